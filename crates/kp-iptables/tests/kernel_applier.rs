//! Kernel tests of the system applier: restores as large as a cluster of
//! thousands of Services makes (enough chains for the nft applier to add
//! its whole-table listing) apply without touching other owners' chains, a
//! rejected line is reported by its number in the input the backend
//! rendered, and a table listing finds the jump rules the applier inserted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kernel;

use kernel::require;
use kp_iptables::applier::{Applier, ApplyError, Tool};
use std::collections::{BTreeMap, BTreeSet};

use kp_iptables::{
    IptablesBackend, IptablesFlavor, IptablesOptions, JumpRule, NodePortAddresses, SystemApplier,
    Table, JUMP_RULES,
};
use kp_model::{IpFamily, NodeInfo};
use kp_sync::testing::service;
use kp_sync::{Backend, BackendError, StaleConntrack, SyncRequest};
use kp_testkit::netns::Netns;

on_both_flavors!(
    a_restore_of_thousands_of_chains_keeps_foreign_chains,
    a_rejected_line_of_a_large_restore_is_named_by_its_input_line,
    a_listing_finds_every_jump_rule_a_restore_inserted,
    a_large_first_restore_on_a_fresh_host_inserts_the_jump_rules,
    a_line_rejected_in_a_streamed_full_sync_is_named_and_nothing_is_applied,
);

const CHAINS: usize = 1500;

/// A filter section with one chain and a nat section with [`CHAINS`]
/// chains, one rule each, jumping along the chain of chains.
fn large_input(extra_nat_line: Option<&str>) -> String {
    let mut text = String::from("*filter\n:KUBE-SERVICES - [0:0]\nCOMMIT\n*nat\n");
    for n in 0..CHAINS {
        text.push_str(&format!(":KUBE-SVC-{n:012} - [0:0]\n"));
    }
    for n in 0..CHAINS - 1 {
        text.push_str(&format!("-A KUBE-SVC-{n:012} -j KUBE-SVC-{:012}\n", n + 1));
    }
    if let Some(line) = extra_nat_line {
        text.push_str(line);
        text.push('\n');
    }
    text.push_str("COMMIT\n");
    text
}

fn iptables(namespace: &Netns, flavor: IptablesFlavor, args: &[&str]) -> String {
    namespace.exec_ok(&flavor.program(IpFamily::V4, Tool::Iptables), args)
}

fn a_restore_of_thousands_of_chains_keeps_foreign_chains(flavor: IptablesFlavor) {
    require(flavor);
    let node = Netns::create("large").unwrap();
    iptables(&node, flavor, &["-t", "nat", "-N", "CNI-HOSTPORT"]);
    iptables(
        &node,
        flavor,
        &["-t", "nat", "-A", "CNI-HOSTPORT", "-j", "RETURN"],
    );

    let input = large_input(None);
    // Twice: into an empty table, and over the rules of the first time.
    for _ in 0..2 {
        node.run(|| SystemApplier::new(flavor).restore(IpFamily::V4, &input))
            .unwrap();
    }

    let save = node.exec_ok(&flavor.program(IpFamily::V4, Tool::Save), &["-t", "nat"]);
    let last = format!(
        "-A KUBE-SVC-{:012} -j KUBE-SVC-{:012}",
        CHAINS - 2,
        CHAINS - 1
    );
    assert!(save.contains(&last), "every rule is in place");
    assert_eq!(
        save.lines()
            .filter(|l| l.starts_with("-A KUBE-SVC-"))
            .count(),
        CHAINS - 1,
        "each rule once, after two restores"
    );
    assert!(
        save.contains("-A CNI-HOSTPORT -j RETURN"),
        "foreign rules stay"
    );
}

fn a_rejected_line_of_a_large_restore_is_named_by_its_input_line(flavor: IptablesFlavor) {
    require(flavor);
    let node = Netns::create("large").unwrap();
    // A parse error: both flavors name the line itself (a missing jump
    // target is found by iptables-nft only at COMMIT).
    let bad = "-A KUBE-SVC-000000000007 -p tcp --dport 99999 -j RETURN";
    let input = large_input(Some(bad));

    let error = node
        .run(|| SystemApplier::new(flavor).restore(IpFamily::V4, &input))
        .unwrap_err();

    let expected_line = input.lines().position(|l| l == bad).unwrap() + 1;
    match error {
        ApplyError::RestoreLine { line, text, .. } => {
            assert_eq!((line, text.as_str()), (expected_line, bad));
        }
        other => panic!("expected the rejected line to be named, got {other}"),
    }
    let save = node.exec_ok(&flavor.program(IpFamily::V4, Tool::Save), &["-t", "nat"]);
    assert!(
        !save.contains("KUBE-SVC-"),
        "nothing of the input was applied"
    );
}

/// A first full sync on a fresh host: the nat table holds only the canary
/// chain, none of its built-in chains exists yet (iptables-nft creates them
/// on first use), and the restore of thousands of chains inserts the jump
/// rules into them.
fn a_large_first_restore_on_a_fresh_host_inserts_the_jump_rules(flavor: IptablesFlavor) {
    require(flavor);
    let node = Netns::create("fresh").unwrap();
    let mut applier = SystemApplier::new(flavor);
    // As the renderer writes them: the chains declared first, the jump
    // rules inserted at the end of the section.
    let nat_rules = JUMP_RULES.iter().filter(|rule| rule.table == Table::Nat);
    let targets: String = nat_rules
        .clone()
        .map(|rule| format!(":{} - [0:0]\n", rule.target_chain))
        .collect();
    let inserts: Vec<String> = nat_rules.map(JumpRule::insert_line).collect();
    let input =
        large_input(Some(&inserts.join("\n"))).replace("*nat\n", &format!("*nat\n{targets}"));

    let saved = node.run(|| {
        applier.ensure_chain(IpFamily::V4, Table::Nat, "KUBE-PROXY-CANARY")?;
        applier.restore(IpFamily::V4, &input)?;
        applier.save_table(IpFamily::V4, Table::Nat)
    });

    let saved = saved.unwrap_or_else(|error| panic!("{error}"));
    for rule in JUMP_RULES.iter().filter(|rule| rule.table == Table::Nat) {
        assert!(saved.has_jump(rule), "{}", rule.restore_line());
    }
}

fn a_listing_finds_every_jump_rule_a_restore_inserted(flavor: IptablesFlavor) {
    require(flavor);
    let node = Netns::create("jumps").unwrap();
    let mut applier = SystemApplier::new(flavor);
    // The jump rules as a full sync's restore inserts them.
    let inserts: String = [Table::Filter, Table::Nat]
        .iter()
        .map(|table| {
            let rules = JUMP_RULES.iter().filter(|rule| rule.table == *table);
            let lines: String = rules.map(|rule| rule.insert_line() + "\n").collect();
            format!("*{table}\n{lines}COMMIT\n")
        })
        .collect();
    let saved = node.run(|| {
        for rule in JUMP_RULES {
            applier.ensure_chain(IpFamily::V4, rule.table, rule.target_chain)?;
        }
        applier.restore(IpFamily::V4, &inserts)?;
        let filter = applier.save_table(IpFamily::V4, Table::Filter)?;
        let nat = applier.save_table(IpFamily::V4, Table::Nat)?;
        Ok::<_, ApplyError>([filter, nat])
    });
    let saved = saved.unwrap();

    for rule in JUMP_RULES {
        let listing = if rule.table == Table::Filter {
            &saved[0]
        } else {
            &saved[1]
        };
        assert!(
            listing.has_jump(rule),
            "{} found in iptables-save output of table {}",
            rule.restore_line(),
            rule.table
        );
    }
}

/// A full sync streams its text into the restore program, so the backend
/// has no copy of it when the program rejects a line. Here the kernel
/// refuses to delete a stale chain of ours that another owner's rule still
/// jumps to: the error names the `-X` line all the same (for iptables-nft,
/// past the lines added for its whole-table listing), and nothing of the
/// sync is applied.
fn a_line_rejected_in_a_streamed_full_sync_is_named_and_nothing_is_applied(flavor: IptablesFlavor) {
    require(flavor);
    let node = Netns::create("reject").unwrap();
    let stale = "KUBE-SEP-STALESTALESTALE2";
    iptables(&node, flavor, &["-t", "nat", "-N", stale]);
    iptables(&node, flavor, &["-t", "nat", "-N", "FOREIGN"]);
    iptables(&node, flavor, &["-t", "nat", "-A", "FOREIGN", "-j", stale]);
    // Enough chains for iptables-nft's listing.
    let service_ports: BTreeMap<_, _> = (0..600u32)
        .map(|n| {
            let (a, b) = (n / 250, n % 250);
            service("ns1", &format!("svc{n}"), &format!("10.96.{a}.{b}"), 80)
                .remote_endpoint(&format!("10.244.{}.{b}", 2 + a), 8080)
                .build()
        })
        .collect();
    let no_change = BTreeSet::new();
    let node_info = NodeInfo::default();
    let stale_conntrack = StaleConntrack::default();
    let request = SyncRequest {
        family: IpFamily::V4,
        full: true,
        service_ports: &service_ports,
        changed_services: &no_change,
        node: &node_info,
        stale_conntrack: &stale_conntrack,
    };
    let mut backend = IptablesBackend::system(
        IpFamily::V4,
        IptablesOptions::default(),
        NodePortAddresses::All,
        flavor,
    )
    .unwrap()
    .with_sysctl(Box::new(kp_node::MemorySysctl::new()));

    let error = node.run(|| backend.sync(&request)).unwrap_err();

    let BackendError::Rejected { attempted, .. } = &error else {
        panic!("expected a failed apply, got {error}");
    };
    assert!(
        attempted.ends_with(&format!(": -X {stale})")),
        "the rejected line is named: {attempted}"
    );
    let save = node.exec_ok(&flavor.program(IpFamily::V4, Tool::Save), &["-t", "nat"]);
    assert!(
        !save.contains("KUBE-SVC-"),
        "nothing of the sync was applied"
    );
    assert!(save.contains(&format!("-A FOREIGN -j {stale}")));
}
