//! The `kube-proxy` binary when its healthz (10256) or metrics (10249)
//! address cannot be bound, in a node network namespace: with
//! `--bind-address-hard-fail` it exits 1 with upstream's message naming
//! the server and the address; without, it logs, keeps serving the other
//! server, and binds once the address is free.
//!
//! No Service is needed: the proxy runs on an empty `--manifests` directory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::{self, File};
use std::net::TcpListener;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use kp_testkit::http::{self, HttpReply};
use kp_testkit::netns::{require_root, wait_until, Netns, NsChild};

/// How long a proxy that must exit may take.
const EXIT_DEADLINE: Duration = Duration::from_secs(20);

/// Starts the proxy in `node` on the empty manifests directory `dir` with
/// `extra` flags, its stderr going to `dir/stderr`.
fn proxy(node: &Netns, dir: &Path, extra: &[&str]) -> NsChild {
    let manifests = dir.join("manifests");
    fs::create_dir_all(&manifests).unwrap();
    let stderr = File::create(dir.join("stderr")).unwrap();
    let mut command = node.command(env!("CARGO_BIN_EXE_kube-proxy"));
    command
        .args(["--manifests", manifests.to_str().unwrap()])
        .args(["--hostname-override", "node-1"])
        .args(["--cluster-cidr", "10.244.0.0/16"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(stderr));
    NsChild::spawn(&mut command).unwrap()
}

/// Waits (bounded) for the proxy to exit; its status and stderr.
fn exit_of(mut proxy: NsChild, dir: &Path) -> (ExitStatus, String) {
    let mut status = None;
    let exited = wait_until(EXIT_DEADLINE, || {
        status = proxy.try_wait().unwrap();
        status.is_some()
    });
    let stderr = fs::read_to_string(dir.join("stderr")).unwrap();
    assert!(exited, "the proxy still runs; its log:\n{stderr}");
    (status.unwrap(), stderr)
}

/// `GET path` on `port` of the node's loopback.
fn get(node: &Netns, port: u16, path: &str) -> std::io::Result<HttpReply> {
    node.run(|| http::get(("127.0.0.1", port), path))
}

/// A listener holding `address` in `node`.
fn squat(node: &Netns, address: &str) -> TcpListener {
    node.run(|| TcpListener::bind(address)).unwrap()
}

#[test]
fn with_hard_fail_a_taken_metrics_address_ends_the_proxy_naming_it() {
    require_root();
    let node = Netns::create("bind-metrics").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let _squatter = squat(&node, "127.0.0.1:10249");

    let (status, stderr) = exit_of(
        proxy(&node, dir.path(), &["--bind-address-hard-fail"]),
        dir.path(),
    );

    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr
            .contains("Error: starting metrics server failed: cannot listen on 127.0.0.1:10249: "),
        "{stderr}"
    );
    assert!(stderr.contains("Address already in use"), "{stderr}");
}

#[test]
fn with_hard_fail_a_taken_healthz_address_ends_the_proxy_naming_it() {
    require_root();
    let node = Netns::create("bind-healthz").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let _squatter = squat(&node, "127.0.0.1:10256");
    let flags = [
        "--bind-address-hard-fail",
        "--healthz-bind-address",
        "127.0.0.1:10256",
    ];

    let (status, stderr) = exit_of(proxy(&node, dir.path(), &flags), dir.path());

    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("Error: failed to start proxier healthz on 127.0.0.1:10256: "),
        "{stderr}"
    );
}

#[test]
fn with_hard_fail_an_address_not_on_the_node_ends_the_proxy() {
    require_root();
    let node = Netns::create("bind-absent").unwrap();
    let dir = tempfile::tempdir().unwrap();
    // TEST-NET-3: on no interface of the node namespace.
    let flags = [
        "--bind-address-hard-fail",
        "--metrics-bind-address",
        "203.0.113.7:10249",
    ];

    let (status, stderr) = exit_of(proxy(&node, dir.path(), &flags), dir.path());

    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("starting metrics server failed: cannot listen on 203.0.113.7:10249: "),
        "{stderr}"
    );
    assert!(
        stderr.contains("Cannot assign requested address"),
        "{stderr}"
    );
}

#[test]
fn without_hard_fail_the_proxy_serves_on_and_binds_once_the_address_is_free() {
    require_root();
    let node = Netns::create("bind-soft").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let squatter = squat(&node, "127.0.0.1:10249");
    let mut proxy = proxy(&node, dir.path(), &[]);

    let healthz_up = wait_until(Duration::from_secs(15), || {
        get(&node, 10256, "/livez").is_ok_and(|a| a.code == 200)
    });
    assert!(healthz_up, "the healthz server answers");
    assert!(proxy.try_wait().unwrap().is_none(), "the proxy runs on");
    let log = fs::read_to_string(dir.path().join("stderr")).unwrap();
    assert!(log.contains("Cannot listen; retrying in 5 s"), "{log}");
    assert!(log.contains("127.0.0.1:10249"), "{log}");

    // Upstream retries every 5 s; so does the proxy.
    drop(squatter);
    let metrics_up = wait_until(Duration::from_secs(20), || {
        get(&node, 10249, "/proxyMode").is_ok_and(|a| a.body == "iptables")
    });
    assert!(
        metrics_up,
        "the metrics server binds once the address is free"
    );
}

/// The default healthz address `0.0.0.0:10256` answers on both families,
/// as upstream's (Go listens on `[::]` with `IPV6_V6ONLY` off for a
/// wildcard address): kubelet's liveness probe of a node with only an IPv6
/// address reaches it. An IPv6 address given as such is served too.
#[test]
fn the_default_healthz_address_answers_on_both_families() {
    require_root();
    let node = Netns::create("bind-dual").unwrap();
    node.ip(&["link", "set", "lo", "up"]).unwrap();
    node.ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "eth1",
    ])
    .unwrap();
    node.ip(&["link", "set", "eth1", "up"]).unwrap();
    node.ip(&["addr", "add", "192.168.99.2/24", "dev", "eth0"])
        .unwrap();
    node.ip(&[
        "addr",
        "add",
        "fd00:192:168:99::2/64",
        "dev",
        "eth0",
        "nodad",
    ])
    .unwrap();
    node.ip(&["link", "set", "eth0", "up"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let _proxy = proxy(&node, dir.path(), &[]);

    let livez = |address: &str| {
        let address: std::net::SocketAddr = address.parse().unwrap();
        node.run(|| http::get(address, "/livez"))
            .is_ok_and(|reply| reply.code == 200)
    };
    let up = wait_until(Duration::from_secs(15), || livez("192.168.99.2:10256"));
    let log = || fs::read_to_string(dir.path().join("stderr")).unwrap();
    assert!(up, "no answer on the IPv4 address:\n{}", log());
    for address in [
        "127.0.0.1:10256",
        "[fd00:192:168:99::2]:10256",
        "[::1]:10256",
    ] {
        assert!(livez(address), "no answer on {address}:\n{}", log());
    }
    // One socket: nothing else can take the port of either family.
    let taken = node.run(|| TcpListener::bind("[::]:10256"));
    assert!(taken.is_err(), "[::]:10256 is free");
}
