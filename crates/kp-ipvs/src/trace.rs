//! Follows the first packet of a new connection through the IPVS mode's
//! live kernel state, as the kernel does: the nat rules of PREROUTING (a
//! received packet) or OUTPUT (a packet of this node), which mark Service
//! traffic for masquerading through the mode's ipsets; for a received
//! packet to an address of the node, filter INPUT (the NodePort, firewall
//! and source-range chains, `KUBE-IPVS-FILTER`); then IPVS, which at
//! LOCAL_IN (or LOCAL_OUT for the node's own packets) looks up the virtual
//! server of (protocol, destination, port) and sends the packet to one of
//! its real servers; then filter OUTPUT and nat POSTROUTING
//! (`KUBE-POSTROUTING`: masquerade by mark, and `KUBE-LOOP-BACK` for a pod
//! reaching itself).
//!
//! Every real server with a weight above 0 is a path, with the share of
//! the weights (the scheduler is named on the path; `rr` ignores weights,
//! but the mode gives every real server weight 1); a virtual server with
//! none makes the kernel answer ICMP port unreachable ([`PathVerdict::Reject`]);
//! no virtual server leaves the packet to the node's own sockets. The
//! iptables rules are followed by kp-iptables' tracer, which fails on a
//! rule of our `KUBE-*` chains it does not understand; a virtual server
//! whose settings this module does not model is an error naming it.
//!
//! A path's steps ([`PathOutcome::matched`]) are the iptables rules as
//! `table/CHAIN rule`, the virtual server as `ipvs: TCP 10.96.0.10:80 rr`
//! and the real server as `ipvs: real server 10.244.1.2:80 weight 1 of 2`;
//! persistence is the path's [`Affinity`], named by its virtual server.

use std::collections::BTreeSet;
use std::io;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use kp_iptables::tracer::{self as ipt, InFlight, IpSetMembers, IpSets, Ruleset, Verdict};
use kp_iptables::{IptablesFlavor, Table};
use kp_model::{IpFamily, Protocol};

use crate::kernel::{IpvsKernel, KernelError};
use crate::netlink::NetlinkKernel;
use crate::state::{
    KernelState, ServiceKey, ServiceState, SetEntry, SetKind, SetType, FLAG_HASHED,
    FLAG_PERSISTENT, FLAG_SOURCE_HASH,
};

/// The virtual server flags a trace understands: persistence and the
/// source-port hash of `mh`, which change neither the candidates nor
/// their shares.
const MODELLED_FLAGS: u32 = FLAG_PERSISTENT | FLAG_SOURCE_HASH | FLAG_HASHED;

/// What the kernel holds for the IPVS mode in one family.
#[derive(Debug, Clone)]
pub struct LiveState {
    /// The family.
    pub family: IpFamily,
    /// kube-ipvs0 and its addresses, the virtual servers with their real
    /// servers, the ipsets' members.
    pub kernel: KernelState,
    /// The node's addresses of the family (every interface's, kube-ipvs0's
    /// included or not: they are added).
    pub node_addresses: Vec<IpAddr>,
    /// The nat and filter tables.
    pub rules: Ruleset,
}

/// Why the live state could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// IPVS, the ipsets or kube-ipvs0 could not be listed.
    #[error("reading the IPVS mode's kernel objects failed")]
    Kernel(#[source] KernelError),
    /// The node's addresses could not be listed.
    #[error("listing the node's addresses failed")]
    Addresses(#[source] io::Error),
    /// The iptables rules could not be read.
    #[error("reading the IPVS mode's iptables rules failed")]
    Rules(#[source] ipt::TraceError),
}

pub use kp_sync::trace::{Affinity, Packet, PathOutcome, PathVerdict, Trace};

/// Why a packet could not be traced.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The packet is of the other family.
    #[error("the packet to {dst} is not {family}: the state read is of that family")]
    Family {
        /// The packet's destination.
        dst: IpAddr,
        /// The state's family.
        family: &'static str,
    },
    /// The iptables rules could not be followed.
    #[error(transparent)]
    Rules(#[from] ipt::TraceError),
    /// A virtual server the packet reaches has settings the trace does not
    /// model.
    #[error("IPVS virtual server {service}: {reason}; the trace does not follow it")]
    VirtualServer {
        /// The virtual server, e.g. `TCP 10.96.0.10:80`.
        service: String,
        /// What is not modelled.
        reason: String,
    },
}

/// What IPVS did with one branch of the packet.
enum Scheduled {
    /// No virtual server: the packet goes on unchanged.
    NotAService(InFlight),
    /// Sent to a real server.
    To(InFlight, Option<Affinity>),
    /// The virtual server has no real server to take it.
    Refused(InFlight, Option<Affinity>),
}

/// A finished path before its set members are looked up.
struct Finished {
    path: ipt::PathOutcome,
    affinity: Option<Affinity>,
    /// The destination IPVS looked up (the packet's view before it).
    at_ipvs: SocketAddr,
}

impl LiveState {
    /// Reads the state of `family` in the calling thread's network
    /// namespace: IPVS, the ipsets and kube-ipvs0 over netlink, the node's
    /// addresses, the nat and filter tables with the iptables flavor in
    /// use.
    pub fn read(family: IpFamily) -> Result<Self, ReadError> {
        Self::read_with(family, IptablesFlavor::detect())
    }

    /// [`Self::read`] with the iptables flavor given.
    pub fn read_with(family: IpFamily, flavor: IptablesFlavor) -> Result<Self, ReadError> {
        let kernel = NetlinkKernel::new()
            .list(family)
            .map_err(ReadError::Kernel)?;
        let node_addresses = kp_host::HostAddresses::new()
            .addresses()
            .map_err(|error| ReadError::Addresses(io::Error::other(error)))?
            .iter()
            .copied()
            .filter(|ip| family.matches(ip))
            .collect();
        let rules = Ruleset::from_live(flavor, family).map_err(ReadError::Rules)?;
        Ok(Self {
            family,
            kernel,
            node_addresses,
            rules,
        })
    }

    /// Every address local to the node: its own and kube-ipvs0's.
    fn local_ips(&self) -> Vec<IpAddr> {
        let mut local: BTreeSet<IpAddr> = self.node_addresses.iter().copied().collect();
        local.extend(self.kernel.addresses.iter().copied());
        local.into_iter().collect()
    }

    /// The ipsets' members as the iptables tracer asks them.
    fn ip_sets(&self) -> IpSets {
        let mut sets = IpSets::new();
        for (kind, members) in &self.kernel.sets {
            sets = sets.with(
                kind.name(self.family),
                set_members(kind.set_type(), members),
            );
        }
        sets
    }

    /// Follows `packet`: every path it can take.
    pub fn trace(&self, packet: &Packet) -> Result<Trace, TraceError> {
        if !self.family.matches(&packet.dst) {
            return Err(TraceError::Family {
                dst: packet.dst,
                family: self.family.as_api_str(),
            });
        }
        let tracer_packet = ipt::Packet {
            src: packet.src,
            dst: packet.dst,
            dport: packet.dport,
            protocol: packet.protocol,
            in_interface: packet.in_interface.clone(),
            local_origin: packet.src_local,
        };
        let run = Run {
            state: self,
            packet: &tracer_packet,
            local: self.local_ips(),
            sets: self.ip_sets(),
        };
        let mut finished = Vec::new();
        let nat_hook = if packet.src_local {
            "OUTPUT"
        } else {
            "PREROUTING"
        };
        for (flight, verdict, _) in run.hook(Table::Nat, nat_hook, InFlight::new(&tracer_packet))? {
            if verdict != Verdict::Accept {
                finished.push(run.end(flight, verdict, false, None));
            } else if packet.src_local {
                run.sent_by_node(flight, &mut finished)?;
            } else {
                run.received(flight, &mut finished)?;
            }
        }
        let paths = finished
            .into_iter()
            .map(|done| self.outcome(packet, done))
            .collect();
        Ok(Trace { paths })
    }

    fn outcome(&self, packet: &Packet, done: Finished) -> PathOutcome {
        let Finished {
            path,
            affinity,
            at_ipvs,
        } = done;
        let after = path.destination.unwrap_or(at_ipvs);
        let mut elements = Vec::new();
        let mut before_ipvs = true;
        for rule in &path.matched {
            if rule.starts_with("ipvs: ") {
                before_ipvs = false;
                continue;
            }
            let view = View {
                src: packet.src,
                dst: if before_ipvs { at_ipvs } else { after },
                protocol: packet.protocol,
            };
            for (name, flags) in set_matches(rule) {
                let Some((kind, family)) = SetKind::from_name(name) else {
                    continue;
                };
                if family != self.family {
                    continue;
                }
                for entry in self.kernel.entries(kind) {
                    if member_matches(entry, &flags, &view) {
                        let element = format!("{name}: {entry}");
                        if !elements.contains(&element) {
                            elements.push(element);
                        }
                    }
                }
            }
        }
        let mut all_affinity: Vec<Affinity> = affinity.into_iter().collect();
        all_affinity.extend(path.affinity.iter().map(|recent| Affinity {
            name: recent.list.clone(),
            timeout_secs: recent.seconds.unwrap_or(0),
        }));
        PathOutcome {
            destination: path.destination,
            verdict: match path.verdict {
                Verdict::Accept => PathVerdict::Accept,
                Verdict::Drop => PathVerdict::Drop,
                Verdict::Reject => PathVerdict::Reject,
            },
            masqueraded: path.masqueraded,
            probability: path.probability,
            matched: path.matched,
            elements,
            affinity: all_affinity,
            not_followed: path.not_followed,
        }
    }
}

/// One trace in progress.
struct Run<'a> {
    state: &'a LiveState,
    packet: &'a ipt::Packet,
    local: Vec<IpAddr>,
    sets: IpSets,
}

impl Run<'_> {
    fn hook(
        &self,
        table: Table,
        hook: &str,
        flight: InFlight,
    ) -> Result<Vec<(InFlight, Verdict, bool)>, TraceError> {
        Ok(self
            .state
            .rules
            .run_hook(table, hook, self.packet, flight, &self.local, &self.sets)?)
    }

    fn is_local(&self, ip: IpAddr) -> bool {
        ip.is_loopback() || self.local.contains(&ip)
    }

    fn end(
        &self,
        flight: InFlight,
        verdict: Verdict,
        masqueraded: bool,
        affinity: Option<Affinity>,
    ) -> Finished {
        let at_ipvs = flight.destination();
        self.end_at(flight, verdict, masqueraded, affinity, at_ipvs)
    }

    fn end_at(
        &self,
        flight: InFlight,
        verdict: Verdict,
        masqueraded: bool,
        affinity: Option<Affinity>,
        at_ipvs: SocketAddr,
    ) -> Finished {
        Finished {
            path: flight.finish(verdict, masqueraded),
            affinity,
            at_ipvs,
        }
    }

    /// A received packet after nat PREROUTING: to an address of the node,
    /// filter INPUT and IPVS at LOCAL_IN; otherwise routed on.
    fn received(&self, flight: InFlight, out: &mut Vec<Finished>) -> Result<(), TraceError> {
        if !self.is_local(flight.destination().ip()) {
            for (flight, verdict, _) in self.hook(Table::Filter, "FORWARD", flight)? {
                self.postrouting(flight, verdict, None, None, out)?;
            }
            return Ok(());
        }
        for (flight, verdict, _) in self.hook(Table::Filter, "INPUT", flight)? {
            if verdict != Verdict::Accept {
                out.push(self.end(flight, verdict, false, None));
                continue;
            }
            let at_ipvs = flight.destination();
            for scheduled in self.schedule(flight)? {
                match scheduled {
                    Scheduled::NotAService(flight) => {
                        out.push(self.end(flight, Verdict::Accept, false, None));
                    }
                    Scheduled::Refused(flight, affinity) => {
                        out.push(self.end_at(flight, Verdict::Reject, false, affinity, at_ipvs));
                    }
                    // A real server on the node itself: delivered there.
                    Scheduled::To(flight, affinity) if self.is_local(flight.destination().ip()) => {
                        out.push(self.end_at(flight, Verdict::Accept, false, affinity, at_ipvs));
                    }
                    // IPVS sends the packet out through LOCAL_OUT.
                    Scheduled::To(flight, affinity) => {
                        for (flight, verdict, _) in self.hook(Table::Filter, "OUTPUT", flight)? {
                            self.postrouting(
                                flight,
                                verdict,
                                affinity.clone(),
                                Some(at_ipvs),
                                out,
                            )?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// A packet of the node after nat OUTPUT: IPVS at LOCAL_OUT, filter
    /// OUTPUT, nat POSTROUTING, and filter INPUT when it comes back to the
    /// node.
    fn sent_by_node(&self, flight: InFlight, out: &mut Vec<Finished>) -> Result<(), TraceError> {
        let at_ipvs = flight.destination();
        for scheduled in self.schedule(flight)? {
            let (flight, affinity) = match scheduled {
                Scheduled::Refused(flight, affinity) => {
                    out.push(self.end_at(flight, Verdict::Reject, false, affinity, at_ipvs));
                    continue;
                }
                Scheduled::NotAService(flight) => (flight, None),
                Scheduled::To(flight, affinity) => (flight, affinity),
            };
            for (flight, verdict, _) in self.hook(Table::Filter, "OUTPUT", flight)? {
                if verdict != Verdict::Accept {
                    out.push(self.end_at(flight, verdict, false, affinity.clone(), at_ipvs));
                    continue;
                }
                for (flight, _, masqueraded) in self.hook(Table::Nat, "POSTROUTING", flight)? {
                    if !self.is_local(flight.destination().ip()) {
                        out.push(self.end_at(
                            flight,
                            Verdict::Accept,
                            masqueraded,
                            affinity.clone(),
                            at_ipvs,
                        ));
                        continue;
                    }
                    for (flight, verdict, _) in self.hook(Table::Filter, "INPUT", flight)? {
                        out.push(self.end_at(
                            flight,
                            verdict,
                            masqueraded,
                            affinity.clone(),
                            at_ipvs,
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// nat POSTROUTING after a filter hook that gave `verdict`.
    fn postrouting(
        &self,
        flight: InFlight,
        verdict: Verdict,
        affinity: Option<Affinity>,
        at_ipvs: Option<SocketAddr>,
        out: &mut Vec<Finished>,
    ) -> Result<(), TraceError> {
        let at_ipvs = at_ipvs.unwrap_or_else(|| flight.destination());
        if verdict != Verdict::Accept {
            out.push(self.end_at(flight, verdict, false, affinity, at_ipvs));
            return Ok(());
        }
        for (flight, _, masqueraded) in self.hook(Table::Nat, "POSTROUTING", flight)? {
            out.push(self.end_at(
                flight,
                Verdict::Accept,
                masqueraded,
                affinity.clone(),
                at_ipvs,
            ));
        }
        Ok(())
    }

    /// IPVS: the virtual server of the packet's destination, and its real
    /// servers that take new connections.
    fn schedule(&self, mut flight: InFlight) -> Result<Vec<Scheduled>, TraceError> {
        let to = flight.destination();
        let key = ServiceKey {
            address: to.ip(),
            protocol: self.packet.protocol,
            port: to.port(),
        };
        let Some(service) = self.state.kernel.services.get(&key) else {
            return Ok(vec![Scheduled::NotAService(flight)]);
        };
        let name = virtual_server_name(&key);
        let unmodelled = service.server.flags & !MODELLED_FLAGS;
        if unmodelled != 0 {
            return Err(TraceError::VirtualServer {
                service: name,
                reason: format!("flags {unmodelled:#x} are not modelled"),
            });
        }
        flight.record(format!("ipvs: {name} {}", describe(service)));
        let affinity = (service.server.flags & FLAG_PERSISTENT != 0).then(|| Affinity {
            name: name.clone(),
            timeout_secs: service.server.timeout_secs,
        });
        let live: Vec<(SocketAddr, u32)> = service
            .reals
            .iter()
            .filter(|(_, weight)| **weight > 0)
            .map(|(real, weight)| (*real, *weight))
            .collect();
        let total: f64 = live.iter().map(|(_, weight)| f64::from(*weight)).sum();
        if live.is_empty() {
            flight.record(format!(
                "ipvs: {name} has no real server with a weight above 0 ({} with weight 0): \
                 ICMP port unreachable",
                service.reals.len()
            ));
            return Ok(vec![Scheduled::Refused(flight, affinity)]);
        }
        Ok(live
            .into_iter()
            .map(|(real, weight)| {
                let mut branch = flight.clone();
                let chance = f64::from(weight) / total;
                branch.redirect(
                    real,
                    chance,
                    format!("ipvs: real server {real} weight {weight} of {total}"),
                );
                Scheduled::To(branch, affinity.clone())
            })
            .collect())
    }
}

/// `TCP 10.96.0.10:80`, `UDP [fd00::10]:53`.
fn virtual_server_name(key: &ServiceKey) -> String {
    let protocol = match key.protocol {
        Protocol::Tcp => "TCP",
        Protocol::Udp => "UDP",
        Protocol::Sctp => "SCTP",
    };
    format!("{protocol} {}", SocketAddr::new(key.address, key.port))
}

/// `rr`, `rr persistent 10800`.
fn describe(service: &ServiceState) -> String {
    let mut text = service.server.scheduler.clone();
    if service.server.flags & FLAG_PERSISTENT != 0 {
        text.push_str(&format!(" persistent {}", service.server.timeout_secs));
    }
    text
}

/// The members of a set as the iptables tracer holds them.
fn set_members(set_type: SetType, members: &BTreeSet<SetEntry>) -> IpSetMembers {
    let host = |ip: IpAddr| IpNet::from(ip);
    match set_type {
        SetType::HashIp => IpSetMembers::Addresses(
            members
                .iter()
                .filter_map(|entry| match entry {
                    SetEntry::Ip(ip) => Some(host(*ip)),
                    _ => None,
                })
                .collect(),
        ),
        SetType::HashIpPort => IpSetMembers::AddressPorts(
            members
                .iter()
                .filter_map(|entry| match entry {
                    SetEntry::IpPort(ip, protocol, port) => Some((*ip, *protocol, *port)),
                    _ => None,
                })
                .collect(),
        ),
        SetType::HashIpPortIp | SetType::HashIpPortNet => IpSetMembers::AddressPortNets(
            members
                .iter()
                .filter_map(|entry| match entry {
                    SetEntry::IpPortIp(ip, protocol, port, other) => {
                        Some((*ip, *protocol, *port, host(*other)))
                    }
                    SetEntry::IpPortNet(ip, protocol, port, net) => {
                        Some((*ip, *protocol, *port, *net))
                    }
                    _ => None,
                })
                .collect(),
        ),
        SetType::BitmapPort => IpSetMembers::Ports(
            members
                .iter()
                .filter_map(|entry| match entry {
                    SetEntry::Port(port) => Some(*port),
                    _ => None,
                })
                .collect(),
        ),
    }
}

/// The packet as a set lookup sees it.
struct View {
    src: IpAddr,
    dst: SocketAddr,
    protocol: Protocol,
}

/// The `--match-set NAME FLAGS` of a matched rule that are not negated.
fn set_matches(rule: &str) -> Vec<(&str, Vec<&str>)> {
    let words: Vec<&str> = rule.split_whitespace().collect();
    let mut found = Vec::new();
    for (index, word) in words.iter().enumerate() {
        if *word != "--match-set" || (index > 0 && words[index - 1] == "!") {
            continue;
        }
        if let (Some(name), Some(flags)) = (words.get(index + 1), words.get(index + 2)) {
            found.push((*name, flags.split(',').collect()));
        }
    }
    found
}

/// Whether `entry` is what a lookup with `flags` finds for `view`.
fn member_matches(entry: &SetEntry, flags: &[&str], view: &View) -> bool {
    let address = |dimension: usize| match flags.get(dimension) {
        Some(&"src") => Some(view.src),
        Some(&"dst") => Some(view.dst.ip()),
        _ => None,
    };
    let port = |dimension: usize| match flags.get(dimension) {
        Some(&"dst") => Some(view.dst.port()),
        _ => None,
    };
    match entry {
        SetEntry::Ip(ip) => address(0) == Some(*ip),
        SetEntry::IpPort(ip, protocol, p) => {
            address(0) == Some(*ip) && *protocol == view.protocol && port(1) == Some(*p)
        }
        SetEntry::IpPortIp(ip, protocol, p, other) => {
            address(0) == Some(*ip)
                && *protocol == view.protocol
                && port(1) == Some(*p)
                && address(2) == Some(*other)
        }
        SetEntry::IpPortNet(ip, protocol, p, net) => {
            address(0) == Some(*ip)
                && *protocol == view.protocol
                && port(1) == Some(*p)
                && address(2).is_some_and(|other| net.contains(&other))
        }
        SetEntry::Port(p) => port(0) == Some(*p),
    }
}

#[cfg(test)]
#[path = "trace_tests.rs"]
mod tests;
