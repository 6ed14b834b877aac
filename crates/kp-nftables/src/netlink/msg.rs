//! The nf_tables vocabulary over [`kp_netlink`]: message kinds, the
//! questions the applier asks (the table, the ruleset generation), and the
//! answers and notifications it reads. Integers inside nf_tables
//! attributes are big-endian, as the kernel's `NLA_BE32` policies say.

use kp_netlink::nfnetlink::{self, NFPROTO_UNSPEC, SUBSYS_NFTABLES};
use kp_netlink::{find, messages, read_be_u32, Message, OwnedReply};

/// `NFT_MSG_NEWGEN`, the answer to `NFT_MSG_GETGEN`.
const MSG_NEWGEN: u8 = 15;
/// `NFT_MSG_GETGEN`.
const MSG_GETGEN: u8 = 16;
/// `NFT_MSG_GETTABLE`.
const MSG_GETTABLE: u8 = 1;
/// `NFTA_TABLE_NAME`.
const TABLE_NAME: u16 = 1;
/// `NFTA_GEN_ID`.
const GEN_ID: u16 = 1;

/// `NFT_MSG_*` message kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
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

/// An nf_tables request of `kind` for `family` (`NFPROTO_IPV4`,
/// `NFPROTO_IPV6`); attributes follow.
pub fn request(kind: Kind, family: u8, flags: u16) -> Message {
    nfnetlink::request(SUBSYS_NFTABLES, kind as u8, family, flags)
}

/// `NFT_MSG_GETGEN`: the ruleset generation (`nft list ruleset` shows it
/// as `# generation N`).
pub fn generation_request() -> Message {
    nfnetlink::request(SUBSYS_NFTABLES, MSG_GETGEN, NFPROTO_UNSPEC, 0)
}

/// `NFT_MSG_GETTABLE` of table `name` in `family` (`nft list table F
/// NAME` without its contents): answered by the table, or `ENOENT`.
pub fn table_request(family: u8, name: &str) -> Message {
    nfnetlink::request(SUBSYS_NFTABLES, MSG_GETTABLE, family, 0).string(TABLE_NAME, name)
}

/// The generation in an answer to [`generation_request`].
pub fn generation_of(reply: &OwnedReply) -> Option<u32> {
    if reply.kind != nfnetlink::message_type(SUBSYS_NFTABLES, MSG_NEWGEN) {
        return None;
    }
    generation_in(reply.payload())
}

/// The nf_tables notifications in `datagram`, in order; other messages
/// are skipped. A `NEWGEN` without a generation, and a datagram that ends
/// inside a message (cut by the receive buffer), are reported as a change
/// of no known table, so that neither is taken for a harmless commit.
pub fn parse_notifications<'a>(datagram: &'a [u8], out: &mut Vec<Notification<'a>>) {
    let mut messages = messages(datagram);
    for message in messages.by_ref() {
        if message.kind >> 8 != u16::from(SUBSYS_NFTABLES) {
            continue;
        }
        let family = message.payload.first().copied().unwrap_or(0);
        if message.kind & 0xff == u16::from(MSG_NEWGEN) {
            out.push(match generation_in(message.payload) {
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
        let table = nfnetlink::split_payload(message.payload)
            .and_then(|(_, attributes)| find(attributes, TABLE_NAME))
            .map(|name| name.split(|b| *b == 0).next().unwrap_or(name));
        out.push(Notification::Change { family, table });
    }
    if messages.truncated() {
        out.push(Notification::Change {
            family: 0,
            table: None,
        });
    }
}

/// The generation in an `NFT_MSG_NEWGEN` payload.
fn generation_in(payload: &[u8]) -> Option<u32> {
    let (_, attributes) = nfnetlink::split_payload(payload)?;
    find(attributes, GEN_ID).and_then(read_be_u32)
}

#[cfg(test)]
mod tests;
