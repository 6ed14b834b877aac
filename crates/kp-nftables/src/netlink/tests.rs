//! Unit tests of the encoder and of how the kernel's answers are read.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;

use std::io;
use std::sync::Arc;

use kp_netlink::BatchError;

use crate::model::{
    AddrField, Address, ChainKind, Command, Expr, Key, Name, Rule, SetElement, Verdict,
};

/// The error of a batch of `transaction` (encoded by `encoder`) that
/// failed as `failure` says, as [`NetlinkApplier::apply`] reports it.
fn batch_error(failure: BatchFailure, encoder: &Encoder, transaction: &Transaction) -> ApplyError {
    match refused_lines(failure, encoder) {
        Ok(lines) => named_refusal(lines, transaction),
        Err(error) => error,
    }
}

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
    let (line, error) = encoder.encode(&text).unwrap_err();
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
    encoder
        .encode(&transaction(IpFamily::V6, vec![chain("services")]))
        .unwrap();
    assert_eq!(encoder.messages.len(), 1);
    let bytes = encoder.messages.requests().next().unwrap();
    let message = kp_netlink::messages(bytes).next().unwrap();
    assert_eq!(message.bytes.len(), bytes.len());
    assert_eq!(message.payload[0], NFPROTO_IPV6);
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

/// The encoder of [`three_lines`], its messages written.
fn encoded() -> Encoder {
    let mut encoder = Encoder::new(IpFamily::V4, "p".to_owned());
    encoder.encode(&three_lines()).unwrap();
    encoder
}

/// `ENOMEM`.
const ENOMEM: i32 = 12;
/// `ENOBUFS`.
const ENOBUFS: i32 = 105;

/// A refusal of message `index` with `errno`.
fn refusal(index: usize, errno: i32) -> BatchError {
    BatchError {
        index,
        error: kp_netlink::Error::Kernel(io::Error::from_raw_os_error(errno)),
    }
}

#[test]
fn every_message_knows_the_line_it_was_written_for() {
    let encoder = encoded();
    assert_eq!(encoder.lines, [1, 2, 3]);
    assert_eq!(encoder.line_of(2), Some(3));
    assert_eq!(encoder.line_of(3), None);
}

#[test]
fn every_refused_message_is_named_with_its_line() {
    let failure = BatchFailure {
        refused: vec![refusal(1, 17), refusal(2, 2)],
        ..BatchFailure::default()
    };
    match batch_error(failure, &encoded(), &three_lines()) {
        ApplyError::Kernel {
            message,
            line,
            also_refused,
            refused,
        } => {
            assert!(message.contains("File exists"), "{message}");
            assert_eq!(line.unwrap().0, 2);
            assert_eq!(also_refused.len(), 1);
            assert_eq!(also_refused[0].0, 3);
            assert_eq!(refused, three_lines().commands[1..]);
        }
        other => panic!("expected the refused lines, got {other}"),
    }
}

#[test]
fn a_refusal_of_the_batch_as_a_whole_says_so() {
    let whole = |errno| BatchFailure {
        refused_whole: Some(kp_netlink::Error::Kernel(io::Error::from_raw_os_error(
            errno,
        ))),
        ..BatchFailure::default()
    };
    let error = batch_error(whole(ENOMEM), &encoded(), &three_lines());
    assert!(
        error.to_string().contains("the batch as a whole"),
        "{error}"
    );
    assert!(matches!(
        batch_error(whole(ERESTART), &encoded(), &three_lines()),
        ApplyError::GenerationMoved
    ));
    assert!(matches!(
        batch_error(whole(EOPNOTSUPP), &encoded(), &three_lines()),
        ApplyError::NoNftables { .. }
    ));
}

#[test]
fn answers_lost_leave_the_transaction_failed_whatever_was_refused() {
    // Answers dropped by a full socket buffer could each have been a
    // refusal: the transaction is not taken as applied, nor its refusals
    // as the whole story.
    let failure = BatchFailure {
        refused: vec![refusal(1, 17)],
        broken: Some(BatchError {
            index: 0,
            error: kp_netlink::Error::Receive(io::Error::from_raw_os_error(ENOBUFS)),
        }),
        refused_whole: None,
    };
    let error = batch_error(failure, &encoded(), &three_lines());
    assert!(matches!(error, ApplyError::Write(_)), "{error}");
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
    let read = |table, generation| ReadBack { table, generation };
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
    let comment: &'static str = "c".repeat(300).leak();
    let text = transaction(
        IpFamily::V4,
        vec![Command::AddRule(goto_rule().with_comment(comment))],
    );
    let (line, error) = encoder.encode(&text).unwrap_err();
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
    let name = format!("service-AAAAAAAA-ns1/web/tcp/{}", "x".repeat(70_000));
    let text = transaction(IpFamily::V4, vec![chain(&name)]);
    let (line, error) = encoder.encode(&text).unwrap_err();
    let error = encode_error(&text, line, error);
    let message = error.to_string();
    assert!(
        matches!(&error, ApplyError::TooLarge { object, .. } if object.ends_with("(Service ns1/web)")),
        "{message}"
    );
    assert!(message.contains("at most 65535 bytes"), "{message}");
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
        encoder.encode(&text).unwrap();
        let kinds: Vec<(u16, usize)> = encoder
            .messages
            .requests()
            .map(|bytes| (u16::from_ne_bytes([bytes[4], bytes[5]]) & 0xff, bytes.len()))
            .collect();
        let element_messages = kinds
            .iter()
            .filter(|(kind, _)| *kind == Kind::NewSetElem as u16)
            .count();
        assert!(
            element_messages > 1,
            "{family}: {element_messages} element messages"
        );
        assert!(
            kinds.iter().all(|(_, len)| *len < kp_netlink::ATTR_LEN_MAX),
            "{family}: every message's element list fits its nest"
        );
        // The set, its element messages, then the rule that binds it.
        assert_eq!(kinds[0].0, Kind::NewSet as u16);
        assert_eq!(kinds[kinds.len() - 1].0, Kind::NewRule as u16);
        assert_eq!(encoder.lines, vec![1; kinds.len()], "all of line 1");
    }
}
