//! The address a UDP datagram was sent to before a portal rule rewrote it,
//! read from the conntrack table over ctnetlink.
//!
//! For TCP the kernel answers `SO_ORIGINAL_DST` on the accepted socket; for
//! UDP it refuses (`getorigdst` serves TCP and SCTP only), and the
//! listener's socket is not tied to one client anyway. The conntrack entry
//! is there all the same: a datagram from `C:cp` to `VIP:vp` redirected to
//! the listener `L:lp` has the reply tuple `L:lp → C:cp`, which the relay
//! knows (the client's address from `recvmsg`, `L` from `IP_PKTINFO`), and
//! the entry's original tuple names `VIP:vp`. The same question on the
//! command line:
//!
//! ```text
//! conntrack -G -p udp --reply-src L --reply-dst C --reply-port-src lp --reply-port-dst cp
//! ```
//!
//! The entry exists by the time the listener reads the datagram: conntrack
//! confirms it in `INPUT`, before the socket's queue. The kernel handles a
//! netlink request inside `sendmsg`, so the answer is queued when `send`
//! returns and reading it never blocks.

use std::io;
use std::net::SocketAddr;

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Protocol, Tuple,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket};
use nix::libc;

/// `ENOENT`: conntrack has no such entry.
const ENOENT: i32 = 2;
/// Room for one conntrack entry with every attribute the kernel adds.
const RECEIVE_BUFFER: usize = 8 * 1024;

/// Looks up original destinations of UDP datagrams; one per listener, its
/// socket opened on first use in the namespace of the calling thread, and
/// opened again after a failure.
#[derive(Debug, Default)]
pub struct OriginalDestinations {
    socket: Option<Socket>,
    next_seq: u32,
    /// Answers are read into this, kept from one question to the next:
    /// a flood of datagrams from new sources asks one question each.
    buffer: Vec<u8>,
}

/// What one answer to a request said.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// The entry's original destination.
    Found(SocketAddr),
    /// No entry (or one without a readable original tuple).
    Missing,
    /// The kernel refused the request.
    Failed(i32),
    /// A message about another request.
    Other,
}

impl OriginalDestinations {
    /// A lookup whose socket is opened on first use.
    pub fn new() -> Self {
        Self::default()
    }

    /// Where the datagram from `client`, received at `local` (after the
    /// rewrite), was sent; `None` when conntrack does not know it or
    /// cannot be asked.
    pub fn udp(&mut self, client: SocketAddr, local: SocketAddr) -> Option<SocketAddr> {
        match self.query(client, local) {
            Ok(found) => found,
            Err(error) => {
                tracing::debug!(%client, %local, %error, "asking conntrack for a datagram's original destination failed");
                // Answers left in a broken socket must not answer the next
                // question.
                self.socket = None;
                None
            }
        }
    }

    fn query(&mut self, client: SocketAddr, local: SocketAddr) -> io::Result<Option<SocketAddr>> {
        self.next_seq = self.next_seq.wrapping_add(1).max(1);
        let seq = self.next_seq;
        let request = reply_tuple_request(client, local, seq);
        let mut buffer = std::mem::take(&mut self.buffer);
        buffer.reserve(RECEIVE_BUFFER);
        let answer = self.ask(&request, seq, &mut buffer);
        self.buffer = buffer;
        answer
    }

    fn ask(
        &mut self,
        request: &[u8],
        seq: u32,
        buffer: &mut Vec<u8>,
    ) -> io::Result<Option<SocketAddr>> {
        let socket = self.socket()?;
        socket.send(request, 0)?;
        loop {
            buffer.clear();
            socket.recv(buffer, libc::MSG_DONTWAIT)?;
            for message in split_messages(buffer) {
                match decode_answer(message, seq) {
                    Answer::Found(destination) => return Ok(Some(destination)),
                    Answer::Missing => return Ok(None),
                    Answer::Failed(code) if code == ENOENT => return Ok(None),
                    Answer::Failed(code) => return Err(io::Error::from_raw_os_error(code)),
                    Answer::Other => {}
                }
            }
        }
    }

    fn socket(&mut self) -> io::Result<&Socket> {
        let socket = match self.socket.take() {
            Some(socket) => socket,
            None => {
                let mut socket = Socket::new(NETLINK_NETFILTER)?;
                socket.bind_auto()?;
                socket.connect(&netlink_sys::SocketAddr::new(0, 0))?;
                socket
            }
        };
        Ok(self.socket.insert(socket))
    }
}

/// `IPCTNL_MSG_CT_GET` for the entry whose reply tuple is
/// `local → client` over UDP.
fn reply_tuple_request(client: SocketAddr, local: SocketAddr, seq: u32) -> Vec<u8> {
    let tuple = vec![
        Tuple::Ip(vec![
            IPTuple::SourceAddress(local.ip()),
            IPTuple::DestinationAddress(client.ip()),
        ]),
        Tuple::Proto(vec![
            ProtoTuple::Protocol(Protocol::Udp),
            ProtoTuple::SourcePort(local.port()),
            ProtoTuple::DestinationPort(client.port()),
        ]),
    ];
    let family = if client.is_ipv4() {
        NetfilterProtoFamily::IPv4
    } else {
        NetfilterProtoFamily::IPv6
    };
    let message = ConntrackMessage::Get(vec![ConntrackAttribute::CtaTupleReply(tuple)]);
    encode(family, NLM_F_REQUEST, seq, message)
}

fn encode(
    family: NetfilterProtoFamily,
    flags: u16,
    seq: u32,
    message: ConntrackMessage,
) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = seq;
    let inner = NetfilterMessage::new(NetfilterHeader::new(family, 0, 0), message);
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(inner));
    packet.finalize();
    let mut bytes = vec![0; packet.buffer_len()];
    packet.serialize(&mut bytes);
    bytes
}

/// The netlink messages of one datagram (each `nlmsghdr.len` long, aligned
/// to 4 bytes); a truncated tail is left out.
fn split_messages(datagram: &[u8]) -> Vec<&[u8]> {
    let mut messages = Vec::new();
    let mut rest = datagram;
    while let Some(&[a, b, c, d]) = rest.get(..4) {
        let length = u32::from_ne_bytes([a, b, c, d]) as usize;
        if length < 16 || length > rest.len() {
            break;
        }
        messages.push(&rest[..length]);
        rest = rest.get((length + 3) & !3..).unwrap_or_default();
    }
    messages
}

/// What `message` says about request `seq`.
fn decode_answer(message: &[u8], seq: u32) -> Answer {
    let Ok(message) = NetlinkMessage::<NetfilterMessage>::deserialize(message) else {
        return Answer::Other;
    };
    if message.header.sequence_number != seq {
        return Answer::Other;
    }
    match message.payload {
        NetlinkPayload::Error(error) => match error.code {
            Some(code) => Answer::Failed(-code.get()),
            None => Answer::Other,
        },
        NetlinkPayload::InnerMessage(NetfilterMessage {
            inner: NetfilterMessageInner::Conntrack(ConntrackMessage::New(attributes)),
            ..
        }) => original_destination(&attributes).map_or(Answer::Missing, Answer::Found),
        _ => Answer::Other,
    }
}

/// The destination of the original tuple of an entry's attributes.
fn original_destination(attributes: &[ConntrackAttribute]) -> Option<SocketAddr> {
    let tuple = attributes.iter().find_map(|attribute| match attribute {
        ConntrackAttribute::CtaTupleOrig(tuple) => Some(tuple),
        _ => None,
    })?;
    let mut ip = None;
    let mut port = None;
    for part in tuple {
        match part {
            Tuple::Ip(addresses) => {
                ip = addresses.iter().find_map(|address| match address {
                    IPTuple::DestinationAddress(ip) => Some(*ip),
                    _ => None,
                });
            }
            Tuple::Proto(fields) => {
                port = fields.iter().find_map(|field| match field {
                    ProtoTuple::DestinationPort(port) => Some(*port),
                    _ => None,
                });
            }
            _ => {}
        }
    }
    Some(SocketAddr::new(ip?, port?))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// The kernel's answer to a lookup: the entry of a datagram from
    /// `client` to `service`, redirected to `local`.
    fn entry(client: SocketAddr, service: SocketAddr, local: SocketAddr, seq: u32) -> Vec<u8> {
        let tuple = |src: SocketAddr, dst: SocketAddr| {
            vec![
                Tuple::Ip(vec![
                    IPTuple::SourceAddress(src.ip()),
                    IPTuple::DestinationAddress(dst.ip()),
                ]),
                Tuple::Proto(vec![
                    ProtoTuple::Protocol(Protocol::Udp),
                    ProtoTuple::SourcePort(src.port()),
                    ProtoTuple::DestinationPort(dst.port()),
                ]),
            ]
        };
        let message = ConntrackMessage::New(vec![
            ConntrackAttribute::CtaTupleOrig(tuple(client, service)),
            ConntrackAttribute::CtaTupleReply(tuple(local, client)),
        ]);
        encode(NetfilterProtoFamily::IPv4, 0, seq, message)
    }

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn the_request_asks_by_the_reply_tuple() {
        let bytes = reply_tuple_request(addr("10.244.1.2:40000"), addr("10.244.1.1:35000"), 7);
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
    fn the_answer_names_the_service_address() {
        let client = addr("192.168.99.11:40000");
        let answer = entry(
            client,
            addr("203.0.113.9:53"),
            addr("192.168.99.2:35000"),
            3,
        );
        let messages = split_messages(&answer);
        assert_eq!(messages.len(), 1);
        assert_eq!(
            decode_answer(messages[0], 3),
            Answer::Found(addr("203.0.113.9:53"))
        );
        assert_eq!(
            decode_answer(messages[0], 4),
            Answer::Other,
            "another request's"
        );
    }

    #[test]
    fn answers_of_a_datagram_are_split_and_a_truncated_tail_dropped() {
        let first = entry(
            addr("10.0.0.1:1"),
            addr("10.96.0.1:53"),
            addr("10.0.0.2:2"),
            1,
        );
        let second = entry(
            addr("10.0.0.3:1"),
            addr("10.96.0.2:53"),
            addr("10.0.0.2:2"),
            2,
        );
        let mut datagram = first.clone();
        datagram.extend_from_slice(&second);
        datagram.extend_from_slice(&second[..10]);
        assert_eq!(split_messages(&datagram), vec![&first[..], &second[..]]);
    }
}
