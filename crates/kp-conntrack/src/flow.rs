//! Conntrack entries ("flows") as the cleaner sees them: the protocol, the
//! original and the reply tuple, and the zone.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use kp_model::IpFamily;

/// IANA protocol number of TCP.
pub const IPPROTO_TCP: u8 = 6;
/// IANA protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;
/// IANA protocol number of SCTP.
pub const IPPROTO_SCTP: u8 = 132;

/// One conntrack entry, as `conntrack -L` prints it.
///
/// For a flow DNATed by a Service rule, `original.dst` is the Service's
/// address (ClusterIP, external or load balancer IP, or a node address for a
/// NodePort) and `reply.src` is the endpoint the kernel sends the flow to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Flow {
    /// IANA protocol number ([`IPPROTO_UDP`], …).
    pub protocol: u8,
    /// The tuple of the first packet (`src=… dst=… sport=… dport=…`).
    pub original: FlowTuple,
    /// The tuple replies carry (after NAT: `src` is the real destination).
    pub reply: FlowTuple,
    /// The conntrack zone (`zone=N`); 0, the default zone, when absent.
    pub zone: u16,
}

/// Addresses and ports of one direction of a flow. Protocols without ports
/// (ICMP) have port 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowTuple {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
}

impl Flow {
    /// A UDP flow from `client` to `service`, sent on to `endpoint` (the
    /// reply comes from `endpoint` to `client`), in the default zone.
    pub fn udp(client: SocketAddr, service: SocketAddr, endpoint: SocketAddr) -> Self {
        Self {
            protocol: IPPROTO_UDP,
            original: FlowTuple::new(client, service),
            reply: FlowTuple::new(endpoint, client),
            zone: 0,
        }
    }

    /// The family of the flow's addresses.
    pub fn family(&self) -> IpFamily {
        IpFamily::of(&self.original.src)
    }

    /// Where the flow was sent to (`--orig-dst`, `--orig-port-dst`).
    pub fn original_destination(&self) -> SocketAddr {
        SocketAddr::new(self.original.dst, self.original.dst_port)
    }

    /// Where replies come from (`--reply-src`, `--reply-port-src`): the
    /// endpoint, for a DNATed flow.
    pub fn reply_source(&self) -> SocketAddr {
        SocketAddr::new(self.reply.src, self.reply.src_port)
    }
}

impl FlowTuple {
    /// The tuple of a packet from `src` to `dst`.
    pub fn new(src: SocketAddr, dst: SocketAddr) -> Self {
        Self {
            src: src.ip(),
            dst: dst.ip(),
            src_port: src.port(),
            dst_port: dst.port(),
        }
    }
}

impl fmt::Display for Flow {
    /// `conntrack -L` style: `udp src=… dst=… sport=… dport=… src=… …`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.protocol {
            IPPROTO_TCP => f.write_str("tcp")?,
            IPPROTO_UDP => f.write_str("udp")?,
            IPPROTO_SCTP => f.write_str("sctp")?,
            other => write!(f, "proto-{other}")?,
        }
        write!(f, " {} {}", self.original, self.reply)?;
        if self.zone != 0 {
            write!(f, " zone={}", self.zone)?;
        }
        Ok(())
    }
}

impl fmt::Display for FlowTuple {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "src={} dst={} sport={} dport={}",
            self.src, self.dst, self.src_port, self.dst_port
        )
    }
}
