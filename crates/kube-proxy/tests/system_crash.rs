//! The `kube-proxy` binary killed with SIGKILL in the middle of a full sync
//! at 10,000 Services and started again: its first sync after the restart
//! must leave exactly the ruleset a clean start leaves, with no stale or
//! duplicate chains or rules.
//!
//! Two cluster states of 10,000 Services each alternate: 2,000 Services of
//! each are not in the other, a fifth of the shared ones have other
//! endpoints, some have no endpoints (filter-table REJECT rules) and some
//! are NodePorts. Each round starts the proxy with one state's manifests on
//! a kernel holding the other state's rules, so the sync it is killed in was
//! replacing, creating and deleting chains. The kill comes from a wrapper
//! around one IPv4 iptables program placed first on the proxy's `PATH`:
//! - while the full sync lists the nat table;
//! - as `iptables-restore` starts, before it reads anything;
//! - after the filter table's `COMMIT` (iptables-legacy commits each table
//!   on its own, so the filter table is already the new one);
//! - half-way through the restore input;
//! - with everything but the final `COMMIT` written;
//! - after the restore succeeded, before the proxy learned it;
//!
//! and twice from the test, at 60% and 90% of a clean start's time to its
//! first sync. A wrapper that cuts the input passes that part to the real
//! program, which sees its input end as it does when the proxy dies
//! mid-write. Then the proxy starts again with the same manifests and,
//! after its first sync, every chain and rule of the filter, nat and mangle
//! tables (counters aside) must equal what a clean start of the same state
//! left in a namespace of its own, and a Service must answer.
//!
//! Address plan: kp-testkit's. Pod `web` (10.244.1.2) answers the Service
//! `demo/web` at 10.96.200.1:80 in both states; the bulk Services have
//! ClusterIPs 10.96.0.1–10.96.47.250 and endpoints in 10.244.64.0/18 and
//! 10.244.128.0/17, addresses no host owns.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use kp_testkit::http;
use kp_testkit::netns::{
    connect, require_root, require_tool, wait_until, Netns, NsChild, Topology,
};

/// Services of each state, besides `demo/web`.
const SERVICES: usize = 10_000;
/// Services of one state that the other lacks.
const SHIFT: usize = 2_000;
/// How long the proxy may take to its first sync, or to reach a kill point.
const START_TIMEOUT: Duration = Duration::from_secs(180);
/// The Service every round checks with traffic.
const WEB: &str = "10.96.200.1:80";

/// Which iptables programs the node uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavor {
    Legacy,
    Nft,
}

impl Flavor {
    /// `iptables-legacy`, `iptables-nft-save`, …: `tool` is `""`, `"-save"`
    /// or `"-restore"`.
    fn program(self, tool: &str) -> String {
        match self {
            Flavor::Legacy => format!("iptables-legacy{tool}"),
            Flavor::Nft => format!("iptables-nft{tool}"),
        }
    }
}

/// One of the two alternating cluster states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    A,
    B,
}

impl State {
    fn other(self) -> State {
        match self {
            State::A => State::B,
            State::B => State::A,
        }
    }

    /// The bulk Services: indexes `0..10,000` in A, `2,000..12,000` in B.
    fn services(self) -> std::ops::Range<usize> {
        match self {
            State::A => 0..SERVICES,
            State::B => SHIFT..SHIFT + SERVICES,
        }
    }

    /// Whether Service `i` has no endpoints in this state.
    fn without_endpoints(self, i: usize) -> bool {
        match self {
            State::A => i % 50 == 25,
            State::B => i % 50 == 0,
        }
    }

    /// The second endpoint of Service `i`: a fifth of the Services move it
    /// in B.
    fn second_endpoint(self, i: usize) -> String {
        let moved = self == State::B && i % 5 == 0;
        let base = if moved { 192 } else { 128 };
        format!("10.244.{}.{}", base + i / 250, i % 250 + 1)
    }

    /// Every manifest of the state, as one multi-document YAML file.
    fn manifests(self) -> String {
        let mut text = String::with_capacity(6 << 20);
        text.push_str(WEB_MANIFESTS);
        for i in self.services() {
            let (namespace, cluster_ip) = (format!("ns{}", i % 100), bulk_cluster_ip(i));
            let node_port = i % 100 == 7;
            let (kind, port) = if node_port {
                ("NodePort", format!(", nodePort: {}", 30_000 + i / 100))
            } else {
                ("ClusterIP", String::new())
            };
            write!(
                text,
                "---\napiVersion: v1\nkind: Service\n\
                 metadata: {{namespace: {namespace}, name: svc{i}}}\n\
                 spec:\n  type: {kind}\n  clusterIP: {cluster_ip}\n  clusterIPs: [{cluster_ip}]\n  \
                 ports:\n    - {{name: http, port: 80, targetPort: 8080, protocol: TCP{port}}}\n"
            )
            .unwrap();
            let endpoints = if self.without_endpoints(i) {
                " []\n".to_owned()
            } else {
                format!(
                    "\n  - addresses: [10.244.{}.{}]\n  - addresses: [{}]\n",
                    64 + i / 250,
                    i % 250 + 1,
                    self.second_endpoint(i)
                )
            };
            write!(
                text,
                "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
                 metadata:\n  namespace: {namespace}\n  name: svc{i}-1\n  \
                 labels: {{kubernetes.io/service-name: svc{i}}}\n\
                 addressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\n\
                 endpoints:{endpoints}"
            )
            .unwrap();
        }
        text
    }
}

fn bulk_cluster_ip(i: usize) -> String {
    format!("10.96.{}.{}", i / 250, i % 250 + 1)
}

const WEB_MANIFESTS: &str = "apiVersion: v1
kind: Service
metadata: {namespace: demo, name: web}
spec:
  clusterIP: 10.96.200.1
  clusterIPs: [10.96.200.1]
  ports:
    - {name: http, port: 80, targetPort: 8080, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: demo
  name: web-1
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
  - addresses: [10.244.1.2]
    conditions: {ready: true}
    nodeName: node-1
";

/// Where the proxy is killed.
#[derive(Debug, Clone, Copy)]
enum KillPoint {
    /// The full sync's `iptables-save -t nat`, before it runs.
    Listing,
    /// `iptables-restore` started; it reads no input.
    RestoreStart,
    /// The restore got the filter table up to its `COMMIT` and ten lines of
    /// the nat table.
    RestoreAfterFilter,
    /// The restore got the first half of its input's lines.
    RestoreHalf,
    /// The restore got every line but the last (the nat table's `COMMIT`).
    RestoreAllButCommit,
    /// The restore succeeded; the proxy is killed before it hears so.
    RestoreDone,
    /// Killed by the test after this fraction of a clean start's time to
    /// its first sync.
    Elapsed(f64),
}

const KILL_POINTS: [KillPoint; 8] = [
    KillPoint::Listing,
    KillPoint::RestoreStart,
    KillPoint::RestoreAfterFilter,
    KillPoint::RestoreHalf,
    KillPoint::RestoreAllButCommit,
    KillPoint::RestoreDone,
    KillPoint::Elapsed(0.6),
    KillPoint::Elapsed(0.9),
];

/// The real program `name`, from the usual directories.
fn real_program(name: &str) -> PathBuf {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|dir| Path::new(dir).join(name))
        .find(|path| path.exists())
        .unwrap_or_else(|| panic!("{name} is not installed"))
}

/// A directory to put first on the proxy's `PATH`, with a wrapper that
/// kills its parent (the proxy) with SIGKILL at `point` and writes
/// `reached` beside itself when it does; `None` for the kill points the
/// test itself carries out.
fn kill_wrapper(flavor: Flavor, point: KillPoint) -> Option<tempfile::TempDir> {
    // `$PPID` is the proxy, which started the wrapper; it stays so in the
    // subshells of a pipeline. A cut input reaches the real program as an
    // input that ends early, as when the writer dies.
    let cut = |awk: &str| {
        format!("{{ awk '{awk}'; echo reached > \"$HERE/reached\"; kill -KILL $PPID; }} | \"$REAL\" \"$@\"")
    };
    let (tool, body) = match point {
        KillPoint::Listing => (
            "-save",
            "case \" $* \" in *\" -t nat \"*) echo reached > \"$HERE/reached\"; kill -KILL $PPID; exit 1;; esac\n\
             exec \"$REAL\" \"$@\""
                .to_owned(),
        ),
        KillPoint::RestoreStart => (
            "-restore",
            "echo reached > \"$HERE/reached\"; kill -KILL $PPID; exit 1".to_owned(),
        ),
        KillPoint::RestoreAfterFilter => (
            "-restore",
            cut("{ print } /^COMMIT$/ { n++ } n == 1 && ++after > 10 { exit }"),
        ),
        KillPoint::RestoreHalf => (
            "-restore",
            cut("{ a[NR] = $0 } END { for (i = 1; i <= NR / 2; i++) print a[i] }"),
        ),
        KillPoint::RestoreAllButCommit => (
            "-restore",
            cut("{ a[NR] = $0 } END { for (i = 1; i < NR; i++) print a[i] }"),
        ),
        KillPoint::RestoreDone => (
            "-restore",
            "\"$REAL\" \"$@\"; status=$?\n\
             echo reached > \"$HERE/reached\"; kill -KILL $PPID; exit $status"
                .to_owned(),
        ),
        KillPoint::Elapsed(_) => return None,
    };
    let dir = tempfile::tempdir().unwrap();
    let name = flavor.program(tool);
    let script = format!(
        "#!/bin/sh\n# Kills the proxy at {point:?}.\nHERE={here}\nREAL={real}\n{body}\n",
        here = dir.path().display(),
        real = real_program(&name).display(),
    );
    let path = dir.path().join(&name);
    fs::write(&path, script).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    Some(dir)
}

/// The proxy in `ns` serving `manifests`, its log going to `log`; with
/// `wrapper`, that directory comes first on its `PATH`.
fn start_proxy(ns: &Netns, manifests: &Path, wrapper: Option<&Path>, log: &Path) -> NsChild {
    let mut path = std::env::var("PATH").unwrap_or_default();
    if let Some(dir) = wrapper {
        path = format!("{}:{path}", dir.display());
    }
    let mut command = ns.command("env");
    command
        .arg(format!("PATH={path}"))
        .arg(env!("CARGO_BIN_EXE_kube-proxy"))
        .args(["--manifests", manifests.to_str().unwrap()])
        .args(["--hostname-override", "node-1"])
        .args(["--cluster-cidr", "10.244.0.0/16"])
        .args(["--iptables-min-sync-period", "0s"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(log).unwrap());
    NsChild::spawn(&mut command).unwrap()
}

/// The last lines of the proxy's log, for failure messages.
fn log_tail(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// Whether both families' first syncs succeeded, by the proxy's metrics.
fn synced(ns: &Netns) -> bool {
    let Ok(reply) = ns.run(|| http::get(("127.0.0.1", 10249), "/metrics")) else {
        return false;
    };
    ["IPv4", "IPv6"].iter().all(|family| {
        let series =
            format!("kubeproxy_sync_proxy_rules_last_timestamp_seconds{{ip_family=\"{family}\"}}");
        reply.body.lines().any(|line| line.starts_with(&series))
    })
}

/// Waits for the proxy's first sync of both families and returns how long
/// it took from `started`.
fn wait_synced(ns: &Netns, proxy: &mut NsChild, log: &Path, started: Instant) -> Duration {
    let done = wait_until(START_TIMEOUT, || {
        if let Some(status) = proxy.try_wait().unwrap() {
            panic!("the proxy exited with {status}:\n{}", log_tail(log));
        }
        synced(ns)
    });
    assert!(
        done,
        "no first sync within {START_TIMEOUT:?}:\n{}",
        log_tail(log)
    );
    started.elapsed()
}

/// Waits until no process is left in `ns`: a restore the killed proxy
/// started may still be reading its input or committing.
fn wait_quiet(ns: &Netns) {
    let quiet = wait_until(Duration::from_secs(60), || {
        let output = std::process::Command::new("ip")
            .args(["netns", "pids", ns.name()])
            .output()
            .unwrap();
        output.status.success() && output.stdout.trim_ascii().is_empty()
    });
    assert!(quiet, "processes are still running in {}", ns.name());
}

/// What the kernel holds of one table: every chain with its rules, in
/// order, counters aside.
type Chains = BTreeMap<String, Vec<String>>;

/// The filter, nat and mangle tables of `ns` as `iptables-save` shows them.
fn ruleset(ns: &Netns, flavor: Flavor) -> BTreeMap<&'static str, Chains> {
    let mut tables = BTreeMap::new();
    for table in ["filter", "nat", "mangle"] {
        let saved = ns.exec_ok(&flavor.program("-save"), &["-t", table]);
        let mut chains = Chains::new();
        for line in saved.lines() {
            if let Some(declaration) = line.strip_prefix(':') {
                let name = declaration.split_whitespace().next().unwrap().to_owned();
                let again = chains.insert(name.clone(), Vec::new());
                assert!(again.is_none(), "{table} declares {name} twice");
            } else if let Some(rule) = line.strip_prefix("-A ") {
                let chain = rule.split_whitespace().next().unwrap();
                chains.get_mut(chain).unwrap().push(rule.to_owned());
            }
        }
        tables.insert(table, chains);
    }
    tables
}

/// The chains of `table` whose names start with `prefix`.
fn count(ruleset: &BTreeMap<&str, Chains>, table: &str, prefix: &str) -> usize {
    ruleset[table]
        .keys()
        .filter(|c| c.starts_with(prefix))
        .count()
}

/// A short account of how `found` differs from `expected`.
fn difference(expected: &BTreeMap<&str, Chains>, found: &BTreeMap<&str, Chains>) -> String {
    let mut text = String::new();
    for (table, want) in expected {
        let have = &found[table];
        let extra: Vec<&String> = have.keys().filter(|c| !want.contains_key(*c)).collect();
        let missing: Vec<&String> = want.keys().filter(|c| !have.contains_key(*c)).collect();
        let differing: Vec<&String> = want
            .iter()
            .filter(|(chain, rules)| have.get(*chain).is_some_and(|r| r != *rules))
            .map(|(chain, _)| chain)
            .collect();
        if extra.is_empty() && missing.is_empty() && differing.is_empty() {
            continue;
        }
        writeln!(
            text,
            "{table}: {} stale chains {:?}, {} missing {:?}, {} with other rules {:?}",
            extra.len(),
            &extra[..extra.len().min(5)],
            missing.len(),
            &missing[..missing.len().min(5)],
            differing.len(),
            &differing[..differing.len().min(5)],
        )
        .unwrap();
        if let Some(chain) = differing.first() {
            writeln!(
                text,
                "  {chain} expected {:?}\n  found {:?}",
                want[*chain], have[*chain]
            )
            .unwrap();
        }
    }
    text
}

/// What a clean start of `state` leaves: the proxy's first sync in a fresh
/// namespace; also how long that took.
fn clean_start(
    flavor: Flavor,
    manifests: &Path,
    log: &Path,
) -> (BTreeMap<&'static str, Chains>, Duration) {
    let ns = Netns::create("ref").unwrap();
    hint(&ns, flavor);
    let started = Instant::now();
    let mut proxy = start_proxy(&ns, manifests, None, log);
    let took = wait_synced(&ns, &mut proxy, log, started);
    drop(proxy);
    wait_quiet(&ns);
    (ruleset(&ns, flavor), took)
}

/// kubelet's hint chain, which makes the proxy choose `flavor`.
fn hint(ns: &Netns, flavor: Flavor) {
    ns.exec_ok(
        &flavor.program(""),
        &["-t", "mangle", "-N", "KUBE-IPTABLES-HINT"],
    );
}

fn killed_mid_sync_and_restarted(flavor: Flavor) {
    require_root();
    require_tool(&flavor.program("-restore"));
    require_tool("awk");
    let cluster = Topology::builder()
        .pod("web", |p| p.tcp(8080))
        .pod("caller", |p| p)
        .build()
        .unwrap();
    let (node, client) = (cluster.node(), cluster.pod("caller"));
    let work = tempfile::tempdir().unwrap();
    let log = work.path().join("kube-proxy.log");
    let dir_of = |state: State| work.path().join(format!("{state:?}"));
    for state in [State::A, State::B] {
        fs::create_dir(dir_of(state)).unwrap();
        fs::write(dir_of(state).join("cluster.yaml"), state.manifests()).unwrap();
    }

    let (reference_a, _) = clean_start(flavor, &dir_of(State::A), &log);
    let (reference_b, clean_time) = clean_start(flavor, &dir_of(State::B), &log);
    let expected_of = |state| match state {
        State::A => &reference_a,
        State::B => &reference_b,
    };
    for (state, reference) in [(State::A, &reference_a), (State::B, &reference_b)] {
        // 10,000 bulk Services, of which 200 have no endpoints, and web.
        let endpoints = SERVICES - SERVICES / 50;
        assert_eq!(
            count(reference, "nat", "KUBE-SVC-"),
            endpoints + 1,
            "{state:?}"
        );
        assert_eq!(
            count(reference, "nat", "KUBE-SEP-"),
            2 * endpoints + 1,
            "{state:?}"
        );
    }
    assert_ne!(reference_a, reference_b);

    hint(node, flavor);
    let mut state = State::A;
    let mut proxy = start_proxy(node, &dir_of(state), None, &log);
    wait_synced(node, &mut proxy, &log, Instant::now());
    drop(proxy);
    wait_quiet(node);

    let web: SocketAddr = WEB.parse().unwrap();
    for point in KILL_POINTS {
        state = state.other();
        let wrapper = kill_wrapper(flavor, point);
        let mut proxy = start_proxy(
            node,
            &dir_of(state),
            wrapper.as_ref().map(|dir| dir.path()),
            &log,
        );
        match (point, &wrapper) {
            (KillPoint::Elapsed(fraction), _) => {
                std::thread::sleep(clean_time.mul_f64(fraction));
                let still_running = proxy.try_wait().unwrap().is_none();
                assert!(
                    still_running,
                    "the proxy exited before {point:?}:\n{}",
                    log_tail(&log)
                );
                proxy.kill().unwrap();
            }
            (_, Some(dir)) => {
                let exited = wait_until(START_TIMEOUT, || proxy.try_wait().unwrap().is_some());
                assert!(exited, "{point:?} was not reached:\n{}", log_tail(&log));
                let status = proxy.wait().unwrap();
                assert_eq!(
                    status.signal(),
                    Some(9),
                    "the proxy was to be killed at {point:?}, it exited with {status}:\n{}",
                    log_tail(&log)
                );
                assert!(
                    dir.path().join("reached").exists(),
                    "{point:?} was not reached"
                );
            }
            (_, None) => unreachable!("every other kill point has a wrapper"),
        }
        let _ = proxy.wait();
        drop(proxy);
        wait_quiet(node);
        // Each table is committed whole or not at all: the kill leaves the
        // old state's table or the new one's, never a mix.
        let left = ruleset(node, flavor);
        let (old, new) = (expected_of(state.other()), expected_of(state));
        let held: BTreeMap<&str, &str> = left
            .iter()
            .map(|(table, chains)| {
                let which = if *chains == old[table] {
                    "old"
                } else if *chains == new[table] {
                    "new"
                } else {
                    panic!(
                        "the kill at {point:?} left the {table} table half-applied:\n{}",
                        difference(old, &left)
                    )
                };
                (*table, which)
            })
            .collect();
        eprintln!("{flavor:?}: killed at {point:?} on the way to {state:?}: tables {held:?}");
        let expected_nat = match point {
            KillPoint::Elapsed(_) => None,
            KillPoint::RestoreDone => Some("new"),
            _ => Some("old"),
        };
        if let Some(expected_nat) = expected_nat {
            assert_eq!(
                held["nat"], expected_nat,
                "the nat table after the kill at {point:?}"
            );
        }

        let mut proxy = start_proxy(node, &dir_of(state), None, &log);
        wait_synced(node, &mut proxy, &log, Instant::now());
        let after = ruleset(node, flavor);
        let expected = expected_of(state);
        assert!(
            after == *expected,
            "after the kill at {point:?} and a restart, the rules of {state:?} differ from a \
             clean start's:\n{}",
            difference(expected, &after)
        );
        let answered = wait_until(Duration::from_secs(5), || {
            connect(client, web).is_ok_and(|reply| reply.backend == "web")
        });
        assert!(
            answered,
            "{WEB} answers from web after the restart at {point:?}"
        );
        drop(proxy);
        wait_quiet(node);
    }
}

#[test]
fn iptables_legacy_recovers_from_a_kill_at_any_point_of_a_full_sync() {
    killed_mid_sync_and_restarted(Flavor::Legacy);
}

#[test]
fn iptables_nft_recovers_from_a_kill_at_any_point_of_a_full_sync() {
    killed_mid_sync_and_restarted(Flavor::Nft);
}
