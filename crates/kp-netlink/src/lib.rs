//! The one netlink layer of kube-proxy-rs: every mode and helper crate that
//! talks to the kernel over netlink (IPVS, ipset, the dummy link, nfacct,
//! conntrack, nftables) goes through this crate.
//!
//! - [`Message`] builds a request whose every length is checked: an
//!   attribute, nest or message too long for its length field is an error
//!   ([`LengthError`]) naming what it is, never a length cut to fit (a cut
//!   length makes the kernel read a different message than the one built).
//!   Messages of rust-netlink's crates (`netlink-packet-route`,
//!   `netlink-packet-netfilter`) are requests too ([`Request`]).
//! - [`nfnetlink`] frames nfnetlink requests and batches.
//! - [`Channel`] owns one socket of one protocol, opened on first use in
//!   the network namespace of the calling thread, and its sequence numbers.
//!   It sends requests in datagrams that fit and matches every
//!   acknowledgement and error to its request ([`Channel::execute`]), reads
//!   dumps until `NLMSG_DONE` ([`Channel::dump`]) and asks single questions
//!   ([`Channel::ask`]).
//! - [`Subscription`] listens to multicast notifications, apart from any
//!   channel.
//! - [`messages`] and [`Attributes`] read the kernel's answers.
//!
//! ```text
//! nlmsghdr  len u32 | type u16 | flags u16 | seq u32 | pid u32
//! payload   family header (genlmsghdr, nfgenmsg, ifinfomsg, ifaddrmsg)
//!           attributes: len u16 | type u16 | value, padded to 4 bytes;
//!           type bit 15 = nested, bit 14 = value in network byte order
//! ```

mod channel;
mod message;
pub mod nfnetlink;
mod parse;
mod subscription;

use std::io;

pub use channel::{BatchError, BatchFailure, Channel, EncodedBatch};
pub use message::{LengthError, Message, Request};
pub use parse::{
    error_code, find, messages, read_be_u16, read_be_u32, read_be_u64, read_string, read_u16,
    read_u32, Attributes, Messages, OwnedReply, Reply,
};

pub use subscription::Subscription;

pub use netlink_sys::protocols::{NETLINK_GENERIC, NETLINK_NETFILTER, NETLINK_ROUTE};

/// `NLMSG_NOOP`.
pub const NLMSG_NOOP: u16 = 1;
/// `NLMSG_ERROR`: an acknowledgement (error 0) or a refusal.
pub const NLMSG_ERROR: u16 = 2;
/// `NLMSG_DONE`: the end of a dump.
pub const NLMSG_DONE: u16 = 3;
/// `NLM_F_REQUEST`.
pub const NLM_F_REQUEST: u16 = 0x1;
/// `NLM_F_MULTI`: part of a multi-part answer.
pub const NLM_F_MULTI: u16 = 0x2;
/// `NLM_F_ACK`.
pub const NLM_F_ACK: u16 = 0x4;
/// `NLM_F_DUMP_INTR`: the dumped table changed while it was dumped.
pub const NLM_F_DUMP_INTR: u16 = 0x10;
/// `NLM_F_REPLACE`.
pub const NLM_F_REPLACE: u16 = 0x100;
/// `NLM_F_EXCL`.
pub const NLM_F_EXCL: u16 = 0x200;
/// `NLM_F_CREATE`.
pub const NLM_F_CREATE: u16 = 0x400;
/// `NLM_F_APPEND`.
pub const NLM_F_APPEND: u16 = 0x800;
/// `NLM_F_DUMP` (`NLM_F_ROOT | NLM_F_MATCH`).
pub const NLM_F_DUMP: u16 = 0x300;
/// `NLA_F_NESTED`.
pub const NLA_F_NESTED: u16 = 0x8000;
/// `NLA_F_NET_BYTEORDER`.
pub const NLA_F_NET_BYTEORDER: u16 = 0x4000;
/// The type bits of an attribute (`NLA_TYPE_MASK`).
pub const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | NLA_F_NET_BYTEORDER);
/// Length of `nlmsghdr`.
pub const HEADER_LEN: usize = 16;
/// The longest attribute (or nest) netlink can frame, its 4-byte header
/// included: `nla_len` is a u16.
pub const ATTR_LEN_MAX: usize = u16::MAX as usize;

/// What went wrong while talking to the kernel over netlink.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket could not be set up.
    #[error("opening a netlink socket failed while {step}: {source}")]
    Open {
        /// What was being done (`creating the socket`, `binding it`, …).
        step: &'static str,
        /// The system call's error.
        #[source]
        source: io::Error,
    },
    /// A request could not be sent.
    #[error("sending to the kernel failed: {0}")]
    Send(#[source] io::Error),
    /// The kernel's answer could not be received whole: a receive error,
    /// no answer in time, answers dropped because the socket's buffer was
    /// full (`ENOBUFS`), or a datagram longer than the buffer.
    #[error("receiving the kernel's answer failed: {0}")]
    Receive(#[source] io::Error),
    /// The kernel refused the request; the error carries its errno.
    #[error("{0}")]
    Kernel(#[source] io::Error),
    /// The request was not sent: a length does not fit its field.
    #[error("the request was not sent: {0}")]
    TooLarge(#[from] LengthError),
    /// The kernel's answer cannot be understood.
    #[error("malformed netlink answer: {0}")]
    Malformed(&'static str),
}

impl Error {
    /// The kernel's error code (positive errno) of a refusal.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Kernel(error) => error.raw_os_error(),
            _ => None,
        }
    }

    /// Whether the exchange itself failed (the socket is unusable until it
    /// is opened again), as opposed to a refused or unsent request.
    pub fn is_broken(&self) -> bool {
        matches!(
            self,
            Self::Open { .. } | Self::Send(_) | Self::Receive(_) | Self::Malformed(_)
        )
    }
}

impl From<Error> for io::Error {
    /// The error as the system call or the kernel said it: a refusal keeps
    /// its errno, so that callers can tell `ENOENT` from `EEXIST`.
    fn from(error: Error) -> Self {
        match error {
            Error::Open { source, .. } | Error::Send(source) | Error::Receive(source) => source,
            Error::Kernel(source) => source,
            Error::TooLarge(error) => io::Error::new(io::ErrorKind::InvalidInput, error),
            Error::Malformed(what) => io::Error::new(
                io::ErrorKind::InvalidData,
                format!("malformed netlink answer: {what}"),
            ),
        }
    }
}
