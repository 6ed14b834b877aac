//! Datagrams that fit, acknowledgements matched by sequence number, and
//! dumps over several datagrams, without a kernel.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use pretty_assertions::assert_eq;

use super::*;
use crate::parse::tests::error;
use crate::{Message, NLMSG_DONE};

fn request(len: usize) -> Vec<u8> {
    Message::new(20, 0)
        .raw(&vec![0; len - crate::HEADER_LEN])
        .finish(0)
        .unwrap()
}

#[test]
fn a_datagram_takes_requests_up_to_its_message_count() {
    let mut datagram = Datagram::default();
    for index in 0..DATAGRAM_MESSAGES_MAX {
        assert!(datagram.fits(20), "request {index}");
        datagram.push(index, index as u32 + 1, request(20));
    }
    assert!(!datagram.fits(20), "the 65th request starts a new datagram");
}

#[test]
fn a_datagram_takes_requests_up_to_its_byte_limit_exactly() {
    let mut datagram = Datagram::default();
    datagram.push(0, 1, request(DATAGRAM_BYTES_MAX - 64));
    assert!(datagram.fits(64), "a request that ends at the limit fits");
    assert!(!datagram.fits(68), "one that ends past it does not");
}

#[test]
fn a_request_longer_than_a_datagram_goes_alone() {
    let datagram = Datagram::default();
    assert!(datagram.fits(DATAGRAM_BYTES_MAX + 1000));
}

#[test]
fn every_request_of_a_datagram_asks_for_an_acknowledgement() {
    let mut datagram = Datagram::default();
    datagram.push(0, 1, request(20));
    datagram.push(1, 2, request(24));
    for message in messages(&datagram.bytes) {
        assert_eq!(message.flags & NLM_F_ACK, NLM_F_ACK, "{}", message.seq);
    }
    assert_eq!(datagram.first, Some(0));
}

#[test]
fn an_error_for_one_request_among_many_is_reported_at_its_position() {
    let mut acks = Acks::default();
    for index in 0..10 {
        acks.expect(100 + index as u32, index);
    }
    // The answers in two datagrams, one refusal among them, and a late
    // answer to a request of an earlier exchange.
    let first: Vec<u8> = (100..105).flat_map(|seq| error(seq, 0)).collect();
    let mut second: Vec<u8> = error(7, -2);
    for seq in 105..110 {
        second.extend(error(seq, if seq == 107 { -17 } else { 0 }));
    }

    acks.read(&first).unwrap();
    assert!(!acks.complete());
    acks.read(&second).unwrap();

    assert!(acks.complete());
    let refused: Vec<_> = acks
        .refused
        .iter()
        .map(|r| (r.index, r.error.errno()))
        .collect();
    assert_eq!(refused, vec![(7, Some(17))]);
}

#[test]
fn every_refusal_is_reported_none_lost() {
    let mut acks = Acks::default();
    for index in 0..5 {
        acks.expect(index as u32 + 1, index);
    }
    let answers: Vec<u8> = (1..=5).flat_map(|seq| error(seq, -(seq as i32))).collect();
    acks.read(&answers).unwrap();
    let refused: Vec<_> = acks
        .refused
        .iter()
        .map(|r| (r.index, r.error.errno()))
        .collect();
    assert_eq!(
        refused,
        vec![
            (0, Some(1)),
            (1, Some(2)),
            (2, Some(3)),
            (3, Some(4)),
            (4, Some(5))
        ]
    );
}

#[test]
fn a_refused_batch_marker_refuses_the_batch_as_a_whole() {
    let mut acks = Acks {
        markers: vec![1, 4],
        members: Some((2, 2)),
        ..Acks::default()
    };
    acks.expect(2, 0);
    acks.expect(3, 1);

    acks.read(&error(1, -85)).unwrap();

    assert!(acks.complete(), "no answer follows a refused batch");
    assert!(acks.refused.is_empty());
    assert_eq!(acks.refused_whole.as_ref().and_then(Error::errno), Some(85));
}

#[test]
fn a_batch_member_that_did_not_ask_is_still_reported_when_refused() {
    // Five requests, sequence numbers 11 to 15; only the last asked.
    let mut acks = Acks {
        markers: vec![10, 16],
        members: Some((11, 5)),
        ..Acks::default()
    };
    acks.expect(15, 4);

    acks.read(&[error(13, -2), error(15, 0)].concat()).unwrap();

    assert!(acks.complete());
    let refused: Vec<_> = acks
        .refused
        .iter()
        .map(|r| (r.index, r.error.errno()))
        .collect();
    assert_eq!(refused, vec![(2, Some(2))]);
}

#[test]
fn member_positions_follow_sequence_numbers_across_their_wrap() {
    let acks = Acks {
        members: Some((u32::MAX - 1, 4)),
        ..Acks::default()
    };
    assert_eq!(acks.member(u32::MAX - 1), Some(0));
    assert_eq!(acks.member(0), Some(2));
    assert_eq!(acks.member(1), Some(3));
    assert_eq!(acks.member(2), None);
}

#[test]
fn an_empty_batch_bound_to_a_generation_waits_for_its_begin_marker() {
    let mut acks = Acks {
        markers: vec![7, 8],
        members: Some((8, 0)),
        marker_awaited: Some(7),
        ..Acks::default()
    };
    assert!(!acks.complete());
    acks.read(&error(7, 0)).unwrap();
    assert!(acks.complete());
    assert!(acks.refused_whole.is_none());
}

#[test]
fn a_dump_over_several_datagrams_yields_every_entry_until_done() {
    let entry = |seq: u32, n: u8| {
        Message::new(20, crate::NLM_F_MULTI)
            .u8(1, n)
            .finish(seq)
            .unwrap()
    };
    let done = Message::new(NLMSG_DONE, crate::NLM_F_MULTI)
        .raw(&0i32.to_ne_bytes())
        .finish(9)
        .unwrap();
    let datagrams = [
        [entry(9, 1), entry(9, 2)].concat(),
        // An answer to another request in between is not part of the dump.
        [entry(8, 99), entry(9, 3)].concat(),
        [entry(9, 4), done].concat(),
    ];
    let mut reader = DumpReader { seq: 9 };
    let mut seen = Vec::new();
    let mut complete = Vec::new();
    for datagram in &datagrams {
        let done = reader
            .read(datagram, &mut |reply: Reply<'_>| {
                seen.push(crate::find(reply.payload, 1).unwrap()[0]);
            })
            .unwrap();
        complete.push(done);
    }
    assert_eq!(seen, vec![1, 2, 3, 4]);
    assert_eq!(complete, vec![false, false, true]);
}

#[test]
fn a_dump_the_kernel_refuses_is_an_error_with_its_errno() {
    let mut reader = DumpReader { seq: 3 };
    let error = reader.read(&error(3, -1), &mut |_| {}).unwrap_err();
    assert_eq!(error.errno(), Some(1));
    assert!(!error.is_broken());
}

#[test]
fn a_lost_answer_is_an_error_that_says_so() {
    let overflow = receive_error(io::Error::from_raw_os_error(nix::libc::ENOBUFS), false);
    assert!(overflow.is_broken());
    assert!(overflow.to_string().contains("overflowed"), "{overflow}");
    let late = receive_error(io::ErrorKind::WouldBlock.into(), true);
    assert!(late.to_string().contains("not queued"), "{late}");
}

#[test]
fn a_question_is_answered_by_its_own_reply_and_acknowledgement_only() {
    let reply = |seq: u32, n: u8| Message::new(20, 0).u8(1, n).finish(seq).unwrap();
    let mut reader = AskReader {
        seq: 4,
        acknowledged: true,
        reply: None,
    };
    // A late answer to another question, then the answer in two datagrams.
    assert!(reader.read(&[reply(3, 1), error(3, 0)].concat()).is_none());
    assert!(reader.read(&reply(4, 2)).is_none());
    let answer = reader.read(&error(4, 0)).unwrap().unwrap();
    assert_eq!(crate::find(answer.payload(), 1), Some(&[2][..]));

    let mut refused = AskReader {
        seq: 5,
        acknowledged: true,
        reply: None,
    };
    let refusal = refused.read(&error(5, -2)).unwrap().unwrap_err();
    assert_eq!(refusal.errno(), Some(2));

    let mut bare = AskReader {
        seq: 6,
        acknowledged: true,
        reply: None,
    };
    let malformed = bare.read(&error(6, 0)).unwrap().unwrap_err();
    assert!(
        malformed.to_string().contains("without an answer"),
        "{malformed}"
    );
}

#[test]
fn an_answer_that_cannot_be_read_whole_is_an_error_not_skipped() {
    let mut acks = Acks::default();
    acks.expect(1, 0);
    acks.expect(2, 1);
    let answers = [error(1, 0), error(2, -1)].concat();
    let cut = &answers[..answers.len() - 4];
    let error = acks.read(cut).unwrap_err();
    assert!(error.is_broken());
    assert!(error.to_string().contains("inside a message"), "{error}");

    let mut reader = DumpReader { seq: 2 };
    assert!(reader.read(cut, &mut |_| {}).is_err());
    let mut asked = AskReader {
        seq: 2,
        acknowledged: true,
        reply: None,
    };
    assert!(matches!(asked.read(cut), Some(Err(_))));
}

#[test]
fn a_question_without_an_acknowledgement_ends_at_its_answer() {
    let reply = Message::new(20, 0).u8(1, 7).finish(9).unwrap();
    let mut reader = AskReader {
        seq: 9,
        acknowledged: false,
        reply: None,
    };
    let answer = reader.read(&reply).unwrap().unwrap();
    assert_eq!(crate::find(answer.payload(), 1), Some(&[7][..]));

    let mut refused = AskReader {
        seq: 10,
        acknowledged: false,
        reply: None,
    };
    assert_eq!(
        refused.read(&error(10, -2)).unwrap().unwrap_err().errno(),
        Some(2)
    );
}

#[test]
fn the_receive_buffer_is_raised_for_many_answers_or_for_refusals_unasked() {
    assert_eq!(
        receive_buffer_wanted(100, false, 0),
        None,
        "the default holds 100"
    );
    assert_eq!(
        receive_buffer_wanted(8_192, false, 0),
        Some(8_192 * ANSWER_BYTES)
    );
    assert_eq!(
        receive_buffer_wanted(300, false, 0),
        Some(RECEIVE_BUFFER_MIN_RAISED_BYTES),
        "never raised by less than the floor"
    );
    // A batch past its acknowledgement budget asks for one answer, but
    // its refused requests answer too.
    assert_eq!(
        receive_buffer_wanted(1, true, 0),
        Some(RECEIVE_BUFFER_MIN_RAISED_BYTES)
    );
    assert_eq!(
        receive_buffer_wanted(1, true, RECEIVE_BUFFER_MIN_RAISED_BYTES),
        None,
        "raised already"
    );
}

#[test]
fn an_encoded_batch_frames_its_requests_behind_the_begin_marker() {
    for batch in [Batch::new(10), Batch::new(10).bound_to(7)] {
        let mut encoded = EncodedBatch::new();
        encoded
            .push(&Message::new(20, 0).raw(&[1, 2, 3, 4]))
            .unwrap();
        encoded
            .push(&Message::new(21, 0).raw(&[5, 6, 7, 8, 9, 10, 11, 12]))
            .unwrap();
        assert_eq!(encoded.len(), 2);
        let begin = batch.begin().finish(40).unwrap();
        let (bytes, starts) = encoded.with_begin(&begin, 41).unwrap();
        assert_eq!(&bytes[..begin.len()], &begin[..], "the begin marker first");
        assert_eq!(starts, [begin.len(), begin.len() + 20]);
        let read: Vec<(u32, u16, usize)> = messages(&bytes)
            .map(|message| (message.seq, message.kind, message.bytes.len()))
            .collect();
        assert_eq!(
            read,
            [
                (40, begin_kind(&begin), begin.len()),
                (41, 20, 20),
                (42, 21, 24)
            ]
        );
    }
}

#[test]
fn a_message_whose_lengths_do_not_fit_is_not_added_to_an_encoded_batch() {
    let mut encoded = EncodedBatch::new();
    let mut open = Message::new(20, 0);
    open.open_nest(1);
    assert!(encoded.push(&open).is_err());
    assert!(encoded.is_empty());
}

fn begin_kind(begin: &[u8]) -> u16 {
    u16::from_ne_bytes([begin[4], begin[5]])
}
