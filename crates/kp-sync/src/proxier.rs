//! The one sync loop every backend shares, for one IP family.
//!
//! Upstream copies this loop into each proxier (`syncProxyRules`); here it is
//! written once: wait until Services and EndpointSlices are synced, drain the
//! change trackers, decide full versus partial, categorize every service
//! port's endpoints, hand the result to the [`Backend`], record the outcome.

use std::collections::{BTreeMap, BTreeSet};
use std::error::Error;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_model::{
    EndpointsChangeTracker, EndpointsMap, IpFamily, NamespacedName, NodeInfo, ObjectEvent,
    Protocol, ProxyEventHandler, ResourceKind, ServiceChangeTracker, ServicePort, ServicePortMap,
    ServicePortName, TopologyOptions,
};
use tokio::time::Instant;

use crate::backend::{
    Backend, BackendError, ServicePortState, StaleConntrack, SyncOutcome, SyncRequest,
};
use crate::runner::{BoundedFrequencyRunner, RunReason, RunResult, RunnerConfig};
use crate::status::{ChangeKind, SyncStats, SyncStatus};

/// How to build a [`Proxier`].
#[derive(Debug, Clone, PartialEq)]
pub struct ProxierConfig {
    /// The family this proxier handles; objects of the other family are
    /// ignored by its trackers.
    pub family: IpFamily,
    /// The proxy's own Node as known at start (at least its name).
    pub node: NodeInfo,
    /// Timing of the sync runner (`minSyncPeriod`, `syncPeriod`, retry).
    pub runner: RunnerConfig,
}

/// Told about every successful sync, in order, while no other sync runs:
/// the place for work that must follow the rules (service health-check
/// servers, stale conntrack cleanup).
pub trait SyncObserver: Send + Sync {
    /// The backend applied `request` and reported `outcome`.
    fn on_synced(&self, request: &SyncRequest<'_>, outcome: &SyncOutcome);

    /// A sync attempt ended, successfully or not (for metrics); called after
    /// [`on_synced`](SyncObserver::on_synced) on success.
    fn on_sync_finished(&self, _family: IpFamily, _stats: &SyncStats) {}

    /// The kernel refused the rules of `service` (for the reason given), so
    /// the following syncs leave it out until it changes; told once per
    /// refusal (e.g. to post an Event about the Service).
    fn on_service_refused(&self, _family: IpFamily, _service: &NamespacedName, _reason: &str) {}
}

/// The change trackers and sync loop of one IP family, driving one backend.
///
/// As a [`ProxyEventHandler`] it only records: events go into the trackers
/// and a sync is requested from the runner. [`run`](Proxier::run) performs
/// the syncs.
pub struct Proxier {
    family: IpFamily,
    mode: &'static str,
    runner: BoundedFrequencyRunner,
    tracked: Mutex<Tracked>,
    /// The backend, with the categorized view it was last given; locked
    /// from drain to apply.
    backend: Mutex<Applying>,
    status: Arc<SyncStatus>,
    observers: Vec<Arc<dyn SyncObserver>>,
    /// The failed attempts since the last successful sync, for the log.
    failures: Mutex<Failures>,
    /// How topology hints are read (feature gates).
    topology: TopologyOptions,
    /// Trigger times before this are of changes made before the proxy ran,
    /// whose latency says nothing about it (upstream's `trackerStartTime`).
    started_at: SystemTime,
    /// A [`RepairHandle`] asked for the kernel's rules to be rewritten.
    repair: Arc<AtomicBool>,
}

/// Asks a [`Proxier`] to rewrite its rules whole at once, trusting no
/// record of what it applied before: for the state check, which found the
/// kernel's rules differing from what the proxy programmed.
#[derive(Debug, Clone)]
pub struct RepairHandle {
    family: IpFamily,
    requested: Arc<AtomicBool>,
    runner: BoundedFrequencyRunner,
}

impl RepairHandle {
    /// The family of the proxier this handle repairs.
    pub fn family(&self) -> IpFamily {
        self.family
    }

    /// Makes the next sync a full one that calls
    /// [`Backend::distrust_kernel`] first, and asks for it now (within the
    /// runner's minimum interval). Never blocks.
    pub fn request(&self) {
        self.requested.store(true, Ordering::Release);
        self.runner.run();
    }
}

/// A sync could not be done.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// Nothing is written before the sources delivered their first lists.
    #[error("cannot sync {family} proxy rules yet: waiting for {waiting_for}")]
    NotSynced {
        /// `IPv4` or `IPv6`.
        family: &'static str,
        /// What is missing, e.g. `the first complete list of EndpointSlices`.
        waiting_for: &'static str,
    },
    /// The backend failed to render or apply the rules.
    #[error("syncing {family} proxy rules failed")]
    Backend {
        /// `IPv4` or `IPv6`.
        family: &'static str,
        /// The backend's error.
        #[source]
        source: BackendError,
    },
}

/// Everything the event handlers write, under one lock.
#[derive(Debug)]
struct Tracked {
    services: ServiceChangeTracker,
    endpoints: EndpointsChangeTracker,
    node: NodeInfo,
    /// Nothing is written until the Node has pod CIDRs
    /// (`detectLocalMode: NodeCIDR`).
    needs_pod_cidrs: bool,
    services_synced: bool,
    endpoint_slices_synced: bool,
    needs_full_sync: bool,
    /// Services that changed behind failed syncs, handed to the next one.
    carried_changed: BTreeSet<NamespacedName>,
    /// Stale conntrack entries of failed syncs, handed to the next one.
    carried_stale: StaleConntrack,
    /// Trigger times of the changes of failed syncs, handed to the next one.
    carried_trigger_times: Vec<SystemTime>,
    /// Services whose rules the kernel refused: left out of every sync
    /// until they change, so that they do not keep every other Service
    /// from being programmed.
    refused: BTreeSet<NamespacedName>,
}

/// Failed sync attempts in a row. A failure that repeats the previous one
/// word for word (a missing program, a rule the kernel keeps rejecting) is
/// logged once, not on every retry; the first success after them is logged
/// with their number.
#[derive(Debug, Default)]
struct Failures {
    attempts: u64,
    last_error: String,
}

/// What one sync took out of the trackers.
struct Drained {
    full: bool,
    changed: BTreeSet<NamespacedName>,
    /// Shared with the trackers, which copy them on their next drain only
    /// if this sync still holds them.
    service_ports: Arc<ServicePortMap>,
    endpoints: Arc<EndpointsMap>,
    node: NodeInfo,
    stale: StaleConntrack,
    queued_since: Option<Instant>,
    /// Last-change trigger times of the slice updates behind `changed`.
    trigger_times: Vec<SystemTime>,
    /// Services left out of this sync: the kernel refused their rules and
    /// they have not changed since.
    refused: BTreeSet<NamespacedName>,
}

impl Proxier {
    /// A proxier for `config.family` that syncs through `backend`. The first
    /// sync is full.
    pub fn new(config: ProxierConfig, backend: Box<dyn Backend>) -> Self {
        let tracked = Tracked {
            services: ServiceChangeTracker::new(config.family),
            endpoints: EndpointsChangeTracker::new(config.family, config.node.name.clone()),
            node: config.node,
            needs_pod_cidrs: false,
            services_synced: false,
            endpoint_slices_synced: false,
            needs_full_sync: true,
            carried_changed: BTreeSet::new(),
            carried_stale: StaleConntrack::default(),
            carried_trigger_times: Vec::new(),
            refused: BTreeSet::new(),
        };
        Self {
            family: config.family,
            mode: backend.mode(),
            runner: BoundedFrequencyRunner::new(config.runner),
            tracked: Mutex::new(tracked),
            backend: Mutex::new(Applying {
                backend,
                categorized: None,
            }),
            status: Arc::new(SyncStatus::new()),
            observers: Vec::new(),
            failures: Mutex::new(Failures::default()),
            topology: TopologyOptions::default(),
            started_at: SystemTime::now(),
            repair: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A handle that makes this proxier rewrite its rules whole.
    pub fn repair_handle(&self) -> RepairHandle {
        RepairHandle {
            family: self.family,
            requested: Arc::clone(&self.repair),
            runner: self.runner.clone(),
        }
    }

    /// Adds an observer told about every successful sync.
    pub fn with_observer(mut self, observer: Arc<dyn SyncObserver>) -> Self {
        self.observers.push(observer);
        self
    }

    /// Writes nothing until the proxy's Node has pod CIDRs (`spec.podCIDRs`),
    /// which `detectLocalMode: NodeCIDR` tells local traffic by: rules
    /// without them would masquerade pod traffic they should not. Upstream
    /// waits for them at start too.
    pub fn waiting_for_pod_cidrs(self) -> Self {
        self.lock_tracked().needs_pod_cidrs = true;
        self
    }

    /// Reads topology hints with these feature gates (default: v1.34's).
    pub fn with_topology(mut self, topology: TopologyOptions) -> Self {
        self.topology = topology;
        self
    }

    /// Measures network-programming latency only for changes triggered at
    /// or after `start` (by default, when the proxier was created): the
    /// trigger times of objects listed at start tell of changes made before
    /// the proxy ran.
    pub fn measuring_changes_since(mut self, start: SystemTime) -> Self {
        self.started_at = start;
        self
    }

    /// The family this proxier handles.
    pub fn family(&self) -> IpFamily {
        self.family
    }

    /// The backend's mode (`iptables`, `nftables`, …).
    pub fn mode(&self) -> &'static str {
        self.mode
    }

    /// The sync state, for health and metrics.
    pub fn status(&self) -> Arc<SyncStatus> {
        Arc::clone(&self.status)
    }

    /// The proxy's own Node as last reported.
    pub fn node(&self) -> NodeInfo {
        self.lock_tracked().node.clone()
    }

    /// True once Services and EndpointSlices have both reported their first
    /// complete list.
    pub fn is_synced(&self) -> bool {
        self.lock_tracked().waiting_for().is_none()
    }

    /// Syncs once, right now, without the runner (`--dry-run`). Fails when
    /// the sources have not delivered their first lists yet.
    pub fn sync_once(&self) -> Result<SyncOutcome, SyncError> {
        self.sync(false)
    }

    /// Syncs once, right now, in full, as the periodic sync of the runner
    /// does.
    pub fn sync_once_full(&self) -> Result<SyncOutcome, SyncError> {
        self.sync(true)
    }

    /// Syncs whenever the runner says so until `shutdown` completes. Syncs
    /// run on tokio's blocking pool, since backends call into the kernel.
    pub async fn run(self: Arc<Self>, shutdown: impl Future<Output = ()>) {
        let runner = self.runner.clone();
        let task = |reason: RunReason| {
            let proxier = Arc::clone(&self);
            async move {
                // Upstream does a full sync every syncPeriod, and every retry
                // after a failure starts from scratch.
                let force_full = reason != RunReason::Requested;
                match tokio::task::spawn_blocking(move || proxier.sync_for_runner(force_full)).await
                {
                    Ok(result) => result,
                    Err(error) => {
                        tracing::error!(%error, "proxy rules sync task panicked");
                        RunResult::Failed
                    }
                }
            }
        };
        runner.drive(task, shutdown).await;
    }

    fn sync_for_runner(&self, force_full: bool) -> RunResult {
        match self.sync(force_full) {
            Ok(_) => {
                let failures = std::mem::take(&mut *lock(&self.failures));
                if failures.attempts > 0 {
                    tracing::info!(
                        family = self.family.as_api_str(),
                        mode = self.mode,
                        failed_attempts = failures.attempts,
                        "syncing proxy rules works again"
                    );
                }
                RunResult::Succeeded
            }
            Err(SyncError::NotSynced {
                family,
                waiting_for,
            }) => {
                tracing::debug!(
                    family,
                    waiting_for,
                    "not syncing proxy rules until the sources are synced"
                );
                RunResult::Succeeded
            }
            Err(error) => {
                let error = error_chain(&error);
                if lock(&self.failures).repeats(&error) {
                    tracing::debug!(
                        family = self.family.as_api_str(),
                        mode = self.mode,
                        %error,
                        "syncing proxy rules failed again in the same way"
                    );
                } else if let Some(hint) = privilege_hint(&error) {
                    tracing::error!(
                        family = self.family.as_api_str(),
                        mode = self.mode,
                        %error,
                        hint,
                        "syncing proxy rules failed; a full sync is scheduled"
                    );
                } else {
                    tracing::error!(
                        family = self.family.as_api_str(),
                        mode = self.mode,
                        %error,
                        "syncing proxy rules failed; a full sync is scheduled"
                    );
                }
                RunResult::Failed
            }
        }
    }

    fn sync(&self, force_full: bool) -> Result<SyncOutcome, SyncError> {
        // The backend lock is held from drain to apply so that concurrent
        // syncs apply drains in order.
        let mut applying = lock(&self.backend);
        let Applying {
            backend,
            categorized,
        } = &mut *applying;
        let started = Instant::now();
        let repair = self.repair.swap(false, Ordering::AcqRel);
        let mut drained = self.drain(force_full || repair).inspect_err(|_| {
            // Nothing was synced; the repair waits for the next sync.
            if repair {
                self.repair.store(true, Ordering::Release);
            }
        })?;
        if repair {
            tracing::warn!(
                family = self.family.as_api_str(),
                mode = self.mode,
                "Rewriting the proxy rules whole: the kernel's rules differ from what was programmed"
            );
            backend.distrust_kernel();
        }
        let mut changed = std::mem::take(&mut drained.changed);
        let service_ports = categorize(
            categorized,
            &drained,
            &mut changed,
            self.family,
            self.topology,
        );
        let request = SyncRequest {
            family: self.family,
            full: drained.full,
            service_ports,
            changed_services: &changed,
            node: &drained.node,
            stale_conntrack: &drained.stale,
        };
        let result = backend.sync(&request);
        let stats = |result: Result<SyncOutcome, String>, rejected: bool| {
            let finished_at_wall = SystemTime::now();
            let network_programming = if result.is_ok() {
                self.programming_latencies(&drained.trigger_times, finished_at_wall)
            } else {
                Vec::new()
            };
            SyncStats {
                finished_at: Instant::now(),
                finished_at_wall,
                duration: started.elapsed(),
                full: drained.full,
                service_ports: service_ports.len(),
                endpoints: service_ports.values().map(|s| s.all_endpoints.len()).sum(),
                result,
                rejected,
                network_programming,
            }
        };
        match result {
            Ok(outcome) => {
                let stats = stats(Ok(outcome.clone()), false);
                self.log_success(&stats, &changed);
                for observer in &self.observers {
                    observer.on_synced(&request, &outcome);
                    observer.on_sync_finished(self.family, &stats);
                }
                self.status.record(stats, None);
                Ok(outcome)
            }
            Err(source) => {
                // A missing restore program fails the restore too (upstream
                // counts any error of its restore call).
                let rejected = matches!(
                    source,
                    BackendError::Rejected { .. } | BackendError::Unavailable { .. }
                );
                let stats = stats(Err(error_chain(&source)), rejected);
                for observer in &self.observers {
                    observer.on_sync_finished(self.family, &stats);
                }
                let unavailable =
                    matches!(source, BackendError::Unavailable { .. }).then(|| source.to_string());
                self.status.record(stats, unavailable);
                if let BackendError::Rejected { services, .. } = &source {
                    self.refuse(services, &error_chain(&source));
                }
                self.restore_after_failure(drained, changed);
                Err(SyncError::Backend {
                    family: self.family.as_api_str(),
                    source,
                })
            }
        }
    }

    /// Takes every pending change out of the trackers.
    fn drain(&self, force_full: bool) -> Result<Drained, SyncError> {
        let mut tracked = self.lock_tracked();
        if let Some(waiting_for) = tracked.waiting_for() {
            return Err(SyncError::NotSynced {
                family: self.family.as_api_str(),
                waiting_for,
            });
        }
        let services = tracked.services.drain();
        let mut endpoints = tracked.endpoints.drain();
        let mut trigger_times = std::mem::take(&mut tracked.carried_trigger_times);
        for (name, times) in std::mem::take(&mut endpoints.trigger_times) {
            tracing::trace!(service = %name, changes = times.len(), "endpoint change trigger times");
            trigger_times.extend(times);
        }
        let needed_full = std::mem::take(&mut tracked.needs_full_sync);
        let mut changed = services.changed;
        changed.extend(endpoints.changed);
        // Only a Service's own change gives it another try.
        tracked.forgive_changed(&changed, self.family);
        changed.append(&mut tracked.carried_changed);
        self.status
            .set_refused_services(tracked.refused.iter().cloned().collect());
        let mut stale = std::mem::take(&mut tracked.carried_stale);
        stale.merge(StaleConntrack {
            deleted_cluster_ips: services.deleted_cluster_ips,
        });
        Ok(Drained {
            full: force_full || needed_full,
            changed,
            service_ports: tracked.services.service_ports_snapshot(),
            endpoints: tracked.endpoints.endpoints_snapshot(),
            node: tracked.node.clone(),
            stale,
            queued_since: self.status.take_queued(),
            trigger_times,
            refused: tracked.refused.clone(),
        })
    }

    /// Leaves `services` out of the following syncs until they change: the
    /// kernel refused their rules. Logs and tells the observers once per
    /// Service.
    fn refuse(&self, services: &BTreeSet<NamespacedName>, reason: &str) {
        if services.is_empty() {
            return;
        }
        let newly_refused: Vec<&NamespacedName> = {
            let mut tracked = self.lock_tracked();
            let newly: Vec<&NamespacedName> = services
                .iter()
                .filter(|service| tracked.refused.insert((*service).clone()))
                .collect();
            self.status
                .set_refused_services(tracked.refused.iter().cloned().collect());
            newly
        };
        for service in newly_refused {
            tracing::error!(
                family = self.family.as_api_str(),
                mode = self.mode,
                service = %service,
                reason,
                "the kernel refused the rules of a Service; it is left out of the proxy rules until it changes"
            );
            for observer in &self.observers {
                observer.on_service_refused(self.family, service, reason);
            }
        }
    }

    /// `finished_at` minus each trigger time after the proxy started.
    fn programming_latencies(
        &self,
        trigger_times: &[SystemTime],
        finished_at: SystemTime,
    ) -> Vec<Duration> {
        trigger_times
            .iter()
            .filter(|time| **time >= self.started_at)
            .map(|time| finished_at.duration_since(*time).unwrap_or_default())
            .collect()
    }

    /// After a failed sync the next one is full, and it carries the
    /// Services that changed, the stale conntrack entries, the queue time
    /// and the trigger times of the changes that did not make it into the
    /// kernel.
    fn restore_after_failure(&self, drained: Drained, changed: BTreeSet<NamespacedName>) {
        let mut tracked = self.lock_tracked();
        tracked.needs_full_sync = true;
        tracked.carried_changed.extend(changed);
        tracked.carried_stale.merge(drained.stale);
        tracked.carried_trigger_times.extend(drained.trigger_times);
        self.status.requeue(drained.queued_since);
    }

    /// Upstream's message at upstream's verbosity (2) and `elapsed` (Go's
    /// duration text), with what the sync covered.
    fn log_success(&self, stats: &SyncStats, changed: &BTreeSet<NamespacedName>) {
        tracing::info!(
            v = 2,
            elapsed = %go_duration(stats.duration),
            ipFamily = self.family.as_api_str(),
            mode = self.mode,
            full = stats.full,
            service_ports = stats.service_ports,
            endpoints = stats.endpoints,
            changed_services = changed.len(),
            "SyncProxyRules complete"
        );
    }

    /// Applies `change` to the tracked state; when it reports a change and
    /// the sources are synced, queues it and asks for a sync.
    fn record(&self, change: impl FnOnce(&mut Tracked) -> bool) {
        let wants_sync = {
            let mut tracked = self.lock_tracked();
            let changed = change(&mut tracked);
            let wants_sync = changed && tracked.waiting_for().is_none();
            if wants_sync {
                self.status.mark_queued(Instant::now());
            }
            wants_sync
        };
        if wants_sync {
            self.runner.run();
        }
    }

    fn lock_tracked(&self) -> MutexGuard<'_, Tracked> {
        lock(&self.tracked)
    }
}

impl fmt::Debug for Proxier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Proxier")
            .field("family", &self.family)
            .field("mode", &self.mode)
            .field("runner", &self.runner.config())
            .finish_non_exhaustive()
    }
}

impl ProxyEventHandler for Proxier {
    fn on_service(&self, event: ObjectEvent<Service>) {
        self.record(|tracked| {
            let changed = tracked.services.record(&event);
            if changed {
                self.status.count_change(ChangeKind::Service);
            }
            changed
        });
    }

    fn on_endpoint_slice(&self, event: ObjectEvent<EndpointSlice>) {
        self.record(|tracked| {
            let changed = tracked.endpoints.record(&event);
            if changed {
                self.status.count_change(ChangeKind::EndpointSlice);
            }
            changed
        });
    }

    fn on_node(&self, event: ObjectEvent<Node>) {
        self.record(|tracked| tracked.apply_node_event(&event));
    }

    fn on_synced(&self, kind: ResourceKind) {
        self.record(|tracked| tracked.mark_synced(kind));
    }
}

impl Failures {
    /// Counts a failure; true when it says what the previous one said.
    fn repeats(&mut self, error: &str) -> bool {
        self.attempts += 1;
        if self.last_error == error {
            return true;
        }
        error.clone_into(&mut self.last_error);
        false
    }
}

impl Tracked {
    /// Gives refused Services that changed another try.
    fn forgive_changed(&mut self, changed: &BTreeSet<NamespacedName>, family: IpFamily) {
        if self.refused.is_empty() {
            return;
        }
        for service in changed {
            if self.refused.remove(service) {
                tracing::info!(
                    family = family.as_api_str(),
                    service = %service,
                    "a Service whose rules the kernel refused changed; programming it again"
                );
            }
        }
    }

    /// What the first sync still waits for, if anything.
    fn waiting_for(&self) -> Option<&'static str> {
        match (self.services_synced, self.endpoint_slices_synced) {
            (true, true) if self.needs_pod_cidrs && self.node.pod_cidrs.is_empty() => {
                Some("the Node's spec.podCIDRs (detectLocalMode: NodeCIDR)")
            }
            (true, true) => None,
            (false, true) => Some("the first complete list of Services"),
            (true, false) => Some("the first complete list of EndpointSlices"),
            (false, false) => Some("the first complete list of Services and EndpointSlices"),
        }
    }

    /// Returns true when this completes the initial sync of the sources.
    fn mark_synced(&mut self, kind: ResourceKind) -> bool {
        let was_waiting = self.waiting_for().is_some();
        match kind {
            ResourceKind::Service => self.services_synced = true,
            ResourceKind::EndpointSlice => self.endpoint_slices_synced = true,
            ResourceKind::Node => {}
        }
        was_waiting && self.waiting_for().is_none()
    }

    /// Takes in a change of the proxy's own Node. Returns true when the
    /// rules depend on what changed (labels for topology, addresses and pod
    /// CIDRs for NodePorts and local traffic detection): that forces a full
    /// sync, since every service port may render differently.
    fn apply_node_event(&mut self, event: &ObjectEvent<Node>) -> bool {
        let (node, deleted) = match event {
            ObjectEvent::Apply(node) => (node, false),
            ObjectEvent::Delete(node) => (node, true),
        };
        let name = node.metadata.name.as_deref().unwrap_or_default();
        if name != self.node.name {
            tracing::debug!(node = name, own_node = %self.node.name, "ignoring event of another node");
            return false;
        }
        let changed = if deleted {
            // As upstream: forget the labels of a deleted node, so topology
            // no longer narrows its endpoints.
            let had_labels = !self.node.labels.is_empty();
            self.node.labels.clear();
            // A deleted Node is not eligible for load-balancer traffic
            // (healthz answers 503), as one being deleted is not.
            self.node.deleting = true;
            had_labels
        } else {
            let info = NodeInfo::from_node(node);
            let changed = info.labels != self.node.labels
                || info.addresses != self.node.addresses
                || info.pod_cidrs != self.node.pod_cidrs;
            self.node = info;
            changed
        };
        self.needs_full_sync |= changed;
        changed
    }
}

/// Every service port with its endpoints categorized for `node`, sorted.
/// The backend and the categorized view of its last sync.
struct Applying {
    backend: Box<dyn Backend>,
    categorized: Option<Categorized>,
}

/// Every service port with its categorized endpoints, as of one drain.
struct Categorized {
    /// The node they were categorized for (topology and locality depend
    /// on it).
    node: NodeInfo,
    service_ports: BTreeMap<ServicePortName, ServicePortState>,
}

/// The categorized view of `drained`, without the refused Services, and
/// the Services whose categorized service ports may differ from the last
/// sync's (`drained.changed` and more, into `changed`). The last view is
/// kept while the node stays the same, full sync or not: the changed
/// Services' service ports are categorized again and the refused ones
/// left out. A new node (or the first sync) builds it anew, and every
/// Service counts as changed, since each may categorize differently.
/// Categorizing every service port on every sync cost a partial sync at
/// 10,000 Services more than the rest of the sync loop together (upstream
/// does it per service port on every sync as well); a full sync that did
/// so made each Service one to render again.
fn categorize<'a>(
    categorized: &'a mut Option<Categorized>,
    drained: &Drained,
    changed: &mut BTreeSet<NamespacedName>,
    family: IpFamily,
    topology: TopologyOptions,
) -> &'a BTreeMap<ServicePortName, ServicePortState> {
    let reusable = categorized
        .as_ref()
        .is_some_and(|last| last.node == drained.node);
    if let Some(last) = categorized.as_ref().filter(|_| !reusable) {
        changed.extend(last.service_ports.keys().map(|name| name.service.clone()));
    }
    // A view that cannot be reused is freed before the new one is built.
    let current = match categorized.take().filter(|_| reusable) {
        Some(mut last) => {
            for service in &drained.refused {
                if has_service(&last.service_ports, service) {
                    remove_service(&mut last.service_ports, service);
                    changed.insert(service.clone());
                }
            }
            for service in changed.iter() {
                remove_service(&mut last.service_ports, service);
            }
            let again = drained.service_ports.iter().filter(|(name, _)| {
                changed.contains(&name.service) && !drained.refused.contains(&name.service)
            });
            last.service_ports
                .extend(categorize_each(again, drained, family, topology));
            last
        }
        None => {
            let programmed = drained
                .service_ports
                .iter()
                .filter(|(name, _)| !drained.refused.contains(&name.service));
            changed.extend(programmed.clone().map(|(name, _)| name.service.clone()));
            Categorized {
                node: drained.node.clone(),
                service_ports: categorize_each(programmed, drained, family, topology).collect(),
            }
        }
    };
    &categorized.insert(current).service_ports
}

/// Whether `service_ports` holds a service port of `service`.
fn has_service(
    service_ports: &BTreeMap<ServicePortName, ServicePortState>,
    service: &NamespacedName,
) -> bool {
    service_ports
        .range(first_port_of(service)..)
        .next()
        .is_some_and(|(name, _)| name.service == *service)
}

/// The first name a service port of `service` can have: service port
/// names sort by Service, then port name, then protocol (TCP first), so
/// its ports are adjacent, from the empty name with TCP.
fn first_port_of(service: &NamespacedName) -> ServicePortName {
    ServicePortName {
        service: service.clone(),
        port: Arc::from(""),
        protocol: Protocol::Tcp,
    }
}

/// Removes every service port of `service`.
fn remove_service(
    service_ports: &mut BTreeMap<ServicePortName, ServicePortState>,
    service: &NamespacedName,
) {
    let names: Vec<ServicePortName> = service_ports
        .range(first_port_of(service)..)
        .take_while(|(name, _)| name.service == *service)
        .map(|(name, _)| name.clone())
        .collect();
    for name in names {
        service_ports.remove(&name);
    }
}

/// Categorizes the endpoints of each of `service_ports` and plans its
/// traffic.
fn categorize_each<'a>(
    service_ports: impl Iterator<Item = (&'a ServicePortName, &'a Arc<ServicePort>)> + 'a,
    drained: &'a Drained,
    family: IpFamily,
    topology: TopologyOptions,
) -> impl Iterator<Item = (ServicePortName, ServicePortState)> + 'a {
    let node = &drained.node;
    service_ports.map(move |(name, port)| {
        let all_endpoints = drained.endpoints.get(name).cloned().unwrap_or_default();
        let state = ServicePortState::new(Arc::clone(port), all_endpoints, node, family, topology);
        (name.clone(), state)
    })
}

/// What an operator can do about a sync error `error` (its whole chain)
/// that the kernel refused for lack of privilege (`EPERM`, or iptables'
/// "Permission denied (you must be root)").
fn privilege_hint(error: &str) -> Option<&'static str> {
    (error.contains("Operation not permitted") || error.contains("Permission denied")).then_some(
        "the kernel refused for lack of privilege: the proxy needs CAP_NET_ADMIN, and CAP_NET_RAW for iptables-legacy (a privileged container, or deploy/least-privilege/)",
    )
}

/// `error: cause: cause …`, for logs and the sync status.
pub fn error_chain(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in a backend must not take the whole proxy down with poisoned
    // locks: the tracked state is only changed by whole assignments, and a
    // backend left half-applied is repaired by the full sync that follows
    // the failed run.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A duration as Go's `time.Duration.String` writes it (`31.25ms`,
/// `1.5s`, `812µs`), which upstream's `elapsed` shows.
pub fn go_duration(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    if nanos >= 60_000_000_000 {
        // Go writes the rest of a minute-long duration in seconds: `1m0.5s`.
        let minutes = duration.as_secs() / 60;
        let rest = duration - Duration::from_secs(minutes * 60);
        return format!("{minutes}m{}s", decimal(rest.as_secs_f64()));
    }
    let (value, unit) = if nanos < 1_000 {
        return format!("{nanos}ns");
    } else if nanos < 1_000_000 {
        (nanos as f64 / 1e3, "µs")
    } else if nanos < 1_000_000_000 {
        (nanos as f64 / 1e6, "ms")
    } else {
        (nanos as f64 / 1e9, "s")
    };
    format!("{}{unit}", decimal(value))
}

/// `value` with up to nine decimals and no trailing zeros (`0.5`, `2`).
fn decimal(value: f64) -> String {
    let text = format!("{value:.9}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod go_duration_tests {
    use super::*;

    #[test]
    fn durations_read_as_gos() {
        for (duration, text) in [
            (Duration::from_nanos(500), "500ns"),
            (Duration::from_micros(812), "812µs"),
            (Duration::from_micros(31_250), "31.25ms"),
            (Duration::from_millis(1_500), "1.5s"),
            (Duration::from_secs(2), "2s"),
            (Duration::from_millis(90_500), "1m30.5s"),
            (Duration::from_secs(120), "2m0s"),
            (Duration::from_millis(60_500), "1m0.5s"),
        ] {
            assert_eq!(go_duration(duration), text);
        }
    }
}
