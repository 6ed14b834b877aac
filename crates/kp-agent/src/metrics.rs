//! The `kubeproxy_*` metrics, with upstream's names, help texts, labels
//! and buckets (`pkg/proxy/metrics`), plus the process metrics.
//!
//! Sync metrics are fed by a [`SyncObserver`] on each family's proxier;
//! change counts, the last queued time and the process metrics are read
//! when `/metrics` is scraped.
//!
//! One metric is our own, under a `kubeproxy_rs_` prefix that no upstream
//! metric uses (we add, we never rename): the failed list and watch
//! requests of the API source per resource.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use kp_model::IpFamily;
use kp_nfacct::{CounterMetric, CounterReader, NfacctCollector};
use kp_source::api::watch_failures;
use kp_sync::{Proxier, SyncObserver, SyncOutcome, SyncRequest, SyncStats};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

mod exposition;
mod process;
mod rest_client;

pub use exposition::{to_prometheus_text, ExpositionFormat};

/// Label pairs of one series.
type Labels = Vec<(&'static str, String)>;
/// A gauge holding seconds or timestamps.
type FloatGauge = Gauge<f64, AtomicU64>;
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// The metrics of one proxy process, shared by the metrics server, the
/// healthz server and the sync observers.
#[derive(Clone)]
pub struct ProxyMetrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Mutex<Registry>,
    proxiers: Mutex<Vec<Arc<Proxier>>>,
    sync: Sync,
    changes: Changes,
    healthz: Family<Labels, Counter>,
    livez: Family<Labels, Counter>,
    watch_failures: Family<Labels, Counter>,
    process: process::ProcessMetrics,
    rest_client: rest_client::RestClientMetrics,
}

/// Metrics moved by syncs.
struct Sync {
    duration: Histograms,
    full_duration: Histograms,
    partial_duration: Histograms,
    last_timestamp: Family<Labels, FloatGauge>,
    network_programming: Histograms,
    iptables_total: Family<Labels, Gauge>,
    iptables_last: Family<Labels, Gauge>,
    restore_failures: Family<Labels, Counter>,
    partial_restore_failures: Family<Labels, Counter>,
    nftables_sync_failures: Family<Labels, Counter>,
    nftables_cleanup_failures: Family<Labels, Counter>,
    no_local_endpoints: Family<Labels, Gauge>,
}

/// Metrics read from the trackers when scraped.
#[derive(Default)]
struct Changes {
    last_queued: Family<Labels, FloatGauge>,
    /// Services left out of the rules because the kernel refused theirs,
    /// per family.
    refused_services: Family<Labels, Gauge>,
    service_pending: Gauge,
    service_total: Counter,
    endpoint_pending: Gauge,
    endpoint_total: Counter,
}

fn sync_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// 0, 0.25 s, 0.5 s, 1–59 s, 60–115 s by 5 s, 2–5 min by 30 s (upstream's
/// merged linear buckets).
fn programming_buckets() -> Histogram {
    let mut buckets = vec![0.0, 0.25, 0.5];
    buckets.extend((1..=59).map(f64::from));
    buckets.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    buckets.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    Histogram::new(buckets)
}

fn histograms(constructor: fn() -> Histogram) -> Histograms {
    Family::new_with_constructor(constructor)
}

fn family_label(family: IpFamily) -> Labels {
    let name = match family {
        IpFamily::V4 => "IPv4",
        IpFamily::V6 => "IPv6",
    };
    vec![("ip_family", name.to_owned())]
}

impl ProxyMetrics {
    /// Every metric that applies to `mode` (`iptables`, `nftables`, `ipvs`,
    /// `userspace`), registered under upstream's names.
    pub fn new(mode: &'static str) -> Self {
        let sync = Sync {
            duration: histograms(sync_buckets),
            full_duration: histograms(sync_buckets),
            partial_duration: histograms(sync_buckets),
            last_timestamp: Family::default(),
            network_programming: histograms(programming_buckets),
            iptables_total: Family::default(),
            iptables_last: Family::default(),
            restore_failures: Family::default(),
            partial_restore_failures: Family::default(),
            nftables_sync_failures: Family::default(),
            nftables_cleanup_failures: Family::default(),
            no_local_endpoints: Family::default(),
        };
        let changes = Changes::default();
        let healthz = Family::default();
        let livez = Family::default();
        let watch_failures = Family::default();
        let mut registry = Registry::default();
        register_common(&mut registry, &sync, &changes, &healthz, &livez);
        register_own(&mut registry, &watch_failures, &changes.refused_services);
        register_mode(&mut registry, &sync, mode);
        let process = process::ProcessMetrics::register(&mut registry);
        let rest_client = rest_client::RestClientMetrics::register(&mut registry);
        Self {
            inner: Arc::new(Inner {
                registry: Mutex::new(registry),
                proxiers: Mutex::new(Vec::new()),
                sync,
                changes,
                healthz,
                livez,
                watch_failures,
                process,
                rest_client,
            }),
        }
    }

    /// What the API client tells of each request it makes (client-go's
    /// `rest_client_*` metrics).
    pub fn api_requests(&self) -> Arc<dyn kp_source::api::RequestObserver> {
        Arc::new(self.inner.rest_client.clone())
    }

    /// The registry, to add the metrics of other parts (conntrack).
    pub fn registry(&self) -> MutexGuard<'_, Registry> {
        lock(&self.inner.registry)
    }

    /// The proxiers whose change counts and queue times are reported. Their
    /// families' sync histograms and failure counters show from the start,
    /// at zero.
    pub fn watch(&self, proxiers: &[Arc<Proxier>]) {
        let sync = &self.inner.sync;
        for proxier in proxiers {
            let labels = family_label(proxier.family());
            for histograms in [
                &sync.duration,
                &sync.full_duration,
                &sync.partial_duration,
                &sync.network_programming,
            ] {
                drop(histograms.get_or_create(&labels));
            }
            for counters in [
                &sync.restore_failures,
                &sync.partial_restore_failures,
                &sync.nftables_sync_failures,
                &sync.nftables_cleanup_failures,
            ] {
                drop(counters.get_or_create(&labels));
            }
        }
        *lock(&self.inner.proxiers) = proxiers.to_vec();
    }

    /// Publishes the iptables mode's nfacct counters under upstream's names:
    /// the packets dropped as conntrack-INVALID (counter `invalid_dropped`)
    /// and those accepted on localhost NodePorts (`localhost_accepted`),
    /// read through `reader` on every scrape.
    pub fn count_nfacct(
        &self,
        reader: Box<dyn CounterReader>,
        invalid_dropped: &'static str,
        localhost_accepted: &'static str,
    ) {
        let metrics = vec![
            CounterMetric {
                metric: "kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
                help: "packets dropped by iptables to work around conntrack problems",
                counter: invalid_dropped,
            },
            CounterMetric {
                metric: "kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
                help: "Number of packets accepted on nodeports of loopback interface",
                counter: localhost_accepted,
            },
        ];
        self.registry()
            .register_collector(Box::new(NfacctCollector::new(reader, metrics)));
    }

    /// The observer to attach to each family's proxier.
    pub fn observer(&self) -> Arc<dyn SyncObserver> {
        Arc::new(self.clone())
    }

    /// Counts one `/healthz` answer with status `code`.
    pub fn healthz_answered(&self, code: u16) {
        self.inner
            .healthz
            .get_or_create(&vec![("code", code.to_string())])
            .inc();
    }

    /// Counts one `/livez` answer with status `code`.
    pub fn livez_answered(&self, code: u16) {
        self.inner
            .livez
            .get_or_create(&vec![("code", code.to_string())])
            .inc();
    }

    /// The metrics in the OpenMetrics text format, with the values read at
    /// scrape time brought up to date.
    pub fn render(&self) -> String {
        self.refresh_changes();
        self.refresh_watch_failures();
        self.inner.process.refresh();
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &self.registry());
        text
    }

    /// The metrics in `format`.
    pub fn render_as(&self, format: ExpositionFormat) -> String {
        let text = self.render();
        match format {
            ExpositionFormat::OpenMetrics => text,
            ExpositionFormat::Prometheus => to_prometheus_text(&text),
        }
    }

    fn refresh_changes(&self) {
        let changes = &self.inner.changes;
        let mut totals = kp_sync::ChangeCounts::default();
        for proxier in lock(&self.inner.proxiers).iter() {
            let status = proxier.status();
            let counts = status.changes();
            // Both families see every object; the counts are the same, so
            // the largest is reported once, as upstream's shared trackers do.
            totals.services_total = totals.services_total.max(counts.services_total);
            totals.endpoint_slices_total = totals
                .endpoint_slices_total
                .max(counts.endpoint_slices_total);
            totals.services_pending = totals.services_pending.max(counts.services_pending);
            totals.endpoint_slices_pending = totals
                .endpoint_slices_pending
                .max(counts.endpoint_slices_pending);
            changes
                .refused_services
                .get_or_create(&family_label(proxier.family()))
                .set(as_gauge(status.refused_services().len() as u64));
            if let Some(queued) = status.last_queued_wall() {
                changes
                    .last_queued
                    .get_or_create(&family_label(proxier.family()))
                    .set(unix_seconds(queued));
            }
        }
        catch_up(&changes.service_total, totals.services_total);
        catch_up(&changes.endpoint_total, totals.endpoint_slices_total);
        changes
            .service_pending
            .set(as_gauge(totals.services_pending));
        changes
            .endpoint_pending
            .set(as_gauge(totals.endpoint_slices_pending));
    }
}

impl ProxyMetrics {
    /// Brings the API source's failure counts (process-wide, kept by
    /// kp-source) into the registry.
    fn refresh_watch_failures(&self) {
        let failures = watch_failures();
        for (resource, total) in [
            ("services", failures.services),
            ("endpointslices", failures.endpoint_slices),
            ("nodes", failures.nodes),
        ] {
            let labels = vec![("resource", resource.to_owned())];
            catch_up(&self.inner.watch_failures.get_or_create(&labels), total);
        }
    }
}

impl SyncObserver for ProxyMetrics {
    fn on_synced(&self, request: &SyncRequest<'_>, _outcome: &SyncOutcome) {
        let (mut internal, mut external) = (0, 0);
        for state in request.service_ports.values() {
            internal += i64::from(state.plan.no_local_endpoints_internal());
            external += i64::from(state.plan.no_local_endpoints_external());
        }
        let sync = &self.inner.sync;
        for (policy, count) in [("internal", internal), ("external", external)] {
            let mut labels = family_label(request.family);
            labels.push(("traffic_policy", policy.to_owned()));
            sync.no_local_endpoints.get_or_create(&labels).set(count);
        }
    }

    fn on_sync_finished(&self, family: IpFamily, stats: &SyncStats) {
        let sync = &self.inner.sync;
        let labels = family_label(family);
        let seconds = stats.duration.as_secs_f64();
        match &stats.result {
            Ok(outcome) => {
                sync.duration.get_or_create(&labels).observe(seconds);
                let by_kind = if outcome.full {
                    &sync.full_duration
                } else {
                    &sync.partial_duration
                };
                by_kind.get_or_create(&labels).observe(seconds);
                let programming = sync.network_programming.get_or_create(&labels);
                for latency in &stats.network_programming {
                    programming.observe(latency.as_secs_f64());
                }
                let now = unix_seconds(stats.finished_at_wall);
                sync.last_timestamp.get_or_create(&labels).set(now);
                let cleanup_failures = u64::try_from(outcome.cleanup_failures).unwrap_or(u64::MAX);
                sync.nftables_cleanup_failures
                    .get_or_create(&labels)
                    .inc_by(cleanup_failures);
                set_per_table(&sync.iptables_total, &labels, &outcome.rules_per_table);
                set_per_table(
                    &sync.iptables_last,
                    &labels,
                    &outcome.rules_written_per_table,
                );
            }
            // Upstream counts only rule sets that could not be applied: a
            // failed listing or a broken netlink exchange fails our sync but
            // is not a restore failure; requests the kernel refused are.
            Err(_) if stats.rejected => {
                sync.restore_failures.get_or_create(&labels).inc();
                sync.nftables_sync_failures.get_or_create(&labels).inc();
                if !stats.full {
                    sync.partial_restore_failures.get_or_create(&labels).inc();
                }
            }
            Err(_) => {}
        }
    }
}

fn register_common(
    registry: &mut Registry,
    sync: &Sync,
    changes: &Changes,
    healthz: &Family<Labels, Counter>,
    livez: &Family<Labels, Counter>,
) {
    registry.register(
        "kubeproxy_sync_proxy_rules_duration_seconds",
        "SyncProxyRules latency in seconds",
        sync.duration.clone(),
    );
    registry.register(
        "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
        "The last time a sync of proxy rules was queued",
        changes.last_queued.clone(),
    );
    registry.register(
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
        "The last time proxy rules were successfully synced",
        sync.last_timestamp.clone(),
    );
    registry.register(
        "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
        "Pending proxy rules Endpoint changes",
        changes.endpoint_pending.clone(),
    );
    registry.register(
        "kubeproxy_sync_proxy_rules_endpoint_changes",
        "Cumulative proxy rules Endpoint changes",
        changes.endpoint_total.clone(),
    );
    registry.register(
        "kubeproxy_sync_proxy_rules_service_changes_pending",
        "Pending proxy rules Service changes",
        changes.service_pending.clone(),
    );
    registry.register(
        "kubeproxy_sync_proxy_rules_service_changes",
        "Cumulative proxy rules Service changes",
        changes.service_total.clone(),
    );
    registry.register(
        "kubeproxy_proxy_healthz",
        "Cumulative proxy healthz HTTP status",
        healthz.clone(),
    );
    registry.register(
        "kubeproxy_proxy_livez",
        "Cumulative proxy livez HTTP status",
        livez.clone(),
    );
    registry.register(
        "kubeproxy_network_programming_duration_seconds",
        "In Cluster Network Programming Latency in seconds",
        sync.network_programming.clone(),
    );
    registry.register(
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
        "Number of services with a Local traffic policy and no endpoints",
        sync.no_local_endpoints.clone(),
    );
}

/// kube-proxy-rs' own metrics. `kubeproxy_rs_api_watch_failures_total`
/// counts every failed list or watch request of the API source (410 Gone,
/// a normal request to list again, excepted), per `resource`; during an
/// outage it grows by about one per second per watch, while the log says
/// only when the outage began and ended. Upstream has no such metric
/// (client-go logs each failure instead), hence the `kubeproxy_rs_` prefix.
fn register_own(
    registry: &mut Registry,
    watch_failures: &Family<Labels, Counter>,
    refused_services: &Family<Labels, Gauge>,
) {
    registry.register(
        "kubeproxy_rs_api_watch_failures",
        "Failed list and watch requests to the API server, per resource (kube-proxy-rs)",
        watch_failures.clone(),
    );
    registry.register(
        "kubeproxy_rs_sync_refused_services",
        "Services left out of the proxy rules until they change, because the kernel refused their rules (kube-proxy-rs)",
        refused_services.clone(),
    );
}

fn register_mode(registry: &mut Registry, sync: &Sync, mode: &str) {
    if mode == "iptables" {
        registry.register(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            sync.full_duration.clone(),
        );
        registry.register(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            sync.partial_duration.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures",
            "Cumulative proxy iptables partial restore failures",
            sync.partial_restore_failures.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_iptables_total",
            "Total number of iptables rules owned by kube-proxy",
            sync.iptables_total.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_iptables_last",
            "Number of iptables rules written by kube-proxy in last sync",
            sync.iptables_last.clone(),
        );
    }
    if mode == "iptables" || mode == "ipvs" {
        registry.register(
            "kubeproxy_sync_proxy_rules_iptables_restore_failures",
            "Cumulative proxy iptables restore failures",
            sync.restore_failures.clone(),
        );
    }
    if mode == "nftables" {
        registry.register(
            "kubeproxy_sync_proxy_rules_nftables_sync_failures",
            "Cumulative proxy nftables sync failures",
            sync.nftables_sync_failures.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_nftables_cleanup_failures",
            "Cumulative proxy nftables cleanup failures",
            sync.nftables_cleanup_failures.clone(),
        );
    }
}

/// Sets one gauge per table, labelled with `labels` and the table.
fn set_per_table(gauges: &Family<Labels, Gauge>, labels: &Labels, counts: &[(String, usize)]) {
    for (table, count) in counts {
        let mut labels = labels.clone();
        labels.push(("table", table.clone()));
        gauges
            .get_or_create(&labels)
            .set(as_gauge(u64::try_from(*count).unwrap_or(u64::MAX)));
    }
}

/// Raises `counter` to `total` (counters only go up).
fn catch_up(counter: &Counter, total: u64) {
    let current = counter.get();
    if total > current {
        counter.inc_by(total - current);
    }
}

fn as_gauge(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these locks is a plain assignment.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
