//! Kernel tests: the table over time. Endpoint changes are partial syncs
//! that keep established connections, a flush or deletion by someone else
//! is repaired by the periodic full sync, and cleanup removes both tables.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web, http 80/TCP | ClusterIP 10.96.0.10, NodePort 30080, endpoints ep1, ep2 |
//! | ns1/web6, http 80/TCP | ClusterIP fd00:10:96::10, endpoints ep1 |
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kernel;

use std::time::Duration;

use kernel::{at, build, pod_ip, pod_ip_v6, require, slice, three_pods, Proxy};
use kp_model::IpFamily;
use kp_nftables::Layout;
use kp_node::NodePortAddresses;
use kp_testkit::builders::service;
use kp_testkit::netns::{connect, hits, wait_until, TcpSession};

/// How long a test waits for the periodic sync (period: 1 s).
const REPAIR_DEADLINE: Duration = Duration::from_secs(5);

fn web() -> k8s_openapi::api::core::v1::Service {
    service("ns1", "web", |s| {
        s.service_type("NodePort")
            .cluster_ip("10.96.0.10")
            .port("http", 80, "TCP")
            .node_port(30080)
    })
}

#[test]
fn removing_the_endpoint_of_an_established_connection_keeps_it_and_moves_new_ones() {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start(&topology, IpFamily::V4);
    let both = ["ep1", "ep2"].map(|p| pod_ip(&topology, p));
    proxy.apply(&[web()], &[slice("web", &both, &[])]);
    proxy.sync();
    let mut session = TcpSession::open(topology.client(), at("10.96.0.10", 80)).unwrap();
    let used = session.backend().to_owned();
    let other = if used == "ep1" { "ep2" } else { "ep1" };

    // The endpoint the session uses goes away (its pod keeps running, as
    // a terminating pod does).
    proxy.apply(&[], &[slice("web", &[pod_ip(&topology, other)], &[])]);
    let outcome = proxy.sync();
    assert!(!outcome.full, "an endpoint change is a partial sync");

    let counts = hits(topology.client(), at("10.96.0.10", 80), 10);
    assert_eq!(counts.keys().collect::<Vec<_>>(), [&other]);
    let echo = session.echo("still here").unwrap();
    assert_eq!(
        (echo.backend.as_str(), echo.text.as_str()),
        (used.as_str(), "still here")
    );
}

#[test]
fn a_deleted_table_or_a_flushed_ruleset_is_repaired_by_the_next_periodic_sync() {
    damage_is_repaired_by_the_next_periodic_sync(Layout::Chains);
}

#[test]
fn a_deleted_table_or_a_flushed_ruleset_of_the_data_layout_is_repaired_by_the_next_periodic_sync() {
    damage_is_repaired_by_the_next_periodic_sync(Layout::Data);
}

fn damage_is_repaired_by_the_next_periodic_sync(layout: Layout) {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start_with_layout(
        &topology,
        IpFamily::V4,
        Duration::from_secs(1),
        NodePortAddresses::All,
        layout,
    );
    proxy.apply(&[web()], &[slice("web", &[pod_ip(&topology, "ep1")], &[])]);
    let _running = proxy.run_in_background();
    let works = || connect(topology.client(), at("10.96.0.10", 80)).is_ok();
    assert!(
        wait_until(REPAIR_DEADLINE, works),
        "the first sync programs the Service"
    );

    for damage in [
        &["flush", "table", "ip", "kube-proxy"][..],
        &["delete", "table", "ip", "kube-proxy"],
        &["flush", "ruleset"],
    ] {
        // The damage is checked in the kernel's listing right after it: a
        // traffic check would race the periodic sync (a connection attempt
        // that waits for an answer outlasts its 1 s period and is repaired
        // while it waits).
        proxy.nft(damage);
        let after_damage = proxy.nft(&["list", "ruleset"]);
        assert!(
            !after_damage.contains(" dnat "),
            "{damage:?} left the Service's rules:\n{after_damage}"
        );
        assert!(
            wait_until(REPAIR_DEADLINE, works),
            "{damage:?} is repaired:\n{}",
            proxy.nft(&["list", "ruleset"])
        );
    }
}

#[test]
fn a_partial_sync_on_a_deleted_table_fails_and_the_full_retry_repairs() {
    partial_sync_on_a_deleted_table_fails_and_the_full_retry_repairs(Layout::Chains);
}

/// The data layout's partial sync of a replaced endpoint is elements only,
/// and fails on a deleted table as well.
#[test]
fn a_partial_sync_of_the_data_layout_on_a_deleted_table_fails_and_the_full_retry_repairs() {
    partial_sync_on_a_deleted_table_fails_and_the_full_retry_repairs(Layout::Data);
}

fn partial_sync_on_a_deleted_table_fails_and_the_full_retry_repairs(layout: Layout) {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start_in(&topology, IpFamily::V4, layout);
    proxy.apply(&[web()], &[slice("web", &[pod_ip(&topology, "ep1")], &[])]);
    proxy.sync();
    proxy.nft(&["delete", "table", "ip", "kube-proxy"]);
    proxy.apply(&[], &[slice("web", &[pod_ip(&topology, "ep2")], &[])]);

    let failed = topology.node().run(|| proxy.proxier.sync_once());
    assert!(failed.is_err(), "the partial transaction meets no table");
    let retried = proxy.sync();
    assert!(retried.full, "the retry is a full sync");
    assert_eq!(
        connect(topology.client(), at("10.96.0.10", 80))
            .unwrap()
            .backend,
        "ep2"
    );
}

/// (The chains layout: its endpoint chains are what goes stale.)
#[test]
fn stale_chains_are_flushed_at_once_and_deleted_by_a_later_sync() {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start_in(&topology, IpFamily::V4, Layout::Chains);
    let both = ["ep1", "ep2"].map(|p| pod_ip(&topology, p));
    proxy.apply(&[web()], &[slice("web", &both, &[])]);
    proxy.sync();
    let endpoint_chains = |listing: &str| listing.matches("chain endpoint-").count();
    assert_eq!(endpoint_chains(&proxy.list()), 2);

    proxy.apply(&[], &[slice("web", &[both[0]], &[])]);
    proxy.sync();
    assert_eq!(
        endpoint_chains(&proxy.list()),
        2,
        "flushed, not yet deleted"
    );

    // A second later (kernels before 6.2 need the pause), any sync
    // deletes it.
    std::thread::sleep(kp_nftables::STALE_CHAIN_DELAY);
    proxy.apply(&[web()], &[]);
    proxy.sync();
    let listing = proxy.list();
    assert_eq!(endpoint_chains(&listing), 1, "{listing}");
}

#[test]
fn cleanup_removes_both_tables_and_leaves_foreign_ones() {
    require();
    let topology = build(three_pods());
    let v4 = Proxy::start(&topology, IpFamily::V4);
    v4.apply(&[web()], &[slice("web", &[pod_ip(&topology, "ep1")], &[])]);
    v4.sync();
    let v6 = Proxy::start(&topology, IpFamily::V6);
    v6.apply(
        &[service("ns1", "web6", |s| {
            s.ip_families(&["IPv6"])
                .cluster_ip("fd00:10:96::10")
                .port("http", 80, "TCP")
        })],
        &[slice("web6", &[pod_ip_v6(&topology, "ep1")], &[])],
    );
    v6.sync();
    v4.nft(&["add", "table", "inet", "foreign"]);
    let tables = v4.nft(&["list", "tables"]);
    assert!(tables.contains("ip kube-proxy") && tables.contains("ip6 kube-proxy"));

    topology.node().run(kp_nftables::cleanup).unwrap();

    let tables = v4.nft(&["list", "tables"]);
    assert!(!tables.contains("kube-proxy"), "{tables}");
    assert!(tables.contains("inet foreign"), "{tables}");
    // Again: nothing to remove is no error.
    topology.node().run(kp_nftables::cleanup).unwrap();
}
