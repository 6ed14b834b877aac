//! The state of one family's sync loop, shared with the health and metrics
//! servers.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use kp_model::NamespacedName;
use tokio::time::Instant;

use crate::backend::SyncOutcome;

/// What the sync loop of one family has done so far. Cheap to read from any
/// thread; the sync loop is the only writer.
///
/// Health follows upstream's healthz logic: a proxy is healthy when nothing
/// has been waiting longer than allowed, i.e. when [`queued_since`] is unset
/// or recent.
///
/// [`queued_since`]: SyncStatus::queued_since
#[derive(Debug, Default)]
pub struct SyncStatus {
    inner: Mutex<StatusInner>,
}

/// One finished sync.
#[derive(Debug, Clone, PartialEq)]
pub struct SyncStats {
    /// When the sync finished (monotonic clock, tokio time).
    pub finished_at: Instant,
    /// When the sync finished (wall clock, for
    /// `kubeproxy_sync_proxy_rules_last_timestamp_seconds`).
    pub finished_at_wall: SystemTime,
    /// How long the sync took, categorizing and applying included.
    pub duration: Duration,
    /// Whether a full sync was asked of the backend.
    pub full: bool,
    /// Number of service ports handed to the backend.
    pub service_ports: usize,
    /// Number of endpoints of all service ports handed to the backend.
    pub endpoints: usize,
    /// The backend's outcome, or the error (with its causes) when it failed.
    pub result: Result<SyncOutcome, String>,
    /// Whether the sync failed because the rule set could not be applied:
    /// the kernel refused it ([`BackendError::Rejected`](crate::BackendError::Rejected))
    /// or the program that applies it is missing
    /// ([`BackendError::Unavailable`](crate::BackendError::Unavailable)).
    pub rejected: bool,
    /// On success, for each EndpointSlice update this sync applied that
    /// carried a trigger time later than the proxy's start, the time from
    /// that trigger to the end of the sync
    /// (`kubeproxy_network_programming_duration_seconds`).
    pub network_programming: Vec<Duration>,
}

/// Counters since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncTotals {
    /// Successful full syncs.
    pub full_syncs: u64,
    /// Successful partial syncs.
    pub partial_syncs: u64,
    /// Failed syncs.
    pub failed_syncs: u64,
}

/// Which kind of object a recorded change was of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// A Service.
    Service,
    /// An EndpointSlice.
    EndpointSlice,
}

/// Changes recorded by the trackers: since start, and not yet taken by a
/// sync (`kubeproxy_sync_proxy_rules_{service,endpoint}_changes_{total,pending}`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChangeCounts {
    /// Service changes since start.
    pub services_total: u64,
    /// EndpointSlice changes since start.
    pub endpoint_slices_total: u64,
    /// Service changes no sync has taken yet.
    pub services_pending: u64,
    /// EndpointSlice changes no sync has taken yet.
    pub endpoint_slices_pending: u64,
}

#[derive(Debug, Default)]
struct StatusInner {
    queued_since: Option<Instant>,
    last_queued_wall: Option<SystemTime>,
    last_successful_sync: Option<Instant>,
    last_sync: Option<SyncStats>,
    totals: SyncTotals,
    changes: ChangeCounts,
    unavailable: Option<String>,
    refused_services: Vec<NamespacedName>,
}

impl SyncStatus {
    /// A status with nothing queued and no sync done.
    pub fn new() -> Self {
        Self::default()
    }

    /// When the oldest change that no successful sync has applied yet was
    /// recorded; `None` when everything recorded is applied.
    pub fn queued_since(&self) -> Option<Instant> {
        self.lock().queued_since
    }

    /// When the last successful sync finished.
    pub fn last_successful_sync(&self) -> Option<Instant> {
        self.lock().last_successful_sync
    }

    /// The last sync, successful or not.
    pub fn last_sync(&self) -> Option<SyncStats> {
        self.lock().last_sync.clone()
    }

    /// Counters of syncs since start.
    pub fn totals(&self) -> SyncTotals {
        self.lock().totals
    }

    /// Changes recorded since start and not yet synced.
    pub fn changes(&self) -> ChangeCounts {
        self.lock().changes
    }

    /// Why the mode cannot run on this host, while the last sync failed
    /// with [`BackendError::Unavailable`](crate::BackendError::Unavailable);
    /// `None` once a sync succeeds.
    pub fn unavailable(&self) -> Option<String> {
        self.lock().unavailable.clone()
    }

    /// The Services whose rules the kernel refused and that the syncs leave
    /// out until they change (`kubeproxy_rs_sync_refused_services`).
    pub fn refused_services(&self) -> Vec<NamespacedName> {
        self.lock().refused_services.clone()
    }

    /// Sets the Services the syncs leave out.
    pub(crate) fn set_refused_services(&self, services: Vec<NamespacedName>) {
        self.lock().refused_services = services;
    }

    /// When a sync was last asked for (wall clock, for
    /// `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds`).
    pub fn last_queued_wall(&self) -> Option<SystemTime> {
        self.lock().last_queued_wall
    }

    /// A change was recorded at `at`; keeps the oldest such time.
    pub(crate) fn mark_queued(&self, at: Instant) {
        let mut inner = self.lock();
        inner.queued_since.get_or_insert(at);
        inner.last_queued_wall = Some(SystemTime::now());
    }

    /// The trackers took in a change of `kind`.
    pub(crate) fn count_change(&self, kind: ChangeKind) {
        let mut inner = self.lock();
        let changes = &mut inner.changes;
        match kind {
            ChangeKind::Service => {
                changes.services_total += 1;
                changes.services_pending += 1;
            }
            ChangeKind::EndpointSlice => {
                changes.endpoint_slices_total += 1;
                changes.endpoint_slices_pending += 1;
            }
        }
    }

    /// A sync took every queued change; returns when the oldest was queued.
    pub(crate) fn take_queued(&self) -> Option<Instant> {
        let mut inner = self.lock();
        inner.changes.services_pending = 0;
        inner.changes.endpoint_slices_pending = 0;
        inner.queued_since.take()
    }

    /// A sync failed to apply changes queued since `since`.
    pub(crate) fn requeue(&self, since: Option<Instant>) {
        let mut inner = self.lock();
        inner.queued_since = match (inner.queued_since, since) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    /// Records a finished sync; `unavailable` says why the mode cannot run
    /// when that is why it failed.
    pub(crate) fn record(&self, stats: SyncStats, unavailable: Option<String>) {
        let mut inner = self.lock();
        inner.unavailable = unavailable;
        match &stats.result {
            Ok(_) => {
                inner.last_successful_sync = Some(stats.finished_at);
                if stats.full {
                    inner.totals.full_syncs += 1;
                } else {
                    inner.totals.partial_syncs += 1;
                }
            }
            Err(_) => inner.totals.failed_syncs += 1,
        }
        inner.last_sync = Some(stats);
    }

    fn lock(&self) -> MutexGuard<'_, StatusInner> {
        // The state stays consistent even if a holder panicked: every update
        // is a plain assignment.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
