//! A synced state to hand the cleaner, built from Services and
//! EndpointSlices (test-only).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_model::{
    endpoints_from_slices, service_ports_from_service, CategorizedEndpoints, IpFamily,
    NamespacedName, NodeInfo, Protocol, ServicePortName,
};
use kp_sync::{ServicePortState, StaleConntrack, SyncRequest};
use kp_testkit::builders::{endpoint_slice, service, EndpointBuilder};

pub(crate) const EP1: &str = "10.244.1.2";
pub(crate) const EP2: &str = "10.244.1.3";
pub(crate) const EP3: &str = "10.244.1.4";

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

pub(crate) fn dns_port() -> ServicePortName {
    ServicePortName::new(NamespacedName::new("ns1", "dns"), "dns", Protocol::Udp)
}

/// The synced state of one family and what the sync reported stale.
pub(crate) struct Synced {
    ports: BTreeMap<ServicePortName, ServicePortState>,
    stale: StaleConntrack,
    node: NodeInfo,
    changed: BTreeSet<NamespacedName>,
}

pub(crate) fn synced(services: &[Service], slices: &[EndpointSlice]) -> Synced {
    let endpoints = endpoints_from_slices(slices, IpFamily::V4, "node-1");
    let mut ports = BTreeMap::new();
    for service in services {
        for (name, port) in service_ports_from_service(service, IpFamily::V4).unwrap() {
            let state = ServicePortState {
                port: Arc::new(port),
                endpoints: CategorizedEndpoints::default(),
                all_endpoints: endpoints.get(&name).cloned().unwrap_or_default(),
            };
            ports.insert(name, state);
        }
    }
    Synced {
        ports,
        stale: StaleConntrack::default(),
        node: NodeInfo::default(),
        changed: BTreeSet::new(),
    }
}

impl Synced {
    pub(crate) fn reporting(mut self, stale: StaleConntrack) -> Self {
        self.stale = stale;
        self
    }

    /// The request of a sync that reached this state.
    pub(crate) fn request(&self) -> SyncRequest<'_> {
        SyncRequest {
            family: IpFamily::V4,
            full: false,
            service_ports: &self.ports,
            changed_services: &self.changed,
            node: &self.node,
            stale_conntrack: &self.stale,
        }
    }
}
