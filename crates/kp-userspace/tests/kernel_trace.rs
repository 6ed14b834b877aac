//! Kernel tests of `kp_userspace::trace`: the userspace proxy programs the
//! node namespace and publishes its routing table; the tracer reads the
//! portal rules back from the kernel and the table from the file, and
//! its answer for each Service address is compared with the pods that
//! answer real connections there.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web, http 80/TCP | ClusterIP 10.96.0.10, endpoints ep1, ep2 (node-1), ep3 (node-2) |
//! | ns1/lb, http 80/TCP | LoadBalancer 203.0.113.9 from 192.168.99.10/32 only, NodePort 30081, endpoint ep2 |
//! | ns1/empty, http 80/TCP | ClusterIP 10.96.0.14, no endpoints |
//! | ns1/dns, dns 53/UDP | ClusterIP 10.96.0.12, endpoint ep2 |
//!
//! Clients: `client` 192.168.99.10 (inside the source range), `client2`
//! 192.168.99.11 (outside).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kernel;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use kernel::{at, node_at, pod_ip, require, slice, three_pods, Proxy, POD_TCP_PORT};
use kp_iptables::IptablesFlavor;
use kp_model::{IpFamily, Protocol};
use kp_testkit::builders::service;
use kp_testkit::netns::{connect, expect_refused, hits, udp_roundtrip, Topology};
use kp_userspace::trace::{LiveState, Packet, PathVerdict, Trace};
use kp_userspace::RelayOptions;

on_both_flavors!(the_trace_of_each_service_address_names_the_pods_that_answer);

const PODS: [&str; 3] = ["ep1", "ep2", "ep3"];

fn the_trace_of_each_service_address_names_the_pods_that_answer(flavor: IptablesFlavor) {
    require(flavor);
    let topology = three_pods();
    let dir = tempfile::tempdir().unwrap();
    let routes = dir.path().join("userspace-routes-IPv4.json");
    let options = RelayOptions {
        dial_timeouts: vec![std::time::Duration::from_millis(300); 3],
        ..RelayOptions::default()
    };
    let proxy = Proxy::start_publishing(
        &topology,
        flavor,
        IpFamily::V4,
        options,
        Some(routes.clone()),
    );
    proxy.apply(
        &[
            service("ns1", "web", |s| {
                s.cluster_ip("10.96.0.10").port("http", 80, "TCP")
            }),
            service("ns1", "lb", |s| {
                s.service_type("LoadBalancer")
                    .cluster_ip("10.96.0.15")
                    .port("http", 80, "TCP")
                    .node_port(30081)
                    .lb_ingress_ip("203.0.113.9")
                    .lb_source_range("192.168.99.10/32")
            }),
            service("ns1", "empty", |s| {
                s.cluster_ip("10.96.0.14").port("http", 80, "TCP")
            }),
            service("ns1", "dns", |s| {
                s.cluster_ip("10.96.0.12").port("dns", 53, "UDP")
            }),
        ],
        &[
            slice(
                "web",
                &[pod_ip(&topology, "ep1"), pod_ip(&topology, "ep2")],
                &[pod_ip(&topology, "ep3")],
            ),
            slice("lb", &[pod_ip(&topology, "ep2")], &[]),
            slice("dns", &[pod_ip(&topology, "ep2")], &[]),
        ],
    );
    proxy.sync();
    let state = read(&topology, flavor, &routes);
    let pod = pod_ip(&topology, "ep1");
    let client: IpAddr = "192.168.99.10".parse().unwrap();
    let client2: IpAddr = "192.168.99.11".parse().unwrap();

    // ClusterIP from a pod: the relay's round robin reaches every endpoint
    // in 30 connections, and the trace names the same pods, 1/3 each.
    let trace = state.trace(&received(pod, at("10.96.0.10", 80))).unwrap();
    let answered = hits(topology.pod("ep1"), at("10.96.0.10", 80), 30);
    assert_eq!(
        pods_of(&topology, &trace),
        answered.keys().cloned().collect::<BTreeSet<_>>(),
        "{trace}"
    );
    assert_eq!(trace.paths.len(), 3, "{trace}");
    for path in &trace.paths {
        assert!((path.probability - 1.0 / 3.0).abs() < 1e-9, "{trace}");
        assert!(path.masqueraded, "{trace}");
    }

    // The node's own connection takes the host chain to the same relay.
    let mut own = received("192.168.99.2".parse().unwrap(), at("10.96.0.10", 80));
    own.src_local = true;
    let own_trace = state.trace(&own).unwrap();
    assert_eq!(pods_of(&topology, &own_trace), pods_of(&topology, &trace));
    assert!(
        own_trace.paths[0].matched[1].starts_with("nat/KUBE-PORTALS-HOST "),
        "{own_trace}"
    );

    // The load balancer IP and the NodePort from the client in the range.
    for addr in [at("203.0.113.9", 80), node_at(30081)] {
        let trace = state.trace(&received(client, addr)).unwrap();
        let answer = connect(topology.client(), addr).unwrap().backend;
        assert_eq!(
            pods_of(&topology, &trace),
            BTreeSet::from([answer]),
            "{addr}: {trace}"
        );
    }

    // From outside the source range: reset, by the relay and in the trace.
    let outside = state
        .trace(&received(client2, at("203.0.113.9", 80)))
        .unwrap();
    assert!(outside.always(PathVerdict::Reject), "{outside}");
    let refused = connect(topology.client_named("client2"), at("203.0.113.9", 80));
    assert!(
        refused.is_err(),
        "a client outside the source ranges is turned away: {refused:?}"
    );

    // No endpoints: reset.
    let empty = state.trace(&received(pod, at("10.96.0.14", 80))).unwrap();
    assert!(empty.always(PathVerdict::Reject), "{empty}");
    expect_refused(topology.pod("ep1"), at("10.96.0.14", 80));

    // UDP: the datagram's answer comes from the pod the trace names.
    let mut dns = received(pod, at("10.96.0.12", 53));
    dns.protocol = Protocol::Udp;
    let dns_trace = state.trace(&dns).unwrap();
    let dns_answer = udp_roundtrip(topology.pod("ep1"), at("10.96.0.12", 53))
        .unwrap()
        .backend;
    assert_eq!(
        dns_trace
            .destinations()
            .into_iter()
            .map(|to| to.ip())
            .collect::<Vec<_>>(),
        [pod_ip(&topology, &dns_answer)],
        "{dns_trace}"
    );

    // A Service address the proxy does not serve is not redirected.
    let none = state.trace(&received(pod, at("10.96.0.99", 80))).unwrap();
    assert_eq!(none.paths.len(), 1, "{none}");
    assert_eq!(none.paths[0].destination, None, "{none}");

    // After the endpoints change, a fresh read follows them.
    proxy.apply(&[], &[slice("web", &[pod_ip(&topology, "ep2")], &[])]);
    proxy.sync();
    let state = read(&topology, flavor, &routes);
    let trace = state.trace(&received(pod, at("10.96.0.10", 80))).unwrap();
    let answered = hits(topology.pod("ep1"), at("10.96.0.10", 80), 10);
    assert_eq!(
        pods_of(&topology, &trace),
        answered.keys().cloned().collect::<BTreeSet<_>>(),
        "{trace}"
    );
}

/// The userspace mode's state, read in the node namespace.
fn read(topology: &Topology, flavor: IptablesFlavor, routes: &Path) -> LiveState {
    topology
        .node()
        .run(|| LiveState::read_with(IpFamily::V4, flavor, routes))
        .unwrap_or_else(|error| panic!("reading the userspace state failed: {error:?}"))
}

/// A TCP packet from `src` arriving at the node for `to`.
fn received(src: IpAddr, to: SocketAddr) -> Packet {
    Packet {
        src,
        dst: to.ip(),
        dport: to.port(),
        protocol: Protocol::Tcp,
        src_local: false,
        in_interface: None,
    }
}

/// The names of the pods the trace's accepted paths reach.
#[track_caller]
fn pods_of(topology: &Topology, trace: &Trace) -> BTreeSet<String> {
    trace
        .destinations()
        .into_iter()
        .map(|to| {
            PODS.iter()
                .find(|pod| SocketAddr::new(pod_ip(topology, pod), POD_TCP_PORT) == to)
                .map(|pod| (*pod).to_owned())
                .unwrap_or_else(|| panic!("{to} is no pod's TCP port: {trace}"))
        })
        .collect()
}
