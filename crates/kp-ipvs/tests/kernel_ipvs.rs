//! Kernel tests of the IPVS mode: the real netlink kernel programs IPVS,
//! ipsets and kube-ipvs0 in a node namespace, and real connections from a
//! pod namespace prove the result. The backend is the one the binary
//! builds (`kp_ipvs::system_backend`), so the mode's iptables rules
//! (masquerading, source ranges, the KUBE-* filter chains and their ipset
//! matches) are in the data path of every packet.
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
//! | ns1/itp, p80 80/TCP | ClusterIP 10.96.0.16, internalTrafficPolicy Local, endpoints ep1 (node-1), ep3 (node-2) |
//! | ns1/itp-remote, p80 80/TCP | ClusterIP 10.96.0.17, internalTrafficPolicy Local, endpoint ep3 (node-2) |
//! | ns1/np-empty, p80 80/TCP | ClusterIP 10.96.0.18, NodePort 30082, no endpoints (later ep1, then none again) |
//! | ns1/sticky-dns, p53 53/UDP | ClusterIP 10.96.0.19, ClientIP affinity for 2 s, endpoints ep1, ep2 |
//! | ns1/np6, p80 80/TCP | ClusterIP fd00:10:96::12, NodePort 30090, LB 2001:db8:203:113::9, endpoints ep1, ep3 |
//! | ns1/far, p80 80/TCP | ClusterIP 10.96.0.21, NodePort 30100, externalIP 203.0.113.5, LB 203.0.113.9, endpoint ep3 behind the second node |
//! | ns1/far6, p80 80/TCP | ClusterIP fd00:10:96::21, NodePort 30100, endpoint ep3 behind the second node |
//! | examples/ (the binary's trace) | demo/sticky 10.96.0.15 (ClientIP 600 s), demo/web-nodeport 30080, demo/shop LB 203.0.113.10 (source ranges 192.168.99.8/29, 198.51.100.0/24), demo/empty 10.96.0.17 |
//! | source of pod traffic | pod `src` on node-1, not an endpoint; `client` outside |
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use kp_iptables::{Applier, IptablesFlavor, SystemApplier};
use kp_ipvs::kernel::IpvsKernel;
use kp_ipvs::netlink::NetlinkKernel;
use kp_ipvs::testing::{service, Ports, RequestParts};
use kp_ipvs::{
    cleanup_with, IpvsBackend, IpvsOptions, Op, ServiceKey, SetEntry, SetKind, VirtualServer,
    DUMMY_LINK,
};
use kp_model::{IpFamily, Protocol};
use kp_sync::expect::{self, Expected, Frontend, Probe};
use kp_sync::Backend;
use kp_testkit::netns::{
    connect, expect_refused, expect_timeout, hits, hits_until_all, require_root, udp_roundtrip,
    wait_until, Netns, TcpSession, Topology,
};

const NEEDS_IPVS: &str = "needs a kernel with IPVS: run scripts/ipvs-vm/run";

/// How long a UDP connection entry of IPVS lives after its last datagram
/// in the affinity test (`ipvs.udpTimeout`).
const UDP_TIMEOUT: Duration = Duration::from_secs(1);
/// The affinity test's `sessionAffinityConfig.clientIP.timeoutSeconds`.
const AFFINITY_SECS: u64 = 2;

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

/// The IPVS backend of `family` as the binary builds it for the node of
/// `topology` (kp_ipvs::system_backend): the real netlink kernel and the
/// mode's iptables rules restored with the iptables flavor detected in the
/// node namespace, so masquerading, source ranges and the filter chains
/// are in the data path of every packet the tests send.
fn node_backend(topology: &Topology, family: IpFamily) -> IpvsBackend {
    node_backend_with(topology, family, IpvsOptions::default())
}

/// [`node_backend`] with `options`.
fn node_backend_with(topology: &Topology, family: IpFamily, options: IpvsOptions) -> IpvsBackend {
    // Built on a thread of the node namespace: the flavor detection runs
    // the iptables-save programs there.
    topology
        .node()
        .run(|| kp_ipvs::system_backend(family, options))
}

/// Every address of the node namespace (kube-ipvs0's included), as a
/// masqueraded packet may leave from any of them.
fn node_addresses(topology: &Topology) -> Vec<IpAddr> {
    topology.node().run(|| {
        kp_host::HostAddresses::new()
            .addresses()
            .map(<[IpAddr]>::to_vec)
            .unwrap()
    })
}

/// One sync of `parts` in the node namespace, which must succeed.
#[track_caller]
fn sync(topology: &Topology, backend: &mut IpvsBackend, parts: &RequestParts, full: bool) {
    topology
        .node()
        .run(|| backend.sync(&parts.request(full)))
        .unwrap();
}

/// The real servers of the virtual server `key` as the kernel lists them.
#[track_caller]
fn kernel_reals(topology: &Topology, key: &ServiceKey) -> Vec<SocketAddr> {
    let family = IpFamily::of(&key.address);
    let listed = topology
        .node()
        .run(|| NetlinkKernel::new().list(family))
        .unwrap();
    match listed.services.get(key) {
        Some(service) => service.reals.keys().copied().collect(),
        None => panic!(
            "the kernel has no virtual server {key:?}; it has {:?}",
            listed.services.keys()
        ),
    }
}

/// The lines of the node's IPVS connection table (`ipvsadm -Lnc`, here
/// `/proc/net/ip_vs_conn` with hex addresses) whose client is `client`:
/// its connections and its persistence template.
fn connections_of(topology: &Topology, client: Ipv4Addr) -> Vec<String> {
    // /proc/net names the namespace of the process's main thread; the
    // calling thread's table is under /proc/thread-self.
    let table = topology
        .node()
        .run(|| std::fs::read_to_string("/proc/thread-self/net/ip_vs_conn"))
        .unwrap();
    let hex = format!("{:08X}", u32::from(client));
    table
        .lines()
        .filter(|line| line.split_whitespace().nth(1) == Some(hex.as_str()))
        .map(str::to_owned)
        .collect()
}

/// Which endpoint answered each of `n` UDP datagrams from `from` to
/// `address`, each from a new socket (a new source port, so a new IPVS
/// connection that only the affinity template ties to the others).
fn udp_answers(from: &Netns, address: SocketAddr, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| udp_roundtrip(from, address).unwrap().backend)
        .collect()
}

/// The source addresses each endpoint saw over `n` connections from
/// `from` to `address`.
fn sources_seen(from: &Netns, address: SocketAddr, n: usize) -> BTreeMap<String, BTreeSet<IpAddr>> {
    let mut seen: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
    for _ in 0..n {
        let reply = connect(from, address).unwrap();
        seen.entry(reply.backend).or_default().insert(reply.source);
    }
    seen
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
    let mut backend = node_backend(&topology, IpFamily::V4);
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
    let mut backend = node_backend(&topology, IpFamily::V4);
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

/// externalTrafficPolicy Cluster: a client outside the node reaches every
/// endpoint through the NodePort, the external IP and the load balancer
/// IP, and each endpoint sees an address of the node, not the client's:
/// KUBE-NODE-PORT, KUBE-EXTERNAL-IP and KUBE-LOAD-BALANCER mark the packets
/// for KUBE-POSTROUTING's masquerade, as upstream's IPVS mode does, so the
/// replies of an endpoint on another node come back through this one.
#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_node_port_external_and_load_balancer_ips_answer_a_client_from_the_node_address() {
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
        .build();
    let parts = RequestParts::new(ports, "192.168.99.2");
    let mut backend = node_backend(&topology, IpFamily::V4);
    topology
        .node()
        .run(|| backend.sync(&parts.request(true)))
        .unwrap();

    let client = topology.client();
    let node = node_addresses(&topology);
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
        let seen = sources_seen(client, address, 6);
        assert_eq!(
            seen.keys().collect::<Vec<_>>(),
            ["ep1", "ep3"],
            "{address}: {seen:?}"
        );
        for (endpoint, sources) in &seen {
            assert!(
                sources.iter().all(|source| node.contains(source)),
                "{address}: {endpoint} sees {sources:?}, not an address of the node \
                 {node:?}: the client {} was not masqueraded",
                client.ip()
            );
        }
    }
}

/// externalTrafficPolicy Local: a client outside the node reaches only the
/// local endpoint through the NodePort, the external IP and the load
/// balancer IP, and the endpoint sees the client's own address: the
/// KUBE-NODE-PORT-LOCAL-TCP and KUBE-LOAD-BALANCER-LOCAL sets return before
/// the masquerade mark, and KUBE-EXTERNAL-IP-LOCAL marks nothing.
#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_external_traffic_policy_local_reaches_the_local_endpoint_with_the_client_address() {
    require_ipvs();
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(80))
        .remote_pod("ep3", |p| p.tcp(80))
        .build()
        .unwrap();
    let ports = Ports::new()
        .with(
            service("ns1", "local", "10.96.0.12", 80)
                .node_port(30081)
                .external_ip("203.0.113.6")
                .lb_ip("203.0.113.10")
                .etp_local()
                .health_check_node_port(30999)
                .endpoint(&ip_of(&topology, "ep1"), 80, true)
                .endpoint(&ip_of(&topology, "ep3"), 80, false),
        )
        .build();
    let parts = RequestParts::new(ports, "192.168.99.2");
    let mut backend = node_backend(&topology, IpFamily::V4);
    topology
        .node()
        .run(|| backend.sync(&parts.request(true)))
        .unwrap();

    let client = topology.client();
    for address in [
        at("192.168.99.2", 30081),
        at("203.0.113.6", 80),
        at("203.0.113.10", 80),
    ] {
        let seen = sources_seen(client, address, 12);
        assert_eq!(
            seen.keys().collect::<Vec<_>>(),
            ["ep1"],
            "{address}: only the local endpoint: {seen:?}"
        );
        assert_eq!(
            seen["ep1"].iter().collect::<Vec<_>>(),
            [&IpAddr::V4(client.ip())],
            "{address}: the client address is preserved"
        );
    }
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
    let mut backend = node_backend(&topology, IpFamily::V4);
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
    let mut backend = node_backend(&topology, IpFamily::V4);
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
    let mut backend = node_backend(&topology, IpFamily::V4);
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
        // The rules match the sets, which cannot be destroyed while a rule
        // holds them: the cleanup removes the chains first, with the flavor
        // the backend restored them with.
        let mut applier = SystemApplier::new(IptablesFlavor::detect());
        let mut appliers: [&mut dyn Applier; 1] = [&mut applier];
        let report = cleanup_with(&mut kernel, &mut appliers).unwrap();
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
    for table in ["nat", "filter"] {
        let saved = topology
            .node()
            .exec_ok("iptables-legacy-save", &["-t", table]);
        assert!(
            !saved.contains("KUBE-"),
            "no rule of ours is left:\n{saved}"
        );
    }
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
    let mut backend = node_backend(&topology, IpFamily::V4);
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
    let mut backend6 = node_backend(&topology, IpFamily::V6);
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
    let mut backend = node_backend(&topology, IpFamily::V6);
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
    let node = Netns::create("ipvs-table").unwrap();
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

/// internalTrafficPolicy Local: a pod of the node reaches only the
/// endpoints on its node; with none there, the ClusterIP's virtual server
/// has no real server and IPVS refuses the connection (as upstream's IPVS
/// mode, whose virtual server then has no real servers either).
#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_internal_traffic_policy_local_reaches_only_local_endpoints_and_refuses_without_one() {
    require_ipvs();
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(80))
        .remote_pod("ep3", |p| p.tcp(80))
        .pod("src", |p| p)
        .build()
        .unwrap();
    let ports = Ports::new()
        .with(
            service("ns1", "itp", "10.96.0.16", 80)
                .itp_local()
                .endpoint(&ip_of(&topology, "ep1"), 80, true)
                .endpoint(&ip_of(&topology, "ep3"), 80, false),
        )
        .with(
            service("ns1", "itp-remote", "10.96.0.17", 80)
                .itp_local()
                .endpoint(&ip_of(&topology, "ep3"), 80, false),
        )
        .build();
    let parts = RequestParts::new(ports, "192.168.99.2");
    let mut backend = node_backend(&topology, IpFamily::V4);
    sync(&topology, &mut backend, &parts, true);

    let counts = hits(topology.pod("src"), at("10.96.0.16", 80), 12);
    assert_eq!(
        counts.keys().collect::<Vec<_>>(),
        ["ep1"],
        "only the endpoint on this node: {counts:?}"
    );
    expect_refused(topology.pod("src"), at("10.96.0.17", 80));
    let remote_only = ServiceKey {
        address: "10.96.0.17".parse().unwrap(),
        protocol: Protocol::Tcp,
        port: 80,
    };
    let reals = kernel_reals(&topology, &remote_only);
    assert!(
        reals.is_empty(),
        "the remote endpoint is no real server of the ClusterIP: {reals:?}"
    );
}

/// A NodePort without endpoints is refused. Upstream's IPVS mode creates
/// the virtual server of every node address and then syncs its real
/// servers, whatever their number (`syncProxyRules`,
/// pkg/proxy/ipvs/proxier.go), and writes no REJECT rule for a Service
/// without endpoints (kubernetes#72534: the IPVS proxier needs none): IPVS itself
/// answers a packet it finds no real server for with ICMP port unreachable
/// (`ip_vs_leave`, net/netfilter/ipvs/ip_vs_core.c), which the client sees
/// as a refused connection. The same holds once the last endpoint goes
/// away again: the drained real server (weight 0) takes no new connection.
///
/// Without the virtual server the node's own TCP stack would refuse the
/// connection as well, so the test also reads the virtual server back.
#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_a_node_port_without_endpoints_is_refused_by_its_empty_virtual_server() {
    require_ipvs();
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(80))
        .build()
        .unwrap();
    let ep1 = ip_of(&topology, "ep1");
    let with_empty = |endpoint: Option<&str>| {
        let mut empty = service("ns1", "np-empty", "10.96.0.18", 80).node_port(30082);
        if let Some(address) = endpoint {
            empty = empty.endpoint(address, 80, true);
        }
        let np = service("ns1", "np", "10.96.0.11", 80)
            .node_port(30080)
            .endpoint(&ep1, 80, true);
        RequestParts::new(Ports::new().with(np).with(empty).build(), "192.168.99.2")
    };
    let mut backend = node_backend(&topology, IpFamily::V4);
    let client = topology.client();
    let node_port = ServiceKey {
        address: "192.168.99.2".parse().unwrap(),
        protocol: Protocol::Tcp,
        port: 30082,
    };

    sync(&topology, &mut backend, &with_empty(None), true);
    assert_eq!(
        connect(client, at("192.168.99.2", 30080)).unwrap().backend,
        "ep1",
        "the NodePort with an endpoint answers"
    );
    expect_refused(client, at("192.168.99.2", 30082));
    let reals = kernel_reals(&topology, &node_port);
    assert!(
        reals.is_empty(),
        "the NodePort's virtual server is there, without real servers: {reals:?}"
    );

    sync(&topology, &mut backend, &with_empty(Some(&ep1)), false);
    assert_eq!(
        connect(client, at("192.168.99.2", 30082)).unwrap().backend,
        "ep1"
    );
    sync(&topology, &mut backend, &with_empty(None), false);
    expect_refused(client, at("192.168.99.2", 30082));
}

/// ClientIP affinity: every connection of one client goes to one endpoint
/// while its persistence template lives, and once the template expired
/// (`timeoutSeconds` after the client's last connection ended) the
/// scheduler chooses again. With `rr` and two endpoints the next choice is
/// the other endpoint, so the client moving proves the expiry.
///
/// UDP, since IPVS keeps a template while a connection it controls lives,
/// and a closed TCP connection stays in TIME_WAIT for two minutes (not
/// configurable), while a UDP one ends `ipvs.udpTimeout` after its last
/// datagram.
#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_session_affinity_expires_after_its_timeout_and_the_client_moves() {
    require_ipvs();
    let topology = Topology::builder()
        .pod("ep1", |p| p.udp(53))
        .pod("ep2", |p| p.udp(53))
        .pod("src", |p| p)
        .build()
        .unwrap();
    let ports = Ports::new()
        .with(
            service("ns1", "sticky-dns", "10.96.0.19", 53)
                .protocol(Protocol::Udp)
                .affinity_secs(AFFINITY_SECS)
                .endpoint(&ip_of(&topology, "ep1"), 53, true)
                .endpoint(&ip_of(&topology, "ep2"), 53, true),
        )
        .build();
    let parts = RequestParts::new(ports, "192.168.99.2");
    let options = IpvsOptions {
        timeouts: [Duration::ZERO, Duration::ZERO, UDP_TIMEOUT],
        ..IpvsOptions::default()
    };
    let mut backend = node_backend_with(&topology, IpFamily::V4, options);
    sync(&topology, &mut backend, &parts, true);
    let src = topology.pod("src");
    let address = at("10.96.0.19", 53);

    let before = udp_answers(src, address, 8);
    let first = before[0].clone();
    assert!(
        before.iter().all(|backend| *backend == first),
        "every datagram sticks to one endpoint: {before:?}"
    );
    assert!(
        !connections_of(&topology, src.ip()).is_empty(),
        "the client has a persistence template"
    );
    // The template lives AFFINITY_SECS after the last connection ended,
    // which is UDP_TIMEOUT after the last datagram: a few seconds in all.
    let expired = wait_until(Duration::from_secs(15), || {
        connections_of(&topology, src.ip()).is_empty()
    });
    assert!(
        expired,
        "the affinity of {} s expires: {:?}",
        AFFINITY_SECS,
        connections_of(&topology, src.ip())
    );
    let after = udp_answers(src, address, 8);
    assert!(
        after.iter().all(|backend| *backend != first),
        "after the expiry the scheduler chose again ({first} before): {after:?}"
    );
    assert!(
        after.iter().all(|backend| *backend == after[0]),
        "and the client sticks to its new endpoint: {after:?}"
    );
}

/// IPv6: a client outside the node reaches both endpoints through the
/// NodePort on the node's address and through the load balancer IP, and
/// the endpoints see an address of the node (externalTrafficPolicy Cluster
/// masquerades, with ip6tables).
#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_ipv6_node_port_and_load_balancer_ip_answer_a_client_outside_the_node() {
    require_ipvs();
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(80))
        .remote_pod("ep3", |p| p.tcp(80))
        .build()
        .unwrap();
    let v6 = |pod: &str| topology.pod(pod).ip_v6().to_string();
    let ports = Ports::new()
        .with(
            service("ns1", "np6", "fd00:10:96::12", 80)
                .node_port(30090)
                .lb_ip("2001:db8:203:113::9")
                .endpoint(&v6("ep1"), 80, true)
                .endpoint(&v6("ep3"), 80, false),
        )
        .build();
    let parts = RequestParts::new(ports, "fd00:192:168:99::2");
    let mut backend = node_backend(&topology, IpFamily::V6);
    sync(&topology, &mut backend, &parts, true);

    let client = topology.client();
    let node = node_addresses(&topology);
    for address in [
        at("fd00:192:168:99::2", 30090),
        at("2001:db8:203:113::9", 80),
    ] {
        let counts = hits_until_all(client, address, &["ep1", "ep3"], 60);
        assert_eq!(
            counts.keys().collect::<Vec<_>>(),
            ["ep1", "ep3"],
            "{address}: {counts:?}"
        );
        let seen = sources_seen(client, address, 6);
        for (endpoint, sources) in &seen {
            assert!(
                sources.iter().all(|source| node.contains(source)),
                "{address}: {endpoint} sees {sources:?}, not an address of the node \
                 {node:?}: the client {} was not masqueraded",
                client.ip_v6()
            );
        }
    }
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

/// What the trace of `probe` through `live` does differently from the
/// model's expectation, if anything.
fn trace_difference(live: &kp_ipvs::trace::LiveState, probe: &Probe) -> Option<String> {
    use kp_ipvs::trace::{Packet, PathVerdict};
    let packet = Packet {
        src: probe.source,
        dst: probe.destination.ip(),
        dport: probe.destination.port(),
        protocol: probe.protocol,
        src_local: false,
        in_interface: Some("cl0".to_owned()),
    };
    let trace = match live.trace(&packet) {
        Ok(trace) => trace,
        Err(error) => return Some(format!("the trace failed: {error}")),
    };
    let same = match &probe.expected {
        Expected::Endpoints {
            endpoints,
            masquerade,
        } => {
            trace.always(PathVerdict::Accept)
                && trace.destinations() == *endpoints
                && trace.paths.iter().all(|path| path.destination.is_some())
                && masquerade.is_none_or(|m| trace.paths.iter().all(|p| p.masqueraded == m))
        }
        // The endpoint reaching itself is masqueraded (KUBE-LOOP-BACK).
        Expected::Hairpin { endpoints, itself } => {
            trace.always(PathVerdict::Accept)
                && trace.destinations() == *endpoints
                && trace.paths.iter().all(|path| {
                    path.destination.is_some_and(|to| to.ip() != *itself) || path.masqueraded
                })
        }
        Expected::Reject => trace.always(PathVerdict::Reject),
        Expected::Drop => trace.always(PathVerdict::Drop),
        // The empty virtual server answers ICMP port unreachable, as
        // upstream's IPVS mode does.
        Expected::NoLocalEndpoint => trace.always(PathVerdict::Reject),
        // The source-range sets hold the load balancer IP with or without
        // endpoints: the client outside them is dropped first.
        Expected::RejectUnlessFiltered => trace.always(PathVerdict::Drop),
    };
    (!same).then(|| {
        format!(
            "{probe}: the model says {}; the trace:\n{trace}",
            probe.expected
        )
    })
}

/// `kube-proxy check` for the IPVS mode, in the kernel: a cluster of
/// ClusterIPs (spread, empty, UDP, sticky, internalTrafficPolicy Local),
/// NodePorts with both external policies, an external IP and load balancer
/// IPs with and without source ranges is programmed by the real backend
/// (its iptables rules included); the state read back
/// (`kp_ipvs::trace::LiveState::read`) sends every probe of
/// `kp_sync::expect::probes` where the model says: the same endpoints,
/// masquerading where the model has a word on it, refusal and drop. A real
/// server deleted behind the backend's back then shows in exactly the probes
/// of its ClusterIP (from outside, and from its endpoint on this node).
#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_every_probe_of_the_model_traces_through_the_live_state_as_expected() {
    require_ipvs();
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(80).udp(53))
        .pod("ep2", |p| p.tcp(80).udp(53))
        .remote_pod("ep3", |p| p.tcp(80))
        .build()
        .unwrap();
    let (ep1, ep2, ep3) = (
        ip_of(&topology, "ep1"),
        ip_of(&topology, "ep2"),
        ip_of(&topology, "ep3"),
    );
    let ports = Ports::new()
        .with(
            service("ns1", "web", "10.96.0.10", 80)
                .endpoint(&ep1, 80, true)
                .endpoint(&ep2, 80, true)
                .endpoint(&ep3, 80, false),
        )
        .with(service("ns1", "empty", "10.96.0.14", 80))
        .with(
            service("ns1", "np", "10.96.0.11", 80)
                .node_port(30080)
                .external_ip("203.0.113.5")
                .lb_ip("203.0.113.9")
                .endpoint(&ep1, 80, true)
                .endpoint(&ep3, 80, false),
        )
        .with(
            service("ns1", "local", "10.96.0.12", 80)
                .node_port(30081)
                .etp_local()
                .lb_ip("203.0.113.11")
                .endpoint(&ep1, 80, true)
                .endpoint(&ep3, 80, false),
        )
        .with(
            service("ns1", "sticky", "10.96.0.13", 80)
                .affinity_secs(600)
                .endpoint(&ep1, 80, true)
                .endpoint(&ep2, 80, true),
        )
        .with(
            service("ns1", "dns", "10.96.0.20", 53)
                .udp()
                .endpoint(&ep2, 53, true),
        )
        .with(
            service("ns1", "lb", "10.96.0.15", 80)
                .lb_ip("203.0.113.10")
                .source_range("198.51.100.0/24")
                .endpoint(&ep1, 80, true),
        )
        .with(
            service("ns1", "itp", "10.96.0.16", 80)
                .itp_local()
                .endpoint(&ep1, 80, true)
                .endpoint(&ep3, 80, false),
        )
        .with(service("ns1", "np-empty", "10.96.0.18", 80).node_port(30082))
        .with(
            service("ns1", "local-far", "10.96.0.19", 80)
                .node_port(30083)
                .etp_local()
                .itp_local()
                .endpoint(&ep3, 80, false),
        )
        .build();
    let parts = RequestParts::new(ports, "192.168.99.2");
    let mut backend = node_backend(&topology, IpFamily::V4);
    sync(&topology, &mut backend, &parts, true);

    let node_ips: Vec<IpAddr> = vec!["192.168.99.2".parse().unwrap()];
    let probes: Vec<Probe> = parts
        .ports
        .iter()
        .flat_map(|(name, state)| expect::probes(name, state, IpFamily::V4, &node_ips))
        .collect();
    let read = || {
        topology
            .node()
            .run(|| kp_ipvs::trace::LiveState::read(IpFamily::V4))
            .unwrap()
    };
    let live = read();
    let differences: Vec<String> = probes
        .iter()
        .filter_map(|probe| trace_difference(&live, probe))
        .collect();
    let to_endpoints = probes
        .iter()
        .filter(|p| matches!(p.expected, Expected::Endpoints { .. }))
        .count();
    let hairpin = probes
        .iter()
        .filter(|p| matches!(p.expected, Expected::Hairpin { .. }))
        .count();
    println!(
        "trace: {} probes of {} service ports, {} to endpoints, {} hairpin, {} refused or dropped, {} different",
        probes.len(),
        parts.ports.len(),
        to_endpoints,
        hairpin,
        probes.len() - to_endpoints - hairpin,
        differences.len()
    );
    assert!(differences.is_empty(), "{}", differences.join("\n"));
    // Per Service: web 1, empty 1, np 4 (ClusterIP, NodePort, external and
    // load balancer IP), local 3, sticky 1, dns 1, lb 3 (ClusterIP, a
    // client inside the range and one outside), itp 1, np-empty 2,
    // local-far 2 (its ClusterIP and NodePort, both without a local
    // endpoint); and the hairpin connection of each of the 7 with an
    // endpoint on this node their ClusterIP leads to (web, local, sticky,
    // dns, lb, np, itp).
    assert_eq!(
        (probes.len(), to_endpoints, hairpin),
        (26, 13, 7),
        "{probes:#?}"
    );
    // Every kind of outcome is among the probes.
    for wanted in [Expected::Reject, Expected::Drop, Expected::NoLocalEndpoint] {
        assert!(
            probes.iter().any(|p| p.expected == wanted),
            "no probe expects {wanted}"
        );
    }
    assert!(probes.iter().any(|p| matches!(
        p.expected,
        Expected::Endpoints {
            masquerade: Some(false),
            ..
        }
    )));
    assert!(probes.iter().any(|p| matches!(
        p.expected,
        Expected::Endpoints {
            masquerade: Some(true),
            ..
        }
    )));

    // One real server of the web ClusterIP deleted behind the backend's back.
    let web = ServiceKey {
        address: "10.96.0.10".parse().unwrap(),
        protocol: Protocol::Tcp,
        port: 80,
    };
    let deleted = at(&ep1, 80);
    topology
        .node()
        .run(|| NetlinkKernel::new().apply(IpFamily::V4, &[Op::DeleteReal(web, deleted)]))
        .unwrap();
    let live = read();
    let differing: Vec<(String, String)> = probes
        .iter()
        .filter_map(|probe| trace_difference(&live, probe).map(|d| (probe.to_string(), d)))
        .collect();
    let web_probe: Vec<String> = probes
        .iter()
        .filter(|p| p.frontend == Frontend::ClusterIp && p.destination == at("10.96.0.10", 80))
        .map(ToString::to_string)
        .collect();
    // From outside, and from its endpoint on this node (hairpin).
    assert_eq!(web_probe.len(), 2, "{probes:#?}");
    assert_eq!(
        differing.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>(),
        web_probe,
        "{differing:#?}"
    );
    println!("after deleting {deleted} of {web}: {}", differing[0].1);
    let trace = live
        .trace(&kp_ipvs::trace::Packet {
            src: expect::outside_client(IpFamily::V4),
            dst: web.address,
            dport: 80,
            protocol: Protocol::Tcp,
            src_local: false,
            in_interface: None,
        })
        .unwrap();
    assert_eq!(
        trace.destinations(),
        [at(&ep2, 80), at(&ep3, 80)].into_iter().collect(),
        "{trace}"
    );
}

/// The binary's flags for the IPVS mode on the manifests in `dir`.
fn differential_flags(dir: &Path) -> Vec<String> {
    [
        "--manifests",
        dir.to_str().unwrap(),
        "--hostname-override",
        "node-1",
        "--cluster-cidr",
        "10.244.0.0/16,fd00:10:244::/48",
        "--proxy-mode",
        "ipvs",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The seeds of the differential test: `KP_IPVS_TEST_DIFFERENTIAL_SEED`
/// (default 1) and the `KP_IPVS_TEST_DIFFERENTIAL_CASES` after it
/// (default 3: the emulated guest is slow).
fn differential_seeds() -> std::ops::Range<u64> {
    let number = |name: &str, default: u64| {
        std::env::var(name).map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
        })
    };
    let first = number("KP_IPVS_TEST_DIFFERENTIAL_SEED", 1);
    first..first + number("KP_IPVS_TEST_DIFFERENTIAL_CASES", 3)
}

/// Programs the random cluster of `seed` (`kp_testkit::clusters`, both
/// families) with the binary in IPVS mode in a fresh node namespace and
/// runs `kube-proxy check` with the same flags: `Ok` with check's output
/// when the kernel does for every connection of both families what the
/// model says, else `Err` with check's output, the proxy's log and the
/// cluster.
fn check_ipvs_cluster(binary: &str, seed: u64) -> Result<String, String> {
    use kp_testkit::netns::NsChild;
    use std::fs;
    let ns = Netns::bare_node("ipvsdiff").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    fs::create_dir_all(&manifests).unwrap();
    let cluster = kp_testkit::clusters::random_manifests(seed);
    fs::write(manifests.join("cluster.yaml"), &cluster).unwrap();
    let log_path = dir.path().join("proxy.log");
    let mut command = ns.command(binary);
    command
        .args(differential_flags(&manifests))
        .args(["--metrics-bind-address", "127.0.0.1:10249"])
        .args(["--healthz-bind-address", "127.0.0.1:10256"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(fs::File::create(&log_path).unwrap());
    let _proxy = NsChild::spawn(&mut command).unwrap();
    let log = || fs::read_to_string(&log_path).unwrap_or_default();
    let healthy = wait_until(Duration::from_secs(60), || {
        ns.run(|| kp_testkit::http::get(("127.0.0.1", 10256), "/healthz"))
            .is_ok_and(|reply| reply.code == 200)
    });
    if !healthy {
        return Err(format!("the proxy never became healthy:\n{}", log()));
    }
    // Each family syncs on its own; give the second its first sync.
    let mut last = String::new();
    let agreed = wait_until(Duration::from_secs(20), || {
        let output = ns
            .command(binary)
            .arg("check")
            .args(differential_flags(&manifests))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        last = format!(
            "exit {:?}\n{stdout}{}",
            output.status.code(),
            String::from_utf8_lossy(&output.stderr)
        );
        let checked = |family: &str| {
            stdout
                .lines()
                .any(|l| l.starts_with(family) && !l.contains(": 0 connections"))
        };
        output.status.code() == Some(0) && checked("IPv4:") && checked("IPv6:")
    });
    if agreed {
        Ok(last)
    } else {
        Err(format!(
            "{last}\nthe proxy's log:\n{}\nthe cluster:\n{cluster}",
            log()
        ))
    }
}

/// The differential test of the IPVS mode: random clusters of both
/// families (Services of every type and policy, endpoints in every state;
/// the generator of the iptables and nftables modes' differential test)
/// programmed by the binary in IPVS mode, and `kube-proxy check` with the
/// same flags traces every Service address of both families through the
/// kernel's live IPVS table, ipsets and iptables rules and finds each
/// doing what the model (`kp_sync::expect`) says.
#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_random_clusters_of_both_families_agree_with_the_model() {
    require_ipvs();
    let binary = std::env::var(BINARY_VARIABLE).unwrap_or_else(|_| {
        panic!("{BINARY_VARIABLE} does not name the kube-proxy binary: {NEEDS_IPVS}")
    });
    for seed in differential_seeds() {
        match check_ipvs_cluster(&binary, seed) {
            Ok(output) => println!("seed {seed}: {output}"),
            Err(report) => panic!(
                "seed {seed} (KP_IPVS_TEST_DIFFERENTIAL_SEED={seed} KP_IPVS_TEST_DIFFERENTIAL_CASES=1 \
                 scripts/ipvs-vm/run vm_random_clusters): the IPVS mode differs from the model:\n{report}"
            ),
        }
    }
}

/// The repository's example manifests (examples/), compiled into the test
/// executable: the VM holds the executables, not the source tree. They are
/// the manifests of docs/OPERATIONS.md's trace examples of the other modes.
const EXAMPLE_MANIFESTS: [(&str, &str); 3] = [
    (
        "services.yaml",
        include_str!("../../../examples/services.yaml"),
    ),
    (
        "endpointslices.yaml",
        include_str!("../../../examples/endpointslices.yaml"),
    ),
    ("node.yaml", include_str!("../../../examples/node.yaml")),
];

/// One `kube-proxy trace` in a node namespace: the command line as a user
/// on the node types it, the text report, and the `-o json` report parsed.
struct Traced {
    command: String,
    /// The exact command line that ran: `ip netns exec NODE BINARY trace …`.
    invocation: String,
    text: String,
    /// The JSON report as printed.
    json_text: String,
    json: k8s_openapi::serde_json::Value,
}

/// Runs `kube-proxy trace ARGS` and `kube-proxy trace ARGS -o json` in
/// `node`; both must succeed and the second must be JSON.
#[track_caller]
fn trace_in(node: &Netns, binary: &str, args: &[&str]) -> Traced {
    let run = |extra: &[&str]| {
        let output = node
            .command(binary)
            .arg("trace")
            .args(args)
            .args(extra)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "kube-proxy trace {} {} exited with {}: {}",
            args.join(" "),
            extra.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    };
    let text = run(&[]);
    let json_text = run(&["-o", "json"]);
    let json = k8s_openapi::serde_json::from_str(&json_text).unwrap_or_else(|error| {
        panic!(
            "kube-proxy trace {} -o json printed no JSON ({error}):\n{json_text}",
            args.join(" ")
        )
    });
    Traced {
        command: format!("kube-proxy trace {}", args.join(" ")),
        invocation: format!(
            "ip netns exec {} {binary} trace {}",
            node.name(),
            args.join(" ")
        ),
        text,
        json_text,
        json,
    }
}

impl Traced {
    /// Writes both reports between marker lines to the test's stderr
    /// directly (not through `eprintln!`, which the test harness captures
    /// for a passing test), so they appear in the VM's console log.
    fn show(&self) {
        use std::io::Write as _;
        let block = format!(
            "===== BEGIN IPVS TRACE: $ {command} =====\n{text}===== END IPVS TRACE =====\n\
             ===== BEGIN IPVS TRACE: $ {command} -o json =====\n{json}===== END IPVS TRACE =====\n",
            command = self.invocation,
            text = self.text,
            json = self.json_text,
        );
        let mut stderr = std::io::stderr().lock();
        stderr.write_all(block.as_bytes()).unwrap();
        stderr.flush().unwrap();
    }

    /// The outcome's kind in the JSON report (`dnat`, `reject`, `drop`, …).
    fn outcome(&self) -> &str {
        self.json["outcome"]["kind"].as_str().unwrap_or_default()
    }

    /// The paths of the JSON report.
    fn paths(&self) -> &[k8s_openapi::serde_json::Value] {
        self.json["paths"].as_array().map_or(&[], Vec::as_slice)
    }

    /// The endpoints of a DNAT outcome with their probabilities in
    /// percent, rounded.
    fn shares(&self) -> Vec<(String, u32)> {
        self.json["outcome"]["endpoints"]
            .as_array()
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .map(|share| {
                let percent = share["probability"].as_f64().unwrap() * 100.0;
                (
                    share["endpoint"].as_str().unwrap().to_owned(),
                    // A share is between 0 and 100 %.
                    percent.round() as u32,
                )
            })
            .collect()
    }

    /// The text report's `Outcome:` line said as the JSON's kind, so both
    /// reports can be compared.
    fn text_outcome(&self) -> &'static str {
        let line = self
            .text
            .lines()
            .find_map(|line| line.strip_prefix("Outcome: "))
            .unwrap_or_default();
        match line {
            _ if line.starts_with("load-balanced to") => "dnat",
            "rejected" => "reject",
            "dropped" => "drop",
            _ if line.starts_with("not a Service") => "not-a-service",
            _ if line.starts_with("the paths end differently") => "mixed",
            _ => "none",
        }
    }

    /// Both reports say the same: the same outcome, the same number of
    /// paths, and every rule, set member and affinity of the JSON paths in
    /// the text.
    #[track_caller]
    fn assert_text_agrees(&self) {
        assert_eq!(
            self.text_outcome(),
            self.outcome(),
            "{}: the text and the JSON report differ:\n{}\n{:#}",
            self.command,
            self.text,
            self.json
        );
        let text_paths = self
            .text
            .lines()
            .filter(|line| line.starts_with("path "))
            .count();
        assert_eq!(text_paths, self.paths().len(), "{}", self.text);
        for path in self.paths() {
            let lines = strings(&path["rules"])
                .into_iter()
                .map(|rule| format!("    {rule}"))
                .chain(
                    strings(&path["elements"])
                        .into_iter()
                        .map(|element| format!("    element {element}")),
                )
                .chain(path["affinity"].as_array().unwrap().iter().map(|a| {
                    format!(
                        "    session affinity: {}, {} s",
                        a["name"].as_str().unwrap(),
                        a["seconds"]
                    )
                }));
            for line in lines {
                assert!(
                    self.text.lines().any(|l| l == line),
                    "{}: the JSON's {line:?} is not in the text:\n{}",
                    self.command,
                    self.text
                );
            }
        }
    }

    /// Every path: its rules, set members and affinity checked by `check`,
    /// which names what it found wrong.
    #[track_caller]
    fn assert_each_path(&self, check: impl Fn(&TracePath) -> Result<(), String>) {
        assert!(!self.paths().is_empty(), "{}: no path", self.command);
        for path in self.paths() {
            let path = TracePath::of(path);
            if let Err(wrong) = check(&path) {
                panic!("{}: {wrong}\n{}", self.command, self.text);
            }
        }
    }
}

/// One path of a JSON trace report, its lists as strings.
struct TracePath {
    verdict: String,
    endpoint: Option<String>,
    masqueraded: bool,
    probability: f64,
    rules: Vec<String>,
    elements: Vec<String>,
    /// `name for N s` of each affinity.
    affinity: Vec<String>,
}

impl TracePath {
    fn of(json: &k8s_openapi::serde_json::Value) -> Self {
        Self {
            verdict: json["verdict"].as_str().unwrap().to_owned(),
            endpoint: json["endpoint"].as_str().map(str::to_owned),
            masqueraded: json["masqueraded"].as_bool().unwrap(),
            probability: json["probability"].as_f64().unwrap(),
            rules: strings(&json["rules"]),
            elements: strings(&json["elements"]),
            affinity: json["affinity"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| format!("{} for {} s", a["name"].as_str().unwrap(), a["seconds"]))
                .collect(),
        }
    }

    /// The rule that matched and contains `part`, else an error saying so.
    fn rule(&self, part: &str) -> Result<&str, String> {
        self.rules
            .iter()
            .find(|rule| rule.contains(part))
            .map(String::as_str)
            .ok_or_else(|| format!("no matched rule has {part:?}: {:#?}", self.rules))
    }

    /// The rule that matched and contains each of `parts`.
    fn rule_with(&self, parts: &[&str]) -> Result<&str, String> {
        self.rules
            .iter()
            .find(|rule| parts.iter().all(|part| rule.contains(part)))
            .map(String::as_str)
            .ok_or_else(|| format!("no matched rule has all of {parts:?}: {:#?}", self.rules))
    }

    /// No matched rule contains `part`.
    fn no_rule(&self, part: &str) -> Result<(), String> {
        match self.rules.iter().find(|rule| rule.contains(part)) {
            Some(rule) => Err(format!("the rule {rule:?} matched")),
            None => Ok(()),
        }
    }

    /// The set member `element` (`SET: member`) was found.
    fn element(&self, element: &str) -> Result<(), String> {
        if self.elements.iter().any(|e| e == element) {
            Ok(())
        } else {
            Err(format!("no set member {element:?}: {:?}", self.elements))
        }
    }

    /// The path ends in `verdict` and is masqueraded or not.
    fn ends(&self, verdict: &str, masqueraded: bool) -> Result<(), String> {
        if self.verdict == verdict && self.masqueraded == masqueraded {
            Ok(())
        } else {
            Err(format!(
                "the path ends {} (masqueraded: {}), not {verdict} (masqueraded: {masqueraded})",
                self.verdict, self.masqueraded
            ))
        }
    }

    /// The path's affinity is `expected` (`name for N s` each).
    fn affinity_is(&self, expected: &[&str]) -> Result<(), String> {
        if self.affinity == expected {
            Ok(())
        } else {
            Err(format!("affinity {:?}, not {expected:?}", self.affinity))
        }
    }

    /// The path goes through the virtual server `virtual_server` (`TCP
    /// 10.96.0.15:80 rr`) to its real server, the path's endpoint, chosen
    /// with weight 1 of `of` and probability 1 / `of`.
    fn scheduled(&self, virtual_server: &str, of: u32) -> Result<(), String> {
        self.rule(&format!("ipvs: {virtual_server}"))?;
        let endpoint = self.endpoint.as_deref().ok_or("the path has no endpoint")?;
        self.rule(&format!("ipvs: real server {endpoint} weight 1 of {of}"))?;
        if (self.probability - 1.0 / f64::from(of)).abs() > 1e-6 {
            return Err(format!("probability {}, not 1/{of}", self.probability));
        }
        Ok(())
    }
}

/// The strings of a JSON array.
fn strings(json: &k8s_openapi::serde_json::Value) -> Vec<String> {
    json.as_array()
        .unwrap()
        .iter()
        .map(|value| value.as_str().unwrap().to_owned())
        .collect()
}

/// `kube-proxy trace` in the IPVS mode: the binary programs the example
/// manifests (examples/) in a fresh node namespace, and `trace` run there
/// reads IPVS, the ipsets, kube-ipvs0 and the iptables rules back and shows,
/// in text and as JSON with the same outcome:
/// - a pod to demo/sticky's ClusterIP (two endpoints, ClientIP affinity
///   600 s): the virtual server `rr persistent 600`, each real server with
///   half the connections, the KUBE-CLUSTER-IP member, the affinity, and no
///   masquerade (a pod of the cluster CIDR keeps its address); the same
///   ClusterIP from an address outside the cluster CIDR is masqueraded by
///   the `! -s 10.244.0.0/16 -j KUBE-MARK-MASQ` rule;
/// - a client outside to demo/web-nodeport's NodePort on the node address:
///   the KUBE-NODE-PORT-TCP member and its mark, masqueraded;
/// - demo/shop's load balancer IP from inside its source ranges (the
///   KUBE-LOAD-BALANCER-SOURCE-CIDR member lets it through to both
///   endpoints, masqueraded) and from outside them (dropped by
///   KUBE-SOURCE-RANGES-FIREWALL before IPVS);
/// - demo/empty: its virtual server has no real server, so rejected (ICMP
///   port unreachable).
///
/// Each report is written to the console between `===== BEGIN IPVS TRACE`
/// and `===== END IPVS TRACE` lines.
#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_kube_proxy_trace_shows_the_ipvs_path_of_each_kind_of_service() {
    use kp_testkit::netns::NsChild;
    require_ipvs();
    let binary = std::env::var(BINARY_VARIABLE).unwrap_or_else(|_| {
        panic!("{BINARY_VARIABLE} does not name the kube-proxy binary: {NEEDS_IPVS}")
    });
    let node = Netns::bare_node("ipvstrace").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    for (name, text) in EXAMPLE_MANIFESTS {
        std::fs::write(manifests.join(name), text).unwrap();
    }
    let log_path = dir.path().join("proxy.log");
    let mut command = node.command(&binary);
    command
        .args(["--proxy-mode", "ipvs"])
        .args(["--manifests", manifests.to_str().unwrap()])
        .args(["--hostname-override", "node-1"])
        .args(["--cluster-cidr", "10.244.0.0/16"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap());
    let _proxy = NsChild::spawn(&mut command).unwrap();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    // Each trace names the mode; finding it without --proxy-mode is
    // checked on its own at the end.
    let trace = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--proxy-mode", "ipvs"]);
        trace_in(&node, &binary, &all)
    };

    // The first sync programs every Service at once.
    let mut last = String::new();
    let programmed = wait_until(Duration::from_secs(60), || {
        let output = node
            .command(&binary)
            .args(["trace", "--proxy-mode", "ipvs", "-o", "json"])
            .args(["--to", "203.0.113.10:443/tcp", "--from", "198.51.100.7"])
            .output()
            .unwrap();
        last = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        last.contains("\"kind\": \"dnat\"")
    });
    assert!(
        programmed,
        "the load balancer IP was not traced as programmed within 60 s:\n{last}\nthe proxy's log:\n{}",
        log()
    );

    // A pod to the ClusterIP with ClientIP affinity.
    let sticky = trace(&["--to", "10.96.0.15:80/tcp", "--from", "10.244.1.5"]);
    sticky.show();
    assert_eq!(sticky.json["mode"], "ipvs");
    assert_eq!(sticky.json["origin"], "received");
    assert_eq!(sticky.outcome(), "dnat", "{}", sticky.text);
    assert_eq!(
        sticky.shares(),
        [
            ("10.244.1.2:8080".to_owned(), 50),
            ("10.244.1.3:8080".to_owned(), 50)
        ]
    );
    assert_eq!(sticky.json["outcome"]["masqueraded"], "none");
    sticky.assert_each_path(|path| {
        path.ends("accept", false)?;
        path.scheduled("TCP 10.96.0.15:80 rr persistent 600", 2)?;
        path.element("KUBE-CLUSTER-IP: 10.96.0.15,tcp:80")?;
        path.affinity_is(&["TCP 10.96.0.15:80 for 600 s"])?;
        // Why not masqueraded: the pod is in the cluster CIDR, so nothing
        // marked the packet and KUBE-POSTROUTING returns.
        path.no_rule("KUBE-MARK-MASQ")?;
        path.rule("KUBE-POSTROUTING -m mark ! --mark").map(drop)
    });
    sticky.assert_text_agrees();
    assert!(
        sticky
            .text
            .contains("Outcome: load-balanced to 2 endpoint(s): 10.244.1.2:8080 (50.0 %), 10.244.1.3:8080 (50.0 %); not masqueraded"),
        "{}",
        sticky.text
    );

    // The same ClusterIP from outside the cluster CIDR is masqueraded.
    let outside = trace(&["--to", "10.96.0.15:80/tcp", "--from", "192.168.99.10"]);
    outside.show();
    assert_eq!(outside.outcome(), "dnat", "{}", outside.text);
    assert_eq!(outside.json["outcome"]["masqueraded"], "all");
    outside.assert_each_path(|path| {
        path.ends("accept", true)?;
        path.scheduled("TCP 10.96.0.15:80 rr persistent 600", 2)?;
        // Why masqueraded: the source is outside the cluster CIDR.
        path.rule_with(&[
            "! -s 10.244.0.0/16",
            "--match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ",
        ])?;
        path.rule("-j MASQUERADE")?;
        path.affinity_is(&["TCP 10.96.0.15:80 for 600 s"])
    });
    outside.assert_text_agrees();

    // A client outside the node to the NodePort on the node's address.
    let node_port = trace(&["--to", "192.168.99.2:30080/tcp", "--from", "198.51.100.7"]);
    node_port.show();
    assert_eq!(node_port.outcome(), "dnat", "{}", node_port.text);
    assert_eq!(
        node_port.shares(),
        [
            ("10.244.1.2:8080".to_owned(), 50),
            ("10.244.1.3:8080".to_owned(), 50)
        ]
    );
    assert_eq!(node_port.json["outcome"]["masqueraded"], "all");
    node_port.assert_each_path(|path| {
        path.ends("accept", true)?;
        path.scheduled("TCP 192.168.99.2:30080 rr", 2)?;
        path.element("KUBE-NODE-PORT-TCP: 30080")?;
        // Why masqueraded: the NodePort set's rule marks the packet, and
        // KUBE-POSTROUTING masquerades what is marked.
        path.rule("KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ")?;
        path.rule("-j MASQUERADE")?;
        path.affinity_is(&[])
    });
    node_port.assert_text_agrees();

    // The load balancer IP from inside its source ranges.
    let inside = trace(&["--to", "203.0.113.10:443/tcp", "--from", "198.51.100.7"]);
    inside.show();
    assert_eq!(inside.outcome(), "dnat", "{}", inside.text);
    assert_eq!(
        inside.shares(),
        [
            ("10.244.1.4:8443".to_owned(), 50),
            ("10.244.2.3:8443".to_owned(), 50)
        ]
    );
    assert_eq!(inside.json["outcome"]["masqueraded"], "all");
    inside.assert_each_path(|path| {
        path.ends("accept", true)?;
        path.scheduled("TCP 203.0.113.10:443 rr", 2)?;
        path.element("KUBE-LOAD-BALANCER: 203.0.113.10,tcp:443")?;
        path.element("KUBE-LOAD-BALANCER-FW: 203.0.113.10,tcp:443")?;
        path.element("KUBE-LOAD-BALANCER-SOURCE-CIDR: 203.0.113.10,tcp:443,198.51.100.0/24")?;
        path.rule("KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ")?;
        path.rule("-j MASQUERADE")?;
        path.no_rule("-j DROP")
    });
    inside.assert_text_agrees();

    // The load balancer IP from outside its source ranges.
    let refused = trace(&["--to", "203.0.113.10:443/tcp", "--from", "192.0.2.1"]);
    refused.show();
    assert_eq!(refused.outcome(), "drop", "{}", refused.text);
    assert_eq!(refused.paths().len(), 1, "{}", refused.text);
    refused.assert_each_path(|path| {
        path.ends("drop", false)?;
        path.element("KUBE-LOAD-BALANCER-FW: 203.0.113.10,tcp:443")?;
        path.rule("KUBE-SOURCE-RANGES-FIREWALL -j DROP")?;
        // Dropped in filter INPUT, before IPVS schedules it.
        path.no_rule("ipvs: ")?;
        if path.elements.iter().any(|e| e.contains("SOURCE-CIDR")) {
            return Err(format!("a source range matched: {:?}", path.elements));
        }
        Ok(())
    });
    refused.assert_text_agrees();

    // The Service without endpoints.
    let empty = trace(&["--to", "10.96.0.17:80/tcp", "--from", "10.244.1.5"]);
    empty.show();
    assert_eq!(empty.outcome(), "reject", "{}", empty.text);
    assert_eq!(empty.paths().len(), 1, "{}", empty.text);
    empty.assert_each_path(|path| {
        path.ends("reject", false)?;
        path.rule("ipvs: TCP 10.96.0.17:80 rr")?;
        path.rule("ipvs: TCP 10.96.0.17:80 has no real server")?;
        path.element("KUBE-CLUSTER-IP: 10.96.0.17,tcp:80")?;
        if path.endpoint.is_some() {
            return Err(format!("an endpoint: {:?}", path.endpoint));
        }
        Ok(())
    });
    empty.assert_text_agrees();
    assert!(
        empty.text.contains("rejected (ICMP unreachable)"),
        "{}",
        empty.text
    );

    // Without --proxy-mode, trace finds the IPVS mode's rules itself.
    let detected = trace_in(&node, &binary, &["--to", "10.96.0.17:80/tcp"]);
    detected.show();
    detected.assert_text_agrees();
    assert_eq!(detected.json["mode"], "ipvs", "{}", detected.text);
    assert_eq!(detected.json["origin"], "this-node", "{}", detected.text);
    // A process of the node reaches kube-ipvs0's address from that address.
    assert_eq!(detected.json["source"], "10.96.0.17", "{}", detected.text);
    assert_eq!(detected.outcome(), "reject", "{}", detected.text);
    assert!(
        !log().contains("syncing proxy rules failed"),
        "no sync failed:\n{}",
        log()
    );
}

/// How many packets from `source` the second node forwarded (an
/// iptables-legacy counting rule in its FORWARD chain, added by
/// [`count_forwarded_from`]): a client sees a reply dropped on node-2 and
/// a request never sent there alike (no answer); the count tells them
/// apart.
fn forwarded_from(topology: &Topology, source: IpAddr) -> u64 {
    let program = if source.is_ipv6() {
        "ip6tables-legacy"
    } else {
        "iptables-legacy"
    };
    let listing = topology
        .second_node()
        .exec_ok(program, &["-L", "FORWARD", "-n", "-v", "-x"]);
    let source = source.to_string();
    listing
        .lines()
        .find(|line| {
            line.split_whitespace()
                .any(|word| word.split('/').next() == Some(source.as_str()))
        })
        .and_then(|line| line.split_whitespace().next())
        .and_then(|packets| packets.parse().ok())
        .unwrap_or_else(|| panic!("no counting rule for {source} on node-2:\n{listing}"))
}

/// Starts counting the packets the second node forwards from `source`.
fn count_forwarded_from(topology: &Topology, source: IpAddr) {
    let program = if source.is_ipv6() {
        "ip6tables-legacy"
    } else {
        "iptables-legacy"
    };
    topology
        .second_node()
        .exec_ok(program, &["-A", "FORWARD", "-s", &source.to_string()]);
}

/// The rule number of KUBE-POSTROUTING's MASQUERADE rule in the node's nat
/// table of `program` (`iptables-legacy`, `ip6tables-legacy`).
fn masquerade_rule_number(topology: &Topology, program: &str) -> String {
    let listing = topology.node().exec_ok(
        program,
        &[
            "-t",
            "nat",
            "-L",
            "KUBE-POSTROUTING",
            "-n",
            "--line-numbers",
        ],
    );
    listing
        .lines()
        .find(|line| line.split_whitespace().nth(1) == Some("MASQUERADE"))
        .and_then(|line| line.split_whitespace().next())
        .unwrap_or_else(|| panic!("KUBE-POSTROUTING has no MASQUERADE rule:\n{listing}"))
        .to_owned()
}

/// A second node (kp_testkit's `with_second_node`): ep3 lives behind
/// node-2, which routes only to this node and its pods, so ep3 can answer a
/// client outside the cluster only when this node masqueraded the
/// connection to its own address. For each family, a client reaches ep3
/// through the NodePort on the node's address (and in IPv4 also through
/// the external IP and the load balancer IP), and ep3 sees the node's
/// address; the same client connecting to ep3 directly (routed by the
/// node, not masqueraded) reaches node-2 and gets no answer; a pod of this
/// node reaches ep3 through the ClusterIP with its own address (pod ranges
/// are routed between the nodes, so nothing is masqueraded). With
/// KUBE-POSTROUTING's MASQUERADE rule deleted, a new connection through
/// the NodePort goes unanswered too.
#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_a_pod_on_the_second_node_answers_a_client_only_through_the_masquerade() {
    use kp_testkit::plan::{NODE_IP, NODE_IP_V6};
    require_ipvs();
    kp_testkit::netns::require_tool("iptables-legacy");
    let topology = Topology::builder()
        .with_second_node()
        .remote_pod("ep3", |p| p.tcp(80))
        .pod("src", |p| p)
        .build()
        .unwrap();
    let (ep3, ep3_v6) = (
        ip_of(&topology, "ep3"),
        topology.pod("ep3").ip_v6().to_string(),
    );
    let parts = RequestParts::new(
        Ports::new()
            .with(
                service("ns1", "far", "10.96.0.21", 80)
                    .node_port(30100)
                    .external_ip("203.0.113.5")
                    .lb_ip("203.0.113.9")
                    .endpoint(&ep3, 80, false),
            )
            .build(),
        "192.168.99.2",
    );
    let parts6 = RequestParts::new(
        Ports::new()
            .with(
                service("ns1", "far6", "fd00:10:96::21", 80)
                    .node_port(30100)
                    .endpoint(&ep3_v6, 80, false),
            )
            .build(),
        "fd00:192:168:99::2",
    );
    let mut backend = node_backend(&topology, IpFamily::V4);
    let mut backend6 = node_backend(&topology, IpFamily::V6);
    sync(&topology, &mut backend, &parts, true);
    sync(&topology, &mut backend6, &parts6, true);

    let client = topology.client();
    let (client_v4, client_v6) = (IpAddr::V4(client.ip()), IpAddr::V6(client.ip_v6()));
    let cases = [
        (at("192.168.99.2", 30100), IpAddr::V4(NODE_IP)),
        (at("203.0.113.5", 80), IpAddr::V4(NODE_IP)),
        (at("203.0.113.9", 80), IpAddr::V4(NODE_IP)),
        (at("fd00:192:168:99::2", 30100), IpAddr::V6(NODE_IP_V6)),
    ];
    for (address, node_ip) in cases {
        let reply = connect(client, address).unwrap_or_else(|error| {
            panic!("{address}: no answer from ep3 on node-2 (not masqueraded?): {error}")
        });
        assert_eq!(reply.backend, "ep3", "{address}");
        assert_eq!(
            reply.source, node_ip,
            "{address}: ep3 sees the node's address, not the client's"
        );
    }

    // Without the masquerade the client's connection reaches node-2, and
    // ep3's answer to the client's address has no way back.
    count_forwarded_from(&topology, client_v4);
    count_forwarded_from(&topology, client_v6);
    expect_timeout(client, at(&ep3, 80));
    expect_timeout(client, SocketAddr::new(ep3_v6.parse().unwrap(), 80));
    assert!(
        forwarded_from(&topology, client_v4) > 0 && forwarded_from(&topology, client_v6) > 0,
        "node-2 forwarded the client's direct connections to ep3"
    );

    // A pod of this node keeps its address: the pod ranges are routed.
    let src = topology.pod("src");
    for (address, own) in [
        (at("10.96.0.21", 80), IpAddr::V4(src.ip())),
        (at("fd00:10:96::21", 80), IpAddr::V6(src.ip_v6())),
    ] {
        let reply = connect(src, address).unwrap();
        assert_eq!(
            (reply.backend.as_str(), reply.source),
            ("ep3", own),
            "{address}: the pod reaches ep3 with its own address"
        );
    }

    // KUBE-POSTROUTING's MASQUERADE rule deleted: a new connection through
    // the NodePort reaches ep3 with the client's address and dies there.
    for (program, address) in [
        ("iptables-legacy", at("192.168.99.2", 30100)),
        ("ip6tables-legacy", at("fd00:192:168:99::2", 30100)),
    ] {
        let number = masquerade_rule_number(&topology, program);
        topology
            .node()
            .exec_ok(program, &["-t", "nat", "-D", "KUBE-POSTROUTING", &number]);
        let source = client_ip_of(client, address);
        let before = forwarded_from(&topology, source);
        expect_timeout(client, address);
        assert!(
            forwarded_from(&topology, source) > before,
            "{address}: without the masquerade the connection still reaches node-2"
        );
    }
}

/// The client's address of `address`'s family.
fn client_ip_of(client: &kp_testkit::netns::Host, address: SocketAddr) -> IpAddr {
    if address.is_ipv6() {
        IpAddr::V6(client.ip_v6())
    } else {
        IpAddr::V4(client.ip())
    }
}

/// The IPv4 connections `kube-proxy check` derives from the example
/// manifests: every service port's ClusterIP (11 service ports), the three
/// NodePorts on the node address, the external IP, the load balancer IPs
/// (demo/shop's twice: from inside its source ranges and from outside),
/// and for the 10 service ports with an endpoint on this node that
/// endpoint reaching its own ClusterIP (hairpin).
const EXAMPLE_CONNECTIONS: usize = 28;

/// A node namespace where the binary in IPVS mode programmed the example
/// manifests and was then stopped (killed: its kernel state stays, and
/// nothing repairs what a test breaks).
struct StoppedExampleNode {
    node: Netns,
    binary: String,
    flags: Vec<String>,
    _dir: tempfile::TempDir,
}

/// One `kube-proxy check` run: exit code and output.
struct CheckRun {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl std::fmt::Display for CheckRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "kube-proxy check exited with {:?}\nstdout:\n{}stderr:\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

impl CheckRun {
    /// The IPv4 summary line (`IPv4: N connections to M service ports
    /// checked against the ipvs rules: K different`), if printed.
    fn ipv4_line(&self) -> Option<&str> {
        self.stdout.lines().find(|line| line.starts_with("IPv4:"))
    }

    /// Each `DIFFERENT PROBE: the model says …; the ipvs rules: FOUND`
    /// line as (PROBE, FOUND); `None` for a line of another shape.
    fn differences(&self) -> Vec<Option<(String, String)>> {
        self.stdout
            .lines()
            .filter_map(|line| line.strip_prefix("DIFFERENT "))
            .map(|rest| {
                let (probe, said) = rest.split_once(": the model says ")?;
                let (_, found) = said.split_once("; the ipvs rules: ")?;
                Some((probe.to_owned(), found.to_owned()))
            })
            .collect()
    }
}

impl StoppedExampleNode {
    /// Starts the binary in IPVS mode on the example manifests in a fresh
    /// node namespace, waits until `kube-proxy check` with the same flags
    /// exits 0 having checked all [`EXAMPLE_CONNECTIONS`], and stops it.
    fn new(role: &str) -> Self {
        use kp_testkit::netns::NsChild;
        require_ipvs();
        let binary = std::env::var(BINARY_VARIABLE).unwrap_or_else(|_| {
            panic!("{BINARY_VARIABLE} does not name the kube-proxy binary: {NEEDS_IPVS}")
        });
        let node = Netns::bare_node(role).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let manifests = dir.path().join("manifests");
        std::fs::create_dir_all(&manifests).unwrap();
        for (name, text) in EXAMPLE_MANIFESTS {
            std::fs::write(manifests.join(name), text).unwrap();
        }
        let flags: Vec<String> = [
            "--proxy-mode",
            "ipvs",
            "--manifests",
            manifests.to_str().unwrap(),
            "--hostname-override",
            "node-1",
            "--cluster-cidr",
            "10.244.0.0/16",
        ]
        .map(str::to_owned)
        .to_vec();
        let log_path = dir.path().join("proxy.log");
        let mut command = node.command(&binary);
        command
            .args(&flags)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap());
        let proxy = NsChild::spawn(&mut command).unwrap();
        let stopped = Self {
            node,
            binary,
            flags,
            _dir: dir,
        };
        // The first sync programs every Service at once; until then check
        // finds differences (or no rules at all).
        let mut last = None;
        let agreed = wait_until(Duration::from_secs(60), || {
            let run = stopped.check();
            let clean = run.code == Some(0);
            last = Some(run);
            clean
        });
        let last = last.unwrap();
        assert!(
            agreed,
            "kube-proxy check never agreed with the proxy's own state within 60 s:\n{last}\nthe proxy's log:\n{}",
            std::fs::read_to_string(&log_path).unwrap_or_default()
        );
        assert_eq!(
            last.ipv4_line(),
            Some(
                format!(
                    "IPv4: {EXAMPLE_CONNECTIONS} connections to 11 service ports checked against the ipvs rules: 0 different"
                )
                .as_str()
            ),
            "{last}"
        );
        drop(proxy);
        stopped
    }

    /// Runs `kube-proxy check` with the proxy's flags in the node.
    fn check(&self) -> CheckRun {
        let output = self
            .node
            .command(&self.binary)
            .arg("check")
            .args(&self.flags)
            .output()
            .unwrap();
        CheckRun {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Applies `ops` to the node's IPVS table and sets, which must take
    /// them all and change what the kernel lists. (The kernel takes an
    /// ipset delete of a member that is not there without an error when
    /// the request lacks `NLM_F_EXCL`, as `ipset -exist del` does, so a
    /// successful apply alone proves nothing.)
    #[track_caller]
    fn damage(&self, ops: &[Op]) {
        let (before, after) = self.node.run(|| {
            let mut kernel = NetlinkKernel::new();
            let before = kernel.list(IpFamily::V4).unwrap();
            kernel
                .apply(IpFamily::V4, ops)
                .unwrap_or_else(|error| panic!("damaging the IPVS state with {ops:?}: {error}"));
            (before, kernel.list(IpFamily::V4).unwrap())
        });
        assert_ne!(before, after, "{ops:?} changed nothing in the kernel");
    }

    /// `kube-proxy check` exits 1 and names exactly the connections of
    /// `expected` (the probe as check prints it, and a part of what it
    /// says the kernel does instead), no other.
    #[track_caller]
    fn assert_check_names(&self, expected: &[(&str, &str)]) {
        let run = self.check();
        assert_eq!(run.code, Some(1), "{run}");
        let found = run.differences();
        assert!(
            found.iter().all(Option::is_some),
            "a DIFFERENT line of an unknown shape:\n{run}"
        );
        let mut named: Vec<&str> = found.iter().flatten().map(|(p, _)| p.as_str()).collect();
        named.sort_unstable();
        let mut wanted: Vec<&str> = expected.iter().map(|(probe, _)| *probe).collect();
        wanted.sort_unstable();
        assert_eq!(named, wanted, "check named other connections:\n{run}");
        for (probe, part) in expected {
            let (_, what) = found.iter().flatten().find(|(p, _)| p == probe).unwrap();
            assert!(
                what.contains(part),
                "{probe}: check found {what:?}, which does not say {part:?}:\n{run}"
            );
        }
        assert_eq!(
            run.ipv4_line(),
            Some(
                format!(
                    "IPv4: {EXAMPLE_CONNECTIONS} connections to 11 service ports checked against the ipvs rules: {} different",
                    expected.len()
                )
                .as_str()
            ),
            "{run}"
        );
    }
}

/// `kube-proxy check` in the IPVS mode: demo/web's ClusterIP virtual
/// server deleted behind the stopped proxy's back (`ipvsadm -D -t
/// 10.96.0.10:80`). Its address stays on kube-ipvs0 and in KUBE-CLUSTER-IP,
/// so a connection to it is delivered to the node, where nothing handles
/// it; check names its two connections (from outside, and from its
/// endpoint on the node) and no other.
#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_kube_proxy_check_names_a_deleted_virtual_server() {
    let stopped = StoppedExampleNode::new("ipvscheck-vs");
    stopped.damage(&[Op::DeleteService(ServiceKey {
        address: "10.96.0.10".parse().unwrap(),
        protocol: Protocol::Tcp,
        port: 80,
    })]);
    stopped.assert_check_names(&[
        (
            "demo/web:http cluster IP 10.96.0.10:80/tcp from 192.0.2.1",
            "not handled (no rule for this address and port)",
        ),
        (
            "demo/web:http cluster IP 10.96.0.10:80/tcp from 10.244.1.2",
            "not handled (no rule for this address and port)",
        ),
    ]);
}

/// `kube-proxy check` in the IPVS mode: one of the two real servers of
/// demo/web-nodeport's NodePort virtual server removed (`ipvsadm -d -t
/// 192.168.99.2:30080 -r 10.244.1.3:8080`). Check names the NodePort's
/// connection with the one endpoint left, and not the Service's ClusterIP,
/// whose virtual server keeps both. Adding the real server back makes
/// check agree again.
#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_kube_proxy_check_names_a_removed_real_server() {
    let stopped = StoppedExampleNode::new("ipvscheck-rs");
    let node_port = ServiceKey {
        address: "192.168.99.2".parse().unwrap(),
        protocol: Protocol::Tcp,
        port: 30080,
    };
    let removed = at("10.244.1.3", 8080);
    stopped.damage(&[Op::DeleteReal(node_port, removed)]);
    stopped.assert_check_names(&[(
        "demo/web-nodeport:http node port 192.168.99.2:30080/tcp from 192.0.2.1",
        "DNAT to one of {10.244.1.2:8080}, masqueraded on every path",
    )]);

    stopped.damage(&[Op::AddReal(node_port, removed, 1)]);
    let run = stopped.check();
    assert_eq!(run.code, Some(0), "after the repair:\n{run}");
}

/// `kube-proxy check` in the IPVS mode: demo/web-nodeport's member removed
/// from KUBE-NODE-PORT-TCP (`ipset del KUBE-NODE-PORT-TCP 30080`). The set
/// does not decide whether IPVS takes the connection (the virtual server
/// on the node address does); it is matched by the nat rule
/// `KUBE-NODE-PORT -p tcp -m set --match-set KUBE-NODE-PORT-TCP dst -j
/// KUBE-MARK-MASQ`, so without the member the NodePort's connections reach
/// both endpoints unmasqueraded: the endpoints would answer the client
/// directly, and the model requires the masquerade
/// (externalTrafficPolicy: Cluster). Check names that one connection;
/// demo/shop's NodePort (30443, still a member) is not named.
#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_kube_proxy_check_names_a_removed_node_port_set_member() {
    let stopped = StoppedExampleNode::new("ipvscheck-np");
    stopped.damage(&[Op::DeleteEntry(SetKind::NodePortTcp, SetEntry::Port(30080))]);
    stopped.assert_check_names(&[(
        "demo/web-nodeport:http node port 192.168.99.2:30080/tcp from 192.0.2.1",
        "DNAT to one of {10.244.1.2:8080, 10.244.1.3:8080}, not masqueraded",
    )]);
}

/// `kube-proxy check` in the IPVS mode: demo/shop's member removed from
/// KUBE-LOAD-BALANCER-FW (`ipset del KUBE-LOAD-BALANCER-FW
/// 203.0.113.10,tcp:443`). That member is what sends the load balancer
/// IP's connections from KUBE-PROXY-FIREWALL (filter INPUT) to
/// KUBE-SOURCE-RANGES-FIREWALL, which drops a client outside the source
/// ranges: without it, the client 192.0.2.1 the model drops reaches both
/// endpoints. The client inside the ranges (192.168.99.9) fares as before,
/// so check names only the refused client's connection.
#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_kube_proxy_check_names_a_removed_load_balancer_firewall_member() {
    let stopped = StoppedExampleNode::new("ipvscheck-fw");
    stopped.damage(&[Op::DeleteEntry(
        SetKind::LoadBalancerFw,
        SetEntry::IpPort("203.0.113.10".parse().unwrap(), Protocol::Tcp, 443),
    )]);
    stopped.assert_check_names(&[(
        "demo/shop:https load balancer IP 203.0.113.10:443/tcp from 192.0.2.1",
        "DNAT to one of {10.244.1.4:8443, 10.244.2.3:8443}",
    )]);
}

/// `kube-proxy check` in the IPVS mode after `iptables-legacy -t nat -F`:
/// IPVS itself still schedules every connection (it DNATs at LOCAL_IN, not
/// through nat rules), and the filter table's source-range firewall still
/// drops, so the only thing lost is the masquerade (the mark, and the
/// KUBE-LOOP-BACK rule). Exactly the connections the model masquerades
/// differ: four from outside (a NodePort, a load balancer IP and an
/// external IP of Services with externalTrafficPolicy: Cluster), and the
/// ten of an endpoint reaching its own ClusterIP (hairpin); not the
/// ClusterIPs from outside (the model leaves their masquerade to the
/// mode), not demo/api-local's NodePort and load balancer IP (Local: never
/// masqueraded), not the refused client of demo/shop's source ranges, not
/// the rejected demo/empty.
#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_kube_proxy_check_names_the_masqueraded_connections_of_a_flushed_nat_table() {
    let stopped = StoppedExampleNode::new("ipvscheck-nat");
    stopped
        .node
        .exec_ok("iptables-legacy", &["-t", "nat", "-F"]);
    let shop = "DNAT to one of {10.244.1.4:8443, 10.244.2.3:8443}, not masqueraded";
    stopped.assert_check_names(&[
        (
            "demo/web-nodeport:http node port 192.168.99.2:30080/tcp from 192.0.2.1",
            "DNAT to one of {10.244.1.2:8080, 10.244.1.3:8080}, not masqueraded",
        ),
        (
            "demo/shop:https node port 192.168.99.2:30443/tcp from 192.0.2.1",
            shop,
        ),
        (
            "demo/shop:https load balancer IP 203.0.113.10:443/tcp from 192.168.99.9",
            shop,
        ),
        (
            "demo/legacy external IP 203.0.113.20:8080/tcp from 192.0.2.1",
            "DNAT to one of {10.244.1.6:8080}, not masqueraded",
        ),
        (
            "demo/api-local:http cluster IP 10.96.0.13:80/tcp from 10.244.1.5",
            "DNAT to one of {10.244.1.5:8080, 10.244.2.4:8080}, not masqueraded",
        ),
        (
            "demo/draining:http cluster IP 10.96.0.18:80/tcp from 10.244.1.9",
            "DNAT to one of {10.244.1.9:8080}, not masqueraded",
        ),
        (
            "demo/legacy cluster IP 10.96.0.14:8080/tcp from 10.244.1.6",
            "DNAT to one of {10.244.1.6:8080}, not masqueraded",
        ),
        (
            "demo/multi:http cluster IP 10.96.0.16:80/tcp from 10.244.1.7",
            "DNAT to one of {10.244.1.7:8080}, not masqueraded",
        ),
        (
            "demo/multi:metrics cluster IP 10.96.0.16:9090/tcp from 10.244.1.7",
            "DNAT to one of {10.244.1.7:9090}, not masqueraded",
        ),
        (
            "demo/shop:https cluster IP 10.96.0.12:443/tcp from 10.244.1.4",
            shop,
        ),
        (
            "demo/sticky:http cluster IP 10.96.0.15:80/tcp from 10.244.1.2",
            "DNAT to one of {10.244.1.2:8080, 10.244.1.3:8080}, not masqueraded",
        ),
        (
            "demo/web:http cluster IP 10.96.0.10:80/tcp from 10.244.1.2",
            "DNAT to one of {10.244.1.2:8080, 10.244.1.3:8080, 10.244.2.2:8080}, not masqueraded",
        ),
        (
            "demo/web-nodeport:http cluster IP 10.96.0.11:80/tcp from 10.244.1.2",
            "DNAT to one of {10.244.1.2:8080, 10.244.1.3:8080}, not masqueraded",
        ),
        (
            "kube-system/dns:dns cluster IP 10.96.0.53:53/udp from 10.244.1.8",
            "DNAT to one of {10.244.1.8:5353}, not masqueraded",
        ),
    ]);
}
