//! The `kube-proxy` binary's HTTP servers under a flood of idle
//! connections, in a node network namespace: 2,000 connections that send
//! nothing, or a partial request head, and never close, either to the
//! healthz port (10256) or spread over two health-check node ports. The
//! proxy runs with 1,024 descriptors, soft and hard, as in a container that
//! allows no more; a server without a connection bound would spend them
//! all on the flood.
//!
//! While the flood holds its connections, the proxy must keep its
//! descriptors below the bound (512 connections for the healthz server,
//! 512 for all health-check node ports together) plus what it held before,
//! answer every probe (`/healthz`, `/metrics`, each health-check port), and
//! program an endpoint change into the kernel (read back with
//! `iptables-save`) within [`SYNC_DEADLINE`]. The server then closes every
//! flood connection within its 32 s header read timeout (plus
//! [`CLOSE_MARGIN`]).
//!
//! Address plan: the Service `demo/web` at 10.96.0.44:80, its endpoint
//! 10.244.1.2:8080 and then 10.244.1.3:8080; the LoadBalancer Services
//! `demo/lb1` and `demo/lb2` (`externalTrafficPolicy: Local`) at
//! 10.96.0.45 and .46, health-check node ports 32001 and 32002, endpoint
//! 10.244.1.4:8080 on this node; the flood and the probes go to the node
//! namespace's loopback.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::{self, File};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_testkit::builders::{endpoint_slice, service};
use kp_testkit::files::{manifest, write_atomically};
use kp_testkit::http::{self, HttpReply};
use kp_testkit::netns::{require_root, wait_until, Netns, NsChild};

/// Idle connections opened, spread over the flooded ports.
const FLOOD: usize = 2_000;
/// The health-check node ports of `demo/lb1` and `demo/lb2`.
const HEALTH_CHECK_PORTS: [u16; 2] = [32_001, 32_002];
/// Every this many flood connections, one sends a partial request head.
const PARTIAL_EVERY: usize = 4;
/// The proxy's descriptor limit, soft and hard.
const NOFILE: u64 = 1_024;
/// The connection bound of the healthz server, and of the health-check
/// node ports together (`ConnectionLimits::DEFAULT`).
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

/// Opens the flood: [`FLOOD`] connections to `ports` of the node's
/// loopback, in turn, every [`PARTIAL_EVERY`]th sending part of a request
/// head. Returns the connections and how many could not be opened within
/// 2 s (a server that stops accepting fills its listen backlog).
fn flood(node: &Netns, ports: &[u16]) -> (Vec<TcpStream>, usize) {
    node.run(|| {
        let mut connections = Vec::with_capacity(FLOOD);
        let mut failed = 0;
        for n in 0..FLOOD {
            let address = SocketAddr::from(([127, 0, 0, 1], ports[n % ports.len()]));
            let Ok(mut stream) = TcpStream::connect_timeout(&address, Duration::from_secs(2))
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
    flood_while_syncing("httplim", &[10256]);
}

#[test]
fn idle_connections_to_health_check_node_ports_share_one_bound() {
    flood_while_syncing("hcplim", &HEALTH_CHECK_PORTS);
}

/// `demo/lb1` or `demo/lb2`: a LoadBalancer Service of local policy with
/// health-check node port `health_check_port`.
fn local_load_balancer(name: &str, cluster_ip: &str, health_check_port: u16) -> Service {
    service("demo", name, |s| {
        s.service_type("LoadBalancer")
            .cluster_ip(cluster_ip)
            .port("http", 80, "TCP")
            .target_port(8080)
            .node_port(i32::from(health_check_port) - 1_000)
            .external_traffic_policy_local()
            .health_check_node_port(i32::from(health_check_port))
    })
}

/// The flood of `flooded` ports while an endpoint change is synced, in a
/// node namespace called `name`.
fn flood_while_syncing(name: &str, flooded: &[u16]) {
    require_root();
    // The test itself holds the flood's 2,000 sockets.
    kp_agent::descriptors::raise_nofile_soft_limit().unwrap();
    let node = Netns::create(name).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    fs::create_dir(&manifests).unwrap();
    let web = service("demo", "web", |s| {
        s.cluster_ip("10.96.0.44")
            .port("http", 80, "TCP")
            .target_port(8080)
    });
    fs::write(manifests.join("web.json"), manifest(&web)).unwrap();
    let [first, second] = HEALTH_CHECK_PORTS;
    for (service, slice) in [
        (local_load_balancer("lb1", "10.96.0.45", first), "lb1"),
        (local_load_balancer("lb2", "10.96.0.46", second), "lb2"),
    ] {
        fs::write(manifests.join(format!("{slice}.json")), manifest(&service)).unwrap();
        let endpoints = endpoint_slice("demo", &format!("{slice}-1"), slice, |e| {
            e.address_type("IPv4")
                .port("http", 8080, "TCP")
                .endpoint("10.244.1.4", |ep| ep.ready(true).node("node-1"))
        });
        fs::write(
            manifests.join(format!("{slice}-slice.json")),
            manifest(&endpoints),
        )
        .unwrap();
    }
    let slice_file = manifests.join("slice.json");
    fs::write(&slice_file, manifest(&slice("10.244.1.2"))).unwrap();
    let proxy = proxy(&node, dir.path());
    let log = || fs::read_to_string(dir.path().join("stderr")).unwrap();
    let probes: [(u16, &str); 4] = [
        (10256, "/healthz"),
        (10249, "/metrics"),
        (first, "/"),
        (second, "/"),
    ];
    let answers = |expected: u16| {
        probes
            .iter()
            .all(|(port, path)| get(&node, *port, path).is_ok_and(|r| r.code == expected))
    };
    let up = wait_until(Duration::from_secs(20), || {
        programmed(&node, "10.244.1.2:8080") && answers(200)
    });
    assert!(
        up,
        "the proxy synced and every probe answers 200; its log:\n{}",
        log()
    );
    let before = descriptors(proxy.id());

    let (connections, not_accepted) = flood(&node, flooded);
    let flooded_at = Instant::now();
    let mut most = descriptors(proxy.id());
    let mut sample = || most = most.max(descriptors(proxy.id()));

    let mut probed = Vec::new();
    for (port, path) in probes {
        probed.push((port, get(&node, port, path).map(|r| r.code).ok()));
        sample();
    }
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
    for (port, code) in probed {
        assert_eq!(code, Some(200), "port {port} answers during the flood");
    }
    assert!(
        synced,
        "the endpoint change reached the kernel within {SYNC_DEADLINE:?}; the proxy's log:\n{}",
        log()
    );
    assert!(
        most <= before + MAX_CONNECTIONS + OTHER_DESCRIPTORS,
        "the proxy held {most} descriptors during the flood of {flooded:?}, {before} before"
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
