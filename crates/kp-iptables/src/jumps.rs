//! Jump rules from the built-in chains into ours.
//!
//! iptables-restore with `--noflush` cannot own a built-in chain without
//! replacing everyone else's rules in it, so these rules are ensured one by
//! one on every full sync, as upstream's `EnsureRule(Prepend, …)` does:
//! `iptables -t filter -C INPUT <args>` and, when missing,
//! `iptables -t filter -I INPUT <args>`.

use std::fmt;

use crate::names::{
    KUBE_EXTERNAL_SERVICES, KUBE_FIREWALL, KUBE_FORWARD, KUBE_NODEPORTS, KUBE_POSTROUTING,
    KUBE_PROXY_FIREWALL, KUBE_SERVICES,
};

/// An iptables table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// `filter`
    Filter,
    /// `nat`
    Nat,
    /// `mangle` (only the canary chain lives here)
    Mangle,
}

/// One rule in a built-in chain that jumps to one of our chains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JumpRule {
    /// The table.
    pub table: Table,
    /// The built-in chain holding the rule (`INPUT`, `PREROUTING`, …).
    pub builtin_chain: &'static str,
    /// Our chain the rule jumps to.
    pub target_chain: &'static str,
    /// The rule's comment (none for kubelet's KUBE-FIREWALL jumps).
    pub comment: Option<&'static str>,
    /// Only packets of new connections (`-m conntrack --ctstate NEW`).
    pub only_new: bool,
    /// The chain is kubelet's too: ensured, but never removed by cleanup.
    pub shared_with_kubelet: bool,
}

const PORTALS: &str = "kubernetes service portals";
const EXTERNAL_PORTALS: &str = "kubernetes externally-visible service portals";
const FIREWALL: &str = "kubernetes load balancer firewall";

/// Every jump rule, in the order upstream ensures them. Each is prepended,
/// so on a clean host a built-in chain ends up holding them in reverse order.
pub const JUMP_RULES: &[JumpRule] = &[
    jump(
        Table::Filter,
        "INPUT",
        KUBE_EXTERNAL_SERVICES,
        Some(EXTERNAL_PORTALS),
        true,
    ),
    jump(
        Table::Filter,
        "FORWARD",
        KUBE_EXTERNAL_SERVICES,
        Some(EXTERNAL_PORTALS),
        true,
    ),
    jump(
        Table::Filter,
        "INPUT",
        KUBE_NODEPORTS,
        Some("kubernetes health check service ports"),
        false,
    ),
    jump(Table::Filter, "FORWARD", KUBE_SERVICES, Some(PORTALS), true),
    jump(Table::Filter, "OUTPUT", KUBE_SERVICES, Some(PORTALS), true),
    jump(
        Table::Filter,
        "FORWARD",
        KUBE_FORWARD,
        Some("kubernetes forwarding rules"),
        false,
    ),
    jump(
        Table::Filter,
        "INPUT",
        KUBE_PROXY_FIREWALL,
        Some(FIREWALL),
        true,
    ),
    jump(
        Table::Filter,
        "OUTPUT",
        KUBE_PROXY_FIREWALL,
        Some(FIREWALL),
        true,
    ),
    jump(
        Table::Filter,
        "FORWARD",
        KUBE_PROXY_FIREWALL,
        Some(FIREWALL),
        true,
    ),
    jump(Table::Nat, "OUTPUT", KUBE_SERVICES, Some(PORTALS), false),
    jump(
        Table::Nat,
        "PREROUTING",
        KUBE_SERVICES,
        Some(PORTALS),
        false,
    ),
    jump(
        Table::Nat,
        "POSTROUTING",
        KUBE_POSTROUTING,
        Some("kubernetes postrouting rules"),
        false,
    ),
    kubelet_jump("INPUT"),
    kubelet_jump("OUTPUT"),
];

impl Table {
    /// The name iptables uses (`-t filter`).
    pub fn as_str(self) -> &'static str {
        match self {
            Table::Filter => "filter",
            Table::Nat => "nat",
            Table::Mangle => "mangle",
        }
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl JumpRule {
    /// The rule's arguments as separate words, ready for
    /// `iptables -t <table> -C|-I|-D <builtin_chain> <args…>`.
    pub fn args(&self) -> Vec<&'static str> {
        let mut args = Vec::with_capacity(10);
        if self.only_new {
            args.extend(["-m", "conntrack", "--ctstate", "NEW"]);
        }
        if let Some(comment) = self.comment {
            args.extend(["-m", "comment", "--comment", comment]);
        }
        args.extend(["-j", self.target_chain]);
        args
    }

    /// The rule as an iptables-restore line (`-A INPUT … -j KUBE-…`), with
    /// the comment quoted.
    pub fn restore_line(&self) -> String {
        let words: Vec<String> = self
            .args()
            .into_iter()
            .map(|word| {
                if word.contains(' ') {
                    format!("\"{word}\"")
                } else {
                    word.to_owned()
                }
            })
            .collect();
        format!("-A {} {}", self.builtin_chain, words.join(" "))
    }

    /// The rule as an iptables-restore line that prepends it
    /// (`-I INPUT … -j KUBE-…`), as upstream inserts it.
    pub fn insert_line(&self) -> String {
        let line = self.restore_line();
        let rest = line.strip_prefix("-A ").unwrap_or(&line);
        format!("-I {rest}")
    }
}

const fn jump(
    table: Table,
    builtin_chain: &'static str,
    target_chain: &'static str,
    comment: Option<&'static str>,
    only_new: bool,
) -> JumpRule {
    JumpRule {
        table,
        builtin_chain,
        target_chain,
        comment,
        only_new,
        shared_with_kubelet: false,
    }
}

const fn kubelet_jump(builtin_chain: &'static str) -> JumpRule {
    JumpRule {
        table: Table::Filter,
        builtin_chain,
        target_chain: KUBE_FIREWALL,
        comment: None,
        only_new: false,
        shared_with_kubelet: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_match_upstream_order() {
        let input_external = JUMP_RULES[0];
        assert_eq!(
            input_external.args(),
            [
                "-m",
                "conntrack",
                "--ctstate",
                "NEW",
                "-m",
                "comment",
                "--comment",
                "kubernetes externally-visible service portals",
                "-j",
                "KUBE-EXTERNAL-SERVICES"
            ]
        );
        assert_eq!(
            JUMP_RULES[10].restore_line(),
            "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
        );
        assert_eq!(JUMP_RULES[13].restore_line(), "-A OUTPUT -j KUBE-FIREWALL");
    }
}
