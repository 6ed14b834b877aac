//! Which flows are stale, told as stories over one address plan:
//!
//! | what | address |
//! |---|---|
//! | ns1/dns, port dns 53/UDP | ClusterIP 10.96.0.20, NodePort 30053, external IP 203.0.113.5 |
//! | ns1/web, port http 80/TCP | ClusterIP 10.96.0.10 |
//! | endpoints ep1, ep2, ep3 | 10.244.1.2, 10.244.1.3, 10.244.1.4, target port 5353 (UDP), 8080 (TCP) |
//! | node, client | 192.168.99.2, 192.168.99.10 |
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use kp_model::{endpoints_from_slices, IpFamily};
use kp_sync::StaleConntrack;
use pretty_assertions::assert_eq;

use super::stale_flows;
use crate::flow::{Flow, FlowTuple, IPPROTO_TCP};
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
fn a_terminating_endpoint_keeps_its_flows_while_it_serves() {
    let state = synced(
        &[dns()],
        &[slice(
            "dns",
            &[
                (EP1, |e| e.ready(false).terminating_serving()),
                (EP2, ready),
                (EP3, |e| e.ready(false).terminating_not_serving()),
            ],
        )],
    );
    let to_serving_terminating = udp(40001, "10.96.0.20:53", "10.244.1.2:5353");
    let to_not_serving = udp(40002, "10.96.0.20:53", "10.244.1.4:5353");

    state.assert_stale(&[to_serving_terminating, to_not_serving], &[to_not_serving]);
}

#[test]
fn entries_cached_before_the_service_had_an_endpoint_are_stale_once_it_has_one() {
    let state = synced(&[dns()], &[slice("dns", &[(EP1, ready)])]);
    let not_translated = udp(40001, "10.96.0.20:53", "10.96.0.20:53");

    state.assert_stale(&[not_translated], &[not_translated]);
}

#[test]
fn when_every_endpoint_is_gone_only_flows_to_the_reported_ones_are_stale() {
    let no_endpoints = synced(&[dns()], &[slice("dns", &[])]);
    let to_ep1 = udp(40001, "10.96.0.20:53", "10.244.1.2:5353");
    let to_ep2 = udp(40002, "10.96.0.20:53", "10.244.1.3:5353");
    no_endpoints.assert_stale(&[to_ep1, to_ep2], &[]);

    let removed_ep1 =
        endpoints_from_slices(&[slice("dns", &[(EP1, ready)])], IpFamily::V4, "node-1");
    let ep1 = Arc::clone(&removed_ep1[&dns_port()][0]);
    let reported = synced(&[dns()], &[slice("dns", &[])]).reporting(StaleConntrack {
        stale_endpoints: vec![(dns_port(), ep1)],
        ..StaleConntrack::default()
    });
    reported.assert_stale(&[to_ep1, to_ep2], &[to_ep1]);
}

#[test]
fn flows_to_a_deleted_cluster_ip_are_stale_unless_a_current_port_owns_the_address() {
    let state = synced(&[dns()], &[slice("dns", &[(EP2, ready)])]).reporting(StaleConntrack {
        deleted_udp_cluster_ips: ["10.96.0.99".parse().unwrap(), "10.96.0.20".parse().unwrap()]
            .into(),
        ..StaleConntrack::default()
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
