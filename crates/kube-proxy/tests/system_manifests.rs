//! The `kube-proxy` binary as a node runs it: started in a node network
//! namespace with `--manifests`, driven by editing the manifests, checked by
//! real traffic from a pod and from a client, stopped with SIGTERM (rules
//! stay) and cleaned up with `--cleanup` (rules go).
//!
//! Address plan: kp-testkit's (pods 10.244.1.2–4, client 192.168.99.10,
//! node 192.168.99.2); the Service is 10.96.0.41:80 → 8080, NodePort 30080.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::fs;
use std::net::SocketAddr;

use std::process::Command;
use std::time::Duration;

use kp_testkit::files::write_atomically;
use kp_testkit::netns::{
    connect, hits_until_all, require_root, require_tool, wait_until, Netns, Topology,
};

const SERVICE: &str = "apiVersion: v1
kind: Service
metadata: {namespace: demo, name: web}
spec:
  type: NodePort
  clusterIP: 10.96.0.41
  clusterIPs: [10.96.0.41]
  ports:
    - {name: http, port: 80, targetPort: 8080, nodePort: 30080, protocol: TCP}
";

const NODE: &str = "apiVersion: v1
kind: Node
metadata: {name: node-1}
status:
  addresses:
    - {type: InternalIP, address: 192.168.99.2}
";

fn slice(addresses: &[&str]) -> String {
    let mut text = String::from(
        "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: demo
  name: web-1
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports:
  - {name: http, port: 8080, protocol: TCP}
endpoints:
",
    );
    for address in addresses {
        text.push_str(&format!(
            "  - addresses: [{address}]\n    conditions: {{ready: true}}\n    nodeName: node-1\n"
        ));
    }
    if addresses.is_empty() {
        text = text.replace("endpoints:\n", "endpoints: []\n");
    }
    text
}

fn at(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

/// The pods answering `addr`, sampled until each of `expected` answered.
fn backends_of(from: &Netns, addr: SocketAddr, expected: &[&str]) -> BTreeSet<String> {
    hits_until_all(from, addr, expected, 200)
        .into_keys()
        .collect()
}

#[test]
fn the_binary_follows_manifest_edits_and_leaves_rules_on_sigterm() {
    require_root();
    require_tool("nft");
    let cluster = Topology::builder()
        .pod("ep1", |p| p.tcp(8080))
        .pod("ep2", |p| p.tcp(8080))
        .pod("ep3", |p| p.tcp(8080))
        .build()
        .unwrap();
    cluster.add_node_default_route().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path();
    fs::write(manifests.join("service.yaml"), SERVICE).unwrap();
    let slice_file = manifests.join("slice.yaml");
    fs::write(
        &slice_file,
        slice(&["10.244.1.2", "10.244.1.3", "10.244.1.4"]),
    )
    .unwrap();

    let (node, pod, client) = (cluster.node(), cluster.pod("ep1"), cluster.client());
    // What upstream's nftables mode would have left, and a table of others;
    // what a userspace proxy would have left.
    nft_leftovers(node);
    node.exec_ok("nft", &["add", "table", "inet", "other"]);
    portal_leftovers(node);
    let mut proxy = node.spawn(
        env!("CARGO_BIN_EXE_kube-proxy"),
        &[
            "--manifests",
            manifests.to_str().unwrap(),
            "--hostname-override",
            "node-1",
            "--cluster-cidr",
            "10.244.0.0/16",
            "--iptables-min-sync-period",
            "0s",
        ],
    );
    let cluster_ip = at("10.96.0.41:80");
    let up = wait_until(Duration::from_secs(15), || connect(pod, cluster_ip).is_ok());
    assert!(up, "the proxy programmed the ClusterIP within 15 s");
    let tables = nft_tables(node);
    assert!(
        !tables.iter().any(|t| t.ends_with(" kube-proxy"))
            && tables.contains(&"table inet other".to_owned()),
        "the nftables mode's tables are gone at start, others stay: {tables:?}"
    );
    assert_eq!(
        node.iptables_chains("nat", "KUBE-PORTALS-"),
        0,
        "the userspace mode's portals are gone at start"
    );
    let all: BTreeSet<String> = ["ep1", "ep2", "ep3"].map(String::from).into();
    assert_eq!(
        backends_of(pod, cluster_ip, &["ep1", "ep2", "ep3"]),
        all,
        "ClusterIP spreads over all three"
    );
    assert_eq!(
        backends_of(client, at("192.168.99.2:30080"), &["ep1", "ep2", "ep3"]),
        all,
        "the NodePort answers the client"
    );

    // Scale down by editing the manifest: new connections follow.
    write_atomically(&slice_file, &slice(&["10.244.1.3"]));
    let moved = wait_until(Duration::from_secs(5), || {
        backends_of(pod, cluster_ip, &["ep2"]) == BTreeSet::from(["ep2".to_owned()])
    });
    assert!(moved, "after the edit only ep2 answers");

    // No endpoints left: the Service refuses connections.
    write_atomically(&slice_file, &slice(&[]));
    let refused = wait_until(Duration::from_secs(5), || {
        connect(pod, cluster_ip).is_err_and(|e| e.is_refused())
    });
    assert!(refused, "a Service without endpoints refuses connections");

    // SIGTERM stops the proxy; its rules stay in place.
    write_atomically(&slice_file, &slice(&["10.244.1.4"]));
    let back = wait_until(Duration::from_secs(5), || {
        connect(pod, cluster_ip).is_ok_and(|r| r.backend == "ep3")
    });
    assert!(back, "ep3 answers after it was added");
    let pid = proxy.id().to_string();
    let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(status.success());
    let exited = wait_until(Duration::from_secs(5), || {
        proxy.try_wait().is_ok_and(|s| s.is_some())
    });
    assert!(exited, "SIGTERM ends the proxy");
    assert!(proxy.try_wait().unwrap().unwrap().success(), "a clean exit");
    assert_eq!(
        connect(pod, cluster_ip).unwrap().backend,
        "ep3",
        "rules stay"
    );

    // --cleanup removes every KUBE- service chain, and the nftables mode's
    // tables.
    assert!(node.iptables_chains("nat", "KUBE-SVC-") > 0);
    nft_leftovers(node);
    let out = node.exec(env!("CARGO_BIN_EXE_kube-proxy"), &["--cleanup"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        node.iptables_chains("nat", "KUBE-SVC-"),
        0,
        "--cleanup leaves no KUBE-SVC chain"
    );
    let tables = nft_tables(node);
    assert!(
        !tables.iter().any(|t| t.ends_with(" kube-proxy"))
            && tables.contains(&"table inet other".to_owned()),
        "--cleanup removes the nftables mode's tables only: {tables:?}"
    );
}

/// A portal chain of the userspace mode, with its jump, capturing the web
/// Service's ClusterIP for a listener that is gone.
fn portal_leftovers(node: &Netns) {
    // The jump exactly as the mode writes it: the removal looks for it.
    let iptables = |args: &[&str]| node.exec_ok("iptables", args);
    iptables(&["-t", "nat", "-N", "KUBE-PORTALS-CONTAINER"]);
    iptables(&[
        "-t",
        "nat",
        "-A",
        "KUBE-PORTALS-CONTAINER",
        "-d",
        "10.96.0.41/32",
        "-p",
        "tcp",
        "--dport",
        "80",
        "-j",
        "REDIRECT",
        "--to-ports",
        "1",
    ]);
    iptables(&[
        "-t",
        "nat",
        "-I",
        "PREROUTING",
        "-m",
        "comment",
        "--comment",
        "handle ClusterIPs; NOTE: this must be before the NodePort rules",
        "-j",
        "KUBE-PORTALS-CONTAINER",
    ]);
}

/// The tables upstream's nftables mode programs, with a chain each.
fn nft_leftovers(node: &Netns) {
    for family in ["ip", "ip6"] {
        node.exec_ok("nft", &["add", "table", family, "kube-proxy"]);
        node.exec_ok("nft", &["add", "chain", family, "kube-proxy", "services"]);
    }
}

fn nft_tables(node: &Netns) -> Vec<String> {
    let listing = node.exec_ok("nft", &["list", "tables"]);
    listing.lines().map(str::to_owned).collect()
}

/// Three pods behind the web Service (and, with `node`, a Node manifest
/// giving node-1 its address), the manifests in a temporary directory.
struct WebCluster {
    cluster: Topology,
    dir: tempfile::TempDir,
    slice_file: std::path::PathBuf,
}

impl WebCluster {
    fn new(node: bool) -> Self {
        let cluster = Topology::builder()
            .pod("ep1", |p| p.tcp(8080))
            .pod("ep2", |p| p.tcp(8080))
            .pod("ep3", |p| p.tcp(8080))
            .build()
            .unwrap();
        cluster.add_node_default_route().unwrap();
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("service.yaml"), SERVICE).unwrap();
        if node {
            fs::write(dir.path().join("node.yaml"), NODE).unwrap();
        }
        let slice_file = dir.path().join("slice.yaml");
        fs::write(
            &slice_file,
            slice(&["10.244.1.2", "10.244.1.3", "10.244.1.4"]),
        )
        .unwrap();
        Self {
            cluster,
            dir,
            slice_file,
        }
    }

    /// The binary in `mode` on the manifests, in the node namespace.
    fn spawn(&self, mode: &str) -> kp_testkit::netns::NsChild {
        self.spawn_with(&["--proxy-mode", mode])
    }

    /// The binary with `mode_flags` (its mode, and the nftables table
    /// layout) on the manifests, in the node namespace.
    fn spawn_with(&self, mode_flags: &[&str]) -> kp_testkit::netns::NsChild {
        let mut args = mode_flags.to_vec();
        args.extend([
            "--manifests",
            self.dir.path().to_str().unwrap(),
            "--hostname-override",
            "node-1",
            "--cluster-cidr",
            "10.244.0.0/16",
        ]);
        self.cluster
            .node()
            .spawn(env!("CARGO_BIN_EXE_kube-proxy"), &args)
    }

    /// The ClusterIP and the NodePort reach all three pods; after an edit
    /// only ep2 answers; without endpoints the Service refuses.
    fn serves_and_follows_edits(&self) {
        let (pod, client) = (self.cluster.pod("ep1"), self.cluster.client());
        let cluster_ip = at("10.96.0.41:80");
        let up = wait_until(Duration::from_secs(15), || connect(pod, cluster_ip).is_ok());
        assert!(up, "the proxy serves the ClusterIP within 15 s");
        let all: BTreeSet<String> = ["ep1", "ep2", "ep3"].map(String::from).into();
        assert_eq!(backends_of(pod, cluster_ip, &["ep1", "ep2", "ep3"]), all);
        assert_eq!(
            backends_of(client, at("192.168.99.2:30080"), &["ep1", "ep2", "ep3"]),
            all,
            "the NodePort answers the client"
        );
        write_atomically(&self.slice_file, &slice(&["10.244.1.3"]));
        let moved = wait_until(Duration::from_secs(5), || {
            backends_of(pod, cluster_ip, &["ep2"]) == BTreeSet::from(["ep2".to_owned()])
        });
        assert!(moved, "after the edit only ep2 answers");
        write_atomically(&self.slice_file, &slice(&[]));
        let refused = wait_until(Duration::from_secs(5), || {
            connect(pod, cluster_ip).is_err_and(|e| e.is_refused())
        });
        assert!(refused, "a Service without endpoints refuses connections");
    }

    /// Stops `proxy` with SIGTERM, then runs `--cleanup` in the node.
    fn stop_and_clean_up(&self, mut proxy: kp_testkit::netns::NsChild) {
        let pid = proxy.id().to_string();
        let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(status.success());
        let exited = wait_until(Duration::from_secs(5), || {
            proxy.try_wait().is_ok_and(|s| s.is_some())
        });
        assert!(exited, "SIGTERM ends the proxy");
        let out = self
            .cluster
            .node()
            .exec(env!("CARGO_BIN_EXE_kube-proxy"), &["--cleanup"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `--proxy-mode nftables`: the binary removes the iptables mode's chains at
/// start, programs its own tables over netlink (NodePorts on the Node's
/// primary address, this mode's default), follows manifest edits, and
/// `--cleanup` removes its tables.
#[test]
fn the_binary_in_nftables_mode_serves_follows_edits_and_cleans_up() {
    nftables_serves_follows_edits_and_cleans_up("chains");
}

/// The same in the data layout: the endpoints are elements of a
/// `service-endpoints-tcp-K` map, and the edits change elements only.
#[test]
fn the_binary_in_nftables_data_layout_serves_follows_edits_and_cleans_up() {
    nftables_serves_follows_edits_and_cleans_up("data");
}

fn nftables_serves_follows_edits_and_cleans_up(layout: &str) {
    require_root();
    require_tool("nft");
    let web = WebCluster::new(true);
    let node = web.cluster.node();
    // What the iptables mode would have left.
    node.exec_ok("iptables", &["-t", "nat", "-N", "KUBE-SVC-LEFTOVER0000000"]);

    let proxy = web.spawn_with(&["--proxy-mode", "nftables", "--nftables-layout", layout]);
    web.serves_and_follows_edits();
    assert!(nft_tables(node).contains(&"table ip kube-proxy".to_owned()));
    let table = node.exec_ok("nft", &["list", "table", "ip", "kube-proxy"]);
    assert_eq!(
        table.contains("map service-endpoints-tcp {"),
        layout == "data",
        "the {layout} layout's table:\n{table}"
    );
    assert_eq!(
        node.iptables_chains("nat", "KUBE-SVC-"),
        0,
        "the iptables mode's chains are gone at start"
    );

    web.stop_and_clean_up(proxy);
    let tables = nft_tables(node);
    assert!(
        !tables.iter().any(|t| t.ends_with(" kube-proxy")),
        "--cleanup removes the nftables mode's tables: {tables:?}"
    );
}

/// `--proxy-mode userspace`: the binary relays Service traffic itself
/// behind nat portal rules, follows manifest edits, and `--cleanup` removes
/// the portal chains.
#[test]
fn the_binary_in_userspace_mode_relays_follows_edits_and_cleans_up() {
    require_root();
    require_tool("nft");
    let web = WebCluster::new(false);
    let node = web.cluster.node();
    // What the iptables and nftables modes would have left.
    node.exec_ok("iptables", &["-t", "nat", "-N", "KUBE-SVC-LEFTOVER0000000"]);
    nft_leftovers(node);

    let proxy = web.spawn("userspace");
    web.serves_and_follows_edits();
    assert!(node.iptables_chains("nat", "KUBE-PORTALS-") > 0);
    // The relay's connections per service port are on /metrics.
    let metrics = node
        .run(|| kp_testkit::http::get(("127.0.0.1", 10249), "/metrics"))
        .unwrap()
        .body;
    let accepted = metrics
        .lines()
        .find(|l| {
            l.starts_with("kubeproxy_userspace_accepted_connections_total{")
                && l.contains("service=\"web\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok());
    assert!(accepted.is_some_and(|n| n >= 1.0), "{metrics}");
    assert!(
        !nft_tables(node).iter().any(|t| t.ends_with(" kube-proxy")),
        "the nftables mode's tables are gone at start"
    );
    assert_eq!(
        node.iptables_chains("nat", "KUBE-SVC-"),
        0,
        "no per-Service NAT chains in this mode; the iptables mode's leftover is gone"
    );

    web.stop_and_clean_up(proxy);
    assert_eq!(
        node.iptables_chains("nat", "KUBE-PORTALS-"),
        0,
        "--cleanup removes the portal chains"
    );
}
