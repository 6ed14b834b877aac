//! `TrafficPlan`: where each kind of traffic to a service port goes, the
//! decisions every mode shares.
//!
//! Address plan: this node is `node-1`; 10.244.1.2 runs on it, 10.244.2.2 on
//! `node-2`. The ClusterIP is 10.96.0.41, the external IP 203.0.113.5, the
//! load balancer IP 203.0.113.9.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use kp_model::{
    categorize_endpoints, endpoints_from_slices, service_ports_from_service, IpFamily, Refusal,
    TrafficPlan,
};
use kp_testkit::builders::{endpoint_slice, service, EndpointSliceBuilder, ServiceBuilder};
use pretty_assertions::assert_eq;

const NODE: &str = "node-1";

fn plan(
    build: impl FnOnce(ServiceBuilder) -> ServiceBuilder,
    endpoints: impl FnOnce(EndpointSliceBuilder) -> EndpointSliceBuilder,
) -> TrafficPlan {
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
    TrafficPlan::new(&port, &categorized)
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
