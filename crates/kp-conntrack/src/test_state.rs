//! A synced state to hand the cleaner, built from Services and
//! EndpointSlices (test-only).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_model::{
    endpoints_from_slices, service_ports_from_service, IpFamily, NamespacedName, NodeInfo,
    ServicePortName,
};
use kp_sync::{ServicePortState, StaleConntrack, SyncRequest};
use kp_testkit::builders::{endpoint_slice, service, EndpointBuilder};

pub(crate) const EP1: &str = "10.244.1.2";
pub(crate) const EP2: &str = "10.244.1.3";
pub(crate) const EP3: &str = "10.244.1.4";
/// The node's address.
pub(crate) const NODE_IP: &str = "192.168.99.2";
/// The pod CIDR of the node.
const NODE_POD_CIDR: &str = "10.244.1.0/24";
/// The node's name; endpoints built with `local` are on it.
const NODE_NAME: &str = "node-1";

pub(crate) fn at(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

pub(crate) fn client(port: u16) -> SocketAddr {
    SocketAddr::new("192.168.99.10".parse().unwrap(), port)
}

pub(crate) fn dns() -> Service {
    service("ns1", "dns", |s| {
        s.service_type("NodePort")
            .cluster_ip("10.96.0.20")
            .port("dns", 53, "UDP")
            .node_port(30053)
            .external_ip("203.0.113.5")
    })
}

pub(crate) fn web() -> Service {
    service("ns1", "web", |s| {
        s.cluster_ip("10.96.0.10").port("http", 80, "TCP")
    })
}

/// Conditions of one endpoint, on top of `ready`.
pub(crate) type Conditions = fn(EndpointBuilder) -> EndpointBuilder;

/// A slice of `service` with port dns 5353/UDP and http 8080/TCP and one
/// endpoint per `(ip, conditions)`.
pub(crate) fn slice(service: &str, endpoints: &[(&str, Conditions)]) -> EndpointSlice {
    endpoint_slice("ns1", &format!("{service}-1"), service, |mut s| {
        s = s.port("dns", 5353, "UDP").port("http", 8080, "TCP");
        for (ip, conditions) in endpoints {
            s = s.endpoint(ip, |e| conditions(e.ready(true)));
        }
        s
    })
}

pub(crate) fn ready(e: EndpointBuilder) -> EndpointBuilder {
    e
}

/// Ready, on this node.
pub(crate) fn local(e: EndpointBuilder) -> EndpointBuilder {
    e.node(NODE_NAME)
}

/// Ready, on another node.
pub(crate) fn remote(e: EndpointBuilder) -> EndpointBuilder {
    e.node("node-2")
}

/// The synced state of one family, as a partial sync that changed nothing
/// hands it over, and what the sync reported removed.
pub(crate) struct Synced {
    ports: BTreeMap<ServicePortName, ServicePortState>,
    stale: StaleConntrack,
    node: NodeInfo,
    changed: BTreeSet<NamespacedName>,
    full: bool,
}

/// The state with `services` and `slices`, endpoints categorized for this
/// node as the sync loop does.
pub(crate) fn synced(services: &[Service], slices: &[EndpointSlice]) -> Synced {
    let endpoints = endpoints_from_slices(slices, IpFamily::V4, NODE_NAME);
    let mut ports = BTreeMap::new();
    for service in services {
        for (name, port) in service_ports_from_service(service, IpFamily::V4).unwrap() {
            let all_endpoints = endpoints.get(&name).cloned().unwrap_or_default();
            let state = kp_sync::testing::planned(port, all_endpoints);
            ports.insert(name, state);
        }
    }
    Synced {
        ports,
        stale: StaleConntrack::default(),
        node: NodeInfo {
            name: NODE_NAME.to_owned(),
            addresses: vec![NODE_IP.parse().unwrap()],
            pod_cidrs: vec![NODE_POD_CIDR.parse().unwrap()],
            ..NodeInfo::default()
        },
        changed: BTreeSet::new(),
        full: false,
    }
}

impl Synced {
    pub(crate) fn reporting(mut self, stale: StaleConntrack) -> Self {
        self.stale = stale;
        self
    }

    /// As a partial sync that changed the Service `ns1/name`.
    pub(crate) fn changing(mut self, name: &str) -> Self {
        self.changed.insert(NamespacedName::new("ns1", name));
        self
    }

    /// As a full sync.
    pub(crate) fn full(mut self) -> Self {
        self.full = true;
        self
    }

    /// The request of a sync that reached this state.
    pub(crate) fn request(&self) -> SyncRequest<'_> {
        SyncRequest {
            family: IpFamily::V4,
            full: self.full,
            service_ports: &self.ports,
            changed_services: &self.changed,
            node: &self.node,
            stale_conntrack: &self.stale,
        }
    }
}
