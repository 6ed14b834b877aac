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
//! The targets run on parallel threads. Exits 1 on any failure, after
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

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use report::{Counts, Failures};
use restore::Restorer;
use rng::Gen;

const TARGETS: [&str; 3] = ["manifests", "config", "pipeline"];
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
        let number = |name: &str, default: u64| match std::env::var(name) {
            Ok(value) => value
                .replace('_', "")
                .parse()
                .unwrap_or_else(|_| panic!("{name}={value:?} is not a number")),
            Err(_) => default,
        };
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
    let results: Vec<(String, Counts, f64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = settings
            .targets
            .iter()
            .map(|target| {
                let (settings, restorer) = (&settings, restorer.as_ref());
                scope.spawn(move || {
                    let began = Instant::now();
                    let counts = run_target(target, settings, restorer);
                    (target.clone(), counts, began.elapsed().as_secs_f64())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    println!("{}  {:>8}", report::header(), "seconds");
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

fn restorer(settings: &Settings) -> Option<Restorer> {
    if settings.sample_every == 0 || !nix::unistd::geteuid().is_root() {
        return None;
    }
    let restorer = Restorer::detect();
    (!restorer.flavors().is_empty()).then_some(restorer)
}

fn run_target(target: &str, settings: &Settings, restorer: Option<&Restorer>) -> Counts {
    let index = TARGETS.iter().position(|t| *t == target).unwrap_or(0) as u64;
    let name = TARGETS[index as usize];
    let failures = Failures::new(name, settings.seed);
    let mut counts = Counts::default();
    let (start, end) = (settings.start, settings.start + settings.cases);
    let golden = config::golden();
    let dir = tempfile::Builder::new()
        .prefix("kp-fuzz-")
        .tempdir_in(if std::path::Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        })
        .unwrap();
    let mut case = start;
    let mut next_progress = start + 100_000;
    while case < end {
        let mut gen = Gen::for_case(settings.seed, index, case);
        match name {
            "manifests" => manifests::case(&mut gen, &mut counts, &failures, case),
            "config" => config::case(&mut gen, &golden, &mut counts, &failures, case),
            _ => {
                let steps = (1 + gen.below(4) as u64).min(end - case);
                pipeline::session(
                    &mut gen,
                    dir.path(),
                    steps,
                    case,
                    &mut counts,
                    &failures,
                    restorer,
                    settings.sample_every.max(1),
                );
                case += steps - 1;
            }
        }
        case += 1;
        if case >= next_progress {
            next_progress += 100_000;
            eprintln!("{}", report::row(name, &counts));
        }
    }
    counts
}
