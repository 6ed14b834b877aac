//! Reading the kernel's answers: the messages of a datagram, the
//! attributes of a payload, and their values.

use crate::{HEADER_LEN, NLA_TYPE_MASK, NLMSG_DONE, NLMSG_ERROR};

/// One message of a received datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply<'a> {
    /// `nlmsg_type`.
    pub kind: u16,
    /// `nlmsg_flags`.
    pub flags: u16,
    /// `nlmsg_seq`.
    pub seq: u32,
    /// Everything after the header.
    pub payload: &'a [u8],
    /// The whole message, header included (for `netlink-packet-*` parsers).
    pub bytes: &'a [u8],
}

/// An answer kept beyond the datagram it came in ([`Channel::ask`](crate::Channel::ask)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedReply {
    /// `nlmsg_type`.
    pub kind: u16,
    /// `nlmsg_flags`.
    pub flags: u16,
    /// The whole message, header included.
    pub bytes: Vec<u8>,
}

/// The messages of one datagram, in order ([`messages`]).
#[derive(Debug, Clone)]
pub struct Messages<'a> {
    /// What is left to read; after the walk, what could not be read.
    rest: &'a [u8],
}

/// Attributes of a payload, in order: `(type without flag bits, value)`.
/// A malformed attribute ends the walk.
#[derive(Debug, Clone)]
pub struct Attributes<'a> {
    rest: &'a [u8],
}

impl Reply<'_> {
    /// The kernel's answer to a request, when this is an `NLMSG_ERROR`:
    /// `Ok(())` for an acknowledgement, else the (positive) errno. A
    /// `NLMSG_DONE` carries an error the same way when a dump failed
    /// after it started; `None` for every other message.
    pub fn status(&self) -> Option<Result<(), i32>> {
        match self.kind {
            NLMSG_ERROR => Some(error_code(self.payload).map_or(Ok(()), Err)),
            NLMSG_DONE => Some(match read_i32(self.payload) {
                Some(code) if code < 0 => Err(-code),
                _ => Ok(()),
            }),
            _ => None,
        }
    }

    /// A copy that outlives the datagram.
    pub fn to_owned(&self) -> OwnedReply {
        OwnedReply {
            kind: self.kind,
            flags: self.flags,
            bytes: self.bytes.to_vec(),
        }
    }
}

impl OwnedReply {
    /// Everything after the header.
    pub fn payload(&self) -> &[u8] {
        self.bytes.get(HEADER_LEN..).unwrap_or_default()
    }
}

/// The messages in one received datagram; a truncated message ends the
/// walk, and [`Messages::truncated`] tells so afterwards: an answer that
/// cannot be read whole could have been a refusal, so readers treat it as
/// an error rather than skip it.
pub fn messages(datagram: &[u8]) -> Messages<'_> {
    Messages { rest: datagram }
}

impl Messages<'_> {
    /// Whether the walk ended inside a message (a length field that points
    /// before its header or past the datagram): meaningful once the
    /// iterator returned `None`.
    pub fn truncated(&self) -> bool {
        !self.rest.is_empty()
    }
}

impl<'a> Iterator for Messages<'a> {
    type Item = Reply<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        let rest = self.rest;
        let header = rest.get(..HEADER_LEN)?;
        let len = u32_at(header, 0) as usize;
        if len < HEADER_LEN || len > rest.len() {
            return None;
        }
        self.rest = rest.get(align(len)..).unwrap_or_default();
        Some(Reply {
            kind: u16_at(header, 4),
            flags: u16_at(header, 6),
            seq: u32_at(header, 8),
            payload: &rest[HEADER_LEN..len],
            bytes: &rest[..len],
        })
    }
}

/// The error code of an `NLMSG_ERROR` payload: `None` for an
/// acknowledgement, else the (positive) errno; a payload too short to hold
/// a code is `EPROTO`.
pub fn error_code(payload: &[u8]) -> Option<i32> {
    match read_i32(payload) {
        None => Some(EPROTO),
        Some(0) => None,
        Some(code) => Some(code.saturating_neg()),
    }
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
        let len = usize::from(u16_at(self.rest, 0));
        let kind = u16_at(self.rest, 2) & NLA_TYPE_MASK;
        if len < 4 || len > self.rest.len() {
            self.rest = &[];
            return None;
        }
        let value = &self.rest[4..len];
        self.rest = self.rest.get(align(len)..).unwrap_or_default();
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

/// A big-endian `u16` value of exactly two bytes.
pub fn read_be_u16(value: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(value.try_into().ok()?))
}

/// A big-endian `u32` value of exactly four bytes.
pub fn read_be_u32(value: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(value.try_into().ok()?))
}

/// A big-endian `u64` value of exactly eight bytes.
pub fn read_be_u64(value: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(value.try_into().ok()?))
}

/// A NUL-terminated string value (lossy for bytes that are not UTF-8).
pub fn read_string(value: &[u8]) -> String {
    let end = value.iter().position(|b| *b == 0).unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end]).into_owned()
}

/// `EPROTO`.
const EPROTO: i32 = 71;

fn read_i32(value: &[u8]) -> Option<i32> {
    Some(i32::from_ne_bytes(value.get(..4)?.try_into().ok()?))
}

pub(crate) fn align(len: usize) -> usize {
    (len + 3) & !3
}

/// Callers check that `at + 2 <= bytes.len()`.
fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([bytes[at], bytes[at + 1]])
}

/// Callers check that `at + 4 <= bytes.len()`.
fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

#[cfg(test)]
#[path = "parse_tests.rs"]
pub(crate) mod tests;
