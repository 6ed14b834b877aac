//! Behaviour of the rendered rules, told as packet stories and checked with
//! the tracer. Address plan: see tests/common/mod.rs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;

use common::{ip, service, World};
use kp_iptables::tracer::{Packet, Ruleset, Trace, Verdict};
use kp_iptables::LocalDetector;
use kp_model::Protocol;

const POD: &str = "10.244.1.5";
const CLIENT: &str = "192.168.99.10";
const NODE: &str = "192.168.99.2";

fn to(addresses: &[&str]) -> BTreeSet<SocketAddr> {
    addresses.iter().map(|a| a.parse().unwrap()).collect()
}

fn tcp(src: &str, dst: &str, port: u16) -> Packet {
    Packet::tcp(ip(src), ip(dst), port)
}

#[track_caller]
fn assert_goes_to(trace: &Trace, expected: &[&str]) {
    assert!(
        trace.always(Verdict::Accept),
        "not always accepted:\n{trace}"
    );
    assert_eq!(trace.destinations(), to(expected), "\n{trace}");
}

fn three_endpoints() -> World {
    World::v4().with(
        service("ns1", "svc1", "10.96.0.41", 80)
            .local_endpoint("10.244.1.2", 8080)
            .remote_endpoint("10.244.2.3", 8080)
            .remote_endpoint("10.244.2.4", 8080),
    )
}

#[test]
fn pod_to_cluster_ip_reaches_any_endpoint_without_masquerade() {
    let trace = three_endpoints().trace(&tcp(POD, "10.96.0.41", 80));
    assert_goes_to(
        &trace,
        &["10.244.1.2:8080", "10.244.2.3:8080", "10.244.2.4:8080"],
    );
    assert!(trace.never_masqueraded(), "\n{trace}");
}

#[test]
fn off_cluster_client_to_cluster_ip_is_masqueraded() {
    let trace = three_endpoints().trace(&tcp(CLIENT, "10.96.0.41", 80));
    assert_goes_to(
        &trace,
        &["10.244.1.2:8080", "10.244.2.3:8080", "10.244.2.4:8080"],
    );
    assert!(trace.always_masqueraded(), "\n{trace}");
}

#[test]
fn wrong_port_or_protocol_is_not_captured() {
    let world = three_endpoints();
    assert!(world
        .trace(&tcp(POD, "10.96.0.41", 81))
        .destinations()
        .is_empty());
    let udp = tcp(POD, "10.96.0.41", 80).with_protocol(Protocol::Udp);
    assert!(world.trace(&udp).destinations().is_empty());
}

#[test]
fn endpoint_reaching_itself_through_the_service_is_masqueraded() {
    let trace = three_endpoints().trace(&tcp("10.244.1.2", "10.96.0.41", 80));
    let hairpin = trace
        .paths
        .iter()
        .find(|p| p.destination == Some("10.244.1.2:8080".parse().unwrap()));
    assert!(hairpin.unwrap().masqueraded, "\n{trace}");
    let other = trace
        .paths
        .iter()
        .find(|p| p.destination == Some("10.244.2.3:8080".parse().unwrap()));
    assert!(!other.unwrap().masqueraded, "\n{trace}");
}

#[test]
fn service_without_endpoints_is_rejected() {
    let world = World::v4().with(service("ns4", "empty", "10.96.0.50", 80).node_port(30050));
    assert!(world
        .trace(&tcp(POD, "10.96.0.50", 80))
        .always(Verdict::Reject));
    assert!(world
        .trace(&tcp(CLIENT, NODE, 30050))
        .always(Verdict::Reject));
}

fn load_balancer() -> World {
    World::v4().with(
        service("ns1", "lb", "10.96.0.43", 443)
            .lb_ip("203.0.113.9")
            .source_range("203.0.113.0/25")
            .remote_endpoint("10.244.2.3", 8443),
    )
}

#[test]
fn client_outside_the_source_ranges_is_dropped() {
    let trace = load_balancer().trace(&tcp(CLIENT, "203.0.113.9", 443));
    assert!(trace.always(Verdict::Drop), "\n{trace}");
}

#[test]
fn client_inside_the_source_ranges_reaches_the_endpoint_masqueraded() {
    let trace = load_balancer().trace(&tcp("203.0.113.50", "203.0.113.9", 443));
    assert_goes_to(&trace, &["10.244.2.3:8443"]);
    assert!(trace.always_masqueraded(), "\n{trace}");
}

fn etp_local(with_local_endpoint: bool) -> World {
    let mut svc = service("ns2", "svc2", "10.96.0.46", 80)
        .node_port(30046)
        .lb_ip("203.0.113.10")
        .etp_local()
        .remote_endpoint("10.244.2.3", 80);
    if with_local_endpoint {
        svc = svc.local_endpoint("10.244.1.2", 80);
    }
    World::v4().with(svc)
}

#[test]
fn etp_local_external_traffic_goes_to_local_endpoints_unmasqueraded() {
    let world = etp_local(true);
    for packet in [tcp(CLIENT, NODE, 30046), tcp(CLIENT, "203.0.113.10", 80)] {
        let trace = world.trace(&packet);
        assert_goes_to(&trace, &["10.244.1.2:80"]);
        assert!(trace.never_masqueraded(), "\n{trace}");
    }
}

#[test]
fn etp_local_pod_traffic_short_circuits_to_all_endpoints() {
    let trace = etp_local(true).trace(&tcp(POD, "203.0.113.10", 80));
    assert_goes_to(&trace, &["10.244.1.2:80", "10.244.2.3:80"]);
    assert!(trace.never_masqueraded(), "\n{trace}");
}

#[test]
fn etp_local_host_traffic_is_masqueraded_to_all_endpoints() {
    let trace = etp_local(true).trace(&tcp(NODE, "203.0.113.10", 80).from_host());
    assert_goes_to(&trace, &["10.244.1.2:80", "10.244.2.3:80"]);
    assert!(trace.always_masqueraded(), "\n{trace}");
}

#[test]
fn etp_local_without_local_endpoints_drops_external_but_serves_pods() {
    let world = etp_local(false);
    assert!(world.trace(&tcp(CLIENT, NODE, 30046)).always(Verdict::Drop));
    assert!(world
        .trace(&tcp(CLIENT, "203.0.113.10", 80))
        .always(Verdict::Drop));
    assert_goes_to(
        &world.trace(&tcp(POD, "203.0.113.10", 80)),
        &["10.244.2.3:80"],
    );
}

#[test]
fn itp_local_keeps_cluster_ip_traffic_on_the_node() {
    let world = World::v4()
        .with(
            service("ns3", "local", "10.96.0.48", 80)
                .itp_local()
                .local_endpoint("10.244.1.2", 80)
                .remote_endpoint("10.244.2.3", 80),
        )
        .with(
            service("ns3", "remote-only", "10.96.0.49", 80)
                .itp_local()
                .remote_endpoint("10.244.2.4", 80),
        );
    assert_goes_to(
        &world.trace(&tcp(POD, "10.96.0.48", 80)),
        &["10.244.1.2:80"],
    );
    assert!(world
        .trace(&tcp(POD, "10.96.0.49", 80))
        .always(Verdict::Drop));
}

#[test]
fn masquerade_all_marks_everything() {
    let world = three_endpoints().options(|o| o.masquerade_all = true);
    let trace = world.trace(&tcp(POD, "10.96.0.41", 80));
    assert_eq!(trace.destinations().len(), 3);
    assert!(trace.always_masqueraded(), "\n{trace}");
}

#[test]
fn without_a_detector_cluster_ip_traffic_is_never_masqueraded() {
    let world = three_endpoints().options(|o| o.local_detector = LocalDetector::None);
    assert!(world
        .trace(&tcp(CLIENT, "10.96.0.41", 80))
        .never_masqueraded());
}

#[test]
fn bridge_detector_tells_pods_by_their_interface() {
    let world = three_endpoints()
        .options(|o| o.local_detector = LocalDetector::BridgeInterface("cbr0".into()));
    let from_bridge = world.trace(&tcp(POD, "10.96.0.41", 80).from_interface("cbr0"));
    assert!(from_bridge.never_masqueraded(), "\n{from_bridge}");
    let from_uplink = world.trace(&tcp(CLIENT, "10.96.0.41", 80).from_interface("eth0"));
    assert!(from_uplink.always_masqueraded(), "\n{from_uplink}");
}

#[test]
fn interface_prefix_detector_matches_every_veth() {
    let world = three_endpoints()
        .options(|o| o.local_detector = LocalDetector::InterfaceNamePrefix("veth".into()));
    let trace = world.trace(&tcp(POD, "10.96.0.41", 80).from_interface("veth1234"));
    assert!(trace.never_masqueraded(), "\n{trace}");
}

#[test]
fn node_port_answers_on_localhost_for_the_host_only() {
    let world = World::v4().with(
        service("ns1", "np", "10.96.0.42", 80)
            .node_port(30080)
            .remote_endpoint("10.244.2.3", 80),
    );
    let host = world.trace(&tcp("127.0.0.1", "127.0.0.1", 30080).from_host());
    assert_goes_to(&host, &["10.244.2.3:80"]);
    assert!(host.always_masqueraded(), "\n{host}");

    let without = world.clone().options(|o| o.localhost_node_ports = false);
    let trace = without.trace(&tcp("127.0.0.1", "127.0.0.1", 30080).from_host());
    assert!(trace.destinations().is_empty(), "\n{trace}");
}

#[test]
fn remote_packets_to_loopback_are_dropped_when_localhost_node_ports_are_on() {
    let world = World::v4().with(service("ns1", "np", "10.96.0.42", 80).node_port(30080));
    let trace = world.trace(&tcp(CLIENT, "127.0.0.1", 22));
    assert!(trace.always(Verdict::Drop), "\n{trace}");
}

#[test]
fn session_affinity_still_balances_first_packets() {
    let world = World::v4().with(
        service("ns1", "sticky", "10.96.0.45", 80)
            .affinity_secs(10800)
            .local_endpoint("10.244.1.2", 80)
            .remote_endpoint("10.244.2.3", 80),
    );
    let trace = world.trace(&tcp(POD, "10.96.0.45", 80));
    assert_goes_to(&trace, &["10.244.1.2:80", "10.244.2.3:80"]);
    // Each path passed both affinity rules, which a returning client
    // would match instead.
    for path in &trace.paths {
        let timeouts: Vec<Option<u32>> = path.affinity.iter().map(|a| a.seconds).collect();
        assert_eq!(timeouts, [Some(10800), Some(10800)], "\n{trace}");
        assert!(path
            .affinity
            .iter()
            .all(|a| a.list.starts_with("KUBE-SEP-")));
    }
}

#[test]
fn udp_and_sctp_services_capture_their_protocol() {
    let world = World::v4()
        .with(
            service("kube-system", "dns", "10.96.0.10", 53)
                .protocol(Protocol::Udp)
                .remote_endpoint("10.244.2.5", 53),
        )
        .with(
            service("ns6", "sctp", "10.96.0.52", 9999)
                .protocol(Protocol::Sctp)
                .remote_endpoint("10.244.2.6", 9999),
        );
    let dns = tcp(POD, "10.96.0.10", 53).with_protocol(Protocol::Udp);
    assert_goes_to(&world.trace(&dns), &["10.244.2.5:53"]);
    let sctp = tcp(POD, "10.96.0.52", 9999).with_protocol(Protocol::Sctp);
    assert_goes_to(&world.trace(&sctp), &["10.244.2.6:9999"]);
}

#[test]
fn ipv6_service_reaches_its_endpoints() {
    let world = World::v6().with(
        service("ns1", "svc1", "fd00:10:96::41", 80)
            .node_port(30080)
            .local_endpoint("fd00:10:244:1::2", 8080)
            .remote_endpoint("fd00:10:244:2::3", 8080),
    );
    let trace = world.trace(&tcp("fd00:10:244:1::5", "fd00:10:96::41", 80));
    assert_goes_to(
        &trace,
        &["[fd00:10:244:1::2]:8080", "[fd00:10:244:2::3]:8080"],
    );
    let node_port = world.trace(&tcp("fd00:192:168:99::10", "fd00:192:168:99::2", 30080));
    assert!(node_port.always_masqueraded(), "\n{node_port}");
    let localhost = world.trace(&tcp("::1", "::1", 30080).from_host());
    assert!(
        localhost.destinations().is_empty(),
        "no localhost NodePorts on IPv6:\n{localhost}"
    );
}

#[test]
fn like_the_kernel_a_restore_may_not_jump_to_a_missing_chain() {
    let error =
        Ruleset::from_restore("*nat\n:KUBE-SVC-A - [0:0]\n-A KUBE-SVC-A -j KUBE-SEP-B\nCOMMIT\n")
            .unwrap_err()
            .to_string();
    assert!(error.contains("KUBE-SEP-B"), "{error}");
    let declared =
        "*nat\n:KUBE-SVC-A - [0:0]\n:KUBE-SEP-B - [0:0]\n-A KUBE-SVC-A -j KUBE-SEP-B\nCOMMIT\n";
    assert!(Ruleset::from_restore(declared).is_ok());
}

#[test]
fn like_the_kernel_a_restore_may_not_delete_a_chain_still_jumped_to() {
    let mut ruleset = Ruleset::from_restore(
        "*nat\n:KUBE-SVC-A - [0:0]\n:KUBE-SEP-B - [0:0]\n-A KUBE-SVC-A -j KUBE-SEP-B\nCOMMIT\n",
    )
    .unwrap();
    let error = ruleset
        .apply("*nat\n-X KUBE-SEP-B\nCOMMIT\n")
        .unwrap_err()
        .to_string();
    assert!(error.contains("still referenced"), "{error}");
    // Flushing the referring chain first, as a stale-chain deletion does.
    ruleset
        .apply("*nat\n:KUBE-SVC-A - [0:0]\n-X KUBE-SEP-B\nCOMMIT\n")
        .unwrap();
}

#[test]
fn the_hosts_own_connection_leaves_through_output_never_forward() {
    let trace = three_endpoints().trace(&tcp(NODE, "10.96.0.41", 80).from_host());
    assert_goes_to(
        &trace,
        &["10.244.1.2:8080", "10.244.2.3:8080", "10.244.2.4:8080"],
    );
    for path in &trace.paths {
        assert!(
            path.matched
                .iter()
                .any(|rule| rule.starts_with("filter/OUTPUT")),
            "no filter OUTPUT rule on the path:\n{trace}"
        );
        assert!(
            !path
                .matched
                .iter()
                .any(|rule| rule.starts_with("filter/FORWARD")),
            "a packet of the host passed filter FORWARD:\n{trace}"
        );
    }
    // A pod's packet to a remote endpoint is forwarded.
    let trace = three_endpoints().trace(&tcp(POD, "10.96.0.41", 80));
    assert!(
        trace.paths.iter().all(|path| path
            .matched
            .iter()
            .any(|rule| rule.starts_with("filter/FORWARD"))),
        "\n{trace}"
    );
}
