//! The time to program the userspace mode at many Services with a hostile
//! one among them, against the real kernel in a node namespace.
//!
//! `cargo bench -p kp-userspace --bench sync_many` (root; iptables-nft, or
//! `KP_US_SYNC_FLAVOR=legacy`). Per run, a fresh proxier with the
//! userspace backend in the node namespace of a kp-testkit topology gets
//! `KP_US_SYNC_SERVICES` (10,000 by default) ClusterIP Services of one TCP
//! port and one endpoint each, plus the hostile Service: a LoadBalancer
//! with 10,000 `loadBalancerSourceRanges`, 100 external IPs and 200 TCP
//! ports. Figures, medians of `KP_US_SYNC_RUNS` runs (5 by default):
//! - the first sync (every listener opened, the portal ruleset written);
//! - a later sync after one endpoint changed;
//! - the nat rules the kernel holds afterwards (read back with
//!   `iptables-save`), checked against the rules the proxy wrote.
//!
//! The relay runs with one worker thread (`RelayOptions::workers` 1): each
//! TCP service port costs a descriptor per worker, and 10,000 ports at the
//! default (one worker per CPU) need more descriptors than a hard limit of
//! 20,000 allows next to the test's own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_iptables::applier::Tool;
use kp_iptables::{IptablesFlavor, SystemApplier};
use kp_model::{IpFamily, NodeInfo, ObjectEvent, ProxyEventHandler, ResourceKind};
use kp_sync::{Proxier, ProxierConfig, RunnerConfig};
use kp_testkit::builders::{endpoint_slice, service};
use kp_testkit::netns::Topology;
use kp_testkit::plan::{NODE_IP, NODE_NAME};
use kp_userspace::{JumpCheck, RelayOptions, UserspaceBackend};
use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// Ports of the hostile Service.
const HOSTILE_PORTS: u16 = 200;
/// External IPs of the hostile Service.
const HOSTILE_EXTERNAL_IPS: u32 = 100;
/// Source ranges of the hostile Service.
const HOSTILE_SOURCE_RANGES: u32 = 10_000;

fn main() {
    let services: u32 = env_or("KP_US_SYNC_SERVICES", 10_000);
    let runs: usize = env_or("KP_US_SYNC_RUNS", 5);
    let flavor = match std::env::var("KP_US_SYNC_FLAVOR").as_deref() {
        Ok("legacy") => IptablesFlavor::Legacy,
        _ => IptablesFlavor::Nft,
    };
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    let (objects, slices) = objects(services);
    let mut first = Vec::new();
    let mut later = Vec::new();
    for run in 0..runs {
        let topology = Topology::builder().build().unwrap();
        let (first_sync, later_sync, rules) = one_run(&topology, flavor, &objects, &slices);
        eprintln!(
            "run {run}: first sync {first_sync:?}, later sync {later_sync:?}, {rules} nat rules in the kernel"
        );
        first.push(first_sync);
        later.push(later_sync);
    }
    println!(
        "userspace mode, {services} Services + 1 hostile ({HOSTILE_PORTS} ports, \
         {HOSTILE_EXTERNAL_IPS} external IPs, {HOSTILE_SOURCE_RANGES} source ranges), \
         {flavor:?}, medians of {runs} runs: first sync {:?}, sync after one endpoint change {:?}",
        median(&mut first),
        median(&mut later)
    );
}

/// One proxier from scratch: the first sync, then one after an endpoint
/// change; and the number of portal rules the kernel shows.
fn one_run(
    topology: &Topology,
    flavor: IptablesFlavor,
    services: &[Service],
    slices: &[EndpointSlice],
) -> (Duration, Duration, usize) {
    let routes_dir = tempfile::tempdir().unwrap();
    let runtime = topology.node().run(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    });
    let options = RelayOptions {
        workers: 1,
        ..RelayOptions::default()
    };
    let backend = UserspaceBackend::new(
        runtime.handle().clone(),
        IpFamily::V4,
        options,
        Box::new(SystemApplier::new(flavor)),
    )
    .with_jump_check(JumpCheck::for_flavor(flavor))
    // Published as the binary does, but not into the machine's /run.
    .with_routes_file(Some(routes_dir.path().join("userspace-routes-IPv4.json")));
    let proxier = Arc::new(Proxier::new(
        ProxierConfig {
            family: IpFamily::V4,
            node: NodeInfo {
                name: NODE_NAME.to_owned(),
                addresses: vec![IpAddr::V4(NODE_IP)],
                ..NodeInfo::default()
            },
            runner: RunnerConfig {
                min_interval: Duration::ZERO,
                max_interval: Duration::ZERO,
                retry_interval: Duration::from_millis(100),
            },
        },
        Box::new(backend),
    ));
    for object in services {
        proxier.on_service(ObjectEvent::Apply(object.clone()));
    }
    for slice in slices {
        proxier.on_endpoint_slice(ObjectEvent::Apply(slice.clone()));
    }
    proxier.on_synced(ResourceKind::Service);
    proxier.on_synced(ResourceKind::EndpointSlice);
    let timed = |proxier: &Proxier| {
        topology.node().run(|| {
            let start = Instant::now();
            let outcome = proxier.sync_once().unwrap();
            (start.elapsed(), outcome)
        })
    };
    let (first, outcome) = timed(&proxier);
    proxier.on_endpoint_slice(ObjectEvent::Apply(slice_of(0, 2)));
    let (later, _) = timed(&proxier);
    let saved = topology
        .node()
        .exec_ok(&flavor.program(IpFamily::V4, Tool::Save), &["-t", "nat"]);
    let in_kernel = saved
        .lines()
        .filter(|line| {
            line.starts_with("-A KUBE-PORTALS-") || line.starts_with("-A KUBE-NODEPORT-")
        })
        .count();
    let written: usize = outcome.rules_per_table.iter().map(|(_, n)| n).sum();
    assert_eq!(in_kernel, written, "the kernel holds every rule written");
    drop(proxier);
    runtime.shutdown_background();
    (first, later, in_kernel)
}

/// `count` ClusterIP Services `ns1/svc-N` (10.96.x.y:80/TCP), each with one
/// endpoint, and the hostile Service `ns1/hostile` with its slice.
fn objects(count: u32) -> (Vec<Service>, Vec<EndpointSlice>) {
    let mut services = Vec::new();
    let mut slices = Vec::new();
    for index in 0..count {
        let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 1, 0)) + index);
        services.push(service("ns1", &format!("svc-{index}"), |s| {
            s.cluster_ip(ip).port("http", 80, "TCP")
        }));
        slices.push(slice_of(index, 1));
    }
    services.push(service("ns1", "hostile", |s| {
        let mut s = s
            .service_type("LoadBalancer")
            .cluster_ip("10.96.0.9")
            .lb_ingress_ip("203.0.113.9");
        for port in 0..HOSTILE_PORTS {
            s = s
                .port(&format!("p{port}"), i32::from(1000 + port), "TCP")
                .node_port(i32::from(30_000 + port));
        }
        for index in 0..HOSTILE_EXTERNAL_IPS {
            s = s.external_ip(Ipv4Addr::from(
                u32::from(Ipv4Addr::new(203, 0, 113, 100)) + index % 100,
            ));
        }
        for index in 0..HOSTILE_SOURCE_RANGES {
            s = s.lb_source_range(format!("{}/32", Ipv4Addr::from(0x0b00_0000 + index)));
        }
        s
    }));
    slices.push(endpoint_slice("ns1", "hostile-1", "hostile", |mut s| {
        for port in 0..HOSTILE_PORTS {
            s = s.port(&format!("p{port}"), 8080, "TCP");
        }
        s.endpoint("10.244.1.2", |e| e.ready(true).node(NODE_NAME))
    }));
    (services, slices)
}

/// The slice of `ns1/svc-N` with endpoint 10.244.`octet`.N%250+2.
fn slice_of(index: u32, octet: u8) -> EndpointSlice {
    let last = u8::try_from(index % 250).unwrap() + 2;
    endpoint_slice(
        "ns1",
        &format!("svc-{index}-1"),
        &format!("svc-{index}"),
        |s| {
            s.port("http", 8080, "TCP")
                .endpoint(IpAddr::V4(Ipv4Addr::new(10, 244, octet, last)), |e| {
                    e.ready(true).node(NODE_NAME)
                })
        },
    )
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn median(values: &mut [Duration]) -> Duration {
    values.sort();
    values[values.len() / 2]
}
