//! Kernel tests of the IPVS mode: the real netlink kernel programs IPVS,
//! ipsets and kube-ipvs0 in a node namespace, and real connections from a
//! pod namespace prove the result.
//!
//! They need a kernel with IPVS, which the build machines lack, so they are
//! `#[ignore]`d and named `vm_…`: `cargo test -p kp-ipvs` runs everything
//! else, and scripts/ipvs-vm/run runs these inside a virtual machine with
//! `--ignored`. Run on a kernel without IPVS they fail and say why.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web, p80 80/TCP | ClusterIP 10.96.0.10, endpoints ep1, ep2 (node-1), ep3 (node-2) |
//! | ns1/empty, p80 80/TCP | ClusterIP 10.96.0.14, no endpoints |
//! | ns1/np, p80 80/TCP | NodePort 30080, externalIP 203.0.113.5, LB 203.0.113.9, endpoints ep1, ep3 |
//! | ns1/local, p80 80/TCP | NodePort 30081, externalTrafficPolicy Local, endpoints ep1, ep3 |
//! | ns1/sticky, p80 80/TCP | ClusterIP 10.96.0.13, ClientIP affinity, endpoints ep1, ep2 |
//! | ns1/dns, p53 53/UDP | ClusterIP 10.96.0.20, endpoint ep2 |
//! | ns1/web6, p80 80/TCP | ClusterIP fd00:10:96::10, endpoints ep1, ep2 (fd00:10:96::11 with ip6tables, ep1) |
//! | ns1/lb, p80 80/TCP | LB 203.0.113.9, loadBalancerSourceRanges client/32, endpoint ep1 |
//! | source of pod traffic | pod `src` on node-1, not an endpoint; `client` outside |
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use kp_iptables::{
    Applier, ApplyError, IptablesFlavor, JumpRule, SavedTable, SystemApplier, Table,
};
use kp_ipvs::kernel::IpvsKernel;
use kp_ipvs::netlink::NetlinkKernel;
use kp_ipvs::testing::{service, Ports, RequestParts};
use kp_ipvs::{
    cleanup_with, IpvsBackend, IpvsOptions, Op, ServiceKey, SetKind, VirtualServer, DUMMY_LINK,
};
use kp_model::IpFamily;
use kp_sync::Backend;
use kp_testkit::netns::{
    connect, expect_refused, expect_timeout, hits, hits_until_all, require_root, udp_roundtrip,
    TcpSession, Topology,
};

const NEEDS_IPVS: &str = "needs a kernel with IPVS: run scripts/ipvs-vm/run";

/// The iptables rules are proven by the golden tests and by kp-iptables'
/// applier; these tests prove the IPVS, ipset and link side, so restores
/// are only counted.
#[derive(Default)]
struct CountingApplier(usize);

impl Applier for CountingApplier {
    fn restore(&mut self, _: IpFamily, _: &str) -> Result<(), ApplyError> {
        self.0 += 1;
        Ok(())
    }
    fn save_table(&mut self, _: IpFamily, _: Table) -> Result<SavedTable, ApplyError> {
        Ok(SavedTable::default())
    }
    fn chain_exists(&mut self, _: IpFamily, _: Table, _: &str) -> Result<bool, ApplyError> {
        Ok(self.0 > 0)
    }
    fn ensure_chain(&mut self, _: IpFamily, _: Table, _: &str) -> Result<(), ApplyError> {
        Ok(())
    }
    fn delete_jump(&mut self, _: IpFamily, _: &JumpRule) -> Result<bool, ApplyError> {
        Ok(false)
    }
    fn flush_and_delete_chain(
        &mut self,
        _: IpFamily,
        _: Table,
        _: &str,
    ) -> Result<bool, ApplyError> {
        Ok(false)
    }
}

#[track_caller]
fn require_ipvs() {
    require_root();
    assert!(
        Path::new("/proc/net/ip_vs").exists(),
        "this kernel has no IPVS (/proc/net/ip_vs is missing; the ip_vs module is not loaded): {NEEDS_IPVS}"
    );
}

fn at(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap(), port)
}

fn ip_of(topology: &Topology, pod: &str) -> String {
    topology.pod(pod).ip().to_string()
}

#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_cluster_ip_spreads_over_three_endpoints_and_an_empty_service_refuses() {
    require_ipvs();
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(80))
        .pod("ep2", |p| p.tcp(80))
        .remote_pod("ep3", |p| p.tcp(80))
        .pod("src", |p| p)
        .build()
        .unwrap();
    let ports = Ports::new()
        .with(
            service("ns1", "web", "10.96.0.10", 80)
                .endpoint(&ip_of(&topology, "ep1"), 80, true)
                .endpoint(&ip_of(&topology, "ep2"), 80, true)
                .endpoint(&ip_of(&topology, "ep3"), 80, false),
        )
        .with(service("ns1", "empty", "10.96.0.14", 80))
        .build();
    let parts = RequestParts::new(ports, "192.168.99.2");
    let mut backend = IpvsBackend::new(
        IpFamily::V4,
        IpvsOptions::default(),
        Box::new(NetlinkKernel::new()),
        Box::new(CountingApplier::default()),
    );
    topology
        .node()
        .run(|| backend.sync(&parts.request(true)))
        .expect("the first sync programs the node");

    let counts = hits_until_all(
        topology.pod("src"),
        at("10.96.0.10", 80),
        &["ep1", "ep2", "ep3"],
        60,
    );
    assert_eq!(
        counts.keys().collect::<Vec<_>>(),
        ["ep1", "ep2", "ep3"],
        "rr spreads connections over every endpoint: {counts:?}"
    );
    expect_refused(topology.pod("src"), at("10.96.0.14", 80));

    // What the kernel holds is what was planned: a second full sync sends
    // nothing but its listing.
    let listed = topology
        .node()
        .run(|| NetlinkKernel::new().list(IpFamily::V4))
        .unwrap();
    assert!(listed.link, "{DUMMY_LINK} exists");
    let addresses: Vec<IpAddr> = listed.addresses.iter().copied().collect();
    assert_eq!(
        addresses,
        [
            "10.96.0.10".parse::<IpAddr>().unwrap(),
            "10.96.0.14".parse().unwrap()
        ]
    );
    assert_eq!(listed.services.len(), 2);
    assert_eq!(&listed, backend.applied().unwrap());
    let outcome = topology
        .node()
        .run(|| backend.sync(&parts.request(true)))
        .unwrap();
    assert_eq!(outcome.objects_written, 0, "nothing was rewritten");
}

#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_one_endpoint_change_touches_one_real_server() {
    require_ipvs();
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(80))
        .remote_pod("ep2", |p| p.tcp(80))
        .pod("src", |p| p)
        .build()
        .unwrap();
    // ep2 is on another node, so adding it changes no hairpin set member.
    let web = |both: bool| {
        let mut svc =
            service("ns1", "web", "10.96.0.10", 80).endpoint(&ip_of(&topology, "ep1"), 80, true);
        if both {
            svc = svc.endpoint(&ip_of(&topology, "ep2"), 80, false);
        }
        RequestParts::new(Ports::new().with(svc).build(), "192.168.99.2")
    };
    let mut backend = IpvsBackend::new(
        IpFamily::V4,
        IpvsOptions::default(),
        Box::new(NetlinkKernel::new()),
        Box::new(CountingApplier::default()),
    );
    let one = web(false);
    let two = web(true);
    topology
        .node()
        .run(|| backend.sync(&one.request(true)))
        .unwrap();
    let counts = hits_until_all(topology.pod("src"), at("10.96.0.10", 80), &["ep1"], 10);
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["ep1"]);
    let outcome = topology
        .node()
        .run(|| backend.sync(&two.request(false)))
        .unwrap();
    assert_eq!(outcome.objects_written, 1, "one real server added");
    let counts = hits_until_all(
        topology.pod("src"),
        at("10.96.0.10", 80),
        &["ep1", "ep2"],
        60,
    );
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["ep1", "ep2"]);
}

/// A backend for the node of `topology`, with the real netlink kernel.
fn node_backend(family: IpFamily) -> IpvsBackend {
    IpvsBackend::new(
        family,
        IpvsOptions::default(),
        Box::new(NetlinkKernel::new()),
        Box::new(CountingApplier::default()),
    )
}

#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_node_port_external_and_load_balancer_ips_answer_a_client() {
    require_ipvs();
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(80))
        .remote_pod("ep3", |p| p.tcp(80))
        .build()
        .unwrap();
    let ports = Ports::new()
        .with(
            service("ns1", "np", "10.96.0.11", 80)
                .node_port(30080)
                .external_ip("203.0.113.5")
                .lb_ip("203.0.113.9")
                .endpoint(&ip_of(&topology, "ep1"), 80, true)
                .endpoint(&ip_of(&topology, "ep3"), 80, false),
        )
        .with(
            service("ns1", "local", "10.96.0.12", 80)
                .node_port(30081)
                .etp_local()
                .health_check_node_port(30999)
                .endpoint(&ip_of(&topology, "ep1"), 80, true)
                .endpoint(&ip_of(&topology, "ep3"), 80, false),
        )
        .build();
    let parts = RequestParts::new(ports, "192.168.99.2");
    let mut backend = node_backend(IpFamily::V4);
    topology
        .node()
        .run(|| backend.sync(&parts.request(true)))
        .unwrap();

    let client = topology.client();
    for address in [
        at("192.168.99.2", 30080),
        at("203.0.113.5", 80),
        at("203.0.113.9", 80),
    ] {
        let counts = hits_until_all(client, address, &["ep1", "ep3"], 60);
        assert_eq!(
            counts.keys().collect::<Vec<_>>(),
            ["ep1", "ep3"],
            "{address}: {counts:?}"
        );
    }
    // externalTrafficPolicy Local: only the local endpoint, and it sees the
    // client's own address.
    let counts = hits(client, at("192.168.99.2", 30081), 12);
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["ep1"], "{counts:?}");
    let reply = connect(client, at("192.168.99.2", 30081)).unwrap();
    assert_eq!(
        reply.source,
        IpAddr::V4(client.ip()),
        "the client address is preserved"
    );
}

#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_session_affinity_sticks_and_udp_round_trips() {
    require_ipvs();
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(80).udp(53))
        .pod("ep2", |p| p.tcp(80).udp(53))
        .pod("src", |p| p)
        .build()
        .unwrap();
    let ports = Ports::new()
        .with(
            service("ns1", "sticky", "10.96.0.13", 80)
                .affinity_secs(600)
                .endpoint(&ip_of(&topology, "ep1"), 80, true)
                .endpoint(&ip_of(&topology, "ep2"), 80, true),
        )
        .with(
            service("ns1", "dns", "10.96.0.20", 53)
                .protocol(kp_model::Protocol::Udp)
                .endpoint(&ip_of(&topology, "ep2"), 53, true),
        )
        .build();
    let parts = RequestParts::new(ports, "192.168.99.2");
    let mut backend = node_backend(IpFamily::V4);
    topology
        .node()
        .run(|| backend.sync(&parts.request(true)))
        .unwrap();
    let counts = hits(topology.pod("src"), at("10.96.0.13", 80), 16);
    assert_eq!(
        counts.len(),
        1,
        "every connection sticks to one endpoint: {counts:?}"
    );
    let reply = udp_roundtrip(topology.pod("src"), at("10.96.0.20", 53)).unwrap();
    assert_eq!(reply.backend, "ep2");
}

#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_a_removed_endpoint_keeps_its_open_connection_while_new_ones_avoid_it() {
    require_ipvs();
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(80))
        .pod("ep2", |p| p.tcp(80))
        .pod("src", |p| p)
        .build()
        .unwrap();
    let web = |with_ep1: bool| {
        let mut svc =
            service("ns1", "web", "10.96.0.10", 80).endpoint(&ip_of(&topology, "ep2"), 80, true);
        if with_ep1 {
            svc = svc.endpoint(&ip_of(&topology, "ep1"), 80, true);
        }
        RequestParts::new(Ports::new().with(svc).build(), "192.168.99.2")
    };
    let (both, only_ep2) = (web(true), web(false));
    let mut backend = node_backend(IpFamily::V4);
    topology
        .node()
        .run(|| backend.sync(&both.request(true)))
        .unwrap();
    let mut session = (0..40)
        .map(|_| TcpSession::open(topology.pod("src"), at("10.96.0.10", 80)).unwrap())
        .find(|s| s.backend() == "ep1")
        .expect("some connection reaches ep1");

    topology
        .node()
        .run(|| backend.sync(&only_ep2.request(false)))
        .unwrap();
    let reply = session.echo("still there").unwrap();
    assert_eq!(
        (reply.backend.as_str(), reply.text.as_str()),
        ("ep1", "still there")
    );
    let counts = hits(topology.pod("src"), at("10.96.0.10", 80), 12);
    assert_eq!(
        counts.keys().collect::<Vec<_>>(),
        ["ep2"],
        "new connections avoid ep1: {counts:?}"
    );
    let weight = |backend: &IpvsBackend| {
        backend
            .applied()
            .unwrap()
            .services
            .values()
            .next()
            .unwrap()
            .reals
            .get(&SocketAddr::new(topology.pod("ep1").ip().into(), 80))
            .copied()
    };
    assert_eq!(
        weight(&backend),
        Some(0),
        "drained, not deleted, while the connection is open"
    );
    // IPVS keeps a closed connection in TIME_WAIT for two minutes, so its
    // deletion once the count reaches zero is shown with the fake kernel
    // (backend tests) rather than waited for here.
    drop(session);
}

#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_cleanup_leaves_nothing_of_ours_and_keeps_a_foreign_virtual_server() {
    require_ipvs();
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(80))
        .build()
        .unwrap();
    let ports = Ports::new()
        .with(
            service("ns1", "web", "10.96.0.10", 80)
                .node_port(30080)
                .endpoint(&ip_of(&topology, "ep1"), 80, true),
        )
        .build();
    let parts = RequestParts::new(ports, "192.168.99.2");
    let mut backend = node_backend(IpFamily::V4);
    let foreign = ServiceKey {
        address: "192.168.99.2".parse().unwrap(),
        protocol: kp_model::Protocol::Tcp,
        port: 8443,
    };
    let report = topology.node().run(|| {
        backend.sync(&parts.request(true)).unwrap();
        let mut kernel = NetlinkKernel::new();
        let server = VirtualServer {
            scheduler: "lc".into(),
            flags: 0,
            timeout_secs: 0,
        };
        kernel
            .apply(IpFamily::V4, &[Op::AddService(foreign, server)])
            .unwrap();
        assert!(
            kp_ipvs::has_leftovers(),
            "kube-ipvs0 and the sets are found"
        );
        let report = cleanup_with(&mut kernel, &mut []).unwrap();
        assert!(!kp_ipvs::has_leftovers(), "nothing is left to find");
        report
    });
    // The ClusterIP, and the NodePort on each node address (the node's
    // 192.168.99.2 and the pods' gateway 169.254.1.1).
    assert!(report.services.len() >= 2, "{report:?}");
    assert!(
        report
            .services
            .iter()
            .all(|key| key.port == 30080 || key.address.to_string() == "10.96.0.10"),
        "{report:?}"
    );
    assert!(report.link);
    let (v4, v6) = topology.node().run(|| {
        let mut kernel = NetlinkKernel::new();
        (
            kernel.list(IpFamily::V4).unwrap(),
            kernel.list(IpFamily::V6).unwrap(),
        )
    });
    assert!(!v4.link, "kube-ipvs0 is gone");
    assert!(
        v4.sets.is_empty() && v6.sets.is_empty(),
        "no set of ours is left: {:?}",
        v4.sets.keys()
    );
    assert_eq!(
        v4.services.keys().copied().collect::<Vec<_>>(),
        [foreign],
        "the foreign virtual server stays"
    );
}

#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_with_iptables_source_ranges_filter_and_hairpin_masquerades() {
    require_ipvs();
    kp_testkit::netns::require_tool("iptables-legacy-restore");
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(80))
        .client("client")
        .client("client2")
        .build()
        .unwrap();
    let client = topology.client_named("client");
    let ports = Ports::new()
        .with(
            service("ns1", "lb", "10.96.0.15", 80)
                .lb_ip("203.0.113.9")
                .source_range(&format!("{}/32", client.ip()))
                .endpoint(&ip_of(&topology, "ep1"), 80, true),
        )
        .build();
    let parts = RequestParts::new(ports, "192.168.99.2");
    let mut backend = IpvsBackend::new(
        IpFamily::V4,
        IpvsOptions::default(),
        Box::new(NetlinkKernel::new()),
        Box::new(SystemApplier::new(IptablesFlavor::Legacy)),
    );
    topology
        .node()
        .run(|| backend.sync(&parts.request(true)))
        .unwrap();

    assert_eq!(
        connect(client, at("203.0.113.9", 80)).unwrap().backend,
        "ep1"
    );
    expect_timeout(topology.client_named("client2"), at("203.0.113.9", 80));
    // A pod reaching itself through its Service is masqueraded
    // (KUBE-LOOP-BACK), so the reply finds its way back.
    let reply = connect(topology.pod("ep1"), at("10.96.0.15", 80)).unwrap();
    assert_eq!(reply.backend, "ep1");
    assert_ne!(
        reply.source,
        IpAddr::V4(topology.pod("ep1").ip()),
        "hairpin traffic is masqueraded"
    );

    // A later full sync finds the chains and inserts no second jump.
    topology
        .node()
        .run(|| backend.sync(&parts.request(true)))
        .unwrap();
    let saved = topology
        .node()
        .exec_ok("iptables-legacy-save", &["-t", "filter"]);
    assert_eq!(saved.matches("-A INPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-FILTER").count(), 1, "{saved}");
    assert!(
        saved.contains("--match-set KUBE-LOAD-BALANCER-FW dst,dst -j KUBE-SOURCE-RANGES-FIREWALL"),
        "{saved}"
    );
}

#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_ipv6_cluster_ip_spreads_connections() {
    require_ipvs();
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(80))
        .pod("ep2", |p| p.tcp(80))
        .pod("src", |p| p)
        .build()
        .unwrap();
    let v6 = |pod: &str| topology.pod(pod).ip_v6().to_string();
    let ports6 = Ports::new()
        .with(
            service("ns1", "web6", "fd00:10:96::10", 80)
                .endpoint(&v6("ep1"), 80, true)
                .endpoint(&v6("ep2"), 80, true),
        )
        .build();
    let parts6 = RequestParts::new(ports6, "fd00:192:168:99::2");
    let mut backend6 = node_backend(IpFamily::V6);
    topology
        .node()
        .run(|| backend6.sync(&parts6.request(true)))
        .unwrap();
    let counts = hits_until_all(
        topology.pod("src"),
        at("fd00:10:96::10", 80),
        &["ep1", "ep2"],
        60,
    );
    assert_eq!(
        counts.keys().collect::<Vec<_>>(),
        ["ep1", "ep2"],
        "{counts:?}"
    );
    // The listing of the family finds its KUBE-6- sets and its address.
    let listed = topology
        .node()
        .run(|| NetlinkKernel::new().list(IpFamily::V6))
        .unwrap();
    assert!(listed.has_entries(SetKind::ClusterIp));
    assert_eq!(listed.addresses.len(), 1);
}

#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_ipv6_rules_restore_with_ip6tables_and_traffic_still_flows() {
    require_ipvs();
    kp_testkit::netns::require_tool("ip6tables-legacy-restore");
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(80))
        .pod("src", |p| p)
        .build()
        .unwrap();
    let ep1 = topology.pod("ep1").ip_v6().to_string();
    let ports = Ports::new()
        .with(service("ns1", "web6", "fd00:10:96::11", 80).endpoint(&ep1, 80, true))
        .build();
    let parts = RequestParts::new(ports, "fd00:192:168:99::2");
    let mut backend = IpvsBackend::new(
        IpFamily::V6,
        IpvsOptions::default(),
        Box::new(NetlinkKernel::new()),
        Box::new(SystemApplier::new(IptablesFlavor::Legacy)),
    );
    topology
        .node()
        .run(|| backend.sync(&parts.request(true)))
        .unwrap();
    let reply = connect(topology.pod("src"), at("fd00:10:96::11", 80)).unwrap();
    assert_eq!(reply.backend, "ep1");
    let saved = topology
        .node()
        .exec_ok("ip6tables-legacy-save", &["-t", "nat"]);
    assert!(
        saved.contains("-A KUBE-SERVICES -s ::1/128 -j RETURN"),
        "{saved}"
    );
    assert!(saved.contains("--match-set KUBE-6-CLUSTER-IP"), "{saved}");
}

#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_the_ipvs_table_lists_every_real_server_as_netlink_does() {
    use kp_ipvs::netlink::ipvs::IpvsNetlink;
    use kp_ipvs::netlink::table;
    require_ipvs();
    let node = kp_testkit::netns::Netns::create("ipvs-table").unwrap();
    // Enough services that the kernel prints the table in many pieces.
    let mut ops = Vec::new();
    for n in 0..400u16 {
        let v6 = n % 4 == 3;
        let address: IpAddr = if v6 {
            format!("fd00:10:96::{n:x}").parse().unwrap()
        } else {
            format!("10.96.{}.{}", n / 200, n % 200 + 1)
                .parse()
                .unwrap()
        };
        let key = ServiceKey {
            address,
            protocol: if n % 5 == 0 {
                kp_model::Protocol::Udp
            } else {
                kp_model::Protocol::Tcp
            },
            port: 80 + n % 3,
        };
        let persistent = n % 7 == 0;
        ops.push(Op::AddService(
            key,
            VirtualServer {
                scheduler: if n % 2 == 0 { "rr" } else { "sh" }.into(),
                flags: u32::from(persistent),
                timeout_secs: if persistent { 10800 } else { 0 },
            },
        ));
        for endpoint in 0..(n % 4) {
            let real: IpAddr = if v6 {
                format!("fd00:10:244:1::{:x}", endpoint + 2)
                    .parse()
                    .unwrap()
            } else {
                format!("10.244.1.{}", endpoint + 2).parse().unwrap()
            };
            ops.push(Op::AddReal(
                key,
                SocketAddr::new(real, 8080 + n),
                u32::from(endpoint != 1),
            ));
        }
    }
    let (from_table, from_netlink, listed) = node.run(|| {
        let mut kernel = NetlinkKernel::new();
        for family in [IpFamily::V4, IpFamily::V6] {
            let ours: Vec<Op> = ops
                .iter()
                .filter(|op| match op {
                    Op::AddService(key, _) | Op::AddReal(key, ..) => family.matches(&key.address),
                    _ => false,
                })
                .cloned()
                .collect();
            kernel.apply(family, &ours).unwrap();
        }
        let from_table = table::read().unwrap();
        let mut ipvs = IpvsNetlink::new();
        let mut from_netlink = std::collections::HashMap::new();
        for (key, _) in ipvs.list_services(None).unwrap() {
            from_netlink.insert(key, ipvs.list_dests(&key).unwrap());
        }
        let listed = kernel.list(IpFamily::V4).unwrap();
        (from_table, from_netlink, listed)
    });
    assert_eq!(from_netlink.len(), 400);
    assert_eq!(from_table, from_netlink);
    assert_eq!(listed.services.len(), 300);
    let sample = ServiceKey {
        address: "10.96.0.3".parse().unwrap(),
        protocol: kp_model::Protocol::Tcp,
        port: 82,
    };
    let weights: Vec<(String, u32)> = listed.services[&sample]
        .reals
        .iter()
        .map(|(address, weight)| (address.to_string(), *weight))
        .collect();
    assert_eq!(
        weights,
        [
            ("10.244.1.2:8082".to_owned(), 1),
            ("10.244.1.3:8082".to_owned(), 0)
        ]
    );
}

/// The `kube-proxy` binary scripts/ipvs-vm/run puts in the guest.
const BINARY_VARIABLE: &str = "KP_IPVS_VM_KUBE_PROXY";

/// The web Service (NodePort 30080) and node-1, as manifest files in `dir`;
/// returns the EndpointSlice's file, which [`write_web_slice`] rewrites.
fn write_web_manifests(dir: &Path) -> std::path::PathBuf {
    use kp_testkit::builders::{node, service};
    use kp_testkit::files::{manifest, write_atomically};
    let web = service("demo", "web", |s| {
        s.service_type("NodePort")
            .cluster_ip("10.96.0.41")
            .port("http", 80, "TCP")
            .target_port(80)
            .node_port(30080)
    });
    let node = node("node-1", |n| n.internal_ip("192.168.99.2"));
    write_atomically(&dir.join("web.json"), &manifest(&web));
    write_atomically(&dir.join("node.json"), &manifest(&node));
    dir.join("slice.json")
}

/// The web Service's EndpointSlice with `addresses`, ready, on node-1.
fn write_web_slice(file: &Path, addresses: &[String]) {
    let slice = kp_testkit::builders::endpoint_slice("demo", "web-1", "web", |mut e| {
        e = e.address_type("IPv4").port("http", 80, "TCP");
        for address in addresses {
            e = e.endpoint(address, |ep| ep.ready(true).node("node-1"));
        }
        e
    });
    kp_testkit::files::write_atomically(file, &kp_testkit::files::manifest(&slice));
}

#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_the_binary_serves_manifests_in_ipvs_mode_and_its_cleanup_keeps_a_foreign_server() {
    use kp_testkit::netns::wait_until;
    use std::time::Duration;
    require_ipvs();
    let binary = std::env::var(BINARY_VARIABLE).unwrap_or_else(|_| {
        panic!("{BINARY_VARIABLE} does not name the kube-proxy binary: {NEEDS_IPVS}")
    });
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(80))
        .pod("ep2", |p| p.tcp(80))
        .pod("src", |p| p)
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let slice_file = write_web_manifests(dir.path());
    let both = [ip_of(&topology, "ep1"), ip_of(&topology, "ep2")];
    write_web_slice(&slice_file, &both);
    let log_path = dir.path().join("proxy.log");
    let mut command = topology.node().command(&binary);
    command
        .args([
            "--proxy-mode",
            "ipvs",
            "--manifests",
            dir.path().to_str().unwrap(),
            "--hostname-override",
            "node-1",
            "--cluster-cidr",
            "10.244.0.0/16",
        ])
        .stdin(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap());
    let mut proxy = kp_testkit::netns::NsChild::spawn(&mut command).unwrap();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let cluster_ip = at("10.96.0.41", 80);
    let up = wait_until(Duration::from_secs(30), || {
        connect(topology.pod("src"), cluster_ip).is_ok()
    });
    assert!(
        up,
        "the binary serves the ClusterIP within 30 s\n{}\n{}",
        log(),
        processes()
    );
    let counts = hits_until_all(topology.pod("src"), cluster_ip, &["ep1", "ep2"], 60);
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["ep1", "ep2"]);
    let counts = hits_until_all(
        topology.client(),
        at("192.168.99.2", 30080),
        &["ep1", "ep2"],
        60,
    );
    assert_eq!(
        counts.keys().collect::<Vec<_>>(),
        ["ep1", "ep2"],
        "the NodePort answers the client"
    );
    // An edit of the manifests reaches the kernel: only ep2 is left.
    write_web_slice(&slice_file, &both[1..]);
    let moved = wait_until(Duration::from_secs(15), || {
        let counts = hits(topology.pod("src"), cluster_ip, 10);
        counts.keys().map(String::as_str).eq(["ep2"])
    });
    assert!(moved, "after the edit only ep2 answers\n{}", log());
    let log_text = log();
    assert!(
        !log_text.contains("syncing proxy rules failed"),
        "no sync failed:\n{log_text}"
    );
    assert!(proxy.try_wait().unwrap().is_none(), "the proxy still runs");
    let status = std::process::Command::new("kill")
        .args(["-TERM", &proxy.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(
        wait_until(Duration::from_secs(10), || proxy
            .try_wait()
            .is_ok_and(|s| s.is_some())),
        "SIGTERM ends the proxy"
    );
    let foreign = ServiceKey {
        address: "192.168.99.2".parse().unwrap(),
        protocol: kp_model::Protocol::Tcp,
        port: 8443,
    };
    let server = VirtualServer {
        scheduler: "rr".into(),
        flags: 0,
        timeout_secs: 0,
    };
    topology.node().run(|| {
        NetlinkKernel::new()
            .apply(IpFamily::V4, &[Op::AddService(foreign, server)])
            .unwrap()
    });
    let out = topology.node().exec(&binary, &["--cleanup"]);
    assert!(
        out.status.success(),
        "--cleanup: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let state = topology.node().run(|| {
        let mut kernel = NetlinkKernel::new();
        (kernel.list(IpFamily::V4).unwrap(), kp_ipvs::has_leftovers())
    });
    let (v4, leftovers) = state;
    assert!(!v4.link, "kube-ipvs0 is gone");
    assert!(
        v4.sets.is_empty(),
        "no set of ours is left: {:?}",
        v4.sets.keys()
    );
    assert_eq!(
        v4.services.keys().copied().collect::<Vec<_>>(),
        [foreign],
        "only the foreign virtual server stays"
    );
    assert!(!leftovers, "nothing of the IPVS mode is left to find");
    let nat = topology
        .node()
        .exec_ok("iptables-legacy-save", &["-t", "nat"]);
    assert!(!nat.contains("KUBE-"), "no chain of ours is left:\n{nat}");
}

/// One Service the kernel refuses (an endpoint at 255.255.255.255, which
/// the API server accepts and IPVS does not take as a real server) beside
/// the web Service: the binary programs web, names the refused Service in
/// its log and in `kubeproxy_rs_sync_refused_services`, and keeps it out
/// until it changes; its next version, with a valid endpoint, is served.
#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_the_binary_leaves_out_a_service_the_kernel_refuses_and_serves_every_other() {
    use kp_testkit::builders::{endpoint_slice, service};
    use kp_testkit::files::{manifest, write_atomically};
    use kp_testkit::netns::wait_until;
    use std::time::Duration;
    require_ipvs();
    let binary = std::env::var(BINARY_VARIABLE).unwrap_or_else(|_| {
        panic!("{BINARY_VARIABLE} does not name the kube-proxy binary: {NEEDS_IPVS}")
    });
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(80))
        .pod("src", |p| p)
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_web_slice(&write_web_manifests(dir.path()), &[ip_of(&topology, "ep1")]);
    let bad = service("demo", "bad", |s| {
        s.cluster_ip("10.96.0.42")
            .port("http", 80, "TCP")
            .target_port(80)
    });
    write_atomically(&dir.path().join("bad.json"), &manifest(&bad));
    let bad_slice = |address: &str| {
        endpoint_slice("demo", "bad-1", "bad", |e| {
            e.address_type("IPv4")
                .port("http", 80, "TCP")
                .endpoint(address, |ep| ep.ready(true).node("node-1"))
        })
    };
    let bad_slice_file = dir.path().join("bad-slice.json");
    write_atomically(&bad_slice_file, &manifest(&bad_slice("255.255.255.255")));
    let log_path = dir.path().join("proxy.log");
    let mut command = topology.node().command(&binary);
    command
        .args(["--proxy-mode", "ipvs"])
        .args(["--manifests", dir.path().to_str().unwrap()])
        .args(["--hostname-override", "node-1"])
        .args(["--cluster-cidr", "10.244.0.0/16"])
        .stdin(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap());
    let _proxy = kp_testkit::netns::NsChild::spawn(&mut command).unwrap();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();

    let web = at("10.96.0.41", 80);
    let up = wait_until(Duration::from_secs(30), || {
        connect(topology.pod("src"), web).is_ok()
    });
    assert!(up, "the web Service answers within 30 s\n{}", log());
    let refused_gauge = || {
        let metrics = topology
            .node()
            .run(|| kp_testkit::http::get("127.0.0.1:10249", "/metrics"))
            .map(|reply| reply.body)
            .unwrap_or_default();
        metrics
            .lines()
            .find(|line| line.starts_with("kubeproxy_rs_sync_refused_services{ip_family=\"IPv4\"}"))
            .map(str::to_owned)
    };
    let counted = wait_until(Duration::from_secs(30), || {
        refused_gauge().is_some_and(|line| line.ends_with(" 1"))
    });
    assert!(
        counted,
        "one Service is left out: {:?}\n{}",
        refused_gauge(),
        log()
    );
    let log_text = log();
    assert!(
        log_text.contains("the kernel refused the rules of a Service")
            && log_text.contains("demo/bad"),
        "the log names the refused Service:\n{log_text}"
    );
    assert_eq!(connect(topology.pod("src"), web).unwrap().backend, "ep1");

    // A change gives the Service another try; valid now, it is served.
    write_atomically(
        &bad_slice_file,
        &manifest(&bad_slice(&ip_of(&topology, "ep1"))),
    );
    let served = wait_until(Duration::from_secs(30), || {
        connect(topology.pod("src"), at("10.96.0.42", 80)).is_ok_and(|reply| reply.backend == "ep1")
    });
    assert!(served, "the changed Service is programmed\n{}", log());
    assert!(
        refused_gauge().is_some_and(|line| line.ends_with(" 0")),
        "{:?}",
        refused_gauge()
    );
}

/// Every process with what its threads wait in, for a failure message.
fn processes() -> String {
    let mut text = String::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let mut waits = Vec::new();
        if let Ok(tasks) = std::fs::read_dir(entry.path().join("task")) {
            for task in tasks.flatten() {
                let wchan = std::fs::read_to_string(task.path().join("wchan")).unwrap_or_default();
                let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
                waits.push(format!("{}:{wchan}", comm.trim()));
            }
        }
        text.push_str(&format!("{pid} {cmdline} [{}]\n", waits.join(" ")));
    }
    text
}
