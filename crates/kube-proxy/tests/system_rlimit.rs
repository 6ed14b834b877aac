//! The `kube-proxy` binary's descriptor limit: started with a soft limit
//! of 1,024 and a hard limit of 4,096 (as a container runtime may start
//! it), the running process has raised its soft limit to the hard one, as
//! upstream's Go binary does. Read from `/proc/PID/limits`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::process::Stdio;
use std::time::Duration;

use kp_testkit::netns::{require_root, wait_until, Netns, NsChild};

/// The limits the proxy is started with.
const SOFT: u64 = 1_024;
const HARD: u64 = 4_096;

/// The soft and hard `Max open files` of process `pid`.
fn open_files_limits(pid: u32) -> Option<(u64, u64)> {
    let limits = fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let mut numbers = line["Max open files".len()..].split_whitespace();
    Some((numbers.next()?.parse().ok()?, numbers.next()?.parse().ok()?))
}

#[test]
fn the_proxy_raises_its_soft_descriptor_limit_to_the_hard_limit() {
    require_root();
    let node = Netns::create("rlimit").unwrap();
    let manifests = tempfile::tempdir().unwrap();
    let mut command = node.command("prlimit");
    command
        .arg(format!("--nofile={SOFT}:{HARD}"))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_kube-proxy"))
        .args(["--manifests", manifests.path().to_str().unwrap()])
        .args(["--hostname-override", "node-1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let mut proxy = NsChild::spawn(&mut command).unwrap();
    let pid = proxy.id();
    // `ip netns exec` and `prlimit` exec the proxy in the same process.
    let is_proxy =
        || fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "kube-proxy");

    let mut seen = None;
    let raised = wait_until(Duration::from_secs(10), || {
        seen = open_files_limits(pid);
        is_proxy() && seen == Some((HARD, HARD))
    });

    assert!(proxy.try_wait().unwrap().is_none(), "the proxy still runs");
    assert!(
        raised,
        "soft limit raised to the hard limit; /proc/{pid}/limits says {seen:?} (soft, hard)"
    );
}
