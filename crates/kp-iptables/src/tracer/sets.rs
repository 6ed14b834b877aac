//! ipset membership, given to the tracer as input: the sets live in the
//! kernel beside the rules, and `-m set --match-set` asks them.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use kp_model::Protocol;

use super::parse::SetFlag;

/// The members of the ipsets the rules refer to, by set name
/// (`ipset list NAME` shows the same).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IpSets {
    sets: BTreeMap<String, IpSetMembers>,
}

/// The members of one set, by its type.
#[derive(Debug, Clone, PartialEq)]
pub enum IpSetMembers {
    /// `hash:ip` or `hash:net`: one address dimension.
    Addresses(Vec<IpNet>),
    /// `hash:ip,port`: an address and a protocol and port.
    AddressPorts(Vec<(IpAddr, Protocol, u16)>),
    /// `hash:ip,port,ip` or `hash:ip,port,net`: an address, a protocol and
    /// port, and a second address.
    AddressPortNets(Vec<(IpAddr, Protocol, u16, IpNet)>),
    /// `bitmap:port`: ports of any protocol.
    Ports(Vec<u16>),
}

/// What a `--match-set` lookup needs to know of the packet.
pub(crate) struct Lookup {
    pub(crate) src: IpAddr,
    pub(crate) dst: IpAddr,
    pub(crate) protocol: Protocol,
    pub(crate) dport: u16,
}

impl IpSets {
    /// No sets.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same sets with `name` holding `members`.
    pub fn with(mut self, name: &str, members: IpSetMembers) -> Self {
        self.sets.insert(name.to_owned(), members);
        self
    }

    /// Whether the packet is in set `name`, looked up with `flags` (`dst`,
    /// `dst,dst`, `src,dst`…); an error says why it cannot be told.
    pub(crate) fn contains(
        &self,
        name: &str,
        flags: &[SetFlag],
        packet: &Lookup,
    ) -> Result<bool, String> {
        let members = self
            .sets
            .get(name)
            .ok_or_else(|| format!("the members of ipset {name} were not given"))?;
        let address = |dimension: usize| match flags.get(dimension) {
            Some(SetFlag::Src) => Ok(packet.src),
            Some(SetFlag::Dst) => Ok(packet.dst),
            None => Err(format!("ipset {name} is matched with too few flags")),
        };
        let port = |dimension: usize| match flags.get(dimension) {
            Some(SetFlag::Dst) => Ok(packet.dport),
            Some(SetFlag::Src) => Err(format!(
                "ipset {name} is matched on the source port, which a trace does not have"
            )),
            None => Err(format!("ipset {name} is matched with too few flags")),
        };
        Ok(match members {
            IpSetMembers::Addresses(nets) => {
                let ip = address(0)?;
                nets.iter().any(|net| net.contains(&ip))
            }
            IpSetMembers::AddressPorts(entries) => {
                let (ip, port) = (address(0)?, port(1)?);
                entries.contains(&(ip, packet.protocol, port))
            }
            IpSetMembers::AddressPortNets(entries) => {
                let (ip, port, other) = (address(0)?, port(1)?, address(2)?);
                entries.iter().any(|(a, p, n, net)| {
                    (*a, *p, *n) == (ip, packet.protocol, port) && net.contains(&other)
                })
            }
            IpSetMembers::Ports(ports) => ports.contains(&port(0)?),
        })
    }
}
