//! Kernel test: `detectLocalMode: NodeCIDR` tells this node's pods by the
//! Node's `spec.podCIDRs`, as the Node delivers them, and follows a change.
//! Traffic from outside that range to a ClusterIP is masqueraded; traffic
//! from the node's pods keeps its source.
//!
//! | object | addresses |
//! |---|---|
//! | node-1 | podCIDR 10.244.1.0/24, later 10.244.200.0/24 |
//! | ns1/web, http 80/TCP | ClusterIP 10.96.0.10, endpoint ep2 (10.244.1.3) |
//! | pod ep1 | 10.244.1.2, a client inside the node's pods |
//! | client | 192.168.99.10, outside the cluster |
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kernel;

use std::net::IpAddr;
use std::time::Duration;

use kernel::{at, build, pod_ip, require, slice, three_pods, Proxy};
use kp_iptables::{IptablesFlavor, IptablesOptions, LocalDetector};
use kp_model::{IpFamily, ObjectEvent, ProxyEventHandler};
use kp_testkit::builders::{node, service};
use kp_testkit::netns::{connect, Netns};
use kp_testkit::plan::{NODE_NAME, NODE_POD_CIDR};

on_both_flavors!(
    traffic_from_outside_the_nodes_pod_cidr_is_masqueraded_and_a_cidr_change_is_followed
);

/// The source address the ClusterIP's endpoint saw for a connection from
/// `from`.
fn source_seen(from: &Netns) -> IpAddr {
    let reply = connect(from, at("10.96.0.10", 80)).unwrap();
    assert_eq!(reply.backend, "ep2");
    reply.source
}

fn traffic_from_outside_the_nodes_pod_cidr_is_masqueraded_and_a_cidr_change_is_followed(
    flavor: IptablesFlavor,
) {
    require(flavor);
    let topology = build(three_pods());
    let options = IptablesOptions {
        local_detector: LocalDetector::NodeCidr,
        ..IptablesOptions::default()
    };
    let proxy = Proxy::start_with_options(&topology, flavor, IpFamily::V4, Duration::ZERO, options);
    let (ep1, ep2) = (pod_ip(&topology, "ep1"), pod_ip(&topology, "ep2"));
    let client_ip = IpAddr::V4(topology.client().ip());
    proxy.apply(
        &[service("ns1", "web", |s| {
            s.cluster_ip("10.96.0.10").port("http", 80, "TCP")
        })],
        &[slice("web", &[ep2], &[])],
    );
    proxy
        .proxier
        .on_node(ObjectEvent::Apply(node(NODE_NAME, |n| {
            n.pod_cidr(NODE_POD_CIDR)
        })));
    proxy.sync();

    assert_eq!(
        source_seen(topology.pod("ep1")),
        ep1,
        "a pod of this node keeps its address"
    );
    let from_client = source_seen(topology.client());
    assert_ne!(
        from_client, client_ip,
        "traffic from outside the node's pod CIDR is masqueraded"
    );

    proxy
        .proxier
        .on_node(ObjectEvent::Apply(node(NODE_NAME, |n| {
            n.pod_cidr("10.244.200.0/24")
        })));
    proxy.sync();

    assert_ne!(
        source_seen(topology.pod("ep1")),
        ep1,
        "after the change ep1 is outside the node's pod CIDR and is masqueraded"
    );
}
