//! The healthz server (`healthzBindAddress`, default `0.0.0.0:10256`) and
//! the metrics server (`metricsBindAddress`, default `127.0.0.1:10249`),
//! with upstream's paths and answers. An empty address disables a server.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;

use crate::health::ProxyHealth;
use crate::http::{serve_retrying, Handler, Response};
use crate::metrics::ProxyMetrics;

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
    /// `enableProfiling`.
    pub profiling: bool,
}

/// The `/configz` body for `config`.
pub fn configz_json(config: &kp_config::KubeProxyConfiguration) -> String {
    let config = serde_json::to_value(config).unwrap_or(serde_json::Value::Null);
    serde_json::json!({ "kubeproxy.config.k8s.io": config }).to_string()
}

/// `/healthz` and `/livez`.
pub fn healthz_handler(health: ProxyHealth, metrics: ProxyMetrics) -> Handler {
    Arc::new(move |_method, path| match path {
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

/// `/metrics`, `/healthz`, `/proxyMode`, `/configz` and `/debug/pprof/`.
pub fn metrics_handler(endpoints: MetricsEndpoints) -> Handler {
    Arc::new(move |_method, path| {
        match path {
        "/metrics" => Response::new(
            200,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            endpoints.metrics.render(),
        ),
        "/healthz" => Response::text(200, "ok"),
        "/proxyMode" => Response::text(200, endpoints.mode),
        "/configz" => Response::new(200, "application/json", endpoints.configz.clone()),
        path if path.starts_with("/debug/pprof") && endpoints.profiling => Response::text(
            501,
            "Go's pprof endpoints have no equivalent in kube-proxy-rs; profile the process with `perf record -g -p <pid>` instead.\n",
        ),
        _ => Response::not_found(),
    }
    })
}

/// Serves the healthz server on `address` until `stop`.
pub async fn serve_healthz(address: &str, handler: Handler, stop: watch::Receiver<bool>) {
    if let Some(address) = parse("healthz", address) {
        serve_retrying("healthz", address, handler, stop).await;
    }
}

/// Serves the metrics server on `address` until `stop`.
pub async fn serve_metrics(address: &str, handler: Handler, stop: watch::Receiver<bool>) {
    if let Some(address) = parse("metrics", address) {
        serve_retrying("metrics", address, handler, stop).await;
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
