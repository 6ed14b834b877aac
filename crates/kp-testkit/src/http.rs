//! A blocking HTTP/1.1 `GET` for tests that ask the proxy's servers (healthz,
//! metrics, health-check node ports) from whatever namespace the calling
//! thread is in.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// What a server answered.
#[derive(Debug, Clone)]
pub struct HttpReply {
    /// The status code; 0 when the status line did not parse.
    pub code: u16,
    /// The status line and headers.
    pub head: String,
    /// The body.
    pub body: String,
}

/// `GET path` from `addr` with `Connection: close`, reading the whole reply
/// (5 s read timeout).
pub fn get(addr: impl ToSocketAddrs, path: &str) -> io::Result<HttpReply> {
    get_accepting(addr, path, None)
}

/// [`get`] with an `Accept` header when `accept` is given.
pub fn get_accepting(
    addr: impl ToSocketAddrs,
    path: &str,
    accept: Option<&str>,
) -> io::Result<HttpReply> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let accept = accept.map_or_else(String::new, |a| format!("Accept: {a}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: test\r\n{accept}Connection: close\r\n\r\n"
    )?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply)?;
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    Ok(HttpReply {
        code: head.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0),
        head: head.to_owned(),
        body: body.to_owned(),
    })
}
