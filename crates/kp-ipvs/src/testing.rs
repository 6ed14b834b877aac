//! Story-style builders of service port maps for tests of this crate and of
//! the binary: `service("ns1", "svc1", "10.96.0.41", 80).endpoint(...)`.
//! Endpoints are categorized for node `node-1` (kp_testkit's address plan).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use kp_model::{Endpoint, NamespacedName, NodeInfo, Protocol, ServicePort, ServicePortName};
use kp_sync::{ServicePortState, StaleConntrack, SyncRequest};

/// The node the builders categorize for.
pub const NODE_NAME: &str = "node-1";

/// A service port under construction.
#[derive(Debug, Clone)]
pub struct ServiceBuilder {
    name: ServicePortName,
    port: ServicePort,
    endpoints: Vec<Endpoint>,
}

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

/// Service port `ns/name:p<port>` (TCP) at `cluster_ip:port`, no endpoints.
pub fn service(namespace: &str, name: &str, cluster_ip: &str, port: u16) -> ServiceBuilder {
    ServiceBuilder {
        name: ServicePortName::new(
            NamespacedName::new(namespace, name),
            format!("p{port}"),
            Protocol::Tcp,
        ),
        port: ServicePort {
            cluster_ip: ip(cluster_ip),
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

impl ServiceBuilder {
    /// Another protocol.
    pub fn protocol(mut self, protocol: Protocol) -> Self {
        self.name.protocol = protocol;
        self.port.protocol = protocol;
        self
    }
    /// A NodePort.
    pub fn node_port(mut self, port: u16) -> Self {
        self.port.node_port = Some(port);
        self
    }
    /// An external IP.
    pub fn external_ip(mut self, address: &str) -> Self {
        self.port.external_ips.push(ip(address));
        self
    }
    /// A load balancer IP.
    pub fn load_balancer(mut self, address: &str) -> Self {
        self.port.load_balancer_ips.push(ip(address));
        self
    }
    /// A `loadBalancerSourceRanges` entry.
    pub fn source_range(mut self, cidr: &str) -> Self {
        if let Ok(cidr) = cidr.parse() {
            self.port.load_balancer_source_ranges.push(cidr);
        }
        self
    }
    /// `sessionAffinity: ClientIP` with a timeout.
    pub fn affinity(mut self, timeout_secs: u64) -> Self {
        self.port.session_affinity_timeout = Some(Duration::from_secs(timeout_secs));
        self
    }
    /// `externalTrafficPolicy: Local` (with a health check node port).
    pub fn local_policy(mut self) -> Self {
        self.port.external_policy_local = true;
        self.port.health_check_node_port = Some(30999);
        self
    }
    /// `internalTrafficPolicy: Local`.
    pub fn internal_local(mut self) -> Self {
        self.port.internal_policy_local = true;
        self
    }
    /// A ready endpoint, on this node when `local`.
    pub fn endpoint(mut self, address: &str, port: u16, local: bool) -> Self {
        self.endpoints.push(Endpoint {
            ip: ip(address),
            port,
            ready: true,
            serving: true,
            terminating: false,
            is_local: local,
            node_name: Some(Arc::from(if local { NODE_NAME } else { "node-2" })),
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

    fn build(mut self) -> (ServicePortName, ServicePortState) {
        self.endpoints.sort_by_key(|e| (e.ip, e.port));
        let all: Vec<Arc<Endpoint>> = self.endpoints.into_iter().map(Arc::new).collect();
        (self.name, kp_sync::testing::planned(self.port, all))
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
