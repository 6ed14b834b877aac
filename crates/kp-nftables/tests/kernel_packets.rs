//! Kernel tests: traffic policies, refusals, affinity expiry and IPv6
//! external addresses of the nftables mode, told by real packets in
//! network namespaces that the netlink applier programmed; where a packet
//! alone cannot tell two causes apart, the table the kernel holds is read
//! back (`kp_nftables::live::read_table`) and traced.
//!
//! Behaviour follows upstream's nftables proxier: a ClusterIP with
//! `internalTrafficPolicy: Local` and no endpoint on this node is dropped
//! (`no-endpoint-services` … `drop`); a NodePort without any endpoint is
//! refused in the filter input hook (`no-endpoint-nodeports` … `goto
//! reject-chain`), ahead of any socket of the host; an affinity entry is an
//! element of the endpoint's `affinity-…` set that lives `timeoutSeconds`
//! after the client's last connection. Each test runs in both layouts
//! (`chains::…`, `data::…`, [`Layout`]); the data layout writes a
//! service port with affinity as the chains layout does.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/itp, http 80/TCP | ClusterIP 10.96.0.23, iTP Local, endpoints ep1 (node-1), ep3 (node-2) |
//! | ns1/itp-far, http 80/TCP | ClusterIP 10.96.0.24, iTP Local, endpoint ep3 (node-2) only |
//! | ns1/empty-np, http 80/TCP | NodePort 30092, ClusterIP 10.96.0.25, no endpoints; a socket of the node listens on 30092 |
//! | ns1/brief, http 80/TCP | ClusterIP 10.96.0.15, ClientIP affinity of 2 s, endpoints ep1, ep2 (node-1), ep3 (node-2) |
//! | ns1/np6, http 80/TCP | ClusterIP fd00:10:96::13, NodePort 30083 on fd00:192:168:99::2, eTP Cluster, endpoints ep1 (node-1), ep3 (node-2) |
//! | ns1/lb6, http 80/TCP | ClusterIP fd00:10:96::14, LoadBalancer 2001:db8:203:113::9, NodePort 30084, eTP Local, endpoints ep2 (node-1), ep3 (node-2) |
//!
//! Node 192.168.99.2 / fd00:192:168:99::2; `client` 192.168.99.10 /
//! fd00:192:168:99::10; pods of node-1 10.244.1.2 (ep1), .3 (ep2), of
//! node-2 10.244.2.2 (ep3), each serving TCP 8080.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod kernel;

in_both_layouts!(
    internal_traffic_policy_local_keeps_cluster_ip_traffic_on_the_node,
    a_node_port_without_endpoints_is_refused_ahead_of_the_nodes_own_socket,
    session_affinity_ends_after_its_timeout,
    ipv6_node_port_answers_a_client_outside_the_node,
    ipv6_load_balancer_ip_answers_a_client_outside_the_node,
);

use std::io::Write as _;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kernel::{
    at, build, node_at, pod_ip, pod_ip_v6, require, slice, three_pods, Proxy, POD_TCP_PORT,
};
use kp_model::{IpFamily, NamespacedName, Protocol, ServicePortName};
use kp_nftables::tracer::{Packet, Table, Verdict};
use kp_nftables::Layout;
use kp_testkit::builders::service;
use kp_testkit::netns::{
    connect, expect_refused, expect_timeout, hits, hits_until_all, wait_until, Netns, Topology,
};
use kp_testkit::plan;

fn internal_traffic_policy_local_keeps_cluster_ip_traffic_on_the_node(layout: Layout) {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start_in(&topology, IpFamily::V4, layout);
    let remote = [pod_ip(&topology, "ep3")];
    proxy.apply(
        &[
            service("ns1", "itp", |s| {
                s.cluster_ip("10.96.0.23")
                    .port("http", 80, "TCP")
                    .internal_traffic_policy_local()
            }),
            service("ns1", "itp-far", |s| {
                s.cluster_ip("10.96.0.24")
                    .port("http", 80, "TCP")
                    .internal_traffic_policy_local()
            }),
        ],
        &[
            slice("itp", &[pod_ip(&topology, "ep1")], &remote),
            slice("itp-far", &[], &remote),
        ],
    );
    proxy.sync();

    // From a pod of this node and from the node itself: the local endpoint
    // only, never the one on node-2.
    let itp = at("10.96.0.23", 80);
    let pod = topology.pod("ep2");
    for from in [pod.netns(), topology.node()] {
        let counts = hits(from, itp, 16);
        assert_eq!(
            counts.keys().collect::<Vec<_>>(),
            ["ep1"],
            "from {}: local endpoints only",
            from.name()
        );
    }
    // Traffic inside the cluster keeps its source: the endpoint sees the
    // pod, not the node.
    let reply = connect(pod, itp).unwrap();
    assert_eq!(reply.source, pod_ip(&topology, "ep2"), "not masqueraded");
    // Without a local endpoint the ClusterIP is dropped: no answer, no
    // refusal, and no connection to node-2.
    let far = at("10.96.0.24", 80);
    expect_timeout(pod, far);

    // The kernel's table, traced: ep1 alone for `itp` (a sample of
    // connections could miss ep3 by chance; the table cannot), a drop for
    // `itp-far`.
    let table = read_back(&topology, IpFamily::V4);
    let from_pod = |dst| tcp_packet(pod_ip(&topology, "ep2"), dst, false);
    assert_dnat_to(
        &table.trace(&from_pod(itp)).unwrap(),
        &[SocketAddr::new(pod_ip(&topology, "ep1"), POD_TCP_PORT)],
    );
    assert_eq!(table.trace(&from_pod(far)).unwrap(), Verdict::Drop);
}

fn a_node_port_without_endpoints_is_refused_ahead_of_the_nodes_own_socket(layout: Layout) {
    require();
    let topology = build(three_pods());
    let client = topology.client();
    let node_port = node_at(30092);
    // A socket of the node on the NodePort: before the proxy it answers,
    // so a refusal afterwards cannot come from a closed port (whose TCP
    // reset a client could not tell from the rules' ICMP error).
    let socket = HostSocket::listen(topology.node(), node_port.port());
    assert_eq!(connect(client, node_port).unwrap().backend, "node");
    assert_eq!(socket.accepted(), 1);

    let proxy = Proxy::start_in(&topology, IpFamily::V4, layout);
    proxy.apply(
        &[service("ns1", "empty-np", |s| {
            s.service_type("NodePort")
                .cluster_ip("10.96.0.25")
                .port("http", 80, "TCP")
                .node_port(30092)
        })],
        &[],
    );
    proxy.sync();

    expect_refused(client, node_port);
    assert_eq!(
        socket.accepted(),
        1,
        "the refused connection never reached the node's socket"
    );
    let table = read_back(&topology, IpFamily::V4);
    assert_eq!(
        table.maps["no-endpoint-nodeports"]
            .keys()
            .collect::<Vec<_>>(),
        ["tcp . 30092"],
        "{:?}",
        table.maps["no-endpoint-nodeports"]
    );
    let from_client = tcp_packet(IpAddr::V4(client.ip()), node_port, true);
    assert_eq!(table.trace(&from_client).unwrap(), Verdict::Reject);
}

/// How long `ns1/brief` keeps a client on its endpoint.
const BRIEF_AFFINITY_SECS: u64 = 2;

fn session_affinity_ends_after_its_timeout(layout: Layout) {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start_in(&topology, IpFamily::V4, layout);
    let local = ["ep1", "ep2"].map(|p| pod_ip(&topology, p));
    proxy.apply(
        &[service("ns1", "brief", |s| {
            s.cluster_ip("10.96.0.15")
                .port("http", 80, "TCP")
                .session_affinity_client_ip(i32::try_from(BRIEF_AFFINITY_SECS).unwrap())
        })],
        &[slice("brief", &local, &[pod_ip(&topology, "ep3")])],
    );
    proxy.sync();
    let client = topology.client();
    let client_ip = IpAddr::V4(client.ip());
    let address = at("10.96.0.15", 80);
    let timeout = Duration::from_secs(BRIEF_AFFINITY_SECS);

    let first = hits(client, address, 10);
    assert_eq!(first.len(), 1, "one endpoint within the timeout: {first:?}");
    let stuck = first.keys().next().unwrap().clone();
    let table = read_back(&topology, IpFamily::V4);
    // The kernel remembers the client in that endpoint's set alone, for
    // the Service's timeout (in either layout).
    let set = affinity_set(&topology, "brief", &stuck);
    assert_eq!(
        affinity_sets_holding(&table, client_ip),
        std::slice::from_ref(&set)
    );
    assert_eq!(table.timeouts_secs.get(&set), Some(&BRIEF_AFFINITY_SECS));

    // Each connection starts the timeout again: a client that keeps
    // coming back stays past it. (The kernel's clock cannot be paused:
    // real time has to pass.)
    let step = timeout / 2;
    for _ in 0..4 {
        std::thread::sleep(step);
        assert_eq!(
            connect(client, address).unwrap().backend,
            stuck,
            "a client connecting every {step:?} stays on its endpoint"
        );
    }

    // Idle, the entry lives out its timeout and then expires.
    let idle_since = Instant::now();
    expect_expiry(&topology, client_ip, idle_since, timeout);

    // Forgotten, the client is balanced again: each connection picks one
    // of three endpoints, so within a few expiries it lands on another
    // (twelve tries all miss with probability 3^-12).
    let mut moved = None;
    for _ in 0..12 {
        let backend = connect(client, address).unwrap().backend;
        if backend != stuck {
            moved = Some(backend);
            break;
        }
        expect_expiry(&topology, client_ip, Instant::now(), timeout);
    }
    assert!(
        moved.is_some(),
        "the client stayed on {stuck} past twelve affinity timeouts"
    );
}

fn ipv6_node_port_answers_a_client_outside_the_node(layout: Layout) {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start_in(&topology, IpFamily::V6, layout);
    proxy.apply(
        &[service("ns1", "np6", |s| {
            s.ip_families(&["IPv6"])
                .service_type("NodePort")
                .cluster_ip("fd00:10:96::13")
                .port("http", 80, "TCP")
                .node_port(30083)
        })],
        &[slice(
            "np6",
            &[pod_ip_v6(&topology, "ep1")],
            &[pod_ip_v6(&topology, "ep3")],
        )],
    );
    proxy.sync();

    let client = topology.client();
    let node_port = SocketAddr::new(plan::NODE_IP_V6.into(), 30083);
    let counts = hits_until_all(client, node_port, &["ep1", "ep3"], 200);
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["ep1", "ep3"]);
    // eTP Cluster: the endpoint on node-2 must answer through this node,
    // so the client's address is replaced by the node's.
    for _ in 0..4 {
        let reply = connect(client, node_port).unwrap();
        assert_eq!(
            reply.source,
            IpAddr::V6(plan::NODE_IP_V6),
            "masqueraded: {reply:?}"
        );
    }
}

fn ipv6_load_balancer_ip_answers_a_client_outside_the_node(layout: Layout) {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start_in(&topology, IpFamily::V6, layout);
    proxy.apply(
        &[service("ns1", "lb6", |s| {
            s.ip_families(&["IPv6"])
                .service_type("LoadBalancer")
                .cluster_ip("fd00:10:96::14")
                .port("http", 80, "TCP")
                .node_port(30084)
                .lb_ingress_ip("2001:db8:203:113::9")
                .external_traffic_policy_local()
        })],
        &[slice(
            "lb6",
            &[pod_ip_v6(&topology, "ep2")],
            &[pod_ip_v6(&topology, "ep3")],
        )],
    );
    proxy.sync();

    // eTP Local: the endpoint of this node only, and it sees the client's
    // own address.
    let client = topology.client();
    let client_ip = IpAddr::V6(client.ip_v6());
    let load_balancer = at("2001:db8:203:113::9", 80);
    let counts = hits(client, load_balancer, 16);
    assert_eq!(
        counts.keys().collect::<Vec<_>>(),
        ["ep2"],
        "local endpoints only"
    );
    let reply = connect(client, load_balancer).unwrap();
    assert_eq!(reply.source, client_ip, "not masqueraded: {reply:?}");
    let node_port = SocketAddr::new(plan::NODE_IP_V6.into(), 30084);
    assert_eq!(connect(client, node_port).unwrap().backend, "ep2");

    let table = read_back(&topology, IpFamily::V6);
    let ep2 = SocketAddr::new(pod_ip_v6(&topology, "ep2"), POD_TCP_PORT);
    for (dst, dst_local) in [(load_balancer, false), (node_port, true)] {
        let verdict = table.trace(&tcp_packet(client_ip, dst, dst_local)).unwrap();
        assert_eq!(
            verdict,
            Verdict::Dnat {
                endpoints: [ep2].into(),
                masquerade: [].into(),
            },
            "{dst}: ep2, the client's address kept"
        );
    }
}

/// The `kube-proxy` table of `family` the node's kernel holds.
#[track_caller]
fn read_back(topology: &Topology, family: IpFamily) -> Table {
    topology
        .node()
        .run(|| kp_nftables::live::read_table(family))
        .unwrap_or_else(|error| panic!("reading the table back: {error}"))
        .unwrap_or_else(|| panic!("the node holds no {family:?} kube-proxy table"))
}

/// A new TCP connection from `src` to `dst`, from outside the node.
fn tcp_packet(src: IpAddr, dst: SocketAddr, dst_local: bool) -> Packet {
    Packet {
        src,
        dst: dst.ip(),
        protocol: "tcp",
        dport: dst.port(),
        src_local: false,
        dst_local,
    }
}

/// DNAT to exactly `endpoints`.
#[track_caller]
fn assert_dnat_to(verdict: &Verdict, endpoints: &[SocketAddr]) {
    match verdict {
        Verdict::Dnat { endpoints: got, .. } => {
            let want: std::collections::BTreeSet<SocketAddr> = endpoints.iter().copied().collect();
            assert_eq!(got, &want, "endpoints");
        }
        other => panic!("expected DNAT to {endpoints:?}, got {other:?}"),
    }
}

/// The affinity set of pod `pod`'s endpoint (port 8080) of `ns1/<service>`
/// port `http`.
fn affinity_set(topology: &Topology, service: &str, pod: &str) -> String {
    let port = ServicePortName {
        service: NamespacedName::new("ns1", service),
        port: Arc::from("http"),
        protocol: Protocol::Tcp,
    };
    let endpoint = SocketAddr::new(pod_ip(topology, pod), POD_TCP_PORT);
    kp_nftables::names::endpoint_names(&port, endpoint)
        .affinity_set
        .to_string()
}

/// The affinity sets that hold `client`.
fn affinity_sets_holding(table: &Table, client: IpAddr) -> Vec<String> {
    let key = client.to_string();
    table
        .dynamic_sets
        .iter()
        .filter(|set| table.maps.get(*set).is_some_and(|e| e.contains_key(&key)))
        .cloned()
        .collect()
}

/// Asserts that the kernel forgets `client`'s affinity entry `timeout`
/// after `idle_since` (its last connection), not much sooner and not much
/// later.
#[track_caller]
fn expect_expiry(topology: &Topology, client: IpAddr, idle_since: Instant, timeout: Duration) {
    // The kernel's clock is jiffies: allow a little on either side.
    let margin = Duration::from_millis(500);
    let held = || {
        let table = read_back(topology, IpFamily::V4);
        !affinity_sets_holding(&table, client).is_empty()
    };
    let early = (timeout - margin).saturating_sub(idle_since.elapsed());
    assert!(
        early.is_zero() || !wait_until(early, || !held()),
        "the affinity entry of {client} expired after {:?}, before its timeout of {timeout:?}",
        idle_since.elapsed()
    );
    let late = (timeout + margin * 2).saturating_sub(idle_since.elapsed());
    assert!(
        wait_until(late, || !held()),
        "the affinity entry of {client} was still held {:?} after its last connection (timeout {timeout:?})",
        idle_since.elapsed()
    );
}

/// A TCP socket of the node that greets each connection like the pods'
/// echo servers (`node <source ip>`) and counts them; closed on drop.
struct HostSocket<'n> {
    port: u16,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    node: &'n Netns,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl<'n> HostSocket<'n> {
    /// Listens on every IPv4 address of `node` at `port`.
    fn listen(node: &'n Netns, port: u16) -> Self {
        let listener = node
            .run(|| TcpListener::bind(("0.0.0.0", port)))
            .unwrap_or_else(|error| panic!("listening on the node's port {port}: {error}"));
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (accepted, stop) = (Arc::clone(&accepted), Arc::clone(&stop));
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(mut stream) = stream else { continue };
                    accepted.fetch_add(1, Ordering::SeqCst);
                    if let Ok(peer) = stream.peer_addr() {
                        let _ = writeln!(stream, "node {}", peer.ip());
                    }
                }
            })
        };
        Self {
            port,
            accepted,
            stop,
            node,
            thread: Some(thread),
        }
    }

    /// Connections accepted so far.
    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for HostSocket<'_> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accepting thread; NodePorts never answer on loopback.
        let port = self.port;
        let _ = self
            .node
            .try_run(|| std::net::TcpStream::connect(("127.0.0.1", port)));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
