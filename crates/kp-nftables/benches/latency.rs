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
use std::sync::Arc;
use std::time::{Duration, Instant};

use kp_iptables::{LocalDetector, NodePortAddresses};
use kp_model::{
    categorize_endpoints, Endpoint, IpFamily, NamespacedName, NodeInfo, Protocol, ServicePort,
    ServicePortName,
};
use kp_nftables::{NftablesBackend, NftablesOptions};
use kp_sync::{Backend, ServicePortState, StaleConntrack, SyncRequest};
use kp_testkit::netns::{require_root, Topology};
use kp_testkit::plan;

const POD_PORT: u16 = 8080;
const SERVICE_PORT: u16 = 80;
/// Pause after each sync before the samples.
const SETTLE: Duration = Duration::from_secs(3);

fn endpoint(ip: Ipv4Addr, port: u16, local: bool) -> Arc<Endpoint> {
    Arc::new(Endpoint {
        ip: IpAddr::V4(ip),
        port,
        ready: true,
        serving: true,
        terminating: false,
        is_local: local,
        node_name: Some(
            if local {
                plan::NODE_NAME
            } else {
                plan::OTHER_NODE_NAME
            }
            .into(),
        ),
        zone: None,
        zone_hints: None,
        node_hints: None,
    })
}

/// Service `i`: ClusterIP 10.96.0.10 + i, port 80/TCP.
fn service_port(i: u32, mut endpoints: Vec<Arc<Endpoint>>) -> (ServicePortName, ServicePortState) {
    let name = ServicePortName::new(
        NamespacedName::new(format!("ns{}", i % 100), format!("svc{i}")),
        "http",
        Protocol::Tcp,
    );
    let port = ServicePort {
        cluster_ip: IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 10)) + i)),
        port: SERVICE_PORT,
        protocol: Protocol::Tcp,
        node_port: None,
        external_ips: Vec::new(),
        load_balancer_ips: Vec::new(),
        load_balancer_source_ranges: Vec::new(),
        session_affinity_timeout: None,
        external_policy_local: false,
        internal_policy_local: false,
        health_check_node_port: None,
        traffic_distribution: None,
        topology_mode: None,
    };
    endpoints.sort_by_key(|e| (e.ip, e.port));
    let categorized = categorize_endpoints(&endpoints, &port, plan::NODE_NAME, &BTreeMap::new());
    let state = ServicePortState {
        port: Arc::new(port),
        endpoints: categorized,
        all_endpoints: endpoints,
    };
    (name, state)
}

/// The measured Service (to `pod`) and `count - 1` others.
fn services(count: u32, pod: Ipv4Addr) -> BTreeMap<ServicePortName, ServicePortState> {
    let filler = |i: u32| {
        let base = u32::from(Ipv4Addr::new(10, 244, 2, 0)) + 2 * i;
        vec![
            endpoint(Ipv4Addr::from(base), POD_PORT, false),
            endpoint(Ipv4Addr::from(base + 1), POD_PORT, false),
        ]
    };
    (0..count)
        .map(|i| {
            if i == 0 {
                service_port(0, vec![endpoint(pod, POD_PORT, true)])
            } else {
                service_port(i, filler(i))
            }
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
