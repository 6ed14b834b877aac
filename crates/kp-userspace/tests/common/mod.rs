//! Loopback helpers for the relay's own tests: named echo servers standing
//! in for endpoints, and clients that read which one answered.
//!
//! Address plan: everything on 127.0.0.1, ports chosen by the kernel.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use kp_model::{NamespacedName, Protocol, ServicePortName};
use kp_userspace::{DesiredListener, Relay, RelayOptions, Route};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

/// Deadline of every wait in these tests.
pub const DEADLINE: Duration = Duration::from_secs(5);

/// A TCP endpoint that greets each connection with `"<name>\n"` and then
/// echoes what it reads.
pub async fn tcp_endpoint(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                if stream
                    .write_all(format!("{name}\n").as_bytes())
                    .await
                    .is_err()
                {
                    return;
                }
                let (mut reader, mut writer) = stream.split();
                let _ = tokio::io::copy(&mut reader, &mut writer).await;
                let _ = writer.shutdown().await;
            });
        }
    });
    addr
}

/// A UDP endpoint that answers each datagram with `"<name> <datagram>"`.
pub async fn udp_endpoint(name: &'static str) -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buffer = vec![0u8; 65_536];
        loop {
            let Ok((n, from)) = socket.recv_from(&mut buffer).await else {
                return;
            };
            let text = String::from_utf8_lossy(&buffer[..n]).into_owned();
            let _ = socket
                .send_to(format!("{name} {text}").as_bytes(), from)
                .await;
        }
    });
    addr
}

/// A port on 127.0.0.1 where nothing listens (connections are refused).
pub fn closed_port() -> SocketAddr {
    let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    socket.local_addr().unwrap()
}

/// `ns1/<service>:p` over `protocol`.
pub fn port_name(service: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName::new(NamespacedName::new("ns1", service), "p", protocol)
}

/// Applies one TCP service `name` relaying to `endpoints` and returns the
/// listener's address on 127.0.0.1.
pub fn serve_tcp(relay: &mut Relay, service: &str, route: Route) -> SocketAddr {
    serve(relay, service, Protocol::Tcp, route)
}

/// Like [`serve_tcp`], for UDP.
pub fn serve_udp(relay: &mut Relay, service: &str, route: Route) -> SocketAddr {
    serve(relay, service, Protocol::Udp, route)
}

fn serve(relay: &mut Relay, service: &str, protocol: Protocol, route: Route) -> SocketAddr {
    let name = port_name(service, protocol);
    let desired = BTreeMap::from([(name.clone(), DesiredListener { protocol, route })]);
    let errors = relay.apply(&desired);
    assert!(errors.is_empty(), "opening {name}: {errors:?}");
    let port = relay.listener(&name).unwrap().port;
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Options with short dial timeouts, so a silent endpoint costs little.
pub fn quick_options() -> RelayOptions {
    RelayOptions {
        dial_timeouts: vec![Duration::from_millis(200); 3],
        udp_idle_timeout: Duration::from_millis(300),
        ..RelayOptions::default()
    }
}

/// An open client connection through the relay.
pub struct Client {
    reader: BufReader<tokio::net::tcp::OwnedReadHalf>,
    writer: tokio::net::tcp::OwnedWriteHalf,
    /// The endpoint that greeted it.
    pub backend: String,
}

impl Client {
    /// Connects to `addr` and reads the greeting.
    pub async fn open(addr: SocketAddr) -> std::io::Result<Self> {
        let stream = tokio::time::timeout(DEADLINE, TcpStream::connect(addr))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        let (reader, writer) = stream.into_split();
        let mut reader = BufReader::new(reader);
        let mut backend = String::new();
        let n = tokio::time::timeout(DEADLINE, reader.read_line(&mut backend))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(Self {
            reader,
            writer,
            backend: backend.trim_end().to_owned(),
        })
    }

    /// Sends `line` and reads its echo.
    pub async fn echo(&mut self, line: &str) -> String {
        self.writer
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
        let mut answer = String::new();
        tokio::time::timeout(DEADLINE, self.reader.read_line(&mut answer))
            .await
            .unwrap()
            .unwrap();
        answer.trim_end().to_owned()
    }

    /// Sends `data`, half-closes, and reads everything until the end.
    pub async fn round_trip(mut self, data: &[u8]) -> Vec<u8> {
        let write = async {
            self.writer.write_all(data).await.unwrap();
            self.writer.shutdown().await.unwrap();
        };
        let mut received = Vec::new();
        let read = self.reader.read_to_end(&mut received);
        let ((), read) = tokio::time::timeout(DEADLINE * 4, async { tokio::join!(write, read) })
            .await
            .unwrap();
        read.unwrap();
        received
    }
}

/// Which endpoints `n` new connections to `addr` reach.
pub async fn hits(addr: SocketAddr, n: usize) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for _ in 0..n {
        let client = Client::open(addr).await.unwrap();
        *counts.entry(client.backend).or_default() += 1;
    }
    counts
}

/// Sends `text` from `socket` to `addr` and returns the answer.
pub async fn udp_ask(socket: &UdpSocket, addr: SocketAddr, text: &str) -> String {
    socket.send_to(text.as_bytes(), addr).await.unwrap();
    let mut buffer = vec![0u8; 65_536];
    let (n, from) = tokio::time::timeout(DEADLINE, socket.recv_from(&mut buffer))
        .await
        .expect("an answer within the deadline")
        .unwrap();
    assert_eq!(from, addr, "the answer comes from the address asked");
    String::from_utf8_lossy(&buffer[..n]).into_owned()
}

/// Whether `condition` holds within [`DEADLINE`], checked every 20 ms.
pub async fn wait_for(mut condition: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while tokio::time::Instant::now() < deadline {
        if condition() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Whether a connection to `addr` is refused within [`DEADLINE`].
pub async fn wait_refused(addr: SocketAddr) -> bool {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while tokio::time::Instant::now() < deadline {
        match TcpStream::connect(addr).await {
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused => return true,
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    false
}

impl Client {
    /// Waits up to [`DEADLINE`] for the relay to end the connection (end of
    /// stream or reset); false when it stays open.
    pub async fn wait_for_end(mut self) -> bool {
        let mut rest = Vec::new();
        tokio::time::timeout(DEADLINE, self.reader.read_to_end(&mut rest))
            .await
            .is_ok()
    }
}

/// Fails the test unless `ss` (iproute2) can be run.
pub fn require_ss() {
    let found = std::process::Command::new("ss").arg("-V").output().is_ok();
    assert!(found, "this test needs ss from iproute2");
}

/// `ss -tnoH state established`: the established TCP sockets of this
/// namespace with their timers, one line each.
pub fn established_sockets() -> Vec<String> {
    let output = std::process::Command::new("ss")
        .args(["-tnoH", "state", "established"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| format!("{} ", line.split_whitespace().collect::<Vec<_>>().join(" ")))
        .collect()
}
