//! Kernel tests: acknowledged requests, dumps and nfnetlink batches against
//! the kernel, in a network namespace of their own.
//!
//! Address plan: addresses 10.1.0.0/16 (one /32 each) on `lo`, index 1 in
//! every new namespace; interface index 9999 does not exist.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::Ipv4Addr;

use kp_netlink::nfnetlink::{self, Batch};
use kp_netlink::{Channel, Message, NETLINK_NETFILTER, NETLINK_ROUTE, NLM_F_CREATE, NLM_F_DUMP};
use kp_testkit::netns::{require_root, Netns};

const RTM_NEWADDR: u16 = 20;
const RTM_GETADDR: u16 = 22;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const AF_INET: u8 = 2;
const LO: u32 = 1;
const ENODEV: i32 = 19;
const ENOENT: i32 = 2;
const NFT_MSG_NEWTABLE: u8 = 0;
const NFT_MSG_GETTABLE: u8 = 1;
const NFT_MSG_DELTABLE: u8 = 2;
const NFTA_TABLE_NAME: u16 = 1;
const NFT_MSG_GETGEN: u8 = 16;
const NFTA_GEN_ID: u16 = 1;
const ERESTART: i32 = 85;
const RTNLGRP_IPV4_IFADDR: u32 = 5;

/// `ip address add 10.1.H.L/32 dev INDEX`.
fn add_address(index: u32, n: u16) -> Message {
    let address = Ipv4Addr::new(10, 1, (n >> 8) as u8, n as u8).octets();
    let mut header = vec![AF_INET, 32, 0, 0];
    header.extend_from_slice(&index.to_ne_bytes());
    Message::new(RTM_NEWADDR, NLM_F_CREATE)
        .raw(&header)
        .attr(IFA_LOCAL, &address)
        .attr(IFA_ADDRESS, &address)
}

/// The IPv4 addresses of 10.1.0.0/16, from an address dump.
fn test_addresses(channel: &mut Channel) -> usize {
    let request = Message::new(RTM_GETADDR, NLM_F_DUMP).raw(&[AF_INET, 0, 0, 0, 0, 0, 0, 0]);
    let mut found = 0;
    channel
        .dump(request, |reply| {
            let local = kp_netlink::find(reply.payload.get(8..).unwrap_or_default(), IFA_LOCAL);
            if local.is_some_and(|ip| ip.starts_with(&[10, 1])) {
                found += 1;
            }
        })
        .unwrap();
    found
}

fn table(message: u8, name: &str) -> Message {
    let flags = if message == NFT_MSG_NEWTABLE {
        NLM_F_CREATE
    } else {
        0
    };
    nfnetlink::request(
        nfnetlink::SUBSYS_NFTABLES,
        message,
        nfnetlink::NFPROTO_IPV4,
        flags,
    )
    .string(NFTA_TABLE_NAME, name)
}

fn nftables() -> Batch {
    Batch::new(nfnetlink::SUBSYS_NFTABLES)
}

/// The ruleset generation (`NFT_MSG_GETGEN`).
fn generation(channel: &mut Channel) -> u32 {
    let request = nfnetlink::request(nfnetlink::SUBSYS_NFTABLES, NFT_MSG_GETGEN, 0, 0);
    let reply = channel.ask(request).unwrap();
    let (_, attributes) = nfnetlink::split_payload(reply.payload()).unwrap();
    kp_netlink::find(attributes, NFTA_GEN_ID)
        .and_then(kp_netlink::read_be_u32)
        .unwrap()
}

#[test]
fn a_refused_request_among_many_is_reported_by_position_and_the_others_are_applied() {
    require_root();
    let ns = Netns::create("nl-exec").unwrap();
    let (failure, found) = ns.run(|| {
        let mut channel = Channel::new(NETLINK_ROUTE);
        let requests = (0..200u16).map(|n| add_address(if n == 57 { 9999 } else { LO }, n));
        let failure = channel.execute(requests).unwrap_err();
        (failure, test_addresses(&mut channel))
    });
    assert!(failure.broken.is_none(), "{:?}", failure.broken);
    let refused: Vec<_> = failure
        .refused
        .iter()
        .map(|r| (r.index, r.error.errno()))
        .collect();
    assert_eq!(refused, vec![(57, Some(ENODEV))]);
    assert_eq!(found, 199);
}

#[test]
fn a_request_too_long_to_encode_is_refused_alone_and_never_sent() {
    require_root();
    let ns = Netns::create("nl-long").unwrap();
    let (failure, sent, found) = ns.run(|| {
        let mut channel = Channel::new(NETLINK_ROUTE);
        let requests = (0..3u16).map(|n| match n {
            1 => add_address(LO, n).attr(8, &[0; 70_000]),
            _ => add_address(LO, n),
        });
        let failure = channel.execute(requests).unwrap_err();
        (failure, channel.messages(), test_addresses(&mut channel))
    });
    assert_eq!(failure.refused.len(), 1);
    assert_eq!(failure.refused[0].index, 1);
    let error = failure.refused[0].error.to_string();
    assert!(error.contains("70004 bytes"), "{error}");
    assert_eq!(sent, 2, "only the two that fit were sent");
    assert_eq!(found, 2);
}

#[test]
fn a_dump_longer_than_a_datagram_is_read_to_its_end() {
    require_root();
    let ns = Netns::create("nl-dump").unwrap();
    let found = ns.run(|| {
        let mut channel = Channel::new(NETLINK_ROUTE);
        // About 80 bytes per address: 1,500 of them take four datagrams or
        // more of at most 32 KiB.
        channel
            .execute((0..1_500u16).map(|n| add_address(LO, n)))
            .unwrap();
        test_addresses(&mut channel)
    });
    assert_eq!(found, 1_500);
}

#[test]
fn a_batch_is_applied_whole_or_not_at_all() {
    require_root();
    let ns = Netns::create("nl-batch").unwrap();
    let (created, refused, absent) = ns.run(|| {
        let mut channel = Channel::new(NETLINK_NETFILTER);
        let created = channel
            .execute_batch(&nftables(), [table(NFT_MSG_NEWTABLE, "kp_one")])
            .map(|()| channel.ask(table(NFT_MSG_GETTABLE, "kp_one")).is_ok());
        let refused = channel
            .execute_batch(
                &nftables(),
                [
                    table(NFT_MSG_NEWTABLE, "kp_two"),
                    table(NFT_MSG_DELTABLE, "kp_missing"),
                ],
            )
            .unwrap_err();
        let absent = channel
            .ask(table(NFT_MSG_GETTABLE, "kp_two"))
            .unwrap_err()
            .errno();
        (created.unwrap(), refused, absent)
    });
    assert!(created, "the first batch made its table");
    let refusals: Vec<_> = refused
        .refused
        .iter()
        .map(|r| (r.index, r.error.errno()))
        .collect();
    assert_eq!(refusals, vec![(1, Some(ENOENT))]);
    assert_eq!(
        absent,
        Some(ENOENT),
        "nothing of the refused batch was applied"
    );
}

#[test]
fn a_subscription_hears_a_change_and_never_blocks() {
    require_root();
    let ns = Netns::create("nl-watch").unwrap();
    let (before, after, drained) = ns.run(|| {
        // RTNLGRP_IPV4_IFADDR.
        let watch = kp_netlink::Subscription::open(NETLINK_ROUTE, &[5]).unwrap();
        let mut buffer = Vec::with_capacity(4096);
        let before = watch.receive(&mut buffer).map_err(|e| e.kind());
        Channel::new(NETLINK_ROUTE)
            .execute_one(add_address(LO, 1))
            .unwrap();
        let after = watch.receive(&mut buffer).map(|len| len > 0);
        let drained = watch.receive(&mut buffer).map_err(|e| e.kind());
        (before, after.unwrap(), drained)
    });
    assert_eq!(before, Err(std::io::ErrorKind::WouldBlock));
    assert!(after, "the added address was announced");
    assert_eq!(drained, Err(std::io::ErrorKind::WouldBlock));
}

#[test]
fn a_subscription_that_left_its_group_hears_nothing_until_it_joins_again() {
    require_root();
    let ns = Netns::create("nl-rejoin").unwrap();
    let (left, joined) = ns.run(|| {
        let watch = kp_netlink::Subscription::open(NETLINK_ROUTE, &[]).unwrap();
        watch.set_receive_buffer(1 << 20).unwrap();
        let mut buffer = Vec::with_capacity(4096);
        let mut route = Channel::new(NETLINK_ROUTE);
        watch.join(RTNLGRP_IPV4_IFADDR).unwrap();
        watch.leave(RTNLGRP_IPV4_IFADDR).unwrap();
        route.execute_one(add_address(LO, 2)).unwrap();
        let left = watch.receive(&mut buffer).map_err(|e| e.kind());
        watch.join(RTNLGRP_IPV4_IFADDR).unwrap();
        route.execute_one(add_address(LO, 3)).unwrap();
        let joined = watch.receive(&mut buffer).map(|len| len > 0);
        (left, joined.unwrap())
    });
    assert_eq!(left, Err(std::io::ErrorKind::WouldBlock), "not a member");
    assert!(joined, "a member again");
}

#[test]
fn a_batch_bound_to_a_generation_that_moved_on_is_refused_as_a_whole() {
    require_root();
    let ns = Netns::create("nl-gen").unwrap();
    let (current, stale, empty_current, empty_stale) = ns.run(|| {
        let mut channel = Channel::new(NETLINK_NETFILTER);
        let before = generation(&mut channel);
        channel
            .execute_batch(&nftables(), [table(NFT_MSG_NEWTABLE, "kp_one")])
            .unwrap();
        let now = generation(&mut channel);
        let current = channel.execute_batch(
            &nftables().bound_to(now),
            [table(NFT_MSG_NEWTABLE, "kp_two")],
        );
        let stale = channel
            .execute_batch(
                &nftables().bound_to(before),
                [table(NFT_MSG_NEWTABLE, "kp_three")],
            )
            .unwrap_err();
        let now = generation(&mut channel);
        let empty_current = channel.execute_batch(&nftables().bound_to(now), [] as [Message; 0]);
        let empty_stale = channel
            .execute_batch(&nftables().bound_to(before), [] as [Message; 0])
            .unwrap_err();
        (current, stale, empty_current, empty_stale)
    });
    assert!(current.is_ok(), "{current:?}");
    assert!(stale.refused.is_empty(), "{:?}", stale.refused);
    assert_eq!(
        stale.refused_whole.as_ref().and_then(|e| e.errno()),
        Some(ERESTART)
    );
    assert!(empty_current.is_ok(), "{empty_current:?}");
    assert_eq!(
        empty_stale.refused_whole.as_ref().and_then(|e| e.errno()),
        Some(ERESTART)
    );
}

#[test]
fn a_batch_that_asks_only_its_last_acknowledgement_still_names_every_refusal() {
    require_root();
    let ns = Netns::create("nl-acks").unwrap();
    let refused = ns.run(|| {
        let mut channel = Channel::new(NETLINK_NETFILTER);
        let requests = (0..300).map(|n| match n {
            41 | 250 => table(NFT_MSG_DELTABLE, "kp_missing"),
            n => table(NFT_MSG_NEWTABLE, &format!("kp_{n}")),
        });
        channel
            .execute_batch(&nftables().acks_max(16), requests)
            .unwrap_err()
    });
    assert!(refused.broken.is_none());
    let positions: Vec<_> = refused
        .refused
        .iter()
        .map(|r| (r.index, r.error.errno()))
        .collect();
    assert_eq!(positions, vec![(41, Some(ENOENT)), (250, Some(ENOENT))]);
}
