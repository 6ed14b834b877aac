//! Committing transactions over netlink, without the `nft` program.
//!
//! [`NetlinkApplier`] encodes the renderer's typed transaction
//! ([`crate::model`]) as one nf_tables netlink batch (the message sequence
//! `nft -f` would send for the transaction's text) and sends it on a
//! `NETLINK_NETFILTER` socket; the kernel commits the batch atomically or
//! not at all. Text and messages come from the same value, so `--dry-run`
//! output is exactly what is committed; the kernel tests check that a
//! commit over netlink leaves the table `nft -f` leaves for the same text.
//!
//! The socket, the batch, its acknowledgements and the questions asked
//! after it are `kp-netlink`'s ([`Channel::execute_batch`],
//! [`Channel::ask`]); what stays here is the nf_tables vocabulary, which
//! line of the transaction each message belongs to, and the read-back.
//! A transaction counts as committed only when the kernel answered every
//! message that asked for an acknowledgement, refused none, and a read-back
//! (whether the table exists, and the ruleset generation) agrees; no
//! length is ever cut to fit its field ([`LengthError`]).
//!
//! Why: `nft -f` lists the table before every transaction, which at 10,000
//! Service ports costs 150–200 ms however small the change, and its
//! evaluation of a full transaction takes seconds (see the `sync` bench).

use kp_model::IpFamily;
use kp_netlink::nfnetlink::{Batch, NFPROTO_IPV4, NFPROTO_IPV6, SUBSYS_NFTABLES};
use kp_netlink::{BatchFailure, Channel, EncodedBatch, LengthError, Message, NETLINK_NETFILTER};

use crate::applier::{Applier, ApplyError};
use crate::generation::Watch;
use crate::model::{Command, Transaction};

mod data;
mod exprs;
mod msg;
mod objects;
mod watch;

pub use watch::NetlinkWatch;

use msg::Kind;

/// Batches of at most this many messages ask for an acknowledgement of
/// each (about 8 MiB of answers at most); larger ones of their last
/// message only ([`Batch::acks_max`]): the kernel queues all answers at
/// once, each taking several hundred bytes of socket buffer, so a full
/// sync of 50,000 Service ports (some 750,000 messages) acknowledged
/// message by message would hold hundreds of megabytes of kernel memory.
const ACKED_MESSAGES_MAX: usize = 8192;
/// `ERESTART`: a batch bound to a generation that has moved on.
const ERESTART: i32 = 85;
/// `ENOENT`: the read-back's table does not exist.
const ENOENT: i32 = 2;
/// `EOPNOTSUPP`: a batch of a subsystem the kernel does not have.
const EOPNOTSUPP: i32 = 95;

/// Commits transactions over a netlink socket of the namespace of the
/// thread that opens it (on first use).
#[derive(Debug)]
pub struct NetlinkApplier {
    channel: Channel,
    /// Transactions committed, part of anonymous set names.
    transactions: u64,
    /// Start time of this applier in nanoseconds, part of anonymous set
    /// names so that another process's sets never clash with ours.
    epoch: u128,
    /// Tests only: rules of chains whose name holds this are encoded so
    /// that the kernel refuses them ([`NetlinkApplier::refusing_rules_of`]).
    refused_chains: Option<String>,
}

/// Why a command could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EncodeError {
    /// A value the kernel cannot take in this table: an address of the
    /// other family, or an empty address list.
    Unsupported,
    /// A length does not fit its netlink field.
    TooLarge(LengthError),
    /// A comment longer than nftnl's one-byte user data length holds.
    CommentTooLong {
        /// Its length in bytes.
        len: usize,
        /// The longest comment that fits.
        max: usize,
    },
}

impl From<LengthError> for EncodeError {
    fn from(error: LengthError) -> Self {
        Self::TooLarge(error)
    }
}

/// A command that could not be encoded: its line number, and why.
type LineError = (usize, EncodeError);

/// Encodes one transaction for one family.
#[derive(Debug)]
pub(crate) struct Encoder {
    /// `NFPROTO_IPV4` (2) or `NFPROTO_IPV6` (10).
    family: u8,
    /// The same family.
    ip_family: IpFamily,
    table: String,
    /// The messages written, in order, in one buffer.
    messages: EncodedBatch,
    /// The line (1-based) of each message, by position.
    lines: Vec<usize>,
    /// The line being encoded.
    line: usize,
    set_id: u32,
    /// Prefix of anonymous set names, unique to this applier and run.
    anonymous_prefix: String,
    /// Tests only: see [`NetlinkApplier::refusing_rules_of`].
    pub(crate) refused_chains: Option<String>,
}

impl Encoder {
    fn new(family: IpFamily, anonymous_prefix: String) -> Self {
        Self {
            family: nfproto(family),
            ip_family: family,
            table: crate::names::TABLE.to_owned(),
            messages: EncodedBatch::new(),
            lines: Vec::new(),
            line: 0,
            set_id: 0,
            anonymous_prefix,
            refused_chains: None,
        }
    }

    /// A message of `kind` for the line being encoded.
    fn begin(&self, kind: Kind, flags: u16) -> Message {
        msg::request(kind, self.family, flags)
    }

    /// Adds `message`, written for the line being encoded, to the batch;
    /// one whose lengths do not fit their fields is refused.
    fn push(&mut self, message: Message) -> Result<(), EncodeError> {
        self.messages.push(&message)?;
        self.lines.push(self.line);
        Ok(())
    }

    /// The name of anonymous set `id`. nft names them `__set%d` and lets
    /// the kernel pick the number, but the kernel finds a free number by
    /// scanning every set of the table: with one anonymous map per Service
    /// port that made each transaction cost time in proportion to the
    /// table (2 s to add 1,000 Services to 8,000). Names of our own, unique
    /// to this process and transaction, need no scan; `nft list` prints
    /// anonymous sets inline either way.
    fn anonymous_name(&self, id: u32) -> String {
        format!("__set{}{id}", self.anonymous_prefix)
    }

    fn next_set_id(&mut self) -> u32 {
        self.set_id += 1;
        self.set_id
    }

    fn ip_family(&self) -> IpFamily {
        self.ip_family
    }

    /// Encodes `transaction` into its messages; a command that cannot be
    /// encoded is named by its line.
    fn encode(&mut self, transaction: &Transaction) -> Result<(), LineError> {
        for command in &transaction.commands {
            self.encode_next(command)
                .map_err(|error| (self.line, error))?;
        }
        Ok(())
    }

    /// Encodes `command` as the transaction's next line.
    fn encode_next(&mut self, command: &Command) -> Result<(), EncodeError> {
        self.line += 1;
        self.encode_command(command)
    }

    fn encode_command(&mut self, command: &Command) -> Result<(), EncodeError> {
        match command {
            Command::AddTable { comment } => self.table(false, *comment),
            Command::DeleteTable => self.table(true, None),
            Command::AddChain { name, kind } => self.add_chain(name, kind),
            Command::FlushChain(name) => self.chain_operation(false, name),
            Command::DeleteChain(name) => self.chain_operation(true, name),
            Command::AddSet(spec) => self.add_set(spec),
            Command::FlushSet { name, .. } => self.set_operation(false, name),
            Command::DeleteSet { name, .. } => self.set_operation(true, name),
            Command::AddElements { set, elements } => self.add_elements(set, elements),
            Command::DeleteElements { set, keys } => self.delete_elements(set, keys),
            Command::AddRule(rule) => self.rule(rule),
            Command::AddTypeofSet(spec) => self.add_typeof_set(spec),
            Command::AddMapElements { map, elements } => self.add_map_elements(map, elements),
        }
    }

    /// The line of message `index` of the batch.
    fn line_of(&self, index: usize) -> Option<usize> {
        self.lines.get(index).copied()
    }
}

impl NetlinkApplier {
    /// An applier; the socket is opened on the first transaction.
    pub fn new() -> Self {
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Self {
            channel: Channel::new(NETLINK_NETFILTER),
            transactions: 0,
            epoch: epoch ^ u128::from(std::process::id()),
            refused_chains: None,
        }
    }

    /// For tests of how a refusal is reported: every rule of a chain whose
    /// name holds `pattern` is sent with an expression the kernel does not
    /// know, so the kernel refuses its message (`ENOENT`). Everything
    /// else, from the answers to the Service named in the error, is the
    /// production path. Not for use outside tests.
    #[doc(hidden)]
    #[must_use]
    pub fn refusing_rules_of(mut self, pattern: &str) -> Self {
        self.refused_chains = Some(pattern.to_owned());
        self
    }
}

/// What the read-back after a commit found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ReadBack {
    /// Whether the table exists.
    table: bool,
    /// The ruleset generation.
    generation: u32,
}

/// What a transaction says the read-back must find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Expected {
    /// Whether the table exists afterwards (`add table` or `delete table`,
    /// whichever comes last); `None` when no line names the table alone.
    table_exists: Option<bool>,
    /// Whether the transaction adds a rule: the kernel counts such a commit
    /// as a change, so the generation must move.
    generation_moves: bool,
}

impl Expected {
    /// Whether the read-back `read` (with the generation `before` the
    /// commit, read when the generation must move) agrees with what the
    /// transaction should have left.
    fn judge(
        &self,
        family: IpFamily,
        before: Option<u32>,
        read: &ReadBack,
    ) -> Result<(), ApplyError> {
        let table = table_text(family);
        match (self.table_exists, read.table) {
            (Some(true), false) => {
                return Err(ApplyError::NotApplied {
                    reason: format!("{table} does not exist after a transaction that writes it"),
                })
            }
            (Some(false), true) => {
                return Err(ApplyError::NotApplied {
                    reason: format!("{table} still exists after a transaction that deletes it"),
                })
            }
            _ => {}
        }
        if before == Some(read.generation) {
            return Err(ApplyError::NotApplied {
                reason: format!(
                    "the ruleset generation is still {} after a transaction that adds rules",
                    read.generation
                ),
            });
        }
        Ok(())
    }

    /// What an empty transaction leaves.
    fn new() -> Self {
        Self {
            table_exists: None,
            generation_moves: false,
        }
    }

    fn of(transaction: &Transaction) -> Self {
        let mut expected = Self::new();
        for command in &transaction.commands {
            expected.take_in(command);
        }
        expected
    }

    /// What the transaction leaves with `command` as its next line.
    fn take_in(&mut self, command: &Command) {
        match command {
            Command::AddTable { .. } => self.table_exists = Some(true),
            Command::DeleteTable => self.table_exists = Some(false),
            Command::AddRule(_) => {
                self.generation_moves = true;
                // A rule can only be added to a table that exists.
                self.table_exists.get_or_insert(true);
            }
            _ => {
                // Chains, sets and elements live in the table too.
                self.table_exists.get_or_insert(true);
            }
        }
    }
}

/// The error for command `line` (1-based) of `transaction`, which the
/// encoder refused, naming the object it writes.
fn encode_error(transaction: &Transaction, line: usize, error: EncodeError) -> ApplyError {
    let Some(command) = transaction.commands.get(line.wrapping_sub(1)).cloned() else {
        // Not reached: the encoder numbers the commands it was given.
        return ApplyError::NotApplied {
            reason: format!("the netlink encoder refused line {line}, which does not exist"),
        };
    };
    command_encode_error(transaction.family, line, command, error)
}

/// The error for `command`, line `line` of a transaction of `family`,
/// which the encoder refused.
fn command_encode_error(
    family: IpFamily,
    line: usize,
    command: Command,
    error: EncodeError,
) -> ApplyError {
    let text = command.line(family).to_string();
    match error {
        EncodeError::Unsupported => ApplyError::Kernel {
            message: "not sent: the netlink encoder cannot encode this line".to_owned(),
            line: Some((line, text)),
            also_refused: Vec::new(),
            refused: vec![command],
        },
        EncodeError::TooLarge(oversize) => ApplyError::TooLarge {
            object: crate::names::describe_command(&command, family),
            reason: oversize.to_string(),
            line: (line, text),
            command: Box::new(command),
        },
        EncodeError::CommentTooLong { len, max } => ApplyError::TooLarge {
            object: crate::names::describe_command(&command, family),
            reason: format!(
                "its comment is {len} bytes long, more than the {max} nftnl's user data holds"
            ),
            line: (line, text),
            command: Box::new(command),
        },
    }
}

/// The lines of the messages of a batch the kernel did not apply, with
/// the kernel's error for each (the line is `None` where the encoder does
/// not know it); an error of its own for a batch whose answers were lost,
/// or that was refused as a whole.
fn refused_lines(
    failure: BatchFailure,
    encoder: &Encoder,
) -> Result<Vec<(Option<usize>, String)>, ApplyError> {
    if let Some(broken) = failure.broken {
        // Answers lost or unread (a receive error, `ENOBUFS`): whether
        // each message was applied is unknown.
        return Err(ApplyError::Write(broken.error.into()));
    }
    if let Some(error) = failure.refused_whole {
        return Err(match error.errno() {
            Some(ERESTART) => ApplyError::GenerationMoved,
            Some(EOPNOTSUPP) => ApplyError::NoNftables {
                message: error.to_string(),
            },
            _ => ApplyError::Kernel {
                message: format!("{error} (the batch as a whole)"),
                line: None,
                also_refused: Vec::new(),
                refused: Vec::new(),
            },
        });
    }
    Ok(failure
        .refused
        .iter()
        .map(|refused| (encoder.line_of(refused.index), refused.error.to_string()))
        .collect())
}

/// The error for the refused `lines` of `transaction` (with the kernel's
/// error for each), naming each line by its text and command.
fn named_refusal(lines: Vec<(Option<usize>, String)>, transaction: &Transaction) -> ApplyError {
    let mut refused = lines.into_iter().map(|(line, message)| {
        let line = line.and_then(|n| transaction.line(n).map(|text| (n, text)));
        (line, message)
    });
    let Some((line, message)) = refused.next() else {
        // Not reached: a failure names what failed.
        return ApplyError::NotApplied {
            reason: "the kernel's answers reported a failure without an error".to_owned(),
        };
    };
    let also_refused: Vec<(usize, String, String)> = refused
        .filter_map(|(line, message)| line.map(|(n, text)| (n, text, message)))
        .collect();
    let numbers = line.iter().map(|(n, _)| *n);
    let numbers = numbers.chain(also_refused.iter().map(|(n, _, _)| *n));
    let refused = numbers
        .filter_map(|n| transaction.commands.get(n - 1).cloned())
        .collect();
    ApplyError::Kernel {
        message,
        line,
        also_refused,
        refused,
    }
}

/// `error` with the lines of an [`ApplyError::RefusedLines`] named from
/// `transaction`, the same transaction rendered again (rendering is
/// deterministic); any other error as it is.
pub fn name_refused_lines(error: ApplyError, transaction: &Transaction) -> ApplyError {
    match error {
        ApplyError::RefusedLines { lines, .. } => named_refusal(lines, transaction),
        other => other,
    }
}

/// A read-back that failed: lost answers are a failed write, a refused
/// question means the commit cannot be confirmed.
fn read_back_error(family: IpFamily, error: kp_netlink::Error) -> ApplyError {
    if error.is_broken() {
        return ApplyError::Write(error.into());
    }
    ApplyError::NotApplied {
        reason: format!("reading {} back failed: {error}", table_text(family)),
    }
}

/// `table ip kube-proxy` or `table ip6 kube-proxy`.
fn table_text(family: IpFamily) -> String {
    format!(
        "table {} {}",
        crate::options::family_keyword(family),
        crate::names::TABLE
    )
}

/// `NFPROTO_IPV4` or `NFPROTO_IPV6`.
fn nfproto(family: IpFamily) -> u8 {
    match family {
        IpFamily::V4 => NFPROTO_IPV4,
        IpFamily::V6 => NFPROTO_IPV6,
    }
}

/// `NFT_MSG_GETTABLE` of the `kube-proxy` table of `nfproto`: answered by
/// the table, or `ENOENT`.
pub(crate) fn table_question(nfproto: u8) -> Message {
    msg::table_request(nfproto, crate::names::TABLE)
}

/// The payloads (nfgenmsg and attributes) of the messages `transaction`
/// encodes to, with their `NFT_MSG_*` kinds: the same layout the kernel's
/// dumps answer with, which the read-back's tests decode.
#[cfg(test)]
pub(crate) fn encoded_payloads(transaction: &Transaction) -> Result<Vec<(u8, Vec<u8>)>, LineError> {
    let mut encoder = Encoder::new(transaction.family, "t".to_owned());
    encoder.encode(transaction)?;
    Ok(encoder
        .messages
        .requests()
        .map(|bytes| {
            let kind = u16::from_ne_bytes([bytes[4], bytes[5]]);
            (
                (kind & 0xff) as u8,
                bytes[kp_netlink::HEADER_LEN..].to_vec(),
            )
        })
        .collect())
}

/// The ruleset generation (`NFT_MSG_GETGEN`), asked on `channel`.
pub(crate) fn ask_generation(channel: &mut Channel) -> Result<u32, kp_netlink::Error> {
    let answer = channel.ask(msg::generation_request())?;
    msg::generation_of(&answer).ok_or(kp_netlink::Error::Malformed(
        "the answer to NFT_MSG_GETGEN holds no generation",
    ))
}

/// Whether this family's table exists, and the generation: the read-back
/// after a commit, two questions.
fn read_back(channel: &mut Channel, family: IpFamily) -> Result<ReadBack, kp_netlink::Error> {
    let table = match channel.ask(msg::table_request(nfproto(family), crate::names::TABLE)) {
        Ok(_) => true,
        Err(error) if error.errno() == Some(ENOENT) => false,
        Err(error) => return Err(error),
    };
    let generation = ask_generation(channel)?;
    Ok(ReadBack { table, generation })
}

impl NetlinkApplier {
    /// The encoder of this applier's next transaction of `family`.
    fn encoder(&mut self, family: IpFamily) -> Encoder {
        self.transactions += 1;
        let prefix = format!("{:x}x{}x", self.epoch, self.transactions);
        let mut encoder = Encoder::new(family, prefix);
        encoder.refused_chains.clone_from(&self.refused_chains);
        encoder
    }

    /// Commits `transaction`, bound to `generation` when given.
    fn commit(
        &mut self,
        transaction: &Transaction,
        generation: Option<u32>,
    ) -> Result<(), ApplyError> {
        let family = transaction.family;
        let mut encoder = self.encoder(family);
        encoder
            .encode(transaction)
            .map_err(|(line, error)| encode_error(transaction, line, error))?;
        let expected = Expected::of(transaction);
        self.send(family, &mut encoder, expected, generation)
            .map_err(|failure| match failure {
                SendFailure::Apply(error) => error,
                SendFailure::Batch(failure) => match refused_lines(failure, &encoder) {
                    Ok(lines) => named_refusal(lines, transaction),
                    Err(error) => error,
                },
            })
    }

    /// Sends the messages of `encoder` as one batch (bound to `generation`
    /// when given) and reads back what it left.
    ///
    /// The transaction counts as applied only when the kernel answered
    /// every message without an error and a read-back agrees with what it
    /// was `expected` to leave: the table exists (or, after a transaction
    /// that deletes it last, does not), and the generation moved on when
    /// the transaction added a rule (the kernel counts every such commit
    /// as a change).
    fn send(
        &mut self,
        family: IpFamily,
        encoder: &mut Encoder,
        expected: Expected,
        generation: Option<u32>,
    ) -> Result<(), SendFailure> {
        let messages = std::mem::take(&mut encoder.messages);
        let empty = messages.is_empty();
        if empty && generation.is_none() {
            // Nothing to commit: an empty partial sync.
            return Ok(());
        }
        let before = if expected.generation_moves {
            Some(
                ask_generation(&mut self.channel)
                    .map_err(|error| SendFailure::Apply(ApplyError::Write(error.into())))?,
            )
        } else {
            None
        };
        let mut batch = Batch::new(SUBSYS_NFTABLES).acks_max(ACKED_MESSAGES_MAX);
        if let Some(generation) = generation {
            // An empty batch is then only the check that the generation
            // has not moved: the kernel answers its begin (`ERESTART`).
            batch = batch.bound_to(generation);
        }
        self.channel
            .execute_encoded_batch(&batch, messages)
            .map_err(SendFailure::Batch)?;
        if empty {
            return Ok(());
        }
        let read = read_back(&mut self.channel, family)
            .map_err(|error| SendFailure::Apply(read_back_error(family, error)))?;
        expected
            .judge(family, before, &read)
            .map_err(SendFailure::Apply)
    }
}

/// Why a batch was not committed.
enum SendFailure {
    /// The kernel refused it or its answers were lost.
    Batch(BatchFailure),
    /// Anything else.
    Apply(ApplyError),
}

/// The transactions of a [`NetlinkApplier`] written in pieces: each piece
/// is encoded as it comes and its commands dropped, so that a large full
/// sync never holds its commands and its messages at once (its element
/// commands alone were 6 MB at 10,000 Service ports × 2 endpoints). A
/// refusal names its lines by number only
/// ([`ApplyError::RefusedLines`]); the caller, which rendered them, names
/// them from the same render ([`name_refused_lines`]).
struct NetlinkStream<'a> {
    applier: &'a mut NetlinkApplier,
    family: IpFamily,
    /// The encoder of the transaction being written.
    encoder: Option<Encoder>,
    /// What the transaction being written must leave.
    expected: Expected,
    /// Transactions this stream committed.
    committed: usize,
}

impl crate::applier::TransactionStream for NetlinkStream<'_> {
    fn write(&mut self, commands: Vec<Command>) -> Result<(), ApplyError> {
        let encoder = match &mut self.encoder {
            Some(encoder) => encoder,
            None => self.encoder.insert(self.applier.encoder(self.family)),
        };
        for command in &commands {
            self.expected.take_in(command);
            encoder.encode_next(command).map_err(|error| {
                command_encode_error(self.family, encoder.line, command.clone(), error)
            })?;
        }
        Ok(())
    }

    fn commit(&mut self) -> Result<(), ApplyError> {
        let mut encoder = match self.encoder.take() {
            Some(encoder) => encoder,
            None => self.applier.encoder(self.family),
        };
        let expected = std::mem::replace(&mut self.expected, Expected::new());
        let transaction = self.committed;
        self.committed += 1;
        self.applier
            .send(self.family, &mut encoder, expected, None)
            .map_err(|failure| match failure {
                SendFailure::Apply(error) => error,
                SendFailure::Batch(failure) => match refused_lines(failure, &encoder) {
                    Ok(lines) => ApplyError::RefusedLines { transaction, lines },
                    Err(error) => error,
                },
            })
    }
}

impl Default for NetlinkApplier {
    fn default() -> Self {
        Self::new()
    }
}

impl Applier for NetlinkApplier {
    fn apply(&mut self, transaction: &Transaction) -> Result<(), ApplyError> {
        self.commit(transaction, None)
    }

    fn stream(&mut self, family: IpFamily) -> Box<dyn crate::applier::TransactionStream + '_> {
        Box::new(NetlinkStream {
            applier: self,
            family,
            encoder: None,
            expected: Expected::new(),
            committed: 0,
        })
    }

    fn generation(&mut self) -> Option<Result<u32, ApplyError>> {
        Some(ask_generation(&mut self.channel).map_err(|error| ApplyError::Write(error.into())))
    }

    fn watch(&mut self) -> Option<Box<dyn Watch>> {
        match NetlinkWatch::open() {
            Ok(watch) => Some(Box::new(watch)),
            Err(error) => {
                tracing::debug!(error = %error, "cannot receive nftables commit notifications; any other program's commit makes the next full sync rewrite the table");
                None
            }
        }
    }

    fn apply_at(&mut self, transaction: &Transaction, generation: u32) -> Result<(), ApplyError> {
        self.commit(transaction, Some(generation))
    }
}

#[cfg(test)]
mod tests;
