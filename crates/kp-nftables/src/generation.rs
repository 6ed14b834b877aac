//! The ruleset generations this process's own commits produced, per
//! ruleset (network namespace).
//!
//! Every commit to nf_tables by anyone in a network namespace moves its
//! ruleset generation on, whatever table it touches. The IPv4 and IPv6
//! backends commit to different tables of one namespace, so each would
//! otherwise take the other's commits for someone else's and never trust
//! its table. Their commits, with the generation reads around them, run
//! one at a time under their shared [`Ruleset`]'s lock, and each records
//! the generations it produced; a generation recorded here was produced by
//! this process, which changed only its own tables.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use crate::applier::next_generation;

/// Generations remembered per ruleset: more commits than this by the other
/// family between two periodic full syncs of one family only cost a
/// rewrite.
const REMEMBERED: usize = 1024;

/// The commits of this process to one ruleset.
#[derive(Debug, Default)]
pub struct Ruleset {
    own: VecDeque<u32>,
}

/// A [`Ruleset`] the backends of one network namespace share.
pub type SharedRuleset = Arc<Mutex<Ruleset>>;

/// The ruleset of the proxy process: the network namespace it runs in,
/// shared by its IPv4 and IPv6 backends ([`crate::from_config`]).
pub fn process_ruleset() -> SharedRuleset {
    static PROCESS: OnceLock<SharedRuleset> = OnceLock::new();
    Arc::clone(PROCESS.get_or_init(SharedRuleset::default))
}

/// Locks `ruleset`.
pub fn lock(ruleset: &SharedRuleset) -> MutexGuard<'_, Ruleset> {
    ruleset.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Ruleset {
    /// Records the generations after `before` up to `after`, produced by
    /// this process's commit.
    pub fn record(&mut self, before: u32, after: u32) {
        let mut generation = before;
        for _ in 0..REMEMBERED {
            if generation == after {
                return;
            }
            generation = next_generation(generation);
            self.own.push_back(generation);
            if self.own.len() > REMEMBERED {
                self.own.pop_front();
            }
        }
    }

    /// Whether every generation after `from` up to `to` was produced by
    /// this process (true when they are equal).
    pub fn only_own_between(&self, from: u32, to: u32) -> bool {
        let mut generation = from;
        for _ in 0..=REMEMBERED {
            if generation == to {
                return true;
            }
            generation = next_generation(generation);
            if !self.own.contains(&generation) {
                return false;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn only_recorded_generations_count_as_own() {
        let mut ruleset = Ruleset::default();
        ruleset.record(10, 12);
        assert!(ruleset.only_own_between(10, 12));
        assert!(ruleset.only_own_between(11, 12));
        assert!(ruleset.only_own_between(12, 12));
        assert!(!ruleset.only_own_between(10, 13), "13 was someone else's");
        assert!(!ruleset.only_own_between(9, 12), "10 was someone else's");
    }

    #[test]
    fn the_counter_skips_zero_when_it_wraps() {
        let mut ruleset = Ruleset::default();
        ruleset.record(u32::MAX, 2);
        assert!(ruleset.only_own_between(u32::MAX, 2));
        assert!(!ruleset.own.contains(&0));
    }

    #[test]
    fn the_process_has_one_ruleset() {
        let one = process_ruleset();
        let other = process_ruleset();
        assert!(Arc::ptr_eq(&one, &other));
    }
}
