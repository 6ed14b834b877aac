//! The `kube-proxy` binary's HTTP servers under a flood of idle
//! connections, in a node network namespace: 2,000 connections to the
//! healthz port (10256) that send nothing, or a partial request head, and
//! never close. The proxy runs with 1,024 descriptors, soft and hard, as in
//! a container that allows no more; a server without a connection bound
//! would spend them all on the flood.
//!
//! While the flood holds its connections, the proxy must keep its
//! descriptors below its bound (512 connections per server) plus what it
//! held before, answer `/healthz` and `/metrics`, and program an endpoint
//! change into the kernel (read back with `iptables-save`) within
//! [`SYNC_DEADLINE`]. The server then closes every flood connection within
//! its 32 s header read timeout (plus [`CLOSE_MARGIN`]).
//!
//! Address plan: the Service `demo/web` at 10.96.0.44:80, its endpoint
//! 10.244.1.2:8080 and then 10.244.1.3:8080; the flood and the probes go to
//! the node namespace's loopback.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::{self, File};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_testkit::builders::{endpoint_slice, service};
use kp_testkit::files::{manifest, write_atomically};
use kp_testkit::http::{self, HttpReply};
use kp_testkit::netns::{require_root, wait_until, Netns, NsChild};

/// Idle connections opened to the healthz port.
const FLOOD: usize = 2_000;
/// Every this many flood connections, one sends a partial request head.
const PARTIAL_EVERY: usize = 4;
/// The proxy's descriptor limit, soft and hard.
const NOFILE: u64 = 1_024;
/// The connection bound of each server (`ConnectionLimits::DEFAULT`).
const MAX_CONNECTIONS: usize = 512;
/// Descriptors the proxy may open besides the flood's connections while
/// the flood lasts (a sync's pipes, a probe's connection, the log).
const OTHER_DESCRIPTORS: usize = 32;
/// The header read timeout of the servers (`ConnectionLimits::DEFAULT`).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(32);
/// How much later than the header read timeout the last flood connection
/// may be closed.
const CLOSE_MARGIN: Duration = Duration::from_secs(15);
/// How long an endpoint change may take to reach the kernel.
const SYNC_DEADLINE: Duration = Duration::from_secs(10);

/// `demo/web-1` with the one ready endpoint `address`.
fn slice(address: &str) -> EndpointSlice {
    endpoint_slice("demo", "web-1", "web", |e| {
        e.address_type("IPv4")
            .port("http", 8080, "TCP")
            .endpoint(address, |ep| ep.ready(true).node("node-1"))
    })
}

/// Starts the proxy in `node` on the manifests in `dir`, with `NOFILE`
/// descriptors (`prlimit --nofile=1024:1024`), its stderr to
/// `dir/stderr`.
fn proxy(node: &Netns, dir: &Path) -> NsChild {
    let manifests = dir.join("manifests");
    let stderr = File::create(dir.join("stderr")).unwrap();
    let mut command = node.command("prlimit");
    command
        .arg(format!("--nofile={NOFILE}:{NOFILE}"))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_kube-proxy"))
        .args(["--manifests", manifests.to_str().unwrap()])
        .args(["--hostname-override", "node-1"])
        .args(["--cluster-cidr", "10.244.0.0/16"])
        .args(["--iptables-min-sync-period", "0s"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(stderr));
    NsChild::spawn(&mut command).unwrap()
}

/// Whether the node's nat table DNATs to `endpoint`.
fn programmed(node: &Netns, endpoint: &str) -> bool {
    node.exec_ok("iptables-save", &["-t", "nat"])
        .contains(&format!("--to-destination {endpoint}"))
}

/// How many descriptors process `pid` has open.
fn descriptors(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

/// `GET path` on `port` of the node's loopback.
fn get(node: &Netns, port: u16, path: &str) -> std::io::Result<HttpReply> {
    node.run(|| http::get(("127.0.0.1", port), path))
}

/// Opens the flood: [`FLOOD`] connections to the node's healthz port,
/// every [`PARTIAL_EVERY`]th sending part of a request head. Returns the
/// connections and how many could not be opened within 2 s (a server that
/// stops accepting fills its listen backlog).
fn flood(node: &Netns) -> (Vec<TcpStream>, usize) {
    node.run(|| {
        let healthz = "127.0.0.1:10256".parse().unwrap();
        let mut connections = Vec::with_capacity(FLOOD);
        let mut failed = 0;
        for n in 0..FLOOD {
            let Ok(mut stream) = TcpStream::connect_timeout(&healthz, Duration::from_secs(2))
            else {
                failed += 1;
                if failed == 3 {
                    // The backlog is full; more attempts only take time.
                    break;
                }
                continue;
            };
            if n % PARTIAL_EVERY == 0 {
                // A write to a connection the server already closed to
                // admit newer ones may fail; it counts as closed.
                let _ = stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: node-1\r\n");
            }
            stream.set_nonblocking(true).unwrap();
            connections.push(stream);
        }
        (connections, failed)
    })
}

/// Whether the server closed `stream` (end of file or reset). Anything
/// the server sent before closing is read and dropped.
fn closed(mut stream: &TcpStream) -> bool {
    let mut buffer = [0u8; 512];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(error) if error.kind() == ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

#[test]
fn idle_connections_to_the_healthz_port_neither_delay_a_sync_nor_exhaust_descriptors() {
    require_root();
    // The test itself holds the flood's 2,000 sockets.
    kp_agent::descriptors::raise_nofile_soft_limit().unwrap();
    let node = Netns::create("httplim").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    fs::create_dir(&manifests).unwrap();
    let web = service("demo", "web", |s| {
        s.cluster_ip("10.96.0.44")
            .port("http", 80, "TCP")
            .target_port(8080)
    });
    fs::write(manifests.join("web.json"), manifest(&web)).unwrap();
    let slice_file = manifests.join("slice.json");
    fs::write(&slice_file, manifest(&slice("10.244.1.2"))).unwrap();
    let proxy = proxy(&node, dir.path());
    let log = || fs::read_to_string(dir.path().join("stderr")).unwrap();
    let up = wait_until(Duration::from_secs(20), || {
        programmed(&node, "10.244.1.2:8080")
            && get(&node, 10256, "/healthz").is_ok_and(|r| r.code == 200)
    });
    assert!(
        up,
        "the proxy synced and serves healthz; its log:\n{}",
        log()
    );
    let before = descriptors(proxy.id());

    let (connections, not_accepted) = flood(&node);
    let flooded_at = Instant::now();
    let mut most = descriptors(proxy.id());
    let mut sample = || most = most.max(descriptors(proxy.id()));

    let healthz = get(&node, 10256, "/healthz").map(|r| r.code);
    sample();
    let metrics = get(&node, 10249, "/metrics").map(|r| r.code);
    sample();
    write_atomically(&slice_file, &manifest(&slice("10.244.1.3")));
    let changed_at = Instant::now();
    let synced = wait_until(SYNC_DEADLINE, || {
        sample();
        programmed(&node, "10.244.1.3:8080")
    });
    let sync_took = changed_at.elapsed();
    let open_after_flood = connections.iter().filter(|c| !closed(c)).count();
    sample();

    assert_eq!(
        not_accepted,
        0,
        "every flood connection was accepted; the proxy's log:\n{}",
        log()
    );
    assert_eq!(healthz.ok(), Some(200), "/healthz answers during the flood");
    assert_eq!(metrics.ok(), Some(200), "/metrics answers during the flood");
    assert!(
        synced,
        "the endpoint change reached the kernel within {SYNC_DEADLINE:?}; the proxy's log:\n{}",
        log()
    );
    assert!(
        most <= before + MAX_CONNECTIONS + OTHER_DESCRIPTORS,
        "the proxy held {most} descriptors during the flood, {before} before"
    );
    assert!(
        open_after_flood <= MAX_CONNECTIONS,
        "{open_after_flood} flood connections open, bound {MAX_CONNECTIONS}"
    );
    eprintln!(
        "sync during the flood took {sync_took:?}; {most} descriptors at most ({before} before); {open_after_flood} flood connections kept"
    );

    let all_closed = wait_until(
        (HEADER_READ_TIMEOUT + CLOSE_MARGIN).saturating_sub(flooded_at.elapsed()),
        || connections.iter().all(closed),
    );
    let still_open = connections.iter().filter(|c| !closed(c)).count();
    assert!(
        all_closed,
        "{still_open} flood connections still open {:?} after the flood",
        flooded_at.elapsed()
    );
    assert!(
        descriptors(proxy.id()) <= before + 4,
        "the proxy's descriptors are back to about {before}"
    );
}
