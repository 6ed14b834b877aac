//! Kernel tests: each Service type answers real connections once the
//! nftables backend has programmed the node namespace with `nft`.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web, http 80/TCP | ClusterIP 10.96.0.10, endpoints ep1, ep2 (node-1), ep3 (node-2) |
//! | ns1/np, http 80/TCP | NodePort 30080, externalIP 203.0.113.5, endpoints ep1, ep3 |
//! | ns1/lb, http 80/TCP | LoadBalancer 203.0.113.9, NodePort 30081, endpoints ep2 |
//! | ns1/fw, http 80/TCP | LoadBalancer 203.0.113.10 from client2 (192.168.99.11/32) only, endpoints ep2 |
//! | ns1/sticky, http 80/TCP | ClusterIP 10.96.0.13, ClientIP affinity, endpoints ep1, ep2, ep3 |
//! | ns1/empty, http 80/TCP | ClusterIP 10.96.0.14, no endpoints |
//! | ns1/dns, dns 53/UDP | ClusterIP 10.96.0.12, endpoints ep2 |
//! | ns1/web6, http 80/TCP | ClusterIP fd00:10:96::10, endpoints ep1, ep3 |
//!
//! Every test runs in both layouts (`chains::…` and `data::…`,
//! [`Layout`]).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod kernel;

in_both_layouts!(
    cluster_ip_spreads_connections_over_every_ready_endpoint,
    node_port_external_ip_and_load_balancer_ip_answer_the_client,
    load_balancer_source_ranges_admit_only_their_clients,
    session_affinity_keeps_a_client_on_one_endpoint,
    external_traffic_policy_local_keeps_the_client_address,
    service_without_endpoints_refuses_connections,
    udp_service_round_trip,
    ipv6_cluster_ip_spreads_connections,
);

use std::io::ErrorKind;
use std::net::SocketAddr;

use kernel::{at, build, node_at, pod_ip, pod_ip_v6, require, slice, three_pods, Proxy};
use kp_model::IpFamily;
use kp_nftables::Layout;
use kp_testkit::builders::service;
use kp_testkit::netns::{connect, hits, hits_until_all, udp_roundtrip, Netns, ProbeError};

fn cluster_ip_spreads_connections_over_every_ready_endpoint(layout: Layout) {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start_in(&topology, IpFamily::V4, layout);
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
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["ep1", "ep2", "ep3"]);
    let from_outside = connect(topology.client(), at("10.96.0.10", 80)).unwrap();
    assert!(["ep1", "ep2", "ep3"].contains(&from_outside.backend.as_str()));
    let listing = proxy.list();
    assert!(listing.contains("map service-ips"), "nft holds the table");
    assert_eq!(
        listing.contains("numgen random mod 3 map @service-endpoints-tcp"),
        layout == Layout::Data,
        "the layout's draw: {listing}"
    );
}

fn node_port_external_ip_and_load_balancer_ip_answer_the_client(layout: Layout) {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start_in(&topology, IpFamily::V4, layout);
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
    assert_eq!(
        connect(client, at("203.0.113.9", 80)).unwrap().backend,
        "ep2"
    );
    assert_eq!(connect(client, node_at(30081)).unwrap().backend, "ep2");
}

fn load_balancer_source_ranges_admit_only_their_clients(layout: Layout) {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start_in(&topology, IpFamily::V4, layout);
    proxy.apply(
        &[service("ns1", "fw", |s| {
            s.service_type("LoadBalancer")
                .cluster_ip("10.96.0.16")
                .port("http", 80, "TCP")
                .lb_ingress_ip("203.0.113.10")
                .lb_source_range("192.168.99.11/32")
        })],
        &[slice("fw", &[pod_ip(&topology, "ep2")], &[])],
    );
    proxy.sync();

    let allowed = connect(topology.client_named("client2"), at("203.0.113.10", 80));
    assert_eq!(allowed.unwrap().backend, "ep2");
    let denied = connect(topology.client_named("client"), at("203.0.113.10", 80));
    assert!(
        matches!(&denied, Err(e) if e.is_timeout()),
        "dropped without an answer: {denied:?}"
    );
}

fn session_affinity_keeps_a_client_on_one_endpoint(layout: Layout) {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start_in(&topology, IpFamily::V4, layout);
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

fn external_traffic_policy_local_keeps_the_client_address(layout: Layout) {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start_in(&topology, IpFamily::V4, layout);
    proxy.apply(
        &[service("ns1", "local", |s| {
            s.service_type("NodePort")
                .cluster_ip("10.96.0.17")
                .port("http", 80, "TCP")
                .node_port(30082)
                .external_traffic_policy_local()
        })],
        &[slice(
            "local",
            &[pod_ip(&topology, "ep1")],
            &[pod_ip(&topology, "ep3")],
        )],
    );
    proxy.sync();

    // Only the local endpoint, and it sees the client's own address.
    let counts = hits(topology.client(), node_at(30082), 10);
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["ep1"]);
    let reply = connect(topology.client(), node_at(30082)).unwrap();
    let client_ip = std::net::IpAddr::V4(topology.client().ip());
    assert_eq!(reply.source, client_ip, "source preserved: {reply:?}");
}

fn service_without_endpoints_refuses_connections(layout: Layout) {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start_in(&topology, IpFamily::V4, layout);
    proxy.apply(
        &[service("ns1", "empty", |s| {
            s.cluster_ip("10.96.0.14").port("http", 80, "TCP")
        })],
        &[],
    );
    proxy.sync();

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

fn udp_service_round_trip(layout: Layout) {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start_in(&topology, IpFamily::V4, layout);
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

fn ipv6_cluster_ip_spreads_connections(layout: Layout) {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start_in(&topology, IpFamily::V6, layout);
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
    assert!(proxy.list().contains("table ip6 kube-proxy"));
}
