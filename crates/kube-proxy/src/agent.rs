//! The node agent around the proxiers: the sync observers (conntrack
//! cleanup, metrics, service health-check ports) and the healthz and
//! metrics servers.

use std::sync::{Arc, OnceLock};

use anyhow::Context;
use kp_agent::servers::{configz_json, healthz_handler, metrics_handler};
use kp_agent::{
    start_server, ListenAddresses, MetricsEndpoints, ProxyHealth, ProxyMetrics, Server,
    ServiceHealthServers,
};
use kp_config::{KubeProxyConfiguration, ProxyMode};
use kp_conntrack::{ConntrackCleaner, ConntrackMetrics};
use kp_iptables::{NFACCT_INVALID_DROPPED, NFACCT_LOCALHOST_NODE_PORTS};
use kp_model::{IpFamily, NamespacedName};
use kp_nfacct::NfacctClient;
use kp_sync::{Proxier, SyncObserver, SyncOutcome, SyncRequest};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// What the agent shares between the proxiers and its servers.
pub struct Agent {
    metrics: ProxyMetrics,
    health_checks: ServiceHealthServers,
    conntrack: ConntrackMetrics,
    /// Whether the mode DNATs flows to endpoints, whose conntrack entries
    /// then pin UDP and SCTP clients to them (every mode but userspace,
    /// whose flows end at the proxy's own relay, which picks endpoints
    /// itself).
    cleans_conntrack: bool,
    service_events: Arc<ServiceEvents>,
}

/// Posts a Warning event about each Service whose rules the kernel refused,
/// once the API client exists (with `--manifests` there is none, and the
/// log line and metric say it alone).
struct ServiceEvents {
    node_name: String,
    runtime: tokio::runtime::Handle,
    client: OnceLock<kube::Client>,
}

impl Agent {
    /// The agent of a proxy in `mode` with `config`; call inside the
    /// runtime.
    pub fn new(
        config: &KubeProxyConfiguration,
        mode: ProxyMode,
        node_name: &str,
    ) -> anyhow::Result<Self> {
        let metrics = ProxyMetrics::new(mode.as_str());
        if mode == ProxyMode::Iptables {
            metrics.count_nfacct(
                Box::new(NfacctClient::new()),
                NFACCT_INVALID_DROPPED,
                NFACCT_LOCALHOST_NODE_PORTS,
            );
        }
        register_build_info(&mut metrics.registry());
        let conntrack = ConntrackMetrics::new();
        conntrack.register(&mut metrics.registry());
        if mode == ProxyMode::Userspace {
            kp_userspace::metrics::register(&mut metrics.registry());
        }
        let health_checks = ServiceHealthServers::listening_on(
            tokio::runtime::Handle::current(),
            health_check_addresses(config)?,
        );
        Ok(Self {
            metrics,
            health_checks,
            conntrack,
            cleans_conntrack: mode != ProxyMode::Userspace,
            service_events: Arc::new(ServiceEvents {
                node_name: node_name.to_owned(),
                runtime: tokio::runtime::Handle::current(),
                client: OnceLock::new(),
            }),
        })
    }

    /// The metrics registry, for observers the binary adds.
    pub fn registry(&self) -> std::sync::MutexGuard<'_, prometheus_client::registry::Registry> {
        self.metrics.registry()
    }

    /// The API client to post events with.
    pub fn use_api_client(&self, client: &kube::Client) {
        // Set once: a second call would be the same client.
        let _ = self.service_events.client.set(client.clone());
    }

    /// Where the API client reports its requests (`rest_client_*`).
    pub fn api_requests(&self) -> Arc<dyn kp_source::api::RequestObserver> {
        self.metrics.api_requests()
    }

    /// `proxier` with the agent's observers attached.
    pub fn observe(&self, mut proxier: Proxier) -> Proxier {
        if self.cleans_conntrack {
            let cleaner = ConntrackCleaner::new(proxier.family(), self.conntrack.clone());
            proxier = proxier.with_observer(Arc::new(cleaner));
        }
        proxier
            .with_observer(Arc::clone(&self.service_events) as Arc<dyn SyncObserver>)
            .with_observer(self.metrics.observer())
            .with_observer(Arc::new(self.health_checks.clone()))
    }

    /// Starts the healthz and metrics servers on `tasks`; they stop with
    /// `stop`. With `bindAddressHardFail`, an address either server cannot
    /// bind is returned as the error (upstream exits with it); without, the
    /// server logs it and retries while the proxy runs.
    pub fn serve(
        &self,
        config: &KubeProxyConfiguration,
        mode: ProxyMode,
        proxiers: &[Arc<Proxier>],
        stop: &watch::Receiver<bool>,
        tasks: &mut JoinSet<()>,
    ) -> anyhow::Result<()> {
        let periods = config
            .sync_periods()
            .context("sync periods must not be negative")?;
        // Upstream's health timeout: two sync periods.
        let health = ProxyHealth::new(proxiers.to_vec(), 2 * periods.sync_period);
        self.health_checks.set_proxy_health(health.clone());
        self.metrics.watch(proxiers);

        let hard_fail = config.bind_address_hard_fail;
        let healthz = healthz_handler(health, self.metrics.clone());
        let address = &config.healthz_bind_address;
        if let Some(server) =
            start_server(Server::Healthz, address, healthz, stop.clone(), hard_fail)?
        {
            tasks.spawn(server);
        }

        let endpoints = MetricsEndpoints {
            metrics: self.metrics.clone(),
            mode: mode.as_str(),
            configz: configz_json(config),
            profiling: config.enable_profiling,
            set_verbosity: crate::logging::installed_verbosity().map(|verbosity| {
                Arc::new(move |text: &str| verbosity.set_from_text(text))
                    as kp_agent::servers::VerbositySetter
            }),
        };
        let handler = metrics_handler(endpoints);
        let address = &config.metrics_bind_address;
        if let Some(server) =
            start_server(Server::Metrics, address, handler, stop.clone(), hard_fail)?
        {
            tasks.spawn(server);
        }
        Ok(())
    }

    /// Closes the health-check node ports.
    pub fn stop(&self) {
        self.health_checks.stop_all();
    }
}

/// Where health-check node ports listen: the node-port addresses, resolved
/// against the host's addresses when a sync needs a new server. When the
/// host's addresses cannot be read, every address, so that load balancers
/// keep getting answers.
fn health_check_addresses(config: &KubeProxyConfiguration) -> anyhow::Result<ListenAddresses> {
    let node_ports = crate::modes::node_port_addresses(config)?;
    Ok(Arc::new(move |family, node| {
        let local = match kp_iptables::local_addresses() {
            Ok(local) => local,
            Err(error) => {
                tracing::warn!(%error, "Cannot read the node's addresses; health-check node ports listen on every address");
                return None;
            }
        };
        node_ports.resolve(family, node, &local)
    }))
}

impl SyncObserver for ServiceEvents {
    fn on_synced(&self, _request: &SyncRequest<'_>, _outcome: &SyncOutcome) {}

    fn on_service_refused(&self, _family: IpFamily, service: &NamespacedName, reason: &str) {
        let Some(client) = self.client.get().cloned() else {
            return;
        };
        let service = service.clone();
        let node_name = self.node_name.clone();
        let reason = reason.to_owned();
        // Called from the sync thread; the post runs on the runtime and
        // never holds up the next sync.
        self.runtime.spawn(async move {
            let _ =
                kp_source::api::post_refused_rules_event(&client, &service, &node_name, &reason)
                    .await;
        });
    }
}

/// component-base's `kubernetes_build_info`, which dashboards read for the
/// version each node runs: `major` and `minor` are the Kubernetes release
/// whose kube-proxy this build matches, `git_version` this program's
/// version (`v0.1.0-kube-proxy-rs`, so a dashboard tells it from
/// upstream's), `compiler` `rustc`, `platform` as Go names it. Labels
/// that have no value here (Go's version, a build date) are left out.
fn register_build_info(registry: &mut prometheus_client::registry::Registry) {
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    let (major, minor) = kp_config::KUBERNETES_COMPAT_VERSION;
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    };
    let labels = vec![
        ("major", major.to_string()),
        ("minor", minor.to_string()),
        (
            "git_version",
            format!("v{}-kube-proxy-rs", env!("CARGO_PKG_VERSION")),
        ),
        ("compiler", "rustc".to_owned()),
        ("platform", format!("{}/{arch}", std::env::consts::OS)),
    ];
    let info = Family::<Vec<(&'static str, String)>, Gauge>::default();
    info.get_or_create(&labels).set(1);
    registry.register(
        "kubernetes_build_info",
        "A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running.",
        info,
    );
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use kp_model::{IpFamily, NodeInfo};

    use super::*;

    #[test]
    fn health_check_ports_listen_on_the_selected_node_port_addresses() {
        let node = NodeInfo::default();
        let everywhere = health_check_addresses(&KubeProxyConfiguration::default()).unwrap();
        assert_eq!(everywhere(IpFamily::V4, &node), None);

        let config = KubeProxyConfiguration {
            node_port_addresses: Some(vec!["127.0.0.0/8".to_owned()]),
            ..KubeProxyConfiguration::default()
        };
        let loopback = health_check_addresses(&config).unwrap();
        let selected = loopback(IpFamily::V4, &node).unwrap();
        assert!(
            selected.contains(&"127.0.0.1".parse().unwrap()),
            "{selected:?}"
        );
        assert!(selected.iter().all(|ip| ip.is_loopback()), "{selected:?}");
    }
}
