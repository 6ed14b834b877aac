//! The ctnetlink messages byte for byte, and round trips through the
//! parser.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use pretty_assertions::assert_eq;

use super::*;
use kp_netlink::{messages, Request as _};

fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

/// client 192.168.99.10:40000 → Service 10.96.0.20:53 → endpoint 10.244.1.2:5353
fn dns_flow() -> Flow {
    Flow::udp(
        addr("192.168.99.10:40000"),
        addr("10.96.0.20:53"),
        addr("10.244.1.2:5353"),
    )
}

fn nlmsghdr(len: u32, kind: u16, flags: u16, seq: u32) -> Vec<u8> {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&len.to_ne_bytes());
    bytes.extend_from_slice(&kind.to_ne_bytes());
    bytes.extend_from_slice(&flags.to_ne_bytes());
    bytes.extend_from_slice(&seq.to_ne_bytes());
    bytes.extend_from_slice(&0u32.to_ne_bytes());
    bytes
}

fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&(4 + value.len() as u16).to_ne_bytes());
    bytes.extend_from_slice(&kind.to_ne_bytes());
    bytes.extend_from_slice(value);
    while bytes.len() % 4 != 0 {
        bytes.push(0);
    }
    bytes
}

fn nested(kind: u16, parts: &[Vec<u8>]) -> Vec<u8> {
    nla(kind | 0x8000, &parts.concat())
}

fn decode_one(bytes: &[u8]) -> Answer {
    let messages: Vec<_> = messages(bytes).collect();
    assert_eq!(messages.len(), 1, "one message in {bytes:?}");
    decode_answer(messages[0].bytes).unwrap()
}

/// `request` as the channel sends it with sequence number `seq`.
fn encoded(request: Request, seq: u32) -> Vec<u8> {
    request.encode(seq).unwrap()
}

#[test]
fn a_dump_request_is_a_ctnetlink_get_with_the_dump_flags_and_the_family() {
    let mut expected = nlmsghdr(20, 0x0101, 0x0301, 7);
    expected.extend_from_slice(&[2, 0, 0, 0]);
    assert_eq!(encoded(dump_request(IpFamily::V4), 7), expected);

    let v6 = encoded(dump_request(IpFamily::V6), 8);
    assert_eq!(v6[16], 10, "AF_INET6 in nfgenmsg");
}

#[test]
fn a_delete_request_carries_the_original_tuple_as_nested_attributes() {
    let tuple = nested(
        1,
        &[
            nested(1, &[nla(1, &[192, 168, 99, 10]), nla(2, &[10, 96, 0, 20])]),
            nested(
                2,
                &[
                    nla(1, &[17]),
                    nla(2, &40000u16.to_be_bytes()),
                    nla(3, &53u16.to_be_bytes()),
                ],
            ),
        ],
    );
    let mut expected = nlmsghdr(20 + tuple.len() as u32, 0x0102, 0x0005, 9);
    expected.extend_from_slice(&[2, 0, 0, 0]);
    expected.extend_from_slice(&tuple);

    assert_eq!(encoded(delete_request(&dns_flow()), 9), expected);
}

#[test]
fn a_delete_request_names_a_zone_other_than_the_default() {
    let flow = Flow {
        zone: 3,
        ..dns_flow()
    };
    let request = encoded(delete_request(&flow), 1);
    let default_zone = encoded(delete_request(&dns_flow()), 1);
    assert_eq!(request.len(), default_zone.len() + 8);
    assert_eq!(
        request[request.len() - 8..],
        nla(18, &3u16.to_be_bytes())[..]
    );
}

#[test]
fn dumped_entries_decode_to_the_flows_they_describe() {
    let v6 = Flow::udp(
        addr("[fd00:192:168:99::10]:40000"),
        addr("[fd00:10:96::20]:53"),
        addr("[fd00:10:244:1::2]:5353"),
    );
    let zoned = Flow {
        zone: 7,
        ..dns_flow()
    };
    for flow in [dns_flow(), v6, zoned] {
        match decode_one(&entry_message(&flow, 1)) {
            Answer::Entry(Some(decoded)) => assert_eq!(decoded, flow),
            _ => panic!("{flow} did not decode to an entry"),
        }
    }
}

#[test]
fn attributes_besides_the_tuples_are_ignored() {
    let mut bytes = entry_message(&dns_flow(), 1);
    bytes.extend(nla(3, &0x1c6u32.to_be_bytes())); // CTA_STATUS
    bytes.extend(nla(7, &29u32.to_be_bytes())); // CTA_TIMEOUT
    bytes.extend(nla(12, &0xdead_beefu32.to_be_bytes())); // CTA_ID
    bytes.extend(nla(11, &1u32.to_be_bytes())); // CTA_USE
    let len = bytes.len() as u32;
    bytes[..4].copy_from_slice(&len.to_ne_bytes());

    match decode_one(&bytes) {
        Answer::Entry(Some(decoded)) => assert_eq!(decoded, dns_flow()),
        _ => panic!("the entry did not decode"),
    }
}

#[test]
fn an_entry_without_a_reply_tuple_is_undecodable() {
    let attributes = vec![ConntrackAttribute::CtaTupleOrig(tuple_attributes(
        17,
        &dns_flow().original,
    ))];
    assert_eq!(flow_from_attributes(&attributes), None);
}

#[test]
fn acknowledgements_and_errors_answer_their_request_by_sequence_number() {
    let answer = |code: i32| {
        let mut bytes = nlmsghdr(36, 2, 0x0100, 41);
        bytes.extend_from_slice(&code.to_ne_bytes());
        bytes.extend(nlmsghdr(72, 0x0102, 0x0005, 41));
        bytes
    };
    let status = |bytes: &[u8]| {
        let message = messages(bytes).next().unwrap();
        (message.seq, message.status())
    };
    assert_eq!(
        status(&answer(0)),
        (41, Some(Ok(()))),
        "0 is an acknowledgement"
    );
    assert_eq!(status(&answer(-2)), (41, Some(Err(ENOENT))), "-2 is ENOENT");
}

#[test]
fn the_end_of_a_dump_is_done() {
    let mut bytes = nlmsghdr(20, 3, 0x0002, 5);
    bytes.extend_from_slice(&0i32.to_ne_bytes());
    let message = messages(&bytes).next().unwrap();
    assert_eq!(
        (message.kind, message.status()),
        (kp_netlink::NLMSG_DONE, Some(Ok(())))
    );
}

#[test]
fn a_datagram_splits_into_its_messages_and_drops_a_truncated_tail() {
    let first = entry_message(&dns_flow(), 1);
    let second = encoded(dump_request(IpFamily::V4), 2);
    let mut datagram = [first.clone(), second.clone()].concat();
    datagram.extend_from_slice(&first[..10]);

    let split: Vec<&[u8]> = messages(&datagram).map(|m| m.bytes).collect();
    assert_eq!(split, vec![&first[..], &second[..]]);
}

/// The kernel's answer to a lookup: the entry of a datagram from `client`
/// to `service`, redirected to `local`.
fn redirected_entry(
    client: SocketAddr,
    service: SocketAddr,
    local: SocketAddr,
    seq: u32,
) -> Vec<u8> {
    let mut flow = Flow::udp(client, service, local);
    flow.reply = FlowTuple {
        src: local.ip(),
        dst: client.ip(),
        src_port: local.port(),
        dst_port: client.port(),
    };
    entry_message(&flow, seq)
}

#[test]
fn a_lookup_asks_by_the_reply_tuple() {
    let bytes = encoded(
        reply_tuple_request(addr("10.244.1.2:40000"), addr("10.244.1.1:35000")),
        7,
    );
    let message = NetlinkMessage::<NetfilterMessage>::deserialize(&bytes).unwrap();
    assert_eq!(message.header.sequence_number, 7);
    assert_eq!(message.header.flags, NLM_F_REQUEST);
    let NetlinkPayload::InnerMessage(NetfilterMessage {
        inner: NetfilterMessageInner::Conntrack(ConntrackMessage::Get(attributes)),
        ..
    }) = message.payload
    else {
        panic!("not a conntrack GET: {:?}", message.payload);
    };
    let [ConntrackAttribute::CtaTupleReply(tuple)] = &attributes[..] else {
        panic!("only the reply tuple: {attributes:?}");
    };
    assert!(tuple.contains(&Tuple::Ip(vec![
        IPTuple::SourceAddress("10.244.1.1".parse().unwrap()),
        IPTuple::DestinationAddress("10.244.1.2".parse().unwrap()),
    ])));
    assert!(tuple.contains(&Tuple::Proto(vec![
        ProtoTuple::Protocol(Protocol::Udp),
        ProtoTuple::SourcePort(35000),
        ProtoTuple::DestinationPort(40000),
    ])));
}

#[test]
fn a_lookup_answer_names_the_service_address() {
    let answer = redirected_entry(
        addr("192.168.99.11:40000"),
        addr("203.0.113.9:53"),
        addr("192.168.99.2:35000"),
        3,
    );
    assert_eq!(
        original_destination_of(&answer),
        Some(addr("203.0.113.9:53"))
    );
    assert_eq!(
        original_destination_of(&encoded(dump_request(IpFamily::V4), 3)),
        None,
        "not an entry"
    );
}
