//! The limits of the agent's HTTP server, told with real connections on
//! loopback and limits short enough to wait for.

#![allow(clippy::unwrap_used, clippy::expect_used)]

//!
//! The server runs on the runtime's workers; the test body, on the thread
//! that blocks on it, plays the clients with blocking sockets.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream as Client;

use super::*;

/// Long enough that it never fires in a test that does not wait for it.
const NEVER: Duration = Duration::from_secs(600);

/// How long a test waits for the server to close a connection.
const CLOSE_DEADLINE: Duration = Duration::from_secs(10);

/// Serves a handler answering "hello" on a loopback port within `limits`;
/// the server stops when the returned sender is dropped.
async fn server(limits: ConnectionLimits) -> (SocketAddr, watch::Sender<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop_tx, stop) = watch::channel(false);
    let handler: Handler = Arc::new(|_request| Response::text(200, "hello"));
    tokio::spawn(serve_within(listener, handler, limits, stop));
    (address, stop_tx)
}

fn limits(header_read_timeout: Duration, idle_timeout: Duration, max: usize) -> ConnectionLimits {
    ConnectionLimits {
        header_read_timeout,
        idle_timeout,
        max_connections: max,
    }
}

/// Waits until the server closes `stream` (end of file or reset), at
/// most [`CLOSE_DEADLINE`]; returns how long that took, `None` if the
/// connection is still open then. Whatever the server sends before closing
/// is read and dropped.
fn closed_within_deadline(stream: &mut Client) -> Option<Duration> {
    let started = std::time::Instant::now();
    stream.set_read_timeout(Some(CLOSE_DEADLINE)).unwrap();
    let mut buffer = [0u8; 1024];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return Some(started.elapsed()),
            Ok(_) if started.elapsed() < CLOSE_DEADLINE => continue,
            Err(error) if error.kind() == ErrorKind::ConnectionReset => {
                return Some(started.elapsed())
            }
            Ok(_) | Err(_) => return None,
        }
    }
}

/// Whether `stream` is still open: nothing to read within 100 ms.
fn still_open(stream: &mut Client) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut buffer = [0u8; 1];
    stream
        .read(&mut buffer)
        .is_err_and(|error| error.kind() == ErrorKind::WouldBlock)
}

/// Sends `GET /` on `stream` (kept alive) and reads the answer's head.
fn request(stream: &mut Client) -> String {
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    stream.set_read_timeout(Some(CLOSE_DEADLINE)).unwrap();
    let mut buffer = [0u8; 1024];
    let read = stream.read(&mut buffer).unwrap();
    String::from_utf8_lossy(&buffer[..read]).into_owned()
}

/// `GET /` on a new connection: the whole answer (`Connection: close`).
fn get(address: SocketAddr) -> String {
    let mut stream = Client::connect(address).unwrap();
    stream.set_read_timeout(Some(CLOSE_DEADLINE)).unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_and_a_partial_head_are_closed_after_the_header_read_timeout() {
    let timeout = Duration::from_millis(300);
    let (address, _stop) = server(limits(timeout, NEVER, 16)).await;
    let mut silent = Client::connect(address).unwrap();
    let mut partial = Client::connect(address).unwrap();
    partial.write_all(b"GET / HTTP/1.1\r\nHost: te").unwrap();

    let silent_closed = closed_within_deadline(&mut silent);
    let partial_closed = closed_within_deadline(&mut partial);

    let silent_closed = silent_closed.expect("the silent connection is closed");
    assert!(
        partial_closed.is_some(),
        "the partial head's connection is closed"
    );
    assert!(
        silent_closed >= timeout - Duration::from_millis(50),
        "not before the timeout: {silent_closed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_without_a_next_request_is_closed_after_the_header_read_timeout() {
    let (address, _stop) = server(limits(Duration::from_millis(300), NEVER, 16)).await;
    let mut stream = Client::connect(address).unwrap();
    assert!(request(&mut stream).starts_with("HTTP/1.1 200 OK"));

    assert!(
        closed_within_deadline(&mut stream).is_some(),
        "the idle kept-alive connection is closed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idle_timeout_closes_a_connection_however_long_the_header_read_timeout() {
    let idle = Duration::from_millis(300);
    let (address, _stop) = server(limits(NEVER, idle, 16)).await;
    let mut stream = Client::connect(address).unwrap();

    let closed = closed_within_deadline(&mut stream);

    let closed = closed.expect("closed after the idle timeout");
    assert!(closed >= idle - Duration::from_millis(50), "{closed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_bound_a_new_client_is_answered_and_the_longest_waiting_connection_closed() {
    let (address, _stop) = server(limits(NEVER, NEVER, 4)).await;
    let mut idle = Vec::new();
    for _ in 0..4 {
        let mut stream = Client::connect(address).unwrap();
        // An answer proves the server admitted the connection; it then
        // waits for the next request.
        assert!(request(&mut stream).starts_with("HTTP/1.1 200 OK"));
        idle.push(stream);
    }

    let reply = get(address);

    assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
    assert!(reply.ends_with("hello"), "{reply}");
    assert!(
        closed_within_deadline(&mut idle[0]).is_some(),
        "the connection that waited longest gave way"
    );
    for stream in &mut idle[1..] {
        assert!(still_open(stream), "the others stay open");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bound_holds_however_many_clients_connect() {
    let (address, _stop) = server(limits(NEVER, NEVER, 8)).await;
    let mut streams: Vec<Client> = (0..40).map(|_| Client::connect(address).unwrap()).collect();
    // The server takes connections in order: once one opened after them
    // is answered, it has seen them all.
    assert!(get(address).starts_with("HTTP/1.1 200 OK"));

    let open = streams
        .iter_mut()
        .map(still_open)
        .filter(|open| *open)
        .count();

    assert!(open <= 8, "{open} connections open, bound 8");
    assert!(open >= 7, "the newest are kept: {open}");
}

/// `request` (whole, with `Connection: close`) to `address`: the answer.
fn exchange(address: SocketAddr, request: &[u8]) -> String {
    let mut stream = Client::connect(address).unwrap();
    stream.set_read_timeout(Some(CLOSE_DEADLINE)).unwrap();
    stream.write_all(request).unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_reaches_the_handler_up_to_its_bound() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (_stop_tx, stop) = watch::channel(false);
    let handler: Handler = Arc::new(|request| {
        Response::text(
            200,
            format!(
                "{} {} {}",
                request.method,
                request.path,
                String::from_utf8_lossy(request.body)
            ),
        )
    });
    tokio::spawn(serve_within(
        listener,
        handler,
        ConnectionLimits::DEFAULT,
        stop,
    ));
    let put = |body: String| {
        format!(
            "PUT /debug/flags/v HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    };
    let small = put("4".to_owned());
    let large = put("9".repeat(MAX_BODY + 1));
    let exact = put("7".repeat(MAX_BODY));
    let (small, large, exact) = tokio::task::spawn_blocking(move || {
        (
            exchange(address, &small),
            exchange(address, &large),
            exchange(address, &exact),
        )
    })
    .await
    .unwrap();
    assert!(small.starts_with("HTTP/1.1 200"), "{small}");
    assert!(small.ends_with("PUT /debug/flags/v 4"), "{small}");
    assert!(large.starts_with("HTTP/1.1 413"), "{large}");
    assert!(exact.starts_with("HTTP/1.1 200"), "{exact}");
    assert!(exact.ends_with(&"7".repeat(MAX_BODY)), "{exact}");
}
