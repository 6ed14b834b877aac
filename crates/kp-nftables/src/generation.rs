//! The ruleset generations this process's own commits produced, per
//! ruleset (network namespace), and the commits of others it saw.
//!
//! Every commit to nf_tables by anyone in a network namespace moves its
//! ruleset generation on, whatever table it touches. The IPv4 and IPv6
//! backends commit to different tables of one namespace, so each would
//! otherwise take the other's commits for someone else's and never trust
//! its table. Their commits, with the generation reads around them, run
//! one at a time under their shared [`Ruleset`]'s lock, and each records
//! the generations it produced; a generation recorded here was produced by
//! this process, which changed only its own tables.
//!
//! Other programs commit too: a CNI plugin, a firewall, `iptables-nft`.
//! Without more, any such commit, in any table, makes the next periodic
//! full sync rewrite the whole table, which takes seconds at scale. A
//! [`Watch`] receives the kernel's notification of every commit (the
//! objects it changed, then its generation), so a commit someone else
//! made in other tables is known for one that left the proxy's table
//! alone. The watch is paused while this process commits a full rewrite:
//! the kernel builds a notification for every object of a commit while someone
//! listens, and a full rewrite has hundreds of thousands. A commit the
//! watch did not see whole (made while it was paused or before it
//! joined, or whose notifications were lost) counts as one that touched
//! every table. Small commits (partial syncs, the differences a full sync
//! of an untouched table sends) run with the watch listening: it then
//! also receives them, which changes nothing, since they are recorded as
//! this process's own.

use std::collections::VecDeque;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use kp_model::IpFamily;

use crate::applier::next_generation;

/// Generations remembered per ruleset, of this process's commits and of
/// others' commits seen: more commits than this between two periodic full
/// syncs of one family only cost a rewrite.
const REMEMBERED: usize = 1024;

/// Which of the proxy's tables (`ip kube-proxy`, `ip6 kube-proxy`) a
/// commit changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Touched {
    /// The IPv4 table.
    pub v4: bool,
    /// The IPv6 table.
    pub v6: bool,
}

impl Touched {
    /// Both tables: what a commit the watch could not read counts as.
    pub const BOTH: Touched = Touched { v4: true, v6: true };

    /// Whether the table of `family` was changed.
    pub fn has(self, family: IpFamily) -> bool {
        match family {
            IpFamily::V4 => self.v4,
            IpFamily::V6 => self.v6,
        }
    }

    /// Marks the table of `family` changed.
    pub fn add(&mut self, family: IpFamily) {
        match family {
            IpFamily::V4 => self.v4 = true,
            IpFamily::V6 => self.v6 = true,
        }
    }
}

/// A commit someone else made, seen whole by a [`Watch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observed {
    /// The generation the commit produced.
    pub generation: u32,
    /// The proxy's tables it changed.
    pub touched: Touched,
}

/// The ruleset's commit notifications (nf_tables' `NFNLGRP_NFTABLES`
/// multicast group), from [`crate::Applier::watch`].
pub trait Watch: Send + fmt::Debug {
    /// Appends the commits received since the last call, oldest first.
    /// A commit the watch may have seen only in part (it joined while the
    /// kernel was sending its notifications, or some were lost) is left
    /// out: it then counts as unknown.
    fn drain(&mut self, out: &mut Vec<Observed>);
    /// Stops receiving notifications (what was received stays to drain).
    fn pause(&mut self);
    /// Receives notifications again.
    fn resume(&mut self);
}

/// The commits of this process to one ruleset, and the commits of others
/// its watch saw.
#[derive(Debug, Default)]
pub struct Ruleset {
    own: VecDeque<u32>,
    others: VecDeque<Observed>,
    watch: Option<Box<dyn Watch>>,
    watch_opened: bool,
}

/// A [`Ruleset`] the backends of one network namespace share.
pub type SharedRuleset = Arc<Mutex<Ruleset>>;

/// The ruleset of the proxy process: the network namespace it runs in,
/// shared by its IPv4 and IPv6 backends ([`crate::build`]).
pub fn process_ruleset() -> SharedRuleset {
    static PROCESS: OnceLock<SharedRuleset> = OnceLock::new();
    Arc::clone(PROCESS.get_or_init(SharedRuleset::default))
}

/// A locked [`Ruleset`]: this process's commits run while it is held.
#[derive(Debug)]
pub struct Committing<'a> {
    ruleset: MutexGuard<'a, Ruleset>,
    quiet: bool,
}

/// Locks `ruleset` for this process's commits and takes in what its watch
/// received (the watch is opened with `open` on first use).
pub fn lock_for_commits(
    ruleset: &SharedRuleset,
    open: impl FnOnce() -> Option<Box<dyn Watch>>,
) -> Committing<'_> {
    let mut ruleset = ruleset.lock().unwrap_or_else(PoisonError::into_inner);
    if !ruleset.watch_opened {
        ruleset.watch_opened = true;
        ruleset.watch = open();
    }
    ruleset.observe();
    Committing {
        ruleset,
        quiet: false,
    }
}

impl Committing<'_> {
    /// Pauses the watch until this lock is released, for a commit of many
    /// objects: the kernel builds a notification for each object of a
    /// commit while anyone listens. Small commits run with the watch
    /// listening, so that others' commits meanwhile are seen.
    pub fn quiet(&mut self) {
        if self.quiet {
            return;
        }
        self.ruleset.observe();
        if let Some(watch) = self.ruleset.watch.as_mut() {
            watch.pause();
            self.quiet = true;
        }
    }
}

impl Deref for Committing<'_> {
    type Target = Ruleset;

    fn deref(&self) -> &Ruleset {
        &self.ruleset
    }
}

impl DerefMut for Committing<'_> {
    fn deref_mut(&mut self) -> &mut Ruleset {
        &mut self.ruleset
    }
}

impl Drop for Committing<'_> {
    fn drop(&mut self) {
        if !self.quiet {
            return;
        }
        if let Some(watch) = self.ruleset.watch.as_mut() {
            watch.resume();
        }
    }
}

/// Appends `item` to `queue`, forgetting the oldest beyond [`REMEMBERED`].
fn remember<T>(queue: &mut VecDeque<T>, item: T) {
    queue.push_back(item);
    if queue.len() > REMEMBERED {
        queue.pop_front();
    }
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
            remember(&mut self.own, generation);
        }
    }

    /// Takes in the commits of others the watch received.
    pub fn observe(&mut self) {
        let Some(watch) = self.watch.as_mut() else {
            return;
        };
        let mut seen = Vec::new();
        watch.drain(&mut seen);
        for observed in seen {
            remember(&mut self.others, observed);
        }
    }

    /// Whether the table of `family` is as this process left it at
    /// generation `from` when the generation now is `to`: every commit in
    /// between was this process's own, or someone else's that the watch
    /// saw whole and that left that table alone. Takes in what the watch
    /// received first.
    pub fn untouched_between(&mut self, family: IpFamily, from: u32, to: u32) -> bool {
        self.observe();
        let mut generation = from;
        for _ in 0..=2 * REMEMBERED {
            if generation == to {
                return true;
            }
            generation = next_generation(generation);
            let own = self.own.contains(&generation);
            let harmless = || {
                self.others
                    .iter()
                    .any(|seen| seen.generation == generation && !seen.touched.has(family))
            };
            if !own && !harmless() {
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
        assert!(ruleset.untouched_between(IpFamily::V4, 10, 12));
        assert!(ruleset.untouched_between(IpFamily::V4, 11, 12));
        assert!(ruleset.untouched_between(IpFamily::V4, 12, 12));
        assert!(
            !ruleset.untouched_between(IpFamily::V4, 10, 13),
            "13 was someone else's"
        );
        assert!(
            !ruleset.untouched_between(IpFamily::V4, 9, 12),
            "10 was someone else's"
        );
    }

    #[test]
    fn the_counter_skips_zero_when_it_wraps() {
        let mut ruleset = Ruleset::default();
        ruleset.record(u32::MAX, 2);
        assert!(ruleset.untouched_between(IpFamily::V4, u32::MAX, 2));
        assert!(!ruleset.own.contains(&0));
    }

    /// A watch that reports what a test put in and records its calls.
    #[derive(Debug, Default, Clone)]
    struct Recorded(Arc<Mutex<(Vec<Observed>, Vec<&'static str>)>>);

    impl Watch for Recorded {
        fn drain(&mut self, out: &mut Vec<Observed>) {
            let mut state = self.0.lock().unwrap();
            out.append(&mut state.0);
            state.1.push("drain");
        }
        fn pause(&mut self) {
            self.0.lock().unwrap().1.push("pause");
        }
        fn resume(&mut self) {
            self.0.lock().unwrap().1.push("resume");
        }
    }

    fn seen(generation: u32, v4: bool, v6: bool) -> Observed {
        Observed {
            generation,
            touched: Touched { v4, v6 },
        }
    }

    #[test]
    fn others_commits_count_for_the_tables_they_left_alone() {
        let mut ruleset = Ruleset::default();
        ruleset.record(10, 11);
        ruleset.others.push_back(seen(12, false, false));
        ruleset.others.push_back(seen(13, false, true));
        ruleset.record(13, 14);
        assert!(ruleset.untouched_between(IpFamily::V4, 10, 14));
        assert!(
            !ruleset.untouched_between(IpFamily::V6, 10, 14),
            "13 changed the IPv6 table"
        );
        assert!(ruleset.untouched_between(IpFamily::V6, 13, 14));
        assert!(
            !ruleset.untouched_between(IpFamily::V4, 10, 15),
            "15 was not seen"
        );
    }

    #[test]
    fn large_commits_run_with_the_watch_paused_and_it_is_opened_once() {
        let shared = SharedRuleset::default();
        let watch = Recorded::default();
        watch.0.lock().unwrap().0.push(seen(5, false, false));
        let mut opened = 0;
        {
            let mut committing = lock_for_commits(&shared, || {
                opened += 1;
                Some(Box::new(watch.clone()))
            });
            assert_eq!(watch.0.lock().unwrap().1, ["drain"]);
            assert!(committing.untouched_between(IpFamily::V4, 4, 5));
            committing.quiet();
            committing.quiet();
            assert_eq!(
                watch.0.lock().unwrap().1,
                ["drain", "drain", "drain", "pause"]
            );
        }
        assert_eq!(
            watch.0.lock().unwrap().1,
            ["drain", "drain", "drain", "pause", "resume"]
        );
        drop(lock_for_commits(&shared, || {
            opened += 1;
            None
        }));
        assert_eq!(opened, 1);
        assert_eq!(
            watch.0.lock().unwrap().1,
            ["drain", "drain", "drain", "pause", "resume", "drain"],
            "a lock without a large commit leaves the watch listening"
        );
    }

    #[test]
    fn the_process_has_one_ruleset() {
        let one = process_ruleset();
        let other = process_ruleset();
        assert!(Arc::ptr_eq(&one, &other));
    }
}
