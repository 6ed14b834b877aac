//! What the backend knows of its table between syncs, as one state, and
//! what the next sync does in each.
//!
//! | state | the next sync | after a success | after a failure |
//! |---|---|---|---|
//! | `Unknown` | full, deletes the table first, may be split | `Synced` | `Failed` |
//! | `Failed` | full, deletes the table first, one transaction | `Synced` | `Failed` |
//! | `Synced` | as the sync loop asks; a full one sends only differences while the table is trusted | `Synced` (trusted generation and fixed part updated) | `Failed` |
//!
//! The record of what the table holds ([`crate::Programmed`]) and the
//! process-wide record of commits to the ruleset
//! ([`crate::generation::SharedRuleset`]) sit beside this state: the first
//! says what the proxy's own last transaction left, the second whose
//! commits moved the ruleset generation on; [`TableState::Synced`]'s
//! `trusted` generation joins them (the table is exactly the record at
//! that generation).

use crate::applier::next_generation;
use crate::render::Commits;

/// The backend's knowledge of its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TableState {
    /// No transaction of this process has succeeded yet. The next sync is
    /// full and deletes the table first, in the same transaction (which
    /// removes whatever an earlier process left without listing it, and
    /// lets base chains change priority); it may be split.
    Unknown,
    /// The last transaction failed: the kernel may hold anything the record
    /// does not know (someone else may have changed the table). The next
    /// sync is full, deletes the table first, and is one transaction, which
    /// repairs what a split one could not (a base chain whose priority
    /// changed, a table someone else edited).
    Failed,
    /// The last transaction succeeded: the table is what the record says,
    /// unless someone else changed it since.
    Synced {
        /// The ruleset generation at which the table is exactly the
        /// record, while nobody else's commit touched it since; `None`
        /// when that is not known, and a full sync rewrites every rule.
        trusted: Option<u32>,
        /// The fingerprint of the fixed part the last full render
        /// committed ([`crate::Renderer::head_fingerprint`]).
        head_hash: Option<u64>,
    },
}

/// How the next sync runs, as the state decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SyncPlan {
    /// Rewrite everything.
    pub full: bool,
    /// Delete the table first, in the same transaction.
    pub reset: bool,
    /// A full render may be split into several transactions.
    pub split: bool,
    /// A full sync may first try to send only the differences, bound to
    /// the trusted generation.
    pub differences_only: bool,
}

impl TableState {
    /// The plan of the next sync, when the sync loop asked for a full one
    /// (`requested_full`) or not.
    pub fn plan(self, requested_full: bool) -> SyncPlan {
        match self {
            Self::Unknown => SyncPlan {
                full: true,
                reset: true,
                split: true,
                differences_only: false,
            },
            Self::Failed => SyncPlan {
                full: true,
                reset: true,
                split: false,
                differences_only: false,
            },
            Self::Synced { trusted, .. } => SyncPlan {
                full: requested_full,
                reset: false,
                split: true,
                differences_only: requested_full && trusted.is_some(),
            },
        }
    }

    /// The trusted generation, if any.
    pub fn trusted(self) -> Option<u32> {
        match self {
            Self::Synced { trusted, .. } => trusted,
            Self::Unknown | Self::Failed => None,
        }
    }

    /// The fixed part's fingerprint the table holds, if known.
    pub fn head_hash(self) -> Option<u64> {
        match self {
            Self::Synced { head_hash, .. } => head_hash,
            Self::Unknown | Self::Failed => None,
        }
    }

    /// After a successful sync that rendered the fixed part with
    /// fingerprint `head_hash` (`None` for a partial one, which keeps the
    /// last), leaving the table trusted at `trusted`.
    #[must_use]
    pub fn succeeded(self, head_hash: Option<u64>, trusted: Option<u32>) -> Self {
        Self::Synced {
            trusted,
            head_hash: head_hash.or(self.head_hash()),
        }
    }

    /// The same state with the trusted generation replaced (a successful
    /// commit outside a sync's own transaction: stale chain deletion).
    #[must_use]
    pub fn with_trusted(self, trusted: Option<u32>) -> Self {
        match self {
            Self::Synced { head_hash, .. } => Self::Synced { trusted, head_hash },
            other => other,
        }
    }
}

/// Whether the proxy's own `commits`, made from generation `before`,
/// alone explain the generation `after`: each commit that changes the
/// table moves it on by one, and a commit that may change nothing is
/// taken to have left it where it was. Any other generation means someone else committed meanwhile.
pub(super) fn commits_explain(before: u32, after: u32, commits: Commits) -> bool {
    match commits {
        Commits::Changes(n) => after == (0..n).fold(before, |g, _| next_generation(g)),
        Commits::MaybeNone => after == before,
        Commits::Unknown => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_backend_resets_the_table_in_a_full_sync_that_may_be_split() {
        let plan = TableState::Unknown.plan(false);
        assert!(plan.full && plan.reset && plan.split && !plan.differences_only);
    }

    #[test]
    fn after_a_failure_the_table_is_rebuilt_in_one_transaction() {
        let failed = TableState::Failed;
        let plan = failed.plan(false);
        assert!(plan.full && plan.reset && !plan.split);
        assert_eq!(failed.trusted(), None);
        assert_eq!(failed.head_hash(), None);
    }

    #[test]
    fn a_success_keeps_the_fixed_parts_fingerprint_until_a_full_render_changes_it() {
        let first = TableState::Unknown.succeeded(Some(7), Some(3));
        assert_eq!(
            first,
            TableState::Synced {
                trusted: Some(3),
                head_hash: Some(7)
            }
        );
        let partial = first.succeeded(None, Some(4));
        assert_eq!(partial.head_hash(), Some(7));
        assert_eq!(partial.trusted(), Some(4));
        let full = partial.succeeded(Some(8), None);
        assert_eq!(full.head_hash(), Some(8));
        assert_eq!(full.trusted(), None);
    }

    #[test]
    fn a_synced_table_syncs_as_asked_and_sends_differences_only_while_trusted() {
        let trusted = TableState::Synced {
            trusted: Some(5),
            head_hash: Some(1),
        };
        let partial = trusted.plan(false);
        assert!(!partial.full && !partial.reset && !partial.differences_only);
        let full = trusted.plan(true);
        assert!(full.full && !full.reset && full.split && full.differences_only);
        let untrusted = trusted.with_trusted(None).plan(true);
        assert!(untrusted.full && !untrusted.differences_only);
    }

    #[test]
    fn a_trusted_generation_is_only_set_on_a_synced_table() {
        assert_eq!(TableState::Failed.with_trusted(Some(9)), TableState::Failed);
        assert_eq!(
            TableState::Unknown.with_trusted(Some(9)),
            TableState::Unknown
        );
    }

    #[test]
    fn only_the_proxys_own_commits_explain_the_generation() {
        assert!(commits_explain(4, 6, Commits::Changes(2)));
        assert!(
            !commits_explain(4, 7, Commits::Changes(2)),
            "someone else committed"
        );
        assert!(
            commits_explain(u32::MAX, 1, Commits::Changes(1)),
            "0 is skipped"
        );
        assert!(commits_explain(4, 4, Commits::MaybeNone));
        assert!(!commits_explain(4, 5, Commits::MaybeNone));
        assert!(!commits_explain(4, 4, Commits::Unknown));
    }
}
