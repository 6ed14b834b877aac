//! Follows the first packet of a new connection through the userspace
//! mode's live state, for `kube-proxy trace`: the portal rules in the
//! kernel's nat table, then the running relay's route, read from the
//! routing file it publishes (see [`crate::routes_file`]).
//!
//! A received packet passes nat `PREROUTING`, whose jumps lead to
//! `KUBE-PORTALS-CONTAINER` (first) and `KUBE-NODEPORT-CONTAINER` (last);
//! a packet of the node passes nat `OUTPUT` with `KUBE-PORTALS-HOST` and
//! `KUBE-NODEPORT-HOST`. The first portal rule that matches redirects the
//! packet to a relay port (`REDIRECT --to-ports`, or `DNAT` to the node
//! IP). The relay then classifies the connection by the address it was
//! sent to ([`Route::classify`](crate::route::Route::classify)) and dials
//! one of the endpoints of that traffic, round robin: every endpoint is a
//! path with the share 1/n, masqueraded (the relay's connection comes from
//! the node). Without an endpoint, or from a client outside
//! `loadBalancerSourceRanges`, a TCP connection is reset
//! ([`PathVerdict::Reject`]; a TCP service port without endpoints is
//! redirected to the relay's refusing port, which does the same) and a
//! UDP datagram dropped ([`PathVerdict::Drop`]), as the relay does.
//!
//! Only the jumps of the built-in chain into the portal chains and the
//! portal rules are followed: other software's nat rules are not, and
//! the filter table is not read (the mode writes no filter rule). A rule
//! in a portal chain of a shape the mode does not write is an error
//! naming it. The nat table is listed with the same save program as
//! [`kp_iptables::tracer::Ruleset::from_live`] uses, but read here:
//! that tracer refuses the portal rules (`unknown target REDIRECT`), as
//! no other mode writes `REDIRECT`.
//!
//! A path's steps ([`PathOutcome::matched`]) are the nat rules as
//! `nat/CHAIN rule`, then the relay as `relay: PORT (NAME PROTOCOL,
//! internal traffic) -> N endpoints` and `relay: endpoint
//! 10.244.1.2:8080, 1 of 2`; its `elements` and `not_followed` are empty
//! (the mode uses no set, and only its own rules are followed).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use ipnet::IpNet;
use kp_iptables::{IptablesFlavor, SystemApplier, Table};
use kp_model::{IpFamily, Protocol};

use crate::portal::{
    KUBE_NODEPORT_CONTAINER, KUBE_NODEPORT_HOST, KUBE_PORTALS_CONTAINER, KUBE_PORTALS_HOST,
    PORTAL_CHAINS,
};
use crate::route::{Denied, TrafficKind};
use crate::routes_file::{self, PublishedPort, RoutesFile, RoutesFileError};

/// What the kernel and the relay hold for the userspace mode in one
/// family.
#[derive(Debug, Clone)]
pub struct LiveState {
    /// The family.
    pub family: IpFamily,
    /// The node's addresses of the family (`--dst-type LOCAL`).
    pub node_addresses: Vec<IpAddr>,
    /// The rules of nat `PREROUTING` and `OUTPUT` that jump to a portal
    /// chain, and the rules of the portal chains, in order.
    pub rules: Vec<PortalRule>,
    /// The relay's routing table.
    pub routes: RoutesFile,
}

/// One rule of nat `PREROUTING`, `OUTPUT` or a portal chain, as far as
/// the trace reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortalRule {
    /// The chain holding it.
    pub chain: String,
    /// The rule as written after `-A CHAIN`.
    pub text: String,
    /// What it does.
    pub action: PortalAction,
}

/// What a [`PortalRule`] does with a packet it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortalAction {
    /// Jumps to a portal chain (a rule of a built-in chain).
    Jump(String),
    /// Sends the packet to a relay port.
    Redirect {
        /// `-p`.
        protocol: Protocol,
        /// `--dport`.
        dport: u16,
        /// `-d`; `None` for a NodePort rule.
        destination: Option<IpNet>,
        /// `-m addrtype --dst-type LOCAL`.
        local_only: bool,
        /// The relay port (`--to-ports`, or the port of `--to-destination`).
        relay_port: u16,
    },
}

/// Why the live state could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The nat table could not be listed.
    #[error("listing the nat table with {command} failed")]
    Rules {
        /// The save program.
        command: String,
        /// The cause.
        #[source]
        source: kp_iptables::ApplyError,
    },
    /// A rule of a portal chain is not of the shape the mode writes.
    #[error("nat rule -A {chain} {text}: {reason}; the trace does not follow it")]
    Rule {
        /// The chain.
        chain: String,
        /// The rule.
        text: String,
        /// What is not understood.
        reason: String,
    },
    /// The node's addresses could not be listed.
    #[error("listing the node's addresses failed")]
    Addresses(#[source] io::Error),
    /// The relay's routing file could not be read.
    #[error(transparent)]
    Routes(#[from] RoutesFileError),
    /// The routing file is of the other family.
    #[error("the routing file holds the {found} relay's routes, not {family}'s")]
    Family {
        /// The family asked for.
        family: &'static str,
        /// The family in the file.
        found: String,
    },
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
    /// A portal rule sends the packet to a port the routing file does not
    /// list (the file is older or newer than the rules: trace again).
    #[error(
        "nat rule -A {chain} {rule} redirects to relay port {relay_port}/{protocol}, which the \
         relay's routing file does not list"
    )]
    NoRelay {
        /// The portal chain.
        chain: String,
        /// The portal rule.
        rule: String,
        /// The port.
        relay_port: u16,
        /// The protocol.
        protocol: &'static str,
    },
}

impl LiveState {
    /// Reads the state of `family` in the calling thread's network
    /// namespace: the nat table with the iptables flavor in use, the
    /// node's addresses, and the routing file at its default path.
    pub fn read(family: IpFamily) -> Result<Self, ReadError> {
        Self::read_with(
            family,
            IptablesFlavor::detect(),
            &routes_file::default_path(family),
        )
    }

    /// [`Self::read`] with the iptables flavor and the routing file given.
    pub fn read_with(
        family: IpFamily,
        flavor: IptablesFlavor,
        routes_path: &Path,
    ) -> Result<Self, ReadError> {
        let applier = SystemApplier::new(flavor);
        let nat = applier
            .save_text(family, Table::Nat)
            .map_err(|source| ReadError::Rules {
                command: format!(
                    "{} -t nat",
                    flavor.program(family, kp_iptables::applier::Tool::Save)
                ),
                source,
            })?;
        let node_addresses = kp_iptables::local_addresses()
            .map_err(ReadError::Addresses)?
            .into_iter()
            .filter(|ip| family.matches(ip))
            .collect();
        let routes = RoutesFile::read(routes_path)?;
        Self::from_parts(family, node_addresses, &nat, routes)
    }

    /// The state from the nat table as `iptables-save -t nat` prints it,
    /// or as restore text (only the jumps to the portal chains and the portal chains' rules
    /// are kept), the node's addresses and the routing table.
    pub fn from_parts(
        family: IpFamily,
        node_addresses: Vec<IpAddr>,
        nat_save: &str,
        routes: RoutesFile,
    ) -> Result<Self, ReadError> {
        if routes.family != family.as_api_str() {
            return Err(ReadError::Family {
                family: family.as_api_str(),
                found: routes.family,
            });
        }
        let mut rules = Vec::new();
        for line in nat_save.lines() {
            let line = line.trim();
            // `-I` (restore text, as the backend writes its jumps) puts the
            // rule first in its chain; the order among chains is not used.
            let (rest, first) = match (line.strip_prefix("-A "), line.strip_prefix("-I ")) {
                (Some(rest), _) => (rest, false),
                (None, Some(rest)) => (rest, true),
                (None, None) => continue,
            };
            let (chain, text) = rest.split_once(' ').unwrap_or((rest, ""));
            if let Some(rule) = parse_rule(chain, text)? {
                if first {
                    rules.insert(0, rule);
                } else {
                    rules.push(rule);
                }
            }
        }
        Ok(Self {
            family,
            node_addresses,
            rules,
            routes,
        })
    }

    /// Follows `packet`: every path it can take.
    pub fn trace(&self, packet: &Packet) -> Result<Trace, TraceError> {
        if !self.family.matches(&packet.dst) {
            return Err(TraceError::Family {
                dst: packet.dst,
                family: self.family.as_api_str(),
            });
        }
        let hook = if packet.src_local {
            "OUTPUT"
        } else {
            "PREROUTING"
        };
        for jump in self.rules.iter().filter(|rule| rule.chain == hook) {
            let PortalAction::Jump(chain) = &jump.action else {
                continue;
            };
            let Some(portal) = self.first_match(chain, packet) else {
                continue;
            };
            let matched = vec![
                format!("nat/{hook} {}", jump.text),
                format!("nat/{chain} {}", portal.text),
            ];
            return self.relay(packet, portal, matched);
        }
        // No portal rule: the packet goes on unchanged.
        Ok(Trace {
            paths: vec![PathOutcome {
                destination: None,
                verdict: PathVerdict::Accept,
                masqueraded: false,
                probability: 1.0,
                matched: Vec::new(),
                elements: Vec::new(),
                affinity: Vec::new(),
                not_followed: Vec::new(),
            }],
        })
    }

    /// The first rule of portal chain `chain` that redirects `packet`.
    fn first_match(&self, chain: &str, packet: &Packet) -> Option<&PortalRule> {
        self.rules
            .iter()
            .filter(|rule| rule.chain == chain)
            .find(|rule| {
                let PortalAction::Redirect {
                    protocol,
                    dport,
                    destination,
                    local_only,
                    ..
                } = &rule.action
                else {
                    return false;
                };
                *protocol == packet.protocol
                    && *dport == packet.dport
                    && destination.is_none_or(|net| net.contains(&packet.dst))
                    && (!local_only || self.is_local(packet.dst))
            })
    }

    fn is_local(&self, ip: IpAddr) -> bool {
        ip.is_loopback() || self.node_addresses.contains(&ip)
    }

    /// What the relay does with a connection `portal` sent it.
    fn relay(
        &self,
        packet: &Packet,
        portal: &PortalRule,
        mut matched: Vec<String>,
    ) -> Result<Trace, TraceError> {
        let PortalAction::Redirect { relay_port, .. } = portal.action else {
            // first_match only returns redirecting rules.
            return Ok(Trace { paths: Vec::new() });
        };
        let refused = |matched: Vec<String>| Trace {
            paths: vec![PathOutcome {
                destination: None,
                verdict: refusal(packet.protocol),
                masqueraded: false,
                probability: 1.0,
                matched,
                elements: Vec::new(),
                affinity: Vec::new(),
                not_followed: Vec::new(),
            }],
        };
        if packet.protocol == Protocol::Tcp && self.routes.refusing_port == Some(relay_port) {
            matched.push(format!(
                "relay: {relay_port} is the refusing port: connection reset"
            ));
            return Ok(refused(matched));
        }
        let Some(port) = self.routes.by_relay_port(packet.protocol, relay_port) else {
            return Err(TraceError::NoRelay {
                chain: portal.chain.clone(),
                rule: portal.text.clone(),
                relay_port,
                protocol: packet.protocol.as_api_str(),
            });
        };
        let original = SocketAddr::new(packet.dst, packet.dport);
        let route = port.route();
        let kind = match route.classify(Some(original), packet.src) {
            Ok(kind) => kind,
            Err(denied) => {
                let why = match denied {
                    Denied::SourceRange => "the client is outside loadBalancerSourceRanges",
                    Denied::NotRedirected => "no portal of this service port is at that address",
                };
                matched.push(format!(
                    "relay: {relay_port} ({} {}): {why}: {}",
                    port.name,
                    port.protocol,
                    refusal_text(packet.protocol)
                ));
                return Ok(refused(matched));
            }
        };
        let endpoints = route.endpoints(kind);
        matched.push(format!(
            "relay: {relay_port} ({} {}, {} traffic{}) -> {} endpoints",
            port.name,
            port.protocol,
            match kind {
                TrafficKind::Internal => "internal",
                TrafficKind::External => "external",
            },
            if kind == TrafficKind::External && port.external_traffic_local {
                ", externalTrafficPolicy Local"
            } else {
                ""
            },
            endpoints.len()
        ));
        if endpoints.is_empty() {
            matched.push(format!(
                "relay: no endpoint: {}",
                refusal_text(packet.protocol)
            ));
            return Ok(refused(matched));
        }
        let affinity: Vec<Affinity> = affinity_of(port).into_iter().collect();
        let count = endpoints.len();
        // A service port has at most a few thousand endpoints: exact in f64.
        let share = 1.0 / count as f64;
        let paths = endpoints
            .iter()
            .enumerate()
            .map(|(index, endpoint)| {
                let mut steps = matched.clone();
                steps.push(format!(
                    "relay: endpoint {endpoint}, {} of {count}",
                    index + 1
                ));
                PathOutcome {
                    destination: Some(*endpoint),
                    verdict: PathVerdict::Accept,
                    masqueraded: true,
                    probability: share,
                    matched: steps,
                    elements: Vec::new(),
                    affinity: affinity.clone(),
                    not_followed: Vec::new(),
                }
            })
            .collect();
        Ok(Trace { paths })
    }
}

/// How the relay refuses a connection of `protocol`.
fn refusal(protocol: Protocol) -> PathVerdict {
    match protocol {
        Protocol::Tcp => PathVerdict::Reject,
        _ => PathVerdict::Drop,
    }
}

fn refusal_text(protocol: Protocol) -> &'static str {
    match refusal(protocol) {
        PathVerdict::Reject => "connection reset",
        _ => "datagram dropped",
    }
}

fn affinity_of(port: &PublishedPort) -> Option<Affinity> {
    port.affinity_timeout_secs.map(|secs| Affinity {
        name: port.name.clone(),
        timeout_secs: u32::try_from(secs).unwrap_or(u32::MAX),
    })
}

/// The rule `-A chain text`, when it is one the trace follows: a jump of
/// a built-in chain to a portal chain, or any rule of a portal chain (an
/// error when not of the mode's shape).
fn parse_rule(chain: &str, text: &str) -> Result<Option<PortalRule>, ReadError> {
    let fail = |reason: String| ReadError::Rule {
        chain: chain.to_owned(),
        text: text.to_owned(),
        reason,
    };
    let words = split_words(text).map_err(fail)?;
    let option = |name: &str| {
        words
            .iter()
            .position(|word| word == name)
            .and_then(|at| words.get(at + 1))
            .map(String::as_str)
    };
    let rule = |action| {
        Some(PortalRule {
            chain: chain.to_owned(),
            text: text.to_owned(),
            action,
        })
    };
    if matches!(chain, "PREROUTING" | "OUTPUT") {
        let jump = option("-j").filter(|target| PORTAL_CHAINS.contains(target));
        let fits = match jump {
            Some(KUBE_PORTALS_CONTAINER | KUBE_NODEPORT_CONTAINER) => chain == "PREROUTING",
            Some(KUBE_PORTALS_HOST | KUBE_NODEPORT_HOST) => chain == "OUTPUT",
            _ => false,
        };
        return Ok(match jump {
            Some(target) if fits => rule(PortalAction::Jump(target.to_owned())),
            _ => None,
        });
    }
    if !PORTAL_CHAINS.contains(&chain) {
        return Ok(None);
    }
    let mut protocol = None;
    let mut dport = None;
    let mut destination = None;
    let mut local_only = false;
    let mut relay_port = None;
    let mut index = 0;
    while index < words.len() {
        let word = words[index].as_str();
        let value = words.get(index + 1).map(String::as_str);
        let need = || value.ok_or_else(|| fail(format!("{word} needs a value")));
        index += 2;
        match word {
            "-m" => {
                let module = need()?;
                if !matches!(module, "comment" | "tcp" | "udp" | "addrtype") {
                    return Err(fail(format!(
                        "match -m {module} is not one the mode writes"
                    )));
                }
            }
            "--comment" => {
                need()?;
            }
            "-p" => {
                let name = need()?;
                protocol = Some(
                    Protocol::from_api(&name.to_ascii_uppercase())
                        .ok_or_else(|| fail(format!("unknown protocol {name}")))?,
                );
            }
            "--dport" => {
                let text = need()?;
                dport = Some(parse_port(text).ok_or_else(|| fail(format!("bad port {text}")))?);
            }
            "-d" => {
                let text = need()?;
                destination = Some(
                    text.parse::<IpNet>()
                        .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
                        .map_err(|_| fail(format!("bad address {text}")))?,
                );
            }
            "--dst-type" => {
                let kind = need()?;
                if kind != "LOCAL" {
                    return Err(fail(format!(
                        "--dst-type {kind} is not one the mode writes"
                    )));
                }
                local_only = true;
            }
            "-j" => {
                let target = need()?;
                if !matches!(target, "REDIRECT" | "DNAT") {
                    return Err(fail(format!("target {target} is not one the mode writes")));
                }
            }
            "--to-ports" => {
                let text = need()?;
                relay_port =
                    Some(parse_port(text).ok_or_else(|| fail(format!("bad port {text}")))?);
            }
            "--to-destination" => {
                let text = need()?;
                let to: SocketAddr = text
                    .parse()
                    .map_err(|_| fail(format!("bad DNAT destination {text}")))?;
                relay_port = Some(to.port());
            }
            other => {
                return Err(fail(format!("option {other} is not one the mode writes")));
            }
        }
    }
    let protocol = protocol.ok_or_else(|| fail("no -p".to_owned()))?;
    let dport = dport.ok_or_else(|| fail("no --dport".to_owned()))?;
    let relay_port =
        relay_port.ok_or_else(|| fail("no --to-ports or --to-destination".to_owned()))?;
    Ok(rule(PortalAction::Redirect {
        protocol,
        dport,
        destination,
        local_only,
        relay_port,
    }))
}

fn parse_port(text: &str) -> Option<u16> {
    text.parse().ok()
}

/// Splits a rule into words as `iptables-save` quotes them: `"a b"` is one
/// word, `\"` a quote within it.
fn split_words(text: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut in_word = false;
    let mut quoted = false;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if quoted => {
                if let Some(next) = chars.next() {
                    current.push(next);
                }
            }
            '"' => {
                quoted = !quoted;
                in_word = true;
            }
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    words.push(std::mem::take(&mut current));
                    in_word = false;
                }
            }
            c => {
                current.push(c);
                in_word = true;
            }
        }
    }
    if quoted {
        return Err("unterminated quote".to_owned());
    }
    if in_word {
        words.push(current);
    }
    Ok(words)
}

#[cfg(test)]
#[path = "trace_tests.rs"]
mod tests;
