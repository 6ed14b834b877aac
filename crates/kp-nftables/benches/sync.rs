//! Sync time of the nftables backend against the real kernel, in both
//! table layouts (`KP_BENCH_LAYOUTS=chains,data`, default both: upstream's
//! chains and the data layout of issue 26) and committing over netlink or
//! with `nft -f -` (`KP_BENCH_APPLIERS=netlink,nft`, default both).
//!
//! For each size (Service ports × 2 endpoints, or `KP_BENCH_ENDPOINTS`;
//! one TCP port each) and applier, each layout gets a network namespace of
//! its own that this program creates, enters and removes, and the layouts
//! take turns at every run (the first layout first in even runs, last in
//! odd ones), so that a change in the machine's load falls on both:
//! - the cold start: a new backend's first sync into a namespace without
//!   the table (the table of the previous run is deleted first, and the
//!   kernel given time to free it);
//! - the full sync of a table nobody else touched, after another program
//!   committed to a table of its own, and after a commit that changed the
//!   proxy's table (the repair, which rewrites every rule);
//! - one-endpoint changes, each a partial sync of one Service: an endpoint
//!   replaced (the count stays), a readiness flip (one endpoint turns not
//!   ready, or ready again: the count changes), an endpoint added, and the
//!   same endpoint removed again;
//! - the kernel's own floor for a commit (see `kernel_floors`), the time
//!   `nft -f` needs for a one-line transaction on the same table, and the
//!   render time of a full and of a one-Service render.
//!
//! Each sync is reported with the time of its commits alone: the backend's
//! applier is wrapped so that every commit call (`Applier::apply`, and
//! `apply_at` for the full sync of an untouched table) is timed, by the
//! wall clock and by the calling thread's CPU clock. Over netlink a commit
//! call is the encoding of the transaction, the batch (the kernel applies
//! and commits it inside the send) and the read-back of the table and the
//! ruleset generation; the thread's CPU time in it leaves out the time the
//! thread waited for a CPU, which on a loaded machine is much of the wall
//! time. With `nft -f` a commit call is the nft process, whose CPU time is
//! not the thread's (the CPU column is then near zero).
//!
//! Medians of 5 runs, 11 for the one-endpoint changes
//! (`KP_BENCH_CHANGE_RUNS=N` for N), with the minimum and maximum; the load
//! average before each block. Needs root and nft. Run with `cargo bench -p
//! kp-nftables --bench sync`, or for example `KP_BENCH_SIZES=5000
//! KP_BENCH_ENDPOINTS=50 KP_BENCH_APPLIERS=netlink cargo bench -p
//! kp-nftables --bench sync`. The peak RSS printed is the process's
//! (VmHWM, reset at the start of each size and applier): with both layouts
//! in one process it holds both backends, so run one size, applier and
//! layout alone (`KP_BENCH_LAYOUTS=data`) for one layout's figure. It is
//! read before the render times, whose full renders hold the whole
//! transaction. `KP_BENCH_TRANSACTION_TEXT_MAX=BYTES` sets the bound at
//! which a full sync is split into several transactions.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kp_model::{
    Endpoint, IpFamily, NamespacedName, NodeInfo, Protocol, ServicePort, ServicePortName,
};
use kp_nftables::generation::Watch;
use kp_nftables::model::{ChainKind, Command, Expr, Key, Name, Rule, SetElement, Verdict};
use kp_nftables::{
    Applier, ApplyError, Layout, NetlinkApplier, NftApplier, NftablesBackend, NftablesOptions,
    Programmed, RenderInput, Renderer, Transaction,
};
use kp_node::{LocalDetector, NodePortAddresses};
use kp_sync::{Backend, ServicePortState, StaleConntrack, SyncRequest};
use kp_testkit::netns::Netns;
use nix::time::{clock_gettime, ClockId};

const RUNS: usize = 5;
const CHANGE_RUNS: usize = 11;
const DEFAULT_SIZES: &str = "1000,10000";
/// The Services whose endpoints the one-endpoint changes touch: one per
/// kind of change, so each starts from the Service's first state.
const REPLACED: u32 = 7;
const FLIPPED: u32 = 8;
const GROWN: u32 = 9;

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

/// Times the commit calls of the applier it wraps into a shared log.
struct TimedApplier {
    inner: Box<dyn Applier>,
    log: Arc<Mutex<CommitLog>>,
}

/// What the commit calls since the last reset took.
#[derive(Debug, Default, Clone, Copy)]
struct CommitLog {
    wall: Duration,
    cpu: Duration,
    commits: u32,
}

/// One timed sync (or commit, for the floors).
#[derive(Debug, Clone, Copy)]
struct Sample {
    sync: Duration,
    commit: CommitLog,
}

/// A layout's namespace and backend during one size and applier.
struct Lane {
    layout: Layout,
    namespace: Netns,
    backend: Option<NftablesBackend>,
    log: Arc<Mutex<CommitLog>>,
    /// Another program's commits to the proxy's table (the repair) and
    /// the kernel floors; opened in the lane's namespace.
    other: NetlinkApplier,
    samples: BTreeMap<Measure, Vec<Sample>>,
    render_full: Vec<Duration>,
    render_change: Vec<Duration>,
}

/// What a row of the report measured, in the report's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Measure {
    Cold,
    FullUntouched,
    FullElsewhere,
    Repair,
    Replaced,
    Flipped,
    Added,
    Removed,
    ElementFloor,
    RuleFloor,
    NftFloor,
}

impl Measure {
    const ALL: [Measure; 11] = [
        Measure::Cold,
        Measure::FullUntouched,
        Measure::FullElsewhere,
        Measure::Repair,
        Measure::Replaced,
        Measure::Flipped,
        Measure::Added,
        Measure::Removed,
        Measure::ElementFloor,
        Measure::RuleFloor,
        Measure::NftFloor,
    ];

    fn label(self) -> &'static str {
        match self {
            Measure::Cold => "cold start (first sync, empty namespace)",
            Measure::FullUntouched => "full sync, table untouched",
            Measure::FullElsewhere => "full sync after a commit to another table",
            Measure::Repair => "repair: full sync after a change to its table",
            Measure::Replaced => "one endpoint replaced (count kept), partial",
            Measure::Flipped => "readiness flip (count changes), partial",
            Measure::Added => "one endpoint added, partial",
            Measure::Removed => "the same endpoint removed, partial",
            Measure::ElementFloor => "kernel floor: one element",
            Measure::RuleFloor => "kernel floor: one checked rule",
            Measure::NftFloor => "`nft -f` one-line transaction",
        }
    }
}

impl Applier for TimedApplier {
    fn apply(&mut self, transaction: &Transaction) -> Result<(), ApplyError> {
        let inner = &mut self.inner;
        timed_commit(&self.log, || inner.apply(transaction))
    }

    fn generation(&mut self) -> Option<Result<u32, ApplyError>> {
        self.inner.generation()
    }

    fn watch(&mut self) -> Option<Box<dyn Watch>> {
        self.inner.watch()
    }

    fn apply_at(&mut self, transaction: &Transaction, generation: u32) -> Result<(), ApplyError> {
        let inner = &mut self.inner;
        timed_commit(&self.log, || inner.apply_at(transaction, generation))
    }
}

/// The calling thread's CPU time (user and system).
fn thread_cpu() -> Duration {
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(Duration::from)
        .expect("the thread CPU clock")
}

fn timed_commit<T>(log: &Mutex<CommitLog>, commit: impl FnOnce() -> T) -> T {
    let (cpu, start) = (thread_cpu(), Instant::now());
    let result = commit();
    let (wall, cpu) = (start.elapsed(), thread_cpu() - cpu);
    let mut log = log.lock().unwrap();
    log.wall += wall;
    log.cpu += cpu;
    log.commits += 1;
    result
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// `median (min–max)` in milliseconds, or `–` without samples.
fn spread(samples: &[Duration]) -> String {
    let (Some(min), Some(max)) = (samples.iter().min(), samples.iter().max()) else {
        return "–".to_owned();
    };
    let mid = median(samples.to_vec());
    let digits = if ms(mid) < 10.0 { 2 } else { 1 };
    format!(
        "{:.*} ({:.*}–{:.*})",
        digits,
        ms(mid),
        digits,
        ms(*min),
        digits,
        ms(*max)
    )
}

fn time(f: impl FnOnce()) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}

fn layout_name(layout: Layout) -> &'static str {
    match layout {
        Layout::Chains => "chains",
        Layout::Data => "data",
    }
}

/// The layouts of `KP_BENCH_LAYOUTS` (default `chains,data`).
fn layouts() -> Vec<Layout> {
    let text = std::env::var("KP_BENCH_LAYOUTS").unwrap_or_else(|_| "chains,data".to_owned());
    text.split(',')
        .map(|word| match word.trim() {
            "chains" => Layout::Chains,
            "data" => Layout::Data,
            other => panic!("KP_BENCH_LAYOUTS: {other:?} is not a layout; valid: chains, data"),
        })
        .collect()
}

/// How many one-endpoint changes of each kind are timed
/// (`KP_BENCH_CHANGE_RUNS`, default 11).
fn change_runs() -> usize {
    std::env::var("KP_BENCH_CHANGE_RUNS")
        .ok()
        .map(|runs| runs.parse().expect("KP_BENCH_CHANGE_RUNS: a number"))
        .unwrap_or(CHANGE_RUNS)
}

/// The lanes' indices in the order of run `run`: forward in even runs,
/// backward in odd ones.
fn turns(run: usize, lanes: usize) -> Vec<usize> {
    if run % 2 == 0 {
        (0..lanes).collect()
    } else {
        (0..lanes).rev().collect()
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unavailable".to_owned())
}

impl Lane {
    fn new(layout: Layout) -> Self {
        Self {
            layout,
            namespace: Netns::create(&format!("bench-{}", layout_name(layout)))
                .expect("the benchmark needs root"),
            backend: None,
            log: Arc::default(),
            other: NetlinkApplier::new(),
            samples: BTreeMap::new(),
            render_full: Vec::new(),
            render_change: Vec::new(),
        }
    }

    fn new_backend(&self, netlink: bool) -> NftablesBackend {
        let inner: Box<dyn Applier> = if netlink {
            Box::new(NetlinkApplier::new())
        } else {
            Box::new(NftApplier::new())
        };
        let applier = Box::new(TimedApplier {
            inner,
            log: Arc::clone(&self.log),
        });
        let backend =
            NftablesBackend::new(IpFamily::V4, options(), NodePortAddresses::All, applier)
                .unwrap()
                .with_layout(self.layout);
        match transaction_text_max() {
            Some(bytes) => backend.with_transaction_text_max(bytes),
            None => backend,
        }
    }

    /// One sync of `services`, timed with its commits, recorded as
    /// `measure`.
    fn sync(
        &mut self,
        measure: Measure,
        services: &BTreeMap<ServicePortName, ServicePortState>,
        full: bool,
        changed: &BTreeSet<NamespacedName>,
    ) {
        let Self {
            namespace,
            backend,
            log,
            ..
        } = self;
        let backend = backend.as_mut().expect("a backend after the cold start");
        let node = node();
        let stale = StaleConntrack::default();
        let sample = namespace.run(|| {
            let request = SyncRequest {
                family: IpFamily::V4,
                full,
                service_ports: services,
                changed_services: changed,
                node: &node,
                stale_conntrack: &stale,
            };
            *log.lock().unwrap() = CommitLog::default();
            let sync = time(|| {
                backend.sync(&request).unwrap();
            });
            Sample {
                sync,
                commit: *log.lock().unwrap(),
            }
        });
        self.samples.entry(measure).or_default().push(sample);
    }

    /// A new backend's first sync into a namespace without the table.
    fn cold_start(
        &mut self,
        services: &BTreeMap<ServicePortName, ServicePortState>,
        netlink: bool,
    ) {
        // The previous run's backend and table go first; the kernel frees
        // a deleted table's objects after the commit, so it gets time.
        self.backend = None;
        let other = &mut self.other;
        let deleted = self
            .namespace
            .run(|| time(|| kp_nftables::cleanup_with(other).unwrap()));
        std::thread::sleep(Duration::from_millis(500) + deleted * 2);
        self.backend = Some(self.new_backend(netlink));
        self.sync(Measure::Cold, services, true, &BTreeSet::new());
    }

    /// The full sync after another program's commit to a table of its own.
    fn full_after_elsewhere(&mut self, services: &BTreeMap<ServicePortName, ServicePortState>) {
        self.namespace.run(|| {
            nft("add table ip kp-bench-elsewhere\ndelete table ip kp-bench-elsewhere\n");
        });
        self.sync(Measure::FullElsewhere, services, true, &BTreeSet::new());
    }

    /// The full sync after a commit that changed the proxy's table: a
    /// chain added to it and deleted again.
    fn repair(&mut self, services: &BTreeMap<ServicePortName, ServicePortState>) {
        let other = &mut self.other;
        self.namespace.run(|| {
            other
                .apply(&transaction(
                    IpFamily::V4,
                    vec![
                        add_chain("kp-bench-foreign"),
                        Command::DeleteChain(Name::Fixed("kp-bench-foreign")),
                    ],
                ))
                .unwrap();
        });
        self.sync(Measure::Repair, services, true, &BTreeSet::new());
    }

    fn floors(&mut self) {
        let other = &mut self.other;
        let (element, rule, nft_floor) = self.namespace.run(|| {
            let (element, rule) = kernel_floors(other);
            let nft_floor: Vec<Duration> = (0..RUNS).map(|_| time(nft_one_line)).collect();
            (element, rule, nft_floor)
        });
        for (measure, samples) in [
            (Measure::ElementFloor, element),
            (Measure::RuleFloor, rule),
            (Measure::NftFloor, nft_floor),
        ] {
            let samples = samples.into_iter().map(|sync| Sample {
                sync,
                commit: CommitLog::default(),
            });
            self.samples.entry(measure).or_default().extend(samples);
        }
    }

    fn render_times(&mut self, current: &BTreeMap<ServicePortName, ServicePortState>) {
        let node = node();
        let mut renderer = Renderer::new(options()).unwrap().with_layout(self.layout);
        let none = BTreeSet::new();
        let mut input = RenderInput {
            family: IpFamily::V4,
            full: true,
            reset: false,
            split: true,
            service_ports: current,
            changed_services: &none,
            prune: false,
            node: &node,
            node_port_addresses: None,
            now: Instant::now(),
        };
        let mut programmed = Programmed::default();
        self.render_full = (0..RUNS)
            .map(|_| time(|| drop(renderer.render(&input, &programmed))))
            .collect();
        programmed.commit(renderer.render(&input, &programmed).delta);
        let changed = BTreeSet::from([name(REPLACED).service]);
        input.full = false;
        input.changed_services = &changed;
        self.render_change = (0..RUNS)
            .map(|_| time(|| drop(renderer.render(&input, &programmed))))
            .collect();
    }

    /// The cells of `measure`: sync, commit wall, commit CPU, commits.
    fn cells(&self, measure: Measure) -> [String; 4] {
        let samples = self.samples.get(&measure).map_or(&[][..], Vec::as_slice);
        let pick = |f: fn(&Sample) -> Duration| samples.iter().map(f).collect::<Vec<_>>();
        if matches!(
            measure,
            Measure::ElementFloor | Measure::RuleFloor | Measure::NftFloor
        ) {
            return [
                spread(&pick(|s| s.sync)),
                String::new(),
                String::new(),
                String::new(),
            ];
        }
        let mut commits: Vec<u32> = samples.iter().map(|s| s.commit.commits).collect();
        commits.sort_unstable();
        let commits = match (commits.first(), commits.last()) {
            (Some(a), Some(b)) if a == b => a.to_string(),
            (Some(a), Some(b)) => format!("{a}–{b}"),
            _ => String::new(),
        };
        [
            spread(&pick(|s| s.sync)),
            spread(&pick(|s| s.commit.wall)),
            spread(&pick(|s| s.commit.cpu)),
            commits,
        ]
    }
}

/// The endpoints of Service `i` as [`services`] made them.
fn first_endpoints(i: u32) -> Vec<Arc<Endpoint>> {
    let per = endpoints_per_service();
    (0..per).map(|k| endpoint(per * i + k)).collect()
}

/// `endpoint` turned not ready (and not serving), or ready again.
fn with_readiness(endpoint: &Endpoint, ready: bool) -> Arc<Endpoint> {
    Arc::new(Endpoint {
        ready,
        serving: ready,
        ..endpoint.clone()
    })
}

/// Picks a lane's render samples.
type RenderPick = fn(&Lane) -> &[Duration];

struct Report {
    size: u32,
    applier: &'static str,
    loads: Vec<(&'static str, String)>,
    peak_rss_syncs_kib: Option<u64>,
    peak_rss_kib: Option<u64>,
    lanes: Vec<Lane>,
}

fn measure(size: u32, netlink: bool, layouts: &[Layout]) -> Report {
    reset_peak_rss();
    let mut loads = vec![("start", load_average())];
    let mut lanes: Vec<Lane> = layouts.iter().map(|&layout| Lane::new(layout)).collect();
    let count = lanes.len();
    let mut current = services(size);
    let no_changes = BTreeSet::new();
    for run in 0..RUNS {
        for i in turns(run, count) {
            eprintln!(
                "{size} × {}: cold start {run} of {}",
                endpoints_per_service(),
                layout_name(lanes[i].layout)
            );
            lanes[i].cold_start(&current, netlink);
        }
    }
    loads.push(("after the cold starts", load_average()));
    for run in 0..RUNS {
        for i in turns(run, count) {
            lanes[i].sync(Measure::FullUntouched, &current, true, &no_changes);
        }
    }
    for run in 0..RUNS {
        for i in turns(run, count) {
            lanes[i].full_after_elsewhere(&current);
        }
    }
    loads.push(("after the untouched full syncs", load_average()));
    for run in 0..RUNS {
        for i in turns(run, count) {
            eprintln!("{size}: repair {run} of {}", layout_name(lanes[i].layout));
            lanes[i].repair(&current);
        }
    }
    loads.push(("after the repairs", load_average()));
    let sync_all = |run: usize,
                    measure: Measure,
                    lanes: &mut Vec<Lane>,
                    current: &BTreeMap<ServicePortName, ServicePortState>,
                    changed: u32| {
        let changed = BTreeSet::from([name(changed).service]);
        for i in turns(run, count) {
            lanes[i].sync(measure, current, false, &changed);
        }
    };
    for run in 0..change_runs() {
        // The Service's first endpoint, or the previous run's replacement,
        // gives way to a new one in the same place.
        let mut moved = first_endpoints(REPLACED);
        moved[0] = endpoint(10_000_000 + run as u32);
        current.insert(name(REPLACED), state(REPLACED, moved));
        sync_all(run, Measure::Replaced, &mut lanes, &current, REPLACED);
        // The last endpoint turns not ready in even runs, ready again in
        // odd ones: the count of endpoints in use changes each time.
        let mut flipped = first_endpoints(FLIPPED);
        let last = flipped.len() - 1;
        flipped[last] = with_readiness(&flipped[last], run % 2 == 1);
        current.insert(name(FLIPPED), state(FLIPPED, flipped));
        sync_all(run, Measure::Flipped, &mut lanes, &current, FLIPPED);
        // One endpoint more, then the same one gone again.
        let mut grown = first_endpoints(GROWN);
        grown.push(endpoint(11_000_000 + run as u32));
        current.insert(name(GROWN), state(GROWN, grown));
        sync_all(run, Measure::Added, &mut lanes, &current, GROWN);
        current.insert(name(GROWN), state(GROWN, first_endpoints(GROWN)));
        sync_all(run, Measure::Removed, &mut lanes, &current, GROWN);
    }
    loads.push(("after the one-endpoint changes", load_average()));
    for lane in &mut lanes {
        lane.floors();
    }
    let peak_rss_syncs_kib = peak_rss_kib();
    for lane in &mut lanes {
        lane.backend = None;
        lane.render_times(&current);
    }
    loads.push(("end", load_average()));
    Report {
        size,
        applier: if netlink { "netlink" } else { "nft -f" },
        loads,
        peak_rss_syncs_kib,
        peak_rss_kib: peak_rss_kib(),
        lanes,
    }
}

fn print(report: &Report, change_runs: usize) {
    let per = endpoints_per_service();
    println!();
    println!(
        "### {} Service ports × {per} endpoints, {} (component)",
        report.size, report.applier
    );
    println!();
    let mut header = String::from("| measurement | runs |");
    let mut rule = String::from("|---|---:|");
    for lane in &report.lanes {
        let layout = layout_name(lane.layout);
        header.push_str(&format!(
            " {layout}: sync (ms) | {layout}: commit calls, wall (ms) | {layout}: commit calls, thread CPU (ms) | {layout}: commits |"
        ));
        rule.push_str("---:|---:|---:|---:|");
    }
    println!("{header}");
    println!("{rule}");
    for measure in Measure::ALL {
        let runs = match measure {
            Measure::Replaced | Measure::Flipped | Measure::Added | Measure::Removed => change_runs,
            _ => RUNS,
        };
        let mut line = format!("| {} | {runs} |", measure.label());
        for lane in &report.lanes {
            for cell in lane.cells(measure) {
                line.push_str(&format!(" {cell} |"));
            }
        }
        println!("{line}");
    }
    let renders: [(&str, RenderPick); 2] = [
        ("full render", |lane| &lane.render_full),
        ("one-Service render", |lane| &lane.render_change),
    ];
    for (label, pick) in renders {
        let mut line = format!("| {label} | {RUNS} |");
        for lane in &report.lanes {
            line.push_str(&format!(" {} | | | |", spread(pick(lane))));
        }
        println!("{line}");
    }
    println!();
    let loads: Vec<String> = report
        .loads
        .iter()
        .map(|(when, load)| format!("{when} {load}"))
        .collect();
    println!("load average (1, 5, 15 min): {}", loads.join("; "));
    let mib = |kib: Option<u64>| {
        kib.map_or("unavailable".to_owned(), |k| {
            format!("{:.1} MiB", k as f64 / 1024.0)
        })
    };
    println!(
        "peak RSS of this process (VmHWM) through the syncs: {}; with the render times: {}",
        mib(report.peak_rss_syncs_kib),
        mib(report.peak_rss_kib)
    );
}

/// Resets the process's VmHWM to its current RSS (`/proc/self/clear_refs`,
/// value 5), so the peak read later is that of what follows.
fn reset_peak_rss() {
    if let Err(error) = std::fs::write("/proc/self/clear_refs", "5") {
        eprintln!("cannot reset the peak RSS (/proc/self/clear_refs): {error}");
    }
}

/// What the kernel alone takes to commit into the table the syncs left,
/// over netlink: one set element added (and removed in a second
/// transaction), and one rule added to a chain nothing jumps to (and the
/// chain removed again). Adding a rule whose expressions the kernel must
/// check against their hooks (a verdict, NAT, a map lookup) makes the
/// commit walk every chain reachable from the base chains; adding an
/// element to a set without verdicts does not. Every partial sync that
/// adds a rule with a verdict, NAT or lookup pays the second figure.
fn kernel_floors(applier: &mut NetlinkApplier) -> (Vec<Duration>, Vec<Duration>) {
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
    (element, rule)
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
    let layouts = layouts();
    let change_runs = change_runs();
    let mut reports = Vec::new();
    for &size in &sizes {
        for applier in appliers.split(',') {
            eprintln!("measuring {size} service ports with {applier}");
            reports.push(measure(size, applier.trim() == "netlink", &layouts));
        }
    }
    let layout_names: Vec<&str> = layouts.iter().map(|&l| layout_name(l)).collect();
    println!(
        "endpoints per Service port: {}; layouts: {}; cold start, full syncs and floors: {RUNS} runs, one-endpoint changes: {change_runs}; median (min–max)",
        endpoints_per_service(),
        layout_names.join(", ")
    );
    for report in &reports {
        print(report, change_runs);
    }
}
