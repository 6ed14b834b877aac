//! Shared cast of the sync loop tests: a proxier with a fake backend, and the
//! objects of a small cluster, all on the address plan of `kp_testkit::plan`.
//!
//! | object | addresses |
//! |---|---|
//! | Service ns1/web, port http 80/TCP | ClusterIP 10.96.0.10 |
//! | Service ns1/db, port pg 5432/TCP | ClusterIP 10.96.0.11 |
//! | Service ns1/dns, port dns 53/UDP | ClusterIP 10.96.0.12 |
//! | Service ns1/dual, port http 80/TCP | ClusterIPs 10.96.0.20, fd00:10:96::20 |
//! | endpoints of web | 10.244.1.2 (this node), 10.244.2.2 (node-2), port 8080 |
//! | endpoints of db | 10.244.1.5 (this node), port 5432 |
//! | endpoints of dns | 10.244.1.6 (this node), port 53 |
//! | endpoints of dual | 10.244.1.7 and fd00:10:244:1::7, port 8080 |
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_model::{IpFamily, ObjectEvent, ProxyEventHandler, ResourceKind};
use kp_sync::testing::FakeBackend;
use kp_sync::{Proxier, RunnerConfig};
use kp_testkit::builders::{endpoint_slice, service};
use kp_testkit::plan::{NODE_NAME, OTHER_NODE_NAME};

pub use kp_sync::testing::IMMEDIATE;

/// A proxier of `family` on [`NODE_NAME`] and the fake backend behind it.
pub fn proxier(family: IpFamily) -> (Proxier, FakeBackend) {
    proxier_with(family, IMMEDIATE)
}

/// Like [`proxier`], with the given runner timing.
pub fn proxier_with(family: IpFamily, runner: RunnerConfig) -> (Proxier, FakeBackend) {
    kp_sync::testing::fake_proxier(family, NODE_NAME, runner)
}

/// Both sources report their first complete list.
pub fn sources_synced(handler: &dyn ProxyEventHandler) {
    handler.on_synced(ResourceKind::Service);
    handler.on_synced(ResourceKind::EndpointSlice);
}

/// Applies Services and EndpointSlices.
pub fn apply(handler: &dyn ProxyEventHandler, services: &[Service], slices: &[EndpointSlice]) {
    for service in services {
        handler.on_service(ObjectEvent::Apply(service.clone()));
    }
    for slice in slices {
        handler.on_endpoint_slice(ObjectEvent::Apply(slice.clone()));
    }
}

/// Service ns1/web: ClusterIP 10.96.0.10, port http 80/TCP.
pub fn web() -> Service {
    service("ns1", "web", |s| {
        s.cluster_ip("10.96.0.10")
            .port("http", 80, "TCP")
            .target_port(8080)
    })
}

/// Service ns1/db: ClusterIP 10.96.0.11, port pg 5432/TCP.
pub fn db() -> Service {
    service("ns1", "db", |s| {
        s.cluster_ip("10.96.0.11").port("pg", 5432, "TCP")
    })
}

/// Service ns1/dns: ClusterIP 10.96.0.12, port dns 53/UDP (conntrack
/// cleanup concerns UDP and SCTP).
pub fn dns() -> Service {
    service("ns1", "dns", |s| {
        s.cluster_ip("10.96.0.12").port("dns", 53, "UDP")
    })
}

/// Service ns1/dual: ClusterIPs 10.96.0.20 and fd00:10:96::20, port http.
pub fn dual() -> Service {
    service("ns1", "dual", |s| {
        s.cluster_ips(&["10.96.0.20", "fd00:10:96::20"])
            .ip_families(&["IPv4", "IPv6"])
            .port("http", 80, "TCP")
    })
}

/// The endpoints of web: `ready` endpoints at each of `ips` (10.244.1.x is
/// on this node, 10.244.2.x on the other).
pub fn web_endpoints(ips: &[&str]) -> EndpointSlice {
    endpoint_slice("ns1", "web-abc", "web", |e| {
        ips.iter().fold(e.port("http", 8080, "TCP"), |e, ip| {
            e.endpoint(*ip, |ep| ep.ready(true).node(node_of(ip)))
        })
    })
}

fn node_of(pod_ip: &str) -> &'static str {
    if pod_ip.starts_with("10.244.1.") {
        NODE_NAME
    } else {
        OTHER_NODE_NAME
    }
}

/// The endpoints of db: 10.244.1.5 on this node.
pub fn db_endpoints() -> EndpointSlice {
    endpoint_slice("ns1", "db-abc", "db", |e| {
        e.port("pg", 5432, "TCP")
            .endpoint("10.244.1.5", |ep| ep.ready(true).node(NODE_NAME))
    })
}

/// The endpoints of dns: ready endpoints at each of `ips`, on this node.
pub fn dns_endpoints(ips: &[&str]) -> EndpointSlice {
    endpoint_slice("ns1", "dns-abc", "dns", |e| {
        ips.iter().fold(e.port("dns", 53, "UDP"), |e, ip| {
            e.endpoint(*ip, |ep| ep.ready(true).node(NODE_NAME))
        })
    })
}

/// The endpoints of dual, one slice per family.
pub fn dual_endpoints() -> [EndpointSlice; 2] {
    [
        endpoint_slice("ns1", "dual-v4", "dual", |e| {
            e.port("http", 8080, "TCP")
                .endpoint("10.244.1.7", |ep| ep.ready(true).node(NODE_NAME))
        }),
        endpoint_slice("ns1", "dual-v6", "dual", |e| {
            e.address_type("IPv6")
                .port("http", 8080, "TCP")
                .endpoint("fd00:10:244:1::7", |ep| ep.ready(true).node(NODE_NAME))
        }),
    ]
}

/// A proxier that has done its first (full) sync of web, db and dns.
pub fn proxier_after_first_sync() -> (Arc<Proxier>, FakeBackend) {
    let (proxier, backend) = proxier(IpFamily::V4);
    apply(
        &proxier,
        &[web(), db(), dns()],
        &[
            web_endpoints(&["10.244.1.2"]),
            db_endpoints(),
            dns_endpoints(&["10.244.1.6"]),
        ],
    );
    sources_synced(&proxier);
    proxier.sync_once().expect("the first sync");
    backend.take_single_request();
    (Arc::new(proxier), backend)
}
