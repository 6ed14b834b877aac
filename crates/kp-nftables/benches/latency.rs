//! Data-path connection latency through a ClusterIP with 1 Service and
//! with many (10,000 by default) in the `ip kube-proxy` table: does the
//! table's size cost a new connection anything?
//!
//! One harness topology (kp-testkit: a node namespace, pod `ep1` of this
//! node serving TCP 8080, an outside client; removed afterwards, also on
//! panic). The backend commits over netlink in the node namespace. The
//! measured Service is `ns0/svc0` (ClusterIP 10.96.0.10:80 → ep1:8080);
//! the others (10.96.x.y, each with two endpoints on node-2 that no host
//! owns) only fill the table. From the client, each sample is one fresh
//! TCP connection: connect, read the echo server's greeting, send one line
//! and read its echo, close; timed from before `connect` to the echo.
//!
//! Rounds alternate between the small and the large table (each round
//! syncs the table it needs, waits 3 s for the kernel's deferred work after
//! the commit, warms up with 200 connections, then takes its samples), so a
//! change of the machine's load during the run lands on both. Printed: median, p90 and
//! p99 per table size over all its samples, and the ratio of the medians.
//!
//! Needs root. `cargo bench -p kp-nftables --bench latency`; environment:
//! `KP_LATENCY_SERVICES` (the large table, default 10000),
//! `KP_LATENCY_ROUNDS` (default 6, three per size), `KP_LATENCY_SAMPLES`
//! (connections per round, default 2000).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use kp_model::{IpFamily, NodeInfo, ServicePortName};
use kp_nftables::{NftablesBackend, NftablesOptions};
use kp_node::{LocalDetector, NodePortAddresses};
use kp_sync::testing::service;
use kp_sync::{Backend, ServicePortState, StaleConntrack, SyncRequest};
use kp_testkit::netns::{require_root, Topology};
use kp_testkit::plan;

const POD_PORT: u16 = 8080;
const SERVICE_PORT: u16 = 80;
/// Pause after each sync before the samples.
const SETTLE: Duration = Duration::from_secs(3);

/// The measured Service `ns0/svc0` (ClusterIP 10.96.0.10:80 to `pod`, on
/// this node) and `count - 1` others (10.96.0.10 + i, each with two
/// endpoints on node-2).
fn services(count: u32, pod: Ipv4Addr) -> BTreeMap<ServicePortName, ServicePortState> {
    (0..count)
        .map(|i| {
            let cluster_ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 10)) + i);
            let builder = service(
                &format!("ns{}", i % 100),
                &format!("svc{i}"),
                &cluster_ip.to_string(),
                SERVICE_PORT,
            );
            if i == 0 {
                builder.local_endpoint(&pod.to_string(), POD_PORT)
            } else {
                let base = u32::from(Ipv4Addr::new(10, 244, 2, 0)) + 2 * i;
                builder
                    .remote_endpoint(&Ipv4Addr::from(base).to_string(), POD_PORT)
                    .remote_endpoint(&Ipv4Addr::from(base + 1).to_string(), POD_PORT)
            }
            .build()
        })
        .collect()
}

fn env_number(name: &str, default: u32) -> u32 {
    std::env::var(name)
        .ok()
        .map(|text| text.trim().parse().expect("a number"))
        .unwrap_or(default)
}

/// One sample: connect, greeting, one line echoed, close.
fn sample(addr: SocketAddr) -> Duration {
    let start = Instant::now();
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect");
    stream.set_nodelay(true).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).expect("greeting");
    assert!(line.starts_with("ep1 "), "greeting {line:?}");
    writer.write_all(b"ping\n").unwrap();
    line.clear();
    reader.read_line(&mut line).expect("echo");
    let took = start.elapsed();
    assert!(line.trim_end().ends_with(" ping"), "echo {line:?}");
    took
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    // Nearest rank.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1].as_secs_f64() * 1e6
}

fn main() {
    require_root();
    let large = env_number("KP_LATENCY_SERVICES", 10_000);
    let rounds = env_number("KP_LATENCY_ROUNDS", 6);
    let samples = env_number("KP_LATENCY_SAMPLES", 2000);
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(POD_PORT))
        .client("client")
        .build()
        .expect("the benchmark needs root, iproute2 and network namespaces");
    topology.add_node_default_route().unwrap();
    let pod = topology.pod("ep1").ip();
    let tables = [(1, services(1, pod)), (large, services(large, pod))];
    let node = NodeInfo {
        name: plan::NODE_NAME.to_owned(),
        addresses: vec![IpAddr::V4(plan::NODE_IP)],
        ..NodeInfo::default()
    };
    let options = NftablesOptions {
        local_detector: LocalDetector::ClusterCidr(vec![plan::POD_CIDR.into()]),
        ..NftablesOptions::default()
    };
    let mut backend =
        NftablesBackend::system(IpFamily::V4, options, NodePortAddresses::All).unwrap();
    let stale = StaleConntrack::default();
    let none = BTreeSet::new();
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10)), SERVICE_PORT);
    let mut results: BTreeMap<u32, Vec<Duration>> = BTreeMap::new();
    for round in 0..rounds {
        let (size, service_ports) = &tables[round as usize % 2];
        let request = SyncRequest {
            family: IpFamily::V4,
            full: true,
            service_ports,
            changed_services: &none,
            node: &node,
            stale_conntrack: &stale,
        };
        topology.node().run(|| backend.sync(&request)).unwrap();
        // The kernel frees the replaced rules and may resize its set hash
        // tables after a commit, in deferred work; let that end before the
        // samples, then warm up, so neither size pays for it.
        std::thread::sleep(SETTLE);
        let client = topology.client();
        client.run(|| {
            for _ in 0..200 {
                sample(addr);
            }
        });
        let taken: Vec<Duration> = client.run(|| (0..samples).map(|_| sample(addr)).collect());
        eprintln!("round {round}: {size} Services, {samples} connections");
        results.entry(*size).or_default().extend(taken);
    }
    println!("connect + greeting + one echoed line through ClusterIP 10.96.0.10:80, one fresh TCP connection each");
    println!("| Services in the table | connections | median (µs) | p90 (µs) | p99 (µs) |");
    println!("|---:|---:|---:|---:|---:|");
    let mut medians = Vec::new();
    for (size, mut taken) in results {
        taken.sort_unstable();
        let median = percentile(&taken, 50.0);
        medians.push(median);
        println!(
            "| {size} | {} | {median:.0} | {:.0} | {:.0} |",
            taken.len(),
            percentile(&taken, 90.0),
            percentile(&taken, 99.0)
        );
    }
    if let [small, large] = medians[..] {
        println!(
            "\nmedian ratio, {large_size} to 1 Service: {:.3}",
            large / small,
            large_size = tables[1].0
        );
    }
}
