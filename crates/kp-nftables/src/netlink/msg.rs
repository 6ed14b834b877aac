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

/// A batch of messages under construction.
#[derive(Debug, Default)]
pub struct Batch {
    pub bytes: Vec<u8>,
    /// Sequence number of the next message.
    pub next_seq: u32,
    /// Start of the message being built.
    current: usize,
    /// Open nested attributes (their start offsets).
    nests: Vec<usize>,
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
        batch.end();
        batch
    }

    /// `NFT_MSG_GETGEN` with sequence number `seq`, alone.
    pub fn generation_request(seq: u32) -> Vec<u8> {
        let mut batch = Self {
            next_seq: seq,
            ..Self::default()
        };
        batch.begin_raw((SUBSYS_NFTABLES << 8) | MSG_GETGEN, F_REQUEST, 0);
        batch.end();
        batch.bytes
    }

    /// Starts an nf_tables message of `kind` for `family`
    /// (`NFPROTO_IPV4`/`NFPROTO_IPV6`); returns its sequence number.
    pub fn begin(&mut self, kind: Kind, family: u8, flags: u16) -> u32 {
        self.begin_raw(
            (SUBSYS_NFTABLES << 8) | kind as u16,
            F_REQUEST | flags,
            family,
        )
    }

    fn begin_raw(&mut self, kind: u16, flags: u16, family: u8) -> u32 {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        self.current = self.bytes.len();
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

    /// Ends the current message, filling in its length.
    pub fn end(&mut self) {
        let len = u32::try_from(self.bytes.len() - self.current).unwrap_or(u32::MAX);
        self.bytes[self.current..self.current + 4].copy_from_slice(&len.to_ne_bytes());
    }

    /// Asks for an acknowledgement of the last message written.
    pub fn ask_ack_last(&mut self) {
        let at = self.current + 6;
        let flags = u16::from_ne_bytes([self.bytes[at], self.bytes[at + 1]]) | F_ACK;
        self.bytes[at..at + 2].copy_from_slice(&flags.to_ne_bytes());
    }

    /// Ends the batch.
    pub fn finish(&mut self) {
        self.begin_raw(BATCH_END, F_REQUEST, 0);
        self.end();
    }

    /// An attribute with raw `data`.
    pub fn attr(&mut self, kind: u16, data: &[u8]) {
        let len = u16::try_from(4 + data.len()).unwrap_or(u16::MAX);
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
        self.nests.push(self.bytes.len());
        self.bytes.extend_from_slice(&0u16.to_ne_bytes());
        self.bytes
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
    }

    /// Closes the innermost nested attribute.
    pub fn close(&mut self) {
        if let Some(start) = self.nests.pop() {
            let len = u16::try_from(self.bytes.len() - start).unwrap_or(u16::MAX);
            self.bytes[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        }
    }

    fn pad(&mut self) {
        while self.bytes.len() % 4 != 0 {
            self.bytes.push(0);
        }
    }
}

/// The messages in `buf` as `(kind, seq, payload after the header)`; a
/// truncated message ends the walk.
fn messages(buf: &[u8]) -> impl Iterator<Item = (u16, u32, &[u8])> {
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
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// A message of `kind` with sequence number `seq` and `payload`.
    fn message(kind: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(NLMSG_HDRLEN + payload.len()).unwrap();
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&len.to_ne_bytes());
        bytes.extend_from_slice(&kind.to_ne_bytes());
        bytes.extend_from_slice(&0u16.to_ne_bytes());
        bytes.extend_from_slice(&seq.to_ne_bytes());
        bytes.extend_from_slice(&0u32.to_ne_bytes());
        bytes.extend_from_slice(payload);
        bytes
    }

    #[test]
    fn the_generation_is_read_from_the_answer_to_its_request() {
        // nfgenmsg, NFTA_GEN_ID = 0x01020304, NFTA_GEN_PROC_PID.
        let mut payload = vec![0, 0, 0, 0];
        payload.extend_from_slice(&8u16.to_ne_bytes());
        payload.extend_from_slice(&GEN_ID.to_ne_bytes());
        payload.extend_from_slice(&[1, 2, 3, 4]);
        let newgen = (SUBSYS_NFTABLES << 8) | MSG_NEWGEN;
        let mut buf = message(newgen, 6, &payload);
        buf.extend(message(newgen, 7, &payload));
        assert_eq!(parse_generation(&buf, 7), Some(Ok(0x0102_0304)));
        assert_eq!(parse_generation(&buf, 8), None, "no answer to 8 yet");
        let refused = message(2, 9, &(-22i32).to_ne_bytes());
        assert_eq!(parse_generation(&refused, 9), Some(Err(-22)));
        let mut truncated = message(newgen, 7, &payload);
        truncated.truncate(truncated.len() - 2);
        assert_eq!(parse_generation(&truncated, 7), None);
    }

    /// An attribute: length, type, value, padding.
    fn attribute(kind: u16, value: &[u8]) -> Vec<u8> {
        let len = u16::try_from(4 + value.len()).unwrap();
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&len.to_ne_bytes());
        bytes.extend_from_slice(&kind.to_ne_bytes());
        bytes.extend_from_slice(value);
        bytes.resize(bytes.len().next_multiple_of(4), 0);
        bytes
    }

    #[test]
    fn notifications_name_the_table_of_each_change_and_end_with_the_generation() {
        let nftables = |msg: u16| (SUBSYS_NFTABLES << 8) | msg;
        // A new rule in `ip kube-proxy` (table, chain, handle attributes),
        // a deleted chain of `ip6 filter`, the generation, and a message of
        // another subsystem.
        let mut rule = vec![2, 0, 0, 0];
        rule.extend(attribute(1, b"kube-proxy\0"));
        rule.extend(attribute(2, b"services\0"));
        let mut chain = vec![10, 0, 0, 0];
        chain.extend(attribute(1, b"filter\0"));
        let mut newgen = vec![0, 0, 0, 0];
        newgen.extend(attribute(GEN_ID, &7u32.to_be_bytes()));
        newgen.extend(attribute(2, &42u32.to_be_bytes()));
        let mut buf = message(nftables(Kind::NewRule as u16), 1, &rule);
        buf.extend(message(nftables(Kind::DelChain as u16), 1, &chain));
        buf.extend(message(nftables(MSG_NEWGEN), 1, &newgen));
        buf.extend(message((1 << 8) | 2, 1, &rule));
        let mut out = Vec::new();
        parse_notifications(&buf, &mut out);
        assert_eq!(
            out,
            [
                Notification::Change {
                    family: 2,
                    table: Some(b"kube-proxy".as_slice())
                },
                Notification::Change {
                    family: 10,
                    table: Some(b"filter".as_slice())
                },
                Notification::Generation(7),
            ]
        );
        // A generation message without its number is not a generation.
        let bare = message(nftables(MSG_NEWGEN), 1, &[0, 0, 0, 0]);
        let mut out = Vec::new();
        parse_notifications(&bare, &mut out);
        assert_eq!(
            out,
            [Notification::Change {
                family: 0,
                table: None
            }]
        );
    }

    #[test]
    fn errors_and_acknowledgements_are_collected_with_their_sequence_numbers() {
        let mut buf = message(2, 3, &0i32.to_ne_bytes());
        buf.extend(message(2, 4, &(-85i32).to_ne_bytes()));
        let mut replies = Vec::new();
        parse_replies(&buf, &mut replies);
        assert_eq!(replies, [(3, 0), (4, -85)]);
    }
}
