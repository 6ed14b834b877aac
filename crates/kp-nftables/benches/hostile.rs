//! Time to program the largest inputs the API server accepts on a node
//! with 10,000 other Services, committing over netlink to the real kernel.
//!
//! In a network namespace this program creates, enters and removes: a
//! table of `KP_BENCH_OTHERS` (default 10,000) Service ports × 2 endpoints
//! is written first; then, 5 times for each hostile Service: a full sync
//! without it that rewrites the table (after a change to the table by
//! another commit, so the backend trusts its record again), a partial sync
//! adding it (timed), and a full sync with it that rewrites the table
//! (after another such change: the repair path, timed). The medians are
//! printed. The IPv6 input runs against an IPv6 table of the same size.
//!
//! Needs root. Run with `cargo bench -p kp-nftables --bench hostile`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use kp_model::{
    Endpoint, IpFamily, NamespacedName, NodeInfo, Protocol, ServicePort, ServicePortName,
};
use kp_nftables::model::{ChainKind, Command, Name};
use kp_nftables::{Applier, NetlinkApplier, NftablesBackend, NftablesOptions, Transaction};
use kp_node::{LocalDetector, NodePortAddresses};
use kp_sync::{Backend, ServicePortState, StaleConntrack, SyncRequest};
use kp_testkit::netns::Netns;

const RUNS: usize = 5;

type Ports = BTreeMap<ServicePortName, ServicePortState>;

/// One hostile Service: its name and its ports.
struct Input {
    label: &'static str,
    family: IpFamily,
    ports: Ports,
}

fn endpoint(ip: IpAddr) -> Arc<Endpoint> {
    Arc::new(Endpoint {
        ip,
        port: 8080,
        ready: true,
        serving: true,
        terminating: false,
        is_local: false,
        node_name: Some("node-2".into()),
        zone: None,
        zone_hints: None,
        node_hints: None,
    })
}

fn v4(n: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(n))
}

fn v6(n: u32) -> IpAddr {
    IpAddr::V6(Ipv6Addr::from(
        0xfd00_0010_0244_0000_0000_0000_0000_0000u128 + u128::from(n),
    ))
}

fn service_port(cluster_ip: IpAddr, port: u16) -> ServicePort {
    ServicePort {
        cluster_ip,
        port,
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
    }
}

fn state(port: ServicePort, mut endpoints: Vec<Arc<Endpoint>>) -> ServicePortState {
    endpoints.sort_by_key(|e| (e.ip, e.port));
    kp_sync::testing::planned(port, endpoints)
}

fn port_name(ns: &str, svc: &str, port: &str) -> ServicePortName {
    ServicePortName::new(NamespacedName::new(ns, svc), port, Protocol::Tcp)
}

/// `count` Service ports × 2 endpoints of `family`.
fn others(family: IpFamily, count: u32) -> Ports {
    let ip = |n: u32| match family {
        IpFamily::V4 => v4(0x0a60_0000 + n),
        IpFamily::V6 => v6(0x0060_0000 + n),
    };
    let ep = |n: u32| match family {
        IpFamily::V4 => v4(0x0af4_0000 + n),
        IpFamily::V6 => v6(n),
    };
    (0..count)
        .map(|i| {
            let name = port_name(&format!("ns{}", i % 100), &format!("svc{i}"), "http");
            let endpoints = vec![endpoint(ep(2 * i)), endpoint(ep(2 * i + 1))];
            (name, state(service_port(ip(i), 80), endpoints))
        })
        .collect()
}

fn source_ranges(family: IpFamily, count: u32) -> Input {
    let (cluster_ip, lb, ranges): (IpAddr, IpAddr, Vec<IpNet>) = match family {
        IpFamily::V4 => (
            "10.96.255.1".parse().unwrap(),
            "203.0.113.10".parse().unwrap(),
            (0..count)
                .map(|i| {
                    format!("100.{}.{}.0/25", 64 + i / 256, i % 256)
                        .parse()
                        .unwrap()
                })
                .collect(),
        ),
        IpFamily::V6 => (
            "fd00:10:96::ff01".parse().unwrap(),
            "2001:db8:203:113::10".parse().unwrap(),
            (0..count)
                .map(|i| format!("fc00:aaaa:{:x}::/48", 2 * i).parse().unwrap())
                .collect(),
        ),
    };
    let mut port = service_port(cluster_ip, 80);
    port.load_balancer_ips = vec![lb];
    port.load_balancer_source_ranges = ranges;
    let ep = match family {
        IpFamily::V4 => v4(0x0af4_ff00),
        IpFamily::V6 => v6(0xff00),
    };
    let label = match (family, count) {
        (IpFamily::V4, 3_000) => "3,000 IPv4 loadBalancerSourceRanges",
        (IpFamily::V4, _) => "10,000 IPv4 loadBalancerSourceRanges",
        (IpFamily::V6, _) => "10,000 IPv6 loadBalancerSourceRanges",
    };
    Input {
        label,
        family,
        ports: [(
            port_name("hostile", "lb", "http"),
            state(port, vec![endpoint(ep)]),
        )]
        .into(),
    }
}

/// The baseline: one more ordinary Service port (2 endpoints).
fn ordinary(family: IpFamily) -> Input {
    let (cluster_ip, eps) = match family {
        IpFamily::V4 => (
            "10.96.255.5".parse().unwrap(),
            [v4(0x0af4_ff03), v4(0x0af4_ff04)],
        ),
        IpFamily::V6 => (
            "fd00:10:96::ff05".parse().unwrap(),
            [v6(0xff03), v6(0xff04)],
        ),
    };
    let label = match family {
        IpFamily::V4 => "baseline: one ordinary IPv4 Service (2 endpoints)",
        IpFamily::V6 => "baseline: one ordinary IPv6 Service (2 endpoints)",
    };
    Input {
        label,
        family,
        ports: [(
            port_name("hostile", "ordinary", "http"),
            state(service_port(cluster_ip, 80), eps.map(endpoint).to_vec()),
        )]
        .into(),
    }
}

fn many_endpoints() -> Input {
    let endpoints = (0..1_000).map(|n| endpoint(v4(0x0af5_0000 + n))).collect();
    let port = service_port("10.96.255.2".parse().unwrap(), 80);
    Input {
        label: "1,000 endpoints behind one Service",
        family: IpFamily::V4,
        ports: [(port_name("hostile", "big", "http"), state(port, endpoints))].into(),
    }
}

fn many_external_ips() -> Input {
    let mut port = service_port("10.96.255.3".parse().unwrap(), 80);
    port.external_ips = (0..100).map(|n| v4(0xcb00_7164 + n)).collect();
    Input {
        label: "100 external IPs",
        family: IpFamily::V4,
        ports: [(
            port_name("hostile", "ext", "http"),
            state(port, vec![endpoint(v4(0x0af4_ff01))]),
        )]
        .into(),
    }
}

fn many_ports() -> Input {
    let ports = (0..200u16)
        .map(|i| {
            let port = service_port("10.96.255.4".parse().unwrap(), 1000 + i);
            (
                port_name("hostile", "ports", &format!("p{i}")),
                state(port, vec![endpoint(v4(0x0af4_ff02))]),
            )
        })
        .collect();
    Input {
        label: "200 ports on one Service",
        family: IpFamily::V4,
        ports,
    }
}

fn median(mut samples: Vec<Duration>) -> f64 {
    samples.sort_unstable();
    samples[samples.len() / 2].as_secs_f64() * 1000.0
}

fn options() -> NftablesOptions {
    NftablesOptions {
        local_detector: LocalDetector::ClusterCidr(vec![
            "10.244.0.0/16".parse().unwrap(),
            "fd00:10:244::/48".parse().unwrap(),
        ]),
        ..NftablesOptions::default()
    }
}

/// Adds each input `RUNS` times to a table of `count` others; returns
/// `(label, median add ms, median rewrite ms with it)`.
fn measure(family: IpFamily, count: u32, inputs: &[Input]) -> Vec<(&'static str, f64, f64)> {
    let namespace = Netns::create("bench-hostile").expect("the benchmark needs root");
    namespace.run(|| {
        let node = NodeInfo {
            name: "node-1".into(),
            addresses: vec![
                IpAddr::V4(Ipv4Addr::new(192, 168, 99, 2)),
                "fd00:192:168:99::2".parse().unwrap(),
            ],
            ..NodeInfo::default()
        };
        let stale = StaleConntrack::default();
        let mut backend =
            NftablesBackend::system(family, options(), NodePortAddresses::All).unwrap();
        let base = others(family, count);
        let mut sync = |ports: &Ports, full: bool, changed: &BTreeSet<NamespacedName>| {
            let request = SyncRequest {
                family,
                full,
                service_ports: ports,
                changed_services: changed,
                node: &node,
                stale_conntrack: &stale,
            };
            let start = Instant::now();
            backend
                .sync(&request)
                .unwrap_or_else(|e| panic!("{}", kp_sync::error_chain(&e)));
            start.elapsed()
        };
        sync(&base, true, &BTreeSet::new());
        // A change to the proxy's table by another commit: the next full
        // sync rewrites every rule.
        let mut other = NetlinkApplier::new();
        let mut touch = || {
            let chain = || Name::Fixed("kp-bench-foreign");
            let transaction = Transaction {
                family,
                commands: vec![
                    Command::AddChain {
                        name: chain(),
                        kind: ChainKind::Regular,
                    },
                    Command::DeleteChain(chain()),
                ],
            };
            other.apply(&transaction).unwrap();
        };
        let mut rows = Vec::new();
        for input in inputs.iter().filter(|input| input.family == family) {
            let service = input.ports.keys().next().unwrap().service.clone();
            let changed = BTreeSet::from([service]);
            let mut with = base.clone();
            with.extend(input.ports.iter().map(|(k, v)| (k.clone(), v.clone())));
            let mut adds = Vec::new();
            let mut fulls = Vec::new();
            for _ in 0..RUNS {
                touch();
                sync(&base, true, &BTreeSet::new());
                adds.push(sync(&with, false, &changed));
                touch();
                fulls.push(sync(&with, true, &BTreeSet::new()));
            }
            eprintln!("{}: added in {:.1} ms", input.label, median(adds.clone()));
            rows.push((input.label, median(adds), median(fulls)));
        }
        rows
    })
}

fn main() {
    let count: u32 = std::env::var("KP_BENCH_OTHERS")
        .ok()
        .map(|text| text.parse().expect("KP_BENCH_OTHERS: a number"))
        .unwrap_or(10_000);
    let inputs = [
        ordinary(IpFamily::V4),
        source_ranges(IpFamily::V4, 3_000),
        source_ranges(IpFamily::V4, 10_000),
        source_ranges(IpFamily::V6, 10_000),
        many_endpoints(),
        many_external_ips(),
        many_ports(),
        ordinary(IpFamily::V6),
    ];
    let mut rows = measure(IpFamily::V4, count, &inputs);
    rows.extend(measure(IpFamily::V6, count, &inputs));
    println!("other Service ports × 2 endpoints: {count}");
    println!(
        "| input | partial sync adding it (ms) | full sync rewriting the table with it (ms) |"
    );
    println!("|---|---:|---:|");
    for (label, add, full) in rows {
        println!("| {label} | {add:.1} | {full:.1} |");
    }
    println!();
    println!("medians of {RUNS} runs");
}
