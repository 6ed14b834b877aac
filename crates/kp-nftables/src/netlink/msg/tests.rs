//! Unit tests of the message framing and of reading the kernel's answers.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;

/// A message of `kind` with sequence number `seq` and `payload`.
fn message(kind: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(NLMSG_HDRLEN + payload.len()).unwrap();
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&len.to_ne_bytes());
    bytes.extend_from_slice(&kind.to_ne_bytes());
    bytes.extend_from_slice(&0u16.to_ne_bytes());
    bytes.extend_from_slice(&seq.to_ne_bytes());
    bytes.extend_from_slice(&0u32.to_ne_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

#[test]
fn the_generation_is_read_from_the_answer_to_its_request() {
    // nfgenmsg, NFTA_GEN_ID = 0x01020304, NFTA_GEN_PROC_PID.
    let mut payload = vec![0, 0, 0, 0];
    payload.extend_from_slice(&8u16.to_ne_bytes());
    payload.extend_from_slice(&GEN_ID.to_ne_bytes());
    payload.extend_from_slice(&[1, 2, 3, 4]);
    let newgen = (SUBSYS_NFTABLES << 8) | MSG_NEWGEN;
    let mut buf = message(newgen, 6, &payload);
    buf.extend(message(newgen, 7, &payload));
    assert_eq!(parse_generation(&buf, 7), Some(Ok(0x0102_0304)));
    assert_eq!(parse_generation(&buf, 8), None, "no answer to 8 yet");
    let refused = message(2, 9, &(-22i32).to_ne_bytes());
    assert_eq!(parse_generation(&refused, 9), Some(Err(-22)));
    let mut truncated = message(newgen, 7, &payload);
    truncated.truncate(truncated.len() - 2);
    assert_eq!(parse_generation(&truncated, 7), None);
}

/// An attribute: length, type, value, padding.
fn attribute(kind: u16, value: &[u8]) -> Vec<u8> {
    let len = u16::try_from(4 + value.len()).unwrap();
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&len.to_ne_bytes());
    bytes.extend_from_slice(&kind.to_ne_bytes());
    bytes.extend_from_slice(value);
    bytes.resize(bytes.len().next_multiple_of(4), 0);
    bytes
}

#[test]
fn notifications_name_the_table_of_each_change_and_end_with_the_generation() {
    let nftables = |msg: u16| (SUBSYS_NFTABLES << 8) | msg;
    // A new rule in `ip kube-proxy` (table, chain, handle attributes),
    // a deleted chain of `ip6 filter`, the generation, and a message of
    // another subsystem.
    let mut rule = vec![2, 0, 0, 0];
    rule.extend(attribute(1, b"kube-proxy\0"));
    rule.extend(attribute(2, b"services\0"));
    let mut chain = vec![10, 0, 0, 0];
    chain.extend(attribute(1, b"filter\0"));
    let mut newgen = vec![0, 0, 0, 0];
    newgen.extend(attribute(GEN_ID, &7u32.to_be_bytes()));
    newgen.extend(attribute(2, &42u32.to_be_bytes()));
    let mut buf = message(nftables(Kind::NewRule as u16), 1, &rule);
    buf.extend(message(nftables(Kind::DelChain as u16), 1, &chain));
    buf.extend(message(nftables(MSG_NEWGEN), 1, &newgen));
    buf.extend(message((1 << 8) | 2, 1, &rule));
    let mut out = Vec::new();
    parse_notifications(&buf, &mut out);
    assert_eq!(
        out,
        [
            Notification::Change {
                family: 2,
                table: Some(b"kube-proxy".as_slice())
            },
            Notification::Change {
                family: 10,
                table: Some(b"filter".as_slice())
            },
            Notification::Generation(7),
        ]
    );
    // A generation message without its number is not a generation.
    let bare = message(nftables(MSG_NEWGEN), 1, &[0, 0, 0, 0]);
    let mut out = Vec::new();
    parse_notifications(&bare, &mut out);
    assert_eq!(
        out,
        [Notification::Change {
            family: 0,
            table: None
        }]
    );
}

#[test]
fn an_attribute_too_long_for_its_length_field_refuses_the_message() {
    let mut batch = Batch::new(1, None);
    batch.begin(Kind::NewSetElem, 2, 0);
    batch.attr(1, &vec![0; ATTR_LEN_MAX - 4]);
    assert_eq!(batch.end(), Ok(()), "65,535 bytes with the header fit");
    batch.begin(Kind::NewSetElem, 2, 0);
    batch.attr(3, &vec![0; ATTR_LEN_MAX - 3]);
    let error = batch.end().unwrap_err();
    assert_eq!(
        error,
        Oversize {
            what: "attribute",
            kind: 3,
            len: ATTR_LEN_MAX + 1,
            max: ATTR_LEN_MAX
        }
    );
}

#[test]
fn a_nest_too_long_for_its_length_field_refuses_the_message() {
    let mut batch = Batch::new(1, None);
    batch.begin(Kind::NewSetElem, 2, 0);
    batch.open(3);
    for _ in 0..2_000 {
        batch.open(1);
        batch.attr(1, &[0; 28]);
        batch.close();
    }
    batch.close();
    let error = batch.end().unwrap_err();
    assert_eq!((error.what, error.kind), ("nested attribute", 3));
    assert_eq!(error.len, 4 + 2_000 * 36);
    // The next message starts clean.
    batch.begin(Kind::NewSetElem, 2, 0);
    batch.str(1, "kube-proxy");
    assert_eq!(batch.end(), Ok(()));
}

#[test]
fn a_nest_left_open_refuses_the_message() {
    let mut batch = Batch::new(1, None);
    batch.begin(Kind::NewRule, 2, 0);
    batch.open(4);
    assert_eq!(batch.end().unwrap_err().what, "nested attribute left open");
}

#[test]
fn every_message_but_the_batch_markers_asks_for_an_acknowledgement() {
    let mut batch = Batch::new(7, None);
    let first = batch.begin(Kind::NewTable, 2, F_CREATE);
    batch.end().unwrap();
    let second = batch.begin(Kind::NewChain, 2, F_CREATE);
    batch.end().unwrap();
    batch.ask_acks(2);
    batch.finish();
    assert_eq!(batch.acked, [first, second]);
    assert_eq!(
        messages(&batch.bytes).count(),
        4,
        "begin, two messages, end"
    );
    let mut offset = 0;
    let mut acks = Vec::new();
    while offset < batch.bytes.len() {
        let len = u32::from_ne_bytes(batch.bytes[offset..offset + 4].try_into().unwrap());
        let flags = u16::from_ne_bytes(batch.bytes[offset + 6..offset + 8].try_into().unwrap());
        acks.push(flags & F_ACK != 0);
        offset += len as usize;
    }
    assert_eq!(acks, [false, true, true, false]);
}

#[test]
fn a_batch_of_more_messages_than_the_bound_asks_only_its_last() {
    let mut batch = Batch::new(1, None);
    for _ in 0..3 {
        batch.begin(Kind::NewChain, 2, F_CREATE);
        batch.end().unwrap();
    }
    batch.ask_acks(2);
    batch.finish();
    assert_eq!(batch.acked, [4]);
    let acks: Vec<bool> = messages(&batch.bytes)
        .map(|(_, seq, _)| seq)
        .zip(flags_of(&batch.bytes))
        .map(|(_, flags)| flags & F_ACK != 0)
        .collect();
    assert_eq!(acks, [false, false, false, true, false]);
}

/// The flags of every message in `bytes`, in order.
fn flags_of(bytes: &[u8]) -> Vec<u16> {
    let mut offset = 0;
    let mut flags = Vec::new();
    while offset < bytes.len() {
        let len = u32::from_ne_bytes(bytes[offset..offset + 4].try_into().unwrap());
        flags.push(u16::from_ne_bytes(
            bytes[offset + 6..offset + 8].try_into().unwrap(),
        ));
        offset += len as usize;
    }
    flags
}

#[test]
fn the_read_back_tells_a_missing_table_from_an_existing_one() {
    let newtable = (SUBSYS_NFTABLES << 8) | Kind::NewTable as u16;
    let newgen = (SUBSYS_NFTABLES << 8) | MSG_NEWGEN;
    let mut generation = vec![0, 0, 0, 0];
    generation.extend(attribute(GEN_ID, &9u32.to_be_bytes()));
    let mut table = vec![2, 0, 0, 0];
    table.extend(attribute(1, b"kube-proxy\0"));
    let mut buf = message(newtable, 20, &table);
    buf.extend(message(newgen, 21, &generation));
    let mut read = ReadBack::default();
    parse_read_back(&buf, 20, &mut read);
    assert!(read.complete());
    assert_eq!((read.table, read.generation), (Some(true), Some(9)));

    let mut missing = message(2, 20, &(-2i32).to_ne_bytes());
    missing.extend(message(newgen, 21, &generation));
    let mut read = ReadBack::default();
    parse_read_back(&missing, 20, &mut read);
    assert_eq!((read.table, read.generation), (Some(false), Some(9)));
    let mut read = ReadBack::default();
    parse_read_back(&message(newgen, 21, &generation), 20, &mut read);
    assert!(!read.complete(), "the table is not answered yet");
}

#[test]
fn errors_and_acknowledgements_are_collected_with_their_sequence_numbers() {
    let mut buf = message(2, 3, &0i32.to_ne_bytes());
    buf.extend(message(2, 4, &(-85i32).to_ne_bytes()));
    let mut replies = Vec::new();
    parse_replies(&buf, &mut replies);
    assert_eq!(replies, [(3, 0), (4, -85)]);
}
