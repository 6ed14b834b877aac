//! The cleaner: after a sync, delete the UDP conntrack entries the new rules
//! made stale.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use kp_model::IpFamily;
use kp_sync::{SyncObserver, SyncOutcome, SyncRequest};

use crate::metrics::ConntrackMetrics;
use crate::netlink::NetlinkConntrack;
use crate::stale::{stale_flows, sync_may_leave_stale_flows};
use crate::table::{ConntrackError, ConntrackTable};

/// Deletes stale UDP and SCTP conntrack entries of one IP family after
/// syncs (upstream's conntrack reconciler, `CleanStaleEntries`).
///
/// As a [`SyncObserver`] it reconciles after the first successful sync
/// (entries may have gone stale while the proxy was down), after every
/// full sync, after every partial sync that changed a Service with a UDP
/// or SCTP port or removed one ([`sync_may_leave_stale_flows`]), and after
/// any sync that follows a failed reconcile. A reconcile lists the family's
/// entries, picks the stale ones with [`stale_flows`] and deletes them.
/// Failures are logged, never passed on: the rules are in place either way.
///
/// Upstream reconciles after every sync; a partial sync that touched only
/// TCP Services cannot have made a UDP or SCTP entry stale, so here it
/// does not list the table.
///
/// The netlink socket is opened by the thread that first reconciles, so in
/// the network namespace the syncs run in.
pub struct ConntrackCleaner {
    family: IpFamily,
    metrics: ConntrackMetrics,
    state: Mutex<State>,
}

/// What one reconcile did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Entries of the family that were listed.
    pub listed: usize,
    /// Listed entries found stale.
    pub stale: usize,
    /// Stale entries the kernel deleted.
    pub deleted: usize,
    /// Stale entries that were gone before they could be deleted.
    pub already_gone: usize,
    /// Stale entries the kernel refused to delete (logged each).
    pub failed: usize,
    /// The listing may be incomplete (the table changed while it was read).
    pub interrupted: bool,
}

struct State {
    table: Box<dyn ConntrackTable>,
    /// True until a reconcile has worked once, and again after a failed one.
    pending: bool,
}

impl ConntrackCleaner {
    /// The cleaner of `family`'s entries in the kernel's table, through
    /// ctnetlink; it records into `metrics`.
    pub fn new(family: IpFamily, metrics: ConntrackMetrics) -> Self {
        Self::with_table(family, Box::new(NetlinkConntrack::new()), metrics)
    }

    /// The cleaner of `family`'s entries in `table`.
    pub fn with_table(
        family: IpFamily,
        table: Box<dyn ConntrackTable>,
        metrics: ConntrackMetrics,
    ) -> Self {
        Self {
            family,
            metrics,
            state: Mutex::new(State {
                table,
                pending: true,
            }),
        }
    }

    /// The family this cleaner handles.
    pub fn family(&self) -> IpFamily {
        self.family
    }

    /// Reconciles now: lists the family's entries and deletes those that
    /// are stale for the state in `request` (`conntrack -L`, then
    /// `conntrack -D` per entry). Records the metrics unless listing failed.
    pub fn clean(&self, request: &SyncRequest<'_>) -> Result<CleanupReport, ConntrackError> {
        let mut state = self.lock();
        let result = self.reconcile(state.table.as_mut(), request);
        state.pending = result.is_err();
        result
    }

    fn reconcile(
        &self,
        table: &mut dyn ConntrackTable,
        request: &SyncRequest<'_>,
    ) -> Result<CleanupReport, ConntrackError> {
        let started = Instant::now();
        let listing = table.list(self.family)?;
        if listing.interrupted {
            tracing::debug!(family = %self.family.as_api_str(), "conntrack table changed while it was listed; cleaning what was listed");
        }
        let stale = stale_flows(request, &listing.flows);
        let mut report = CleanupReport {
            listed: listing.flows.len(),
            stale: stale.len(),
            interrupted: listing.interrupted,
            ..CleanupReport::default()
        };
        let deletion = if stale.is_empty() {
            Ok(Default::default())
        } else {
            table.delete(&stale)
        };
        let deletion = match deletion {
            Ok(deletion) => deletion,
            Err(error) => {
                self.metrics.record(self.family, started.elapsed(), 0);
                return Err(error);
            }
        };
        for (flow, error) in &deletion.failed {
            tracing::warn!(family = %self.family.as_api_str(), %flow, %error, "deleting a stale conntrack entry failed");
        }
        report.deleted = deletion.deleted;
        report.already_gone = deletion.already_gone;
        report.failed = deletion.failed.len();
        self.metrics
            .record(self.family, started.elapsed(), report.deleted);
        Ok(report)
    }

    fn needs_cleanup(&self, request: &SyncRequest<'_>) -> bool {
        self.lock().pending || sync_may_leave_stale_flows(request)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is a socket and a flag; a panic while it was held leaves
        // nothing half-written.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for ConntrackCleaner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConntrackCleaner")
            .field("family", &self.family)
            .finish_non_exhaustive()
    }
}

impl SyncObserver for ConntrackCleaner {
    fn on_synced(&self, request: &SyncRequest<'_>, _outcome: &SyncOutcome) {
        if request.family != self.family || !self.needs_cleanup(request) {
            return;
        }
        let family = self.family.as_api_str();
        match self.clean(request) {
            Ok(report) if report.failed > 0 => tracing::warn!(
                family,
                listed = report.listed,
                deleted = report.deleted,
                failed = report.failed,
                "some stale conntrack entries could not be deleted"
            ),
            Ok(report) => tracing::debug!(
                family,
                listed = report.listed,
                stale = report.stale,
                deleted = report.deleted,
                already_gone = report.already_gone,
                "reconciled conntrack entries"
            ),
            Err(error) => tracing::warn!(
                family,
                error = %kp_sync::error_chain(&error),
                "reconciling conntrack entries failed; retrying after the next sync"
            ),
        }
    }
}

#[cfg(test)]
#[path = "cleaner_tests.rs"]
mod tests;
