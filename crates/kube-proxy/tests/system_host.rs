//! The `kube-proxy` binary on a host that lacks what its mode needs: started
//! in a node network namespace with a `PATH` that hides some of the iptables
//! programs, checked by its log, `/healthz` and the rules it leaves.
//!
//! Address plan: kp-testkit's; the Service is 10.96.0.41:80.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use kp_testkit::http;
use kp_testkit::netns::{require_root, require_tool, wait_until, Netns, NsChild};

const SERVICE: &str = "apiVersion: v1
kind: Service
metadata: {namespace: demo, name: web}
spec:
  clusterIP: 10.96.0.41
  clusterIPs: [10.96.0.41]
  ports:
    - {name: http, port: 80, targetPort: 8080, protocol: TCP}
";

/// The IPv4 iptables programs of both flavors.
const IPV4_PROGRAMS: [&str; 9] = [
    "iptables",
    "iptables-save",
    "iptables-restore",
    "iptables-legacy",
    "iptables-legacy-save",
    "iptables-legacy-restore",
    "iptables-nft",
    "iptables-nft-save",
    "iptables-nft-restore",
];

/// A directory for `PATH` holding links to `programs` only.
fn path_with(programs: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for program in programs {
        let target = ["/usr/sbin", "/sbin", "/usr/bin"]
            .iter()
            .map(|d| Path::new(d).join(program))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{program} is not installed"));
        // The xtables multi-call binaries act by the name they are run as.
        std::os::unix::fs::symlink(target, dir.path().join(program)).unwrap();
    }
    dir
}

/// The proxy in `node` with `PATH` set to `path` only, serving the Service
/// from a manifest, its log going to `log`.
fn start_proxy(node: &Netns, path: &Path, manifests: &Path, log: &Path) -> NsChild {
    let log = fs::File::create(log).unwrap();
    // `env` sets PATH for the proxy alone; `ip netns exec` and `env` are
    // still found on the test's own PATH.
    let mut command = node.command("env");
    command
        .arg(format!("PATH={}", path.display()))
        .arg(env!("CARGO_BIN_EXE_kube-proxy"))
        .args(["--manifests", manifests.to_str().unwrap()])
        .args(["--hostname-override", "node-1", "--healthz-bind-address"])
        .arg("127.0.0.1:10256")
        .args(["--metrics-bind-address", "127.0.0.1:10249"])
        .args(["--iptables-min-sync-period", "0s"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    NsChild::spawn(&mut command).unwrap()
}

fn healthz_status(node: &Netns) -> Option<u16> {
    node.run(|| http::get(("127.0.0.1", 10256), "/healthz"))
        .ok()
        .map(|reply| reply.code)
}

/// `kubeproxy_sync_proxy_rules_iptables_restore_failures_total`: failed
/// sync attempts so far.
fn failed_syncs(node: &Netns) -> f64 {
    let Ok(reply) = node.run(|| http::get(("127.0.0.1", 10249), "/metrics")) else {
        return 0.0;
    };
    reply
        .body
        .lines()
        .find(|l| l.starts_with("kubeproxy_sync_proxy_rules_iptables_restore_failures_total"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

fn manifests_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("service.yaml"), SERVICE).unwrap();
    dir
}

#[test]
fn without_iptables_the_proxy_says_so_once_and_is_unhealthy_at_once() {
    require_root();
    let node = Netns::create("noipt").unwrap();
    node.exec_ok("ip", &["link", "set", "lo", "up"]);
    let empty_path = path_with(&[]);
    let manifests = manifests_dir();
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("proxy.log");

    let _proxy = start_proxy(&node, empty_path.path(), manifests.path(), &log);

    // Well before the health timeout (2 × syncPeriod = 60 s).
    let unhealthy = wait_until(Duration::from_secs(10), || {
        healthz_status(&node) == Some(503)
    });
    assert!(unhealthy, "/healthz answers 503 at once");
    let retried = wait_until(Duration::from_secs(20), || failed_syncs(&node) >= 3.0);
    assert!(retried, "the proxy kept retrying");
    let text = fs::read_to_string(&log).unwrap();
    let said: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("cannot run on this host"))
        .collect();
    assert_eq!(said.len(), 1, "said once, not per retry:\n{text}");
    assert!(
        said[0].contains("iptables-restore not found")
            || said[0].contains("iptables-save not found"),
        "names the missing program: {}",
        said[0]
    );
    assert!(
        said[0].contains("apt-get install iptables"),
        "says how to install it: {}",
        said[0]
    );
    assert!(
        !text.contains("panicked"),
        "no panic for an expected condition:\n{text}"
    );
}

#[test]
fn without_ip6tables_the_proxy_runs_single_stack_and_stays_healthy() {
    require_root();
    require_tool("iptables-nft-save");
    let node = Netns::create("noip6t").unwrap();
    node.exec_ok("ip", &["link", "set", "lo", "up"]);
    let v4_only = path_with(&IPV4_PROGRAMS);
    let manifests = manifests_dir();
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("proxy.log");

    let _proxy = start_proxy(&node, v4_only.path(), manifests.path(), &log);

    let programmed = wait_until(Duration::from_secs(15), || {
        // Without endpoints the Service is a REJECT rule in the filter table.
        let saved = node.exec("iptables-save", &[]);
        String::from_utf8_lossy(&saved.stdout).contains("10.96.0.41/32")
    });
    assert!(
        programmed,
        "the IPv4 rules are programmed:\n{}",
        fs::read_to_string(&log).unwrap()
    );
    let healthy = wait_until(Duration::from_secs(10), || {
        healthz_status(&node) == Some(200)
    });
    let text = fs::read_to_string(&log).unwrap();
    assert!(healthy, "/healthz answers 200 without IPv6:\n{text}");
    assert!(
        text.contains("running single-stack IPv4"),
        "the log says why IPv6 is left out:\n{text}"
    );
    assert!(
        !text.contains("syncing proxy rules failed"),
        "no family fails:\n{text}"
    );
}
