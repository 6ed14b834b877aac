//! A strict in-memory [`Backend`] for tests of the sync loop and of the
//! binary's wiring.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use kp_model::{IpFamily, NamespacedName, NodeInfo, ServicePortName};
use tokio::sync::watch;

use crate::proxier::{Proxier, ProxierConfig};
use crate::runner::RunnerConfig;

use crate::backend::{
    Backend, BackendError, ServicePortState, StaleConntrack, SyncOutcome, SyncRequest,
};

/// Records every request as an owned [`RecordedSync`] and succeeds, unless
/// told to fail with [`fail_next`](FakeBackend::fail_next). Clones share
/// their records, so a test keeps one clone and hands the other to the
/// [`Proxier`](crate::Proxier).
#[derive(Debug, Clone)]
pub struct FakeBackend {
    mode: &'static str,
    state: Arc<Mutex<FakeState>>,
    syncs: Arc<watch::Sender<usize>>,
}

/// One request as the [`FakeBackend`] received it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedSync {
    /// [`SyncRequest::family`].
    pub family: IpFamily,
    /// [`SyncRequest::full`].
    pub full: bool,
    /// [`SyncRequest::service_ports`].
    pub service_ports: BTreeMap<ServicePortName, ServicePortState>,
    /// [`SyncRequest::changed_services`].
    pub changed_services: BTreeSet<NamespacedName>,
    /// [`SyncRequest::node`].
    pub node: NodeInfo,
    /// [`SyncRequest::stale_conntrack`].
    pub stale_conntrack: StaleConntrack,
    /// Whether the fake answered this request with an error.
    pub failed: bool,
}

/// The error a [`FakeBackend`] returns when told to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the fake backend was told to fail this sync")]
pub struct InjectedFailure;

#[derive(Debug, Default)]
struct FakeState {
    requests: Vec<RecordedSync>,
    failures_left: usize,
    unavailable: bool,
}

impl FakeBackend {
    /// A fake whose mode is `fake`.
    pub fn new() -> Self {
        Self::with_mode("fake")
    }

    /// A fake that reports `mode` as its [`Backend::mode`].
    pub fn with_mode(mode: &'static str) -> Self {
        Self {
            mode,
            state: Arc::default(),
            syncs: Arc::new(watch::Sender::new(0)),
        }
    }

    /// Makes the next `count` syncs fail with [`InjectedFailure`] (they are
    /// still recorded).
    pub fn fail_next(&self, count: usize) {
        self.lock().failures_left = count;
    }

    /// Makes the next `count` syncs fail as a backend whose program is
    /// missing ([`BackendError::Unavailable`]).
    pub fn unavailable_next(&self, count: usize) {
        let mut state = self.lock();
        state.failures_left = count;
        state.unavailable = true;
    }

    /// Every request received so far, oldest first.
    pub fn requests(&self) -> Vec<RecordedSync> {
        self.lock().requests.clone()
    }

    /// Every request received since the last call, oldest first.
    pub fn take_requests(&self) -> Vec<RecordedSync> {
        std::mem::take(&mut self.lock().requests)
    }

    /// The one request received since the last call; panics, naming what
    /// arrived, when there was not exactly one.
    #[track_caller]
    pub fn take_single_request(&self) -> RecordedSync {
        let mut requests = self.take_requests();
        match requests.len() {
            1 => requests.remove(0),
            n => panic!("expected exactly one sync request, got {n}: {requests:#?}"),
        }
    }

    /// Panics when a request arrived since the last call.
    #[track_caller]
    pub fn assert_no_requests(&self) {
        let requests = self.take_requests();
        assert!(
            requests.is_empty(),
            "expected no sync request, got {}: {requests:#?}",
            requests.len()
        );
    }

    /// Number of syncs received since the fake was made.
    pub fn sync_count(&self) -> usize {
        *self.syncs.borrow()
    }

    /// Waits until at least `count` syncs have been received in total.
    pub async fn wait_for_syncs(&self, count: usize) {
        let mut receiver = self.syncs.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = receiver.wait_for(|received| *received >= count).await;
    }

    fn lock(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for FakeBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl Backend for FakeBackend {
    fn mode(&self) -> &'static str {
        self.mode
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncOutcome, BackendError> {
        let (failed, unavailable) = {
            let mut state = self.lock();
            let failed = state.failures_left > 0;
            state.failures_left = state.failures_left.saturating_sub(1);
            state.requests.push(RecordedSync::new(request, failed));
            let unavailable = failed && state.unavailable;
            state.unavailable &= state.failures_left > 0;
            (failed, unavailable)
        };
        self.syncs.send_modify(|received| *received += 1);
        if unavailable {
            return Err(BackendError::Unavailable {
                mode: self.mode,
                missing: "program fake-restore not found".to_owned(),
                remedy: "install the fake package".to_owned(),
            });
        }
        if failed {
            return Err(BackendError::Apply {
                mode: self.mode,
                attempted: "applying the fake ruleset".to_owned(),
                source: Box::new(InjectedFailure),
            });
        }
        let objects_written = if request.full {
            request.service_ports.len()
        } else {
            request
                .service_ports
                .keys()
                .filter(|name| request.changed_services.contains(&name.service))
                .count()
        };
        Ok(SyncOutcome {
            full: request.full,
            rules_per_table: vec![("fake".to_owned(), request.service_ports.len())],
            chains_per_table: vec![("fake".to_owned(), 1)],
            rules_written_per_table: vec![("fake".to_owned(), objects_written)],
            objects_written,
        })
    }
}

impl RecordedSync {
    fn new(request: &SyncRequest<'_>, failed: bool) -> Self {
        Self {
            family: request.family,
            full: request.full,
            service_ports: request.service_ports.clone(),
            changed_services: request.changed_services.clone(),
            node: request.node.clone(),
            stale_conntrack: request.stale_conntrack.clone(),
            failed,
        }
    }

    /// The service ports as `ns/name:port` strings, sorted.
    pub fn service_port_names(&self) -> Vec<String> {
        self.service_ports
            .keys()
            .map(|name| {
                let service = format!("{}/{}", name.service.namespace, name.service.name);
                if name.port.is_empty() {
                    service
                } else {
                    format!("{service}:{}", name.port)
                }
            })
            .collect()
    }

    /// The changed Services as `ns/name` strings, sorted.
    pub fn changed_service_names(&self) -> Vec<String> {
        self.changed_services
            .iter()
            .map(|name| format!("{}/{}", name.namespace, name.name))
            .collect()
    }
}

/// Runner timing for tests: every request runs at once, failures are
/// retried at once, no periodic runs.
pub const IMMEDIATE: RunnerConfig = RunnerConfig {
    min_interval: std::time::Duration::ZERO,
    max_interval: std::time::Duration::ZERO,
    retry_interval: std::time::Duration::ZERO,
};

/// A proxier of `family` on node `node_name` with `runner` timing, and the
/// fake backend behind it; its sources have not reported a list yet.
pub fn fake_proxier(
    family: IpFamily,
    node_name: &str,
    runner: RunnerConfig,
) -> (Proxier, FakeBackend) {
    let backend = FakeBackend::new();
    let config = ProxierConfig {
        family,
        node: NodeInfo {
            name: node_name.to_owned(),
            ..NodeInfo::default()
        },
        runner,
    };
    (Proxier::new(config, Box::new(backend.clone())), backend)
}
