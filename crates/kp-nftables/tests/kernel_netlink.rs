//! Kernel tests of the netlink applier: the same transactions committed
//! with `nft -f` (as text) in one namespace and over netlink (encoded from
//! the typed commands) in another leave tables that `nft list` prints
//! alike, which checks the encoder against nft's reading of the text; and
//! the proxy works end to end over netlink.
//!
//! The transactions are the renderer's own, for the golden worlds (their
//! text is checked against the golden files first), and hand-built ones
//! for the statements those worlds do not write.
//!
//! Address plan: as `tests/golden.rs` (ClusterIPs 10.96.0.0/16, pods
//! 10.244.0.0/16, load balancer and external IPs 203.0.113.0/24, IPv6
//! fd00:10:96::/112 and fd00:10:244::/48).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod kernel;

use std::path::PathBuf;
use std::sync::Arc;

use common::{service, World};
use kernel::require;
use kp_model::{IpFamily, Protocol};
use kp_nftables::model::{
    AddrField, Address, ChainKind, Command, Expr, Name, Rule, SetSpec, Verdict, IPV4,
};
use kp_nftables::{Applier, NetlinkApplier, NftApplier, Transaction};
use kp_node::NodePortAddresses;
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

/// The world of `tests/golden.rs`'s IPv4 files.
fn golden_world_v4() -> World {
    golden_world_v4_in(World::v4())
}

/// The same world in the data layout (the `data_` golden files).
fn golden_world_v4_data() -> World {
    golden_world_v4_in(World::v4_data())
}

fn golden_world_v4_in(mut world: World) -> World {
    world
        .put(
            service("ns1", "web", "10.96.0.10", 80)
                .local_endpoint("10.244.1.2", 8080)
                .remote_endpoint("10.244.2.2", 8080),
        )
        .put(
            service("ns1", "lb", "10.96.0.12", 80)
                .lb_ip("203.0.113.9")
                .source_range("198.51.100.0/24")
                .node_port(30081)
                .etp_local()
                .affinity_secs(300)
                .local_endpoint("10.244.1.4", 8080),
        )
        .put(service("ns1", "empty", "10.96.0.14", 80).external_ip("203.0.113.5"));
    world
}

/// The transactions `world`'s syncs committed so far.
fn committed(world: &World) -> Vec<Transaction> {
    world
        .applier
        .transactions()
        .into_iter()
        .map(|sent| sent.transaction)
        .collect()
}

#[track_caller]
fn commit_both(transactions: &[Transaction]) {
    let family = transactions[0].family;
    let with_nft = Netns::create("nl-nft").unwrap();
    let with_netlink = Netns::create("nl-netlink").unwrap();
    for transaction in transactions {
        with_nft
            .run(|| NftApplier::new().apply(transaction))
            .unwrap();
        let result = with_netlink.run(|| NetlinkApplier::new().apply(transaction));
        result.unwrap_or_else(|e| panic!("netlink: {e}"));
    }
    let table = if family == IpFamily::V4 { "ip" } else { "ip6" };
    pretty_assertions::assert_eq!(listing(&with_nft, table), listing(&with_netlink, table));
}

#[test]
fn a_full_ipv4_transaction_leaves_the_same_table_as_nft() {
    require();
    let mut world = golden_world_v4();
    let text = world.sync(true, &[]);
    pretty_assertions::assert_eq!(golden("full_v4.nft"), text);
    commit_both(&committed(&world));
}

#[test]
fn a_partial_transaction_after_a_full_one_leaves_the_same_table_as_nft() {
    require();
    let mut world = golden_world_v4();
    world.sync(true, &[]);
    world.put(
        service("ns1", "web", "10.96.0.10", 80)
            .local_endpoint("10.244.1.2", 8080)
            .remote_endpoint("10.244.2.3", 8080),
    );
    let text = world.sync(false, &[("ns1", "web")]);
    pretty_assertions::assert_eq!(golden("partial_v4.nft"), text);
    commit_both(&committed(&world));
}

#[test]
fn a_full_ipv6_transaction_leaves_the_same_table_as_nft() {
    require();
    let mut world = World::with(
        IpFamily::V6,
        NodePortAddresses::Select {
            cidrs: Vec::new(),
            primary: true,
        },
    );
    world.put(
        service("ns1", "web6", "fd00:10:96::10", 80)
            .node_port(30080)
            .local_endpoint("fd00:10:244:1::2", 8080),
    );
    let text = world.sync(true, &[]);
    pretty_assertions::assert_eq!(golden("full_v6.nft"), text);
    commit_both(&committed(&world));
}

#[test]
fn a_full_ipv4_transaction_of_the_data_layout_leaves_the_same_table_as_nft() {
    require();
    let mut world = golden_world_v4_data();
    let text = world.sync(true, &[]);
    pretty_assertions::assert_eq!(golden("data_full_v4.nft"), text);
    commit_both(&committed(&world));
}

/// The element-only partial transaction of the data layout, after the full
/// one, in both namespaces.
#[test]
fn a_partial_transaction_of_the_data_layout_leaves_the_same_table_as_nft() {
    require();
    let mut world = golden_world_v4_data();
    world.sync(true, &[]);
    world.put(
        service("ns1", "web", "10.96.0.10", 80)
            .local_endpoint("10.244.1.2", 8080)
            .remote_endpoint("10.244.2.3", 8080),
    );
    let text = world.sync(false, &[("ns1", "web")]);
    pretty_assertions::assert_eq!(golden("data_partial_v4.nft"), text);
    commit_both(&committed(&world));
}

#[test]
fn a_full_ipv6_transaction_of_the_data_layout_leaves_the_same_table_as_nft() {
    require();
    let mut world = World::with(
        IpFamily::V6,
        NodePortAddresses::Select {
            cidrs: Vec::new(),
            primary: true,
        },
    )
    .with_layout(kp_nftables::Layout::Data);
    world.put(
        service("ns1", "web6", "fd00:10:96::10", 80)
            .node_port(30080)
            .local_endpoint("fd00:10:244:1::2", 8080),
    );
    let text = world.sync(true, &[]);
    pretty_assertions::assert_eq!(golden("data_full_v6.nft"), text);
    commit_both(&committed(&world));
}

fn chain(name: &'static str) -> Command {
    Command::AddChain {
        name: Name::Fixed(name),
        kind: ChainKind::Regular,
    }
}

fn rule(chain: &'static str, exprs: Vec<Expr>) -> Command {
    Command::AddRule(Rule::new(chain, exprs))
}

#[test]
fn a_rejected_transaction_names_its_line_and_changes_nothing() {
    require();
    let namespace = Netns::create("nl-reject").unwrap();
    let transaction = Transaction {
        family: IpFamily::V4,
        commands: vec![
            Command::AddTable { comment: None },
            chain("a"),
            rule(
                "a",
                vec![Expr::Verdict(Verdict::Goto(Name::Fixed("missing")))],
            ),
        ],
    };
    let error = namespace
        .run(|| NetlinkApplier::new().apply(&transaction))
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
    let jump = || Expr::Verdict(Verdict::Jump(Name::Fixed("mark-for-masquerade")));
    let interface = |negate, name: &str, prefix| Expr::InputInterface {
        negate,
        name: Arc::from(name),
        prefix,
    };
    let transaction = Transaction {
        family: IpFamily::V4,
        commands: vec![
            Command::AddTable { comment: None },
            chain("mark-for-masquerade"),
            chain("fw"),
            rule(
                "fw",
                vec![
                    Expr::AddrNotIn {
                        field: AddrField::Source,
                        values: vec![
                            Address::Prefix("198.51.100.0/24".parse().unwrap()),
                            Address::Host("203.0.113.9".parse().unwrap()),
                            Address::Prefix("10.0.0.0/8".parse().unwrap()),
                        ],
                    },
                    Expr::Verdict(Verdict::Drop),
                ],
            ),
            rule("fw", vec![interface(false, "veth", true), jump()]),
            rule("fw", vec![interface(true, "cbr0", false), jump()]),
            Command::AddSet(SetSpec {
                name: Name::Fixed("affinity-x"),
                map: false,
                key: IPV4,
                verdicts: false,
                dynamic_timeout_secs: Some(10800),
                comment: None,
            }),
            rule(
                "fw",
                vec![
                    Expr::AddrInSet {
                        field: AddrField::Source,
                        set: Name::Fixed("affinity-x"),
                    },
                    Expr::Verdict(Verdict::Goto(Name::Fixed("mark-for-masquerade"))),
                ],
            ),
            rule("fw", vec![Expr::UpdateSourceSet(Name::Fixed("affinity-x"))]),
            rule(
                "fw",
                vec![
                    Expr::L4Proto(Protocol::Udp),
                    Expr::Dnat("10.244.1.2:53".parse().unwrap()),
                ],
            ),
        ],
    };
    assert_eq!(
        transaction.to_string(),
        "add table ip kube-proxy\n\
        add chain ip kube-proxy mark-for-masquerade\n\
        add chain ip kube-proxy fw\n\
        add rule ip kube-proxy fw ip saddr != { 198.51.100.0/24, 203.0.113.9, 10.0.0.0/8 } drop\n\
        add rule ip kube-proxy fw iifname veth* jump mark-for-masquerade\n\
        add rule ip kube-proxy fw iifname != cbr0 jump mark-for-masquerade\n\
        add set ip kube-proxy affinity-x { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }\n\
        add rule ip kube-proxy fw ip saddr @affinity-x goto mark-for-masquerade\n\
        add rule ip kube-proxy fw update @affinity-x { ip saddr }\n\
        add rule ip kube-proxy fw meta l4proto udp dnat to 10.244.1.2:53\n"
    );
    commit_both(&[transaction]);
}
