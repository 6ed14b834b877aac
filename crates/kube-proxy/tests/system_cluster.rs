//! Three nodes, each running the `kube-proxy` binary against the one test
//! API server with its own `--hostname-override`, pods spread across them,
//! checked with real packets: a ClusterIP crosses the fabric to an endpoint
//! on another node; `externalTrafficPolicy: Local` answers only on nodes
//! with a local endpoint, keeps the client's address, and each node's
//! health-check node port counts its own endpoints; topology hints and
//! `trafficDistribution: PreferClose` keep traffic in the zone; a node
//! drained of its endpoints converges. The same story runs in iptables mode
//! and in nftables mode with each table layout.
//!
//! Address plan (kp-testkit's `plan`, one pod range per node):
//!
//! | node   | zone   | address      | pods |
//! |--------|--------|--------------|------|
//! | node-a | zone-a | 192.168.99.2 | a1 10.244.1.2, a2 10.244.1.3, pa 10.244.1.4 |
//! | node-b | zone-b | 192.168.99.3 | b1 10.244.2.2, b2 10.244.2.3, pb 10.244.2.4 |
//! | node-c | zone-a | 192.168.99.4 | c1 10.244.3.2, pc 10.244.3.3 |
//!
//! The test API server listens on the fabric, 192.168.99.1; the client is
//! 192.168.99.10. `pa`, `pb`, `pc` only send; the others answer on 8080.
//!
//! Services (all port 80 → 8080, namespace `demo`):
//! - `web` 10.96.0.41, ClusterIP: a1, b1, c1;
//! - `local` 10.96.0.42, LoadBalancer 203.0.113.10, NodePort 30080,
//!   `externalTrafficPolicy: Local`, health-check node port 32000: a1, a2,
//!   c1;
//! - `hinted` 10.96.0.43, `topology-mode: Auto`, and `close` 10.96.0.44,
//!   `trafficDistribution: PreferClose`: a1, b1, c1, each hinted for its
//!   own zone as the EndpointSlice controller writes it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_testkit::apiserver::TestApiServer;
use kp_testkit::builders::{endpoint_slice, node, service};
use kp_testkit::http::{self, HttpReply};
use kp_testkit::netns::{
    connect, expect_timeout, hits, require_root, wait_until, Cluster, ClusterNode, Host, Netns,
    NsChild, Reply,
};
use kp_testkit::plan::FABRIC_IP;

const WEB: &str = "10.96.0.41:80";
const LOCAL: &str = "10.96.0.42:80";
const LB: &str = "203.0.113.10:80";
const HINTED: &str = "10.96.0.43:80";
const CLOSE: &str = "10.96.0.44:80";
const NODE_PORT: u16 = 30080;
const HEALTH_CHECK_NODE_PORT: u16 = 32000;
const ECHO_PORT: u16 = 8080;

/// How long a proxy may take to start and program its first rules.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long every proxy may take to follow a change of the API objects.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(15);

#[test]
fn three_iptables_nodes_share_one_api_server() {
    the_cluster_story(&["--proxy-mode", "iptables"]);
}

#[test]
fn three_nftables_nodes_share_one_api_server() {
    the_cluster_story(&["--proxy-mode", "nftables", "--nftables-layout", "chains"]);
}

#[test]
fn three_nftables_nodes_in_the_data_layout_share_one_api_server() {
    the_cluster_story(&["--proxy-mode", "nftables", "--nftables-layout", "data"]);
}

/// A proxy on one node, whose log is shown when the test fails.
struct Proxy {
    node: String,
    log: PathBuf,
    _child: NsChild,
}

/// Which pods answered and the source addresses they saw.
type Answers = BTreeMap<String, BTreeSet<IpAddr>>;

/// The story, each proxy started with `mode_flags` (its mode and layout).
fn the_cluster_story(mode_flags: &[&str]) {
    require_root();
    let cluster = Cluster::builder()
        .node("node-a", |n| {
            n.pod("a1", |p| p.tcp(ECHO_PORT))
                .pod("a2", |p| p.tcp(ECHO_PORT))
                .pod("pa", |p| p)
        })
        .node("node-b", |n| {
            n.pod("b1", |p| p.tcp(ECHO_PORT))
                .pod("b2", |p| p.tcp(ECHO_PORT))
                .pod("pb", |p| p)
        })
        .node("node-c", |n| {
            n.pod("c1", |p| p.tcp(ECHO_PORT)).pod("pc", |p| p)
        })
        .client("client")
        .build()
        .unwrap();
    // The API server's sockets live in the fabric namespace.
    cluster.fabric().block_on(|| story(&cluster, mode_flags));
}

async fn story(cluster: &Cluster, mode_flags: &[&str]) {
    let server = TestApiServer::start_on(SocketAddr::from((FABRIC_IP, 0)))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    for (name, zone) in [
        ("node-a", "zone-a"),
        ("node-b", "zone-b"),
        ("node-c", "zone-a"),
    ] {
        let node_ns = cluster.node(name);
        server.create(node(name, |n| {
            n.zone(zone)
                .internal_ip(node_ns.ip())
                .pod_cidr(node_ns.pod_cidr())
        }));
    }
    server.create(web_service());
    server.create(slice("web", &["a1", "b1", "c1"], cluster));
    server.create(local_service());
    server.create(slice("local", &["a1", "a2", "c1"], cluster));
    server.create(zonal_service("hinted", "10.96.0.43", |s| {
        s.annotation("service.kubernetes.io/topology-mode", "Auto")
    }));
    server.create(hinted_slice("hinted", cluster));
    server.create(zonal_service("close", "10.96.0.44", |s| {
        s.traffic_distribution("PreferClose")
    }));
    server.create(hinted_slice("close", cluster));

    let _proxies: Vec<Proxy> = cluster
        .nodes()
        .iter()
        .map(|node| start_proxy(node, mode_flags, &kubeconfig, dir.path()))
        .collect();
    let senders = [cluster.pod("pa"), cluster.pod("pb"), cluster.pod("pc")];
    for node in cluster.nodes() {
        let synced = wait_until(START_TIMEOUT, || {
            health_check(cluster.client(), node).is_ok_and(|reply| reply.code != 0)
        });
        assert!(
            synced,
            "{}'s proxy serves the health-check node port",
            node.name()
        );
    }
    for sender in senders {
        let up = wait_until(START_TIMEOUT, || connect(sender, addr(WEB)).is_ok());
        assert!(up, "the ClusterIP answers {}", sender.name());
    }

    cluster_ip_crosses_nodes(cluster, &senders);
    local_traffic_stays_on_its_node(cluster);
    zones_keep_their_traffic(&senders);
    a_drained_node_converges(cluster, &server, &senders);
    server.assert_no_protocol_errors();
}

/// A ClusterIP from a pod on node-a reaches the endpoint on node-c, with the
/// pod's own address (pods are not masqueraded inside the cluster CIDR), and
/// spreads over the endpoints of every node, from every node.
fn cluster_ip_crosses_nodes(cluster: &Cluster, senders: &[&Host]) {
    let pa = cluster.pod("pa");
    let reply = wait_for_backend(pa, addr(WEB), "c1");
    assert_eq!(
        reply.source,
        pa.ip(),
        "c1 on node-c sees pa's address: the packet crossed the fabric unmasqueraded"
    );
    for sender in senders {
        let answers = answers_until_all(sender, addr(WEB), &["a1", "b1", "c1"]);
        assert_eq!(
            pods(&answers),
            set(&["a1", "b1", "c1"]),
            "from {}",
            sender.name()
        );
        assert_eq!(
            answers.values().flatten().collect::<BTreeSet<_>>(),
            BTreeSet::from([&IpAddr::V4(sender.ip())]),
            "every endpoint sees {}'s own address",
            sender.name()
        );
    }
}

/// `externalTrafficPolicy: Local`: the NodePort and the LoadBalancer IP
/// answer only on nodes with a local endpoint, only with those endpoints,
/// and the endpoints see the client's own address; elsewhere the packets
/// are dropped, as upstream does. Each node's health-check node port counts
/// its own endpoints.
fn local_traffic_stays_on_its_node(cluster: &Cluster) {
    let client = cluster.client();
    let expected: [(&str, &[&str]); 3] = [
        ("node-a", &["a1", "a2"]),
        ("node-b", &[]),
        ("node-c", &["c1"]),
    ];
    for (name, local) in expected {
        let node = cluster.node(name);
        assert_health_check(client, node, local.len());
        assert_local_only(client, node.addr(NODE_PORT), local, name);
        cluster.route_external_via(client, node).unwrap();
        assert_local_only(client, addr(LB), local, name);
    }
    // The ClusterIP of the same Service still uses every endpoint.
    let pb = cluster.pod("pb");
    let answers = answers_until_all(pb, addr(LOCAL), &["a1", "a2", "c1"]);
    assert_eq!(pods(&answers), set(&["a1", "a2", "c1"]));
}

/// Zone hints, from `topology-mode: Auto` or `trafficDistribution:
/// PreferClose`, keep a pod's connections in its node's zone: zone-a
/// (node-a, node-c) reaches a1 and c1, never b1; zone-b reaches only b1.
fn zones_keep_their_traffic(senders: &[&Host]) {
    for service in [HINTED, CLOSE] {
        for sender in senders {
            let zone_pods: &[&str] = if sender.name() == "pb" {
                &["b1"]
            } else {
                &["a1", "c1"]
            };
            // The zone is a label of the Node object, which each proxy
            // may learn after its first sync.
            let in_zone = wait_until(CONVERGE_TIMEOUT, || {
                pods(&answers_until_all(sender, addr(service), zone_pods)) == set(zone_pods)
            });
            assert!(
                in_zone,
                "{service} from {} stays in its zone",
                sender.name()
            );
            let mut seen = pods(&answers_until_all(sender, addr(service), zone_pods));
            // More connections, so an endpoint of another zone would show.
            seen.extend(hits(sender, addr(service), 30).into_keys());
            assert_eq!(
                seen,
                set(zone_pods),
                "{service} from {} stays in its zone",
                sender.name()
            );
        }
    }
}

/// node-c is drained: c1 leaves `web` and `local`, and b2 on node-b takes
/// its place. node-c's NodePort stops answering and its health check says
/// 503 with no endpoint, node-b's starts answering with b2, and the
/// ClusterIP from every node reaches the remaining endpoints only.
fn a_drained_node_converges(cluster: &Cluster, server: &TestApiServer, senders: &[&Host]) {
    server.update(slice("web", &["a1", "b1", "b2"], cluster));
    server.update(slice("local", &["a1", "a2", "b2"], cluster));
    let client = cluster.client();
    let node_b = cluster.node("node-b");
    let node_c = cluster.node("node-c");
    let drained = wait_until(CONVERGE_TIMEOUT, || {
        health_check(client, node_c).is_ok_and(|reply| reply.code == 503)
    });
    assert!(drained, "node-c's health check reports the drain");
    assert_health_check(client, node_c, 0);
    let moved = wait_until(CONVERGE_TIMEOUT, || {
        health_check(client, node_b).is_ok_and(|reply| reply.code == 200)
    });
    assert!(moved, "node-b's health check reports b2");
    assert_health_check(client, node_b, 1);
    assert_health_check(client, cluster.node("node-a"), 2);

    assert_local_only(client, node_c.addr(NODE_PORT), &[], "node-c");
    assert_local_only(client, node_b.addr(NODE_PORT), &["b2"], "node-b");
    cluster.route_external_via(client, node_c).unwrap();
    assert_local_only(client, addr(LB), &[], "node-c");

    for sender in senders {
        let remaining = set(&["a1", "b1", "b2"]);
        let converged = wait_until(CONVERGE_TIMEOUT, || {
            pods(&answers_until_all(sender, addr(WEB), &["a1", "b1", "b2"])) == remaining
        });
        assert!(
            converged,
            "the ClusterIP from {} leaves node-c's endpoint",
            sender.name()
        );
        let mut seen = pods(&answers_until_all(sender, addr(WEB), &["a1", "b1", "b2"]));
        seen.extend(hits(sender, addr(WEB), 30).into_keys());
        assert_eq!(seen, remaining, "from {}", sender.name());
    }
}

fn start_proxy(node: &ClusterNode, mode_flags: &[&str], kubeconfig: &Path, dir: &Path) -> Proxy {
    let log = dir.join(format!("{}.log", node.name()));
    let child = NsChild::spawn(
        node.command(env!("CARGO_BIN_EXE_kube-proxy"))
            .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
            .args(["--hostname-override", node.name()])
            .args(mode_flags)
            .args(["--cluster-cidr", "10.244.0.0/16"])
            .args(["--iptables-min-sync-period", "0s"])
            .env_remove("KUBECONFIG")
            .stdin(std::process::Stdio::null())
            .stderr(File::create(&log).unwrap()),
    )
    .unwrap();
    Proxy {
        node: node.name().to_owned(),
        log,
        _child: child,
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(40)..].join("\n");
            eprintln!("--- last lines of {}'s proxy log ---\n{tail}", self.node);
        }
    }
}

fn web_service() -> Service {
    service("demo", "web", |s| {
        s.cluster_ip("10.96.0.41")
            .port("http", 80, "TCP")
            .target_port(i32::from(ECHO_PORT))
    })
}

fn local_service() -> Service {
    service("demo", "local", |s| {
        s.service_type("LoadBalancer")
            .cluster_ip("10.96.0.42")
            .port("http", 80, "TCP")
            .target_port(i32::from(ECHO_PORT))
            .node_port(i32::from(NODE_PORT))
            .external_traffic_policy_local()
            .health_check_node_port(i32::from(HEALTH_CHECK_NODE_PORT))
            .lb_ingress_ip("203.0.113.10")
    })
}

fn zonal_service(
    name: &str,
    ip: &str,
    topology: impl FnOnce(kp_testkit::ServiceBuilder) -> kp_testkit::ServiceBuilder,
) -> Service {
    service("demo", name, |s| {
        topology(
            s.cluster_ip(ip)
                .port("http", 80, "TCP")
                .target_port(i32::from(ECHO_PORT)),
        )
    })
}

/// The zone of the node a pod runs on.
fn zone_of(node: &str) -> &'static str {
    if node == "node-b" {
        "zone-b"
    } else {
        "zone-a"
    }
}

/// The node a pod runs on: its name's letter.
fn node_of(pod: &str) -> String {
    format!("node-{}", &pod[..1])
}

/// `demo/<service>-1` with one ready endpoint per pod, each with its node
/// and zone.
fn slice(service_name: &str, pods: &[&str], cluster: &Cluster) -> EndpointSlice {
    endpoint_slice(
        "demo",
        &format!("{service_name}-1"),
        service_name,
        |mut e| {
            e = e.port("http", i32::from(ECHO_PORT), "TCP");
            for pod in pods {
                let node = node_of(pod);
                e = e.endpoint(cluster.pod(pod).ip(), |ep| {
                    ep.ready(true).node(&node).zone(zone_of(&node))
                });
            }
            e
        },
    )
}

/// a1, b1, c1, each hinted for its own zone.
fn hinted_slice(service_name: &str, cluster: &Cluster) -> EndpointSlice {
    endpoint_slice(
        "demo",
        &format!("{service_name}-1"),
        service_name,
        |mut e| {
            e = e.port("http", i32::from(ECHO_PORT), "TCP");
            for pod in ["a1", "b1", "c1"] {
                let node = node_of(pod);
                let zone = zone_of(&node);
                e = e.endpoint(cluster.pod(pod).ip(), |ep| {
                    ep.ready(true).node(&node).zone(zone).hints_zones(&[zone])
                });
            }
            e
        },
    )
}

/// `GET /` on `node`'s health-check node port, from `from`.
fn health_check(from: &Netns, node: &ClusterNode) -> std::io::Result<HttpReply> {
    let addr = node.addr(HEALTH_CHECK_NODE_PORT);
    from.run(|| http::get(addr, "/"))
}

/// `node`'s health-check node port answers upstream's JSON with `local`
/// endpoints: 200 when there are some, 503 when there are none.
#[track_caller]
fn assert_health_check(from: &Netns, node: &ClusterNode, local: usize) {
    let reply = health_check(from, node).unwrap();
    let code = if local > 0 { 200 } else { 503 };
    assert_eq!(reply.code, code, "{}: {}", node.name(), reply.head);
    let body: serde_json::Value = serde_json::from_str(&reply.body)
        .unwrap_or_else(|e| panic!("{}: {e}: {}", node.name(), reply.body));
    assert_eq!(
        body,
        serde_json::json!({
            "service": {"namespace": "demo", "name": "local"},
            "localEndpoints": local,
            "serviceProxyHealthy": true
        }),
        "{}",
        node.name()
    );
}

/// `addr` (a NodePort or the LoadBalancer IP routed to `node`) answers from
/// `from` with exactly the `local` pods, which see `from`'s own address;
/// with no local pod, the connection is dropped.
#[track_caller]
fn assert_local_only(from: &Host, addr: SocketAddr, local: &[&str], node: &str) {
    if local.is_empty() {
        expect_timeout(from, addr);
        return;
    }
    let answers = answers_until_all(from, addr, local);
    assert_eq!(pods(&answers), set(local), "{addr} on {node}");
    assert_eq!(
        answers.values().flatten().collect::<BTreeSet<_>>(),
        BTreeSet::from([&IpAddr::V4(from.ip())]),
        "{addr} on {node} keeps the client's address"
    );
}

/// Opens fresh connections from `from` to `addr` until every pod of
/// `expected` answered and at least eight per expected pod were made (at
/// most 200), recording the source address each pod saw.
#[track_caller]
fn answers_until_all(from: &Netns, addr: SocketAddr, expected: &[&str]) -> Answers {
    let mut answers = Answers::new();
    for attempt in 1..=200 {
        let reply = connect(from, addr).unwrap_or_else(|error| {
            panic!(
                "connection {attempt} from {} to {addr}: {error}",
                from.name()
            )
        });
        answers
            .entry(reply.backend)
            .or_default()
            .insert(reply.source);
        let made = attempt >= expected.len() * 8;
        if made && expected.iter().all(|pod| answers.contains_key(*pod)) {
            break;
        }
    }
    answers
}

/// Connects until `pod` answers (at most 200 connections).
#[track_caller]
fn wait_for_backend(from: &Netns, addr: SocketAddr, pod: &str) -> Reply {
    for _ in 0..200 {
        let reply = connect(from, addr).unwrap();
        if reply.backend == pod {
            return reply;
        }
    }
    panic!("{pod} never answered {addr} from {}", from.name())
}

fn pods(answers: &Answers) -> BTreeSet<String> {
    answers.keys().cloned().collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap()
}
