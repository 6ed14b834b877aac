//! The real applier: runs the iptables programs of one flavor.

use std::io::{self, Write};
use std::process::{Command, Output, Stdio};

use kp_model::IpFamily;

use super::{
    lines_around, restore_error_line, Applier, ApplyError, IptablesFlavor, SavedTable, Tool,
};
use crate::jumps::{JumpRule, Table, JUMP_RULES};

/// Wait up to 5 s for the xtables lock, polling every 100 ms: upstream's
/// `-w 5 -W 100000` (iptables ≥ 1.6.2), so that kube-proxy and other users
/// of the lock (kubelet, CNI plugins) take turns instead of failing.
const WAIT_ARGS: [&str; 4] = ["-w", "5", "-W", "100000"];

/// Lines shown on each side of a line `iptables-restore` rejected.
const ERROR_CONTEXT_LINES: usize = 2;

/// Runs `iptables`, `iptables-save` and `iptables-restore` (or their
/// ip6tables twins) of one [`IptablesFlavor`]. The programs run in the
/// network namespace of the calling thread, unless
/// [`in_network_namespace`](SystemApplier::in_network_namespace) says
/// otherwise.
#[derive(Debug, Clone)]
pub struct SystemApplier {
    flavor: IptablesFlavor,
    prefix: Vec<String>,
}

impl SystemApplier {
    /// An applier running the programs of `flavor`.
    pub fn new(flavor: IptablesFlavor) -> Self {
        Self {
            flavor,
            prefix: Vec::new(),
        }
    }

    /// Runs every program through `ip netns exec NAME`, in that named
    /// network namespace (benchmarks and tools; the proxy itself runs in the
    /// namespace it programs).
    pub fn in_network_namespace(mut self, name: &str) -> Self {
        self.prefix = ["ip", "netns", "exec", name].map(String::from).to_vec();
        self
    }

    /// The flavor whose programs this applier runs.
    pub fn flavor(&self) -> IptablesFlavor {
        self.flavor
    }

    fn command(&self, family: IpFamily, tool: Tool) -> (Command, String) {
        let program = self.flavor.program(family, tool);
        let mut words = self.prefix.clone();
        words.push(program);
        let mut command = Command::new(&words[0]);
        command.args(&words[1..]);
        (command, words.join(" "))
    }

    /// Runs `iptables [-w…] -t TABLE ARGS…` and returns its output, whatever
    /// the exit status.
    fn iptables(
        &self,
        family: IpFamily,
        table: Table,
        args: &[&str],
    ) -> Result<(Output, String), ApplyError> {
        let (mut command, mut line) = self.command(family, Tool::Iptables);
        command
            .args(WAIT_ARGS)
            .args(["-t", table.as_str()])
            .args(args);
        line = format!("{line} -t {table} {}", args.join(" "));
        let output = command
            .stdin(Stdio::null())
            .output()
            .map_err(|source| ApplyError::Spawn {
                command: line.clone(),
                source,
            })?;
        Ok((output, line))
    }

    /// Runs an iptables command that must succeed.
    fn iptables_ok(&self, family: IpFamily, table: Table, args: &[&str]) -> Result<(), ApplyError> {
        let (output, command) = self.iptables(family, table, args)?;
        if output.status.success() {
            Ok(())
        } else {
            Err(failed(command, &output))
        }
    }
}

impl Applier for SystemApplier {
    fn restore(&mut self, family: IpFamily, text: &str) -> Result<(), ApplyError> {
        let (mut command, line) = self.command(family, Tool::Restore);
        let command_line = format!("{line} --noflush --counters {}", WAIT_ARGS.join(" "));
        let spawn_error = |source| ApplyError::Spawn {
            command: command_line.clone(),
            source,
        };
        // The unversioned programs may be either flavor; legacy accepts the
        // listing too.
        let listings = match self.flavor {
            IptablesFlavor::Nft | IptablesFlavor::System => whole_table_listings(text),
            IptablesFlavor::Legacy => Vec::new(),
        };
        // Standard output carries only the listings added above.
        let mut child = command
            .args(["--noflush", "--counters"])
            .args(WAIT_ARGS)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_error)?;
        let written = match child.stdin.take() {
            Some(mut stdin) => write_with_listings(&mut stdin, text, &listings),
            None => Ok(()),
        };
        let output = child.wait_with_output().map_err(spawn_error)?;
        if output.status.success() {
            // A write error without a failed exit cannot happen: restore
            // reads all of stdin before it commits.
            return written.map_err(spawn_error);
        }
        Err(restore_failed(command_line, &output, text, &listings))
    }

    fn save_table(&mut self, family: IpFamily, table: Table) -> Result<SavedTable, ApplyError> {
        let (mut command, line) = self.command(family, Tool::Save);
        let line = format!("{line} -t {table}");
        let mut child = command
            .args(["-t", table.as_str()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| ApplyError::Spawn {
                command: line.clone(),
                source,
            })?;
        // The listing is read line by line and only what the proxy needs is
        // kept: the nat table of 10,000 Services is 9 MB of text, which
        // `Command::output` would hold whole (and copy while growing its
        // buffer) at the full sync's memory peak. iptables-save writes a
        // line or two to stderr at most, so its pipe cannot fill meanwhile.
        let mut saved = SavedTableParser::new(table);
        let read = match child.stdout.take() {
            Some(stdout) => read_lines(stdout, |text| saved.line(text)),
            None => Ok(()),
        };
        let output = child
            .wait_with_output()
            .map_err(|source| ApplyError::Spawn {
                command: line.clone(),
                source,
            })?;
        if !output.status.success() {
            return Err(failed(line, &output));
        }
        read.map_err(|error| ApplyError::Failed {
            command: line,
            status: "its output could not be read".to_owned(),
            stderr: error.to_string(),
        })?;
        Ok(saved.finish())
    }

    fn chain_exists(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
    ) -> Result<bool, ApplyError> {
        let (output, command) = self.iptables(family, table, &["-S", chain])?;
        match output.status.code() {
            Some(0) => Ok(true),
            // Exit status 1: no such chain (nft may also call it
            // "incompatible" when legacy tables exist in the namespace).
            Some(1) => Ok(false),
            _ => Err(failed(command, &output)),
        }
    }

    fn ensure_chain(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
    ) -> Result<(), ApplyError> {
        let (output, command) = self.iptables(family, table, &["-N", chain])?;
        if output.status.success() || stderr(&output).contains("already exists") {
            return Ok(());
        }
        // Some versions word it differently; the chain existing is what
        // counts.
        if self.chain_exists(family, table, chain)? {
            return Ok(());
        }
        Err(failed(command, &output))
    }

    fn delete_jump(&mut self, family: IpFamily, rule: &JumpRule) -> Result<bool, ApplyError> {
        let mut delete = vec!["-D", rule.builtin_chain];
        delete.extend(rule.args());
        let (output, command) = self.iptables(family, rule.table, &delete)?;
        if output.status.success() {
            Ok(true)
        } else if is_not_found(&output) {
            Ok(false)
        } else {
            Err(failed(command, &output))
        }
    }

    fn flush_and_delete_chain(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
    ) -> Result<bool, ApplyError> {
        let (output, command) = self.iptables(family, table, &["-F", chain])?;
        if !output.status.success() {
            return if is_not_found(&output) {
                Ok(false)
            } else {
                Err(failed(command, &output))
            };
        }
        self.iptables_ok(family, table, &["-X", chain])?;
        Ok(true)
    }
}

/// The `KUBE-*` chains declared in `iptables-save` output of `table`, and
/// the jump rules present in its built-in chains. A jump rule is found by
/// its exact text; one printed differently counts as missing, which costs
/// an `iptables -C` later, never a wrong answer.
/// [`SavedTableParser`] over a whole listing at once.
#[cfg(test)]
fn saved_table(table: Table, save: &str) -> SavedTable {
    let mut parser = SavedTableParser::new(table);
    save.lines().for_each(|line| parser.line(line));
    parser.finish()
}

/// Reads `iptables-save -t TABLE` output a line at a time into a
/// [`SavedTable`].
struct SavedTableParser {
    /// The jump rules of the table, as `iptables-save` prints them.
    jump_lines: Vec<(String, &'static JumpRule)>,
    saved: SavedTable,
}

impl SavedTableParser {
    fn new(table: Table) -> Self {
        let jump_lines = JUMP_RULES
            .iter()
            .filter(|rule| rule.table == table)
            .map(|rule| (rule.restore_line(), rule))
            .collect();
        Self {
            jump_lines,
            saved: SavedTable::default(),
        }
    }

    fn line(&mut self, line: &str) {
        if let Some(rest) = line.strip_prefix(':') {
            let chain = rest.split_whitespace().next().unwrap_or_default();
            if chain.starts_with("KUBE-") {
                self.saved.kube_chains.push(chain.to_owned());
            }
        } else if line.starts_with("-A ") && !line.starts_with("-A KUBE-") {
            let found = self.jump_lines.iter().find(|(text, _)| text == line);
            if let Some((_, rule)) = found {
                self.saved.jumps.push(**rule);
            }
        }
    }

    fn finish(self) -> SavedTable {
        self.saved
    }
}

/// Hands each line of `input` (without its line end) to `each`.
fn read_lines(input: impl io::Read, mut each: impl FnMut(&str)) -> io::Result<()> {
    let mut reader = io::BufReader::new(input);
    let mut buffer = Vec::new();
    loop {
        buffer.clear();
        if io::BufRead::read_until(&mut reader, b'\n', &mut buffer)? == 0 {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&buffer);
        each(text.trim_end_matches(['\n', '\r']));
    }
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr)
        .lines()
        .filter(|line| !line.contains("deprecated --wait-interval"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A missing rule, chain or jump target: exit status 1, or legacy's
/// complaint about a target chain that does not exist.
fn is_not_found(output: &Output) -> bool {
    let text = stderr(output);
    output.status.code() == Some(1)
        || text.contains("Couldn't load target")
        || text.contains("does not exist")
        || text.contains("No chain/target/match")
}

fn failed(command: String, output: &Output) -> ApplyError {
    ApplyError::Failed {
        command,
        status: output.status.to_string(),
        stderr: stderr(output),
    }
}

/// A table section of restore input big enough for iptables-nft-restore
/// to spend more time on its list of named chains than on a listing of the
/// table; see [`whole_table_listings`].
const WHOLE_TABLE_CACHE_MIN_CHAINS: usize = 1000;

/// Lines added to the input: a `-S` line and the declarations of the
/// built-in chains the section inserts into, where they go (byte offset in
/// the original input) and the 1-based number of the original line they
/// follow.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Listing {
    offset: usize,
    after_line: usize,
    builtin_chains: Vec<String>,
}

/// The nat table's built-in chains. Their policy can only be ACCEPT
/// (iptables inhibits DROP in nat), so declaring them `ACCEPT` changes
/// nothing but their policy counters.
const NAT_BUILTIN_CHAINS: [&str; 4] = ["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"];

impl Listing {
    /// How many lines it adds.
    fn len(&self) -> usize {
        1 + self.builtin_chains.len()
    }
}

/// Where to add a `-S` command to the restore input of iptables-nft: right
/// after the `*table` line of each section declaring at least
/// [`WHOLE_TABLE_CACHE_MIN_CHAINS`] chains.
///
/// iptables-nft-restore (1.8.x) notes every chain a command names in a
/// sorted linked list, to fetch only those chains from the kernel later.
/// Each insertion walks the list, so a restore declaring N chains costs
/// O(N²) string comparisons: 42 s of CPU for the nat table of 10,000
/// Services, almost all of upstream kube-proxy's full-sync time on this
/// backend. One command that names no chain makes it fetch the whole table
/// instead and stop keeping the list. `-S` (list the table's rules) is the
/// only such command without side effects; its output is discarded. It
/// costs one listing of the table (about 0.8 s at 10,000 Services), so
/// small restores, e.g. partial syncs, go without it.
///
/// With the whole table fetched, iptables-nft no longer creates a missing
/// built-in chain for a rule inserted into it ("RULE_INSERT failed (No such
/// file or directory): rule in chain OUTPUT"), as on a fresh host whose nat
/// table holds only the canary chain. So the nat built-in chains a section
/// inserts jump rules into are declared right after the `-S`.
fn whole_table_listings(text: &str) -> Vec<Listing> {
    let mut listings = Vec::new();
    let mut section: Option<(Listing, usize, bool)> = None;
    let mut offset = 0;
    for (index, line) in text.split_inclusive('\n').enumerate() {
        offset += line.len();
        let content = line.trim_end();
        if let Some(table) = content.strip_prefix('*') {
            let listing = Listing {
                offset,
                after_line: index + 1,
                builtin_chains: Vec::new(),
            };
            section = Some((listing, 0, table == "nat"));
        } else if content.starts_with(':') {
            if let Some((_, chains, _)) = section.as_mut() {
                *chains += 1;
            }
        } else if let Some(rule) = content.strip_prefix("-I ") {
            if let Some((listing, _, true)) = section.as_mut() {
                let chain = rule.split_whitespace().next().unwrap_or_default();
                let builtin = NAT_BUILTIN_CHAINS.contains(&chain);
                if builtin && !listing.builtin_chains.iter().any(|c| c == chain) {
                    listing.builtin_chains.push(chain.to_owned());
                }
            }
        } else if content == "COMMIT" {
            if let Some((listing, chains, _)) = section.take() {
                if chains >= WHOLE_TABLE_CACHE_MIN_CHAINS {
                    listings.push(listing);
                }
            }
        }
    }
    listings
}

/// Writes `text` with the lines of each of `listings` added.
fn write_with_listings(out: &mut impl Write, text: &str, listings: &[Listing]) -> io::Result<()> {
    let mut start = 0;
    for listing in listings {
        out.write_all(&text.as_bytes()[start..listing.offset])?;
        out.write_all(b"-S\n")?;
        for chain in &listing.builtin_chains {
            writeln!(out, ":{chain} ACCEPT [0:0]")?;
        }
        start = listing.offset;
    }
    out.write_all(&text.as_bytes()[start..])
}

/// The line of the original input that line `sent` of the input as written
/// (with `listings` added) came from; `None` for an added line.
fn original_line(sent: usize, listings: &[Listing]) -> Option<usize> {
    let mut added = 0;
    for listing in listings {
        let first_added = listing.after_line + added + 1;
        if sent < first_added {
            break;
        }
        if sent < first_added + listing.len() {
            return None;
        }
        added += listing.len();
    }
    Some(sent - added)
}

/// The error of a failed restore, naming the rejected line when the
/// program said which; the line and its neighbours are logged.
fn restore_failed(
    command: String,
    output: &Output,
    input: &str,
    listings: &[Listing],
) -> ApplyError {
    let stderr = stderr(output);
    let reported = restore_error_line(&stderr).and_then(|sent| original_line(sent, listings));
    let Some(line) = reported else {
        tracing::error!(%command, %stderr, "iptables-restore failed");
        return ApplyError::Failed {
            command,
            status: output.status.to_string(),
            stderr,
        };
    };
    let text = input.lines().nth(line - 1).unwrap_or_default().to_owned();
    tracing::error!(
        %command,
        line,
        rule = %text,
        context = %lines_around(input, line, ERROR_CONTEXT_LINES),
        %stderr,
        "iptables-restore rejected a line of its input"
    );
    ApplyError::RestoreLine {
        command,
        line,
        text,
        stderr,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_listing_is_read_line_by_line_whatever_its_last_line_ends_with() {
        let mut lines = Vec::new();
        read_lines(
            &b":KUBE-A - [0:0]\r\n:KUBE-B - [0:0]\n\nCOMMIT"[..],
            |line| {
                lines.push(line.to_owned());
            },
        )
        .unwrap();
        assert_eq!(lines, [":KUBE-A - [0:0]", ":KUBE-B - [0:0]", "", "COMMIT"]);
    }

    #[test]
    fn only_kube_chains_and_our_exact_jump_rules_are_listed() {
        let portals =
            "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES";
        let save = format!(
            "# Generated by iptables-save\n*nat\n:PREROUTING ACCEPT [0:0]\n\
             :KUBE-SERVICES - [0:0]\n:DOCKER - [0:0]\n:KUBE-SEP-ABC - [3:180]\n\
             -A PREROUTING -j KUBE-SERVICES\n{portals}\n-A OUTPUT -j DOCKER\nCOMMIT\n"
        );
        let saved = saved_table(Table::Nat, &save);
        assert_eq!(saved.kube_chains, ["KUBE-SERVICES", "KUBE-SEP-ABC"]);
        let jumps: Vec<String> = saved.jumps.iter().map(JumpRule::restore_line).collect();
        assert_eq!(jumps, [portals], "the comment-less jump is someone else's");
    }

    #[test]
    fn a_missing_program_names_the_command() {
        let mut applier = SystemApplier::new(IptablesFlavor::Legacy);
        applier.prefix = vec!["/nonexistent/kp-test-program".to_owned()];
        let error = applier.restore(IpFamily::V4, "*nat\nCOMMIT\n").unwrap_err();
        let message = error.to_string();
        assert!(message.contains("iptables-legacy-restore --noflush --counters -w 5"));
        assert!(matches!(error, ApplyError::Spawn { .. }));
    }

    fn section(table: &str, chains: usize) -> String {
        let mut text = format!("*{table}\n");
        for n in 0..chains {
            text.push_str(&format!(":KUBE-C{n} - [0:0]\n"));
        }
        text.push_str("-A KUBE-C0 -j RETURN\nCOMMIT\n");
        text
    }

    #[test]
    fn only_sections_with_many_chains_get_a_listing() {
        let text = section("filter", 3) + &section("nat", WHOLE_TABLE_CACHE_MIN_CHAINS);
        let listings = whole_table_listings(&text);
        assert_eq!(listings.len(), 1);
        let mut sent = Vec::new();
        write_with_listings(&mut sent, &text, &listings).unwrap();
        let sent = String::from_utf8(sent).unwrap();
        assert!(sent.starts_with(&section("filter", 3)));
        assert!(sent[section("filter", 3).len()..].starts_with("*nat\n-S\n:KUBE-C0 - [0:0]\n"));
        assert_eq!(sent.len(), text.len() + 3);
    }

    #[test]
    fn small_input_is_sent_as_it_is() {
        let text = section("nat", 10);
        assert!(whole_table_listings(&text).is_empty());
    }

    #[test]
    fn error_lines_of_the_sent_input_map_back_to_the_original() {
        // Original: 1 *filter, 2 COMMIT, 3 *nat, 4 :A, 5 COMMIT; a listing
        // after lines 1 and 3.
        let listings = [
            Listing {
                offset: 8,
                after_line: 1,
                builtin_chains: Vec::new(),
            },
            Listing {
                offset: 20,
                after_line: 3,
                builtin_chains: vec!["OUTPUT".to_owned()],
            },
        ];
        let mapped: Vec<_> = (1..=8).map(|sent| original_line(sent, &listings)).collect();
        assert_eq!(
            mapped,
            [
                Some(1),
                None,
                Some(2),
                Some(3),
                None,
                None,
                Some(4),
                Some(5)
            ]
        );
    }

    #[test]
    fn a_large_nat_section_inserting_jumps_declares_their_builtin_chains() {
        let mut nat = section("nat", WHOLE_TABLE_CACHE_MIN_CHAINS);
        let jumps = "-I OUTPUT -j KUBE-C0\n-I PREROUTING -j KUBE-C0\n-I OUTPUT -j KUBE-C1\n";
        nat.insert_str(nat.len() - "COMMIT\n".len(), jumps);
        let filter = "*filter\n:KUBE-F - [0:0]\n-I INPUT -j KUBE-F\nCOMMIT\n";
        let text = format!("{filter}{nat}");

        let listings = whole_table_listings(&text);
        let mut sent = Vec::new();
        write_with_listings(&mut sent, &text, &listings).unwrap();
        let sent = String::from_utf8(sent).unwrap();

        assert!(sent.starts_with(filter), "filter's INPUT is left alone");
        assert!(sent[filter.len()..].starts_with(
            "*nat\n-S\n:OUTPUT ACCEPT [0:0]\n:PREROUTING ACCEPT [0:0]\n:KUBE-C0 - [0:0]\n"
        ));
        let jump_line = text
            .lines()
            .position(|l| l == "-I PREROUTING -j KUBE-C0")
            .unwrap()
            + 1;
        let sent_line = sent
            .lines()
            .position(|l| l == "-I PREROUTING -j KUBE-C0")
            .unwrap()
            + 1;
        assert_eq!(original_line(sent_line, &listings), Some(jump_line));
    }
}
