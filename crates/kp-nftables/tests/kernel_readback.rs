//! Kernel test: the table the kernel holds, read back over netlink
//! (`kp_nftables::live::read_table`), is the table the rendered
//! transactions say, and packets traced through either end the same way;
//! after a partial sync too. When someone deletes one map element or one
//! rule with `nft`, the read-back shows the difference (what `kube-proxy
//! check` reports). Both families, each in a network namespace of its own.
//! Besides: a table of 1,000 Services reads back whole; a table written by
//! `nft -f` reads back as the netlink one; reads during a stream of commits
//! are each one whole table.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web:p80 | ClusterIP 10.96.0.10, endpoints 10.244.1.2 (here), 10.244.2.2 (node-2) |
//! | ns1/np:p80 | NodePort 30080, externalIP 203.0.113.5, eTP Local, endpoint 10.244.2.3 (node-2) |
//! | ns1/lb:p80 | LB 203.0.113.9 from 198.51.100.0/24, NodePort 30081, eTP Local, affinity 300 s, endpoint 10.244.1.4 |
//! | ns1/lb2:p443 | LB 203.0.113.10 from 198.51.100.0/25, 198.51.100.128/25, 192.0.2.7/32, endpoint 10.244.1.5 |
//! | ns1/empty:p80 | ClusterIP 10.96.0.14, externalIP 203.0.113.6, no endpoints |
//! | ns1/itp:p80 | ClusterIP 10.96.0.15, iTP Local, endpoint 10.244.2.5 (node-2) |
//! | ns1/dns:p53 | UDP ClusterIP 10.96.0.16, endpoint 10.244.1.6 |
//! | IPv6: ns1/web | ClusterIP fd00:10:96::10, NodePort 30090, endpoints fd00:10:244:1::2, fd00:10:244:2::2 |
//! | IPv6: ns1/lb | LB fd00:203::9 from fd00:198::/64, fd00:199::/64, affinity 60 s, endpoint fd00:10:244:1::4 |
//! | IPv6: ns1/empty | ClusterIP fd00:10:96::14, no endpoints |
//!
//! Node 192.168.99.2 / fd00:192:168:99::2; sources traced from: a pod of
//! this node, a client, the node itself, an address inside the source
//! ranges.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use kp_model::{IpFamily, NamespacedName, NodeInfo, ServicePortName};
use kp_nftables::generation::Watch;
use kp_nftables::live::{self, differences, kernel_form};
use kp_nftables::model::Transaction;
use kp_nftables::tracer::{Packet, Table, Verdict};
use kp_nftables::{Applier, ApplyError, NetlinkApplier, NftablesBackend, NftablesOptions};
use kp_node::{LocalDetector, NodePortAddresses};
use kp_sync::testing::{service, ServiceBuilder};
use kp_sync::{Backend, ServicePortState, StaleConntrack, SyncRequest};
use kp_testkit::netns::{require_root, require_tool, Netns};

/// The NetlinkApplier, keeping a copy of every transaction it committed.
struct Recording {
    inner: NetlinkApplier,
    committed: Arc<Mutex<Vec<Transaction>>>,
}

impl Applier for Recording {
    fn apply(&mut self, transaction: &Transaction) -> Result<(), ApplyError> {
        self.inner.apply(transaction)?;
        self.committed.lock().unwrap().push(transaction.clone());
        Ok(())
    }

    fn generation(&mut self) -> Option<Result<u32, ApplyError>> {
        self.inner.generation()
    }

    fn watch(&mut self) -> Option<Box<dyn Watch>> {
        self.inner.watch()
    }

    fn apply_at(&mut self, transaction: &Transaction, generation: u32) -> Result<(), ApplyError> {
        self.inner.apply_at(transaction, generation)?;
        self.committed.lock().unwrap().push(transaction.clone());
        Ok(())
    }
}

/// One family's proxy in a namespace of its own: the backend over the
/// recording applier, and the Services it syncs.
struct Node {
    family: IpFamily,
    netns: Netns,
    backend: NftablesBackend,
    committed: Arc<Mutex<Vec<Transaction>>>,
    services: BTreeMap<ServicePortName, ServicePortState>,
    node: NodeInfo,
    /// The committed transactions replayed, in order.
    intended: Table,
    replayed: usize,
}

struct Plan {
    pod: &'static str,
    client: &'static str,
    node: &'static str,
    in_source_range: &'static str,
    cluster: fn() -> Vec<ServiceBuilder>,
    /// ns1/web without its endpoint on node-2.
    web_without_remote: fn() -> ServiceBuilder,
    web_cluster_ip: &'static str,
    web_port_key: &'static str,
}

const V4: Plan = Plan {
    pod: "10.244.1.7",
    client: "192.168.99.10",
    node: "192.168.99.2",
    in_source_range: "198.51.100.7",
    cluster: v4_cluster,
    web_without_remote: || {
        service("ns1", "web", "10.96.0.10", 80).local_endpoint("10.244.1.2", 8080)
    },
    web_cluster_ip: "10.96.0.10",
    web_port_key: "10.96.0.10 . tcp . 80",
};

const V6: Plan = Plan {
    pod: "fd00:10:244:1::7",
    client: "fd00:192:168:99::10",
    node: "fd00:192:168:99::2",
    in_source_range: "fd00:198::7",
    cluster: v6_cluster,
    web_without_remote: || {
        service("ns1", "web", "fd00:10:96::10", 80)
            .node_port(30090)
            .local_endpoint("fd00:10:244:1::2", 8080)
    },
    web_cluster_ip: "fd00:10:96::10",
    web_port_key: "fd00:10:96::10 . tcp . 80",
};

fn v4_cluster() -> Vec<ServiceBuilder> {
    vec![
        service("ns1", "web", "10.96.0.10", 80)
            .local_endpoint("10.244.1.2", 8080)
            .remote_endpoint("10.244.2.2", 8080),
        service("ns1", "np", "10.96.0.11", 80)
            .node_port(30080)
            .external_ip("203.0.113.5")
            .etp_local()
            .remote_endpoint("10.244.2.3", 8080),
        service("ns1", "lb", "10.96.0.12", 80)
            .lb_ip("203.0.113.9")
            .source_range("198.51.100.0/24")
            .node_port(30081)
            .etp_local()
            .affinity_secs(300)
            .local_endpoint("10.244.1.4", 8080),
        service("ns1", "lb2", "10.96.0.13", 443)
            .lb_ip("203.0.113.10")
            .source_range("198.51.100.0/25")
            .source_range("198.51.100.128/25")
            .source_range("192.0.2.7/32")
            .local_endpoint("10.244.1.5", 8443),
        service("ns1", "empty", "10.96.0.14", 80).external_ip("203.0.113.6"),
        service("ns1", "itp", "10.96.0.15", 80)
            .itp_local()
            .remote_endpoint("10.244.2.5", 8080),
        service("ns1", "dns", "10.96.0.16", 53)
            .udp()
            .local_endpoint("10.244.1.6", 53),
    ]
}

fn v6_cluster() -> Vec<ServiceBuilder> {
    vec![
        service("ns1", "web", "fd00:10:96::10", 80)
            .node_port(30090)
            .local_endpoint("fd00:10:244:1::2", 8080)
            .remote_endpoint("fd00:10:244:2::2", 8080),
        service("ns1", "lb", "fd00:10:96::12", 80)
            .lb_ip("fd00:203::9")
            .source_range("fd00:198::/64")
            .source_range("fd00:199::/64")
            .affinity_secs(60)
            .local_endpoint("fd00:10:244:1::4", 8080),
        service("ns1", "empty", "fd00:10:96::14", 80),
    ]
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn family_keyword(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

impl Node {
    fn start(family: IpFamily, plan: &Plan) -> Self {
        let netns = Netns::create("readback").unwrap();
        let committed = Arc::new(Mutex::new(Vec::new()));
        let applier = Recording {
            inner: NetlinkApplier::new(),
            committed: Arc::clone(&committed),
        };
        let options = NftablesOptions {
            local_detector: LocalDetector::ClusterCidr(vec![
                "10.244.0.0/16".parse().unwrap(),
                "fd00:10:244::/48".parse().unwrap(),
            ]),
            ..NftablesOptions::default()
        };
        let backend =
            NftablesBackend::new(family, options, NodePortAddresses::All, Box::new(applier))
                .unwrap()
                .with_layout(kp_nftables::Layout::Chains)
                .with_local_addresses(|_| Ok(Vec::new()));
        Self {
            family,
            netns,
            backend,
            committed,
            services: (plan.cluster)()
                .into_iter()
                .map(ServiceBuilder::build)
                .collect(),
            node: NodeInfo {
                name: "node-1".to_owned(),
                addresses: vec![ip(V4.node), ip(V6.node)],
                ..NodeInfo::default()
            },
            intended: Table::new(),
            replayed: 0,
        }
    }

    /// One sync in the namespace; the transactions it committed are
    /// replayed on the intended table.
    fn sync(&mut self, full: bool, changed: &[(&str, &str)]) {
        let changed: BTreeSet<NamespacedName> = changed
            .iter()
            .map(|(ns, name)| NamespacedName::new(ns, name))
            .collect();
        let stale = StaleConntrack::default();
        let request = SyncRequest {
            family: self.family,
            full,
            service_ports: &self.services,
            changed_services: &changed,
            node: &self.node,
            stale_conntrack: &stale,
        };
        let backend = &mut self.backend;
        let outcome = self.netns.run(|| backend.sync(&request)).unwrap();
        assert_eq!(outcome.full, full, "{outcome:?}");
        let committed = self.committed.lock().unwrap().clone();
        for transaction in &committed[self.replayed..] {
            self.intended.apply(transaction).unwrap();
        }
        self.replayed = committed.len();
    }

    fn read(&self) -> Option<Table> {
        let family = self.family;
        self.netns.run(|| live::read_table(family)).unwrap()
    }

    fn nft(&self, args: &[&str]) -> String {
        self.netns.exec_ok("nft", args)
    }

    /// The handle of rule `index` of `chain` (`nft -a list chain`).
    fn rule_handle(&self, chain: &str, index: usize) -> String {
        let listing = self.nft(&[
            "-a",
            "list",
            "chain",
            family_keyword(self.family),
            "kube-proxy",
            chain,
        ]);
        let handles: Vec<&str> = listing
            .lines()
            .filter(|line| !line.trim_start().starts_with("chain ") && line.contains("# handle"))
            .filter_map(|line| line.rsplit("# handle ").next())
            .collect();
        handles[index].trim().to_owned()
    }
}

/// Every packet to a Service address and port of `table`'s maps, from
/// each source of the plan: ClusterIPs, external and load balancer IPs
/// (`service-ips`, `no-endpoint-services`, `firewall-ips`), and NodePorts
/// at the node's address (`service-nodeports`, `no-endpoint-nodeports`).
fn packets(table: &Table, plan: &Plan) -> Vec<Packet> {
    let sources = [plan.pod, plan.client, plan.node, plan.in_source_range];
    let protocol = |text: &str| -> &'static str {
        match text {
            "tcp" => "tcp",
            "udp" => "udp",
            "sctp" => "sctp",
            other => panic!("protocol {other}"),
        }
    };
    let mut destinations = BTreeSet::new();
    for map in ["service-ips", "no-endpoint-services", "firewall-ips"] {
        for key in table.maps[map].keys() {
            let parts: Vec<&str> = key.split(" . ").collect();
            destinations.insert((ip(parts[0]), protocol(parts[1]), parts[2].parse().unwrap()));
        }
    }
    for map in ["service-nodeports", "no-endpoint-nodeports"] {
        for key in table.maps[map].keys() {
            let parts: Vec<&str> = key.split(" . ").collect();
            destinations.insert((ip(plan.node), protocol(parts[0]), parts[1].parse().unwrap()));
        }
    }
    let mut out = Vec::new();
    for (dst, protocol, dport) in destinations {
        for src in sources {
            out.push(Packet {
                src: ip(src),
                dst,
                protocol,
                dport,
                src_local: src == plan.node,
                dst_local: dst == ip(plan.node),
            });
        }
    }
    out
}

/// The read-back equals the intended table (in the kernel's form), and
/// every Service packet ends the same way through both.
#[track_caller]
fn assert_kernel_holds_intended(node: &Node, plan: &Plan, when: &str) {
    let read = node.read().unwrap_or_else(|| panic!("{when}: no table"));
    let intended = kernel_form(&node.intended);
    let diff = differences(&intended, &read);
    assert!(
        diff.is_empty(),
        "{when}: read-back differs:\n{}",
        diff.join("\n")
    );
    assert_eq!(read, intended, "{when}");
    let packets = packets(&intended, plan);
    assert!(packets.len() >= 20, "{when}: {} packets", packets.len());
    let mut dnat = 0;
    for packet in &packets {
        let want = node.intended.trace(packet).unwrap();
        let got = read.trace(packet).unwrap();
        assert_eq!(got, want, "{when}: {packet:?}");
        dnat += usize::from(matches!(want, Verdict::Dnat { .. }));
    }
    assert!(dnat > 5, "{when}: only {dnat} packets DNATed");
}

fn story(family: IpFamily, plan: &Plan) {
    require_root();
    require_tool("nft");
    let mut node = Node::start(family, plan);
    assert!(node.read().is_none(), "no table before the first sync");

    // Another program's table of the same family, with a chain and a rule
    // our decoder would refuse: not read.
    let keyword = family_keyword(family);
    for args in [
        vec!["add", "table", keyword, "other"],
        vec!["add", "chain", keyword, "other", "foreign"],
        vec!["add", "rule", keyword, "other", "foreign", "counter"],
    ] {
        node.nft(&args);
    }

    // A full sync, read back.
    node.sync(true, &[]);
    assert_kernel_holds_intended(&node, plan, "after the full sync");

    // web loses its endpoint on node-2: a partial sync, read back.
    let (name, state) = (plan.web_without_remote)().build();
    assert!(node.services.insert(name, state).is_some());
    node.sync(false, &[("ns1", "web")]);
    assert_kernel_holds_intended(&node, plan, "after the partial sync");

    // Someone deletes web's ClusterIP element: the read-back misses it,
    // and a packet to it is now refused instead of DNATed.
    let element = format!("{{ {} }}", plan.web_port_key);
    node.nft(&[
        "delete",
        "element",
        keyword,
        "kube-proxy",
        "service-ips",
        &element,
    ]);
    let read = node.read().unwrap();
    let intended = kernel_form(&node.intended);
    let diff = differences(&intended, &read);
    assert_eq!(
        diff,
        [format!(
            "set service-ips: element {} missing",
            plan.web_port_key
        )]
    );
    let to_web = Packet {
        src: ip(plan.pod),
        dst: ip(plan.web_cluster_ip),
        protocol: "tcp",
        dport: 80,
        src_local: false,
        dst_local: false,
    };
    assert!(matches!(
        node.intended.trace(&to_web).unwrap(),
        Verdict::Dnat { .. }
    ));
    assert_eq!(read.trace(&to_web).unwrap(), Verdict::Reject);

    // A packet adds an address to an affinity set: the kernel holds an
    // element no transaction wrote, which is not drift.
    let affinity = intended
        .dynamic_sets
        .iter()
        .next()
        .expect("an affinity set")
        .clone();
    let source = format!("{{ {} }}", plan.pod);
    node.nft(&["add", "element", keyword, "kube-proxy", &affinity, &source]);
    let read = node.read().unwrap();
    assert!(read.maps[&affinity].contains_key(plan.pod), "{affinity}");
    assert_eq!(
        differences(&intended, &read),
        [format!(
            "set service-ips: element {} missing",
            plan.web_port_key
        )]
    );

    // Someone deletes the rule that sets the masquerade mark.
    let handle = node.rule_handle("mark-for-masquerade", 0);
    node.nft(&[
        "delete",
        "rule",
        keyword,
        "kube-proxy",
        "mark-for-masquerade",
        "handle",
        &handle,
    ]);
    let diff = differences(&intended, &node.read().unwrap());
    assert_eq!(
        diff,
        [
            "chain mark-for-masquerade: rule 0 missing".to_owned(),
            format!("set service-ips: element {} missing", plan.web_port_key),
        ]
    );

    // Someone moves a base chain to another priority.
    for args in [
        vec!["flush", "chain", keyword, "kube-proxy", "filter-output"],
        vec!["delete", "chain", keyword, "kube-proxy", "filter-output"],
        vec![
            "add",
            "chain",
            keyword,
            "kube-proxy",
            "filter-output",
            "{ type filter hook output priority 5 ; }",
        ],
    ] {
        node.nft(&args);
    }
    let diff = differences(&intended, &node.read().unwrap());
    assert!(
        diff.iter()
            .any(|line| line.starts_with("chain filter-output: hooks in as")
                && line.contains("priority: 5")),
        "{diff:#?}"
    );

    // The table deleted: the read-back says so, and the kernel refuses a
    // partial sync onto it as the FakeApplier does.
    node.nft(&["delete", "table", keyword, "kube-proxy"]);
    assert!(node.read().is_none(), "no table after nft delete table");
    let partial = node.committed.lock().unwrap().last().cloned().unwrap();
    assert!(
        !partial
            .commands
            .iter()
            .any(|c| matches!(c, kp_nftables::Command::AddTable { .. })),
        "the last transaction is a partial one"
    );
    let mut applier = NetlinkApplier::new();
    let error = node.netns.run(|| applier.apply(&partial)).unwrap_err();
    let ApplyError::Kernel { message, line, .. } = &error else {
        panic!("a kernel refusal, not {error:?}");
    };
    assert_eq!(message, "No such file or directory (os error 2)", "{error}");
    assert!(line.is_some(), "{error}");
    let mut fake = kp_nftables::FakeApplier::new();
    let fake_error = fake.apply(&partial).unwrap_err();
    assert!(
        matches!(&fake_error, ApplyError::Kernel { message: m, line: Some(_), .. } if m == message),
        "{fake_error:?}"
    );
}

#[test]
fn the_ipv4_table_read_back_is_the_rendered_one_until_someone_changes_it() {
    story(IpFamily::V4, &V4);
}

#[test]
fn the_ipv6_table_read_back_is_the_rendered_one_until_someone_changes_it() {
    story(IpFamily::V6, &V6);
}

#[test]
fn a_table_of_a_thousand_services_reads_back_whole() {
    require_root();
    require_tool("nft");
    let mut node = Node::start(IpFamily::V4, &V4);
    for n in 0..1000u32 {
        let (name, state) = service(
            "ns2",
            &format!("fill{n}"),
            &format!("10.96.{}.{}", 10 + n / 250, n % 250),
            80,
        )
        .local_endpoint(&format!("10.244.1.{}", 2 + n % 200), 8080)
        .remote_endpoint(&format!("10.244.2.{}", 2 + n % 200), 8080)
        .build();
        node.services.insert(name, state);
    }
    node.sync(true, &[]);
    let read = node.read().unwrap();
    let intended = kernel_form(&node.intended);
    let diff = differences(&intended, &read);
    assert!(diff.is_empty(), "{}", diff.join("\n"));
    assert_eq!(read, intended);
    // Every dump took several datagrams: thousands of rules and elements.
    let rules: usize = read.chains.values().map(Vec::len).sum();
    assert!(rules > 5000, "{rules} rules");
    assert!(read.maps["service-ips"].len() > 1000);
}

/// The same transactions committed by `nft -f` (the NftApplier), which
/// writes some matches its own way (a byte-aligned prefix loads only its
/// bytes: `ip daddr != 127.0.0.0/8` compares one byte), read back as the
/// same table.
#[test]
fn a_table_written_by_nft_reads_back_as_the_same_table() {
    require_root();
    require_tool("nft");
    for (family, plan) in [(IpFamily::V4, &V4), (IpFamily::V6, &V6)] {
        let mut node = Node::start(family, plan);
        node.sync(true, &[]);
        let by_nft = Netns::create("readback-nft").unwrap();
        let committed = node.committed.lock().unwrap().clone();
        by_nft.run(|| {
            let mut nft = kp_nftables::NftApplier::new();
            for transaction in &committed {
                nft.apply(transaction).unwrap();
            }
        });
        let read = by_nft
            .run(|| live::read_table(family))
            .unwrap_or_else(|error| panic!("{family:?}: {error}"))
            .unwrap();
        let intended = kernel_form(&node.intended);
        let diff = differences(&intended, &read);
        assert!(diff.is_empty(), "{family:?}:\n{}", diff.join("\n"));
        assert_eq!(read, intended, "{family:?}");
        assert_eq!(read, node.read().unwrap(), "{family:?}: nft and netlink");
    }
}

/// While another thread commits and undoes, over and over, one change that
/// spans the first dump (a chain) and the last (a map element), every read
/// that succeeds is the table before or after it, never half of each: the
/// generation read before and after the dumps sends a torn read round
/// again.
#[test]
fn a_read_during_commits_is_one_table_or_the_other_never_half() {
    use kp_nftables::model::{ChainKind, Command, Expr, Key, Name, Rule, SetElement, Verdict};
    use std::sync::atomic::{AtomicBool, Ordering};

    require_root();
    require_tool("nft");
    let mut node = Node::start(IpFamily::V4, &V4);
    node.sync(true, &[]);
    let chain = Name::Shared(Arc::from("service-ZZZZZZZZ-ns9/probe/tcp/p1"));
    let key = Key::AddrProtoPort(ip("10.96.99.99"), kp_model::Protocol::Tcp, 1);
    let add = Transaction {
        family: IpFamily::V4,
        commands: vec![
            Command::AddChain {
                name: chain.clone(),
                kind: ChainKind::Regular,
            },
            Command::AddRule(Rule::new(chain.clone(), vec![Expr::Reject])),
            Command::AddElements {
                set: Name::Fixed("service-ips"),
                elements: vec![SetElement {
                    key,
                    comment: None,
                    verdict: Some(Verdict::Goto(chain.clone())),
                }],
            },
        ],
    };
    let undo = Transaction {
        family: IpFamily::V4,
        commands: vec![
            Command::DeleteElements {
                set: Name::Fixed("service-ips"),
                keys: vec![key],
            },
            Command::FlushChain(chain.clone()),
            Command::DeleteChain(chain.clone()),
        ],
    };
    let before = kernel_form(&node.intended);
    let mut after = node.intended.clone();
    after.apply(&add).unwrap();
    let after = kernel_form(&after);

    let done = AtomicBool::new(false);
    let (reads, changing) = std::thread::scope(|scope| {
        let netns = &node.netns;
        let done = &done;
        let committer = scope.spawn(|| {
            netns.run(|| {
                let mut applier = NetlinkApplier::new();
                for _ in 0..1000 {
                    applier.apply(&add).unwrap();
                    applier.apply(&undo).unwrap();
                }
            });
            done.store(true, Ordering::SeqCst);
        });
        let reads = netns.run(|| {
            let (mut reads, mut changing) = (0, 0);
            while !done.load(Ordering::SeqCst) {
                match live::read_table(IpFamily::V4) {
                    Ok(Some(read)) => {
                        assert!(
                            read == before || read == after,
                            "a read of neither table:\n{}\n--- or ---\n{}",
                            differences(&before, &read).join("\n"),
                            differences(&after, &read).join("\n"),
                        );
                        reads += 1;
                    }
                    Ok(None) => panic!("the table vanished"),
                    Err(live::ReadError::Changing { .. }) => changing += 1,
                    Err(error) => panic!("{error}"),
                }
            }
            (reads, changing)
        });
        committer.join().unwrap();
        reads
    });
    println!("{reads} whole reads, {changing} given up while commits went on");
    assert_eq!(node.read().unwrap(), before, "after the last undo");
}
