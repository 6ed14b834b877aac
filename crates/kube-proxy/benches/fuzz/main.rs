//! Fuzzing the manifest parser, the configuration decoder and the whole
//! manifests → trackers → categorize → iptables renderer pipeline with
//! random and damaged input: no panic, every refused input gets a message
//! naming its object or field, and one rendered ruleset in
//! `KP_FUZZ_SAMPLE` (1000) is accepted by `iptables-restore --test` (and
//! then committed, so the partial syncs after it are checked on top of
//! it), with iptables-legacy and iptables-nft, inside network namespaces
//! created and removed here.
//!
//! `cargo bench -p kube-proxy --bench fuzz`. Settings:
//! - `KP_FUZZ_CASES` cases per target (default 1,000,000);
//! - `KP_FUZZ_SEED` (default 1) and `KP_FUZZ_START` (the first case's
//!   number, default 0): each case's random choices depend only on these
//!   and its number, so a failure is replayed with the command it prints;
//! - `KP_FUZZ_TARGETS` a comma-separated subset of `manifests,config,pipeline`;
//! - `KP_FUZZ_SAMPLE` one ruleset in this many is restore-tested; `0` (or
//!   not running as root) skips restore tests;
//! - `KP_FUZZ_SHOW_ERRORS=1` prints every manifest error (to see what the
//!   generators produce).
//!
//! `KP_FUZZ_THREADS` worker threads (default: one per core) take the
//! targets' cases 10,000 at a time. Exits 1 on any failure, after
//! printing the first few of each target in full (input, message,
//! ruleset).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

mod cluster;
mod config;
mod manifests;
mod mutate;
mod pipeline;
mod report;
mod restore;
mod rng;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use report::{Counts, Failures};
use restore::Restorer;
use rng::Gen;

const TARGETS: [&str; 3] = ["manifests", "config", "pipeline"];
/// Cases a worker takes at a time.
const CHUNK_CASES: u64 = 10_000;
/// Counts are printed each time a target passes a multiple of this.
const PROGRESS_EVERY: u64 = 100_000;
/// Panics shown in full; later ones are only counted.
const PANICS_SHOWN: usize = 10;
static PANICS: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug, Clone)]
struct Settings {
    cases: u64,
    seed: u64,
    start: u64,
    targets: Vec<String>,
    sample_every: u64,
}

impl Settings {
    fn from_env() -> Self {
        let targets = std::env::var("KP_FUZZ_TARGETS")
            .map(|t| t.split(',').map(str::trim).map(str::to_owned).collect())
            .unwrap_or_else(|_| TARGETS.map(str::to_owned).to_vec());
        for target in &targets {
            assert!(
                TARGETS.contains(&target.as_str()),
                "unknown target {target:?}; known: {TARGETS:?}"
            );
        }
        Self {
            cases: number("KP_FUZZ_CASES", 1_000_000),
            seed: number("KP_FUZZ_SEED", 1),
            start: number("KP_FUZZ_START", 0),
            targets,
            sample_every: number("KP_FUZZ_SAMPLE", 1000),
        }
    }
}

fn main() {
    let settings = Settings::from_env();
    std::panic::set_hook(Box::new(|info| {
        if PANICS.fetch_add(1, Ordering::Relaxed) < PANICS_SHOWN {
            eprintln!("panic: {info}");
        }
    }));
    let restorer = restorer(&settings);
    println!(
        "fuzz: {} cases per target, seed {}, start {}, targets {:?}, restore {}",
        settings.cases,
        settings.seed,
        settings.start,
        settings.targets,
        restorer.as_ref().map_or("off".to_owned(), |r| format!(
            "1 in {} with {:?}",
            settings.sample_every,
            r.flavors()
        )),
    );
    let started = Instant::now();
    let results = run_all(&settings, restorer.as_ref());
    println!("{}  {:>8}", report::header(), "cpu-secs");
    let mut total = Counts::default();
    for (target, counts, seconds) in &results {
        println!("{}  {seconds:>8.1}", report::row(target, counts));
        total.add(counts);
    }
    println!("total: {:.1} s wall", started.elapsed().as_secs_f64());
    if total.failed() {
        eprintln!("fuzz: FAILED (see the failures above)");
        std::process::exit(1);
    }
    println!("fuzz: no failure");
}

/// The number in environment variable `name`, or `default`.
fn number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(value) => value
            .replace('_', "")
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a number")),
        Err(_) => default,
    }
}

fn restorer(settings: &Settings) -> Option<Restorer> {
    if settings.sample_every == 0 || !nix::unistd::geteuid().is_root() {
        return None;
    }
    let restorer = Restorer::detect();
    (!restorer.flavors().is_empty()).then_some(restorer)
}

/// Work shared by the worker threads: each target's cases cut into chunks
/// that any idle thread takes, so the targets finish together.
struct Work<'a> {
    settings: &'a Settings,
    restorer: Option<&'a Restorer>,
    targets: Vec<Target>,
}

/// One target's progress.
struct Target {
    name: &'static str,
    index: u64,
    next_chunk: AtomicU64,
    chunks: u64,
    failures: Failures,
    counts: Mutex<Counts>,
    busy_secs: Mutex<f64>,
}

fn run_all(settings: &Settings, restorer: Option<&Restorer>) -> Vec<(String, Counts, f64)> {
    let chunks = settings.cases.div_ceil(CHUNK_CASES);
    let targets = settings
        .targets
        .iter()
        .map(|target| {
            let index = TARGETS.iter().position(|t| t == target).unwrap_or(0);
            Target {
                name: TARGETS[index],
                index: index as u64,
                next_chunk: AtomicU64::new(0),
                chunks,
                failures: Failures::new(TARGETS[index], settings.seed),
                counts: Mutex::new(Counts::default()),
                busy_secs: Mutex::new(0.0),
            }
        })
        .collect();
    let work = Work {
        settings,
        restorer,
        targets,
    };
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let threads = number("KP_FUZZ_THREADS", threads as u64).max(1);
    std::thread::scope(|scope| {
        for worker in 0..threads {
            let work = &work;
            scope.spawn(move || run_worker(work, worker as usize));
        }
    });
    work.targets
        .into_iter()
        .map(|t| {
            let busy = t.busy_secs.into_inner().unwrap();
            (t.name.to_owned(), t.counts.into_inner().unwrap(), busy)
        })
        .collect()
}

/// Takes chunks, starting with target `worker` (modulo), until none is left.
fn run_worker(work: &Work<'_>, worker: usize) {
    let dir = tempfile::Builder::new()
        .prefix("kp-fuzz-")
        .tempdir_in(if std::path::Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        })
        .unwrap();
    let golden = config::golden();
    let count = work.targets.len();
    for turn in 0.. {
        let Some((target, chunk)) = (0..count)
            .map(|i| &work.targets[(worker + turn + i) % count])
            .find_map(|t| {
                let chunk = t.next_chunk.fetch_add(1, Ordering::Relaxed);
                (chunk < t.chunks).then_some((t, chunk))
            })
        else {
            return;
        };
        let began = Instant::now();
        let first = work.settings.start + chunk * CHUNK_CASES;
        let end = (first + CHUNK_CASES).min(work.settings.start + work.settings.cases);
        let counts = run_chunk(target, work, first..end, dir.path(), &golden);
        *target.busy_secs.lock().unwrap() += began.elapsed().as_secs_f64();
        let mut total = target.counts.lock().unwrap();
        total.add(&counts);
        if total.cases / PROGRESS_EVERY != (total.cases - counts.cases) / PROGRESS_EVERY {
            eprintln!("{}", report::row(target.name, &total));
        }
    }
}

/// Runs the cases `cases` of `target`.
fn run_chunk(
    target: &Target,
    work: &Work<'_>,
    cases: std::ops::Range<u64>,
    dir: &std::path::Path,
    golden: &str,
) -> Counts {
    let mut counts = Counts::default();
    let failures = &target.failures;
    let mut case = cases.start;
    while case < cases.end {
        let mut gen = Gen::for_case(work.settings.seed, target.index, case);
        match target.name {
            "manifests" => manifests::case(&mut gen, &mut counts, failures, case),
            "config" => config::case(&mut gen, golden, &mut counts, failures, case),
            _ => {
                let steps = (1 + gen.below(4) as u64).min(cases.end - case);
                let sample_every = work.settings.sample_every.max(1);
                pipeline::session(
                    &mut gen,
                    dir,
                    steps,
                    case,
                    &mut counts,
                    failures,
                    work.restorer,
                    sample_every,
                );
                case += steps - 1;
            }
        }
        case += 1;
    }
    counts
}
