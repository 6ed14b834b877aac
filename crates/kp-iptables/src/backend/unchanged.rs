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
    digests: HashMap<(String, String), u64>,
}

/// One restore input, split into what each declared chain holds.
struct Parsed<'a> {
    /// `(table, chain)` → digest of its `-A` lines, for declared chains.
    chains: HashMap<(&'a str, &'a str), u64>,
    /// Chains deleted with `-X`.
    deleted: Vec<(&'a str, &'a str)>,
}

impl ChainDigests {
    /// Forgets everything (the kernel may hold anything).
    pub fn clear(&mut self) {
        self.digests.clear();
    }

    /// Records what a successful restore of `text` left in the kernel.
    pub fn record(&mut self, text: &str) {
        let parsed = parse(text);
        for ((table, chain), digest) in parsed.chains {
            self.digests
                .insert((table.to_owned(), chain.to_owned()), digest);
        }
        for (table, chain) in parsed.deleted {
            self.digests.remove(&(table.to_owned(), chain.to_owned()));
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
                let key = ((*table).to_owned(), (*chain).to_owned());
                self.digests.get(&key) == Some(*digest)
            })
            .map(|(key, _)| *key)
            .collect();
        if unchanged.is_empty() {
            return Cow::Borrowed(text);
        }
        let mut out = String::with_capacity(text.len());
        let mut table = "";
        for line in text.lines() {
            if let Some(name) = line.strip_prefix('*') {
                table = name;
            }
            let skip = chain_of(line).is_some_and(|chain| unchanged.contains(&(table, chain)));
            if !skip {
                out.push_str(line);
                out.push('\n');
            }
        }
        Cow::Owned(out)
    }
}

/// The chain a declaration (`:CHAIN - [0:0]`) or rule (`-A CHAIN …`) line
/// belongs to.
fn chain_of(line: &str) -> Option<&str> {
    let rest = line
        .strip_prefix(':')
        .or_else(|| line.strip_prefix("-A "))?;
    rest.split(' ').next()
}

fn parse(text: &str) -> Parsed<'_> {
    let mut hashers: HashMap<(&str, &str), DefaultHasher> = HashMap::new();
    let mut deleted = Vec::new();
    let mut table = "";
    for line in text.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = name;
        } else if let Some(rest) = line.strip_prefix(':') {
            let chain = rest.split(' ').next().unwrap_or(rest);
            hashers.insert((table, chain), DefaultHasher::new());
        } else if let Some(rest) = line.strip_prefix("-A ") {
            let chain = rest.split(' ').next().unwrap_or(rest);
            // Rules of a chain this input does not declare are appended
            // without a flush; such a chain is never left out (no digest).
            if let Some(hasher) = hashers.get_mut(&(table, chain)) {
                line.hash(hasher);
            }
        } else if let Some(rest) = line.strip_prefix("-X ") {
            deleted.push((table, rest.trim()));
        }
    }
    let chains = hashers
        .into_iter()
        .map(|(key, hasher)| (key, hasher.finish()))
        .collect();
    Parsed { chains, deleted }
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
