//! The `kube-proxy` binary fed a Service that any user allowed to create a
//! LoadBalancer Service may write: 3,000 `loadBalancerSourceRanges` (the
//! API server sets no limit), next to an ordinary Service. In every mode
//! the kernel must hold the rules the proxy reports as synced: the
//! ordinary Service answers, the hostile one admits a client inside its
//! ranges and drops one outside, `/healthz` is healthy, and the sync
//! metrics count no failure. What the proxy says is checked against the
//! kernel and real packets, never taken on its word.
//!
//! | object | addresses |
//! |---|---|
//! | demo/web, port 80 → 8080 | 10.96.0.41 → ep1, ep2 |
//! | demo/lb, LoadBalancer, 3,000 source ranges | 10.96.0.42, LB 203.0.113.9, NodePort 30090 → ep1 |
//! | client (in the ranges), client2 (not) | 192.168.99.10, .11 |

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Write as _;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use kp_testkit::http::get;
use kp_testkit::netns::{
    connect, expect_timeout, require_root, require_tool, wait_until, NsChild, Topology,
};

const SOURCE_RANGES: u32 = 3_000;

const WEB: &str = "apiVersion: v1
kind: Service
metadata: {namespace: demo, name: web}
spec:
  clusterIP: 10.96.0.41
  clusterIPs: [10.96.0.41]
  ports:
    - {name: http, port: 80, targetPort: 8080, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: demo
  name: web-1
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports:
  - {name: http, port: 8080, protocol: TCP}
endpoints:
  - {addresses: [10.244.1.2], conditions: {ready: true}, nodeName: node-1}
  - {addresses: [10.244.1.3], conditions: {ready: true}, nodeName: node-1}
---
apiVersion: v1
kind: Node
metadata: {name: node-1}
status:
  addresses:
    - {type: InternalIP, address: 192.168.99.2}
";

/// The LoadBalancer Service with `SOURCE_RANGES` ranges, the first client's
/// address last among them, and its slice.
fn hostile_lb() -> String {
    let mut text = String::from(
        "apiVersion: v1
kind: Service
metadata: {namespace: demo, name: lb}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.42
  clusterIPs: [10.96.0.42]
  ports:
    - {name: http, port: 80, targetPort: 8080, nodePort: 30090, protocol: TCP}
  loadBalancerSourceRanges:
",
    );
    for i in 0..SOURCE_RANGES - 1 {
        // Every other address, so that no two ranges merge into one.
        let _ = writeln!(text, "    - {}/32", Ipv4Addr::from(0x0a80_0000 + 2 * i));
    }
    text.push_str(
        "    - 192.168.99.10/32
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
endpoints:
  - {addresses: [10.244.1.2], conditions: {ready: true}, nodeName: node-1}
",
    );
    text
}

#[test]
fn iptables_mode_programs_a_service_with_3000_source_ranges_and_every_other() {
    require_tool("iptables-legacy-restore");
    hostile_source_ranges(&["--proxy-mode", "iptables"], |topology| {
        let save = topology.node().exec_ok("iptables-save", &[]);
        save.lines()
            .filter(|line| line.starts_with("-A KUBE-FW-") && line.contains(" -s "))
            .count()
    });
}

#[test]
fn nftables_mode_programs_a_service_with_3000_source_ranges_and_every_other() {
    require_tool("nft");
    hostile_source_ranges(
        &["--proxy-mode", "nftables", "--nftables-layout", "chains"],
        nft_source_ranges,
    );
}

#[test]
fn nftables_data_layout_programs_a_service_with_3000_source_ranges_and_every_other() {
    require_tool("nft");
    hostile_source_ranges(
        &["--proxy-mode", "nftables", "--nftables-layout", "data"],
        nft_source_ranges,
    );
}

/// How many source ranges the `ip kube-proxy` table holds.
fn nft_source_ranges(topology: &Topology) -> usize {
    let out = topology
        .node()
        .exec("nft", &["list", "table", "ip", "kube-proxy"]);
    assert!(
        out.status.success(),
        "the table ip kube-proxy is in the kernel: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .matches("10.128.")
        .count()
        + 1
}

/// Runs the binary with `mode_flags` (its mode, and the nftables table
/// layout) on the ordinary and the hostile Service and checks packets,
/// health and metrics; `ranges_in_kernel` reads how many source ranges the
/// kernel holds.
fn hostile_source_ranges(mode_flags: &[&str], ranges_in_kernel: impl Fn(&Topology) -> usize) {
    require_root();
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(8080))
        .pod("ep2", |p| p.tcp(8080))
        .client("client")
        .client("client2")
        .build()
        .unwrap();
    topology.add_node_default_route().unwrap();
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("web.yaml"), WEB).unwrap();
    fs::write(dir.path().join("lb.yaml"), hostile_lb()).unwrap();
    let log = dir.path().join("log");
    let _proxy = NsChild::spawn(
        topology
            .node()
            .command(env!("CARGO_BIN_EXE_kube-proxy"))
            .args(mode_flags)
            .args(["--manifests", dir.path().to_str().unwrap()])
            .args(["--hostname-override", "node-1"])
            .args(["--cluster-cidr", "10.244.0.0/16"])
            .stdout(fs::File::create(&log).unwrap())
            .stderr(fs::File::create(dir.path().join("stderr")).unwrap()),
    )
    .unwrap();
    let log = || {
        fs::read_to_string(dir.path().join("stderr")).unwrap_or_default()
            + &fs::read_to_string(&log).unwrap_or_default()
    };

    let web = at("10.96.0.41:80");
    let up = wait_until(Duration::from_secs(30), || {
        connect(topology.pod("ep2"), web).is_ok()
    });
    assert!(
        up,
        "the ordinary Service answers within 30 s; log:\n{}",
        log()
    );
    let lb = at("203.0.113.9:80");
    assert_eq!(
        connect(topology.client_named("client"), lb)
            .unwrap()
            .backend,
        "ep1",
        "a client inside the ranges is let through"
    );
    expect_timeout(topology.client_named("client2"), lb);
    assert_eq!(
        ranges_in_kernel(&topology),
        SOURCE_RANGES as usize,
        "the kernel holds every range"
    );

    let (healthz, metrics) = topology.node().run(|| {
        (
            get("127.0.0.1:10256", "/healthz").unwrap(),
            get("127.0.0.1:10249", "/metrics").unwrap(),
        )
    });
    assert_eq!(healthz.code, 200, "{}", healthz.body);
    for failures in [
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
        "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
    ] {
        let failed = metrics
            .body
            .lines()
            .filter(|line| line.starts_with(failures))
            .any(|line| !line.ends_with(" 0"));
        assert!(!failed, "{failures} counted a failure:\n{}", metrics.body);
    }
}

fn at(text: &str) -> SocketAddr {
    text.parse().unwrap()
}
