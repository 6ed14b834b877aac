//! The network-namespace harness against the real kernel (needs root).
//!
//! Address plan (from `kp_testkit::plan`):
//! - node 192.168.99.2 / fd00:192:168:99::2
//! - client 192.168.99.10 / fd00:192:168:99::10, client2 192.168.99.11
//! - ep1 10.244.1.2, ep2 10.244.1.3 (this node), ep3 10.244.2.2 (another node)
//! - 192.168.99.250 belongs to nobody

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::Command;

use kp_testkit::netns::{
    connect, expect_refused, expect_timeout, hits, remove_leftovers, require_root, udp_roundtrip,
    Netns, TcpSession, Topology,
};
use kp_testkit::plan::{
    CLIENT_IP, CLIENT_IP_V6, NODE_IP, SECOND_CLIENT_IP, UNUSED_NODE_NETWORK_IP,
};

const ECHO_PORT: u16 = 8080;
const SECOND_PORT: u16 = 8081;
const DNS_PORT: u16 = 53;
const CLOSED_PORT: u16 = 9999;

/// ep1 and ep2 on this node, ep3 on another; two clients.
fn cluster() -> Topology {
    require_root();
    Topology::builder()
        .pod("ep1", |p| p.tcp(ECHO_PORT).tcp(SECOND_PORT).udp(DNS_PORT))
        .pod("ep2", |p| p.tcp(ECHO_PORT))
        .remote_pod("ep3", |p| p.tcp(ECHO_PORT))
        .client("client")
        .client("client2")
        .build()
        .unwrap()
}

fn namespaces() -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[track_caller]
fn assert_all_gone(names: &[String]) {
    let left = namespaces();
    let still_there: Vec<&String> = names.iter().filter(|n| left.contains(n)).collect();
    assert!(still_there.is_empty(), "left behind: {still_there:?}");
}

fn root_snapshot() -> BTreeMap<&'static str, String> {
    let show = |args: &[&str]| {
        let out = Command::new("ip").args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    BTreeMap::from([
        ("ip route", show(&["route"])),
        ("ip -6 route", show(&["-6", "route"])),
        ("ip link", show(&["link"])),
        (
            "ip_forward",
            std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").unwrap(),
        ),
    ])
}

#[test]
fn a_topology_leaves_no_namespace_behind() {
    let topology = cluster();
    let names = topology.namespace_names();
    assert_eq!(names.len(), 6, "node, two clients, three pods");
    let listed = namespaces();
    assert!(
        names.iter().all(|n| listed.contains(n)),
        "{names:?} not in {listed:?}"
    );

    drop(topology);

    assert_all_gone(&names);
}

#[test]
fn a_panicking_test_still_removes_its_namespaces() {
    let (names_tx, names_rx) = std::sync::mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let topology = cluster();
        names_tx.send(topology.namespace_names()).unwrap();
        panic!("the test body fails");
    })
    .join();

    assert!(outcome.is_err());
    assert_all_gone(&names_rx.recv().unwrap());
}

#[test]
fn a_client_reaches_pods_through_the_node() {
    let topology = cluster();
    let ep1 = topology.pod("ep1");

    let reply = connect(topology.client(), ep1.addr(ECHO_PORT)).unwrap();
    assert_eq!(reply.backend, "ep1");
    assert_eq!(reply.source, IpAddr::V4(CLIENT_IP));

    let other_port = connect(topology.client(), ep1.addr(SECOND_PORT)).unwrap();
    assert_eq!(other_port.backend, "ep1");

    let remote = connect(topology.client(), topology.pod("ep3").addr(ECHO_PORT)).unwrap();
    assert_eq!(remote.backend, "ep3");
    assert_eq!(topology.pod("ep3").ip().to_string(), "10.244.2.2");
}

#[test]
fn each_client_is_seen_with_its_own_address() {
    let topology = cluster();
    let ep2 = topology.pod("ep2").addr(ECHO_PORT);

    let second = connect(topology.client_named("client2"), ep2).unwrap();

    assert_eq!(second.backend, "ep2");
    assert_eq!(second.source, IpAddr::V4(SECOND_CLIENT_IP));
}

#[test]
fn pods_and_the_node_reach_pods_too() {
    let topology = cluster();
    let (ep1, ep2) = (topology.pod("ep1"), topology.pod("ep2"));

    let pod_to_pod = connect(ep1, ep2.addr(ECHO_PORT)).unwrap();
    assert_eq!(pod_to_pod.source, IpAddr::V4(ep1.ip()));

    let node_to_pod = connect(topology.node(), ep2.addr(ECHO_PORT)).unwrap();
    assert_eq!(node_to_pod.source, IpAddr::V4(NODE_IP));
}

#[test]
fn udp_datagrams_are_answered() {
    let topology = cluster();
    let ep1 = topology.pod("ep1");

    let reply = udp_roundtrip(topology.client(), ep1.addr(DNS_PORT)).unwrap();
    assert_eq!(reply.backend, "ep1");
    assert_eq!(reply.source, IpAddr::V4(CLIENT_IP));

    let closed = udp_roundtrip(topology.client(), ep1.addr(CLOSED_PORT)).unwrap_err();
    assert!(closed.is_refused(), "{closed:?}");
}

#[test]
fn a_closed_port_is_refused_and_an_unowned_address_times_out() {
    let topology = cluster();

    expect_refused(topology.client(), topology.pod("ep1").addr(CLOSED_PORT));
    expect_timeout(
        topology.client(),
        SocketAddr::new(UNUSED_NODE_NETWORK_IP.into(), ECHO_PORT),
    );
}

#[test]
#[should_panic(expected = "expected no answer")]
fn expecting_a_timeout_fails_when_the_pod_answers() {
    let topology = cluster();
    expect_timeout(topology.client(), topology.pod("ep1").addr(ECHO_PORT));
}

#[test]
fn a_client_reaches_pods_over_ipv6() {
    let topology = cluster();
    let ep1 = topology.pod("ep1");

    let reply = connect(topology.client(), ep1.addr_v6(ECHO_PORT)).unwrap();
    assert_eq!(reply.backend, "ep1");
    assert_eq!(reply.source, IpAddr::V6(CLIENT_IP_V6));

    let udp = udp_roundtrip(topology.client(), ep1.addr_v6(DNS_PORT)).unwrap();
    assert_eq!(udp.source, IpAddr::V6(CLIENT_IP_V6));
    expect_refused(topology.client(), ep1.addr_v6(CLOSED_PORT));
}

#[test]
fn hits_count_answers_per_pod() {
    let topology = cluster();

    let counts = hits(topology.client(), topology.pod("ep2").addr(ECHO_PORT), 5);

    assert_eq!(counts, BTreeMap::from([("ep2".to_owned(), 5)]));
}

#[test]
fn a_session_stays_with_its_pod() {
    let topology = cluster();
    let mut session =
        TcpSession::open(topology.client(), topology.pod("ep1").addr(ECHO_PORT)).unwrap();
    assert_eq!(session.backend(), "ep1");

    let first = session.echo("hello").unwrap();
    let second = session.echo("still here").unwrap();

    assert_eq!(
        (first.backend.as_str(), first.text.as_str()),
        ("ep1", "hello")
    );
    assert_eq!(second.text, "still here");
    assert_eq!(second.source, IpAddr::V4(CLIENT_IP));
}

#[test]
fn parallel_topologies_do_not_collide() {
    let replies: Vec<_> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..3)
            .map(|_| {
                scope.spawn(|| {
                    let topology = cluster();
                    connect(topology.client(), topology.pod("ep1").addr(ECHO_PORT)).unwrap()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });

    assert!(replies
        .iter()
        .all(|r| r.backend == "ep1" && r.source == CLIENT_IP));
}

#[test]
fn the_root_namespace_is_untouched() {
    require_root();
    let before = root_snapshot();

    let topology = cluster();
    connect(topology.client(), topology.pod("ep1").addr(ECHO_PORT)).unwrap();
    drop(topology);

    pretty_assertions::assert_eq!(before, root_snapshot());
}

#[test]
fn code_and_programs_run_inside_the_namespace() {
    let topology = cluster();
    let node = topology.node();

    let forwarding = node.run(|| std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward"));
    assert_eq!(forwarding.unwrap().trim(), "1");
    let addresses = node.exec_ok("ip", &["-brief", "address", "show", "cl0"]);
    assert!(addresses.contains("192.168.99.2/32"), "{addresses}");

    let child = node.spawn("sleep", &["600"]);
    let pid = child.id();
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    drop(child);
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
}

#[test]
fn leftovers_of_dead_processes_are_removed() {
    require_root();
    let mut gone = Command::new("true").spawn().unwrap();
    gone.wait().unwrap();
    let stale = format!("kpt-{}-0-stale", gone.id());
    let status = Command::new("ip").args(["netns", "add", &stale]).status();
    assert!(status.unwrap().success());
    let alive = Netns::create("alive").unwrap();

    remove_leftovers();

    let left = namespaces();
    assert!(!left.contains(&stale), "{stale} survived");
    assert!(left.iter().any(|n| n == alive.name()));
}
