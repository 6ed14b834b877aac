//! The `kube-proxy` binary under endpoint churn in a large cluster: one
//! Service's endpoint moves every 150 ms for three sync periods while the
//! nat table is sampled. The chains of removed endpoints must go as they go
//! stale (never pile up between full syncs), and the periodic full sync
//! must still come once per `syncPeriod` although changes never stop.
//!
//! Address plan: kp-testkit's. 600 bulk Services × 2 endpoints (1,200
//! endpoints: large-cluster mode, where upstream deletes stale chains only
//! once per syncPeriod) at 10.96.0.1–10.96.2.100 with endpoints in
//! 10.244.64.0/18 and 10.244.128.0/18 that no host owns; `demo/web` at
//! 10.96.200.1:80 → pod web (10.244.1.2:8080), whose endpoint churns among
//! 10.244.200.0/24 addresses besides web.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Write as _;
use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use kp_testkit::files::write_atomically;
use kp_testkit::http;
use kp_testkit::netns::{connect, require_root, wait_until, Netns, NsChild, Topology};

const BULK_SERVICES: usize = 600;
const SYNC_PERIOD: Duration = Duration::from_secs(4);
const CHURN_FOR: Duration = Duration::from_secs(12);
const CHANGE_EVERY: Duration = Duration::from_millis(150);

fn bulk_manifests() -> String {
    let mut text = String::new();
    for i in 0..BULK_SERVICES {
        let ip = format!("10.96.{}.{}", i / 250, i % 250 + 1);
        write!(
            text,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: bulk, name: svc{i}}}\n\
             spec:\n  clusterIP: {ip}\n  clusterIPs: [{ip}]\n  \
             ports:\n    - {{name: http, port: 80, targetPort: 8080, protocol: TCP}}\n\
             ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata:\n  namespace: bulk\n  name: svc{i}-1\n  \
             labels: {{kubernetes.io/service-name: svc{i}}}\n\
             addressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\n\
             endpoints:\n  - addresses: [10.244.{a}.{b}]\n  - addresses: [10.244.{c}.{b}]\n",
            a = 64 + i / 250,
            b = i % 250 + 1,
            c = 128 + i / 250,
        )
        .unwrap();
    }
    text
}

const WEB_SERVICE: &str = "apiVersion: v1
kind: Service
metadata: {namespace: demo, name: web}
spec:
  clusterIP: 10.96.200.1
  clusterIPs: [10.96.200.1]
  ports:
    - {name: http, port: 80, targetPort: 8080, protocol: TCP}
";

/// web's slice: the pod web and a second endpoint that moves with `step`.
fn web_slice(step: usize) -> String {
    format!(
        "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: demo
  name: web-1
  labels: {{kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:
  - addresses: [10.244.1.2]
    nodeName: node-1
  - addresses: [10.244.200.{}]
",
        step % 250 + 1
    )
}

fn start_proxy(node: &Netns, manifests: &Path, log: &Path) -> NsChild {
    let mut command = node.command(env!("CARGO_BIN_EXE_kube-proxy"));
    command
        .args(["--manifests", manifests.to_str().unwrap()])
        .args(["--hostname-override", "node-1"])
        .args(["--cluster-cidr", "10.244.0.0/16"])
        .args(["--iptables-min-sync-period", "0s"])
        .arg("--iptables-sync-period")
        .arg(format!("{}s", SYNC_PERIOD.as_secs()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(log).unwrap());
    NsChild::spawn(&mut command).unwrap()
}

/// The `KUBE-SEP-` chains of the nat table.
fn endpoint_chains(node: &Netns) -> usize {
    node.iptables_chains("nat", "KUBE-SEP-")
}

/// The IPv4 count of a histogram of the proxy's metrics.
fn sync_count(node: &Netns, histogram: &str) -> u64 {
    let reply = node
        .run(|| http::get(("127.0.0.1", 10249), "/metrics"))
        .unwrap();
    let series = format!("{histogram}_count{{ip_family=\"IPv4\"}}");
    reply
        .body
        .lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .map_or(0, |value| value.trim().parse().unwrap())
}

#[test]
fn endpoint_chains_stay_bounded_and_full_syncs_keep_their_period_under_churn() {
    require_root();
    let cluster = Topology::builder()
        .pod("web", |p| p.tcp(8080))
        .pod("caller", |p| p)
        .build()
        .unwrap();
    let (node, caller) = (cluster.node(), cluster.pod("caller"));
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    fs::create_dir(&manifests).unwrap();
    fs::write(manifests.join("bulk.yaml"), bulk_manifests()).unwrap();
    fs::write(manifests.join("web.yaml"), WEB_SERVICE).unwrap();
    let slice_file = manifests.join("web-slice.yaml");
    fs::write(&slice_file, web_slice(0)).unwrap();
    let log = dir.path().join("kube-proxy.log");
    let _proxy = start_proxy(node, &manifests, &log);

    let web: SocketAddr = "10.96.200.1:80".parse().unwrap();
    // Every endpoint of the bulk Services and web's two.
    let expected = 2 * BULK_SERVICES + 2;
    let up = wait_until(Duration::from_secs(60), || {
        endpoint_chains(node) == expected && connect(caller, web).is_ok()
    });
    assert!(
        up,
        "the proxy programmed {expected} endpoint chains within 60 s:\n{}",
        fs::read_to_string(&log).unwrap_or_default()
    );
    let full = "kubeproxy_sync_full_proxy_rules_duration_seconds";
    let partial = "kubeproxy_sync_partial_proxy_rules_duration_seconds";
    let (full_before, partial_before) = (sync_count(node, full), sync_count(node, partial));

    let started = Instant::now();
    let (mut step, mut most) = (0, 0);
    let mut next_sample = started;
    while started.elapsed() < CHURN_FOR {
        step += 1;
        write_atomically(&slice_file, &web_slice(step));
        std::thread::sleep(CHANGE_EVERY);
        if Instant::now() >= next_sample {
            most = most.max(endpoint_chains(node));
            next_sample += Duration::from_millis(500);
        }
    }
    let (full_syncs, partial_syncs) = (
        sync_count(node, full) - full_before,
        sync_count(node, partial) - partial_before,
    );

    assert!(
        partial_syncs >= 20,
        "the churn was synced change by change: {partial_syncs} partial syncs for {step} changes"
    );
    assert!(
        most <= expected,
        "at most {expected} endpoint chains while endpoints churn, found {most} \
         (stale chains piled up between full syncs)"
    );
    // Three sync periods of churn: a periodic full sync in each, although
    // changes never stopped (one may fall just outside the window).
    assert!(
        full_syncs >= 2,
        "full syncs every {SYNC_PERIOD:?} under churn: {full_syncs} in {CHURN_FOR:?}"
    );
    let settled = wait_until(Duration::from_secs(10), || {
        endpoint_chains(node) == expected
    });
    assert!(settled, "{expected} endpoint chains once the churn stopped");
    let answered = wait_until(Duration::from_secs(5), || {
        connect(caller, web).is_ok_and(|reply| reply.backend == "web")
    });
    assert!(answered, "web still answers through {web}");
}
