//! A small HTTP/1 server for the agent's endpoints: a handler maps a
//! request's method and path to a [`Response`].

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// How long a server whose address cannot be bound waits before trying
/// again (upstream retries its healthz and metrics servers every 5 s).
pub const BIND_RETRY: Duration = Duration::from_secs(5);

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
}

/// Maps a request to its answer.
pub type Handler = Arc<dyn Fn(&RequestHead<'_>) -> Response + Send + Sync>;

/// Serves `handler` on `listener` until `stop` says so.
pub async fn serve(listener: TcpListener, handler: Handler, mut stop: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stop| *stop) => return,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::debug!(%error, "accepting a connection failed");
                continue;
            }
        };
        let handler = Arc::clone(&handler);
        tokio::spawn(async move {
            let service = service_fn(move |request| answer(Arc::clone(&handler), request));
            let served = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(error) = served {
                tracing::debug!(%error, "serving a connection failed");
            }
        });
    }
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
        match TcpListener::bind(address).await {
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

async fn answer(
    handler: Handler,
    request: Request<Incoming>,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let accept = request
        .headers()
        .get(hyper::header::ACCEPT)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    let response = handler(&RequestHead {
        method: request.method().as_str(),
        path: request.uri().path(),
        accept,
    });
    let mut builder = hyper::Response::builder()
        .status(StatusCode::from_u16(response.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR));
    for (name, value) in &response.headers {
        builder = builder.header(*name, value);
    }
    let body = Full::new(Bytes::from(response.body));
    Ok(builder.body(body).unwrap_or_else(|_| {
        // Only an invalid header value gets here; every header is ours.
        let mut fallback = hyper::Response::new(Full::new(Bytes::new()));
        *fallback.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        fallback
    }))
}
