//! What the kernel tests of this crate share: a UDP client that sends from
//! one fixed source port, as a client whose flow conntrack pins.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{self, ErrorKind};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use kp_testkit::netns::{Netns, Reply};

/// How long one datagram waits for its answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// A UDP socket connected to a Service address from one fixed source
/// port, in some namespace: every datagram it sends belongs to one
/// conntrack entry.
pub struct UdpClient {
    pub name: &'static str,
    socket: UdpSocket,
    sent: usize,
}

impl UdpClient {
    /// A client named `name` in `netns`, sending to `to`.
    pub fn open(name: &'static str, netns: &Netns, to: SocketAddr) -> Self {
        let socket = netns
            .run(|| UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)))
            .unwrap();
        socket.connect(to).unwrap();
        Self {
            name,
            socket,
            sent: 0,
        }
    }

    /// Sends one datagram and returns the pod that answered it.
    #[track_caller]
    pub fn ask(&mut self) -> String {
        self.try_ask()
            .unwrap_or_else(|error| panic!("{}: asking failed: {error}", self.name))
    }

    /// Sends one datagram and returns the pod that answered it, or the
    /// error the socket reported (`ConnectionRefused` for an ICMP
    /// unreachable, `TimedOut` when nothing came back).
    pub fn try_ask(&mut self) -> io::Result<String> {
        // A refusal of an earlier datagram may still be pending on the
        // socket (the node's own datagram is refused twice: by the send
        // call, EPERM, and by the ICMP unreachable that follows it).
        self.socket.take_error()?;
        self.sent += 1;
        let token = format!("{}-{}", self.name, self.sent);
        self.socket.send(token.as_bytes())?;
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        let mut buffer = [0u8; 2048];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    ErrorKind::TimedOut,
                    format!("no answer to {token}"),
                ));
            }
            self.socket.set_read_timeout(Some(left))?;
            match self.socket.recv(&mut buffer) {
                Ok(len) => {
                    let answer = String::from_utf8_lossy(&buffer[..len]);
                    let reply = Reply::parse(&answer).expect("an echo server's answer");
                    if reply.text == token {
                        return Ok(reply.backend);
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The client's source port.
    pub fn local_port(&self) -> u16 {
        self.socket.local_addr().unwrap().port()
    }
}
