#![allow(clippy::unwrap_used)]

use std::net::IpAddr;

use pretty_assertions::assert_eq;

use kp_netlink::Request as _;

use super::*;
use crate::wire;

const SEQ: u32 = 7;

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// The addresses in one datagram of a dump, read as the channel hands its
/// messages on (the end of the dump and errors are the channel's).
#[track_caller]
fn read(datagram: &[u8]) -> Vec<IpAddr> {
    kp_netlink::messages(datagram)
        .filter(|message| message.status().is_none())
        .filter_map(|message| address_in(message.bytes).unwrap())
        .collect()
}

#[test]
fn the_request_dumps_the_addresses_of_both_families() {
    let mut expected = Vec::new();
    expected.extend(24u32.to_ne_bytes()); // length: nlmsghdr + ifaddrmsg
    expected.extend(22u16.to_ne_bytes()); // RTM_GETADDR
    expected.extend(0x0301u16.to_ne_bytes()); // NLM_F_REQUEST | NLM_F_DUMP
    expected.extend(SEQ.to_ne_bytes());
    expected.extend(0u32.to_ne_bytes()); // port id: the kernel fills it in
    expected.extend([0, 0, 0, 0]); // AF_UNSPEC, prefixlen, flags, scope
    expected.extend(0u32.to_ne_bytes()); // every interface
    assert_eq!(dump_request().encode(SEQ).unwrap(), expected);
}

#[test]
fn a_kernel_message_gives_its_local_address() {
    // 192.168.99.2/24 on interface 2, as `ip monitor address` receives it.
    let mut datagram = Vec::new();
    datagram.extend(40u32.to_ne_bytes());
    datagram.extend(20u16.to_ne_bytes()); // RTM_NEWADDR
    datagram.extend(2u16.to_ne_bytes()); // NLM_F_MULTI
    datagram.extend(SEQ.to_ne_bytes());
    datagram.extend(0u32.to_ne_bytes());
    datagram.extend([2, 24, 0x80, 0]); // AF_INET, /24, IFA_F_PERMANENT, universe
    datagram.extend(2u32.to_ne_bytes());
    for attribute in [1u16, 2] {
        // IFA_ADDRESS, IFA_LOCAL
        datagram.extend(8u16.to_ne_bytes());
        datagram.extend(attribute.to_ne_bytes());
        datagram.extend([192, 168, 99, 2]);
    }
    let found = read(&datagram);
    assert_eq!(found, [ip("192.168.99.2")]);
}

#[test]
fn a_dump_datagram_gives_every_address_until_done() {
    let datagram = [
        wire::new_address(SEQ, 1, ip("127.0.0.1"), None),
        wire::new_address(SEQ, 2, ip("fd00:192:168:99::2"), None),
        wire::new_address(SEQ, 3, ip("fe80::1"), None),
        wire::done(SEQ),
    ]
    .concat();
    let found = read(&datagram);
    let last = kp_netlink::messages(&datagram).last().unwrap();
    assert_eq!(last.status(), Some(Ok(())), "the end of the dump");
    assert_eq!(
        found,
        [ip("127.0.0.1"), ip("fd00:192:168:99::2"), ip("fe80::1")]
    );
}

#[test]
fn a_point_to_point_address_is_the_local_end_not_the_peer() {
    let datagram = wire::new_address(SEQ, 4, ip("10.0.0.1"), Some(ip("10.0.0.2")));
    let found = read(&datagram);
    assert_eq!(found, [ip("10.0.0.1")]);
}

#[test]
fn a_kernel_error_is_reported_with_its_errno() {
    let answer = wire::error(SEQ, 1);
    let status = kp_netlink::messages(&answer).next().unwrap().status();
    assert_eq!(status, Some(Err(1)));
    let refused = kp_netlink::Error::Kernel(std::io::Error::from_raw_os_error(1));
    let HostError::Kernel(error) = dump_error(refused) else {
        panic!("expected a kernel error");
    };
    assert_eq!(error.raw_os_error(), Some(1));
}

#[test]
fn a_malformed_message_is_a_decode_error() {
    let mut datagram = wire::new_address(SEQ, 2, ip("192.168.99.2"), None);
    // Claim an IFA_ADDRESS of 5 bytes.
    datagram[24..26].copy_from_slice(&9u16.to_ne_bytes());
    let progress = address_in(&datagram);
    assert!(
        matches!(progress, Err(HostError::Decode(_))),
        "unexpected: {progress:?}"
    );
}
