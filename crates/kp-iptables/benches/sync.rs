//! Sync time against the real kernel, on iptables-legacy and iptables-nft.
//!
//! For each size (Services × 2 endpoints, one TCP port each) and flavor, in
//! a network namespace this program creates, enters and removes: render time, full
//! sync time (jump rules, iptables-save, render, iptables-restore), and the
//! time of a partial sync after one endpoint changed; medians of 5 runs.
//! Prints a markdown table and the peak RSS of the process.
//!
//! Needs root. Run with
//! `cargo bench -p kp-iptables --bench sync`, or for a quick run
//! `KP_BENCH_SIZES=1000 cargo bench -p kp-iptables --bench sync`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kp_iptables::{
    IptablesBackend, IptablesFlavor, IptablesOptions, LocalDetector, NatChains, NodePortAddresses,
    RenderInput, Renderer, SystemApplier,
};
use kp_model::{
    Endpoint, IpFamily, NamespacedName, NodeInfo, Protocol, ServicePort, ServicePortName,
};
use kp_sync::{Backend, ServicePortState, StaleConntrack, SyncRequest};
use kp_testkit::netns::Netns;

const RUNS: usize = 5;
const DEFAULT_SIZES: &str = "1000,5000,10000";

fn endpoint(n: u32) -> Arc<Endpoint> {
    Arc::new(Endpoint {
        ip: IpAddr::V4(Ipv4Addr::from(0x0af4_0000 + n)),
        port: 8080,
        ready: true,
        serving: true,
        terminating: false,
        is_local: false,
        node_name: Some("node-2".into()),
        zone: None,
        zone_hints: None,
        node_hints: None,
    })
}

fn name(i: u32) -> ServicePortName {
    ServicePortName {
        service: NamespacedName {
            namespace: format!("ns{}", i % 100).into(),
            name: format!("svc{i}").into(),
        },
        port: "http".into(),
        protocol: Protocol::Tcp,
    }
}

fn state(i: u32, mut all_endpoints: Vec<Arc<Endpoint>>) -> ServicePortState {
    let port = ServicePort {
        cluster_ip: IpAddr::V4(Ipv4Addr::from(0x0a60_0000 + i)),
        port: 80,
        protocol: Protocol::Tcp,
        node_port: None,
        external_ips: Vec::new(),
        load_balancer_ips: Vec::new(),
        load_balancer_source_ranges: Vec::new(),
        session_affinity_timeout: None,
        external_policy_local: false,
        internal_policy_local: false,
        health_check_node_port: None,
        traffic_distribution: None,
        topology_mode: None,
    };
    all_endpoints.sort_by_key(|e| (e.ip, e.port));
    kp_sync::testing::planned(port, all_endpoints)
}

fn services(count: u32) -> BTreeMap<ServicePortName, ServicePortState> {
    let pair = |i: u32| vec![endpoint(2 * i), endpoint(2 * i + 1)];
    (0..count).map(|i| (name(i), state(i, pair(i)))).collect()
}

fn options() -> IptablesOptions {
    IptablesOptions {
        local_detector: LocalDetector::ClusterCidr(vec!["10.244.0.0/16".parse().unwrap()]),
        ..IptablesOptions::default()
    }
}

fn node() -> NodeInfo {
    NodeInfo {
        name: "node-1".into(),
        addresses: vec![IpAddr::V4(Ipv4Addr::new(192, 168, 99, 2))],
        ..NodeInfo::default()
    }
}

fn median(mut samples: Vec<Duration>) -> f64 {
    samples.sort_unstable();
    samples[samples.len() / 2].as_secs_f64() * 1000.0
}

fn time(mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}

struct Row {
    flavor: IptablesFlavor,
    size: u32,
    render_ms: f64,
    full_ms: f64,
    change_ms: f64,
}

/// Measures inside a fresh network namespace: the measuring thread enters
/// it, so iptables programs start there directly, as they do for the proxy.
fn measure(flavor: IptablesFlavor, size: u32) -> Row {
    let namespace = Netns::create(&format!("bench-{flavor}")).expect("the benchmark needs root");
    namespace.run(|| measure_here(flavor, size))
}

fn measure_here(flavor: IptablesFlavor, size: u32) -> Row {
    let node = node();
    let mut current = services(size);
    let stale = StaleConntrack::default();
    let no_changes = BTreeSet::new();

    let mut renderer = Renderer::new(options()).unwrap();
    let render_input = RenderInput {
        family: IpFamily::V4,
        full: true,
        service_ports: &current,
        changed_services: &no_changes,
        node: &node,
        node_port_addresses: None,
        existing_nat_chains: NatChains::Unknown,
        jumps: &[],
    };
    let render = (0..RUNS).map(|_| time(|| drop(renderer.render(&render_input))));
    let render_ms = median(render.collect());
    // The backend below has a renderer of its own; the peak RSS printed at
    // the end should be the backend's.
    drop(renderer);

    let applier = SystemApplier::new(flavor);
    let backend = IptablesBackend::new(
        IpFamily::V4,
        options(),
        NodePortAddresses::All,
        Box::new(applier),
    );
    // Sysctls stay in memory: nothing the sync time depends on.
    let mut backend = backend
        .unwrap()
        .with_sysctl(Box::new(kp_node::MemorySysctl::new()));
    let mut sync = |services: &BTreeMap<_, _>, full: bool, changed: &BTreeSet<_>| {
        let request = SyncRequest {
            family: IpFamily::V4,
            full,
            service_ports: services,
            changed_services: changed,
            node: &node,
            stale_conntrack: &stale,
        };
        time(|| {
            backend.sync(&request).unwrap();
        })
    };
    let full = (0..RUNS)
        .map(|_| sync(&current, true, &no_changes))
        .collect();
    let full_ms = median(full);

    let changed = BTreeSet::from([name(7).service]);
    let mut change = Vec::new();
    for run in 0..RUNS as u32 {
        let moved = vec![endpoint(14), endpoint(1_000_000 + run)];
        current.insert(name(7), state(7, moved));
        change.push(sync(&current, false, &changed));
    }
    Row {
        flavor,
        size,
        render_ms,
        full_ms,
        change_ms: median(change),
    }
}

fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let sizes = std::env::var("KP_BENCH_SIZES").unwrap_or_else(|_| DEFAULT_SIZES.to_owned());
    let sizes: Vec<u32> = sizes
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("KP_BENCH_SIZES: comma-separated numbers")
        })
        .collect();
    let mut rows = Vec::new();
    for &size in &sizes {
        for flavor in [IptablesFlavor::Legacy, IptablesFlavor::Nft] {
            eprintln!("measuring {size} services on iptables-{flavor}");
            rows.push(measure(flavor, size));
        }
    }
    println!("| iptables | Services (×2 endpoints) | render (ms) | full sync (ms) | one-endpoint change sync (ms) |");
    println!("|---|---:|---:|---:|---:|");
    for row in rows {
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1} |",
            row.flavor, row.size, row.render_ms, row.full_ms, row.change_ms
        );
    }
    println!();
    println!("medians of {RUNS} runs");
    match peak_rss_kib() {
        Some(kib) => println!("peak RSS (VmHWM): {:.1} MiB", kib as f64 / 1024.0),
        None => println!("peak RSS (VmHWM): unavailable"),
    }
}
