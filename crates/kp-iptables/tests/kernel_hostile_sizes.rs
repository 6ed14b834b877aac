//! Kernel tests: the largest Services the API server accepts are
//! programmed, with packets, next to an ordinary Service that keeps
//! working: 10,000 source ranges (IPv4 and IPv6), 1,000 endpoints, 100
//! external IPs, 200 ports. The API server sets no limit on any of them.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web (the ordinary Service), port http 80 | 10.96.0.10, fd00:10:96::10 → ep1 |
//! | ns1/lb, LoadBalancer, 10,000 source ranges | 10.96.0.20, LB 203.0.113.9; fd00:10:96::20, LB 2001:db8:203:113::9 |
//! | ns1/many, 1,000 endpoints | 10.96.0.30 → 10.244.8.1 … (addresses of pod ep3) |
//! | ns1/ext, 100 external IPs | 10.96.0.40, 203.0.113.101 … 203.0.113.200 |
//! | ns1/ports, 200 ports 10001 … 10200 | 10.96.0.50 → 8080 |
//! | client (inside the ranges), client2 (outside) | 192.168.99.10, .11 |
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kernel;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use k8s_openapi::api::core::v1::Service;
use kernel::*;
use kp_iptables::IptablesFlavor;
use kp_model::IpFamily;
use kp_testkit::builders::{endpoint_slice, service};
use kp_testkit::netns::{connect, expect_timeout, Topology};

/// The size the tests program: what no user is stopped from writing.
const SOURCE_RANGES: usize = 10_000;
const ENDPOINTS: usize = 1_000;
const EXTERNAL_IPS: usize = 100;
const PORTS: usize = 200;

on_both_flavors!(ten_thousand_ipv4_source_ranges_admit_one_client_and_drop_another);

#[test]
fn ten_thousand_ipv6_source_ranges_admit_one_client_and_drop_another() {
    let flavor = IptablesFlavor::Legacy;
    require(flavor);
    let topology = build(three_pods());
    let proxy = Proxy::start(&topology, flavor, IpFamily::V6);
    // 10,000 /128s around the first client's address, and the client.
    let client = Ipv6Addr::from(topology.client_named("client").ip_v6());
    let ranges = (0..SOURCE_RANGES as u128 - 1)
        .map(|i| format!("{}/128", Ipv6Addr::from(u128::from(client) + 0x1_0000 + i)))
        .chain([format!("{client}/128")]);
    let lb = service("ns1", "lb", |mut s| {
        s = s
            .ip_families(&["IPv6"])
            .service_type("LoadBalancer")
            .cluster_ip("fd00:10:96::20")
            .port("http", 80, "TCP")
            .node_port(30081)
            .lb_ingress_ip("2001:db8:203:113::9");
        for range in ranges {
            s = s.lb_source_range(range);
        }
        s
    });
    let web = service("ns1", "web", |s| {
        s.ip_families(&["IPv6"])
            .cluster_ip("fd00:10:96::10")
            .port("http", 80, "TCP")
    });
    let ep1 = pod_ip_v6(&topology, "ep1");
    proxy.apply(
        &[web, lb],
        &[slice("web", &[ep1], &[]), slice("lb", &[ep1], &[])],
    );
    proxy.sync();

    let lb_ip = at("2001:db8:203:113::9", 80);
    assert_eq!(
        connect(topology.client_named("client"), lb_ip)
            .unwrap()
            .backend,
        "ep1"
    );
    expect_timeout(topology.client_named("client2"), lb_ip);
    assert_eq!(
        connect(topology.pod("ep2"), at("fd00:10:96::10", 80))
            .unwrap()
            .backend,
        "ep1",
        "the ordinary Service answers"
    );
    assert_source_ranges_in_kernel(&proxy, SOURCE_RANGES);
}

fn ten_thousand_ipv4_source_ranges_admit_one_client_and_drop_another(flavor: IptablesFlavor) {
    require(flavor);
    let topology = build(three_pods());
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    // 9,999 /32s of 10.128.0.0/16 and the first client's address, last.
    let ranges = (0..SOURCE_RANGES as u32 - 1)
        .map(|i| format!("{}/32", Ipv4Addr::from(0x0a80_0000 + i)))
        .chain([format!("{}/32", topology.client_named("client").ip())]);
    let lb = service("ns1", "lb", |mut s| {
        s = s
            .service_type("LoadBalancer")
            .cluster_ip("10.96.0.20")
            .port("http", 80, "TCP")
            .node_port(30081)
            .lb_ingress_ip("203.0.113.9");
        for range in ranges {
            s = s.lb_source_range(range);
        }
        s
    });
    let ep1 = pod_ip(&topology, "ep1");
    proxy.apply(
        &[web(), lb],
        &[slice("web", &[ep1], &[]), slice("lb", &[ep1], &[])],
    );
    proxy.sync();

    let lb_ip = at("203.0.113.9", 80);
    assert_eq!(
        connect(topology.client_named("client"), lb_ip)
            .unwrap()
            .backend,
        "ep1"
    );
    expect_timeout(topology.client_named("client2"), lb_ip);
    assert_ordinary_service_answers(&topology);
    assert_source_ranges_in_kernel(&proxy, SOURCE_RANGES);
}

#[test]
fn a_thousand_endpoints_behind_one_service_are_all_used() {
    let flavor = IptablesFlavor::Legacy;
    require(flavor);
    let topology = build(three_pods());
    // Pod ep3 answers on 1,000 addresses of 10.244.8.0/22, routed to it.
    let addresses: Vec<IpAddr> = (1..=ENDPOINTS as u32)
        .map(|i| IpAddr::V4(Ipv4Addr::from(0x0af4_0800 + i)))
        .collect();
    give_pod_addresses(&topology, "ep3", &addresses, "10.244.8.0/22");
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    let many = service("ns1", "many", |s| {
        s.cluster_ip("10.96.0.30").port("http", 80, "TCP")
    });
    let ep1 = pod_ip(&topology, "ep1");
    proxy.apply(
        &[web(), many],
        &[slice("web", &[ep1], &[]), slice("many", &[], &addresses)],
    );
    proxy.sync();

    for _ in 0..20 {
        let reply = connect(topology.client_named("client"), at("10.96.0.30", 80)).unwrap();
        assert_eq!(reply.backend, "ep3");
    }
    assert_ordinary_service_answers(&topology);
    // Past 1,000 endpoints the rules carry no comments (upstream's large
    // cluster mode): the Service's chain is found by its ClusterIP.
    let save = proxy.save();
    let service_chain = save
        .lines()
        .find(|line| line.starts_with("-A KUBE-SERVICES") && line.contains("-d 10.96.0.30/32"))
        .and_then(|line| line.split("-j ").nth(1))
        .unwrap()
        .trim()
        .to_owned();
    let endpoint_jumps = save
        .lines()
        .filter(|line| line.starts_with(&format!("-A {service_chain} ")))
        .filter(|line| line.contains("-j KUBE-SEP-"))
        .count();
    assert_eq!(endpoint_jumps, ENDPOINTS, "one jump per endpoint");
}

#[test]
fn a_hundred_external_ips_and_two_hundred_ports_each_answer() {
    let flavor = IptablesFlavor::Legacy;
    require(flavor);
    let topology = build(three_pods());
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    let ext = service("ns1", "ext", |mut s| {
        s = s.cluster_ip("10.96.0.40").port("http", 80, "TCP");
        for i in 0..EXTERNAL_IPS {
            s = s.external_ip(format!("203.0.113.{}", 101 + i));
        }
        s
    });
    let ports = service("ns1", "ports", |mut s| {
        s = s.cluster_ip("10.96.0.50");
        for i in 0..PORTS {
            let port = 10_001 + i as i32;
            s = s.port(&format!("p{port}"), port, "TCP").target_port(8080);
        }
        s
    });
    let ep1 = pod_ip(&topology, "ep1");
    let ports_slice = endpoint_slice("ns1", "ports-1", "ports", |mut s| {
        for i in 0..PORTS {
            s = s.port(&format!("p{}", 10_001 + i), 8080, "TCP");
        }
        s.endpoint(ep1, |e| e.ready(true).node(kp_testkit::plan::NODE_NAME))
    });
    proxy.apply(
        &[web(), ext, ports],
        &[
            slice("web", &[ep1], &[]),
            slice("ext", &[ep1], &[]),
            ports_slice,
        ],
    );
    proxy.sync();

    for last_octet in [101, 150, 200] {
        let reply = connect(
            topology.client_named("client"),
            at(&format!("203.0.113.{last_octet}"), 80),
        )
        .unwrap();
        assert_eq!(reply.backend, "ep1", "external IP 203.0.113.{last_octet}");
    }
    for port in [10_001, 10_100, 10_200] {
        let reply = connect(topology.pod("ep2"), at("10.96.0.50", port)).unwrap();
        assert_eq!(reply.backend, "ep1", "port {port}");
    }
    assert_ordinary_service_answers(&topology);
}

/// The ordinary Service next to the hostile one.
fn web() -> Service {
    service("ns1", "web", |s| {
        s.cluster_ip("10.96.0.10").port("http", 80, "TCP")
    })
}

#[track_caller]
fn assert_ordinary_service_answers(topology: &Topology) {
    let reply = connect(topology.pod("ep2"), at("10.96.0.10", 80)).unwrap();
    assert_eq!(reply.backend, "ep1", "the ordinary Service answers");
}

/// The kernel holds one firewall rule per source range (read back with
/// `iptables-save`, not taken from the proxy's word).
#[track_caller]
fn assert_source_ranges_in_kernel(proxy: &Proxy<'_>, ranges: usize) {
    let save = proxy.save();
    let firewall_rules = save
        .lines()
        .filter(|line| line.starts_with("-A KUBE-FW-") && line.contains(" -s "))
        .count();
    assert_eq!(firewall_rules, ranges);
}

/// Adds `addresses` to pod `pod`'s interface and routes `cidr` to it from
/// the node, so that the pod's echo servers answer on each of them.
fn give_pod_addresses(topology: &Topology, pod: &str, addresses: &[IpAddr], cidr: &str) {
    let host = topology.pod(pod);
    let link = pod_interface(host);
    let commands: Vec<String> = addresses
        .iter()
        .map(|address| format!("address add {address}/32 dev {link}"))
        .collect();
    host.netns().ip_batch(&commands).unwrap();
    topology
        .node()
        .ip(&["route", "add", cidr, "dev", host.node_interface()])
        .unwrap();
}

/// The pod's own end of its link: its only interface besides `lo`.
fn pod_interface(host: &kp_testkit::netns::Host) -> String {
    let links = host.netns().exec_ok("ip", &["-o", "link", "show"]);
    links
        .lines()
        .filter_map(|line| line.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_owned())
        .find(|name| name != "lo")
        .unwrap()
}
