//! The `kube-proxy` binary repairs what someone else flushed: started in a
//! node namespace with `--manifests` and a 2 s `syncPeriod`, the node's nat
//! and filter tables are flushed and their chains deleted, as an operator's
//! `iptables -t nat -F; iptables -t nat -X; iptables -t filter -F;
//! iptables -t filter -X` does; the Service answers again within one
//! period, and a later endpoint change takes effect. In the iptables mode
//! and in the userspace mode, whose portal rules are iptables rules too.
//!
//! Address plan: kp-testkit's (pods ep1 10.244.1.2, ep2 10.244.1.3; node
//! 192.168.99.2; client 192.168.99.10); demo/web is 10.96.0.41:80 → 8080,
//! NodePort 30080.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kp_testkit::files::write_atomically;
use kp_testkit::netns::{connect, require_root, require_tool, wait_until, NsChild, Topology};

const SYNC_PERIOD: &str = "2s";
/// One period and the time a sync and a connection take on a busy machine.
const REPAIR_DEADLINE: Duration = Duration::from_secs(6);

const MANIFESTS: &str = "apiVersion: v1
kind: Node
metadata: {name: node-1}
status:
  addresses:
    - {type: InternalIP, address: 192.168.99.2}
---
apiVersion: v1
kind: Service
metadata: {namespace: demo, name: web}
spec:
  type: NodePort
  clusterIP: 10.96.0.41
  clusterIPs: [10.96.0.41]
  ports:
    - {name: http, port: 80, targetPort: 8080, nodePort: 30080, protocol: TCP}
";

fn slice(address: &str) -> String {
    format!(
        "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: demo
  name: web-1
  labels: {{kubernetes.io/service-name: web}}
addressType: IPv4
ports:
  - {{name: http, port: 8080, protocol: TCP}}
endpoints:
  - addresses: [{address}]
    conditions: {{ready: true}}
    nodeName: node-1
"
    )
}

#[test]
fn iptables_mode_repairs_flushed_tables_within_one_sync_period() {
    flushed_and_repaired("iptables");
}

#[test]
fn userspace_mode_repairs_flushed_portal_rules_within_one_sync_period() {
    flushed_and_repaired("userspace");
}

fn flushed_and_repaired(mode: &str) {
    require_root();
    require_tool("iptables-legacy");
    require_tool("iptables-nft");
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(8080))
        .pod("ep2", |p| p.tcp(8080))
        .build()
        .unwrap();
    topology.add_node_default_route().unwrap();
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("web.yaml"), MANIFESTS).unwrap();
    let slice_file = dir.path().join("slice.yaml");
    fs::write(&slice_file, slice("10.244.1.2")).unwrap();
    let stderr = dir.path().join("stderr");
    let _proxy = NsChild::spawn(
        topology
            .node()
            .command(env!("CARGO_BIN_EXE_kube-proxy"))
            .args(["--proxy-mode", mode])
            .args(["--manifests", dir.path().to_str().unwrap()])
            .args(["--hostname-override", "node-1"])
            .args(["--cluster-cidr", "10.244.0.0/16"])
            .args(["--iptables-sync-period", SYNC_PERIOD])
            .stderr(fs::File::create(&stderr).unwrap()),
    )
    .unwrap();
    let log = || fs::read_to_string(&stderr).unwrap_or_default();
    let answers = |address: &str, backend: &str| {
        let addr: SocketAddr = address.parse().unwrap();
        let from = if address.starts_with("192.168.99.") {
            topology.client()
        } else {
            topology.pod("ep2")
        };
        connect(from, addr).is_ok_and(|reply| reply.backend == backend)
    };
    let up = wait_until(Duration::from_secs(30), || answers("10.96.0.41:80", "ep1"));
    assert!(up, "the Service answers within 30 s:\n{}", log());

    // In whichever flavor the binary chose.
    for program in ["iptables-legacy", "iptables-nft"] {
        for (table, action) in [
            ("nat", "-F"),
            ("nat", "-X"),
            ("filter", "-F"),
            ("filter", "-X"),
        ] {
            topology.node().exec_ok(program, &["-t", table, action]);
        }
    }
    let flushed = Instant::now();
    for save in ["iptables-legacy-save", "iptables-nft-save"] {
        let nat = topology.node().exec_ok(save, &["-t", "nat"]);
        assert!(!nat.contains("KUBE-"), "the flush took:\n{nat}");
    }

    let repaired = wait_until(REPAIR_DEADLINE, || {
        answers("10.96.0.41:80", "ep1") && answers("192.168.99.2:30080", "ep1")
    });
    assert!(
        repaired,
        "the ClusterIP and the NodePort answer within {REPAIR_DEADLINE:?} of the flush \
         ({:?} gone):\n{}",
        flushed.elapsed(),
        log()
    );

    write_atomically(&slice_file, &slice("10.244.1.3"));
    let moved = wait_until(REPAIR_DEADLINE, || answers("10.96.0.41:80", "ep2"));
    assert!(moved, "a later endpoint change takes effect:\n{}", log());
}
