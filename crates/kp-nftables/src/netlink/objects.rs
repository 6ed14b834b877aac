//! Tables, chains, sets and elements: one command of the transaction to
//! one netlink message (or several, for a long element list).

use std::net::IpAddr;

use kp_model::Protocol;
use kp_netlink::{Message, NLM_F_CREATE};

use super::msg::Kind;
use super::{EncodeError, Encoder};
use crate::model::{ChainKind, Hook, Key, KeyType, Name, SetElement, SetSpec, Verdict};

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
pub(super) const SET_TIMEOUT: u16 = 11;
pub(super) const SET_USERDATA: u16 = 13;
// NFT_SET_* flags
pub(super) const SET_F_ANONYMOUS: u32 = 0x1;
pub(super) const SET_F_CONSTANT: u32 = 0x2;
pub(super) const SET_F_INTERVAL: u32 = 0x4;
pub(super) const SET_F_MAP: u32 = 0x8;
pub(super) const SET_F_TIMEOUT: u32 = 0x10;
pub(super) const SET_F_EVAL: u32 = 0x20;
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
pub(super) const ELEM_USERDATA: u16 = 6;
// NFTA_DATA_*, NFTA_VERDICT_*
pub(super) const DATA_VALUE: u16 = 1;
pub(super) const DATA_VERDICT_ATTR: u16 = 2;
const VERDICT_CODE: u16 = 1;
const VERDICT_CHAIN: u16 = 2;

/// nft's data type ids, kept in sets' key type so `nft list` prints keys.
pub(super) const TYPE_IPV4: u32 = 7;
pub(super) const TYPE_IPV6: u32 = 8;
pub(super) const TYPE_PROTO: u32 = 12;
pub(super) const TYPE_SERVICE: u32 = 13;

/// The element messages of one command: elements beyond what one message
/// frames ([`ELEMENTS_BYTES_MAX`]) go on in the next one.
pub(super) struct ElementList<'a> {
    kind: Kind,
    flags: u16,
    set: &'a str,
    /// The set's id in the batch, for an anonymous set created in it.
    set_id: Option<u32>,
    /// The message whose element list is being written.
    message: Option<Message>,
}

impl Encoder {
    /// `add table F kube-proxy [{ comment "C" ; }]`, `delete table …`.
    pub(super) fn table(&mut self, delete: bool, comment: Option<&str>) -> Result<(), EncodeError> {
        let kind = if delete {
            Kind::DelTable
        } else {
            Kind::NewTable
        };
        let mut message = self.begin(kind, if delete { 0 } else { NLM_F_CREATE });
        message.put_string(TABLE_NAME, &self.table);
        if let Some(comment) = comment {
            message.put_attr(TABLE_USERDATA, &udata_comment(0, comment)?);
        }
        self.push(message)
    }

    /// `add chain F kube-proxy NAME [{ … }]`.
    pub(super) fn add_chain(&mut self, name: &Name, kind: &ChainKind) -> Result<(), EncodeError> {
        let mut message = self.begin(Kind::NewChain, NLM_F_CREATE);
        message.put_string(CHAIN_TABLE, &self.table);
        message.put_string(CHAIN_NAME, name.as_str());
        match kind {
            ChainKind::Regular => {}
            ChainKind::Commented(comment) => {
                message.put_attr(CHAIN_USERDATA, &udata_comment(0, comment)?);
            }
            ChainKind::Base {
                chain_type,
                hook,
                priority,
            } => {
                message.open_nest(CHAIN_HOOK);
                message.put_be32(HOOK_HOOKNUM, hook_number(*hook));
                message.put_attr(HOOK_PRIORITY, &priority.to_be_bytes());
                message.close_nest();
                message.put_string(CHAIN_TYPE, chain_type.keyword());
            }
        }
        self.push(message)
    }

    /// `flush chain …` (deletes its rules) or `delete chain …`.
    pub(super) fn chain_operation(&mut self, delete: bool, name: &Name) -> Result<(), EncodeError> {
        let kind = if delete {
            Kind::DelChain
        } else {
            Kind::DelRule
        };
        let mut message = self.begin(kind, 0);
        message.put_string(CHAIN_TABLE, &self.table);
        // NFTA_RULE_CHAIN is 2, NFTA_CHAIN_NAME is 3.
        message.put_string(if delete { CHAIN_NAME } else { 2 }, name.as_str());
        self.push(message)
    }

    /// `add set|map F kube-proxy NAME { … }`.
    pub(super) fn add_set(&mut self, spec: &SetSpec) -> Result<(), EncodeError> {
        let mut message = self.begin(Kind::NewSet, NLM_F_CREATE);
        message.put_string(SET_TABLE, &self.table);
        message.put_string(SET_NAME, spec.name.as_str());
        let mut type_id = 0u32;
        let mut key_len = 0u32;
        for field in spec.key {
            let (id, len) = match field {
                KeyType::Ipv4Addr => (TYPE_IPV4, 4),
                KeyType::Ipv6Addr => (TYPE_IPV6, 16),
                KeyType::InetProto => (TYPE_PROTO, 4),
                KeyType::InetService => (TYPE_SERVICE, 4),
            };
            type_id = (type_id << 6) | id;
            key_len += len;
        }
        // NFT_SET_CONCAT is for concatenated ranges only; a hash set takes
        // a concatenated key as it is.
        let mut flags = 0;
        if spec.map || spec.verdicts {
            flags |= SET_F_MAP;
        }
        if spec.dynamic_timeout_secs.is_some() {
            flags |= SET_F_EVAL | SET_F_TIMEOUT;
        }
        message.put_be32(SET_FLAGS, flags);
        message.put_be32(SET_KEY_TYPE, type_id);
        message.put_be32(SET_KEY_LEN, key_len);
        if spec.verdicts {
            message.put_be32(SET_DATA_TYPE, DATA_VERDICT);
            message.put_be32(SET_DATA_LEN, 0);
        }
        if let Some(seconds) = spec.dynamic_timeout_secs {
            message.put_be64(SET_TIMEOUT, seconds.saturating_mul(1000));
        }
        let set_id = self.next_set_id();
        message.put_be32(SET_ID, set_id);
        if let Some(comment) = spec.comment {
            // NFTNL_UDATA_SET_COMMENT
            message.put_attr(SET_USERDATA, &udata_comment(7, comment)?);
        }
        self.push(message)
    }

    /// `flush set|map …` (deletes its elements) or `delete set|map …`.
    pub(super) fn set_operation(&mut self, delete: bool, name: &Name) -> Result<(), EncodeError> {
        let kind = if delete {
            Kind::DelSet
        } else {
            Kind::DelSetElem
        };
        let mut message = self.begin(kind, 0);
        // NFTA_SET_ELEM_LIST_TABLE and _SET have NFTA_SET_TABLE's and
        // _NAME's numbers.
        message.put_string(SET_TABLE, &self.table);
        message.put_string(SET_NAME, name.as_str());
        self.push(message)
    }

    /// `add element … NAME { E[, E…] }`.
    pub(super) fn add_elements(
        &mut self,
        set: &Name,
        elements: &[SetElement],
    ) -> Result<(), EncodeError> {
        let mut list = ElementList::new(Kind::NewSetElem, NLM_F_CREATE, set.as_str(), None);
        for element in elements {
            let message = list.next(self)?;
            message.open_nest(LIST_ELEM);
            message.open_nest(ELEM_KEY);
            message.put_attr(DATA_VALUE, &key_bytes(&element.key));
            message.close_nest();
            if let Some(verdict) = &element.verdict {
                verdict_data(message, ELEM_DATA, verdict);
            }
            if let Some(comment) = &element.comment {
                // NFTNL_UDATA_SET_ELEM_COMMENT
                message.put_attr(ELEM_USERDATA, &udata_comment(0, comment)?);
            }
            message.close_nest();
        }
        list.finish(self)
    }

    /// `delete element … NAME { KEY[, KEY…] }`.
    pub(super) fn delete_elements(&mut self, set: &Name, keys: &[Key]) -> Result<(), EncodeError> {
        let mut list = ElementList::new(Kind::DelSetElem, 0, set.as_str(), None);
        for key in keys {
            let message = list.next(self)?;
            message.open_nest(LIST_ELEM);
            message.open_nest(ELEM_KEY);
            message.put_attr(DATA_VALUE, &key_bytes(key));
            message.close_nest();
            message.close_nest();
        }
        list.finish(self)
    }
}

impl<'a> ElementList<'a> {
    /// The element messages of set `set` (with `set_id`, an anonymous set
    /// of the same batch).
    pub(super) fn new(kind: Kind, flags: u16, set: &'a str, set_id: Option<u32>) -> Self {
        Self {
            kind,
            flags,
            set,
            set_id,
            message: None,
        }
    }

    /// The message to write the next element into: a full one is ended
    /// and another started.
    pub(super) fn next(&mut self, encoder: &mut Encoder) -> Result<&mut Message, EncodeError> {
        let message = match self.message.take() {
            Some(message) if message.nest_len() < ELEMENTS_BYTES_MAX => message,
            full => {
                if let Some(mut full) = full {
                    full.close_nest();
                    encoder.push(full)?;
                }
                let mut message = encoder.begin(self.kind, self.flags);
                message.put_string(ELEM_LIST_TABLE, &encoder.table);
                message.put_string(ELEM_LIST_SET, self.set);
                if let Some(id) = self.set_id {
                    message.put_be32(ELEM_LIST_SET_ID, id);
                }
                message.open_nest(ELEM_LIST_ELEMENTS);
                message
            }
        };
        Ok(self.message.insert(message))
    }

    /// Ends the last message.
    pub(super) fn finish(self, encoder: &mut Encoder) -> Result<(), EncodeError> {
        match self.message {
            Some(mut message) => {
                message.close_nest();
                encoder.push(message)
            }
            None => Ok(()),
        }
    }
}

/// `NF_INET_*`.
fn hook_number(hook: Hook) -> u32 {
    match hook {
        Hook::Prerouting => 0,
        Hook::Input => 1,
        Hook::Forward => 2,
        Hook::Output => 3,
        Hook::Postrouting => 4,
    }
}

/// A verdict as nested data.
pub(super) fn verdict_data(message: &mut Message, attr: u16, verdict: &Verdict) {
    let (code, chain): (i32, Option<&Name>) = match verdict {
        Verdict::Goto(chain) => (-4, Some(chain)),
        Verdict::Jump(chain) => (-3, Some(chain)),
        Verdict::Drop => (0, None),
        Verdict::Accept => (1, None),
        Verdict::Return => (-5, None),
    };
    message.open_nest(attr);
    message.open_nest(DATA_VERDICT_ATTR);
    message.put_attr(VERDICT_CODE, &code.to_be_bytes());
    if let Some(chain) = chain {
        message.put_string(VERDICT_CHAIN, chain.as_str());
    }
    message.close_nest();
    message.close_nest();
}

/// A key as the kernel compares it: each concatenated field padded to 4
/// bytes (addresses, protocol numbers, ports in network order).
pub(super) fn key_bytes(key: &Key) -> Vec<u8> {
    let mut out = Vec::with_capacity(24);
    let address = |out: &mut Vec<u8>, ip: &IpAddr| match ip {
        IpAddr::V4(ip) => out.extend_from_slice(&ip.octets()),
        IpAddr::V6(ip) => out.extend_from_slice(&ip.octets()),
    };
    let proto_port = |out: &mut Vec<u8>, protocol: Protocol, port: u16| {
        out.extend_from_slice(&[protocol_number(protocol), 0, 0, 0]);
        out.extend_from_slice(&port.to_be_bytes());
        out.extend_from_slice(&[0, 0]);
    };
    match key {
        Key::Addr(ip) => address(&mut out, ip),
        Key::AddrProtoPort(ip, protocol, port) => {
            address(&mut out, ip);
            proto_port(&mut out, *protocol, *port);
        }
        Key::ProtoPort(protocol, port) => proto_port(&mut out, *protocol, *port),
        // `numgen` writes host-order numbers, and the set compares them so.
        Key::EntrySlot(ip, port, slot) => {
            address(&mut out, ip);
            out.extend_from_slice(&port.to_be_bytes());
            out.extend_from_slice(&[0, 0]);
            out.extend_from_slice(&slot.to_ne_bytes());
        }
        Key::PortSlot(port, slot) => {
            out.extend_from_slice(&port.to_be_bytes());
            out.extend_from_slice(&[0, 0]);
            out.extend_from_slice(&slot.to_ne_bytes());
        }
        Key::AddrPair(source, destination) => {
            address(&mut out, source);
            address(&mut out, destination);
        }
    }
    out
}

/// The IP protocol number.
pub(super) fn protocol_number(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
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
