//! The `kube-proxy` binary in userspace mode seen from outside the node:
//! started in a node namespace with `--manifests`, every TCP and UDP port
//! the process holds open is tried from client namespaces on every address
//! of the node, and only what the rules allow answers: the NodePorts (which
//! the portal rules redirect; the process does not listen on them) and the
//! health and metrics servers. The relay's own ports, one per service port,
//! reach no endpoint.
//!
//! Address plan: kp-testkit's (pods ep1 10.244.1.2, ep2 10.244.1.3; node
//! 192.168.99.2, fd00:192:168:99::2, 169.254.1.1 towards the pods; client
//! 192.168.99.10, client2 192.168.99.11).
//!
//! | Service | addresses | endpoints |
//! |---|---|---|
//! | demo/internal, http 80/TCP, dns 53/UDP | ClusterIP 10.96.0.41 only | ep1 |
//! | demo/lb, http 80/TCP, dns 53/UDP | LoadBalancer 203.0.113.9 from 192.168.99.10/32 only, NodePorts 30081/TCP, 30054/UDP | ep2 |

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use kp_testkit::netns::{
    connect, require_root, require_tool, udp_roundtrip, wait_until, Netns, Topology,
};
use kp_testkit::plan;

const MANIFESTS: &str = "apiVersion: v1
kind: Node
metadata: {name: node-1}
status:
  addresses:
    - {type: InternalIP, address: 192.168.99.2}
---
apiVersion: v1
kind: Service
metadata: {namespace: demo, name: internal}
spec:
  clusterIP: 10.96.0.41
  clusterIPs: [10.96.0.41]
  ports:
    - {name: http, port: 80, targetPort: 8080, protocol: TCP}
    - {name: dns, port: 53, targetPort: 5353, protocol: UDP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: demo
  name: internal-1
  labels: {kubernetes.io/service-name: internal}
addressType: IPv4
ports:
  - {name: http, port: 8080, protocol: TCP}
  - {name: dns, port: 5353, protocol: UDP}
endpoints:
  - addresses: [10.244.1.2]
    conditions: {ready: true}
    nodeName: node-1
---
apiVersion: v1
kind: Service
metadata: {namespace: demo, name: lb}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.42
  clusterIPs: [10.96.0.42]
  loadBalancerSourceRanges: [192.168.99.10/32]
  ports:
    - {name: http, port: 80, targetPort: 8080, nodePort: 30081, protocol: TCP}
    - {name: dns, port: 53, targetPort: 5353, nodePort: 30054, protocol: UDP}
status:
  loadBalancer:
    ingress:
      - {ip: 203.0.113.9}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: demo
  name: lb-1
  labels: {kubernetes.io/service-name: lb}
addressType: IPv4
ports:
  - {name: http, port: 8080, protocol: TCP}
  - {name: dns, port: 5353, protocol: UDP}
endpoints:
  - addresses: [10.244.1.3]
    conditions: {ready: true}
    nodeName: node-1
";

/// The healthz server's port.
const HEALTHZ_PORT: u16 = 10256;
/// The metrics server's port.
const METRICS_PORT: u16 = 10249;

/// The socket inodes `pid` holds (`/proc/PID/fd/* -> socket:[INODE]`).
fn socket_inodes(pid: u32) -> BTreeSet<String> {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|entry| fs::read_link(entry.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            target
                .strip_prefix("socket:[")
                .and_then(|rest| rest.strip_suffix(']'))
                .map(str::to_owned)
        })
        .collect()
}

/// The TCP ports `pid` listens on and the UDP ports it has bound without
/// a peer, in the namespace `node`, from `/proc/net/{tcp,tcp6,udp,udp6}`
/// matched to the process's sockets by inode.
fn ports_of(node: &Netns, pid: u32) -> BTreeSet<(&'static str, u16)> {
    let inodes = socket_inodes(pid);
    let mut ports = BTreeSet::new();
    for (file, protocol, listening) in [
        ("/proc/net/tcp", "tcp", "0A"),
        ("/proc/net/tcp6", "tcp", "0A"),
        ("/proc/net/udp", "udp", "07"),
        ("/proc/net/udp6", "udp", "07"),
    ] {
        for line in node.exec_ok("cat", &[file]).lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 10 || !inodes.contains(fields[9]) || fields[3] != listening {
                continue;
            }
            if !fields[2].ends_with(":0000") {
                continue; // a connected socket: a session, not a listener
            }
            let port = fields[1].rsplit(':').next().unwrap();
            ports.insert((protocol, u16::from_str_radix(port, 16).unwrap()));
        }
    }
    ports
}

#[test]
fn only_node_ports_and_the_health_and_metrics_ports_answer_from_outside_the_node() {
    require_root();
    require_tool("iptables");
    let cluster = Topology::builder()
        .pod("ep1", |p| p.tcp(8080).udp(5353))
        .pod("ep2", |p| p.tcp(8080).udp(5353))
        .client("client")
        .client("client2")
        .build()
        .unwrap();
    cluster.add_node_default_route().unwrap();
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("objects.yaml"), MANIFESTS).unwrap();
    let node = cluster.node();
    let proxy = node.spawn(
        env!("CARGO_BIN_EXE_kube-proxy"),
        &[
            "--proxy-mode",
            "userspace",
            "--manifests",
            dir.path().to_str().unwrap(),
            "--hostname-override",
            "node-1",
            "--cluster-cidr",
            "10.244.0.0/16",
        ],
    );
    let (pod, client, outsider) = (
        cluster.pod("ep2"),
        cluster.client(),
        cluster.client_named("client2"),
    );
    let node_port = SocketAddr::new(IpAddr::V4(plan::NODE_IP), 30081);
    let up = wait_until(Duration::from_secs(20), || {
        connect(pod, "10.96.0.41:80".parse().unwrap()).is_ok() && connect(client, node_port).is_ok()
    });
    assert!(
        up,
        "the proxy serves the ClusterIP and the NodePort within 20 s"
    );

    // What the rules allow answers.
    assert_eq!(
        udp_roundtrip(pod, "10.96.0.41:53".parse().unwrap())
            .unwrap()
            .backend,
        "ep1"
    );
    assert_eq!(connect(outsider, node_port).unwrap().backend, "ep2");
    assert_eq!(
        udp_roundtrip(outsider, SocketAddr::new(IpAddr::V4(plan::NODE_IP), 30054))
            .unwrap()
            .backend,
        "ep2"
    );
    assert_eq!(
        connect(client, "203.0.113.9:80".parse().unwrap())
            .unwrap()
            .backend,
        "ep2"
    );
    assert!(
        connect(outsider, "203.0.113.9:80".parse().unwrap()).is_err(),
        "client2 is outside loadBalancerSourceRanges"
    );

    // Every port of the process, from outside, on every node address (the
    // pods' gateway address too: a neighbour can send to any address of
    // the node).
    for outside in [client, outsider] {
        outside
            .netns()
            .ip(&["route", "replace", "169.254.1.1/32", "via", "192.168.99.2"])
            .unwrap();
    }
    let ports = ports_of(node, proxy.id());
    let relay_ports: Vec<(&str, u16)> = ports
        .iter()
        .copied()
        .filter(|(_, port)| ![HEALTHZ_PORT, METRICS_PORT].contains(port))
        .collect();
    assert!(
        relay_ports.len() >= 4,
        "a relay listener per service port: {ports:?}"
    );
    let addresses = [
        IpAddr::V4(plan::NODE_IP),
        IpAddr::V6(plan::NODE_IP_V6),
        IpAddr::V4(Ipv4Addr::new(169, 254, 1, 1)),
    ];
    let mut answered: BTreeMap<String, String> = BTreeMap::new();
    for outside in [client, outsider] {
        for &(protocol, port) in &relay_ports {
            for ip in addresses {
                let addr = SocketAddr::new(ip, port);
                let reply = if protocol == "tcp" {
                    connect(outside, addr)
                } else {
                    udp_roundtrip(outside, addr)
                };
                if let Ok(reply) = reply {
                    answered.insert(
                        format!("{protocol} {addr} from {}", outside.name()),
                        reply.backend,
                    );
                }
            }
        }
    }
    assert!(
        answered.is_empty(),
        "ports of the proxy that reach endpoints from outside the node: {answered:#?}"
    );

    // The health server answers from outside; the metrics server listens
    // on the node's loopback only (upstream's default 127.0.0.1:10249).
    let health = client
        .run(|| kp_testkit::http::get((plan::NODE_IP, HEALTHZ_PORT), "/healthz"))
        .unwrap();
    assert_eq!(health.code, 200, "{health:?}");
    assert!(
        ports.contains(&("tcp", METRICS_PORT)),
        "the metrics server is one of the ports: {ports:?}"
    );
    drop(proxy);
}
