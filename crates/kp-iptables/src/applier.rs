//! Programming the kernel: `iptables-restore` for our chains, single
//! `iptables` commands for the jump rules in built-in chains and the canary.
//!
//! [`Applier`] is the seam between the backend and the kernel. Three
//! implementations exist:
//! - [`SystemApplier`] runs the iptables programs of one [`IptablesFlavor`]
//!   (`iptables-legacy-*`, `iptables-nft-*` or the `iptables` wrapper on the
//!   PATH), in the network namespace of the calling thread.
//! - [`FakeApplier`] keeps chains and jump rules in memory, for unit tests.
//! - [`DryRunApplier`] writes what would be programmed to a writer.

use std::fmt;
use std::io;

use kp_model::IpFamily;

use crate::jumps::{JumpRule, Table};

mod dry_run;
#[cfg(any(test, feature = "test-util"))]
mod fake;
mod sent_input;
mod system;

pub use dry_run::DryRunApplier;
#[cfg(any(test, feature = "test-util"))]
pub use fake::{FakeApplier, FakeCall, FakeKernel};
pub use system::SystemApplier;

/// Applies rules for one or both IP families.
///
/// Every method names the family: ip6tables programs are used for
/// [`IpFamily::V6`]. Methods take `&mut self` so a dry run can write and a
/// fake can record.
pub trait Applier: Send {
    /// `iptables-restore --noflush --counters -w 5 -W 100000` with `text` on
    /// stdin: each table in `text` is replaced atomically at its `COMMIT`
    /// (one table after the other; nothing spans tables).
    fn restore(&mut self, family: IpFamily, text: &str) -> Result<(), ApplyError>;

    /// [`Self::restore`] with input that `input` writes into a sink as it
    /// produces it, so that a large ruleset need not be held whole. An
    /// error of `input` (the sink's own, passed on) ends the restore with
    /// nothing more applied: the program gets no further input and is
    /// stopped before it could see a `COMMIT` that did not come.
    ///
    /// A [`ApplyError::RestoreLine`] from here has an empty `text` unless
    /// the applier kept the input: the caller, which can produce it again,
    /// names the line.
    ///
    /// By default the input is gathered and passed to [`Self::restore`].
    fn restore_streamed(
        &mut self,
        family: IpFamily,
        input: &mut dyn FnMut(&mut dyn RestoreSink) -> io::Result<()>,
    ) -> Result<(), ApplyError> {
        let mut text = String::new();
        input(&mut text).map_err(ApplyError::Write)?;
        self.restore(family, &text)
    }

    /// What `iptables-save -t TABLE` shows of `table`: the `KUBE-` chains
    /// and which of [`JUMP_RULES`](crate::jumps::JUMP_RULES) are present.
    fn save_table(&mut self, family: IpFamily, table: Table) -> Result<SavedTable, ApplyError>;

    /// Whether `chain` exists in `table` (`iptables -t TABLE -S CHAIN`).
    fn chain_exists(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
    ) -> Result<bool, ApplyError>;

    /// Creates `chain` in `table` unless it exists (`iptables -t TABLE -N
    /// CHAIN`).
    fn ensure_chain(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
    ) -> Result<(), ApplyError>;

    /// Removes `rule` from its built-in chain (`iptables -t TABLE -D CHAIN
    /// …`). Returns false when it was not there.
    fn delete_jump(&mut self, family: IpFamily, rule: &JumpRule) -> Result<bool, ApplyError>;

    /// Flushes and deletes `chain` (`iptables -t TABLE -F CHAIN`, then `-X
    /// CHAIN`). Returns false when it did not exist.
    fn flush_and_delete_chain(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
    ) -> Result<bool, ApplyError>;

    /// Marks the end of one sync. Only a dry run does something here: it
    /// writes what the sync would have done.
    fn end_sync(&mut self) -> Result<(), ApplyError> {
        Ok(())
    }
}

/// Where restore input goes as it is produced, in pieces of whole lines.
pub trait RestoreSink {
    /// Takes the next piece: one or more lines, each ending in `\n`.
    fn write_lines(&mut self, lines: &str) -> io::Result<()>;
}

impl RestoreSink for String {
    fn write_lines(&mut self, lines: &str) -> io::Result<()> {
        self.push_str(lines);
        Ok(())
    }
}

/// Which iptables programs to run. Hosts carry two implementations that do
/// not see each other's rules: the legacy one (x_tables in the kernel) and
/// the nft one (iptables syntax over nf_tables). kube-proxy must use the one
/// the rest of the host (kubelet, the CNI plugin) uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IptablesFlavor {
    /// `iptables-legacy`, `iptables-legacy-save`, `iptables-legacy-restore`.
    Legacy,
    /// `iptables-nft`, `iptables-nft-save`, `iptables-nft-restore`.
    Nft,
    /// `iptables`, `iptables-save`, `iptables-restore` as found on the PATH
    /// (whatever the distribution's alternatives point at).
    System,
}

/// One table as `iptables-save` shows it, reduced to what the proxy needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SavedTable {
    /// The chains whose names start with `KUBE-`.
    pub kube_chains: Vec<String>,
    /// The jump rules of [`JUMP_RULES`](crate::jumps::JUMP_RULES) found in
    /// the table's built-in chains.
    pub jumps: Vec<JumpRule>,
}

impl SavedTable {
    /// Whether `chain` exists.
    pub fn has_chain(&self, chain: &str) -> bool {
        self.kube_chains.iter().any(|c| c == chain)
    }

    /// Whether `rule` is in its built-in chain.
    pub fn has_jump(&self, rule: &JumpRule) -> bool {
        self.jumps.contains(rule)
    }
}

/// Why a command could not program the kernel.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The program could not be started.
    #[error("could not run {command} (is the iptables package installed?)")]
    Spawn {
        /// The command line.
        command: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The program ran and failed.
    #[error("{command} exited with {status}: {stderr}")]
    Failed {
        /// The command line.
        command: String,
        /// The exit status.
        status: String,
        /// What the program wrote to stderr.
        stderr: String,
    },
    /// `iptables-restore` rejected one line of its input; nothing of the
    /// input was applied.
    #[error("{command} rejected line {line} of its input ({text:?}): {stderr}")]
    RestoreLine {
        /// The command line.
        command: String,
        /// The 1-based line number.
        line: usize,
        /// The line.
        text: String,
        /// What the program wrote to stderr.
        stderr: String,
    },
    /// Writing restore input or a dry run's output failed.
    #[error("writing the rules failed")]
    Write(#[source] std::io::Error),
}

impl ApplyError {
    /// The program that could not be started because it is not installed,
    /// if that is what went wrong.
    pub fn missing_program(&self) -> Option<&str> {
        match self {
            ApplyError::Spawn { command, source }
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                command.split_whitespace().next()
            }
            _ => None,
        }
    }
}

impl IptablesFlavor {
    /// The program for `family` and `tool` (`""`, `"-save"` or
    /// `"-restore"`), e.g. `ip6tables-legacy-restore`.
    pub fn program(self, family: IpFamily, tool: Tool) -> String {
        let base = match family {
            IpFamily::V4 => "iptables",
            IpFamily::V6 => "ip6tables",
        };
        let flavor = match self {
            IptablesFlavor::Legacy => "-legacy",
            IptablesFlavor::Nft => "-nft",
            IptablesFlavor::System => "",
        };
        format!("{base}{flavor}{}", tool.suffix())
    }

    /// Picks the flavor the host uses, as upstream's iptables wrapper does:
    /// kubelet's `KUBE-IPTABLES-HINT` chain (kubelet ≥ 1.24) or its
    /// `KUBE-KUBELET-CANARY` chain in the mangle table names the flavor in
    /// use; failing that, the flavor holding more rules wins. With no rules
    /// anywhere, or without the `-legacy`/`-nft` programs, the `iptables`
    /// wrapper on the PATH is used.
    pub fn detect() -> IptablesFlavor {
        let chosen = Self::detect_with(save_all);
        tracing::info!(flavor = %chosen, "detected iptables flavor");
        chosen
    }

    /// [`IptablesFlavor::detect`] over `save`, which reads a flavor's IPv4
    /// rules (one table, or all). A flavor whose mangle table cannot be
    /// read is not read again for its rule count: it would fail (and warn)
    /// the same way.
    fn detect_with(
        save: impl Fn(IptablesFlavor, Option<Table>) -> Option<String>,
    ) -> IptablesFlavor {
        const MARKERS: [&str; 2] = ["KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"];
        let nft = save(IptablesFlavor::Nft, Some(Table::Mangle));
        let legacy = save(IptablesFlavor::Legacy, Some(Table::Mangle));
        for marker in MARKERS {
            let declared = |text: &Option<String>| {
                text.as_deref()
                    .is_some_and(|t| t.lines().any(|l| l.starts_with(&format!(":{marker} "))))
            };
            if declared(&nft) {
                return IptablesFlavor::Nft;
            }
            if declared(&legacy) {
                return IptablesFlavor::Legacy;
            }
        }
        let rules = |flavor, mangle: &Option<String>| {
            mangle.as_ref()?;
            save(flavor, None).map(|text| text.lines().filter(|l| l.starts_with('-')).count())
        };
        match (
            rules(IptablesFlavor::Legacy, &legacy),
            rules(IptablesFlavor::Nft, &nft),
        ) {
            (Some(legacy), Some(nft)) if legacy > nft => IptablesFlavor::Legacy,
            (Some(legacy), Some(nft)) if nft > legacy => IptablesFlavor::Nft,
            _ => IptablesFlavor::System,
        }
    }
}

impl fmt::Display for IptablesFlavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IptablesFlavor::Legacy => "legacy",
            IptablesFlavor::Nft => "nft",
            IptablesFlavor::System => "system",
        })
    }
}

/// One of the three programs of a flavor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    /// `iptables`
    Iptables,
    /// `iptables-save`
    Save,
    /// `iptables-restore`
    Restore,
}

impl Tool {
    fn suffix(self) -> &'static str {
        match self {
            Tool::Iptables => "",
            Tool::Save => "-save",
            Tool::Restore => "-restore",
        }
    }
}

/// The line number in an `iptables-restore` error: legacy and nft say
/// `line N failed`, a parse error says `Error occurred at line: N`.
pub fn restore_error_line(stderr: &str) -> Option<usize> {
    let number_after = |marker: &str| {
        let start = stderr.find(marker)? + marker.len();
        let digits: String = stderr[start..]
            .trim_start()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    };
    ["Error occurred at line:", "line "]
        .iter()
        .find_map(|marker| number_after(marker))
        .filter(|line| *line > 0)
}

/// The lines around 1-based `line` of `text`: up to `context` before and
/// after, each with its number, the failing one marked with `>`.
pub fn lines_around(text: &str, line: usize, context: usize) -> String {
    let first = line.saturating_sub(context).max(1);
    text.lines()
        .enumerate()
        .skip(first - 1)
        .take(line + context + 1 - first)
        .map(|(index, content)| {
            let mark = if index + 1 == line { '>' } else { ' ' };
            format!("{mark}{:>6} {content}", index + 1)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `iptables-save` output of `table` (all tables when `None`), or `None`
/// when the program is missing or fails.
fn save_all(flavor: IptablesFlavor, table: Option<Table>) -> Option<String> {
    let program = flavor.program(IpFamily::V4, Tool::Save);
    let mut command = std::process::Command::new(&program);
    if let Some(table) = table {
        command.args(["-t", table.as_str()]);
    }
    // A missing program says only that the flavor is not installed.
    let output = command.output().ok()?;
    if !output.status.success() {
        tracing::warn!(
            program,
            %output.status,
            stderr = %String::from_utf8_lossy(&output.stderr).trim(),
            "Cannot read this flavor's iptables tables, so the flavor is chosen without them (iptables-legacy needs CAP_NET_RAW as well as CAP_NET_ADMIN)"
        );
        return None;
    }
    Some(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_flavor_whose_tables_cannot_be_read_is_read_once() {
        use std::cell::RefCell;
        let reads = RefCell::new(Vec::new());
        let chosen = IptablesFlavor::detect_with(|flavor, table| {
            reads.borrow_mut().push((flavor, table));
            match flavor {
                IptablesFlavor::Legacy => None,
                _ => Some("*filter\n-A INPUT -j ACCEPT\nCOMMIT\n".to_owned()),
            }
        });
        assert_eq!(chosen, IptablesFlavor::System);
        let legacy_reads = reads
            .borrow()
            .iter()
            .filter(|(flavor, _)| *flavor == IptablesFlavor::Legacy)
            .count();
        assert_eq!(legacy_reads, 1, "{:?}", reads.borrow());
    }

    #[test]
    fn the_flavor_holding_more_rules_is_chosen() {
        let chosen = IptablesFlavor::detect_with(|flavor, table| {
            Some(match (flavor, table) {
                (IptablesFlavor::Legacy, None) => {
                    "-A INPUT -j ACCEPT\n-A FORWARD -j ACCEPT\n".to_owned()
                }
                (IptablesFlavor::Nft, None) => "-A INPUT -j ACCEPT\n".to_owned(),
                _ => String::new(),
            })
        });
        assert_eq!(chosen, IptablesFlavor::Legacy);
    }

    #[test]
    fn programs_of_each_flavor() {
        let restore = IptablesFlavor::Legacy.program(IpFamily::V4, Tool::Restore);
        assert_eq!(restore, "iptables-legacy-restore");
        let save = IptablesFlavor::Nft.program(IpFamily::V6, Tool::Save);
        assert_eq!(save, "ip6tables-nft-save");
        let plain = IptablesFlavor::System.program(IpFamily::V4, Tool::Iptables);
        assert_eq!(plain, "iptables");
    }

    #[test]
    fn failing_line_is_found_in_legacy_nft_and_parse_errors() {
        assert_eq!(
            restore_error_line("iptables-restore: line 4 failed\n"),
            Some(4)
        );
        let nft = "iptables-nft-restore: line 12 failed: No chain/target/match by that name.";
        assert_eq!(restore_error_line(nft), Some(12));
        let parse = "iptables-restore v1.8.9 (legacy): Couldn't load match `foo':No such file \
                     or directory\n\nError occurred at line: 3\nTry `iptables-restore -h'";
        assert_eq!(restore_error_line(parse), Some(3));
        assert_eq!(
            restore_error_line("Another app is currently holding the xtables lock"),
            None
        );
    }

    #[test]
    fn neighbours_of_the_failing_line() {
        let text = "a\nb\nc\nd\ne\nf\n";
        assert_eq!(
            lines_around(text, 2, 2),
            "      1 a\n>     2 b\n      3 c\n      4 d"
        );
        assert_eq!(lines_around(text, 6, 2).lines().count(), 3);
    }
}
