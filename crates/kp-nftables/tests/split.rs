//! A full sync split into several transactions (a large table): each
//! transaction leaves a table in which every Service behaves either as
//! before the sync or as after it, never half-way.
//!
//! Address plan: Services `ns1/sN` at ClusterIP 10.96.0.(10+N):80, their
//! endpoints on node-2 at 10.244.2.(10+N):8080 (moved ones at
//! 10.244.2.(110+N)); the client is pod 10.244.1.7 of this node.
//!
//! In the data layout a Service whose endpoint count changes meanwhile is
//! not covered: its draw rule is rewritten with its chain, ahead of the
//! slots it draws, which come with the last transaction.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;

use common::{assert_goes_to, at, service, World};
use kp_nftables::tracer::Verdict;

const POD: &str = "10.244.1.7";

fn cluster_ip(n: u8) -> String {
    format!("10.96.0.{}", 10 + n)
}

fn put(world: &mut World, n: u8, endpoint: Option<u8>) {
    let mut builder = service("ns1", &format!("s{n}"), &cluster_ip(n), 80);
    if let Some(last) = endpoint {
        builder = builder.remote_endpoint(&format!("10.244.2.{last}"), 8080);
    }
    world.put(builder);
}

/// What a connection to Service `n` meets now.
fn verdict(world: &World, n: u8) -> Verdict {
    world.trace(POD, at(&cluster_ip(n), 80))
}

fn dnat(last: u8) -> Verdict {
    Verdict::Dnat {
        endpoints: BTreeSet::from([at(&format!("10.244.2.{last}"), 8080)]),
        masquerade: BTreeSet::new(),
    }
}

#[test]
fn every_transaction_of_a_split_full_sync_leaves_each_service_old_or_new() {
    // A bound of a few hundred bytes: about one Service per transaction.
    each_transaction_leaves_each_service_old_or_new(World::v4().split_at(400));
}

/// The same in the data layout, whose Service chains go to the class
/// chains: each transaction ahead of the last declares them. Its Service
/// chains are shorter (no endpoint chains), so the bound is lower.
#[test]
fn every_transaction_of_a_split_full_sync_in_the_data_layout_leaves_each_service_old_or_new() {
    each_transaction_leaves_each_service_old_or_new(World::v4_data().split_at(150));
}

fn each_transaction_leaves_each_service_old_or_new(mut world: World) {
    for n in 0..6 {
        put(&mut world, n, Some(10 + n));
    }
    let first = world.applier.transactions().len();
    world.sync(true, &[]);
    let sent = world.applier.transactions().len() - first;
    assert!(sent > 3, "the first sync is split: {sent} transactions");
    for n in 0..6 {
        assert_goes_to(
            &verdict(&world, n),
            &[at(&format!("10.244.2.{}", 10 + n), 8080)],
        );
    }

    // Meanwhile: s0's endpoint moves, s1 loses its endpoints, s2 is
    // removed, s6 is new.
    put(&mut world, 0, Some(110));
    put(&mut world, 1, None);
    world.remove("ns1", "s2");
    put(&mut world, 6, Some(16));
    let old = |n: u8| match n {
        6 => Verdict::Accept,
        n => dnat(10 + n),
    };
    let new = |n: u8| match n {
        0 => dnat(110),
        1 => Verdict::Reject,
        2 => Verdict::Accept,
        n => dnat(10 + n),
    };

    let before = world.applier.transactions().len();
    let outcome = world.try_sync(true, &BTreeSet::new()).unwrap();
    assert!(outcome.full);
    let transactions = world.applier.transactions().split_off(before);
    assert!(
        transactions.len() > 3,
        "{} transactions",
        transactions.len()
    );
    for (i, transaction) in transactions.iter().enumerate() {
        assert!(
            !transaction.text.contains("delete table"),
            "a split sync rewrites in place"
        );
        world.table.apply(&transaction.transaction).unwrap();
        for n in 0..7 {
            let seen = verdict(&world, n);
            assert!(
                seen == old(n) || seen == new(n),
                "after transaction {i}, s{n} meets {seen:?}:\n{}",
                transaction.text
            );
        }
    }
    for n in 0..7 {
        assert_eq!(verdict(&world, n), new(n), "s{n} at the end");
    }
    let last = &transactions[transactions.len() - 1].text;
    assert!(
        last.contains("flush map ip kube-proxy service-ips"),
        "{last}"
    );
    assert!(
        transactions[..transactions.len() - 1]
            .iter()
            .all(|t| !t.text.contains("element")),
        "elements change only in the last transaction"
    );
}

#[test]
fn a_failed_piece_makes_the_next_sync_one_transaction_that_deletes_the_table() {
    let mut world = World::v4().split_at(400);
    for n in 0..6 {
        put(&mut world, n, Some(10 + n));
    }
    world.sync(true, &[]);
    world.advance(std::time::Duration::from_secs(2));

    // The second transaction of the periodic full sync fails.
    let before = world.applier.transactions().len();
    world.applier.fail_after(1, 1);
    let error = world.try_sync(true, &BTreeSet::new()).unwrap_err();
    assert!(error.to_string().contains("nftables"), "{error}");
    assert_eq!(
        world.applier.transactions().len() - before,
        2,
        "nothing is sent after the failed piece"
    );

    let before = world.applier.transactions().len();
    let retry = world.try_sync(false, &BTreeSet::new()).unwrap();
    assert!(retry.full);
    let transactions = world.applier.transactions().split_off(before);
    assert_eq!(transactions.len(), 1, "one transaction repairs");
    assert!(transactions[0]
        .text
        .starts_with("add table ip kube-proxy\ndelete table ip kube-proxy\n"));
    world.table.apply(&transactions[0].transaction).unwrap();
    for n in 0..6 {
        assert_eq!(verdict(&world, n), dnat(10 + n));
    }
}
