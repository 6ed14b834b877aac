//! Soak: the `kube-proxy` binary through 100,000 syncs of endpoint churn
//! against kp-testkit's API server, programming real iptables-legacy in a
//! network namespace this program creates and removes. Its memory, its open
//! files and the number of our chains must stay flat.
//!
//! The server holds `KP_SOAK_SERVICES` Services × 2 endpoints (one TCP
//! port each; ClusterIPs from 10.96.0.10, endpoints on node-2 in
//! 10.244.0.0/16). The churn is closed-loop: one update replaces the second
//! endpoint of one Service's EndpointSlice (round robin over the Services,
//! cycling each through a pool of [`POOL`] addresses, so every change makes
//! one new KUBE-SEP chain and one stale and the steady state stays the
//! same), then waits until the proxy's
//! `kubeproxy_sync_proxy_rules_duration_seconds_count` has gone up before
//! the next update. So the proxy does one sync per update; the driver polls
//! its metrics every [`POLL`].
//!
//! Every 1 % of the syncs a sample records: syncs done, time, the proxy's
//! VmRSS, RssAnon and VmHWM (`/proc/PID/status`), its open fds
//! (`/proc/PID/fd`), its CPU time and that of its children
//! (`iptables-restore`), our chains in the nat and filter tables
//! (`iptables-legacy-save` in the namespace), and the RSS and CPU time of
//! this process (the test API server and the driver; the server keeps the
//! last 10,000 changes for its watches, as a real watch cache keeps a
//! bounded window).
//!
//! Verdict: after the warm-up (the first 10 % of the syncs), the proxy's
//! VmRSS and the number of `KUBE-` chains stay within ±5 % of their median;
//! at the end `/healthz` answers 200 and, after at most one more sync, the
//! nat table holds exactly the KUBE-SVC and KUBE-SEP chains of the current
//! endpoints. It panics when one of these fails, after printing the samples
//! and the summary.
//!
//! kubelet's `KUBE-IPTABLES-HINT` chain in the namespace's legacy mangle
//! table makes the binary pick iptables-legacy. Its INFO log goes to a file;
//! the summary counts its lines and shows its warnings and errors.
//!
//! Needs root. `cargo bench -p kube-proxy --bench soak`; environment:
//! `KP_SOAK_SYNCS` (default 100000), `KP_SOAK_SERVICES` (default 100),
//! `KP_SOAK_LOG=FILE` keeps the binary's log (default: a temporary file).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_testkit::apiserver::TestApiServer;
use kp_testkit::builders::{endpoint_slice, node, service};
use kp_testkit::http;
use kp_testkit::netns::{require_root, require_tool, Netns, NsChild};
use kp_testkit::plan::{NODE_IP, NODE_NAME, OTHER_NODE_NAME, POD_CIDR, SERVICE_CIDR};

/// Addresses each Service's second endpoint cycles through.
const POOL: usize = 4;
/// The endpoints' (target) port.
const TARGET_PORT: i32 = 8080;
/// How often the driver asks the proxy whether it has synced.
const POLL: Duration = Duration::from_millis(2);
/// Longest wait for one sync before the soak fails.
const SYNC_TIMEOUT: Duration = Duration::from_secs(60);
/// Share of the syncs that is warm-up, left out of the verdict.
const WARM_UP: f64 = 0.10;
/// Allowed deviation from the median after the warm-up.
const TOLERANCE: f64 = 0.05;
/// Samples taken over the run (at least).
const SAMPLES: u64 = 100;
/// Clock ticks per second of `/proc/PID/stat` (USER_HZ, 100 on Linux).
const TICKS_PER_SEC: f64 = 100.0;

const SYNC_COUNT: &str = "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}";
const FULL_SYNC_COUNT: &str =
    "kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}";
const PARTIAL_SYNC_COUNT: &str =
    "kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}";
const RESTORE_FAILURES: &str =
    "kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family=\"IPv4\"}";

/// What the environment asks for.
struct Settings {
    services: usize,
    syncs: u64,
    log: PathBuf,
}

/// One look at the proxy (and this process) during the soak.
struct Sample {
    syncs: u64,
    elapsed: Duration,
    rss_kib: u64,
    anon_kib: u64,
    hwm_kib: u64,
    fds: usize,
    nat_chains: usize,
    filter_chains: usize,
    /// The proxy's own user and system time.
    proxy_cpu_s: f64,
    /// That of its waited-for children (`iptables-restore`).
    children_cpu_s: f64,
    server_rss_kib: u64,
    server_cpu_s: f64,
}

/// Median, extremes and the largest deviation from the median of one
/// figure over the samples after the warm-up.
struct Spread {
    median: f64,
    min: f64,
    max: f64,
    deviation: f64,
}

/// The addresses of the workload, from kp-testkit's plan.
struct Workload {
    services: usize,
    /// Pool index of each Service's second endpoint.
    current: Vec<usize>,
}

impl Workload {
    fn new(services: usize) -> Self {
        // Fixed endpoints from 10.244.16.0, pools from 10.244.128.0: both
        // must stay inside the pod range.
        assert!(
            services <= 0x7000 && services * POOL <= 0x7f00,
            "KP_SOAK_SERVICES={services} does not fit the address plan"
        );
        Self {
            services,
            current: vec![0; services],
        }
    }

    fn namespace(i: usize) -> String {
        format!("ns{}", i % 100)
    }

    fn name(i: usize) -> String {
        format!("svc{i}")
    }

    fn cluster_ip(i: usize) -> Ipv4Addr {
        offset(SERVICE_CIDR.network(), 10 + i)
    }

    fn fixed_endpoint(i: usize) -> Ipv4Addr {
        offset(POD_CIDR.network(), 0x1000 + i)
    }

    fn pool_endpoint(i: usize, p: usize) -> Ipv4Addr {
        offset(POD_CIDR.network(), 0x8000 + i * POOL + p)
    }

    fn slice(&self, i: usize) -> EndpointSlice {
        let second = Self::pool_endpoint(i, self.current[i]);
        endpoint_slice(
            &Self::namespace(i),
            &format!("svc{i}-1"),
            &Self::name(i),
            |e| {
                e.address_type("IPv4")
                    .port("http", TARGET_PORT, "TCP")
                    .endpoint(Self::fixed_endpoint(i).to_string(), |ep| {
                        ep.ready(true).node(OTHER_NODE_NAME)
                    })
                    .endpoint(second.to_string(), |ep| {
                        ep.ready(true).node(OTHER_NODE_NAME)
                    })
            },
        )
    }

    /// The Node and every Service with its EndpointSlice.
    fn populate(&self, server: &TestApiServer) {
        server.create(node(NODE_NAME, |n| n.internal_ip(NODE_IP.to_string())));
        for i in 0..self.services {
            server.create(service(&Self::namespace(i), &Self::name(i), |s| {
                s.cluster_ip(Self::cluster_ip(i).to_string())
                    .port("http", 80, "TCP")
                    .target_port(TARGET_PORT)
            }));
            server.create(self.slice(i));
        }
    }

    /// Update `k`: the next Service in turn gets the next address of its
    /// pool as its second endpoint.
    fn churn(&mut self, server: &TestApiServer, k: u64) {
        let i = (k % self.services as u64) as usize;
        self.current[i] = (self.current[i] + 1) % POOL;
        server.update(self.slice(i));
    }

    /// `IP:PORT` of every endpoint now, as the DNAT rules name them.
    fn destinations(&self) -> BTreeSet<String> {
        (0..self.services)
            .flat_map(|i| {
                [
                    Self::fixed_endpoint(i),
                    Self::pool_endpoint(i, self.current[i]),
                ]
            })
            .map(|ip| format!("{ip}:{TARGET_PORT}"))
            .collect()
    }
}

impl Spread {
    fn of(values: &[f64]) -> Self {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        let (min, max) = (sorted[0], sorted[sorted.len() - 1]);
        let deviation = if median == 0.0 {
            0.0
        } else {
            (max - median).max(median - min) / median
        };
        Self {
            median,
            min,
            max,
            deviation,
        }
    }

    fn flat(&self) -> bool {
        self.deviation <= TOLERANCE
    }
}

fn offset(base: Ipv4Addr, n: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(base) + u32::try_from(n).unwrap())
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |value| {
        value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a number"))
    })
}

/// `GET /metrics` of the binary's metrics server, if it answers.
fn metrics() -> Option<String> {
    let reply = http::get(("127.0.0.1", 10249), "/metrics").ok()?;
    (reply.code == 200).then_some(reply.body)
}

fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// The proxy's sync counter, if its metrics server answers.
fn sync_count() -> Option<u64> {
    metric(&metrics()?, SYNC_COUNT).map(|count| count as u64)
}

/// A `kB` field of `/proc/PID/status`.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// User and system time of `pid`, and of its waited-for children, in s.
fn cpu_seconds(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name, which may hold spaces: state is
    // field 3, utime 14, stime 15, cutime 16, cstime 17.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let seconds = |range: std::ops::Range<usize>| {
        let ticks: u64 = fields[range]
            .iter()
            .map(|f| f.parse::<u64>().unwrap())
            .sum();
        ticks as f64 / TICKS_PER_SEC
    };
    (seconds(11..13), seconds(13..15))
}

/// `iptables-legacy-save -t TABLE` (the calling thread is in the node
/// namespace).
fn save(table: &str) -> String {
    let out = Command::new("iptables-legacy-save")
        .args(["-t", table])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "iptables-legacy-save -t {table} failed"
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Our chains (`KUBE-…`) declared in a saved table whose names start with
/// `prefix`.
fn chains<'a>(saved: &'a str, prefix: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    saved
        .lines()
        .filter_map(|line| line.strip_prefix(':'))
        .filter_map(|line| line.split_whitespace().next())
        .filter(move |chain| chain.starts_with(prefix))
}

fn take_sample(pid: u32, syncs: u64, elapsed: Duration) -> Sample {
    let (proxy_cpu_s, children_cpu_s) = cpu_seconds(pid);
    Sample {
        syncs,
        elapsed,
        rss_kib: status_kib(pid, "VmRSS:"),
        anon_kib: status_kib(pid, "RssAnon:"),
        hwm_kib: status_kib(pid, "VmHWM:"),
        fds: open_fds(pid),
        nat_chains: chains(&save("nat"), "KUBE-").count(),
        filter_chains: chains(&save("filter"), "KUBE-").count(),
        proxy_cpu_s,
        children_cpu_s,
        server_rss_kib: status_kib(std::process::id(), "VmRSS:"),
        server_cpu_s: cpu_seconds(std::process::id()).0,
    }
}

/// What is wrong with the nat table, if it does not hold exactly the
/// chains of `workload`'s current endpoints.
fn nat_mismatch(workload: &Workload) -> Option<String> {
    let nat = save("nat");
    let services = chains(&nat, "KUBE-SVC-").count();
    let endpoints: BTreeSet<&str> = chains(&nat, "KUBE-SEP-").collect();
    let destinations: BTreeSet<String> = nat
        .lines()
        .filter(|line| line.starts_with("-A KUBE-SEP-"))
        .filter_map(|line| line.split_once("--to-destination "))
        .map(|(_, to)| to.split_whitespace().next().unwrap().to_owned())
        .collect();
    let expected = workload.destinations();
    let mut problems = Vec::new();
    if services != workload.services {
        problems.push(format!(
            "{services} KUBE-SVC chains, expected {}",
            workload.services
        ));
    }
    if endpoints.len() != expected.len() {
        problems.push(format!(
            "{} KUBE-SEP chains, expected {}",
            endpoints.len(),
            expected.len()
        ));
    }
    if destinations != expected {
        let stale: Vec<_> = destinations.difference(&expected).take(5).collect();
        let missing: Vec<_> = expected.difference(&destinations).take(5).collect();
        problems.push(format!(
            "DNAT destinations differ: stale {stale:?}…, missing {missing:?}…"
        ));
    }
    (!problems.is_empty()).then(|| problems.join("; "))
}

/// Waits until the sync counter is above `above`; returns it and how
/// many times the metrics were read.
#[track_caller]
fn wait_for_sync(above: u64, log: &Path) -> (u64, u64) {
    let deadline = Instant::now() + SYNC_TIMEOUT;
    let mut polls = 0;
    loop {
        polls += 1;
        if let Some(count) = sync_count().filter(|count| *count > above) {
            return (count, polls);
        }
        assert!(
            Instant::now() < deadline,
            "no sync after {SYNC_TIMEOUT:?} (counter at {above}); the log's end:\n{}",
            log_tail(log)
        );
        std::thread::sleep(POLL);
    }
}

fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// What the soak saw, for the verdict.
struct Outcome {
    samples: Vec<Sample>,
    syncs: u64,
    updates: u64,
    elapsed: Duration,
    full_syncs: f64,
    partial_syncs: f64,
    restore_failures: f64,
    polls: u64,
    metrics_bytes: usize,
    healthz: u16,
    settle: Result<Duration, String>,
}

/// The soak itself; runs on a blocking thread inside the node namespace.
fn soak(server: &TestApiServer, mut workload: Workload, settings: &Settings, pid: u32) -> Outcome {
    let log = settings.log.as_path();
    let (start_count, _) = wait_for_sync(0, log);
    eprintln!("soak: first sync done, churning");
    let every = (settings.syncs / SAMPLES).max(1);
    let started = Instant::now();
    let mut samples = vec![take_sample(pid, 0, Duration::ZERO)];
    let mut next_sample = every;
    let (mut count, mut updates, mut polls) = (start_count, 0, 0);
    while count - start_count < settings.syncs {
        workload.churn(server, updates);
        updates += 1;
        let (now, tries) = wait_for_sync(count, log);
        (count, polls) = (now, polls + tries);
        let done = count - start_count;
        if done >= next_sample {
            let sample = take_sample(pid, done, started.elapsed());
            if samples.len() % 10 == 0 {
                eprintln!(
                    "soak: {done} syncs, {:.0} s, RSS {} KiB, {} nat chains",
                    sample.elapsed.as_secs_f64(),
                    sample.rss_kib,
                    sample.nat_chains
                );
            }
            samples.push(sample);
            next_sample += every;
        }
    }
    let elapsed = started.elapsed();
    let syncs = count - start_count;
    // The churn has stopped: the table holds the current endpoints once
    // the last change is applied, after at most one more sync.
    let settle_start = Instant::now();
    let mut settle = Err(String::new());
    let mut last_count = count;
    while settle_start.elapsed() < Duration::from_secs(10) {
        match nat_mismatch(&workload) {
            None => {
                settle = Ok(settle_start.elapsed());
                break;
            }
            Some(problem) => settle = Err(problem),
        }
        std::thread::sleep(Duration::from_millis(20));
        last_count = sync_count().unwrap_or(last_count);
    }
    if let Err(problem) = &mut settle {
        problem.push_str(&format!(
            " ({} syncs after the last update)",
            last_count - count
        ));
    }
    let text = metrics().unwrap_or_default();
    let healthz = http::get(("127.0.0.1", 10256), "/healthz").map_or(0, |reply| reply.code);
    Outcome {
        samples,
        syncs,
        updates,
        elapsed,
        full_syncs: metric(&text, FULL_SYNC_COUNT).unwrap_or(f64::NAN),
        partial_syncs: metric(&text, PARTIAL_SYNC_COUNT).unwrap_or(f64::NAN),
        restore_failures: metric(&text, RESTORE_FAILURES).unwrap_or(f64::NAN),
        polls,
        metrics_bytes: text.len(),
        healthz,
        settle,
    }
}

async fn run(settings: &Settings, kubeconfig: &Path) -> Outcome {
    let server = Arc::new(TestApiServer::start().await.unwrap());
    server.write_kubeconfig(kubeconfig).unwrap();
    let workload = Workload::new(settings.services);
    workload.populate(&server);
    // kubelet's hint chain makes the proxy pick iptables-legacy, as on a
    // node whose kubelet uses it.
    let hint = Command::new("iptables-legacy")
        .args(["-t", "mangle", "-N", "KUBE-IPTABLES-HINT"])
        .status()
        .unwrap();
    assert!(hint.success(), "creating kubelet's hint chain");
    let log = std::fs::File::create(&settings.log).unwrap();
    let child = NsChild::spawn(
        Command::new(env!("CARGO_BIN_EXE_kube-proxy"))
            .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
            .args(["--hostname-override", NODE_NAME])
            .args(["--cluster-cidr", &POD_CIDR.to_string()])
            .args(["--iptables-min-sync-period", "0s"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log)),
    )
    .unwrap();
    let pid = child.id();
    let soaking = {
        let server = Arc::clone(&server);
        let settings = Settings {
            services: settings.services,
            syncs: settings.syncs,
            log: settings.log.clone(),
        };
        tokio::task::spawn_blocking(move || soak(&server, workload, &settings, pid))
    };
    let outcome = soaking.await;
    drop(child);
    server.assert_no_protocol_errors();
    match outcome {
        Ok(outcome) => outcome,
        Err(error) => std::panic::resume_unwind(error.into_panic()),
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn print_samples(samples: &[Sample]) {
    println!(
        "| syncs | time (s) | syncs/s | proxy CPU (ms/sync) | its children's CPU (ms/sync) \
         | bench process CPU (ms/sync) \
         | VmRSS (MiB) | RssAnon (MiB) | VmHWM (MiB) | fds | KUBE- chains nat | KUBE- chains filter \
         | API server RSS (MiB) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let last = samples.len() - 1;
    for (n, sample) in samples.iter().enumerate() {
        if n % 10 != 0 && n != last {
            continue;
        }
        // Rates are over the interval since the row shown before this one.
        let previous = &samples[n.saturating_sub(1) / 10 * 10];
        let syncs = (sample.syncs - previous.syncs) as f64;
        let seconds = (sample.elapsed - previous.elapsed).as_secs_f64();
        let per_sync = |cpu: fn(&Sample) -> f64| {
            if syncs > 0.0 {
                format!("{:.2}", (cpu(sample) - cpu(previous)) * 1000.0 / syncs)
            } else {
                "–".to_owned()
            }
        };
        let rate = if seconds > 0.0 {
            format!("{:.0}", syncs / seconds)
        } else {
            "–".to_owned()
        };
        println!(
            "| {} | {:.0} | {rate} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {:.0} |",
            sample.syncs,
            sample.elapsed.as_secs_f64(),
            per_sync(|s| s.proxy_cpu_s),
            per_sync(|s| s.children_cpu_s),
            per_sync(|s| s.server_cpu_s),
            mib(sample.rss_kib),
            mib(sample.anon_kib),
            mib(sample.hwm_kib),
            sample.fds,
            sample.nat_chains,
            sample.filter_chains,
            mib(sample.server_rss_kib),
        );
    }
}

/// Lines of the binary's log, and those at WARN or ERROR.
fn read_log(path: &Path) -> (usize, Vec<String>) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let notable = text
        .lines()
        .filter(|line| {
            line.split_whitespace()
                .take(3)
                .any(|word| word.contains("WARN") || word.contains("ERROR"))
        })
        .map(str::to_owned)
        .collect();
    (text.lines().count(), notable)
}

fn main() {
    require_root();
    require_tool("iptables-legacy-save");
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        services: usize::try_from(env_number("KP_SOAK_SERVICES", 100)).unwrap(),
        syncs: env_number("KP_SOAK_SYNCS", 100_000),
        log: std::env::var_os("KP_SOAK_LOG")
            .map_or_else(|| dir.path().join("kube-proxy.log"), PathBuf::from),
    };
    assert!(settings.services > 0 && settings.syncs > 0);
    let kubeconfig = dir.path().join("kubeconfig");
    eprintln!(
        "soak: {} syncs, {} Services × 2 endpoints, log {}",
        settings.syncs,
        settings.services,
        settings.log.display()
    );
    let node = Netns::create("soak").expect("the benchmark needs root");
    let outcome = node.block_on(|| run(&settings, &kubeconfig));
    drop(node);
    report(&settings, &outcome);
}

fn report(settings: &Settings, outcome: &Outcome) {
    let Outcome {
        samples,
        syncs,
        updates,
        elapsed,
        ..
    } = outcome;
    println!(
        "The kube-proxy binary, {} Services × 2 endpoints, {syncs} syncs of endpoint churn \
         ({updates} updates), samples every {} syncs (every 10th shown):",
        settings.services,
        (settings.syncs / SAMPLES).max(1)
    );
    println!();
    print_samples(samples);
    let warm_up = (settings.syncs as f64 * WARM_UP) as u64;
    let steady: Vec<&Sample> = samples.iter().filter(|s| s.syncs >= warm_up).collect();
    let spread =
        |f: fn(&Sample) -> f64| Spread::of(&steady.iter().map(|s| f(s)).collect::<Vec<_>>());
    let rss = spread(|s| mib(s.rss_kib));
    let anon = spread(|s| mib(s.anon_kib));
    let hwm = spread(|s| mib(s.hwm_kib));
    let chains = spread(|s| (s.nat_chains + s.filter_chains) as f64);
    let fds = spread(|s| s.fds as f64);
    let server = spread(|s| mib(s.server_rss_kib));
    let line = |what: &str, unit: &str, spread: &Spread, digits: usize| {
        println!(
            "| {what} | {:.digits$}{unit} | {:.digits$}{unit} | {:.digits$}{unit} | ±{:.1} % |",
            spread.median,
            spread.min,
            spread.max,
            spread.deviation * 100.0
        );
    };
    let seconds = elapsed.as_secs_f64();
    let (first, last) = (&samples[0], samples.last().unwrap());
    let per_sync = |cpu: fn(&Sample) -> f64| (cpu(last) - cpu(first)) * 1000.0 / *syncs as f64;
    let (log_lines, notable) = read_log(&settings.log);
    println!();
    println!(
        "{syncs} syncs ({} full, {} partial in all, {} iptables-restore failures) in {seconds:.0} s: \
         {:.0} syncs/s, {:.2} ms per sync. CPU per sync: the proxy {:.2} ms, its children \
         (iptables-restore) {:.2} ms, this process (API server and driver) {:.2} ms.",
        outcome.full_syncs,
        outcome.partial_syncs,
        outcome.restore_failures,
        *syncs as f64 / seconds,
        seconds * 1000.0 / *syncs as f64,
        per_sync(|s| s.proxy_cpu_s),
        per_sync(|s| s.children_cpu_s),
        per_sync(|s| s.server_cpu_s),
    );
    println!(
        "The driver read /metrics ({} bytes) {} times, {:.1} per sync.",
        outcome.metrics_bytes,
        outcome.polls,
        outcome.polls as f64 / *syncs as f64
    );
    println!();
    println!(
        "After the warm-up ({warm_up} syncs), {} samples:",
        steady.len()
    );
    println!();
    println!("| figure | median | min | max | largest deviation |");
    println!("|---|---:|---:|---:|---:|");
    line("proxy VmRSS", " MiB", &rss, 2);
    line("proxy RssAnon", " MiB", &anon, 2);
    line("proxy VmHWM", " MiB", &hwm, 2);
    line("KUBE- chains (nat + filter)", "", &chains, 0);
    line("open fds", "", &fds, 0);
    line("API server (bench process) RSS", " MiB", &server, 1);
    println!();
    println!(
        "Log: {log_lines} lines ({:.4} per sync), {} at WARN or ERROR.",
        log_lines as f64 / *syncs as f64,
        notable.len()
    );
    for line in notable.iter().take(10) {
        println!("    {line}");
    }
    println!("/healthz at the end: {}", outcome.healthz);
    match &outcome.settle {
        Ok(after) => println!(
            "After the churn the nat table held exactly the current endpoints' chains ({} ms).",
            after.as_millis()
        ),
        Err(problem) => println!("After the churn the nat table did not settle: {problem}"),
    }
    let mut failures = Vec::new();
    if !rss.flat() {
        failures.push(format!(
            "VmRSS deviates {:.1} % from its median {:.1} MiB",
            rss.deviation * 100.0,
            rss.median
        ));
    }
    if !chains.flat() {
        failures.push(format!(
            "the chain count deviates {:.1} % from its median {:.0}",
            chains.deviation * 100.0,
            chains.median
        ));
    }
    if outcome.healthz != 200 {
        failures.push(format!("/healthz answered {}", outcome.healthz));
    }
    if let Err(problem) = &outcome.settle {
        failures.push(format!("stale rules after the churn: {problem}"));
    }
    assert!(
        failures.is_empty(),
        "the soak is not flat: {}",
        failures.join("; ")
    );
    println!(
        "Verdict: flat (within ±{:.0} % after the warm-up).",
        TOLERANCE * 100.0
    );
}
