//! The ctnetlink messages byte for byte, and round trips through the
//! parser.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use pretty_assertions::assert_eq;

use super::*;

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
    let messages = split_messages(bytes);
    assert_eq!(messages.len(), 1, "one message in {bytes:?}");
    decode_answer(messages[0]).unwrap().1
}

#[test]
fn a_dump_request_is_a_ctnetlink_get_with_the_dump_flags_and_the_family() {
    let mut expected = nlmsghdr(20, 0x0101, 0x0301, 7);
    expected.extend_from_slice(&[2, 0, 0, 0]);
    assert_eq!(dump_request(IpFamily::V4, 7), expected);

    let v6 = dump_request(IpFamily::V6, 8);
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

    assert_eq!(delete_request(&dns_flow(), 9), expected);
}

#[test]
fn a_delete_request_names_a_zone_other_than_the_default() {
    let flow = Flow {
        zone: 3,
        ..dns_flow()
    };
    let request = delete_request(&flow, 1);
    let default_zone = delete_request(&dns_flow(), 1);
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
    match decode_one(&answer(0)) {
        Answer::Status {
            seq: 41,
            error: None,
        } => {}
        _ => panic!("0 is an acknowledgement"),
    }
    match decode_one(&answer(-2)) {
        Answer::Status {
            seq: 41,
            error: Some(error),
        } => assert_eq!(error.raw_os_error(), Some(ENOENT)),
        _ => panic!("-2 is ENOENT"),
    }
}

#[test]
fn the_end_of_a_dump_is_done() {
    let mut bytes = nlmsghdr(20, 3, 0x0002, 5);
    bytes.extend_from_slice(&0i32.to_ne_bytes());
    assert!(matches!(decode_one(&bytes), Answer::Done));
}

#[test]
fn a_datagram_splits_into_its_messages_and_drops_a_truncated_tail() {
    let first = entry_message(&dns_flow(), 1);
    let second = dump_request(IpFamily::V4, 2);
    let mut datagram = [first.clone(), second.clone()].concat();
    datagram.extend_from_slice(&first[..10]);

    assert_eq!(split_messages(&datagram), vec![&first[..], &second[..]]);
}
