//! Which flows are stale, told as stories over one address plan:
//!
//! | what | address |
//! |---|---|
//! | ns1/dns, port dns 53/UDP | ClusterIP 10.96.0.20, NodePort 30053, external IP 203.0.113.5 |
//! | ns1/web, port http 80/TCP | ClusterIP 10.96.0.10 |
//! | endpoints ep1, ep2, ep3 | 10.244.1.2, 10.244.1.3, 10.244.1.4, target port 5353 (UDP), 8080 (TCP) |
//! | node-1 (this node), client | 192.168.99.2, 192.168.99.10 |
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kp_sync::StaleConntrack;
use kp_testkit::builders::{endpoint_slice, service};
use pretty_assertions::assert_eq;

use super::{stale_flows, sync_may_leave_stale_flows};
use crate::flow::{Flow, FlowTuple, IPPROTO_SCTP, IPPROTO_TCP};
use crate::test_state::*;

impl Synced {
    #[track_caller]
    fn assert_stale(&self, flows: &[Flow], expected: &[Flow]) {
        assert_eq!(stale_flows(&self.request(), flows), expected);
    }
}

fn udp(client_port: u16, to: &str, from: &str) -> Flow {
    Flow::udp(client(client_port), at(to), at(from))
}

#[test]
fn a_flow_to_a_removed_endpoint_is_stale_and_one_to_a_serving_endpoint_is_not() {
    let state = synced(&[dns()], &[slice("dns", &[(EP2, ready)])]);
    let to_ep1 = udp(40001, "10.96.0.20:53", "10.244.1.2:5353");
    let to_ep2 = udp(40002, "10.96.0.20:53", "10.244.1.3:5353");

    state.assert_stale(&[to_ep1, to_ep2], &[to_ep1]);
}

#[test]
fn external_ips_and_node_ports_are_frontends_too() {
    let state = synced(&[dns()], &[slice("dns", &[(EP2, ready)])]);
    let via_external_ip = udp(40001, "203.0.113.5:53", "10.244.1.2:5353");
    let via_node_port = udp(40002, "192.168.99.2:30053", "10.244.1.2:5353");
    let kept = udp(40003, "192.168.99.2:30053", "10.244.1.3:5353");

    state.assert_stale(
        &[via_external_ip, via_node_port, kept],
        &[via_external_ip, via_node_port],
    );
}

#[test]
fn an_endpoint_on_another_port_is_not_the_serving_one() {
    let state = synced(&[dns()], &[slice("dns", &[(EP2, ready)])]);
    let old_target_port = udp(40001, "10.96.0.20:53", "10.244.1.3:5354");

    state.assert_stale(&[old_target_port], &[old_target_port]);
}

#[test]
fn tcp_flows_and_flows_to_other_destinations_are_left_alone() {
    let state = synced(
        &[dns(), web()],
        &[slice("dns", &[(EP2, ready)]), slice("web", &[(EP2, ready)])],
    );
    let tcp = Flow {
        protocol: IPPROTO_TCP,
        ..udp(40001, "10.96.0.10:80", "10.244.1.2:8080")
    };
    let other_port = udp(40002, "10.96.0.20:54", "10.244.1.2:5353");
    let unrelated = udp(40003, "8.8.8.8:53", "8.8.8.8:53");

    state.assert_stale(&[tcp, other_port, unrelated], &[]);
}

#[test]
fn a_terminating_endpoint_keeps_its_flows_only_while_no_endpoint_is_ready() {
    let to_ep1 = udp(40001, "10.96.0.20:53", "10.244.1.2:5353");
    let to_ep3 = udp(40002, "10.96.0.20:53", "10.244.1.4:5353");
    let alone = synced(
        &[dns()],
        &[slice(
            "dns",
            &[
                (EP1, |e| e.ready(false).terminating_serving()),
                (EP3, |e| e.ready(false).terminating_not_serving()),
            ],
        )],
    );
    alone.assert_stale(&[to_ep1, to_ep3], &[to_ep3]);

    let with_a_ready_one = synced(
        &[dns()],
        &[slice(
            "dns",
            &[
                (EP1, |e| e.ready(false).terminating_serving()),
                (EP2, ready),
            ],
        )],
    );
    with_a_ready_one.assert_stale(&[to_ep1], &[to_ep1]);
}

#[test]
fn a_removed_terminating_endpoint_is_stale() {
    let state = synced(&[dns()], &[slice("dns", &[(EP2, ready)])]);
    let to_removed_terminating = udp(40001, "10.96.0.20:53", "10.244.1.2:5353");

    state.assert_stale(&[to_removed_terminating], &[to_removed_terminating]);
}

#[test]
fn entries_cached_before_the_service_had_an_endpoint_are_stale_once_it_has_one() {
    let state = synced(&[dns()], &[slice("dns", &[(EP1, ready)])]);
    let not_translated = udp(40001, "10.96.0.20:53", "10.96.0.20:53");
    let to_node_port = udp(40002, "192.168.99.2:30053", "192.168.99.2:30053");
    let elsewhere_same_port = udp(40003, "198.51.100.7:30053", "198.51.100.7:30053");

    state.assert_stale(
        &[not_translated, to_node_port, elsewhere_same_port],
        &[not_translated, to_node_port],
    );
}

#[test]
fn when_every_endpoint_is_gone_translated_flows_are_stale_and_cached_refusals_are_not() {
    let no_endpoints = synced(&[dns()], &[slice("dns", &[])]);
    let to_ep1 = udp(40001, "10.96.0.20:53", "10.244.1.2:5353");
    let via_node_port = udp(40002, "192.168.99.2:30053", "10.244.1.3:5353");
    let not_translated = udp(40003, "10.96.0.20:53", "10.96.0.20:53");

    no_endpoints.assert_stale(
        &[to_ep1, via_node_port, not_translated],
        &[to_ep1, via_node_port],
    );
}

#[test]
fn internal_traffic_policy_local_keeps_only_flows_to_local_endpoints_on_the_cluster_ip() {
    let dns_itp_local = service("ns1", "dns", |s| {
        s.service_type("NodePort")
            .cluster_ip("10.96.0.20")
            .port("dns", 53, "UDP")
            .node_port(30053)
            .internal_traffic_policy_local()
    });
    let state = synced(
        &[dns_itp_local],
        &[slice("dns", &[(EP1, local), (EP2, remote)])],
    );
    let to_local = udp(40001, "10.96.0.20:53", "10.244.1.2:5353");
    let to_remote = udp(40002, "10.96.0.20:53", "10.244.1.3:5353");
    let node_port_to_remote = udp(40003, "192.168.99.2:30053", "10.244.1.3:5353");

    state.assert_stale(&[to_local, to_remote, node_port_to_remote], &[to_remote]);
}

#[test]
fn an_endpoint_that_moves_off_this_node_under_external_policy_local_loses_its_outside_clients() {
    let dns_etp_local = service("ns1", "dns", |s| {
        s.service_type("NodePort")
            .cluster_ip("10.96.0.20")
            .port("dns", 53, "UDP")
            .node_port(30053)
            .external_traffic_policy_local()
    });
    let from_outside = udp(40001, "192.168.99.2:30053", "10.244.1.2:5353");
    let from_a_local_pod = Flow::udp(
        at("10.244.1.9:40002"),
        at("192.168.99.2:30053"),
        at("10.244.1.2:5353"),
    );
    let from_the_node = Flow::udp(
        at("192.168.99.2:40003"),
        at("192.168.99.2:30053"),
        at("10.244.1.2:5353"),
    );
    let via_cluster_ip = udp(40004, "10.96.0.20:53", "10.244.1.2:5353");
    let flows = [
        from_outside,
        from_a_local_pod,
        from_the_node,
        via_cluster_ip,
    ];
    let on_this_node = synced(
        std::slice::from_ref(&dns_etp_local),
        &[slice("dns", &[(EP1, local)])],
    );
    on_this_node.assert_stale(&flows, &[]);

    // The pod is on another node now: traffic from outside may only go to
    // this node's endpoints, of which there is none; the node's own pods
    // and processes are still sent to the cluster's.
    let moved = synced(&[dns_etp_local], &[slice("dns", &[(EP1, remote)])]);
    moved.assert_stale(&flows, &[from_outside]);
}

#[test]
fn sctp_flows_are_reconciled_like_udp_ones_and_kept_apart_by_protocol() {
    let both = service("ns1", "dns", |s| {
        s.cluster_ip("10.96.0.20")
            .port("dns", 53, "UDP")
            .port("dns-sctp", 53, "SCTP")
    });
    let slices = [endpoint_slice("ns1", "dns-1", "dns", |s| {
        s.port("dns", 5353, "UDP")
            .port("dns-sctp", 5354, "SCTP")
            .endpoint(EP2, |e| e.ready(true))
    })];
    let state = synced(&[both], &slices);
    let sctp = |client_port, from| Flow {
        protocol: IPPROTO_SCTP,
        ..udp(client_port, "10.96.0.20:53", from)
    };
    let sctp_to_removed = sctp(40001, "10.244.1.2:5354");
    let sctp_kept = sctp(40002, "10.244.1.3:5354");
    let udp_kept = udp(40003, "10.96.0.20:53", "10.244.1.3:5353");
    let sctp_to_the_udp_target_port = sctp(40004, "10.244.1.3:5353");

    state.assert_stale(
        &[
            sctp_to_removed,
            sctp_kept,
            udp_kept,
            sctp_to_the_udp_target_port,
        ],
        &[sctp_to_removed, sctp_to_the_udp_target_port],
    );
}

#[test]
fn a_node_port_does_not_claim_flows_to_another_services_address() {
    let other = service("ns1", "other", |s| {
        s.cluster_ip("10.96.0.30").port("p", 30053, "UDP")
    });
    let state = synced(
        &[dns(), other],
        &[
            slice("dns", &[(EP2, ready)]),
            endpoint_slice("ns1", "other-1", "other", |s| {
                s.port("p", 7000, "UDP").endpoint(EP3, |e| e.ready(true))
            }),
        ],
    );
    let to_other = udp(40001, "10.96.0.30:30053", "10.244.1.4:7000");

    state.assert_stale(&[to_other], &[]);
}

#[test]
fn only_syncs_that_touched_udp_or_sctp_services_need_a_reconcile() {
    let both = || {
        synced(
            &[dns(), web()],
            &[slice("dns", &[(EP2, ready)]), slice("web", &[(EP2, ready)])],
        )
    };
    assert!(!sync_may_leave_stale_flows(&both().request()));
    assert!(!sync_may_leave_stale_flows(
        &both().changing("web").request()
    ));
    assert!(sync_may_leave_stale_flows(
        &both().changing("dns").request()
    ));
    assert!(sync_may_leave_stale_flows(&both().full().request()));
    let removed = both().reporting(StaleConntrack {
        deleted_cluster_ips: ["10.96.0.99".parse().unwrap()].into(),
    });
    assert!(sync_may_leave_stale_flows(&removed.request()));
}

#[test]
fn flows_to_a_deleted_cluster_ip_are_stale_unless_a_current_port_owns_the_address() {
    let state = synced(&[dns()], &[slice("dns", &[(EP2, ready)])]).reporting(StaleConntrack {
        deleted_cluster_ips: ["10.96.0.99".parse().unwrap(), "10.96.0.20".parse().unwrap()].into(),
    });
    let to_deleted = udp(40001, "10.96.0.99:53", "10.244.1.2:5353");
    let to_reused = udp(40002, "10.96.0.20:53", "10.244.1.3:5353");
    let to_reused_other_port = udp(40003, "10.96.0.20:5000", "10.244.1.3:5000");

    state.assert_stale(
        &[to_deleted, to_reused, to_reused_other_port],
        &[to_deleted, to_reused_other_port],
    );
}

#[test]
fn flows_of_the_other_family_are_not_this_cleaners_business() {
    let state = synced(&[dns()], &[slice("dns", &[(EP2, ready)])]);
    let v6 = Flow {
        original: FlowTuple::new(at("[fd00::10]:40001"), at("[fd00:10:96::20]:53")),
        reply: FlowTuple::new(at("[fd00:10:244:1::2]:5353"), at("[fd00::10]:40001")),
        ..udp(0, "10.96.0.20:53", "10.96.0.20:53")
    };

    state.assert_stale(&[v6], &[]);
}
