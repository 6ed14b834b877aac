//! Connection metrics per service port, for the `/metrics` endpoint.
//!
//! Upstream's userspace proxier recorded no metrics of its own (its
//! package never used `pkg/proxy/metrics`); the sync metrics every mode
//! shares come from the sync loop here. These are additions, under the
//! `kubeproxy_userspace_` prefix, read from the relays' counters at each
//! scrape:
//!
//! | metric | type | what |
//! |---|---|---|
//! | `kubeproxy_userspace_active_connections` | gauge | TCP connections and UDP sessions open now |
//! | `kubeproxy_userspace_accepted_connections_total` | counter | TCP connections accepted, UDP sessions opened |
//! | `kubeproxy_userspace_refused_connections_total` | counter | connections reset and UDP datagrams dropped: no endpoint, or a client outside `loadBalancerSourceRanges` |
//! | `kubeproxy_userspace_endpoint_dial_failures_total` | counter | attempts to reach an endpoint that were refused or timed out |
//!
//! Labels: `namespace`, `service`, `port_name`, `protocol` (`TCP`, `UDP`)
//! and `ip_family` (`IPv4`, `IPv6`: dual-stack runs one relay per family).
//! Counters start again from zero when a service port's listener is opened
//! anew (after the Service was removed, or its protocol changed).

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use kp_model::{IpFamily, ServicePortName};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::stats::{StatsRegistry, StatsSnapshot};

/// The counters of every relay of the process, as one metrics collector.
/// Cloning shares the same set of relays.
#[derive(Debug, Clone, Default)]
pub struct UserspaceMetrics {
    relays: Arc<Mutex<Vec<(IpFamily, StatsRegistry)>>>,
}

/// One metric family: its name (counters without `_total`), help, type and
/// the value it takes from a snapshot.
struct Family {
    name: &'static str,
    help: &'static str,
    counter: bool,
    value: fn(&StatsSnapshot) -> u64,
}

/// The collector registered with a [`Registry`].
#[derive(Debug)]
struct ConnectionCollector {
    metrics: UserspaceMetrics,
}

const FAMILIES: [Family; 4] = [
    Family::gauge(
        "kubeproxy_userspace_active_connections",
        "TCP connections and UDP sessions the userspace proxy holds open, per service port",
        |stats| stats.active,
    ),
    Family::counter(
        "kubeproxy_userspace_accepted_connections",
        "TCP connections accepted and UDP sessions opened by the userspace proxy, per service port",
        |stats| stats.accepted,
    ),
    Family::counter(
        "kubeproxy_userspace_refused_connections",
        "TCP connections reset and UDP datagrams dropped by the userspace proxy because no endpoint could serve them or the client was outside loadBalancerSourceRanges, per service port",
        |stats| stats.refused,
    ),
    Family::counter(
        "kubeproxy_userspace_endpoint_dial_failures",
        "Attempts of the userspace proxy to reach an endpoint that were refused or timed out, per service port",
        |stats| stats.dial_failures,
    ),
];

impl Family {
    const fn gauge(
        name: &'static str,
        help: &'static str,
        value: fn(&StatsSnapshot) -> u64,
    ) -> Self {
        Self {
            name,
            help,
            counter: false,
            value,
        }
    }

    const fn counter(
        name: &'static str,
        help: &'static str,
        value: fn(&StatsSnapshot) -> u64,
    ) -> Self {
        Self {
            name,
            help,
            counter: true,
            value,
        }
    }
}

/// The metrics of the process's relays: the binary's backends (one per
/// family) add their relays with [`UserspaceMetrics::watch`], and its
/// agent, built apart from them, registers them once with [`register`].
pub fn process_metrics() -> &'static UserspaceMetrics {
    static METRICS: OnceLock<UserspaceMetrics> = OnceLock::new();
    METRICS.get_or_init(UserspaceMetrics::new)
}

/// Adds the metrics of the process's relays ([`process_metrics`]) to
/// `registry`, the metrics server's.
pub fn register(registry: &mut Registry) {
    process_metrics().register(registry);
}

impl UserspaceMetrics {
    /// Metrics over no relay yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reports the counters of the relay of `family` (see
    /// [`Relay::stats_registry`](crate::Relay::stats_registry)).
    pub fn watch(&self, family: IpFamily, stats: StatsRegistry) {
        self.relays
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((family, stats));
    }

    /// Adds the metrics to `registry`; they are read at each scrape.
    pub fn register(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(ConnectionCollector {
            metrics: self.clone(),
        }));
    }

    /// Every relay's service ports and their counters now.
    fn samples(&self) -> Vec<(IpFamily, ServicePortName, StatsSnapshot)> {
        let relays = self.relays.lock().unwrap_or_else(PoisonError::into_inner);
        relays
            .iter()
            .flat_map(|(family, stats)| {
                stats
                    .snapshot()
                    .into_iter()
                    .map(move |(name, snapshot)| (*family, name, snapshot))
            })
            .collect()
    }
}

impl Collector for ConnectionCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let samples = self.metrics.samples();
        // Without a listener there is nothing to say; the families are left
        // out rather than shown empty.
        if samples.is_empty() {
            return Ok(());
        }
        for family in &FAMILIES {
            let metric_type = if family.counter {
                MetricType::Counter
            } else {
                MetricType::Gauge
            };
            let mut metric =
                encoder.encode_descriptor(family.name, family.help, None, metric_type)?;
            for (ip_family, name, snapshot) in &samples {
                let labels = labels(*ip_family, name);
                let value = (family.value)(snapshot);
                let sample = metric.encode_family(&labels)?;
                if family.counter {
                    ConstCounter::new(value).encode(sample)?;
                } else {
                    // A gauge of i64: more open connections than that
                    // cannot exist.
                    ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX)).encode(sample)?;
                }
            }
        }
        Ok(())
    }
}

fn labels(family: IpFamily, name: &ServicePortName) -> [(&'static str, &str); 5] {
    let ip_family = match family {
        IpFamily::V4 => "IPv4",
        IpFamily::V6 => "IPv6",
    };
    [
        ("namespace", &name.service.namespace),
        ("service", &name.service.name),
        ("port_name", &name.port),
        ("protocol", name.protocol.as_api_str()),
        ("ip_family", ip_family),
    ]
}
