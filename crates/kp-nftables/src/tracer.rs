//! A packet tracer over the transactions this crate renders.
//!
//! [`Table::apply`] replays transactions (a full one, then partial ones) on
//! an in-memory model of the `kube-proxy` table; [`Table::trace`] follows a
//! new connection's first packet through it the way the kernel's hooks
//! would: source-range firewall before DNAT, the `services` dispatch and
//! the per-service chains in nat, then the refusal checks after DNAT. It
//! reads the typed commands ([`crate::model`]), not their text, and fails
//! loudly on a statement it does not follow, so a renderer change cannot
//! slip past it unnoticed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use crate::model::{
    protocol_keyword, AddrField, ChainKind, ChainType, Command, Expr, Hook, Rule, Transaction,
};
use crate::names::MARK_FOR_MASQUERADE;

use crate::model::Verdict as RuleVerdict;

/// The `kube-proxy` table of one family, as transactions left it (or as
/// [`crate::live::read_table`] read it from the kernel).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    /// Rules per chain.
    pub chains: BTreeMap<String, Vec<Rule>>,
    /// Elements per set or map: key (as `add element` writes it) → the
    /// verdict of a map element (`None` for a set element).
    pub maps: BTreeMap<String, BTreeMap<String, Option<RuleVerdict>>>,
    /// Sets declared (affinity sets among them).
    pub sets: BTreeSet<String>,
    /// Sets that packets add elements to (`flags dynamic`: affinity sets),
    /// whose elements the kernel holds but no transaction writes.
    pub dynamic_sets: BTreeSet<String>,
    /// The base chains: where each hooks in.
    pub base_chains: BTreeMap<String, BaseChain>,
}

/// Where a base chain hooks in: `{ type T hook H priority P ; }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaseChain {
    /// `filter` or `nat`.
    pub chain_type: ChainType,
    /// The netfilter hook.
    pub hook: Hook,
    /// The priority at that hook.
    pub priority: i32,
}

/// The first packet of a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// `tcp`, `udp` or `sctp`.
    pub protocol: &'static str,
    /// Destination port.
    pub dport: u16,
    /// The source is an address of this host (`fib saddr type local`).
    pub src_local: bool,
    /// The destination is an address of this host (`fib daddr type local`).
    pub dst_local: bool,
}

/// What happens to a packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// DNATed to one of these endpoints; `masquerade` lists the endpoints
    /// whose path also marks the packet for SNAT.
    Dnat {
        /// Every endpoint the packet may go to.
        endpoints: BTreeSet<SocketAddr>,
        /// Those of them reached with the masquerade mark set.
        masquerade: BTreeSet<SocketAddr>,
    },
    /// Refused with an ICMP error (`reject`).
    Reject,
    /// Silently dropped.
    Drop,
    /// Not touched by our rules.
    Accept,
}

/// A command or rule the tracer does not follow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tracer cannot read {0:?}")]
pub struct Unknown(pub String);

/// One path through the nat chains.
#[derive(Debug, Clone, Default)]
struct Path {
    masquerade: bool,
    dnat: Option<SocketAddr>,
    dropped: bool,
}

impl Table {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replays one transaction.
    pub fn apply(&mut self, transaction: &Transaction) -> Result<(), Unknown> {
        for command in &transaction.commands {
            self.apply_command(command)
                .ok_or_else(|| Unknown(command.line(transaction.family).to_string()))?;
        }
        Ok(())
    }

    /// Replays one command; `None` when it names a chain, set or element
    /// the table does not hold (the kernel refuses those with `ENOENT`).
    pub(crate) fn apply_command(&mut self, command: &Command) -> Option<()> {
        match command {
            Command::AddTable { .. } => {}
            Command::DeleteTable => *self = Self::default(),
            Command::AddChain { name, kind } => {
                self.chains.entry(name.as_str().to_owned()).or_default();
                if let ChainKind::Base {
                    chain_type,
                    hook,
                    priority,
                } = *kind
                {
                    // `add chain` of an existing chain changes nothing.
                    self.base_chains
                        .entry(name.as_str().to_owned())
                        .or_insert(BaseChain {
                            chain_type,
                            hook,
                            priority,
                        });
                }
            }
            Command::FlushChain(name) => self.chains.get_mut(name.as_str())?.clear(),
            Command::DeleteChain(name) => {
                self.base_chains.remove(name.as_str());
                self.chains.remove(name.as_str())?;
            }
            Command::AddRule(rule) => self.chains.get_mut(rule.chain.as_str())?.push(rule.clone()),
            Command::AddSet(spec) => {
                self.sets.insert(spec.name.as_str().to_owned());
                if spec.dynamic_timeout_secs.is_some() {
                    self.dynamic_sets.insert(spec.name.as_str().to_owned());
                }
                self.maps.entry(spec.name.as_str().to_owned()).or_default();
            }
            Command::FlushSet { name, .. } => self.maps.get_mut(name.as_str())?.clear(),
            Command::DeleteSet { name, .. } => {
                self.sets.remove(name.as_str());
                self.dynamic_sets.remove(name.as_str());
                self.maps.remove(name.as_str())?;
            }
            Command::AddElements { set, elements } => {
                let map = self.maps.get_mut(set.as_str())?;
                for element in elements {
                    map.insert(element.key.to_string(), element.verdict.clone());
                }
            }
            Command::DeleteElements { set, keys } => {
                let map = self.maps.get_mut(set.as_str())?;
                for key in keys {
                    map.remove(&key.to_string())?;
                }
            }
        }
        Some(())
    }

    /// Follows `packet` through the table.
    pub fn trace(&self, packet: &Packet) -> Result<Verdict, Unknown> {
        if self.firewall_drops(packet)? {
            return Ok(Verdict::Drop);
        }
        let paths = self.run_chain("services", packet, 0)?;
        let dnat: Vec<&Path> = paths.iter().filter(|p| p.dnat.is_some()).collect();
        if paths.iter().any(|p| p.dropped) {
            return Ok(Verdict::Drop);
        }
        if !dnat.is_empty() {
            let endpoints = dnat.iter().filter_map(|p| p.dnat).collect();
            let masquerade = dnat
                .iter()
                .filter(|p| p.masquerade)
                .filter_map(|p| p.dnat)
                .collect();
            return Ok(Verdict::Dnat {
                endpoints,
                masquerade,
            });
        }
        Ok(self.refusal(packet))
    }

    fn firewall_drops(&self, packet: &Packet) -> Result<bool, Unknown> {
        let Some(verdict) = self.lookup("firewall-ips", &ip_key(packet)) else {
            return Ok(false);
        };
        let RuleVerdict::Goto(chain) = verdict else {
            return Err(Unknown(format!("firewall-ips verdict {verdict}")));
        };
        let paths = self.run_chain(chain.as_str(), packet, 0)?;
        Ok(paths.iter().any(|p| p.dropped))
    }

    /// The filter checks after DNAT, for a packet nat left alone.
    fn refusal(&self, packet: &Packet) -> Verdict {
        let by_verdict = |verdict: &RuleVerdict| {
            if *verdict == RuleVerdict::Drop {
                Verdict::Drop
            } else {
                Verdict::Reject
            }
        };
        if let Some(verdict) = self.lookup("no-endpoint-services", &ip_key(packet)) {
            return by_verdict(verdict);
        }
        if self.node_port_address(packet) {
            if let Some(verdict) = self.lookup("no-endpoint-nodeports", &port_key(packet)) {
                return by_verdict(verdict);
            }
        }
        if self
            .maps
            .get("cluster-ips")
            .is_some_and(|ips| ips.contains_key(&packet.dst.to_string()))
        {
            return Verdict::Reject;
        }
        Verdict::Accept
    }

    fn node_port_address(&self, packet: &Packet) -> bool {
        match self.maps.get("nodeport-ips") {
            Some(ips) => ips.contains_key(&packet.dst.to_string()),
            None => packet.dst_local && !packet.dst.is_loopback(),
        }
    }

    /// The verdict of map element `key`.
    fn lookup(&self, map: &str, key: &str) -> Option<&RuleVerdict> {
        self.maps.get(map)?.get(key)?.as_ref()
    }

    fn run_chain(&self, chain: &str, packet: &Packet, depth: usize) -> Result<Vec<Path>, Unknown> {
        if depth > 16 {
            return Err(Unknown(format!("chain loop at {chain}")));
        }
        let rules = self
            .chains
            .get(chain)
            .ok_or_else(|| Unknown(format!("missing chain {chain}")))?;
        self.run_rules(rules, packet, depth, Path::default())
    }

    /// Runs `rules` from the first; a `numgen random mod N 0 goto C` rule
    /// may or may not be taken, so both continuations are followed.
    fn run_rules(
        &self,
        rules: &[Rule],
        packet: &Packet,
        depth: usize,
        mut state: Path,
    ) -> Result<Vec<Path>, Unknown> {
        for (index, rule) in rules.iter().enumerate() {
            if let [Expr::NumgenIs { .. }, Expr::Verdict(RuleVerdict::Goto(target))] =
                rule.exprs.as_slice()
            {
                let mut paths = match self.enter(target.as_str(), packet, depth, &state)? {
                    Step::Done(found) => found,
                    Step::Continue(path) => vec![path],
                };
                paths.extend(self.run_rules(&rules[index + 1..], packet, depth, state)?);
                return Ok(paths);
            }
            match self.run_rule(rule, packet, depth, &state)? {
                Step::Continue(next) => state = next,
                Step::Done(paths) => return Ok(paths),
            }
        }
        Ok(vec![state])
    }
}

/// What a rule did.
enum Step {
    Continue(Path),
    Done(Vec<Path>),
}

impl Table {
    /// Runs one rule: its matches in order (a miss leaves the rule), then
    /// its statement.
    fn run_rule(
        &self,
        rule: &Rule,
        packet: &Packet,
        depth: usize,
        state: &Path,
    ) -> Result<Step, Unknown> {
        let unknown = |expr: &Expr| Unknown(format!("{expr:?} in chain {}", rule.chain));
        let mut next = state.clone();
        for expr in &rule.exprs {
            let matched = match expr {
                Expr::FibLocal(AddrField::Source) => packet.src_local,
                Expr::FibLocal(AddrField::Destination) => packet.dst_local,
                Expr::AddrIs {
                    field,
                    negate,
                    value,
                } => value.net().contains(&address(packet, *field)) != *negate,
                Expr::AddrNotIn { field, values } => {
                    let addr = address(packet, *field);
                    !values.iter().any(|value| value.net().contains(&addr))
                }
                Expr::AddrInSet { field, set } => {
                    // Affinity sets hold no entries in this model.
                    let addr = address(packet, *field).to_string();
                    self.maps
                        .get(set.as_str())
                        .is_some_and(|set| set.contains_key(&addr))
                }
                Expr::DestinationPort { protocol, port } => {
                    protocol_keyword(*protocol) == packet.protocol && *port == packet.dport
                }
                Expr::L4Proto(protocol) => protocol_keyword(*protocol) == packet.protocol,
                Expr::DispatchVmap { with_addr, map } => {
                    let key = if *with_addr {
                        ip_key(packet)
                    } else if self.node_port_address(packet) {
                        port_key(packet)
                    } else {
                        return Ok(Step::Continue(next));
                    };
                    let Some(verdict) = self.lookup(map.as_str(), &key) else {
                        return Ok(Step::Continue(next));
                    };
                    return self.verdict(verdict, packet, depth, next);
                }
                Expr::UpdateSourceSet(_) => true,
                Expr::Dnat(to) => {
                    next.dnat = Some(*to);
                    return Ok(Step::Done(vec![next]));
                }
                Expr::Verdict(verdict) => return self.verdict(verdict, packet, depth, next),
                other => return Err(unknown(other)),
            };
            if !matched {
                return Ok(Step::Continue(state.clone()));
            }
        }
        Ok(Step::Continue(next))
    }

    fn verdict(
        &self,
        verdict: &RuleVerdict,
        packet: &Packet,
        depth: usize,
        mut next: Path,
    ) -> Result<Step, Unknown> {
        match verdict {
            RuleVerdict::Jump(chain) if chain.as_str() == MARK_FOR_MASQUERADE => {
                next.masquerade = true;
                Ok(Step::Continue(next))
            }
            RuleVerdict::Drop => {
                next.dropped = true;
                Ok(Step::Done(vec![next]))
            }
            RuleVerdict::Goto(target) => self.enter(target.as_str(), packet, depth, &next),
            other => Err(Unknown(format!("verdict {other}"))),
        }
    }

    fn enter(
        &self,
        target: &str,
        packet: &Packet,
        depth: usize,
        state: &Path,
    ) -> Result<Step, Unknown> {
        let found = self.run_chain(target, packet, depth + 1)?;
        let merged = found
            .into_iter()
            .map(|path| Path {
                masquerade: path.masquerade || state.masquerade,
                ..path
            })
            .collect();
        Ok(Step::Done(merged))
    }
}

fn address(packet: &Packet, field: AddrField) -> IpAddr {
    match field {
        AddrField::Source => packet.src,
        AddrField::Destination => packet.dst,
    }
}

/// `ADDRESS . PROTOCOL . PORT` of the packet's destination, as map keys
/// are written.
fn ip_key(packet: &Packet) -> String {
    format!("{} . {} . {}", packet.dst, packet.protocol, packet.dport)
}

/// `PROTOCOL . PORT` of the packet's destination.
fn port_key(packet: &Packet) -> String {
    format!("{} . {}", packet.protocol, packet.dport)
}
