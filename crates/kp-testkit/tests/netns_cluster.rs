//! The multi-node harness against the real kernel (needs root): three nodes
//! on a fabric, pods reaching pods of other nodes over host-gw routes, a
//! client reaching every node, a server on the fabric address reached by
//! every node, and nothing left behind.
//!
//! Address plan (from `kp_testkit::plan`):
//! - fabric 192.168.99.1; node-a .2, node-b .3, node-c .4; client .10
//! - a1 10.244.1.2, pa 10.244.1.3 (node-a); b1 10.244.2.2 (node-b);
//!   c1 10.244.3.2 (node-c)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;

use kp_testkit::netns::{connect, expect_refused, require_root, Cluster};
use kp_testkit::plan::{CLIENT_IP, FABRIC_IP};

const ECHO_PORT: u16 = 8080;
const CLOSED_PORT: u16 = 9999;

fn cluster() -> Cluster {
    require_root();
    Cluster::builder()
        .node("node-a", |n| {
            n.pod("a1", |p| p.tcp(ECHO_PORT)).pod("pa", |p| p)
        })
        .node("node-b", |n| n.pod("b1", |p| p.tcp(ECHO_PORT)))
        .node("node-c", |n| n.pod("c1", |p| p.tcp(ECHO_PORT)))
        .client("client")
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

#[test]
fn nodes_pods_and_clients_get_the_planned_addresses() {
    let cluster = cluster();
    let ips: Vec<String> = cluster.nodes().iter().map(|n| n.ip().to_string()).collect();
    assert_eq!(ips, ["192.168.99.2", "192.168.99.3", "192.168.99.4"]);
    assert_eq!(
        cluster.node("node-c").pod_cidr().to_string(),
        "10.244.3.0/24"
    );
    assert_eq!(cluster.pod("pa").ip().to_string(), "10.244.1.3");
    assert_eq!(cluster.pod("c1").ip().to_string(), "10.244.3.2");
    assert_eq!(cluster.client().ip(), CLIENT_IP);
    let addresses = cluster
        .node("node-b")
        .netns()
        .ip(&["-4", "-brief", "address", "show", "eth0"]);
    assert!(addresses.unwrap().contains("192.168.99.3/24"));
}

#[test]
fn a_pod_reaches_pods_of_every_node_with_its_own_address() {
    let cluster = cluster();
    let pa = cluster.pod("pa");
    for pod in ["a1", "b1", "c1"] {
        let reply = connect(pa, cluster.pod(pod).addr(ECHO_PORT)).unwrap();
        assert_eq!(reply.backend, pod);
        assert_eq!(reply.source, pa.ip(), "host-gw routing does not NAT");
    }
    // And back: a pod of node-c reaches node-a's pod.
    let reply = connect(cluster.pod("c1"), cluster.pod("a1").addr(ECHO_PORT)).unwrap();
    assert_eq!(reply.backend, "a1");
}

#[test]
fn the_client_reaches_every_node_and_nodes_reach_the_fabric() {
    let cluster = cluster();
    for node in cluster.nodes() {
        // The node's own stack answers with a reset: it is on-link.
        expect_refused(cluster.client(), node.addr(CLOSED_PORT));
    }
    // A server on the fabric address, as the test API server listens.
    let listener = cluster
        .fabric()
        .run(|| TcpListener::bind(SocketAddr::from((FABRIC_IP, 0))))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    for node in cluster.nodes() {
        node.run(|| TcpStream::connect(addr).unwrap().write_all(b"hi").unwrap());
        let (_, peer) = listener.accept().unwrap();
        assert_eq!(peer.ip(), node.ip(), "{} reaches the fabric", node.name());
    }
}

#[test]
fn external_traffic_goes_to_the_node_the_client_is_told() {
    let cluster = cluster();
    let client = cluster.client();
    let route = || {
        client
            .netns()
            .ip(&["-4", "route", "show", "203.0.113.0/24"])
            .unwrap()
    };
    assert!(route().contains("via 192.168.99.2"), "{}", route());
    cluster
        .route_external_via(client, cluster.node("node-c"))
        .unwrap();
    assert!(route().contains("via 192.168.99.4"), "{}", route());
}

#[test]
fn every_namespace_is_removed_on_drop_even_after_a_panic() {
    let names = std::panic::catch_unwind(|| {
        let cluster = cluster();
        let names = cluster.namespace_names();
        assert_eq!(names.len(), 1 + 3 + 4 + 1, "fabric, nodes, pods, client");
        assert!(names.iter().all(|name| namespaces().contains(name)));
        std::panic::panic_any(names)
    })
    .unwrap_err()
    .downcast::<Vec<String>>()
    .unwrap();
    let left = namespaces();
    for name in names.iter() {
        assert!(!left.contains(name), "{name} is left after the panic");
    }
}
