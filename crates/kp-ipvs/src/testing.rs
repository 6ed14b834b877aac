//! Service port maps and sync requests for tests of this crate, built with
//! the one [`ServiceBuilder`] of every mode's tests
//! (`service("ns1", "svc1", "10.96.0.41", 80).endpoint(...)`). Endpoints
//! are categorized for node `node-1` (kp_testkit's address plan).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use kp_model::{NamespacedName, NodeInfo, ServicePortName};
pub use kp_sync::testing::{service, ServiceBuilder};
use kp_sync::{ServicePortState, StaleConntrack, SyncRequest};

/// The node the builders categorize for.
pub const NODE_NAME: &str = "node-1";

/// A map of service ports under construction.
#[derive(Debug, Clone, Default)]
pub struct Ports(Vec<ServiceBuilder>);

/// Everything a [`SyncRequest`] borrows, owned.
#[derive(Debug, Clone)]
pub struct RequestParts {
    /// The service ports.
    pub ports: BTreeMap<ServicePortName, ServicePortState>,
    /// The changed Services.
    pub changed: BTreeSet<NamespacedName>,
    /// The node.
    pub node: NodeInfo,
    /// Nothing stale.
    pub stale: StaleConntrack,
}

/// Parses an address, panicking on a typo in a test.
pub fn ip(text: &str) -> IpAddr {
    match text.parse() {
        Ok(ip) => ip,
        Err(_) => panic!("bad test address {text}"),
    }
}

impl Ports {
    /// No service ports.
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds a service port.
    pub fn with(mut self, service: ServiceBuilder) -> Self {
        self.0.push(service);
        self
    }
    /// The map the sync loop would hand over.
    pub fn build(self) -> BTreeMap<ServicePortName, ServicePortState> {
        self.0.into_iter().map(ServiceBuilder::build).collect()
    }
}

impl RequestParts {
    /// Parts for `ports` on node `node-1` at `node_ip`; every Service counts
    /// as changed.
    pub fn new(ports: BTreeMap<ServicePortName, ServicePortState>, node_ip: &str) -> Self {
        let changed = ports.keys().map(|name| name.service.clone()).collect();
        Self {
            ports,
            changed,
            node: NodeInfo {
                name: NODE_NAME.to_owned(),
                addresses: vec![ip(node_ip)],
                ..NodeInfo::default()
            },
            stale: StaleConntrack::default(),
        }
    }

    /// The request of one sync.
    pub fn request(&self, full: bool) -> SyncRequest<'_> {
        SyncRequest {
            family: kp_model::IpFamily::of(&self.node.addresses[0]),
            full,
            service_ports: &self.ports,
            changed_services: &self.changed,
            node: &self.node,
            stale_conntrack: &self.stale,
        }
    }
}
