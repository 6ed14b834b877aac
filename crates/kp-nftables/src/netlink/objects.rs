//! Tables, chains, sets and elements: one line of the transaction text to
//! one netlink message, for the lines the renderer writes.

use std::net::IpAddr;

use super::msg::{Batch, Kind, F_CREATE};
use super::{EncodeError, Encoder};

/// Bytes of elements after which a `NEWSETELEM` message is ended and the
/// next element starts another, as libnftnl does: the element list is one
/// nested attribute, whose length field holds at most 65,535 bytes, and
/// one element (a key, a verdict naming a chain of at most 256 bytes, a
/// comment of at most 255) stays well under the rest.
pub(super) const ELEMENTS_BYTES_MAX: usize = 32 * 1024;

// NFTA_TABLE_*
const TABLE_NAME: u16 = 1;
const TABLE_USERDATA: u16 = 6;
// NFTA_CHAIN_*
const CHAIN_TABLE: u16 = 1;
const CHAIN_NAME: u16 = 3;
const CHAIN_HOOK: u16 = 4;
const CHAIN_TYPE: u16 = 7;
const CHAIN_USERDATA: u16 = 12;
const HOOK_HOOKNUM: u16 = 1;
const HOOK_PRIORITY: u16 = 2;
// NFTA_SET_*
pub(super) const SET_TABLE: u16 = 1;
pub(super) const SET_NAME: u16 = 2;
pub(super) const SET_FLAGS: u16 = 3;
pub(super) const SET_KEY_TYPE: u16 = 4;
pub(super) const SET_KEY_LEN: u16 = 5;
pub(super) const SET_DATA_TYPE: u16 = 6;
pub(super) const SET_DATA_LEN: u16 = 7;
pub(super) const SET_ID: u16 = 10;
const SET_TIMEOUT: u16 = 11;
pub(super) const SET_USERDATA: u16 = 13;
// NFT_SET_* flags
pub(super) const SET_F_ANONYMOUS: u32 = 0x1;
pub(super) const SET_F_CONSTANT: u32 = 0x2;
pub(super) const SET_F_INTERVAL: u32 = 0x4;
pub(super) const SET_F_MAP: u32 = 0x8;
const SET_F_TIMEOUT: u32 = 0x10;
const SET_F_EVAL: u32 = 0x20;
/// `NFT_DATA_VERDICT`.
pub(super) const DATA_VERDICT: u32 = 0xffff_ff00;
// NFTA_SET_ELEM_LIST_*
pub(super) const ELEM_LIST_TABLE: u16 = 1;
pub(super) const ELEM_LIST_SET: u16 = 2;
pub(super) const ELEM_LIST_ELEMENTS: u16 = 3;
pub(super) const ELEM_LIST_SET_ID: u16 = 4;
pub(super) const LIST_ELEM: u16 = 1;
// NFTA_SET_ELEM_*
pub(super) const ELEM_KEY: u16 = 1;
pub(super) const ELEM_DATA: u16 = 2;
pub(super) const ELEM_FLAGS: u16 = 3;
const ELEM_USERDATA: u16 = 6;
// NFTA_DATA_*, NFTA_VERDICT_*
pub(super) const DATA_VALUE: u16 = 1;
pub(super) const DATA_VERDICT_ATTR: u16 = 2;
const VERDICT_CODE: u16 = 1;
const VERDICT_CHAIN: u16 = 2;

/// nft's data type ids, kept in sets' key type so `nft list` prints keys.
const TYPE_IPV4: u32 = 7;
const TYPE_IPV6: u32 = 8;
const TYPE_PROTO: u32 = 12;
const TYPE_SERVICE: u32 = 13;

impl Encoder {
    /// `add table F kube-proxy [{ comment "C" ; }]`, `delete table …`.
    pub(super) fn table(
        &mut self,
        batch: &mut Batch,
        delete: bool,
        body: &str,
    ) -> Result<(), EncodeError> {
        let kind = if delete {
            Kind::DelTable
        } else {
            Kind::NewTable
        };
        let seq = batch.begin(kind, self.family, if delete { 0 } else { F_CREATE });
        self.note(seq);
        batch.str(TABLE_NAME, &self.table);
        if let Some(comment) = comment_of(body) {
            batch.attr(TABLE_USERDATA, &udata_comment(0, comment)?);
        }
        batch.end()?;
        Ok(())
    }

    /// `add|flush|delete chain F kube-proxy NAME [{ … }]`.
    pub(super) fn chain(
        &mut self,
        batch: &mut Batch,
        verb: &str,
        rest: &str,
    ) -> Result<(), EncodeError> {
        let (name, body) = split_name(rest);
        let (kind, flags) = match verb {
            "add" => (Kind::NewChain, F_CREATE),
            "flush" => (Kind::DelRule, 0),
            "delete" => (Kind::DelChain, 0),
            _ => return Err(EncodeError::Unsupported),
        };
        let seq = batch.begin(kind, self.family, flags);
        self.note(seq);
        batch.str(CHAIN_TABLE, &self.table);
        // NFTA_RULE_CHAIN is 2, NFTA_CHAIN_NAME is 3.
        batch.str(if kind == Kind::DelRule { 2 } else { CHAIN_NAME }, name);
        if kind == Kind::NewChain {
            self.chain_body(batch, body)?;
        }
        batch.end()?;
        Ok(())
    }

    fn chain_body(&mut self, batch: &mut Batch, body: &str) -> Result<(), EncodeError> {
        if let Some(comment) = comment_of(body) {
            batch.attr(CHAIN_USERDATA, &udata_comment(0, comment)?);
            return Ok(());
        }
        let words: Vec<&str> = body.split_whitespace().collect();
        let Some(position) = words.iter().position(|w| *w == "type") else {
            return Ok(());
        };
        let (chain_type, hook, priority) = match &words[position..] {
            ["type", t, "hook", h, "priority", p, ..] => (*t, *h, *p),
            _ => return Err(EncodeError::Unsupported),
        };
        let hooknum = match hook {
            "prerouting" => 0,
            "input" => 1,
            "forward" => 2,
            "output" => 3,
            "postrouting" => 4,
            _ => return Err(EncodeError::Unsupported),
        };
        let priority: i32 = priority.parse().map_err(|_| EncodeError::Unsupported)?;
        batch.open(CHAIN_HOOK);
        batch.u32(HOOK_HOOKNUM, hooknum);
        batch.attr(HOOK_PRIORITY, &priority.to_be_bytes());
        batch.close();
        batch.str(CHAIN_TYPE, chain_type);
        Ok(())
    }

    /// `add set|map …`, `flush set|map …`, `delete set|map …`.
    pub(super) fn set(
        &mut self,
        batch: &mut Batch,
        verb: &str,
        is_map: bool,
        rest: &str,
    ) -> Result<(), EncodeError> {
        let (name, body) = split_name(rest);
        let (kind, flags) = match verb {
            "add" => (Kind::NewSet, F_CREATE),
            "flush" => (Kind::DelSetElem, 0),
            "delete" => (Kind::DelSet, 0),
            _ => return Err(EncodeError::Unsupported),
        };
        let seq = batch.begin(kind, self.family, flags);
        self.note(seq);
        batch.str(SET_TABLE, &self.table);
        batch.str(SET_NAME, name);
        if kind == Kind::NewSet {
            self.set_body(batch, is_map, body)?;
        }
        batch.end()?;
        Ok(())
    }

    fn set_body(&mut self, batch: &mut Batch, is_map: bool, body: &str) -> Result<(), EncodeError> {
        let type_spec = body
            .split(';')
            .find_map(|part| {
                part.trim()
                    .trim_start_matches('{')
                    .trim()
                    .strip_prefix("type ")
            })
            .ok_or(EncodeError::Unsupported)?;
        let (key, data) = match type_spec.split_once(" : ") {
            Some((key, data)) => (key.trim(), Some(data.trim())),
            None => (type_spec.trim(), None),
        };
        let mut type_id = 0u32;
        let mut key_len = 0u32;
        for field in key.split(" . ") {
            let (id, len) = match field {
                "ipv4_addr" => (TYPE_IPV4, 4),
                "ipv6_addr" => (TYPE_IPV6, 16),
                "inet_proto" => (TYPE_PROTO, 4),
                "inet_service" => (TYPE_SERVICE, 4),
                _ => return Err(EncodeError::Unsupported),
            };
            type_id = (type_id << 6) | id;
            key_len += len;
        }
        // NFT_SET_CONCAT is for concatenated ranges only; a hash set takes
        // a concatenated key as it is.
        let mut flags = 0;
        if is_map || data.is_some() {
            flags |= SET_F_MAP;
        }
        if body.contains("flags dynamic,timeout") {
            flags |= SET_F_EVAL | SET_F_TIMEOUT;
        }
        batch.u32(SET_FLAGS, flags);
        batch.u32(SET_KEY_TYPE, type_id);
        batch.u32(SET_KEY_LEN, key_len);
        if data == Some("verdict") {
            batch.u32(SET_DATA_TYPE, DATA_VERDICT);
            batch.u32(SET_DATA_LEN, 0);
        }
        if let Some(seconds) = timeout_of(body) {
            batch.u64(SET_TIMEOUT, seconds * 1000);
        }
        let set_id = self.next_set_id();
        batch.u32(SET_ID, set_id);
        if let Some(comment) = comment_of(body) {
            // NFTNL_UDATA_SET_COMMENT
            batch.attr(SET_USERDATA, &udata_comment(7, comment)?);
        }
        Ok(())
    }

    /// `add element … NAME { KEY[, KEY…] [comment "C"] [: VERDICT] }`,
    /// `delete element … NAME { KEY }`.
    pub(super) fn element(
        &mut self,
        batch: &mut Batch,
        delete: bool,
        rest: &str,
    ) -> Result<(), EncodeError> {
        let (name, body) = split_name(rest);
        let inner = body
            .strip_prefix("{ ")
            .and_then(|b| b.strip_suffix(" }"))
            .ok_or(EncodeError::Unsupported)?;
        let (keys, verdict) = match inner.split_once(" : ") {
            Some((keys, verdict)) => (keys, Some(verdict)),
            None => (inner, None),
        };
        let (keys, comment) = match keys.split_once(" comment ") {
            Some((keys, comment)) => (keys, Some(comment.trim_matches('"'))),
            None => (keys, None),
        };
        let kind = if delete {
            Kind::DelSetElem
        } else {
            Kind::NewSetElem
        };
        let comment = match comment.filter(|_| !delete) {
            Some(comment) => Some(udata_comment(0, comment)?),
            None => None,
        };
        // Elements beyond what one message frames go on in the next one.
        let mut open = false;
        for key in keys.split(", ") {
            if !open {
                let seq = batch.begin(kind, self.family, if delete { 0 } else { F_CREATE });
                self.note(seq);
                batch.str(ELEM_LIST_TABLE, &self.table);
                batch.str(ELEM_LIST_SET, name);
                batch.open(ELEM_LIST_ELEMENTS);
                open = true;
            }
            batch.open(LIST_ELEM);
            batch.open(ELEM_KEY);
            batch.attr(DATA_VALUE, &key_bytes(key)?);
            batch.close();
            if let Some(verdict) = verdict.filter(|_| !delete) {
                verdict_data(batch, ELEM_DATA, verdict)?;
            }
            if let Some(comment) = &comment {
                // NFTNL_UDATA_SET_ELEM_COMMENT
                batch.attr(ELEM_USERDATA, comment);
            }
            batch.close();
            if batch.nest_len() >= ELEMENTS_BYTES_MAX {
                batch.close();
                batch.end()?;
                open = false;
            }
        }
        if open {
            batch.close();
            batch.end()?;
        }
        Ok(())
    }
}

/// A verdict as nested data: `goto C`, `jump C`, `drop`, `accept`, `return`.
pub(super) fn verdict_data(batch: &mut Batch, attr: u16, verdict: &str) -> Result<(), EncodeError> {
    let (code, chain): (i32, Option<&str>) = match verdict.split_once(' ') {
        Some(("goto", chain)) => (-4, Some(chain)),
        Some(("jump", chain)) => (-3, Some(chain)),
        None if verdict == "drop" => (0, None),
        None if verdict == "accept" => (1, None),
        None if verdict == "return" => (-5, None),
        _ => return Err(EncodeError::Unsupported),
    };
    batch.open(attr);
    batch.open(DATA_VERDICT_ATTR);
    batch.attr(VERDICT_CODE, &code.to_be_bytes());
    if let Some(chain) = chain {
        batch.str(VERDICT_CHAIN, chain);
    }
    batch.close();
    batch.close();
    Ok(())
}

/// A key as the kernel compares it: each concatenated field padded to 4
/// bytes (addresses, protocol numbers, ports in network order).
pub(super) fn key_bytes(key: &str) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::with_capacity(24);
    for field in key.split(" . ") {
        if let Ok(ip) = field.parse::<IpAddr>() {
            match ip {
                IpAddr::V4(ip) => out.extend_from_slice(&ip.octets()),
                IpAddr::V6(ip) => out.extend_from_slice(&ip.octets()),
            }
        } else if let Some(proto) = protocol_number(field) {
            out.extend_from_slice(&[proto, 0, 0, 0]);
        } else if let Ok(port) = field.parse::<u16>() {
            out.extend_from_slice(&port.to_be_bytes());
            out.extend_from_slice(&[0, 0]);
        } else {
            return Err(EncodeError::Unsupported);
        }
    }
    Ok(out)
}

/// `tcp`, `udp`, `sctp` as IP protocol numbers.
pub(super) fn protocol_number(name: &str) -> Option<u8> {
    match name {
        "tcp" => Some(6),
        "udp" => Some(17),
        "sctp" => Some(132),
        _ => None,
    }
}

/// nftnl user data holding one comment: type, length, NUL-terminated text.
/// The length is one byte: a longer comment is refused, not cut (a cut
/// comment would still be sent, and read back as a different one).
pub(super) fn udata_comment(kind: u8, comment: &str) -> Result<Vec<u8>, EncodeError> {
    let text: &[u8] = comment.as_bytes();
    let len = u8::try_from(text.len() + 1).map_err(|_| EncodeError::CommentTooLong {
        len: text.len(),
        max: usize::from(u8::MAX) - 1,
    })?;
    let mut out = vec![kind, len];
    out.extend_from_slice(text);
    out.push(0);
    Ok(out)
}

fn split_name(rest: &str) -> (&str, &str) {
    rest.split_once(' ').unwrap_or((rest, ""))
}

fn comment_of(body: &str) -> Option<&str> {
    let start = body.find("comment \"")? + "comment \"".len();
    let end = body[start..].find('"')? + start;
    Some(&body[start..end])
}

fn timeout_of(body: &str) -> Option<u64> {
    body.split(';')
        .find_map(|part| part.trim().strip_prefix("timeout "))
        .and_then(|value| value.trim().strip_suffix('s'))
        .and_then(|seconds| seconds.parse().ok())
}
