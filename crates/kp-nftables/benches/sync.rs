//! Sync time of the nftables backend against the real kernel, committing
//! over netlink and with `nft -f -` (`KP_BENCH_APPLIERS=netlink,nft`).
//!
//! For each size (Service ports × 2 endpoints, or `KP_BENCH_ENDPOINTS`;
//! one TCP port each), in a
//! network namespace this program creates, enters and removes: the cold
//! start (the first sync, which deletes and writes the table), full render
//! and full sync time (of a table nobody else touched, and after another
//! program committed to a table of its own, both of which send only
//! differences; and after a commit that changed the proxy's table, which
//! rewrites every rule), the kernel's own floor for a commit (see
//! `kernel_floors`), and the render and sync time of a partial sync after
//! one endpoint changed; plus the time `nft -f` needs for a one-line
//! transaction on the same table (the floor any `nft`-based sync pays:
//! process start and nft's cache of the table). Medians of 5 runs.
//!
//! Needs root and nft. Run with `cargo bench -p kp-nftables --bench sync`,
//! or `KP_BENCH_SIZES=1000,10000 KP_BENCH_APPLIERS=netlink cargo bench -p
//! kp-nftables --bench sync`. The peak RSS printed is the process's over
//! every measurement (run one size and applier alone for its own figure).
//! `KP_BENCH_TRANSACTION_TEXT_MAX=BYTES` sets the bound at which a full
//! sync is split into several transactions; `KP_BENCH_CHANGE_RUNS=N` times
//! N one-endpoint changes instead of 5.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kp_model::{
    Endpoint, IpFamily, NamespacedName, NodeInfo, Protocol, ServicePort, ServicePortName,
};
use kp_nftables::model::{ChainKind, Command, Expr, Key, Name, Rule, SetElement, Verdict};
use kp_nftables::{
    Applier, NetlinkApplier, NftablesBackend, NftablesOptions, Programmed, RenderInput, Renderer,
    Transaction,
};
use kp_node::{LocalDetector, NodePortAddresses};
use kp_sync::{Backend, ServicePortState, StaleConntrack, SyncRequest};
use kp_testkit::netns::Netns;

const RUNS: usize = 5;
const DEFAULT_SIZES: &str = "1000,10000";

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
    ServicePortName::new(
        NamespacedName::new(format!("ns{}", i % 100), format!("svc{i}")),
        "http",
        Protocol::Tcp,
    )
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

/// Endpoints per Service port (`KP_BENCH_ENDPOINTS`, default 2).
fn endpoints_per_service() -> u32 {
    std::env::var("KP_BENCH_ENDPOINTS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(2)
}

/// `KP_BENCH_TRANSACTION_TEXT_MAX`: the bound of Service chain text per
/// transaction of a split full sync (default: the backend's, 1 MiB; a
/// large value keeps every sync one transaction, to compare).
fn transaction_text_max() -> Option<usize> {
    std::env::var("KP_BENCH_TRANSACTION_TEXT_MAX")
        .ok()
        .map(|text| {
            text.parse()
                .expect("KP_BENCH_TRANSACTION_TEXT_MAX: a number of bytes")
        })
}

fn services(count: u32) -> BTreeMap<ServicePortName, ServicePortState> {
    let per = endpoints_per_service();
    let endpoints = |i: u32| (0..per).map(|k| endpoint(per * i + k)).collect();
    (0..count)
        .map(|i| (name(i), state(i, endpoints(i))))
        .collect()
}

fn options() -> NftablesOptions {
    NftablesOptions {
        local_detector: LocalDetector::ClusterCidr(vec!["10.244.0.0/16".parse().unwrap()]),
        ..NftablesOptions::default()
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

fn time(f: impl FnOnce()) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}

#[derive(Debug)]
struct Row {
    applier: &'static str,
    size: u32,
    cold_ms: f64,
    render_full_ms: f64,
    full_ms: f64,
    full_elsewhere_ms: f64,
    full_foreign_ms: f64,
    render_change_ms: f64,
    change_ms: f64,
    element_floor_ms: f64,
    rule_floor_ms: f64,
    nft_floor_ms: f64,
}

fn measure(size: u32, netlink: bool) -> Row {
    let namespace = Netns::create("bench-nft").expect("the benchmark needs root");
    namespace.run(|| measure_here(size, netlink))
}

fn render_times(
    current: &BTreeMap<ServicePortName, ServicePortState>,
    node: &NodeInfo,
) -> (f64, f64) {
    let mut renderer = Renderer::new(options()).unwrap();
    let none = BTreeSet::new();
    let mut input = RenderInput {
        family: IpFamily::V4,
        full: true,
        reset: false,
        split: true,
        service_ports: current,
        changed_services: &none,
        node,
        node_port_addresses: None,
        now: Instant::now(),
    };
    let mut programmed = Programmed::default();
    let full = (0..RUNS).map(|_| time(|| drop(renderer.render(&input, &programmed))));
    let full = median(full.collect());
    programmed.commit(renderer.render(&input, &programmed).delta);
    let changed = BTreeSet::from([name(7).service]);
    input.full = false;
    input.changed_services = &changed;
    let partial = (0..RUNS).map(|_| time(|| drop(renderer.render(&input, &programmed))));
    (full, median(partial.collect()))
}

fn measure_here(size: u32, netlink: bool) -> Row {
    let node = node();
    let mut current = services(size);
    let (render_full_ms, render_change_ms) = render_times(&current, &node);
    let stale = StaleConntrack::default();
    let no_changes = BTreeSet::new();
    let backend = if netlink {
        NftablesBackend::system(IpFamily::V4, options(), NodePortAddresses::All).unwrap()
    } else {
        NftablesBackend::with_nft(IpFamily::V4, options(), NodePortAddresses::All).unwrap()
    };
    let mut backend = match transaction_text_max() {
        Some(bytes) => backend.with_transaction_text_max(bytes),
        None => backend,
    };
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
    let cold_ms = if std::env::var_os("KP_BENCH_CHUNKED").is_some() {
        // `KP_BENCH_CHUNKED=1`: the cold start as a first transaction of
        // 1,000 service ports and partial ones adding 1,000 more each,
        // each timed (how a transaction's cost grows with the table).
        let all: Vec<_> = current
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut sofar = BTreeMap::new();
        let start = Instant::now();
        for (i, chunk) in all.chunks(1000).enumerate() {
            let mut changed = BTreeSet::new();
            for (k, v) in chunk {
                sofar.insert(k.clone(), v.clone());
                changed.insert(k.service.clone());
            }
            let took = sync(&sofar, i == 0, &changed);
            eprintln!("chunk {i}: {:.1} ms", took.as_secs_f64() * 1000.0);
        }
        start.elapsed().as_secs_f64() * 1000.0
    } else {
        median(vec![sync(&current, true, &no_changes)])
    };
    let full = (0..RUNS).map(|_| sync(&current, true, &no_changes));
    let full_ms = median(full.collect());
    // Another program's commit to a table of its own before each: the
    // proxy's watch sees it leave the proxy's table alone.
    let mut after_elsewhere = Vec::new();
    for _ in 0..RUNS {
        nft("add table ip kp-bench-elsewhere\ndelete table ip kp-bench-elsewhere\n");
        after_elsewhere.push(sync(&current, true, &no_changes));
    }
    let full_elsewhere_ms = median(after_elsewhere);
    // A commit that changed the proxy's table before each: the table may
    // differ from the record, so every rule is written again.
    let mut other = NetlinkApplier::new();
    let mut full_foreign = Vec::new();
    for _ in 0..RUNS {
        other
            .apply(&transaction(
                IpFamily::V4,
                vec![
                    add_chain("kp-bench-foreign"),
                    Command::DeleteChain(Name::Fixed("kp-bench-foreign")),
                ],
            ))
            .unwrap();
        full_foreign.push(sync(&current, true, &no_changes));
    }
    let full_foreign_ms = median(full_foreign);
    let changed = BTreeSet::from([name(7).service]);
    let mut change = Vec::new();
    for run in 0..change_runs() {
        let per = endpoints_per_service();
        let mut moved: Vec<_> = (1..per).map(|k| endpoint(per * 7 + k)).collect();
        moved.push(endpoint(10_000_000 + run));
        current.insert(name(7), state(7, moved));
        change.push(sync(&current, false, &changed));
    }
    let fastest = change.iter().min().copied().unwrap_or_default();
    let slowest = change.iter().max().copied().unwrap_or_default();
    eprintln!(
        "{size} Service ports: one-endpoint changes {:.1}..{:.1} ms over {} runs",
        fastest.as_secs_f64() * 1000.0,
        slowest.as_secs_f64() * 1000.0,
        change.len()
    );
    let (element_floor_ms, rule_floor_ms) = kernel_floors(&mut other);
    let floor = (0..RUNS).map(|_| time(nft_one_line));
    Row {
        applier: if netlink { "netlink" } else { "nft -f" },
        size,
        cold_ms,
        render_full_ms,
        full_ms,
        full_elsewhere_ms,
        full_foreign_ms,
        render_change_ms,
        change_ms: median(change),
        element_floor_ms,
        rule_floor_ms,
        nft_floor_ms: median(floor.collect()),
    }
}

/// How many one-endpoint changes are timed (`KP_BENCH_CHANGE_RUNS`,
/// default 5): more of them give a profiler something to look at.
fn change_runs() -> u32 {
    std::env::var("KP_BENCH_CHANGE_RUNS")
        .ok()
        .map(|runs| runs.parse().expect("KP_BENCH_CHANGE_RUNS: a number"))
        .unwrap_or(RUNS as u32)
}

/// What the kernel alone takes to commit into the table the syncs left,
/// over netlink: one set element added (and removed in a second
/// transaction), and one rule added to a chain nothing jumps to (and the
/// chain removed again). Adding a rule whose expressions the kernel must
/// check against their hooks (a verdict, NAT, a map lookup) makes the
/// commit walk every chain reachable from the base chains; adding an
/// element to a set without verdicts does not. Every partial sync that
/// adds an endpoint chain pays the second figure.
fn kernel_floors(applier: &mut NetlinkApplier) -> (f64, f64) {
    let mut commit = |commands: Vec<Command>| {
        let start = Instant::now();
        applier.apply(&transaction(IpFamily::V4, commands)).unwrap();
        start.elapsed()
    };
    let key = Key::Addr(IpAddr::V4(Ipv4Addr::new(10, 96, 255, 254)));
    let cluster_ips = || Name::Fixed("cluster-ips");
    let mut element = Vec::new();
    let mut rule = Vec::new();
    for _ in 0..RUNS {
        element.push(commit(vec![Command::AddElements {
            set: cluster_ips(),
            elements: vec![SetElement {
                key,
                comment: None,
                verdict: None,
            }],
        }]));
        commit(vec![Command::DeleteElements {
            set: cluster_ips(),
            keys: vec![key],
        }]);
        rule.push(commit(vec![
            add_chain("kp-bench-floor"),
            Command::AddRule(Rule::new(
                "kp-bench-floor",
                vec![Expr::Verdict(Verdict::Accept)],
            )),
        ]));
        commit(vec![Command::DeleteChain(Name::Fixed("kp-bench-floor"))]);
    }
    (median(element), median(rule))
}

fn transaction(family: IpFamily, commands: Vec<Command>) -> Transaction {
    Transaction { family, commands }
}

fn add_chain(name: &'static str) -> Command {
    Command::AddChain {
        name: Name::Fixed(name),
        kind: ChainKind::Regular,
    }
}

/// `nft -f -` with one element change on the table the syncs left.
fn nft_one_line() {
    nft("add element ip kube-proxy cluster-ips { 10.96.255.254 }\ndelete element ip kube-proxy cluster-ips { 10.96.255.254 }\n");
}

/// Runs `nft -f -` with `text`.
fn nft(text: &str) {
    let mut child = std::process::Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
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
    let appliers = std::env::var("KP_BENCH_APPLIERS").unwrap_or_else(|_| "netlink,nft".to_owned());
    let mut rows = Vec::new();
    for &size in &sizes {
        for applier in appliers.split(',') {
            eprintln!("measuring {size} service ports with {applier}");
            rows.push(measure(size, applier.trim() == "netlink"));
        }
    }
    println!("endpoints per Service port: {}", endpoints_per_service());
    println!("| applier | Service ports | cold start (ms) | full render (ms) | full sync, table untouched (ms) | full sync after a commit elsewhere (ms) | full sync after a change to its table (ms) | change render (ms) | one-endpoint change sync (ms) | kernel: one element (ms) | kernel: one checked rule (ms) | `nft -f` one-line floor (ms) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} | {:.1} | {:.1} |",
            row.applier,
            row.size,
            row.cold_ms,
            row.render_full_ms,
            row.full_ms,
            row.full_elsewhere_ms,
            row.full_foreign_ms,
            row.render_change_ms,
            row.change_ms,
            row.element_floor_ms,
            row.rule_floor_ms,
            row.nft_floor_ms
        );
    }
    println!();
    println!("medians of {RUNS} runs (cold start: one run)");
    match peak_rss_kib() {
        Some(kib) => println!(
            "peak RSS of this process (VmHWM): {:.1} MiB",
            kib as f64 / 1024.0
        ),
        None => println!("peak RSS (VmHWM): unavailable"),
    }
}
