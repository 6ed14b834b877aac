//! Behaviour of rendered transactions, traced packet by packet.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web:p80 | ClusterIP 10.96.0.10, endpoints 10.244.1.2 (here), 10.244.2.2 (node-2) |
//! | ns1/np:p80 | NodePort 30080, externalIP 203.0.113.5, eTP Local, endpoint 10.244.2.3 (node-2) |
//! | ns1/lb:p80 | LB 203.0.113.9 from 198.51.100.0/24 only, endpoint 10.244.1.4 |
//! | ns1/empty:p80 | ClusterIP 10.96.0.14, no endpoints |
//! | ns1/itp:p80 | ClusterIP 10.96.0.15, iTP Local, endpoint 10.244.2.5 (node-2) |
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{assert_goes_to, at, packet, service, World};
use kp_nftables::tracer::Verdict;

const POD: &str = "10.244.1.7";
const CLIENT: &str = "192.168.99.10";
const NODE: &str = "192.168.99.2";

fn world() -> World {
    let mut world = World::v4();
    world
        .put(
            service("ns1", "web", "10.96.0.10", 80)
                .local_endpoint("10.244.1.2", 8080)
                .remote_endpoint("10.244.2.2", 8080),
        )
        .put(
            service("ns1", "np", "10.96.0.11", 80)
                .node_port(30080)
                .external_ip("203.0.113.5")
                .etp_local()
                .remote_endpoint("10.244.2.3", 8080),
        )
        .put(
            service("ns1", "lb", "10.96.0.12", 80)
                .lb_ip("203.0.113.9")
                .source_range("198.51.100.0/24")
                .local_endpoint("10.244.1.4", 8080),
        )
        .put(service("ns1", "empty", "10.96.0.14", 80))
        .put(
            service("ns1", "itp", "10.96.0.15", 80)
                .itp_local()
                .remote_endpoint("10.244.2.5", 8080),
        );
    world.sync(true, &[]);
    world
}

#[test]
fn cluster_ip_goes_to_one_of_its_endpoints() {
    let world = world();
    let verdict = world.trace(POD, at("10.96.0.10", 80));
    assert_goes_to(&verdict, &[at("10.244.1.2", 8080), at("10.244.2.2", 8080)]);
    // From outside the cluster the packet is masqueraded; a pod's is not,
    // unless it reaches itself (hairpin).
    let Verdict::Dnat { masquerade, .. } = world.trace(CLIENT, at("10.96.0.10", 80)) else {
        panic!("client traffic is DNATed");
    };
    assert_eq!(masquerade.len(), 2);
    let Verdict::Dnat { masquerade, .. } = world.trace("10.244.1.2", at("10.96.0.10", 80)) else {
        panic!("hairpin traffic is DNATed");
    };
    assert_eq!(
        masquerade.into_iter().collect::<Vec<_>>(),
        [at("10.244.1.2", 8080)]
    );
}

#[test]
fn a_service_without_endpoints_is_rejected_and_an_unknown_port_too() {
    let world = world();
    assert_eq!(world.trace(POD, at("10.96.0.14", 80)), Verdict::Reject);
    assert_eq!(world.trace(POD, at("10.96.0.10", 81)), Verdict::Reject);
    assert_eq!(world.trace(POD, at("10.96.9.9", 80)), Verdict::Accept);
}

#[test]
fn external_traffic_policy_local_without_local_endpoints() {
    let world = world();
    // From outside: dropped (a load balancer's health check moves on).
    assert_eq!(world.trace(CLIENT, at(NODE, 30080)), Verdict::Drop);
    assert_eq!(world.trace(CLIENT, at("203.0.113.5", 80)), Verdict::Drop);
    // Pods and the node itself are short-circuited to cluster endpoints.
    assert_goes_to(
        &world.trace(POD, at(NODE, 30080)),
        &[at("10.244.2.3", 8080)],
    );
    let Verdict::Dnat { masquerade, .. } = world.trace(NODE, at("203.0.113.5", 80)) else {
        panic!("node traffic is DNATed");
    };
    assert_eq!(masquerade.len(), 1, "the node's own traffic is masqueraded");
    // The ClusterIP still works for everyone.
    assert_goes_to(
        &world.trace(CLIENT, at("10.96.0.11", 80)),
        &[at("10.244.2.3", 8080)],
    );
}

#[test]
fn load_balancer_source_ranges_drop_other_sources() {
    let world = world();
    assert_eq!(world.trace(CLIENT, at("203.0.113.9", 80)), Verdict::Drop);
    assert_goes_to(
        &world.trace("198.51.100.7", at("203.0.113.9", 80)),
        &[at("10.244.1.4", 8080)],
    );
}

#[test]
fn internal_traffic_policy_local_without_local_endpoints_drops() {
    let world = world();
    assert_eq!(world.trace(POD, at("10.96.0.15", 80)), Verdict::Drop);
}

#[test]
fn udp_and_node_ports_on_selected_addresses() {
    let mut world = World::with(
        kp_model::IpFamily::V4,
        kp_node::NodePortAddresses::Select {
            cidrs: Vec::new(),
            primary: true,
        },
    );
    world.put(
        service("ns1", "dns", "10.96.0.53", 53)
            .udp()
            .node_port(30053)
            .remote_endpoint("10.244.2.9", 5353),
    );
    world.sync(true, &[]);
    let verdict = world.trace_packet(packet(CLIENT, at(NODE, 30053), "udp"));
    assert_goes_to(&verdict, &[at("10.244.2.9", 5353)]);
    let tcp = world.trace_packet(packet(CLIENT, at(NODE, 30053), "tcp"));
    assert_eq!(tcp, Verdict::Accept);
    assert!(world.table.maps["nodeport-ips"].contains_key(NODE));
}

#[test]
fn a_partial_sync_changes_only_what_changed_and_stale_chains_go_later() {
    let mut world = world();
    world.put(service("ns1", "web", "10.96.0.10", 80).local_endpoint("10.244.1.2", 8080));
    let text = world.sync(false, &[("ns1", "web")]);

    assert!(
        !text.contains("ns1/np/"),
        "only ns1/web is written:\n{text}"
    );
    assert!(!text.contains("flush map"), "maps are not flushed:\n{text}");
    assert!(
        text.contains("flush chain ip kube-proxy endpoint-"),
        "{text}"
    );
    assert!(
        !text.contains("delete chain"),
        "a stale chain waits:\n{text}"
    );
    assert_goes_to(
        &world.trace(POD, at("10.96.0.10", 80)),
        &[at("10.244.1.2", 8080)],
    );

    // A second later, the next sync deletes the flushed chain, in a
    // transaction of its own before the sync's.
    world.advance(Duration::from_secs(2));
    let text = world.sync(false, &[]);
    assert!(!text.contains("delete chain"), "{text}");
    let cleanup = world.cleanup_of_last_sync().expect("a cleanup transaction");
    assert!(
        cleanup.contains("delete chain ip kube-proxy endpoint-"),
        "{cleanup}"
    );
    assert_eq!(world.backend.programmed().stale_chains.len(), 0);

    // A removed Service leaves nothing behind.
    world.remove("ns1", "lb");
    let text = world.sync(false, &[("ns1", "lb")]);
    assert!(
        text.contains("delete element ip kube-proxy firewall-ips"),
        "{text}"
    );
    assert_eq!(
        world.trace("198.51.100.7", at("203.0.113.9", 80)),
        Verdict::Accept
    );
    assert_eq!(world.trace(POD, at("10.96.0.12", 80)), Verdict::Accept);
}

#[test]
fn endpoints_coming_and_going_switch_between_reject_and_dnat() {
    let mut world = world();
    world.put(service("ns1", "empty", "10.96.0.14", 80).remote_endpoint("10.244.2.8", 80));
    world.sync(false, &[("ns1", "empty")]);
    assert_goes_to(
        &world.trace(POD, at("10.96.0.14", 80)),
        &[at("10.244.2.8", 80)],
    );
    world.put(service("ns1", "empty", "10.96.0.14", 80));
    world.sync(false, &[("ns1", "empty")]);
    assert_eq!(world.trace(POD, at("10.96.0.14", 80)), Verdict::Reject);
}

#[test]
fn a_full_sync_over_a_table_gives_the_same_behaviour_as_a_fresh_one() {
    let mut world = world();
    world.put(service("ns1", "web", "10.96.0.10", 80).remote_endpoint("10.244.2.2", 8080));
    world.remove("ns1", "empty");
    world.sync(true, &[]);
    let mut fresh = World::v4();
    fresh.services = world.services.clone();
    fresh.sync(true, &[]);
    for (src, dst) in [
        (POD, at("10.96.0.10", 80)),
        (POD, at("10.96.0.14", 80)),
        (CLIENT, at("203.0.113.9", 80)),
        (CLIENT, at(NODE, 30080)),
    ] {
        assert_eq!(
            world.trace(src, dst),
            fresh.trace(src, dst),
            "{src} -> {dst}"
        );
    }
    assert_eq!(world.table.maps, fresh.table.maps);
}

#[test]
fn terminating_endpoints_serve_when_no_endpoint_is_ready() {
    let mut world = World::v4();
    world.put(service("ns1", "web", "10.96.0.10", 80).terminating_endpoint("10.244.1.2", 80, true));
    world.sync(true, &[]);
    assert_goes_to(
        &world.trace(POD, at("10.96.0.10", 80)),
        &[at("10.244.1.2", 80)],
    );
}
