//! Render time for 1k and 10k service ports with 2 endpoints each: a full
//! render, and a partial render after one endpoint of one Service changed.
//! Run with `cargo bench -p kp-iptables --bench render`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use kp_iptables::{IptablesOptions, LocalDetector, NatChains, RenderInput, Renderer};
use kp_model::{
    Endpoint, IpFamily, NamespacedName, NodeInfo, Protocol, ServicePort, ServicePortName,
};
use kp_sync::ServicePortState;

fn endpoint(n: u32, port: u16) -> Arc<Endpoint> {
    Arc::new(Endpoint {
        ip: IpAddr::V4(Ipv4Addr::from(0x0af4_0000 + n)),
        port,
        ready: true,
        serving: true,
        terminating: false,
        is_local: n % 7 == 0,
        node_name: None,
        zone: None,
        zone_hints: None,
        node_hints: None,
    })
}

fn state(i: u32, endpoints: Vec<Arc<Endpoint>>) -> ServicePortState {
    let port = ServicePort {
        cluster_ip: IpAddr::V4(Ipv4Addr::from(0x0a60_0000 + i)),
        port: 80,
        protocol: Protocol::Tcp,
        node_port: (i % 10 == 0).then_some(30000 + (i % 2000) as u16),
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
    kp_sync::testing::planned(port, endpoints)
}

fn name(i: u32) -> ServicePortName {
    ServicePortName {
        service: NamespacedName {
            namespace: format!("ns{}", i % 100).into(),
            name: format!("svc{i}").into(),
        },
        port: "http".into(),
        protocol: Protocol::Tcp,
    }
}

fn services(count: u32) -> BTreeMap<ServicePortName, ServicePortState> {
    (0..count)
        .map(|i| {
            (
                name(i),
                state(i, vec![endpoint(2 * i, 8080), endpoint(2 * i + 1, 8080)]),
            )
        })
        .collect()
}

fn options() -> IptablesOptions {
    IptablesOptions {
        local_detector: LocalDetector::ClusterCidr(vec!["10.244.0.0/16".parse().unwrap()]),
        ..IptablesOptions::default()
    }
}

fn render(c: &mut Criterion) {
    let node = NodeInfo {
        name: "node-1".into(),
        addresses: vec![IpAddr::V4(Ipv4Addr::new(192, 168, 99, 2))],
        ..NodeInfo::default()
    };
    let mut group = c.benchmark_group("render");
    group.sample_size(20);
    for count in [1_000u32, 10_000] {
        let before = services(count);
        let mut after = before.clone();
        after.insert(
            name(7),
            state(7, vec![endpoint(14, 8080), endpoint(999_999, 8080)]),
        );
        let changed = BTreeSet::from([name(7).service]);
        let input = |service_ports, full| RenderInput {
            family: IpFamily::V4,
            full,
            service_ports,
            changed_services: &changed,
            node: &node,
            node_port_addresses: None,
            existing_nat_chains: NatChains::Unknown,
            jumps: &[],
        };
        let mut renderer = Renderer::new(options()).unwrap();
        group.bench_function(BenchmarkId::new("full", count), |b| {
            b.iter(|| black_box(renderer.render(&input(&before, true))))
        });
        group.bench_function(BenchmarkId::new("partial_one_endpoint", count), |b| {
            b.iter(|| black_box(renderer.render(&input(&after, false))))
        });
    }
    group.finish();
}

criterion_group!(benches, render);
criterion_main!(benches);
