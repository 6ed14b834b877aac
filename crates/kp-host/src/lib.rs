//! The node's own addresses, as `ip address show` lists them: every address
//! of every interface, IPv4 and IPv6, read with one rtnetlink dump
//! (`RTM_GETADDR`) and kept in a cache ([`HostAddresses`]).
//!
//! The cache is read again only when the kernel says an address changed: a
//! second rtnetlink socket is subscribed to the multicast groups
//! `RTNLGRP_IPV4_IFADDR` and `RTNLGRP_IPV6_IFADDR` (the `RTMGRP_*_IFADDR`
//! bits of `ip monitor address`), and every read first drains what is
//! pending there without blocking. Nothing pending: the cache is returned
//! as it is, which costs two system calls however many addresses and
//! routes the node has. Something pending, or `ENOBUFS` (the queue
//! overflowed and notifications were lost): the addresses are dumped again.
//! [`HostAddresses::refresh`] dumps in any case, as a safety net for callers
//! that can afford it now and then.
//!
//! Which addresses count is what upstream's `GetNodeIPs` gets from Go's
//! `net.InterfaceAddrs()`: `IFA_LOCAL` of each address message when
//! present (the local end of a point-to-point address, whose
//! `IFA_ADDRESS` is the peer), else `IFA_ADDRESS`; of interfaces up or
//! down; link-local, tentative and deprecated IPv6 addresses included, as
//! upstream skips none of them for NodePorts.
//!
//! **Namespaces.** A netlink socket belongs to the network namespace of the
//! thread that creates it, and stays there. The sockets are therefore
//! created lazily, on the first read, by the thread doing it: a proxy that
//! enters a namespace on one thread (as the kernel tests do) reads that
//! namespace as long as the first read happens after entering it. A
//! [`HostAddresses`] keeps reading the namespace of its first read even
//! when later used from other threads. [`local_addresses`] keeps one cache
//! per thread, so each thread reads its own namespace, provided it does not
//! switch namespaces after its first call.

mod cache;
mod message;
mod netlink;
#[cfg(test)]
mod wire;

use std::cell::RefCell;
use std::io;
use std::net::IpAddr;

pub use cache::{HostAddresses, Notification, RouteTransport};
pub use netlink::NetlinkTransport;

use netlink_packet_core::DecodeError;

/// What went wrong while reading the host's addresses.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The rtnetlink sockets could not be set up.
    #[error("opening an rtnetlink socket for the host's addresses failed while {step}")]
    Open {
        /// What was being done (`creating`, `subscribing to address changes`, …).
        step: &'static str,
        /// The system call's error.
        #[source]
        source: io::Error,
    },
    /// The address dump request could not be sent.
    #[error("sending the rtnetlink address dump request (RTM_GETADDR) failed")]
    Send(#[source] io::Error),
    /// An answer or a notification could not be received.
    #[error("receiving from the rtnetlink socket failed while {step}")]
    Receive {
        /// `reading the address dump` or `reading address change notifications`.
        step: &'static str,
        /// The system call's error.
        #[source]
        source: io::Error,
    },
    /// The kernel answered the dump with an error.
    #[error("the kernel refused the rtnetlink address dump (RTM_GETADDR)")]
    Kernel(#[source] io::Error),
    /// A message of the dump could not be decoded.
    #[error("an rtnetlink message of the address dump could not be decoded")]
    Decode(#[source] DecodeError),
}

thread_local! {
    /// One cache per thread: each thread reads the namespace it is in.
    static THREAD_ADDRESSES: RefCell<HostAddresses> = RefCell::new(HostAddresses::new());
}

/// Every address of the host's interfaces, both families, sorted, in the
/// network namespace of the calling thread, from a cache kept per thread
/// (see the crate documentation).
pub fn local_addresses() -> Result<Vec<IpAddr>, HostError> {
    // The borrow cannot fail: nothing inside `addresses` calls back here.
    THREAD_ADDRESSES.with(|cache| cache.borrow_mut().addresses().map(<[IpAddr]>::to_vec))
}
