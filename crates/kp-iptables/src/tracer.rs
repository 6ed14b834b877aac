//! A packet tracer over the rules this crate renders.
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
//! It understands the rule shapes we write, not iptables in general:
//! session affinity (`-m recent --rcheck`) never matches, as for a first
//! packet, and unknown options are parse errors.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use kp_model::Protocol;

use crate::jumps::{Table, JUMP_RULES};

mod parse;

pub use parse::Rule;
use parse::{parse_rule, words, Match, Target};

/// How deep chain jumps may nest before the tracer assumes a loop.
const MAX_JUMP_DEPTH: usize = 32;
const BUILTIN_CHAINS: [&str; 5] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];

/// Why text could not be loaded or checked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    /// A line of restore text is not understood.
    #[error("restore text line {line}: {reason}: {text}")]
    Parse {
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
        /// What is wrong with it.
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathOutcome {
    /// Where DNAT sent it, if anywhere.
    pub destination: Option<SocketAddr>,
    /// The filter verdict.
    pub verdict: Verdict,
    /// nat POSTROUTING masquerades it (only for accepted paths).
    pub masqueraded: bool,
    /// The rules that matched, in order, as `table/CHAIN rule`.
    pub matched: Vec<String>,
}

/// Every path of one packet.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    matched: Vec<String>,
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

/// What `trace` needs besides the rules.
struct Env<'a> {
    protocol: &'static str,
    in_interface: Option<&'a str>,
    local_ips: &'a [IpAddr],
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
            apply_line(chains, line).map_err(fail)?;
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
    /// hooks a packet takes.
    pub fn trace(&self, packet: &Packet, local_ips: &[IpAddr]) -> Trace {
        let env = Env {
            protocol: packet.protocol.as_rule_str(),
            in_interface: packet
                .in_interface
                .as_deref()
                .filter(|_| !packet.local_origin),
            local_ips,
        };
        let start = State {
            src: packet.src,
            dst: packet.dst,
            dport: packet.dport,
            mark: 0,
            destination: None,
            matched: Vec::new(),
        };
        let nat_hook = if packet.local_origin {
            "OUTPUT"
        } else {
            "PREROUTING"
        };
        let mut paths = Vec::new();
        for (state, _) in self.run_chain("nat", nat_hook, start, &env, 0) {
            let mut hooks = Vec::new();
            if packet.local_origin {
                hooks.push("OUTPUT");
            }
            hooks.push(if env.is_local(state.dst) {
                "INPUT"
            } else {
                "FORWARD"
            });
            paths.extend(self.filter_and_postrouting(state, &hooks, &env));
        }
        Trace { paths }
    }

    fn filter_and_postrouting(
        &self,
        start: State,
        hooks: &[&str],
        env: &Env<'_>,
    ) -> Vec<PathOutcome> {
        let mut states = vec![(start, Verdict::Accept)];
        for hook in hooks {
            states = states
                .into_iter()
                .flat_map(|(state, verdict)| match verdict {
                    Verdict::Accept => self
                        .run_chain("filter", hook, state, env, 0)
                        .into_iter()
                        .map(|(state, flow)| (state, filter_verdict(flow)))
                        .collect(),
                    refused => vec![(state, refused)],
                })
                .collect();
        }
        let mut paths = Vec::new();
        for (state, verdict) in states {
            if verdict != Verdict::Accept {
                paths.push(outcome(state, verdict, false));
                continue;
            }
            for (state, flow) in self.run_chain("nat", "POSTROUTING", state, env, 0) {
                let masqueraded = flow == Flow::Stop(Terminal::Masquerade);
                paths.push(outcome(state, verdict, masqueraded));
            }
        }
        paths
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
    ) -> Vec<(State, Flow)> {
        let rules = match self.tables.get(table).and_then(|chains| chains.get(chain)) {
            Some(rules) if depth < MAX_JUMP_DEPTH => rules,
            _ => return vec![(state, Flow::Continue)],
        };
        let mut results = Vec::new();
        let mut pending = vec![(state, 0usize)];
        'paths: while let Some((mut state, start)) = pending.pop() {
            for (index, rule) in rules.iter().enumerate().skip(start) {
                if !env.matches(rule, &state) {
                    continue;
                }
                if rule
                    .matches
                    .iter()
                    .any(|m| matches!(m, Match::Probability(_)))
                {
                    pending.push((state.clone(), index + 1));
                }
                state.matched.push(format!("{table}/{chain} {}", rule.raw));
                let flow = match &rule.target {
                    Target::Jump(sub) => {
                        for (next, flow) in self.run_chain(table, sub, state, env, depth + 1) {
                            match flow {
                                Flow::Continue => pending.push((next, index + 1)),
                                stop => results.push((next, stop)),
                            }
                        }
                        continue 'paths;
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
        results
    }
}

impl Env<'_> {
    fn is_local(&self, ip: IpAddr) -> bool {
        ip.is_loopback() || self.local_ips.contains(&ip)
    }

    fn matches(&self, rule: &Rule, state: &State) -> bool {
        rule.matches.iter().all(|m| match m {
            Match::Protocol(negate, protocol) => (protocol == self.protocol) != *negate,
            Match::Source(negate, net) => net.contains(&state.src) != *negate,
            Match::Destination(negate, net) => net.contains(&state.dst) != *negate,
            Match::InInterface(negate, name) => {
                interface_matches(name, self.in_interface) != *negate
            }
            Match::DestinationPort(negate, port) => (*port == state.dport) != *negate,
            Match::SourceLocal(want) => self.is_local(state.src) == *want,
            Match::DestinationLocal(want) => self.is_local(state.dst) == *want,
            Match::Mark(negate, mark, mask) => ((state.mark & mask) == *mark) != *negate,
            Match::ConntrackState(negate, states) => {
                let dnat = state.destination.is_some();
                let any = states.iter().any(|s| s == "NEW" || (s == "DNAT" && dnat));
                any != *negate
            }
            Match::Probability(_) => true,
            Match::RecentCheck => false,
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
                "path {i}: {:?} to {to}, masqueraded: {}",
                path.verdict, path.masqueraded
            )?;
            for rule in &path.matched {
                writeln!(f, "    {rule}")?;
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

fn apply_line(chains: &mut BTreeMap<String, Vec<Rule>>, line: &str) -> Result<(), String> {
    let words = words(line)?;
    match words.first().map(String::as_str) {
        Some(declaration) if declaration.starts_with(':') => {
            let chain = &declaration[1..];
            let rules = chains.entry(chain.to_owned()).or_default();
            if !BUILTIN_CHAINS.contains(&chain) {
                rules.clear();
            }
            Ok(())
        }
        Some("-A") => {
            let chain = words.get(1).ok_or("-A needs a chain")?;
            let rule = parse_rule(&words[2..])?;
            require_target(chains, &rule)?;
            let rules = chains
                .get_mut(chain)
                .ok_or_else(|| format!("chain {chain} does not exist"))?;
            rules.push(rule);
            Ok(())
        }
        Some("-I") => {
            let chain = words.get(1).ok_or("-I needs a chain")?;
            let rule = parse_rule(&words[2..])?;
            require_target(chains, &rule)?;
            let rules = if BUILTIN_CHAINS.contains(&chain.as_str()) {
                chains.entry(chain.clone()).or_default()
            } else {
                chains
                    .get_mut(chain)
                    .ok_or_else(|| format!("chain {chain} does not exist"))?
            };
            rules.insert(0, rule);
            Ok(())
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
                .map(|_| ())
                .ok_or_else(|| format!("chain {chain} does not exist"))
        }
        _ => Err("unknown command".to_owned()),
    }
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
        Target::None | Target::Jump(_) => None,
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
        Target::Masquerade => Some(Flow::Stop(Terminal::Masquerade)),
        Target::Dnat(to) => {
            state.destination = Some(*to);
            state.dst = to.ip();
            state.dport = to.port();
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

fn filter_verdict(flow: Flow) -> Verdict {
    match flow {
        Flow::Stop(Terminal::Drop) => Verdict::Drop,
        Flow::Stop(Terminal::Reject) => Verdict::Reject,
        _ => Verdict::Accept,
    }
}

fn outcome(state: State, verdict: Verdict, masqueraded: bool) -> PathOutcome {
    PathOutcome {
        destination: state.destination,
        verdict,
        masqueraded,
        matched: state.matched,
    }
}
