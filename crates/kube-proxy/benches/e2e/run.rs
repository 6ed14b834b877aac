//! One run: a fresh test API server and a fresh binary in the namespace of
//! the calling thread, from start through the patches to the stale-chain
//! check.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kp_testkit::apiserver::TestApiServer;

use crate::mode::{Mode, ObjectKind};
use crate::proxy::{unix_now, Histogram, Memory, Proxy, SeenSync, Snapshot, SyncKind};
use crate::workload::{Change, Workload, TARGET_PORT};

/// Patches per run, as upstream was measured.
pub const PATCHES: usize = 20;
/// Time between patches, as upstream was measured.
pub const PATCH_EVERY: Duration = Duration::from_secs(3);
/// When the stale chains are counted, after the first patch.
pub const STALE_CHECK_AFTER: Duration = Duration::from_secs(60);
/// Longest wait for the first sync.
pub const FIRST_SYNC_TIMEOUT: Duration = Duration::from_secs(900);
/// Longest wait for a patch to be programmed.
pub const PATCH_TIMEOUT: Duration = Duration::from_secs(180);

/// What one patch took.
#[derive(Debug, Clone, Copy)]
pub struct Patch {
    /// From just before the update reached the server to the end of the
    /// sync that applied it (ms).
    pub latency_ms: f64,
    /// The kind of that sync, and its duration (ms).
    pub kind: SyncKind,
    pub sync_ms: f64,
    /// Whether that sync started after the patch (it must have: a sanity
    /// check of how it was found).
    pub started_after: bool,
    /// Syncs that ended after the patch without applying it (a sync
    /// already running).
    pub syncs_before: usize,
    /// Whether the patch went out later than its turn because the one
    /// before took longer than [`PATCH_EVERY`].
    pub late: bool,
    /// Whether the Service's rules sent to exactly its endpoints after
    /// the patch right after (as many to draw from, each of them, no
    /// other: a new endpoint there, a replaced or removed one gone).
    pub verified: bool,
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// From spawning the binary to the end of its first IPv4 sync (s).
    pub start_to_rules_s: f64,
    /// Service objects in the kernel after the first sync.
    pub service_objects: usize,
    /// The first (full) sync's duration as the proxy measured it (s); NaN
    /// if the driver saw it only with a later one.
    pub first_full_s: f64,
    /// Every full sync of the run, the first included.
    pub full: Histogram,
    /// Every partial sync of the run.
    pub partial: Histogram,
    pub patches: Vec<Patch>,
    /// Endpoint objects and those no rule jumps to, at the stale check.
    pub endpoint_objects: usize,
    pub stale_endpoints: usize,
    /// Objects of ours of any kind no rule jumps to, at the stale check.
    pub stale_objects: usize,
    /// The binary's memory at the end.
    pub memory: Memory,
    pub restore_failures: u64,
}

impl RunResult {
    /// The `p` quantile of the patch latencies (ms), nearest rank: with 20
    /// patches p50 is the 10th and p99 the 20th (the largest).
    pub fn patch_quantile_ms(&self, p: f64) -> f64 {
        if self.patches.is_empty() {
            return f64::NAN;
        }
        let mut sorted: Vec<f64> = self.patches.iter().map(|p| p.latency_ms).collect();
        sorted.sort_by(f64::total_cmp);
        let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1]
    }

    /// The mean of the full syncs after the first (s), if there were any.
    pub fn periodic_full_s(&self) -> Option<f64> {
        (self.full.count > 1 && self.first_full_s.is_finite())
            .then(|| (self.full.sum - self.first_full_s) / (self.full.count - 1) as f64)
    }

    /// The median of the partial syncs that applied a patch (ms), if any.
    pub fn partial_median_ms(&self) -> Option<f64> {
        let mut syncs: Vec<f64> = self
            .patches
            .iter()
            .filter(|p| p.kind == SyncKind::Partial)
            .map(|p| p.sync_ms)
            .collect();
        syncs.sort_by(f64::total_cmp);
        syncs.get(syncs.len() / 2).copied()
    }

    /// The mean partial sync (ms), if there were any.
    pub fn partial_mean_ms(&self) -> Option<f64> {
        (self.partial.count > 0).then(|| self.partial.sum * 1000.0 / self.partial.count as f64)
    }
}

/// One run of `workload` in `mode`; the calling thread is in a fresh node
/// namespace.
pub async fn run(mode: Mode, workload: Workload, kubeconfig: &Path, log: &Path) -> RunResult {
    let server = Arc::new(TestApiServer::start().await.unwrap());
    server.write_kubeconfig(kubeconfig).unwrap();
    workload.populate(&server);
    mode.prepare_node();
    let driving = {
        let server = Arc::clone(&server);
        let (kubeconfig, log): (PathBuf, PathBuf) = (kubeconfig.into(), log.into());
        tokio::task::spawn_blocking(move || drive(mode, workload, &server, &kubeconfig, &log))
    };
    let result = driving.await;
    server.assert_no_protocol_errors();
    match result {
        Ok(result) => result,
        Err(error) => std::panic::resume_unwind(error.into_panic()),
    }
}

fn drive(
    mode: Mode,
    workload: Workload,
    server: &TestApiServer,
    kubeconfig: &Path,
    log: &Path,
) -> RunResult {
    let proxy = Proxy::spawn(mode, kubeconfig, log, None);
    let mut watch = proxy.first_sync(FIRST_SYNC_TIMEOUT);
    let first = watch.seen.clone();
    let first_end = first.last_sync.unwrap();
    let start_to_rules_s = first_end - proxy.spawned;
    // Modes without the full-sync histogram (upstream's nftables mode has
    // none) leave it unknown.
    let first_full_s = if first.syncs.count == 1 && first.full.count == 1 {
        first.full.sum
    } else {
        f64::NAN
    };
    // Untimed: the rules are complete, and where each patch will show.
    let ruleset = mode.ruleset();
    let service_objects = ruleset.count(ObjectKind::Service);
    let targets: Vec<(Change, String)> = (0..workload.patches)
        .map(|k| {
            let change = workload.change(k);
            let port = Workload::service_port(change.service);
            let object = ruleset
                .service_object(&port)
                .unwrap_or_else(|| panic!("no service chain for {port} after the first sync"));
            (change, object.to_owned())
        })
        .collect();
    drop(ruleset);
    eprintln!("  first sync {start_to_rules_s:.2} s after start, {service_objects} service chains");

    // The first patch comes a patch interval after the first sync, past the
    // proxy's minSyncPeriod.
    let settle = (first_end + PATCH_EVERY.as_secs_f64() - unix_now()).max(0.0);
    std::thread::sleep(Duration::from_secs_f64(settle));
    let began = Instant::now();
    let mut patches = Vec::with_capacity(workload.patches);
    // Untimed, but it delays the next patch if it takes longer than the
    // interval (a late patch): shown so that this can be told.
    let mut read_back_ms = Vec::with_capacity(workload.patches);
    for (k, (change, object)) in targets.iter().enumerate() {
        let due = began + PATCH_EVERY * u32::try_from(k).unwrap();
        let late = Instant::now() > due + Duration::from_millis(50);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        watch.refresh();
        let at = SystemTime::now();
        let patched = at.duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
        server.update(Workload::slice(change.service, &change.endpoints, Some(at)));
        let (sync, syncs_before) = applied(&mut watch, &proxy);
        let expected: Vec<String> = change
            .endpoints
            .iter()
            .map(|address| format!("{address}:{TARGET_PORT}"))
            .collect();
        let reading = Instant::now();
        let verified = mode
            .service_endpoints(object)
            .is_some_and(|found| found.are(&expected));
        read_back_ms.push(reading.elapsed().as_secs_f64() * 1000.0);
        patches.push(Patch {
            latency_ms: (sync.end - patched) * 1000.0,
            kind: sync.kind,
            sync_ms: sync.duration * 1000.0,
            started_after: sync.start() > patched,
            syncs_before,
            late,
            verified,
        });
    }

    let shown: Vec<String> = patches
        .iter()
        .map(|p| format!("{:.0}/{:.0}", p.latency_ms, p.sync_ms))
        .collect();
    eprintln!("  patch → programmed / its sync (ms): {}", shown.join(" "));
    if let Some(longest) = read_back_ms.iter().copied().reduce(f64::max) {
        eprintln!("  reading a patched Service's rules back took up to {longest:.0} ms");
    }
    // Without patches there is no churn whose stale chains to count.
    let stale_check = if workload.patches > 0 {
        STALE_CHECK_AFTER
    } else {
        Duration::ZERO
    };
    if let Some(wait) = (began + stale_check).checked_duration_since(Instant::now()) {
        std::thread::sleep(wait);
    }
    let ruleset = mode.ruleset();
    let end = Snapshot::read().expect("the metrics at the end");
    RunResult {
        start_to_rules_s,
        service_objects,
        first_full_s,
        full: end.full,
        partial: end.partial,
        patches,
        endpoint_objects: ruleset.count(ObjectKind::Endpoint),
        stale_endpoints: ruleset.unreferenced(Some(ObjectKind::Endpoint)),
        stale_objects: ruleset.unreferenced(None),
        memory: proxy.memory(),
        restore_failures: end.restore_failures,
    }
}

/// The sync that applied the patch just made, and how many syncs ended
/// before it without applying it: the first whose network programming
/// latency count rose, which the patch's trigger time makes happen in
/// exactly the sync that drained it.
pub fn applied(watch: &mut crate::proxy::SyncWatch, proxy: &Proxy) -> (SeenSync, usize) {
    let mut before = 0;
    loop {
        let sync = watch.next(proxy, PATCH_TIMEOUT);
        if sync.programmed > 0 {
            return (sync, before);
        }
        before += 1;
    }
}
