//! A packet tracer over the transactions this crate renders.
//!
//! [`Table::apply`] replays transactions (a full one, then partial ones) on
//! an in-memory model of the `kube-proxy` table; [`Table::trace`] follows a
//! new connection's first packet through it the way the kernel's hooks
//! would: source-range firewall before DNAT, the `services` dispatch and
//! the per-service chains in nat, then the refusal checks after DNAT. It
//! knows only the rule shapes the renderer writes and fails loudly on any
//! other, so a renderer change cannot slip past it unnoticed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

/// The `kube-proxy` table of one family, as transactions left it.
#[derive(Debug, Clone, Default)]
pub struct Table {
    /// Rules per chain.
    pub chains: BTreeMap<String, Vec<String>>,
    /// Elements per set or map: key → value (empty for a set).
    pub maps: BTreeMap<String, BTreeMap<String, String>>,
    /// Sets declared (affinity sets among them).
    pub sets: BTreeSet<String>,
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

/// A line or rule the tracer does not know.
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
    pub fn apply(&mut self, text: &str) -> Result<(), Unknown> {
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            self.apply_line(line)
                .ok_or_else(|| Unknown(line.to_owned()))?;
        }
        Ok(())
    }

    fn apply_line(&mut self, line: &str) -> Option<()> {
        let mut words = line.splitn(5, ' ');
        let (verb, kind, _family, table) =
            (words.next()?, words.next()?, words.next()?, words.next()?);
        let rest = words.next().unwrap_or("");
        if kind == "table" {
            if verb == "delete" {
                *self = Self::default();
            }
            return Some(());
        }
        let (name, body) = rest.split_once(' ').unwrap_or((rest, ""));
        if table != "kube-proxy" {
            return None;
        }
        match (verb, kind) {
            ("add", "chain") => {
                self.chains.entry(name.to_owned()).or_default();
            }
            ("flush", "chain") => self.chains.get_mut(name)?.clear(),
            ("delete", "chain") => {
                self.chains.remove(name)?;
            }
            ("add", "rule") => self.chains.get_mut(name)?.push(strip_comment(body)),
            ("add", "set" | "map") => {
                self.sets.insert(name.to_owned());
                self.maps.entry(name.to_owned()).or_default();
            }
            ("flush", "set" | "map") => self.maps.get_mut(name)?.clear(),
            ("delete", "set" | "map") => {
                self.sets.remove(name);
                self.maps.remove(name)?;
            }
            ("add", "element") => self.add_elements(name, body)?,
            ("delete", "element") => {
                let key = body.strip_prefix("{ ")?.strip_suffix(" }")?;
                self.maps.get_mut(name)?.remove(key)?;
            }
            _ => return None,
        }
        Some(())
    }

    fn add_elements(&mut self, map: &str, body: &str) -> Option<()> {
        let inner = body.strip_prefix("{ ")?.strip_suffix(" }")?;
        let elements = self.maps.get_mut(map)?;
        if !inner.contains(" : ") && !inner.contains(" comment ") {
            for key in inner.split(", ") {
                elements.insert(key.to_owned(), String::new());
            }
            return Some(());
        }
        let (key, value) = inner.split_once(" : ").unwrap_or((inner, ""));
        let key = key.split(" comment ").next()?;
        elements.insert(key.to_owned(), value.to_owned());
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
        let Some(value) = self.lookup("firewall-ips", &ip_key(packet)) else {
            return Ok(false);
        };
        let chain = value
            .strip_prefix("goto ")
            .ok_or_else(|| Unknown(value.clone()))?;
        let paths = self.run_chain(chain, packet, 0)?;
        Ok(paths.iter().any(|p| p.dropped))
    }

    /// The filter checks after DNAT, for a packet nat left alone.
    fn refusal(&self, packet: &Packet) -> Verdict {
        let by_verdict = |value: &str| {
            if value == "drop" {
                Verdict::Drop
            } else {
                Verdict::Reject
            }
        };
        if let Some(value) = self.lookup("no-endpoint-services", &ip_key(packet)) {
            return by_verdict(value);
        }
        let port_key = format!("{} . {}", packet.protocol, packet.dport);
        if self.node_port_address(packet) {
            if let Some(value) = self.lookup("no-endpoint-nodeports", &port_key) {
                return by_verdict(value);
            }
        }
        if self
            .lookup("cluster-ips", &packet.dst.to_string())
            .is_some()
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

    fn lookup(&self, map: &str, key: &str) -> Option<&String> {
        self.maps.get(map)?.get(key)
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
        rules: &[String],
        packet: &Packet,
        depth: usize,
        mut state: Path,
    ) -> Result<Vec<Path>, Unknown> {
        for (index, rule) in rules.iter().enumerate() {
            if let Some(choice) = rule.strip_prefix("numgen random mod ") {
                let (_, target) = choice
                    .split_once(" 0 goto ")
                    .ok_or_else(|| Unknown(rule.clone()))?;
                let mut paths = match self.enter(target, packet, depth, &state)? {
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
    fn run_rule(
        &self,
        rule: &str,
        packet: &Packet,
        depth: usize,
        state: &Path,
    ) -> Result<Step, Unknown> {
        let unknown = || Unknown(rule.to_owned());
        let dispatched;
        let mut rest = rule;
        if rule.contains(" vmap @") {
            match dispatch(rule, packet, self) {
                Some(verdict) => {
                    dispatched = verdict;
                    rest = &dispatched;
                }
                None => return Ok(Step::Continue(state.clone())),
            }
        } else {
            // Conditions, each consumed from the front.
            loop {
                let (matched, after) = match_condition(rest, packet, self).ok_or_else(unknown)?;
                match matched {
                    Some(false) => return Ok(Step::Continue(state.clone())),
                    Some(true) => rest = after,
                    None => break,
                }
            }
        }
        let mut next = state.clone();
        if rest == "jump mark-for-masquerade" {
            next.masquerade = true;
            return Ok(Step::Continue(next));
        }
        if rest == "drop" {
            next.dropped = true;
            return Ok(Step::Done(vec![next]));
        }
        if let Some(target) = rest.strip_prefix("goto ") {
            return self.enter(target, packet, depth, &next);
        }
        if let Some(to) = rest.strip_prefix("meta l4proto ") {
            let (_, address) = to.split_once(" dnat to ").ok_or_else(unknown)?;
            next.dnat = Some(address.parse().map_err(|_| unknown())?);
            return Ok(Step::Done(vec![next]));
        }
        if rest.starts_with("update @") {
            return Ok(Step::Continue(next));
        }
        Err(unknown())
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

/// Matches one condition at the front of `rule`: `Some(true)` and the rest
/// when it matches, `Some(false)` when it does not, `None` when the front
/// is an action.
fn match_condition<'r>(
    rule: &'r str,
    packet: &Packet,
    table: &Table,
) -> Option<(Option<bool>, &'r str)> {
    let words: Vec<&str> = rule.splitn(4, ' ').collect();
    let take = |n: usize| -> &'r str {
        let mut rest = rule;
        for _ in 0..n {
            rest = rest.split_once(' ').map_or("", |(_, r)| r);
        }
        rest
    };
    match words.as_slice() {
        ["fib", "saddr", "type", _] => Some((Some(packet.src_local), take(4))),
        ["fib", "daddr", "type", _] => Some((Some(packet.dst_local), take(4))),
        [ipx, field @ ("saddr" | "daddr"), "!=", value] if is_ipx(ipx) => {
            let addr = if *field == "saddr" {
                packet.src
            } else {
                packet.dst
            };
            if value.starts_with('{') {
                let (set, after) = value.strip_prefix("{ ")?.split_once(" } ")?;
                let inside = set.split(", ").any(|v| contains(v, addr));
                return Some((Some(!inside), after));
            }
            let (value, _) = value.split_once(' ').unwrap_or((value, ""));
            Some((Some(!contains(value, addr)), take(4)))
        }
        [ipx, field @ ("saddr" | "daddr"), value, ..] if is_ipx(ipx) => {
            let addr = if *field == "saddr" {
                packet.src
            } else {
                packet.dst
            };
            if let Some(set) = value.strip_prefix('@') {
                // Affinity sets hold no entries in this model.
                let hit = table
                    .maps
                    .get(set)
                    .is_some_and(|m| m.contains_key(&addr.to_string()));
                return Some((Some(hit), take(3)));
            }
            Some((Some(contains(value, addr)), take(3)))
        }
        [proto @ ("tcp" | "udp" | "sctp"), "dport", port, ..] => {
            let hit = *proto == packet.protocol && port.parse() == Ok(packet.dport);
            Some((Some(hit), take(3)))
        }
        _ => Some((None, rule)),
    }
}

/// A dispatch rule (`ip daddr . meta l4proto . th dport vmap @map`, or
/// the NodePort one): the verdict of the matching element, if any.
fn dispatch(rule: &str, packet: &Packet, table: &Table) -> Option<String> {
    let (condition, map) = rule.split_once(" vmap @")?;
    let (key, matches) = if condition.ends_with("daddr . meta l4proto . th dport") {
        (ip_key(packet), true)
    } else {
        let port_key = format!("{} . {}", packet.protocol, packet.dport);
        (port_key, table.node_port_address(packet))
    };
    if !matches {
        return None;
    }
    table.lookup(map, &key).cloned()
}

fn ip_key(packet: &Packet) -> String {
    format!("{} . {} . {}", packet.dst, packet.protocol, packet.dport)
}

fn is_ipx(word: &str) -> bool {
    word == "ip" || word == "ip6"
}

fn contains(value: &str, addr: IpAddr) -> bool {
    if let Ok(net) = value.parse::<ipnet::IpNet>() {
        return net.contains(&addr);
    }
    value.parse::<IpAddr>() == Ok(addr)
}

fn strip_comment(rule: &str) -> String {
    match rule.find(" comment \"") {
        Some(index) => rule[..index].to_owned(),
        None => rule.to_owned(),
    }
}
