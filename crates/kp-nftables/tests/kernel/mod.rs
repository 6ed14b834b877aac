//! The proxy under test in a harness topology: `kp_sync::Proxier` with the
//! nftables backend, running in the node namespace, fed with objects built
//! by `kp_testkit::builders`.
//!
//! Address plan (`kp_testkit::plan` and the harness): node 192.168.99.2,
//! clients 192.168.99.10, .11; pods of this node 10.244.1.2, .3, …; pods "of
//! node-2" 10.244.2.2, …; ClusterIPs 10.96.0.0/16; external and load
//! balancer IPs 203.0.113.0/24; IPv6 fd00:10:96::/112 services,
//! fd00:10:244::/48 pods. Every pod serves TCP 8080 and UDP 5353.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

/// `#[test]`s running each of the functions named in both layouts.
#[allow(unused_macros)] // not every test file runs tests in both layouts
macro_rules! in_both_layouts {
    ($($test:ident),* $(,)?) => {
        mod chains {
            $(#[test]
            fn $test() {
                super::$test(kp_nftables::Layout::Chains);
            })*
        }
        mod data {
            $(#[test]
            fn $test() {
                super::$test(kp_nftables::Layout::Data);
            })*
        }
    };
}

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_model::{IpFamily, NodeInfo, ObjectEvent, ProxyEventHandler, ResourceKind};
use kp_nftables::{Layout, NftablesBackend, NftablesOptions};
use kp_node::{LocalDetector, NodePortAddresses};
use kp_sync::{Proxier, ProxierConfig, RunnerConfig, SyncOutcome};
use kp_testkit::builders::endpoint_slice;
use kp_testkit::netns::{require_root, require_tool, Topology, TopologyBuilder};
use kp_testkit::plan::{self, NODE_NAME, OTHER_NODE_NAME};

/// The port every pod's echo servers listen on (TCP).
pub const POD_TCP_PORT: u16 = 8080;
/// The port every pod's echo servers listen on (UDP).
pub const POD_UDP_PORT: u16 = 5353;

/// Fails the test unless it can run: root, iproute2 and nft.
pub fn require() {
    require_root();
    require_tool("ip");
    require_tool("nft");
}

/// A topology with pods `ep1`, `ep2` on this node and `ep3` on node-2,
/// each serving TCP 8080 and UDP 5353, and clients `client`, `client2`.
pub fn three_pods() -> TopologyBuilder {
    Topology::builder()
        .pod("ep1", |p| p.tcp(POD_TCP_PORT).udp(POD_UDP_PORT))
        .pod("ep2", |p| p.tcp(POD_TCP_PORT).udp(POD_UDP_PORT))
        .remote_pod("ep3", |p| p.tcp(POD_TCP_PORT).udp(POD_UDP_PORT))
        .client("client")
        .client("client2")
}

/// Builds `topology` with a default route on the node.
pub fn build(topology: TopologyBuilder) -> Topology {
    let topology = topology.build().unwrap();
    topology.add_node_default_route().unwrap();
    topology
}

/// The proxy: a proxier of one family with the nftables backend. Every
/// sync runs in the node namespace.
pub struct Proxy<'t> {
    pub topology: &'t Topology,
    pub family: IpFamily,
    pub proxier: Arc<Proxier>,
}

impl<'t> Proxy<'t> {
    /// A proxy for `family` with NodePorts on every local address, in the
    /// default layout (data); the sources have already delivered their
    /// (empty) first lists.
    pub fn start(topology: &'t Topology, family: IpFamily) -> Self {
        Self::start_with(topology, family, Duration::ZERO, NodePortAddresses::All)
    }

    /// Like [`Proxy::start`], with `syncPeriod` = `sync_period` (zero: no
    /// periodic syncs) and `nodePortAddresses`.
    pub fn start_with(
        topology: &'t Topology,
        family: IpFamily,
        sync_period: Duration,
        node_ports: NodePortAddresses,
    ) -> Self {
        Self::start_with_layout(topology, family, sync_period, node_ports, Layout::default())
    }

    /// Like [`Proxy::start`], writing the table in `layout`.
    pub fn start_in(topology: &'t Topology, family: IpFamily, layout: Layout) -> Self {
        let all = NodePortAddresses::All;
        Self::start_with_layout(topology, family, Duration::ZERO, all, layout)
    }

    /// Like [`Proxy::start_with`], writing the table in `layout`.
    pub fn start_with_layout(
        topology: &'t Topology,
        family: IpFamily,
        sync_period: Duration,
        node_ports: NodePortAddresses,
        layout: Layout,
    ) -> Self {
        let options = NftablesOptions {
            local_detector: LocalDetector::ClusterCidr(vec![
                plan::POD_CIDR.into(),
                plan::POD_CIDR_V6.into(),
            ]),
            ..NftablesOptions::default()
        };
        let backend = NftablesBackend::system(family, options, node_ports)
            .unwrap()
            .with_layout(layout);
        let config = ProxierConfig {
            family,
            node: NodeInfo {
                name: NODE_NAME.to_owned(),
                addresses: vec![IpAddr::V4(plan::NODE_IP), IpAddr::V6(plan::NODE_IP_V6)],
                ..NodeInfo::default()
            },
            runner: RunnerConfig {
                min_interval: Duration::ZERO,
                max_interval: sync_period,
                retry_interval: Duration::from_millis(100),
            },
        };
        let proxier = Arc::new(Proxier::new(config, Box::new(backend)));
        proxier.on_synced(ResourceKind::Service);
        proxier.on_synced(ResourceKind::EndpointSlice);
        Self {
            topology,
            family,
            proxier,
        }
    }

    /// Records Services and EndpointSlices (nothing is written yet).
    pub fn apply(&self, services: &[Service], slices: &[EndpointSlice]) -> &Self {
        for service in services {
            self.proxier.on_service(ObjectEvent::Apply(service.clone()));
        }
        for slice in slices {
            self.proxier
                .on_endpoint_slice(ObjectEvent::Apply(slice.clone()));
        }
        self
    }

    /// Syncs once, in the node namespace.
    #[track_caller]
    pub fn sync(&self) -> SyncOutcome {
        let proxier = &self.proxier;
        let result = self.topology.node().run(|| proxier.sync_once());
        result.unwrap_or_else(|error| panic!("sync failed: {}", kp_sync::error_chain(&error)))
    }

    /// Syncs once in full, as the periodic sync does, in the node namespace.
    #[track_caller]
    #[allow(dead_code)] // not every test file syncs in full
    pub fn full_sync(&self) -> SyncOutcome {
        let proxier = &self.proxier;
        let result = self.topology.node().run(|| proxier.sync_once_full());
        result.unwrap_or_else(|error| panic!("sync failed: {}", kp_sync::error_chain(&error)))
    }

    /// `nft ARGS…` in the node namespace (someone else touching the rules).
    pub fn nft(&self, args: &[&str]) -> String {
        self.topology.node().exec_ok("nft", args)
    }

    /// `nft list table` of this family's table in the node namespace.
    pub fn list(&self) -> String {
        let family = match self.family {
            IpFamily::V4 => "ip",
            IpFamily::V6 => "ip6",
        };
        self.nft(&["list", "table", family, "kube-proxy"])
    }
}

/// An EndpointSlice `ns1/<service>-1` with port `http` 8080/TCP and `dns`
/// 5353/UDP, and one ready endpoint per address; `local` addresses are on
/// this node, the others on node-2.
pub fn slice(service: &str, local: &[IpAddr], remote: &[IpAddr]) -> EndpointSlice {
    endpoint_slice("ns1", &format!("{service}-1"), service, |s| {
        let v6 = local.iter().chain(remote).any(IpAddr::is_ipv6);
        let mut s = s
            .address_type(if v6 { "IPv6" } else { "IPv4" })
            .port("http", i32::from(POD_TCP_PORT), "TCP")
            .port("dns", i32::from(POD_UDP_PORT), "UDP");
        for ip in local {
            s = s.endpoint(ip, |e| e.ready(true).node(NODE_NAME));
        }
        for ip in remote {
            s = s.endpoint(ip, |e| e.ready(true).node(OTHER_NODE_NAME));
        }
        s
    })
}

/// `ip:port` as a socket address.
pub fn at(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap(), port)
}

/// The node's address at `port`.
pub fn node_at(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(plan::NODE_IP), port)
}

/// The IPv4 address of pod `name`.
pub fn pod_ip(topology: &Topology, name: &str) -> IpAddr {
    IpAddr::V4(topology.pod(name).ip())
}

/// The IPv6 address of pod `name`.
pub fn pod_ip_v6(topology: &Topology, name: &str) -> IpAddr {
    IpAddr::V6(topology.pod(name).ip_v6())
}

/// A proxier running its sync loop in the node namespace; stopped and
/// joined on drop.
pub struct Running {
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy<'_> {
    /// Runs the proxier's loop on a thread of the node namespace until the
    /// result is dropped.
    pub fn run_in_background(&self) -> Running {
        let proxier = Arc::clone(&self.proxier);
        let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = self.topology.node().run(move || {
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .unwrap();
                runtime.block_on(proxier.run(async {
                    let _ = stopped.await;
                }));
            })
        });
        Running {
            shutdown: Some(shutdown),
            thread: Some(thread),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `ns1/web` (ClusterIP 10.96.0.10:80 → `web_endpoint`:8080, on this node)
/// and `ns1/fill0` … `fill<fillers-1>` (ClusterIPs 10.96.1.0 …, one endpoint
/// each on node-2, 10.244.2.100 …, with no host behind it), as the sync
/// loop hands them to a backend.
pub fn web_and_fillers(
    web_endpoint: IpAddr,
    fillers: u32,
) -> std::collections::BTreeMap<kp_model::ServicePortName, kp_sync::ServicePortState> {
    use kp_sync::testing::service;
    let mut all = std::collections::BTreeMap::new();
    let (name, state) = service("ns1", "web", "10.96.0.10", 80)
        .local_endpoint(&web_endpoint.to_string(), POD_TCP_PORT)
        .build();
    all.insert(name, state);
    for n in 0..fillers {
        let (name, state) = service("ns1", &format!("fill{n}"), &format!("10.96.1.{n}"), 80)
            .remote_endpoint(&format!("10.244.2.{}", 100 + n), POD_TCP_PORT)
            .build();
        all.insert(name, state);
    }
    all
}

/// An IPv4 backend committing over netlink, ClusterCIDR 10.244.0.0/16,
/// NodePorts on every address, in the chains layout (callers that test
/// the data layout say so with `with_layout`).
pub fn netlink_backend_v4() -> NftablesBackend {
    let options = NftablesOptions {
        local_detector: LocalDetector::ClusterCidr(vec![plan::POD_CIDR.into()]),
        ..NftablesOptions::default()
    };
    NftablesBackend::system(IpFamily::V4, options, NodePortAddresses::All)
        .unwrap()
        .with_layout(Layout::Chains)
}

/// This node (192.168.99.2), IPv4 only.
pub fn node_v4() -> NodeInfo {
    NodeInfo {
        name: NODE_NAME.to_owned(),
        addresses: vec![IpAddr::V4(plan::NODE_IP)],
        ..NodeInfo::default()
    }
}

/// One sync of `backend` (of `family`) in the node namespace of
/// `topology`, with every Service of `service_ports` marked changed (a
/// caller that does not track changes).
pub fn sync_backend(
    topology: &Topology,
    backend: &mut NftablesBackend,
    family: IpFamily,
    node: &NodeInfo,
    service_ports: &std::collections::BTreeMap<
        kp_model::ServicePortName,
        kp_sync::ServicePortState,
    >,
    full: bool,
) -> SyncOutcome {
    use kp_sync::Backend;
    let stale = kp_sync::StaleConntrack::default();
    let every: std::collections::BTreeSet<kp_model::NamespacedName> = service_ports
        .keys()
        .map(|port| port.service.clone())
        .collect();
    let request = kp_sync::SyncRequest {
        family,
        full,
        service_ports,
        changed_services: &every,
        node,
        stale_conntrack: &stale,
    };
    topology.node().run(|| backend.sync(&request)).unwrap()
}
