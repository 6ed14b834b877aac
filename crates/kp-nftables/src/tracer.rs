//! A packet tracer over the transactions this crate renders.
//!
//! [`Table::apply`] replays transactions (a full one, then partial ones) on
//! an in-memory model of the `kube-proxy` table; [`Table::trace_paths`]
//! follows a new connection's first packet through it the way the kernel's
//! hooks would: the base chains of each hook in priority order (prerouting
//! or output, then input, or forward and postrouting, by where the possibly
//! DNATed packet is delivered), every jump, goto, verdict map and mark on
//! the way. A `numgen random mod N V` match forks the walk (one in `N`
//! takes it), and so does the data layout's draw (`dnat to numgen … map
//! @MAP`: one path per slot, one in the slot count each; a slot without an
//! element is an error, since the kernel would pass the connection on
//! un-DNATed), so the result lists every path with its probability, the
//! rules it matched (as `--dry-run` prints them), the map elements it
//! consulted and the affinity sets it passed. [`Table::trace`] sums the
//! paths up as one [`Verdict`].
//!
//! It reads the typed commands ([`crate::model`]), not their text, and
//! fails loudly on a statement it does not follow, so a renderer change
//! cannot slip past it unnoticed. A looped-back packet (the node to its
//! own address) passes output, postrouting and input; the prerouting it
//! passes again on `lo` is not walked, since nat there is already decided.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use kp_model::IpFamily;

use crate::model::Verdict as RuleVerdict;
use crate::model::{
    protocol_keyword, AddrField, ChainKind, ChainType, Command, Expr, Hook, Key, Name, Rule,
    Transaction, TypeofSpec,
};
use crate::names::TABLE;
use crate::options::family_keyword;

/// How deep jumps and gotos may nest before the tracer assumes a loop
/// (the kernel refuses more than 16 levels, `NFT_JUMP_STACK_SIZE`).
const MAX_DEPTH: usize = 16;

/// The `kube-proxy` table of one family, as transactions left it (or as
/// [`crate::live::read_table`] read it from the kernel).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    /// Rules per chain.
    pub chains: BTreeMap<String, Vec<Rule>>,
    /// Elements per set or verdict map: key (as `add element` writes it)
    /// → the verdict of a map element (`None` for a set element). Maps of
    /// endpoints are in [`Table::targets`].
    pub maps: BTreeMap<String, BTreeMap<String, Option<RuleVerdict>>>,
    /// Sets declared (affinity sets among them).
    pub sets: BTreeSet<String>,
    /// Sets that packets add elements to (`flags dynamic`: affinity sets),
    /// whose elements the kernel holds but no transaction writes.
    pub dynamic_sets: BTreeSet<String>,
    /// The timeout of each set declared with one (`timeout 300s`), in
    /// seconds: how long an affinity entry lives.
    pub timeouts_secs: BTreeMap<String, u64>,
    /// The base chains: where each hooks in.
    pub base_chains: BTreeMap<String, BaseChain>,
    /// Maps whose data is an endpoint (`typeof … : ip daddr . tcp dport`):
    /// key (as `add element` writes it) → endpoint.
    pub targets: BTreeMap<String, BTreeMap<String, SocketAddr>>,
    /// The sets and maps declared with `typeof`, by name (each stored
    /// under [`Name::Shared`], so that a declaration and its read-back
    /// compare alike).
    pub typeof_sets: BTreeMap<String, TypeofSpec>,
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

/// What happens to a packet, summed up over its paths.
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

/// Every path a new connection can take, like `kp_iptables::tracer::Trace`.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// The paths, one per combination of `numgen` outcomes, in rule order.
    pub paths: Vec<PathOutcome>,
}

/// One path a packet can take.
#[derive(Debug, Clone, PartialEq)]
pub struct PathOutcome {
    /// Where DNAT sent it, if anywhere.
    pub destination: Option<SocketAddr>,
    /// How the path ends.
    pub verdict: PathVerdict,
    /// nat postrouting masquerades it (the mark set on the path, then
    /// `masquerade` in the masquerading chain).
    pub masqueraded: bool,
    /// The chance that a new connection takes this path: the product of
    /// the `numgen random mod N` outcomes on it (1 when there is none).
    pub probability: f64,
    /// The rules that matched, in order, as `CHAIN: RULE` with the rule as
    /// `nft -f` reads it (`services: ip daddr . meta l4proto . th dport
    /// vmap @service-ips`).
    pub matched: Vec<String>,
    /// The elements the path found, in order: of a verdict map as
    /// `MAP: KEY : VERDICT` (`service-ips: 10.96.0.10 . tcp . 80 : goto
    /// service-…`), of a set as `SET: KEY` (`cluster-ips: 10.96.0.10`).
    /// Affinity sets are listed in `affinity` instead.
    pub elements: Vec<String>,
    /// The affinity sets the path looked up (a first packet finds no
    /// entry) or added its source to.
    pub affinity: Vec<Affinity>,
}

/// How a path ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathVerdict {
    /// Let through (no rule refused it).
    Accept,
    /// Silently dropped.
    Drop,
    /// Refused with an ICMP error.
    Reject,
}

/// An affinity set on a path: a later packet of the same client within
/// `timeout_secs` finds its entry and goes to the same endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Affinity {
    /// The set.
    pub set: String,
    /// Its timeout, if it was declared with one.
    pub timeout_secs: Option<u64>,
    /// The rule, as `CHAIN: RULE`.
    pub rule: String,
}

/// The named set or map an expression looks up or updates.
fn named_set(expr: &Expr) -> Option<&Name> {
    match expr {
        Expr::AddrInSet { set, .. }
        | Expr::UpdateSourceSet(set)
        | Expr::AddrPairInSet(set)
        | Expr::EntryInSet { set, .. } => Some(set),
        Expr::DispatchVmap { map, .. } | Expr::DnatDraw { map, .. } => Some(map),
        _ => None,
    }
}

/// A command or rule the tracer does not follow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tracer cannot read {0:?}")]
pub struct Unknown(pub String);

/// A packet's state on one path, as far as it has been walked.
#[derive(Debug, Clone)]
struct Walk {
    /// The destination, DNATed or not.
    dst: IpAddr,
    dport: u16,
    mark: u32,
    destination: Option<SocketAddr>,
    masqueraded: bool,
    probability: f64,
    matched: Vec<String>,
    elements: Vec<String>,
    affinity: Vec<Affinity>,
}

/// Where a rule or chain leaves a walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    /// On to the next rule.
    Next,
    /// Back to the calling chain (end of chain, `return`, or a goto's
    /// chain ending).
    Return,
    /// The base chain accepts (`accept`, `dnat`, `masquerade`); the next
    /// base chain of the hook still sees the packet.
    Accept,
    /// Dropped.
    Drop,
    /// Rejected.
    Reject,
}

/// What a walk needs besides the table.
#[derive(Debug, Clone, Copy)]
struct Context<'a> {
    packet: &'a Packet,
    family: IpFamily,
    /// A draw slot without an element goes on past the rule un-DNATed,
    /// as in the kernel ([`Table::trace_paths_as_the_kernel`]), instead of
    /// failing the trace.
    slot_misses_go_on: bool,
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
            Command::AddRule(rule) => {
                // The kernel refuses a rule naming a set or map the table
                // does not hold (ENOENT), as it refuses one in a missing
                // chain.
                let known = |name: &Name| {
                    let name = name.as_str();
                    self.sets.contains(name)
                        || self.maps.contains_key(name)
                        || self.targets.contains_key(name)
                };
                if !rule.exprs.iter().filter_map(named_set).all(known) {
                    return None;
                }
                self.chains.get_mut(rule.chain.as_str())?.push(rule.clone());
            }
            Command::AddSet(spec) => {
                self.sets.insert(spec.name.as_str().to_owned());
                if let Some(timeout) = spec.dynamic_timeout_secs {
                    self.dynamic_sets.insert(spec.name.as_str().to_owned());
                    self.timeouts_secs
                        .insert(spec.name.as_str().to_owned(), timeout);
                }
                self.maps.entry(spec.name.as_str().to_owned()).or_default();
            }
            Command::AddTypeofSet(spec) => {
                let name = spec.name.as_str().to_owned();
                self.sets.insert(name.clone());
                if spec.data.is_empty() {
                    self.maps.entry(name.clone()).or_default();
                } else {
                    self.targets.entry(name.clone()).or_default();
                }
                self.typeof_sets
                    .entry(name)
                    .or_insert_with(|| shared_name(spec));
            }
            Command::AddMapElements { map, elements } => {
                let targets = self.targets.get_mut(map.as_str())?;
                for element in elements {
                    targets.insert(element.key.to_string(), element.target);
                }
            }
            Command::FlushSet { name, .. } => match self.targets.get_mut(name.as_str()) {
                Some(targets) => targets.clear(),
                None => self.maps.get_mut(name.as_str())?.clear(),
            },
            Command::DeleteSet { name, .. } => {
                self.sets.remove(name.as_str());
                self.dynamic_sets.remove(name.as_str());
                self.timeouts_secs.remove(name.as_str());
                self.typeof_sets.remove(name.as_str());
                if self.targets.remove(name.as_str()).is_none() {
                    self.maps.remove(name.as_str())?;
                }
            }
            Command::AddElements { set, elements } => {
                let map = self.maps.get_mut(set.as_str())?;
                for element in elements {
                    map.insert(element.key.to_string(), element.verdict.clone());
                }
            }
            Command::DeleteElements { set, keys } => {
                if let Some(targets) = self.targets.get_mut(set.as_str()) {
                    for key in keys {
                        targets.remove(&key.to_string())?;
                    }
                } else {
                    let map = self.maps.get_mut(set.as_str())?;
                    for key in keys {
                        map.remove(&key.to_string())?;
                    }
                }
            }
        }
        Some(())
    }

    /// Every path `packet` can take through the table's base chains. A
    /// data-layout draw that finds a slot without an element fails the
    /// trace: no render may leave one.
    pub fn trace_paths(&self, packet: &Packet) -> Result<Trace, Unknown> {
        self.trace_paths_with(packet, false)
    }

    /// [`Table::trace_paths`] over a table read from the kernel, where a
    /// slot without an element is damage to report, not a renderer bug: the
    /// kernel's map lookup misses and the connection goes on past the draw
    /// rule un-DNATed, and so does that path here (its elements name the
    /// missing one).
    pub fn trace_paths_as_the_kernel(&self, packet: &Packet) -> Result<Trace, Unknown> {
        self.trace_paths_with(packet, true)
    }

    fn trace_paths_with(&self, packet: &Packet, slot_misses_go_on: bool) -> Result<Trace, Unknown> {
        let context = Context {
            slot_misses_go_on,
            packet,
            family: match packet.dst {
                IpAddr::V4(_) => IpFamily::V4,
                IpAddr::V6(_) => IpFamily::V6,
            },
        };
        let first: &[Hook] = if packet.src_local {
            &[Hook::Output, Hook::Postrouting]
        } else {
            &[Hook::Prerouting]
        };
        let mut paths = Vec::new();
        for (walk, stopped) in self.run_hooks(first, context, vec![Walk::new(packet)])? {
            if let Some(verdict) = stopped {
                paths.push(walk.outcome(verdict));
                continue;
            }
            // Routing: delivered here when the (DNATed) destination is an
            // address of this host (input), else forwarded on (forward, then
            // postrouting); a local packet sent elsewhere is done.
            let rest: &[Hook] = match (walk.dst_local(packet), packet.src_local) {
                (true, _) => &[Hook::Input],
                (false, false) => &[Hook::Forward, Hook::Postrouting],
                (false, true) => &[],
            };
            for (walk, stopped) in self.run_hooks(rest, context, vec![walk])? {
                paths.push(walk.outcome(stopped.unwrap_or(PathVerdict::Accept)));
            }
        }
        Ok(Trace { paths })
    }

    /// Follows `packet` through the table: its paths summed up.
    pub fn trace(&self, packet: &Packet) -> Result<Verdict, Unknown> {
        Ok(self.trace_paths(packet)?.verdict())
    }

    /// Runs `walks` through the base chains of each of `hooks` in turn,
    /// each hook's in priority order; a walk stops at a drop or reject.
    fn run_hooks(
        &self,
        hooks: &[Hook],
        context: Context<'_>,
        walks: Vec<Walk>,
    ) -> Result<Vec<(Walk, Option<PathVerdict>)>, Unknown> {
        let mut live = walks;
        let mut stopped = Vec::new();
        for hook in hooks {
            let mut chains: Vec<(&String, &BaseChain)> = self
                .base_chains
                .iter()
                .filter(|(_, base)| base.hook == *hook)
                .collect();
            chains.sort_by_key(|(name, base)| (base.priority, *name));
            for (chain, _) in chains {
                let mut next = Vec::new();
                for walk in live {
                    for (walk, flow) in self.run_chain(chain, context, walk, 0)? {
                        match flow {
                            Flow::Drop => stopped.push((walk, Some(PathVerdict::Drop))),
                            Flow::Reject => stopped.push((walk, Some(PathVerdict::Reject))),
                            Flow::Next | Flow::Return | Flow::Accept => next.push(walk),
                        }
                    }
                }
                live = next;
            }
        }
        stopped.extend(live.into_iter().map(|walk| (walk, None)));
        Ok(stopped)
    }

    /// Runs `walk` through `chain`'s rules; every way out of it, in the
    /// order of the rules that ended them (falling off the end last).
    fn run_chain(
        &self,
        chain: &str,
        context: Context<'_>,
        walk: Walk,
        depth: usize,
    ) -> Result<Vec<(Walk, Flow)>, Unknown> {
        if depth > MAX_DEPTH {
            return Err(Unknown(format!(
                "chain {chain}: jumps nest deeper than {MAX_DEPTH}"
            )));
        }
        let rules = self
            .chains
            .get(chain)
            .ok_or_else(|| Unknown(format!("chain {chain}: missing")))?;
        let mut live = vec![walk];
        let mut ended = Vec::new();
        for rule in rules {
            let mut next = Vec::new();
            for walk in live {
                for (walk, flow) in self.run_exprs(rule, 0, false, context, walk, depth)? {
                    match flow {
                        Flow::Next => next.push(walk),
                        other => ended.push((walk, other)),
                    }
                }
            }
            live = next;
            if live.is_empty() {
                break;
            }
        }
        ended.extend(live.into_iter().map(|walk| (walk, Flow::Return)));
        Ok(ended)
    }

    /// Runs `rule`'s expressions from `from` on: matches in order (a miss
    /// leaves the rule), statements, a verdict. `recorded` says whether the
    /// rule is already on the walk's matched list.
    /// Whether `set` holds `key`; a match is recorded on the walk.
    fn set_holds(&self, set: &Name, key: String, walk: &mut Walk) -> bool {
        let found = self
            .maps
            .get(set.as_str())
            .is_some_and(|elements| elements.contains_key(&key));
        if found {
            walk.elements.push(format!("{set}: {key}"));
        }
        found
    }

    /// The affinity set or map `set` as `rule` of the walk passes it.
    fn affinity(&self, set: &Name, rule: &Rule, context: Context<'_>) -> Affinity {
        Affinity {
            set: set.as_str().to_owned(),
            timeout_secs: self.timeouts_secs.get(set.as_str()).copied(),
            rule: rule_text(rule, context.family),
        }
    }

    fn run_exprs(
        &self,
        rule: &Rule,
        from: usize,
        mut recorded: bool,
        context: Context<'_>,
        mut walk: Walk,
        depth: usize,
    ) -> Result<Vec<(Walk, Flow)>, Unknown> {
        let packet = context.packet;
        let unknown = |expr: &Expr| {
            Unknown(format!(
                "{}: `{}` is not followed",
                rule_text(rule, context.family),
                expr.text(context.family)
            ))
        };
        for (index, expr) in rule.exprs.iter().enumerate().skip(from) {
            let is_match = matches!(
                expr,
                Expr::CtStateNew
                    | Expr::AddrIs { .. }
                    | Expr::AddrNotIn { .. }
                    | Expr::AddrInSet { .. }
                    | Expr::DestinationPort { .. }
                    | Expr::L4Proto(_)
                    | Expr::FibLocal(_)
                    | Expr::InputInterface { .. }
                    | Expr::MarkLacks(_)
                    | Expr::NumgenIs { .. }
                    | Expr::DispatchVmap { .. }
                    | Expr::AddrPairInSet(_)
                    | Expr::EntryInSet { .. }
            );
            if !is_match && !recorded {
                walk.matched.push(rule_text(rule, context.family));
                recorded = true;
            }
            let matched = match expr {
                Expr::CtStateNew => true,
                Expr::FibLocal(AddrField::Source) => packet.src_local,
                Expr::FibLocal(AddrField::Destination) => walk.dst_local(packet),
                Expr::AddrIs {
                    field,
                    negate,
                    value,
                } => value.net().contains(&walk.address(packet, *field)) != *negate,
                Expr::AddrNotIn { field, values } => {
                    let addr = walk.address(packet, *field);
                    !values.iter().any(|value| value.net().contains(&addr))
                }
                Expr::AddrInSet { field, set } if self.dynamic_sets.contains(set.as_str()) => {
                    // An affinity set: a first packet has no entry there;
                    // a client the set holds (read back from the kernel)
                    // goes where it went before.
                    walk.affinity.push(self.affinity(set, rule, context));
                    let addr = walk.address(packet, *field).to_string();
                    self.set_holds(set, addr, &mut walk)
                }
                Expr::AddrInSet { field, set } => {
                    let addr = walk.address(packet, *field).to_string();
                    self.set_holds(set, addr, &mut walk)
                }
                Expr::DestinationPort { protocol, port } => {
                    protocol_keyword(*protocol) == packet.protocol && *port == walk.dport
                }
                Expr::L4Proto(protocol) => protocol_keyword(*protocol) == packet.protocol,
                Expr::MarkLacks(mark) => walk.mark & mark == 0,
                Expr::NumgenIs { modulus, value } if *value < *modulus => {
                    // One in `modulus` packets takes the rule: fork.
                    let share = 1.0 / f64::from(*modulus);
                    let mut missed = walk.clone();
                    missed.probability *= 1.0 - share;
                    walk.probability *= share;
                    let mut out =
                        self.run_exprs(rule, index + 1, recorded, context, walk, depth)?;
                    out.push((missed, Flow::Next));
                    return Ok(out);
                }
                Expr::NumgenIs { .. } => false,
                Expr::DispatchVmap { with_addr, map } => {
                    let key = if *with_addr {
                        format!("{} . {} . {}", walk.dst, packet.protocol, walk.dport)
                    } else {
                        format!("{} . {}", packet.protocol, walk.dport)
                    };
                    let Some(element) = self.maps.get(map.as_str()).and_then(|m| m.get(&key))
                    else {
                        return Ok(vec![(walk, Flow::Next)]);
                    };
                    let Some(verdict) = element else {
                        return Err(Unknown(format!("map {map}: element {key} has no verdict")));
                    };
                    if !recorded {
                        walk.matched.push(rule_text(rule, context.family));
                    }
                    walk.elements.push(format!("{map}: {key} : {verdict}"));
                    return self.verdict(verdict, context, walk, depth);
                }
                Expr::MarkSetOr(mark) => {
                    walk.mark |= mark;
                    true
                }
                Expr::MarkSetXor(mark) => {
                    walk.mark ^= mark;
                    true
                }
                Expr::UpdateSourceSet(set) => {
                    walk.affinity.push(self.affinity(set, rule, context));
                    true
                }
                Expr::Dnat(to) => {
                    walk.dnat(*to);
                    return Ok(vec![(walk, Flow::Accept)]);
                }
                Expr::MasqueradeFullyRandom => {
                    walk.masqueraded = true;
                    return Ok(vec![(walk, Flow::Accept)]);
                }
                Expr::Reject => return Ok(vec![(walk, Flow::Reject)]),
                Expr::AddrPairInSet(set) => {
                    let key = Key::AddrPair(packet.src, walk.dst).to_string();
                    self.set_holds(set, key, &mut walk)
                }
                Expr::EntryInSet { with_addr, set } => {
                    let key = if *with_addr {
                        format!("{} . {} . {}", walk.dst, packet.protocol, walk.dport)
                    } else {
                        format!("{} . {}", packet.protocol, walk.dport)
                    };
                    self.set_holds(set, key, &mut walk)
                }
                Expr::DnatDraw {
                    protocol,
                    with_addr,
                    endpoints,
                    map,
                } => {
                    if protocol_keyword(*protocol) != packet.protocol {
                        return Ok(vec![(walk, Flow::Next)]);
                    }
                    let entry = with_addr.then_some(walk.dst);
                    return self.draw(rule, context, walk, entry, *endpoints, map);
                }
                Expr::Verdict(verdict) => return self.verdict(verdict, context, walk, depth),
                Expr::InputInterface { .. } => return Err(unknown(expr)),
            };
            if !matched {
                return Ok(vec![(walk, Flow::Next)]);
            }
        }
        if !recorded {
            walk.matched.push(rule_text(rule, context.family));
        }
        Ok(vec![(walk, Flow::Next)])
    }

    /// `dnat to [ip daddr .] tcp dport . numgen random mod ENDPOINTS map
    /// @MAP` (`entry` is the destination address when the key holds it):
    /// one path per slot of the entry, each taken by one in
    /// `endpoints` connections, DNATed to the slot's element. A slot
    /// without an element is an error here: the kernel's lookup would miss
    /// and the connection go on past the rule un-DNATed (to the ClusterIP
    /// itself), which no render may leave. Tracing the kernel's table
    /// (`slot_misses_go_on`), that path goes on past the rule instead.
    fn draw(
        &self,
        rule: &Rule,
        context: Context<'_>,
        walk: Walk,
        entry: Option<IpAddr>,
        endpoints: u32,
        map: &Name,
    ) -> Result<Vec<(Walk, Flow)>, Unknown> {
        if endpoints == 0 {
            return Err(Unknown(format!(
                "{}: a draw among 0 slots (the kernel refuses `numgen random mod 0`)",
                rule_text(rule, context.family)
            )));
        }
        let targets = self.targets.get(map.as_str());
        let share = 1.0 / f64::from(endpoints);
        let mut out = Vec::new();
        for slot in 0..endpoints {
            let key = match entry {
                Some(ip) => Key::EntrySlot(ip, walk.dport, slot),
                None => Key::PortSlot(walk.dport, slot),
            }
            .to_string();
            let Some(to) = targets.and_then(|targets| targets.get(&key)).copied() else {
                if context.slot_misses_go_on {
                    let mut path = walk.clone();
                    path.probability *= share;
                    path.elements
                        .push(format!("{map}: {key} : no element (the lookup misses)"));
                    out.push((path, Flow::Next));
                    continue;
                }
                return Err(Unknown(format!(
                    "{}: map {map} has no element {key}: the kernel's lookup misses and \
                     the connection goes on past the rule without DNAT",
                    rule_text(rule, context.family)
                )));
            };
            let mut path = walk.clone();
            path.probability *= share;
            path.elements
                .push(format!("{map}: {key} : {}", endpoint_text(to)));
            path.dnat(to);
            out.push((path, Flow::Accept));
        }
        Ok(out)
    }

    /// Where `verdict` leaves the rule that gives it.
    fn verdict(
        &self,
        verdict: &RuleVerdict,
        context: Context<'_>,
        walk: Walk,
        depth: usize,
    ) -> Result<Vec<(Walk, Flow)>, Unknown> {
        let called = |chain: &str, on_return: Flow| -> Result<Vec<(Walk, Flow)>, Unknown> {
            let out = self.run_chain(chain, context, walk.clone(), depth + 1)?;
            Ok(out
                .into_iter()
                .map(|(walk, flow)| match flow {
                    Flow::Return => (walk, on_return),
                    other => (walk, other),
                })
                .collect())
        };
        match verdict {
            RuleVerdict::Accept => Ok(vec![(walk, Flow::Accept)]),
            RuleVerdict::Drop => Ok(vec![(walk, Flow::Drop)]),
            RuleVerdict::Return => Ok(vec![(walk, Flow::Return)]),
            // After a jump the rule's chain goes on; after a goto, the
            // chain that called it does.
            RuleVerdict::Jump(chain) => called(chain.as_str(), Flow::Next),
            RuleVerdict::Goto(chain) => called(chain.as_str(), Flow::Return),
        }
    }
}

impl Trace {
    /// The paths summed up: dropped if any path drops, DNATed if any path
    /// is, rejected if any path rejects, else accepted.
    pub fn verdict(&self) -> Verdict {
        if self.paths.iter().any(|p| p.verdict == PathVerdict::Drop) {
            return Verdict::Drop;
        }
        let dnat: Vec<&PathOutcome> = self
            .paths
            .iter()
            .filter(|p| p.destination.is_some())
            .collect();
        if !dnat.is_empty() {
            return Verdict::Dnat {
                endpoints: dnat.iter().filter_map(|p| p.destination).collect(),
                masquerade: dnat
                    .iter()
                    .filter(|p| p.masqueraded)
                    .filter_map(|p| p.destination)
                    .collect(),
            };
        }
        if self.paths.iter().any(|p| p.verdict == PathVerdict::Reject) {
            return Verdict::Reject;
        }
        Verdict::Accept
    }
}

impl Walk {
    fn new(packet: &Packet) -> Self {
        Self {
            dst: packet.dst,
            dport: packet.dport,
            mark: 0,
            destination: None,
            masqueraded: false,
            probability: 1.0,
            matched: Vec::new(),
            elements: Vec::new(),
            affinity: Vec::new(),
        }
    }

    /// DNAT to `to`.
    fn dnat(&mut self, to: SocketAddr) {
        self.destination = Some(to);
        self.dst = to.ip();
        self.dport = to.port();
    }

    fn address(&self, packet: &Packet, field: AddrField) -> IpAddr {
        match field {
            AddrField::Source => packet.src,
            AddrField::Destination => self.dst,
        }
    }

    /// `fib daddr type local` of the (possibly DNATed) destination.
    fn dst_local(&self, packet: &Packet) -> bool {
        (self.dst == packet.dst && packet.dst_local)
            || (self.dst == packet.src && packet.src_local)
            || self.dst.is_loopback()
    }

    fn outcome(self, verdict: PathVerdict) -> PathOutcome {
        PathOutcome {
            destination: self.destination,
            verdict,
            masqueraded: self.masqueraded,
            probability: self.probability,
            matched: self.matched,
            elements: self.elements,
            affinity: self.affinity,
        }
    }
}

/// `ADDRESS . PORT`, as a map element's data is written.
fn endpoint_text(to: SocketAddr) -> String {
    format!("{} . {}", to.ip(), to.port())
}

/// `spec` under a [`Name::Shared`] name, as a read-back names it.
pub(crate) fn shared_name(spec: &TypeofSpec) -> TypeofSpec {
    TypeofSpec {
        name: Name::Shared(spec.name.as_str().into()),
        ..spec.clone()
    }
}

/// `CHAIN: RULE`, the rule as the `add rule` line of `--dry-run` prints it
/// after the chain's name.
fn rule_text(rule: &Rule, family: IpFamily) -> String {
    let line = Command::AddRule(rule.clone()).line(family).to_string();
    let prefix = format!(
        "add rule {} {TABLE} {} ",
        family_keyword(family),
        rule.chain
    );
    let text = line.strip_prefix(&prefix).unwrap_or(&line);
    format!("{}: {text}", rule.chain)
}
