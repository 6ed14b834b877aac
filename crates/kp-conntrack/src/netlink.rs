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
//! datagrams of several messages each, and every acknowledgement is matched
//! to its flow, by the shared netlink channel (`kp-netlink`).

use std::net::{IpAddr, SocketAddr};

use kp_model::IpFamily;
use kp_netlink::{Channel, Reply, NETLINK_NETFILTER};
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

use crate::flow::{Flow, FlowTuple};
use crate::table::{ConntrackError, ConntrackTable, Deletion, Listing};

/// `CTA_ZONE`: the conntrack zone of an entry, a big-endian u16.
const CTA_ZONE: u16 = 18;
/// `ENOENT`: the entry to delete (or look up) does not exist (any more).
const ENOENT: i32 = 2;
/// Room for one conntrack entry with every attribute the kernel adds.
const LOOKUP_BUFFER_BYTES: usize = 8 * 1024;

/// The conntrack table of the network namespace in which the socket is
/// opened: the namespace of the thread that first uses it. The socket is
/// opened on first use and opened again after a failure.
#[derive(Debug)]
pub struct NetlinkConntrack {
    channel: Channel,
}

/// A ctnetlink request, as `netlink-packet-netfilter` builds it.
type Request = NetlinkMessage<NetfilterMessage>;

/// What a message of a dump holds.
enum Answer {
    /// A conntrack entry; `None` when its tuples are incomplete.
    Entry(Option<Flow>),
    /// Anything else (ignored).
    Other,
}

impl Default for NetlinkConntrack {
    fn default() -> Self {
        Self::new()
    }
}

impl NetlinkConntrack {
    /// A table that opens its socket on first use.
    pub fn new() -> Self {
        Self {
            channel: Channel::new(NETLINK_NETFILTER),
        }
    }

    /// A table for [`NetlinkConntrack::udp_original_destination`] on a hot
    /// path: answers are read without blocking (the kernel answers a
    /// lookup inside `send`) into a buffer of one entry, so that one such
    /// table per listener costs little.
    pub fn for_lookups() -> Self {
        Self {
            channel: Channel::new(NETLINK_NETFILTER)
                .answers_queued()
                .receive_buffer(LOOKUP_BUFFER_BYTES),
        }
    }

    /// The destination a UDP datagram from `client`, received at `local`
    /// after a rewrite, was sent to: the original destination of the entry
    /// whose reply tuple is `local → client`; `None` when conntrack has no
    /// such entry.
    ///
    /// ```text
    /// conntrack -G -p udp --reply-src L --reply-dst C --reply-port-src lp --reply-port-dst cp
    /// ```
    pub fn udp_original_destination(
        &mut self,
        client: SocketAddr,
        local: SocketAddr,
    ) -> Result<Option<SocketAddr>, ConntrackError> {
        match self.channel.ask(reply_tuple_request(client, local)) {
            Ok(reply) => Ok(original_destination_of(&reply.bytes)),
            Err(error) if error.errno() == Some(ENOENT) => Ok(None),
            Err(error) => Err(failed("lookup", error)),
        }
    }

    fn dump(&mut self, family: IpFamily) -> Result<Listing, ConntrackError> {
        let mut listing = Listing::default();
        self.channel
            .dump(dump_request(family), |reply: Reply<'_>| {
                listing.interrupted |= reply.flags & NLM_F_DUMP_INTR != 0;
                match decode_answer(reply.bytes) {
                    Ok(Answer::Entry(Some(flow))) if flow.family() == family => {
                        listing.flows.push(flow)
                    }
                    Ok(Answer::Entry(Some(_)) | Answer::Other) => {}
                    // One entry the parser does not understand must not
                    // stop the cleanup of the others.
                    Ok(Answer::Entry(None)) | Err(_) => listing.undecodable += 1,
                }
            })
            .map_err(|error| failed("dump", error))?;
        Ok(listing)
    }
}

impl ConntrackTable for NetlinkConntrack {
    fn list(&mut self, family: IpFamily) -> Result<Listing, ConntrackError> {
        self.dump(family)
    }

    fn delete(&mut self, flows: &[Flow]) -> Result<Deletion, ConntrackError> {
        let mut deletion = Deletion::default();
        let Err(failure) = self.channel.execute(flows.iter().map(delete_request)) else {
            deletion.deleted = flows.len();
            return Ok(deletion);
        };
        if let Some(broken) = failure.broken {
            return Err(failed("delete", broken.error));
        }
        let refused = failure.refused.len();
        for refusal in failure.refused {
            match (refusal.error.errno(), flows.get(refusal.index)) {
                (Some(ENOENT), _) => deletion.already_gone += 1,
                (_, Some(flow)) => deletion.failed.push((*flow, refusal.error.into())),
                (_, None) => {}
            }
        }
        deletion.deleted = flows.len() - refused;
        Ok(deletion)
    }
}

/// `request` failed with `error`, in this crate's words.
fn failed(request: &'static str, error: kp_netlink::Error) -> ConntrackError {
    match error {
        kp_netlink::Error::Open { source, .. } => ConntrackError::OpenSocket(source),
        kp_netlink::Error::Send(source) => ConntrackError::Send { request, source },
        kp_netlink::Error::Kernel(source) => ConntrackError::Kernel { request, source },
        other => ConntrackError::Receive {
            request,
            source: other.into(),
        },
    }
}

/// The request to list every entry of `family`.
pub(crate) fn dump_request(family: IpFamily) -> Request {
    request(
        nf_family(family),
        NLM_F_REQUEST | NLM_F_DUMP,
        ConntrackMessage::Get(Vec::new()),
    )
}

/// The request to delete `flow` (found by its original tuple and zone).
pub(crate) fn delete_request(flow: &Flow) -> Request {
    let mut attributes = vec![ConntrackAttribute::CtaTupleOrig(tuple_attributes(
        flow.protocol,
        &flow.original,
    ))];
    if flow.zone != 0 {
        attributes.push(zone_attribute(flow.zone));
    }
    request(
        nf_family(flow.family()),
        NLM_F_REQUEST | NLM_F_ACK,
        ConntrackMessage::Delete(attributes),
    )
}

/// `IPCTNL_MSG_CT_GET` for the entry whose reply tuple is
/// `local → client` over UDP.
pub(crate) fn reply_tuple_request(client: SocketAddr, local: SocketAddr) -> Request {
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
        IpFamily::V4
    } else {
        IpFamily::V6
    };
    request(
        nf_family(family),
        NLM_F_REQUEST,
        ConntrackMessage::Get(vec![ConntrackAttribute::CtaTupleReply(tuple)]),
    )
}

/// A `NEW` message describing `flow`, as the kernel sends it in a dump.
#[cfg(test)]
pub(crate) fn entry_message(flow: &Flow, seq: u32) -> Vec<u8> {
    use kp_netlink::Request as _;

    let mut attributes = vec![
        ConntrackAttribute::CtaTupleOrig(tuple_attributes(flow.protocol, &flow.original)),
        ConntrackAttribute::CtaTupleReply(tuple_attributes(flow.protocol, &flow.reply)),
    ];
    if flow.zone != 0 {
        attributes.push(zone_attribute(flow.zone));
    }
    let message = request(
        nf_family(flow.family()),
        0,
        ConntrackMessage::New(attributes),
    );
    // Invariant: an entry of two tuples is some 100 bytes long.
    message.encode(seq).unwrap_or_default()
}

/// A ctnetlink message for `family` with `flags`; the channel sets its
/// sequence number.
fn request(family: NetfilterProtoFamily, flags: u16, message: ConntrackMessage) -> Request {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    let inner = NetfilterMessage::new(NetfilterHeader::new(family, 0, 0), message);
    NetlinkMessage::new(header, NetlinkPayload::from(inner))
}

fn nf_family(family: IpFamily) -> NetfilterProtoFamily {
    match family {
        IpFamily::V4 => NetfilterProtoFamily::IPv4,
        IpFamily::V6 => NetfilterProtoFamily::IPv6,
    }
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

/// Decodes one message of a dump.
fn decode_answer(message: &[u8]) -> Result<Answer, DecodeError> {
    let message = NetlinkMessage::<NetfilterMessage>::deserialize(message)?;
    Ok(match message.payload {
        NetlinkPayload::InnerMessage(NetfilterMessage {
            inner: NetfilterMessageInner::Conntrack(ConntrackMessage::New(attributes)),
            ..
        }) => Answer::Entry(flow_from_attributes(&attributes)),
        _ => Answer::Other,
    })
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

/// The destination of the original tuple of the entry in `message` (the
/// answer to [`reply_tuple_request`]); `None` when it has none readable.
pub(crate) fn original_destination_of(message: &[u8]) -> Option<SocketAddr> {
    let message = NetlinkMessage::<NetfilterMessage>::deserialize(message).ok()?;
    let NetlinkPayload::InnerMessage(NetfilterMessage {
        inner: NetfilterMessageInner::Conntrack(ConntrackMessage::New(attributes)),
        ..
    }) = message.payload
    else {
        return None;
    };
    let (_, original) = attributes.iter().find_map(|attribute| match attribute {
        ConntrackAttribute::CtaTupleOrig(tuple) => decode_tuple(tuple),
        _ => None,
    })?;
    Some(SocketAddr::new(original.dst, original.dst_port))
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
