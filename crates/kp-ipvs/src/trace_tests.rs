//! Traces over the state and rules the planner programs for a node at
//! 192.168.99.2 (address plan of kp_testkit: ClusterIPs 10.96.0.0/16, this
//! node's pods 10.244.1.0/24, other nodes' 10.244.2.0/24).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use kp_iptables::tracer::Ruleset;
use pretty_assertions::assert_eq;

use super::*;
use crate::backend::IpvsOptions;
use crate::planner::{plan, PlanInput};
use crate::rules::{self, RuleOptions, JUMP_RULES};
use crate::testing::{ip, service, Ports, ServiceBuilder};

const NODE: &str = "192.168.99.2";
const OUTSIDE: &str = "192.0.2.1";

/// The live state of a node that synced `services`.
fn live(services: Vec<ServiceBuilder>) -> LiveState {
    let mut ports = Ports::new();
    for service in services {
        ports = ports.with(service);
    }
    let ports = ports.build();
    let node = [ip(NODE)];
    let options = RuleOptions {
        masquerade_mark: IpvsOptions::default().masquerade_mark.to_string(),
        masquerade_all: false,
        not_local: None,
        random_fully: true,
    };
    let planned = plan(
        &PlanInput {
            family: IpFamily::V4,
            scheduler: "rr",
            node_addresses: &node,
            node_port_addresses: &node,
            rules: &options,
        },
        &ports,
    );
    let text = rules::with_jumps(&planned.iptables, &JUMP_RULES);
    LiveState {
        family: IpFamily::V4,
        kernel: planned.state,
        node_addresses: node.to_vec(),
        rules: Ruleset::from_restore(&text).unwrap(),
    }
}

fn from_outside(dst: &str, dport: u16) -> Packet {
    Packet {
        src: ip(OUTSIDE),
        dst: ip(dst),
        dport,
        protocol: Protocol::Tcp,
        src_local: false,
        in_interface: Some("eth0".to_owned()),
    }
}

fn sock(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

/// (destination, verdict, masqueraded, probability) of each path, sorted.
fn summary(trace: &Trace) -> Vec<(Option<SocketAddr>, PathVerdict, bool, String)> {
    let mut paths: Vec<_> = trace
        .paths
        .iter()
        .map(|p| {
            (
                p.destination,
                p.verdict,
                p.masqueraded,
                format!("{:.3}", p.probability),
            )
        })
        .collect();
    paths.sort_by_key(|p| (p.0, p.1));
    paths
}

#[test]
fn a_cluster_ip_with_two_endpoints_takes_each_with_half_the_connections() {
    let state = live(vec![service("ns1", "web", "10.96.0.10", 80)
        .endpoint("10.244.1.2", 80, true)
        .endpoint("10.244.2.3", 80, false)]);
    let trace = state.trace(&from_outside("10.96.0.10", 80)).unwrap();
    assert_eq!(
        summary(&trace),
        vec![
            (
                Some(sock("10.244.1.2:80")),
                PathVerdict::Accept,
                false,
                "0.500".into()
            ),
            (
                Some(sock("10.244.2.3:80")),
                PathVerdict::Accept,
                false,
                "0.500".into()
            ),
        ],
        "{trace}"
    );
    let path = &trace.paths[0];
    assert!(
        path.matched
            .contains(&"ipvs: TCP 10.96.0.10:80 rr".to_owned()),
        "{trace}"
    );
    assert!(
        path.matched
            .iter()
            .any(|rule| rule.starts_with("filter/KUBE-IPVS-FILTER")),
        "{trace}"
    );
    assert!(
        path.elements
            .contains(&"KUBE-CLUSTER-IP: 10.96.0.10,tcp:80".to_owned()),
        "{trace}"
    );
    assert!(path.affinity.is_empty(), "{trace}");
}

#[test]
fn a_real_server_of_weight_zero_takes_no_new_connection() {
    let mut state = live(vec![service("ns1", "web", "10.96.0.10", 80)
        .endpoint("10.244.1.2", 80, true)
        .endpoint("10.244.2.3", 80, false)]);
    let key = ServiceKey {
        address: ip("10.96.0.10"),
        protocol: Protocol::Tcp,
        port: 80,
    };
    // A terminating endpoint drains with weight 0.
    state
        .kernel
        .services
        .get_mut(&key)
        .unwrap()
        .reals
        .insert(sock("10.244.2.3:80"), 0);
    let trace = state.trace(&from_outside("10.96.0.10", 80)).unwrap();
    assert_eq!(
        summary(&trace),
        vec![(
            Some(sock("10.244.1.2:80")),
            PathVerdict::Accept,
            false,
            "1.000".into()
        )],
        "{trace}"
    );
}

#[test]
fn real_servers_share_new_connections_by_weight() {
    let mut state = live(vec![service("ns1", "web", "10.96.0.10", 80)
        .endpoint("10.244.1.2", 80, true)
        .endpoint("10.244.2.3", 80, false)]);
    let key = ServiceKey {
        address: ip("10.96.0.10"),
        protocol: Protocol::Tcp,
        port: 80,
    };
    let reals = &mut state.kernel.services.get_mut(&key).unwrap().reals;
    reals.insert(sock("10.244.1.2:80"), 3);
    let trace = state.trace(&from_outside("10.96.0.10", 80)).unwrap();
    assert_eq!(
        summary(&trace),
        vec![
            (
                Some(sock("10.244.1.2:80")),
                PathVerdict::Accept,
                false,
                "0.750".into()
            ),
            (
                Some(sock("10.244.2.3:80")),
                PathVerdict::Accept,
                false,
                "0.250".into()
            ),
        ],
        "{trace}"
    );
    assert!(
        trace.paths.iter().any(|p| p
            .matched
            .contains(&"ipvs: real server 10.244.1.2:80 weight 3 of 4".to_owned())),
        "{trace}"
    );
}

#[test]
fn external_traffic_policy_local_node_port_reaches_local_endpoints_with_the_client_address() {
    let state = live(vec![service("ns1", "local", "10.96.0.12", 80)
        .node_port(30081)
        .etp_local()
        .endpoint("10.244.1.2", 80, true)
        .endpoint("10.244.2.3", 80, false)]);
    let trace = state.trace(&from_outside(NODE, 30081)).unwrap();
    assert_eq!(
        summary(&trace),
        vec![(
            Some(sock("10.244.1.2:80")),
            PathVerdict::Accept,
            false,
            "1.000".into()
        )],
        "{trace}"
    );
    assert!(
        trace.paths[0]
            .elements
            .contains(&"KUBE-NODE-PORT-LOCAL-TCP: 30081".to_owned()),
        "{trace}"
    );
}

#[test]
fn external_traffic_policy_cluster_node_port_masquerades_to_every_endpoint() {
    let state = live(vec![service("ns1", "np", "10.96.0.11", 80)
        .node_port(30080)
        .endpoint("10.244.1.2", 80, true)
        .endpoint("10.244.2.3", 80, false)]);
    let trace = state.trace(&from_outside(NODE, 30080)).unwrap();
    assert_eq!(
        summary(&trace),
        vec![
            (
                Some(sock("10.244.1.2:80")),
                PathVerdict::Accept,
                true,
                "0.500".into()
            ),
            (
                Some(sock("10.244.2.3:80")),
                PathVerdict::Accept,
                true,
                "0.500".into()
            ),
        ],
        "{trace}"
    );
    assert!(
        trace.paths[0]
            .matched
            .iter()
            .any(|rule| rule.starts_with("nat/KUBE-POSTROUTING") && rule.contains("MASQUERADE")),
        "{trace}"
    );
}

#[test]
fn a_load_balancer_ip_with_source_ranges_drops_a_client_outside_them() {
    let state = live(vec![service("ns1", "lb", "10.96.0.15", 80)
        .lb_ip("203.0.113.9")
        .source_range("198.51.100.0/24")
        .endpoint("10.244.1.2", 80, true)]);
    let refused = state.trace(&from_outside("203.0.113.9", 80)).unwrap();
    assert_eq!(
        summary(&refused),
        vec![(None, PathVerdict::Drop, false, "1.000".into())],
        "{refused}"
    );
    assert!(
        refused.paths[0]
            .matched
            .iter()
            .any(|rule| rule == "filter/KUBE-SOURCE-RANGES-FIREWALL -j DROP"),
        "{refused}"
    );
    let mut inside = from_outside("203.0.113.9", 80);
    inside.src = ip("198.51.100.7");
    let admitted = state.trace(&inside).unwrap();
    assert_eq!(
        summary(&admitted),
        vec![(
            Some(sock("10.244.1.2:80")),
            PathVerdict::Accept,
            true,
            "1.000".into()
        )],
        "{admitted}"
    );
    assert!(
        admitted.paths[0].elements.contains(
            &"KUBE-LOAD-BALANCER-SOURCE-CIDR: 203.0.113.9,tcp:80,198.51.100.0/24".to_owned()
        ),
        "{admitted}"
    );
}

#[test]
fn a_service_without_endpoints_is_rejected_by_its_empty_virtual_server() {
    let state = live(vec![service("ns1", "empty", "10.96.0.14", 80)]);
    let trace = state.trace(&from_outside("10.96.0.14", 80)).unwrap();
    assert_eq!(
        summary(&trace),
        vec![(None, PathVerdict::Reject, false, "1.000".into())],
        "{trace}"
    );
    assert!(
        trace.paths[0]
            .matched
            .iter()
            .any(|step| step.contains("ICMP port unreachable")),
        "{trace}"
    );
}

#[test]
fn session_affinity_reports_the_persistence_timeout() {
    let state = live(vec![service("ns1", "sticky", "10.96.0.13", 80)
        .affinity_secs(600)
        .endpoint("10.244.1.2", 80, true)
        .endpoint("10.244.1.3", 80, true)]);
    let trace = state.trace(&from_outside("10.96.0.13", 80)).unwrap();
    assert_eq!(trace.paths.len(), 2, "{trace}");
    for path in &trace.paths {
        assert_eq!(
            path.affinity,
            vec![Affinity {
                name: "TCP 10.96.0.13:80".to_owned(),
                timeout_secs: 600
            }],
            "{trace}"
        );
    }
}

#[test]
fn a_pod_reaching_itself_through_its_service_is_masqueraded_on_that_path_only() {
    let state = live(vec![service("ns1", "web", "10.96.0.10", 80)
        .endpoint("10.244.1.2", 80, true)
        .endpoint("10.244.1.3", 80, true)]);
    let mut packet = from_outside("10.96.0.10", 80);
    packet.src = ip("10.244.1.2");
    packet.in_interface = Some("veth1".to_owned());
    let trace = state.trace(&packet).unwrap();
    assert_eq!(
        summary(&trace),
        vec![
            (
                Some(sock("10.244.1.2:80")),
                PathVerdict::Accept,
                true,
                "0.500".into()
            ),
            (
                Some(sock("10.244.1.3:80")),
                PathVerdict::Accept,
                false,
                "0.500".into()
            ),
        ],
        "{trace}"
    );
    let hairpin = trace
        .paths
        .iter()
        .find(|p| p.destination == Some(sock("10.244.1.2:80")))
        .unwrap();
    assert!(
        hairpin
            .elements
            .contains(&"KUBE-LOOP-BACK: 10.244.1.2,tcp:80,10.244.1.2".to_owned()),
        "{trace}"
    );
}

#[test]
fn an_address_without_a_virtual_server_is_left_to_the_node() {
    let state = live(vec![service("ns1", "web", "10.96.0.10", 80).endpoint(
        "10.244.1.2",
        80,
        true,
    )]);
    let trace = state.trace(&from_outside(NODE, 22)).unwrap();
    assert_eq!(
        summary(&trace),
        vec![(None, PathVerdict::Accept, false, "1.000".into())],
        "{trace}"
    );
    assert!(
        !trace.paths[0]
            .matched
            .iter()
            .any(|s| s.starts_with("ipvs: ")),
        "{trace}"
    );
    // Another port of a service address is closed by KUBE-IPVS-FILTER.
    let closed = state.trace(&from_outside("10.96.0.10", 81)).unwrap();
    assert_eq!(
        summary(&closed),
        vec![(None, PathVerdict::Reject, false, "1.000".into())],
        "{closed}"
    );
}

#[test]
fn a_virtual_server_with_flags_the_trace_does_not_model_is_named() {
    let mut state = live(vec![service("ns1", "web", "10.96.0.10", 80).endpoint(
        "10.244.1.2",
        80,
        true,
    )]);
    let key = ServiceKey {
        address: ip("10.96.0.10"),
        protocol: Protocol::Tcp,
        port: 80,
    };
    // IP_VS_SVC_F_ONEPACKET
    state.kernel.services.get_mut(&key).unwrap().server.flags |= 0x4;
    let error = state.trace(&from_outside("10.96.0.10", 80)).unwrap_err();
    assert_eq!(
        error.to_string(),
        "IPVS virtual server TCP 10.96.0.10:80: flags 0x4 are not modelled; the trace does not follow it"
    );
    let empty: BTreeSet<SocketAddr> = BTreeSet::new();
    assert_eq!(
        state.trace(&from_outside(NODE, 22)).unwrap().destinations(),
        empty
    );
}

/// A packet of a process of the node; the kernel picks a source on the
/// route to the destination (a service address: itself, on kube-ipvs0).
fn from_node(src: &str, dst: &str, dport: u16) -> Packet {
    Packet {
        src: ip(src),
        dst: ip(dst),
        dport,
        protocol: Protocol::Tcp,
        src_local: true,
        in_interface: None,
    }
}

#[test]
fn the_node_reaching_a_cluster_ip_is_scheduled_at_local_out_and_masqueraded() {
    let state = live(vec![service("ns1", "web", "10.96.0.10", 80)
        .endpoint("10.244.1.2", 80, true)
        .endpoint("10.244.2.3", 80, false)]);
    let trace = state
        .trace(&from_node("10.96.0.10", "10.96.0.10", 80))
        .unwrap();
    assert_eq!(
        summary(&trace),
        vec![
            (
                Some(sock("10.244.1.2:80")),
                PathVerdict::Accept,
                true,
                "0.500".into()
            ),
            (
                Some(sock("10.244.2.3:80")),
                PathVerdict::Accept,
                true,
                "0.500".into()
            ),
        ],
        "{trace}"
    );
    assert!(
        trace.paths[0].matched[0].starts_with("nat/OUTPUT"),
        "{trace}"
    );
}

#[test]
fn the_node_is_kept_from_a_load_balancer_ip_whose_source_ranges_exclude_it() {
    let state = live(vec![service("ns1", "lb", "10.96.0.15", 80)
        .lb_ip("203.0.113.9")
        .source_range("198.51.100.0/24")
        .endpoint("10.244.1.2", 80, true)]);
    let trace = state
        .trace(&from_node("203.0.113.9", "203.0.113.9", 80))
        .unwrap();
    assert_eq!(
        summary(&trace),
        vec![(
            Some(sock("10.244.1.2:80")),
            PathVerdict::Drop,
            false,
            "1.000".into()
        )],
        "{trace}"
    );
    assert!(
        trace.paths[0]
            .matched
            .iter()
            .any(|rule| rule.starts_with("filter/KUBE-IPVS-OUT-FILTER")),
        "{trace}"
    );
}
