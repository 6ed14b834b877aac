//! Answers as the kernel sends them, read back; malformed input ends a
//! walk instead of panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use pretty_assertions::assert_eq;

use super::*;
use crate::Message;

/// An `NLMSG_ERROR` answering `seq` with `code` (0: acknowledgement).
pub(crate) fn error(seq: u32, code: i32) -> Vec<u8> {
    let mut payload = code.to_ne_bytes().to_vec();
    payload.extend_from_slice(&[0; HEADER_LEN]);
    Message::new(NLMSG_ERROR, 0)
        .raw(&payload)
        .finish(seq)
        .unwrap()
}

#[test]
fn truncated_input_ends_the_iteration_instead_of_panicking() {
    let bytes = Message::new(1, 0).u32(1, 5).finish(1).unwrap();
    assert_eq!(messages(&bytes[..bytes.len() - 2]).count(), 0);
    let broken = [8u8, 0, 1, 0, 1, 2];
    assert_eq!(Attributes::new(&broken).count(), 0);
    assert_eq!(error_code(&[0, 0]), Some(71));
    for cut in 0..bytes.len() {
        let _ = messages(&bytes[..cut]).count();
        let _ = Attributes::new(&bytes[..cut]).count();
    }
}

#[test]
fn a_datagram_splits_into_its_messages_and_drops_a_truncated_tail() {
    let first = Message::new(20, 0).raw(&[1, 2, 3]).finish(1).unwrap();
    let second = Message::new(21, 0).u8(1, 9).finish(2).unwrap();
    let mut datagram = [first.clone(), second.clone()].concat();
    datagram.extend_from_slice(&first[..10]);

    let mut walk = messages(&datagram);
    let bytes: Vec<&[u8]> = walk.by_ref().map(|m| m.bytes).collect();
    assert_eq!(bytes, vec![&first[..], &second[..]]);
    assert!(walk.truncated(), "the tail is reported");

    let mut whole = messages(&datagram[..first.len() + second.len()]);
    assert_eq!(whole.by_ref().count(), 2);
    assert!(!whole.truncated());
}

#[test]
fn acknowledgements_refusals_and_the_end_of_a_dump_are_statuses() {
    let ack = error(5, 0);
    let refusal = error(6, -17);
    let done = Message::new(NLMSG_DONE, 0)
        .raw(&0i32.to_ne_bytes())
        .finish(7)
        .unwrap();
    let failed_dump = Message::new(NLMSG_DONE, 0)
        .raw(&(-4i32).to_ne_bytes())
        .finish(8)
        .unwrap();
    let entry = Message::new(20, 0).finish(9).unwrap();
    let datagram = [ack, refusal, done, failed_dump, entry].concat();

    let statuses: Vec<_> = messages(&datagram).map(|m| (m.seq, m.status())).collect();
    assert_eq!(
        statuses,
        vec![
            (5, Some(Ok(()))),
            (6, Some(Err(17))),
            (7, Some(Ok(()))),
            (8, Some(Err(4))),
            (9, None)
        ]
    );
}

#[test]
fn values_of_the_wrong_size_are_none() {
    assert_eq!(read_be_u16(&[1]), None);
    assert_eq!(read_be_u16(&[1, 2]), Some(0x0102));
    assert_eq!(read_be_u32(&[0, 0, 0, 0, 0]), None);
    assert_eq!(read_be_u64(&7u64.to_be_bytes()), Some(7));
    assert_eq!(read_u32(&[1, 0]), None);
    assert_eq!(read_string(b"name\0\0\0"), "name");
}
