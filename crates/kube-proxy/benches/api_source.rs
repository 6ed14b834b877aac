//! The proxy against an API server that speaks the real list/watch
//! protocol (kp-testkit's), programming real iptables-legacy in a network
//! namespace this program creates and removes:
//!
//! 1. Network-programming latency: the API source, the sync loop and the
//!    iptables backend in this process. 200 EndpointSlice updates, one every
//!    100 ms; each one's latency runs from just before the update reaches the
//!    server to the end of the first successful sync that applied its
//!    Service (`iptables-restore` returned: the rule is in the kernel). p50
//!    and p99 for each size, with minSyncPeriod 0 and 1 s.
//! 2. The `kube-proxy` binary at the largest size: time from start to the
//!    first sync, time from the end of the initial lists (both watches
//!    opened) to the end of the first sync (its
//!    `kubeproxy_sync_proxy_rules_last_timestamp_seconds`), and its peak RSS
//!    (VmHWM) after the first sync and after 200 more updates. kubelet's
//!    `KUBE-IPTABLES-HINT` chain in the legacy mangle table makes it choose
//!    iptables-legacy, as the in-process part uses.
//!
//! Needs root. `cargo bench -p kube-proxy --bench api_source`;
//! `KP_BENCH_SIZES=1000,10000` (default) and `KP_BENCH_RUNS=3`;
//! `KP_BENCH_PARTS=latency` or `binary` runs one part only, and
//! `KP_BENCH_WRAPPER` runs the binary under a profiler (for example
//! `KP_BENCH_WRAPPER="heaptrack -o /tmp/kube-proxy"`), `KP_BENCH_LOG=FILE`
//! keeps its debug log.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_iptables::{
    IptablesBackend, IptablesFlavor, IptablesOptions, LocalDetector, NodePortAddresses,
    SystemApplier,
};
use kp_model::{IpFamily, NamespacedName, NodeInfo, ProxyEventHandler};
use kp_source::api::{client_from, ApiSource};
use kp_sync::{Proxier, ProxierConfig, RunnerConfig, SyncObserver, SyncOutcome, SyncRequest};
use kp_testkit::apiserver::TestApiServer;
use kp_testkit::builders::{endpoint_slice, node, service};
use kp_testkit::http;
use kp_testkit::netns::{Netns, NsChild};
use tokio::sync::watch;

const CHANGES: usize = 200;
const CHANGE_EVERY: Duration = Duration::from_millis(100);

fn namespace(i: usize) -> String {
    format!("ns{}", i % 100)
}

fn ip(base: u32, n: usize) -> String {
    Ipv4Addr::from(base + n as u32).to_string()
}

fn slice(i: usize, second: &str) -> EndpointSlice {
    endpoint_slice(
        &namespace(i),
        &format!("svc{i}-1"),
        &format!("svc{i}"),
        |e| {
            e.address_type("IPv4")
                .port("http", 8080, "TCP")
                .endpoint(ip(0x0af4_0000, 2 * i), |ep| ep.ready(true).node("node-2"))
                .endpoint(second, |ep| ep.ready(true).node("node-2"))
        },
    )
}

/// `size` Services × 2 endpoints, one TCP port each, and the Node.
fn populate(server: &TestApiServer, size: usize) {
    server.create(node("node-1", |n| n.internal_ip("192.168.99.2")));
    for i in 0..size {
        server.create(service(&namespace(i), &format!("svc{i}"), |s| {
            s.cluster_ip(ip(0x0a60_0000, i))
                .port("http", 80, "TCP")
                .target_port(8080)
        }));
        server.create(slice(i, &ip(0x0af4_0000, 2 * i + 1)));
    }
}

/// When each successful sync ended, and the Services it applied.
#[derive(Default)]
struct Syncs(Mutex<Vec<(Instant, BTreeSet<NamespacedName>)>>);

impl SyncObserver for Syncs {
    fn on_synced(&self, request: &SyncRequest<'_>, _outcome: &SyncOutcome) {
        let changed = request.changed_services.clone();
        self.0.lock().unwrap().push((Instant::now(), changed));
    }
}

impl Syncs {
    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// The end of the first sync after `since` that applied `service`.
    fn applied(&self, service: &NamespacedName, since: Instant) -> Option<Instant> {
        let syncs = self.0.lock().unwrap();
        syncs
            .iter()
            .find(|(at, changed)| *at > since && changed.contains(service))
            .map(|(at, _)| *at)
    }
}

fn backend() -> Box<IptablesBackend> {
    let options = IptablesOptions {
        local_detector: LocalDetector::ClusterCidr(vec!["10.244.0.0/16".parse().unwrap()]),
        ..IptablesOptions::default()
    };
    let applier = Box::new(SystemApplier::new(IptablesFlavor::Legacy));
    let backend = IptablesBackend::new(IpFamily::V4, options, NodePortAddresses::All, applier);
    Box::new(
        backend
            .unwrap()
            .with_sysctl(Box::new(kp_node::MemorySysctl::new())),
    )
}

async fn wait_for(what: &str, timeout: Duration, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Latencies (ms) of [`CHANGES`] updates with `min_sync`.
async fn latencies(size: usize, min_sync: Duration, kubeconfig: &Path) -> Vec<f64> {
    let server = TestApiServer::start().await.unwrap();
    server.write_kubeconfig(kubeconfig).unwrap();
    populate(&server, size);
    let client = client_from(Some(kubeconfig), None, 5.0, 10).await.unwrap();
    let syncs = Arc::new(Syncs::default());
    let config = ProxierConfig {
        family: IpFamily::V4,
        node: NodeInfo {
            name: "node-1".into(),
            ..NodeInfo::default()
        },
        runner: RunnerConfig {
            min_interval: min_sync,
            max_interval: Duration::from_secs(30),
            retry_interval: Duration::from_secs(1),
        },
    };
    let proxier =
        Proxier::new(config, backend()).with_observer(Arc::clone(&syncs) as Arc<dyn SyncObserver>);
    let proxier = Arc::new(proxier);
    let (stop_tx, stop) = watch::channel(false);
    let stopped = |mut stop: watch::Receiver<bool>| async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    let running = tokio::spawn(Arc::clone(&proxier).run(stopped(stop.clone())));
    let handler: Arc<dyn ProxyEventHandler> = proxier;
    let source = tokio::spawn(ApiSource::new(client, "node-1").run(handler, stopped(stop.clone())));
    wait_for("the first sync", Duration::from_secs(300), || {
        syncs.count() > 0
    })
    .await;

    let start = Instant::now();
    let mut changes = Vec::with_capacity(CHANGES);
    for k in 0..CHANGES {
        let at = start + CHANGE_EVERY * k as u32;
        tokio::time::sleep_until(at.into()).await;
        let i = (k * 37) % size;
        let name = NamespacedName {
            namespace: namespace(i).into(),
            name: format!("svc{i}").into(),
        };
        let sent = Instant::now();
        server.update(slice(i, &ip(0x0afa_0000, k)));
        changes.push((name, sent));
    }
    let all_applied = || {
        changes
            .iter()
            .all(|(name, sent)| syncs.applied(name, *sent).is_some())
    };
    wait_for(
        "every change to be applied",
        Duration::from_secs(120),
        all_applied,
    )
    .await;
    let _ = stop_tx.send(true);
    let _ = running.await;
    let _ = source.await;
    changes
        .iter()
        .map(|(name, sent)| {
            let applied = syncs.applied(name, *sent).unwrap();
            applied.duration_since(*sent).as_secs_f64() * 1000.0
        })
        .collect()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// What one run of the binary measured.
struct BinaryRun {
    start_to_first_sync_s: f64,
    lists_to_first_sync_s: f64,
    rss_after_first_sync_mib: f64,
    rss_after_changes_mib: f64,
}

fn vm_hwm_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib / 1024.0
}

/// `GET /metrics` of the binary's metrics server, if it answers.
fn metrics() -> Option<String> {
    let reply = http::get(("127.0.0.1", 10249), "/metrics").ok()?;
    Some(reply.body)
}

fn last_sync_wall(metrics: &str) -> Option<f64> {
    let series = "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}";
    let line = metrics.lines().find(|l| l.starts_with(series))?;
    line[series.len()..].trim().parse().ok()
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

async fn binary(size: usize, kubeconfig: &Path) -> BinaryRun {
    let server = TestApiServer::start().await.unwrap();
    server.write_kubeconfig(kubeconfig).unwrap();
    populate(&server, size);
    // kubelet's hint chain makes the proxy pick iptables-legacy, as on a
    // node whose kubelet uses it.
    let hint = Command::new("iptables-legacy")
        .args(["-t", "mangle", "-N", "KUBE-IPTABLES-HINT"])
        .status()
        .unwrap();
    assert!(hint.success(), "creating kubelet's hint chain");
    let wrapper = std::env::var("KP_BENCH_WRAPPER").unwrap_or_default();
    let mut command = match wrapper.split_whitespace().collect::<Vec<_>>().split_first() {
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args).arg(env!("CARGO_BIN_EXE_kube-proxy"));
            command
        }
        None => Command::new(env!("CARGO_BIN_EXE_kube-proxy")),
    };
    // `KP_BENCH_LOG=FILE` keeps the binary's debug log.
    let log = std::env::var("KP_BENCH_LOG")
        .ok()
        .map(|path| std::fs::File::create(path).unwrap());
    let started = unix_now();
    let child = NsChild::spawn(
        command
            .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
            .args([
                "--hostname-override",
                "node-1",
                "--cluster-cidr",
                "10.244.0.0/16",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .args(log.as_ref().map(|_| "--v=4"))
            .stderr(log.map_or_else(Stdio::null, Stdio::from)),
    )
    .unwrap();
    let watching = |kind: &str| {
        server
            .request_log()
            .iter()
            .any(|r| r.path.ends_with(kind) && r.query.contains("watch="))
    };
    wait_for("the initial lists", Duration::from_secs(300), || {
        watching("/services") && watching("/endpointslices")
    })
    .await;
    let lists_done = unix_now();
    let mut first_sync = None;
    let deadline = Instant::now() + Duration::from_secs(300);
    while first_sync.is_none() {
        assert!(Instant::now() < deadline, "no first sync");
        tokio::time::sleep(Duration::from_millis(20)).await;
        first_sync = tokio::task::spawn_blocking(metrics)
            .await
            .unwrap()
            .as_deref()
            .and_then(last_sync_wall);
    }
    let first_sync = first_sync.unwrap();
    let rss_after_first_sync_mib = vm_hwm_mib(child.id());
    for k in 0..CHANGES {
        let i = (k * 37) % size;
        server.update(slice(i, &ip(0x0afa_0000, k)));
        tokio::time::sleep(CHANGE_EVERY).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_after_changes_mib = vm_hwm_mib(child.id());
    drop(child);
    BinaryRun {
        start_to_first_sync_s: first_sync - started,
        lists_to_first_sync_s: first_sync - lists_done,
        rss_after_first_sync_mib,
        rss_after_changes_mib,
    }
}

fn env_list(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .map(|s| s.trim().parse().expect("comma-separated numbers"))
        .collect()
}

fn main() {
    let sizes = env_list("KP_BENCH_SIZES", "1000,10000");
    let runs = env_list("KP_BENCH_RUNS", "3")[0];
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let parts = std::env::var("KP_BENCH_PARTS").unwrap_or_default();
    if parts != "binary" {
        latency_table(&sizes, runs, &kubeconfig);
    }
    if parts != "latency" {
        binary_table(&sizes, runs, &kubeconfig);
    }
}

fn latency_table(sizes: &[usize], runs: usize, kubeconfig: &Path) {
    println!("| Services (×2 endpoints) | minSyncPeriod | p50 (ms) | p99 (ms) |");
    println!("|---:|---:|---:|---:|");
    for &size in sizes {
        for min_sync in [Duration::ZERO, Duration::from_secs(1)] {
            let (mut p50s, mut p99s) = (Vec::new(), Vec::new());
            for _ in 0..runs {
                eprintln!("latency: {size} Services, minSyncPeriod {min_sync:?}");
                let node = Netns::create("apibench").expect("the benchmark needs root");
                let mut latencies =
                    node.run(|| runtime().block_on(latencies(size, min_sync, kubeconfig)));
                latencies.sort_by(f64::total_cmp);
                p50s.push(percentile(&latencies, 0.50));
                p99s.push(percentile(&latencies, 0.99));
            }
            println!(
                "| {size} | {} s | {:.0} | {:.0} |",
                min_sync.as_secs(),
                median(p50s),
                median(p99s)
            );
        }
    }
}

fn binary_table(sizes: &[usize], runs: usize, kubeconfig: &Path) {
    let size = *sizes.iter().max().unwrap();
    let mut results = Vec::new();
    for _ in 0..runs {
        eprintln!("binary: {size} Services");
        let node = Netns::create("apibench").expect("the benchmark needs root");
        results.push(node.run(|| runtime().block_on(binary(size, kubeconfig))));
    }
    println!();
    println!("The kube-proxy binary, {size} Services × 2 endpoints, medians of {runs} runs:");
    println!();
    println!("| start → first sync (s) | lists complete → first sync (s) | peak RSS after first sync (MiB) | peak RSS after {CHANGES} updates (MiB) |");
    println!("|---:|---:|---:|---:|");
    let pick = |f: fn(&BinaryRun) -> f64| median(results.iter().map(f).collect());
    println!(
        "| {:.2} | {:.2} | {:.1} | {:.1} |",
        pick(|r| r.start_to_first_sync_s),
        pick(|r| r.lists_to_first_sync_s),
        pick(|r| r.rss_after_first_sync_mib),
        pick(|r| r.rss_after_changes_mib)
    );
}

/// A runtime built on the calling thread, inside its network namespace.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
