//! Which endpoints each kind of traffic uses, and who may connect.
//!
//! | what | addresses |
//! |---|---|
//! | service port | ClusterIP 10.96.0.10:80, NodePort 30080, externalIP 203.0.113.5, LB 203.0.113.9 |
//! | endpoints | 10.244.1.2:8080 (this node), 10.244.2.2:8080 (node-2) |
//! | clients | 192.168.99.10 (allowed by the source ranges), 192.168.99.11 |
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use kp_model::{Endpoint, Protocol};

use super::*;

const LOCAL: &str = "10.244.1.2:8080";
const REMOTE: &str = "10.244.2.2:8080";

fn port(build: impl FnOnce(&mut ServicePort)) -> ServicePort {
    let mut port = ServicePort {
        cluster_ip: "10.96.0.10".parse().unwrap(),
        port: 80,
        protocol: Protocol::Tcp,
        node_port: Some(30080),
        external_ips: vec!["203.0.113.5".parse().unwrap()],
        load_balancer_ips: vec!["203.0.113.9".parse().unwrap()],
        load_balancer_source_ranges: vec!["192.168.99.10/32".parse().unwrap()],
        session_affinity_timeout: None,
        external_policy_local: false,
        internal_policy_local: false,
        health_check_node_port: None,
        traffic_distribution: None,
        topology_mode: None,
    };
    build(&mut port);
    port
}

fn state(port: ServicePort) -> ServicePortState {
    let endpoints: Vec<Arc<Endpoint>> = [(LOCAL, true), (REMOTE, false)]
        .iter()
        .map(|(addr, is_local)| {
            let addr: SocketAddr = addr.parse().unwrap();
            Arc::new(Endpoint {
                ip: addr.ip(),
                port: addr.port(),
                ready: true,
                serving: true,
                terminating: false,
                is_local: *is_local,
                node_name: None,
                zone: None,
                zone_hints: None,
                node_hints: None,
            })
        })
        .collect();
    kp_sync::testing::planned(port, endpoints)
}

fn addrs(list: &[&str]) -> Vec<SocketAddr> {
    list.iter().map(|a| a.parse().unwrap()).collect()
}

fn at(text: &str) -> Option<SocketAddr> {
    Some(text.parse().unwrap())
}

fn client(text: &str) -> IpAddr {
    text.parse().unwrap()
}

#[test]
fn cluster_policy_sends_both_kinds_of_traffic_to_every_endpoint() {
    let route = Route::from_state(&state(port(|_| {})));
    assert_eq!(route.internal.to_vec(), addrs(&[LOCAL, REMOTE]));
    assert_eq!(route.external.to_vec(), addrs(&[LOCAL, REMOTE]));
    assert!(route.has_endpoints());
}

#[test]
fn external_traffic_policy_local_keeps_external_traffic_on_this_node() {
    let route = Route::from_state(&state(port(|p| p.external_policy_local = true)));
    assert_eq!(route.internal.to_vec(), addrs(&[LOCAL, REMOTE]));
    assert_eq!(route.external.to_vec(), addrs(&[LOCAL]));
}

#[test]
fn internal_traffic_policy_local_keeps_cluster_ip_traffic_on_this_node() {
    let route = Route::from_state(&state(port(|p| p.internal_policy_local = true)));
    assert_eq!(route.internal.to_vec(), addrs(&[LOCAL]));
    assert_eq!(route.external.to_vec(), addrs(&[LOCAL, REMOTE]));
}

#[test]
fn connections_are_classified_by_the_address_they_were_sent_to() {
    let route = Route::from_state(&state(port(|_| {})));
    let allowed = client("192.168.99.10");
    assert_eq!(
        route.classify(at("10.96.0.10:80"), allowed),
        Ok(TrafficKind::Internal)
    );
    assert_eq!(
        route.classify(at("192.168.99.2:30080"), allowed),
        Ok(TrafficKind::External)
    );
    assert_eq!(
        route.classify(at("203.0.113.5:80"), allowed),
        Ok(TrafficKind::External)
    );
    assert_eq!(
        route.classify(at("203.0.113.9:80"), allowed),
        Ok(TrafficKind::External)
    );
}

#[test]
fn connections_no_portal_rule_sent_are_refused() {
    let route = Route::from_state(&state(port(|_| {})));
    let anyone = client("192.168.99.10");
    for (destination, what) in [
        (None, "unknown to conntrack"),
        (at("192.168.99.2:41234"), "straight to the listener's port"),
        (at("10.96.0.10:81"), "the ClusterIP at another port"),
        (
            at("203.0.113.9:41234"),
            "the load balancer IP at another port",
        ),
        (at("203.0.113.5:8080"), "an external IP at another port"),
    ] {
        assert_eq!(
            route.classify(destination, anyone),
            Err(Denied::NotRedirected),
            "{what}"
        );
    }
    let test_route = Route::to_endpoints(&addrs(&[LOCAL]));
    assert_eq!(
        test_route.classify(None, anyone),
        Ok(TrafficKind::Internal),
        "a loopback test's route takes them"
    );
}

#[test]
fn load_balancer_source_ranges_turn_other_clients_away_from_the_load_balancer_ip_only() {
    let route = Route::from_state(&state(port(|_| {})));
    let outsider = client("192.168.99.11");
    assert_eq!(
        route.classify(at("203.0.113.9:80"), outsider),
        Err(Denied::SourceRange)
    );
    assert_eq!(
        route.classify(at("192.168.99.2:30080"), outsider),
        Ok(TrafficKind::External),
        "the NodePort is not filtered"
    );
    assert_eq!(
        route.classify(at("10.96.0.10:80"), outsider),
        Ok(TrafficKind::Internal)
    );
}

#[test]
fn a_source_range_holding_the_node_lets_the_load_balancer_ip_itself_connect() {
    // The builder's node is 192.168.99.2: outside 192.168.99.10/32, inside
    // 192.168.99.0/24.
    let lb_ip = client("203.0.113.9");
    let narrow = Route::from_state(&state(port(|_| {})));
    assert_eq!(
        narrow.classify(at("203.0.113.9:80"), lb_ip),
        Err(Denied::SourceRange)
    );
    let wide = Route::from_state(&state(port(|p| {
        p.load_balancer_source_ranges = vec!["192.168.99.0/24".parse().unwrap()];
    })));
    assert!(wide.source_ranges_admit_node);
    assert_eq!(
        wide.classify(at("203.0.113.9:80"), lb_ip),
        Ok(TrafficKind::External),
        "the node's own connection to a load balancer IP local to it"
    );
    assert_eq!(
        wide.classify(at("203.0.113.9:80"), client("198.51.100.7")),
        Err(Denied::SourceRange)
    );
}

#[test]
fn without_source_ranges_everyone_may_use_the_load_balancer_ip() {
    let route = Route::from_state(&state(port(|p| p.load_balancer_source_ranges.clear())));
    assert_eq!(
        route.classify(at("203.0.113.9:80"), client("198.51.100.7")),
        Ok(TrafficKind::External)
    );
}

#[test]
fn affinity_timeout_comes_from_the_service_port() {
    let timeout = std::time::Duration::from_secs(300);
    let route = Route::from_state(&state(port(|p| p.session_affinity_timeout = Some(timeout))));
    assert_eq!(route.affinity_timeout, Some(timeout));
}

#[test]
fn a_services_route_always_asks_for_the_original_destination() {
    let plain = Route::from_state(&state(port(|p| p.load_balancer_source_ranges.clear())));
    assert!(
        plain.needs_classification(),
        "only redirected connections are relayed"
    );
}

#[test]
fn a_loopback_route_asks_for_the_original_destination_only_when_it_decides_something() {
    let plain = Route::to_endpoints(&addrs(&[LOCAL]));
    assert!(
        !plain.needs_classification(),
        "same endpoints for all, no source ranges"
    );
    let ranges = Route {
        source_ranges: vec!["192.168.99.10/32".parse().unwrap()],
        ..plain.clone()
    };
    assert!(
        ranges.needs_classification(),
        "the source ranges need the destination"
    );
    let local = Route {
        external: Arc::from(addrs(&[LOCAL, REMOTE])),
        ..plain
    };
    assert!(
        local.needs_classification(),
        "external traffic has its own endpoints"
    );
}
