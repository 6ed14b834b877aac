//! Kernel test: a periodic full sync of a table nobody else touched sends
//! only what differs from what the proxy committed (every rule keeps its
//! handle), also after other programs committed to their own tables; one
//! after someone else changed the table rewrites it, which also removes a
//! rule someone added to a chain of ours.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web, http 80/TCP | ClusterIP 10.96.0.10, endpoint ep1 (then ep2), port 8080 |
//! | ns1/fill0 … fill19 | ClusterIPs 10.96.1.0 …, one endpoint each on node-2 (no host) |
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod kernel;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use kernel::{
    at, build, netlink_backend_v4, node_v4, pod_ip, require, sync_backend, three_pods,
    web_and_fillers, POD_TCP_PORT,
};
use kp_model::{IpFamily, NodeInfo, ServicePortName};
use kp_nftables::{NftablesBackend, NftablesOptions};
use kp_node::{LocalDetector, NodePortAddresses};
use kp_sync::testing::service;
use kp_sync::ServicePortState;
use kp_testkit::netns::connect;
use kp_testkit::plan;

/// The rules of the table with their handles (`nft -a`), sorted.
fn rules_with_handles(listing: &str) -> Vec<String> {
    let mut rules: Vec<String> = listing
        .lines()
        .map(str::trim)
        .filter(|line| {
            line.contains("# handle") && !line.starts_with("chain ") && !line.starts_with("table ")
        })
        .map(str::to_owned)
        .collect();
    rules.sort();
    rules
}

#[test]
fn a_full_sync_of_an_untouched_table_rewrites_nothing_and_one_after_a_foreign_commit_repairs() {
    require();
    let topology = build(three_pods());
    let mut backend = netlink_backend_v4();
    let node = node_v4();
    let mut full_sync = |service_ports: &BTreeMap<ServicePortName, ServicePortState>| {
        sync_backend(
            &topology,
            &mut backend,
            IpFamily::V4,
            &node,
            service_ports,
            true,
        )
    };
    let list = || {
        topology
            .node()
            .exec_ok("nft", &["-a", "list", "table", "ip", "kube-proxy"])
    };
    let web = at("10.96.0.10", 80);
    let ep1 = web_and_fillers(pod_ip(&topology, "ep1"), 20);

    full_sync(&ep1);
    assert_eq!(connect(topology.client(), web).unwrap().backend, "ep1");
    let before = rules_with_handles(&list());
    assert!(before.len() > 40, "{before:?}");

    // Nothing changed, nobody else committed: no rule is rewritten (a
    // rewritten rule gets a new handle).
    let untouched = full_sync(&ep1);
    assert!(untouched.full);
    assert_eq!(untouched.rules_written_per_table[0].1, 0, "{untouched:?}");
    assert_eq!(rules_with_handles(&list()), before);

    // web moves to ep2: only its chains are rewritten.
    let ep2 = web_and_fillers(pod_ip(&topology, "ep2"), 20);
    let moved = full_sync(&ep2);
    let written = moved.rules_written_per_table[0].1;
    assert!(written > 0 && written < 10, "{moved:?}");
    assert_eq!(connect(topology.client(), web).unwrap().backend, "ep2");

    // Another program commits to tables of its own: the proxy's watch saw
    // those commits leave its table alone, so nothing is rewritten.
    topology
        .node()
        .exec_ok("nft", &["add", "table", "ip", "other"]);
    topology
        .node()
        .exec_ok("nft", &["add", "chain", "ip", "other", "input"]);
    topology
        .node()
        .exec_ok("nft", &["add", "rule", "ip", "other", "input", "accept"]);
    topology
        .node()
        .exec_ok("nft", &["add", "table", "ip6", "kube-proxy"]);
    let elsewhere = full_sync(&ep2);
    assert_eq!(elsewhere.rules_written_per_table[0].1, 0, "{elsewhere:?}");
    assert_eq!(connect(topology.client(), web).unwrap().backend, "ep2");

    // Someone adds a rule to a chain of ours: the watch saw the change,
    // so the next full sync rewrites the table, without it.
    let listing = list();
    let chain = listing
        .lines()
        .map(str::trim)
        .find_map(|line| line.strip_prefix("chain service-"))
        .and_then(|rest| rest.split_whitespace().next())
        .map(|rest| format!("service-{rest}"))
        .unwrap();
    topology.node().exec_ok(
        "nft",
        &["insert", "rule", "ip", "kube-proxy", &chain, "drop"],
    );
    let foreign = |listing: &str| {
        listing
            .lines()
            .any(|line| line.trim().starts_with("drop # handle"))
    };
    assert!(
        foreign(&list()),
        "the foreign rule is in place:\n{}",
        list()
    );
    let repaired = full_sync(&ep2);
    assert!(repaired.rules_written_per_table[0].1 > 40, "{repaired:?}");
    assert!(!foreign(&list()), "the foreign rule is gone:\n{}", list());
    assert_eq!(connect(topology.client(), web).unwrap().backend, "ep2");

    // And the proxy trusts the table again.
    let again = full_sync(&ep2);
    assert_eq!(again.rules_written_per_table[0].1, 0, "{again:?}");
}

/// The first sync of a table too large for one transaction is split
/// (here, every few Services): the table it leaves is trusted as a whole,
/// so the next full sync rewrites nothing, in either layout.
fn a_split_first_sync_leaves_a_trusted_table(layout: kp_nftables::Layout) {
    require();
    let topology = build(three_pods());
    let mut backend = netlink_backend_v4()
        .with_layout(layout)
        .with_transaction_text_max(2_000);
    let node = node_v4();
    let ports = web_and_fillers(pod_ip(&topology, "ep1"), 40);
    let first = sync_backend(&topology, &mut backend, IpFamily::V4, &node, &ports, true);
    assert!(first.rules_written_per_table[0].1 > 40, "{first:?}");
    let again = sync_backend(&topology, &mut backend, IpFamily::V4, &node, &ports, true);
    assert!(again.full);
    assert_eq!(again.rules_written_per_table[0].1, 0, "{again:?}");
    let web = at("10.96.0.10", 80);
    assert_eq!(connect(topology.client(), web).unwrap().backend, "ep1");
    // An endpoint change in a partial sync keeps the table trusted too.
    let moved = web_and_fillers(pod_ip(&topology, "ep2"), 40);
    let changed = BTreeSet::from([kp_model::NamespacedName::new("ns1", "web")]);
    let stale = kp_sync::StaleConntrack::default();
    let partial = kp_sync::SyncRequest {
        family: IpFamily::V4,
        full: false,
        service_ports: &moved,
        changed_services: &changed,
        node: &node,
        stale_conntrack: &stale,
    };
    let outcome = topology
        .node()
        .run(|| kp_sync::Backend::sync(&mut backend, &partial))
        .unwrap();
    assert!(!outcome.full, "{outcome:?}");
    assert_eq!(connect(topology.client(), web).unwrap().backend, "ep2");
    let after = sync_backend(&topology, &mut backend, IpFamily::V4, &node, &moved, true);
    assert_eq!(after.rules_written_per_table[0].1, 0, "{after:?}");
}

in_both_layouts!(a_split_first_sync_leaves_a_trusted_table);

#[test]
fn the_two_families_do_not_take_each_others_commits_for_someone_elses() {
    require();
    let topology = build(three_pods());
    let ruleset = kp_nftables::generation::SharedRuleset::default();
    let backend = |family| {
        let options = NftablesOptions {
            local_detector: LocalDetector::ClusterCidr(vec![
                plan::POD_CIDR.into(),
                plan::POD_CIDR_V6.into(),
            ]),
            ..NftablesOptions::default()
        };
        NftablesBackend::system(family, options, NodePortAddresses::All)
            .unwrap()
            .with_layout(kp_nftables::Layout::Chains)
            .with_shared_ruleset(ruleset.clone())
    };
    let mut v4 = backend(IpFamily::V4);
    let mut v6 = backend(IpFamily::V6);
    let node = NodeInfo {
        name: plan::NODE_NAME.to_owned(),
        addresses: vec![IpAddr::V4(plan::NODE_IP), IpAddr::V6(plan::NODE_IP_V6)],
        ..NodeInfo::default()
    };
    let one = |cluster_ip: &str, endpoint: &str| {
        let (name, state) = service("ns1", "web", cluster_ip, 80)
            .remote_endpoint(endpoint, POD_TCP_PORT)
            .build();
        BTreeMap::from([(name, state)])
    };
    let ports_v4 = one("10.96.0.10", "10.244.2.2");
    let ports_v6 = one("fd00:10:96::10", "fd00:10:244:2::2");
    let sync = |backend: &mut NftablesBackend,
                family: IpFamily,
                service_ports: &BTreeMap<ServicePortName, ServicePortState>,
                full: bool| {
        sync_backend(&topology, backend, family, &node, service_ports, full).rules_written_per_table
            [0]
        .1
    };
    assert!(sync(&mut v4, IpFamily::V4, &ports_v4, true) > 0);
    assert!(sync(&mut v6, IpFamily::V6, &ports_v6, true) > 0);
    // Each family's commits moved the generation on; the other knows them
    // for the process's own.
    assert_eq!(sync(&mut v4, IpFamily::V4, &ports_v4, true), 0);
    assert_eq!(sync(&mut v6, IpFamily::V6, &ports_v6, true), 0);
    let moved_v4 = one("10.96.0.10", "10.244.2.3");
    assert!(sync(&mut v4, IpFamily::V4, &moved_v4, true) > 0);
    assert_eq!(sync(&mut v6, IpFamily::V6, &ports_v6, true), 0);
    assert_eq!(sync(&mut v4, IpFamily::V4, &moved_v4, true), 0);
}
