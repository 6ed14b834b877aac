//! Kernel tests: each Service type answers real connections once the
//! iptables backend has programmed the node namespace, on iptables-legacy
//! and on iptables-nft.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web, http 80/TCP | ClusterIP 10.96.0.10, endpoints ep1, ep2 (node-1), ep3 (node-2) |
//! | ns1/np, http 80/TCP | NodePort 30080, externalIP 203.0.113.5, endpoints ep1, ep3 |
//! | ns1/lb, http 80/TCP | LoadBalancer 203.0.113.9, NodePort 30081, endpoints ep2 |
//! | ns1/sticky, http 80/TCP | ClusterIP 10.96.0.13, ClientIP affinity, endpoints ep1, ep2, ep3 |
//! | ns1/empty, http 80/TCP | ClusterIP 10.96.0.14, no endpoints |
//! | ns1/dns, dns 53/UDP | ClusterIP 10.96.0.12, endpoints ep2 |
//! | ns1/web6, http 80/TCP | ClusterIP fd00:10:96::10, endpoints ep1, ep3 |
//! | ns1/brief, http 80/TCP | ClusterIP 10.96.0.15, ClientIP affinity of 2 s, endpoints ep1, ep2 |
//! | ns1/lb6, http 80/TCP | LoadBalancer 2001:db8:203:113::9, NodePort 30083 on fd00:192:168:99::2, endpoint ep2 |
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kernel;

use kernel::{at, build, node_at, pod_ip, pod_ip_v6, require, slice, three_pods, Proxy};
use kp_iptables::IptablesFlavor;
use kp_model::IpFamily;
use kp_testkit::builders::service;
use std::io::ErrorKind;
use std::net::SocketAddr;

use kp_testkit::netns::{connect, hits, hits_until_all, udp_roundtrip, Netns, ProbeError};

on_both_flavors!(
    cluster_ip_spreads_connections_over_every_ready_endpoint,
    node_port_external_ip_and_load_balancer_ip_answer_the_client,
    session_affinity_keeps_a_client_on_one_endpoint,
    service_without_endpoints_refuses_connections,
    udp_service_round_trip,
    ipv6_cluster_ip_spreads_connections,
    session_affinity_ends_after_its_timeout,
    ipv6_node_port_and_load_balancer_ip_answer_the_client,
);

fn cluster_ip_spreads_connections_over_every_ready_endpoint(flavor: IptablesFlavor) {
    require(flavor);
    let topology = build(three_pods());
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    let endpoints = ["ep1", "ep2"].map(|p| pod_ip(&topology, p));
    proxy.apply(
        &[service("ns1", "web", |s| {
            s.cluster_ip("10.96.0.10").port("http", 80, "TCP")
        })],
        &[slice("web", &endpoints, &[pod_ip(&topology, "ep3")])],
    );
    proxy.sync();

    // From a pod that is itself an endpoint: a third of the connections
    // hairpin back to it.
    let counts = hits_until_all(
        topology.pod("ep1"),
        at("10.96.0.10", 80),
        &["ep1", "ep2", "ep3"],
        200,
    );
    assert_eq!(
        counts.keys().collect::<Vec<_>>(),
        ["ep1", "ep2", "ep3"],
        "connections reach every endpoint: {counts:?}"
    );
    let from_outside = connect(topology.client(), at("10.96.0.10", 80)).unwrap();
    assert!(["ep1", "ep2", "ep3"].contains(&from_outside.backend.as_str()));
}

fn node_port_external_ip_and_load_balancer_ip_answer_the_client(flavor: IptablesFlavor) {
    require(flavor);
    let topology = build(three_pods());
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    proxy.apply(
        &[
            service("ns1", "np", |s| {
                s.service_type("NodePort")
                    .cluster_ip("10.96.0.11")
                    .port("http", 80, "TCP")
                    .node_port(30080)
                    .external_ip("203.0.113.5")
            }),
            service("ns1", "lb", |s| {
                s.service_type("LoadBalancer")
                    .cluster_ip("10.96.0.15")
                    .port("http", 80, "TCP")
                    .node_port(30081)
                    .lb_ingress_ip("203.0.113.9")
            }),
        ],
        &[
            slice(
                "np",
                &[pod_ip(&topology, "ep1")],
                &[pod_ip(&topology, "ep3")],
            ),
            slice("lb", &[pod_ip(&topology, "ep2")], &[]),
        ],
    );
    proxy.sync();

    let client = topology.client();
    let node_port = hits_until_all(client, node_at(30080), &["ep1", "ep3"], 200);
    assert_eq!(node_port.keys().collect::<Vec<_>>(), ["ep1", "ep3"]);
    let external = hits_until_all(client, at("203.0.113.5", 80), &["ep1", "ep3"], 200);
    assert_eq!(external.keys().collect::<Vec<_>>(), ["ep1", "ep3"]);
    let balancer = connect(client, at("203.0.113.9", 80)).unwrap();
    assert_eq!(balancer.backend, "ep2");
    assert_eq!(connect(client, node_at(30081)).unwrap().backend, "ep2");
}

fn session_affinity_keeps_a_client_on_one_endpoint(flavor: IptablesFlavor) {
    require(flavor);
    let topology = build(three_pods());
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    let local = ["ep1", "ep2"].map(|p| pod_ip(&topology, p));
    proxy.apply(
        &[service("ns1", "sticky", |s| {
            s.cluster_ip("10.96.0.13")
                .port("http", 80, "TCP")
                .session_affinity_client_ip(300)
        })],
        &[slice("sticky", &local, &[pod_ip(&topology, "ep3")])],
    );
    proxy.sync();

    let counts = hits(topology.client(), at("10.96.0.13", 80), 15);
    assert_eq!(counts.len(), 1, "one endpoint for one client: {counts:?}");
}

fn service_without_endpoints_refuses_connections(flavor: IptablesFlavor) {
    require(flavor);
    let topology = build(three_pods());
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    proxy.apply(
        &[service("ns1", "empty", |s| {
            s.cluster_ip("10.96.0.14").port("http", 80, "TCP")
        })],
        &[],
    );
    proxy.sync();

    // REJECT answers with "port unreachable": connection refused, at once
    // (without the rule, the SYN would follow the default route and get no
    // answer).
    expect_connection_refused(topology.node(), at("10.96.0.14", 80));
    expect_connection_refused(topology.pod("ep1"), at("10.96.0.14", 80));
    expect_connection_refused(topology.client(), at("10.96.0.14", 80));
}

#[track_caller]
fn expect_connection_refused(from: &Netns, addr: SocketAddr) {
    match connect(from, addr) {
        Err(ProbeError::Connect { source, .. })
            if source.kind() == ErrorKind::ConnectionRefused => {}
        other => panic!("expected connection refused from {addr}, got {other:?}"),
    }
}

fn udp_service_round_trip(flavor: IptablesFlavor) {
    require(flavor);
    let topology = build(three_pods());
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    proxy.apply(
        &[service("ns1", "dns", |s| {
            s.cluster_ip("10.96.0.12").port("dns", 53, "UDP")
        })],
        &[slice("dns", &[pod_ip(&topology, "ep2")], &[])],
    );
    proxy.sync();

    let reply = udp_roundtrip(topology.client(), at("10.96.0.12", 53)).unwrap();
    assert_eq!(reply.backend, "ep2");
    let from_pod = udp_roundtrip(topology.pod("ep1"), at("10.96.0.12", 53)).unwrap();
    assert_eq!(from_pod.backend, "ep2");
}

fn ipv6_cluster_ip_spreads_connections(flavor: IptablesFlavor) {
    require(flavor);
    let topology = build(three_pods());
    let proxy = Proxy::start(&topology, flavor, IpFamily::V6);
    proxy.apply(
        &[service("ns1", "web6", |s| {
            s.ip_families(&["IPv6"])
                .cluster_ip("fd00:10:96::10")
                .port("http", 80, "TCP")
        })],
        &[slice(
            "web6",
            &[pod_ip_v6(&topology, "ep1")],
            &[pod_ip_v6(&topology, "ep3")],
        )],
    );
    proxy.sync();

    let counts = hits_until_all(
        topology.pod("ep2"),
        at("fd00:10:96::10", 80),
        &["ep1", "ep3"],
        200,
    );
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["ep1", "ep3"]);
    assert!(
        proxy.save().contains("-A KUBE-SERVICES"),
        "ip6tables holds the rules"
    );
}

/// How long `ns1/brief` keeps a client on its endpoint.
const BRIEF_AFFINITY_SECS: u64 = 2;

fn session_affinity_ends_after_its_timeout(flavor: IptablesFlavor) {
    require(flavor);
    let topology = build(three_pods());
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    let local = ["ep1", "ep2"].map(|p| pod_ip(&topology, p));
    proxy.apply(
        &[service("ns1", "brief", |s| {
            s.cluster_ip("10.96.0.15")
                .port("http", 80, "TCP")
                .session_affinity_client_ip(BRIEF_AFFINITY_SECS as i32)
        })],
        &[slice("brief", &local, &[])],
    );
    proxy.sync();
    let client = topology.client();
    let address = at("10.96.0.15", 80);
    let first = hits(client, address, 10);
    assert_eq!(first.len(), 1, "one endpoint within the timeout: {first:?}");
    let stuck = first.keys().next().unwrap().clone();

    // After the timeout a client is balanced again: its next connection
    // picks either endpoint, so within a few expiries it lands on the
    // other one (each time with probability 1/2; eight tries miss with
    // probability 1/256).
    let mut moved = false;
    for _ in 0..8 {
        std::thread::sleep(std::time::Duration::from_millis(
            BRIEF_AFFINITY_SECS * 1000 + 600,
        ));
        if connect(client, address).unwrap().backend != stuck {
            moved = true;
            break;
        }
    }
    assert!(
        moved,
        "the client stayed on {stuck} past eight affinity timeouts"
    );
}

fn ipv6_node_port_and_load_balancer_ip_answer_the_client(flavor: IptablesFlavor) {
    require(flavor);
    let topology = build(three_pods());
    let proxy = Proxy::start(&topology, flavor, IpFamily::V6);
    proxy.apply(
        &[service("ns1", "lb6", |s| {
            s.ip_families(&["IPv6"])
                .service_type("LoadBalancer")
                .cluster_ip("fd00:10:96::13")
                .port("http", 80, "TCP")
                .node_port(30083)
                .lb_ingress_ip("2001:db8:203:113::9")
        })],
        &[slice("lb6", &[pod_ip_v6(&topology, "ep2")], &[])],
    );
    proxy.sync();
    let client = topology.client();
    let node_port = SocketAddr::new(kp_testkit::plan::NODE_IP_V6.into(), 30083);
    assert_eq!(connect(client, node_port).unwrap().backend, "ep2");
    assert_eq!(
        connect(client, at("2001:db8:203:113::9", 80))
            .unwrap()
            .backend,
        "ep2"
    );
}
