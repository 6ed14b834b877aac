//! What kube-proxy does on a node besides programming rules, with
//! upstream's ports, paths, names and formats so that existing probes,
//! dashboards and load balancers keep working:
//!
//! - [`health`]: the proxy's health as upstream's healthz server judges it,
//!   and the JSON of `/healthz` and `/livez`;
//! - [`metrics`]: the `kubeproxy_*` metrics, fed by a sync observer;
//! - [`servers`]: the healthz server (`healthzBindAddress`, 10256) and the
//!   metrics server (`metricsBindAddress`, 10249);
//! - [`service_health`]: the health-check node ports of
//!   `externalTrafficPolicy: Local` LoadBalancer Services;
//! - [`http`]: the small HTTP/1 server they share, and the limits it
//!   holds every connection to;
//! - [`descriptors`]: the process's descriptor limit, raised at start.

mod connections;
pub mod descriptors;
pub mod health;
pub mod http;
pub mod metrics;
pub mod servers;
pub mod service_health;
mod time_format;

pub use health::{Health, ProxyHealth};
pub use http::ConnectionLimits;
pub use metrics::ProxyMetrics;
pub use servers::{start_server, BindError, MetricsEndpoints, Server, Serving};
pub use service_health::{ListenAddresses, ServiceHealthServers};
