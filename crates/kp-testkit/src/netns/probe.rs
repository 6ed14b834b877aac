//! Probes: connections and datagrams sent from a namespace to the echo
//! servers, with deadlines.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::namespace::{error_chain, Netns};
use super::NetnsError;

/// How long a probe waits for a connection, an answer, or a refusal.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Makes every UDP probe's payload unique, so a late answer to an earlier
/// probe is never taken for the answer to this one.
static UDP_TOKEN: AtomicU64 = AtomicU64::new(0);

/// An echo server's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The pod that answered.
    pub backend: String,
    /// The source address the pod saw (after any SNAT on the way).
    pub source: IpAddr,
    /// The text the client sent, echoed; empty for a TCP greeting.
    pub text: String,
}

/// Why a probe got no answer.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The connection was refused or the destination reported unreachable
    /// (TCP RST or ICMP unreachable), or the connect failed otherwise.
    #[error("connecting to {addr} failed")]
    Connect {
        /// The destination.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Nothing came back before the deadline.
    #[error("no answer from {addr} within {timeout:?}")]
    Timeout {
        /// The destination.
        addr: SocketAddr,
        /// How long the probe waited.
        timeout: Duration,
    },
    /// Sending or receiving failed after the connection was set up.
    #[error("exchanging data with {addr} failed")]
    Io {
        /// The destination.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Something answered, but not an echo server of this harness.
    #[error("{addr} answered {answer:?}, expected \"<pod> <source ip>[ <text>]\"")]
    BadReply {
        /// The destination.
        addr: SocketAddr,
        /// What came back.
        answer: String,
    },
    /// The namespace to probe from could not be entered.
    #[error("entering the namespace to probe from failed")]
    Namespace(#[source] NetnsError),
}

/// An established TCP connection to an echo server that stays open, to
/// show that an established flow survives a change of endpoints.
#[derive(Debug)]
pub struct TcpSession {
    addr: SocketAddr,
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    greeting: Reply,
}

/// Connects over TCP from namespace `from` to `addr` and returns the echo
/// server's greeting: which pod answered and which source it saw.
pub fn connect(from: &Netns, addr: SocketAddr) -> Result<Reply, ProbeError> {
    TcpSession::open(from, addr).map(|session| session.greeting)
}

/// Opens `n` fresh TCP connections from `from` to `addr` and counts the
/// answers per pod.
///
/// # Panics
/// If any connection fails; the message says which one and why.
#[track_caller]
pub fn hits(from: &Netns, addr: SocketAddr, n: usize) -> BTreeMap<String, usize> {
    count_answers(from, addr, n, |_| false)
}

/// Opens fresh TCP connections from `from` to `addr` until every pod in
/// `expected` has answered at least once and at least eight connections
/// per expected pod were made, or `max` connections were made; counts the
/// answers per pod.
///
/// Load balancing is random, so a fixed small sample can miss an endpoint
/// by chance (two endpoints, twelve connections: one run in 2048). Asking
/// for each expected pod keeps the test's meaning (every endpoint is
/// reachable; the minimum sample gives an unexpected pod its chance to
/// show) while making a miss by chance vanishingly rare: with `max` = 200
/// and two endpoints, one run in 2^199.
///
/// # Panics
/// If any connection fails; the message says which one and why.
#[track_caller]
pub fn hits_until_all(
    from: &Netns,
    addr: SocketAddr,
    expected: &[&str],
    max: usize,
) -> BTreeMap<String, usize> {
    let enough = expected.len() * 8;
    count_answers(from, addr, max, |counts| {
        counts.values().sum::<usize>() >= enough
            && expected.iter().all(|pod| counts.contains_key(*pod))
    })
}

/// Opens up to `max` TCP connections, stopping early once `done` holds for
/// the counts so far.
#[track_caller]
fn count_answers(
    from: &Netns,
    addr: SocketAddr,
    max: usize,
    done: impl Fn(&BTreeMap<String, usize>) -> bool + Send + Sync,
) -> BTreeMap<String, usize> {
    let outcome = from.run(|| {
        let mut counts = BTreeMap::new();
        for attempt in 1..=max {
            let reply = open_tcp(addr).map_err(|error| (attempt, error))?.2;
            *counts.entry(reply.backend).or_insert(0) += 1;
            if done(&counts) {
                break;
            }
        }
        Ok(counts)
    });
    match outcome {
        Ok(counts) => counts,
        Err((attempt, error)) => panic!(
            "connection {attempt} of {max} from {} to {addr}: {}",
            from.name(),
            error_chain(&error)
        ),
    }
}

/// Sends one UDP datagram from `from` to `addr` and returns the answer.
/// An ICMP port-unreachable comes back as [`ProbeError::Connect`] with
/// `ConnectionRefused`.
pub fn udp_roundtrip(from: &Netns, addr: SocketAddr) -> Result<Reply, ProbeError> {
    let token = format!("udp-{}", UDP_TOKEN.fetch_add(1, Ordering::Relaxed));
    from.try_run(|| udp_exchange(addr, &token))
        .map_err(ProbeError::Namespace)?
}

/// Asserts that a TCP connection from `from` to `addr` is refused within
/// [`PROBE_TIMEOUT`]: a TCP RST or an ICMP unreachable, not a timeout.
///
/// # Panics
/// If the connection succeeds, times out, or fails another way.
#[track_caller]
pub fn expect_refused(from: &Netns, addr: SocketAddr) {
    match connect(from, addr) {
        Err(error) if error.is_refused() => {}
        other => panic!(
            "expected {addr} to refuse a connection from {} within {PROBE_TIMEOUT:?}, got {}",
            from.name(),
            describe(&other)
        ),
    }
}

/// Asserts that a TCP connection from `from` to `addr` gets no answer at
/// all within [`PROBE_TIMEOUT`] (dropped, not refused).
///
/// # Panics
/// If the connection succeeds or is refused.
#[track_caller]
pub fn expect_timeout(from: &Netns, addr: SocketAddr) {
    match connect(from, addr) {
        Err(error) if error.is_timeout() => {}
        other => panic!(
            "expected no answer from {addr} to {} within {PROBE_TIMEOUT:?}, got {}",
            from.name(),
            describe(&other)
        ),
    }
}

impl Reply {
    /// Parses an echo server's line `"<pod> <source ip>[ <text>]"`.
    pub fn parse(line: &str) -> Option<Self> {
        let line = line.trim_end_matches(['\r', '\n']);
        let (backend, rest) = line.split_once(' ')?;
        let (source, text) = rest.split_once(' ').unwrap_or((rest, ""));
        Some(Self {
            backend: backend.to_owned(),
            source: source.parse().ok()?,
            text: text.to_owned(),
        })
    }
}

impl ProbeError {
    /// Whether the destination actively said no: connection refused, or
    /// host or network unreachable.
    pub fn is_refused(&self) -> bool {
        let source = match self {
            Self::Connect { source, .. } | Self::Io { source, .. } => source,
            _ => return false,
        };
        matches!(
            source.kind(),
            ErrorKind::ConnectionRefused
                | ErrorKind::HostUnreachable
                | ErrorKind::NetworkUnreachable
        )
    }

    /// Whether nothing came back before the deadline.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout { .. })
    }
}

impl TcpSession {
    /// Connects from `from` to `addr` and reads the greeting. The socket
    /// belongs to `from`'s namespace for its whole life.
    pub fn open(from: &Netns, addr: SocketAddr) -> Result<Self, ProbeError> {
        let (reader, writer, greeting) = from
            .try_run(|| open_tcp(addr))
            .map_err(ProbeError::Namespace)??;
        Ok(Self {
            addr,
            reader,
            writer,
            greeting,
        })
    }

    /// The greeting read when the connection was set up.
    pub fn greeting(&self) -> &Reply {
        &self.greeting
    }

    /// The pod at the other end of this connection.
    pub fn backend(&self) -> &str {
        &self.greeting.backend
    }

    /// Sends `text` as one line and waits for its echo.
    pub fn echo(&mut self, text: &str) -> Result<Reply, ProbeError> {
        let io_error = |source| ProbeError::Io {
            addr: self.addr,
            source,
        };
        self.writer
            .write_all(format!("{text}\n").as_bytes())
            .map_err(io_error)?;
        let reply = read_reply(&mut self.reader, self.addr)?;
        if reply.text != text {
            return Err(ProbeError::BadReply {
                addr: self.addr,
                answer: format!("{} {} {}", reply.backend, reply.source, reply.text),
            });
        }
        Ok(reply)
    }
}

/// Connects to `addr` from the current thread's namespace and reads the
/// greeting.
fn open_tcp(addr: SocketAddr) -> Result<(BufReader<TcpStream>, TcpStream, Reply), ProbeError> {
    let stream = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).map_err(|source| {
        if matches!(source.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) {
            ProbeError::Timeout {
                addr,
                timeout: PROBE_TIMEOUT,
            }
        } else {
            ProbeError::Connect { addr, source }
        }
    })?;
    let io_error = |source| ProbeError::Io { addr, source };
    stream
        .set_read_timeout(Some(PROBE_TIMEOUT))
        .map_err(io_error)?;
    let writer = stream.try_clone().map_err(io_error)?;
    let mut reader = BufReader::new(stream);
    let greeting = read_reply(&mut reader, addr)?;
    Ok((reader, writer, greeting))
}

fn read_reply(reader: &mut BufReader<TcpStream>, addr: SocketAddr) -> Result<Reply, ProbeError> {
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Ok(_) => Reply::parse(&line).ok_or(ProbeError::BadReply { addr, answer: line }),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            Err(ProbeError::Timeout {
                addr,
                timeout: PROBE_TIMEOUT,
            })
        }
        Err(source) => Err(ProbeError::Io { addr, source }),
    }
}

/// Sends `token` to `addr` and waits for the answer that echoes it.
fn udp_exchange(addr: SocketAddr, token: &str) -> Result<Reply, ProbeError> {
    let local: IpAddr = match addr {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let io_error = |source| ProbeError::Io { addr, source };
    let socket = UdpSocket::bind(SocketAddr::new(local, 0)).map_err(io_error)?;
    // Connected, so ICMP errors are reported to this socket.
    socket
        .connect(addr)
        .map_err(|source| ProbeError::Connect { addr, source })?;
    socket.send(token.as_bytes()).map_err(io_error)?;
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let mut buffer = [0u8; 2048];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ProbeError::Timeout {
                addr,
                timeout: PROBE_TIMEOUT,
            });
        }
        socket.set_read_timeout(Some(left)).map_err(io_error)?;
        let len = match socket.recv(&mut buffer) {
            Ok(len) => len,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(source) => return Err(ProbeError::Connect { addr, source }),
        };
        let answer = String::from_utf8_lossy(&buffer[..len]).into_owned();
        match Reply::parse(&answer) {
            Some(reply) if reply.text == token => return Ok(reply),
            Some(_) => continue,
            None => return Err(ProbeError::BadReply { addr, answer }),
        }
    }
}

fn describe(outcome: &Result<Reply, ProbeError>) -> String {
    match outcome {
        Ok(reply) => format!("an answer from {} (source {})", reply.backend, reply.source),
        Err(error) => error_chain(error),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn replies_parse_with_and_without_text() {
        let greeting = Reply::parse("ep1 192.168.99.10\n").unwrap();
        assert_eq!(greeting.backend, "ep1");
        assert_eq!(greeting.source.to_string(), "192.168.99.10");
        assert_eq!(greeting.text, "");
        let echo = Reply::parse("ep2 fd00:192:168:99::10 still here\n").unwrap();
        assert_eq!(echo.backend, "ep2");
        assert_eq!(echo.text, "still here");
    }

    #[test]
    fn foreign_answers_do_not_parse() {
        assert_eq!(Reply::parse("HTTP/1.1 400 Bad Request"), None);
        assert_eq!(Reply::parse(""), None);
        assert_eq!(Reply::parse("ep1"), None);
    }

    #[test]
    fn refusals_and_timeouts_are_told_apart() {
        let addr: SocketAddr = "10.244.1.2:80".parse().unwrap();
        let refused = ProbeError::Connect {
            addr,
            source: ErrorKind::ConnectionRefused.into(),
        };
        let unreachable = ProbeError::Connect {
            addr,
            source: ErrorKind::HostUnreachable.into(),
        };
        let timeout = ProbeError::Timeout {
            addr,
            timeout: PROBE_TIMEOUT,
        };
        assert!(refused.is_refused() && !refused.is_timeout());
        assert!(unreachable.is_refused());
        assert!(timeout.is_timeout() && !timeout.is_refused());
    }
}
