//! `kube-proxy trace`: where a new connection to an address goes on this
//! node, read from the kernel's live state in the network namespace it runs
//! in.
//!
//! It needs no API server and changes nothing: it reads the rules of the
//! mode in use (the iptables tables of the flavor the host uses, or the
//! nftables `kube-proxy` table over netlink), follows the connection's first
//! packet through them with the mode's tracer, and prints every path it can
//! take: the rules it matches in order, the endpoint it is DNATed to and
//! with which probability, session affinity, whether it is masqueraded, and
//! the verdict. `--output json` prints the same for tools. In the nftables
//! data layout (`--nftables-layout data`) a path names the class rule that
//! drew (by the count set holding the packet's entry), the element `ENTRY
//! . slot` of the slot map it found and the endpoint that element holds,
//! and the dynamic
//! `affinity-PROTO-SECS` map of ClientIP affinity; a slot without its
//! element (damage) is a path that goes on un-DNATed, as in the kernel.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::str::FromStr;

use clap::Parser;
use kp_iptables::{IptablesFlavor, Table};
use kp_model::{IpFamily, Protocol};
use serde::Serialize;

/// `kube-proxy trace` on the command line.
#[derive(Debug, Parser)]
#[command(
    name = "kube-proxy trace",
    about = "Show where a new connection to an address goes on this node, \
             from the kernel's live rules (changes nothing, needs no API server)"
)]
pub struct TraceArgs {
    /// The destination: ADDRESS:PORT/PROTOCOL, e.g. 10.96.0.10:80/tcp,
    /// [fd00:10:96::a]:53/udp, 192.168.99.2:30080 (tcp when no protocol is
    /// given). A ClusterIP, a node address with a NodePort, an external IP
    /// or a load balancer IP.
    #[arg(long, value_parser = Destination::from_str)]
    to: Destination,
    /// The client's address. Left out: a process on this node. An address
    /// of this node: a process on this node with that source. Any other: a
    /// packet arriving from that address (a pod, another node, a client
    /// outside the cluster).
    #[arg(long)]
    from: Option<IpAddr>,
    /// The interface the packet arrives on (iptables mode; matters with
    /// `detectLocalMode: BridgeInterface` or `InterfaceNamePrefix`).
    #[arg(long, value_name = "NAME")]
    in_interface: Option<String>,
    /// The mode whose rules to read. Left out: the mode whose rules this
    /// network namespace holds.
    #[arg(long, value_name = "MODE")]
    proxy_mode: Option<TraceMode>,
    /// `text` for people, `json` for tools.
    #[arg(long, short = 'o', default_value = "text")]
    output: Output,
}

/// The modes whose kernel state `trace` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TraceMode {
    Iptables,
    Nftables,
    Ipvs,
    Userspace,
}

/// How the report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    Text,
    Json,
}

/// `--to`: address, port and protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Destination {
    addr: SocketAddr,
    protocol: Protocol,
}

impl FromStr for Destination {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (addr, protocol) = match text.rsplit_once('/') {
            Some((addr, protocol)) => (addr, protocol),
            None => (text, "tcp"),
        };
        let protocol = match protocol.to_ascii_lowercase().as_str() {
            "tcp" => Protocol::Tcp,
            "udp" => Protocol::Udp,
            "sctp" => Protocol::Sctp,
            other => return Err(format!("protocol {other:?} is not tcp, udp or sctp")),
        };
        let addr = addr.parse::<SocketAddr>().map_err(|_| {
            format!("{addr:?} is not ADDRESS:PORT (an IPv6 address goes in brackets: [fd00::a]:80)")
        })?;
        Ok(Self { addr, protocol })
    }
}

/// Where the connection comes from, as the rules see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    /// A process of this node (nat OUTPUT).
    ThisNode,
    /// A packet received from another host or a pod (nat PREROUTING).
    Received,
}

/// What a trace found: the same shape for every mode.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    mode: &'static str,
    family: &'static str,
    protocol: &'static str,
    source: IpAddr,
    destination: SocketAddr,
    origin: Origin,
    /// Every path a new connection can take.
    paths: Vec<Path>,
    /// The paths summed up.
    pub outcome: Outcome,
}

/// One way through the rules.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct Path {
    /// The chance a new connection takes this path.
    probability: f64,
    /// How it ends.
    verdict: Verdict,
    /// The endpoint it is DNATed to.
    endpoint: Option<SocketAddr>,
    /// Its source is rewritten to the node's address on the way out.
    masqueraded: bool,
    /// Session affinity: later connections of the same client within
    /// `seconds` go to the same endpoint.
    affinity: Vec<Affinity>,
    /// The rules it matched, in order.
    rules: Vec<String>,
    /// The set and map elements it found (nftables mode), in order.
    elements: Vec<String>,
    /// Rules of other software the tracer could not decide and that could
    /// not change the path.
    not_followed: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct Affinity {
    /// The affinity list or set.
    name: String,
    /// Its timeout.
    seconds: Option<u32>,
}

/// How a path ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Let through (DNATed or not).
    Accept,
    /// Silently dropped.
    Drop,
    /// Refused (ICMP unreachable, or a TCP reset by the userspace relay).
    Reject,
}

/// On how many of a DNAT outcome's paths the source is rewritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Masquerade {
    /// Every path.
    All,
    /// No path.
    None,
    /// Some paths.
    Some,
}

impl Masquerade {
    /// As the text reports say it.
    pub fn phrase(self) -> &'static str {
        match self {
            Self::All => "masqueraded on every path",
            Self::None => "not masqueraded",
            Self::Some => "masqueraded on some paths",
        }
    }
}

/// What happens to the connection, summed over its paths.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Outcome {
    /// DNATed to one of these endpoints (with probabilities).
    Dnat {
        endpoints: Vec<Share>,
        /// On how many paths the source is rewritten.
        masqueraded: Masquerade,
    },
    /// Refused with an ICMP error (no endpoint for this traffic, or a port
    /// of a ClusterIP that is no service port).
    Reject,
    /// Silently dropped (a source range or a Local policy without local
    /// endpoints).
    Drop,
    /// Not touched by the proxy's rules: not a Service address and port
    /// here.
    NotAService,
    /// Different paths end differently.
    Mixed,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Share {
    /// The endpoint.
    pub endpoint: SocketAddr,
    /// The chance a new connection goes there.
    pub probability: f64,
    /// Whether every path to it is masqueraded.
    pub masqueraded: bool,
}

/// Runs `kube-proxy trace`; `args` starts with the program name.
pub fn main(args: &[OsString]) -> ExitCode {
    let mut argv: Vec<OsString> = vec![OsString::from("kube-proxy trace")];
    argv.extend(args.iter().skip(2).cloned());
    let parsed = match TraceArgs::try_parse_from(argv) {
        Ok(parsed) => parsed,
        Err(error) => {
            let code = if error.use_stderr() { 1 } else { 0 };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    match run(&parsed) {
        Ok(report) => {
            match parsed.output {
                Output::Text => print!("{}", text(&report)),
                Output::Json => match serde_json::to_string_pretty(&report) {
                    Ok(json) => println!("{json}"),
                    Err(error) => {
                        eprintln!("kube-proxy trace: {error}");
                        return ExitCode::FAILURE;
                    }
                },
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("kube-proxy trace: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Reads the live state and traces the connection `args` describes.
pub fn run(args: &TraceArgs) -> anyhow::Result<Report> {
    let destination = args.to.addr;
    let family = IpFamily::of(&destination.ip());
    let local = kp_host::local_addresses()
        .map_err(|error| anyhow::anyhow!("reading this node's addresses: {error}"))?;
    let local: Vec<IpAddr> = local
        .into_iter()
        .filter(|ip| IpFamily::of(ip) == family)
        .collect();
    if let Some(from) = args.from {
        anyhow::ensure!(
            IpFamily::of(&from) == family,
            "--from {from} and --to {destination} are of different families"
        );
    }
    let (source, origin) = match args.from {
        Some(from) if local.contains(&from) => (from, Origin::ThisNode),
        Some(from) => (from, Origin::Received),
        None => (
            own_source(&local, family, destination.ip()),
            Origin::ThisNode,
        ),
    };
    let connection = Connection {
        source,
        destination,
        protocol: args.to.protocol,
        origin,
        in_interface: args.in_interface.clone(),
    };
    let mode = match args.proxy_mode {
        Some(mode) => mode,
        None => detect_mode(family)?,
    };
    let live = Live::read(mode, family)?;
    live.trace(&connection, &local)
}

/// One family's rules of one mode, as the kernel holds them.
pub enum Live {
    /// The iptables tables of the host's flavor.
    Iptables(kp_iptables::tracer::Ruleset),
    /// The nftables `kube-proxy` table.
    Nftables(kp_nftables::tracer::Table),
    /// The IPVS virtual servers, the ipsets, `kube-ipvs0` and the mode's
    /// iptables rules.
    Ipvs(Box<kp_ipvs::trace::LiveState>),
    /// The userspace mode's portal rules and its relay's routing file.
    Userspace(Box<kp_userspace::trace::LiveState>),
}

impl Live {
    /// The mode whose rules these are.
    pub fn mode(&self) -> TraceMode {
        match self {
            Self::Iptables(_) => TraceMode::Iptables,
            Self::Nftables(_) => TraceMode::Nftables,
            Self::Ipvs(_) => TraceMode::Ipvs,
            Self::Userspace(_) => TraceMode::Userspace,
        }
    }

    /// Reads `mode`'s rules of `family` in this network namespace for a
    /// check: a missing nftables table is an empty one (every Service then
    /// differs), where a trace says the table is missing.
    pub fn read_for_check(mode: TraceMode, family: IpFamily) -> anyhow::Result<Self> {
        if mode == TraceMode::Nftables {
            let table = kp_nftables::live::read_table(family)
                .map_err(|error| anyhow::anyhow!("{error}"))?
                .unwrap_or_default();
            return Ok(Self::Nftables(table));
        }
        Self::read(mode, family)
    }

    /// Reads `mode`'s rules of `family` in this network namespace.
    pub fn read(mode: TraceMode, family: IpFamily) -> anyhow::Result<Self> {
        match mode {
            TraceMode::Iptables => Ok(Self::Iptables(kp_iptables::tracer::Ruleset::from_live(
                IptablesFlavor::detect(),
                family,
            )?)),
            TraceMode::Nftables => {
                let table = kp_nftables::live::read_table(family)
                    .map_err(|error| anyhow::anyhow!("{error}"))?
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "this network namespace has no nftables table {} kube-proxy",
                            nft_family(family)
                        )
                    })?;
                Ok(Self::Nftables(table))
            }
            TraceMode::Ipvs => Ok(Self::Ipvs(Box::new(
                kp_ipvs::trace::LiveState::read(family)
                    .map_err(|error| anyhow::anyhow!("{error}"))?,
            ))),
            TraceMode::Userspace => Ok(Self::Userspace(Box::new(
                kp_userspace::trace::LiveState::read(family)?,
            ))),
        }
    }

    /// Every path of `connection` through these rules; `local` are the
    /// node's addresses of the family.
    pub fn trace(&self, connection: &Connection, local: &[IpAddr]) -> anyhow::Result<Report> {
        let (mode, paths) = match self {
            Self::Iptables(ruleset) => (
                TraceMode::Iptables,
                trace_iptables(ruleset, connection, local)?,
            ),
            Self::Nftables(table) => (
                TraceMode::Nftables,
                trace_nftables(table, connection, local)?,
            ),
            Self::Ipvs(state) => (
                TraceMode::Ipvs,
                mode_paths(state.trace(&packet(connection))?),
            ),
            Self::Userspace(state) => (
                TraceMode::Userspace,
                mode_paths(state.trace(&packet(connection))?),
            ),
        };
        Ok(Report {
            mode: mode.name(),
            family: IpFamily::of(&connection.destination.ip()).as_api_str(),
            protocol: connection.protocol.as_rule_str(),
            source: connection.source,
            destination: connection.destination,
            origin: connection.origin,
            outcome: outcome(&paths),
            paths,
        })
    }
}

fn nft_family(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

/// The connection as every mode's tracer needs it.
pub struct Connection {
    /// The client's address.
    pub source: IpAddr,
    /// The address and port connected to.
    pub destination: SocketAddr,
    /// The transport protocol.
    pub protocol: Protocol,
    /// Whether a process of this node opens it.
    pub origin: Origin,
    /// The interface it arrives on, if known.
    pub in_interface: Option<String>,
}

/// The source address a process of this node uses to reach `destination`
/// when none is given: `destination` itself when it is an address of the
/// node (the IPVS mode's Service addresses are, on kube-ipvs0: the kernel
/// takes a local route's own address, `ip route get` says `src
/// 10.96.0.10`), else the first address of the family that is not a
/// loopback one.
fn own_source(local: &[IpAddr], family: IpFamily, destination: IpAddr) -> IpAddr {
    if local.contains(&destination) {
        return destination;
    }
    local
        .iter()
        .copied()
        .find(|ip| !ip.is_loopback())
        .unwrap_or(match family {
            IpFamily::V4 => IpAddr::from([127, 0, 0, 1]),
            IpFamily::V6 => IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
        })
}

impl TraceMode {
    /// The mode as `--proxy-mode` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Iptables => "iptables",
            Self::Nftables => "nftables",
            Self::Ipvs => "ipvs",
            Self::Userspace => "userspace",
        }
    }
}

/// The mode whose rules this network namespace holds: the nftables table,
/// else the chains each iptables-based mode alone creates.
fn detect_mode(family: IpFamily) -> anyhow::Result<TraceMode> {
    match kp_nftables::live::read_table(family) {
        Ok(Some(_)) => return Ok(TraceMode::Nftables),
        Ok(None) => {}
        // A kernel without nftables holds no table of it; the IPVS mode
        // runs on such kernels.
        Err(error) if without_nftables(&error) => {}
        Err(error) => return Err(anyhow::anyhow!("{error}")),
    }
    // The chains each iptables-based mode alone declares, from the nat
    // table's listing (not parsed as rules: the tracer of one mode does not
    // read another's).
    let nat = kp_iptables::SystemApplier::new(IptablesFlavor::detect())
        .save_text(family, Table::Nat)
        .map_err(|error| anyhow::anyhow!("listing the nat table: {error}"))?;
    let has = |name: &str| {
        nat.lines()
            .any(|line| line.strip_prefix(':').and_then(|l| l.split(' ').next()) == Some(name))
    };
    if has("KUBE-PORTALS-CONTAINER") {
        return Ok(TraceMode::Userspace);
    }
    if has("KUBE-LOAD-BALANCER") || has("KUBE-NODE-PORT") {
        return Ok(TraceMode::Ipvs);
    }
    if has("KUBE-SERVICES") {
        return Ok(TraceMode::Iptables);
    }
    anyhow::bail!(
        "no kube-proxy rules for {} in this network namespace (looked for the nftables \
         table {} kube-proxy and the iptables chain KUBE-SERVICES); run it where the proxy \
         runs, or name the mode with --proxy-mode",
        family.as_api_str(),
        nft_family(family)
    )
}

/// Whether reading the nftables table failed because the kernel has no
/// nftables: nfnetlink answers a message to a subsystem that is not
/// registered (`CONFIG_NF_TABLES` off, or `nf_tables` not loaded where no
/// module can be loaded) with EINVAL (`nfnetlink_rcv_msg`,
/// net/netfilter/nfnetlink.c).
fn without_nftables(error: &kp_nftables::live::ReadError) -> bool {
    match error {
        kp_nftables::live::ReadError::Netlink { source, .. } => {
            source.errno().is_some_and(is_invalid_argument)
        }
        _ => false,
    }
}

/// Whether `errno` is EINVAL.
fn is_invalid_argument(errno: i32) -> bool {
    std::io::Error::from_raw_os_error(errno).kind() == std::io::ErrorKind::InvalidInput
}

fn trace_iptables(
    ruleset: &kp_iptables::tracer::Ruleset,
    connection: &Connection,
    local: &[IpAddr],
) -> anyhow::Result<Vec<Path>> {
    use kp_iptables::tracer::{Packet, Verdict as Kernel};
    let packet = Packet {
        src: connection.source,
        dst: connection.destination.ip(),
        dport: connection.destination.port(),
        protocol: connection.protocol,
        in_interface: connection.in_interface.clone(),
        local_origin: connection.origin == Origin::ThisNode,
    };
    let trace = ruleset.trace(&packet, local)?;
    Ok(trace
        .paths
        .into_iter()
        .map(|path| Path {
            probability: path.probability,
            verdict: match path.verdict {
                Kernel::Accept => Verdict::Accept,
                Kernel::Drop => Verdict::Drop,
                Kernel::Reject => Verdict::Reject,
            },
            endpoint: path.destination,
            masqueraded: path.masqueraded,
            affinity: path
                .affinity
                .into_iter()
                .map(|affinity| Affinity {
                    name: affinity.list,
                    seconds: affinity.seconds,
                })
                .collect(),
            rules: path.matched,
            elements: Vec::new(),
            not_followed: path.not_followed,
        })
        .collect())
}

fn trace_nftables(
    table: &kp_nftables::tracer::Table,
    connection: &Connection,
    local: &[IpAddr],
) -> anyhow::Result<Vec<Path>> {
    use kp_nftables::tracer::{Packet, PathVerdict};
    let packet = Packet {
        src: connection.source,
        dst: connection.destination.ip(),
        protocol: connection.protocol.as_rule_str(),
        dport: connection.destination.port(),
        src_local: connection.origin == Origin::ThisNode,
        dst_local: local.contains(&connection.destination.ip()),
    };
    // The kernel's table: damage (a slot without its element) is a path
    // to report, not a failure of the trace.
    let trace = table
        .trace_paths_as_the_kernel(&packet)
        .map_err(|unknown| {
            anyhow::anyhow!(
                "the table holds a rule the tracer cannot follow: {}",
                unknown.0
            )
        })?;
    Ok(trace
        .paths
        .into_iter()
        .map(|path| {
            let mut affinity: Vec<Affinity> = Vec::new();
            for seen in path.affinity {
                // A lookup and an update of the same set are one affinity.
                if affinity.iter().all(|a| a.name != seen.set) {
                    affinity.push(Affinity {
                        name: seen.set,
                        seconds: seen.timeout_secs.and_then(|s| u32::try_from(s).ok()),
                    });
                }
            }
            Path {
                probability: path.probability,
                verdict: match path.verdict {
                    PathVerdict::Accept => Verdict::Accept,
                    PathVerdict::Drop => Verdict::Drop,
                    PathVerdict::Reject => Verdict::Reject,
                },
                endpoint: path.destination,
                masqueraded: path.masqueraded,
                affinity,
                rules: path.matched,
                elements: path.elements,
                not_followed: Vec::new(),
            }
        })
        .collect())
}

/// The packet of `connection`, as the IPVS and userspace tracers take it.
fn packet(connection: &Connection) -> kp_sync::trace::Packet {
    kp_sync::trace::Packet {
        src: connection.source,
        dst: connection.destination.ip(),
        dport: connection.destination.port(),
        protocol: connection.protocol,
        src_local: connection.origin == Origin::ThisNode,
        in_interface: connection.in_interface.clone(),
    }
}

/// The paths of an IPVS or userspace trace.
fn mode_paths(trace: kp_sync::trace::Trace) -> Vec<Path> {
    use kp_sync::trace::PathVerdict;
    trace
        .paths
        .into_iter()
        .map(|path| Path {
            probability: path.probability,
            verdict: match path.verdict {
                PathVerdict::Accept => Verdict::Accept,
                PathVerdict::Drop => Verdict::Drop,
                PathVerdict::Reject => Verdict::Reject,
            },
            endpoint: path.destination,
            masqueraded: path.masqueraded,
            affinity: path
                .affinity
                .into_iter()
                .map(|affinity| Affinity {
                    name: affinity.name,
                    seconds: Some(affinity.timeout_secs),
                })
                .collect(),
            rules: path.matched,
            elements: path.elements,
            not_followed: path.not_followed,
        })
        .collect()
}

/// The paths summed up.
fn outcome(paths: &[Path]) -> Outcome {
    let all = |f: &dyn Fn(&Path) -> bool| !paths.is_empty() && paths.iter().all(f);
    if all(&|p| p.verdict == Verdict::Accept && p.endpoint.is_some()) {
        let mut endpoints: Vec<Share> = Vec::new();
        for path in paths {
            // Checked by `all` above: every path has an endpoint.
            let Some(endpoint) = path.endpoint else {
                continue;
            };
            match endpoints.iter_mut().find(|s| s.endpoint == endpoint) {
                Some(share) => {
                    share.probability += path.probability;
                    share.masqueraded &= path.masqueraded;
                }
                None => endpoints.push(Share {
                    endpoint,
                    probability: path.probability,
                    masqueraded: path.masqueraded,
                }),
            }
        }
        endpoints.sort_by_key(|share| share.endpoint);
        let masqueraded = if paths.iter().all(|p| p.masqueraded) {
            Masquerade::All
        } else if paths.iter().any(|p| p.masqueraded) {
            Masquerade::Some
        } else {
            Masquerade::None
        };
        return Outcome::Dnat {
            endpoints,
            masqueraded,
        };
    }
    if all(&|p| p.verdict == Verdict::Reject) {
        return Outcome::Reject;
    }
    if all(&|p| p.verdict == Verdict::Drop) {
        return Outcome::Drop;
    }
    if all(&|p| p.verdict == Verdict::Accept && p.endpoint.is_none()) {
        return Outcome::NotAService;
    }
    Outcome::Mixed
}

/// The nftables data layout's draw on `path`, in words: the count set
/// that holds the packet's entry (which class rule drew), the slot the
/// rule's `numgen` picked, the slot map's element `ENTRY . SLOT` it found
/// and the endpoint that element holds. `None` on a path without a draw
/// (the chains layout, the other modes).
fn drawn_slot(path: &Path) -> Option<String> {
    // The elements as the tracer writes them: `MAP: KEY : ADDRESS . PORT`
    // for the slot, `SET: KEY` for the count set.
    let element = path.elements.iter().find(|e| {
        e.split_once(": ")
            .is_some_and(|(map, _)| kp_nftables::names::is_slot_map(map))
    })?;
    let (map, rest) = element.split_once(": ")?;
    let (key, target) = rest.split_once(" : ")?;
    let (address, port) = target.split_once(" . ")?;
    let endpoint = SocketAddr::new(address.parse().ok()?, port.parse().ok()?);
    let (entry, slot) = key.rsplit_once(" . ")?;
    let (set, count) = path.elements.iter().find_map(|e| {
        let (set, _) = e.split_once(": ")?;
        let (_, count) = kp_nftables::names::count_of_set(set)?;
        Some((set, count))
    })?;
    Some(format!(
        "drawn: the entry {entry} is in {set}, so slot {slot} of {count} was drawn: element \
         {key} of map {map} holds the endpoint {endpoint}"
    ))
}

/// The report for people.
fn text(report: &Report) -> String {
    let mut out = String::new();
    let origin = match report.origin {
        Origin::ThisNode => "a process on this node",
        Origin::Received => "received from a pod or another host",
    };
    let _ = writeln!(
        out,
        "A new {} connection {} -> {} ({origin}), {} mode, {}:",
        report.protocol.to_ascii_uppercase(),
        report.source,
        report.destination,
        report.mode,
        report.family
    );
    let _ = writeln!(out);
    for (n, path) in report.paths.iter().enumerate() {
        let mut summary = match (path.verdict, path.endpoint) {
            (Verdict::Accept, Some(endpoint)) => format!("DNAT to {endpoint}"),
            (Verdict::Accept, None) => "accepted, not changed".to_owned(),
            (Verdict::Drop, _) => "dropped".to_owned(),
            (_, _) if report.mode == "userspace" => {
                "rejected (the relay resets the connection)".to_owned()
            }
            (_, _) => "rejected (ICMP unreachable)".to_owned(),
        };
        if path.masqueraded {
            summary.push_str(", masqueraded");
        }
        let _ = writeln!(
            out,
            "path {} (probability {:.3}): {summary}",
            n + 1,
            path.probability
        );
        for rule in &path.rules {
            let _ = writeln!(out, "    {rule}");
        }
        for element in &path.elements {
            let _ = writeln!(out, "    element {element}");
        }
        if let Some(drawn) = drawn_slot(path) {
            let _ = writeln!(out, "    {drawn}");
        }
        for affinity in &path.affinity {
            let _ = writeln!(
                out,
                "    session affinity: {}{}",
                affinity.name,
                affinity
                    .seconds
                    .map(|s| format!(", {s} s"))
                    .unwrap_or_default(),
            );
        }
        for rule in &path.not_followed {
            let _ = writeln!(out, "    not followed: {rule}");
        }
    }
    let _ = writeln!(out);
    let summary = match &report.outcome {
        Outcome::Dnat {
            endpoints,
            masqueraded,
        } => {
            let list: Vec<String> = endpoints
                .iter()
                .map(|s| format!("{} ({:.1} %)", s.endpoint, s.probability * 100.0))
                .collect();
            format!(
                "load-balanced to {} endpoint(s): {}; {}",
                endpoints.len(),
                list.join(", "),
                masqueraded.phrase()
            )
        }
        Outcome::Reject => "rejected".to_owned(),
        Outcome::Drop => "dropped".to_owned(),
        Outcome::NotAService => {
            "not a Service address and port handled by the proxy here".to_owned()
        }
        Outcome::Mixed => "the paths end differently (see above)".to_owned(),
    };
    let _ = writeln!(out, "Outcome: {summary}");
    out
}

#[cfg(test)]
#[path = "trace_tests.rs"]
mod tests;
