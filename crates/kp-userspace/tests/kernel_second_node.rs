//! Kernel test: an endpoint on a second node, whose pods have no route back
//! to the client except through the node, with the userspace proxy (portal
//! rules by iptables-legacy and by iptables-nft), IPv4 and IPv6. The relay
//! dials the endpoint from the node itself, so no masquerade rule is
//! involved: the endpoint sees the node's address because the node made
//! the connection.
//!
//! | object | addresses |
//! |---|---|
//! | node (proxy) | 192.168.99.2 / fd00:192:168:99::2 |
//! | node-2 | 192.168.99.3 / fd00:192:168:99::3, no route to the client |
//! | client | 192.168.99.10 / fd00:192:168:99::10 |
//! | ep3 (on node-2) | 10.244.2.2 / fd00:10:244:2::2 |
//! | ns1/cluster, http 80/TCP | NodePort 30100, eTP Cluster, endpoint ep3 |
//! | ns1/local, http 80/TCP | NodePort 30101, eTP Local, endpoint ep3 |
//!
//! ep3 answers the client through a NodePort only if the connection it sees
//! comes from the node's address: a reply to the client's address dies on
//! node-2.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kernel;

use std::net::IpAddr;

use kernel::{require, slice, Proxy, POD_TCP_PORT};
use kp_iptables::IptablesFlavor;
use kp_model::IpFamily;
use kp_testkit::builders::node_port_service;
use kp_testkit::netns::{connect, Topology, TopologyBuilder};
use kp_testkit::plan::node_at;

const CLUSTER_NODE_PORT: u16 = 30100;
const LOCAL_NODE_PORT: u16 = 30101;

on_both_flavors!(
    a_node_port_reaches_a_pod_on_the_second_node_masqueraded_to_the_node,
    a_node_port_reaches_a_pod_on_the_second_node_masqueraded_to_the_node_v6,
    external_traffic_policy_local_with_the_only_endpoint_on_the_second_node_is_not_served,
    external_traffic_policy_local_with_the_only_endpoint_on_the_second_node_is_not_served_v6,
);

/// ep1 on this node, ep3 behind the second node; one client; the node's
/// default route, as real nodes have one.
fn two_nodes() -> Topology {
    let builder: TopologyBuilder = Topology::builder()
        .with_second_node()
        .pod("ep1", |p| p.tcp(POD_TCP_PORT))
        .remote_pod("ep3", |p| p.tcp(POD_TCP_PORT));
    let topology = builder.build().unwrap();
    topology.add_node_default_route().unwrap();
    topology
}

fn masqueraded_to_the_node(flavor: IptablesFlavor, family: IpFamily) {
    require(flavor);
    let topology = two_nodes();
    let proxy = Proxy::start(&topology, flavor, family);
    let service = node_port_service(family == IpFamily::V6, "cluster", CLUSTER_NODE_PORT, false);
    let endpoints = slice(
        "cluster",
        &[],
        &[topology.pod("ep3").ip_of(family == IpFamily::V6)],
    );
    proxy.apply(&[service], &[endpoints]);
    proxy.sync();

    let reply = connect(
        topology.client(),
        node_at(family == IpFamily::V6, CLUSTER_NODE_PORT),
    )
    .unwrap_or_else(|error| panic!("no answer through the NodePort from ep3 on node-2: {error}"));
    assert_eq!(reply.backend, "ep3");
    assert_eq!(
        reply.source,
        node_at(family == IpFamily::V6, 0).ip(),
        "ep3 must see the node's address"
    );
}

fn not_served_without_local_endpoint(flavor: IptablesFlavor, family: IpFamily) {
    require(flavor);
    let topology = two_nodes();
    let proxy = Proxy::start(&topology, flavor, family);
    let services = [
        node_port_service(family == IpFamily::V6, "local", LOCAL_NODE_PORT, true),
        node_port_service(family == IpFamily::V6, "cluster", CLUSTER_NODE_PORT, false),
    ];
    let remote = [topology.pod("ep3").ip_of(family == IpFamily::V6)];
    proxy.apply(
        &services,
        &[slice("local", &[], &remote), slice("cluster", &[], &remote)],
    );
    proxy.sync();

    let client = topology.client();
    let client_ip = match family {
        IpFamily::V4 => IpAddr::V4(client.ip()),
        IpFamily::V6 => IpAddr::V6(client.ip_v6()),
    };
    topology.count_second_node_forwarding(client_ip);
    // The same endpoint answers through the eTP Cluster NodePort, so the
    // failure below is the proxy's, not the path to node-2.
    let cluster = connect(client, node_at(family == IpFamily::V6, CLUSTER_NODE_PORT)).unwrap();
    assert_eq!(cluster.backend, "ep3");
    let local = connect(client, node_at(family == IpFamily::V6, LOCAL_NODE_PORT));
    assert!(local.is_err(), "no local endpoint, yet answered: {local:?}");
    assert_eq!(
        topology.second_node_forwarded(),
        0,
        "nothing from the client reaches node-2 (the relay dials from the node)"
    );
}

fn a_node_port_reaches_a_pod_on_the_second_node_masqueraded_to_the_node(flavor: IptablesFlavor) {
    masqueraded_to_the_node(flavor, IpFamily::V4);
}

fn a_node_port_reaches_a_pod_on_the_second_node_masqueraded_to_the_node_v6(flavor: IptablesFlavor) {
    masqueraded_to_the_node(flavor, IpFamily::V6);
}

fn external_traffic_policy_local_with_the_only_endpoint_on_the_second_node_is_not_served(
    flavor: IptablesFlavor,
) {
    not_served_without_local_endpoint(flavor, IpFamily::V4);
}

fn external_traffic_policy_local_with_the_only_endpoint_on_the_second_node_is_not_served_v6(
    flavor: IptablesFlavor,
) {
    not_served_without_local_endpoint(flavor, IpFamily::V6);
}
