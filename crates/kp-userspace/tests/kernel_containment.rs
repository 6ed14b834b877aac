//! Kernel tests of what the userspace mode must not let through, and how it
//! heals: the relay's own ports reached straight from outside the node, the
//! portal rules flushed by someone else, a flood of UDP sources, and UDP
//! sessions to an endpoint the Service no longer uses (issue 28), on
//! iptables-legacy and on iptables-nft where the rules matter.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web, http 80/TCP | ClusterIP 10.96.0.10 only, endpoint ep1 |
//! | ns1/dns, dns 53/UDP | ClusterIP 10.96.0.12 only, endpoint ep2 |
//! | ns1/lb, http 80/TCP + dns 53/UDP | LoadBalancer 203.0.113.9 from 192.168.99.10/32 only, NodePort 30081 (TCP) / 30054 (UDP), endpoint ep2 |
//! | ns1/web6, http 80/TCP + dns 53/UDP | ClusterIP fd00:10:96::10 only, endpoint ep1 |
//! | ns1/np, dns 53/UDP | ClusterIP 10.96.0.20, NodePort 30053, endpoints ep2 (flood) or s1 = ep3 (node-2), s2 = ep2 (issue 28) |
//! | ns1/local, dns 53/UDP | ClusterIP 10.96.0.21, NodePort 30055, externalTrafficPolicy Local, endpoints ep1, ep2 (one of them moved to node-2) |
//!
//! Node 192.168.99.2 / fd00:192:168:99::2 (and 169.254.1.1 towards pods);
//! clients 192.168.99.10 (`client`) and .11 (`client2`, outside the LB's
//! source ranges).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kernel;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kernel::{at, node_at, pod_ip, pod_ip_v6, require, slice, three_pods, Proxy};
use kp_iptables::IptablesFlavor;
use kp_model::IpFamily;
use kp_testkit::builders::{endpoint_slice, service};
use kp_testkit::netns::{connect, udp_roundtrip, wait_until, Netns};
use kp_testkit::plan::{self, NODE_NAME, OTHER_NODE_NAME};
use kp_userspace::RelayOptions;

on_both_flavors!(
    the_relays_ports_answer_nothing_sent_straight_to_them,
    portal_rules_flushed_by_someone_else_are_back_after_the_next_sync,
);

/// Which sockets of the node namespace listen (TCP) or are bound without a
/// peer (UDP): `(protocol, port)` from `/proc/net/{tcp,tcp6,udp,udp6}`.
pub fn listening_ports(node: &Netns) -> BTreeSet<(&'static str, u16)> {
    let mut ports = BTreeSet::new();
    for (file, protocol, state) in [
        ("/proc/net/tcp", "tcp", "0A"),
        ("/proc/net/tcp6", "tcp", "0A"),
        ("/proc/net/udp", "udp", "07"),
        ("/proc/net/udp6", "udp", "07"),
    ] {
        let text = node.exec_ok("cat", &[file]);
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(remote), Some(st)) =
                (fields.get(1), fields.get(2), fields.get(3))
            else {
                continue;
            };
            let unconnected = remote.rsplit(':').next() == Some("0000");
            if *st != state || !unconnected {
                continue;
            }
            let port = local.rsplit(':').next().unwrap();
            ports.insert((protocol, u16::from_str_radix(port, 16).unwrap()));
        }
    }
    ports
}

/// UDP sockets of the node namespace connected to `port` of any peer: the
/// relay's sessions to endpoints serving `port`.
fn sessions_to_port(node: &Netns, port: u16) -> usize {
    let suffix = format!(":{port:04X}");
    ["/proc/net/udp", "/proc/net/udp6"]
        .iter()
        .map(|file| {
            node.exec_ok("cat", &[file])
                .lines()
                .skip(1)
                .filter(|line| {
                    line.split_whitespace()
                        .nth(2)
                        .is_some_and(|remote| remote.ends_with(&suffix))
                })
                .count()
        })
        .sum()
}

fn the_relays_ports_answer_nothing_sent_straight_to_them(flavor: IptablesFlavor) {
    require(flavor);
    let topology = three_pods();
    let before = listening_ports(topology.node());
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    let proxy6 = Proxy::start(&topology, flavor, IpFamily::V6);
    let (ep1, ep2) = (pod_ip(&topology, "ep1"), pod_ip(&topology, "ep2"));
    proxy.apply(
        &[
            service("ns1", "web", |s| {
                s.cluster_ip("10.96.0.10").port("http", 80, "TCP")
            }),
            service("ns1", "dns", |s| {
                s.cluster_ip("10.96.0.12").port("dns", 53, "UDP")
            }),
            service("ns1", "lb", |s| {
                s.service_type("LoadBalancer")
                    .cluster_ip("10.96.0.15")
                    .port("http", 80, "TCP")
                    .node_port(30081)
                    .port("dns", 53, "UDP")
                    .node_port(30054)
                    .lb_ingress_ip("203.0.113.9")
                    .lb_source_range("192.168.99.10/32")
            }),
        ],
        &[
            slice("web", &[ep1], &[]),
            slice("dns", &[ep2], &[]),
            slice("lb", &[ep2], &[]),
        ],
    );
    proxy.sync();
    proxy6.apply(
        &[service("ns1", "web6", |s| {
            s.ip_families(&["IPv6"])
                .cluster_ip("fd00:10:96::10")
                .port("http", 80, "TCP")
                .port("dns", 53, "UDP")
        })],
        &[slice("web6", &[pod_ip_v6(&topology, "ep1")], &[])],
    );
    proxy6.sync();

    // The Services work as the rules say.
    let pod = topology.pod("ep3");
    assert_eq!(connect(pod, at("10.96.0.10", 80)).unwrap().backend, "ep1");
    assert_eq!(
        udp_roundtrip(pod, at("10.96.0.12", 53)).unwrap().backend,
        "ep2"
    );
    assert_eq!(
        connect(pod, at("fd00:10:96::10", 80)).unwrap().backend,
        "ep1"
    );
    assert_eq!(
        udp_roundtrip(pod, at("fd00:10:96::10", 53))
            .unwrap()
            .backend,
        "ep1"
    );
    assert_eq!(
        connect(topology.client(), node_at(30081)).unwrap().backend,
        "ep2"
    );
    assert_eq!(
        udp_roundtrip(topology.client(), node_at(30054))
            .unwrap()
            .backend,
        "ep2"
    );

    // Every port the relay opened, tried straight from outside the node
    // on each of its addresses, by a client inside and one outside the
    // load balancer's source ranges.
    let relay_ports: Vec<(&str, u16)> = listening_ports(topology.node())
        .difference(&before)
        .copied()
        .collect();
    assert!(
        relay_ports.len() >= 6,
        "a listener per service port: {relay_ports:?}"
    );
    let node_ips = [IpAddr::V4(plan::NODE_IP), IpAddr::V6(plan::NODE_IP_V6)];
    let mut answered = Vec::new();
    for client in [topology.client(), topology.client_named("client2")] {
        for &(protocol, port) in &relay_ports {
            for ip in node_ips {
                let addr = SocketAddr::new(ip, port);
                let reply = match protocol {
                    "tcp" => connect(client, addr),
                    _ => udp_roundtrip(client, addr),
                };
                if let Ok(reply) = reply {
                    answered.push(format!(
                        "{protocol} {addr} from {}: {}",
                        client.name(),
                        reply.backend
                    ));
                }
            }
        }
    }
    assert!(
        answered.is_empty(),
        "the relay's ports reach endpoints without a portal rule:\n{}",
        answered.join("\n")
    );
    // From a pod, through its gateway address, likewise.
    let gateway = IpAddr::V4(std::net::Ipv4Addr::new(169, 254, 1, 1));
    for &(protocol, port) in &relay_ports {
        let addr = SocketAddr::new(gateway, port);
        let reply = match protocol {
            "tcp" => connect(pod, addr),
            _ => udp_roundtrip(pod, addr),
        };
        assert!(reply.is_err(), "{protocol} {addr} from ep3: {reply:?}");
    }
}

fn portal_rules_flushed_by_someone_else_are_back_after_the_next_sync(flavor: IptablesFlavor) {
    require(flavor);
    let topology = three_pods();
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    let web = |s: kp_testkit::builders::ServiceBuilder| {
        s.service_type("NodePort")
            .cluster_ip("10.96.0.10")
            .port("http", 80, "TCP")
            .node_port(30080)
    };
    proxy.apply(
        &[service("ns1", "web", web)],
        &[slice("web", &[pod_ip(&topology, "ep1")], &[])],
    );
    proxy.sync();
    assert_eq!(
        connect(topology.pod("ep2"), at("10.96.0.10", 80))
            .unwrap()
            .backend,
        "ep1"
    );

    let iptables = flavor.program(IpFamily::V4, kp_iptables::applier::Tool::Iptables);
    for args in [
        ["-t", "nat", "-F"],
        ["-t", "nat", "-X"],
        ["-t", "filter", "-F"],
        ["-t", "filter", "-X"],
    ] {
        topology.node().exec_ok(&iptables, &args);
    }
    assert!(
        connect(topology.pod("ep2"), at("10.96.0.10", 80)).is_err(),
        "the flush took the portals away"
    );

    // The next sync (at the latest the periodic one, a syncPeriod later)
    // finds nothing changed in the Services, and puts the rules back.
    proxy.sync();
    assert_eq!(
        connect(topology.pod("ep2"), at("10.96.0.10", 80))
            .unwrap()
            .backend,
        "ep1"
    );
    assert_eq!(
        connect(topology.client(), node_at(30080)).unwrap().backend,
        "ep1"
    );
    // A later endpoint change takes effect.
    proxy.apply(&[], &[slice("web", &[pod_ip(&topology, "ep2")], &[])]);
    proxy.sync();
    assert_eq!(
        connect(topology.pod("ep1"), at("10.96.0.10", 80))
            .unwrap()
            .backend,
        "ep2"
    );
    // Each jump is there once, whatever the order of syncs and flushes.
    let saved = topology.node().exec_ok(
        &flavor.program(IpFamily::V4, kp_iptables::applier::Tool::Save),
        &["-t", "nat"],
    );
    for chain in kp_userspace::portal::PORTAL_CHAINS {
        let jumps = saved
            .lines()
            .filter(|line| {
                (line.starts_with("-A PREROUTING") || line.starts_with("-A OUTPUT"))
                    && line.ends_with(&format!("-j {chain}"))
            })
            .count();
        assert_eq!(jumps, 1, "one jump to {chain}:\n{saved}");
    }
}

/// The NodePort UDP Service `ns1/np` with endpoints made by `endpoints`.
fn np_service() -> k8s_openapi::api::core::v1::Service {
    service("ns1", "np", |s| {
        s.service_type("NodePort")
            .cluster_ip("10.96.0.20")
            .port("dns", 53, "UDP")
            .node_port(30053)
    })
}

#[test]
fn a_flood_of_udp_sources_keeps_the_sessions_at_their_bound_and_a_client_still_gets_answers() {
    require(IptablesFlavor::Legacy);
    let topology = three_pods();
    const BOUND: usize = 64;
    const FLOOD: u16 = 2000;
    let options = RelayOptions {
        max_udp_sessions: BOUND,
        // Sessions stay until evicted: the count shows the bound.
        udp_idle_timeout: Duration::from_secs(120),
        ..RelayOptions::default()
    };
    let proxy = Proxy::start_with(&topology, IptablesFlavor::Legacy, IpFamily::V4, options);
    proxy.apply(
        &[np_service()],
        &[endpoint_slice("ns1", "np-1", "np", |s| {
            s.port("dns", i32::from(kernel::POD_UDP_PORT), "UDP")
                .endpoint(pod_ip(&topology, "ep2"), |e| e.ready(true).node(NODE_NAME))
        })],
    );
    proxy.sync();
    let target = node_at(30053);
    assert_eq!(
        udp_roundtrip(topology.client(), target).unwrap().backend,
        "ep2"
    );

    // 2,000 sources (distinct ports of client2), one datagram each.
    topology.client_named("client2").run(|| {
        for port in 0..FLOOD {
            let socket = UdpSocket::bind(("0.0.0.0", 20_000 + port)).unwrap();
            socket.send_to(b"flood", target).unwrap();
        }
    });
    // The relay has read them all once a datagram sent after them is
    // answered (one receive loop, in order). The flood may fill the
    // listener's receive queue and the kernel drop a datagram: a client
    // asks again, as resolvers do.
    let answered = wait_until(Duration::from_secs(10), || {
        udp_roundtrip(topology.client(), target).is_ok_and(|reply| reply.backend == "ep2")
    });
    assert!(answered, "a legitimate client is answered after the flood");
    let sessions = sessions_to_port(topology.node(), kernel::POD_UDP_PORT);
    assert_eq!(
        sessions, BOUND,
        "the relay's sockets to the endpoint stay at the bound"
    );
}

/// A client sending a datagram to `target` every 0.3 s from one fixed
/// source port, in `from`, and noting who answered.
struct SteadyClient {
    answers: Arc<Mutex<Vec<(Instant, String)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SteadyClient {
    fn start(from: &Netns, source_port: u16, target: SocketAddr) -> Self {
        let answers = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let socket = from.run(|| {
            let socket = UdpSocket::bind(("0.0.0.0", source_port)).unwrap();
            socket.connect(target).unwrap();
            socket
        });
        socket
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let thread = {
            let (answers, stop) = (Arc::clone(&answers), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut buffer = [0u8; 512];
                while !stop.load(Ordering::Relaxed) {
                    let sent = Instant::now();
                    // An ICMP error for an earlier datagram may surface on
                    // either call; the client goes on as a real one would.
                    let _ = socket.send(b"steady");
                    while sent.elapsed() < Duration::from_millis(300) {
                        if let Ok(len) = socket.recv(&mut buffer) {
                            let text = String::from_utf8_lossy(&buffer[..len]);
                            let backend = text.split(' ').next().unwrap_or_default().to_owned();
                            answers.lock().unwrap().push((Instant::now(), backend));
                        }
                    }
                }
            })
        };
        Self {
            answers,
            stop,
            thread: Some(thread),
        }
    }

    /// Who answered since `since`.
    fn answered_since(&self, since: Instant) -> Vec<String> {
        self.answers
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, _)| *at >= since)
            .map(|(_, backend)| backend.clone())
            .collect()
    }
}

impl Drop for SteadyClient {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Waits until each client has been answered by `backend` only, for three
/// answers in a row, since `since`.
#[track_caller]
fn wait_for_only(clients: &[(&str, &SteadyClient)], backend: &str, since: Instant, what: &str) {
    let moved = wait_until(Duration::from_secs(5), || {
        clients.iter().all(|(_, client)| {
            let answers = client.answered_since(since);
            answers.len() >= 3 && answers.iter().rev().take(3).all(|b| b == backend)
        })
    });
    let seen: Vec<String> = clients
        .iter()
        .map(|(name, client)| format!("{name}: {:?}", client.answered_since(since)))
        .collect();
    assert!(
        moved,
        "{what}: every client should reach {backend}:\n{}",
        seen.join("\n")
    );
}

#[test]
fn udp_sessions_to_an_endpoint_no_longer_used_end_in_that_sync() {
    require(IptablesFlavor::Nft);
    let topology = three_pods();
    let options = RelayOptions {
        // A session outlives the client's 0.3 s between datagrams: only
        // closing it moves the client.
        udp_idle_timeout: Duration::from_secs(30),
        ..RelayOptions::default()
    };
    let proxy = Proxy::start_with(&topology, IptablesFlavor::Nft, IpFamily::V4, options);
    let (s1, s2) = (pod_ip(&topology, "ep3"), pod_ip(&topology, "ep2"));
    let slice_with = |build: &dyn Fn(
        kp_testkit::builders::EndpointSliceBuilder,
    ) -> kp_testkit::builders::EndpointSliceBuilder| {
        endpoint_slice("ns1", "np-1", "np", |s| {
            build(s.port("dns", i32::from(kernel::POD_UDP_PORT), "UDP"))
        })
    };
    proxy.apply(
        &[np_service()],
        &[slice_with(&|s| {
            s.endpoint(s1, |e| e.ready(true).node(OTHER_NODE_NAME))
        })],
    );
    proxy.sync();

    let cluster_ip = at("10.96.0.20", 53);
    let clients = [
        (
            "pod ep1",
            SteadyClient::start(topology.pod("ep1"), 40_053, cluster_ip),
        ),
        (
            "node",
            SteadyClient::start(topology.node(), 40_053, cluster_ip),
        ),
        (
            "client",
            SteadyClient::start(topology.client(), 40_053, node_at(30053)),
        ),
    ];
    let clients: Vec<(&str, &SteadyClient)> = clients
        .iter()
        .map(|(name, client)| (*name, client))
        .collect();
    wait_for_only(&clients, "ep3", Instant::now(), "one endpoint s1");

    // s2 joins: the clients' sessions stay with s1.
    proxy.apply(
        &[],
        &[slice_with(&|s| {
            s.endpoint(s1, |e| e.ready(true).node(OTHER_NODE_NAME))
                .endpoint(s2, |e| e.ready(true).node(NODE_NAME))
        })],
    );
    proxy.sync();

    // s1 terminates, still serving, while s2 is ready: s1 is no longer
    // used, and its sessions end in this sync.
    proxy.apply(
        &[],
        &[slice_with(&|s| {
            s.endpoint(s1, |e| {
                e.ready(false)
                    .serving(true)
                    .terminating(true)
                    .node(OTHER_NODE_NAME)
            })
            .endpoint(s2, |e| e.ready(true).node(NODE_NAME))
        })],
    );
    proxy.sync();
    let synced = Instant::now();
    wait_for_only(&clients, "ep2", synced, "s1 terminating, s2 ready");

    // s1 leaves the slice: nothing changes for the clients.
    proxy.apply(
        &[],
        &[slice_with(&|s| {
            s.endpoint(s2, |e| e.ready(true).node(NODE_NAME))
        })],
    );
    proxy.sync();
    let synced = Instant::now();
    wait_for_only(&clients, "ep2", synced, "s1 removed");
}

#[test]
fn udp_sessions_to_an_endpoint_that_leaves_this_node_end_under_a_local_policy() {
    require(IptablesFlavor::Nft);
    let topology = three_pods();
    let options = RelayOptions {
        udp_idle_timeout: Duration::from_secs(30),
        ..RelayOptions::default()
    };
    let proxy = Proxy::start_with(&topology, IptablesFlavor::Nft, IpFamily::V4, options);
    let local = service("ns1", "local", |s| {
        s.service_type("NodePort")
            .cluster_ip("10.96.0.21")
            .port("dns", 53, "UDP")
            .node_port(30055)
            .external_traffic_policy_local()
    });
    let pods = [
        ("ep1", pod_ip(&topology, "ep1")),
        ("ep2", pod_ip(&topology, "ep2")),
    ];
    let slice_on = |nodes: [&str; 2]| {
        endpoint_slice("ns1", "local-1", "local", |s| {
            let mut s = s.port("dns", i32::from(kernel::POD_UDP_PORT), "UDP");
            for ((_, ip), node) in pods.iter().zip(nodes) {
                s = s.endpoint(ip, |e| e.ready(true).node(node));
            }
            s
        })
    };
    proxy.apply(&[local], &[slice_on([NODE_NAME, NODE_NAME])]);
    proxy.sync();

    let client = SteadyClient::start(topology.client(), 40_055, node_at(30055));
    let clients = [("client", &client)];
    let started = Instant::now();
    let first = wait_until(Duration::from_secs(5), || {
        !client.answered_since(started).is_empty()
    });
    assert!(first, "the client is answered through the NodePort");
    let kept = client.answered_since(started)[0].clone();
    wait_for_only(&clients, &kept, started, "one session, one endpoint");

    // The endpoint it talks to is now reported on node-2: under
    // externalTrafficPolicy Local it no longer serves this node's NodePort.
    let nodes = if kept == "ep1" {
        [OTHER_NODE_NAME, NODE_NAME]
    } else {
        [NODE_NAME, OTHER_NODE_NAME]
    };
    let other = if kept == "ep1" { "ep2" } else { "ep1" };
    proxy.apply(&[], &[slice_on(nodes)]);
    proxy.sync();
    wait_for_only(
        &clients,
        other,
        Instant::now(),
        "its endpoint left this node",
    );
}
