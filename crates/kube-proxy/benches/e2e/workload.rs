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
/// First offset in the pod range of the hostile Service's endpoints.
const HOSTILE_ENDPOINTS_FROM: usize = 0xf800;

/// N Services × 2 endpoints, one hostile Service beside them if asked,
/// and how many patches follow the first sync.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    pub services: usize,
    pub hostile: Hostile,
    pub patches: usize,
}

/// One Service of the largest kind the API server accepts, put beside the
/// N ordinary ones (`KP_E2E_HOSTILE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hostile {
    /// None: the plain workload.
    None,
    /// A LoadBalancer Service with 10,000 `loadBalancerSourceRanges`.
    SourceRanges,
    /// A Service with 1,000 endpoints.
    Endpoints,
    /// A Service with 100 external IPs.
    ExternalIps,
    /// A Service with 200 ports.
    Ports,
}

/// The hostile Service's ClusterIP, past every ordinary one.
const HOSTILE_CLUSTER_IP: &str = "10.96.255.250";
/// The namespace and name of the hostile Service.
const HOSTILE: (&str, &str) = ("hostile", "big");

impl Hostile {
    pub fn parse(name: &str) -> Self {
        match name {
            "none" => Self::None,
            "source-ranges" => Self::SourceRanges,
            "endpoints" => Self::Endpoints,
            "external-ips" => Self::ExternalIps,
            "ports" => Self::Ports,
            other => panic!(
                "KP_E2E_HOSTILE: {other:?} is not one of none, source-ranges, endpoints, external-ips, ports"
            ),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::SourceRanges => "10,000 source ranges",
            Self::Endpoints => "1,000 endpoints",
            Self::ExternalIps => "100 external IPs",
            Self::Ports => "200 ports",
        }
    }

    /// Creates the Service and its EndpointSlice.
    fn populate(self, server: &TestApiServer) {
        let (namespace, name) = HOSTILE;
        let ports = if self == Self::Ports { 200 } else { 1 };
        let endpoints = if self == Self::Endpoints { 1_000 } else { 1 };
        match self {
            Self::None => return,
            Self::SourceRanges => server.create(service(namespace, name, |mut s| {
                s = s
                    .service_type("LoadBalancer")
                    .cluster_ip(HOSTILE_CLUSTER_IP)
                    .port("p0", 80, "TCP")
                    .target_port(TARGET_PORT)
                    .node_port(30_250)
                    .lb_ingress_ip("203.0.113.250");
                for i in 0..10_000u32 {
                    s = s.lb_source_range(format!("{}/32", Ipv4Addr::from(0x0a80_0000 + 2 * i)));
                }
                s
            })),
            Self::ExternalIps => server.create(service(namespace, name, |mut s| {
                s = s
                    .cluster_ip(HOSTILE_CLUSTER_IP)
                    .port("p0", 80, "TCP")
                    .target_port(TARGET_PORT);
                for i in 0..100u32 {
                    s = s.external_ip(Ipv4Addr::from(0xcb00_7100 + i).to_string());
                }
                s
            })),
            Self::Endpoints | Self::Ports => server.create(service(namespace, name, |mut s| {
                s = s.cluster_ip(HOSTILE_CLUSTER_IP);
                for p in 0..ports {
                    s = s
                        .port(&format!("p{p}"), 10_000 + p, "TCP")
                        .target_port(TARGET_PORT);
                }
                s
            })),
        };
        server.create(endpoint_slice(
            namespace,
            &format!("{name}-1"),
            name,
            |mut e| {
                e = e.address_type("IPv4");
                for p in 0..ports {
                    e = e.port(&format!("p{p}"), TARGET_PORT, "TCP");
                }
                for j in 0..endpoints {
                    let address = offset(POD_CIDR.network(), HOSTILE_ENDPOINTS_FROM + j);
                    e = e.endpoint(address.to_string(), |ep| {
                        ep.ready(true).node(OTHER_NODE_NAME)
                    });
                }
                e
            },
        ));
    }
}

impl Workload {
    pub fn new(services: usize, hostile: Hostile, patches: usize) -> Self {
        assert!(
            services > 0 && ENDPOINTS_FROM + 2 * services <= PATCHED_FROM,
            "{services} Services do not fit the address plan"
        );
        Self {
            services,
            hostile,
            patches,
        }
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
        self.hostile.populate(server);
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
