//! The workload of the upstream measurement: N Services × E
//! endpoints (one TCP port each; E = 2 as upstream was measured), then
//! patches of one endpoint each: a replaced endpoint (the count stays) or
//! an endpoint added and removed again (the count changes).
//!
//! Addresses (kp-testkit's plan): ClusterIPs from 10.96.0.10; endpoints on
//! node-2 from 10.244.16.0 (E per Service, consecutive) while the N × E fit
//! below the patched ones (57,344 addresses: 10,000 × 2 and 1,000 × 50
//! do), else from 10.16.0.0 in 10.16.0.0/12, outside the cluster CIDR
//! (5,000 × 50 is 250,000 addresses, and 10.244.0.0/16 has 65,536);
//! patched and added endpoints from 10.244.240.0; the hostile Service's
//! from 10.244.248.0. No host owns any of them. Every endpoint address is
//! used once: a node's pods back one Service each here, so the data
//! layout's per-address elements (its `hairpin-endpoints` pairs) are as
//! many as the endpoints, as on a node whose Services share no pods.
//! Outside the cluster CIDR is no different for the rules: the binary's
//! `--cluster-cidr` only tells which sources are pods (for masquerading),
//! it is never matched against an endpoint.

use std::net::Ipv4Addr;
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use kp_testkit::apiserver::TestApiServer;
use kp_testkit::builders::{endpoint_slice, node, service};
use kp_testkit::plan::{NODE_IP, NODE_NAME, OTHER_NODE_NAME, POD_CIDR, SERVICE_CIDR};

/// How many endpoints each Service has by default (`KP_E2E_ENDPOINTS`),
/// as upstream was measured.
pub const ENDPOINTS: usize = 2;

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
/// Where the fixed endpoints go when they do not fit the pod range
/// (10.16.0.0/12: apart from the ClusterIPs, the pods, the hostile
/// Service's source ranges from 10.128.0.0 and TEST-NET-3).
const OUTSIDE_ENDPOINTS_FROM: Ipv4Addr = Ipv4Addr::new(10, 16, 0, 0);
/// How many addresses that range has.
const OUTSIDE_ENDPOINTS: usize = 1 << 20;
/// The most endpoints an EndpointSlice may hold (the API server's limit).
const SLICE_ENDPOINTS: usize = 1_000;

/// N Services × E endpoints, one hostile Service beside them if asked,
/// and how many patches of which kind follow the first sync.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    pub services: usize,
    /// Endpoints per Service as populated (E).
    pub endpoints: usize,
    pub hostile: Hostile,
    pub patches: usize,
    pub kind: PatchKind,
}

/// What a patch does to its Service's EndpointSlice
/// (`KP_E2E_PATCH_KIND`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// `replace`: the second endpoint is replaced by a new address; the
    /// count stays E. Upstream's workload.
    Replace,
    /// `count`: patches go in pairs on one Service: the first adds a new
    /// endpoint (E + 1), the second removes it again (E). An added and
    /// removed endpoint, rather than a readiness flip, because it is the
    /// change a scale-up and a scale-down make, and it takes the count
    /// above E, where a flip takes it below.
    Count,
}

/// One patch: the Service it changes and that Service's endpoints after
/// it, in the order of its EndpointSlice.
#[derive(Debug, Clone)]
pub struct Change {
    pub service: usize,
    pub endpoints: Vec<Ipv4Addr>,
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

impl PatchKind {
    pub fn parse(name: &str) -> Self {
        match name {
            "replace" => Self::Replace,
            "count" => Self::Count,
            other => panic!("KP_E2E_PATCH_KIND: {other:?} is not one of replace, count"),
        }
    }

    /// How the header describes the patches.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Replace => "single-endpoint patches (one endpoint replaced; the count stays)",
            Self::Count => {
                "single-endpoint patches (an endpoint added to a Service, then removed again)"
            }
        }
    }
}

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

    /// How many service ports the hostile Service adds.
    pub fn service_ports(self) -> usize {
        match self {
            Self::None => 0,
            Self::Ports => 200,
            Self::SourceRanges | Self::Endpoints | Self::ExternalIps => 1,
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
    pub fn new(
        services: usize,
        endpoints: usize,
        hostile: Hostile,
        patches: usize,
        kind: PatchKind,
    ) -> Self {
        let workload = Self {
            services,
            endpoints,
            hostile,
            patches,
            kind,
        };
        assert!(services > 0, "no Services to run");
        assert!(
            endpoints * services <= OUTSIDE_ENDPOINTS,
            "{services} Services × {endpoints} endpoints do not fit the address plan"
        );
        let least = match kind {
            PatchKind::Replace => 2,
            PatchKind::Count => 1,
        };
        assert!(
            (least..SLICE_ENDPOINTS).contains(&endpoints),
            "KP_E2E_ENDPOINTS: {endpoints} endpoints per Service; with {kind:?} patches \
             between {least} and {} (an EndpointSlice holds at most {SLICE_ENDPOINTS}, \
             a patch may add one)",
            SLICE_ENDPOINTS - 1
        );
        assert!(
            PATCHED_FROM + patches <= HOSTILE_ENDPOINTS_FROM,
            "{patches} patches do not fit the address plan"
        );
        workload
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

    /// Endpoint `j` (below E) of Service `i` as populated.
    pub fn endpoint(&self, i: usize, j: usize) -> Ipv4Addr {
        let n = self.endpoints * i + j;
        if ENDPOINTS_FROM + self.endpoints * self.services <= PATCHED_FROM {
            offset(POD_CIDR.network(), ENDPOINTS_FROM + n)
        } else {
            offset(OUTSIDE_ENDPOINTS_FROM, n)
        }
    }

    /// Service `i`'s endpoints as populated.
    pub fn populated(&self, i: usize) -> Vec<Ipv4Addr> {
        (0..self.endpoints).map(|j| self.endpoint(i, j)).collect()
    }

    /// The address patch `k` brings in.
    pub fn patched_endpoint(k: usize) -> Ipv4Addr {
        offset(POD_CIDR.network(), PATCHED_FROM + k)
    }

    /// Service `i`'s endpoints after this workload's kind of change brings
    /// in `new`: in place of the second endpoint, or added after the last.
    pub fn changed(&self, i: usize, new: Ipv4Addr) -> Vec<Ipv4Addr> {
        let mut endpoints = self.populated(i);
        match self.kind {
            PatchKind::Replace => endpoints[1] = new,
            PatchKind::Count => endpoints.push(new),
        }
        endpoints
    }

    /// Patch `k`: a replacement on a different Service each time, spread
    /// over the Services; or, for count changes, an addition (even `k`)
    /// and its removal (the odd `k` after it) on a different Service each
    /// pair.
    pub fn change(&self, k: usize) -> Change {
        let service = match self.kind {
            PatchKind::Replace => self.patch_target(k, self.patches),
            PatchKind::Count => self.patch_target(k / 2, self.patches.div_ceil(2)),
        };
        let endpoints = match self.kind {
            PatchKind::Count if k % 2 == 1 => self.populated(service),
            PatchKind::Replace | PatchKind::Count => {
                self.changed(service, Self::patched_endpoint(k))
            }
        };
        Change { service, endpoints }
    }

    /// The Service patch `k` of `patches` changes: spread over the
    /// Services, a different one each time.
    pub fn patch_target(&self, k: usize, patches: usize) -> usize {
        k * self.services / patches + self.services / (2 * patches)
    }

    /// Service `i`'s EndpointSlice with `endpoints`, and `trigger` as its
    /// last-change-trigger-time if given.
    pub fn slice(i: usize, endpoints: &[Ipv4Addr], trigger: Option<SystemTime>) -> EndpointSlice {
        endpoint_slice(
            &Self::namespace(i),
            &format!("svc{i}-1"),
            &Self::name(i),
            |e| {
                let mut e = match trigger {
                    Some(time) => e.annotation(TRIGGER_TIME, &rfc3339(time)),
                    None => e,
                };
                e = e.address_type("IPv4").port(PORT_NAME, TARGET_PORT, "TCP");
                for address in endpoints {
                    e = e.endpoint(address.to_string(), |ep| {
                        ep.ready(true).node(OTHER_NODE_NAME)
                    });
                }
                e
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
            server.create(Self::slice(i, &self.populated(i), None));
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
