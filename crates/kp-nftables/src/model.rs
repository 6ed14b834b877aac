//! The typed form of a transaction: the commands the renderer writes, with
//! their rules' matches and statements as values.
//!
//! One value has two readings: [`fmt::Display`] prints the `nft -f` text
//! (what `--dry-run` shows and what [`crate::NftApplier`] sends), and the
//! netlink encoder ([`crate::netlink`]) writes its nf_tables messages from
//! the same value. The rule grammar therefore exists once: a command the
//! renderer can build is one the encoder can send, and no text is read
//! back.
//!
//! Each command is one line of the text, so a refused command is named by
//! its line number and line, as `nft -f` names it.

use std::cmp::Ordering;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use kp_model::{IpFamily, Protocol};

use crate::options::family_keyword;

/// One transaction for the `kube-proxy` table of one family: `nft -f`
/// input, committed atomically.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transaction {
    /// The family of the table.
    pub family: IpFamily,
    /// The commands, one line each, in order.
    pub commands: Vec<Command>,
}

/// The name of a chain or set: one of the table's fixed names, or a
/// Service's (shared with the record, so naming it costs no copy).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Name {
    /// A fixed name, e.g. `services`.
    Fixed(&'static str),
    /// A Service's chain or set, e.g. `service-…-ns1/web/tcp/http`.
    Shared(Arc<str>),
}

/// One command (one line) of a transaction.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Command {
    /// `add table F kube-proxy [{ comment "C" ; }]`.
    AddTable {
        /// The table's comment.
        comment: Option<&'static str>,
    },
    /// `delete table F kube-proxy`.
    DeleteTable,
    /// `add chain F kube-proxy NAME [{ … }]`.
    AddChain {
        /// The chain.
        name: Name,
        /// A base chain's hook, or a comment.
        kind: ChainKind,
    },
    /// `flush chain F kube-proxy NAME`: deletes the chain's rules.
    FlushChain(Name),
    /// `delete chain F kube-proxy NAME`.
    DeleteChain(Name),
    /// `add set|map F kube-proxy NAME { … }`.
    AddSet(SetSpec),
    /// `flush set|map F kube-proxy NAME`: deletes the elements.
    FlushSet {
        /// The set or map.
        name: Name,
        /// Written `map` rather than `set`.
        map: bool,
    },
    /// `delete set|map F kube-proxy NAME`.
    DeleteSet {
        /// The set or map.
        name: Name,
        /// Written `map` rather than `set`.
        map: bool,
    },
    /// `add element F kube-proxy NAME { E[, E…] }`.
    AddElements {
        /// The set or map.
        set: Name,
        /// The elements, at least one.
        elements: Vec<SetElement>,
    },
    /// `delete element F kube-proxy NAME { KEY[, KEY…] }`.
    DeleteElements {
        /// The set or map.
        set: Name,
        /// The keys, at least one.
        keys: Vec<Key>,
    },
    /// `add rule F kube-proxy CHAIN EXPRESSIONS… [comment "C"]`.
    AddRule(Rule),
    /// `add set|map F kube-proxy NAME { typeof … ; … }`: a set or map
    /// whose key (and data) are described by the expressions that fill
    /// them, as the data layout's sets are.
    AddTypeofSet(TypeofSpec),
    /// `add element F kube-proxy NAME { KEY : ADDRESS . PORT[, …] }`: the
    /// elements of a map whose data is an endpoint.
    AddMapElements {
        /// The map.
        map: Name,
        /// The elements, at least one.
        elements: Vec<MapElement>,
    },
}

/// What kind of chain `add chain` declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChainKind {
    /// A regular chain, reached by jumps only.
    Regular,
    /// A regular chain with a comment.
    Commented(&'static str),
    /// A base chain: `{ type T hook H priority P ; }`.
    Base {
        /// `filter` or `nat`.
        chain_type: ChainType,
        /// The netfilter hook.
        hook: Hook,
        /// The priority at that hook.
        priority: i32,
    },
}

/// A base chain's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChainType {
    /// `filter`.
    Filter,
    /// `nat`.
    Nat,
}

/// A netfilter hook of the `ip` and `ip6` families.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hook {
    /// `prerouting` (`NF_INET_PRE_ROUTING`).
    Prerouting,
    /// `input`.
    Input,
    /// `forward`.
    Forward,
    /// `output`.
    Output,
    /// `postrouting`.
    Postrouting,
}

/// A named set or verdict map as `add set` or `add map` declares it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SetSpec {
    /// Its name.
    pub name: Name,
    /// Written `add map` rather than `add set`.
    pub map: bool,
    /// The fields of its key, concatenated.
    pub key: &'static [KeyType],
    /// Whether elements map to verdicts (`: verdict`).
    pub verdicts: bool,
    /// `flags dynamic,timeout ; timeout Ns`: rules add elements, which
    /// expire after this many seconds.
    pub dynamic_timeout_secs: Option<u64>,
    /// Its comment.
    pub comment: Option<&'static str>,
}

/// A set or map declared with `typeof`: its key and data are written as
/// the expressions that fill them, so `nft list` prints them that way
/// (`typeof numgen random mod 1 . numgen random mod 1 : ip daddr . tcp
/// dport`), and nft knows their byte order and protocol.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TypeofSpec {
    /// Its name.
    pub name: Name,
    /// The fields of its key, concatenated.
    pub key: Vec<TypeofField>,
    /// The fields of a map's data, concatenated; empty for a set.
    pub data: Vec<TypeofField>,
    /// Its comment.
    pub comment: Option<Arc<str>>,
}

/// One field of a `typeof` key or data: the expression whose value it
/// holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TypeofField {
    /// `numgen random mod 1`: a 32-bit number in host byte order (a
    /// service port's number, or an endpoint's slot).
    Number,
    /// `ip|ip6 saddr|daddr`.
    Addr(AddrField),
    /// `meta l4proto`.
    L4Proto,
    /// `tcp|udp|sctp dport`.
    Port(Protocol),
    /// `th dport`: the destination port of any transport protocol.
    AnyPort,
}

/// An element of a map whose data is an endpoint (`KEY[ comment "C"] :
/// ADDRESS . PORT`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MapElement {
    /// Its key.
    pub key: Key,
    /// Its comment.
    pub comment: Option<Arc<str>>,
    /// The endpoint it maps to.
    pub target: SocketAddr,
}

/// A field of a set's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyType {
    /// `ipv4_addr`.
    Ipv4Addr,
    /// `ipv6_addr`.
    Ipv6Addr,
    /// `inet_proto`.
    InetProto,
    /// `inet_service`.
    InetService,
}

/// The key of a set or map element.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Key {
    /// An address: `10.96.0.10`.
    Addr(IpAddr),
    /// `ADDRESS . PROTOCOL . PORT`.
    AddrProtoPort(IpAddr, Protocol, u16),
    /// `PROTOCOL . PORT`.
    ProtoPort(Protocol, u16),
    /// `ADDRESS . PORT . SLOT`: a slot of the endpoints of a Service entry
    /// (keys of `typeof ip daddr . tcp dport . numgen random mod 1`).
    EntrySlot(IpAddr, u16, u32),
    /// `PORT . SLOT`: a slot of the endpoints of a NodePort (keys of
    /// `typeof tcp dport . numgen random mod 1`).
    PortSlot(u16, u32),
    /// `ADDRESS . ADDRESS`: a source and destination pair (hairpin).
    AddrPair(IpAddr, IpAddr),
}

/// An element as `add element` writes it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SetElement {
    /// Its key.
    pub key: Key,
    /// Its comment.
    pub comment: Option<Arc<str>>,
    /// A map element's verdict.
    pub verdict: Option<Verdict>,
}

/// A verdict.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// `accept`.
    Accept,
    /// `drop`.
    Drop,
    /// `return`.
    Return,
    /// `jump CHAIN`.
    Jump(Name),
    /// `goto CHAIN`.
    Goto(Name),
}

/// A rule: matches and statements in order, and a comment.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    /// The chain it is appended to.
    pub chain: Name,
    /// Its matches and statements.
    pub exprs: Vec<Expr>,
    /// Its comment.
    pub comment: Option<&'static str>,
}

/// An address field of the network header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddrField {
    /// `saddr`.
    Source,
    /// `daddr`.
    Destination,
}

/// An address or a prefix, printed as given: `10.96.0.10`,
/// `10.244.0.0/16` (a prefix always shows its length).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Address {
    /// One address.
    Host(IpAddr),
    /// A prefix.
    Prefix(IpNet),
}

/// One match or statement of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Expr {
    /// `ct state new`.
    CtStateNew,
    /// `ip saddr|daddr [!=] ADDRESS`.
    AddrIs {
        /// The field.
        field: AddrField,
        /// `!=`.
        negate: bool,
        /// The address or prefix.
        value: Address,
    },
    /// `ip saddr|daddr != { A, B, … }`: none of the addresses (one entry
    /// is a plain comparison; more make an anonymous interval set).
    AddrNotIn {
        /// The field.
        field: AddrField,
        /// The addresses and prefixes, at least one.
        values: Vec<Address>,
    },
    /// `ip saddr|daddr @SET`.
    AddrInSet {
        /// The field.
        field: AddrField,
        /// The set.
        set: Name,
    },
    /// `[ip daddr . ]meta l4proto . th dport vmap @MAP`: the verdict the
    /// map holds for the packet's destination (address,) protocol and
    /// port.
    DispatchVmap {
        /// Whether the key starts with the destination address.
        with_addr: bool,
        /// The verdict map.
        map: Name,
    },
    /// `PROTOCOL dport PORT`.
    DestinationPort {
        /// The protocol.
        protocol: Protocol,
        /// The port.
        port: u16,
    },
    /// `meta l4proto PROTOCOL`.
    L4Proto(Protocol),
    /// `fib saddr|daddr type local`.
    FibLocal(AddrField),
    /// `iifname [!=] NAME[*]`.
    InputInterface {
        /// `!=`.
        negate: bool,
        /// The name, or its prefix.
        name: Arc<str>,
        /// Whether `name` is a prefix (`veth*`).
        prefix: bool,
    },
    /// `mark and MARK == 0`.
    MarkLacks(u32),
    /// `mark set mark or MARK`.
    MarkSetOr(u32),
    /// `mark set mark xor MARK`.
    MarkSetXor(u32),
    /// `numgen random mod MODULUS VALUE`: true for one in `modulus`
    /// packets.
    NumgenIs {
        /// The modulus.
        modulus: u32,
        /// The value compared with.
        value: u32,
    },
    /// `update @SET { ip saddr }`: adds the source address to the set, or
    /// refreshes its timeout.
    UpdateSourceSet(Name),
    /// `dnat to ADDRESS:PORT`.
    Dnat(SocketAddr),
    /// `masquerade fully-random`.
    MasqueradeFullyRandom,
    /// `reject`.
    Reject,
    /// A verdict.
    Verdict(Verdict),
    /// `ip saddr . ip daddr @SET`: the source and destination pair is in
    /// the set (an endpoint connecting to itself through a Service).
    AddrPairInSet(Name),
    /// `ip daddr . meta l4proto . th dport @SET`, or without the address
    /// `meta l4proto . th dport @SET`: the packet's Service entry (or
    /// NodePort) is in the set.
    EntryInSet {
        /// Whether the key starts with the destination address.
        with_addr: bool,
        /// The set.
        set: Name,
    },
    /// `dnat ip to ip daddr . tcp dport . numgen random mod ENDPOINTS map
    /// @MAP` (without `ip daddr . ` for a NodePort): DNAT to the endpoint
    /// in a slot of the packet's entry drawn at random. nft writes the
    /// port's protocol match before it itself, and leaves it out of its
    /// listing again; so does the encoder.
    DnatDraw {
        /// The protocol of the port in the key.
        protocol: Protocol,
        /// Whether the key starts with the destination address.
        with_addr: bool,
        /// The count of slots, `0..endpoints`.
        endpoints: u32,
        /// The map of slots to endpoints.
        map: Name,
    },
}

/// Commands printed as lines of `nft -f` text, for one family.
#[derive(Debug, Clone, Copy)]
pub struct Lines<'a> {
    family: IpFamily,
    commands: &'a [Command],
}

/// A command printed as its line of `nft -f` text, for one family.
#[derive(Debug, Clone, Copy)]
pub struct Line<'a> {
    family: IpFamily,
    command: &'a Command,
}

/// An expression printed for one family (`ip` or `ip6` address matches).
#[derive(Debug, Clone, Copy)]
pub struct ExprText<'a> {
    family: IpFamily,
    expr: &'a Expr,
}

/// `ipv4_addr . inet_proto . inet_service`.
pub const IPV4_PROTO_PORT: &[KeyType] =
    &[KeyType::Ipv4Addr, KeyType::InetProto, KeyType::InetService];
/// `ipv6_addr . inet_proto . inet_service`.
pub const IPV6_PROTO_PORT: &[KeyType] =
    &[KeyType::Ipv6Addr, KeyType::InetProto, KeyType::InetService];
/// `inet_proto . inet_service`.
pub const PROTO_PORT: &[KeyType] = &[KeyType::InetProto, KeyType::InetService];
/// `ipv4_addr`.
pub const IPV4: &[KeyType] = &[KeyType::Ipv4Addr];
/// `ipv6_addr`.
pub const IPV6: &[KeyType] = &[KeyType::Ipv6Addr];

/// `ip kube-proxy` or `ip6 kube-proxy`.
struct Table(IpFamily);

/// A key's text, written without allocating, to compare keys: sorting a
/// Service's elements compares keys often, on every render.
struct StackText {
    bytes: [u8; 96],
    len: usize,
}

/// An address as `Display` writes it; IPv4 without the formatting
/// machinery, since rule text is mostly IPv4 addresses.
struct Ip<'a>(&'a IpAddr);

/// A mark as upstream formats it (Go `%#08x`: the digits padded to 8,
/// then `0x`), e.g. `0x00004000`.
struct Mark(u32);

impl Transaction {
    /// An empty transaction for `family`.
    pub fn new(family: IpFamily) -> Self {
        Self {
            family,
            commands: Vec::new(),
        }
    }

    /// Line `number` (1-based) of the text, as `nft -f` would number it.
    pub fn line(&self, number: usize) -> Option<String> {
        let command = self.commands.get(number.checked_sub(1)?)?;
        Some(command.line(self.family).to_string())
    }
}

/// The text, one command a line.
impl fmt::Display for Transaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Lines::new(self.family, &self.commands).fmt(f)
    }
}

impl Name {
    /// The name.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Fixed(name) => name,
            Self::Shared(name) => name,
        }
    }
}

impl From<&'static str> for Name {
    fn from(name: &'static str) -> Self {
        Self::Fixed(name)
    }
}

impl From<&Arc<str>> for Name {
    fn from(name: &Arc<str>) -> Self {
        Self::Shared(Arc::clone(name))
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Command {
    /// This command as its line of text for a table of `family`.
    pub fn line(&self, family: IpFamily) -> Line<'_> {
        Line {
            family,
            command: self,
        }
    }

    /// Whether it is an `add rule`.
    pub fn is_rule(&self) -> bool {
        matches!(self, Self::AddRule(_))
    }

    /// Whether committing this command certainly changes the table, so
    /// that the kernel counts the commit as a new ruleset generation: a
    /// rule added, an object deleted (which fails if it is not there), or
    /// elements added or deleted (deleting a missing element fails; adding
    /// one the set holds already is a no-op, which a caller that compared
    /// with what the table holds rules out). Declaring a table, chain or
    /// set that exists, or flushing an empty one, changes nothing.
    pub fn certainly_changes(&self) -> bool {
        matches!(
            self,
            Self::AddRule(_)
                | Self::DeleteTable
                | Self::DeleteChain(_)
                | Self::DeleteSet { .. }
                | Self::AddElements { .. }
                | Self::DeleteElements { .. }
                | Self::AddMapElements { .. }
        )
    }
}

impl ChainType {
    /// The keyword.
    pub fn keyword(self) -> &'static str {
        match self {
            Self::Filter => "filter",
            Self::Nat => "nat",
        }
    }
}

impl Hook {
    /// The keyword.
    pub fn keyword(self) -> &'static str {
        match self {
            Self::Prerouting => "prerouting",
            Self::Input => "input",
            Self::Forward => "forward",
            Self::Output => "output",
            Self::Postrouting => "postrouting",
        }
    }
}

impl KeyType {
    /// The keyword.
    pub fn keyword(self) -> &'static str {
        match self {
            Self::Ipv4Addr => "ipv4_addr",
            Self::Ipv6Addr => "ipv6_addr",
            Self::InetProto => "inet_proto",
            Self::InetService => "inet_service",
        }
    }

    /// The address type of `family`.
    pub fn address(family: IpFamily) -> Self {
        match family {
            IpFamily::V4 => Self::Ipv4Addr,
            IpFamily::V6 => Self::Ipv6Addr,
        }
    }
}

/// `10.96.0.10 . tcp . 80`, as `add element` takes it.
impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Addr(ip) => Ip(ip).fmt(f),
            Self::AddrProtoPort(ip, protocol, port) => {
                write!(f, "{} . {} . {port}", Ip(ip), protocol_keyword(*protocol))
            }
            Self::ProtoPort(protocol, port) => {
                write!(f, "{} . {port}", protocol_keyword(*protocol))
            }
            Self::EntrySlot(ip, port, slot) => write!(f, "{} . {port} . {slot}", Ip(ip)),
            Self::PortSlot(port, slot) => write!(f, "{port} . {slot}"),
            Self::AddrPair(a, b) => write!(f, "{} . {}", Ip(a), Ip(b)),
        }
    }
}

/// `KEY[ comment "C"] : ADDRESS . PORT`.
impl fmt::Display for MapElement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.key)?;
        if let Some(comment) = &self.comment {
            write!(f, " comment \"{comment}\"")?;
        }
        write!(f, " : {} . {}", Ip(&self.target.ip()), self.target.port())
    }
}

/// Keys sort as their text does, which is the order the elements of a
/// transaction are written in.
impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        let (mut a, mut b) = (StackText::default(), StackText::default());
        a.key(self);
        b.key(other);
        a.as_bytes().cmp(b.as_bytes())
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// `KEY[ comment "C"][ : VERDICT]`.
impl fmt::Display for SetElement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.key)?;
        if let Some(comment) = &self.comment {
            write!(f, " comment \"{comment}\"")?;
        }
        if let Some(verdict) = &self.verdict {
            write!(f, " : {verdict}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Accept => f.write_str("accept"),
            Self::Drop => f.write_str("drop"),
            Self::Return => f.write_str("return"),
            Self::Jump(chain) => write!(f, "jump {chain}"),
            Self::Goto(chain) => write!(f, "goto {chain}"),
        }
    }
}

impl Rule {
    /// A rule in `chain`.
    pub fn new(chain: impl Into<Name>, exprs: Vec<Expr>) -> Self {
        Self {
            chain: chain.into(),
            exprs,
            comment: None,
        }
    }

    /// The same rule with `comment`.
    #[must_use]
    pub fn with_comment(mut self, comment: &'static str) -> Self {
        self.comment = Some(comment);
        self
    }
}

impl AddrField {
    /// `saddr` or `daddr`.
    pub fn keyword(self) -> &'static str {
        match self {
            Self::Source => "saddr",
            Self::Destination => "daddr",
        }
    }
}

impl Address {
    /// The prefix it covers (a host's is /32 or /128).
    pub fn net(self) -> IpNet {
        match self {
            Self::Host(ip) => IpNet::from(ip),
            Self::Prefix(net) => net,
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Host(ip) => Ip(ip).fmt(f),
            Self::Prefix(net) => write!(f, "{}/{}", Ip(&net.addr()), net.prefix_len()),
        }
    }
}

impl Expr {
    /// This expression's text in a table of `family`.
    pub fn text(&self, family: IpFamily) -> ExprText<'_> {
        ExprText { family, expr: self }
    }
}

impl<'a> Lines<'a> {
    /// `commands` as text for a table of `family`.
    pub fn new(family: IpFamily, commands: &'a [Command]) -> Self {
        Self { family, commands }
    }
}

impl fmt::Display for Lines<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for command in self.commands {
            writeln!(f, "{}", command.line(self.family))?;
        }
        Ok(())
    }
}

impl fmt::Display for Line<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let family = self.family;
        let table = Table(family);
        match self.command {
            Command::AddTable { comment: None } => write!(f, "add table {table}"),
            Command::AddTable {
                comment: Some(comment),
            } => write!(f, "add table {table} {{ comment \"{comment}\" ; }}"),
            Command::DeleteTable => write!(f, "delete table {table}"),
            Command::AddChain { name, kind } => {
                write!(f, "add chain {table} {name}")?;
                match kind {
                    ChainKind::Regular => Ok(()),
                    ChainKind::Commented(comment) => write!(f, " {{ comment \"{comment}\" ; }}"),
                    ChainKind::Base {
                        chain_type,
                        hook,
                        priority,
                    } => write!(
                        f,
                        " {{ type {} hook {} priority {priority} ; }}",
                        chain_type.keyword(),
                        hook.keyword()
                    ),
                }
            }
            Command::FlushChain(name) => write!(f, "flush chain {table} {name}"),
            Command::DeleteChain(name) => write!(f, "delete chain {table} {name}"),
            Command::AddSet(spec) => {
                let kind = if spec.map { "map" } else { "set" };
                write!(f, "add {kind} {table} {} {{ type ", spec.name)?;
                for (index, field) in spec.key.iter().enumerate() {
                    if index > 0 {
                        f.write_str(" . ")?;
                    }
                    f.write_str(field.keyword())?;
                }
                if spec.verdicts {
                    f.write_str(" : verdict")?;
                }
                f.write_str(" ; ")?;
                if let Some(timeout) = spec.dynamic_timeout_secs {
                    write!(f, "flags dynamic,timeout ; timeout {timeout}s ; ")?;
                }
                if let Some(comment) = spec.comment {
                    write!(f, "comment \"{comment}\" ; ")?;
                }
                f.write_str("}")
            }
            Command::FlushSet { name, map } => {
                write!(f, "flush {} {table} {name}", set_keyword(*map))
            }
            Command::DeleteSet { name, map } => {
                write!(f, "delete {} {table} {name}", set_keyword(*map))
            }
            Command::AddElements { set, elements } => {
                write!(f, "add element {table} {set} {{ ")?;
                for (index, element) in elements.iter().enumerate() {
                    if index > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{element}")?;
                }
                f.write_str(" }")
            }
            Command::DeleteElements { set, keys } => {
                write!(f, "delete element {table} {set} {{ ")?;
                for (index, key) in keys.iter().enumerate() {
                    if index > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{key}")?;
                }
                f.write_str(" }")
            }
            Command::AddTypeofSet(spec) => {
                let kind = if spec.data.is_empty() { "set" } else { "map" };
                write!(f, "add {kind} {table} {} {{ typeof ", spec.name)?;
                typeof_fields(f, family, &spec.key)?;
                if !spec.data.is_empty() {
                    f.write_str(" : ")?;
                    typeof_fields(f, family, &spec.data)?;
                }
                f.write_str(" ; ")?;
                if let Some(comment) = &spec.comment {
                    write!(f, "comment \"{comment}\" ; ")?;
                }
                f.write_str("}")
            }
            Command::AddMapElements { map, elements } => {
                write!(f, "add element {table} {map} {{ ")?;
                for (index, element) in elements.iter().enumerate() {
                    if index > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{element}")?;
                }
                f.write_str(" }")
            }
            Command::AddRule(rule) => {
                write!(f, "add rule {table} {}", rule.chain)?;
                for expr in &rule.exprs {
                    write!(f, " {}", expr.text(family))?;
                }
                if let Some(comment) = rule.comment {
                    write!(f, " comment \"{comment}\"")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for ExprText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ipx = family_keyword(self.family);
        match self.expr {
            Expr::CtStateNew => f.write_str("ct state new"),
            Expr::AddrIs {
                field,
                negate,
                value,
            } => {
                let op = if *negate { "!= " } else { "" };
                write!(f, "{ipx} {} {op}{value}", field.keyword())
            }
            Expr::AddrNotIn { field, values } => {
                write!(f, "{ipx} {} != {{ ", field.keyword())?;
                for (index, value) in values.iter().enumerate() {
                    if index > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{value}")?;
                }
                f.write_str(" }")
            }
            Expr::AddrInSet { field, set } => write!(f, "{ipx} {} @{set}", field.keyword()),
            Expr::DispatchVmap { with_addr, map } => {
                if *with_addr {
                    write!(f, "{ipx} daddr . ")?;
                }
                write!(f, "meta l4proto . th dport vmap @{map}")
            }
            Expr::DestinationPort { protocol, port } => {
                write!(f, "{} dport {port}", protocol_keyword(*protocol))
            }
            Expr::L4Proto(protocol) => write!(f, "meta l4proto {}", protocol_keyword(*protocol)),
            Expr::FibLocal(field) => write!(f, "fib {} type local", field.keyword()),
            Expr::InputInterface {
                negate,
                name,
                prefix,
            } => {
                let op = if *negate { "!= " } else { "" };
                let star = if *prefix { "*" } else { "" };
                write!(f, "iifname {op}{name}{star}")
            }
            Expr::MarkLacks(mark) => write!(f, "mark and {} == 0", Mark(*mark)),
            Expr::MarkSetOr(mark) => write!(f, "mark set mark or {}", Mark(*mark)),
            Expr::MarkSetXor(mark) => write!(f, "mark set mark xor {}", Mark(*mark)),
            Expr::NumgenIs { modulus, value } => write!(f, "numgen random mod {modulus} {value}"),
            Expr::UpdateSourceSet(set) => write!(f, "update @{set} {{ {ipx} saddr }}"),
            Expr::Dnat(SocketAddr::V4(to)) => {
                write!(f, "dnat to {}:{}", Ip(&IpAddr::V4(*to.ip())), to.port())
            }
            Expr::Dnat(to) => write!(f, "dnat to {to}"),
            Expr::MasqueradeFullyRandom => f.write_str("masquerade fully-random"),
            Expr::Reject => f.write_str("reject"),
            Expr::Verdict(verdict) => write!(f, "{verdict}"),
            Expr::AddrPairInSet(set) => write!(f, "{ipx} saddr . {ipx} daddr @{set}"),
            Expr::EntryInSet { with_addr, set } => {
                if *with_addr {
                    write!(f, "{ipx} daddr . ")?;
                }
                write!(f, "meta l4proto . th dport @{set}")
            }
            Expr::DnatDraw {
                protocol,
                with_addr,
                endpoints,
                map,
            } => {
                write!(f, "dnat {ipx} to ")?;
                if *with_addr {
                    write!(f, "{ipx} daddr . ")?;
                }
                write!(
                    f,
                    "{} dport . numgen random mod {endpoints} map @{map}",
                    protocol_keyword(*protocol)
                )
            }
        }
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", family_keyword(self.0), crate::names::TABLE)
    }
}

impl Default for StackText {
    fn default() -> Self {
        Self {
            bytes: [0; 96],
            len: 0,
        }
    }
}

impl StackText {
    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// Appends `bytes`. A key's text is at most 89 bytes (two IPv6
    /// addresses and a port), so it always fits.
    fn push(&mut self, bytes: &[u8]) {
        let end = (self.len + bytes.len()).min(self.bytes.len());
        let count = end - self.len;
        self.bytes[self.len..end].copy_from_slice(&bytes[..count]);
        self.len = end;
    }

    /// Appends `value` in decimal.
    fn number(&mut self, value: u16) {
        let mut digits = [0u8; 5];
        let mut start = digits.len();
        let mut rest = value;
        loop {
            start -= 1;
            digits[start] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        self.push(&digits[start..]);
    }

    fn address(&mut self, ip: &IpAddr) {
        match ip {
            IpAddr::V4(ip) => {
                for (index, octet) in ip.octets().iter().enumerate() {
                    if index > 0 {
                        self.push(b".");
                    }
                    self.number(u16::from(*octet));
                }
            }
            IpAddr::V6(_) => {
                let _ = fmt::Write::write_fmt(self, format_args!("{ip}"));
            }
        }
    }

    /// Appends the text [`Key`]'s `Display` writes.
    fn key(&mut self, key: &Key) {
        let proto_port = |text: &mut Self, protocol: Protocol, port: u16| {
            text.push(protocol_keyword(protocol).as_bytes());
            text.push(b" . ");
            text.number(port);
        };
        match key {
            Key::Addr(ip) => self.address(ip),
            Key::AddrProtoPort(ip, protocol, port) => {
                self.address(ip);
                self.push(b" . ");
                proto_port(self, *protocol, *port);
            }
            Key::ProtoPort(protocol, port) => proto_port(self, *protocol, *port),
            // Rarer keys, whose text needs no speed.
            Key::EntrySlot(..) | Key::PortSlot(..) | Key::AddrPair(..) => {
                let _ = fmt::Write::write_fmt(self, format_args!("{key}"));
            }
        }
    }
}

impl fmt::Write for StackText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push(s.as_bytes());
        Ok(())
    }
}

impl fmt::Display for Ip<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(_) => {
                let mut text = StackText::default();
                text.address(self.0);
                f.write_str(std::str::from_utf8(text.as_bytes()).map_err(|_| fmt::Error)?)
            }
            IpAddr::V6(ip) => ip.fmt(f),
        }
    }
}

impl fmt::Display for Mark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:08x}", self.0)
    }
}

/// `tcp`, `udp` or `sctp`.
pub fn protocol_keyword(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

/// `F1 . F2 …` of a `typeof` declaration.
fn typeof_fields(
    f: &mut fmt::Formatter<'_>,
    family: IpFamily,
    fields: &[TypeofField],
) -> fmt::Result {
    let ipx = family_keyword(family);
    for (index, field) in fields.iter().enumerate() {
        if index > 0 {
            f.write_str(" . ")?;
        }
        match field {
            TypeofField::Number => f.write_str("numgen random mod 1")?,
            TypeofField::Addr(field) => write!(f, "{ipx} {}", field.keyword())?,
            TypeofField::L4Proto => f.write_str("meta l4proto")?,
            TypeofField::Port(protocol) => write!(f, "{} dport", protocol_keyword(*protocol))?,
            TypeofField::AnyPort => f.write_str("th dport")?,
        }
    }
    Ok(())
}

fn set_keyword(map: bool) -> &'static str {
    if map {
        "map"
    } else {
        "set"
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn key(text: &str, protocol: Protocol, port: u16) -> Key {
        Key::AddrProtoPort(text.parse().unwrap(), protocol, port)
    }

    #[test]
    fn keys_sort_as_their_text() {
        let mut keys = [
            key("10.96.0.9", Protocol::Tcp, 80),
            key("10.96.0.10", Protocol::Tcp, 80),
            key("10.96.0.10", Protocol::Tcp, 443),
            key("10.96.0.1", Protocol::Udp, 53),
            key("fd00::1", Protocol::Sctp, 9),
            key("255.0.10.200", Protocol::Tcp, 65535),
            key("0.0.0.0", Protocol::Udp, 0),
            Key::AddrProtoPort(
                "fd00:10:96:ffff:ffff:ffff:ffff:ffff".parse().unwrap(),
                Protocol::Sctp,
                65535,
            ),
        ];
        for key in &keys {
            let mut text = StackText::default();
            text.key(key);
            assert_eq!(text.as_bytes(), key.to_string().as_bytes());
        }
        let mut texts: Vec<String> = keys.iter().map(ToString::to_string).collect();
        keys.sort();
        texts.sort();
        let sorted: Vec<String> = keys.iter().map(ToString::to_string).collect();
        assert_eq!(sorted, texts);
    }

    #[test]
    fn addresses_print_as_the_standard_library_prints_them() {
        for text in ["0.0.0.0", "255.255.255.255", "10.96.0.10", "fd00:10:96::a"] {
            let ip: IpAddr = text.parse().unwrap();
            assert_eq!(Address::Host(ip).to_string(), ip.to_string());
        }
        for text in ["10.244.0.0/16", "0.0.0.0/0", "fd00:10:244::/48"] {
            let net: IpNet = text.parse().unwrap();
            assert_eq!(Address::Prefix(net).to_string(), net.to_string());
        }
        for text in ["10.244.1.2:8080", "[fd00::2]:53"] {
            let to: SocketAddr = text.parse().unwrap();
            assert_eq!(
                Expr::Dnat(to).text(IpFamily::V4).to_string(),
                format!("dnat to {to}")
            );
        }
    }

    /// The data layout's statements print as docs/nft-layout-experiment.md
    /// writes them (the text nft 1.0.6 loaded there).
    #[test]
    fn the_data_layout_prints_as_nft_reads_it() {
        use TypeofField::{Number, Port};
        let name = |text: &'static str| Name::Fixed(text);
        let dst = TypeofField::Addr(AddrField::Destination);
        let src = TypeofField::Addr(AddrField::Source);
        let spec = |text, key, data| {
            Command::AddTypeofSet(TypeofSpec {
                name: name(text),
                key,
                data,
                comment: None,
            })
        };
        let rule = |exprs| Command::AddRule(Rule::new("svc", exprs));
        let cases = [
            (
                IpFamily::V4,
                spec("service-endpoints-tcp", vec![dst, Port(Protocol::Tcp), Number], vec![dst, Port(Protocol::Tcp)]),
                "add map ip kube-proxy service-endpoints-tcp { typeof ip daddr . tcp dport . numgen random mod 1 : ip daddr . tcp dport ; }",
            ),
            (
                IpFamily::V4,
                spec("nodeport-endpoints-udp", vec![Port(Protocol::Udp), Number], vec![dst, Port(Protocol::Udp)]),
                "add map ip kube-proxy nodeport-endpoints-udp { typeof udp dport . numgen random mod 1 : ip daddr . udp dport ; }",
            ),
            (
                IpFamily::V4,
                Command::AddMapElements {
                    map: name("service-endpoints-tcp"),
                    elements: vec![
                        MapElement {
                            key: Key::EntrySlot("10.96.0.10".parse().unwrap(), 80, 0),
                            comment: Some("ns1/web:http".into()),
                            target: "10.244.1.2:8080".parse().unwrap(),
                        },
                        MapElement {
                            key: Key::PortSlot(30080, 1),
                            comment: None,
                            target: "10.244.1.3:8080".parse().unwrap(),
                        },
                    ],
                },
                "add element ip kube-proxy service-endpoints-tcp { 10.96.0.10 . 80 . 0 comment \"ns1/web:http\" : 10.244.1.2 . 8080, 30080 . 1 : 10.244.1.3 . 8080 }",
            ),
            (
                IpFamily::V6,
                rule(vec![
                    Expr::EntryInSet { with_addr: true, set: name("endpoint-count-3") },
                    Expr::DnatDraw { protocol: Protocol::Udp, with_addr: true, endpoints: 3, map: name("service-endpoints-udp") },
                ]),
                "add rule ip6 kube-proxy svc ip6 daddr . meta l4proto . th dport @endpoint-count-3 dnat ip6 to ip6 daddr . udp dport . numgen random mod 3 map @service-endpoints-udp",
            ),
            (
                IpFamily::V4,
                rule(vec![
                    Expr::EntryInSet { with_addr: false, set: name("nodeport-count-2") },
                    Expr::DnatDraw { protocol: Protocol::Tcp, with_addr: false, endpoints: 2, map: name("nodeport-endpoints-tcp") },
                ]),
                "add rule ip kube-proxy svc meta l4proto . th dport @nodeport-count-2 dnat ip to tcp dport . numgen random mod 2 map @nodeport-endpoints-tcp",
            ),
            (
                IpFamily::V4,
                spec("hairpin-endpoints", vec![src, dst], vec![]),
                "add set ip kube-proxy hairpin-endpoints { typeof ip saddr . ip daddr ; }",
            ),
            (
                IpFamily::V6,
                Command::AddElements {
                    set: name("hairpin-endpoints"),
                    elements: vec![SetElement {
                        key: Key::AddrPair("fd00::2".parse().unwrap(), "fd00::2".parse().unwrap()),
                        comment: None,
                        verdict: None,
                    }],
                },
                "add element ip6 kube-proxy hairpin-endpoints { fd00::2 . fd00::2 }",
            ),
            (
                IpFamily::V4,
                rule(vec![
                    Expr::AddrPairInSet(name("hairpin-endpoints")),
                    Expr::Verdict(Verdict::Jump(name("mark-for-masquerade"))),
                ]),
                "add rule ip kube-proxy svc ip saddr . ip daddr @hairpin-endpoints jump mark-for-masquerade",
            ),
        ];
        for (family, command, text) in cases {
            assert_eq!(command.line(family).to_string(), text);
        }
    }

    #[test]
    fn the_longest_keys_sort_as_their_text() {
        let wide: IpAddr = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff".parse().unwrap();
        for key in [
            Key::AddrPair(wide, wide),
            Key::EntrySlot(wide, 65535, u32::MAX),
            Key::PortSlot(65535, u32::MAX),
        ] {
            let mut text = StackText::default();
            text.key(&key);
            assert_eq!(text.as_bytes(), key.to_string().as_bytes());
        }
    }

    #[test]
    fn a_rule_prints_as_nft_reads_it() {
        let rule = Rule::new(
            "fw",
            vec![
                Expr::AddrNotIn {
                    field: AddrField::Source,
                    values: vec![
                        Address::Prefix("198.51.100.0/24".parse().unwrap()),
                        Address::Host("203.0.113.9".parse().unwrap()),
                    ],
                },
                Expr::Verdict(Verdict::Drop),
            ],
        )
        .with_comment("c");
        let line = Command::AddRule(rule).line(IpFamily::V4).to_string();
        assert_eq!(
            line,
            "add rule ip kube-proxy fw ip saddr != { 198.51.100.0/24, 203.0.113.9 } drop comment \"c\""
        );
    }
}
