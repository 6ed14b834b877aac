//! Full and partial renders over time: a partial render applied on top of
//! the previous state must leave the kernel exactly as a full render would.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;

use common::{namespaced, service, World};
use kp_iptables::tracer::Ruleset;
use kp_iptables::{stale_chains, Renderer, Table, LARGE_CLUSTER_ENDPOINTS_THRESHOLD};

fn two_services() -> World {
    World::v4()
        .with(service("ns1", "svc1", "10.96.0.41", 80).remote_endpoint("10.244.2.3", 80))
        .with(
            service("ns2", "svc2", "10.96.0.42", 80)
                .node_port(30042)
                .remote_endpoint("10.244.2.4", 80)
                .remote_endpoint("10.244.2.5", 80),
        )
}

fn nat_chains(ruleset: &Ruleset) -> Vec<String> {
    ruleset
        .chains(Table::Nat)
        .into_iter()
        .map(str::to_owned)
        .collect()
}

#[test]
fn partial_render_after_an_endpoint_change_equals_a_full_render() {
    let before = two_services();
    let mut renderer = Renderer::new(before.options.clone()).unwrap();
    let mut kernel = Ruleset::from_restore(
        &before
            .render_with(&mut renderer, true, &BTreeSet::new(), None)
            .restore,
    )
    .unwrap();

    // ns2/svc2 loses 10.244.2.5 and gains 10.244.1.7.
    let after = World::v4()
        .with(service("ns1", "svc1", "10.96.0.41", 80).remote_endpoint("10.244.2.3", 80))
        .with(
            service("ns2", "svc2", "10.96.0.42", 80)
                .node_port(30042)
                .remote_endpoint("10.244.2.4", 80)
                .local_endpoint("10.244.1.7", 80),
        );
    let changed = BTreeSet::from([namespaced("ns2", "svc2")]);
    let existing = nat_chains(&kernel);
    let partial = after.render_with(&mut renderer, false, &changed, Some(&existing));
    assert!(
        !partial
            .restore
            .contains("KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]"),
        "ns1/svc1 untouched"
    );
    assert_eq!(
        partial.deleted_chains.len(),
        1,
        "the SEP chain of 10.244.2.5"
    );
    kernel.apply(&partial.restore).unwrap();

    let fresh = Ruleset::from_restore(&after.render().restore).unwrap();
    assert_eq!(kernel, fresh);
}

#[test]
fn deleting_a_service_removes_its_chains() {
    let before = two_services();
    let mut renderer = Renderer::new(before.options.clone()).unwrap();
    let mut kernel = Ruleset::from_restore(
        &before
            .render_with(&mut renderer, true, &BTreeSet::new(), None)
            .restore,
    )
    .unwrap();

    let after = World::v4()
        .with(service("ns1", "svc1", "10.96.0.41", 80).remote_endpoint("10.244.2.3", 80));
    let existing = nat_chains(&kernel);
    let changed = BTreeSet::from([namespaced("ns2", "svc2")]);
    let partial = after.render_with(&mut renderer, false, &changed, Some(&existing));
    assert_eq!(
        partial.stats.deleted_chains, 4,
        "SVC, EXT and two SEP chains"
    );
    kernel.apply(&partial.restore).unwrap();
    assert_eq!(
        kernel,
        Ruleset::from_restore(&after.render().restore).unwrap()
    );
}

#[test]
fn partial_render_counts_the_rules_it_leaves_alone() {
    let world = two_services();
    let full = world.render();
    let mut renderer = Renderer::new(world.options.clone()).unwrap();
    let partial = world.render_with(&mut renderer, false, &BTreeSet::new(), None);
    assert!(partial.stats.nat_rules < full.stats.nat_rules);
    assert_eq!(partial.stats.nat_rules_total, full.stats.nat_rules);
    assert_eq!(partial.active_nat_chains, full.active_nat_chains);
    assert_eq!(partial.stats.filter_rules, full.stats.filter_rules);
}

#[test]
fn rendering_is_deterministic_across_renderers_and_syncs() {
    let world = two_services();
    let mut renderer = Renderer::new(world.options.clone()).unwrap();
    let first = world.render_with(&mut renderer, true, &BTreeSet::new(), None);
    let second = world.render_with(&mut renderer, true, &BTreeSet::new(), None);
    assert_eq!(first, second);
    assert_eq!(first, world.render());
}

#[test]
fn stale_chains_are_only_unused_service_chains() {
    let rendered = two_services().render();
    let mut existing: Vec<String> = rendered
        .active_nat_chains
        .iter()
        .map(ToString::to_string)
        .collect();
    existing.extend(
        [
            "KUBE-SERVICES",
            "KUBE-MARK-MASQ",
            "KUBE-SVC-AAAAAAAAAAAAAAAA",
            "KUBE-FW-odd",
            "DOCKER",
        ]
        .map(String::from),
    );
    assert_eq!(
        stale_chains(&existing, &rendered),
        ["KUBE-SVC-AAAAAAAAAAAAAAAA", "KUBE-FW-odd"]
    );
}

#[test]
fn large_clusters_drop_per_endpoint_comments() {
    let mut world = World::v4();
    for i in 0..=LARGE_CLUSTER_ENDPOINTS_THRESHOLD / 2 {
        let (a, b) = (i / 250, i % 250);
        world = world.with(
            service("big", &format!("svc{i}"), &format!("10.96.{a}.{b}"), 80)
                .remote_endpoint(&format!("10.244.{}.{b}", 10 + a), 80)
                .remote_endpoint(&format!("10.244.{}.{b}", 20 + a), 80),
        );
    }
    let rendered = world.render();
    assert!(rendered.large_cluster_mode);
    assert!(
        !rendered.restore.contains(" -> "),
        "no per-endpoint comments"
    );
    assert!(
        rendered.restore.contains("\"big/svc0:p80 cluster IP\""),
        "service comments stay"
    );
    common::ruleset(&rendered);
}
