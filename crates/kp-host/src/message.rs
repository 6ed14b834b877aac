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
//! then `NLMSG_DONE`, or `NLMSG_ERROR`.

use std::io;
use std::net::IpAddr;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::RouteNetlinkMessage;

use crate::HostError;

/// `RTNLGRP_IPV4_IFADDR` (linux/rtnetlink.h): IPv4 addresses added or removed.
pub(crate) const RTNLGRP_IPV4_IFADDR: u32 = 5;
/// `RTNLGRP_IPV6_IFADDR`: IPv6 addresses added, removed or changed.
pub(crate) const RTNLGRP_IPV6_IFADDR: u32 = 9;
/// Length of `nlmsghdr`, the least a message can be.
const HEADER_LEN: usize = 16;

/// Where a dump stands after one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DumpProgress {
    /// More datagrams follow.
    More,
    /// `NLMSG_DONE` was seen.
    Done,
}

/// The request for every address of both families
/// (`ip address show`), with sequence number `sequence`.
pub(crate) fn dump_request(sequence: u32) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = sequence;
    // The default message has family AF_UNSPEC: both families.
    let payload = RouteNetlinkMessage::GetAddress(AddressMessage::default());
    let mut message = NetlinkMessage::new(header, NetlinkPayload::from(payload));
    message.finalize();
    let mut bytes = vec![0; message.buffer_len()];
    message.serialize(&mut bytes);
    bytes
}

/// Adds the addresses in one datagram of the answer to the dump
/// `sequence` to `found`. Messages of other sequence numbers are left out:
/// they cannot belong to this dump.
pub(crate) fn read_dump_datagram(
    datagram: &[u8],
    sequence: u32,
    found: &mut Vec<IpAddr>,
) -> Result<DumpProgress, HostError> {
    let mut rest = datagram;
    while rest.len() >= HEADER_LEN {
        let message =
            NetlinkMessage::<RouteNetlinkMessage>::deserialize(rest).map_err(HostError::Decode)?;
        let length = message.header.length as usize;
        // `deserialize` checked that `length` is within `rest` and at least
        // a header long, so the loop always advances.
        rest = rest.get(align(length)..).unwrap_or_default();
        if message.header.sequence_number != sequence {
            continue;
        }
        match message.payload {
            NetlinkPayload::Done(_) => return Ok(DumpProgress::Done),
            NetlinkPayload::Error(error) => {
                if let Some(code) = error.code {
                    return Err(HostError::Kernel(io::Error::from_raw_os_error(-code.get())));
                }
            }
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewAddress(address)) => {
                found.extend(address_of(&address));
            }
            _ => {}
        }
    }
    Ok(DumpProgress::More)
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

/// `NLMSG_ALIGN`: messages in a datagram start at multiples of 4 bytes.
fn align(length: usize) -> usize {
    (length + 3) & !3
}

#[cfg(test)]
#[path = "message_tests.rs"]
mod tests;
