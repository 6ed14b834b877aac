//! The conntrack reconciler's metrics, with upstream's names, help texts,
//! buckets and `ip_family` label (`pkg/proxy/metrics`).

use std::time::Duration;

use kp_model::IpFamily;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Name of the histogram of reconcile durations.
pub const SYNC_DURATION_METRIC: &str = "kubeproxy_conntrack_reconciler_sync_duration_seconds";
/// Name of the counter of deleted entries, without the `_total` suffix that
/// the encoder appends to every counter.
pub const DELETED_ENTRIES_METRIC: &str = "kubeproxy_conntrack_reconciler_deleted_entries";

/// `ip_family="IPv4"` or `ip_family="IPv6"`.
type FamilyLabel = [(&'static str, &'static str); 1];

/// `kubeproxy_conntrack_reconciler_sync_duration_seconds{ip_family}` and
/// `kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family}`.
/// Clones share the same series: create one, register it once, and hand a
/// clone to the cleaner of each family.
#[derive(Debug, Clone)]
pub struct ConntrackMetrics {
    sync_duration: Family<FamilyLabel, Histogram, fn() -> Histogram>,
    deleted_entries: Family<FamilyLabel, Counter>,
}

impl ConntrackMetrics {
    /// Metrics with no series yet.
    pub fn new() -> Self {
        Self {
            sync_duration: Family::new_with_constructor(sync_duration_histogram),
            deleted_entries: Family::default(),
        }
    }

    /// Registers both metrics in `registry` under their full names (the
    /// registry must not add a prefix of its own).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            SYNC_DURATION_METRIC,
            "ReconcileConntrackFlowsLatency latency in seconds",
            self.sync_duration.clone(),
        );
        registry.register(
            DELETED_ENTRIES_METRIC,
            "Cumulative conntrack flows deleted by conntrack reconciler",
            self.deleted_entries.clone(),
        );
    }

    /// Records one reconcile of `family` that took `duration` and deleted
    /// `deleted` entries.
    pub fn record(&self, family: IpFamily, duration: Duration, deleted: usize) {
        let label = label(family);
        self.sync_duration
            .get_or_create(&label)
            .observe(duration.as_secs_f64());
        self.deleted_entries
            .get_or_create(&label)
            .inc_by(deleted as u64);
    }

    /// Entries deleted so far for `family`.
    pub fn deleted_entries(&self, family: IpFamily) -> u64 {
        self.deleted_entries.get_or_create(&label(family)).get()
    }
}

impl Default for ConntrackMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Upstream's buckets: 1 ms doubling to about 16 s (15 buckets), as for
/// the sync durations.
fn sync_duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

fn label(family: IpFamily) -> FamilyLabel {
    [("ip_family", family.as_api_str())]
}
