//! Kernel tests: the largest Services the API server accepts are served by
//! the userspace mode, with packets, in both families, next to an ordinary
//! Service that keeps answering: 10,000 `loadBalancerSourceRanges`, 1,000
//! endpoints, 100 external IPs, 200 ports. The API server sets no limit on
//! any of them. The portal rules are read back from the kernel with
//! `iptables-save` / `ip6tables-save` in the node namespace. Each test
//! runs on iptables-legacy and on iptables-nft.
//!
//! | object | IPv4 | IPv6 |
//! |---|---|---|
//! | ns1/web (the ordinary Service), http 80/TCP | ClusterIP 10.96.0.10 → ep1 | fd00:10:96::10 → ep1 |
//! | ns1/lb, LoadBalancer, http 80/TCP, NodePort 30081, 10,000 source ranges | ClusterIP 10.96.0.20, LB 203.0.113.9 → ep2 | fd00:10:96::20, LB 2001:db8:203:113::9 → ep2 |
//! | ns1/big, http 80/TCP, 1,000 endpoints (all answered by ep1) | ClusterIP 10.96.0.30 → 10.244.8.1 … 10.244.11.232 | fd00:10:96::30 → fd00:10:244:8::1 … fd00:10:244:8::3e8 |
//! | ns1/ext, http 80/TCP, 100 external IPs | ClusterIP 10.96.0.40, 203.0.113.101 … 203.0.113.200 → ep2 | fd00:10:96::40, 2001:db8:203:113::65 … ::c8 → ep2 |
//! | ns1/ports, p10001 … p10200, 10001 … 10200/TCP | ClusterIP 10.96.0.50 → ep2:8080 | fd00:10:96::50 → ep2:8080 |
//! | client (inside the source ranges), client2 (outside) | 192.168.99.10, .11 | fd00:192:168:99::10, ::11 |
//!
//! The 9,999 source ranges that are not the client's are /32s of
//! 100.64.0.0/10 (IPv4) and /128s of the clients' own /64 from
//! fd00:192:168:99::1:0 on (IPv6), which nothing in the topology uses; the
//! client's range is the last of the list, so a list cut short loses it.
//!
//! An IPv6 ClusterIP is reached from pod ep2, an IPv4 one from the client;
//! external and load balancer IPs from the clients.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kernel;

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kernel::{at, pod_ip, pod_ip_v6, require, slice, three_pods, Proxy, POD_TCP_PORT};
use kp_iptables::applier::Tool;
use kp_iptables::IptablesFlavor;
use kp_model::IpFamily;
use kp_testkit::builders::{endpoint_slice, service};
use kp_testkit::netns::{connect, hits, require_tool, Netns, ProbeError, Topology};
use kp_testkit::plan::{self, NODE_NAME};

/// The sizes the tests program: what no user is stopped from writing.
const SOURCE_RANGES: usize = 10_000;
const ENDPOINTS: usize = 1_000;
const EXTERNAL_IPS: usize = 100;
const PORTS: usize = 200;

on_both_flavors!(
    ten_thousand_ipv4_source_ranges_admit_one_client_and_turn_away_another,
    ten_thousand_ipv6_source_ranges_admit_one_client_and_turn_away_another,
    a_thousand_ipv4_endpoints_behind_one_service_all_answer,
    a_thousand_ipv6_endpoints_behind_one_service_all_answer,
    a_hundred_ipv4_external_ips_on_one_service_answer,
    a_hundred_ipv6_external_ips_on_one_service_answer,
    two_hundred_ipv4_ports_on_one_service_answer,
    two_hundred_ipv6_ports_on_one_service_answer,
);

fn ten_thousand_ipv4_source_ranges_admit_one_client_and_turn_away_another(flavor: IptablesFlavor) {
    source_ranges_admit_one_client_and_turn_away_another(flavor, IpFamily::V4);
}

fn ten_thousand_ipv6_source_ranges_admit_one_client_and_turn_away_another(flavor: IptablesFlavor) {
    source_ranges_admit_one_client_and_turn_away_another(flavor, IpFamily::V6);
}

fn a_thousand_ipv4_endpoints_behind_one_service_all_answer(flavor: IptablesFlavor) {
    a_thousand_endpoints_all_answer(flavor, IpFamily::V4);
}

fn a_thousand_ipv6_endpoints_behind_one_service_all_answer(flavor: IptablesFlavor) {
    a_thousand_endpoints_all_answer(flavor, IpFamily::V6);
}

fn a_hundred_ipv4_external_ips_on_one_service_answer(flavor: IptablesFlavor) {
    a_hundred_external_ips_answer(flavor, IpFamily::V4);
}

fn a_hundred_ipv6_external_ips_on_one_service_answer(flavor: IptablesFlavor) {
    a_hundred_external_ips_answer(flavor, IpFamily::V6);
}

fn two_hundred_ipv4_ports_on_one_service_answer(flavor: IptablesFlavor) {
    two_hundred_ports_answer(flavor, IpFamily::V4);
}

fn two_hundred_ipv6_ports_on_one_service_answer(flavor: IptablesFlavor) {
    two_hundred_ports_answer(flavor, IpFamily::V6);
}

fn source_ranges_admit_one_client_and_turn_away_another(flavor: IptablesFlavor, family: IpFamily) {
    require(flavor);
    let topology = three_pods();
    let proxy = Proxy::start(&topology, flavor, family);
    let client = topology.client_named("client");
    let (cluster_ip, lb_ip, client_range) = match family {
        IpFamily::V4 => ("10.96.0.20", "203.0.113.9", format!("{}/32", client.ip())),
        IpFamily::V6 => (
            "fd00:10:96::20",
            "2001:db8:203:113::9",
            format!("{}/128", client.ip_v6()),
        ),
    };
    let ranges = foreign_ranges(family, SOURCE_RANGES - 1).chain([client_range]);
    let lb = service("ns1", "lb", |mut s| {
        s = s
            .ip_families(&[family.as_api_str()])
            .service_type("LoadBalancer")
            .cluster_ip(cluster_ip)
            .port("http", 80, "TCP")
            .node_port(30081)
            .lb_ingress_ip(lb_ip);
        for range in ranges {
            s = s.lb_source_range(range);
        }
        s
    });
    let (web, web_slice) = ordinary(&topology, family);
    proxy.apply(
        &[web, lb],
        &[
            web_slice,
            slice("lb", &[pod_address(&topology, "ep2", family)], &[]),
        ],
    );
    proxy.sync();

    let lb_at = at(lb_ip, 80);
    let admitted = connect(client.netns(), lb_at);
    assert_eq!(
        admitted.unwrap().backend,
        "ep2",
        "the client's range is the last of {SOURCE_RANGES}"
    );
    // client2 is outside every range: the relay resets its connection to
    // the load balancer IP at once.
    let client2 = topology.client_named("client2").netns();
    assert_reset(client2, lb_at);
    // The ranges limit the load balancer IP only: client2 reaches the
    // Service's NodePort, so it was turned away for its address alone.
    let node_port = SocketAddr::new(node_ip(family), 30081);
    assert_eq!(connect(client2, node_port).unwrap().backend, "ep2");
    assert_ordinary_answers(&topology, family);

    // The kernel sends the load balancer IP to the relay, from outside and
    // from the node; the ranges are the relay's to check.
    let nat = nat_rules(&topology, flavor, family);
    let lb_dest = format!("-d {}", host_net(lb_ip.parse().unwrap()));
    for chain in ["KUBE-PORTALS-CONTAINER", "KUBE-PORTALS-HOST"] {
        let rules = portal_rules(&nat, chain, "ns1/lb:http");
        assert_eq!(
            rules.iter().filter(|rule| rule.contains(&lb_dest)).count(),
            1,
            "{chain}: {rules:#?}"
        );
    }
}

/// `count` /32s (/128s) that hold no address of the topology.
fn foreign_ranges(family: IpFamily, count: usize) -> impl Iterator<Item = String> {
    (0..count as u32).map(move |i| match family {
        IpFamily::V4 => format!("{}/32", Ipv4Addr::from(0x6440_0000 + i)),
        IpFamily::V6 => {
            let base = u128::from(plan::CLIENT_IP_V6) & !0xffff_ffff_u128;
            format!("{}/128", Ipv6Addr::from(base + 0x1_0000 + u128::from(i)))
        }
    })
}

fn a_thousand_endpoints_all_answer(flavor: IptablesFlavor, family: IpFamily) {
    require(flavor);
    require_tool("conntrack");
    let topology = three_pods();
    // ep1 answers on every address of a range of its own (its echo servers
    // listen on the wildcard address), and the node routes the range to
    // ep1 through ep1's own address: a pod answers neighbour solicitations
    // only for the addresses of its interface, not for a local route.
    let (range, endpoints, cluster_ip): (&str, Vec<IpAddr>, &str) = match family {
        IpFamily::V4 => (
            "10.244.8.0/22",
            (1..=ENDPOINTS as u32)
                .map(|i| IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 244, 8, 0)) + i)))
                .collect(),
            "10.96.0.30",
        ),
        IpFamily::V6 => (
            "fd00:10:244:8::/64",
            (1..=ENDPOINTS as u16)
                .map(|i| IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0x244, 8, 0, 0, 0, i)))
                .collect(),
            "fd00:10:96::30",
        ),
    };
    topology.route_range_to_pod("ep1", range).unwrap();
    let proxy = Proxy::start(&topology, flavor, family);
    let (web, web_slice) = ordinary(&topology, family);
    proxy.apply(
        &[
            web,
            service("ns1", "big", |s| {
                s.ip_families(&[family.as_api_str()])
                    .cluster_ip(cluster_ip)
                    .port("http", 80, "TCP")
            }),
        ],
        &[web_slice, slice("big", &endpoints, &[])],
    );
    proxy.sync();

    let nat = nat_rules(&topology, flavor, family);
    let rules = portal_rules(&nat, "KUBE-PORTALS-CONTAINER", "ns1/big:http");
    assert_eq!(rules.len(), 1, "{rules:#?}");
    assert_ordinary_answers(&topology, family);
    // The relay takes the endpoints in turn: as many connections as there
    // are endpoints reach each once.
    let counts = hits(
        cluster_client(&topology, family),
        at(cluster_ip, 80),
        ENDPOINTS,
    );
    assert_eq!(counts.get("ep1"), Some(&ENDPOINTS), "{counts:?}");
    // The node's connection tracking holds an entry for each connection
    // the relay opened to an endpoint: the kernel's record of every
    // endpoint address it dialed.
    let wanted: BTreeSet<IpAddr> = endpoints.iter().copied().collect();
    let dialed: BTreeSet<IpAddr> = tracked_destinations(topology.node(), family, POD_TCP_PORT)
        .into_iter()
        .filter(|ip| wanted.contains(ip))
        .collect();
    assert_eq!(
        dialed.len(),
        ENDPOINTS,
        "every endpoint was used; missing: {:?}",
        wanted.difference(&dialed).take(10).collect::<Vec<_>>()
    );
}

fn a_hundred_external_ips_answer(flavor: IptablesFlavor, family: IpFamily) {
    require(flavor);
    let topology = three_pods();
    let proxy = Proxy::start(&topology, flavor, family);
    let cluster_ip = match family {
        IpFamily::V4 => "10.96.0.40",
        IpFamily::V6 => "fd00:10:96::40",
    };
    let external = |i: usize| match family {
        IpFamily::V4 => format!("203.0.113.{}", 101 + i),
        IpFamily::V6 => format!("2001:db8:203:113::{:x}", 101 + i),
    };
    let ext = service("ns1", "ext", |mut s| {
        s = s
            .ip_families(&[family.as_api_str()])
            .cluster_ip(cluster_ip)
            .port("http", 80, "TCP");
        for i in 0..EXTERNAL_IPS {
            s = s.external_ip(external(i));
        }
        s
    });
    let (web, web_slice) = ordinary(&topology, family);
    proxy.apply(
        &[web, ext],
        &[
            web_slice,
            slice("ext", &[pod_address(&topology, "ep2", family)], &[]),
        ],
    );
    proxy.sync();

    // Each external IP has its rule, from outside and from the node.
    let nat = nat_rules(&topology, flavor, family);
    let wanted: BTreeSet<String> = (0..EXTERNAL_IPS)
        .map(|i| host_net(external(i).parse().unwrap()))
        .chain([host_net(cluster_ip.parse().unwrap())])
        .collect();
    for chain in ["KUBE-PORTALS-CONTAINER", "KUBE-PORTALS-HOST"] {
        let rules = portal_rules(&nat, chain, "ns1/ext:http");
        let destinations: BTreeSet<String> = rules
            .iter()
            .filter_map(|rule| option_value(rule, "-d"))
            .collect();
        assert_eq!(rules.len(), EXTERNAL_IPS + 1, "{chain}: {rules:#?}");
        assert_eq!(destinations, wanted, "{chain}");
    }
    for i in [0, EXTERNAL_IPS / 2, EXTERNAL_IPS - 1] {
        let addr = at(&external(i), 80);
        let reply = connect(topology.client(), addr);
        assert_eq!(reply.unwrap().backend, "ep2", "external IP {addr}");
    }
    assert_ordinary_answers(&topology, family);
}

fn two_hundred_ports_answer(flavor: IptablesFlavor, family: IpFamily) {
    require(flavor);
    let topology = three_pods();
    let proxy = Proxy::start(&topology, flavor, family);
    let cluster_ip = match family {
        IpFamily::V4 => "10.96.0.50",
        IpFamily::V6 => "fd00:10:96::50",
    };
    let port_of = |i: usize| 10_001 + u16::try_from(i).unwrap();
    let ports = service("ns1", "ports", |mut s| {
        s = s.ip_families(&[family.as_api_str()]).cluster_ip(cluster_ip);
        for i in 0..PORTS {
            let port = port_of(i);
            s = s
                .port(&format!("p{port}"), i32::from(port), "TCP")
                .target_port(i32::from(POD_TCP_PORT));
        }
        s
    });
    let ep2 = pod_address(&topology, "ep2", family);
    let ports_slice = endpoint_slice("ns1", "ports-1", "ports", |mut s| {
        s = s.address_type(family.as_api_str());
        for i in 0..PORTS {
            s = s.port(&format!("p{}", port_of(i)), i32::from(POD_TCP_PORT), "TCP");
        }
        s.endpoint(ep2, |e| e.ready(true).node(NODE_NAME))
    });
    let (web, web_slice) = ordinary(&topology, family);
    proxy.apply(&[web, ports], &[web_slice, ports_slice]);
    proxy.sync();

    // Each port has its rule, redirecting to a listener of its own.
    let nat = nat_rules(&topology, flavor, family);
    let rules: Vec<&str> = nat
        .lines()
        .filter(|line| line.starts_with("-A KUBE-PORTALS-CONTAINER "))
        .filter(|line| line.contains(&format!("-d {}", host_net(cluster_ip.parse().unwrap()))))
        .collect();
    let service_ports: BTreeSet<u16> = rules
        .iter()
        .filter_map(|rule| option_value(rule, "--dport"))
        .map(|port| port.parse().unwrap())
        .collect();
    let listeners: BTreeSet<String> = rules
        .iter()
        .filter_map(|rule| option_value(rule, "--to-ports"))
        .collect();
    assert_eq!(rules.len(), PORTS, "{rules:#?}");
    assert_eq!(service_ports, (0..PORTS).map(port_of).collect());
    assert_eq!(listeners.len(), PORTS, "one listener per port: {rules:#?}");
    for i in [0, PORTS / 2, PORTS - 1] {
        let addr = at(cluster_ip, port_of(i));
        let reply = connect(cluster_client(&topology, family), addr);
        assert_eq!(reply.unwrap().backend, "ep2", "port {addr}");
    }
    assert_ordinary_answers(&topology, family);
}

/// `ns1/web`, the ordinary Service: a ClusterIP of `family` → ep1.
fn ordinary(topology: &Topology, family: IpFamily) -> (Service, EndpointSlice) {
    let cluster_ip = match family {
        IpFamily::V4 => "10.96.0.10",
        IpFamily::V6 => "fd00:10:96::10",
    };
    (
        service("ns1", "web", |s| {
            s.ip_families(&[family.as_api_str()])
                .cluster_ip(cluster_ip)
                .port("http", 80, "TCP")
        }),
        slice("web", &[pod_address(topology, "ep1", family)], &[]),
    )
}

/// The ordinary Service answers from ep1.
#[track_caller]
fn assert_ordinary_answers(topology: &Topology, family: IpFamily) {
    let addr = match family {
        IpFamily::V4 => at("10.96.0.10", 80),
        IpFamily::V6 => at("fd00:10:96::10", 80),
    };
    let reply = connect(cluster_client(topology, family), addr)
        .unwrap_or_else(|e| panic!("the ordinary Service {addr} does not answer: {e:?}"));
    assert_eq!(reply.backend, "ep1", "the ordinary Service answers");
}

/// Asserts that a TCP connection from `from` to `addr` is reset before any
/// answer: what the relay does to a client it does not allow (it accepts
/// and resets at once, so the reset can beat the end of `connect`).
#[track_caller]
fn assert_reset(from: &Netns, addr: SocketAddr) {
    match connect(from, addr) {
        Err(ProbeError::Connect { source, .. } | ProbeError::Io { source, .. })
            if source.kind() == ErrorKind::ConnectionReset => {}
        other => panic!(
            "expected {addr} to reset the connection from {}, got {other:?}",
            from.name()
        ),
    }
}

/// The nat table of `family`, read back from the node's kernel with
/// `flavor`'s save program.
fn nat_rules(topology: &Topology, flavor: IptablesFlavor, family: IpFamily) -> String {
    topology
        .node()
        .exec_ok(&flavor.program(family, Tool::Save), &["-t", "nat"])
}

/// The rules of `chain` in `nat` whose comment is `comment`.
fn portal_rules<'a>(nat: &'a str, chain: &str, comment: &str) -> Vec<&'a str> {
    let head = format!("-A {chain} ");
    let comment = format!("--comment \"{comment}\"");
    nat.lines()
        .filter(|line| line.starts_with(&head) && line.contains(&comment))
        .collect()
}

/// The word after `option` in `rule`.
fn option_value(rule: &str, option: &str) -> Option<String> {
    let mut words = rule.split_whitespace();
    words.find(|word| *word == option)?;
    words.next().map(str::to_owned)
}

/// `ip` as `iptables-save` writes a single address.
fn host_net(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(ip) => format!("{ip}/32"),
        IpAddr::V6(ip) => format!("{ip}/128"),
    }
}

/// The original destinations of the TCP connections of `family` to `port`
/// that the conntrack table of `netns` holds.
fn tracked_destinations(netns: &Netns, family: IpFamily, port: u16) -> Vec<IpAddr> {
    let family = match family {
        IpFamily::V4 => "ipv4",
        IpFamily::V6 => "ipv6",
    };
    let port = port.to_string();
    let out = netns.exec_ok(
        "conntrack",
        &["-L", "-f", family, "-p", "tcp", "--dport", &port],
    );
    out.lines()
        .filter_map(|line| {
            // The first `dst=` is the original direction's.
            let dst = line
                .split_whitespace()
                .find_map(|word| word.strip_prefix("dst="))?;
            dst.parse().ok()
        })
        .collect()
}

/// The address of `pod` in `family`.
fn pod_address(topology: &Topology, pod: &str, family: IpFamily) -> IpAddr {
    match family {
        IpFamily::V4 => pod_ip(topology, pod),
        IpFamily::V6 => pod_ip_v6(topology, pod),
    }
}

/// The node's address in `family`.
fn node_ip(family: IpFamily) -> IpAddr {
    match family {
        IpFamily::V4 => IpAddr::V4(plan::NODE_IP),
        IpFamily::V6 => IpAddr::V6(plan::NODE_IP_V6),
    }
}

/// Where a ClusterIP of `family` is reached from: the client for IPv4, pod
/// ep2 for IPv6.
fn cluster_client(topology: &Topology, family: IpFamily) -> &Netns {
    match family {
        IpFamily::V4 => topology.client().netns(),
        IpFamily::V6 => topology.pod("ep2").netns(),
    }
}
