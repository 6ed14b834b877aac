//! `categorize_endpoints_with` and the `PreferSameTrafficDistribution` gate.
//!
//! Upstream (`pkg/proxy/topology.go`, v1.34) reads only the hints the
//! EndpointSlice controller wrote: with the gate on, node hints
//! (`PreferSameNode`) win over zone hints; with it off, node hints are
//! ignored and zone hints (`PreferClose`, `PreferSameZone`) still count.
//!
//! Address plan: this node is `node-1` in `zone-a`; 10.244.1.2 runs on it,
//! 10.244.2.2 on `node-2` (`zone-a`), 10.244.3.2 on `node-3` (`zone-b`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_model::{
    categorize_endpoints_with, endpoints_from_slices, service_ports_from_service, IpFamily,
    TopologyOptions,
};
use kp_testkit::builders::{endpoint_slice, service, EndpointSliceBuilder};
use pretty_assertions::assert_eq;

const NODE: &str = "node-1";

const GATE_ON: TopologyOptions = TopologyOptions {
    prefer_same_node_hints: true,
};
const GATE_OFF: TopologyOptions = TopologyOptions {
    prefer_same_node_hints: false,
};

/// The cluster endpoints of a Service with `distribution` and endpoints `slice`.
fn cluster_endpoints(
    distribution: &str,
    slice: fn(EndpointSliceBuilder) -> EndpointSliceBuilder,
    options: TopologyOptions,
) -> Vec<String> {
    let svc: Service = service("ns1", "svc1", |s| {
        s.cluster_ip("10.96.0.41")
            .port("p80", 80, "TCP")
            .traffic_distribution(distribution)
    });
    let slice: EndpointSlice = endpoint_slice("ns1", "svc1-abc", "svc1", |e| {
        slice(e.port("p80", 8080, "TCP"))
    });
    let (name, port) = service_ports_from_service(&svc, IpFamily::V4)
        .unwrap()
        .remove(0);
    let endpoints = endpoints_from_slices(&[slice], IpFamily::V4, NODE)
        .remove(&name)
        .unwrap();
    let labels = BTreeMap::from([(
        "topology.kubernetes.io/zone".to_owned(),
        "zone-a".to_owned(),
    )]);
    categorize_endpoints_with(&endpoints, &port, NODE, &labels, options)
        .cluster
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// What the EndpointSlice controller writes for `PreferSameNode`: a node
/// hint naming the endpoint's node and a zone hint naming its zone.
fn same_node_hints(e: EndpointSliceBuilder) -> EndpointSliceBuilder {
    e.endpoint("10.244.1.2", |ep| {
        ep.ready(true)
            .node("node-1")
            .hints_nodes(&["node-1"])
            .hints_zones(&["zone-a"])
    })
    .endpoint("10.244.2.2", |ep| {
        ep.ready(true)
            .node("node-2")
            .hints_nodes(&["node-2"])
            .hints_zones(&["zone-a"])
    })
    .endpoint("10.244.3.2", |ep| {
        ep.ready(true)
            .node("node-3")
            .hints_nodes(&["node-3"])
            .hints_zones(&["zone-b"])
    })
}

/// What the EndpointSlice controller writes for `PreferSameZone`: zone hints only.
fn same_zone_hints(e: EndpointSliceBuilder) -> EndpointSliceBuilder {
    e.endpoint("10.244.1.2", |ep| {
        ep.ready(true).node("node-1").hints_zones(&["zone-a"])
    })
    .endpoint("10.244.2.2", |ep| {
        ep.ready(true).node("node-2").hints_zones(&["zone-a"])
    })
    .endpoint("10.244.3.2", |ep| {
        ep.ready(true).node("node-3").hints_zones(&["zone-b"])
    })
}

/// Node hints without zone hints: a `PreferSameNode` slice whose endpoints
/// carry no zone (the controller writes only the hints it can).
fn node_hints_only(e: EndpointSliceBuilder) -> EndpointSliceBuilder {
    e.endpoint("10.244.1.2", |ep| {
        ep.ready(true).node("node-1").hints_nodes(&["node-1"])
    })
    .endpoint("10.244.2.2", |ep| {
        ep.ready(true).node("node-2").hints_nodes(&["node-2"])
    })
}

#[test]
fn with_the_gate_on_prefer_same_node_keeps_traffic_on_this_node() {
    assert_eq!(
        cluster_endpoints("PreferSameNode", same_node_hints, GATE_ON),
        ["10.244.1.2:8080"]
    );
}

#[test]
fn with_the_gate_off_prefer_same_node_falls_back_to_this_nodes_zone() {
    assert_eq!(
        cluster_endpoints("PreferSameNode", same_node_hints, GATE_OFF),
        ["10.244.1.2:8080", "10.244.2.2:8080"]
    );
}

#[test]
fn with_the_gate_off_node_hints_alone_narrow_nothing() {
    assert_eq!(
        cluster_endpoints("PreferSameNode", node_hints_only, GATE_ON),
        ["10.244.1.2:8080"]
    );
    assert_eq!(
        cluster_endpoints("PreferSameNode", node_hints_only, GATE_OFF),
        ["10.244.1.2:8080", "10.244.2.2:8080"]
    );
}

#[test]
fn prefer_same_zone_follows_the_zone_hints_whatever_the_gate() {
    // Upstream's proxy consults only the hints: the gate decides whether the
    // API server accepts PreferSameZone and the controller writes its
    // hints, not whether kube-proxy honours zone hints it finds.
    for options in [GATE_ON, GATE_OFF] {
        assert_eq!(
            cluster_endpoints("PreferSameZone", same_zone_hints, options),
            ["10.244.1.2:8080", "10.244.2.2:8080"],
            "{options:?}"
        );
    }
}

#[test]
fn the_default_options_are_the_v1_34_gate_default() {
    assert_eq!(TopologyOptions::default(), GATE_ON);
}
