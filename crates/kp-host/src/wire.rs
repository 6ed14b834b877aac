//! Kernel answers as bytes, for tests of the parsing and of the cache.

use std::net::IpAddr;
use std::num::NonZeroI32;

use netlink_packet_core::{
    DoneMessage, ErrorMessage, NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_MULTIPART,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

/// The `RTM_NEWADDR` the kernel sends for `address` on interface `index`,
/// with `peer` as `IFA_ADDRESS` when it is point-to-point.
pub(crate) fn new_address(
    sequence: u32,
    index: u32,
    address: IpAddr,
    peer: Option<IpAddr>,
) -> Vec<u8> {
    let mut message = AddressMessage::default();
    message.header.family = match address {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    message.header.prefix_len = if address.is_ipv4() { 24 } else { 64 };
    message.header.index = index;
    match peer {
        Some(peer) => {
            message.attributes.push(AddressAttribute::Address(peer));
            message.attributes.push(AddressAttribute::Local(address));
        }
        None => message.attributes.push(AddressAttribute::Address(address)),
    }
    message
        .attributes
        .push(AddressAttribute::Label(format!("eth{index}")));
    encode(sequence, RouteNetlinkMessage::NewAddress(message).into())
}

/// `NLMSG_DONE`, the end of a dump.
pub(crate) fn done(sequence: u32) -> Vec<u8> {
    encode(sequence, NetlinkPayload::Done(DoneMessage::default()))
}

/// `NLMSG_ERROR` with `-errno`.
pub(crate) fn error(sequence: u32, errno: i32) -> Vec<u8> {
    let mut error = ErrorMessage::default();
    error.code = NonZeroI32::new(-errno);
    encode(sequence, NetlinkPayload::Error(error))
}

fn encode(sequence: u32, payload: NetlinkPayload<RouteNetlinkMessage>) -> Vec<u8> {
    use kp_netlink::Request as _;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_MULTIPART;
    // Invariant: these messages are some 100 bytes long.
    NetlinkMessage::new(header, payload)
        .encode(sequence)
        .unwrap_or_default()
}
