//! ipset over nfnetlink (subsystem `NFNL_SUBSYS_IPSET` = 6), as the `ipset`
//! program speaks it (include/uapi/linux/netfilter/ipset/ip_set.h):
//!
//! ```text
//! type      6 << 8 | cmd: PROTOCOL=1 CREATE=2 DESTROY=3 LIST=7 ADD=9 DEL=10
//! nfgenmsg  family u8 (NFPROTO_IPV4=2, _IPV6=10, _UNSPEC=0) | version 0 | res_id be16
//! ATTR      PROTOCOL=1 u8 | SETNAME=2 | TYPENAME=3 | REVISION=4 u8
//!           FAMILY=5 u8 | DATA=7 (nested) | ADT=8 (nested list of DATA)
//! DATA      IP=1 (nested: IPADDR_IPV4=1 | IPADDR_IPV6=2, network order)
//!           PORT=4 be16 | PORT_TO=5 be16 | PROTO=7 u8 | HASHSIZE=18 be32
//!           MAXELEM=19 be32 | IP2=20 (nested) | CIDR2=21 u8
//! ```
//! Integer attributes wider than a byte carry `NLA_F_NET_BYTEORDER`. Without
//! `NLM_F_EXCL`, adding a present member, creating an existing compatible
//! set, or deleting an absent member is not an error (`ipset -exist`).

use std::collections::BTreeSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use kp_model::{IpFamily, Protocol};
use kp_netlink::nfnetlink::{self, NFPROTO_IPV4, NFPROTO_IPV6, NFPROTO_UNSPEC, SUBSYS_IPSET};
use kp_netlink::{
    Attributes, BatchError, BatchFailure, Channel, Message, NETLINK_NETFILTER, NLA_F_NET_BYTEORDER,
    NLM_F_ACK, NLM_F_DUMP, NLM_F_EXCL,
};

use crate::netlink::ipvs::{protocol_number, protocol_of};
use crate::netlink::malformed;
use crate::state::{SetEntry, SetKind, SetType};

const CMD_PROTOCOL: u8 = 1;
const CMD_CREATE: u8 = 2;
const CMD_DESTROY: u8 = 3;
const CMD_LIST: u8 = 7;
const CMD_ADD: u8 = 9;
const CMD_DEL: u8 = 10;

const ATTR_PROTOCOL: u16 = 1;
const ATTR_SETNAME: u16 = 2;
const ATTR_TYPENAME: u16 = 3;
const ATTR_REVISION: u16 = 4;
const ATTR_FAMILY: u16 = 5;
const ATTR_DATA: u16 = 7;
const ATTR_ADT: u16 = 8;

const DATA_IP: u16 = 1;
const DATA_PORT: u16 = 4;
const DATA_PORT_TO: u16 = 5;
const DATA_PROTO: u16 = 7;
const DATA_HASHSIZE: u16 = 18;
const DATA_MAXELEM: u16 = 19;
const DATA_IP2: u16 = 20;
const DATA_CIDR2: u16 = 21;
const IPADDR_IPV4: u16 = 1;
const IPADDR_IPV6: u16 = 2;

/// The protocol version requests speak: 6 is what every kernel since 2.6.39
/// accepts (7 only added attributes this mode does not use).
const PROTOCOL: u8 = 6;
/// Upstream's `ipset create` defaults.
const HASH_SIZE: u32 = 1024;
/// The first of ipset's own error codes.
const IPSET_ERR_PRIVATE: i32 = 4096;
/// Destroying a set a rule uses.
pub const IPSET_ERR_BUSY: i32 = 4100;
/// Adding an element that is there, or deleting one that is not.
pub const IPSET_ERR_EXIST: i32 = 4103;
/// Destroying a set another set refers to.
const IPSET_ERR_REFERENCED: i32 = 4108;
/// The first type-specific code: a full hash, a port out of a bitmap.
const IPSET_ERR_TYPE_SPECIFIC: i32 = 4352;
const MAX_ELEM: u32 = 65536;
/// `ENOENT`: the set does not exist.
const ENOENT: i32 = 2;

/// The ipsets of the network namespace of the thread that first uses them.
#[derive(Debug)]
pub struct IpsetNetlink {
    channel: Channel,
}

impl Default for IpsetNetlink {
    fn default() -> Self {
        Self::new()
    }
}

impl IpsetNetlink {
    /// A handle that opens its socket on first use.
    pub fn new() -> Self {
        Self {
            channel: Channel::new(NETLINK_NETFILTER),
        }
    }

    /// Requests sent so far.
    pub fn messages(&self) -> u64 {
        self.channel.messages()
    }

    /// The kernel's ipset protocol version (`ipset version`).
    pub fn protocol_version(&mut self) -> io::Result<u8> {
        let request = request(CMD_PROTOCOL, NFPROTO_UNSPEC, NLM_F_ACK);
        let reply = self.channel.ask(request)?;
        kp_netlink::find(reply.payload().get(4..).unwrap_or_default(), ATTR_PROTOCOL)
            .and_then(|value| value.first().copied())
            .ok_or_else(|| malformed("no ipset protocol version"))
    }

    /// The members of set `name`; `None` when it does not exist.
    pub fn list(&mut self, name: &str, family: IpFamily) -> io::Result<Option<BTreeSet<SetEntry>>> {
        let request = request(CMD_LIST, nfproto(family), NLM_F_DUMP).string(ATTR_SETNAME, name);
        let answers = match self.channel.dump_all(request) {
            Ok(answers) => answers,
            Err(error) if error.errno() == Some(ENOENT) => return Ok(None),
            Err(error) => return Err(error.into()),
        };
        let Some((kind, _)) = SetKind::from_name(name) else {
            return Ok(Some(BTreeSet::new()));
        };
        let mut members = BTreeSet::new();
        for reply in answers {
            let payload = reply.payload();
            let Some(adt) = kp_netlink::find(payload.get(4..).unwrap_or_default(), ATTR_ADT) else {
                continue;
            };
            for (attr, data) in Attributes::new(adt) {
                if attr == ATTR_DATA {
                    members.extend(parse_entry(data, kind.set_type()));
                }
            }
        }
        Ok(Some(members))
    }

    /// `ipset create NAME TYPE family inet|inet6 hashsize 1024 maxelem 65536`
    /// (`range 0-65535` for `bitmap:port`).
    pub fn create_message(kind: SetKind, family: IpFamily) -> Message {
        let set_type = kind.set_type();
        let (revision, proto) = match set_type {
            SetType::BitmapPort => (0, NFPROTO_UNSPEC),
            SetType::HashIp => (0, nfproto(family)),
            // Revision 1 added SCTP to the port-carrying hash types.
            _ => (1, nfproto(family)),
        };
        let message = request(CMD_CREATE, proto, NLM_F_ACK)
            .string(ATTR_SETNAME, kind.name(family))
            .string(ATTR_TYPENAME, set_type.as_str())
            .u8(ATTR_REVISION, revision)
            .u8(ATTR_FAMILY, proto)
            .begin(ATTR_DATA);
        let message = match set_type {
            SetType::BitmapPort => message
                .attr(DATA_PORT | NLA_F_NET_BYTEORDER, &0u16.to_be_bytes())
                .attr(DATA_PORT_TO | NLA_F_NET_BYTEORDER, &u16::MAX.to_be_bytes()),
            _ => message
                .attr(
                    DATA_HASHSIZE | NLA_F_NET_BYTEORDER,
                    &HASH_SIZE.to_be_bytes(),
                )
                .attr(DATA_MAXELEM | NLA_F_NET_BYTEORDER, &MAX_ELEM.to_be_bytes()),
        };
        message.end()
    }

    /// `ipset add|del NAME ENTRY`.
    pub fn entry_message(kind: SetKind, family: IpFamily, entry: &SetEntry, add: bool) -> Message {
        let cmd = if add { CMD_ADD } else { CMD_DEL };
        let message = request(cmd, nfproto(family), NLM_F_ACK)
            .string(ATTR_SETNAME, kind.name(family))
            .begin(ATTR_DATA);
        let port =
            |m: Message, port: u16| m.attr(DATA_PORT | NLA_F_NET_BYTEORDER, &port.to_be_bytes());
        let proto = |m: Message, p: Protocol| m.u8(DATA_PROTO, protocol_number(p) as u8);
        let message = match *entry {
            SetEntry::Ip(ip) => address(message, DATA_IP, ip),
            SetEntry::Port(number) => port(message, number),
            SetEntry::IpPort(ip, p, number) => {
                proto(port(address(message, DATA_IP, ip), number), p)
            }
            SetEntry::IpPortIp(ip, p, number, ip2) => address(
                proto(port(address(message, DATA_IP, ip), number), p),
                DATA_IP2,
                ip2,
            ),
            SetEntry::IpPortNet(ip, p, number, net) => address(
                proto(port(address(message, DATA_IP, ip), number), p),
                DATA_IP2,
                net.network(),
            )
            .u8(DATA_CIDR2, net.prefix_len()),
        };
        message.end()
    }

    /// `ipset destroy NAME`; false when it did not exist.
    pub fn destroy(&mut self, name: &str) -> io::Result<bool> {
        // With NLM_F_EXCL the kernel says ENOENT for a set that does not
        // exist (without it, destroying nothing succeeds), so the answer
        // tells whether there was a set.
        let message =
            request(CMD_DESTROY, NFPROTO_UNSPEC, NLM_F_ACK | NLM_F_EXCL).string(ATTR_SETNAME, name);
        match self
            .channel
            .execute(vec![message])
            .map_err(BatchFailure::into_first)
        {
            Ok(()) => Ok(true),
            Err(BatchError { error, .. }) if error.errno() == Some(ENOENT) => Ok(false),
            Err(BatchError { error, .. }) => Err(describe_error(error.into(), None)),
        }
    }

    /// Sends ipset requests in batches.
    pub fn execute(&mut self, requests: Vec<Message>) -> Result<(), BatchFailure> {
        self.channel.execute(requests)
    }
}

/// The kernel's answer to an ipset request in words: ipset answers with
/// its own codes above 4096 (include/uapi/linux/netfilter/ipset/ip_set.h),
/// which `strerror` does not know. `set_type` tells the type-specific codes
/// apart. Other codes are left to the system's text.
pub fn describe_error(error: io::Error, set_type: Option<SetType>) -> io::Error {
    let Some(code) = error.raw_os_error() else {
        return error;
    };
    let text = match (code, set_type) {
        (IPSET_ERR_BUSY, _) => "the set is in use by a kernel component (an iptables rule)",
        (IPSET_ERR_EXIST, _) => "the element is already in the set, or not in it for a delete",
        (IPSET_ERR_REFERENCED, _) => "the set is referenced by another set",
        (IPSET_ERR_TYPE_SPECIFIC, Some(SetType::BitmapPort)) => {
            "the port is outside the bitmap's range"
        }
        (IPSET_ERR_TYPE_SPECIFIC, Some(_)) => "the set is full (it holds maxelem 65536 elements)",
        (code, _) if code > IPSET_ERR_PRIVATE => "ipset refused the request",
        _ => return error,
    };
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{text} (ipset error {code})"),
    )
}

fn request(cmd: u8, family: u8, flags: u16) -> Message {
    nfnetlink::request(SUBSYS_IPSET, cmd, family, flags).u8(ATTR_PROTOCOL, PROTOCOL)
}

fn nfproto(family: IpFamily) -> u8 {
    match family {
        IpFamily::V4 => NFPROTO_IPV4,
        IpFamily::V6 => NFPROTO_IPV6,
    }
}

fn address(message: Message, attr: u16, ip: IpAddr) -> Message {
    let message = message.begin(attr);
    let message = match ip {
        IpAddr::V4(v4) => message.attr(IPADDR_IPV4 | NLA_F_NET_BYTEORDER, &v4.octets()),
        IpAddr::V6(v6) => message.attr(IPADDR_IPV6 | NLA_F_NET_BYTEORDER, &v6.octets()),
    };
    message.end()
}

fn parse_address(nested: &[u8]) -> Option<IpAddr> {
    Attributes::new(nested).find_map(|(kind, value)| match kind {
        IPADDR_IPV4 => {
            let octets: [u8; 4] = value.get(..4)?.try_into().ok()?;
            Some(IpAddr::V4(Ipv4Addr::from(octets)))
        }
        IPADDR_IPV6 => {
            let octets: [u8; 16] = value.get(..16)?.try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(octets)))
        }
        _ => None,
    })
}

/// One listed member of a set of `set_type`.
fn parse_entry(data: &[u8], set_type: SetType) -> Option<SetEntry> {
    let mut ip = None;
    let mut ip2 = None;
    let mut port = None;
    let mut proto = None;
    let mut cidr2 = None;
    for (kind, value) in Attributes::new(data) {
        match kind {
            DATA_IP => ip = parse_address(value),
            DATA_IP2 => ip2 = parse_address(value),
            DATA_PORT => port = value.get(..2).map(|b| u16::from_be_bytes([b[0], b[1]])),
            DATA_PROTO => proto = value.first().and_then(|n| protocol_of(u16::from(*n))),
            DATA_CIDR2 => cidr2 = value.first().copied(),
            _ => {}
        }
    }
    Some(match set_type {
        SetType::HashIp => SetEntry::Ip(ip?),
        SetType::BitmapPort => SetEntry::Port(port?),
        SetType::HashIpPort => SetEntry::IpPort(ip?, proto?, port?),
        SetType::HashIpPortIp => SetEntry::IpPortIp(ip?, proto?, port?, ip2?),
        SetType::HashIpPortNet => {
            let net = IpNet::new(ip2?, cidr2?).ok()?;
            SetEntry::IpPortNet(ip?, proto?, port?, net)
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn every_entry_kind_reads_back_from_its_add_message() {
        let entries = [
            (
                SetKind::IpvsIps,
                SetEntry::Ip("10.96.0.41".parse().unwrap()),
            ),
            (SetKind::NodePortTcp, SetEntry::Port(30080)),
            (
                SetKind::ClusterIp,
                SetEntry::IpPort("10.96.0.41".parse().unwrap(), Protocol::Sctp, 80),
            ),
            (
                SetKind::LoopBack,
                SetEntry::IpPortIp(
                    "10.244.1.2".parse().unwrap(),
                    Protocol::Tcp,
                    8080,
                    "10.244.1.2".parse().unwrap(),
                ),
            ),
            (
                SetKind::LoadBalancerSourceCidr,
                SetEntry::IpPortNet(
                    "fd00::7".parse().unwrap(),
                    Protocol::Udp,
                    53,
                    "fd00:192:168:99::/64".parse().unwrap(),
                ),
            ),
        ];
        for (kind, entry) in entries {
            let bytes = IpsetNetlink::entry_message(kind, IpFamily::V4, &entry, true)
                .finish(1)
                .unwrap();
            let answer = kp_netlink::messages(&bytes).next().unwrap();
            assert_eq!(answer.kind, nfnetlink::message_type(SUBSYS_IPSET, CMD_ADD));
            let data = kp_netlink::find(&answer.payload[4..], ATTR_DATA).unwrap();
            assert_eq!(parse_entry(data, kind.set_type()), Some(entry), "{entry}");
        }
    }

    #[test]
    fn ipsets_own_error_codes_are_said_in_words() {
        let full = describe_error(
            io::Error::from_raw_os_error(IPSET_ERR_TYPE_SPECIFIC),
            Some(SetType::HashIpPortNet),
        );
        assert_eq!(
            full.to_string(),
            "the set is full (it holds maxelem 65536 elements) (ipset error 4352)"
        );
        let range = describe_error(
            io::Error::from_raw_os_error(IPSET_ERR_TYPE_SPECIFIC),
            Some(SetType::BitmapPort),
        );
        assert!(range.to_string().contains("bitmap's range"), "{range}");
        let busy = describe_error(io::Error::from_raw_os_error(IPSET_ERR_BUSY), None);
        assert!(busy.to_string().contains("in use"), "{busy}");
        let plain = describe_error(io::Error::from_raw_os_error(2), None);
        assert_eq!(
            plain.raw_os_error(),
            Some(2),
            "errno codes keep their own text"
        );
    }
}
