//! Committing a transaction to the kernel.
//!
//! [`Applier`] is the seam between the backend and the kernel: it takes
//! typed transactions ([`Transaction`]), which the text-based appliers
//! print and the netlink applier encodes. Besides
//! [`crate::NetlinkApplier`] (what the proxy runs), three implementations
//! exist:
//! - [`NftApplier`] runs `nft -f -` with the transaction on stdin, in the
//!   network namespace of the calling thread; nft sends it to the kernel as
//!   one netlink batch, which the kernel commits atomically or not at all.
//! - `FakeApplier` records transactions in memory, for tests (feature
//!   `test-util`).
//! - [`DryRunApplier`] writes them to a writer (`--dry-run`).

use std::io::{self, Write};
use std::process::Stdio;

use kp_model::IpFamily;

use crate::generation::Watch;
use crate::model::{Command, Transaction};

#[cfg(any(test, feature = "test-util"))]
mod fake;
#[cfg(any(test, feature = "test-util"))]
pub use fake::{FakeApplier, FakeTransaction};

/// Commits nft transactions.
pub trait Applier: Send {
    /// Commits `transaction` atomically.
    fn apply(&mut self, transaction: &Transaction) -> Result<(), ApplyError>;

    /// The network namespace's ruleset generation (`NFT_MSG_GETGEN`): every
    /// commit that changes anything, in any table, by anyone, increments
    /// it. `None` where this applier cannot tell.
    fn generation(&mut self) -> Option<Result<u32, ApplyError>> {
        None
    }

    /// A receiver of the ruleset's commit notifications, in the network
    /// namespace this applier commits to; `None` where there is none
    /// ([`crate::generation`]).
    fn watch(&mut self) -> Option<Box<dyn Watch>> {
        None
    }

    /// Commits `transaction` only if the ruleset generation still is
    /// `generation` when the kernel takes it (`NFNL_BATCH_GENID`), refused
    /// with [`ApplyError::GenerationMoved`] otherwise. Appliers that cannot
    /// tell refuse.
    fn apply_at(&mut self, transaction: &Transaction, generation: u32) -> Result<(), ApplyError> {
        let _ = (transaction, generation);
        Err(ApplyError::GenerationMoved)
    }

    /// Transactions of `family` whose commands arrive in pieces, each
    /// committed by [`TransactionStream::commit`]. By default the pieces
    /// are collected and committed with [`Applier::apply`].
    fn stream(&mut self, family: IpFamily) -> Box<dyn TransactionStream + '_> {
        Box::new(Collected {
            applier: self,
            transaction: Transaction::new(family),
        })
    }
}

/// Transactions written in pieces; see [`Applier::stream`].
pub trait TransactionStream {
    /// Adds commands to the current transaction.
    fn write(&mut self, commands: Vec<Command>) -> Result<(), ApplyError>;
    /// Commits the current transaction, even an empty one; the next write
    /// starts another.
    fn commit(&mut self) -> Result<(), ApplyError>;
}

/// The default [`TransactionStream`]: collects each transaction.
struct Collected<'a, A: ?Sized> {
    applier: &'a mut A,
    transaction: Transaction,
}

/// Why a transaction was not committed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The program could not be started.
    #[error("starting {program}")]
    Spawn {
        /// The program, e.g. `nft`.
        program: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The program rejected the transaction; nothing was committed.
    #[error("{program} -f - exited with {status}: {message}{}", line.as_ref().map(|(n, text)| format!(" (line {n}: {text})")).unwrap_or_default())]
    Rejected {
        /// The program.
        program: String,
        /// Its exit status.
        status: String,
        /// The first line of its error output.
        message: String,
        /// The rejected line of the transaction, with its number.
        line: Option<(usize, String)>,
        /// The rejected command (the command of `line`).
        command: Option<Box<Command>>,
    },
    /// The kernel refused a netlink batch; nothing was committed.
    #[error("the kernel refused the transaction: {message}{}{}", line.as_ref().map(|(n, text)| format!(" (line {n}: {})", abbreviated(text))).unwrap_or_default(), more_refused(also_refused))]
    Kernel {
        /// The error the kernel answered, or why the batch was not sent.
        message: String,
        /// The line of the transaction it refused, with its number.
        line: Option<(usize, String)>,
        /// Further lines whose messages the kernel refused in the same
        /// batch, with their numbers and errors.
        also_refused: Vec<(usize, String, String)>,
        /// The refused commands: those of `line` and `also_refused`, in
        /// that order.
        refused: Vec<Command>,
    },
    /// The kernel refused lines of a transaction that was written in
    /// pieces and encoded as they came (its commands are gone): their
    /// numbers, with the kernel's error for each; nothing was committed.
    /// [`crate::netlink::name_refused_lines`] names them from the same
    /// transaction rendered again.
    #[error("the kernel refused the transaction: {}{}", lines.first().map_or("", |(_, message)| message.as_str()), lines.first().and_then(|(line, _)| *line).map(|n| format!(" (line {n} of transaction {})", transaction + 1)).unwrap_or_default())]
    RefusedLines {
        /// The transaction, counted from 0 among those of the stream.
        transaction: usize,
        /// The refused lines (`None` where unknown) with their errors.
        lines: Vec<(Option<usize>, String)>,
    },
    /// A line of the transaction does not fit netlink's length fields (an
    /// attribute, a nested attribute or a message); nothing was sent.
    #[error("not sent: {object} does not fit a netlink message: {reason} (line {}: {})", line.0, abbreviated(&line.1))]
    TooLarge {
        /// The object the line writes, naming its Service where it has
        /// one, e.g. `rule in chain firewall-…-ns1/lb/tcp/http (Service
        /// ns1/lb)`.
        object: String,
        /// Which length did not fit, and by how much.
        reason: String,
        /// The line, with its number.
        line: (usize, String),
        /// The command of the line.
        command: Box<Command>,
    },
    /// The kernel acknowledged the transaction, but reading its state back
    /// shows that it was not applied (or its answers were incomplete).
    #[error("the kernel did not apply the transaction: {reason}")]
    NotApplied {
        /// What the read-back found, e.g. `table ip kube-proxy does not
        /// exist after a transaction that adds it`.
        reason: String,
    },
    /// The kernel refused the batch as a whole, before reading any of it:
    /// it has no nf_tables (the module is neither built in nor loadable).
    #[error("the kernel has no nf_tables: it refused the whole batch ({message})")]
    NoNftables {
        /// The error the kernel answered.
        message: String,
    },
    /// A transaction bound to a ruleset generation ([`Applier::apply_at`])
    /// was refused: something else was committed since.
    #[error("the ruleset changed since the generation the transaction was bound to")]
    GenerationMoved,
    /// Writing the transaction failed (dry run) or a fake was told to fail.
    #[error("writing the transaction")]
    Write(#[source] io::Error),
}

/// Runs `nft -f -`.
#[derive(Debug, Clone)]
pub struct NftApplier {
    program: String,
}

/// Writes each transaction to a writer, touching nothing.
pub struct DryRunApplier {
    out: Box<dyn Write + Send>,
}

impl<A: Applier + ?Sized> TransactionStream for Collected<'_, A> {
    fn write(&mut self, mut commands: Vec<Command>) -> Result<(), ApplyError> {
        if self.transaction.commands.is_empty() {
            self.transaction.commands = commands;
        } else {
            self.transaction.commands.append(&mut commands);
        }
        Ok(())
    }

    fn commit(&mut self) -> Result<(), ApplyError> {
        let family = self.transaction.family;
        let transaction = std::mem::replace(&mut self.transaction, Transaction::new(family));
        self.applier.apply(&transaction)
    }
}

/// `text`, or its first 200 bytes and its length when it is longer: a
/// line with 10,000 source ranges is too long for a log line.
pub(crate) fn abbreviated(text: &str) -> std::borrow::Cow<'_, str> {
    const SHOWN: usize = 200;
    if text.len() <= SHOWN {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut end = SHOWN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{} … ({} bytes)", &text[..end], text.len()))
}

/// `; also refused: line N (error), …` for the further refused lines.
fn more_refused(lines: &[(usize, String, String)]) -> String {
    const SHOWN: usize = 3;
    if lines.is_empty() {
        return String::new();
    }
    let mut out = String::from("; also refused:");
    for (n, text, message) in lines.iter().take(SHOWN) {
        out.push_str(&format!(" line {n} ({message}): {};", abbreviated(text)));
    }
    if lines.len() > SHOWN {
        out.push_str(&format!(" and {} more", lines.len() - SHOWN));
    }
    out
}

impl ApplyError {
    /// The text of the lines of the transaction the kernel (or the
    /// encoder, or `nft`) refused: the first one and any others.
    pub fn refused_lines(&self) -> Vec<&str> {
        match self {
            Self::Kernel {
                line, also_refused, ..
            } => line
                .iter()
                .map(|(_, text)| text.as_str())
                .chain(also_refused.iter().map(|(_, text, _)| text.as_str()))
                .collect(),
            Self::TooLarge { line, .. } => vec![line.1.as_str()],
            Self::Rejected {
                line: Some((_, text)),
                ..
            } => vec![text.as_str()],
            _ => Vec::new(),
        }
    }

    /// The commands the kernel (or the encoder, or `nft`) refused, in the
    /// order of [`ApplyError::refused_lines`].
    pub fn refused_commands(&self) -> Vec<&Command> {
        match self {
            Self::Kernel { refused, .. } => refused.iter().collect(),
            Self::TooLarge { command, .. } => vec![&**command],
            Self::Rejected {
                command: Some(command),
                ..
            } => vec![&**command],
            _ => Vec::new(),
        }
    }

    /// The program that is not installed, if that is the cause.
    pub fn missing_program(&self) -> Option<&str> {
        match self {
            Self::Spawn { program, source } if source.kind() == io::ErrorKind::NotFound => {
                Some(program)
            }
            _ => None,
        }
    }
}

impl NftApplier {
    /// Runs `nft` from the PATH.
    pub fn new() -> Self {
        Self::with_program("nft")
    }

    /// Runs `program` instead of `nft`.
    pub fn with_program(program: impl Into<String>) -> Self {
        Self {
            program: program.into(),
        }
    }

    /// The program run.
    pub fn program(&self) -> &str {
        &self.program
    }
}

impl Default for NftApplier {
    fn default() -> Self {
        Self::new()
    }
}

impl Applier for NftApplier {
    fn apply(&mut self, transaction: &Transaction) -> Result<(), ApplyError> {
        let text = transaction.to_string();
        let spawn_error = |source| ApplyError::Spawn {
            program: self.program.clone(),
            source,
        };
        let mut child = std::process::Command::new(&self.program)
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_error)?;
        let written = child
            .stdin
            .take()
            .map(|mut stdin| stdin.write_all(text.as_bytes()));
        let output = child.wait_with_output().map_err(spawn_error)?;
        if output.status.success() {
            return match written {
                Some(Err(error)) => Err(ApplyError::Write(error)),
                _ => Ok(()),
            };
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        let line = failing_line(&stderr, &text);
        let command = line
            .as_ref()
            .and_then(|(number, _)| transaction.commands.get(number.checked_sub(1)?))
            .map(|command| Box::new(command.clone()));
        Err(ApplyError::Rejected {
            program: self.program.clone(),
            status: output.status.to_string(),
            message: error_message(&stderr),
            line,
            command,
        })
    }
}

/// The first line of nft's error output that says what went wrong.
fn error_message(stderr: &str) -> String {
    stderr
        .lines()
        .find(|line| line.contains("Error:"))
        .or_else(|| stderr.lines().next())
        .unwrap_or("no error output")
        .trim()
        .to_owned()
}

/// nft names the rejected line as `/dev/stdin:LINE:COLUMNS: Error: …`.
fn failing_line(stderr: &str, text: &str) -> Option<(usize, String)> {
    let line = stderr.lines().find(|line| line.contains("Error:"))?;
    let number: usize = line.split(':').nth(1)?.trim().parse().ok()?;
    let content = text.lines().nth(number.checked_sub(1)?)?;
    Some((number, content.to_owned()))
}

/// The generation after `generation`: the kernel's counter skips 0, which
/// means "unbound" in a batch.
pub fn next_generation(generation: u32) -> u32 {
    match generation.wrapping_add(1) {
        0 => 1,
        next => next,
    }
}

impl DryRunApplier {
    /// Writes to `out`.
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        Self { out }
    }
}

impl Applier for DryRunApplier {
    fn apply(&mut self, transaction: &Transaction) -> Result<(), ApplyError> {
        self.out
            .write_all(transaction.to_string().as_bytes())
            .and_then(|()| self.out.flush())
            .map_err(ApplyError::Write)
    }
}

impl std::fmt::Debug for DryRunApplier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DryRunApplier").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn the_rejected_line_is_named() {
        let stderr = "/dev/stdin:2:1-20: Error: Could not process rule: No such file or directory\nadd rule ip kube-proxy x\n^^^^\n";
        let text = "add table ip kube-proxy\nadd rule ip kube-proxy x drop\n";
        assert_eq!(
            failing_line(stderr, text),
            Some((2, "add rule ip kube-proxy x drop".to_owned()))
        );
        assert!(error_message(stderr).starts_with("/dev/stdin:2:1-20: Error: Could not"));
    }

    #[test]
    fn a_missing_program_is_reported_as_such() {
        let mut applier = NftApplier::with_program("/nonexistent/nft");
        let error = applier.apply(&Transaction::new(IpFamily::V4)).unwrap_err();
        assert_eq!(error.missing_program(), Some("/nonexistent/nft"));
    }
}
