//! Kernel tests: the portal rules programmed into the node namespace send
//! real connections to the relay, which reaches the pods, on
//! iptables-legacy and on iptables-nft.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web, http 80/TCP | ClusterIP 10.96.0.10, endpoints ep1, ep2 (node-1), ep3 (node-2) |
//! | ns1/np, http 80/TCP | NodePort 30080, externalIP 203.0.113.5, endpoints ep1, ep3 |
//! | ns1/lb, http 80/TCP | LoadBalancer 203.0.113.9 from 192.168.99.10/32 only, NodePort 30081, endpoints ep2 |
//! | ns1/sticky, http 80/TCP | ClusterIP 10.96.0.13, ClientIP affinity, endpoints ep1, ep2, ep3 |
//! | ns1/empty, http 80/TCP | ClusterIP 10.96.0.14, no endpoints |
//! | ns1/dns, dns 53/UDP | ClusterIP 10.96.0.12, endpoints ep2; NodePort 30053 |
//! | ns1/dnslb, dns 53/UDP | LoadBalancer 203.0.113.10 from 192.168.99.10/32 only, ClusterIP 10.96.0.16, NodePort 30054, endpoints ep2 |
//! | ns1/web6, http 80/TCP | ClusterIP fd00:10:96::10, endpoints ep1, ep3 |
//! | ns1/dns6, dns 53/UDP | ClusterIP fd00:10:96::12, endpoints ep2 |
//! | ns1/dnslb6, dns 53/UDP | LoadBalancer 2001:db8:203:113::10 from fd00:192:168:99::10/128 only, ClusterIP fd00:10:96::16, NodePort 30055, endpoints ep2 |
//! | ns1/itp, http 80/TCP | ClusterIP 10.96.0.23, iTP Local, endpoints ep1 (node-1), ep3 (node-2) |
//! | ns1/itp-far, http 80/TCP | ClusterIP 10.96.0.24, iTP Local, endpoint ep3 (node-2) only |
//! | ns1/empty-np, http 80/TCP | NodePort 30092, no endpoints |
//! | ns1/brief, http 80/TCP | ClusterIP 10.96.0.15, ClientIP affinity of 2 s, endpoints ep1, ep2 |
//! | ns1/lb6, http 80/TCP | LoadBalancer 2001:db8:203:113::9, NodePort 30083 on fd00:192:168:99::2, endpoint ep2 |
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kernel;

use kernel::{at, node_at, pod_ip, pod_ip_v6, require, slice, three_pods, Proxy};
use kp_iptables::IptablesFlavor;
use kp_model::IpFamily;
use kp_testkit::builders::service;
use kp_testkit::netns::{connect, expect_refused, hits, hits_until_all, udp_roundtrip, TcpSession};

on_both_flavors!(
    cluster_ip_spreads_connections_over_every_ready_endpoint,
    the_node_itself_reaches_a_cluster_ip,
    the_relay_not_nat_carries_the_connection,
    node_port_external_ip_and_load_balancer_ip_answer_the_client,
    session_affinity_keeps_a_client_on_one_endpoint,
    service_without_endpoints_refuses_connections,
    udp_service_round_trip,
    udp_load_balancer_source_ranges_drop_datagrams_from_outside,
    removing_an_endpoint_keeps_its_established_connection,
    ipv6_cluster_ip_spreads_connections,
    ipv6_udp_round_trip,
    ipv6_udp_load_balancer_source_ranges_drop_datagrams_from_outside,
    internal_traffic_policy_local_keeps_cluster_ip_traffic_on_the_node,
    a_node_port_without_endpoints_refuses_connections,
    session_affinity_ends_after_its_timeout,
    ipv6_node_port_and_load_balancer_ip_answer_the_client,
);

fn cluster_ip_spreads_connections_over_every_ready_endpoint(flavor: IptablesFlavor) {
    require(flavor);
    let topology = three_pods();
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    let local = ["ep1", "ep2"].map(|p| pod_ip(&topology, p));
    proxy.apply(
        &[service("ns1", "web", |s| {
            s.cluster_ip("10.96.0.10").port("http", 80, "TCP")
        })],
        &[slice("web", &local, &[pod_ip(&topology, "ep3")])],
    );
    proxy.sync();

    // From a pod that is itself an endpoint: a third of the connections
    // come back to it through the relay.
    let counts = hits_until_all(
        topology.pod("ep1"),
        at("10.96.0.10", 80),
        &["ep1", "ep2", "ep3"],
        60,
    );
    assert_eq!(
        counts.keys().collect::<Vec<_>>(),
        ["ep1", "ep2", "ep3"],
        "{counts:?}"
    );
    let even = hits(topology.pod("ep2"), at("10.96.0.10", 80), 30);
    assert_eq!(
        even.values().copied().collect::<Vec<_>>(),
        [10, 10, 10],
        "round robin: {even:?}"
    );
}

fn the_node_itself_reaches_a_cluster_ip(flavor: IptablesFlavor) {
    require(flavor);
    let topology = three_pods();
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    proxy.apply(
        &[service("ns1", "web", |s| {
            s.cluster_ip("10.96.0.10").port("http", 80, "TCP")
        })],
        &[slice("web", &[pod_ip(&topology, "ep1")], &[])],
    );
    proxy.sync();

    let reply = connect(topology.node(), at("10.96.0.10", 80)).unwrap();
    assert_eq!(reply.backend, "ep1");
}

fn the_relay_not_nat_carries_the_connection(flavor: IptablesFlavor) {
    require(flavor);
    let topology = three_pods();
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    proxy.apply(
        &[service("ns1", "web", |s| {
            s.cluster_ip("10.96.0.10").port("http", 80, "TCP")
        })],
        &[slice("web", &[pod_ip(&topology, "ep2")], &[])],
    );
    proxy.sync();

    // The endpoint sees the node's address, not the client's: the relay
    // opened the connection to it.
    let reply = connect(topology.client(), at("10.96.0.10", 80)).unwrap();
    assert_eq!(reply.backend, "ep2");
    assert_eq!(
        reply.source,
        std::net::IpAddr::V4(kp_testkit::plan::NODE_IP)
    );
    let saved = topology.node().exec_ok(
        &flavor.program(IpFamily::V4, kp_iptables::applier::Tool::Save),
        &["-t", "nat"],
    );
    assert!(saved.contains("-A KUBE-PORTALS-CONTAINER"), "{saved}");
    assert!(
        !saved.contains("KUBE-SEP-"),
        "no per-endpoint NAT rules: {saved}"
    );
}

fn node_port_external_ip_and_load_balancer_ip_answer_the_client(flavor: IptablesFlavor) {
    require(flavor);
    let topology = three_pods();
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
                    .lb_source_range("192.168.99.10/32")
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
    let node_port = hits_until_all(client, node_at(30080), &["ep1", "ep3"], 40);
    assert_eq!(node_port.keys().collect::<Vec<_>>(), ["ep1", "ep3"]);
    let external = hits_until_all(client, at("203.0.113.5", 80), &["ep1", "ep3"], 40);
    assert_eq!(external.keys().collect::<Vec<_>>(), ["ep1", "ep3"]);
    assert_eq!(
        connect(client, at("203.0.113.9", 80)).unwrap().backend,
        "ep2"
    );
    assert_eq!(connect(client, node_at(30081)).unwrap().backend, "ep2");
    // client2 (192.168.99.11) is outside loadBalancerSourceRanges.
    let outside = connect(topology.client_named("client2"), at("203.0.113.9", 80));
    assert!(
        outside.is_err(),
        "a client outside the source ranges is turned away: {outside:?}"
    );
}

fn session_affinity_keeps_a_client_on_one_endpoint(flavor: IptablesFlavor) {
    require(flavor);
    let topology = three_pods();
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

    let counts = hits(topology.pod("ep1"), at("10.96.0.13", 80), 15);
    assert_eq!(counts.len(), 1, "one endpoint for one client: {counts:?}");
}

fn service_without_endpoints_refuses_connections(flavor: IptablesFlavor) {
    require(flavor);
    let topology = three_pods();
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    proxy.apply(
        &[service("ns1", "empty", |s| {
            s.cluster_ip("10.96.0.14").port("http", 80, "TCP")
        })],
        &[],
    );
    proxy.sync();

    expect_refused(topology.pod("ep1"), at("10.96.0.14", 80));
    expect_refused(topology.node(), at("10.96.0.14", 80));

    // Endpoints appear: the same address answers.
    proxy.apply(&[], &[slice("empty", &[pod_ip(&topology, "ep2")], &[])]);
    proxy.sync();
    assert_eq!(
        connect(topology.pod("ep1"), at("10.96.0.14", 80))
            .unwrap()
            .backend,
        "ep2"
    );
}

fn udp_service_round_trip(flavor: IptablesFlavor) {
    require(flavor);
    let topology = three_pods();
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    proxy.apply(
        &[service("ns1", "dns", |s| {
            s.service_type("NodePort")
                .cluster_ip("10.96.0.12")
                .port("dns", 53, "UDP")
                .node_port(30053)
        })],
        &[slice("dns", &[pod_ip(&topology, "ep2")], &[])],
    );
    proxy.sync();

    // The probes' sockets are connected: an answer counts only when it
    // comes from the address asked.
    let from_pod = udp_roundtrip(topology.pod("ep1"), at("10.96.0.12", 53)).unwrap();
    assert_eq!(from_pod.backend, "ep2");
    let from_client = udp_roundtrip(topology.client(), node_at(30053)).unwrap();
    assert_eq!(from_client.backend, "ep2");
    let from_node = udp_roundtrip(topology.node(), at("10.96.0.12", 53)).unwrap();
    assert_eq!(from_node.backend, "ep2");
}

fn udp_load_balancer_source_ranges_drop_datagrams_from_outside(flavor: IptablesFlavor) {
    require(flavor);
    let topology = three_pods();
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    proxy.apply(
        &[service("ns1", "dnslb", |s| {
            s.service_type("LoadBalancer")
                .cluster_ip("10.96.0.16")
                .port("dns", 53, "UDP")
                .node_port(30054)
                .lb_ingress_ip("203.0.113.10")
                .lb_source_range("192.168.99.10/32")
        })],
        &[slice("dnslb", &[pod_ip(&topology, "ep2")], &[])],
    );
    proxy.sync();

    let inside = topology.client();
    let outside = topology.client_named("client2");
    assert_eq!(
        udp_roundtrip(inside, at("203.0.113.10", 53))
            .unwrap()
            .backend,
        "ep2"
    );
    // client2 (192.168.99.11) is outside loadBalancerSourceRanges: its
    // datagrams to the load balancer IP get no answer.
    match udp_roundtrip(outside, at("203.0.113.10", 53)) {
        Err(error) if error.is_timeout() => {}
        other => panic!("expected no answer to client2, got {other:?}"),
    }
    // The ranges limit the load balancer IP only, as in the iptables mode:
    // the same client reaches the NodePort, and the allowed one still
    // reaches the load balancer IP.
    assert_eq!(
        udp_roundtrip(outside, node_at(30054)).unwrap().backend,
        "ep2"
    );
    assert_eq!(
        udp_roundtrip(inside, at("203.0.113.10", 53))
            .unwrap()
            .backend,
        "ep2"
    );
}

fn removing_an_endpoint_keeps_its_established_connection(flavor: IptablesFlavor) {
    require(flavor);
    let topology = three_pods();
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    let both = ["ep1", "ep2"].map(|p| pod_ip(&topology, p));
    proxy.apply(
        &[service("ns1", "web", |s| {
            s.cluster_ip("10.96.0.10").port("http", 80, "TCP")
        })],
        &[slice("web", &both, &[])],
    );
    proxy.sync();
    let mut session = TcpSession::open(topology.client(), at("10.96.0.10", 80)).unwrap();
    let kept = session.backend().to_owned();
    let other = if kept == "ep1" { "ep2" } else { "ep1" };

    proxy.apply(&[], &[slice("web", &[pod_ip(&topology, other)], &[])]);
    proxy.sync();

    let counts = hits(topology.client(), at("10.96.0.10", 80), 6);
    assert_eq!(
        counts.keys().collect::<Vec<_>>(),
        [other],
        "new connections avoid {kept}"
    );
    let echo = session.echo("still connected").unwrap();
    assert_eq!(
        echo.backend, kept,
        "the established connection still reaches {kept}"
    );
}

fn ipv6_cluster_ip_spreads_connections(flavor: IptablesFlavor) {
    require(flavor);
    let topology = three_pods();
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
        40,
    );
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["ep1", "ep3"]);
    // The node's own connection goes through the host chain's DNAT.
    let from_node = connect(topology.node(), at("fd00:10:96::10", 80)).unwrap();
    assert!(
        ["ep1", "ep3"].contains(&from_node.backend.as_str()),
        "{from_node:?}"
    );
}

fn ipv6_udp_round_trip(flavor: IptablesFlavor) {
    require(flavor);
    let topology = three_pods();
    let proxy = Proxy::start(&topology, flavor, IpFamily::V6);
    proxy.apply(
        &[service("ns1", "dns6", |s| {
            s.ip_families(&["IPv6"])
                .cluster_ip("fd00:10:96::12")
                .port("dns", 53, "UDP")
        })],
        &[slice("dns6", &[pod_ip_v6(&topology, "ep2")], &[])],
    );
    proxy.sync();

    let reply = udp_roundtrip(topology.pod("ep1"), at("fd00:10:96::12", 53)).unwrap();
    assert_eq!(reply.backend, "ep2");
    let from_node = udp_roundtrip(topology.node(), at("fd00:10:96::12", 53)).unwrap();
    assert_eq!(from_node.backend, "ep2");
}

fn ipv6_udp_load_balancer_source_ranges_drop_datagrams_from_outside(flavor: IptablesFlavor) {
    require(flavor);
    let topology = three_pods();
    let proxy = Proxy::start(&topology, flavor, IpFamily::V6);
    proxy.apply(
        &[service("ns1", "dnslb6", |s| {
            s.service_type("LoadBalancer")
                .ip_families(&["IPv6"])
                .cluster_ip("fd00:10:96::16")
                .port("dns", 53, "UDP")
                .node_port(30055)
                .lb_ingress_ip("2001:db8:203:113::10")
                .lb_source_range("fd00:192:168:99::10/128")
        })],
        &[slice("dnslb6", &[pod_ip_v6(&topology, "ep2")], &[])],
    );
    proxy.sync();

    let lb = at("2001:db8:203:113::10", 53);
    let inside = topology.client();
    let outside = topology.client_named("client2");
    assert_eq!(udp_roundtrip(inside, lb).unwrap().backend, "ep2");
    match udp_roundtrip(outside, lb) {
        Err(error) if error.is_timeout() => {}
        other => panic!("expected no answer to client2, got {other:?}"),
    }
    let node_port = std::net::SocketAddr::new(kp_testkit::plan::NODE_IP_V6.into(), 30055);
    assert_eq!(udp_roundtrip(outside, node_port).unwrap().backend, "ep2");
}

fn internal_traffic_policy_local_keeps_cluster_ip_traffic_on_the_node(flavor: IptablesFlavor) {
    require(flavor);
    let topology = three_pods();
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

    for from in [topology.pod("ep2"), topology.node()] {
        let counts = hits(from, at("10.96.0.23", 80), 12);
        assert_eq!(
            counts.keys().collect::<Vec<_>>(),
            ["ep1"],
            "from {}: local endpoints only",
            from.name()
        );
    }
    // Without a local endpoint nothing answers: the endpoint on node-2 is
    // not used.
    let far = connect(topology.pod("ep2"), at("10.96.0.24", 80));
    assert!(far.is_err(), "{far:?}");
}

fn a_node_port_without_endpoints_refuses_connections(flavor: IptablesFlavor) {
    require(flavor);
    let topology = three_pods();
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
    let refused = connect(topology.client(), node_at(30092));
    assert!(refused.is_err(), "{refused:?}");

    // Endpoints appear: the same NodePort answers.
    proxy.apply(&[], &[slice("empty-np", &[pod_ip(&topology, "ep2")], &[])]);
    proxy.sync();
    assert_eq!(
        connect(topology.client(), node_at(30092)).unwrap().backend,
        "ep2"
    );
}

/// How long `ns1/brief` keeps a client on its endpoint.
const BRIEF_AFFINITY_SECS: u64 = 2;

fn session_affinity_ends_after_its_timeout(flavor: IptablesFlavor) {
    require(flavor);
    let topology = three_pods();
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
    let client = topology.pod("ep1");
    let address = at("10.96.0.15", 80);
    let first = hits(client, address, 10);
    assert_eq!(first.len(), 1, "one endpoint within the timeout: {first:?}");
    let stuck = first.keys().next().unwrap().clone();

    // After the timeout the client is balanced again; within a few
    // expiries it lands on the other endpoint (the relay balances round
    // robin, so the first new choice may still be the same one).
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
    let topology = three_pods();
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
    let node_port = std::net::SocketAddr::new(kp_testkit::plan::NODE_IP_V6.into(), 30083);
    assert_eq!(connect(client, node_port).unwrap().backend, "ep2");
    assert_eq!(
        connect(client, at("2001:db8:203:113::9", 80))
            .unwrap()
            .backend,
        "ep2"
    );
}
