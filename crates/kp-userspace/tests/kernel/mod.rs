//! The userspace proxy under test in a harness topology: `kp_sync::Proxier`
//! with the userspace backend, its sync and its relay's tokio runtime both
//! in the node namespace (so listeners and connections to endpoints are
//! made there), fed with objects built by `kp_testkit::builders`.
//!
//! Address plan (`kp_testkit::plan` and the harness): node 192.168.99.2,
//! clients 192.168.99.10, .11; pods of this node 10.244.1.2, .3; the pod
//! "of node-2" 10.244.2.2; ClusterIPs 10.96.0.0/16; external and load
//! balancer IPs 203.0.113.0/24; IPv6 fd00:10:96::/112 services,
//! fd00:10:244::/48 pods. Every pod serves TCP 8080 and UDP 5353.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_iptables::{IptablesFlavor, SystemApplier};
use kp_model::{IpFamily, NodeInfo, ObjectEvent, ProxyEventHandler, ResourceKind};
use kp_sync::{Proxier, ProxierConfig, RunnerConfig, SyncOutcome};
use kp_testkit::builders::endpoint_slice;
use kp_testkit::netns::{require_root, require_tool, Topology, TopologyBuilder};
use kp_testkit::plan::{self, NODE_NAME, OTHER_NODE_NAME};
use kp_userspace::{JumpCheck, RelayOptions, UserspaceBackend};

/// The port every pod's echo servers listen on (TCP).
pub const POD_TCP_PORT: u16 = 8080;
/// The port every pod's echo servers listen on (UDP).
pub const POD_UDP_PORT: u16 = 5353;

/// Runs one scenario function on iptables-legacy and on iptables-nft, as
/// two tests in modules `legacy` and `nft`.
#[macro_export]
macro_rules! on_both_flavors {
    ($($scenario:ident),* $(,)?) => {
        mod legacy {
            $(#[test] fn $scenario() { super::$scenario(kp_iptables::IptablesFlavor::Legacy) })*
        }
        mod nft {
            $(#[test] fn $scenario() { super::$scenario(kp_iptables::IptablesFlavor::Nft) })*
        }
    };
}

/// Fails the test unless it can run: root, iproute2 and `flavor`'s programs.
pub fn require(flavor: IptablesFlavor) {
    require_root();
    require_tool("ip");
    for family in [IpFamily::V4, IpFamily::V6] {
        for tool in [
            kp_iptables::applier::Tool::Iptables,
            kp_iptables::applier::Tool::Save,
            kp_iptables::applier::Tool::Restore,
        ] {
            require_tool(&flavor.program(family, tool));
        }
    }
}

/// Pods `ep1`, `ep2` on this node and `ep3` on node-2, each serving TCP
/// 8080 and UDP 5353, and clients `client`, `client2`; with the node's
/// default route, as real nodes have one.
pub fn three_pods() -> Topology {
    let builder: TopologyBuilder = Topology::builder()
        .pod("ep1", |p| p.tcp(POD_TCP_PORT).udp(POD_UDP_PORT))
        .pod("ep2", |p| p.tcp(POD_TCP_PORT).udp(POD_UDP_PORT))
        .remote_pod("ep3", |p| p.tcp(POD_TCP_PORT).udp(POD_UDP_PORT))
        .client("client")
        .client("client2");
    let topology = builder.build().unwrap();
    topology.add_node_default_route().unwrap();
    topology
}

/// The proxy: a proxier of one family with the userspace backend.
pub struct Proxy<'t> {
    pub topology: &'t Topology,
    pub proxier: Arc<Proxier>,
    /// The relay's runtime; its threads live in the node namespace.
    runtime: Option<tokio::runtime::Runtime>,
}

impl<'t> Proxy<'t> {
    /// A proxy for `family` on the topology's node, applying portal rules
    /// with `flavor`; the sources have delivered their first lists.
    pub fn start(topology: &'t Topology, flavor: IptablesFlavor, family: IpFamily) -> Self {
        let options = RelayOptions {
            dial_timeouts: vec![Duration::from_millis(300); 3],
            ..RelayOptions::default()
        };
        Self::start_with(topology, flavor, family, options)
    }

    /// [`Proxy::start`] with the relay's `options`.
    pub fn start_with(
        topology: &'t Topology,
        flavor: IptablesFlavor,
        family: IpFamily,
        options: RelayOptions,
    ) -> Self {
        Self::start_publishing(topology, flavor, family, options, None)
    }

    /// [`Proxy::start_with`], publishing the relay's routing table at
    /// `routes_file` (nowhere when `None`: the tests do not write to the
    /// node's `/run/kube-proxy`).
    pub fn start_publishing(
        topology: &'t Topology,
        flavor: IptablesFlavor,
        family: IpFamily,
        options: RelayOptions,
        routes_file: Option<PathBuf>,
    ) -> Self {
        // Built on a thread of the node namespace, the runtime's worker
        // threads are born there too.
        let runtime = topology.node().run(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap()
        });
        let applier = Box::new(SystemApplier::new(flavor));
        let backend = UserspaceBackend::new(runtime.handle().clone(), family, options, applier)
            .with_jump_check(JumpCheck::for_flavor(flavor))
            .with_routes_file(routes_file);
        let config = ProxierConfig {
            family,
            node: NodeInfo {
                name: NODE_NAME.to_owned(),
                addresses: vec![IpAddr::V4(plan::NODE_IP), IpAddr::V6(plan::NODE_IP_V6)],
                ..NodeInfo::default()
            },
            runner: RunnerConfig {
                min_interval: Duration::ZERO,
                max_interval: Duration::ZERO,
                retry_interval: Duration::from_millis(100),
            },
        };
        let proxier = Arc::new(Proxier::new(config, Box::new(backend)));
        proxier.on_synced(ResourceKind::Service);
        proxier.on_synced(ResourceKind::EndpointSlice);
        Self {
            topology,
            proxier,
            runtime: Some(runtime),
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
        result.unwrap_or_else(|error| panic!("sync failed: {}", error_chain(&error)))
    }
}

impl Drop for Proxy<'_> {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
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

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
