//! The rtnetlink messages of an address dump, built and parsed with
//! `netlink-packet-route`.
//!
//! ```text
//! nlmsghdr   len u32 | type u16 (RTM_GETADDR=22 request, RTM_NEWADDR=20 answers,
//!            NLMSG_DONE=3 end) | flags u16 | seq u32 | pid u32
//! ifaddrmsg  family u8 (AF_UNSPEC=0 in the request: both families)
//!            | prefixlen u8 | flags u8 | scope u8 | index u32
//! IFA_ADDRESS=1   4 or 16 bytes: the address, or the peer of a point-to-point one
//! IFA_LOCAL=2     4 or 16 bytes: the local address, when it differs
//! ```
//!
//! The kernel answers one `RTM_NEWADDR` per address, several per datagram,
//! then `NLMSG_DONE`, or `NLMSG_ERROR`; the shared netlink channel
//! (`kp-netlink`) reads the dump, this module builds the request and reads
//! the address of each message.

use std::net::IpAddr;

use netlink_packet_core::{
    DecodeError, NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::RouteNetlinkMessage;

use crate::HostError;

/// `RTNLGRP_IPV4_IFADDR` (linux/rtnetlink.h): IPv4 addresses added or removed.
pub(crate) const RTNLGRP_IPV4_IFADDR: u32 = 5;
/// `RTNLGRP_IPV6_IFADDR`: IPv6 addresses added, removed or changed.
pub(crate) const RTNLGRP_IPV6_IFADDR: u32 = 9;

/// The request for every address of both families (`ip address show`);
/// the channel sets its sequence number.
pub(crate) fn dump_request() -> NetlinkMessage<RouteNetlinkMessage> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    // The default message has family AF_UNSPEC: both families.
    let payload = RouteNetlinkMessage::GetAddress(AddressMessage::default());
    NetlinkMessage::new(header, NetlinkPayload::from(payload))
}

/// The host's address that one message of the dump (`RTM_NEWADDR`, whole,
/// header included) describes; `None` for a message of another kind.
pub(crate) fn address_in(message: &[u8]) -> Result<Option<IpAddr>, HostError> {
    let message =
        NetlinkMessage::<RouteNetlinkMessage>::deserialize(message).map_err(HostError::Decode)?;
    Ok(match message.payload {
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewAddress(address)) => {
            address_of(&address)
        }
        _ => None,
    })
}

/// The host's address an address message describes: `IFA_LOCAL` when
/// present (on a point-to-point interface `IFA_ADDRESS` is the peer), else
/// `IFA_ADDRESS`, as Go's `net.InterfaceAddrs` decides.
pub(crate) fn address_of(message: &AddressMessage) -> Option<IpAddr> {
    let mut address = None;
    for attribute in &message.attributes {
        match attribute {
            AddressAttribute::Local(local) => return Some(*local),
            AddressAttribute::Address(ip) => address = Some(*ip),
            _ => {}
        }
    }
    address
}

/// A failed dump, in this crate's words.
pub(crate) fn dump_error(error: kp_netlink::Error) -> HostError {
    match error {
        kp_netlink::Error::Open { step, source } => HostError::Open { step, source },
        kp_netlink::Error::Send(source) => HostError::Send(source),
        kp_netlink::Error::Receive(source) => HostError::Receive {
            step: "reading the address dump",
            source,
        },
        kp_netlink::Error::Kernel(source) => HostError::Kernel(source),
        kp_netlink::Error::Malformed(what) => HostError::Decode(DecodeError::from(what)),
        kp_netlink::Error::TooLarge(error) => {
            HostError::Send(std::io::Error::new(std::io::ErrorKind::InvalidInput, error))
        }
    }
}

#[cfg(test)]
#[path = "message_tests.rs"]
mod tests;
