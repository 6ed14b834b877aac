//! The real applier: runs the iptables programs of one flavor.

use std::io;
use std::process::{Command, Output, Stdio};

use kp_model::IpFamily;

use super::sent_input::{LineMapping, SentInput};
use super::{
    lines_around, restore_error_line, Applier, ApplyError, IptablesFlavor, RestoreSink, SavedTable,
    Tool,
};
use crate::jumps::{JumpRule, Table, JUMP_RULES};

/// Wait up to 5 s for the xtables lock, polling every 100 ms: upstream's
/// `-w 5 -W 100000` (iptables ≥ 1.6.2), so that kube-proxy and other users
/// of the lock (kubelet, CNI plugins) take turns instead of failing.
const WAIT_ARGS: [&str; 4] = ["-w", "5", "-W", "100000"];

/// The buffer between the renderer's pieces and the restore program's
/// pipe: lines added for iptables-nft go out in few writes.
const PIPE_BUFFER_BYTES: usize = 64 * 1024;

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

    /// The whole `iptables-save -t TABLE` output of `table` (the
    /// ip6tables program for IPv6), every chain and rule of whoever wrote
    /// them, for tools that read the kernel's state back (`kube-proxy
    /// trace`). Syncs use [`Applier::save_table`], which keeps only what
    /// they need.
    pub fn save_text(&self, family: IpFamily, table: Table) -> Result<String, ApplyError> {
        let (mut command, line) = self.command(family, Tool::Save);
        let line = format!("{line} -t {table}");
        let output = command
            .args(["-t", table.as_str()])
            .stdin(Stdio::null())
            .output()
            .map_err(|source| ApplyError::Spawn {
                command: line.clone(),
                source,
            })?;
        if !output.status.success() {
            return Err(failed(line, &output));
        }
        String::from_utf8(output.stdout).map_err(|error| ApplyError::Failed {
            command: line,
            status: "its output is not UTF-8".to_owned(),
            stderr: error.to_string(),
        })
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

    /// Runs the restore program with what `input` writes on its standard
    /// input; `text` is the whole input when the caller has it, for naming
    /// a rejected line.
    fn run_restore(
        &mut self,
        family: IpFamily,
        input: &mut dyn FnMut(&mut dyn RestoreSink) -> io::Result<()>,
        text: Option<&str>,
    ) -> Result<(), ApplyError> {
        let (mut command, line) = self.command(family, Tool::Restore);
        let command_line = format!("{line} --noflush --counters {}", WAIT_ARGS.join(" "));
        let spawn_error = |source| ApplyError::Spawn {
            command: command_line.clone(),
            source,
        };
        // Standard output carries only the listings `SentInput` adds.
        let mut child = command
            .args(["--noflush", "--counters"])
            .args(WAIT_ARGS)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_error)?;
        // The unversioned programs may be either flavor; legacy accepts the
        // listing too.
        let listings = matches!(self.flavor, IptablesFlavor::Nft | IptablesFlavor::System);
        let stdin = child
            .stdin
            .take()
            .map(|stdin| io::BufWriter::with_capacity(PIPE_BUFFER_BYTES, stdin));
        let mut sent = stdin.map(|stdin| SentInput::new(stdin, listings));
        let written = match sent.as_mut() {
            Some(sent) => input(sent).and_then(|()| sent.finish()),
            None => Ok(()),
        };
        if written.is_err() {
            // The input stopped short (the program went away, or the
            // producer failed): make sure no part of it is committed.
            let _ = child.kill();
        }
        // Closes the pipe: the input ends.
        let mapping = sent.map(SentInput::into_mapping);
        let output = child.wait_with_output().map_err(spawn_error)?;
        if output.status.success() {
            // A write error without a failed exit cannot happen: restore
            // reads all of stdin before it commits.
            return written.map_err(spawn_error);
        }
        Err(restore_failed(
            command_line,
            &output,
            text,
            mapping.as_ref(),
        ))
    }
}

impl Applier for SystemApplier {
    fn restore(&mut self, family: IpFamily, text: &str) -> Result<(), ApplyError> {
        self.run_restore(family, &mut |sink| sink.write_lines(text), Some(text))
    }

    fn restore_streamed(
        &mut self,
        family: IpFamily,
        input: &mut dyn FnMut(&mut dyn RestoreSink) -> io::Result<()>,
    ) -> Result<(), ApplyError> {
        self.run_restore(family, input, None)
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

/// The error of a failed restore, naming the rejected line when the
/// program said which; with the whole input at hand, the line and its
/// neighbours are logged (otherwise the caller names it).
fn restore_failed(
    command: String,
    output: &Output,
    input: Option<&str>,
    sent: Option<&LineMapping>,
) -> ApplyError {
    let stderr = stderr(output);
    let reported = restore_error_line(&stderr)
        .and_then(|line| sent.map_or(Some(line), |sent| sent.original_line(line)));
    let Some(line) = reported else {
        tracing::error!(%command, %stderr, "iptables-restore failed");
        return ApplyError::Failed {
            command,
            status: output.status.to_string(),
            stderr,
        };
    };
    let text = match input {
        Some(input) => {
            let text = input.lines().nth(line - 1).unwrap_or_default().to_owned();
            tracing::error!(
                %command,
                line,
                rule = %text,
                context = %lines_around(input, line, ERROR_CONTEXT_LINES),
                %stderr,
                "iptables-restore rejected a line of its input"
            );
            text
        }
        None => String::new(),
    };
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
}
