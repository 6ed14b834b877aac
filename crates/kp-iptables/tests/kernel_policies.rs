//! Kernel tests: who may reach a Service, and with which source address,
//! on iptables-legacy and on iptables-nft.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/lb, http 80/TCP | LoadBalancer 203.0.113.9, NodePort 30081, source range 192.168.99.10/32, endpoints ep1 |
//! | ns1/local, http 80/TCP | NodePort 30090, eTP Local, endpoints ep1 (node-1), ep3 (node-2) |
//! | ns1/faraway, http 80/TCP | NodePort 30091, eTP Local, endpoints ep3 (node-2) only |
//! | ns1/itp, http 80/TCP | ClusterIP 10.96.0.23, iTP Local, endpoints ep1 (node-1), ep3 (node-2) |
//! | ns1/itp-far, http 80/TCP | ClusterIP 10.96.0.24, iTP Local, endpoint ep3 (node-2) only |
//! | ns1/empty-np, http 80/TCP | NodePort 30092, no endpoints |
//!
//! Clients: `client` 192.168.99.10, `client2` 192.168.99.11.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kernel;

use std::net::IpAddr;

use kernel::{at, build, node_at, pod_ip, require, slice, three_pods, Proxy};
use kp_iptables::applier::Tool;
use kp_iptables::IptablesFlavor;
use kp_model::IpFamily;
use kp_testkit::builders::service;
use kp_testkit::netns::{connect, expect_refused, expect_timeout, hits};

on_both_flavors!(
    load_balancer_source_ranges_admit_one_client_and_drop_another,
    external_traffic_policy_local_keeps_the_client_source_ip,
    internal_traffic_policy_local_keeps_cluster_ip_traffic_on_the_node,
    a_node_port_without_endpoints_refuses_at_once,
);

fn load_balancer_source_ranges_admit_one_client_and_drop_another(flavor: IptablesFlavor) {
    require(flavor);
    let topology = build(three_pods());
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    proxy.apply(
        &[service("ns1", "lb", |s| {
            s.service_type("LoadBalancer")
                .cluster_ip("10.96.0.20")
                .port("http", 80, "TCP")
                .node_port(30081)
                .lb_ingress_ip("203.0.113.9")
                .lb_source_range("192.168.99.10/32")
        })],
        &[slice("lb", &[pod_ip(&topology, "ep1")], &[])],
    );
    proxy.sync();

    // The node's default route leads back to client2: a packet of client2
    // that were not dropped would get no answer either, so the DROP rule's
    // counter tells the two apart.
    let admitted = connect(topology.client_named("client"), at("203.0.113.9", 80)).unwrap();
    assert_eq!(admitted.backend, "ep1");
    expect_timeout(topology.client_named("client2"), at("203.0.113.9", 80));
    assert!(
        firewall_drops(&proxy) > 0,
        "KUBE-PROXY-FIREWALL dropped client2's packets"
    );
}

/// Packets counted by the DROP rules of KUBE-PROXY-FIREWALL.
fn firewall_drops(proxy: &Proxy<'_>) -> u64 {
    let program = proxy.flavor.program(IpFamily::V4, Tool::Save);
    let save = proxy
        .topology
        .node()
        .exec_ok(&program, &["-c", "-t", "filter"]);
    save.lines()
        .filter(|line| line.contains("-A KUBE-PROXY-FIREWALL") && line.ends_with("-j DROP"))
        .filter_map(|line| {
            line.strip_prefix('[')?
                .split(':')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

fn external_traffic_policy_local_keeps_the_client_source_ip(flavor: IptablesFlavor) {
    require(flavor);
    let topology = build(three_pods());
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    let remote = [pod_ip(&topology, "ep3")];
    proxy.apply(
        &[
            service("ns1", "local", |s| {
                s.service_type("NodePort")
                    .cluster_ip("10.96.0.21")
                    .port("http", 80, "TCP")
                    .node_port(30090)
                    .external_traffic_policy_local()
            }),
            service("ns1", "faraway", |s| {
                s.service_type("NodePort")
                    .cluster_ip("10.96.0.22")
                    .port("http", 80, "TCP")
                    .node_port(30091)
                    .external_traffic_policy_local()
            }),
        ],
        &[
            slice("local", &[pod_ip(&topology, "ep1")], &remote),
            slice("faraway", &[], &remote),
        ],
    );
    proxy.sync();

    let client = topology.client();
    let counts = hits(client, node_at(30090), 10);
    assert_eq!(
        counts.keys().collect::<Vec<_>>(),
        ["ep1"],
        "local endpoints only"
    );
    let reply = connect(client, node_at(30090)).unwrap();
    assert_eq!(reply.source, IpAddr::V4(client.ip()), "not masqueraded");
    expect_timeout(client, node_at(30091));
}

fn internal_traffic_policy_local_keeps_cluster_ip_traffic_on_the_node(flavor: IptablesFlavor) {
    require(flavor);
    let topology = build(three_pods());
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    let remote = [pod_ip(&topology, "ep3")];
    proxy.apply(
        &[
            service("ns1", "itp", |s| {
                s.cluster_ip("10.96.0.23")
                    .port("http", 80, "TCP")
                    .internal_traffic_policy_local()
            }),
            service("ns1", "itp-far", |s| {
                s.cluster_ip("10.96.0.24")
                    .port("http", 80, "TCP")
                    .internal_traffic_policy_local()
            }),
        ],
        &[
            slice("itp", &[pod_ip(&topology, "ep1")], &remote),
            slice("itp-far", &[], &remote),
        ],
    );
    proxy.sync();

    // From a pod of this node and from the node itself: the local endpoint
    // only, never the one on node-2.
    for from in [topology.pod("ep2"), topology.node()] {
        let counts = hits(from, at("10.96.0.23", 80), 12);
        assert_eq!(
            counts.keys().collect::<Vec<_>>(),
            ["ep1"],
            "from {}: local endpoints only",
            from.name()
        );
    }
    // Without a local endpoint the traffic is dropped, not sent to node-2
    // and not refused (upstream: "has no local endpoints").
    expect_timeout(topology.pod("ep2"), at("10.96.0.24", 80));
}

fn a_node_port_without_endpoints_refuses_at_once(flavor: IptablesFlavor) {
    require(flavor);
    let topology = build(three_pods());
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    proxy.apply(
        &[service("ns1", "empty-np", |s| {
            s.service_type("NodePort")
                .cluster_ip("10.96.0.25")
                .port("http", 80, "TCP")
                .node_port(30092)
        })],
        &[],
    );
    proxy.sync();

    // REJECT in KUBE-EXTERNAL-SERVICES answers at once. The node's closed
    // port would refuse the connection too (with a reset), so the rule's
    // packet counter is what shows the REJECT did it.
    expect_refused(topology.client(), node_at(30092));
    let program = proxy.flavor.program(IpFamily::V4, Tool::Save);
    let save = proxy
        .topology
        .node()
        .exec_ok(&program, &["-c", "-t", "filter"]);
    let rejected: u64 = save
        .lines()
        .filter(|line| {
            line.contains("-A KUBE-EXTERNAL-SERVICES")
                && line.contains("--dport 30092")
                && line.contains("-j REJECT")
        })
        .filter_map(|line| {
            line.strip_prefix('[')?
                .split(':')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert!(
        rejected > 0,
        "the REJECT rule refused the connection:\n{save}"
    );
}
