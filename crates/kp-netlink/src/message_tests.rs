//! Requests byte for byte: nesting, padding, and lengths at the edge of
//! their fields.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use pretty_assertions::assert_eq;

use super::*;
use crate::{
    find, messages, read_string, read_u16, read_u32, Attributes, NLA_F_NET_BYTEORDER, NLM_F_ACK,
};

#[test]
fn a_built_message_reads_back_with_nesting_and_padding() {
    let bytes = Message::new(0x20, NLM_F_ACK)
        .raw(&[4, 1, 0, 0])
        .begin(1)
        .u16(1, 2)
        .string(6, "rr")
        .end()
        .u32(4, 900)
        .finish(7)
        .unwrap();
    assert_eq!(bytes.len() % 4, 0);
    let answers: Vec<_> = messages(&bytes).collect();
    assert_eq!(answers.len(), 1);
    let answer = answers[0];
    assert_eq!((answer.kind, answer.seq), (0x20, 7));
    assert_eq!(answer.flags, NLM_F_ACK | NLM_F_REQUEST);
    let attrs: Vec<_> = Attributes::new(&answer.payload[4..]).collect();
    assert_eq!(attrs.len(), 2);
    assert_eq!(attrs[0].0, 1, "the nested flag is masked off");
    let nested: Vec<_> = Attributes::new(attrs[0].1).collect();
    assert_eq!(read_u16(nested[0].1), Some(2));
    assert_eq!(read_string(nested[1].1), "rr");
    assert_eq!(read_u32(attrs[1].1), Some(900));
}

#[test]
fn an_attribute_too_long_for_its_length_field_is_an_error_not_a_clamp() {
    let fits = vec![7u8; 65_531];
    let bytes = Message::new(1, 0).attr(3, &fits).finish(1).unwrap();
    let reply = messages(&bytes).next().unwrap();
    let value = Attributes::new(reply.payload).next().unwrap().1;
    assert_eq!(
        value.len(),
        65_531,
        "the largest value that fits is sent whole"
    );

    let oversized = vec![7u8; 65_532];
    let message = Message::new(1, 0).attr(3 | NLA_F_NET_BYTEORDER, &oversized);
    let error = LengthError::Attribute {
        kind: 3,
        len: 65_536,
    };
    assert_eq!(message.check(), Err(error.clone()));
    assert_eq!(message.finish(1), Err(error));
}

#[test]
fn a_nest_holding_more_than_an_attribute_can_is_an_error_not_a_clamp() {
    let mut message = Message::new(1, 0).begin(2);
    for _ in 0..2_000 {
        message = message.attr(1, &[0u8; 32]);
    }
    let message = message.end().u32(4, 1);
    assert_eq!(
        message.finish(1),
        Err(LengthError::Nest {
            kind: 2,
            len: 4 + 2_000 * 36
        })
    );
    let error = LengthError::Nest {
        kind: 2,
        len: 72_004,
    }
    .to_string();
    assert!(error.contains("72004 bytes"), "{error}");
}

#[test]
fn a_nest_at_the_limit_fits_and_one_byte_more_does_not() {
    // A nest header (4) and one attribute, header (4) and value, padded:
    // the longest nest, 65,532 bytes, holds a value of 65,524 bytes.
    let at_limit = Message::new(1, 0).begin(2).attr(1, &[0; 65_524]).end();
    assert_eq!(at_limit.clone().finish(1).map(|b| b.len()), Ok(16 + 65_532));
    let over = Message::new(1, 0).begin(2).attr(1, &[0; 65_528]).end();
    assert_eq!(
        over.finish(1),
        Err(LengthError::Nest {
            kind: 2,
            len: 65_536
        })
    );
}

#[test]
fn the_first_length_that_does_not_fit_is_the_one_reported() {
    let message = Message::new(1, 0)
        .attr(5, &[0; 70_000])
        .begin(6)
        .attr(7, &[0; 65_532])
        .end();
    assert_eq!(
        message.check(),
        Err(LengthError::Attribute {
            kind: 5,
            len: 70_004
        })
    );
}

#[test]
fn a_nest_left_open_is_an_error() {
    let message = Message::new(1, 0).begin(9).u8(1, 1);
    assert_eq!(message.finish(1), Err(LengthError::OpenNest { kind: 9 }));
}

#[test]
fn big_endian_and_string_values_are_laid_out_as_the_kernel_reads_them() {
    let bytes = Message::new(1, 0)
        .be16(1, 0x0102)
        .be32(2, 0x0304_0506)
        .be64(3, 7)
        .string(4, "kube")
        .finish(1)
        .unwrap();
    let payload = messages(&bytes).next().unwrap().payload;
    assert_eq!(find(payload, 1), Some(&[1, 2][..]));
    assert_eq!(find(payload, 2), Some(&[3, 4, 5, 6][..]));
    assert_eq!(find(payload, 3), Some(&[0, 0, 0, 0, 0, 0, 0, 7][..]));
    assert_eq!(find(payload, 4), Some(&b"kube\0"[..]));
}

#[test]
fn a_rust_netlink_message_is_a_request_with_the_sequence_number_given() {
    use netlink_packet_core::{NetlinkHeader, NetlinkPayload};
    let message: NetlinkMessage<NoopPayload> =
        NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::Noop);
    let bytes = message.encode(42).unwrap();
    let reply = messages(&bytes).next().unwrap();
    assert_eq!((reply.kind, reply.seq), (crate::NLMSG_NOOP, 42));
    assert_eq!(reply.bytes.len(), bytes.len());
}

/// A payload type with no messages of its own, for the test above.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NoopPayload;

impl netlink_packet_core::NetlinkSerializable for NoopPayload {
    fn message_type(&self) -> u16 {
        0
    }
    fn buffer_len(&self) -> usize {
        0
    }
    fn serialize(&self, _buffer: &mut [u8]) {}
}

#[test]
fn a_message_written_in_place_is_the_message_built_by_value() {
    let built = Message::new(0x20, 0)
        .raw(&[2, 0, 0, 0])
        .string(1, "kube-proxy")
        .begin(3)
        .be32(1, 7)
        .be64(2, 9)
        .attr(4, &[1, 2, 3])
        .end()
        .finish(5)
        .unwrap();
    let mut written = Message::new(0x20, 0);
    written.put_raw(&[2, 0, 0, 0]);
    written.put_string(1, "kube-proxy");
    written.open_nest(3);
    written.put_be32(1, 7);
    written.put_be64(2, 9);
    written.put_attr(4, &[1, 2, 3]);
    written.close_nest();
    assert_eq!(written.finish(5).unwrap(), built);
}

#[test]
fn a_length_too_long_written_in_place_is_an_error_too() {
    let mut string = Message::new(1, 0);
    string.put_string(2, &"x".repeat(65_531));
    assert_eq!(
        string.check(),
        Err(LengthError::Attribute {
            kind: 2,
            len: 65_536
        }),
        "the NUL counts"
    );
    let mut nest = Message::new(1, 0);
    nest.open_nest(3);
    for _ in 0..2_000 {
        nest.put_attr(1, &[0; 32]);
    }
    assert_eq!(nest.nest_len(), 4 + 2_000 * 36);
    nest.close_nest();
    assert_eq!(
        nest.check(),
        Err(LengthError::Nest {
            kind: 3,
            len: 72_004
        })
    );
    let mut open = Message::new(1, 0);
    open.open_nest(4);
    assert_eq!(open.check(), Err(LengthError::OpenNest { kind: 4 }));
}
