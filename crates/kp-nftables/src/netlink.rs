//! Committing transactions over netlink, without the `nft` program.
//!
//! [`NetlinkApplier`] turns the transaction text the renderer writes into
//! one nf_tables netlink batch (the message sequence `nft -f` would send for
//! the same text) and sends it on a `NETLINK_NETFILTER` socket; the kernel
//! commits the batch atomically or not at all. It reads only the shapes the
//! renderer writes and refuses any other line with an error naming it, so
//! `--dry-run` output stays exactly what is committed.
//!
//! Why: `nft -f` lists the table before every transaction, which at 10,000
//! Service ports costs 150–200 ms however small the change, and its
//! evaluation of a full transaction takes seconds (see the `sync` bench).

use std::io;

use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};
use nix::sys::time::{TimeVal, TimeValLike};

use crate::applier::{Applier, ApplyError};
use crate::generation::Watch;
use kp_model::IpFamily;

mod msg;
mod objects;
mod rules;
mod watch;

pub use watch::NetlinkWatch;

use msg::Batch;

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
}

/// A line the encoder does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EncodeError {
    /// Not a shape the renderer writes.
    Unsupported,
}

/// Encodes one transaction for one family.
#[derive(Debug)]
pub(crate) struct Encoder {
    /// `NFPROTO_IPV4` (2) or `NFPROTO_IPV6` (10).
    family: u8,
    table: String,
    /// Line (1-based) of each message's sequence number, in order.
    lines: Vec<(u32, usize)>,
    line: usize,
    set_id: u32,
    /// Prefix of anonymous set names, unique to this applier and run.
    anonymous_prefix: String,
}

impl Encoder {
    fn new(family: IpFamily, anonymous_prefix: String) -> Self {
        Self {
            family: match family {
                IpFamily::V4 => 2,
                IpFamily::V6 => 10,
            },
            table: crate::names::TABLE.to_owned(),
            lines: Vec::new(),
            line: 0,
            set_id: 0,
            anonymous_prefix,
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

    /// Encodes `text` into `batch`.
    fn encode(&mut self, batch: &mut Batch, text: &str) -> Result<(), (usize, String)> {
        for (index, line) in text.lines().enumerate() {
            self.line = index + 1;
            self.encode_line(batch, line)
                .map_err(|EncodeError::Unsupported| (index + 1, line.to_owned()))?;
        }
        Ok(())
    }

    fn encode_line(&mut self, batch: &mut Batch, line: &str) -> Result<(), EncodeError> {
        let mut words = line.splitn(5, ' ');
        let (verb, kind, family, table) = (
            words.next().ok_or(EncodeError::Unsupported)?,
            words.next().ok_or(EncodeError::Unsupported)?,
            words.next().ok_or(EncodeError::Unsupported)?,
            words.next().ok_or(EncodeError::Unsupported)?,
        );
        let rest = words.next().unwrap_or("");
        let family_keyword = if self.family == 2 { "ip" } else { "ip6" };
        if table != self.table || family != family_keyword {
            return Err(EncodeError::Unsupported);
        }
        if kind == "table" {
            return self.table(batch, verb == "delete", rest);
        }
        match (verb, kind) {
            (_, "chain") => self.chain(batch, verb, rest),
            (_, "set") => self.set(batch, verb, false, rest),
            (_, "map") => self.set(batch, verb, true, rest),
            ("add", "element") => self.element(batch, false, rest),
            ("delete", "element") => self.element(batch, true, rest),
            ("add", "rule") => self.rule(batch, rest),
            _ => Err(EncodeError::Unsupported),
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

    fn socket(&mut self) -> io::Result<&Socket> {
        if self.socket.is_none() {
            let mut socket = Socket::new(NETLINK_NETFILTER)?;
            socket.bind_auto()?;
            socket.connect(&SocketAddr::new(0, 0))?;
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

    /// Sends `batch` and collects the kernel's answers until the one to
    /// `last_seq`, or to `begin_seq` when the kernel refuses the batch as a
    /// whole (it then reads no further message). The kernel processes a
    /// batch while `send` runs, so every answer is queued when it returns;
    /// the receive timeout only keeps a kernel that never answers from
    /// stopping the proxy for good.
    fn send(
        &mut self,
        batch: &Batch,
        begin_seq: u32,
        last_seq: u32,
    ) -> io::Result<Vec<(u32, i32)>> {
        let socket = self.socket()?;
        let size = batch.bytes.len() + 4096;
        if size > 200_000 {
            // Raising the buffer past net.core.wmem_max needs CAP_NET_ADMIN,
            // which the proxy has; the kernel takes a batch in one message.
            nix::sys::socket::setsockopt(socket, nix::sys::socket::sockopt::SndBufForce, &size)
                .map_err(io::Error::from)?;
        }
        socket.send(&batch.bytes, 0)?;
        let mut replies = Vec::new();
        let mut buffer = vec![0u8; 65536];
        loop {
            let n = socket.recv(&mut &mut buffer[..], 0).map_err(|error| {
                if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "the kernel did not answer the transaction within {ANSWER_TIMEOUT_SECS} s"
                        ),
                    )
                } else {
                    error
                }
            })?;
            let before = replies.len();
            msg::parse_replies(&buffer[..n], &mut replies);
            if replies[before..]
                .iter()
                .any(|(seq, _)| *seq == last_seq || *seq == begin_seq)
            {
                return Ok(replies);
            }
        }
    }
}

impl NetlinkApplier {
    /// Commits `text`, bound to `generation` when given.
    fn commit(
        &mut self,
        family: IpFamily,
        text: &str,
        generation: Option<u32>,
    ) -> Result<(), ApplyError> {
        self.transactions += 1;
        let prefix = format!("{:x}x{}x", self.epoch, self.transactions);
        let mut encoder = Encoder::new(family, prefix);
        let mut batch = Batch::new(self.next_seq, generation);
        encoder
            .encode(&mut batch, text)
            .map_err(|(line, content)| ApplyError::Kernel {
                message: "not sent: the netlink encoder does not know this line".to_owned(),
                line: Some((line, content)),
            })?;
        // Only the last message asks for an acknowledgement: errors come
        // back for any message, and the last one's answer ends the batch.
        let begin_seq = self.next_seq;
        let last_seq = batch.next_seq.wrapping_sub(1);
        batch.ask_ack_last();
        batch.finish();
        self.next_seq = batch.next_seq.wrapping_add(1);
        let replies = self
            .send(&batch, begin_seq, last_seq)
            .map_err(ApplyError::Write)?;
        match replies.iter().find(|(_, code)| *code != 0) {
            None => Ok(()),
            Some((seq, code)) if *seq == begin_seq && *code == -ERESTART => {
                Err(ApplyError::GenerationMoved)
            }
            Some((seq, code)) if *seq == begin_seq => Err(ApplyError::NoNftables {
                message: io::Error::from_raw_os_error(-code).to_string(),
            }),
            Some((seq, code)) => {
                let line = encoder
                    .line_of(*seq)
                    .and_then(|n| text.lines().nth(n - 1).map(|l| (n, l.to_owned())));
                Err(ApplyError::Kernel {
                    message: io::Error::from_raw_os_error(-code).to_string(),
                    line,
                })
            }
        }
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
    fn apply(&mut self, family: IpFamily, text: &str) -> Result<(), ApplyError> {
        self.commit(family, text, None)
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

    fn apply_at(
        &mut self,
        family: IpFamily,
        text: &str,
        generation: u32,
    ) -> Result<(), ApplyError> {
        self.commit(family, text, Some(generation))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn keys_are_padded_fields_in_network_order() {
        let key = objects::key_bytes("10.96.0.10 . tcp . 80").unwrap();
        assert_eq!(key, [10, 96, 0, 10, 6, 0, 0, 0, 0, 80, 0, 0]);
        assert!(objects::key_bytes("10.96.0.10 . icmp").is_err());
    }

    #[test]
    fn an_unknown_line_is_named_and_nothing_is_sent() {
        let mut encoder = Encoder::new(IpFamily::V4, "p".to_owned());
        let mut batch = Batch::new(1, None);
        let text = "add table ip kube-proxy\nadd rule ip kube-proxy c tcp flags syn drop\n";
        let error = encoder.encode(&mut batch, text).unwrap_err();
        assert_eq!(error.0, 2);
        for other_table in [
            "add chain ip filter c\n",
            "add table ip filter\n",
            "delete table ip filter\n",
            "delete table ip6 kube-proxy\n",
        ] {
            assert!(
                encoder
                    .encode(&mut Batch::new(1, None), other_table)
                    .is_err(),
                "{other_table}"
            );
        }
    }

    #[test]
    fn each_message_is_framed_with_its_length() {
        let mut encoder = Encoder::new(IpFamily::V6, "p".to_owned());
        let mut batch = Batch::new(7, None);
        encoder
            .encode(&mut batch, "add chain ip6 kube-proxy services\n")
            .unwrap();
        batch.finish();
        let mut offset = 0;
        let mut sequences = Vec::new();
        while offset < batch.bytes.len() {
            let len = u32::from_ne_bytes(batch.bytes[offset..offset + 4].try_into().unwrap());
            let seq = u32::from_ne_bytes(batch.bytes[offset + 8..offset + 12].try_into().unwrap());
            sequences.push(seq);
            offset += len as usize;
        }
        assert_eq!(offset, batch.bytes.len());
        assert_eq!(sequences, [7, 8, 9], "begin, the chain, end");
    }
}
