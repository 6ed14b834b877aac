//! nf_tables netlink messages: the framing (`nlmsghdr` + `nfgenmsg`) and a
//! builder for (nested) attributes. Integers inside nf_tables attributes
//! are big-endian, as the kernel's `NLA_BE32` policies say.

/// `NFNL_SUBSYS_NFTABLES`.
pub const SUBSYS_NFTABLES: u16 = 10;
/// `NFNL_MSG_BATCH_BEGIN`.
pub const BATCH_BEGIN: u16 = 0x10;
/// `NFNL_MSG_BATCH_END`.
pub const BATCH_END: u16 = 0x11;

/// `NFT_MSG_NEWGEN`, the answer to `NFT_MSG_GETGEN`.
pub const MSG_NEWGEN: u16 = 15;
/// `NFT_MSG_GETGEN`.
pub const MSG_GETGEN: u16 = 16;
/// `NFT_MSG_GETTABLE`.
const MSG_GETTABLE: u16 = 1;
/// `NFTA_TABLE_NAME`.
const TABLE_NAME: u16 = 1;
/// `NFTA_GEN_ID`.
const GEN_ID: u16 = 1;
/// `NFNL_BATCH_GENID`: a batch is refused unless the generation is this.
const BATCH_GENID: u16 = 1;

/// `NLM_F_REQUEST`.
pub const F_REQUEST: u16 = 0x1;
/// `NLM_F_ACK`.
pub const F_ACK: u16 = 0x4;
/// `NLM_F_CREATE`.
pub const F_CREATE: u16 = 0x400;
/// `NLM_F_APPEND`.
pub const F_APPEND: u16 = 0x800;

/// `NFT_MSG_*` message kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Kind {
    NewTable = 0,
    DelTable = 2,
    NewChain = 3,
    DelChain = 5,
    NewRule = 6,
    DelRule = 8,
    NewSet = 9,
    DelSet = 11,
    NewSetElem = 12,
    DelSetElem = 14,
}

const NLA_F_NESTED: u16 = 0x8000;
const NLMSG_HDRLEN: usize = 16;
/// The largest attribute (or nest) netlink can frame: `nla_len` is a u16
/// and counts the 4-byte attribute header.
pub const ATTR_LEN_MAX: usize = u16::MAX as usize;

/// A length that does not fit its netlink field. The message holding it is
/// never sent: a length cut to fit would make the kernel read a different
/// message from the one written (the cause of a table that silently never
/// appeared, with 3,000 source ranges in one anonymous set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} of type {kind} would be {len} bytes long, more than the {max} its length field holds"
)]
pub struct Oversize {
    /// `attribute`, `nested attribute` or `message`.
    pub what: &'static str,
    /// The attribute's type (the message's kind for a message).
    pub kind: u16,
    /// The length it would have.
    pub len: usize,
    /// The most its length field holds.
    pub max: usize,
}

/// A batch of messages under construction.
#[derive(Debug, Default)]
pub struct Batch {
    pub bytes: Vec<u8>,
    /// Sequence number of the next message.
    pub next_seq: u32,
    /// Messages that ask for an acknowledgement, by sequence number, in
    /// order ([`Batch::ask_acks`]).
    pub acked: Vec<u32>,
    /// Start and sequence number of every nf_tables message (not the batch
    /// markers), in order.
    starts: Vec<(usize, u32)>,
    /// Start of the message being built.
    current: usize,
    /// Open nested attributes (their start offsets and types).
    nests: Vec<(usize, u16)>,
    /// The first length of the current message that did not fit; checked
    /// by [`Batch::end`], so that no message with a wrong length leaves.
    oversize: Option<Oversize>,
}

impl Batch {
    /// A batch whose first message has sequence number `seq`; with
    /// `generation`, the kernel takes it only while the ruleset generation
    /// is that one.
    pub fn new(seq: u32, generation: Option<u32>) -> Self {
        let mut batch = Self {
            next_seq: seq,
            ..Self::default()
        };
        batch.begin_raw(BATCH_BEGIN, F_REQUEST, 0);
        if let Some(generation) = generation {
            batch.u32(BATCH_GENID, generation);
        }
        batch.end_raw();
        batch
    }

    /// `NFT_MSG_GETGEN` with sequence number `seq`, alone.
    pub fn generation_request(seq: u32) -> Vec<u8> {
        let mut batch = Self {
            next_seq: seq,
            ..Self::default()
        };
        batch.begin_raw((SUBSYS_NFTABLES << 8) | MSG_GETGEN, F_REQUEST, 0);
        batch.end_raw();
        batch.bytes
    }

    /// `NFT_MSG_GETTABLE` of table `name` in `family` with sequence number
    /// `seq`, then `NFT_MSG_GETGEN` with `seq + 1`, in one buffer: the
    /// read-back after a commit, one round trip.
    pub fn table_and_generation_request(seq: u32, family: u8, name: &str) -> Vec<u8> {
        let mut batch = Self {
            next_seq: seq,
            ..Self::default()
        };
        batch.begin_raw((SUBSYS_NFTABLES << 8) | MSG_GETTABLE, F_REQUEST, family);
        batch.str(TABLE_NAME, name);
        batch.end_raw();
        batch.begin_raw((SUBSYS_NFTABLES << 8) | MSG_GETGEN, F_REQUEST, 0);
        batch.end_raw();
        batch.bytes
    }

    /// Starts an nf_tables message of `kind` for `family`
    /// (`NFPROTO_IPV4`/`NFPROTO_IPV6`); returns its sequence number.
    pub fn begin(&mut self, kind: Kind, family: u8, flags: u16) -> u32 {
        let start = self.bytes.len();
        let seq = self.begin_raw(
            (SUBSYS_NFTABLES << 8) | kind as u16,
            F_REQUEST | flags,
            family,
        );
        self.starts.push((start, seq));
        seq
    }

    /// The nf_tables messages written (not counting the batch markers).
    pub fn messages(&self) -> usize {
        self.starts.len()
    }

    /// Asks for an acknowledgement of the batch's begin message: for a batch
    /// of no message, bound to a generation, whose answer is only whether
    /// the generation still was that one.
    pub fn ask_ack_begin(&mut self) {
        let flags = u16::from_ne_bytes([self.bytes[6], self.bytes[7]]) | F_ACK;
        self.bytes[6..8].copy_from_slice(&flags.to_ne_bytes());
        let seq =
            u32::from_ne_bytes([self.bytes[8], self.bytes[9], self.bytes[10], self.bytes[11]]);
        self.acked.push(seq);
    }

    /// Asks for an acknowledgement of every message when there are at most
    /// `max`, otherwise of the last one only (the kernel answers a refused
    /// message whatever its flags, and it answers the last one only after
    /// reading every other): the kernel queues all answers at once, each
    /// taking several hundred bytes of socket buffer, so a full sync of
    /// 50,000 Service ports (some 750,000 messages) acknowledged message by
    /// message would hold hundreds of megabytes of kernel memory.
    pub fn ask_acks(&mut self, max: usize) {
        let chosen = if self.starts.len() <= max {
            &self.starts[..]
        } else {
            &self.starts[self.starts.len() - 1..]
        };
        for &(start, seq) in chosen {
            let at = start + 6;
            let flags = u16::from_ne_bytes([self.bytes[at], self.bytes[at + 1]]) | F_ACK;
            self.bytes[at..at + 2].copy_from_slice(&flags.to_ne_bytes());
            self.acked.push(seq);
        }
    }

    fn begin_raw(&mut self, kind: u16, flags: u16, family: u8) -> u32 {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        self.current = self.bytes.len();
        self.nests.clear();
        self.oversize = None;
        self.bytes.extend_from_slice(&0u32.to_ne_bytes());
        self.bytes.extend_from_slice(&kind.to_ne_bytes());
        self.bytes.extend_from_slice(&flags.to_ne_bytes());
        self.bytes.extend_from_slice(&seq.to_ne_bytes());
        self.bytes.extend_from_slice(&0u32.to_ne_bytes());
        // nfgenmsg: family, version 0, resource id (the subsystem for a
        // batch message).
        self.bytes.push(family);
        self.bytes.push(0);
        let res_id = if kind == BATCH_BEGIN || kind == BATCH_END {
            SUBSYS_NFTABLES
        } else {
            0
        };
        self.bytes.extend_from_slice(&res_id.to_be_bytes());
        seq
    }

    /// Ends the current message, filling in its length; refuses it when
    /// any of its lengths (or its own) does not fit its field, or a nested
    /// attribute was left open. A refused message must not be sent: the
    /// caller drops the whole batch.
    pub fn end(&mut self) -> Result<(), Oversize> {
        if let Some((start, kind)) = self.nests.last().copied() {
            self.note_oversize(
                "nested attribute left open",
                kind,
                self.bytes.len() - start,
                0,
            );
        }
        let len = self.bytes.len() - self.current;
        let kind = u16::from_ne_bytes([self.bytes[self.current + 4], self.bytes[self.current + 5]]);
        match u32::try_from(len) {
            Ok(len) => {
                self.bytes[self.current..self.current + 4].copy_from_slice(&len.to_ne_bytes());
            }
            Err(_) => self.note_oversize("message", kind, len, u32::MAX as usize),
        }
        match self.oversize.take() {
            Some(oversize) => Err(oversize),
            None => Ok(()),
        }
    }

    /// Ends a message this module builds itself (batch markers, requests),
    /// whose few fixed attributes always fit.
    fn end_raw(&mut self) {
        let len = self.bytes.len() - self.current;
        // Invariant: these messages hold at most one name of a table (at
        // most 256 bytes) and a u32, so their length fits.
        let len = u32::try_from(len).unwrap_or_default();
        self.bytes[self.current..self.current + 4].copy_from_slice(&len.to_ne_bytes());
        self.oversize = None;
    }

    /// Ends the batch.
    pub fn finish(&mut self) {
        self.begin_raw(BATCH_END, F_REQUEST, 0);
        self.end_raw();
    }

    /// Bytes written inside the innermost open nest so far.
    pub fn nest_len(&self) -> usize {
        self.nests
            .last()
            .map_or(0, |(start, _)| self.bytes.len() - start)
    }

    /// An attribute with raw `data`.
    pub fn attr(&mut self, kind: u16, data: &[u8]) {
        let len = match u16::try_from(4 + data.len()) {
            Ok(len) => len,
            Err(_) => {
                self.note_oversize("attribute", kind, 4 + data.len(), ATTR_LEN_MAX);
                0
            }
        };
        self.bytes.extend_from_slice(&len.to_ne_bytes());
        self.bytes.extend_from_slice(&kind.to_ne_bytes());
        self.bytes.extend_from_slice(data);
        self.pad();
    }

    /// A NUL-terminated string attribute.
    pub fn str(&mut self, kind: u16, text: &str) {
        let mut data = Vec::with_capacity(text.len() + 1);
        data.extend_from_slice(text.as_bytes());
        data.push(0);
        self.attr(kind, &data);
    }

    /// A big-endian u32 attribute.
    pub fn u32(&mut self, kind: u16, value: u32) {
        self.attr(kind, &value.to_be_bytes());
    }

    /// A big-endian u64 attribute.
    pub fn u64(&mut self, kind: u16, value: u64) {
        self.attr(kind, &value.to_be_bytes());
    }

    /// Opens a nested attribute; close it with [`Batch::close`].
    pub fn open(&mut self, kind: u16) {
        self.nests.push((self.bytes.len(), kind));
        self.bytes.extend_from_slice(&0u16.to_ne_bytes());
        self.bytes
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
    }

    /// Closes the innermost nested attribute.
    pub fn close(&mut self) {
        if let Some((start, kind)) = self.nests.pop() {
            let len = self.bytes.len() - start;
            match u16::try_from(len) {
                Ok(len) => self.bytes[start..start + 2].copy_from_slice(&len.to_ne_bytes()),
                Err(_) => self.note_oversize("nested attribute", kind, len, ATTR_LEN_MAX),
            }
        }
    }

    /// Keeps the first length of the message that did not fit.
    fn note_oversize(&mut self, what: &'static str, kind: u16, len: usize, max: usize) {
        self.oversize.get_or_insert(Oversize {
            what,
            kind,
            len,
            max,
        });
    }

    fn pad(&mut self) {
        while self.bytes.len() % 4 != 0 {
            self.bytes.push(0);
        }
    }
}

/// The messages in `buf` as `(kind, seq, payload after the header)`; a
/// truncated message ends the walk.
pub(crate) fn messages(buf: &[u8]) -> impl Iterator<Item = (u16, u32, &[u8])> {
    let mut offset = 0;
    std::iter::from_fn(move || {
        let header = buf.get(offset..offset + NLMSG_HDRLEN)?;
        let word = |at: usize| {
            u32::from_ne_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
        };
        let len = word(0) as usize;
        if len < NLMSG_HDRLEN {
            return None;
        }
        let payload = buf.get(offset + NLMSG_HDRLEN..offset + len)?;
        let kind = u16::from_ne_bytes([header[4], header[5]]);
        let seq = word(8);
        offset += (len + 3) & !3;
        Some((kind, seq, payload))
    })
}

/// The error code of an `NLMSG_ERROR` payload (0: an acknowledgement).
fn error_code(kind: u16, payload: &[u8]) -> Option<i32> {
    let code = payload.get(..4)?;
    (kind == 2).then(|| i32::from_ne_bytes([code[0], code[1], code[2], code[3]]))
}

/// The attributes of an nf_tables message payload (after its nfgenmsg),
/// as `(type, value)`; a malformed attribute ends the walk.
fn attributes(payload: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut at = 4;
    std::iter::from_fn(move || {
        let header = payload.get(at..at + 4)?;
        let len = usize::from(u16::from_ne_bytes([header[0], header[1]]));
        let kind = u16::from_ne_bytes([header[2], header[3]]) & 0x3fff;
        if len < 4 {
            return None;
        }
        let value = payload.get(at + 4..at + len)?;
        at += (len + 3) & !3;
        Some((kind, value))
    })
}

/// The generation in an `NFT_MSG_NEWGEN` payload.
fn generation_of(payload: &[u8]) -> Option<u32> {
    attributes(payload)
        .find(|(kind, _)| *kind == GEN_ID)
        .and_then(|(_, value)| <[u8; 4]>::try_from(value).ok())
        .map(u32::from_be_bytes)
}

/// What the kernel answered to [`Batch::generation_request`] `seq`: the
/// generation, an error code, or nothing yet in `buf`.
pub fn parse_generation(buf: &[u8], seq: u32) -> Option<Result<u32, i32>> {
    for (kind, message_seq, payload) in messages(buf) {
        if message_seq != seq {
            continue;
        }
        if let Some(code) = error_code(kind, payload) {
            return Some(Err(code));
        }
        if kind == (SUBSYS_NFTABLES << 8) | MSG_NEWGEN {
            if let Some(generation) = generation_of(payload) {
                return Some(Ok(generation));
            }
        }
    }
    None
}

/// What the kernel answered to [`Batch::table_and_generation_request`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadBack {
    /// Whether the table exists: `Some(true)` for its description,
    /// `Some(false)` for `ENOENT`.
    pub table: Option<bool>,
    /// The generation, once answered.
    pub generation: Option<u32>,
    /// Any other error the kernel answered to either request.
    pub error: Option<i32>,
}

impl ReadBack {
    /// Whether both requests have been answered.
    pub fn complete(&self) -> bool {
        self.error.is_some() || (self.table.is_some() && self.generation.is_some())
    }
}

/// `ENOENT`.
const ENOENT: i32 = 2;

/// Reads the answers in `buf` to the read-back whose table request is
/// `seq` (the generation request is `seq + 1`) into `out`.
pub fn parse_read_back(buf: &[u8], seq: u32, out: &mut ReadBack) {
    for (kind, message_seq, payload) in messages(buf) {
        if message_seq == seq {
            match error_code(kind, payload) {
                Some(code) if code == -ENOENT => out.table = Some(false),
                Some(0) => {}
                Some(code) => out.error = Some(code),
                None if kind == (SUBSYS_NFTABLES << 8) | Kind::NewTable as u16 => {
                    out.table = Some(true);
                }
                None => {}
            }
        } else if message_seq == seq.wrapping_add(1) {
            match error_code(kind, payload) {
                Some(0) => {}
                Some(code) => out.error = Some(code),
                None if kind == (SUBSYS_NFTABLES << 8) | MSG_NEWGEN => {
                    out.generation = generation_of(payload);
                }
                None => {}
            }
        }
    }
}

/// One message of the kernel's nf_tables notifications
/// (`NFNLGRP_NFTABLES`): each commit sends one per object it changed,
/// then its generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notification<'a> {
    /// A table, chain, rule, set, element or other object of the table
    /// `table` (`None` if the message names none) of `family` changed.
    Change {
        /// `NFPROTO_*` of the table.
        family: u8,
        /// The table's name, without its terminating NUL.
        table: Option<&'a [u8]>,
    },
    /// The commit is complete and produced this generation.
    Generation(u32),
}

/// The nf_tables notifications in `buf`, in order; other messages are
/// skipped. A `NEWGEN` without a generation is reported as a change of
/// no known table, so that it is never taken for a harmless commit.
pub fn parse_notifications<'a>(buf: &'a [u8], out: &mut Vec<Notification<'a>>) {
    for (kind, _, payload) in messages(buf) {
        if kind >> 8 != SUBSYS_NFTABLES {
            continue;
        }
        let family = payload.first().copied().unwrap_or(0);
        if kind & 0xff == MSG_NEWGEN {
            out.push(match generation_of(payload) {
                Some(generation) => Notification::Generation(generation),
                None => Notification::Change {
                    family,
                    table: None,
                },
            });
            continue;
        }
        // Every object's message names its table in attribute 1
        // (`NFTA_TABLE_NAME`, `NFTA_CHAIN_TABLE`, `NFTA_RULE_TABLE`, …).
        let table = attributes(payload)
            .find(|(kind, _)| *kind == 1)
            .map(|(_, name)| name.split(|b| *b == 0).next().unwrap_or(name));
        out.push(Notification::Change { family, table });
    }
}

/// A reply from the kernel: `(seq, errno)` of an `NLMSG_ERROR` (errno 0 is
/// an acknowledgement).
pub fn parse_replies(buf: &[u8], out: &mut Vec<(u32, i32)>) {
    for (kind, seq, payload) in messages(buf) {
        if let Some(code) = error_code(kind, payload) {
            out.push((seq, code));
        }
    }
}

#[cfg(test)]
mod tests;
