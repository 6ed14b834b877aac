//! In-process TCP and UDP echo servers living in pod namespaces.
//!
//! Every answer is one line naming the pod and the source address the pod
//! saw: `"<pod> <source ip>"`, followed by `" <text>"` when the client sent
//! text. A TCP connection is greeted with that line as soon as it is
//! accepted, then every line the client sends is answered; every UDP
//! datagram is answered with one datagram.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::namespace::Netns;
use super::NetnsError;

/// How long a server thread blocks before it looks at the stop flag.
const STOP_CHECK_MS: u16 = 50;

/// The echo servers of a topology; stopped and joined on drop.
#[derive(Debug, Default)]
pub(crate) struct EchoServers {
    stop: Arc<AtomicBool>,
    listeners: Vec<JoinHandle<()>>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

/// What a server needs to answer: its pod name and when to stop.
#[derive(Debug, Clone)]
struct Responder {
    pod: Arc<str>,
    stop: Arc<AtomicBool>,
}

impl EchoServers {
    /// Binds TCP and UDP `ports` on every address of `netns` (`[::]`,
    /// dual-stack) and serves them as pod `pod` until stopped.
    pub(crate) fn start(
        &mut self,
        netns: &Netns,
        pod: &str,
        tcp_ports: &[u16],
        udp_ports: &[u16],
    ) -> Result<(), NetnsError> {
        let responder = Responder {
            pod: Arc::from(pod),
            stop: Arc::clone(&self.stop),
        };
        for &port in tcp_ports {
            let listener = netns
                .try_run(|| TcpListener::bind(any_address(port)))?
                .map_err(|source| bind_error(pod, "TCP", port, source))?;
            let responder = responder.clone();
            let connections = Arc::clone(&self.connections);
            self.listeners.push(spawn(pod, move || {
                serve_tcp(&listener, &responder, &connections);
            })?);
        }
        for &port in udp_ports {
            let socket = netns
                .try_run(|| UdpSocket::bind(any_address(port)))?
                .map_err(|source| bind_error(pod, "UDP", port, source))?;
            let responder = responder.clone();
            self.listeners
                .push(spawn(pod, move || serve_udp(&socket, &responder))?);
        }
        tracing::debug!(pod, ?tcp_ports, ?udp_ports, "echo servers listening");
        Ok(())
    }

    /// Stops every server and waits for its threads.
    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Listeners first: once they are gone no connection thread is added.
        for thread in self.listeners.drain(..) {
            let _ = thread.join();
        }
        let connections = std::mem::take(
            &mut *self
                .connections
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        for thread in connections {
            let _ = thread.join();
        }
    }
}

impl Drop for EchoServers {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Responder {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// The answer to `text` from a client at `source`.
    fn answer(&self, source: IpAddr, text: &str) -> String {
        let source = source.to_canonical();
        if text.is_empty() {
            format!("{} {source}\n", self.pod)
        } else {
            format!("{} {source} {text}\n", self.pod)
        }
    }
}

fn any_address(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port)
}

fn bind_error(pod: &str, protocol: &'static str, port: u16, source: std::io::Error) -> NetnsError {
    NetnsError::Bind {
        pod: pod.to_owned(),
        protocol,
        port,
        source,
    }
}

fn spawn(pod: &str, body: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, NetnsError> {
    std::thread::Builder::new()
        .name(format!("echo-{pod}"))
        .spawn(body)
        .map_err(|source| NetnsError::Thread {
            pod: pod.to_owned(),
            source,
        })
}

/// Accepts connections until stopped, one thread per connection.
fn serve_tcp(
    listener: &TcpListener,
    responder: &Responder,
    connections: &Mutex<Vec<JoinHandle<()>>>,
) {
    while !responder.stopped() {
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(STOP_CHECK_MS)) {
            Ok(0) | Err(nix::Error::EINTR) => continue,
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(pod = %responder.pod, %error, "echo server stopped polling");
                return;
            }
        }
        let (stream, peer) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(pod = %responder.pod, %error, "echo server accept failed");
                continue;
            }
        };
        let connection = responder.clone();
        let thread = spawn(&responder.pod, move || {
            if let Err(error) = serve_connection(stream, peer.ip(), &connection) {
                tracing::debug!(pod = %connection.pod, %error, "echo connection ended");
            }
        });
        match thread {
            Ok(thread) => connections
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(thread),
            Err(error) => tracing::warn!(pod = %responder.pod, %error, "echo connection dropped"),
        }
    }
}

/// Greets the client, then answers every line until it hangs up or the
/// server stops.
fn serve_connection(
    stream: TcpStream,
    source: IpAddr,
    responder: &Responder,
) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_millis(STOP_CHECK_MS.into())))?;
    let mut writer = stream.try_clone()?;
    writer.write_all(responder.answer(source, "").as_bytes())?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    while !responder.stopped() {
        match reader.read_line(&mut line) {
            Ok(0) => return Ok(()),
            Ok(_) => {
                let answer = responder.answer(source, line.trim_end());
                writer.write_all(answer.as_bytes())?;
                line.clear();
            }
            // A partial line stays in `line` and is completed later.
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Answers every datagram until stopped.
fn serve_udp(socket: &UdpSocket, responder: &Responder) {
    if let Err(error) = socket.set_read_timeout(Some(Duration::from_millis(STOP_CHECK_MS.into()))) {
        tracing::warn!(pod = %responder.pod, %error, "echo server cannot serve UDP");
        return;
    }
    let mut buffer = [0u8; 2048];
    while !responder.stopped() {
        let (len, peer) = match socket.recv_from(&mut buffer) {
            Ok(received) => received,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(error) => {
                // ICMP errors for earlier answers surface here; keep serving.
                tracing::debug!(pod = %responder.pod, %error, "echo server receive failed");
                continue;
            }
        };
        let text = String::from_utf8_lossy(&buffer[..len]);
        let answer = responder.answer(peer.ip(), text.trim_end());
        if let Err(error) = socket.send_to(answer.as_bytes(), peer) {
            tracing::debug!(pod = %responder.pod, %error, "echo server answer failed");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn answers_name_the_pod_and_the_plain_source_address() {
        let responder = Responder {
            pod: Arc::from("ep1"),
            stop: Arc::default(),
        };
        let mapped: IpAddr = "::ffff:192.168.99.10".parse().unwrap();
        assert_eq!(responder.answer(mapped, ""), "ep1 192.168.99.10\n");
        let v6: IpAddr = "fd00:192:168:99::10".parse().unwrap();
        assert_eq!(
            responder.answer(v6, "hello"),
            "ep1 fd00:192:168:99::10 hello\n"
        );
    }
}
