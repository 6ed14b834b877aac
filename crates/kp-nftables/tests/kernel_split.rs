//! Kernel test: a full sync split into several transactions (a small bound
//! stands in for a large table) programs the real kernel, and the next one
//! rewrites the table in place.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web, http 80/TCP | ClusterIP 10.96.0.10, endpoint ep1 (then ep2), port 8080 |
//! | ns1/fill0 … fill39 | ClusterIPs 10.96.1.0 …, one endpoint each on node-2, 10.244.2.100 … (no host) |
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kernel;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use kernel::{at, build, pod_ip, require, three_pods, POD_TCP_PORT};
use kp_iptables::{LocalDetector, NodePortAddresses};
use kp_model::{IpFamily, NodeInfo, ServicePortName};
use kp_nftables::{NftablesBackend, NftablesOptions};
use kp_sync::testing::service;
use kp_sync::{Backend, ServicePortState, StaleConntrack, SyncRequest};
use kp_testkit::netns::connect;
use kp_testkit::plan;

fn services(web_endpoint: IpAddr) -> BTreeMap<ServicePortName, ServicePortState> {
    let mut all = BTreeMap::new();
    let (name, state) = service("ns1", "web", "10.96.0.10", 80)
        .local_endpoint(&web_endpoint.to_string(), POD_TCP_PORT)
        .build();
    all.insert(name, state);
    for n in 0..40 {
        let (name, state) = service("ns1", &format!("fill{n}"), &format!("10.96.1.{n}"), 80)
            .remote_endpoint(&format!("10.244.2.{}", 100 + n), POD_TCP_PORT)
            .build();
        all.insert(name, state);
    }
    all
}

#[test]
fn a_split_full_sync_programs_the_kernel_and_the_next_rewrites_it_in_place() {
    require();
    let topology = build(three_pods());
    let options = NftablesOptions {
        local_detector: LocalDetector::ClusterCidr(vec![plan::POD_CIDR.into()]),
        ..NftablesOptions::default()
    };
    let mut backend = NftablesBackend::system(IpFamily::V4, options, NodePortAddresses::All)
        .unwrap()
        .with_transaction_text_max(2_000);
    let node = NodeInfo {
        name: plan::NODE_NAME.to_owned(),
        addresses: vec![IpAddr::V4(plan::NODE_IP)],
        ..NodeInfo::default()
    };
    let stale = StaleConntrack::default();
    let none = BTreeSet::new();
    let mut sync = |service_ports: &BTreeMap<ServicePortName, ServicePortState>| {
        let request = SyncRequest {
            family: IpFamily::V4,
            full: true,
            service_ports,
            changed_services: &none,
            node: &node,
            stale_conntrack: &stale,
        };
        topology.node().run(|| backend.sync(&request)).unwrap()
    };
    let web = at("10.96.0.10", 80);

    sync(&services(pod_ip(&topology, "ep1")));
    assert_eq!(connect(topology.client(), web).unwrap().backend, "ep1");

    // Someone else's commit: the next full sync cannot trust its record
    // and rewrites the table (in pieces) instead of sending differences.
    topology
        .node()
        .exec_ok("nft", &["add", "table", "ip", "elsewhere"]);
    let rewrite = sync(&services(pod_ip(&topology, "ep2")));
    assert!(rewrite.rules_written_per_table[0].1 > 41, "{rewrite:?}");
    assert_eq!(connect(topology.client(), web).unwrap().backend, "ep2");
    let listing = topology
        .node()
        .exec_ok("nft", &["list", "table", "ip", "kube-proxy"]);
    let service_chains = listing
        .lines()
        .filter(|line| line.trim_start().starts_with("chain service-") && line.contains('/'))
        .count();
    assert_eq!(service_chains, 41, "{listing}");
    assert_eq!(listing.matches("goto service-").count(), 41, "{listing}");
}
