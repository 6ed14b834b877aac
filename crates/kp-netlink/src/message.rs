//! Requests: the [`Message`] builder, whose every length is checked, and
//! the [`Request`] trait that messages of rust-netlink's crates share.

use netlink_packet_core::{NetlinkMessage, NetlinkSerializable};

use crate::{NLA_F_NESTED, NLA_TYPE_MASK, NLM_F_REQUEST};

/// A length too large for the netlink field that carries it. The message
/// holding it is never sent: a length cut to fit would make the kernel
/// read a different message from the one written (the cause of an
/// nftables table that silently never appeared, with 3,000 source ranges
/// in one anonymous set).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LengthError {
    /// An attribute's value is too long.
    #[error("attribute type {kind} would be {len} bytes long; a netlink attribute holds at most 65535 bytes")]
    Attribute {
        /// The attribute type (without flag bits).
        kind: u16,
        /// Its length with the 4-byte header.
        len: usize,
    },
    /// A nested attribute holds too much.
    #[error("nested attribute type {kind} would be {len} bytes long; a netlink attribute holds at most 65535 bytes")]
    Nest {
        /// The nest's type (without flag bits).
        kind: u16,
        /// Its length with the 4-byte header.
        len: usize,
    },
    /// A nested attribute was never closed.
    #[error("nested attribute type {kind} was left open")]
    OpenNest {
        /// The nest's type (without flag bits).
        kind: u16,
    },
    /// The whole message is too long.
    #[error(
        "the message would be {len} bytes long; a netlink message holds at most 4294967295 bytes"
    )]
    Message {
        /// Its length with the header.
        len: usize,
    },
}

/// A request that can be put on the wire with a sequence number the
/// [`Channel`](crate::Channel) chooses.
pub trait Request {
    /// The request's bytes with sequence number `seq`, or the first length
    /// that does not fit its field.
    fn encode(self, seq: u32) -> Result<Vec<u8>, LengthError>;
}

/// Builds one request. The first length that does not fit its field is
/// kept and returned by [`Message::check`] and [`Message::finish`].
#[derive(Debug, Clone)]
pub struct Message {
    buf: Vec<u8>,
    /// Open nests: where each starts and its type.
    nests: Vec<(usize, u16)>,
    oversized: Option<LengthError>,
}

impl Message {
    /// A message of `kind` with `flags` (`NLM_F_REQUEST` is added).
    pub fn new(kind: u16, flags: u16) -> Self {
        let mut buf = Vec::with_capacity(128);
        buf.extend_from_slice(&0u32.to_ne_bytes());
        buf.extend_from_slice(&kind.to_ne_bytes());
        buf.extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes());
        Self {
            buf,
            nests: Vec::new(),
            oversized: None,
        }
    }

    /// Appends raw bytes (the family header), padded to 4 bytes.
    #[must_use]
    pub fn raw(mut self, bytes: &[u8]) -> Self {
        self.put_raw(bytes);
        self
    }

    /// Appends an attribute; a value longer than an attribute can hold is
    /// left out and makes the message fail [`Message::check`].
    #[must_use]
    pub fn attr(mut self, kind: u16, value: &[u8]) -> Self {
        self.put_attr(kind, value);
        self
    }

    /// A `u8` attribute.
    #[must_use]
    pub fn u8(self, kind: u16, value: u8) -> Self {
        self.attr(kind, &[value])
    }

    /// A `u16` attribute in host order.
    #[must_use]
    pub fn u16(self, kind: u16, value: u16) -> Self {
        self.attr(kind, &value.to_ne_bytes())
    }

    /// A `u32` attribute in host order.
    #[must_use]
    pub fn u32(self, kind: u16, value: u32) -> Self {
        self.attr(kind, &value.to_ne_bytes())
    }

    /// A big-endian `u16` attribute (nfnetlink's `NLA_BE16`).
    #[must_use]
    pub fn be16(self, kind: u16, value: u16) -> Self {
        self.attr(kind, &value.to_be_bytes())
    }

    /// A big-endian `u32` attribute (nfnetlink's `NLA_BE32`).
    #[must_use]
    pub fn be32(mut self, kind: u16, value: u32) -> Self {
        self.put_be32(kind, value);
        self
    }

    /// A big-endian `u64` attribute (nfnetlink's `NLA_BE64`).
    #[must_use]
    pub fn be64(mut self, kind: u16, value: u64) -> Self {
        self.put_be64(kind, value);
        self
    }

    /// A NUL-terminated string attribute.
    #[must_use]
    pub fn string(mut self, kind: u16, value: &str) -> Self {
        self.put_string(kind, value);
        self
    }

    /// Opens a nested attribute; close it with [`Message::end`].
    #[must_use]
    pub fn begin(mut self, kind: u16) -> Self {
        self.open_nest(kind);
        self
    }

    /// Closes the innermost nested attribute; one holding more than an
    /// attribute can makes the message fail [`Message::check`].
    #[must_use]
    pub fn end(mut self) -> Self {
        self.close_nest();
        self
    }

    /// [`Message::raw`] in place, for encoders that write a message
    /// through a `&mut` borrow.
    pub fn put_raw(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        self.pad();
    }

    /// [`Message::attr`] in place.
    pub fn put_attr(&mut self, kind: u16, value: &[u8]) {
        self.put_attr_of(kind, &[value]);
    }

    /// [`Message::be32`] in place.
    pub fn put_be32(&mut self, kind: u16, value: u32) {
        self.put_attr(kind, &value.to_be_bytes());
    }

    /// [`Message::be64`] in place.
    pub fn put_be64(&mut self, kind: u16, value: u64) {
        self.put_attr(kind, &value.to_be_bytes());
    }

    /// [`Message::string`] in place.
    pub fn put_string(&mut self, kind: u16, value: &str) {
        self.put_attr_of(kind, &[value.as_bytes(), &[0]]);
    }

    /// [`Message::begin`] in place; close the nest with
    /// [`Message::close_nest`].
    pub fn open_nest(&mut self, kind: u16) {
        self.nests.push((self.buf.len(), kind & NLA_TYPE_MASK));
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
    }

    /// [`Message::end`] in place.
    pub fn close_nest(&mut self) {
        if let Some((start, kind)) = self.nests.pop() {
            let len = self.buf.len() - start;
            match u16::try_from(len) {
                Ok(len) => self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes()),
                Err(_) => self.oversize(LengthError::Nest { kind, len }),
            }
        }
    }

    /// Bytes written so far inside the innermost open nest, its header
    /// included (0 outside a nest): for callers that start a new message
    /// before a nest reaches [`ATTR_LEN_MAX`](crate::ATTR_LEN_MAX).
    pub fn nest_len(&self) -> usize {
        self.nests
            .last()
            .map_or(0, |(start, _)| self.buf.len() - start)
    }

    /// The message's length so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether the message is only its header (never: a message always
    /// has one; for clippy's `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Whether every length fits its field and every nest is closed.
    pub fn check(&self) -> Result<(), LengthError> {
        if let Some(error) = &self.oversized {
            return Err(error.clone());
        }
        if let Some((_, kind)) = self.nests.last() {
            return Err(LengthError::OpenNest { kind: *kind });
        }
        u32::try_from(self.buf.len())
            .map(drop)
            .map_err(|_| LengthError::Message {
                len: self.buf.len(),
            })
    }

    /// The message's bytes with its length field and sequence number left
    /// for the sender to set, and its length, or the first length that did
    /// not fit.
    pub(crate) fn unfinished(&self) -> Result<(&[u8], u32), LengthError> {
        self.check()?;
        let len = u32::try_from(self.buf.len()).map_err(|_| LengthError::Message {
            len: self.buf.len(),
        })?;
        Ok((&self.buf, len))
    }

    /// The finished message with sequence number `seq`, or the first length
    /// that did not fit.
    pub fn finish(mut self, seq: u32) -> Result<Vec<u8>, LengthError> {
        self.check()?;
        let len = u32::try_from(self.buf.len()).map_err(|_| LengthError::Message {
            len: self.buf.len(),
        })?;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        Ok(self.buf)
    }

    /// An attribute whose value is `parts` one after the other.
    fn put_attr_of(&mut self, kind: u16, parts: &[&[u8]]) {
        let value_len: usize = parts.iter().map(|part| part.len()).sum();
        let Ok(len) = u16::try_from(4 + value_len) else {
            self.oversize(LengthError::Attribute {
                kind: kind & NLA_TYPE_MASK,
                len: 4 + value_len,
            });
            return;
        };
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        for part in parts {
            self.buf.extend_from_slice(part);
        }
        self.pad();
    }

    fn oversize(&mut self, error: LengthError) {
        self.oversized.get_or_insert(error);
    }

    fn pad(&mut self) {
        while self.buf.len() % 4 != 0 {
            self.buf.push(0);
        }
    }
}

impl Request for Message {
    fn encode(self, seq: u32) -> Result<Vec<u8>, LengthError> {
        self.finish(seq)
    }
}

impl<I: NetlinkSerializable> Request for NetlinkMessage<I> {
    /// Serialized by `netlink-packet-core`, whose header length is a `u32`
    /// it computes itself: the total is checked here.
    fn encode(mut self, seq: u32) -> Result<Vec<u8>, LengthError> {
        self.header.sequence_number = seq;
        let len = self.buffer_len();
        if u32::try_from(len).is_err() {
            return Err(LengthError::Message { len });
        }
        self.finalize();
        let mut bytes = vec![0; len];
        self.serialize(&mut bytes);
        Ok(bytes)
    }
}

#[cfg(test)]
#[path = "message_tests.rs"]
mod tests;
