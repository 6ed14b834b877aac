//! The `kube-proxy` binary end to end: the benchmark docs/BENCHMARKS.md
//! leads with. For each mode, each size N and each run, a fresh network
//! namespace (removed afterwards, also on panic) holds a fresh kp-testkit
//! test API server (the real list/watch protocol) with N Services × E
//! endpoints (E = 2 unless `KP_E2E_ENDPOINTS` says; one TCP port each;
//! ClusterIPs in 10.96.0.0/16; endpoints on node-2, owned by no host, in
//! 10.244.0.0/16 while the N × E fit there, else in 10.16.0.0/12, outside
//! the cluster CIDR, which no rule matches an endpoint against; every
//! address is used once, not shared between Services, so that the data
//! layout's per-address elements are as many as the endpoints, the harder
//! case: `workload.rs`) and the binary, started as an operator runs it:
//! `--kubeconfig … --hostname-override node-1 --cluster-cidr
//! 10.244.0.0/16`, so with our defaults, which are upstream's: syncPeriod
//! 30 s, minSyncPeriod 1 s. The root namespace's rules are never touched.
//! The workload by default is the one upstream v1.28.7 was measured with
//! (against a real kube-apiserver): N Services × 2 endpoints, then 20
//! single-endpoint patches 3 s apart, the proxy's own metrics and
//! `iptables-save` read from outside.
//!
//! Each run measures:
//! 1. **start → complete rules**: from spawning the binary to the end of its
//!    first successful IPv4 sync (when
//!    `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}`
//!    first appears, read every 5 ms from 127.0.0.1:10249 in the
//!    namespace); then, untimed, one `iptables-save -t nat` must show N
//!    `KUBE-SVC-` chains.
//! 2. **patch → programmed**: 3 s after the first sync, 20 patches 3 s
//!    apart, each replacing the second endpoint of a different Service's
//!    EndpointSlice (`KP_E2E_PATCH_KIND=replace`, the default: the count
//!    stays E), or in pairs on a different Service each pair, the first
//!    adding an endpoint (E → E + 1), the second removing it again
//!    (`count`); each with `server.update` and the EndpointSlice
//!    controller's `last-change-trigger-time` annotation set to the patch
//!    time. Each
//!    one's latency runs from just before the update reaches the server to
//!    the end (`last_timestamp`) of the sync that applied it: the first
//!    sync after the patch in which the proxy's
//!    `kubeproxy_network_programming_duration_seconds` count rose, which
//!    happens exactly in the sync that drained the patch (so a periodic
//!    full sync that was already running does not count; that it started
//!    after the patch is checked). Untimed, the Service's rules must then
//!    send to exactly its endpoints after the patch (`mode.rs`): as many
//!    endpoint chains (`iptables -t nat -S`: the `KUBE-SEP-` chains its
//!    `KUBE-SVC-` chain jumps to; nftables: the `endpoint-` chains its
//!    `service-` chain goes to), each DNATing to one of them, none to
//!    another; in the data layout, the `endpoint-count-K` set holding the
//!    entry has K = the count, and the slot map's slots below K hold
//!    exactly them. So an added endpoint must be there, with the count
//!    one higher, and a replaced or removed one gone. That read-back is
//!    not timed, but the next patch waits for it: where it takes longer
//!    than the interval (listing a slot map of 250,000 elements takes `nft`
//!    seconds), the patches go out late (counted; each latency still runs
//!    from its own patch), and stderr shows the longest read-back. p50 and
//!    p99 per run by nearest rank: with 20 patches, p99 is the largest.
//! 3. **full and partial sync**: the proxy's own
//!    `kubeproxy_sync_{full,partial}_proxy_rules_duration_seconds`
//!    histograms: the first (start-up) full sync alone, the mean of the
//!    later full syncs (periodic, every syncPeriod), the mean partial sync.
//! 4. **stale chains after churn**: 60 s after the first patch, one
//!    `iptables-save -t nat`: `KUBE-SEP-` chains no rule jumps to, and any
//!    of our per-Service and per-endpoint chains (`KUBE-SVC-`, `KUBE-SEP-`,
//!    `KUBE-EXT-`, `KUBE-FW-`, `KUBE-SVL-`) no rule jumps to.
//! 5. **memory**: the binary's VmHWM (peak RSS) and VmRSS at the end.
//!
//! Printed per mode: a Markdown table, one row per size, medians over the
//! runs with min–max; then every run; and, at the largest size, the
//! **lone-restore reference** (see `lone.rs`): the `iptables-restore`
//! inputs of two partial syncs (a patch and its reverse) run alone, in
//! turn, five times each on the ruleset the binary left (median), beside
//! the binary's partial sync and their ratio. The
//! top of the output names the command and the machine.
//!
//! iptables-legacy programs take the file lock `/run/xtables.lock`, which
//! every network namespace of the machine shares; on a shared machine other
//! tests' proxies would hold up ours, so the binary, the lone restore and
//! the checks here share a lock file of their own (`XTABLES_LOCKFILE`, set
//! unless the environment sets it), as a node's proxy shares it with its
//! kubelet only.
//!
//! Modes are the iptables mode on a node whose kubelet uses
//! iptables-legacy, and on one using iptables-nft (kubelet's
//! `KUBE-IPTABLES-HINT` chain tells the binary), and the nftables mode in
//! each of its layouts (`nftables` for `--nftables-layout chains`,
//! `nftables-data` for `--nftables-layout data`, the default); `mode.rs`
//! holds all that differs between modes.
//!
//! Needs root. `cargo bench -p kube-proxy --bench e2e`; environment:
//! `KP_E2E_MODES` (default `legacy,nft`), `KP_E2E_SIZES` (default
//! `1000,5000,10000`), `KP_E2E_RUNS` (default 3), `KP_E2E_HOSTILE` puts one
//! Service of the largest kind the API accepts beside the N
//! (`source-ranges`: 10,000 `loadBalancerSourceRanges`; `endpoints`: 1,000
//! endpoints; `external-ips`: 100; `ports`: 200; default `none`),
//! `KP_E2E_PATCHES` (default 20; 0 skips the patches and the stale-chain
//! count, for start-up figures alone), `KP_E2E_ENDPOINTS` the endpoints
//! per Service (default 2; at most 999, so that an added one still fits
//! one EndpointSlice), `KP_E2E_PATCH_KIND` what the patches change
//! (`replace`, the default: one endpoint replaced; `count`: one added,
//! then removed again), `KP_E2E_LONE=0` skips the
//! lone-restore reference, `KP_E2E_LOG=DIR` keeps the binary's logs there
//! (default: a temporary directory), `KP_E2E_POLL_MS` sets how often the
//! metrics are read while a sync is awaited (default 5; each read costs the
//! proxy some CPU, so a larger value shows what the polling costs; the
//! latencies are the proxy's own timestamps and do not depend on it),
//! `KP_E2E_BINARY=PATH` runs that build of the binary instead of this
//! tree's (to compare two trees in one sitting).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

mod lone;
mod mode;
mod proxy;
mod run;
mod workload;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use kp_testkit::netns::{require_root, require_tool, Netns};

use crate::lone::Lone;
use crate::mode::Mode;
use crate::proxy::SyncKind;
use crate::run::{RunResult, PATCHES};
use crate::workload::{Hostile, PatchKind, Workload, ENDPOINTS};

/// The environment variable that moves iptables-legacy's lock file.
const XTABLES_LOCKFILE: &str = "XTABLES_LOCKFILE";

/// What the environment asks for.
struct Settings {
    modes: Vec<Mode>,
    sizes: Vec<usize>,
    runs: usize,
    lone: bool,
    logs: PathBuf,
    hostile: Hostile,
    patches: usize,
    endpoints: usize,
    kind: PatchKind,
}

/// Median and extremes of one figure over the runs.
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

impl Settings {
    fn from_env(temporary: &Path) -> Self {
        let var =
            |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
        let list = |name: &str, default: &str| -> Vec<String> {
            var(name, default)
                .split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        };
        let number = |name: &str, text: &str| -> usize {
            text.parse()
                .unwrap_or_else(|_| panic!("{name}: {text:?} is not a number"))
        };
        let settings = Self {
            modes: list("KP_E2E_MODES", "legacy,nft")
                .iter()
                .map(|name| Mode::parse(name))
                .collect(),
            sizes: list("KP_E2E_SIZES", "1000,5000,10000")
                .iter()
                .map(|s| number("KP_E2E_SIZES", s))
                .collect(),
            runs: number("KP_E2E_RUNS", &var("KP_E2E_RUNS", "3")),
            lone: var("KP_E2E_LONE", "1") != "0",
            logs: std::env::var_os("KP_E2E_LOG").map_or_else(|| temporary.into(), PathBuf::from),
            hostile: Hostile::parse(&var("KP_E2E_HOSTILE", "none")),
            patches: number(
                "KP_E2E_PATCHES",
                &var("KP_E2E_PATCHES", &PATCHES.to_string()),
            ),
            endpoints: number(
                "KP_E2E_ENDPOINTS",
                &var("KP_E2E_ENDPOINTS", &ENDPOINTS.to_string()),
            ),
            kind: PatchKind::parse(&var("KP_E2E_PATCH_KIND", "replace")),
        };
        assert!(
            !settings.modes.is_empty() && !settings.sizes.is_empty() && settings.runs > 0,
            "nothing to run"
        );
        settings
    }
}

impl Spread {
    fn of(values: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut sorted: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
        if sorted.is_empty() {
            return None;
        }
        sorted.sort_by(f64::total_cmp);
        Some(Self {
            median: sorted[sorted.len() / 2],
            min: sorted[0],
            max: sorted[sorted.len() - 1],
        })
    }

    /// `median (min–max)` with `digits` decimals; just the median when all
    /// agree or there is one run.
    fn show(&self, digits: usize) -> String {
        let median = format!("{:.digits$}", self.median);
        let (min, max) = (
            format!("{:.digits$}", self.min),
            format!("{:.digits$}", self.max),
        );
        if min == max {
            median
        } else {
            format!("{median} ({min}–{max})")
        }
    }
}

fn show(spread: Option<&Spread>, digits: usize) -> String {
    spread.map_or_else(|| "–".to_owned(), |s| s.show(digits))
}

fn main() {
    require_root();
    let temporary = tempfile::tempdir().unwrap();
    // iptables-legacy serializes every user of /run/xtables.lock, in every
    // network namespace: on this shared machine, other tests' proxies would
    // hold up ours. A lock of our own, inherited by the binary and by the
    // checks here, is what a node's proxy shares with its kubelet only.
    if std::env::var_os(XTABLES_LOCKFILE).is_none() {
        std::env::set_var(XTABLES_LOCKFILE, temporary.path().join("xtables.lock"));
    }
    let settings = Settings::from_env(temporary.path());
    std::fs::create_dir_all(&settings.logs).unwrap();
    for mode in &settings.modes {
        for tool in mode.tools() {
            require_tool(tool);
        }
    }
    let started = Instant::now();
    header(&settings);
    let kubeconfig = temporary.path().join("kubeconfig");
    let largest = *settings.sizes.iter().max().unwrap();
    for &mode in &settings.modes {
        let mut results: Vec<(usize, Vec<RunResult>)> = Vec::new();
        let mut reference = None;
        for &size in &settings.sizes {
            let workload = Workload::new(
                size,
                settings.endpoints,
                settings.hostile,
                settings.patches,
                settings.kind,
            );
            let mut runs = Vec::with_capacity(settings.runs);
            for n in 1..=settings.runs {
                eprintln!("e2e: {}, {size} Services, run {n}", mode.name());
                let log = settings
                    .logs
                    .join(format!("{}-{size}-{n}.log", mode.short_name()));
                let node = Netns::create("e2e").expect("the benchmark needs root");
                let result = node.block_on(|| run::run(mode, workload, &kubeconfig, &log));
                drop(node);
                eprintln!(
                    "  patch → programmed p50 {:.0} ms, p99 {:.0} ms; partial sync {:.0} ms",
                    result.patch_quantile_ms(0.5),
                    result.patch_quantile_ms(0.99),
                    result.partial_mean_ms().unwrap_or(f64::NAN)
                );
                runs.push(result);
            }
            if settings.lone && size == largest && mode.restore().is_some() {
                eprintln!("e2e: {}, {size} Services, lone restore", mode.name());
                let log = settings
                    .logs
                    .join(format!("{}-{size}-lone.log", mode.short_name()));
                let dir = tempfile::tempdir().unwrap();
                let node = Netns::create("e2e-lone").expect("the benchmark needs root");
                let lone = node
                    .block_on(|| lone::lone_restore(mode, workload, &kubeconfig, &log, dir.path()));
                drop(node);
                reference = Some((size, lone));
            }
            results.push((size, runs));
        }
        report(mode, settings.hostile, &results, reference.as_ref());
    }
    println!(
        "Took {:.0} min; load average at the end: {}",
        started.elapsed().as_secs_f64() / 60.0,
        load_average()
    );
}

fn header(settings: &Settings) {
    let mut command = String::new();
    for name in [
        "KP_E2E_MODES",
        "KP_E2E_SIZES",
        "KP_E2E_RUNS",
        "KP_E2E_LONE",
        "KP_E2E_POLL_MS",
        "KP_E2E_HOSTILE",
        "KP_E2E_PATCHES",
        "KP_E2E_ENDPOINTS",
        "KP_E2E_PATCH_KIND",
    ] {
        if let Ok(value) = std::env::var(name) {
            command.push_str(&format!("{name}={value} "));
        }
    }
    command.push_str("cargo bench -p kube-proxy --bench e2e");
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let commit = Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    println!("# The kube-proxy binary end to end");
    println!();
    println!("Command: `{command}` (tree {commit})");
    println!();
    println!(
        "Machine: {cores} cores ({cpu}), kernel {}, {}; load average at the start: {}",
        kernel.trim(),
        settings
            .modes
            .iter()
            .map(|m| m.versions())
            .collect::<Vec<_>>()
            .join(", "),
        load_average()
    );
    println!();
    println!(
        "Workload: N Services × {} endpoints, a hostile Service beside them: {}; \
         {} {} {} s apart; \
         the binary with its defaults (syncPeriod 30 s, minSyncPeriod 1 s); its metrics read \
         every {} ms while a sync is awaited; iptables-legacy lock file {}; {} run(s) each, \
         medians with (min–max) over the runs.",
        settings.endpoints,
        settings.hostile.name(),
        settings.patches,
        settings.kind.describe(),
        run::PATCH_EVERY.as_secs(),
        proxy::poll().as_millis(),
        std::env::var(XTABLES_LOCKFILE).unwrap_or_default(),
        settings.runs
    );
    println!();
}

fn report(
    mode: Mode,
    hostile: Hostile,
    results: &[(usize, Vec<RunResult>)],
    lone: Option<&(usize, Lone)>,
) {
    println!("## {}", mode.name());
    println!();
    println!(
        "| Services | start → complete rules (s) | first full sync (s) | later full syncs, mean (s) \
         | partial sync, mean (ms) | patch → programmed p50 (ms) | p99 = max of the patches (ms) \
         | unreferenced KUBE-SEP at 60 s | unreferenced chains of ours at 60 s | peak RSS (MiB) | RSS at the end (MiB) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (size, runs) in results {
        let cell = |f: &dyn Fn(&RunResult) -> f64, digits: usize| {
            show(Spread::of(runs.iter().map(f)).as_ref(), digits)
        };
        println!(
            "| {size} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            cell(&|r| r.start_to_rules_s, 2),
            cell(&|r| r.first_full_s, 2),
            cell(&|r| r.periodic_full_s().unwrap_or(f64::NAN), 2),
            cell(&|r| r.partial_mean_ms().unwrap_or(f64::NAN), 0),
            cell(&|r| r.patch_quantile_ms(0.5), 0),
            cell(&|r| r.patch_quantile_ms(0.99), 0),
            cell(&|r| r.stale_endpoints as f64, 0),
            cell(&|r| r.stale_objects as f64, 0),
            cell(&|r| mib(r.memory.hwm_kib), 1),
            cell(&|r| mib(r.memory.rss_kib), 1),
        );
    }
    println!();
    println!("Every run:");
    println!();
    println!(
        "| Services | run | start (s) | KUBE-SVC after the first sync | full syncs (s, each: first, mean of later) \
         | partial syncs | patch p50 / p99 (ms) | patches applied by a partial / full sync \
         | late patches | patches seen in the nat table | a sync ran before the applying one \
         | KUBE-SEP at 60 s (unreferenced) | restore failures | VmHWM / VmRSS (MiB) \
         | RssAnon / RssFile at the end (MiB) |"
    );
    println!("|---:|---:|---:|---:|---|---|---|---|---:|---:|---:|---|---:|---|---|");
    for (size, runs) in results {
        for (n, r) in runs.iter().enumerate() {
            let count = |f: &dyn Fn(&run::Patch) -> bool| r.patches.iter().filter(|p| f(p)).count();
            println!(
                "| {size} | {} | {:.2} | {} | {} ({:.2}, {}) | {} ({} ms mean) | {:.0} / {:.0} | {} / {} | {} | {}/{} | {} | {} ({}) | {} | {:.1} / {:.1} | {:.1} / {:.1} |",
                n + 1,
                r.start_to_rules_s,
                r.service_objects,
                r.full.count,
                r.first_full_s,
                r.periodic_full_s().map_or("–".to_owned(), |s| format!("{s:.2}")),
                r.partial.count,
                r.partial_mean_ms().map_or("–".to_owned(), |m| format!("{m:.0}")),
                r.patch_quantile_ms(0.5),
                r.patch_quantile_ms(0.99),
                count(&|p| p.kind == SyncKind::Partial),
                count(&|p| p.kind == SyncKind::Full),
                count(&|p| p.late),
                count(&|p| p.verified),
                r.patches.len(),
                count(&|p| p.syncs_before > 0),
                r.endpoint_objects,
                r.stale_endpoints,
                r.restore_failures,
                mib(r.memory.hwm_kib),
                mib(r.memory.rss_kib),
                mib(r.memory.anon_kib),
                mib(r.memory.file_kib),
            );
            let wrong: Vec<String> = r
                .patches
                .iter()
                .enumerate()
                .filter(|(_, p)| !p.started_after || !p.verified)
                .map(|(k, p)| {
                    format!(
                        "patch {k}: started after {}, seen {}",
                        p.started_after, p.verified
                    )
                })
                .collect();
            if !wrong.is_empty() || r.service_objects != *size + hostile.service_ports() {
                eprintln!(
                    "WARNING: {} {size} run {}: {} service chains; {}",
                    mode.name(),
                    n + 1,
                    r.service_objects,
                    wrong.join("; ")
                );
            }
        }
    }
    println!();
    if let Some((size, lone)) = lone {
        let runs = results
            .iter()
            .find(|(s, _)| s == size)
            .map(|(_, runs)| runs.as_slice())
            .unwrap_or_default();
        let mean = Spread::of(runs.iter().map(|r| r.partial_mean_ms().unwrap_or(f64::NAN)));
        let median = Spread::of(
            runs.iter()
                .map(|r| r.partial_median_ms().unwrap_or(f64::NAN)),
        );
        let restore = Spread::of(lone.restore_ms.iter().copied()).unwrap();
        let ratio = |partial: &Option<Spread>| {
            partial
                .as_ref()
                .map_or(f64::NAN, |p| p.median / restore.median)
        };
        println!(
            "Lone-restore reference at {size} Services: the inputs of two partial syncs \
             (a patch and its reverse; {} lines, {} bytes) restored in turn with \
             `{} {}` alone on the ruleset the binary left, {} times in all; the issue's target: \
             the binary's partial sync within 15 % of it:",
            lone.input_lines,
            lone.input_bytes,
            mode.restore().unwrap_or_default(),
            mode.restore_args().join(" "),
            lone.restore_ms.len()
        );
        println!();
        println!(
            "| lone restore, median (ms) | the binary's partial sync, mean (ms) | ratio \
             | the binary's partial syncs that applied a patch, median (ms) | ratio |"
        );
        println!("|---:|---:|---:|---:|---:|");
        println!(
            "| {} | {} | {:.2} | {} | {:.2} |",
            restore.show(0),
            show(mean.as_ref(), 0),
            ratio(&mean),
            show(median.as_ref(), 0),
            ratio(&median),
        );
        println!();
        println!(
            "(The binary's partial syncs that wrote the kept inputs took {:.0} ms on average, \
             with the copying wrapper.)",
            lone.captured_sync_ms
        );
        println!();
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}
