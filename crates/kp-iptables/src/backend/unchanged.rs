//! Leaving chains the kernel already holds out of partial restores.
//!
//! A partial render rewrites the top-level chains (`KUBE-SERVICES`,
//! `KUBE-NODEPORTS`, …) in full, as upstream does. With 10,000 Services,
//! `KUBE-SERVICES` alone is 10,000 rules, and iptables-nft-restore spends
//! about a second replacing it even when one endpoint changed, which does
//! not touch it at all. So the backend remembers a digest of every chain it
//! wrote, and a partial restore leaves out each chain whose rules are the
//! same as the last ones written: with `--noflush`, a chain that is not
//! declared in the input keeps its rules. A full sync (the repair path)
//! always writes everything and starts the digests afresh.

use std::borrow::Cow;
use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};

/// Digests of the chains as the last successful restores left them,
/// per table.
#[derive(Debug, Default)]
pub(crate) struct ChainDigests {
    /// Keyed by a hash of table and chain name rather than the names: the
    /// map holds every chain of the ruleset, some 40,000 at 10,000
    /// Services. Two chains would have to collide in that hash and in their
    /// rules' digest for a change to be missed.
    digests: HashMap<u64, u64>,
}

/// One restore input, split into what each declared chain holds.
struct Parsed<'a> {
    /// `(table, chain)` → digest of its `-A` lines, for declared chains.
    chains: HashMap<(&'a str, &'a str), u64>,
}

impl ChainDigests {
    /// Forgets everything (the kernel may hold anything).
    pub fn clear(&mut self) {
        self.digests.clear();
    }

    /// Records what a successful restore of `text` left in the kernel.
    pub fn record(&mut self, text: &str) {
        let mut recording = self.recording();
        recording.lines(text);
        recording.finish();
    }

    /// Records a restore input given piece by piece, as it is streamed.
    ///
    /// The lines are folded straight into the digests: a full restore
    /// declares some 40,000 chains, and a map of them by name (2.7 MB)
    /// would sit next to the restore input at the sync's memory peak.
    pub fn recording(&mut self) -> Recording<'_> {
        Recording {
            digests: self,
            table: String::new(),
            declared: HashSet::new(),
            deleted: Vec::new(),
        }
    }

    /// `text` without the declarations and rules of the chains whose rules
    /// equal the recorded ones.
    pub fn without_unchanged<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let parsed = parse(text);
        let unchanged: HashSet<(&str, &str)> = parsed
            .chains
            .iter()
            .filter(|((table, chain), digest)| {
                self.digests.get(&chain_key(table, chain)) == Some(*digest)
            })
            .map(|(key, _)| *key)
            .collect();
        if unchanged.is_empty() {
            return Cow::Borrowed(text);
        }
        let mut out = String::with_capacity(text.len());
        for (table, line, kind) in restore_lines(text) {
            let skip = match kind {
                LineKind::Declare(chain) | LineKind::Rule(chain) => {
                    unchanged.contains(&(table, chain))
                }
                LineKind::Delete(_) | LineKind::Other => false,
            };
            if !skip {
                out.push_str(line);
                out.push('\n');
            }
        }
        Cow::Owned(out)
    }
}

/// A restore input being recorded into [`ChainDigests`], one piece of
/// whole lines after the other ([`ChainDigests::recording`]).
pub(crate) struct Recording<'d> {
    digests: &'d mut ChainDigests,
    /// The table of the section the last piece ended in.
    table: String,
    declared: HashSet<u64>,
    deleted: Vec<u64>,
}

impl Recording<'_> {
    /// Records the next piece of the input.
    pub fn lines(&mut self, text: &str) {
        for line in text.lines() {
            if let Some(name) = line.strip_prefix('*') {
                self.table.clear();
                self.table.push_str(name);
                continue;
            }
            match line_kind(line) {
                LineKind::Declare(chain) => {
                    let key = chain_key(&self.table, chain);
                    self.declared.insert(key);
                    self.digests.digests.insert(key, EMPTY_CHAIN);
                }
                LineKind::Rule(chain) => {
                    let key = chain_key(&self.table, chain);
                    // As in `parse`: rules of an undeclared chain get no digest.
                    if self.declared.contains(&key) {
                        let digest = self.digests.digests.entry(key).or_insert(EMPTY_CHAIN);
                        *digest = fold(*digest, line);
                    }
                }
                LineKind::Delete(chain) => self.deleted.push(chain_key(&self.table, chain)),
                LineKind::Other => {}
            }
        }
    }

    /// Ends the input: the chains it deleted lose their digests.
    pub fn finish(self) {
        for key in self.deleted {
            self.digests.digests.remove(&key);
        }
    }
}

/// What a line of restore input does to a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LineKind<'a> {
    /// `:CHAIN - [0:0]`: declares (and flushes) the chain.
    Declare(&'a str),
    /// `-A CHAIN …`: appends a rule to the chain.
    Rule(&'a str),
    /// `-X CHAIN`: deletes the chain.
    Delete(&'a str),
    /// Anything else (`*table`, `COMMIT`, `-I …`).
    Other,
}

fn first_word(text: &str) -> &str {
    text.split(' ').next().unwrap_or(text)
}

/// Every line of `text` with the table it belongs to and what it does.
fn restore_lines(text: &str) -> impl Iterator<Item = (&str, &str, LineKind<'_>)> {
    let mut table = "";
    text.lines().map(move |line| {
        if let Some(name) = line.strip_prefix('*') {
            table = name;
        }
        (table, line, line_kind(line))
    })
}

/// What `line` does, when it is not a `*table` line.
fn line_kind(line: &str) -> LineKind<'_> {
    if let Some(rest) = line.strip_prefix(':') {
        LineKind::Declare(first_word(rest))
    } else if let Some(rest) = line.strip_prefix("-A ") {
        LineKind::Rule(first_word(rest))
    } else if let Some(rest) = line.strip_prefix("-X ") {
        LineKind::Delete(rest.trim())
    } else {
        LineKind::Other
    }
}

fn parse(text: &str) -> Parsed<'_> {
    // One u64 per chain (not a hasher state each): at 10,000 Services a
    // restore declares some 40,000 chains.
    let mut chains: HashMap<(&str, &str), u64> = HashMap::new();
    for (table, line, kind) in restore_lines(text) {
        match kind {
            LineKind::Declare(chain) => {
                chains.insert((table, chain), EMPTY_CHAIN);
            }
            // Rules of a chain this input does not declare are appended
            // without a flush; such a chain is never left out (no digest).
            LineKind::Rule(chain) => {
                if let Some(digest) = chains.get_mut(&(table, chain)) {
                    *digest = fold(*digest, line);
                }
            }
            LineKind::Delete(_) | LineKind::Other => {}
        }
    }
    Parsed { chains }
}

fn chain_key(table: &str, chain: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    (table, chain).hash(&mut hasher);
    hasher.finish()
}

/// The digest of a chain without rules.
const EMPTY_CHAIN: u64 = 0x6b75_6265_2d70_7278;

/// The digest of a chain's rules so far followed by `line`: order matters,
/// so a chain whose rules were only reordered differs.
fn fold(digest: u64, line: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    digest.hash(&mut hasher);
    line.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIRST: &str =
        "*filter\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -d 10.96.0.9 -j REJECT\nCOMMIT\n\
*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-A - [0:0]\n:KUBE-SEP-1 - [0:0]\n\
-A KUBE-SERVICES -d 10.96.0.1 -j KUBE-SVC-A\n-A KUBE-SVC-A -j KUBE-SEP-1\n\
-A KUBE-SEP-1 -j DNAT --to-destination 10.244.1.2:80\nCOMMIT\n";

    #[test]
    fn a_partial_restore_leaves_out_chains_the_kernel_already_holds() {
        let mut digests = ChainDigests::default();
        digests.record(FIRST);
        // One endpoint replaced: only the service's chains differ.
        let next =
            "*filter\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -d 10.96.0.9 -j REJECT\nCOMMIT\n\
*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-A - [0:0]\n:KUBE-SEP-2 - [0:0]\n\
-A KUBE-SERVICES -d 10.96.0.1 -j KUBE-SVC-A\n-A KUBE-SVC-A -j KUBE-SEP-2\n\
-A KUBE-SEP-2 -j DNAT --to-destination 10.244.1.3:80\n-X KUBE-SEP-1\nCOMMIT\n";
        assert_eq!(
            digests.without_unchanged(next),
            "*filter\nCOMMIT\n*nat\n:KUBE-SVC-A - [0:0]\n:KUBE-SEP-2 - [0:0]\n\
-A KUBE-SVC-A -j KUBE-SEP-2\n-A KUBE-SEP-2 -j DNAT --to-destination 10.244.1.3:80\n\
-X KUBE-SEP-1\nCOMMIT\n"
        );
    }

    #[test]
    fn a_changed_or_emptied_chain_is_written_again() {
        let mut digests = ChainDigests::default();
        digests.record(FIRST);
        let next = "*filter\n:KUBE-SERVICES - [0:0]\nCOMMIT\n*nat\n:KUBE-SERVICES - [0:0]\n\
-A KUBE-SERVICES -d 10.96.0.1 -j KUBE-SVC-A\nCOMMIT\n";
        assert_eq!(
            digests.without_unchanged(next),
            "*filter\n:KUBE-SERVICES - [0:0]\nCOMMIT\n*nat\nCOMMIT\n",
            "the filter chain lost its REJECT rule; the nat chain is the same"
        );
    }

    #[test]
    fn same_chain_name_in_two_tables_is_tracked_per_table() {
        let mut digests = ChainDigests::default();
        digests.record(FIRST);
        let swapped = "*filter\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -d 10.96.0.1 -j KUBE-SVC-A\nCOMMIT\n";
        assert_eq!(digests.without_unchanged(swapped), swapped);
    }

    #[test]
    fn after_clear_or_a_deletion_everything_is_written() {
        let mut digests = ChainDigests::default();
        digests.record(FIRST);
        digests.record("*nat\n-X KUBE-SEP-1\nCOMMIT\n");
        let again = "*nat\n:KUBE-SEP-1 - [0:0]\n-A KUBE-SEP-1 -j DNAT --to-destination 10.244.1.2:80\nCOMMIT\n";
        assert_eq!(
            digests.without_unchanged(again),
            again,
            "a deleted chain is no longer known"
        );
        digests.clear();
        assert_eq!(digests.without_unchanged(FIRST), FIRST);
    }
}
