//! IPVS over generic netlink (family `IPVS`, version 1), as `ipvsadm` and
//! libipvs speak it (include/uapi/linux/ip_vs.h):
//!
//! ```text
//! genlmsghdr  cmd u8 | version u8 = 1 | reserved u16
//! cmds        NEW_SERVICE=1 SET_SERVICE=2 DEL_SERVICE=3 GET_SERVICE=4
//!             NEW_DEST=5 SET_DEST=6 DEL_DEST=7 GET_DEST=8 SET_CONFIG=12
//! CMD_ATTR    SERVICE=1 (nested) DEST=2 (nested) TIMEOUT_TCP=4
//!             TIMEOUT_TCP_FIN=5 TIMEOUT_UDP=6 (u32 seconds)
//! SVC_ATTR    AF=1 u16 | PROTOCOL=2 u16 | ADDR=3 16 bytes | PORT=4 be16
//!             FWMARK=5 u32 | SCHED_NAME=6 string | FLAGS=7 {flags, mask}
//!             TIMEOUT=8 u32 | NETMASK=9 u32
//! DEST_ATTR   ADDR=1 16 bytes | PORT=2 be16 | FWD_METHOD=3 u32 (0 = masq)
//!             WEIGHT=4 u32 | U_THRESH=5 | L_THRESH=6 | ACTIVE_CONNS=7
//!             INACT_CONNS=8
//! ```
//! A new service must carry every one of AF, address, protocol, port,
//! scheduler, flags, timeout and netmask; a new destination its address,
//! port, forwarding method, weight and both thresholds.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use kp_model::{IpFamily, Protocol};
use kp_netlink::{
    Attributes, BatchFailure, Channel, Message, NETLINK_GENERIC, NLM_F_ACK, NLM_F_DUMP,
};

use crate::netlink::malformed;
use crate::state::{ServiceKey, VirtualServer, FLAG_HASHED};

const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;

const CMD_NEW_SERVICE: u8 = 1;
const CMD_SET_SERVICE: u8 = 2;
const CMD_DEL_SERVICE: u8 = 3;
const CMD_GET_SERVICE: u8 = 4;
const CMD_NEW_DEST: u8 = 5;
const CMD_SET_DEST: u8 = 6;
const CMD_DEL_DEST: u8 = 7;
const CMD_GET_DEST: u8 = 8;
const CMD_SET_CONFIG: u8 = 12;

const ATTR_SERVICE: u16 = 1;
const ATTR_DEST: u16 = 2;
const ATTR_TIMEOUT_TCP: u16 = 4;
const ATTR_TIMEOUT_TCP_FIN: u16 = 5;
const ATTR_TIMEOUT_UDP: u16 = 6;

const SVC_AF: u16 = 1;
const SVC_PROTOCOL: u16 = 2;
const SVC_ADDR: u16 = 3;
const SVC_PORT: u16 = 4;
const SVC_FWMARK: u16 = 5;
const SVC_SCHED_NAME: u16 = 6;
const SVC_FLAGS: u16 = 7;
const SVC_TIMEOUT: u16 = 8;
const SVC_NETMASK: u16 = 9;

const DEST_ADDR: u16 = 1;
const DEST_PORT: u16 = 2;
const DEST_FWD_METHOD: u16 = 3;
const DEST_WEIGHT: u16 = 4;
const DEST_U_THRESH: u16 = 5;
const DEST_L_THRESH: u16 = 6;
const DEST_ACTIVE_CONNS: u16 = 7;
const DEST_INACT_CONNS: u16 = 8;

/// `IP_VS_CONN_F_MASQ`: NAT to the real server.
const FWD_MASQ: u32 = 0;
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

/// A real server as the kernel lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedDest {
    /// Address and port.
    pub address: SocketAddr,
    /// Weight.
    pub weight: u32,
    /// Active plus inactive connections.
    pub connections: u32,
}

/// The IPVS table of the network namespace of the thread that first uses
/// it.
#[derive(Debug)]
pub struct IpvsNetlink {
    channel: Channel,
    family_id: Option<u16>,
}

impl Default for IpvsNetlink {
    fn default() -> Self {
        Self::new()
    }
}

impl IpvsNetlink {
    /// A handle that resolves the `IPVS` family on first use.
    pub fn new() -> Self {
        Self {
            channel: Channel::new(NETLINK_GENERIC),
            family_id: None,
        }
    }

    /// A handle that takes `id` for the `IPVS` family instead of asking
    /// the kernel (tests of message building on a kernel without IPVS).
    #[cfg(test)]
    pub(crate) fn with_family_id(id: u16) -> Self {
        Self {
            channel: Channel::new(NETLINK_GENERIC),
            family_id: Some(id),
        }
    }

    /// Requests sent so far.
    pub fn messages(&self) -> u64 {
        self.channel.messages()
    }

    /// The generic netlink id of the `IPVS` family; `NotFound` with a
    /// clear message when the kernel has no IPVS.
    fn family(&mut self) -> io::Result<u16> {
        if let Some(id) = self.family_id {
            return Ok(id);
        }
        let request = Message::new(GENL_ID_CTRL, NLM_F_ACK)
            .raw(&[CTRL_CMD_GETFAMILY, 1, 0, 0])
            .string(CTRL_ATTR_FAMILY_NAME, "IPVS");
        let reply = self.channel.ask(request).map_err(|error| {
            if error.errno() == Some(2) {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    "the kernel has no IPVS (generic netlink family IPVS not found; is the ip_vs module loaded?)",
                )
            } else {
                error.into()
            }
        })?;
        let id = kp_netlink::find(
            reply.payload().get(4..).unwrap_or_default(),
            CTRL_ATTR_FAMILY_ID,
        )
        .and_then(kp_netlink::read_u16)
        .ok_or_else(|| malformed("no family id"))?;
        self.family_id = Some(id);
        Ok(id)
    }

    fn request(&mut self, cmd: u8, flags: u16) -> io::Result<Message> {
        Ok(Message::new(self.family()?, flags).raw(&[cmd, 1, 0, 0]))
    }

    /// Every virtual server of `family` (all families with `None`),
    /// without firewall-mark services (`ipvsadm -Ln`).
    pub fn list_services(
        &mut self,
        family: Option<IpFamily>,
    ) -> io::Result<Vec<(ServiceKey, VirtualServer)>> {
        let request = self.request(CMD_GET_SERVICE, NLM_F_DUMP)?;
        let mut services = Vec::new();
        for reply in self.channel.dump_all(request)? {
            let payload = reply.payload();
            let Some(service) =
                kp_netlink::find(payload.get(4..).unwrap_or_default(), ATTR_SERVICE)
            else {
                continue;
            };
            if let Some((key, server)) = parse_service(service) {
                if family.is_none_or(|f| f.matches(&key.address)) {
                    services.push((key, server));
                }
            }
        }
        Ok(services)
    }

    /// The real servers of `service` (`ipvsadm -Ln -t SERVICE`).
    pub fn list_dests(&mut self, service: &ServiceKey) -> io::Result<Vec<ListedDest>> {
        let request = self.request(CMD_GET_DEST, NLM_F_DUMP)?;
        let request = service_attr(request, service, None);
        let mut dests = Vec::new();
        for reply in self.channel.dump_all(request)? {
            let payload = reply.payload();
            let Some(dest) = kp_netlink::find(payload.get(4..).unwrap_or_default(), ATTR_DEST)
            else {
                continue;
            };
            if let Some(dest) = parse_dest(dest, IpFamily::of(&service.address)) {
                dests.push(dest);
            }
        }
        Ok(dests)
    }

    /// `ipvsadm -A/-E/-D` and `-a/-e/-d` as messages, sent in batches.
    pub fn execute(&mut self, requests: Vec<Message>) -> Result<(), BatchFailure> {
        self.channel.execute(requests)
    }

    /// `ipvsadm -A -t SERVICE -s SCHEDULER …` (`update`: `-E`).
    pub fn service_message(
        &mut self,
        key: &ServiceKey,
        server: &VirtualServer,
        update: bool,
    ) -> io::Result<Message> {
        let cmd = if update {
            CMD_SET_SERVICE
        } else {
            CMD_NEW_SERVICE
        };
        Ok(service_attr(
            self.request(cmd, NLM_F_ACK)?,
            key,
            Some(server),
        ))
    }

    /// `ipvsadm -D -t SERVICE`.
    pub fn delete_service_message(&mut self, key: &ServiceKey) -> io::Result<Message> {
        Ok(service_attr(
            self.request(CMD_DEL_SERVICE, NLM_F_ACK)?,
            key,
            None,
        ))
    }

    /// `ipvsadm -a|-e -t SERVICE -r REAL -m -w WEIGHT` (`-d` without weight).
    pub fn dest_message(
        &mut self,
        key: &ServiceKey,
        real: SocketAddr,
        weight: Option<u32>,
        update: bool,
    ) -> io::Result<Message> {
        let cmd = match (weight, update) {
            (None, _) => CMD_DEL_DEST,
            (Some(_), false) => CMD_NEW_DEST,
            (Some(_), true) => CMD_SET_DEST,
        };
        let request = service_attr(self.request(cmd, NLM_F_ACK)?, key, None)
            .begin(ATTR_DEST)
            .attr(DEST_ADDR, &address_bytes(real.ip()))
            .attr(DEST_PORT, &real.port().to_be_bytes());
        let request = match weight {
            Some(weight) => request
                .u32(DEST_FWD_METHOD, FWD_MASQ)
                .u32(DEST_WEIGHT, weight)
                .u32(DEST_U_THRESH, 0)
                .u32(DEST_L_THRESH, 0),
            None => request,
        };
        Ok(request.end())
    }

    /// `ipvsadm --set TCP TCPFIN UDP`; zero leaves a value unchanged.
    pub fn set_timeouts(
        &mut self,
        tcp: Duration,
        tcp_fin: Duration,
        udp: Duration,
    ) -> io::Result<()> {
        let mut request = self.request(CMD_SET_CONFIG, NLM_F_ACK)?;
        for (attr, value) in [
            (ATTR_TIMEOUT_TCP, tcp),
            (ATTR_TIMEOUT_TCP_FIN, tcp_fin),
            (ATTR_TIMEOUT_UDP, udp),
        ] {
            if !value.is_zero() {
                request = request.u32(attr, u32::try_from(value.as_secs()).unwrap_or(u32::MAX));
            }
        }
        self.channel
            .execute(vec![request])
            .map_err(|failure| failure.into_first().error.into())
    }
}

/// Connections per real server, from a destination listing.
pub fn connections(dests: &[ListedDest]) -> BTreeMap<SocketAddr, u32> {
    dests.iter().map(|d| (d.address, d.connections)).collect()
}

/// The `IPVS_CMD_ATTR_SERVICE` attribute: the key, and with `server` the
/// settings a new or changed service needs.
fn service_attr(request: Message, key: &ServiceKey, server: Option<&VirtualServer>) -> Message {
    let (af, netmask) = match key.address {
        IpAddr::V4(_) => (AF_INET, u32::MAX),
        IpAddr::V6(_) => (AF_INET6, 128),
    };
    let request = request
        .begin(ATTR_SERVICE)
        .u16(SVC_AF, af)
        .u16(SVC_PROTOCOL, protocol_number(key.protocol))
        .attr(SVC_ADDR, &address_bytes(key.address))
        .attr(SVC_PORT, &key.port.to_be_bytes());
    let request = match server {
        Some(server) => {
            let mut flags = [0u8; 8];
            flags[..4].copy_from_slice(&server.flags.to_ne_bytes());
            flags[4..].copy_from_slice(&u32::MAX.to_ne_bytes());
            request
                .string(SVC_SCHED_NAME, &server.scheduler)
                .attr(SVC_FLAGS, &flags)
                .u32(SVC_TIMEOUT, server.timeout_secs)
                .u32(SVC_NETMASK, netmask)
        }
        None => request,
    };
    request.end()
}

fn parse_service(attrs: &[u8]) -> Option<(ServiceKey, VirtualServer)> {
    let mut af = None;
    let mut protocol = None;
    let mut address = None;
    let mut port = None;
    let mut scheduler = String::new();
    let mut flags = 0;
    let mut timeout_secs = 0;
    for (kind, value) in Attributes::new(attrs) {
        match kind {
            SVC_AF => af = kp_netlink::read_u16(value),
            SVC_PROTOCOL => protocol = kp_netlink::read_u16(value).and_then(protocol_of),
            SVC_ADDR => address = Some(value.to_vec()),
            SVC_PORT => port = value.get(..2).map(|b| u16::from_be_bytes([b[0], b[1]])),
            SVC_FWMARK if kp_netlink::read_u32(value).unwrap_or(0) != 0 => return None,
            SVC_SCHED_NAME => scheduler = kp_netlink::read_string(value),
            SVC_FLAGS => flags = kp_netlink::read_u32(value).unwrap_or(0) & !FLAG_HASHED,
            SVC_TIMEOUT => timeout_secs = kp_netlink::read_u32(value).unwrap_or(0),
            _ => {}
        }
    }
    let family = match af? {
        AF_INET => IpFamily::V4,
        AF_INET6 => IpFamily::V6,
        _ => return None,
    };
    let key = ServiceKey {
        address: address_of(&address?, family)?,
        protocol: protocol?,
        port: port?,
    };
    Some((
        key,
        VirtualServer {
            scheduler,
            flags,
            timeout_secs,
        },
    ))
}

fn parse_dest(attrs: &[u8], family: IpFamily) -> Option<ListedDest> {
    let mut address = None;
    let mut port = None;
    let mut weight = 0;
    let mut connections = 0u32;
    for (kind, value) in Attributes::new(attrs) {
        match kind {
            DEST_ADDR => address = address_of(value, family),
            DEST_PORT => port = value.get(..2).map(|b| u16::from_be_bytes([b[0], b[1]])),
            DEST_WEIGHT => weight = kp_netlink::read_u32(value).unwrap_or(0),
            DEST_ACTIVE_CONNS | DEST_INACT_CONNS => {
                connections = connections.saturating_add(kp_netlink::read_u32(value).unwrap_or(0));
            }
            _ => {}
        }
    }
    Some(ListedDest {
        address: SocketAddr::new(address?, port?),
        weight,
        connections,
    })
}

/// The 16 bytes of `union nf_inet_addr`.
fn address_bytes(address: IpAddr) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    match address {
        IpAddr::V4(v4) => bytes[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => bytes.copy_from_slice(&v6.octets()),
    }
    bytes
}

fn address_of(bytes: &[u8], family: IpFamily) -> Option<IpAddr> {
    match family {
        IpFamily::V4 => {
            let octets: [u8; 4] = bytes.get(..4)?.try_into().ok()?;
            Some(IpAddr::V4(Ipv4Addr::from(octets)))
        }
        IpFamily::V6 => {
            let octets: [u8; 16] = bytes.get(..16)?.try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(octets)))
        }
    }
}

/// `IPPROTO_TCP`, `IPPROTO_UDP`, `IPPROTO_SCTP`.
pub fn protocol_number(protocol: Protocol) -> u16 {
    match protocol {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

/// The protocol of `IPPROTO_*` `number`, of those Services use.
pub fn protocol_of(number: u16) -> Option<Protocol> {
    match number {
        6 => Some(Protocol::Tcp),
        17 => Some(Protocol::Udp),
        132 => Some(Protocol::Sctp),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_service_attribute_reads_back_as_the_same_service() {
        let key = ServiceKey {
            address: "fd00:10:96::41".parse().unwrap(),
            protocol: Protocol::Udp,
            port: 53,
        };
        let server = VirtualServer {
            scheduler: "mh".into(),
            flags: 0x11,
            timeout_secs: 600,
        };
        let bytes = service_attr(Message::new(30, 0).raw(&[1, 1, 0, 0]), &key, Some(&server))
            .finish(1)
            .unwrap();
        let answer = kp_netlink::messages(&bytes).next().unwrap();
        let service = kp_netlink::find(&answer.payload[4..], ATTR_SERVICE).unwrap();
        assert_eq!(parse_service(service), Some((key, server)));
        // The port is in network byte order.
        let port = kp_netlink::find(service, SVC_PORT).unwrap();
        assert_eq!(port, [0, 53]);
    }
}
