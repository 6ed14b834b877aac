//! A packet tracer over the rules this crate renders, and over the rules
//! the kernel holds.
//!
//! [`Ruleset`] holds tables as `iptables-restore --noflush` would leave them
//! after applying rendered text (and, with [`Ruleset::with_jump_rules`], the
//! jump rules in the built-in chains). [`Ruleset::trace`] follows one packet
//! of a new connection through nat PREROUTING or OUTPUT, the filter hooks
//! its (possibly DNATed) destination takes it through, and nat POSTROUTING.
//! `-m statistic` rules fork the trace, so the result lists every path a
//! packet can take: the set of DNAT destinations, whether each path is
//! masqueraded, and the filter verdict.
//!
//! Rules come from restore text we render ([`Ruleset::from_restore`]) or
//! from the kernel as `iptables-save` prints them ([`Ruleset::from_save`],
//! [`Ruleset::from_live`]), where other software's chains and rules sit
//! beside ours. Every option of our own `KUBE-*` chains must be understood
//! (anything else is an error naming the chain and rule). A rule of
//! another chain that the tracer cannot decide is recorded on the path as
//! "not followed" when it cannot change the packet's path, and makes the
//! trace fail when it can.
//!
//! Session affinity (`-m recent --rcheck`) never matches, as for a first
//! packet; each affinity rule the packet passes is reported on its path.
//! `-m set` asks the [`IpSets`] given to [`Ruleset::trace_with_sets`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use kp_model::{IpFamily, Protocol};

use crate::applier::{ApplyError, IptablesFlavor, SystemApplier, Tool};
use crate::jumps::{Table, JUMP_RULES};

mod parse;
mod sets;

pub use parse::Rule;
use parse::{parse_rule, parse_rule_with, words, Match, Strictness, Target};
pub use sets::{IpSetMembers, IpSets};

/// How deep chain jumps may nest before the tracer assumes a loop.
const MAX_JUMP_DEPTH: usize = 32;
const BUILTIN_CHAINS: [&str; 5] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];
/// `KUBE-` chains that are kubelet's alone (flavor hints and its canary):
/// they hold no rules of ours.
const KUBELET_CHAINS: [&str; 2] = ["KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"];
/// The tables a trace passes through, read from the kernel.
const TRACED_TABLES: [Table; 2] = [Table::Nat, Table::Filter];

/// Why rules could not be loaded, checked or traced.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// A line of restore or save text is not understood.
    #[error("line {line}: {reason}: {text}")]
    Parse {
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The kernel's rules could not be read.
    #[error("reading the {family} rules of iptables-{flavor} failed")]
    Live {
        /// The flavor.
        flavor: IptablesFlavor,
        /// `IPv4` or `IPv6`.
        family: &'static str,
        /// The save program's failure.
        #[source]
        source: ApplyError,
    },
    /// What the save program listed of one table is not understood.
    #[error("the output of {command} is not understood")]
    LiveText {
        /// The save command, e.g. `iptables-nft-save -t nat`.
        command: String,
        /// The line at fault.
        #[source]
        source: Box<TraceError>,
    },
    /// The packet reaches a rule the tracer cannot decide, and the rule
    /// could change where the packet goes.
    #[error("{table}/{chain} rule {rule:?}: {reason}; the packet's path depends on it")]
    Undecidable {
        /// The table.
        table: String,
        /// The chain.
        chain: String,
        /// The rule, as written after `-A CHAIN`.
        rule: String,
        /// What the tracer cannot decide.
        reason: String,
    },
    /// Rules jump to chains that do not exist.
    #[error("table {table}: rules jump to chains that do not exist: {chains:?}")]
    MissingChains {
        /// The table.
        table: String,
        /// The missing chains.
        chains: Vec<String>,
    },
}

/// Tables and their chains.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ruleset {
    tables: BTreeMap<String, BTreeMap<String, Vec<Rule>>>,
    /// Policies of built-in chains other than ACCEPT, by table and chain.
    policies: BTreeMap<(String, String), Verdict>,
}

/// A packet opening a new connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Destination port.
    pub dport: u16,
    /// Transport protocol.
    pub protocol: Protocol,
    /// Interface it arrived on (`None` for locally generated packets).
    pub in_interface: Option<String>,
    /// Sent by a process of this host (nat OUTPUT) rather than received
    /// (nat PREROUTING).
    pub local_origin: bool,
}

/// A filter-table verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// Let through (no rule refused it).
    Accept,
    /// Silently dropped.
    Drop,
    /// Refused with an ICMP error.
    Reject,
}

/// One path a packet can take.
#[derive(Debug, Clone, PartialEq)]
pub struct PathOutcome {
    /// Where DNAT sent it, if anywhere.
    pub destination: Option<SocketAddr>,
    /// The filter verdict.
    pub verdict: Verdict,
    /// nat POSTROUTING masquerades (or SNATs) it (only for accepted paths).
    pub masqueraded: bool,
    /// The chance that a new connection takes this path: the product of
    /// the `-m statistic` outcomes on it, with the kernel's rounding.
    pub probability: f64,
    /// The rules that matched, in order, as `table/CHAIN rule`.
    pub matched: Vec<String>,
    /// Session affinity rules the packet passed: a later packet of the
    /// same client within `seconds` takes their jump instead.
    pub affinity: Vec<Affinity>,
    /// Rules of other software's chains the tracer could not decide and
    /// that could not change the path, as `table/CHAIN rule: reason`.
    pub not_followed: Vec<String>,
}

/// A `-m recent --rcheck` rule (session affinity) on a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Affinity {
    /// The recent list (`--name`): the endpoint chain that set it.
    pub list: String,
    /// How long a client stays on the list (`--seconds`).
    pub seconds: Option<u32>,
    /// The rule, as `table/CHAIN rule`.
    pub rule: String,
}

/// What a path does, without the text of the rules: two rulesets that
/// program the same behaviour (the text we render and the kernel's
/// `iptables-save` of it) give equal behaviours.
#[derive(Debug, Clone, PartialEq)]
pub struct PathBehaviour {
    /// Where DNAT sent it, if anywhere.
    pub destination: Option<SocketAddr>,
    /// The filter verdict.
    pub verdict: Verdict,
    /// Masqueraded.
    pub masqueraded: bool,
    /// The chance of the path.
    pub probability: f64,
    /// The chains of the matched rules, in order, as `table/CHAIN`.
    pub chains: Vec<String>,
    /// The affinity lists passed, with their timeouts.
    pub affinity: Vec<(String, Option<u32>)>,
}

/// Every path of one packet.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// The paths, one per combination of `-m statistic` outcomes.
    pub paths: Vec<PathOutcome>,
}

#[derive(Debug, Clone)]
struct State {
    src: IpAddr,
    dst: IpAddr,
    dport: u16,
    mark: u32,
    destination: Option<SocketAddr>,
    probability: f64,
    matched: Vec<String>,
    affinity: Vec<Affinity>,
    not_followed: Vec<String>,
    /// The IPVS virtual server that scheduled the packet (see
    /// [`InFlight::redirect`]): what `-m ipvs --vaddr` asks.
    virtual_server: Option<(IpAddr, u16)>,
}

/// A packet part way through the hooks, for a caller that models what the
/// kernel does between them (IPVS schedules a packet after filter INPUT or
/// nat OUTPUT): [`Ruleset::run_hook`] passes it through one hook,
/// [`InFlight::redirect`] sends it elsewhere, [`InFlight::finish`] ends its
/// path.
#[derive(Debug, Clone)]
pub struct InFlight(State);

impl InFlight {
    /// The first packet of a new connection, before any hook.
    pub fn new(packet: &Packet) -> Self {
        Self(State::start(packet))
    }

    /// Where it is going now: address and port.
    pub fn destination(&self) -> SocketAddr {
        SocketAddr::new(self.0.dst, self.0.dport)
    }

    /// Sends it to `to` on a branch taken with `chance`, as the virtual
    /// server at its current destination schedules it (IPVS masquerading);
    /// `step` is recorded among the matched rules.
    pub fn redirect(&mut self, to: SocketAddr, chance: f64, step: String) {
        self.0.virtual_server = Some((self.0.dst, self.0.dport));
        self.0.dst = to.ip();
        self.0.dport = to.port();
        self.0.destination = Some(to);
        self.0.probability *= chance;
        self.0.matched.push(step);
    }

    /// Records a step taken outside the rules.
    pub fn record(&mut self, step: String) {
        self.0.matched.push(step);
    }

    /// The path, ended with `verdict`.
    pub fn finish(self, verdict: Verdict, masqueraded: bool) -> PathOutcome {
        outcome(self.0, verdict, masqueraded)
    }
}

impl State {
    fn start(packet: &Packet) -> Self {
        State {
            src: packet.src,
            dst: packet.dst,
            dport: packet.dport,
            mark: 0,
            destination: None,
            probability: 1.0,
            matched: Vec::new(),
            affinity: Vec::new(),
            not_followed: Vec::new(),
            virtual_server: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    Stop(Terminal),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Terminal {
    Accept,
    Drop,
    Reject,
    Masquerade,
}

/// Whether a rule matches a packet.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Decision {
    Match,
    NoMatch,
    /// The rule's other matches match, but one cannot be decided.
    Unknown(String),
}

/// Which text a line comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// Restore text we render: everything must be understood.
    Restore,
    /// `iptables-save` output: other software's rules may hold anything.
    Save,
}

/// What `trace` needs besides the rules.
struct Env<'a> {
    protocol: Protocol,
    in_interface: Option<&'a str>,
    local_ips: &'a [IpAddr],
    sets: &'a IpSets,
}

impl Ruleset {
    /// An empty ruleset.
    pub fn new() -> Self {
        Self::default()
    }

    /// The state after applying `text` to an empty ruleset.
    pub fn from_restore(text: &str) -> Result<Self, TraceError> {
        let mut ruleset = Self::new();
        ruleset.apply(text)?;
        Ok(ruleset)
    }

    /// Applies restore text as `iptables-restore --noflush` does: `:CHAIN`
    /// creates or flushes a chain, `-A` appends, `-I` prepends, `-X`
    /// deletes; each table
    /// changes only at its `COMMIT`.
    pub fn apply(&mut self, text: &str) -> Result<(), TraceError> {
        self.apply_text(text, Format::Restore)
    }

    /// The tables as `iptables-save` (legacy or nft, either family) prints
    /// them: built-in chains with their policies and counters, `-m tcp`
    /// and the other modules spelled out, other software's chains and
    /// rules. A line of one of our `KUBE-*` chains that is not understood
    /// is an error naming it; other chains' rules are kept as they are
    /// and judged when a packet reaches them.
    pub fn from_save(text: &str) -> Result<Self, TraceError> {
        let mut ruleset = Self::new();
        ruleset.apply_text(text, Format::Save)?;
        Ok(ruleset)
    }

    /// The nat and filter tables of `family` in the kernel, as the save
    /// program of `flavor` lists them (`iptables-nft-save -t nat`, then
    /// `-t filter`), in the calling thread's network namespace. The mangle
    /// table is not read: neither the iptables nor the IPVS mode writes a
    /// rule there (only the canary chain), and a trace does not pass it.
    pub fn from_live(flavor: IptablesFlavor, family: IpFamily) -> Result<Self, TraceError> {
        Self::from_applier(&SystemApplier::new(flavor), family)
    }

    /// [`Self::from_live`] with the programs `applier` runs (in the network
    /// namespace it was told to use, if any).
    pub fn from_applier(applier: &SystemApplier, family: IpFamily) -> Result<Self, TraceError> {
        let mut ruleset = Self::new();
        for table in TRACED_TABLES {
            let saved = applier
                .save_text(family, table)
                .map_err(|source| TraceError::Live {
                    flavor: applier.flavor(),
                    family: family.as_api_str(),
                    source,
                })?;
            // One table at a time, so that a line number is the program's.
            ruleset
                .apply_text(&saved, Format::Save)
                .map_err(|source| TraceError::LiveText {
                    command: format!(
                        "{} -t {table}",
                        applier.flavor().program(family, Tool::Save)
                    ),
                    source: Box::new(source),
                })?;
        }
        Ok(ruleset)
    }

    fn apply_text(&mut self, text: &str, format: Format) -> Result<(), TraceError> {
        let mut pending: Option<(String, BTreeMap<String, Vec<Rule>>)> = None;
        for (index, line) in text.lines().enumerate() {
            let fail = |reason: String| TraceError::Parse {
                line: index + 1,
                text: line.to_owned(),
                reason,
            };
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(table) = line.strip_prefix('*') {
                let chains = self.tables.get(table).cloned().unwrap_or_default();
                pending = Some((table.to_owned(), chains));
                continue;
            }
            let Some((table, chains)) = pending.as_mut() else {
                return Err(fail("line outside of a table".to_owned()));
            };
            if line == "COMMIT" {
                let (table, chains) = (table.clone(), std::mem::take(chains));
                self.tables.insert(table, chains);
                pending = None;
                continue;
            }
            let policy = apply_line(chains, line, format).map_err(fail)?;
            if let Some((chain, verdict)) = policy {
                self.policies.insert((table.clone(), chain), verdict);
            }
        }
        match pending {
            Some((table, _)) => Err(TraceError::Parse {
                line: text.lines().count(),
                text: String::new(),
                reason: format!("table {table} has no COMMIT"),
            }),
            None => Ok(()),
        }
    }

    /// Adds the [`JUMP_RULES`] to the built-in chains, in the order they
    /// end up in on a clean host (each one is prepended), creating missing
    /// target chains empty, as the applier's `iptables -N` does.
    pub fn with_jump_rules(mut self) -> Result<Self, TraceError> {
        for jump in JUMP_RULES.iter().rev() {
            let line = jump.restore_line();
            let rule = words(&line)
                .and_then(|words| parse_rule(&words[2..]))
                .map_err(|reason| TraceError::Parse {
                    line: 0,
                    text: line.clone(),
                    reason,
                })?;
            let chains = self
                .tables
                .entry(jump.table.as_str().to_owned())
                .or_default();
            chains.entry(jump.target_chain.to_owned()).or_default();
            chains
                .entry(jump.builtin_chain.to_owned())
                .or_default()
                .push(rule);
        }
        Ok(self)
    }

    /// Names of the chains of `table`, sorted.
    pub fn chains(&self, table: Table) -> Vec<&str> {
        self.tables
            .get(table.as_str())
            .map(|chains| chains.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }

    /// Rules of one chain, as written after `-A CHAIN`.
    pub fn rules(&self, table: Table, chain: &str) -> Option<Vec<&str>> {
        let rules = self.tables.get(table.as_str())?.get(chain)?;
        Some(rules.iter().map(|rule| rule.raw.as_str()).collect())
    }

    /// Checks that every jump goes to a chain that exists.
    pub fn check_jumps(&self) -> Result<(), TraceError> {
        for (table, chains) in &self.tables {
            let missing: BTreeSet<&String> = chains
                .values()
                .flatten()
                .filter_map(|rule| match &rule.target {
                    Target::Jump(chain) if !chains.contains_key(chain) => Some(chain),
                    _ => None,
                })
                .collect();
            if !missing.is_empty() {
                return Err(TraceError::MissingChains {
                    table: table.clone(),
                    chains: missing.into_iter().cloned().collect(),
                });
            }
        }
        Ok(())
    }

    /// Follows `packet`; `local_ips` are this host's addresses (loopback is
    /// always local), which decide `-m addrtype` matches and which filter
    /// hooks a packet takes. Rules matching ipsets cannot be decided: see
    /// [`Self::trace_with_sets`].
    pub fn trace(&self, packet: &Packet, local_ips: &[IpAddr]) -> Result<Trace, TraceError> {
        self.trace_with_sets(packet, local_ips, &IpSets::default())
    }

    /// [`Self::trace`], with the members of the ipsets that `-m set`
    /// rules ask.
    pub fn trace_with_sets(
        &self,
        packet: &Packet,
        local_ips: &[IpAddr],
        sets: &IpSets,
    ) -> Result<Trace, TraceError> {
        let env = Env {
            protocol: packet.protocol,
            in_interface: packet
                .in_interface
                .as_deref()
                .filter(|_| !packet.local_origin),
            local_ips,
            sets,
        };
        let start = State::start(packet);
        let nat_hook = if packet.local_origin {
            "OUTPUT"
        } else {
            "PREROUTING"
        };
        let mut paths = Vec::new();
        for (state, _) in self.run_chain("nat", nat_hook, start, &env, 0)? {
            // A packet of this host leaves through filter OUTPUT and, sent
            // to one of the host's own addresses, comes back in through
            // INPUT; it never passes FORWARD. A received packet passes INPUT
            // or FORWARD.
            let mut hooks = Vec::new();
            if packet.local_origin {
                hooks.push("OUTPUT");
            }
            if env.is_local(state.dst) {
                hooks.push("INPUT");
            } else if !packet.local_origin {
                hooks.push("FORWARD");
            }
            paths.extend(self.filter_and_postrouting(state, &hooks, &env)?);
        }
        Ok(Trace { paths })
    }

    /// Passes `packet` (`in_flight`, as far as it got) through one hook:
    /// each resulting path with the hook's verdict (its policy when the
    /// packet falls off its end) and whether it was masqueraded there.
    pub fn run_hook(
        &self,
        table: Table,
        hook: &str,
        packet: &Packet,
        in_flight: InFlight,
        local_ips: &[IpAddr],
        sets: &IpSets,
    ) -> Result<Vec<(InFlight, Verdict, bool)>, TraceError> {
        let env = Env {
            protocol: packet.protocol,
            in_interface: packet
                .in_interface
                .as_deref()
                .filter(|_| !packet.local_origin),
            local_ips,
            sets,
        };
        let policy = self.policy(table.as_str(), hook);
        Ok(self
            .run_chain(table.as_str(), hook, in_flight.0, &env, 0)?
            .into_iter()
            .map(|(state, flow)| {
                let masqueraded = flow == Flow::Stop(Terminal::Masquerade);
                (InFlight(state), filter_verdict(flow, policy), masqueraded)
            })
            .collect())
    }

    fn filter_and_postrouting(
        &self,
        start: State,
        hooks: &[&str],
        env: &Env<'_>,
    ) -> Result<Vec<PathOutcome>, TraceError> {
        let mut states = vec![(start, Verdict::Accept)];
        for hook in hooks {
            let mut next = Vec::new();
            for (state, verdict) in states {
                if verdict != Verdict::Accept {
                    next.push((state, verdict));
                    continue;
                }
                let policy = self.policy("filter", hook);
                for (state, flow) in self.run_chain("filter", hook, state, env, 0)? {
                    next.push((state, filter_verdict(flow, policy)));
                }
            }
            states = next;
        }
        let mut paths = Vec::new();
        for (state, verdict) in states {
            if verdict != Verdict::Accept {
                paths.push(outcome(state, verdict, false));
                continue;
            }
            for (state, flow) in self.run_chain("nat", "POSTROUTING", state, env, 0)? {
                let masqueraded = flow == Flow::Stop(Terminal::Masquerade);
                paths.push(outcome(state, verdict, masqueraded));
            }
        }
        Ok(paths)
    }

    /// The policy of a built-in chain.
    fn policy(&self, table: &str, chain: &str) -> Verdict {
        self.policies
            .get(&(table.to_owned(), chain.to_owned()))
            .copied()
            .unwrap_or(Verdict::Accept)
    }

    /// Runs `state` through one chain; returns each resulting state with
    /// whether it fell off the end / returned, or stopped.
    fn run_chain(
        &self,
        table: &str,
        chain: &str,
        state: State,
        env: &Env<'_>,
        depth: usize,
    ) -> Result<Vec<(State, Flow)>, TraceError> {
        let rules = match self.tables.get(table).and_then(|chains| chains.get(chain)) {
            Some(rules) if depth < MAX_JUMP_DEPTH => rules,
            _ => return Ok(vec![(state, Flow::Continue)]),
        };
        let mut results = Vec::new();
        let mut pending = vec![(state, 0usize)];
        'paths: while let Some((mut state, start)) = pending.pop() {
            for (index, rule) in rules.iter().enumerate().skip(start) {
                let at = || format!("{table}/{chain} {}", rule.raw);
                match env.decide(rule, &state) {
                    Decision::NoMatch => continue,
                    Decision::Match => {}
                    Decision::Unknown(reason) => {
                        if is_own_chain(chain)
                            || !self.cannot_change_path(table, rule, &state, env, depth)?
                        {
                            return Err(TraceError::Undecidable {
                                table: table.to_owned(),
                                chain: chain.to_owned(),
                                rule: rule.raw.clone(),
                                reason,
                            });
                        }
                        state.not_followed.push(format!("{}: {reason}", at()));
                        continue;
                    }
                }
                if let Some(Match::RecentCheck { name, seconds }) = rule
                    .matches
                    .iter()
                    .find(|m| matches!(m, Match::RecentCheck { .. }))
                {
                    // A first packet's source is on no list: the rule is
                    // passed, and reported.
                    state.affinity.push(Affinity {
                        list: name.clone(),
                        seconds: *seconds,
                        rule: at(),
                    });
                    continue;
                }
                if let Some(p) = rule.matches.iter().find_map(|m| match m {
                    Match::Probability(p) => Some(*p),
                    _ => None,
                }) {
                    let chance = f64::from(p) / f64::from(1u32 << 31);
                    let mut missed = state.clone();
                    missed.probability *= 1.0 - chance;
                    pending.push((missed, index + 1));
                    state.probability *= chance;
                }
                state.matched.push(at());
                let flow = match &rule.target {
                    Target::Jump(sub) => {
                        for (next, flow) in self.run_chain(table, sub, state, env, depth + 1)? {
                            match flow {
                                Flow::Continue => pending.push((next, index + 1)),
                                stop => results.push((next, stop)),
                            }
                        }
                        continue 'paths;
                    }
                    Target::Extension(name) if !rule.target.is_inert() => {
                        return Err(TraceError::Undecidable {
                            table: table.to_owned(),
                            chain: chain.to_owned(),
                            rule: rule.raw.clone(),
                            reason: format!("target {name} is not modelled"),
                        });
                    }
                    target => match apply_target(target, &mut state) {
                        Some(flow) => flow,
                        None => continue,
                    },
                };
                results.push((state, flow));
                continue 'paths;
            }
            results.push((state, Flow::Continue));
        }
        Ok(results)
    }

    /// Whether `rule`, were it to match, would leave the packet's path as
    /// it is: its target does nothing to the packet, or it jumps to a chain
    /// that, entered with this packet, changes nothing and stops nothing.
    fn cannot_change_path(
        &self,
        table: &str,
        rule: &Rule,
        state: &State,
        env: &Env<'_>,
        depth: usize,
    ) -> Result<bool, TraceError> {
        let Target::Jump(sub) = &rule.target else {
            return Ok(rule.target.is_inert());
        };
        let results = self.run_chain(table, sub, state.clone(), env, depth + 1)?;
        Ok(results.iter().all(|(after, flow)| {
            *flow == Flow::Continue
                && after.mark == state.mark
                && after.destination == state.destination
                && after.probability == state.probability
        }))
    }
}

impl Env<'_> {
    fn is_local(&self, ip: IpAddr) -> bool {
        ip.is_loopback() || self.local_ips.contains(&ip)
    }

    /// Whether `rule` matches; a rule whose decided matches fail does not
    /// match, whatever its undecided ones would say.
    fn decide(&self, rule: &Rule, state: &State) -> Decision {
        let mut unknown = rule
            .unknown
            .first()
            .map(|option| format!("the tracer does not model {option}"));
        for m in &rule.matches {
            match self.matches(m, state) {
                Ok(true) => {}
                Ok(false) => return Decision::NoMatch,
                Err(reason) => {
                    unknown.get_or_insert(reason);
                }
            }
        }
        match unknown {
            Some(reason) => Decision::Unknown(reason),
            None => Decision::Match,
        }
    }

    fn matches(&self, m: &Match, state: &State) -> Result<bool, String> {
        Ok(match m {
            Match::Protocol(negate, protocol) => {
                (protocol == self.protocol.as_rule_str()) != *negate
            }
            Match::Source(negate, net) => net.contains(&state.src) != *negate,
            Match::Destination(negate, net) => net.contains(&state.dst) != *negate,
            Match::InInterface(negate, name) => {
                interface_matches(name, self.in_interface) != *negate
            }
            Match::DestinationPort(negate, ranges) => {
                let inside = ranges
                    .iter()
                    .any(|(low, high)| (*low..=*high).contains(&state.dport));
                inside != *negate
            }
            Match::SourceLocal(want) => self.is_local(state.src) == *want,
            Match::DestinationLocal(want) => self.is_local(state.dst) == *want,
            Match::Mark(negate, mark, mask) => ((state.mark & mask) == *mark) != *negate,
            Match::ConntrackState(negate, states) => {
                let dnat = state.destination.is_some();
                let any = states.iter().any(|s| s == "NEW" || (s == "DNAT" && dnat));
                any != *negate
            }
            Match::Probability(_) | Match::RecentCheck { .. } => true,
            Match::Set {
                negate,
                name,
                flags,
            } => {
                let lookup = sets::Lookup {
                    src: state.src,
                    dst: state.dst,
                    protocol: self.protocol,
                    dport: state.dport,
                };
                self.sets.contains(name, flags, &lookup)? != *negate
            }
            // A trace follows routed packets, not bridged ones.
            Match::PhysdevIsIn(negate) => *negate,
            Match::Ipvs {
                vaddr,
                vproto,
                vport,
            } => {
                let (dst, dport) = state.virtual_server.unwrap_or((state.dst, state.dport));
                // iptables-save prints the protocol's number.
                let number = match self.protocol {
                    Protocol::Tcp => "6",
                    Protocol::Udp => "17",
                    Protocol::Sctp => "132",
                };
                vaddr.is_none_or(|net| net.contains(&dst))
                    && vproto
                        .as_deref()
                        .is_none_or(|p| p == self.protocol.as_rule_str() || p == number)
                    && vport.is_none_or(|port| port == dport)
            }
        })
    }
}

impl Trace {
    /// DNAT destinations of accepted paths.
    pub fn destinations(&self) -> BTreeSet<SocketAddr> {
        self.paths
            .iter()
            .filter(|path| path.verdict == Verdict::Accept)
            .filter_map(|path| path.destination)
            .collect()
    }

    /// The verdicts of all paths.
    pub fn verdicts(&self) -> BTreeSet<Verdict> {
        self.paths.iter().map(|path| path.verdict).collect()
    }

    /// Every path ends in `verdict`.
    pub fn always(&self, verdict: Verdict) -> bool {
        !self.paths.is_empty() && self.paths.iter().all(|path| path.verdict == verdict)
    }

    /// Every path is accepted and masqueraded.
    pub fn always_masqueraded(&self) -> bool {
        self.always(Verdict::Accept) && self.paths.iter().all(|path| path.masqueraded)
    }

    /// No path is masqueraded.
    pub fn never_masqueraded(&self) -> bool {
        self.paths.iter().all(|path| !path.masqueraded)
    }

    /// What each path does, without rule text (see [`PathBehaviour`]).
    pub fn behaviour(&self) -> Vec<PathBehaviour> {
        self.paths.iter().map(PathOutcome::behaviour).collect()
    }
}

impl PathOutcome {
    /// What this path does, without rule text.
    pub fn behaviour(&self) -> PathBehaviour {
        PathBehaviour {
            destination: self.destination,
            verdict: self.verdict,
            masqueraded: self.masqueraded,
            probability: self.probability,
            chains: self
                .matched
                .iter()
                .map(|rule| rule.split(' ').next().unwrap_or_default().to_owned())
                .collect(),
            affinity: self
                .affinity
                .iter()
                .map(|a| (a.list.clone(), a.seconds))
                .collect(),
        }
    }
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, path) in self.paths.iter().enumerate() {
            let to = path
                .destination
                .map(|d| d.to_string())
                .unwrap_or_else(|| "-".into());
            writeln!(
                f,
                "path {i}: {:?} to {to}, masqueraded: {}, probability {:.4}",
                path.verdict, path.masqueraded, path.probability
            )?;
            for rule in &path.matched {
                writeln!(f, "    {rule}")?;
            }
            for affinity in &path.affinity {
                let seconds = affinity
                    .seconds
                    .map_or_else(|| "-".to_owned(), |s| s.to_string());
                writeln!(
                    f,
                    "    affinity: list {} for {seconds} s: {}",
                    affinity.list, affinity.rule
                )?;
            }
            for rule in &path.not_followed {
                writeln!(f, "    not followed: {rule}")?;
            }
        }
        Ok(())
    }
}

impl Packet {
    /// A TCP packet from `src` to `dst:dport` arriving from outside.
    pub fn tcp(src: IpAddr, dst: IpAddr, dport: u16) -> Self {
        Packet {
            src,
            dst,
            dport,
            protocol: Protocol::Tcp,
            in_interface: None,
            local_origin: false,
        }
    }

    /// The same packet with another protocol.
    pub fn with_protocol(mut self, protocol: Protocol) -> Self {
        self.protocol = protocol;
        self
    }

    /// The same packet arriving on `interface`.
    pub fn from_interface(mut self, interface: &str) -> Self {
        self.in_interface = Some(interface.to_owned());
        self
    }

    /// The same packet sent by a process of this host.
    pub fn from_host(mut self) -> Self {
        self.local_origin = true;
        self
    }
}

/// Applies one line of a table; returns the policy of a built-in chain
/// when the line declares one other than ACCEPT.
fn apply_line(
    chains: &mut BTreeMap<String, Vec<Rule>>,
    line: &str,
    format: Format,
) -> Result<Option<(String, Verdict)>, String> {
    let mut words = words(line)?;
    // `iptables-save -c` puts the counters first: `[12:345] -A CHAIN …`.
    if format == Format::Save && words.first().is_some_and(|w| w.starts_with('[')) {
        words.remove(0);
    }
    match words.first().map(String::as_str) {
        Some(declaration) if declaration.starts_with(':') => {
            let chain = &declaration[1..];
            let rules = chains.entry(chain.to_owned()).or_default();
            if !BUILTIN_CHAINS.contains(&chain) {
                rules.clear();
                return Ok(None);
            }
            Ok(match words.get(1).map(String::as_str) {
                Some("DROP") => Some((chain.to_owned(), Verdict::Drop)),
                _ => None,
            })
        }
        Some(command @ ("-A" | "-I")) => {
            let chain = words
                .get(1)
                .ok_or_else(|| format!("{command} needs a chain"))?;
            let strictness = match format {
                Format::Save if !is_own_chain(chain) => Strictness::Lenient,
                _ => Strictness::Strict,
            };
            let mut rule = parse_rule_with(&words[2..], strictness)?;
            // A chain of other software with an upper-case name, taken for
            // a target extension by the parser.
            if let Target::Extension(name) = &rule.target {
                if chains.contains_key(name) {
                    rule.target = Target::Jump(name.clone());
                }
            }
            require_target(chains, &rule)?;
            let rules = if BUILTIN_CHAINS.contains(&chain.as_str()) {
                chains.entry(chain.clone()).or_default()
            } else {
                chains
                    .get_mut(chain)
                    .ok_or_else(|| format!("chain {chain} does not exist"))?
            };
            if command == "-A" {
                rules.push(rule);
            } else {
                rules.insert(0, rule);
            }
            Ok(None)
        }
        Some("-X") => {
            let chain = words.get(1).ok_or("-X needs a chain")?;
            let referenced = chains.iter().any(|(from, rules)| {
                from != chain
                    && rules
                        .iter()
                        .any(|r| matches!(&r.target, Target::Jump(to) if to == chain))
            });
            if referenced {
                // The kernel refuses to delete a chain a rule jumps to.
                return Err(format!(
                    "chain {chain} is still referenced (Too many links)"
                ));
            }
            chains
                .remove(chain)
                .map(|_| None)
                .ok_or_else(|| format!("chain {chain} does not exist"))
        }
        _ => Err("unknown command".to_owned()),
    }
}

/// Our chains: every `KUBE-` chain but kubelet's own.
fn is_own_chain(chain: &str) -> bool {
    chain.starts_with("KUBE-") && !KUBELET_CHAINS.contains(&chain)
}

/// As the kernel: a rule may only jump to a chain the table holds.
fn require_target(chains: &BTreeMap<String, Vec<Rule>>, rule: &Rule) -> Result<(), String> {
    match &rule.target {
        Target::Jump(to) if !chains.contains_key(to) => Err(format!(
            "Couldn't load target `{to}': No such file or directory"
        )),
        _ => Ok(()),
    }
}

/// Applies a non-jump target; `None` when the rule does not end the chain.
fn apply_target(target: &Target, state: &mut State) -> Option<Flow> {
    match target {
        Target::None | Target::Jump(_) | Target::Extension(_) => None,
        Target::OrMark(bits) => {
            state.mark |= bits;
            None
        }
        Target::XorMark(bits) => {
            state.mark ^= bits;
            None
        }
        Target::SetXmark(bits, mask) => {
            state.mark = (state.mark & !mask) ^ bits;
            None
        }
        Target::Return => Some(Flow::Continue),
        Target::Accept => Some(Flow::Stop(Terminal::Accept)),
        Target::Drop => Some(Flow::Stop(Terminal::Drop)),
        Target::Reject => Some(Flow::Stop(Terminal::Reject)),
        Target::Masquerade | Target::Snat => Some(Flow::Stop(Terminal::Masquerade)),
        Target::Dnat(ip, port) => {
            let port = port.unwrap_or(state.dport);
            state.destination = Some(SocketAddr::new(*ip, port));
            state.dst = *ip;
            state.dport = port;
            Some(Flow::Stop(Terminal::Accept))
        }
    }
}

fn interface_matches(pattern: &str, interface: Option<&str>) -> bool {
    match (pattern.strip_suffix('+'), interface) {
        (_, None) => false,
        (Some(prefix), Some(name)) => name.starts_with(prefix),
        (None, Some(name)) => name == pattern,
    }
}

/// The verdict of a filter hook; falling off its end takes the policy.
fn filter_verdict(flow: Flow, policy: Verdict) -> Verdict {
    match flow {
        Flow::Stop(Terminal::Drop) => Verdict::Drop,
        Flow::Stop(Terminal::Reject) => Verdict::Reject,
        Flow::Continue => policy,
        Flow::Stop(_) => Verdict::Accept,
    }
}

fn outcome(state: State, verdict: Verdict, masqueraded: bool) -> PathOutcome {
    PathOutcome {
        destination: state.destination,
        verdict,
        masqueraded,
        probability: state.probability,
        matched: state.matched,
        affinity: state.affinity,
        not_followed: state.not_followed,
    }
}
