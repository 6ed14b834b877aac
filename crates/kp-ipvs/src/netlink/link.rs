//! The dummy link `kube-ipvs0` and its addresses over rtnetlink, as
//! `ip link add kube-ipvs0 type dummy` and `ip addr add|del` do it:
//!
//! ```text
//! RTM_NEWLINK=16 RTM_DELLINK=17 RTM_GETLINK=18  ifinfomsg (16 bytes):
//!   family u8 | pad u8 | type u16 | index i32 | flags u32 | change u32
//!   IFLA_IFNAME=3 string | IFLA_LINKINFO=18 { IFLA_INFO_KIND=1 "dummy" }
//! RTM_NEWADDR=20 RTM_DELADDR=21 RTM_GETADDR=22  ifaddrmsg (8 bytes):
//!   family u8 | prefixlen u8 | flags u8 | scope u8 | index u32
//!   IFA_ADDRESS=1 | IFA_LOCAL=2 (address bytes)
//! ```
//! The link stays down, as upstream leaves it: the kernel adds the local
//! route of an address whether or not its link is up.

use std::collections::BTreeSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kp_model::IpFamily;
use kp_netlink::{
    Attributes, BatchError, BatchFailure, Channel, Message, NETLINK_ROUTE, NLM_F_ACK, NLM_F_CREATE,
    NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE,
};

use crate::netlink::malformed;
use crate::state::DUMMY_LINK;

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_GETADDR: u16 = 22;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
/// `IFA_F_NODAD`: no duplicate address detection for IPv6 service addresses.
const IFA_F_NODAD: u8 = 0x02;
const ENODEV: i32 = 19;
const EEXIST: i32 = 17;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// kube-ipvs0 in the network namespace of the thread that first uses it.
#[derive(Debug)]
pub struct DummyLink {
    channel: Channel,
}

impl Default for DummyLink {
    fn default() -> Self {
        Self::new()
    }
}

impl DummyLink {
    /// A handle that opens its socket on first use.
    pub fn new() -> Self {
        Self {
            channel: Channel::new(NETLINK_ROUTE),
        }
    }

    /// Requests sent so far.
    pub fn messages(&self) -> u64 {
        self.channel.messages()
    }

    /// The interface index of kube-ipvs0, `None` when it does not exist
    /// (`ip link show kube-ipvs0`).
    pub fn index(&mut self) -> io::Result<Option<u32>> {
        let request = Message::new(RTM_GETLINK, NLM_F_ACK)
            .raw(&[0u8; 16])
            .string(IFLA_IFNAME, DUMMY_LINK);
        match self.channel.ask(request) {
            Ok(reply) => {
                let index = reply
                    .payload()
                    .get(4..8)
                    .and_then(kp_netlink::read_u32)
                    .ok_or_else(|| malformed("link answer without an index"))?;
                Ok(Some(index))
            }
            Err(error) if error.errno() == Some(ENODEV) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// `ip link add kube-ipvs0 type dummy`. A link that exists already is
    /// success: the proxier of the other IP family shares it, and may have
    /// created it since this one listed the kernel.
    pub fn create(&mut self) -> Result<(), BatchError> {
        let request = Message::new(RTM_NEWLINK, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL)
            .raw(&[0u8; 16])
            .string(IFLA_IFNAME, DUMMY_LINK)
            .begin(IFLA_LINKINFO)
            .string(IFLA_INFO_KIND, "dummy")
            .end();
        match self
            .channel
            .execute(vec![request])
            .map_err(BatchFailure::into_first)
        {
            Err(BatchError { error, .. }) if error.errno() == Some(EEXIST) => Ok(()),
            other => other,
        }
    }

    /// `ip link del kube-ipvs0`; false when it did not exist.
    pub fn delete(&mut self) -> io::Result<bool> {
        let request = Message::new(RTM_DELLINK, NLM_F_ACK)
            .raw(&[0u8; 16])
            .string(IFLA_IFNAME, DUMMY_LINK);
        match self
            .channel
            .execute(vec![request])
            .map_err(BatchFailure::into_first)
        {
            Ok(()) => Ok(true),
            Err(BatchError { error, .. }) if error.errno() == Some(ENODEV) => Ok(false),
            Err(BatchError { error, .. }) => Err(error.into()),
        }
    }

    /// The addresses of `family` on the link with `index`
    /// (`ip addr show dev kube-ipvs0`).
    pub fn addresses(&mut self, index: u32, family: IpFamily) -> io::Result<BTreeSet<IpAddr>> {
        let request = Message::new(RTM_GETADDR, NLM_F_DUMP).raw(&[af(family), 0, 0, 0, 0, 0, 0, 0]);
        let mut addresses = BTreeSet::new();
        for reply in self.channel.dump_all(request)? {
            let payload = reply.payload();
            if payload.get(4..8).and_then(kp_netlink::read_u32) != Some(index) {
                continue;
            }
            let wanted = if family == IpFamily::V4 {
                IFA_LOCAL
            } else {
                IFA_ADDRESS
            };
            let address = Attributes::new(payload.get(8..).unwrap_or_default())
                .find(|(kind, _)| *kind == wanted)
                .and_then(|(_, value)| address_of(value));
            addresses.extend(address);
        }
        Ok(addresses)
    }

    /// `ip addr add|del ADDRESS/32 dev kube-ipvs0` (/128 for IPv6).
    pub fn address_message(index: u32, address: IpAddr, add: bool) -> Message {
        let (family, prefix, flags, bytes) = match address {
            IpAddr::V4(v4) => (AF_INET, 32, 0, v4.octets().to_vec()),
            IpAddr::V6(v6) => (AF_INET6, 128, IFA_F_NODAD, v6.octets().to_vec()),
        };
        let mut header = vec![family, prefix, flags, 0];
        header.extend_from_slice(&index.to_ne_bytes());
        let (kind, request_flags) = if add {
            (RTM_NEWADDR, NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE)
        } else {
            (RTM_DELADDR, NLM_F_ACK)
        };
        Message::new(kind, request_flags)
            .raw(&header)
            .attr(IFA_LOCAL, &bytes)
            .attr(IFA_ADDRESS, &bytes)
    }

    /// Sends address requests in batches.
    pub fn execute(&mut self, requests: Vec<Message>) -> Result<(), BatchFailure> {
        self.channel.execute(requests)
    }
}

fn af(family: IpFamily) -> u8 {
    match family {
        IpFamily::V4 => AF_INET,
        IpFamily::V6 => AF_INET6,
    }
}

fn address_of(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => {
            let octets: [u8; 4] = bytes.try_into().ok()?;
            Some(IpAddr::V4(Ipv4Addr::from(octets)))
        }
        16 => {
            let octets: [u8; 16] = bytes.try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(octets)))
        }
        _ => None,
    }
}
