//! A strict in-memory [`Backend`] for tests of the sync loop and of the
//! binary's wiring, and [`ServiceBuilder`], the service ports every mode's
//! tests render.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kp_model::{
    Endpoint, IpFamily, NamespacedName, NodeInfo, Protocol, ServicePort, ServicePortName,
    TopologyOptions,
};
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
    /// Whether [`Backend::distrust_kernel`] was called since the previous
    /// request.
    pub distrusted: bool,
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
    /// Services whose rules this fake refuses, as a kernel refuses a
    /// Service's rules: every sync that renders one of them fails.
    refused: BTreeSet<NamespacedName>,
    /// [`Backend::distrust_kernel`] was called since the last request.
    distrusted: bool,
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

    /// Refuses the rules of `service` from now on, as the kernel refuses an
    /// oversized or malformed object: a sync whose request renders it (a
    /// full sync that holds it, or a partial one that changed it) fails
    /// with [`BackendError::Rejected`] naming it.
    pub fn refuse_service(&self, service: NamespacedName) {
        self.lock().refused.insert(service);
    }

    /// Accepts every Service's rules again.
    pub fn refuse_service_no_more(&self) {
        self.lock().refused.clear();
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

    fn distrust_kernel(&mut self) {
        self.lock().distrusted = true;
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncOutcome, BackendError> {
        let (failed, unavailable, refused) = {
            let mut state = self.lock();
            let refused: BTreeSet<NamespacedName> = request
                .service_ports
                .keys()
                .map(|name| &name.service)
                .filter(|service| {
                    state.refused.contains(*service)
                        && (request.full || request.changed_services.contains(*service))
                })
                .cloned()
                .collect();
            let failed = state.failures_left > 0 || !refused.is_empty();
            state.failures_left = state.failures_left.saturating_sub(1);
            let mut recorded = RecordedSync::new(request, failed);
            recorded.distrusted = std::mem::take(&mut state.distrusted);
            state.requests.push(recorded);
            let unavailable = failed && state.unavailable;
            state.unavailable &= state.failures_left > 0;
            (failed, unavailable, refused)
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
            return Err(BackendError::Rejected {
                mode: self.mode,
                attempted: "applying the fake ruleset".to_owned(),
                services: refused,
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
            cleanup_failures: 0,
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
            distrusted: false,
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

/// The node [`ServiceBuilder`] categorizes endpoints for, and where its
/// local endpoints run (kp-testkit's address plan names the same nodes).
pub const BUILDER_NODE: &str = "node-1";
/// The addresses of [`BUILDER_NODE`] (kp-testkit's address plan).
pub const BUILDER_NODE_ADDRESSES: [&str; 2] = ["192.168.99.2", "fd00:192:168:99::2"];

/// [`BUILDER_NODE`] with its addresses, as [`ServiceBuilder`] plans for it.
pub fn builder_node() -> NodeInfo {
    NodeInfo {
        name: BUILDER_NODE.to_owned(),
        addresses: BUILDER_NODE_ADDRESSES
            .iter()
            .map(|ip| test_ip(ip))
            .collect(),
        ..NodeInfo::default()
    }
}

/// `port` with `all_endpoints` (sorted by (ip, port)) categorized and
/// planned for [`builder_node`], as the sync loop does.
pub fn planned(port: ServicePort, all_endpoints: Vec<Arc<Endpoint>>) -> ServicePortState {
    let family = IpFamily::of(&port.cluster_ip);
    ServicePortState::new(
        Arc::new(port),
        all_endpoints,
        &builder_node(),
        family,
        TopologyOptions::default(),
    )
}

/// Where [`ServiceBuilder`]'s remote endpoints run.
pub const BUILDER_OTHER_NODE: &str = "node-2";

/// A service port with its endpoints under construction, for the tests of
/// every mode's renderer and backend; see [`service`].
#[derive(Debug, Clone)]
pub struct ServiceBuilder {
    name: ServicePortName,
    port: ServicePort,
    endpoints: Vec<Endpoint>,
}

/// Service port `ns/name:p<port>` (TCP) at `cluster_ip:port`, no endpoints.
/// Addresses that do not parse are a bug in the test and panic.
pub fn service(namespace: &str, name: &str, cluster_ip: &str, port: u16) -> ServiceBuilder {
    ServiceBuilder {
        name: ServicePortName::new(
            NamespacedName::new(namespace, name),
            format!("p{port}"),
            Protocol::Tcp,
        ),
        port: ServicePort {
            cluster_ip: test_ip(cluster_ip),
            port,
            protocol: Protocol::Tcp,
            node_port: None,
            external_ips: Vec::new(),
            load_balancer_ips: Vec::new(),
            load_balancer_source_ranges: Vec::new(),
            session_affinity_timeout: None,
            external_policy_local: false,
            internal_policy_local: false,
            health_check_node_port: None,
            traffic_distribution: None,
            topology_mode: None,
        },
        endpoints: Vec::new(),
    }
}

/// Parses an address of a test, panicking on a typo.
fn test_ip(text: &str) -> IpAddr {
    match text.parse() {
        Ok(ip) => ip,
        Err(_) => panic!("bad test address {text:?}"),
    }
}

impl ServiceBuilder {
    /// Another protocol.
    pub fn protocol(mut self, protocol: Protocol) -> Self {
        self.name.protocol = protocol;
        self.port.protocol = protocol;
        self
    }
    /// UDP.
    pub fn udp(self) -> Self {
        self.protocol(Protocol::Udp)
    }
    /// The Service's single unnamed port.
    pub fn unnamed_port(mut self) -> Self {
        self.name.port = "".into();
        self
    }
    /// A NodePort.
    pub fn node_port(mut self, port: u16) -> Self {
        self.port.node_port = Some(port);
        self
    }
    /// An external IP.
    pub fn external_ip(mut self, address: &str) -> Self {
        self.port.external_ips.push(test_ip(address));
        self
    }
    /// A load balancer IP.
    pub fn lb_ip(mut self, address: &str) -> Self {
        self.port.load_balancer_ips.push(test_ip(address));
        self
    }
    /// A `loadBalancerSourceRanges` entry.
    pub fn source_range(mut self, cidr: &str) -> Self {
        match cidr.parse() {
            Ok(cidr) => self.port.load_balancer_source_ranges.push(cidr),
            Err(_) => panic!("bad test CIDR {cidr:?}"),
        }
        self
    }
    /// `sessionAffinity: ClientIP` with a timeout.
    pub fn affinity_secs(mut self, seconds: u64) -> Self {
        self.port.session_affinity_timeout = Some(Duration::from_secs(seconds));
        self
    }
    /// `externalTrafficPolicy: Local`.
    pub fn etp_local(mut self) -> Self {
        self.port.external_policy_local = true;
        self
    }
    /// `internalTrafficPolicy: Local`.
    pub fn itp_local(mut self) -> Self {
        self.port.internal_policy_local = true;
        self
    }
    /// `spec.healthCheckNodePort`.
    pub fn health_check_node_port(mut self, port: u16) -> Self {
        self.port.health_check_node_port = Some(port);
        self
    }
    /// A ready endpoint, on this node when `local`.
    pub fn endpoint(self, address: &str, port: u16, local: bool) -> Self {
        self.with_endpoint(address, port, local, true, false)
    }
    /// A ready endpoint on this node.
    pub fn local_endpoint(self, address: &str, port: u16) -> Self {
        self.endpoint(address, port, true)
    }
    /// A ready endpoint on another node.
    pub fn remote_endpoint(self, address: &str, port: u16) -> Self {
        self.endpoint(address, port, false)
    }
    /// A terminating endpoint that still serves.
    pub fn terminating_endpoint(self, address: &str, port: u16, local: bool) -> Self {
        self.with_endpoint(address, port, local, false, true)
    }

    fn with_endpoint(
        mut self,
        address: &str,
        port: u16,
        local: bool,
        ready: bool,
        terminating: bool,
    ) -> Self {
        let node = if local {
            BUILDER_NODE
        } else {
            BUILDER_OTHER_NODE
        };
        self.endpoints.push(Endpoint {
            ip: test_ip(address),
            port,
            ready,
            serving: true,
            terminating,
            is_local: local,
            node_name: Some(node.into()),
            zone: None,
            zone_hints: None,
            node_hints: None,
        });
        self
    }

    /// The service port's name.
    pub fn name(&self) -> &ServicePortName {
        &self.name
    }

    /// The service port with its endpoints (sorted, without duplicates)
    /// categorized for [`BUILDER_NODE`], as the sync loop does.
    pub fn build(mut self) -> (ServicePortName, ServicePortState) {
        self.endpoints.sort_by_key(|e| (e.ip, e.port));
        self.endpoints.dedup_by_key(|e| (e.ip, e.port));
        let all_endpoints: Vec<Arc<Endpoint>> = self.endpoints.into_iter().map(Arc::new).collect();
        (self.name, planned(self.port, all_endpoints))
    }
}
