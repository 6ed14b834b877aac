//! The healthz server (`healthzBindAddress`, default `0.0.0.0:10256`) and
//! the metrics server (`metricsBindAddress`, default `127.0.0.1:10249`),
//! with upstream's paths and answers. An empty address disables a server;
//! with `bindAddressHardFail`, an address that cannot be bound is an error
//! the caller ends the process with, as upstream does.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::health::ProxyHealth;
use crate::http::{serve, serve_retrying, Handler, RequestHead, Response};
use crate::metrics::{ExpositionFormat, ProxyMetrics};

/// What the metrics server shows besides the metrics.
#[derive(Clone)]
pub struct MetricsEndpoints {
    /// The metrics.
    pub metrics: ProxyMetrics,
    /// The proxy mode, for `/proxyMode`.
    pub mode: &'static str,
    /// The running configuration as upstream's `/configz` shows it:
    /// `{"kubeproxy.config.k8s.io": {…}}`.
    pub configz: String,
    /// `enableProfiling`: `/debug/pprof/` and `/debug/flags/v`.
    pub profiling: bool,
    /// Sets the log verbosity from `PUT /debug/flags/v`'s body, answering
    /// the text to send back or why it was refused; `None` when something
    /// else than `-v` decides what is logged (`RUST_LOG`).
    pub set_verbosity: Option<VerbositySetter>,
}

/// Sets the log verbosity from a text: the answer, or why not.
pub type VerbositySetter = Arc<dyn Fn(&str) -> Result<String, String> + Send + Sync>;

/// The `/configz` body for `config`.
pub fn configz_json(config: &kp_config::KubeProxyConfiguration) -> String {
    let config = serde_json::to_value(config).unwrap_or(serde_json::Value::Null);
    serde_json::json!({ "kubeproxy.config.k8s.io": config }).to_string()
}

/// `/healthz` and `/livez`.
pub fn healthz_handler(health: ProxyHealth, metrics: ProxyMetrics) -> Handler {
    Arc::new(move |request| match request.path {
        "/healthz" => {
            let now = health.check();
            let code = if now.healthz_ok() { 200 } else { 503 };
            metrics.healthz_answered(code);
            json(code, now.healthz_json())
        }
        "/livez" => {
            let now = health.check();
            let code = if now.healthy { 200 } else { 503 };
            metrics.livez_answered(code);
            json(code, now.livez_json())
        }
        _ => Response::not_found(),
    })
}

/// `/metrics`, `/healthz`, `/proxyMode`, `/configz`, `/debug/pprof/` and
/// `/debug/flags/v`.
pub fn metrics_handler(endpoints: MetricsEndpoints) -> Handler {
    Arc::new(move |request| {
        match request.path {
        "/metrics" => {
            let format = ExpositionFormat::accepted(request.accept);
            Response::new(200, format.content_type(), endpoints.metrics.render_as(format))
        }
        "/healthz" => Response::text(200, "ok"),
        "/proxyMode" => Response::text(200, endpoints.mode),
        "/configz" => Response::new(200, "application/json", endpoints.configz.clone()),
        "/debug/flags/v" if endpoints.profiling => debug_flags_v(&endpoints, request),
        path if path.starts_with("/debug/pprof") && endpoints.profiling => Response::text(
            501,
            "Go's pprof endpoints have no equivalent in kube-proxy-rs; profile the process with `perf record -g -p <pid>` instead.\n",
        ),
        _ => Response::not_found(),
    }
    })
}

/// `PUT /debug/flags/v` with the verbosity as its body, as component-base
/// answers it: 200 and `successfully set klog.logging.verbosity to N`, 400
/// with the reason, 406 for another method.
fn debug_flags_v(endpoints: &MetricsEndpoints, request: &RequestHead<'_>) -> Response {
    let plain = |status: u16, text: &str| {
        Response::new(status, "text/plain", format!("{text}\n"))
            .with_header("X-Content-Type-Options", "nosniff")
    };
    if request.method != "PUT" {
        return plain(406, "unsupported http method");
    }
    let Some(set) = &endpoints.set_verbosity else {
        return plain(
            400,
            "the log verbosity is set by RUST_LOG in this process, not by -v",
        );
    };
    match std::str::from_utf8(request.body) {
        Ok(text) => match set(text) {
            Ok(answer) => plain(200, &answer),
            Err(reason) => plain(400, &reason),
        },
        Err(_) => plain(400, "the body is not UTF-8 text"),
    }
}

/// Which of the proxy's two servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// The healthz server (`healthzBindAddress`).
    Healthz,
    /// The metrics server (`metricsBindAddress`).
    Metrics,
}

/// A server future, ready to be spawned; it ends with `stop`.
pub type Serving = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A server could not listen on its address and `bindAddressHardFail` is
/// set. The message is upstream's, so that operators' log searches match.
#[derive(Debug, thiserror::Error)]
#[error("{}", bind_failure_message(*server, *address))]
pub struct BindError {
    /// The server.
    pub server: Server,
    /// The address it could not listen on.
    pub address: SocketAddr,
    /// Why (address in use, not on this host, …).
    #[source]
    pub source: io::Error,
}

impl Server {
    /// The name used in logs: `healthz` or `metrics`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Healthz => "healthz",
            Self::Metrics => "metrics",
        }
    }
}

/// The `server` on `address` (empty: disabled, `None`), serving `handler`
/// until `stop`.
///
/// With `hard_fail` (`bindAddressHardFail`) the address is bound now and a
/// failure is returned, for the caller to end the process as upstream
/// does. Without it, as upstream, a failure is logged and binding is
/// retried every [`BIND_RETRY`](crate::http::BIND_RETRY) while the proxy
/// runs on.
pub fn start_server(
    server: Server,
    address: &str,
    handler: Handler,
    stop: watch::Receiver<bool>,
    hard_fail: bool,
) -> Result<Option<Serving>, BindError> {
    let Some(address) = parse(server.name(), address) else {
        return Ok(None);
    };
    if !hard_fail {
        return Ok(Some(Box::pin(serve_retrying(
            server.name(),
            address,
            handler,
            stop,
        ))));
    }
    let listener = crate::http::listen(address).map_err(|source| BindError {
        server,
        address,
        source,
    })?;
    tracing::info!(server = server.name(), %address, "Serving");
    Ok(Some(Box::pin(async move {
        match TcpListener::from_std(listener) {
            Ok(listener) => serve(listener, handler, stop).await,
            // Registering a bound socket with the runtime fails only when
            // the runtime is out of resources.
            Err(error) => {
                tracing::error!(server = server.name(), %address, %error, "Cannot serve");
            }
        }
    })))
}

/// Upstream's messages: `failed to start proxier healthz on ADDR` and
/// `starting metrics server failed` (the cause follows in the chain).
fn bind_failure_message(server: Server, address: SocketAddr) -> String {
    match server {
        Server::Healthz => format!("failed to start proxier healthz on {address}"),
        Server::Metrics => format!("starting metrics server failed: cannot listen on {address}"),
    }
}

fn parse(server: &'static str, address: &str) -> Option<SocketAddr> {
    if address.is_empty() {
        tracing::info!(server, "Server disabled by an empty bind address");
        return None;
    }
    match address.parse() {
        Ok(address) => Some(address),
        Err(error) => {
            // Configuration validation rejects such addresses; this is a
            // second line.
            tracing::error!(server, address, %error, "Invalid bind address; server not started");
            None
        }
    }
}

fn json(code: u16, body: String) -> Response {
    Response::new(code, "application/json", body).with_header("X-Content-Type-Options", "nosniff")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::sync::Mutex;

    fn hello() -> Handler {
        Arc::new(|_request| Response::text(200, "hello"))
    }

    #[tokio::test]
    async fn with_hard_fail_a_taken_address_is_an_error_naming_server_and_address() {
        let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken = squatter.local_addr().unwrap();
        let (_stop_tx, stop) = watch::channel(false);

        let healthz = start_server(
            Server::Healthz,
            &taken.to_string(),
            hello(),
            stop.clone(),
            true,
        );
        let metrics = start_server(Server::Metrics, &taken.to_string(), hello(), stop, true);

        let healthz = healthz.err().unwrap();
        assert_eq!(
            healthz.to_string(),
            format!("failed to start proxier healthz on {taken}")
        );
        assert_eq!(healthz.source.kind(), io::ErrorKind::AddrInUse);
        let metrics = metrics.err().unwrap();
        assert_eq!(
            metrics.to_string(),
            format!("starting metrics server failed: cannot listen on {taken}")
        );
        assert_eq!((metrics.server, metrics.address), (Server::Metrics, taken));
    }

    #[tokio::test]
    async fn with_hard_fail_an_address_not_on_the_host_is_an_error() {
        let (_stop_tx, stop) = watch::channel(false);
        // TEST-NET-3: on no interface of any host.
        let error = start_server(Server::Metrics, "203.0.113.7:10249", hello(), stop, true)
            .err()
            .unwrap();
        assert_eq!(error.source.kind(), io::ErrorKind::AddrNotAvailable);
    }

    #[tokio::test]
    async fn without_hard_fail_a_taken_address_is_retried_not_an_error() {
        let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken = squatter.local_addr().unwrap().to_string();
        let (_stop_tx, stop) = watch::channel(false);

        let serving = start_server(Server::Metrics, &taken, hello(), stop, false);

        assert!(matches!(serving, Ok(Some(_))));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_hard_fail_a_free_address_is_bound_at_once_and_served_until_stop() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = free.local_addr().unwrap();
        drop(free);
        let (stop_tx, stop) = watch::channel(false);

        let serving = start_server(
            Server::Healthz,
            &address.to_string(),
            hello(),
            stop.clone(),
            true,
        )
        .unwrap()
        .unwrap();

        let second = start_server(Server::Metrics, &address.to_string(), hello(), stop, true);
        assert_eq!(
            second.err().unwrap().source.kind(),
            io::ErrorKind::AddrInUse,
            "bound before the server runs"
        );
        let task = tokio::spawn(serving);
        let reply = tokio::task::spawn_blocking(move || kp_testkit::http::get(address, "/"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(reply.body, "hello");
        stop_tx.send(true).unwrap();
        task.await.unwrap();
    }

    fn endpoints_of(
        profiling: bool,
        settable: bool,
    ) -> (MetricsEndpoints, Arc<Mutex<Vec<String>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        let set: VerbositySetter = Arc::new(move |text: &str| {
            record.lock().unwrap().push(text.to_owned());
            match text.trim() {
                "4" => Ok("successfully set klog.logging.verbosity to 4".to_owned()),
                other => Err(format!("failed set klog.logging.verbosity {other}")),
            }
        });
        let endpoints = MetricsEndpoints {
            metrics: ProxyMetrics::new("iptables"),
            mode: "iptables",
            configz: "{}".to_owned(),
            profiling,
            set_verbosity: settable.then_some(set),
        };
        (endpoints, seen)
    }

    fn call(handler: &Handler, method: &str, body: &[u8]) -> Response {
        handler(&RequestHead {
            method,
            path: "/debug/flags/v",
            accept: "",
            body,
        })
    }

    #[test]
    fn debug_flags_v_sets_the_verbosity_with_profiling_only() {
        let (endpoints, seen) = endpoints_of(true, true);
        let handler = metrics_handler(endpoints);
        let set = call(&handler, "PUT", b"4");
        assert_eq!(set.status, 200);
        assert_eq!(set.body, "successfully set klog.logging.verbosity to 4\n");
        assert!(set
            .headers
            .contains(&("X-Content-Type-Options", "nosniff".to_owned())));
        let refused = call(&handler, "PUT", b"x");
        assert_eq!(refused.status, 400);
        assert_eq!(refused.body, "failed set klog.logging.verbosity x\n");
        assert_eq!(call(&handler, "GET", b"").status, 406);
        assert_eq!(call(&handler, "PUT", &[0xff, 0xfe]).status, 400);
        assert_eq!(*seen.lock().unwrap(), ["4", "x"]);

        let (endpoints, seen) = endpoints_of(false, true);
        let handler = metrics_handler(endpoints);
        assert_eq!(call(&handler, "PUT", b"4").status, 404);
        assert!(seen.lock().unwrap().is_empty());

        let (endpoints, _) = endpoints_of(true, false);
        let under_rust_log = call(&metrics_handler(endpoints), "PUT", b"4");
        assert_eq!(under_rust_log.status, 400);
        assert!(
            under_rust_log.body.contains("RUST_LOG"),
            "{under_rust_log:?}"
        );
    }

    #[test]
    fn an_empty_address_disables_the_server() {
        let (_stop_tx, stop) = watch::channel(false);
        assert!(start_server(Server::Healthz, "", hello(), stop, true)
            .unwrap()
            .is_none());
    }
}
