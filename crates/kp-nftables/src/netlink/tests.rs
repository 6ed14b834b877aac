//! Unit tests of the encoder and of how the kernel's answers are read.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;

use std::sync::Arc;

use crate::model::{
    AddrField, Address, ChainKind, Command, Expr, Key, Name, Rule, SetElement, Verdict,
};

const SERVICE_CHAIN: &str = "service-AAAAAAAA-ns1/web/tcp/http";
const ENDPOINT_CHAIN: &str = "endpoint-BBBBBBBB-ns1/web/tcp/http__10.244.1.2/8080";

fn transaction(family: IpFamily, commands: Vec<Command>) -> Transaction {
    Transaction { family, commands }
}

fn chain(name: &str) -> Command {
    Command::AddChain {
        name: Name::Shared(Arc::from(name)),
        kind: ChainKind::Regular,
    }
}

/// `add rule … service-… goto endpoint-…`.
fn goto_rule() -> Rule {
    Rule::new(
        Name::Shared(Arc::from(SERVICE_CHAIN)),
        vec![Expr::Verdict(Verdict::Goto(Name::Shared(Arc::from(
            ENDPOINT_CHAIN,
        ))))],
    )
}

#[test]
fn keys_are_padded_fields_in_network_order() {
    let key = Key::AddrProtoPort("10.96.0.10".parse().unwrap(), kp_model::Protocol::Tcp, 80);
    assert_eq!(
        objects::key_bytes(&key),
        [10, 96, 0, 10, 6, 0, 0, 0, 0, 80, 0, 0]
    );
}

#[test]
fn an_address_of_the_other_family_is_named_and_nothing_is_sent() {
    let mut encoder = Encoder::new(IpFamily::V4, "p".to_owned());
    let mut batch = Batch::new(1, None);
    let rule = Rule::new(
        "c",
        vec![
            Expr::AddrIs {
                field: AddrField::Source,
                negate: false,
                value: Address::Host("fd00::1".parse().unwrap()),
            },
            Expr::Verdict(Verdict::Drop),
        ],
    );
    let text = transaction(
        IpFamily::V4,
        vec![Command::AddTable { comment: None }, Command::AddRule(rule)],
    );
    let (line, error) = encoder.encode(&mut batch, &text).unwrap_err();
    assert_eq!(line, 2);
    let error = encode_error(&text, line, error);
    assert_eq!(
        error.refused_lines(),
        ["add rule ip kube-proxy c ip saddr fd00::1 drop"]
    );
}

#[test]
fn each_message_is_framed_with_its_length() {
    let mut encoder = Encoder::new(IpFamily::V6, "p".to_owned());
    let mut batch = Batch::new(7, None);
    encoder
        .encode(
            &mut batch,
            &transaction(IpFamily::V6, vec![chain("services")]),
        )
        .unwrap();
    batch.finish();
    let mut offset = 0;
    let mut sequences = Vec::new();
    while offset < batch.bytes.len() {
        let len = u32::from_ne_bytes(batch.bytes[offset..offset + 4].try_into().unwrap());
        let seq = u32::from_ne_bytes(batch.bytes[offset + 8..offset + 12].try_into().unwrap());
        sequences.push(seq);
        offset += len as usize;
    }
    assert_eq!(offset, batch.bytes.len());
    assert_eq!(sequences, [7, 8, 9], "begin, the chain, end");
}

/// `NLMSG_ERROR` answers `(seq, errno)`, as the kernel sends them with
/// `NETLINK_CAP_ACK`: the error code and the refused message's header.
fn answers(replies: &[(u32, i32)]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for (seq, code) in replies {
        bytes.extend_from_slice(&36u32.to_ne_bytes());
        bytes.extend_from_slice(&2u16.to_ne_bytes());
        bytes.extend_from_slice(&0u16.to_ne_bytes());
        bytes.extend_from_slice(&seq.to_ne_bytes());
        bytes.extend_from_slice(&0u32.to_ne_bytes());
        bytes.extend_from_slice(&code.to_ne_bytes());
        bytes.extend_from_slice(&[0; 16]);
    }
    bytes
}

/// Encodes `text` from sequence number 10 (the batch's begin).
fn encoded(text: &Transaction) -> (Encoder, Batch) {
    let mut encoder = Encoder::new(IpFamily::V4, "p".to_owned());
    let mut batch = Batch::new(10, None);
    encoder.encode(&mut batch, text).unwrap();
    batch.ask_acks(ACKED_MESSAGES_MAX);
    batch.finish();
    (encoder, batch)
}

/// `add table`, `add chain service-…`, `add rule service-… goto …`.
fn three_lines() -> Transaction {
    transaction(
        IpFamily::V4,
        vec![
            Command::AddTable { comment: None },
            chain(SERVICE_CHAIN),
            Command::AddRule(goto_rule()),
        ],
    )
}

#[test]
fn acknowledged_messages_are_applied_as_far_as_the_answers_tell() {
    let (encoder, batch) = encoded(&three_lines());
    assert_eq!(batch.acked, [11, 12, 13]);
    let mut read = Answers::new(10, &batch.acked);
    let buf = answers(&[(11, 0), (12, 0), (13, 0)]);
    read.read(&buf, buf.len()).unwrap();
    assert!(read.complete());
    read.outcome(&encoder, &three_lines()).unwrap();
}

#[test]
fn a_message_left_unanswered_is_not_applied() {
    let (encoder, batch) = encoded(&three_lines());
    let mut read = Answers::new(10, &batch.acked);
    let buf = answers(&[(11, 0), (13, 0)]);
    read.read(&buf, buf.len()).unwrap();
    assert!(!read.complete(), "the answer to 12 is missing");
    let error = read.outcome(&encoder, &three_lines()).unwrap_err();
    assert!(
        matches!(&error, ApplyError::NotApplied { reason } if reason.contains("2 of the 3 messages")),
        "{error}"
    );
}

#[test]
fn an_answer_cut_short_is_an_error_not_skipped() {
    // An answer longer than the buffer could have held a refusal.
    let mut read = Answers::new(10, &[11]);
    let buf = answers(&[(11, -22)]);
    let error = read.read(&buf[..20], buf.len()).unwrap_err();
    assert!(error.to_string().contains("was cut"), "{error}");
}

#[test]
fn every_refused_message_is_named_with_its_line() {
    let (encoder, batch) = encoded(&three_lines());
    let mut read = Answers::new(10, &batch.acked);
    let buf = answers(&[(11, 0), (12, -17), (13, -2)]);
    read.read(&buf, buf.len()).unwrap();
    match read.outcome(&encoder, &three_lines()).unwrap_err() {
        ApplyError::Kernel {
            line, also_refused, ..
        } => {
            assert_eq!(line.unwrap().0, 2);
            assert_eq!(also_refused.len(), 1);
            assert_eq!(also_refused[0].0, 3);
        }
        other => panic!("expected the refused lines, got {other}"),
    }
}

#[test]
fn a_refusal_of_the_batch_as_a_whole_ends_the_answers_and_is_an_error() {
    let (encoder, batch) = encoded(&three_lines());
    let mut read = Answers::new(10, &batch.acked);
    let buf = answers(&[(10, -12)]);
    read.read(&buf, buf.len()).unwrap();
    assert!(
        read.complete(),
        "no message answers after the batch's refusal"
    );
    let error = read.outcome(&encoder, &three_lines()).unwrap_err();
    assert!(
        error.to_string().contains("the batch as a whole"),
        "{error}"
    );
    let mut moved = Answers::new(10, &[11, 12, 13]);
    let buf = answers(&[(10, -ERESTART)]);
    moved.read(&buf, buf.len()).unwrap();
    assert!(matches!(
        moved.outcome(&encoder, &three_lines()),
        Err(ApplyError::GenerationMoved)
    ));
}

#[test]
fn the_read_back_expects_what_the_text_leaves() {
    let writes = Expected::of(&three_lines());
    assert_eq!(writes.table_exists, Some(true));
    assert!(writes.generation_moves, "a rule is a change");
    let deletes = Expected::of(&transaction(
        IpFamily::V4,
        vec![Command::AddTable { comment: None }, Command::DeleteTable],
    ));
    assert_eq!(deletes.table_exists, Some(false));
    assert!(!deletes.generation_moves);
    let elements = Expected::of(&transaction(
        IpFamily::V4,
        vec![Command::AddElements {
            set: Name::Fixed("cluster-ips"),
            elements: vec![SetElement {
                key: Key::Addr("10.96.0.1".parse().unwrap()),
                comment: None,
                verdict: None,
            }],
        }],
    ));
    assert_eq!(elements.table_exists, Some(true));
    assert!(
        !elements.generation_moves,
        "an element may already be there"
    );
}

#[test]
fn a_commit_the_read_back_contradicts_is_not_applied() {
    let writes = Expected::of(&three_lines());
    let read = |table, generation| msg::ReadBack {
        table: Some(table),
        generation: Some(generation),
        error: None,
    };
    writes.judge(IpFamily::V4, Some(4), &read(true, 5)).unwrap();
    let missing = writes
        .judge(IpFamily::V4, Some(4), &read(false, 5))
        .unwrap_err();
    assert!(
        missing
            .to_string()
            .contains("table ip kube-proxy does not exist"),
        "{missing}"
    );
    let unmoved = writes
        .judge(IpFamily::V4, Some(4), &read(true, 4))
        .unwrap_err();
    assert!(unmoved.to_string().contains("still 4"), "{unmoved}");
    let deletes = Expected::of(&transaction(
        IpFamily::V6,
        vec![Command::AddTable { comment: None }, Command::DeleteTable],
    ));
    deletes.judge(IpFamily::V6, None, &read(false, 4)).unwrap();
    assert!(deletes.judge(IpFamily::V6, None, &read(true, 4)).is_err());
}

#[test]
fn a_comment_too_long_for_its_length_byte_names_the_rule_and_its_service() {
    let mut encoder = Encoder::new(IpFamily::V4, "p".to_owned());
    let mut batch = Batch::new(1, None);
    let comment: &'static str = "c".repeat(300).leak();
    let text = transaction(
        IpFamily::V4,
        vec![Command::AddRule(goto_rule().with_comment(comment))],
    );
    let (line, error) = encoder.encode(&mut batch, &text).unwrap_err();
    match encode_error(&text, line, error) {
        ApplyError::TooLarge { object, reason, .. } => {
            assert_eq!(
                object,
                "rule in chain service-AAAAAAAA-ns1/web/tcp/http (Service ns1/web)"
            );
            assert!(reason.contains("300 bytes"), "{reason}");
        }
        other => panic!("expected the rule to be refused by name, got {other}"),
    }
}

#[test]
fn a_name_too_long_for_an_attribute_is_refused_by_name_not_cut() {
    let mut encoder = Encoder::new(IpFamily::V4, "p".to_owned());
    let mut batch = Batch::new(1, None);
    let name = format!("service-AAAAAAAA-ns1/web/tcp/{}", "x".repeat(70_000));
    let text = transaction(IpFamily::V4, vec![chain(&name)]);
    let (line, error) = encoder.encode(&mut batch, &text).unwrap_err();
    let error = encode_error(&text, line, error);
    let message = error.to_string();
    assert!(
        matches!(&error, ApplyError::TooLarge { object, .. } if object.ends_with("(Service ns1/web)")),
        "{message}"
    );
    assert!(message.contains("more than the 65535"), "{message}");
    assert!(
        message.len() < 1_000,
        "the line is abbreviated: {}",
        message.len()
    );
}

#[test]
fn large_element_lists_are_sent_over_several_messages_that_each_fit() {
    for (family, ranges) in [
        (
            IpFamily::V4,
            (0..10_000u32)
                .map(|i| format!("100.{}.{}.0/25", 64 + i / 256, i % 256))
                .collect::<Vec<_>>(),
        ),
        (
            IpFamily::V6,
            (0..10_000u32)
                .map(|i| format!("fc00:aaaa:{:x}::/48", 2 * i))
                .collect(),
        ),
    ] {
        let values = ranges
            .iter()
            .map(|range| Address::Prefix(range.parse().unwrap()))
            .collect();
        let rule = Rule::new(
            Name::Shared(Arc::from("firewall-AAAAAAAA-ns1/lb/tcp/http")),
            vec![
                Expr::AddrNotIn {
                    field: AddrField::Source,
                    values,
                },
                Expr::Verdict(Verdict::Drop),
            ],
        );
        let text = transaction(family, vec![Command::AddRule(rule)]);
        let mut encoder = Encoder::new(family, "p".to_owned());
        let mut batch = Batch::new(1, None);
        encoder.encode(&mut batch, &text).unwrap();
        batch.finish();
        let kinds: Vec<(u16, usize)> = msg::messages(&batch.bytes)
            .map(|(kind, _, payload)| (kind & 0xff, payload.len()))
            .collect();
        let element_messages = kinds
            .iter()
            .filter(|(kind, _)| *kind == msg::Kind::NewSetElem as u16)
            .count();
        assert!(
            element_messages > 1,
            "{family}: {element_messages} element messages"
        );
        assert!(
            kinds.iter().all(|(_, len)| *len < msg::ATTR_LEN_MAX),
            "{family}: every message's element list fits its nest"
        );
        // After the batch's begin: the set, its element messages, then
        // the rule that binds it, and the batch's end.
        assert_eq!(kinds[1].0, msg::Kind::NewSet as u16);
        assert_eq!(kinds[kinds.len() - 2].0, msg::Kind::NewRule as u16);
    }
}
