//! The sync loop reads topology hints with the proxier's feature gates
//! (`Proxier::with_topology`). The cast is in `common/mod.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_model::{IpFamily, TopologyOptions};
use kp_sync::testing::FakeBackend;
use kp_sync::Proxier;
use kp_testkit::builders::endpoint_slice;
use kp_testkit::plan::{NODE_NAME, OTHER_NODE_NAME};
use pretty_assertions::assert_eq;

/// web's endpoints as the controller writes them for `PreferSameNode` when
/// the nodes' zones are unknown: node hints only.
fn web_endpoints_hinted_per_node() -> EndpointSlice {
    endpoint_slice("ns1", "web-abc", "web", |e| {
        e.port("http", 8080, "TCP")
            .endpoint("10.244.1.2", |ep| {
                ep.ready(true).node(NODE_NAME).hints_nodes(&[NODE_NAME])
            })
            .endpoint("10.244.2.2", |ep| {
                ep.ready(true)
                    .node(OTHER_NODE_NAME)
                    .hints_nodes(&[OTHER_NODE_NAME])
            })
    })
}

/// The cluster endpoints of web:http after one sync.
fn web_cluster_endpoints(proxier: &Proxier, backend: &FakeBackend) -> Vec<String> {
    apply(proxier, &[web()], &[web_endpoints_hinted_per_node()]);
    sources_synced(proxier);
    proxier.sync_once().unwrap();
    let request = backend.take_single_request();
    let web = request.service_ports.values().next().unwrap();
    web.endpoints
        .cluster
        .iter()
        .map(|ep| ep.ip.to_string())
        .collect()
}

#[test]
fn by_default_node_hints_keep_web_on_this_node() {
    let (proxier, backend) = proxier(IpFamily::V4);
    assert_eq!(web_cluster_endpoints(&proxier, &backend), ["10.244.1.2"]);
}

#[test]
fn with_prefer_same_traffic_distribution_off_node_hints_are_ignored() {
    let (proxier, backend) = proxier(IpFamily::V4);
    let proxier = proxier.with_topology(TopologyOptions {
        prefer_same_node_hints: false,
    });
    assert_eq!(
        web_cluster_endpoints(&proxier, &backend),
        ["10.244.1.2", "10.244.2.2"]
    );
}
