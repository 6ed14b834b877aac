//! Kernel test: with `nodePortAddresses`, NodePorts follow the node's
//! addresses as they come, on iptables-legacy and on iptables-nft.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/np, http 80/TCP | NodePort 30080, endpoint ep1 |
//! | nodePortAddresses | 192.168.99.0/24: the node IP 192.168.99.2 at start, 192.168.99.3 added later on `cl0` |
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kernel;

use std::time::Duration;

use kernel::{at, build, node_at, pod_ip, require, slice, three_pods, Proxy};
use kp_iptables::{IptablesFlavor, NodePortAddresses};
use kp_model::IpFamily;
use kp_testkit::builders::service;
use kp_testkit::netns::{connect, expect_refused};

/// A second node address, inside the selected CIDR.
const ADDED_NODE_IP: &str = "192.168.99.3";

on_both_flavors!(a_node_address_added_after_a_sync_serves_node_ports_after_the_next_sync);

fn a_node_address_added_after_a_sync_serves_node_ports_after_the_next_sync(flavor: IptablesFlavor) {
    require(flavor);
    let topology = build(three_pods());
    let selection = NodePortAddresses::parse(&["192.168.99.0/24".to_owned()]).unwrap();
    let proxy = Proxy::start_selecting(&topology, flavor, IpFamily::V4, Duration::ZERO, selection);
    proxy.apply(
        &[service("ns1", "np", |s| {
            s.service_type("NodePort")
                .cluster_ip("10.96.0.11")
                .port("http", 80, "TCP")
                .node_port(30080)
        })],
        &[slice("np", &[pod_ip(&topology, "ep1")], &[])],
    );
    assert!(proxy.sync().full);
    let client = topology.client();
    assert_eq!(connect(client, node_at(30080)).unwrap().backend, "ep1");

    let added = at(ADDED_NODE_IP, 30080);
    let interface = client.node_interface();
    topology
        .node()
        .ip(&[
            "address",
            "add",
            &format!("{ADDED_NODE_IP}/32"),
            "dev",
            interface,
        ])
        .unwrap();
    expect_refused(client, added);

    // Nothing changed but the node's addresses: a partial sync, which
    // reads them from the cache the address notification invalidated.
    assert!(!proxy.sync().full);
    assert_eq!(connect(client, added).unwrap().backend, "ep1");
}
