//! Kernel test: an endpoint on a second node, whose pods have no route back
//! to the client except through the node's masquerade, with the nftables
//! backend, IPv4 and IPv6.
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
//! ep3 answers the client through a NodePort only if the node rewrote the
//! connection's source to its own address: without that, ep3's reply to the
//! client dies on node-2 and the client times out.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kernel;

use std::net::IpAddr;

use kernel::{build, require, slice, Proxy, POD_TCP_PORT};
use kp_model::IpFamily;
use kp_nftables::Layout;
use kp_testkit::builders::node_port_service;
use kp_testkit::netns::{connect, expect_timeout, Topology, TopologyBuilder};
use kp_testkit::plan::node_at;

const CLUSTER_NODE_PORT: u16 = 30100;
const LOCAL_NODE_PORT: u16 = 30101;

/// ep1 on this node, ep3 behind the second node; one client.
fn two_nodes() -> TopologyBuilder {
    Topology::builder()
        .with_second_node()
        .pod("ep1", |p| p.tcp(POD_TCP_PORT))
        .remote_pod("ep3", |p| p.tcp(POD_TCP_PORT))
}

fn masqueraded_to_the_node(family: IpFamily, layout: Layout) {
    require();
    let topology = build(two_nodes());
    let proxy = Proxy::start_in(&topology, family, layout);
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
    .unwrap_or_else(|error| {
        panic!("no answer through the NodePort from ep3 on node-2 (not masqueraded?): {error}")
    });
    assert_eq!(reply.backend, "ep3");
    assert_eq!(
        reply.source,
        node_at(family == IpFamily::V6, 0).ip(),
        "ep3 must see the node's address"
    );
}

fn dropped_without_local_endpoint(family: IpFamily, layout: Layout) {
    require();
    let topology = build(two_nodes());
    let proxy = Proxy::start_in(&topology, family, layout);
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
    // silence below is the proxy's drop, not the path to node-2.
    let cluster = connect(client, node_at(family == IpFamily::V6, CLUSTER_NODE_PORT)).unwrap();
    assert_eq!(cluster.backend, "ep3");
    expect_timeout(client, node_at(family == IpFamily::V6, LOCAL_NODE_PORT));
    assert_eq!(
        topology.second_node_forwarded(),
        0,
        "dropped on the node, not forwarded to node-2 without SNAT"
    );
}

#[test]
fn a_node_port_reaches_a_pod_on_the_second_node_masqueraded_to_the_node() {
    masqueraded_to_the_node(IpFamily::V4, Layout::Chains);
}

#[test]
fn a_node_port_reaches_a_pod_on_the_second_node_masqueraded_to_the_node_in_the_data_layout() {
    masqueraded_to_the_node(IpFamily::V4, Layout::Data);
}

#[test]
fn a_node_port_reaches_a_pod_on_the_second_node_masqueraded_to_the_node_v6() {
    masqueraded_to_the_node(IpFamily::V6, Layout::Chains);
}

#[test]
fn a_node_port_reaches_a_pod_on_the_second_node_masqueraded_to_the_node_v6_in_the_data_layout() {
    masqueraded_to_the_node(IpFamily::V6, Layout::Data);
}

#[test]
fn external_traffic_policy_local_with_the_only_endpoint_on_the_second_node_drops() {
    dropped_without_local_endpoint(IpFamily::V4, Layout::Chains);
}

#[test]
fn external_traffic_policy_local_with_the_only_endpoint_on_the_second_node_drops_in_the_data_layout(
) {
    dropped_without_local_endpoint(IpFamily::V4, Layout::Data);
}

#[test]
fn external_traffic_policy_local_with_the_only_endpoint_on_the_second_node_drops_v6() {
    dropped_without_local_endpoint(IpFamily::V6, Layout::Chains);
}

#[test]
fn external_traffic_policy_local_with_the_only_endpoint_on_the_second_node_drops_v6_in_the_data_layout(
) {
    dropped_without_local_endpoint(IpFamily::V6, Layout::Data);
}
