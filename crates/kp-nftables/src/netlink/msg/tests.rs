//! Unit tests of the nf_tables answers and notifications.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;

/// The kernel's message of `kind` (`NFNL_SUBSYS_NFTABLES`) for `family`,
/// with `attributes` (type, value).
fn nftables(kind: u8, family: u8, attributes: &[(u16, &[u8])]) -> Vec<u8> {
    attributes
        .iter()
        .fold(
            nfnetlink::request(SUBSYS_NFTABLES, kind, family, 0),
            |message, (kind, value)| message.attr(*kind, value),
        )
        .finish(1)
        .unwrap()
}

/// `bytes` as the one answer [`kp_netlink::Channel::ask`] returns.
fn reply(bytes: Vec<u8>) -> OwnedReply {
    messages(&bytes).next().unwrap().to_owned()
}

#[test]
fn the_generation_is_read_from_its_answer() {
    let generation = 0x0102_0304u32.to_be_bytes();
    let pid = 42u32.to_be_bytes();
    let newgen = nftables(MSG_NEWGEN, 0, &[(GEN_ID, &generation), (2, &pid)]);
    assert_eq!(generation_of(&reply(newgen)), Some(0x0102_0304));
    let bare = nftables(MSG_NEWGEN, 0, &[]);
    assert_eq!(generation_of(&reply(bare)), None, "no NFTA_GEN_ID");
    let table = nftables(Kind::NewTable as u8, 2, &[(GEN_ID, &generation)]);
    assert_eq!(generation_of(&reply(table)), None, "not a generation");
}

#[test]
fn notifications_name_the_table_of_each_change_and_end_with_the_generation() {
    // A new rule in `ip kube-proxy` (table, chain attributes), a deleted
    // chain of `ip6 filter`, the generation, and a message of another
    // subsystem.
    let rule = nftables(
        Kind::NewRule as u8,
        2,
        &[(1, b"kube-proxy\0"), (2, b"services\0")],
    );
    let chain = nftables(Kind::DelChain as u8, 10, &[(1, b"filter\0")]);
    let newgen = nftables(
        MSG_NEWGEN,
        0,
        &[(GEN_ID, &7u32.to_be_bytes()), (2, &42u32.to_be_bytes())],
    );
    let other = nfnetlink::request(1, 2, 2, 0)
        .string(1, "kube-proxy")
        .finish(1)
        .unwrap();
    let datagram = [rule, chain, newgen, other].concat();
    let mut out = Vec::new();
    parse_notifications(&datagram, &mut out);
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
    let bare = nftables(MSG_NEWGEN, 0, &[]);
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
fn a_datagram_cut_inside_a_notification_is_a_change_of_no_known_table() {
    let rule = nftables(Kind::NewRule as u8, 2, &[(1, b"kube-proxy\0")]);
    let chain = nftables(Kind::DelChain as u8, 10, &[(1, b"filter\0")]);
    let datagram = [rule, chain].concat();
    let mut out = Vec::new();
    parse_notifications(&datagram[..datagram.len() - 4], &mut out);
    assert_eq!(
        out,
        [
            Notification::Change {
                family: 2,
                table: Some(b"kube-proxy".as_slice())
            },
            Notification::Change {
                family: 0,
                table: None
            },
        ]
    );
}

#[test]
fn the_questions_name_their_table_and_family() {
    let table = table_request(10, "kube-proxy").finish(3).unwrap();
    let message = messages(&table).next().unwrap();
    assert_eq!(
        message.kind,
        nfnetlink::message_type(SUBSYS_NFTABLES, MSG_GETTABLE)
    );
    let (family, attributes) = nfnetlink::split_payload(message.payload).unwrap();
    assert_eq!(family, 10);
    assert_eq!(find(attributes, TABLE_NAME), Some(&b"kube-proxy\0"[..]));
    let generation = generation_request().finish(4).unwrap();
    let message = messages(&generation).next().unwrap();
    assert_eq!(
        message.kind,
        nfnetlink::message_type(SUBSYS_NFTABLES, MSG_GETGEN)
    );
}
