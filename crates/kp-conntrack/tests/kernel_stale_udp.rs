//! Kernel tests: UDP clients that keep sending from one source port move
//! off an endpoint as soon as the Service stops using it, whatever way it
//! leaves, in the iptables and the nftables mode (each table layout), for a
//! client in a pod of the node, in the node itself and outside the node.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/dns, port dns 53/UDP, NodePort 30053 | ClusterIP 10.96.0.20 |
//! | pod s1 (another node) | 10.244.2.2, UDP echo on 5353 |
//! | pod s2 (this node) | 10.244.1.2, UDP echo on 5353 |
//! | pod client-pod (this node, no server) | 10.244.1.3 |
//! | node, client outside | 192.168.99.2, 192.168.99.10 |
//!
//! Each client sends from one fixed source port, so all its datagrams
//! belong to one conntrack entry: only the reconcile after a sync can move
//! it. Each step syncs once and then asks every client once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use common::UdpClient;

use k8s_openapi::api::core::v1::Service;
use kp_conntrack::{ConntrackCleaner, ConntrackMetrics};
use kp_iptables::{
    IptablesBackend, IptablesFlavor, IptablesOptions, LocalDetector, NodePortAddresses,
};
use kp_model::{IpFamily, NodeInfo, ObjectEvent, ProxyEventHandler, ResourceKind};
use kp_nftables::{Layout, NftablesBackend, NftablesOptions};
use kp_sync::{Backend, Proxier, ProxierConfig, RunnerConfig};
use kp_testkit::builders::{endpoint_slice, service, EndpointBuilder};
use kp_testkit::netns::{require_root, require_tool, Topology};
use kp_testkit::plan::{self, NODE_NAME, OTHER_NODE_NAME};

const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 20);
const SERVICE_PORT: u16 = 53;
const NODE_PORT: u16 = 30053;
const POD_UDP_PORT: u16 = 5353;

/// The data-plane modes whose flows the conntrack cleaner reconciles.
#[derive(Debug, Clone, Copy)]
enum Mode {
    Iptables,
    /// The nftables mode with its table in this layout.
    Nftables(Layout),
}

#[test]
fn iptables_clients_leave_an_endpoint_that_terminates_while_another_is_ready() {
    terminating_while_another_is_ready(Mode::Iptables);
}

#[test]
fn nftables_clients_leave_an_endpoint_that_terminates_while_another_is_ready() {
    terminating_while_another_is_ready(Mode::Nftables(Layout::Chains));
}

#[test]
fn nftables_data_layout_clients_leave_an_endpoint_that_terminates_while_another_is_ready() {
    terminating_while_another_is_ready(Mode::Nftables(Layout::Data));
}

#[test]
fn iptables_clients_leave_a_terminating_endpoint_once_it_is_removed() {
    removed_after_terminating_alone(Mode::Iptables);
}

#[test]
fn nftables_clients_leave_a_terminating_endpoint_once_it_is_removed() {
    removed_after_terminating_alone(Mode::Nftables(Layout::Chains));
}

#[test]
fn nftables_data_layout_clients_leave_a_terminating_endpoint_once_it_is_removed() {
    removed_after_terminating_alone(Mode::Nftables(Layout::Data));
}

#[test]
fn iptables_clients_of_a_service_without_endpoints_reach_its_first_one() {
    first_endpoint_after_none(Mode::Iptables);
}

#[test]
fn nftables_clients_of_a_service_without_endpoints_reach_its_first_one() {
    first_endpoint_after_none(Mode::Nftables(Layout::Chains));
}

#[test]
fn nftables_data_layout_clients_of_a_service_without_endpoints_reach_its_first_one() {
    first_endpoint_after_none(Mode::Nftables(Layout::Data));
}

/// The walk: s1 alone; s2 added; s1 terminating (still serving)
/// while s2 is ready; s1 removed.
fn terminating_while_another_is_ready(mode: Mode) {
    let walk = Walk::start(mode);
    walk.sync(&[("s1", ready_remote)]);
    let mut clients = walk.clients();
    clients.expect_all("s1", "with s1 alone");

    walk.sync(&[("s1", ready_remote), ("s2", ready_local)]);
    clients.expect_all("s1", "a new ready endpoint leaves the flows where they are");

    walk.sync(&[("s1", terminating_remote), ("s2", ready_local)]);
    clients.expect_all(
        "s2",
        "s1 terminates while s2 is ready: the rules no longer pick s1",
    );

    walk.sync(&[("s2", ready_local)]);
    clients.expect_all("s2", "after s1 is removed");
}

/// s1 alone; s1 terminating and still serving, the only endpoint, so
/// still used; s1 removed as s2 arrives.
fn removed_after_terminating_alone(mode: Mode) {
    let walk = Walk::start(mode);
    walk.sync(&[("s1", ready_remote)]);
    let mut clients = walk.clients();
    clients.expect_all("s1", "with s1 alone");

    walk.sync(&[("s1", terminating_remote)]);
    clients.expect_all(
        "s1",
        "a terminating endpoint that still serves is used while no other is ready",
    );

    walk.sync(&[("s2", ready_local)]);
    clients.expect_all("s2", "after s1 is removed");
}

/// A Service without endpoints refuses; its first endpoint answers the
/// same sockets at once.
fn first_endpoint_after_none(mode: Mode) {
    let walk = Walk::start(mode);
    walk.sync(&[]);
    let mut clients = walk.clients();
    for client in &mut clients.0 {
        let answer = client.try_ask();
        assert!(
            answer.is_err(),
            "{}: a Service without endpoints answered: {answer:?}",
            client.name
        );
    }

    walk.sync(&[("s2", ready_local)]);
    clients.expect_all("s2", "after the first endpoint appeared");
}

/// One mode's proxy in a topology with the two endpoints and the clients.
struct Walk {
    topology: Topology,
    proxier: Proxier,
}

impl Walk {
    fn start(mode: Mode) -> Self {
        require_root();
        match mode {
            Mode::Iptables => require_tool(
                &IptablesFlavor::Legacy.program(IpFamily::V4, kp_iptables::applier::Tool::Restore),
            ),
            Mode::Nftables(_) => {}
        }
        let topology = Topology::builder()
            .remote_pod("s1", |p| p.udp(POD_UDP_PORT))
            .pod("s2", |p| p.udp(POD_UDP_PORT))
            .pod("client-pod", |p| p)
            .client("client")
            .build()
            .unwrap();
        topology.add_node_default_route().unwrap();
        let backend = topology.node().run(|| backend(mode));
        let cleaner = ConntrackCleaner::new(IpFamily::V4, ConntrackMetrics::new());
        let config = ProxierConfig {
            family: IpFamily::V4,
            node: NodeInfo {
                name: NODE_NAME.to_owned(),
                addresses: vec![IpAddr::V4(plan::NODE_IP)],
                ..NodeInfo::default()
            },
            runner: RunnerConfig {
                min_interval: Duration::ZERO,
                max_interval: Duration::ZERO,
                retry_interval: Duration::from_millis(100),
            },
        };
        let proxier = Proxier::new(config, backend).with_observer(Arc::new(cleaner));
        proxier.on_synced(ResourceKind::Service);
        proxier.on_synced(ResourceKind::EndpointSlice);
        Self { topology, proxier }
    }

    /// Gives the Service the endpoints `(pod, conditions)` and syncs once
    /// in the node namespace (the reconcile runs within the sync).
    fn sync(&self, endpoints: &[(&str, Conditions)]) {
        let slice = endpoint_slice("ns1", "dns-1", "dns", |mut s| {
            s = s.port("dns", i32::from(POD_UDP_PORT), "UDP");
            for (pod, conditions) in endpoints {
                let ip = self.topology.pod(pod).ip();
                s = s.endpoint(ip, *conditions);
            }
            s
        });
        self.proxier.on_service(ObjectEvent::Apply(dns()));
        self.proxier.on_endpoint_slice(ObjectEvent::Apply(slice));
        self.topology
            .node()
            .run(|| self.proxier.sync_once())
            .unwrap();
    }

    /// A client in a pod of the node and one in the node, both to the
    /// ClusterIP; one outside the node to the NodePort.
    fn clients(&self) -> Clients {
        let cluster_ip = SocketAddr::new(IpAddr::V4(CLUSTER_IP), SERVICE_PORT);
        let node_port = SocketAddr::new(IpAddr::V4(plan::NODE_IP), NODE_PORT);
        Clients(vec![
            UdpClient::open("pod", self.topology.pod("client-pod").netns(), cluster_ip),
            UdpClient::open("node", self.topology.node(), cluster_ip),
            UdpClient::open("outside", self.topology.client().netns(), node_port),
        ])
    }
}

fn backend(mode: Mode) -> Box<dyn Backend> {
    let detector = LocalDetector::ClusterCidr(vec![plan::POD_CIDR.into()]);
    match mode {
        Mode::Iptables => {
            let options = IptablesOptions {
                local_detector: detector,
                ..IptablesOptions::default()
            };
            Box::new(
                IptablesBackend::system(
                    IpFamily::V4,
                    options,
                    NodePortAddresses::All,
                    IptablesFlavor::Legacy,
                )
                .unwrap(),
            )
        }
        Mode::Nftables(layout) => {
            let options = NftablesOptions {
                local_detector: detector,
                ..NftablesOptions::default()
            };
            Box::new(
                NftablesBackend::system(IpFamily::V4, options, NodePortAddresses::All)
                    .unwrap()
                    .with_layout(layout),
            )
        }
    }
}

fn dns() -> Service {
    service("ns1", "dns", |s| {
        s.service_type("NodePort")
            .cluster_ip(CLUSTER_IP)
            .port("dns", i32::from(SERVICE_PORT), "UDP")
            .node_port(i32::from(NODE_PORT))
    })
}

/// An endpoint's conditions and node.
type Conditions = fn(EndpointBuilder) -> EndpointBuilder;

fn ready_remote(e: EndpointBuilder) -> EndpointBuilder {
    e.ready(true).node(OTHER_NODE_NAME)
}

fn ready_local(e: EndpointBuilder) -> EndpointBuilder {
    e.ready(true).node(NODE_NAME)
}

/// What the EndpointSlice controller writes while a pod shuts down.
fn terminating_remote(e: EndpointBuilder) -> EndpointBuilder {
    e.ready(false).terminating_serving().node(OTHER_NODE_NAME)
}

/// The three clients of one walk.
struct Clients(Vec<UdpClient>);

impl Clients {
    /// Every client's next datagram is answered by `pod`.
    #[track_caller]
    fn expect_all(&mut self, pod: &str, when: &str) {
        for client in &mut self.0 {
            let answer = client
                .try_ask()
                .unwrap_or_else(|error| panic!("{}: {when}: {error}", client.name));
            assert_eq!(
                answer, pod,
                "{}: {when}: answered by {answer}, wanted {pod}",
                client.name
            );
        }
    }
}
