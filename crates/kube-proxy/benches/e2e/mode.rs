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
    /// `--proxy-mode nftables`: the tables `ip kube-proxy` and `ip6
    /// kube-proxy`, committed over netlink.
    Nftables,
    /// The same with `--nftables-layout data`: a service port's endpoints
    /// are elements of a `service-endpoints-` map, not chains.
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
            Mode::Nftables => "nftables",
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
            Mode::Nftables => &["--proxy-mode", "nftables"],
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

    /// Whether the service object `object` sends to `destination`
    /// (`IP:PORT`) now: `iptables-legacy -t nat -S KUBE-SVC-…`, then `-S` of
    /// each `KUBE-SEP-` chain it jumps to, for its DNAT rule.
    pub fn service_reaches(self, object: &str, destination: &str) -> bool {
        let Some(iptables) = self.iptables() else {
            return nft_service_reaches(&self.nft_listing(), object, destination);
        };
        let rules = |chain: &str| self.run(iptables, &["-t", "nat", "-S", chain]);
        rules(object)
            .lines()
            .filter_map(|line| line.strip_prefix("-A "))
            .filter_map(jump_target)
            .filter(|target| chain_kind(target) == Some(ObjectKind::Endpoint))
            .any(|endpoint| {
                rules(endpoint).lines().any(|line| {
                    let words: Vec<&str> = line.split_whitespace().collect();
                    words
                        .windows(2)
                        .any(|pair| pair == ["--to-destination", destination])
                })
            })
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

/// Whether the `service-` chain `object` in `listing` goes to an
/// `endpoint-` chain that DNATs to `destination` (`IP:PORT`), or (the data
/// layout) draws from a map holding `destination` under its number.
fn nft_service_reaches(listing: &str, object: &str, destination: &str) -> bool {
    let block = |kind: &str, name: &str| -> Vec<&str> {
        let mut lines = listing.lines().map(str::trim);
        let header = format!("{kind} {name} {{");
        let quoted = format!("{kind} \"{name}\" {{");
        if !lines.any(|line| line == header || line == quoted) {
            return Vec::new();
        }
        lines.take_while(|line| *line != "}").collect()
    };
    let chain_body = |name: &str| block("chain", name);
    if let Some(reached) = nft_draw_reaches(
        listing,
        object,
        &chain_body(object),
        destination,
        |kind, name| block(kind, name).join(" "),
    ) {
        return reached;
    }
    let endpoints: Vec<String> = chain_body(object)
        .into_iter()
        .flat_map(nft_targets)
        .filter(|target| nft_chain_kind(target) == Some(ObjectKind::Endpoint))
        .map(str::to_owned)
        .collect();
    let dnat = format!("dnat to {destination}");
    endpoints
        .iter()
        .any(|endpoint| chain_body(endpoint).iter().any(|line| line.contains(&dnat)))
}

/// For a service chain of the data layout (its last rule `goto
/// endpoints-by-count-PROTO`): whether the slot map holds `destination`
/// (`IP:PORT`) in a slot of the chain's ClusterIP entry (the `service-ips`
/// element that goes to `object`) below the entry's endpoint count (the
/// `endpoint-count-E` set that holds the entry). `block(kind, name)` is
/// the text of a set or map. `None` without such a goto.
fn nft_draw_reaches(
    listing: &str,
    object: &str,
    chain: &[&str],
    destination: &str,
    block: impl Fn(&str, &str) -> String,
) -> Option<bool> {
    let protocol = chain
        .iter()
        .find_map(|line| line.strip_prefix("goto endpoints-by-count-"))?;
    let words = |text: &str| -> Vec<String> {
        text.split_whitespace()
            .filter(|word| *word != "." && *word != "}" && *word != "{")
            .map(|word| word.trim_matches([',', '"']).to_owned())
            .collect()
    };
    // `IP . PROTO . PORT : goto OBJECT` in service-ips.
    let service_ips = block("map", "service-ips");
    let elements = service_ips.split_once("elements = {")?.1;
    let (ip, port) = elements
        .split(',')
        .find_map(|element| match words(element).as_slice() {
            [ip, p, port, colon, goto, chain]
                if p == protocol && colon == ":" && goto == "goto" && chain == object =>
            {
                Some((ip.clone(), port.clone()))
            }
            _ => None,
        })?;
    let entry = format!("{ip} . {protocol} . {port}");
    let count: u32 = listing
        .lines()
        .filter_map(|line| line.trim().strip_prefix("set endpoint-count-"))
        .filter_map(|rest| rest.strip_suffix(" {"))
        .find(|count| {
            let set = block("set", &format!("endpoint-count-{count}"));
            set.split_once("elements = {").is_some_and(|(_, elements)| {
                elements
                    .split(',')
                    .any(|element| words(element).join(" . ") == entry)
            })
        })?
        .parse()
        .ok()?;
    let (to_ip, to_port) = destination.rsplit_once(':')?;
    let map = block("map", &format!("service-endpoints-{protocol}"));
    let elements = map.split_once("elements = {")?.1;
    Some(elements.split(',').any(|element| {
        matches!(words(element).as_slice(), [i, p, slot, colon, t, tp]
            if *i == ip && *p == port && colon == ":" && t == to_ip && tp == to_port
                && slot.parse::<u32>().is_ok_and(|slot| slot < count))
    }))
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
