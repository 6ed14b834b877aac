//! The backend's choices between full and partial syncs, its dry run and
//! its configuration, over a fake applier.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{service, World};
use kp_model::{IpFamily, NamespacedName};
use kp_nftables::{Applier, NftablesBackend, NftablesOptions};
use kp_node::NodePortAddresses;

fn changed(ns: &str, name: &str) -> BTreeSet<NamespacedName> {
    BTreeSet::from([NamespacedName::new(ns, name)])
}

#[test]
fn the_first_sync_deletes_the_table_and_later_ones_are_partial() {
    let mut world = World::v4();
    world.put(service("ns1", "web", "10.96.0.10", 80).remote_endpoint("10.244.2.2", 80));
    let first = world.try_sync(false, &BTreeSet::new()).unwrap();
    assert!(first.full, "nothing is known before the first sync");
    let text = world.applier.last().unwrap().text;
    assert!(text.starts_with("add table ip kube-proxy\ndelete table ip kube-proxy\n"));

    let second = world.try_sync(false, &changed("ns1", "web")).unwrap();
    assert!(!second.full);
    let periodic = world.try_sync(true, &BTreeSet::new()).unwrap();
    assert!(periodic.full);
    let text = world.applier.last().unwrap().text;
    assert!(
        !text.contains("delete table"),
        "affinity state is kept:\n{text}"
    );
    assert_eq!(
        periodic.chains_per_table,
        vec![("kube-proxy".to_owned(), 2)]
    );
}

#[test]
fn a_failed_sync_is_followed_by_a_full_one_that_starts_afresh() {
    let mut world = World::v4();
    world.put(service("ns1", "web", "10.96.0.10", 80).remote_endpoint("10.244.2.2", 80));
    world.try_sync(true, &BTreeSet::new()).unwrap();
    world.applier.fail_next(1);
    let error = world.try_sync(false, &changed("ns1", "web")).unwrap_err();
    assert!(error.to_string().contains("nftables"), "{error}");

    let retry = world.try_sync(false, &BTreeSet::new()).unwrap();
    assert!(retry.full);
    let text = world.applier.last().unwrap().text;
    assert!(text.contains("delete table ip kube-proxy"), "{text}");
}

#[test]
fn a_failed_stale_chain_cleanup_is_counted_and_tried_again_while_the_syncs_succeed() {
    let mut world = World::v4();
    world.put(
        service("ns1", "web", "10.96.0.10", 80)
            .remote_endpoint("10.244.2.2", 80)
            .remote_endpoint("10.244.2.3", 80),
    );
    world.sync(true, &[]);
    // ep 10.244.2.3 goes: its chain is flushed and waits a second.
    world.put(service("ns1", "web", "10.96.0.10", 80).remote_endpoint("10.244.2.2", 80));
    world.sync(false, &[("ns1", "web")]);
    assert_eq!(world.backend.programmed().stale_chains.len(), 1);

    // Too early: no cleanup transaction at all.
    world.sync(false, &[]);
    assert_eq!(world.cleanup_of_last_sync(), None);

    // Due: the cleanup transaction fails, the sync's own succeeds.
    world.advance(Duration::from_secs(2));
    world.applier.fail_next(1);
    let before = world.applier.transactions().len();
    let outcome = world.try_sync(false, &changed("ns1", "web")).unwrap();
    assert!(!outcome.full, "a failed cleanup forces no full sync");
    assert_eq!(outcome.cleanup_failures, 1, "reported with the sync");
    let sent = world.applier.transactions();
    assert_eq!(sent.len() - before, 2, "the cleanup, then the sync");
    assert!(sent[before]
        .text
        .contains("delete chain ip kube-proxy endpoint-"));
    assert!(
        !sent[before + 1].text.contains("delete"),
        "{}",
        sent[before + 1].text
    );
    assert_eq!(world.backend.cleanup_failures(), 1);
    assert_eq!(
        world.backend.programmed().stale_chains.len(),
        1,
        "kept to try again"
    );

    // The next sync tries again, and succeeds.
    let retried = world.try_sync(false, &BTreeSet::new()).unwrap();
    assert_eq!(retried.cleanup_failures, 0);
    let text = world.applier.last().unwrap().text;
    assert!(!text.contains("delete chain"), "{text}");
    let cleanup = world.cleanup_of_last_sync().expect("the cleanup again");
    assert!(
        cleanup.contains("delete chain ip kube-proxy endpoint-"),
        "{cleanup}"
    );
    assert_eq!(world.backend.programmed().stale_chains.len(), 0);
    assert_eq!(world.backend.cleanup_failures(), 1);
}

#[test]
fn a_sync_of_the_other_family_is_refused() {
    let mut world = World::with(IpFamily::V6, NodePortAddresses::All);
    world.family = IpFamily::V4;
    let error = world.try_sync(true, &BTreeSet::new()).unwrap_err();
    assert!(error.to_string().contains("IPv4"), "{error}");
}

/// A writer the test can read after handing it to the backend.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_dry_run_prints_exactly_what_a_full_sync_commits() {
    let mut world = World::v4();
    world.put(service("ns1", "web", "10.96.0.10", 80).remote_endpoint("10.244.2.2", 80));
    world.sync(true, &[]);
    let committed = world.applier.last().unwrap().text;

    let out = Shared::default();
    let options = NftablesOptions {
        local_detector: kp_node::LocalDetector::ClusterCidr(
            vec![kp_testkit::plan::POD_CIDR.into()],
        ),
        ..NftablesOptions::default()
    };
    let mut dry = NftablesBackend::dry_run(
        IpFamily::V4,
        options,
        NodePortAddresses::All,
        Box::new(out.clone()),
    )
    .unwrap()
    .with_layout(kp_nftables::Layout::Chains);
    let stale = kp_sync::StaleConntrack::default();
    let none = BTreeSet::new();
    let request = kp_sync::SyncRequest {
        family: IpFamily::V4,
        full: true,
        service_ports: &world.services,
        changed_services: &none,
        node: &world.node,
        stale_conntrack: &stale,
    };
    kp_sync::Backend::sync(&mut dry, &request).unwrap();
    let printed = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    pretty_assertions::assert_eq!(printed, committed);
}

#[test]
fn a_partial_sync_rewrites_only_the_chains_whose_text_changed() {
    let mut world = World::v4();
    let web = || {
        service("ns1", "web", "10.96.0.10", 80)
            .remote_endpoint("10.244.2.2", 80)
            .affinity_secs(600)
    };
    world.put(web());
    world.put(service("ns1", "db", "10.96.0.11", 5432).remote_endpoint("10.244.2.3", 5432));
    world.sync(true, &[]);

    // Both reported changed, neither's rules differ: nothing is rewritten.
    let text = world.sync(false, &[("ns1", "web"), ("ns1", "db")]);
    assert!(!text.contains("add rule"), "{text}");
    assert!(!text.contains("flush chain"), "{text}");

    // Only the affinity timeout changes: same chain names and elements,
    // other rule text, so the Service's chains are rewritten.
    world.put(
        service("ns1", "web", "10.96.0.10", 80)
            .remote_endpoint("10.244.2.2", 80)
            .affinity_secs(60),
    );
    let text = world.sync(false, &[("ns1", "web"), ("ns1", "db")]);
    assert!(text.contains("timeout 60s"), "{text}");
    assert!(
        text.contains("flush chain ip kube-proxy service-LV5ZVUGQ-ns1/web/tcp/p80"),
        "{text}"
    );
    assert!(!text.contains("ns1/db"), "db stays as it is:\n{text}");
    let verdict = world.trace("10.244.1.2", common::at("10.96.0.10", 80));
    common::assert_goes_to(&verdict, &[common::at("10.244.2.2", 80)]);
}

/// A full sync that rewrites the table (the fake tells no generation, so
/// the table is never trusted) writes every Service whole, whether it kept
/// its record, changed or is new; and what it records is what a partial
/// sync computes, which then finds nothing to rewrite.
#[test]
fn a_full_rewrite_writes_every_service_kept_changed_or_new() {
    let mut world = World::v4();
    let web = |n: u8, endpoint: &str| {
        service("ns1", &format!("s{n}"), &format!("10.96.0.{}", 10 + n), 80)
            .remote_endpoint(endpoint, 80)
    };
    for n in 0..3 {
        world.put(web(n, &format!("10.244.2.{}", 10 + n)));
    }
    world.sync(true, &[]);

    // s0 stays, s1's endpoint moves, s2 goes, s3 comes.
    world.put(web(1, "10.244.2.111"));
    world.remove("ns1", "s2");
    world.put(web(3, "10.244.2.13"));
    let text = world.sync(true, &[]);
    assert!(!text.contains("delete table"), "{text}");
    for n in [0, 1, 3] {
        let ip = format!("10.96.0.{}", 10 + n);
        for line in [
            format!("add element ip kube-proxy cluster-ips {{ {ip} }}"),
            format!("add element ip kube-proxy service-ips {{ {ip} . tcp . 80 : goto service-"),
        ] {
            assert!(text.contains(&line), "s{n}: no {line:?} in\n{text}");
        }
        let chain = format!("-ns1/s{n}/tcp/p80 ");
        assert!(
            text.lines()
                .any(|line| line.starts_with("add rule ip kube-proxy service-")
                    && line.contains(&chain)),
            "s{n}: no rule in its service chain in\n{text}"
        );
    }
    let to = |ip: &str| world.trace("10.244.1.7", common::at(ip, 80));
    common::assert_goes_to(&to("10.96.0.10"), &[common::at("10.244.2.10", 80)]);
    common::assert_goes_to(&to("10.96.0.11"), &[common::at("10.244.2.111", 80)]);
    common::assert_goes_to(&to("10.96.0.13"), &[common::at("10.244.2.13", 80)]);
    assert_eq!(to("10.96.0.12"), kp_nftables::tracer::Verdict::Accept);

    let every = [("ns1", "s0"), ("ns1", "s1"), ("ns1", "s3")];
    let text = world.sync(false, &every);
    assert!(!text.contains("add rule"), "{text}");
    assert!(!text.contains("add element"), "{text}");
}

#[test]
fn a_full_sync_of_an_untouched_table_sends_only_what_differs() {
    let mut world = World::v4().with_generations();
    let web = |endpoints: &[&str]| {
        let mut svc = service("ns1", "web", "10.96.0.10", 80);
        for endpoint in endpoints {
            svc = svc.remote_endpoint(endpoint, 80);
        }
        svc
    };
    world.put(web(&["10.244.2.2", "10.244.2.3"]));
    world.put(service("ns1", "db", "10.96.0.11", 5432).remote_endpoint("10.244.2.4", 5432));
    let first = world.sync(true, &[]);
    assert!(first.contains("delete table"), "{first}");

    // Nobody committed since: the periodic full sync has nothing to send.
    let periodic = world.sync(true, &[]);
    assert!(!periodic.contains("add rule"), "{periodic}");
    assert!(!periodic.contains("flush"), "{periodic}");
    common::assert_goes_to(
        &world.trace("10.244.1.9", common::at("10.96.0.10", 80)),
        &[common::at("10.244.2.2", 80), common::at("10.244.2.3", 80)],
    );

    // A change the sync loop names (it names the Services that changed
    // since the last sync, in a full sync too): only web is rendered, and
    // only its chains are rewritten.
    world.put(web(&["10.244.2.2"]));
    let periodic = world.sync(true, &[("ns1", "web")]);
    assert!(
        periodic.contains("add rule ip kube-proxy service-"),
        "{periodic}"
    );
    assert!(
        !periodic.contains("ns1/db"),
        "db is left as it is:\n{periodic}"
    );
    common::assert_goes_to(
        &world.trace("10.244.1.9", common::at("10.96.0.10", 80)),
        &[common::at("10.244.2.2", 80)],
    );

    // Someone else committed: the table may differ from the record, so
    // everything is written again, without deleting the table.
    world.applier.foreign_commit();
    let rewrite = world.sync(true, &[]);
    assert!(rewrite.contains("ns1/db"), "{rewrite}");
    assert!(rewrite.contains("flush chain"), "{rewrite}");
    assert!(!rewrite.contains("delete table"), "{rewrite}");
    let periodic = world.sync(true, &[]);
    assert!(
        !periodic.contains("add rule"),
        "untouched again:\n{periodic}"
    );

    // A partial sync keeps the generation known.
    world.put(web(&["10.244.2.2", "10.244.2.3"]));
    world.sync(false, &[("ns1", "web")]);
    let periodic = world.sync(true, &[]);
    assert!(!periodic.contains("add rule"), "{periodic}");

    // After a failed commit the record is not trusted: a fresh table.
    world.applier.fail_next(1);
    world.put(web(&["10.244.2.3"]));
    assert!(world.try_sync(false, &changed("ns1", "web")).is_err());
    let repair = world.sync(true, &[]);
    assert!(repair.contains("delete table"), "{repair}");
}

#[test]
fn a_table_the_state_check_distrusts_is_rebuilt_from_nothing() {
    let mut world = World::v4().with_generations();
    world.put(service("ns1", "web", "10.96.0.10", 80).remote_endpoint("10.244.2.2", 80));
    world.put(service("ns1", "db", "10.96.0.11", 5432).remote_endpoint("10.244.2.4", 5432));
    world.sync(true, &[]);
    let periodic = world.sync(true, &[]);
    assert!(!periodic.contains("add rule"), "{periodic}");

    // The kernel was found holding other rules than the record says,
    // at the generation of the proxy's own last commit: the record is not
    // trusted, and the table is deleted and built again in one
    // transaction.
    kp_sync::Backend::distrust_kernel(&mut world.backend);
    let repair = world.sync(true, &[]);
    assert!(repair.contains("delete table"), "{repair}");
    assert!(
        repair.contains("ns1/db") && repair.contains("ns1/web"),
        "{repair}"
    );
    common::assert_goes_to(
        &world.trace("10.244.1.9", common::at("10.96.0.10", 80)),
        &[common::at("10.244.2.2", 80)],
    );
    let periodic = world.sync(true, &[]);
    assert!(!periodic.contains("add rule"), "trusted again:\n{periodic}");
}

#[test]
fn a_commit_seen_to_leave_the_table_alone_keeps_it_trusted() {
    let mut world = World::v4().with_watch();
    world.put(service("ns1", "web", "10.96.0.10", 80).remote_endpoint("10.244.2.2", 80));
    world.put(service("ns1", "db", "10.96.0.11", 5432).remote_endpoint("10.244.2.4", 5432));
    world.sync(true, &[]);

    // Another program commits to its own tables, twice: the watch saw
    // both whole, so the periodic full sync has nothing to send.
    world.applier.foreign_commit_elsewhere();
    world.applier.foreign_commit_elsewhere();
    let periodic = world.sync(true, &[]);
    assert!(!periodic.contains("add rule"), "{periodic}");
    assert!(!periodic.contains("flush"), "{periodic}");

    // A change is written alone.
    world.put(service("ns1", "web", "10.96.0.10", 80).remote_endpoint("10.244.2.3", 80));
    world.applier.foreign_commit_elsewhere();
    let periodic = world.sync(true, &[("ns1", "web")]);
    assert!(periodic.contains("10.244.2.3"), "{periodic}");
    assert!(!periodic.contains("ns1/db"), "{periodic}");
    common::assert_goes_to(
        &world.trace("10.244.1.9", common::at("10.96.0.10", 80)),
        &[common::at("10.244.2.3", 80)],
    );

    // A commit that changed the proxy's table: everything is written again.
    world.applier.foreign_commit_elsewhere();
    world.applier.foreign_commit();
    let rewrite = world.sync(true, &[]);
    assert!(rewrite.contains("ns1/db"), "{rewrite}");
    assert!(rewrite.contains("flush chain"), "{rewrite}");
    let periodic = world.sync(true, &[]);
    assert!(!periodic.contains("add rule"), "trusted again:\n{periodic}");
}

/// `add table F kube-proxy`, `add chain F kube-proxy services` (the
/// table first: the fake, like the kernel, refuses a chain of a table
/// that does not exist).
fn services_chain(family: IpFamily) -> kp_nftables::Transaction {
    use kp_nftables::model::{ChainKind, Command, Name};
    kp_nftables::Transaction {
        family,
        commands: vec![
            Command::AddTable { comment: None },
            Command::AddChain {
                name: Name::Fixed("services"),
                kind: ChainKind::Regular,
            },
        ],
    }
}

#[test]
fn only_the_other_familys_table_changed_keeps_this_one_trusted() {
    let mut world = World::with(IpFamily::V6, NodePortAddresses::All).with_watch();
    world.put(service("ns1", "web", "fd00:10:96::10", 80).remote_endpoint("fd00:10:244:2::2", 80));
    world.sync(true, &[]);
    // A commit of the fake with the IPv4 table changed: not this table.
    let mut other = world.applier.clone();
    other.apply(&services_chain(IpFamily::V4)).unwrap();
    let periodic = world.sync(true, &[]);
    assert!(!periodic.contains("add rule"), "{periodic}");
    other.apply(&services_chain(IpFamily::V6)).unwrap();
    let rewrite = world.sync(true, &[]);
    assert!(rewrite.contains("flush chain"), "{rewrite}");
}

#[test]
fn a_changed_fixed_part_makes_a_full_sync_rewrite_the_table() {
    let primary = NodePortAddresses::parse(&["primary".to_owned()]).unwrap();
    let mut world = World::with(IpFamily::V4, primary).with_generations();
    world.put(
        service("ns1", "web", "10.96.0.10", 80)
            .node_port(30080)
            .remote_endpoint("10.244.2.2", 80),
    );
    world.sync(true, &[]);
    let periodic = world.sync(true, &[]);
    assert!(!periodic.contains("add rule"), "{periodic}");

    // The node's address moves: NodePorts answer on the new one.
    world.node.addresses = vec![common::ip("192.168.99.7")];
    let rewrite = world.sync(true, &[]);
    assert!(rewrite.contains("192.168.99.7"), "{rewrite}");
    assert!(rewrite.contains("flush chain"), "{rewrite}");
}

#[test]
fn the_fake_refuses_a_partial_sync_onto_a_table_that_was_never_created() {
    use kp_nftables::model::{Command, Key, Name, SetElement, Verdict};
    let mut applier = kp_nftables::FakeApplier::new();
    let partial = kp_nftables::Transaction {
        family: IpFamily::V4,
        commands: vec![Command::AddElements {
            set: Name::Fixed("service-ips"),
            elements: vec![SetElement {
                key: Key::AddrProtoPort(common::ip("10.96.0.10"), kp_model::Protocol::Tcp, 80),
                comment: None,
                verdict: Some(Verdict::Drop),
            }],
        }],
    };
    let error = applier.apply(&partial).unwrap_err();
    // What the NetlinkApplier reports for the same transaction
    // (kernel_readback.rs shows it against the kernel).
    let kp_nftables::ApplyError::Kernel { message, line, .. } = &error else {
        panic!("a kernel refusal, not {error:?}");
    };
    assert_eq!(message, "No such file or directory (os error 2)");
    assert_eq!(line.as_ref().unwrap().0, 1);
    assert!(applier.table(IpFamily::V4).is_none());
}

#[test]
fn a_partial_sync_onto_a_table_someone_deleted_is_refused_and_a_full_one_repairs_it() {
    let mut world = World::v4();
    world.put(service("ns1", "web", "10.96.0.10", 80).remote_endpoint("10.244.2.2", 80));
    world.sync(true, &[]);
    assert!(world.applier.table(IpFamily::V4).is_some());

    // Someone deletes the table; web's endpoint moves.
    world.applier.delete_table(IpFamily::V4);
    world.put(service("ns1", "web", "10.96.0.10", 80).remote_endpoint("10.244.2.3", 80));
    let error = world.try_sync(false, &changed("ns1", "web")).unwrap_err();
    assert!(
        error.to_string().contains("No such file or directory"),
        "{error}"
    );
    assert!(
        world.applier.table(IpFamily::V4).is_none(),
        "nothing of a refused transaction is applied"
    );

    // The full sync that follows a failure writes the table whole.
    let outcome = world.try_sync(true, &BTreeSet::new()).unwrap();
    assert!(outcome.full);
    let table = world.applier.table(IpFamily::V4).unwrap();
    let verdict = table
        .trace(&common::packet(
            "10.244.1.9",
            common::at("10.96.0.10", 80),
            "tcp",
        ))
        .unwrap();
    common::assert_goes_to(&verdict, &[common::at("10.244.2.3", 80)]);
}
