//! A small HTTP/1 server for the agent's endpoints: a handler maps a
//! request's method and path to a [`Response`].

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::connections::{Admitted, Connections, Evicted};

/// How long a server whose address cannot be bound waits before trying
/// again (upstream retries its healthz and metrics servers every 5 s).
pub const BIND_RETRY: Duration = Duration::from_secs(5);

/// The first wait after a failed accept; it doubles up to
/// [`ACCEPT_BACKOFF_MAX`] while accepts keep failing (Go's `http.Server`).
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
/// The longest wait after a failed accept.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// What a server allows its clients: the healthz, metrics and health-check
/// node port servers all use [`ConnectionLimits::DEFAULT`] (the health-check
/// node ports together, as one server). A client can hold a connection only while
/// it sends requests and reads the answers; none holds one for ever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// A request head must have arrived this long after the server started
    /// waiting for it: after accepting the connection, or after answering
    /// the previous request on a kept-alive connection, so this is also
    /// how long a kept-alive connection may stay idle.
    pub header_read_timeout: Duration,
    /// A connection on which no request head arrived for this long is
    /// closed whatever it is doing: this also ends a client that stopped
    /// reading its answer.
    pub idle_timeout: Duration,
    /// Connections open at once. At the bound, the connection that has
    /// waited longest for a request is closed to admit a new one; when all
    /// are busy with a request, new ones wait in the listen backlog until
    /// one is done.
    pub max_connections: usize,
}

impl ConnectionLimits {
    /// The limits of the agent's servers. The timeouts are those of the
    /// Kubernetes API server's `http.Server` (k8s.io/apiserver
    /// `secure_serving.go`: `ReadHeaderTimeout` 32 s, `IdleTimeout` 90 s,
    /// the keep-alive timeout of Go's `http.DefaultTransport`); upstream
    /// kube-proxy sets none on its healthz and metrics servers. The bound
    /// is nginx's default `worker_connections`: far above what probes and
    /// scrapers open at once, and half of a 1,024-descriptor limit, so a
    /// flood of one server leaves the proxy descriptors for its syncs.
    pub const DEFAULT: Self = Self {
        header_read_timeout: Duration::from_secs(32),
        idle_timeout: Duration::from_secs(90),
        max_connections: 512,
    };
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// One answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The HTTP status code.
    pub status: u16,
    /// Headers besides `Content-Length`, `Content-Type` first.
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: String,
}

impl Response {
    /// A response of `status` with a `content_type` body.
    pub fn new(status: u16, content_type: &str, body: impl Into<String>) -> Self {
        Self {
            status,
            headers: vec![("Content-Type", content_type.to_owned())],
            body: body.into(),
        }
    }

    /// A `text/plain` response.
    pub fn text(status: u16, body: impl Into<String>) -> Self {
        Self::new(status, "text/plain; charset=utf-8", body)
    }

    /// 404 with upstream's (Go's) text.
    pub fn not_found() -> Self {
        Self::text(404, "404 page not found\n")
    }

    /// Adds a header.
    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }
}

/// What a handler sees of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHead<'a> {
    /// The method, e.g. `GET`.
    pub method: &'a str,
    /// The path, without the query.
    pub path: &'a str,
    /// The `Accept` header, empty when absent.
    pub accept: &'a str,
    /// The body, at most [`MAX_BODY`] bytes.
    pub body: &'a [u8],
}

/// The largest request body read; a longer one is answered 413. The
/// servers take no body but `PUT /debug/flags/v`'s number.
pub const MAX_BODY: usize = 1024;

/// Maps a request to its answer.
pub type Handler = Arc<dyn Fn(&RequestHead<'_>) -> Response + Send + Sync>;

/// Serves `handler` on `listener` until `stop` says so, within
/// [`ConnectionLimits::DEFAULT`].
pub async fn serve(listener: TcpListener, handler: Handler, stop: watch::Receiver<bool>) {
    serve_within(listener, handler, ConnectionLimits::DEFAULT, stop).await;
}

/// Serves `handler` on `listener` within `limits` until `stop` says so.
/// Connections open when `stop` comes are served until they end (at the
/// latest when a limit closes them).
pub async fn serve_within(
    listener: TcpListener,
    handler: Handler,
    limits: ConnectionLimits,
    stop: watch::Receiver<bool>,
) {
    let connections = Connections::new(limits.max_connections);
    serve_sharing(listener, handler, limits, connections, stop).await;
}

/// Like [`serve_within`], with the connection bound of `connections`
/// (made with `limits.max_connections`) shared with every other listener
/// served with it: the health-check node ports share one bound, so that a
/// node with many of them does not multiply what a flood may hold.
pub(crate) async fn serve_sharing(
    listener: TcpListener,
    handler: Handler,
    limits: ConnectionLimits,
    connections: Arc<Connections>,
    mut stop: watch::Receiver<bool>,
) {
    let mut accept_backoff = None;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stop| *stop) => return,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                accept_backoff = None;
                stream
            }
            Err(error) => {
                // Out of descriptors (EMFILE, ENFILE) or memory: the
                // connection stays in the backlog and the next accept
                // fails at once. Back off as Go's http.Server does (5 ms,
                // doubling up to 1 s) instead of spinning.
                let delay = accept_backoff.map_or(ACCEPT_BACKOFF_MIN, |delay: Duration| {
                    (delay * 2).min(ACCEPT_BACKOFF_MAX)
                });
                accept_backoff = Some(delay);
                tracing::debug!(%error, ?delay, "accepting a connection failed");
                if sleep_or_stop(delay, &mut stop).await {
                    return;
                }
                continue;
            }
        };
        let (admitted, evicted) = tokio::select! {
            admitted = connections.admit() => admitted,
            _ = stop.wait_for(|stop| *stop) => return,
        };
        tokio::spawn(serve_connection(
            stream,
            Arc::clone(&handler),
            limits,
            admitted,
            evicted,
        ));
    }
}

/// Serves one connection until the client closes it, a limit closes it,
/// or it gives way to a new connection at the bound.
async fn serve_connection(
    stream: TcpStream,
    handler: Handler,
    limits: ConnectionLimits,
    admitted: Admitted,
    evicted: Evicted,
) {
    let slot = &admitted;
    let handler = &handler;
    let service = service_fn(|request| async move {
        slot.request_started();
        let response = answer(handler, request, limits.header_read_timeout).await;
        slot.request_answered();
        Ok::<_, Infallible>(response)
    });
    let mut builder = http1::Builder::new();
    // Without a timer, hyper ignores the header read timeout.
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        served = connection => {
            if let Err(error) = served {
                tracing::debug!(%error, "serving a connection failed");
            }
        }
        _ = evicted => {
            tracing::debug!("closing a connection waiting for a request, to admit a new one at the connection bound");
        }
        () = idle_expired(slot, limits.idle_timeout) => {
            tracing::debug!(idle_timeout = ?limits.idle_timeout, "closing a connection without a request for the idle timeout");
        }
    }
}

/// Completes once `idle_timeout` has passed since the connection's last
/// request head arrived (or it was accepted).
async fn idle_expired(slot: &Admitted, idle_timeout: Duration) {
    // The slot lives as long as the connection; without one, nothing
    // holds the connection open.
    while let Some(last) = slot.last_request() {
        let deadline = last + idle_timeout;
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

/// A listening socket on `address`, as Go's `net.Listen("tcp", …)` makes
/// it for upstream's servers: `SO_REUSEADDR`, and a wildcard address
/// (`0.0.0.0` or `[::]`) bound as `[::]` with `IPV6_V6ONLY` off, so that
/// the default `0.0.0.0:10256` answers on both families (kubelet's
/// liveness probe of an IPv6-only node reaches it). Where the kernel has
/// no IPv6, a wildcard is bound as `0.0.0.0`. Non-blocking, ready for the
/// runtime.
pub fn listen(address: SocketAddr) -> io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let open = |domain: Domain, at: SocketAddr, dual: bool| -> io::Result<Socket> {
        let socket = Socket::new(domain, Type::STREAM, None)?;
        if dual {
            socket.set_only_v6(false)?;
        }
        socket.set_reuse_address(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&at.into())?;
        // Go's backlog: the kernel's somaxconn caps it.
        socket.listen(4096)?;
        Ok(socket)
    };
    let socket = if address.ip().is_unspecified() {
        let any = SocketAddr::new(std::net::Ipv6Addr::UNSPECIFIED.into(), address.port());
        match open(Domain::IPV6, any, true) {
            Ok(socket) => socket,
            // No IPv6 in this kernel (`ipv6.disable=1`): IPv4 alone.
            Err(error)
                if address.is_ipv4()
                    && error.raw_os_error() == Some(nix::errno::Errno::EAFNOSUPPORT as i32) =>
            {
                open(Domain::IPV4, address, false)?
            }
            Err(error) => return Err(error),
        }
    } else {
        open(Domain::for_address(address), address, false)?
    };
    Ok(socket.into())
}

/// Binds `address` and serves `handler` until `stop`; while the address
/// cannot be bound (taken, or not on this host yet), logs it and tries
/// again every [`BIND_RETRY`].
pub async fn serve_retrying(
    server: &'static str,
    address: SocketAddr,
    handler: Handler,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        match listen(address).and_then(TcpListener::from_std) {
            Ok(listener) => {
                tracing::info!(server, %address, "Serving");
                return serve(listener, handler, stop).await;
            }
            Err(error) => {
                tracing::error!(server, %address, %error, "Cannot listen; retrying in 5 s");
            }
        }
        if sleep_or_stop(BIND_RETRY, &mut stop).await {
            return;
        }
    }
}

/// Sleeps `duration`; true when `stop` came first.
pub(crate) async fn sleep_or_stop(duration: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        () = tokio::time::sleep(duration) => false,
        _ = stop.wait_for(|stop| *stop) => true,
    }
}

/// The answer to `request`, whose body must arrive within `timeout`.
async fn answer(
    handler: &Handler,
    request: Request<Incoming>,
    timeout: Duration,
) -> hyper::Response<Full<Bytes>> {
    let (head, body) = request.into_parts();
    let read = tokio::time::timeout(timeout, Limited::new(body, MAX_BODY).collect()).await;
    let response = match read {
        Ok(Ok(body)) => {
            let accept = head
                .headers
                .get(hyper::header::ACCEPT)
                .and_then(|value| value.to_str().ok())
                .unwrap_or_default();
            handler(&RequestHead {
                method: head.method.as_str(),
                path: head.uri.path(),
                accept,
                body: &body.to_bytes(),
            })
        }
        Ok(Err(error)) if error.downcast_ref::<LengthLimitError>().is_some() => {
            Response::text(413, format!("request body longer than {MAX_BODY} bytes\n"))
        }
        Ok(Err(error)) => Response::text(400, format!("error reading request body: {error}\n")),
        Err(_) => Response::text(
            408,
            format!("request body not received within {} s\n", timeout.as_secs()),
        ),
    };
    let mut builder = hyper::Response::builder()
        .status(StatusCode::from_u16(response.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR));
    for (name, value) in &response.headers {
        builder = builder.header(*name, value);
    }
    let body = Full::new(Bytes::from(response.body));
    builder.body(body).unwrap_or_else(|_| {
        // Only an invalid header value gets here; every header is ours.
        let mut fallback = hyper::Response::new(Full::new(Bytes::new()));
        *fallback.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        fallback
    })
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
