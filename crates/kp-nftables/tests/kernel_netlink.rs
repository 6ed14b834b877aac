//! Kernel tests of the netlink applier: the same transactions committed
//! with `nft -f` in one namespace and over netlink in another leave tables
//! that `nft list` prints alike, and the proxy works end to end over
//! netlink.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kernel;

use std::path::PathBuf;

use kernel::require;
use kp_model::IpFamily;
use kp_nftables::{Applier, NetlinkApplier, NftApplier};
use kp_testkit::netns::Netns;

fn golden(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    std::fs::read_to_string(path).unwrap()
}

fn listing(namespace: &Netns, family: &str) -> String {
    namespace.exec_ok("nft", &["list", "table", family, "kube-proxy"])
}

#[track_caller]
fn commit_both(family: IpFamily, transactions: &[&str]) {
    let with_nft = Netns::create("nl-nft").unwrap();
    let with_netlink = Netns::create("nl-netlink").unwrap();
    for text in transactions {
        with_nft
            .run(|| NftApplier::new().apply(family, text))
            .unwrap();
        let result = with_netlink.run(|| NetlinkApplier::new().apply(family, text));
        result.unwrap_or_else(|e| panic!("netlink: {e}"));
    }
    let table = if family == IpFamily::V4 { "ip" } else { "ip6" };
    pretty_assertions::assert_eq!(listing(&with_nft, table), listing(&with_netlink, table));
}

#[test]
fn a_full_ipv4_transaction_leaves_the_same_table_as_nft() {
    require();
    commit_both(IpFamily::V4, &[&golden("full_v4.nft")]);
}

#[test]
fn a_partial_transaction_after_a_full_one_leaves_the_same_table_as_nft() {
    require();
    commit_both(
        IpFamily::V4,
        &[&golden("full_v4.nft"), &golden("partial_v4.nft")],
    );
}

#[test]
fn a_full_ipv6_transaction_leaves_the_same_table_as_nft() {
    require();
    commit_both(IpFamily::V6, &[&golden("full_v6.nft")]);
}

#[test]
fn a_rejected_transaction_names_its_line_and_changes_nothing() {
    require();
    let namespace = Netns::create("nl-reject").unwrap();
    let text = "add table ip kube-proxy\nadd chain ip kube-proxy a\nadd rule ip kube-proxy a goto missing\n";
    let error = namespace
        .run(|| NetlinkApplier::new().apply(IpFamily::V4, text))
        .unwrap_err();
    assert!(error.to_string().contains("line 3"), "{error}");
    let tables = namespace.exec_ok("nft", &["list", "tables"]);
    assert!(
        !tables.contains("kube-proxy"),
        "nothing committed: {tables}"
    );
}

#[test]
fn source_ranges_with_several_entries_and_interfaces_leave_the_same_table_as_nft() {
    require();
    let text = "add table ip kube-proxy\n\
        add chain ip kube-proxy mark-for-masquerade\n\
        add chain ip kube-proxy fw\n\
        add rule ip kube-proxy fw ip saddr != { 198.51.100.0/24, 203.0.113.9, 10.0.0.0/8 } drop\n\
        add rule ip kube-proxy fw iifname veth* jump mark-for-masquerade\n\
        add rule ip kube-proxy fw iifname != cbr0 jump mark-for-masquerade\n\
        add set ip kube-proxy affinity-x { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }\n\
        add rule ip kube-proxy fw ip saddr @affinity-x goto mark-for-masquerade\n\
        add rule ip kube-proxy fw update @affinity-x { ip saddr }\n\
        add rule ip kube-proxy fw meta l4proto udp dnat to 10.244.1.2:53\n";
    commit_both(IpFamily::V4, &[text]);
}
