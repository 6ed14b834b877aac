//! Kernel tests: the largest Services the API server accepts are
//! programmed, with packets, next to an ordinary Service that keeps
//! working: 10,000 source ranges (IPv4 and IPv6), 1,000 endpoints, 100
//! external IPs, 200 ports. The API server sets no limit on any of them.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web (the ordinary Service), port http 80 | 10.96.0.10, fd00:10:96::10 → ep1 |
//! | ns1/lb, LoadBalancer, 10,000 source ranges | 10.96.0.20, LB 203.0.113.9; fd00:10:96::20, LB 2001:db8:203:113::9 |
//! | ns1/many, 1,000 endpoints | 10.96.0.30 → 10.244.8.1 … .11.232; fd00:10:96::30 → fd00:10:244:8::1 … ::3e8 (all answered by pod ep3) |
//! | ns1/ext, 100 external IPs | 10.96.0.40, 203.0.113.101 … .200; fd00:10:96::40, 2001:db8:203:113::65 … ::c8 |
//! | ns1/ports, 200 ports 10001 … 10200 | 10.96.0.50, fd00:10:96::50 → 8080 |
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
    let client = topology.client_named("client").ip_v6();
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
    let plan = Plan {
        family: IpFamily::V4,
    };
    proxy.apply(
        &[plan.web(), lb],
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
    plan.assert_ordinary_service_answers(&topology);
    assert_source_ranges_in_kernel(&proxy, SOURCE_RANGES);
}

/// The addresses of `family` used by the one-Service tests: the
/// Service's ClusterIP, the external IPs' prefix, and how one is written.
struct Plan {
    family: IpFamily,
}

impl Plan {
    fn families(&self) -> &'static [&'static str] {
        match self.family {
            IpFamily::V4 => &["IPv4"],
            IpFamily::V6 => &["IPv6"],
        }
    }

    /// ClusterIP number `n` of the plan: 10.96.0.n or fd00:10:96::n.
    fn cluster_ip(&self, n: u8) -> String {
        match self.family {
            IpFamily::V4 => format!("10.96.0.{n}"),
            IpFamily::V6 => format!("fd00:10:96::{n}"),
        }
    }

    /// External IP number `i`: 203.0.113.i or 2001:db8:203:113::i (hex).
    fn external_ip(&self, i: usize) -> String {
        match self.family {
            IpFamily::V4 => format!("203.0.113.{i}"),
            IpFamily::V6 => format!("2001:db8:203:113::{i:x}"),
        }
    }

    /// `iptables-save` writes a host address with its full prefix.
    fn host(&self, ip: &str) -> String {
        match self.family {
            IpFamily::V4 => format!("{ip}/32"),
            IpFamily::V6 => format!("{ip}/128"),
        }
    }

    /// The address of `pod` in the family.
    fn pod(&self, topology: &Topology, pod: &str) -> IpAddr {
        match self.family {
            IpFamily::V4 => pod_ip(topology, pod),
            IpFamily::V6 => pod_ip_v6(topology, pod),
        }
    }

    /// The ordinary Service of the family, answered by ep1.
    fn web(&self) -> Service {
        let families = self.families();
        let cluster_ip = self.cluster_ip(10);
        service("ns1", "web", |s| {
            s.ip_families(families)
                .cluster_ip(cluster_ip)
                .port("http", 80, "TCP")
        })
    }

    #[track_caller]
    fn assert_ordinary_service_answers(&self, topology: &Topology) {
        let reply = connect(topology.pod("ep2"), at(&self.cluster_ip(10), 80)).unwrap();
        assert_eq!(reply.backend, "ep1", "the ordinary Service answers");
    }
}

fn a_thousand_endpoints_behind_one_service_are_all_used(family: IpFamily) {
    let flavor = IptablesFlavor::Legacy;
    require(flavor);
    let plan = Plan { family };
    let topology = build(three_pods());
    // Pod ep3 answers on 1,000 addresses of a range of its own (its echo
    // servers listen on the wildcard address), routed to it by the node.
    let (range, addresses): (&str, Vec<IpAddr>) = match family {
        IpFamily::V4 => (
            "10.244.8.0/22",
            (1..=ENDPOINTS as u32)
                .map(|i| IpAddr::V4(Ipv4Addr::from(0x0af4_0800 + i)))
                .collect(),
        ),
        IpFamily::V6 => (
            "fd00:10:244:8::/64",
            (1..=ENDPOINTS as u16)
                .map(|i| IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0x244, 8, 0, 0, 0, i)))
                .collect(),
        ),
    };
    topology.route_range_to_pod("ep3", range).unwrap();
    let proxy = Proxy::start(&topology, flavor, family);
    let cluster_ip = plan.cluster_ip(30);
    let many = service("ns1", "many", |s| {
        s.ip_families(plan.families())
            .cluster_ip(&cluster_ip)
            .port("http", 80, "TCP")
    });
    let ep1 = plan.pod(&topology, "ep1");
    proxy.apply(
        &[plan.web(), many],
        &[slice("web", &[ep1], &[]), slice("many", &[], &addresses)],
    );
    proxy.sync();

    // An IPv6 ClusterIP is not routed from the clients: pod ep2 asks.
    let from = match family {
        IpFamily::V4 => topology.client_named("client"),
        IpFamily::V6 => topology.pod("ep2"),
    };
    for _ in 0..20 {
        let reply = connect(from, at(&cluster_ip, 80)).unwrap();
        assert_eq!(reply.backend, "ep3");
    }
    plan.assert_ordinary_service_answers(&topology);
    // Past 1,000 endpoints the rules carry no comments (upstream's large
    // cluster mode): the Service's chain is found by its ClusterIP.
    let save = proxy.save();
    let service_chain = save
        .lines()
        .find(|line| {
            line.starts_with("-A KUBE-SERVICES")
                && line.contains(&format!("-d {} ", plan.host(&cluster_ip)))
        })
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
fn a_thousand_ipv4_endpoints_behind_one_service_are_all_used() {
    a_thousand_endpoints_behind_one_service_are_all_used(IpFamily::V4);
}

#[test]
fn a_thousand_ipv6_endpoints_behind_one_service_are_all_used() {
    a_thousand_endpoints_behind_one_service_are_all_used(IpFamily::V6);
}

fn a_hundred_external_ips_and_two_hundred_ports_each_answer(family: IpFamily) {
    let flavor = IptablesFlavor::Legacy;
    require(flavor);
    let plan = Plan { family };
    let topology = build(three_pods());
    let proxy = Proxy::start(&topology, flavor, family);
    let ext_cluster_ip = plan.cluster_ip(40);
    let ext = service("ns1", "ext", |mut s| {
        s = s
            .ip_families(plan.families())
            .cluster_ip(&ext_cluster_ip)
            .port("http", 80, "TCP");
        for i in 0..EXTERNAL_IPS {
            s = s.external_ip(plan.external_ip(101 + i));
        }
        s
    });
    let ports_cluster_ip = plan.cluster_ip(50);
    let ports = service("ns1", "ports", |mut s| {
        s = s.ip_families(plan.families()).cluster_ip(&ports_cluster_ip);
        for i in 0..PORTS {
            let port = 10_001 + i as i32;
            s = s.port(&format!("p{port}"), port, "TCP").target_port(8080);
        }
        s
    });
    let ep1 = plan.pod(&topology, "ep1");
    let ports_slice = endpoint_slice("ns1", "ports-1", "ports", |mut s| {
        s = s.address_type(plan.families()[0]);
        for i in 0..PORTS {
            s = s.port(&format!("p{}", 10_001 + i), 8080, "TCP");
        }
        s.endpoint(ep1, |e| e.ready(true).node(kp_testkit::plan::NODE_NAME))
    });
    proxy.apply(
        &[plan.web(), ext, ports],
        &[
            slice("web", &[ep1], &[]),
            slice("ext", &[ep1], &[]),
            ports_slice,
        ],
    );
    proxy.sync();

    for i in [101, 150, 200] {
        let external_ip = plan.external_ip(i);
        let reply = connect(topology.client_named("client"), at(&external_ip, 80)).unwrap();
        assert_eq!(reply.backend, "ep1", "external IP {external_ip}");
    }
    for port in [10_001, 10_100, 10_200] {
        let reply = connect(topology.pod("ep2"), at(&ports_cluster_ip, port)).unwrap();
        assert_eq!(reply.backend, "ep1", "port {port}");
    }
    plan.assert_ordinary_service_answers(&topology);
    // Read back from the kernel: one rule per external IP and one per
    // port of the ClusterIP in KUBE-SERVICES.
    let save = proxy.save();
    let services = |prefix: &str| {
        save.lines()
            .filter(|line| line.starts_with("-A KUBE-SERVICES"))
            .filter(|line| line.contains(&format!("-d {prefix}")))
            .count()
    };
    let external_prefix = plan.external_ip(0).trim_end_matches('0').to_owned();
    assert_eq!(
        services(&external_prefix),
        EXTERNAL_IPS,
        "one rule per external IP"
    );
    assert_eq!(
        services(&format!("{} ", plan.host(&ports_cluster_ip))),
        PORTS,
        "one rule per port"
    );
}

#[test]
fn a_hundred_ipv4_external_ips_and_two_hundred_ports_each_answer() {
    a_hundred_external_ips_and_two_hundred_ports_each_answer(IpFamily::V4);
}

#[test]
fn a_hundred_ipv6_external_ips_and_two_hundred_ports_each_answer() {
    a_hundred_external_ips_and_two_hundred_ports_each_answer(IpFamily::V6);
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
