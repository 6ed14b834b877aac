//! Netlink messages on the wire, shared by the three protocols this crate
//! speaks (generic netlink for IPVS, nfnetlink for ipset, rtnetlink for the
//! dummy link): a builder of requests and readers of answers.
//!
//! ```text
//! nlmsghdr  len u32 | type u16 | flags u16 | seq u32 | pid u32
//! payload   family header (genlmsghdr, nfgenmsg, ifinfomsg, ifaddrmsg)
//!           attributes: len u16 | type u16 | value, padded to 4 bytes;
//!           type bit 15 = nested, bit 14 = value in network byte order
//! ```
//! Integers are in host order unless the attribute carries bit 14.
//!
//! A length that does not fit its field (65,535 bytes for an attribute or
//! a nest, 4 GiB for a message) is an error ([`LengthError`]), never a
//! clamped value: a clamped length makes the kernel read a different
//! message than the one built.

use std::io;

/// `NLMSG_ERROR`: an acknowledgement (error 0) or a failure.
pub const NLMSG_ERROR: u16 = 2;
/// `NLMSG_DONE`: the end of a dump.
pub const NLMSG_DONE: u16 = 3;
/// `NLM_F_REQUEST`.
pub const NLM_F_REQUEST: u16 = 0x1;
/// `NLM_F_MULTI`: part of a multi-part answer.
pub const NLM_F_MULTI: u16 = 0x2;
/// `NLM_F_ACK`.
pub const NLM_F_ACK: u16 = 0x4;
/// `NLM_F_DUMP` (`NLM_F_ROOT | NLM_F_MATCH`).
pub const NLM_F_DUMP: u16 = 0x300;
/// `NLM_F_EXCL`.
pub const NLM_F_EXCL: u16 = 0x200;
/// `NLM_F_CREATE`.
pub const NLM_F_CREATE: u16 = 0x400;
/// `NLA_F_NESTED`.
pub const NLA_F_NESTED: u16 = 0x8000;
/// `NLA_F_NET_BYTEORDER`.
pub const NLA_F_NET_BYTEORDER: u16 = 0x4000;
/// The type bits of an attribute.
const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | NLA_F_NET_BYTEORDER);
/// Length of `nlmsghdr`.
pub const HEADER_LEN: usize = 16;

/// Builds one request. The first length that does not fit its field is
/// kept and returned by [`Message::check`] and [`Message::finish`].
#[derive(Debug)]
pub struct Message {
    buf: Vec<u8>,
    /// Open nests: where each starts and its type.
    nests: Vec<(usize, u16)>,
    oversized: Option<LengthError>,
}

/// A length too large for the netlink field that carries it.
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
    /// The whole message is too long.
    #[error(
        "the message would be {len} bytes long; a netlink message holds at most 4294967295 bytes"
    )]
    Message {
        /// Its length with the header.
        len: usize,
    },
}

/// One message of an answer.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    /// `nlmsg_type`.
    pub kind: u16,
    /// `nlmsg_flags`.
    pub flags: u16,
    /// `nlmsg_seq`.
    pub seq: u32,
    /// Everything after the header.
    pub payload: &'a [u8],
}

/// Attributes of a payload, in order: `(type without flag bits, value)`.
#[derive(Debug, Clone)]
pub struct Attributes<'a> {
    rest: &'a [u8],
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

    /// Appends raw bytes (the family header).
    pub fn raw(mut self, bytes: &[u8]) -> Self {
        self.buf.extend_from_slice(bytes);
        self.pad();
        self
    }

    /// Appends an attribute; a value longer than an attribute can hold is
    /// left out and makes the message fail [`Message::check`].
    pub fn attr(mut self, kind: u16, value: &[u8]) -> Self {
        let Ok(len) = u16::try_from(4 + value.len()) else {
            self.oversize(LengthError::Attribute {
                kind: kind & NLA_TYPE_MASK,
                len: 4 + value.len(),
            });
            return self;
        };
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(value);
        self.pad();
        self
    }

    /// A `u8` attribute.
    pub fn u8(self, kind: u16, value: u8) -> Self {
        self.attr(kind, &[value])
    }

    /// A `u16` attribute in host order.
    pub fn u16(self, kind: u16, value: u16) -> Self {
        self.attr(kind, &value.to_ne_bytes())
    }

    /// A `u32` attribute in host order.
    pub fn u32(self, kind: u16, value: u32) -> Self {
        self.attr(kind, &value.to_ne_bytes())
    }

    /// A NUL-terminated string attribute.
    pub fn string(self, kind: u16, value: &str) -> Self {
        let mut bytes = Vec::with_capacity(value.len() + 1);
        bytes.extend_from_slice(value.as_bytes());
        bytes.push(0);
        self.attr(kind, &bytes)
    }

    /// Opens a nested attribute; close it with [`Message::end`].
    pub fn begin(mut self, kind: u16) -> Self {
        self.nests.push((self.buf.len(), kind & NLA_TYPE_MASK));
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        self
    }

    /// Closes the innermost nested attribute; one holding more than an
    /// attribute can makes the message fail [`Message::check`].
    pub fn end(mut self) -> Self {
        if let Some((start, kind)) = self.nests.pop() {
            let len = self.buf.len() - start;
            match u16::try_from(len) {
                Ok(len) => self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes()),
                Err(_) => self.oversize(LengthError::Nest { kind, len }),
            }
        }
        self
    }

    /// Whether every length fits its field.
    pub fn check(&self) -> Result<(), LengthError> {
        if let Some(error) = &self.oversized {
            return Err(error.clone());
        }
        u32::try_from(self.buf.len())
            .map(drop)
            .map_err(|_| LengthError::Message {
                len: self.buf.len(),
            })
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

    fn oversize(&mut self, error: LengthError) {
        self.oversized.get_or_insert(error);
    }

    fn pad(&mut self) {
        while self.buf.len() % 4 != 0 {
            self.buf.push(0);
        }
    }
}

/// The messages in one received datagram.
pub fn split(datagram: &[u8]) -> Vec<Answer<'_>> {
    let mut answers = Vec::new();
    let mut rest = datagram;
    while rest.len() >= HEADER_LEN {
        let len = u32_at(rest, 0) as usize;
        if len < HEADER_LEN || len > rest.len() {
            break;
        }
        answers.push(Answer {
            kind: u16_at(rest, 4),
            flags: u16_at(rest, 6),
            seq: u32_at(rest, 8),
            payload: &rest[HEADER_LEN..len],
        });
        rest = &rest[align(len).min(rest.len())..];
    }
    answers
}

/// The error code of an `NLMSG_ERROR` payload: `None` for an
/// acknowledgement, else the (positive) errno.
pub fn error_code(payload: &[u8]) -> Option<i32> {
    if payload.len() < 4 {
        return Some(libc_eproto());
    }
    let code = i32::from_ne_bytes([payload[0], payload[1], payload[2], payload[3]]);
    (code != 0).then_some(-code)
}

/// The sequence number of the request an `NLMSG_ERROR` payload answers.
pub fn error_seq(payload: &[u8]) -> Option<u32> {
    (payload.len() >= 4 + HEADER_LEN).then(|| u32_at(payload, 4 + 8))
}

impl<'a> Attributes<'a> {
    /// The attributes in `bytes` (a payload after its family header, or a
    /// nested attribute's value).
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }
}

impl<'a> Iterator for Attributes<'a> {
    type Item = (u16, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.len() < 4 {
            return None;
        }
        let len = u16_at(self.rest, 0) as usize;
        let kind = u16_at(self.rest, 2) & NLA_TYPE_MASK;
        if len < 4 || len > self.rest.len() {
            self.rest = &[];
            return None;
        }
        let value = &self.rest[4..len];
        self.rest = &self.rest[align(len).min(self.rest.len())..];
        Some((kind, value))
    }
}

/// The first attribute of `kind` in `bytes`.
pub fn find(bytes: &[u8], kind: u16) -> Option<&[u8]> {
    Attributes::new(bytes)
        .find(|(k, _)| *k == kind)
        .map(|(_, v)| v)
}

/// A host-order `u16` value.
pub fn read_u16(value: &[u8]) -> Option<u16> {
    Some(u16::from_ne_bytes(value.get(..2)?.try_into().ok()?))
}

/// A host-order `u32` value.
pub fn read_u32(value: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(value.get(..4)?.try_into().ok()?))
}

/// A NUL-terminated string value.
pub fn read_string(value: &[u8]) -> String {
    let end = value.iter().position(|b| *b == 0).unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end]).into_owned()
}

/// An answer that cannot be understood.
pub fn malformed(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("malformed netlink answer: {what}"),
    )
}

fn libc_eproto() -> i32 {
    71
}

fn align(len: usize) -> usize {
    (len + 3) & !3
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([bytes[at], bytes[at + 1]])
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_built_message_reads_back_with_nesting_and_padding() {
        let bytes = Message::new(0x20, NLM_F_ACK)
            .raw(&[4, 1, 0, 0])
            .begin(1)
            .u16(1, 2)
            .string(6, "rr")
            .end()
            .u32(4, 900)
            .finish(7)
            .unwrap();
        assert_eq!(bytes.len() % 4, 0);
        let answers = split(&bytes);
        assert_eq!(answers.len(), 1);
        let answer = answers[0];
        assert_eq!((answer.kind, answer.seq), (0x20, 7));
        assert_eq!(answer.flags, NLM_F_ACK | NLM_F_REQUEST);
        let attrs: Vec<_> = Attributes::new(&answer.payload[4..]).collect();
        assert_eq!(attrs.len(), 2);
        assert_eq!(attrs[0].0, 1, "the nested flag is masked off");
        let nested: Vec<_> = Attributes::new(attrs[0].1).collect();
        assert_eq!(read_u16(nested[0].1), Some(2));
        assert_eq!(read_string(nested[1].1), "rr");
        assert_eq!(read_u32(attrs[1].1), Some(900));
    }

    #[test]
    fn truncated_input_ends_the_iteration_instead_of_panicking() {
        let bytes = Message::new(1, 0).u32(1, 5).finish(1).unwrap();
        assert_eq!(split(&bytes[..bytes.len() - 2]).len(), 0);
        let broken = [8u8, 0, 1, 0, 1, 2];
        assert_eq!(Attributes::new(&broken).count(), 0);
        assert_eq!(error_code(&[0, 0]), Some(71));
    }

    #[test]
    fn an_attribute_too_long_for_its_length_field_is_an_error_not_a_clamp() {
        let fits = vec![7u8; 65_531];
        let bytes = Message::new(1, 0).attr(3, &fits).finish(1).unwrap();
        let value = Attributes::new(split(&bytes)[0].payload).next().unwrap().1;
        assert_eq!(
            value.len(),
            65_531,
            "the largest value that fits is sent whole"
        );

        let oversized = vec![7u8; 65_532];
        let message = Message::new(1, 0).attr(3 | NLA_F_NET_BYTEORDER, &oversized);
        let error = LengthError::Attribute {
            kind: 3,
            len: 65_536,
        };
        assert_eq!(message.check(), Err(error.clone()));
        assert_eq!(message.finish(1), Err(error));
    }

    #[test]
    fn a_nest_holding_more_than_an_attribute_can_is_an_error_not_a_clamp() {
        let mut message = Message::new(1, 0).begin(2);
        for _ in 0..2_000 {
            message = message.attr(1, &[0u8; 32]);
        }
        let message = message.end().u32(4, 1);
        assert_eq!(
            message.finish(1),
            Err(LengthError::Nest {
                kind: 2,
                len: 4 + 2_000 * 36
            })
        );
        let error = LengthError::Nest {
            kind: 2,
            len: 72_004,
        }
        .to_string();
        assert!(error.contains("72004 bytes"), "{error}");
    }
}
