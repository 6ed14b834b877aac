//! The backend over the fake kernel: what a sync programs, when it is full,
//! and what the host settings become.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use kp_model::{
    Endpoint, IpFamily, NamespacedName, NodeInfo, Protocol, ServicePort, ServicePortName,
};
use kp_sync::{Backend, BackendError, ServicePortState, StaleConntrack, SyncRequest};

use super::*;
use crate::applier::{FakeCall, FakeKernel};
use crate::tracer::{Packet, Ruleset};

const NODE_IP: &str = "192.168.99.2";

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn node() -> NodeInfo {
    NodeInfo {
        name: "node-1".into(),
        addresses: vec![ip(NODE_IP)],
        ..NodeInfo::default()
    }
}

/// `ns1/<name>:http` at `cluster_ip:80` with ready endpoints on port 8080.
fn service_port(
    name: &str,
    cluster_ip: &str,
    endpoint_ips: &[&str],
) -> (ServicePortName, ServicePortState) {
    let port = ServicePort {
        cluster_ip: ip(cluster_ip),
        port: 80,
        protocol: Protocol::Tcp,
        node_port: Some(30080),
        external_ips: Vec::new(),
        load_balancer_ips: Vec::new(),
        load_balancer_source_ranges: Vec::new(),
        session_affinity_timeout: None,
        external_policy_local: false,
        internal_policy_local: false,
        health_check_node_port: None,
        traffic_distribution: None,
        topology_mode: None,
    };
    let all_endpoints: Vec<Arc<Endpoint>> = endpoint_ips
        .iter()
        .map(|address| {
            Arc::new(Endpoint {
                ip: ip(address),
                port: 8080,
                ready: true,
                serving: true,
                terminating: false,
                is_local: false,
                node_name: Some("node-2".into()),
                zone: None,
                zone_hints: None,
                node_hints: None,
            })
        })
        .collect();
    let name = ServicePortName {
        service: svc(name),
        port: "http".into(),
        protocol: Protocol::Tcp,
    };
    let state = kp_sync::testing::planned(port, all_endpoints);
    (name, state)
}

fn svc(name: &str) -> NamespacedName {
    NamespacedName {
        namespace: "ns1".into(),
        name: name.into(),
    }
}

/// A backend over a fresh fake kernel, and the kernel.
fn backend() -> (IptablesBackend, FakeKernel, MemorySysctl) {
    let kernel = FakeKernel::new();
    let sysctl = MemorySysctl::new().with(SYSCTL_BRIDGE_CALL_IPTABLES, "1");
    let backend = IptablesBackend::new(
        IpFamily::V4,
        IptablesOptions::default(),
        NodePortAddresses::All,
        Box::new(kernel.applier()),
    )
    .unwrap()
    .with_sysctl(Box::new(sysctl.clone()));
    (backend, kernel, sysctl)
}

struct World {
    services: BTreeMap<ServicePortName, ServicePortState>,
    node: NodeInfo,
    stale: StaleConntrack,
}

impl World {
    fn new(services: &[(ServicePortName, ServicePortState)]) -> Self {
        Self {
            services: services.iter().cloned().collect(),
            node: node(),
            stale: StaleConntrack::default(),
        }
    }

    fn sync(
        &self,
        backend: &mut IptablesBackend,
        full: bool,
        changed: &[&str],
    ) -> Result<kp_sync::SyncOutcome, BackendError> {
        let changed: BTreeSet<NamespacedName> = changed.iter().map(|n| svc(n)).collect();
        backend.sync(&SyncRequest {
            family: IpFamily::V4,
            full,
            service_ports: &self.services,
            changed_services: &changed,
            node: &self.node,
            stale_conntrack: &self.stale,
        })
    }
}

fn restores(calls: &[FakeCall]) -> Vec<&str> {
    calls
        .iter()
        .filter_map(|call| match call {
            FakeCall::Restore(_, text) => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

fn with_jumps(kernel: &FakeKernel) -> Ruleset {
    kernel.ruleset(IpFamily::V4).with_jump_rules().unwrap()
}

#[test]
fn a_refused_rule_names_its_service_and_a_refused_top_level_rule_names_none() {
    let (mut backend, kernel, _) = backend();
    let world = World::new(&[
        service_port("web", "10.96.0.10", &["10.244.2.3"]),
        service_port("big", "10.96.0.11", &["10.244.2.4"]),
    ]);
    kernel.refuse_lines_with("10.96.0.11");

    let error = world.sync(&mut backend, true, &[]).unwrap_err();

    let BackendError::Rejected { services, .. } = &error else {
        panic!("{error}");
    };
    assert_eq!(*services, [svc("big")].into(), "{error}");
    assert!(error.to_string().contains("Service ns1/big"), "{error}");

    kernel.refuse_lines_with("KUBE-MARK-MASQ -j MARK");
    let error = world.sync(&mut backend, true, &[]).unwrap_err();
    let BackendError::Rejected { services, .. } = &error else {
        panic!("{error}");
    };
    assert!(services.is_empty(), "{error}");
}

#[test]
fn a_line_a_partial_restore_refuses_names_no_service() {
    let (mut backend, kernel, _) = backend();
    let world = World::new(&[
        service_port("web", "10.96.0.10", &["10.244.2.3"]),
        service_port("big", "10.96.0.11", &["10.244.2.4"]),
    ]);
    world.sync(&mut backend, true, &[]).unwrap();
    let changed = World::new(&[
        service_port("web", "10.96.0.10", &["10.244.2.3"]),
        service_port("big", "10.96.0.11", &["10.244.2.5"]),
    ]);
    // As if someone had deleted a chain the partial restore jumps to.
    kernel.refuse_lines_with("10.244.2.5");

    let error = changed.sync(&mut backend, false, &["big"]).unwrap_err();

    let BackendError::Rejected { services, .. } = &error else {
        panic!("{error}");
    };
    assert!(services.is_empty(), "{error}");
}

#[test]
fn a_comment_names_the_service_of_its_rule() {
    for (line, expected) in [
        (
            r#"-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -j KUBE-SVC-X"#,
            Some(("ns1", "svc1")),
        ),
        (
            r#"-A KUBE-SEP-X -m comment --comment ns1/svc1:p80 -j DNAT"#,
            Some(("ns1", "svc1")),
        ),
        (
            r#"-A KUBE-FW-X -m comment --comment "ns1/svc1 loadbalancer IP" -j DROP"#,
            Some(("ns1", "svc1")),
        ),
        (
            r#"-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -j ACCEPT"#,
            None,
        ),
        (":KUBE-SVC-X - [0:0]", None),
    ] {
        assert_eq!(commented_service(line), expected, "{line}");
    }
}

#[test]
fn first_sync_is_full_creates_canaries_jumps_and_rules_in_one_restore() {
    let (mut backend, kernel, _) = backend();
    let world = World::new(&[service_port("web", "10.96.0.10", &["10.244.2.3"])]);

    let outcome = world.sync(&mut backend, false, &[]).unwrap();

    assert!(
        outcome.full,
        "a partial request is upgraded on the first sync"
    );
    let calls = kernel.take_calls();
    assert_eq!(restores(&calls).len(), 1, "one atomic restore");
    for table in [Table::Mangle, Table::Nat, Table::Filter] {
        let chains = kernel.chains(IpFamily::V4, table);
        assert!(chains.contains(&KUBE_PROXY_CANARY.to_owned()), "{table}");
    }
    assert_eq!(kernel.jumps(IpFamily::V4).len(), JUMP_RULES.len());
    let trace = with_jumps(&kernel)
        .trace(
            &Packet::tcp(ip("10.244.1.5"), ip("10.96.0.10"), 80),
            &[ip(NODE_IP)],
        )
        .unwrap();
    let reached: Vec<String> = trace.destinations().iter().map(|d| d.to_string()).collect();
    assert_eq!(reached, ["10.244.2.3:8080"]);
    assert_eq!(outcome.rules_per_table[1].0, "nat");
    assert!(outcome.rules_per_table[1].1 > 0);
}

#[test]
fn later_partial_sync_checks_nothing_and_rewrites_only_changed_services() {
    let (mut backend, kernel, _) = backend();
    let before = World::new(&[
        service_port("web", "10.96.0.10", &["10.244.2.3"]),
        service_port("db", "10.96.0.11", &["10.244.2.4"]),
    ]);
    before.sync(&mut backend, false, &[]).unwrap();
    kernel.take_calls();

    let after = World::new(&[
        service_port("web", "10.96.0.10", &["10.244.2.3", "10.244.2.9"]),
        service_port("db", "10.96.0.11", &["10.244.2.4"]),
    ]);
    let outcome = after.sync(&mut backend, false, &["web"]).unwrap();

    assert!(!outcome.full);
    let calls = kernel.take_calls();
    assert!(
        matches!(calls.as_slice(), [FakeCall::Restore(..)]),
        "one restore and nothing else: {calls:?}"
    );
    let restore = restores(&calls)[0];
    assert!(
        !restore.lines().any(|l| l.starts_with("-I ")),
        "no jump rule inserted"
    );
    assert!(restore.contains("10.244.2.9"));
    assert!(!restore.contains("10.244.2.4"), "db is left alone");
    let count = |table: &str| {
        let section = restore
            .split('*')
            .find(|s| s.starts_with(table))
            .unwrap_or("");
        section.lines().filter(|l| l.starts_with("-A ")).count()
    };
    assert_eq!(
        outcome.rules_written_per_table,
        [
            ("filter".to_owned(), count("filter")),
            ("nat".to_owned(), count("nat"))
        ],
        "the rules written are those of the restore as applied"
    );
    let nat_total = outcome.rules_per_table[1].1;
    assert!(
        count("nat") > 0 && count("nat") < nat_total,
        "a partial sync writes part of the nat table ({} of {nat_total})",
        count("nat")
    );
    assert!(
        !restore.contains(":KUBE-SERVICES") && !restore.contains("-A KUBE-SERVICES"),
        "an endpoint change leaves KUBE-SERVICES as the kernel holds it:\n{restore}"
    );
    let trace = with_jumps(&kernel)
        .trace(
            &Packet::tcp(ip("10.244.1.5"), ip("10.96.0.11"), 80),
            &[ip(NODE_IP)],
        )
        .unwrap();
    assert_eq!(trace.destinations().len(), 1, "db still works");
}

#[test]
fn a_wiped_table_is_repaired_by_the_next_full_sync() {
    let (mut backend, kernel, _) = backend();
    let world = World::new(&[service_port("web", "10.96.0.10", &["10.244.2.3"])]);
    world.sync(&mut backend, false, &[]).unwrap();

    kernel.wipe_table(IpFamily::V4, Table::Nat);
    // The sync loop's periodic run, once per syncPeriod even under churn.
    let outcome = world.sync(&mut backend, true, &[]).unwrap();

    assert!(outcome.full);
    let nat = kernel.chains(IpFamily::V4, Table::Nat);
    assert!(nat.iter().any(|c| c.starts_with("KUBE-SVC-")));
    assert!(nat.contains(&KUBE_PROXY_CANARY.to_owned()));
    let nat_jumps = kernel
        .jumps(IpFamily::V4)
        .into_iter()
        .filter(|j| j.table == Table::Nat);
    assert_eq!(nat_jumps.count(), 3);
}

#[test]
fn a_failed_restore_is_reported_and_the_next_sync_is_full() {
    let (mut backend, kernel, _) = backend();
    let world = World::new(&[service_port("web", "10.96.0.10", &["10.244.2.3"])]);
    world.sync(&mut backend, true, &[]).unwrap();

    kernel.fail_restores(1);
    let error = world.sync(&mut backend, false, &["web"]).unwrap_err();
    let message = error.to_string();
    assert!(message.contains("line 2"), "{message}");
    assert!(message.contains("fake-iptables-restore"), "{message}");

    let outcome = world.sync(&mut backend, false, &[]).unwrap();
    assert!(outcome.full, "the sync after a failure is full");
}

#[test]
fn removed_service_chains_are_deleted_on_a_partial_sync() {
    let (mut backend, kernel, _) = backend();
    World::new(&[
        service_port("web", "10.96.0.10", &["10.244.2.3"]),
        service_port("db", "10.96.0.11", &["10.244.2.4"]),
    ])
    .sync(&mut backend, false, &[])
    .unwrap();
    let before = kernel.chains(IpFamily::V4, Table::Nat).len();

    World::new(&[service_port("web", "10.96.0.10", &["10.244.2.3"])])
        .sync(&mut backend, false, &["db"])
        .unwrap();

    let after = kernel.chains(IpFamily::V4, Table::Nat).len();
    assert_eq!(before - after, 3, "SVC, EXT and SEP of db");
}

#[test]
fn localhost_node_ports_set_route_localnet_once() {
    let (mut backend, _kernel, sysctl) = backend();
    let world = World::new(&[service_port("web", "10.96.0.10", &["10.244.2.3"])]);
    world.sync(&mut backend, true, &[]).unwrap();
    assert_eq!(sysctl.get(SYSCTL_ROUTE_LOCALNET).unwrap(), "1");
}

#[test]
fn without_localhost_node_ports_route_localnet_is_left_alone() {
    let kernel = FakeKernel::new();
    let sysctl = MemorySysctl::new();
    let options = IptablesOptions {
        localhost_node_ports: false,
        ..IptablesOptions::default()
    };
    let mut backend = IptablesBackend::new(
        IpFamily::V4,
        options,
        NodePortAddresses::All,
        Box::new(kernel.applier()),
    )
    .unwrap()
    .with_sysctl(Box::new(sysctl.clone()));
    World::new(&[]).sync(&mut backend, true, &[]).unwrap();
    assert!(sysctl.get(SYSCTL_ROUTE_LOCALNET).is_err());
}

#[test]
fn node_port_addresses_select_host_addresses_in_cidrs_and_the_primary_ip() {
    let config = ["192.168.99.0/24", "primary", "fd00::/8"].map(String::from);
    let selection = NodePortAddresses::parse(&config).unwrap();
    let mut node = node();
    node.addresses = vec![ip("10.1.2.3"), ip(NODE_IP)];
    let local = [
        ip("127.0.0.1"),
        ip(NODE_IP),
        ip("192.168.99.7"),
        ip("fd00::2"),
    ];

    let v4 = selection.resolve(IpFamily::V4, &node, &local).unwrap();
    assert_eq!(v4, [ip("10.1.2.3"), ip(NODE_IP), ip("192.168.99.7")]);
    let v6 = selection.resolve(IpFamily::V6, &node, &local).unwrap();
    assert_eq!(v6, [ip("fd00::2")]);

    let everything = NodePortAddresses::parse(&["0.0.0.0/0".to_owned()]).unwrap();
    assert_eq!(everything.resolve(IpFamily::V4, &node, &local), None);
    let only_v4 = NodePortAddresses::parse(&["192.168.99.0/24".to_owned()]).unwrap();
    assert_eq!(
        only_v4.resolve(IpFamily::V6, &node, &local),
        None,
        "no CIDR of the family"
    );
    let error = NodePortAddresses::parse(&["192.168.99.0/33".to_owned()]).unwrap_err();
    assert!(error.to_string().contains("nodePortAddresses"), "{error}");
}

#[test]
fn node_ports_follow_the_host_addresses_at_each_sync() {
    let kernel = FakeKernel::new();
    let selection = NodePortAddresses::parse(&["192.168.99.0/24".to_owned()]).unwrap();
    let mut backend = IptablesBackend::new(
        IpFamily::V4,
        IptablesOptions::default(),
        selection,
        Box::new(kernel.applier()),
    )
    .unwrap()
    .with_sysctl(Box::new(MemorySysctl::new()))
    .with_local_addresses(|| Ok(vec![ip("127.0.0.1"), ip(NODE_IP)]));
    World::new(&[service_port("web", "10.96.0.10", &["10.244.2.3"])])
        .sync(&mut backend, true, &[])
        .unwrap();
    let restore = kernel.take_calls();
    let text = restores(&restore)[0];
    assert!(text.contains("-d 192.168.99.2 -j KUBE-NODEPORTS"), "{text}");
    assert!(!text.contains("--dst-type LOCAL -j KUBE-NODEPORTS"));
}

/// Host addresses that record whether each read asked for a refresh.
struct RecordedReads(Arc<std::sync::Mutex<Vec<bool>>>);

impl LocalAddresses for RecordedReads {
    fn list(&mut self, refresh: bool) -> io::Result<Vec<IpAddr>> {
        self.0.lock().unwrap().push(refresh);
        Ok(vec![ip(NODE_IP)])
    }
}

#[test]
fn full_syncs_read_the_host_addresses_afresh_and_partial_ones_from_the_cache() {
    let kernel = FakeKernel::new();
    let selection = NodePortAddresses::parse(&["192.168.99.0/24".to_owned()]).unwrap();
    let mut backend = IptablesBackend::new(
        IpFamily::V4,
        IptablesOptions::default(),
        selection,
        Box::new(kernel.applier()),
    )
    .unwrap()
    .with_sysctl(Box::new(MemorySysctl::new()));
    let reads = Arc::new(std::sync::Mutex::new(Vec::new()));
    backend.local_addresses = Box::new(RecordedReads(Arc::clone(&reads)));
    let world = World::new(&[service_port("web", "10.96.0.10", &["10.244.2.3"])]);
    world.sync(&mut backend, true, &[]).unwrap();
    world.sync(&mut backend, false, &[]).unwrap();
    world.sync(&mut backend, true, &[]).unwrap();
    assert_eq!(*reads.lock().unwrap(), [true, false, true]);
}

#[test]
fn dry_run_prints_the_restore_input_with_its_jump_rules() {
    let out = SharedBuffer::default();
    let mut backend = IptablesBackend::dry_run(
        IpFamily::V4,
        IptablesOptions::default(),
        NodePortAddresses::All,
        Box::new(out.clone()),
    )
    .unwrap();
    World::new(&[service_port("web", "10.96.0.10", &["10.244.2.3"])])
        .sync(&mut backend, true, &[])
        .unwrap();
    let text = out.text();
    let header = text.find("# IPv4 iptables-restore input").expect(&text);
    let nat = text.find("*nat\n").expect(&text);
    let jump = text
        .find("\n-I PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n")
        .expect(&text);
    assert!(header < nat && nat < jump, "{text}");
    assert!(
        Ruleset::from_restore(&text).is_ok(),
        "the output is valid restore input"
    );
}

/// A writer tests can read back.
#[derive(Clone, Default)]
struct SharedBuffer(Arc<std::sync::Mutex<Vec<u8>>>);

impl SharedBuffer {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

impl std::io::Write for SharedBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_full_sync_over_intact_rules_lists_filter_and_nat_once_and_inserts_nothing() {
    let (mut backend, kernel, _) = backend();
    let world = World::new(&[service_port("web", "10.96.0.10", &["10.244.2.3"])]);
    world.sync(&mut backend, true, &[]).unwrap();
    kernel.take_calls();

    world.sync(&mut backend, true, &[]).unwrap();

    let calls = kernel.take_calls();
    let listed: Vec<_> = calls
        .iter()
        .filter_map(|c| match c {
            FakeCall::SaveTable(_, table) => Some(*table),
            _ => None,
        })
        .collect();
    assert_eq!(listed, [Table::Filter, Table::Nat]);
    assert!(
        !restores(&calls)[0].lines().any(|l| l.starts_with("-I ")),
        "no jump rule inserted"
    );
    let ensured: Vec<_> = calls
        .iter()
        .filter_map(|c| match c {
            FakeCall::EnsureChain(_, table, chain) => Some((*table, chain.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        ensured,
        [(Table::Mangle, KUBE_PROXY_CANARY)],
        "only the canary of the table that is not listed"
    );
}

#[test]
fn a_partial_sync_that_meets_a_wiped_table_fails_and_the_next_sync_is_full() {
    let (mut backend, kernel, _) = backend();
    let world = World::new(&[service_port("web", "10.96.0.10", &["10.244.2.3"])]);
    world.sync(&mut backend, true, &[]).unwrap();
    kernel.wipe_table(IpFamily::V4, Table::Nat);

    // The new endpoint's chain is written; KUBE-SVC's jump to the
    // unchanged one meets a chain that is gone.
    let grown = World::new(&[service_port(
        "web",
        "10.96.0.10",
        &["10.244.2.3", "10.244.2.7"],
    )]);
    let failed = grown.sync(&mut backend, false, &["web"]);

    assert!(failed.is_err(), "{failed:?}");
    let outcome = grown.sync(&mut backend, false, &[]).unwrap();
    assert!(outcome.full, "the sync after the failure is full");
    let trace = with_jumps(&kernel)
        .trace(
            &Packet::tcp(ip("10.244.1.5"), ip("10.96.0.10"), 80),
            &[ip(NODE_IP)],
        )
        .unwrap();
    assert_eq!(trace.destinations().len(), 2, "both endpoints work again");
}

/// `n` Services of two endpoints each, `svc<i>` at 10.96.<i/250>.<i%250+1>;
/// Service `svc0`'s second endpoint is `second`.
fn many_services(n: usize, second: &str) -> World {
    let ports: Vec<_> = (0..n)
        .map(|i| {
            let cluster_ip = format!("10.96.{}.{}", i / 250, i % 250 + 1);
            let first = format!("10.244.{}.{}", 10 + i / 250, i % 250 + 1);
            let other = format!("10.245.{}.{}", 10 + i / 250, i % 250 + 1);
            let other = if i == 0 { second.to_owned() } else { other };
            service_port(&format!("svc{i}"), &cluster_ip, &[&first, &other])
        })
        .collect();
    World::new(&ports)
}

fn nat_chains(kernel: &FakeKernel) -> BTreeSet<String> {
    kernel
        .chains(IpFamily::V4, Table::Nat)
        .into_iter()
        .filter(|c| c.starts_with("KUBE-SEP-") || c.starts_with("KUBE-SVC-"))
        .collect()
}

#[test]
fn in_a_large_cluster_partial_syncs_delete_the_chains_they_make_stale_without_listing() {
    let (mut backend, kernel, _) = backend();
    // 1,200 endpoints: large-cluster mode, where upstream purges stale
    // chains only once per syncPeriod.
    let first = many_services(600, "10.246.0.1");
    first.sync(&mut backend, true, &[]).unwrap();
    let before = nat_chains(&kernel);
    kernel.take_calls();

    for generation in 2..=20 {
        many_services(600, &format!("10.246.0.{generation}"))
            .sync(&mut backend, false, &["svc0"])
            .unwrap();
    }

    let calls = kernel.take_calls();
    assert!(
        !calls.iter().any(|c| matches!(c, FakeCall::SaveTable(..))),
        "partial syncs list nothing: {:?}",
        calls
            .iter()
            .filter(|c| matches!(c, FakeCall::SaveTable(..)))
            .collect::<Vec<_>>()
    );
    let after = nat_chains(&kernel);
    assert_eq!(
        after.len(),
        before.len(),
        "one SEP chain replaced by one, 19 times"
    );
    let gone: Vec<_> = before.difference(&after).collect();
    let added: Vec<_> = after.difference(&before).collect();
    assert_eq!((gone.len(), added.len()), (1, 1), "{gone:?} {added:?}");
    let last = restores(&calls).pop().unwrap().to_owned();
    assert_eq!(
        last.lines().filter(|l| l.starts_with("-X ")).count(),
        1,
        "{last}"
    );
}

#[test]
fn a_full_sync_deletes_stale_chains_no_sync_of_this_backend_wrote() {
    let (mut backend, kernel, _) = backend();
    let world = World::new(&[service_port("web", "10.96.0.10", &["10.244.2.3"])]);
    world.sync(&mut backend, true, &[]).unwrap();
    // A chain an earlier process left, unknown to this one's record.
    let leftover = "KUBE-SEP-LEFTOVER0000000000";
    kernel
        .applier()
        .restore(
            IpFamily::V4,
            &format!("*nat\n:{leftover} - [0:0]\nCOMMIT\n"),
        )
        .unwrap();

    let moved = World::new(&[service_port("web", "10.96.0.10", &["10.244.2.7"])]);
    moved.sync(&mut backend, false, &["web"]).unwrap();
    assert!(kernel
        .chains(IpFamily::V4, Table::Nat)
        .iter()
        .any(|c| c == leftover));

    moved.sync(&mut backend, true, &[]).unwrap();
    assert!(!kernel
        .chains(IpFamily::V4, Table::Nat)
        .iter()
        .any(|c| c == leftover));
}
