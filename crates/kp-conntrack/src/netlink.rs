//! The conntrack table through ctnetlink (`NETLINK_NETFILTER`, subsystem
//! `NFNL_SUBSYS_CTNETLINK`), as `conntrack -L` and `conntrack -D` use it.
//!
//! Messages are built and parsed with `netlink-packet-netfilter`; this is
//! their layout on the wire (all lengths include their header, attributes
//! are padded to 4 bytes, integers in attribute values are big endian):
//!
//! ```text
//! nlmsghdr   len u32 | type u16 = (NFNL_SUBSYS_CTNETLINK=1) << 8 | msg
//!            | flags u16 | seq u32 | pid u32
//!            msg: IPCTNL_MSG_CT_NEW=0 (dump answers), _GET=1, _DELETE=2
//! nfgenmsg   family u8 (AF_INET=2, AF_INET6=10) | version u8 = 0 | res_id u16 = 0
//! CTA_TUPLE_ORIG=1 (nested)        the tuple of the first packet
//!   CTA_TUPLE_IP=1 (nested)
//!     CTA_IP_V4_SRC=1, CTA_IP_V4_DST=2   4 bytes each, or
//!     CTA_IP_V6_SRC=3, CTA_IP_V6_DST=4   16 bytes each
//!   CTA_TUPLE_PROTO=2 (nested)
//!     CTA_PROTO_NUM=1 u8 | CTA_PROTO_SRC_PORT=2 u16 | CTA_PROTO_DST_PORT=3 u16
//! CTA_TUPLE_REPLY=2 (nested)       the same, for replies (after NAT)
//! CTA_ZONE=18 u16                  only for zones other than 0
//! ```
//!
//! A dump is one `GET` with `NLM_F_REQUEST | NLM_F_DUMP` and the family in
//! the nfgenmsg; the kernel answers with one `NEW` message per entry of that
//! family, then `NLMSG_DONE`. A delete is one `DELETE` with
//! `NLM_F_REQUEST | NLM_F_ACK` carrying `CTA_TUPLE_ORIG` (and `CTA_ZONE`);
//! the kernel answers `NLMSG_ERROR` with 0 or `-ENOENT`. Deletes are sent in
//! batches of several messages per datagram; the kernel acknowledges each.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;

use kp_model::IpFamily;
use netlink_packet_core::{
    DecodeError, DefaultNla, NetlinkHeader, NetlinkMessage, NetlinkPayload, Nla, NLA_TYPE_MASK,
    NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST,
};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Protocol, Tuple,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};

use crate::flow::{Flow, FlowTuple};
use crate::table::{ConntrackError, ConntrackTable, Deletion, Listing};

/// `CTA_ZONE`: the conntrack zone of an entry, a big-endian u16.
const CTA_ZONE: u16 = 18;
/// `ENOENT`: the entry to delete does not exist (any more).
const ENOENT: i32 = 2;
/// Delete requests sent in one datagram.
const DELETE_BATCH: usize = 64;
/// Receive buffer: the kernel never sends a netlink datagram larger than
/// 32 KiB to a reader that offers more (`netlink_dump`).
const RECEIVE_BUFFER: usize = 64 * 1024;

/// The conntrack table of the network namespace in which the socket is
/// opened: the namespace of the thread that first uses it. The socket is
/// opened on first use and opened again after a failure.
#[derive(Debug, Default)]
pub struct NetlinkConntrack {
    socket: Option<Socket>,
    next_seq: u32,
}

/// What a received datagram said about one request.
enum Answer {
    /// A conntrack entry (dump).
    Entry(Option<Flow>),
    /// End of a dump.
    Done,
    /// Acknowledgement (`None`) or error of the request `seq`.
    Status { seq: u32, error: Option<io::Error> },
    /// Anything else (ignored).
    Other,
}

impl NetlinkConntrack {
    /// A table that opens its socket on first use.
    pub fn new() -> Self {
        Self::default()
    }

    fn socket(&mut self) -> Result<&Socket, ConntrackError> {
        if self.socket.is_none() {
            let mut socket = Socket::new(NETLINK_NETFILTER).map_err(ConntrackError::OpenSocket)?;
            socket.bind_auto().map_err(ConntrackError::OpenSocket)?;
            socket
                .connect(&SocketAddr::new(0, 0))
                .map_err(ConntrackError::OpenSocket)?;
            // Acknowledgements without a copy of the request.
            socket
                .set_cap_ack(true)
                .map_err(ConntrackError::OpenSocket)?;
            self.socket = Some(socket);
        }
        self.socket
            .as_ref()
            .ok_or_else(|| ConntrackError::OpenSocket(io::ErrorKind::NotConnected.into()))
    }

    fn seq(&mut self) -> u32 {
        self.next_seq = self.next_seq.wrapping_add(1).max(1);
        self.next_seq
    }

    fn send(&mut self, request: &'static str, bytes: &[u8]) -> Result<(), ConntrackError> {
        let socket = self.socket()?;
        socket
            .send(bytes, 0)
            .map(|_| ())
            .map_err(|source| ConntrackError::Send { request, source })
    }

    fn receive(
        &mut self,
        request: &'static str,
        buffer: &mut Vec<u8>,
    ) -> Result<(), ConntrackError> {
        buffer.clear();
        let socket = self.socket()?;
        socket
            .recv(buffer, 0)
            .map(|_| ())
            .map_err(|source| ConntrackError::Receive { request, source })
    }

    fn dump(&mut self, family: IpFamily) -> Result<Listing, ConntrackError> {
        let seq = self.seq();
        self.send("dump", &dump_request(family, seq))?;
        let mut listing = Listing::default();
        let mut buffer = Vec::with_capacity(RECEIVE_BUFFER);
        loop {
            self.receive("dump", &mut buffer)?;
            for message in split_messages(&buffer) {
                let Ok((flags, answer)) = decode_answer(message) else {
                    // One entry the parser does not understand must not
                    // stop the cleanup of the others.
                    listing.undecodable += 1;
                    continue;
                };
                listing.interrupted |= flags & NLM_F_DUMP_INTR != 0;
                match answer {
                    Answer::Entry(Some(flow)) if flow.family() == family => {
                        listing.flows.push(flow)
                    }
                    Answer::Entry(Some(_)) => {}
                    Answer::Entry(None) => listing.undecodable += 1,
                    Answer::Done => return Ok(listing),
                    Answer::Status {
                        error: Some(source),
                        ..
                    } => {
                        return Err(ConntrackError::Kernel {
                            request: "dump",
                            source,
                        })
                    }
                    Answer::Status { error: None, .. } | Answer::Other => {}
                }
            }
        }
    }

    fn delete_batch(
        &mut self,
        flows: &[Flow],
        deletion: &mut Deletion,
    ) -> Result<(), ConntrackError> {
        let mut pending = HashMap::with_capacity(flows.len());
        let mut datagram = Vec::new();
        for flow in flows {
            let seq = self.seq();
            datagram.extend_from_slice(&delete_request(flow, seq));
            pending.insert(seq, *flow);
        }
        self.send("delete", &datagram)?;
        let mut buffer = Vec::with_capacity(RECEIVE_BUFFER);
        while !pending.is_empty() {
            self.receive("delete", &mut buffer)?;
            for message in split_messages(&buffer) {
                let (_, answer) =
                    decode_answer(message).map_err(|source| ConntrackError::Decode {
                        request: "delete",
                        source,
                    })?;
                let Answer::Status { seq, error } = answer else {
                    continue;
                };
                let Some(flow) = pending.remove(&seq) else {
                    continue;
                };
                match error {
                    None => deletion.deleted += 1,
                    Some(error) if error.raw_os_error() == Some(ENOENT) => {
                        deletion.already_gone += 1
                    }
                    Some(error) => deletion.failed.push((flow, error)),
                }
            }
        }
        Ok(())
    }
}

impl ConntrackTable for NetlinkConntrack {
    fn list(&mut self, family: IpFamily) -> Result<Listing, ConntrackError> {
        let result = self.dump(family);
        if result.is_err() {
            // A half-read dump leaves answers in the socket: start afresh.
            self.socket = None;
        }
        result
    }

    fn delete(&mut self, flows: &[Flow]) -> Result<Deletion, ConntrackError> {
        let mut deletion = Deletion::default();
        for batch in flows.chunks(DELETE_BATCH) {
            if let Err(error) = self.delete_batch(batch, &mut deletion) {
                self.socket = None;
                return Err(error);
            }
        }
        Ok(deletion)
    }
}

/// The request to list every entry of `family`.
pub(crate) fn dump_request(family: IpFamily, seq: u32) -> Vec<u8> {
    encode(
        family,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        ConntrackMessage::Get(Vec::new()),
    )
}

/// The request to delete `flow` (found by its original tuple and zone).
pub(crate) fn delete_request(flow: &Flow, seq: u32) -> Vec<u8> {
    let mut attributes = vec![ConntrackAttribute::CtaTupleOrig(tuple_attributes(
        flow.protocol,
        &flow.original,
    ))];
    if flow.zone != 0 {
        attributes.push(zone_attribute(flow.zone));
    }
    encode(
        flow.family(),
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        ConntrackMessage::Delete(attributes),
    )
}

/// A `NEW` message describing `flow`, as the kernel sends it in a dump.
#[cfg(test)]
pub(crate) fn entry_message(flow: &Flow, seq: u32) -> Vec<u8> {
    let mut attributes = vec![
        ConntrackAttribute::CtaTupleOrig(tuple_attributes(flow.protocol, &flow.original)),
        ConntrackAttribute::CtaTupleReply(tuple_attributes(flow.protocol, &flow.reply)),
    ];
    if flow.zone != 0 {
        attributes.push(zone_attribute(flow.zone));
    }
    encode(flow.family(), 0, seq, ConntrackMessage::New(attributes))
}

fn encode(family: IpFamily, flags: u16, seq: u32, message: ConntrackMessage) -> Vec<u8> {
    let nf_family = match family {
        IpFamily::V4 => NetfilterProtoFamily::IPv4,
        IpFamily::V6 => NetfilterProtoFamily::IPv6,
    };
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = seq;
    let inner = NetfilterMessage::new(NetfilterHeader::new(nf_family, 0, 0), message);
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(inner));
    packet.finalize();
    let mut bytes = vec![0; packet.buffer_len()];
    packet.serialize(&mut bytes);
    bytes
}

fn tuple_attributes(protocol: u8, tuple: &FlowTuple) -> Vec<Tuple> {
    vec![
        Tuple::Ip(vec![
            IPTuple::SourceAddress(tuple.src),
            IPTuple::DestinationAddress(tuple.dst),
        ]),
        Tuple::Proto(vec![
            ProtoTuple::Protocol(Protocol::from(protocol)),
            ProtoTuple::SourcePort(tuple.src_port),
            ProtoTuple::DestinationPort(tuple.dst_port),
        ]),
    ]
}

fn zone_attribute(zone: u16) -> ConntrackAttribute {
    ConntrackAttribute::Other(DefaultNla::new(CTA_ZONE, zone.to_be_bytes().to_vec()))
}

/// The netlink messages of one datagram (each `nlmsghdr.len` long, aligned
/// to 4 bytes). A truncated tail is left out.
pub(crate) fn split_messages(datagram: &[u8]) -> Vec<&[u8]> {
    let mut messages = Vec::new();
    let mut rest = datagram;
    while let Some(length) = rest.get(..4).map(|len| [len[0], len[1], len[2], len[3]]) {
        let length = u32::from_ne_bytes(length) as usize;
        if length < 16 || length > rest.len() {
            break;
        }
        messages.push(&rest[..length]);
        let aligned = (length + 3) & !3;
        rest = rest.get(aligned..).unwrap_or_default();
    }
    messages
}

/// Decodes one message: its header flags and what it says.
fn decode_answer(message: &[u8]) -> Result<(u16, Answer), DecodeError> {
    let message = NetlinkMessage::<NetfilterMessage>::deserialize(message)?;
    let flags = message.header.flags;
    let seq = message.header.sequence_number;
    let answer = match message.payload {
        NetlinkPayload::Done(_) => Answer::Done,
        NetlinkPayload::Error(error) => Answer::Status {
            seq,
            error: error
                .code
                .map(|code| io::Error::from_raw_os_error(-code.get())),
        },
        NetlinkPayload::InnerMessage(NetfilterMessage {
            inner: NetfilterMessageInner::Conntrack(ConntrackMessage::New(attributes)),
            ..
        }) => Answer::Entry(flow_from_attributes(&attributes)),
        _ => Answer::Other,
    };
    Ok((flags, answer))
}

/// The flow described by the attributes of a dumped entry; `None` when the
/// tuples are incomplete.
pub(crate) fn flow_from_attributes(attributes: &[ConntrackAttribute]) -> Option<Flow> {
    let mut original = None;
    let mut reply = None;
    let mut zone = 0;
    for attribute in attributes {
        match attribute {
            ConntrackAttribute::CtaTupleOrig(tuple) => original = decode_tuple(tuple),
            ConntrackAttribute::CtaTupleReply(tuple) => reply = decode_tuple(tuple),
            ConntrackAttribute::Other(nla) if nla.kind() & NLA_TYPE_MASK == CTA_ZONE => {
                let mut value = vec![0; nla.value_len()];
                nla.emit_value(&mut value);
                if let [high, low] = value[..] {
                    zone = u16::from_be_bytes([high, low]);
                }
            }
            _ => {}
        }
    }
    let (protocol, original) = original?;
    let (_, reply) = reply?;
    Some(Flow {
        protocol,
        original,
        reply,
        zone,
    })
}

fn decode_tuple(tuple: &[Tuple]) -> Option<(u8, FlowTuple)> {
    let mut src: Option<IpAddr> = None;
    let mut dst: Option<IpAddr> = None;
    let mut protocol = None;
    let (mut src_port, mut dst_port) = (0, 0);
    for part in tuple {
        match part {
            Tuple::Ip(addresses) => {
                for address in addresses {
                    match address {
                        IPTuple::SourceAddress(ip) => src = Some(*ip),
                        IPTuple::DestinationAddress(ip) => dst = Some(*ip),
                        _ => {}
                    }
                }
            }
            Tuple::Proto(fields) => {
                for field in fields {
                    match field {
                        ProtoTuple::Protocol(number) => protocol = Some(u8::from(*number)),
                        ProtoTuple::SourcePort(port) => src_port = *port,
                        ProtoTuple::DestinationPort(port) => dst_port = *port,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    let tuple = FlowTuple {
        src: src?,
        dst: dst?,
        src_port,
        dst_port,
    };
    Some((protocol?, tuple))
}

#[cfg(test)]
#[path = "netlink_tests.rs"]
mod tests;
