//! Kernel tests of the data layout's statements (issue 26): the same
//! hand-built transaction (`tests/data_layout`) committed with `nft -f`
//! (its text) in one network namespace and over netlink (its values) in
//! another leaves tables that `nft list` prints alike; the listing loads
//! again with `nft -f` in a third namespace and lists the same. The
//! crate's read-back (`kp_nftables::live::read_table`) decodes what was
//! committed over netlink back to the values sent.
//!
//! Address plan: `tests/data_layout/mod.rs` (ClusterIP 10.96.0.12 and
//! fd00:10:96::c, endpoints 10.244.1.2–4 and fd00:10:244:1::2–4).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod data_layout;
mod kernel;

use std::path::PathBuf;

use data_layout::layout;
use kernel::require;
use kp_model::IpFamily;
use kp_nftables::live::{self, differences, kernel_form};
use kp_nftables::tracer::Table;
use kp_nftables::{Applier, NetlinkApplier, NftApplier, Transaction};
use kp_testkit::netns::Netns;

fn table_family(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

fn listing(namespace: &Netns, family: IpFamily) -> String {
    namespace.exec_ok(
        "nft",
        &["list", "table", table_family(family), "kube-proxy"],
    )
}

/// Commits `transaction` as text and over netlink, requires the two
/// listings to be equal, then loads the listing in a third namespace and
/// requires it to list the same. Returns the listing.
#[track_caller]
fn commit_both_and_reload(transaction: &Transaction) -> String {
    let family = transaction.family;
    let with_nft = Netns::create("dl-nft").unwrap();
    let with_netlink = Netns::create("dl-netlink").unwrap();
    let reloaded = Netns::create("dl-reload").unwrap();
    with_nft
        .run(|| NftApplier::new().apply(transaction))
        .unwrap_or_else(|e| panic!("nft -f: {e}"));
    with_netlink
        .run(|| NetlinkApplier::new().apply(transaction))
        .unwrap_or_else(|e| panic!("netlink: {e}"));
    let text = listing(&with_nft, family);
    pretty_assertions::assert_eq!(text, listing(&with_netlink, family));
    let file = listing_file(&text, family);
    reloaded.exec_ok("nft", &["-f", file.to_str().unwrap()]);
    let _ = std::fs::remove_file(&file);
    pretty_assertions::assert_eq!(text, listing(&reloaded, family), "the listing reloaded");
    text
}

fn listing_file(text: &str, family: IpFamily) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "kp-data-layout-{}-{}.nft",
        std::process::id(),
        table_family(family)
    ));
    std::fs::write(&path, text).unwrap();
    path
}

#[track_caller]
fn assert_lists(listing: &str, lines: &[&str]) {
    for line in lines {
        assert!(
            listing.lines().any(|listed| listed.trim() == *line),
            "`{line}` is not in the listing:\n{listing}"
        );
    }
}

#[test]
fn the_ipv4_data_layout_over_netlink_lists_as_nft_leaves_it_and_reloads() {
    require();
    let text = commit_both_and_reload(&layout(IpFamily::V4));
    // The listing is the layout's, not merely the same on both sides.
    assert_lists(
        &text,
        &[
            "typeof ip daddr . sctp dport . numgen random mod 1 : ip daddr . sctp dport",
            "typeof ip saddr . ip daddr",
            "ip saddr . ip daddr @hairpin-endpoints jump mark-for-masquerade",
            "ip daddr . meta l4proto . th dport @endpoint-count-3 dnat ip to ip daddr . tcp dport . numgen random mod 3 map @service-endpoints-tcp",
        ],
    );
}

#[test]
fn the_ipv6_data_layout_over_netlink_lists_as_nft_leaves_it_and_reloads() {
    require();
    let text = commit_both_and_reload(&layout(IpFamily::V6));
    assert_lists(
        &text,
        &[
            "typeof ip6 daddr . udp dport . numgen random mod 1 : ip6 daddr . udp dport",
            "typeof ip6 saddr . ip6 daddr",
            "ip6 saddr . ip6 daddr @hairpin-endpoints jump mark-for-masquerade",
            "ip6 daddr . meta l4proto . th dport @endpoint-count-1 dnat ip6 to ip6 daddr . sctp dport . numgen random mod 1 map @service-endpoints-sctp",
        ],
    );
}

/// Commits `transaction` over netlink, reads the table back and requires
/// it to be the replay of the same commands.
#[track_caller]
fn commit_and_read_back(transaction: Transaction) {
    let family = transaction.family;
    let namespace = Netns::create("dl-read").unwrap();
    namespace
        .run(|| NetlinkApplier::new().apply(&transaction))
        .unwrap_or_else(|e| panic!("netlink: {e}"));
    let read = namespace
        .run(|| live::read_table(family))
        .unwrap_or_else(|e| panic!("read-back: {e}"))
        .expect("the table exists");
    let mut replayed = Table::new();
    replayed.apply(&transaction).unwrap();
    let intended = kernel_form(&replayed);
    assert_eq!(differences(&intended, &read), Vec::<String>::new());
    pretty_assertions::assert_eq!(intended, read);
}

#[test]
fn the_ipv4_data_layout_reads_back_as_the_values_sent() {
    require();
    commit_and_read_back(layout(IpFamily::V4));
}

#[test]
fn the_ipv6_data_layout_reads_back_as_the_values_sent() {
    require();
    commit_and_read_back(layout(IpFamily::V6));
}

/// nft's own messages for the same text (its registers, set ids, the
/// dependencies it adds) read back as the same values too.
#[test]
fn the_data_layout_written_by_nft_reads_back_as_the_values_sent() {
    require();
    for family in [IpFamily::V4, IpFamily::V6] {
        let transaction = layout(family);
        let namespace = Netns::create("dl-read-nft").unwrap();
        namespace
            .run(|| NftApplier::new().apply(&transaction))
            .unwrap_or_else(|e| panic!("nft -f: {e}"));
        let read = namespace
            .run(|| live::read_table(family))
            .unwrap_or_else(|e| panic!("{family:?} read-back: {e}"))
            .expect("the table exists");
        let mut replayed = Table::new();
        replayed.apply(&transaction).unwrap();
        pretty_assertions::assert_eq!(kernel_form(&replayed), read, "{family:?}");
    }
}
