//! The proxy modes the harness drives, and everything that differs between
//! them: how the binary is made to choose one, how our objects are read back
//! from the kernel, and which program applies a sync. A later mode
//! (nftables, IPVS) is one more variant here; the rest of the harness only
//! asks these questions.

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
}

/// What kind of object of ours a chain is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    /// One per Service port (`KUBE-SVC-`).
    Service,
    /// One per endpoint of a Service port (`KUBE-SEP-`).
    Endpoint,
    /// The other per-Service chains (`KUBE-EXT-`, `KUBE-FW-`, `KUBE-SVL-`).
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
    pub const ALL: [Mode; 2] = [Mode::IptablesLegacy, Mode::IptablesNft];

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
        }
    }

    /// How the tables name it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::IptablesLegacy => "iptables-legacy",
            Mode::IptablesNft => "iptables-nft",
        }
    }

    /// The programs this mode needs on the PATH.
    pub fn tools(self) -> [&'static str; 3] {
        [self.iptables(), self.save(), self.restore()]
    }

    /// Flags that select the mode, beyond the operator's usual ones: none
    /// for iptables, the default mode (nftables will pass `--proxy-mode
    /// nftables`).
    pub fn flags(self) -> &'static [&'static str] {
        match self {
            Mode::IptablesLegacy | Mode::IptablesNft => &[],
        }
    }

    /// Prepares the node namespace (the calling thread is in it) as the
    /// node's other agents would have: kubelet's `KUBE-IPTABLES-HINT` chain
    /// in the mangle table of the flavor it uses makes the proxy pick that
    /// flavor (`iptables-legacy -t mangle -N KUBE-IPTABLES-HINT`).
    pub fn prepare_node(self) {
        let status = Command::new(self.iptables())
            .args(["-t", "mangle", "-N", "KUBE-IPTABLES-HINT"])
            .status()
            .unwrap();
        assert!(status.success(), "creating kubelet's hint chain");
    }

    /// The program that applies a sync, as the proxy runs it (`PATH`
    /// lookup), and its arguments: the lone-restore reference times it.
    pub fn restore(self) -> &'static str {
        match self {
            Mode::IptablesLegacy => "iptables-legacy-restore",
            Mode::IptablesNft => "iptables-nft-restore",
        }
    }

    /// The arguments the proxy gives [`restore`](Self::restore).
    pub fn restore_args(self) -> &'static [&'static str] {
        &["--noflush", "--counters", "-w", "5", "-W", "100000"]
    }

    /// Our objects in the kernel now (`iptables-legacy-save -t nat`).
    pub fn ruleset(self) -> Ruleset {
        Ruleset::from_iptables_save(&self.run(self.save(), &["-t", "nat"]))
    }

    /// Whether the service object `object` sends to `destination`
    /// (`IP:PORT`) now: `iptables-legacy -t nat -S KUBE-SVC-…`, then `-S` of
    /// each `KUBE-SEP-` chain it jumps to, for its DNAT rule.
    pub fn service_reaches(self, object: &str, destination: &str) -> bool {
        let rules = |chain: &str| self.run(self.iptables(), &["-t", "nat", "-S", chain]);
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
        self.run(self.iptables(), &["--version"]).trim().to_owned()
    }

    fn iptables(self) -> &'static str {
        match self {
            Mode::IptablesLegacy => "iptables-legacy",
            Mode::IptablesNft => "iptables-nft",
        }
    }

    fn save(self) -> &'static str {
        match self {
            Mode::IptablesLegacy => "iptables-legacy-save",
            Mode::IptablesNft => "iptables-nft-save",
        }
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
