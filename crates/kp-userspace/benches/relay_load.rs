//! Load generators and servers of the relay benchmark, all tokio.
//!
//! Servers (in the pod's namespace): a sink that reads everything and
//! answers the byte count at the end, a greeter that writes one byte and
//! closes, and an echo server. Clients (in the client's namespace) drive
//! each scenario and return one figure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Port of the sink server.
pub const SINK_PORT: u16 = 9000;
/// Port of the greet-and-close server.
pub const GREET_PORT: u16 = 9001;
/// Port of the echo server.
pub const ECHO_PORT: u16 = 9002;

/// Runs the three servers on `ip` until the runtime stops.
pub async fn serve(ip: std::net::IpAddr) {
    let sink = TcpListener::bind((ip, SINK_PORT)).await.unwrap();
    let greet = TcpListener::bind((ip, GREET_PORT)).await.unwrap();
    let echo = TcpListener::bind((ip, ECHO_PORT)).await.unwrap();
    tokio::spawn(accept_loop(sink, |mut stream| async move {
        let mut buffer = vec![0u8; 256 * 1024];
        let mut total = 0u64;
        while let Ok(n) = stream.read(&mut buffer).await {
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        let _ = stream.write_all(&total.to_be_bytes()).await;
    }));
    tokio::spawn(accept_loop(greet, |mut stream| async move {
        let _ = stream.write_all(b"g").await;
    }));
    accept_loop(echo, |stream| async move {
        let (mut reader, mut writer) = stream.into_split();
        let _ = tokio::io::copy(&mut reader, &mut writer).await;
    })
    .await;
}

async fn accept_loop<F, Fut>(listener: TcpListener, handle: F)
where
    F: Fn(TcpStream) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        if let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            tokio::spawn(handle(stream));
        }
    }
}

/// Bytes per second pushed through `addr` to the sink by `connections`
/// parallel streams for `duration`.
pub async fn bulk(addr: SocketAddr, connections: usize, duration: Duration) -> f64 {
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for _ in 0..connections {
        tasks.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let chunk = vec![0x5au8; 64 * 1024];
            let mut sent = 0u64;
            while Instant::now() < deadline {
                stream.write_all(&chunk).await.unwrap();
                sent += chunk.len() as u64;
            }
            stream.shutdown().await.unwrap();
            let mut count = [0u8; 8];
            stream.read_exact(&mut count).await.unwrap();
            assert_eq!(u64::from_be_bytes(count), sent, "the sink got every byte");
            sent
        }));
    }
    let mut total = 0u64;
    for task in tasks {
        total += task.await.unwrap();
    }
    total as f64 / start.elapsed().as_secs_f64()
}

/// Connections completed through `addr` to the greeter by `concurrency`
/// loops of connect, read one byte, close, for `duration`; with the time
/// they took (the last ones finish a little after `duration`).
pub async fn connections(
    addr: SocketAddr,
    concurrency: usize,
    duration: Duration,
) -> (u64, Duration) {
    let start = Instant::now();
    let deadline = start + duration;
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let done = Arc::clone(&done);
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let mut stream = TcpStream::connect(addr).await.unwrap();
                let mut byte = [0u8; 1];
                stream.read_exact(&mut byte).await.unwrap();
                // Close with a reset, so the client side does not pile up
                // TIME_WAIT sockets and run out of ports.
                let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
                drop(stream);
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    (done.load(Ordering::Relaxed), start.elapsed())
}

/// Round-trip times (µs) of 64-byte requests to the echo server through
/// each of `addrs` at once: `connections` connections each, `rate`
/// requests per second through each, for `duration`. The requests of all
/// targets interleave evenly in time, so a stall of the machine meets
/// each target alike. Per target: the times measured from each request's
/// send, and from its scheduled time (which also counts the client's
/// timer lag and any stall that delayed later requests); both sorted.
pub async fn latency(
    addrs: &[SocketAddr],
    connections: usize,
    rate: u32,
    duration: Duration,
) -> Vec<(Vec<u64>, Vec<u64>)> {
    let period = Duration::from_secs_f64(connections as f64 / f64::from(rate));
    let slots = (connections * addrs.len()) as f64;
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for (target, &addr) in addrs.iter().enumerate() {
        for index in 0..connections {
            // Slot by slot: every target's first connection, then every
            // target's second, and so on, spread over one period.
            let slot = (index * addrs.len() + target) as f64;
            let first = start + period.mul_f64(slot / slots);
            tasks.push((
                target,
                tokio::spawn(round_trips(addr, first, period, duration)),
            ));
        }
    }
    let mut figures = vec![(Vec::new(), Vec::new()); addrs.len()];
    for (target, task) in tasks {
        let (send, schedule) = task.await.unwrap();
        figures[target].0.extend(send);
        figures[target].1.extend(schedule);
    }
    for (from_send, from_schedule) in &mut figures {
        from_send.sort_unstable();
        from_schedule.sort_unstable();
    }
    figures
}

/// One connection's round trips of [`latency`]: a request every `period`
/// from `first` on, for `duration`.
async fn round_trips(
    addr: SocketAddr,
    first: tokio::time::Instant,
    period: Duration,
    duration: Duration,
) -> (Vec<u64>, Vec<u64>) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    // Connecting takes a while with many connections; every connection
    // starts its ticks a little later, at the same point of its period.
    let first = first + period * 4;
    let mut ticks = tokio::time::interval_at(first, period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let request = [0x42u8; 64];
    let mut answer = [0u8; 64];
    let mut from_send = Vec::new();
    let mut from_schedule = Vec::new();
    let end = first + duration;
    loop {
        let scheduled = ticks.tick().await;
        if scheduled >= end {
            break;
        }
        let sent = tokio::time::Instant::now();
        stream.write_all(&request).await.unwrap();
        stream.read_exact(&mut answer).await.unwrap();
        let now = tokio::time::Instant::now();
        from_send.push(micros(now.duration_since(sent)));
        from_schedule.push(micros(now.duration_since(scheduled)));
    }
    (from_send, from_schedule)
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// Opens `count` connections through `addr` to the echo server, each with
/// one round trip so the proxy's side to the server is up, and returns
/// them open.
pub async fn open_idle(addr: SocketAddr, count: usize) -> Vec<TcpStream> {
    let mut open = Vec::with_capacity(count);
    let batch = 200;
    for start in (0..count).step_by(batch) {
        let mut tasks = Vec::new();
        for _ in start..(start + batch).min(count) {
            tasks.push(tokio::spawn(async move {
                let mut stream = TcpStream::connect(addr).await.unwrap();
                stream.write_all(b"x").await.unwrap();
                let mut byte = [0u8; 1];
                stream.read_exact(&mut byte).await.unwrap();
                stream
            }));
        }
        for task in tasks {
            open.push(task.await.unwrap());
        }
    }
    open
}

/// The `q`-quantile of sorted `samples`.
pub fn quantile(samples: &[u64], q: f64) -> u64 {
    if samples.is_empty() {
        return 0;
    }
    let index = ((samples.len() - 1) as f64 * q).round() as usize;
    samples[index]
}
