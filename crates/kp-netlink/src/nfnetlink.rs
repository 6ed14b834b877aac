//! nfnetlink framing (`NETLINK_NETFILTER`), shared by ctnetlink, ipset,
//! nfacct and nf_tables:
//!
//! ```text
//! nlmsghdr  type u16 = subsystem << 8 | message
//! nfgenmsg  family u8 (NFPROTO_*) | version u8 = 0 | res_id be16
//! ```
//!
//! A batch (`NFNL_MSG_BATCH_BEGIN` … `NFNL_MSG_BATCH_END`, whose `res_id`
//! names the subsystem) is applied by the kernel as one transaction; only
//! nf_tables takes batches. The kernel reads a batch from one datagram, so
//! [`Channel::execute_batch`](crate::Channel::execute_batch) never splits
//! one ([`Batch`]).

use crate::message::Message;

/// `NFNL_SUBSYS_CTNETLINK`.
pub const SUBSYS_CTNETLINK: u8 = 1;
/// `NFNL_SUBSYS_IPSET`.
pub const SUBSYS_IPSET: u8 = 6;
/// `NFNL_SUBSYS_ACCT`.
pub const SUBSYS_ACCT: u8 = 7;
/// `NFNL_SUBSYS_NFTABLES`.
pub const SUBSYS_NFTABLES: u8 = 10;
/// `NFNL_MSG_BATCH_BEGIN`.
pub const MSG_BATCH_BEGIN: u16 = 0x10;
/// `NFNL_MSG_BATCH_END`.
pub const MSG_BATCH_END: u16 = 0x11;
/// `NFPROTO_UNSPEC`.
pub const NFPROTO_UNSPEC: u8 = 0;
/// `NFPROTO_IPV4`.
pub const NFPROTO_IPV4: u8 = 2;
/// `NFPROTO_IPV6`.
pub const NFPROTO_IPV6: u8 = 10;
/// `NFNL_BATCH_GENID`: the generation a batch is bound to.
const BATCH_GENID: u16 = 1;
/// Length of `nfgenmsg`.
pub const NFGENMSG_LEN: usize = 4;

/// The message type of `message` of `subsystem`.
pub fn message_type(subsystem: u8, message: u8) -> u16 {
    (u16::from(subsystem) << 8) | u16::from(message)
}

/// A request `message` of `subsystem` for `family` (`NFPROTO_*`), with its
/// nfgenmsg written; attributes follow.
pub fn request(subsystem: u8, message: u8, family: u8, flags: u16) -> Message {
    Message::new(message_type(subsystem, message), flags).raw(&[family, 0, 0, 0])
}

/// An nfnetlink batch: its subsystem, the ruleset generation it is bound
/// to, and how many requests ask for an acknowledgement each
/// ([`Channel::execute_batch`](crate::Channel::execute_batch)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    subsystem: u8,
    /// The kernel takes the batch only while the generation is this one.
    pub generation: Option<u32>,
    /// Batches of at most this many requests ask for an acknowledgement of
    /// each; larger ones of their last request only (refusals are answered
    /// anyway): acknowledgements of some 750,000 requests would hold
    /// hundreds of megabytes of socket buffer.
    pub acks_max: usize,
}

impl Batch {
    /// A batch of `subsystem` whose every request is acknowledged.
    pub fn new(subsystem: u8) -> Self {
        Self {
            subsystem,
            generation: None,
            acks_max: usize::MAX,
        }
    }

    /// Bound to ruleset generation `generation` (`NFNL_BATCH_GENID`): the
    /// kernel refuses it as a whole (`ERESTART`) once the generation moved.
    #[must_use]
    pub fn bound_to(mut self, generation: u32) -> Self {
        self.generation = Some(generation);
        self
    }

    /// Acknowledgements of every request only up to `max` requests.
    #[must_use]
    pub fn acks_max(mut self, max: usize) -> Self {
        self.acks_max = max;
        self
    }

    /// `NFNL_MSG_BATCH_BEGIN`.
    pub fn begin(&self) -> Message {
        let begin = batch_marker(MSG_BATCH_BEGIN, self.subsystem);
        match self.generation {
            Some(generation) => begin.be32(BATCH_GENID, generation),
            None => begin,
        }
    }

    /// `NFNL_MSG_BATCH_END`.
    pub fn end(&self) -> Message {
        batch_marker(MSG_BATCH_END, self.subsystem)
    }
}

fn batch_marker(kind: u16, subsystem: u8) -> Message {
    let res_id = u16::from(subsystem).to_be_bytes();
    Message::new(kind, 0).raw(&[NFPROTO_UNSPEC, 0, res_id[0], res_id[1]])
}

/// The nfgenmsg family of a payload, and the attributes after it.
pub fn split_payload(payload: &[u8]) -> Option<(u8, &[u8])> {
    let family = *payload.first()?;
    Some((family, payload.get(NFGENMSG_LEN..)?))
}
