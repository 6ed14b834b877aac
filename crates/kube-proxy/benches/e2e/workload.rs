//! The workload of the upstream measurement: N Services × 2
//! endpoints (one TCP port each), then single-endpoint patches.
//!
//! Addresses (kp-testkit's plan): ClusterIPs from 10.96.0.10; endpoints on
//! node-2 from 10.244.16.0 (two per Service, consecutive); patched endpoints
//! from 10.244.240.0. No host owns any of them.

use std::net::Ipv4Addr;
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use kp_testkit::apiserver::TestApiServer;
use kp_testkit::builders::{endpoint_slice, node, service};
use kp_testkit::plan::{NODE_IP, NODE_NAME, OTHER_NODE_NAME, POD_CIDR, SERVICE_CIDR};

/// The endpoints' (target) port.
pub const TARGET_PORT: i32 = 8080;
/// The Services' port name.
const PORT_NAME: &str = "http";
/// The EndpointSlice controller's annotation: when the change that led to
/// this version of the slice happened. The proxy's
/// `kubeproxy_network_programming_duration_seconds` observes, in the sync
/// that applies the slice, that sync's end minus this time.
const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";
/// First offset in the pod range of the fixed endpoints.
const ENDPOINTS_FROM: usize = 0x1000;
/// First offset in the pod range of the patched endpoints.
const PATCHED_FROM: usize = 0xf000;

/// N Services × 2 endpoints.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    pub services: usize,
}

impl Workload {
    pub fn new(services: usize) -> Self {
        assert!(
            services > 0 && ENDPOINTS_FROM + 2 * services <= PATCHED_FROM,
            "{services} Services do not fit the address plan"
        );
        Self { services }
    }

    fn namespace(i: usize) -> String {
        format!("ns{}", i % 100)
    }

    fn name(i: usize) -> String {
        format!("svc{i}")
    }

    /// Service `i`'s port as the rules' comments name it: `ns/name:port`.
    pub fn service_port(i: usize) -> String {
        format!("{}/{}:{PORT_NAME}", Self::namespace(i), Self::name(i))
    }

    fn cluster_ip(i: usize) -> Ipv4Addr {
        offset(SERVICE_CIDR.network(), 10 + i)
    }

    /// Endpoint `j` (0 or 1) of Service `i` as populated.
    pub fn endpoint(i: usize, j: usize) -> Ipv4Addr {
        offset(POD_CIDR.network(), ENDPOINTS_FROM + 2 * i + j)
    }

    /// The address patch `k` gives its Service.
    pub fn patched_endpoint(k: usize) -> Ipv4Addr {
        offset(POD_CIDR.network(), PATCHED_FROM + k)
    }

    /// The Service patch `k` of `patches` changes: spread over the
    /// Services, a different one each time.
    pub fn patch_target(&self, k: usize, patches: usize) -> usize {
        k * self.services / patches + self.services / (2 * patches)
    }

    /// Service `i`'s EndpointSlice with `second` as its second endpoint,
    /// and `trigger` as its last-change-trigger-time if given.
    pub fn slice(i: usize, second: Ipv4Addr, trigger: Option<SystemTime>) -> EndpointSlice {
        endpoint_slice(
            &Self::namespace(i),
            &format!("svc{i}-1"),
            &Self::name(i),
            |e| {
                let e = match trigger {
                    Some(time) => e.annotation(TRIGGER_TIME, &rfc3339(time)),
                    None => e,
                };
                e.address_type("IPv4")
                    .port(PORT_NAME, TARGET_PORT, "TCP")
                    .endpoint(Self::endpoint(i, 0).to_string(), |ep| {
                        ep.ready(true).node(OTHER_NODE_NAME)
                    })
                    .endpoint(second.to_string(), |ep| {
                        ep.ready(true).node(OTHER_NODE_NAME)
                    })
            },
        )
    }

    /// The Node and every Service with its EndpointSlice.
    pub fn populate(&self, server: &TestApiServer) {
        server.create(node(NODE_NAME, |n| n.internal_ip(NODE_IP.to_string())));
        for i in 0..self.services {
            server.create(service(&Self::namespace(i), &Self::name(i), |s| {
                s.cluster_ip(Self::cluster_ip(i).to_string())
                    .port(PORT_NAME, 80, "TCP")
                    .target_port(TARGET_PORT)
            }));
            server.create(Self::slice(i, Self::endpoint(i, 1), None));
        }
    }
}

fn offset(base: Ipv4Addr, n: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(base) + u32::try_from(n).unwrap())
}

/// `time` in RFC 3339 with nanoseconds, as the EndpointSlice controller
/// writes it.
fn rfc3339(time: SystemTime) -> String {
    let nanos = time.duration_since(UNIX_EPOCH).unwrap().as_nanos();
    Timestamp::from_nanosecond(i128::try_from(nanos).unwrap())
        .unwrap()
        .to_string()
}
