//! The harness's second node against the real kernel (needs root): a pod
//! behind node-2 answers the proxy's node and its pods, but a client's
//! connection gets no reply, because node-2 has no route back to the client.
//! This is what makes a missing masquerade fail the proxies' tests.
//!
//! Address plan (from `kp_testkit::plan`):
//! - node 192.168.99.2 / fd00:192:168:99::2, node-2 192.168.99.3 /
//!   fd00:192:168:99::3
//! - client 192.168.99.10 / fd00:192:168:99::10
//! - ep1 10.244.1.2 (this node), ep3 10.244.2.2 / fd00:10:244:2::2 (node-2)
//! - 10.244.200.0/24 routed to ep3

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, SocketAddr};

use kp_testkit::netns::{connect, expect_timeout, require_root, udp_roundtrip, Topology};
use kp_testkit::plan::{
    CLIENT_IP, NODE_IP, NODE_IP_V6, OTHER_NODE_IP, OTHER_NODE_IP_V6, OTHER_NODE_POD_CIDR,
};

const ECHO_PORT: u16 = 8080;
const DNS_PORT: u16 = 53;

/// ep1 on this node, ep3 behind node-2; one client.
fn two_nodes() -> Topology {
    require_root();
    Topology::builder()
        .with_second_node()
        .pod("ep1", |p| p.tcp(ECHO_PORT).udp(DNS_PORT))
        .remote_pod("ep3", |p| p.tcp(ECHO_PORT).udp(DNS_PORT))
        .build()
        .unwrap()
}

#[test]
fn the_second_node_is_a_namespace_of_its_own_holding_the_remote_pods() {
    let topology = two_nodes();
    let ep3 = topology.pod("ep3");

    assert_eq!(
        topology.namespace_names().len(),
        5,
        "node, node-2, client, ep1, ep3"
    );
    assert!(ep3.is_remote());
    assert_eq!(ep3.ip().to_string(), "10.244.2.2");
    assert!(OTHER_NODE_POD_CIDR.contains(&ep3.ip()));
    let node2_links = topology
        .second_node()
        .ip(&["-brief", "link", "show"])
        .unwrap();
    assert!(
        node2_links.contains(ep3.node_interface()),
        "{} not on node-2: {node2_links}",
        ep3.node_interface()
    );
    let node_links = topology.node().ip(&["-brief", "link", "show"]).unwrap();
    assert!(
        !node_links.contains(ep3.node_interface()),
        "{} is on the proxy's node: {node_links}",
        ep3.node_interface()
    );
}

#[test]
fn the_node_and_its_pods_reach_a_pod_of_the_second_node() {
    let topology = two_nodes();
    let (ep1, ep3) = (topology.pod("ep1"), topology.pod("ep3"));

    let from_node = connect(topology.node(), ep3.addr(ECHO_PORT)).unwrap();
    assert_eq!(from_node.backend, "ep3");
    assert_eq!(from_node.source, IpAddr::V4(NODE_IP));

    let from_pod = connect(ep1, ep3.addr(ECHO_PORT)).unwrap();
    assert_eq!(from_pod.source, IpAddr::V4(ep1.ip()));

    let udp = udp_roundtrip(topology.node(), ep3.addr(DNS_PORT)).unwrap();
    assert_eq!(udp.source, IpAddr::V4(NODE_IP));

    let from_node_v6 = connect(topology.node(), ep3.addr_v6(ECHO_PORT)).unwrap();
    assert_eq!(from_node_v6.source, IpAddr::V6(NODE_IP_V6));
    let from_pod_v6 = connect(ep1, ep3.addr_v6(ECHO_PORT)).unwrap();
    assert_eq!(from_pod_v6.source, IpAddr::V6(ep1.ip_v6()));

    // A pod of node-2 reaches the node's pods too (host-gw both ways).
    assert_eq!(connect(ep3, ep1.addr(ECHO_PORT)).unwrap().backend, "ep1");
}

#[test]
fn a_client_gets_no_reply_from_a_pod_of_the_second_node() {
    let topology = two_nodes();
    let client = topology.client();
    let ep3 = topology.pod("ep3");

    // The node forwards the client's packets to node-2, which has no route
    // back to the client's address: only SNAT on the node makes this work.
    topology.count_second_node_forwarding(IpAddr::V4(CLIENT_IP));
    expect_timeout(client, ep3.addr(ECHO_PORT));
    assert!(
        topology.second_node_forwarded() > 0,
        "the client's packets reach node-2 and ep3; only the replies are lost"
    );
    expect_timeout(client, ep3.addr_v6(ECHO_PORT));
    // Nor is node-2 on the client's link, though its address is in the
    // client's /24 (/64).
    expect_timeout(client, SocketAddr::new(OTHER_NODE_IP.into(), ECHO_PORT));
    expect_timeout(client, SocketAddr::new(OTHER_NODE_IP_V6.into(), ECHO_PORT));

    // The node's own pods still answer the client with its own address.
    let local = connect(client, topology.pod("ep1").addr(ECHO_PORT)).unwrap();
    assert_eq!(local.source, IpAddr::V4(CLIENT_IP));
}

#[test]
fn a_range_routed_to_a_pod_of_the_second_node_goes_through_the_second_node() {
    let topology = two_nodes();
    topology
        .route_range_to_pod("ep3", "10.244.200.0/24")
        .unwrap();
    topology
        .route_range_to_pod("ep3", "fd00:10:244:200::/64")
        .unwrap();

    let v4: SocketAddr = "10.244.200.7:8080".parse().unwrap();
    let v6: SocketAddr = "[fd00:10:244:200::7]:8080".parse().unwrap();
    let reply = connect(topology.node(), v4).unwrap();
    assert_eq!(
        (reply.backend.as_str(), reply.source),
        ("ep3", IpAddr::V4(NODE_IP))
    );
    assert_eq!(connect(topology.node(), v6).unwrap().backend, "ep3");
}

#[test]
#[should_panic(expected = "no second node")]
fn asking_for_a_second_node_that_was_not_built_panics() {
    require_root();
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(ECHO_PORT))
        .build()
        .unwrap();
    topology.second_node();
}
