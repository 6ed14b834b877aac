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

use std::collections::BTreeMap;

use kernel::{
    at, build, netlink_backend_v4, node_v4, pod_ip, require, sync_backend, three_pods,
    web_and_fillers,
};
use kp_model::{IpFamily, ServicePortName};
use kp_nftables::Layout;
use kp_sync::ServicePortState;
use kp_testkit::netns::connect;

#[test]
fn a_split_full_sync_programs_the_kernel_and_the_next_rewrites_it_in_place() {
    split_full_syncs_program_the_kernel(Layout::Chains);
}

/// The same in the data layout: the transactions ahead of the last declare
/// the endpoint maps their draw rules name.
#[test]
fn a_split_full_sync_of_the_data_layout_programs_the_kernel_and_the_next_rewrites_it_in_place() {
    split_full_syncs_program_the_kernel(Layout::Data);
}

fn split_full_syncs_program_the_kernel(layout: Layout) {
    require();
    let topology = build(three_pods());
    let mut backend = netlink_backend_v4()
        .with_layout(layout)
        .with_transaction_text_max(2_000);
    let node = node_v4();
    let mut sync = |service_ports: &BTreeMap<ServicePortName, ServicePortState>| {
        sync_backend(
            &topology,
            &mut backend,
            IpFamily::V4,
            &node,
            service_ports,
            true,
        )
    };
    let web = at("10.96.0.10", 80);

    sync(&web_and_fillers(pod_ip(&topology, "ep1"), 40));
    assert_eq!(connect(topology.client(), web).unwrap().backend, "ep1");

    // Someone else's commits to the proxy's table: the next full sync
    // cannot trust its record and rewrites the table (in pieces) instead
    // of sending differences.
    for verb in ["add", "delete"] {
        topology
            .node()
            .exec_ok("nft", &[verb, "chain", "ip", "kube-proxy", "elsewhere"]);
    }
    let rewrite = sync(&web_and_fillers(pod_ip(&topology, "ep2"), 40));
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
