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
//! A transaction counts as committed only when the kernel answered every
//! message that asked for an acknowledgement, refused none, and a read-back
//! (the table and the ruleset generation, one request) agrees; no length
//! is ever cut to fit its field ([`Oversize`]).
//!
//! Why: `nft -f` lists the table before every transaction, which at 10,000
//! Service ports costs 150–200 ms however small the change, and its
//! evaluation of a full transaction takes seconds (see the `sync` bench).

use std::io;

use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};
use nix::sys::time::{TimeVal, TimeValLike};

use crate::applier::{Applier, ApplyError};
use crate::generation::Watch;
use crate::model::{Command, Transaction};
use kp_model::IpFamily;

mod exprs;
mod msg;
mod objects;
mod watch;

pub use watch::NetlinkWatch;

pub use msg::Oversize;

use msg::{Batch, ReadBack};

/// How long a transaction's answer may take to arrive after it was sent.
/// The kernel answers while the batch is sent, so this only bounds a
/// kernel that never answers.
const ANSWER_TIMEOUT_SECS: i64 = 30;
/// `ERESTART`: a batch bound to a generation that has moved on.
const ERESTART: i32 = 85;

/// Commits transactions over a netlink socket of the namespace of the
/// thread that opens it (on first use).
#[derive(Debug, Default)]
pub struct NetlinkApplier {
    socket: Option<Socket>,
    next_seq: u32,
    /// Transactions committed, part of anonymous set names.
    transactions: u64,
    /// Start time of this applier in nanoseconds, part of anonymous set
    /// names so that another process's sets never clash with ours.
    epoch: u128,
    /// The receive buffer size set on the socket, once raised.
    receive_buffer: usize,
    /// Tests only: rules of chains whose name holds this are encoded so
    /// that the kernel refuses them ([`NetlinkApplier::refusing_rules_of`]).
    refused_chains: Option<String>,
}

/// Why a command could not be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EncodeError {
    /// A value the kernel cannot take in this table: an address of the
    /// other family, or an empty address list.
    Unsupported,
    /// A length does not fit its netlink field.
    TooLarge(Oversize),
    /// A comment longer than nftnl's one-byte user data length holds.
    CommentTooLong {
        /// Its length in bytes.
        len: usize,
        /// The longest comment that fits.
        max: usize,
    },
}

impl From<Oversize> for EncodeError {
    fn from(oversize: Oversize) -> Self {
        Self::TooLarge(oversize)
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
    /// Line (1-based) of each message's sequence number, in order.
    lines: Vec<(u32, usize)>,
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
            lines: Vec::new(),
            line: 0,
            set_id: 0,
            anonymous_prefix,
            refused_chains: None,
        }
    }

    fn note(&mut self, seq: u32) {
        self.lines.push((seq, self.line));
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

    /// Encodes `transaction` into `batch`; a command that cannot be
    /// encoded is named by its line.
    fn encode(&mut self, batch: &mut Batch, transaction: &Transaction) -> Result<(), LineError> {
        for (index, command) in transaction.commands.iter().enumerate() {
            self.line = index + 1;
            self.encode_command(batch, command)
                .map_err(|error| (index + 1, error))?;
        }
        Ok(())
    }

    fn encode_command(&mut self, batch: &mut Batch, command: &Command) -> Result<(), EncodeError> {
        match command {
            Command::AddTable { comment } => self.table(batch, false, *comment),
            Command::DeleteTable => self.table(batch, true, None),
            Command::AddChain { name, kind } => self.add_chain(batch, name, kind),
            Command::FlushChain(name) => self.chain_operation(batch, false, name),
            Command::DeleteChain(name) => self.chain_operation(batch, true, name),
            Command::AddSet(spec) => self.add_set(batch, spec),
            Command::FlushSet { name, .. } => self.set_operation(batch, false, name),
            Command::DeleteSet { name, .. } => self.set_operation(batch, true, name),
            Command::AddElements { set, elements } => self.add_elements(batch, set, elements),
            Command::DeleteElements { set, keys } => self.delete_elements(batch, set, keys),
            Command::AddRule(rule) => self.rule(batch, rule),
        }
    }

    fn line_of(&self, seq: u32) -> Option<usize> {
        self.lines
            .iter()
            .find(|(s, _)| *s == seq)
            .map(|(_, line)| *line)
    }
}

impl NetlinkApplier {
    /// An applier; the socket is opened on the first transaction.
    pub fn new() -> Self {
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Self {
            epoch: epoch ^ u128::from(std::process::id()),
            ..Self::default()
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

    fn socket(&mut self) -> io::Result<&Socket> {
        if self.socket.is_none() {
            let mut socket = Socket::new(NETLINK_NETFILTER)?;
            socket.bind_auto()?;
            socket.connect(&SocketAddr::new(0, 0))?;
            // An error answer carries only the refused message's header,
            // not the whole message (which can be hundreds of kilobytes).
            socket.set_cap_ack(true)?;
            nix::sys::socket::setsockopt(
                &socket,
                nix::sys::socket::sockopt::ReceiveTimeout,
                &TimeVal::seconds(ANSWER_TIMEOUT_SECS),
            )
            .map_err(io::Error::from)?;
            self.socket = Some(socket);
        }
        self.socket
            .as_ref()
            .ok_or_else(|| io::Error::other("no socket"))
    }

    /// Sends `batch` and collects the kernel's answer to every message that
    /// asked for one ([`Batch::ask_acks`]) and to every refused one, or to
    /// `begin_seq` alone when the kernel refuses the batch as a whole. The
    /// kernel processes a batch while `send` runs, so every answer is
    /// queued when it returns; the receive timeout only keeps a kernel that
    /// never answers from stopping the proxy for good.
    ///
    /// Answers that cannot be read whole are errors, never skipped: an
    /// answer cut by a short buffer, or answers the kernel dropped because
    /// the socket's buffer was full (`ENOBUFS`), could each have been the
    /// refusal of a message.
    fn send(&mut self, batch: &Batch, begin_seq: u32) -> io::Result<Answers> {
        // Never below the floor: the buffer also takes the answers to
        // refused messages that did not ask, and to the read-back.
        let answers_size = batch
            .acked
            .len()
            .saturating_mul(ANSWER_BUFFER_BYTES)
            .max(RECEIVE_BUFFER_MIN);
        let grow_receive_buffer = answers_size > self.receive_buffer;
        let socket = self.socket()?;
        let size = batch.bytes.len() + 4096;
        if size > 200_000 {
            // Raising the buffer past net.core.wmem_max needs CAP_NET_ADMIN,
            // which the proxy has; the kernel takes a batch in one message.
            nix::sys::socket::setsockopt(socket, nix::sys::socket::sockopt::SndBufForce, &size)
                .map_err(io::Error::from)?;
        }
        if grow_receive_buffer {
            // Room for one answer per message that asks for one (an
            // acknowledgement takes several hundred bytes of socket buffer
            // in the kernel, with its sk_buff).
            nix::sys::socket::setsockopt(
                socket,
                nix::sys::socket::sockopt::RcvBufForce,
                &answers_size,
            )
            .map_err(io::Error::from)?;
        }
        socket.send(&batch.bytes, 0)?;
        let mut answers = Answers::new(begin_seq, &batch.acked);
        let mut buffer = vec![0u8; RECEIVE_BUFFER_BYTES];
        loop {
            let complete = answers.complete();
            // Once complete, only what is queued already is read.
            let flags = if complete { nix::libc::MSG_DONTWAIT } else { 0 };
            match socket.recv(&mut &mut buffer[..], flags | nix::libc::MSG_TRUNC) {
                Ok(received) => answers.read(&buffer, received)?,
                Err(error) if complete && error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) => return Err(receive_error(error, batch.acked.len())),
            }
        }
        if grow_receive_buffer {
            self.receive_buffer = answers_size;
        }
        Ok(answers)
    }
}

/// The kernel's answers to one batch.
#[derive(Debug)]
struct Answers {
    /// Sequence number of the batch's begin message.
    begin_seq: u32,
    /// The messages that asked for an answer.
    expected: std::collections::HashSet<u32>,
    /// `(seq, errno)` of every answer, in order (errno 0: acknowledged).
    replies: Vec<(u32, i32)>,
    /// The messages answered.
    answered: std::collections::HashSet<u32>,
    /// The kernel refused the batch as a whole.
    refused_whole: bool,
}

impl Answers {
    fn new(begin_seq: u32, acked: &[u32]) -> Self {
        Self {
            begin_seq,
            expected: acked.iter().copied().collect(),
            replies: Vec::with_capacity(acked.len()),
            answered: std::collections::HashSet::with_capacity(acked.len()),
            refused_whole: false,
        }
    }

    /// Every message that asked is answered, or the batch was refused as a
    /// whole.
    fn complete(&self) -> bool {
        self.refused_whole || self.answered.len() == self.expected.len()
    }

    /// Reads one datagram of `received` bytes (as `MSG_TRUNC` reports
    /// it) from `buffer`; a datagram longer than the buffer was cut, and
    /// the answers lost with it are an error, never skipped.
    fn read(&mut self, buffer: &[u8], received: usize) -> io::Result<()> {
        if received > buffer.len() {
            return Err(io::Error::other(format!(
                "an answer of {received} bytes to the transaction was cut to {} bytes",
                buffer.len()
            )));
        }
        let before = self.replies.len();
        msg::parse_replies(&buffer[..received], &mut self.replies);
        for (seq, code) in &self.replies[before..] {
            if *seq == self.begin_seq && *code != 0 {
                self.refused_whole = true;
            }
            if self.expected.contains(seq) {
                self.answered.insert(*seq);
            }
        }
        Ok(())
    }

    /// The outcome: applied (as far as the answers tell) only when every
    /// message was acknowledged and none refused; otherwise the error,
    /// naming every refused line of `transaction` (through `encoder`).
    fn outcome(&self, encoder: &Encoder, transaction: &Transaction) -> Result<(), ApplyError> {
        let begin_seq = self.begin_seq;
        let mut refused = self.replies.iter().filter(|(_, code)| *code != 0);
        match refused.next() {
            None => {}
            Some((seq, code)) if *seq == begin_seq && *code == -ERESTART => {
                return Err(ApplyError::GenerationMoved)
            }
            Some((seq, code)) if *seq == begin_seq && *code == -nix::libc::EOPNOTSUPP => {
                return Err(ApplyError::NoNftables {
                    message: io::Error::from_raw_os_error(-code).to_string(),
                })
            }
            Some(first) => {
                let line_of = |(seq, code): &(u32, i32)| {
                    let line = encoder
                        .line_of(*seq)
                        .and_then(|n| transaction.line(n).map(|l| (n, l)));
                    (line, io::Error::from_raw_os_error(-code).to_string())
                };
                let (line, message) = line_of(first);
                let also_refused: Vec<(usize, String, String)> = refused
                    .map(line_of)
                    .filter_map(|(line, message)| line.map(|(n, text)| (n, text, message)))
                    .collect();
                let numbers = line.iter().map(|(n, _)| *n);
                let numbers = numbers.chain(also_refused.iter().map(|(n, _, _)| *n));
                let refused = numbers
                    .filter_map(|n| transaction.commands.get(n - 1).cloned())
                    .collect();
                let message = if first.0 == begin_seq {
                    format!("{message} (the batch as a whole)")
                } else {
                    message
                };
                return Err(ApplyError::Kernel {
                    message,
                    line,
                    also_refused,
                    refused,
                });
            }
        }
        if self.answered.len() < self.expected.len() {
            return Err(ApplyError::NotApplied {
                reason: format!(
                    "the kernel answered {} of the {} messages of the transaction that asked for an answer",
                    self.answered.len(),
                    self.expected.len()
                ),
            });
        }
        Ok(())
    }
}

/// Batches of at most this many messages ask for an acknowledgement of
/// each (about 8 MiB of answers at most); larger ones of their last
/// message only ([`Batch::ask_acks`]).
const ACKED_MESSAGES_MAX: usize = 8192;
/// The smallest receive buffer set on the socket (the kernel's default is
/// about 208 KiB): about 1,400 answers.
const RECEIVE_BUFFER_MIN: usize = 1 << 20;
/// Receive buffer space wanted per message of a batch, for its answer.
const ANSWER_BUFFER_BYTES: usize = 1024;
/// Bytes read at once: answers are acknowledgements without the message
/// (`NETLINK_CAP_ACK`), the table's description or the generation.
const RECEIVE_BUFFER_BYTES: usize = 64 << 10;

/// A failed receive, said in the words of what it means for a transaction.
fn receive_error(error: io::Error, messages: usize) -> io::Error {
    match error.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the kernel did not answer the transaction within {ANSWER_TIMEOUT_SECS} s"),
        ),
        _ if error.raw_os_error() == Some(nix::libc::ENOBUFS) => io::Error::new(
            error.kind(),
            format!(
                "the kernel's answers to the {messages} messages of the transaction overflowed the socket's buffer ({error}); whether each was applied is unknown"
            ),
        ),
        _ => error,
    }
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
        let table = format!(
            "table {} {}",
            crate::options::family_keyword(family),
            crate::names::TABLE
        );
        if let Some(code) = read.error {
            return Err(ApplyError::NotApplied {
                reason: format!(
                    "reading {table} back failed: {}",
                    io::Error::from_raw_os_error(-code)
                ),
            });
        }
        match (self.table_exists, read.table) {
            (Some(true), Some(false)) => {
                return Err(ApplyError::NotApplied {
                    reason: format!("{table} does not exist after a transaction that writes it"),
                })
            }
            (Some(false), Some(true)) => {
                return Err(ApplyError::NotApplied {
                    reason: format!("{table} still exists after a transaction that deletes it"),
                })
            }
            _ => {}
        }
        if let (Some(before), Some(after)) = (before, read.generation) {
            if before == after {
                return Err(ApplyError::NotApplied {
                    reason: format!(
                        "the ruleset generation is still {after} after a transaction that adds rules"
                    ),
                });
            }
        }
        Ok(())
    }

    fn of(transaction: &Transaction) -> Self {
        let mut expected = Self {
            table_exists: None,
            generation_moves: false,
        };
        for command in &transaction.commands {
            match command {
                Command::AddTable { .. } => expected.table_exists = Some(true),
                Command::DeleteTable => expected.table_exists = Some(false),
                Command::AddRule(_) => {
                    expected.generation_moves = true;
                    // A rule can only be added to a table that exists.
                    expected.table_exists.get_or_insert(true);
                }
                _ => {
                    // Chains, sets and elements live in the table too.
                    expected.table_exists.get_or_insert(true);
                }
            }
        }
        expected
    }
}

/// The error for command `line` (1-based) of `transaction`, which the
/// encoder refused, naming the object it writes.
fn encode_error(transaction: &Transaction, line: usize, error: EncodeError) -> ApplyError {
    let family = transaction.family;
    let Some(command) = transaction.commands.get(line.wrapping_sub(1)).cloned() else {
        // Not reached: the encoder numbers the commands it was given.
        return ApplyError::NotApplied {
            reason: format!("the netlink encoder refused line {line}, which does not exist"),
        };
    };
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

/// `NFPROTO_IPV4` or `NFPROTO_IPV6`.
fn nfproto(family: IpFamily) -> u8 {
    match family {
        IpFamily::V4 => 2,
        IpFamily::V6 => 10,
    }
}

impl NetlinkApplier {
    /// Commits `transaction`, bound to `generation` when given.
    ///
    /// The transaction counts as applied only when the kernel answered
    /// every message without an error and a read-back agrees: the
    /// table exists (or, after a transaction that deletes it last, does
    /// not), and the generation moved on when the transaction added a
    /// rule (the kernel counts every such commit as a change).
    fn commit(
        &mut self,
        transaction: &Transaction,
        generation: Option<u32>,
    ) -> Result<(), ApplyError> {
        let family = transaction.family;
        self.transactions += 1;
        let prefix = format!("{:x}x{}x", self.epoch, self.transactions);
        let mut encoder = Encoder::new(family, prefix);
        encoder.refused_chains.clone_from(&self.refused_chains);
        let mut batch = Batch::new(self.next_seq, generation);
        encoder
            .encode(&mut batch, transaction)
            .map_err(|(line, error)| encode_error(transaction, line, error))?;
        let empty = batch.messages() == 0;
        if empty && generation.is_none() {
            // Nothing to commit: an empty partial sync.
            return Ok(());
        }
        let begin_seq = self.next_seq;
        if empty {
            // Only the check that the generation has not moved: the kernel
            // answers the batch's begin (`ERESTART` if it moved).
            batch.ask_ack_begin();
        } else {
            batch.ask_acks(ACKED_MESSAGES_MAX);
        }
        batch.finish();
        self.next_seq = batch.next_seq.wrapping_add(1);
        let expected = Expected::of(transaction);
        let before = if expected.generation_moves {
            Some(self.ask_generation().map_err(|e| self.failed_socket(e))?)
        } else {
            None
        };
        let answers = self
            .send(&batch, begin_seq)
            .map_err(|e| self.failed_socket(e))?;
        answers.outcome(&encoder, transaction)?;
        if empty {
            return Ok(());
        }
        self.check_applied(family, &expected, before)
    }

    /// Closes the socket after `error` while talking to the kernel: answers
    /// left unread, or an overflow (`ENOBUFS`) still to be reported, must
    /// not reach the next transaction. The next one opens a fresh socket.
    fn failed_socket(&mut self, error: io::Error) -> ApplyError {
        self.socket = None;
        self.receive_buffer = 0;
        ApplyError::Write(error)
    }

    /// The read-back after a commit the kernel acknowledged: one request
    /// for the table and the generation.
    fn check_applied(
        &mut self,
        family: IpFamily,
        expected: &Expected,
        before: Option<u32>,
    ) -> Result<(), ApplyError> {
        let read = self.read_back(family).map_err(|e| self.failed_socket(e))?;
        expected.judge(family, before, &read)
    }

    /// Asks whether this family's table exists, and the generation, in one
    /// round trip.
    fn read_back(&mut self, family: IpFamily) -> io::Result<ReadBack> {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(2);
        let request =
            Batch::table_and_generation_request(seq, nfproto(family), crate::names::TABLE);
        let socket = self.socket()?;
        socket.send(&request, 0)?;
        let mut read = ReadBack::default();
        let mut buffer = vec![0u8; 8192];
        while !read.complete() {
            let n = socket
                .recv(&mut &mut buffer[..], 0)
                .map_err(|error| receive_error(error, 2))?;
            msg::parse_read_back(&buffer[..n.min(buffer.len())], seq, &mut read);
        }
        Ok(read)
    }

    /// Asks the kernel for the ruleset generation.
    fn ask_generation(&mut self) -> io::Result<u32> {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        let socket = self.socket()?;
        socket.send(&Batch::generation_request(seq), 0)?;
        let mut buffer = vec![0u8; 8192];
        loop {
            let n = socket.recv(&mut &mut buffer[..], 0)?;
            match msg::parse_generation(&buffer[..n], seq) {
                Some(Ok(generation)) => return Ok(generation),
                Some(Err(code)) => return Err(io::Error::from_raw_os_error(-code)),
                None => {}
            }
        }
    }
}

impl Applier for NetlinkApplier {
    fn apply(&mut self, transaction: &Transaction) -> Result<(), ApplyError> {
        self.commit(transaction, None)
    }

    fn generation(&mut self) -> Option<Result<u32, ApplyError>> {
        Some(self.ask_generation().map_err(ApplyError::Write))
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
