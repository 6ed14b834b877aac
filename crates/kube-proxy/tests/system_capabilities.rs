//! The `kube-proxy` binary with the least privilege of
//! `deploy/least-privilege/daemonset.yaml`: its proxy container keeps only
//! CAP_NET_ADMIN and CAP_NET_RAW, and a privileged init container runs
//! `kube-proxy --init-only` first.
//!
//! Each test makes a node network namespace (kp-testkit), runs the init
//! container's step there with full privileges (`--init-only` with the
//! proxy's flags), then starts the proxy on the example manifests as an
//! unprivileged container process starts:
//! - in a mount namespace of its own where `/proc/sys` and `/sys` are
//!   read-only, as a container runtime mounts them for a container that is
//!   not privileged (the OCI runtime spec's `readonlyPaths`; sysfs `ro`);
//! - as uid 0 with the bounding set cut down to the two capabilities and no
//!   inheritable ones (`setpriv --bounding-set=-all,+net_admin,+net_raw
//!   --inh-caps=-all --no-new-privs`), so that the proxy and every
//!   `iptables-restore` or `nft` it runs hold exactly those two, as in a
//!   container with `capabilities: {drop: [ALL], add: [NET_ADMIN,
//!   NET_RAW]}` and `allowPrivilegeEscalation: false`. The test reads the
//!   running proxy's `/proc/PID/status` to prove it.
//!
//! Then the example Services are programmed (`kube-proxy check` with the
//! same flags exits 0, and the kernel holds the mode's rules), `/healthz`
//! answers 200, and the only warning logged is the one expected: the OOM
//! score adjustment of -999 needs CAP_SYS_RESOURCE (the kubelet gives a
//! `system-node-critical` pod -997 itself). No "Operation not permitted",
//! no "Permission denied", no "Read-only file system".
//!
//! The sysctls. At start the proxy writes the conntrack sysctls of its
//! configuration and, in the iptables mode with localhost NodePorts,
//! `net.ipv4.conf.all.route_localnet=1`; with a read-only `/proc/sys` it
//! cannot. The init container's step sets them first, so the proxy finds
//! them set and writes nothing. `nf_conntrack_max` is left out with
//! `--conntrack-max-per-core 0` (to both runs): outside the initial network
//! namespace the kernel shows the host's global value read-only, so even
//! the privileged step could not set it here, and these tests never change
//! the root namespace's sysctls. On a node (host network) the init
//! container sets it too.
//!
//! Without the init container (proven below): the iptables mode programs
//! nothing, every sync failing on route_localnet ("Read-only file system";
//! `iptables.localhostNodePorts: false` does without it); the nftables mode
//! programs its rules, and only the conntrack timeouts stay as the host has
//! them (one warning each). Without CAP_NET_ADMIN nothing is programmed in
//! either mode, and the log says what the kernel refused.
//!
//! Address plan: kp-testkit's; the node is 192.168.99.2 (examples/node.yaml).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use kp_testkit::http;
use kp_testkit::netns::{require_root, require_tool, wait_until, Netns, NsChild};

const BIN: &str = env!("CARGO_BIN_EXE_kube-proxy");

/// The proxy container's capabilities in `deploy/least-privilege/`, as
/// `setpriv --bounding-set` takes them.
const PROXY_CAPABILITIES: &str = "+net_admin,+net_raw";

/// CAP_NET_ADMIN (12) and CAP_NET_RAW (13) as `/proc/PID/status` shows a
/// capability set.
const NET_ADMIN_AND_NET_RAW: u64 = (1 << 12) | (1 << 13);

/// The only warning a least-privilege proxy logs.
const OOM_SCORE_WARNING: &str = "Failed to apply the OOM score adjustment; continuing";

/// The shell script that turns the test's root process into an
/// unprivileged container's: read-only `/proc/sys` and `/sys` in a mount
/// namespace of its own (`unshare --mount` runs it), then the capabilities
/// in `$CAPABILITIES` only. `exec` keeps one process id from `ip netns
/// exec` to the proxy.
const AS_CONTAINER: &str = "mount --bind /proc/sys /proc/sys \
    && mount -o remount,bind,ro /proc/sys \
    && mount --bind /sys /sys \
    && mount -o remount,bind,ro /sys \
    && exec setpriv --no-new-privs --inh-caps=-all \
         --bounding-set=-all,\"$CAPABILITIES\" -- \"$@\"";

/// A node namespace for the proxy in `mode`.
struct Node {
    ns: Netns,
    mode: &'static str,
    /// The nftables table layout (`--nftables-layout`), if one is given.
    layout: Option<&'static str>,
    dir: tempfile::TempDir,
}

/// A proxy started as an unprivileged container's process.
struct Container {
    proxy: NsChild,
    log: PathBuf,
}

/// A node namespace with the example node's address, for `mode`; with
/// `legacy_hint` kubelet's `KUBE-IPTABLES-HINT` chain in the legacy mangle
/// table, so that the proxy picks iptables-legacy.
fn node(mode: &'static str, legacy_hint: bool) -> Node {
    node_in_layout(mode, legacy_hint, None)
}

/// [`node`], the nftables table in `layout` if given.
fn node_in_layout(mode: &'static str, legacy_hint: bool, layout: Option<&'static str>) -> Node {
    require_root();
    require_tool("setpriv");
    require_tool("unshare");
    let ns = Netns::create("caps").unwrap();
    ns.ip(&["link", "set", "lo", "up"]).unwrap();
    ns.ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "eth1",
    ])
    .unwrap();
    ns.ip(&["addr", "add", "192.168.99.2/24", "dev", "eth0"])
        .unwrap();
    ns.ip(&["link", "set", "eth0", "up"]).unwrap();
    ns.ip(&["link", "set", "eth1", "up"]).unwrap();
    if legacy_hint {
        ns.exec_ok(
            "iptables-legacy",
            &["-t", "mangle", "-N", "KUBE-IPTABLES-HINT"],
        );
    }
    Node {
        ns,
        mode,
        layout,
        dir: tempfile::tempdir().unwrap(),
    }
}

impl Node {
    /// The proxy's flags: the example manifests in `mode` (and layout),
    /// the table size left alone (see the file's comment).
    fn flags(&self) -> Vec<String> {
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let mut flags = [
            "--manifests",
            examples.to_str().unwrap(),
            "--hostname-override",
            "node-1",
            "--cluster-cidr",
            "10.244.0.0/16",
            "--proxy-mode",
            self.mode,
            "--conntrack-max-per-core",
            "0",
        ]
        .map(str::to_owned)
        .to_vec();
        if let Some(layout) = self.layout {
            flags.extend(["--nftables-layout".to_owned(), layout.to_owned()]);
        }
        flags
    }

    /// The init container: `--init-only` with the proxy's flags and full
    /// privileges.
    fn init_container(&self) {
        let out = self
            .ns
            .command(BIN)
            .args(self.flags())
            .arg("--init-only")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "--init-only failed:\n{stderr}");
        assert!(
            stderr.contains("System initialized and --init-only specified"),
            "{stderr}"
        );
    }

    /// Starts the proxy as an unprivileged container's process holding
    /// only `capabilities` (`+net_admin,+net_raw` style); waits until the
    /// process is the proxy with its capabilities in place.
    fn start_container(&self, capabilities: &str) -> Container {
        let log = self.dir.path().join(format!("proxy-{capabilities}.log"));
        let mut command = self.ns.command("unshare");
        command
            .args(["--mount", "--propagation", "private", "--"])
            .args(["sh", "-c", AS_CONTAINER, "sh", BIN])
            .args(self.flags())
            .env("CAPABILITIES", capabilities)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(File::create(&log).unwrap()));
        let proxy = NsChild::spawn(&mut command).unwrap();
        let pid = proxy.id();
        let started = wait_until(Duration::from_secs(10), || {
            fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "kube-proxy")
        });
        let container = Container { proxy, log };
        assert!(
            started,
            "the proxy did not start as a container process; its log:\n{}",
            container.log_text()
        );
        container
    }

    /// `kube-proxy check` with the proxy's flags, fully privileged: exit
    /// code and output.
    fn check(&self) -> (Option<i32>, String) {
        let out = self
            .ns
            .command(BIN)
            .arg("check")
            .args(self.flags())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    }

    /// Whether `kube-proxy check` finds every example Service programmed,
    /// waiting up to 30 s.
    fn programmed(&self) -> bool {
        wait_until(Duration::from_secs(30), || self.check().0 == Some(0))
    }

    /// The rules the mode left in the kernel, read back with its own tool.
    fn rules(&self, legacy: bool) -> String {
        match (self.mode, legacy) {
            ("nftables", _) => {
                let out = self.ns.exec("nft", &["list", "ruleset"]);
                String::from_utf8_lossy(&out.stdout).into_owned()
            }
            (_, true) => self.ns.exec_ok("iptables-legacy-save", &["-t", "nat"]),
            // The system's iptables, which the proxy uses without a hint.
            (_, false) => self.ns.exec_ok("iptables-save", &["-t", "nat"]),
        }
    }

    /// `/healthz` on the node's loopback.
    fn healthz(&self) -> u16 {
        self.ns
            .run(|| http::get("127.0.0.1:10256", "/healthz"))
            .map_or(0, |reply| reply.code)
    }
}

impl Container {
    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process's capability sets from `/proc/PID/status`
    /// (`CapEff`, `CapPrm`, `CapBnd`, `CapInh`, `CapAmb`).
    fn capabilities(&self) -> Vec<(String, u64)> {
        let status = fs::read_to_string(format!("/proc/{}/status", self.proxy.id())).unwrap();
        status
            .lines()
            .filter_map(|line| {
                let (name, value) = line.split_once(":\t")?;
                let bits = u64::from_str_radix(value.trim(), 16).ok()?;
                name.starts_with("Cap").then(|| (name.to_owned(), bits))
            })
            .collect()
    }

    /// The log's warning and error lines (klog's `W` and `E`).
    fn complaints(&self) -> Vec<String> {
        self.log_text()
            .lines()
            .filter(|line| line.starts_with('W') || line.starts_with('E'))
            .map(str::to_owned)
            .collect()
    }
}

/// The least-privilege run of `mode`: init container, then the proxy with
/// NET_ADMIN and NET_RAW only; proves it holds exactly those, programs the
/// examples, answers `/healthz`, and complains of nothing but the OOM
/// score.
fn programs_with_least_privilege(mode: &'static str, legacy: bool) {
    programs_with_least_privilege_in(node(mode, legacy), legacy);
}

/// [`programs_with_least_privilege`] on `node`.
fn programs_with_least_privilege_in(node: Node, legacy: bool) {
    let mode = node.mode;
    node.init_container();
    let mut container = node.start_container(PROXY_CAPABILITIES);

    let sets = container.capabilities();
    for set in ["CapEff", "CapPrm", "CapBnd"] {
        assert_eq!(
            sets.iter().find(|(name, _)| name == set).map(|s| s.1),
            Some(NET_ADMIN_AND_NET_RAW),
            "{set}: NET_ADMIN and NET_RAW only: {sets:?}"
        );
    }
    for set in ["CapInh", "CapAmb"] {
        assert_eq!(
            sets.iter().find(|(name, _)| name == set).map(|s| s.1),
            Some(0),
            "{set}: {sets:?}"
        );
    }

    let programmed = node.programmed();
    let log = container.log_text();
    assert!(
        programmed,
        "`kube-proxy check` still differs: {}\nthe proxy's log:\n{log}",
        node.check().1
    );
    let rules = node.rules(legacy);
    let expected = if mode == "nftables" {
        "chain services"
    } else {
        "-A KUBE-SERVICES -d 10.96.0.10/32"
    };
    assert!(rules.contains(expected), "{expected} in:\n{rules}");
    assert_eq!(node.healthz(), 200, "/healthz; the proxy's log:\n{log}");
    assert!(
        container.proxy.try_wait().unwrap().is_none(),
        "the proxy still runs"
    );

    let complaints = container.complaints();
    assert!(
        complaints
            .iter()
            .all(|line| line.contains(OOM_SCORE_WARNING)),
        "nothing but the OOM score adjustment failed:\n{}",
        complaints.join("\n")
    );
    for refusal in [
        "Operation not permitted",
        "Permission denied",
        "Read-only file system",
    ] {
        assert!(!log.contains(refusal), "{refusal} in the log:\n{log}");
    }
}

#[test]
fn the_iptables_mode_programs_the_examples_with_only_net_admin_and_net_raw() {
    programs_with_least_privilege("iptables", false);
}

#[test]
fn the_iptables_legacy_flavor_programs_the_examples_with_only_net_admin_and_net_raw() {
    // iptables-legacy talks to the kernel through a raw socket, which is
    // what NET_RAW is for.
    programs_with_least_privilege("iptables", true);
}

#[test]
fn the_nftables_mode_programs_the_examples_with_only_net_admin_and_net_raw() {
    require_tool("nft");
    programs_with_least_privilege("nftables", false);
}

/// The data layout's maps and sets need no more than the chains layout.
#[test]
fn the_nftables_data_layout_programs_the_examples_with_only_net_admin_and_net_raw() {
    require_tool("nft");
    programs_with_least_privilege_in(node_in_layout("nftables", false, Some("data")), false);
}

#[test]
fn without_net_admin_nothing_is_programmed_and_the_log_names_what_the_kernel_refused() {
    require_tool("nft");
    for (mode, refusal) in [
        (
            "iptables",
            &[
                "iptables backend: listing the existing chains with iptables-save -t filter failed",
                "Permission denied (you must be root)",
            ][..],
        ),
        (
            "nftables",
            &[
                "nftables backend: committing the transaction: writing the transaction failed",
                "Operation not permitted (os error 1)",
            ],
        ),
    ] {
        let node = node(mode, false);
        node.init_container();
        let container = node.start_container("+net_raw");
        let refused = wait_until(Duration::from_secs(20), || {
            container.log_text().lines().any(|line| {
                line.starts_with('E')
                    && line.contains("syncing proxy rules failed")
                    && refusal.iter().all(|part| line.contains(part))
                    && line.contains("the proxy needs CAP_NET_ADMIN")
            })
        });
        assert!(
            refused,
            "{mode}: no sync error naming the refusal {refusal:?}; the log:\n{}",
            container.log_text()
        );
        let (code, report) = node.check();
        assert_eq!(code, Some(1), "{mode}: nothing is programmed:\n{report}");
        let rules = node.rules(false);
        assert!(
            !rules.contains("KUBE-SERVICES") && !rules.contains("table ip kube-proxy"),
            "{mode}: rules were written:\n{rules}"
        );
    }
}

#[test]
fn without_the_init_container_the_iptables_mode_fails_on_route_localnet_and_nftables_keeps_the_hosts_timeouts(
) {
    require_tool("nft");
    // The iptables mode: every sync stops at route_localnet.
    let node_iptables = node("iptables", false);
    let container = node_iptables.start_container(PROXY_CAPABILITIES);
    let refusal = "iptables backend: setting sysctl net.ipv4.conf.all.route_localnet=1 \
                   (needed by localhost NodePorts; set iptables.localhostNodePorts: false to do \
                   without) failed: Read-only file system (os error 30)";
    let failed = wait_until(Duration::from_secs(20), || {
        container
            .log_text()
            .lines()
            .any(|line| line.starts_with('E') && line.contains(refusal))
    });
    assert!(
        failed,
        "no sync error naming route_localnet; the log:\n{}",
        container.log_text()
    );
    assert_eq!(node_iptables.check().0, Some(1), "nothing is programmed");
    assert!(!node_iptables.rules(false).contains("-A KUBE-SERVICES"));

    // The nftables mode: programmed; the conntrack timeouts are the host's.
    let node_nftables = node("nftables", false);
    let container = node_nftables.start_container(PROXY_CAPABILITIES);
    assert!(
        node_nftables.programmed(),
        "the nftables mode needs no sysctl of its own; the log:\n{}",
        container.log_text()
    );
    let complaints = container.complaints();
    for sysctl in [
        "nf_conntrack_tcp_timeout_established",
        "nf_conntrack_tcp_timeout_close_wait",
    ] {
        assert!(
            complaints.iter().any(|line| line.contains(&format!(
                "through /proc/sys/net/netfilter/{sysctl} failed: Read-only file system"
            ))),
            "a warning names {sysctl}:\n{}",
            complaints.join("\n")
        );
    }
    assert!(
        complaints.iter().all(|line| line.starts_with('W')),
        "only warnings:\n{}",
        complaints.join("\n")
    );
}
