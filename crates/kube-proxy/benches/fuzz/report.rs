//! What a target counts, and how failures are shown.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Failures printed in full per target; the rest are only counted.
const SHOWN_PER_TARGET: usize = 5;

/// Counts of one target.
#[derive(Debug, Default, Clone)]
pub struct Counts {
    /// Inputs tried.
    pub cases: u64,
    /// Inputs taken without any error.
    pub accepted: u64,
    /// Inputs with at least one error (each one checked to name its object
    /// or field).
    pub rejected: u64,
    /// Rulesets rendered.
    pub rendered: u64,
    /// Rulesets given to `iptables-restore --test` (per flavor).
    pub restore_tested: u64,
    /// Of those, rulesets with at least one endpoint chain (`KUBE-SEP-`).
    pub restore_with_endpoints: u64,
    /// Of those, rulesets the restore program refused.
    pub restore_rejected: u64,
    /// Cases that panicked.
    pub panics: u64,
    /// Errors whose message names neither an object nor a field.
    pub unnamed: u64,
    /// Other failures (a sync that failed).
    pub other: u64,
}

/// Prints failures of one target, the first few in full.
#[derive(Debug)]
pub struct Failures {
    target: &'static str,
    seed: u64,
    shown: AtomicUsize,
}

impl Counts {
    /// Whether anything failed.
    pub fn failed(&self) -> bool {
        self.panics + self.unnamed + self.restore_rejected + self.other > 0
    }

    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &Counts) {
        self.cases += other.cases;
        self.accepted += other.accepted;
        self.rejected += other.rejected;
        self.rendered += other.rendered;
        self.restore_tested += other.restore_tested;
        self.restore_with_endpoints += other.restore_with_endpoints;
        self.restore_rejected += other.restore_rejected;
        self.panics += other.panics;
        self.unnamed += other.unnamed;
        self.other += other.other;
    }
}

impl Failures {
    /// Failures of `target` under `seed`.
    pub fn new(target: &'static str, seed: u64) -> Self {
        Self {
            target,
            seed,
            shown: AtomicUsize::new(0),
        }
    }

    /// Reports a failure of case `case`: what went wrong and the input.
    pub fn report(&self, case: u64, what: &str, detail: &dyn fmt::Display, input: &str) {
        if self.shown.fetch_add(1, Ordering::Relaxed) >= SHOWN_PER_TARGET {
            return;
        }
        // A pipeline case starts a session of up to 4 cases.
        let cases = if self.target == "pipeline" { 4 } else { 1 };
        eprintln!(
            "==== FAILURE in target {} case {case}: {what}\n{detail}\n---- input (replay: KP_FUZZ_TARGETS={} KP_FUZZ_SEED={} KP_FUZZ_START={case} KP_FUZZ_CASES={cases})\n{input}\n==== end of failure",
            self.target, self.target, self.seed
        );
    }
}

/// The header of the counts table.
pub fn header() -> String {
    format!(
        "{:<10} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>6} {:>8} {:>6}",
        "target",
        "cases",
        "accepted",
        "rejected",
        "rendered",
        "restored",
        "with-sep",
        "refused",
        "panics",
        "unnamed",
        "other"
    )
}

/// One row of the counts table.
pub fn row(target: &str, c: &Counts) -> String {
    format!(
        "{:<10} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>6} {:>8} {:>6}",
        target,
        c.cases,
        c.accepted,
        c.rejected,
        c.rendered,
        c.restore_tested,
        c.restore_with_endpoints,
        c.restore_rejected,
        c.panics,
        c.unnamed,
        c.other
    )
}
