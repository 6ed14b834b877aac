//! Kernel tests: real conntrack in a node namespace programmed by the
//! iptables backend. A client keeps talking UDP to a Service from one
//! socket; when the Service's endpoint is replaced, the client's conntrack
//! entry still sends it to the old pod until the cleaner deletes the entry.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/dns, port dns 53/UDP | ClusterIP 10.96.0.20 |
//! | pods ep1, ep2 (this node) | 10.244.1.2, 10.244.1.3, UDP echo on 5353 |
//! | client | 192.168.99.10, outside the node |
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{self, ErrorKind};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use common::UdpClient;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_conntrack::{
    ConntrackCleaner, ConntrackMetrics, ConntrackTable, Flow, FlowTuple, NetlinkConntrack,
    IPPROTO_UDP,
};
use kp_iptables::{
    IptablesBackend, IptablesFlavor, IptablesOptions, LocalDetector, NodePortAddresses,
};
use kp_model::{IpFamily, NodeInfo, ObjectEvent, ProxyEventHandler, ResourceKind};
use kp_sync::{Proxier, ProxierConfig, RunnerConfig};
use kp_testkit::builders::{endpoint_slice, service};
use kp_testkit::netns::{require_root, require_tool, Topology};
use kp_testkit::plan::{self, NODE_NAME};

const SERVICE: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 20)), 53);
const POD_UDP_PORT: u16 = 5353;
const FLAVOR: IptablesFlavor = IptablesFlavor::Legacy;

fn require() {
    require_root();
    require_tool(&FLAVOR.program(IpFamily::V4, kp_iptables::applier::Tool::Restore));
}

fn two_pods() -> Topology {
    let topology = Topology::builder()
        .pod("ep1", |p| p.udp(POD_UDP_PORT))
        .pod("ep2", |p| p.udp(POD_UDP_PORT))
        .client("client")
        .build()
        .unwrap();
    topology.add_node_default_route().unwrap();
    topology
}

fn dns() -> Service {
    service("ns1", "dns", |s| {
        s.cluster_ip("10.96.0.20").port("dns", 53, "UDP")
    })
}

fn dns_slice(endpoint: Ipv4Addr) -> EndpointSlice {
    endpoint_slice("ns1", "dns-1", "dns", |s| {
        s.port("dns", i32::from(POD_UDP_PORT), "UDP")
            .endpoint(endpoint, |e| e.ready(true).node(NODE_NAME))
    })
}

/// The IPv4 proxier with the iptables backend, with `cleaner` attached when
/// given; the sources have delivered their first lists.
fn proxier(cleaner: Option<Arc<ConntrackCleaner>>) -> Proxier {
    let options = IptablesOptions {
        local_detector: LocalDetector::ClusterCidr(vec![plan::POD_CIDR.into()]),
        ..IptablesOptions::default()
    };
    let backend =
        IptablesBackend::system(IpFamily::V4, options, NodePortAddresses::All, FLAVOR).unwrap();
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
    let mut proxier = Proxier::new(config, Box::new(backend));
    if let Some(cleaner) = cleaner {
        proxier = proxier.with_observer(cleaner);
    }
    proxier.on_synced(ResourceKind::Service);
    proxier.on_synced(ResourceKind::EndpointSlice);
    proxier
}

/// Records `slice` (and the Service) and syncs in the node namespace.
fn sync(topology: &Topology, proxier: &Proxier, slice: EndpointSlice) {
    proxier.on_service(ObjectEvent::Apply(dns()));
    proxier.on_endpoint_slice(ObjectEvent::Apply(slice));
    topology.node().run(|| proxier.sync_once()).unwrap();
}

/// The node's UDP conntrack entries of the client's socket.
fn client_flows(topology: &Topology, client: &UdpClient) -> Vec<Flow> {
    let port = client.local_port();
    let listing = topology
        .node()
        .run(|| NetlinkConntrack::new().list(IpFamily::V4))
        .unwrap();
    listing
        .flows
        .into_iter()
        .filter(|flow| flow.protocol == IPPROTO_UDP && flow.original.src_port == port)
        .collect()
}

fn pod_addr(topology: &Topology, pod: &str) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(topology.pod(pod).ip()), POD_UDP_PORT)
}

#[test]
fn without_the_cleaner_the_flow_stays_pinned_to_the_removed_endpoint() {
    require();
    let topology = two_pods();
    let proxier = proxier(None);
    sync(&topology, &proxier, dns_slice(topology.pod("ep1").ip()));
    let mut client = UdpClient::open("client", topology.client().netns(), SERVICE);
    assert_eq!(client.ask(), "ep1");

    sync(&topology, &proxier, dns_slice(topology.pod("ep2").ip()));

    assert_eq!(
        client.ask(),
        "ep1",
        "the old entry still sends the flow to ep1"
    );
    let flows = client_flows(&topology, &client);
    assert_eq!(flows.len(), 1, "{flows:?}");
    assert_eq!(flows[0].original_destination(), SERVICE);
    assert_eq!(flows[0].reply_source(), pod_addr(&topology, "ep1"));
}

#[test]
fn with_the_cleaner_the_flow_moves_to_the_new_endpoint() {
    require();
    let topology = two_pods();
    let metrics = ConntrackMetrics::new();
    let cleaner = Arc::new(ConntrackCleaner::new(IpFamily::V4, metrics.clone()));
    let proxier = proxier(Some(cleaner));
    sync(&topology, &proxier, dns_slice(topology.pod("ep1").ip()));
    let mut client = UdpClient::open("client", topology.client().netns(), SERVICE);
    assert_eq!(client.ask(), "ep1");

    sync(&topology, &proxier, dns_slice(topology.pod("ep2").ip()));

    assert_eq!(
        metrics.deleted_entries(IpFamily::V4),
        1,
        "the client's entry"
    );
    assert_eq!(client.ask(), "ep2");
    let flows = client_flows(&topology, &client);
    assert_eq!(flows.len(), 1, "{flows:?}");
    assert_eq!(flows[0].reply_source(), pod_addr(&topology, "ep2"));
}

#[test]
fn ctnetlink_lists_and_deletes_an_entry_as_conntrack_does() {
    require();
    let topology = two_pods();
    let proxier = proxier(None);
    sync(&topology, &proxier, dns_slice(topology.pod("ep1").ip()));
    let mut client = UdpClient::open("client", topology.client().netns(), SERVICE);
    client.ask();

    let flows = client_flows(&topology, &client);
    assert_eq!(flows.len(), 1, "{flows:?}");
    let client_addr = SocketAddr::new(IpAddr::V4(plan::CLIENT_IP), client.local_port());
    // The reply tuple's destination is the masqueraded source, which the
    // kernel picks; the rest is the client's flow as sent and as DNATed.
    assert_eq!(
        (flows[0].original, flows[0].reply_source()),
        (
            FlowTuple::new(client_addr, SERVICE),
            pod_addr(&topology, "ep1")
        )
    );

    let (first, second) = topology.node().run(|| {
        let mut table = NetlinkConntrack::new();
        (table.delete(&flows).unwrap(), table.delete(&flows).unwrap())
    });
    assert_eq!((first.deleted, first.already_gone), (1, 0));
    assert_eq!((second.deleted, second.already_gone), (0, 1));
    assert!(first.failed.is_empty() && second.failed.is_empty());
    assert_eq!(client_flows(&topology, &client), []);
}

#[test]
fn when_the_last_endpoint_goes_the_client_is_refused_at_once() {
    require();
    let topology = two_pods();
    let cleaner = Arc::new(ConntrackCleaner::new(IpFamily::V4, ConntrackMetrics::new()));
    let proxier = proxier(Some(cleaner));
    sync(&topology, &proxier, dns_slice(topology.pod("ep1").ip()));
    let mut client = UdpClient::open("client", topology.client().netns(), SERVICE);
    assert_eq!(client.ask(), "ep1");

    let no_endpoints = endpoint_slice("ns1", "dns-1", "dns", |s| {
        s.port("dns", i32::from(POD_UDP_PORT), "UDP")
    });
    sync(&topology, &proxier, no_endpoints);

    let answer = client.try_ask();
    assert_eq!(
        answer.as_ref().map_err(io::Error::kind),
        Err(ErrorKind::ConnectionRefused),
        "the Service has no endpoint, so its REJECT rule answers: {answer:?}"
    );
}
