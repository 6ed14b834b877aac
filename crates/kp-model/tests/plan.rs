//! `TrafficPlan`: where each kind of traffic to a service port goes, the
//! decisions every mode shares.
//!
//! Address plan: this node is `node-1`; 10.244.1.2 runs on it, 10.244.2.2 on
//! `node-2`. The ClusterIP is 10.96.0.41, the external IP 203.0.113.5, the
//! load balancer IP 203.0.113.9.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use kp_model::{
    categorize_endpoints, endpoints_from_slices, service_ports_from_service, CategorizedEndpoints,
    IpFamily, Refusal, TrafficPlan,
};
use kp_testkit::builders::{endpoint_slice, service, EndpointSliceBuilder, ServiceBuilder};
use pretty_assertions::assert_eq;

const NODE: &str = "node-1";

fn plan(
    build: impl FnOnce(ServiceBuilder) -> ServiceBuilder,
    endpoints: impl FnOnce(EndpointSliceBuilder) -> EndpointSliceBuilder,
) -> TrafficPlan {
    plan_on(None, build, endpoints).0
}

/// The plan and the categorized endpoints on a node at `node_ip`.
fn plan_on(
    node_ip: Option<&str>,
    build: impl FnOnce(ServiceBuilder) -> ServiceBuilder,
    endpoints: impl FnOnce(EndpointSliceBuilder) -> EndpointSliceBuilder,
) -> (TrafficPlan, CategorizedEndpoints) {
    let svc = service("ns1", "svc1", |s| {
        build(s.cluster_ip("10.96.0.41").port("p80", 80, "TCP"))
    });
    let slice = endpoint_slice("ns1", "svc1-abc", "svc1", |e| {
        endpoints(e.port("p80", 8080, "TCP"))
    });
    let (name, port) = service_ports_from_service(&svc, IpFamily::V4)
        .unwrap()
        .remove(0);
    let endpoints = endpoints_from_slices(&[slice], IpFamily::V4, NODE)
        .remove(&name)
        .unwrap_or_default();
    let categorized = categorize_endpoints(&endpoints, &port, NODE, &BTreeMap::new());
    let node_ip = node_ip.map(|ip| ip.parse().unwrap());
    (TrafficPlan::new(&port, &categorized, node_ip), categorized)
}

fn remote_only(e: EndpointSliceBuilder) -> EndpointSliceBuilder {
    e.endpoint("10.244.2.2", |ep| ep.ready(true).node("node-2"))
}

fn local_and_remote(e: EndpointSliceBuilder) -> EndpointSliceBuilder {
    remote_only(e).endpoint("10.244.1.2", |ep| ep.ready(true).node(NODE))
}

#[test]
fn a_cluster_ip_with_endpoints_balances_over_the_cluster_endpoints_only() {
    let plan = plan(|s| s, local_and_remote);
    assert!(plan.has_internal_endpoints && plan.has_external_endpoints);
    assert!(plan.uses_cluster_endpoints);
    assert!(!plan.uses_local_endpoints);
    assert!(!plan.externally_accessible && !plan.uses_external_path);
}

#[test]
fn without_endpoints_traffic_is_rejected() {
    let plan = plan(|s| s.node_port(30080).service_type("NodePort"), |e| e);
    assert!(!plan.has_endpoints);
    assert!(!plan.has_internal_endpoints && !plan.has_external_endpoints);
    assert!(!plan.uses_cluster_endpoints && !plan.uses_external_path);
    assert_eq!(plan.refusal(), Refusal::NoEndpoints);
}

#[test]
fn internal_policy_local_without_a_local_endpoint_drops_internal_traffic() {
    let plan = plan(|s| s.internal_traffic_policy_local(), remote_only);
    assert!(plan.has_endpoints);
    assert!(!plan.has_internal_endpoints);
    assert!(!plan.uses_cluster_endpoints && !plan.uses_local_endpoints);
    assert_eq!(plan.refusal(), Refusal::NoLocalEndpoints);
}

#[test]
fn external_policy_local_keeps_cluster_endpoints_for_pods_and_local_ones_for_outside() {
    let plan = plan(
        |s| {
            s.node_port(30080)
                .service_type("NodePort")
                .external_traffic_policy_local()
        },
        local_and_remote,
    );
    assert!(plan.external_policy_local);
    assert!(plan.uses_cluster_endpoints, "pods short-circuit to cluster");
    assert!(
        plan.uses_local_endpoints,
        "outside traffic stays on the node"
    );
    assert!(plan.uses_external_path);
}

#[test]
fn external_policy_local_without_local_endpoints_drops_only_external_traffic() {
    let plan = plan(
        |s| s.external_ip("203.0.113.5").external_traffic_policy_local(),
        remote_only,
    );
    assert!(plan.has_internal_endpoints);
    assert!(!plan.has_external_endpoints);
    assert_eq!(plan.refusal(), Refusal::NoLocalEndpoints);
}

#[test]
fn external_policy_local_means_nothing_without_an_external_address() {
    let plan = plan(|s| s.external_traffic_policy_local(), remote_only);
    assert!(!plan.external_policy_local);
    assert!(plan.has_external_endpoints);
}

#[test]
fn source_ranges_filter_load_balancer_traffic_only_when_there_are_endpoints() {
    let with_ranges = |s: ServiceBuilder| {
        s.service_type("LoadBalancer")
            .node_port(30080)
            .lb_ingress_ip("203.0.113.9")
            .lb_source_range("192.168.99.0/24")
    };
    assert!(plan(with_ranges, remote_only).uses_source_ranges_filter);
    assert!(!plan(with_ranges, |e| e).uses_source_ranges_filter);
    let without_ranges = |s: ServiceBuilder| {
        s.service_type("LoadBalancer")
            .node_port(30080)
            .lb_ingress_ip("203.0.113.9")
    };
    assert!(!plan(without_ranges, remote_only).uses_source_ranges_filter);
}

#[test]
fn a_source_range_holding_the_node_address_admits_the_node() {
    let with_range = |range: &'static str| {
        move |s: ServiceBuilder| {
            s.service_type("LoadBalancer")
                .node_port(30080)
                .lb_ingress_ip("203.0.113.9")
                .lb_source_range(range)
        }
    };
    let node = Some("192.168.99.2");
    let admits = |node, range| plan_on(node, with_range(range), remote_only).0;
    assert!(admits(node, "192.168.99.0/24").source_ranges_admit_node);
    assert!(!admits(node, "10.0.0.0/8").source_ranges_admit_node);
    assert!(
        !admits(None, "192.168.99.0/24").source_ranges_admit_node,
        "a node without an address of the family is in no range"
    );
    let without_ranges = plan_on(
        node,
        |s| s.service_type("LoadBalancer").lb_ingress_ip("203.0.113.9"),
        remote_only,
    );
    assert!(!without_ranges.0.source_ranges_admit_node);
}

#[test]
fn no_local_endpoints_counts_only_traffic_a_local_policy_leaves_without_endpoints() {
    let internal = plan(|s| s.internal_traffic_policy_local(), remote_only);
    assert!(internal.no_local_endpoints_internal());
    assert!(!internal.no_local_endpoints_external());
    let external = plan(
        |s| s.external_ip("203.0.113.5").external_traffic_policy_local(),
        remote_only,
    );
    assert!(!external.no_local_endpoints_internal());
    assert!(external.no_local_endpoints_external());
    // Without any endpoint the traffic is rejected, not dropped for want
    // of a local endpoint: upstream does not count it either.
    let none = plan(
        |s| {
            s.external_ip("203.0.113.5")
                .internal_traffic_policy_local()
                .external_traffic_policy_local()
        },
        |e| e,
    );
    assert!(!none.no_local_endpoints_internal() && !none.no_local_endpoints_external());
    let with_local = plan(
        |s| {
            s.external_ip("203.0.113.5")
                .internal_traffic_policy_local()
                .external_traffic_policy_local()
        },
        local_and_remote,
    );
    assert!(!with_local.no_local_endpoints_internal() && !with_local.no_local_endpoints_external());
}

#[test]
fn the_health_check_counts_ready_local_endpoints_not_terminating_ones() {
    let local_policy = |s: ServiceBuilder| {
        s.service_type("LoadBalancer")
            .node_port(30080)
            .lb_ingress_ip("203.0.113.9")
            .external_traffic_policy_local()
            .health_check_node_port(32000)
    };
    let (_, ready) = plan_on(None, local_policy, local_and_remote);
    assert_eq!(ready.local_ready, 1);
    let (plan, terminating) = plan_on(None, local_policy, |e| {
        e.endpoint("10.244.1.2", |ep| ep.terminating_serving().node(NODE))
            .endpoint("10.244.2.2", |ep| ep.ready(true).node("node-2"))
    });
    assert_eq!(terminating.local.len(), 1, "local traffic falls back to it");
    assert!(plan.has_external_endpoints);
    assert_eq!(
        terminating.local_ready, 0,
        "the load balancer drains the node"
    );
}
