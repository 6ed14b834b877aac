//! Differential test of the modes against the model: random clusters
//! (Services of every type and policy, endpoints ready, serving and
//! terminating, on this node, another node or none, both families) are
//! written as manifests; each mode in turn (iptables with either flavor,
//! nftables with each table layout) programs them from the binary in a fresh node namespace, and
//! `kube-proxy check` with the same flags traces every Service address
//! through the kernel's live rules and must find each one doing what the
//! model (`kp_sync::expect`) says. The clusters come from
//! `kp_testkit::clusters`, which the IPVS mode's differential test in the
//! VM shares.
//!
//! `KP_DIFFERENTIAL_CASES` sets how many clusters (default 3, as `.ci/run`
//! runs it); `KP_DIFFERENTIAL_SEED` the first seed (default 1). A failure
//! names the seed, so `KP_DIFFERENTIAL_SEED=N KP_DIFFERENTIAL_CASES=1`
//! repeats it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::{self, File};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use kp_testkit::clusters::random_manifests;
use kp_testkit::netns::{require_root, wait_until, Netns, NsChild};

const BIN: &str = env!("CARGO_BIN_EXE_kube-proxy");

/// The binary's flags for `mode` (and the nftables table `layout`, if
/// given) on the manifests in `dir`.
fn flags(mode: &str, layout: Option<&str>, dir: &Path) -> Vec<String> {
    let mut flags = [
        "--manifests",
        dir.to_str().unwrap(),
        "--hostname-override",
        "node-1",
        "--cluster-cidr",
        "10.244.0.0/16,fd00:10:244::/48",
        "--proxy-mode",
        mode,
    ]
    .map(str::to_owned)
    .to_vec();
    if let Some(layout) = layout {
        flags.extend(["--nftables-layout".to_owned(), layout.to_owned()]);
    }
    flags
}

/// Programs the cluster of `seed` with `mode` (the nftables table in
/// `layout`, if given) and checks it: `None` when the kernel does what the
/// model says, else what `check` printed.
fn differs(seed: u64, mode: &str, layout: Option<&str>, hint: Option<&str>) -> Option<String> {
    let ns = Netns::bare_node("diff").unwrap();
    if let Some(flavor) = hint {
        ns.declare_iptables_hint(flavor);
    }
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    fs::create_dir_all(&manifests).unwrap();
    fs::write(manifests.join("cluster.yaml"), random_manifests(seed)).unwrap();
    let log = dir.path().join("proxy.log");
    let mut command = ns.command(BIN);
    command
        .args(flags(mode, layout, &manifests))
        .args(["--metrics-bind-address", "127.0.0.1:10249"])
        .args(["--healthz-bind-address", "127.0.0.1:10256"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(File::create(&log).unwrap()));
    let _proxy = NsChild::spawn(&mut command).unwrap();
    let healthy = wait_until(Duration::from_secs(30), || {
        ns.run(|| kp_testkit::http::get(("127.0.0.1", 10256), "/healthz"))
            .is_ok_and(|reply| reply.code == 200)
    });
    assert!(
        healthy,
        "seed {seed}, {mode}: the proxy never became healthy:\n{}",
        fs::read_to_string(&log).unwrap_or_default()
    );
    // Each family syncs on its own; give the second its first sync.
    let mut last = String::new();
    let agreed = wait_until(Duration::from_secs(10), || {
        let output = ns
            .command(BIN)
            .arg("check")
            .args(flags(mode, layout, &manifests))
            .output()
            .unwrap();
        last = format!(
            "exit {:?}\n{}{}",
            output.status.code(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let checked_some = String::from_utf8_lossy(&output.stdout)
            .lines()
            .any(|l| l.starts_with("IPv4:") && !l.contains(": 0 connections"));
        output.status.code() == Some(0) && checked_some
    });
    (!agreed).then(|| {
        format!(
            "{last}\nthe proxy's log:\n{}\nthe cluster:\n{}",
            fs::read_to_string(&log).unwrap_or_default(),
            random_manifests(seed)
        )
    })
}

fn cases() -> std::ops::Range<u64> {
    let number = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .map(|v| {
                v.parse()
                    .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
            })
            .unwrap_or(default)
    };
    let first = number("KP_DIFFERENTIAL_SEED", 1);
    first..first + number("KP_DIFFERENTIAL_CASES", 3)
}

fn every_case_agrees(mode: &str, hint: Option<&str>) {
    every_case_agrees_in(mode, None, hint);
}

/// [`every_case_agrees`] with the nftables table in `layout`, if given.
fn every_case_agrees_in(mode: &str, layout: Option<&str>, hint: Option<&str>) {
    require_root();
    for seed in cases() {
        if let Some(report) = differs(seed, mode, layout, hint) {
            panic!(
                "seed {seed}, mode {mode} {layout:?} {hint:?}: the kernel differs from the model:\n{report}"
            );
        }
    }
}

#[test]
fn iptables_legacy_agrees_with_the_model() {
    every_case_agrees("iptables", Some("legacy"));
}

#[test]
fn iptables_nft_agrees_with_the_model() {
    every_case_agrees("iptables", Some("nft"));
}

#[test]
fn userspace_agrees_with_the_model() {
    every_case_agrees("userspace", Some("legacy"));
}

#[test]
fn nftables_agrees_with_the_model() {
    every_case_agrees_in("nftables", Some("chains"), None);
}

#[test]
fn nftables_data_layout_agrees_with_the_model() {
    every_case_agrees_in("nftables", Some("data"), None);
}
