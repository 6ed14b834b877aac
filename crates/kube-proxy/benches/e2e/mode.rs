//! The proxy modes the harness drives, and everything that differs between
//! them: how the binary is made to choose one, how our objects are read back
//! from the kernel, and which program applies a sync (none for the
//! nftables mode, which commits over netlink: it has no lone-restore
//! reference). A later mode (IPVS) is one more variant here; the rest of
//! the harness only asks these questions.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// A proxy mode (for iptables, with its flavor) as a node runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `--proxy-mode iptables` (the default) on a node whose kubelet uses
    /// iptables-legacy.
    IptablesLegacy,
    /// `--proxy-mode iptables` on a node whose kubelet uses iptables-nft.
    IptablesNft,
    /// `--proxy-mode nftables --nftables-layout chains`: the tables `ip
    /// kube-proxy` and `ip6 kube-proxy`, committed over netlink, with
    /// upstream's endpoint chains.
    Nftables,
    /// The same with `--nftables-layout data` (the default): a service
    /// port's endpoints are elements of a `service-endpoints-` map, not
    /// chains.
    NftablesData,
}

/// What kind of object of ours a chain is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    /// One per Service port (`KUBE-SVC-`; nftables: `service-`).
    Service,
    /// One per endpoint of a Service port (`KUBE-SEP-`; `endpoint-`).
    Endpoint,
    /// The other per-Service chains (`KUBE-EXT-`, `KUBE-FW-`, `KUBE-SVL-`;
    /// `external-`, `firewall-`).
    OtherPerService,
}

/// Our per-Service and per-endpoint objects in the kernel's NAT rules, as
/// read from outside the proxy.
#[derive(Debug, Default)]
pub struct Ruleset {
    /// Every object of ours, by kind.
    objects: Vec<(ObjectKind, String)>,
    /// Objects some rule jumps or goes to.
    referenced: BTreeSet<String>,
    /// The service object of each Service port (`ns/name:port`).
    service_objects: BTreeMap<String, String>,
}

/// The endpoints a service object sends to, as read from the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    /// How many it draws from: its endpoint chains, or (the nftables data
    /// layout) the `K` of the `endpoint-count-K` set holding its entry.
    pub count: usize,
    /// The `IP:PORT` destinations found among them, sorted: one per
    /// endpoint chain with a DNAT rule, or per slot below the count.
    pub destinations: Vec<String>,
}

impl Mode {
    /// Every mode, in the order of `KP_E2E_MODES`' names.
    pub const ALL: [Mode; 4] = [
        Mode::IptablesLegacy,
        Mode::IptablesNft,
        Mode::Nftables,
        Mode::NftablesData,
    ];

    /// The mode named `name` in `KP_E2E_MODES`.
    pub fn parse(name: &str) -> Self {
        Self::ALL
            .into_iter()
            .find(|mode| mode.short_name() == name || mode.name() == name)
            .unwrap_or_else(|| {
                let known: Vec<&str> = Self::ALL.iter().map(|m| m.short_name()).collect();
                panic!("KP_E2E_MODES: unknown mode {name:?}; known: {known:?}")
            })
    }

    /// How `KP_E2E_MODES` names it.
    pub fn short_name(self) -> &'static str {
        match self {
            Mode::IptablesLegacy => "legacy",
            Mode::IptablesNft => "nft",
            Mode::Nftables => "nftables",
            Mode::NftablesData => "nftables-data",
        }
    }

    /// How the tables name it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::IptablesLegacy => "iptables-legacy",
            Mode::IptablesNft => "iptables-nft",
            Mode::Nftables => "nftables, chains layout",
            Mode::NftablesData => "nftables, data layout",
        }
    }

    /// The programs the harness needs on the PATH for this mode.
    pub fn tools(self) -> &'static [&'static str] {
        match self {
            Mode::IptablesLegacy => &[
                "iptables-legacy",
                "iptables-legacy-save",
                "iptables-legacy-restore",
            ],
            Mode::IptablesNft => &["iptables-nft", "iptables-nft-save", "iptables-nft-restore"],
            Mode::Nftables | Mode::NftablesData => &["nft"],
        }
    }

    /// Flags that select the mode, beyond the operator's usual ones: none
    /// for iptables, the default mode.
    pub fn flags(self) -> &'static [&'static str] {
        match self {
            Mode::IptablesLegacy | Mode::IptablesNft => &[],
            Mode::Nftables => &["--proxy-mode", "nftables", "--nftables-layout", "chains"],
            Mode::NftablesData => &["--proxy-mode", "nftables", "--nftables-layout", "data"],
        }
    }

    /// Prepares the node namespace (the calling thread is in it) as the
    /// node's other agents would have: kubelet's `KUBE-IPTABLES-HINT` chain
    /// in the mangle table of the flavor it uses makes the proxy pick that
    /// flavor (`iptables-legacy -t mangle -N KUBE-IPTABLES-HINT`).
    pub fn prepare_node(self) {
        let Some(iptables) = self.iptables() else {
            return;
        };
        let status = Command::new(iptables)
            .args(["-t", "mangle", "-N", "KUBE-IPTABLES-HINT"])
            .status()
            .unwrap();
        assert!(status.success(), "creating kubelet's hint chain");
    }

    /// The program that applies a sync, as the proxy runs it (`PATH`
    /// lookup), and its arguments: the lone-restore reference times it.
    /// `None` for the nftables mode, which runs no program.
    pub fn restore(self) -> Option<&'static str> {
        match self {
            Mode::IptablesLegacy => Some("iptables-legacy-restore"),
            Mode::IptablesNft => Some("iptables-nft-restore"),
            Mode::Nftables | Mode::NftablesData => None,
        }
    }

    /// The arguments the proxy gives [`restore`](Self::restore).
    pub fn restore_args(self) -> &'static [&'static str] {
        &["--noflush", "--counters", "-w", "5", "-W", "100000"]
    }

    /// Our objects in the kernel now (`iptables-legacy-save -t nat`;
    /// `nft list table ip kube-proxy`).
    pub fn ruleset(self) -> Ruleset {
        match self.save() {
            Some(save) => Ruleset::from_iptables_save(&self.run(save, &["-t", "nat"])),
            None => Ruleset::from_nft_listing(&self.nft_listing()),
        }
    }

    /// The endpoints the service object `object` sends to now, `None` if
    /// the object is not found. iptables: `iptables-legacy -t nat -S`, the
    /// `KUBE-SEP-` chains `object` jumps to and their DNAT rules'
    /// destinations; nftables: `nft list table ip kube-proxy`, the
    /// `endpoint-` chains `object` goes to and their DNAT destinations, or
    /// (the data layout) the entry's count and its slots below it.
    pub fn service_endpoints(self, object: &str) -> Option<Endpoints> {
        let Some(iptables) = self.iptables() else {
            // The chains, and the sets and maps without their elements
            // (`nft -t`); the few sets and maps the data layout's draw
            // needs are read on their own: not the hairpin pairs, as many
            // as the endpoints, nor the other maps.
            let listing = self.run("nft", &["-t", "list", "table", "ip", "kube-proxy"]);
            return nft_service_endpoints(&listing, object, nft_object);
        };
        // One listing of the table: a listing of one chain costs as much.
        let listing = self.run(iptables, &["-t", "nat", "-S"]);
        let rules = |chain: &str| {
            let prefix = format!("-A {chain} ");
            listing
                .lines()
                .filter_map(move |line| line.strip_prefix(&prefix).map(str::to_owned))
                .collect::<Vec<String>>()
        };
        if !listing.lines().any(|line| line == format!("-N {object}")) {
            return None;
        }
        let chains: BTreeSet<String> = rules(object)
            .iter()
            .filter_map(|rule| jump_target(rule))
            .filter(|target| chain_kind(target) == Some(ObjectKind::Endpoint))
            .map(str::to_owned)
            .collect();
        let destinations = chains
            .iter()
            .filter_map(|chain| {
                rules(chain).iter().find_map(|rule| {
                    let words: Vec<&str> = rule.split_whitespace().collect();
                    words
                        .windows(2)
                        .find(|pair| pair[0] == "--to-destination")
                        .map(|pair| pair[1].to_owned())
                })
            })
            .collect();
        Some(Endpoints::new(chains.len(), destinations))
    }

    /// The versions of the mode's programs, for the header.
    pub fn versions(self) -> String {
        let program = self.iptables().unwrap_or("nft");
        self.run(program, &["--version"]).trim().to_owned()
    }

    fn iptables(self) -> Option<&'static str> {
        match self {
            Mode::IptablesLegacy => Some("iptables-legacy"),
            Mode::IptablesNft => Some("iptables-nft"),
            Mode::Nftables | Mode::NftablesData => None,
        }
    }

    fn save(self) -> Option<&'static str> {
        match self {
            Mode::IptablesLegacy => Some("iptables-legacy-save"),
            Mode::IptablesNft => Some("iptables-nft-save"),
            Mode::Nftables | Mode::NftablesData => None,
        }
    }

    /// `nft list table ip kube-proxy`.
    fn nft_listing(self) -> String {
        self.run("nft", &["list", "table", "ip", "kube-proxy"])
    }

    /// Runs `program ARGS…` in the calling thread's namespace; its stdout.
    fn run(self, program: &str, args: &[&str]) -> String {
        let out = Command::new(program).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

impl Endpoints {
    fn new(count: usize, mut destinations: Vec<String>) -> Self {
        destinations.sort();
        Self {
            count,
            destinations,
        }
    }

    /// Whether these are exactly `expected` (`IP:PORT`, any order): as
    /// many to draw from, each of them there, no other.
    pub fn are(&self, expected: &[String]) -> bool {
        let mut expected = expected.to_vec();
        expected.sort();
        self.count == expected.len() && self.destinations == expected
    }
}

impl Ruleset {
    /// Reads `iptables-save -t nat` output: declared chains (`:NAME …`),
    /// jump and goto targets (`-j NAME`, `-g NAME`), and each Service
    /// port's `KUBE-SVC-` chain from the `KUBE-SERVICES` rule that jumps to
    /// it (comment `"ns/svc:port cluster IP"`).
    pub fn from_iptables_save(text: &str) -> Self {
        let mut ruleset = Ruleset::default();
        for line in text.lines() {
            if let Some(declared) = line.strip_prefix(':') {
                let name = declared.split_whitespace().next().unwrap_or_default();
                if let Some(kind) = chain_kind(name) {
                    ruleset.objects.push((kind, name.to_owned()));
                }
                continue;
            }
            let Some(rule) = line.strip_prefix("-A ") else {
                continue;
            };
            let Some(target) = jump_target(rule) else {
                continue;
            };
            ruleset.referenced.insert(target.to_owned());
            if !rule.starts_with("KUBE-SERVICES ")
                || chain_kind(target) != Some(ObjectKind::Service)
            {
                continue;
            }
            let port = rule
                .split_once("--comment \"")
                .and_then(|(_, rest)| rest.split_once(" cluster IP\""))
                .map(|(port, _)| port);
            if let Some(port) = port {
                ruleset
                    .service_objects
                    .insert(port.to_owned(), target.to_owned());
            }
        }
        ruleset
    }

    /// How many objects of `kind` exist.
    pub fn count(&self, kind: ObjectKind) -> usize {
        self.objects.iter().filter(|(k, _)| *k == kind).count()
    }

    /// How many objects of `kind` (of any kind with `None`) no rule jumps
    /// to: stale ones, which only waste memory and restore time.
    pub fn unreferenced(&self, kind: Option<ObjectKind>) -> usize {
        self.objects
            .iter()
            .filter(|(k, name)| {
                kind.is_none_or(|kind| *k == kind) && !self.referenced.contains(name)
            })
            .count()
    }

    /// The service object of Service port `port` (`ns/name:port`).
    pub fn service_object(&self, port: &str) -> Option<&str> {
        self.service_objects.get(port).map(String::as_str)
    }
}

impl Ruleset {
    /// Reads `nft list table ip kube-proxy`: declared chains (`chain NAME
    /// {`), every `goto`/`jump` target (in rules and in verdict map
    /// elements), and each Service port's `service-` chain, whose name
    /// ends in `ns/name/protocol/port`.
    pub fn from_nft_listing(text: &str) -> Self {
        let mut ruleset = Ruleset::default();
        for line in text.lines() {
            let line = line.trim();
            if let Some(name) = line
                .strip_prefix("chain ")
                .and_then(|l| l.strip_suffix(" {"))
            {
                let name = name.trim_matches('"');
                if let Some(kind) = nft_chain_kind(name) {
                    ruleset.objects.push((kind, name.to_owned()));
                }
                if nft_chain_kind(name) == Some(ObjectKind::Service) {
                    if let Some(port) = nft_service_port(name) {
                        ruleset.service_objects.insert(port, name.to_owned());
                    }
                }
                continue;
            }
            ruleset
                .referenced
                .extend(nft_targets(line).map(str::to_owned));
        }
        ruleset
    }
}

/// The chains an nft line (a rule or verdict map elements) goes or jumps
/// to.
fn nft_targets(line: &str) -> impl Iterator<Item = &str> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let targets: Vec<&str> = words
        .windows(2)
        .filter(|pair| pair[0] == "goto" || pair[0] == "jump")
        .map(|pair| pair[1].trim_end_matches([',', '}']).trim_matches('"'))
        .collect();
    targets.into_iter()
}

/// The kind of a per-Service chain, `KIND-HASHHASH-…` with an 8-character
/// base32 hash (which tells `service-ABCDEFGH-ns/…` from the mode's own
/// `service-endpoints-check`).
fn nft_chain_kind(name: &str) -> Option<ObjectKind> {
    let (prefix, rest) = name.split_once('-')?;
    let hashed = rest.len() > 9
        && rest.as_bytes()[8] == b'-'
        && rest[..8]
            .bytes()
            .all(|b| b.is_ascii_uppercase() || (b'2'..=b'7').contains(&b));
    match prefix {
        _ if !hashed => None,
        "service" => Some(ObjectKind::Service),
        "endpoint" => Some(ObjectKind::Endpoint),
        "external" | "firewall" => Some(ObjectKind::OtherPerService),
        _ => None,
    }
}

/// `ns/name:port` of a `service-HASH-ns/name/protocol/port` chain.
fn nft_service_port(chain: &str) -> Option<String> {
    let (_, readable) = chain.strip_prefix("service-")?.split_once('-')?;
    let mut parts = readable.split('/');
    let (namespace, name, _protocol, port) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    Some(format!("{namespace}/{name}:{port}"))
}

/// `nft list KIND ip kube-proxy NAME` (a set or a map, with its
/// elements); empty if there is none.
fn nft_object(kind: &str, name: &str) -> String {
    Command::new("nft")
        .args(["list", kind, "ip", "kube-proxy", name])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default()
}

/// The lines of the block `KIND NAME {` … `}` in an nft listing, if there
/// is one.
fn nft_block<'a>(listing: &'a str, kind: &str, name: &str) -> Option<Vec<&'a str>> {
    let mut lines = listing.lines().map(str::trim);
    let header = format!("{kind} {name} {{");
    let quoted = format!("{kind} \"{name}\" {{");
    if !lines.any(|line| line == header || line == quoted) {
        return None;
    }
    Some(lines.take_while(|line| *line != "}").collect())
}

/// The endpoints the `service-` chain `object` in `listing` (chains with
/// their rules) sends to: the `endpoint-` chains it goes to and their DNAT
/// destinations, or (the data layout) what it draws from the slot map,
/// whose sets and maps `object_listing(kind, name)` lists with their
/// elements. `None` if there is no such chain.
fn nft_service_endpoints(
    listing: &str,
    object: &str,
    object_listing: impl Fn(&str, &str) -> String,
) -> Option<Endpoints> {
    let block = |kind: &str, name: &str| nft_block(listing, kind, name);
    let chain = block("chain", object)?;
    if let Some(drawn) = nft_draw(listing, object, &chain, |kind, name| {
        nft_block(&object_listing(kind, name), kind, name)
            .unwrap_or_default()
            .join(" ")
    }) {
        return Some(drawn);
    }
    let endpoints: BTreeSet<&str> = chain
        .iter()
        .flat_map(|line| nft_targets(line))
        .filter(|target| nft_chain_kind(target) == Some(ObjectKind::Endpoint))
        .collect();
    let destinations = endpoints
        .iter()
        .filter_map(|endpoint| {
            block("chain", endpoint)?.iter().find_map(|line| {
                let (_, to) = line.split_once("dnat to ")?;
                to.split_whitespace().next().map(str::to_owned)
            })
        })
        .collect();
    Some(Endpoints::new(endpoints.len(), destinations))
}

/// For a service chain of the data layout (its last rule `goto
/// endpoints-by-count-PROTO`): the entry's endpoint count (the `K` of the
/// `endpoint-count-K` set that holds the chain's ClusterIP entry, the
/// `service-ips` element that goes to `object`) and the destinations the
/// slot map holds in the entry's slots below it. `block(kind, name)` is
/// the text of a set or map. `None` without such a goto; a count of 0 if
/// no count set holds the entry.
fn nft_draw(
    listing: &str,
    object: &str,
    chain: &[&str],
    block: impl Fn(&str, &str) -> String,
) -> Option<Endpoints> {
    let protocol = chain
        .iter()
        .find_map(|line| line.strip_prefix("goto endpoints-by-count-"))?;
    let words = |text: &str| -> Vec<String> {
        text.split_whitespace()
            .filter(|word| *word != "." && *word != "}" && *word != "{")
            .map(|word| word.trim_matches([',', '"']).to_owned())
            .collect()
    };
    let elements = |text: &str| -> Vec<Vec<String>> {
        text.split_once("elements = {")
            .map(|(_, elements)| elements.split(',').map(words).collect())
            .unwrap_or_default()
    };
    let nothing = || Endpoints::new(0, Vec::new());
    // `IP . PROTO . PORT : goto OBJECT` in service-ips.
    let entry =
        elements(&block("map", "service-ips"))
            .into_iter()
            .find_map(|element| match element.as_slice() {
                [ip, p, port, colon, goto, chain]
                    if p == protocol && colon == ":" && goto == "goto" && chain == object =>
                {
                    Some([ip.clone(), p.clone(), port.clone()])
                }
                _ => None,
            });
    let Some(entry) = entry else {
        return Some(nothing());
    };
    let [ip, _, port] = &entry;
    let count = listing
        .lines()
        .filter_map(|line| line.trim().strip_prefix("set endpoint-count-"))
        .filter_map(|rest| rest.strip_suffix(" {"))
        .find(|count| {
            elements(&block("set", &format!("endpoint-count-{count}")))
                .iter()
                .any(|element| *element == entry)
        })
        .and_then(|count| count.parse::<usize>().ok());
    let Some(count) = count else {
        return Some(nothing());
    };
    // `IP . PORT . SLOT : TO_IP . TO_PORT` in service-endpoints-PROTO.
    let destinations = elements(&block("map", &format!("service-endpoints-{protocol}")))
        .into_iter()
        .filter_map(|element| match element.as_slice() {
            [i, p, slot, colon, to_ip, to_port]
                if i == ip
                    && p == port
                    && colon == ":"
                    && slot.parse::<usize>().is_ok_and(|slot| slot < count) =>
            {
                Some(format!("{to_ip}:{to_port}"))
            }
            _ => None,
        })
        .collect();
    Some(Endpoints::new(count, destinations))
}

/// The chain an iptables rule (`CHAIN … -j TARGET`) jumps or goes to.
fn jump_target(rule: &str) -> Option<&str> {
    let words: Vec<&str> = rule.split_whitespace().collect();
    words
        .windows(2)
        .find(|pair| pair[0] == "-j" || pair[0] == "-g")
        .map(|pair| pair[1])
}

fn chain_kind(name: &str) -> Option<ObjectKind> {
    if name.starts_with("KUBE-SVC-") {
        Some(ObjectKind::Service)
    } else if name.starts_with("KUBE-SEP-") {
        Some(ObjectKind::Endpoint)
    } else if ["KUBE-EXT-", "KUBE-FW-", "KUBE-SVL-"]
        .iter()
        .any(|prefix| name.starts_with(prefix))
    {
        Some(ObjectKind::OtherPerService)
    } else {
        None
    }
}
