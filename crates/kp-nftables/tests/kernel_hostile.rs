//! Kernel tests with the largest inputs the API server accepts, in both
//! families, each next to an ordinary Service that must keep working:
//! thousands of `loadBalancerSourceRanges`, a thousand endpoints behind
//! one Service, a hundred external IPs, two hundred ports. After each sync
//! the kernel's state is read back with `nft` and real packets prove it.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web, http 80/TCP | ClusterIP 10.96.0.10, endpoint ep1 (the ordinary Service) |
//! | ns1/web6, http 80/TCP | ClusterIP fd00:10:96::10, endpoint ep1 |
//! | ns1/lb, http 80/TCP | LoadBalancer 203.0.113.10 (2001:db8:203:113::10), many source ranges and client2's address, endpoint ep2 |
//! | ns1/big, http 80/TCP | ClusterIP 10.96.0.20 (fd00:10:96::20), 1,000 endpoints 10.244.8.0 … (fd00:10:244:8::1 …), all answered by ep1 |
//! | ns1/ext, http 80/TCP | ClusterIP 10.96.0.21 (fd00:10:96::21), external IPs 203.0.113.100 … 203.0.113.199 (2001:db8:203:113::64 … ::c7), endpoint ep2 |
//! | ns1/ports, p0 … p199 1000 … 1199/TCP | ClusterIP 10.96.0.22 (fd00:10:96::22), endpoint ep2 |
//! | ns1/many0 … many1499, http 80/TCP | ClusterIPs 10.96.1.0 …, one endpoint each on node-2, 10.244.16.0 … (no host) |
//!
//! Source ranges that are not the clients' come from 100.64.0.0/10 and
//! fc00:aaaa::/32, which nothing in the topology uses; they sort before the
//! clients' addresses, so a set cut short would lose client2's range.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kernel;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use k8s_openapi::api::core::v1::Service;
use kernel::{at, build, pod_ip, pod_ip_v6, require, slice, three_pods, Proxy, POD_TCP_PORT};
use kp_model::IpFamily;
use kp_nftables::Layout;
use kp_testkit::builders::{endpoint_slice, service};
use kp_testkit::netns::{connect, Topology};
use kp_testkit::plan::{self, NODE_NAME};

/// `count` disjoint, non-adjacent source ranges of `family` that hold no
/// address of the topology.
fn foreign_ranges(family: IpFamily, count: u32) -> Vec<String> {
    (0..count)
        .map(|i| match family {
            IpFamily::V4 => format!("100.{}.{}.0/25", 64 + i / 256, i % 256),
            IpFamily::V6 => format!("fc00:aaaa:{:x}::/48", 2 * i),
        })
        .collect()
}

/// `ns1/lb`: a LoadBalancer Service of `family` admitting `ranges` and
/// client2's address.
fn load_balancer(family: IpFamily, ranges: &[String]) -> Service {
    service("ns1", "lb", |s| {
        let mut s = s.service_type("LoadBalancer").port("http", 80, "TCP");
        s = match family {
            IpFamily::V4 => s
                .cluster_ip("10.96.0.16")
                .lb_ingress_ip("203.0.113.10")
                .lb_source_range(format!("{}/32", plan::SECOND_CLIENT_IP)),
            IpFamily::V6 => s
                .ip_families(&["IPv6"])
                .cluster_ip("fd00:10:96::16")
                .lb_ingress_ip("2001:db8:203:113::10")
                .lb_source_range(format!("{}/128", plan::SECOND_CLIENT_IP_V6)),
        };
        for range in ranges {
            s = s.lb_source_range(range);
        }
        s
    })
}

/// `ns1/web` (or `ns1/web6`), ClusterIP → ep1.
fn ordinary(
    topology: &Topology,
    family: IpFamily,
) -> (Service, k8s_openapi::api::discovery::v1::EndpointSlice) {
    match family {
        IpFamily::V4 => (
            service("ns1", "web", |s| {
                s.cluster_ip("10.96.0.10").port("http", 80, "TCP")
            }),
            slice("web", &[pod_ip(topology, "ep1")], &[]),
        ),
        IpFamily::V6 => (
            service("ns1", "web6", |s| {
                s.ip_families(&["IPv6"])
                    .cluster_ip("fd00:10:96::10")
                    .port("http", 80, "TCP")
            }),
            slice("web6", &[pod_ip_v6(topology, "ep1")], &[]),
        ),
    }
}

/// The ordinary Service answers from ep1 (from pod ep2: an IPv6 ClusterIP
/// is not routed from the clients).
#[track_caller]
fn assert_ordinary_answers(topology: &Topology, family: IpFamily) {
    let (from, addr) = match family {
        IpFamily::V4 => (topology.client(), at("10.96.0.10", 80)),
        IpFamily::V6 => (topology.pod("ep2"), at("fd00:10:96::10", 80)),
    };
    let reply = connect(from, addr).unwrap_or_else(|e| panic!("{addr} does not answer: {e:?}"));
    assert_eq!(reply.backend, "ep1");
}

/// The kernel holds this family's table, and `nft` (the Debian program
/// installed here) can list it.
#[track_caller]
fn assert_table_listed(proxy: &Proxy<'_>) -> String {
    let family = match proxy.family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    };
    let out = proxy
        .topology
        .node()
        .exec("nft", &["list", "table", family, "kube-proxy"]);
    assert!(
        out.status.success(),
        "nft list table {family} kube-proxy failed after a sync that reported success: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Source ranges on one LoadBalancer Service, next to an ordinary one:
/// client2 (inside a range) reaches it, client (outside every range) is
/// dropped, and the ordinary Service answers.
fn source_ranges_are_programmed(family: IpFamily, count: u32) {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start(&topology, family);
    let (web, web_slice) = ordinary(&topology, family);
    let lb_endpoint = match family {
        IpFamily::V4 => pod_ip(&topology, "ep2"),
        IpFamily::V6 => pod_ip_v6(&topology, "ep2"),
    };
    proxy.apply(
        &[web, load_balancer(family, &foreign_ranges(family, count))],
        &[web_slice, slice("lb", &[lb_endpoint], &[])],
    );
    proxy.sync();

    let listing = assert_table_listed(&proxy);
    // Only the foreign ranges are written so.
    let foreign = match family {
        IpFamily::V4 => ".0/25",
        IpFamily::V6 => "fc00:aaaa:",
    };
    assert_eq!(
        listing.matches(foreign).count(),
        count as usize,
        "every range is in the kernel"
    );
    assert_ordinary_answers(&topology, family);
    let lb = match family {
        IpFamily::V4 => at("203.0.113.10", 80),
        IpFamily::V6 => at("2001:db8:203:113::10", 80),
    };
    let allowed = connect(topology.client_named("client2"), lb);
    assert_eq!(allowed.unwrap().backend, "ep2", "client2 is inside a range");
    let denied = connect(topology.client_named("client"), lb);
    assert!(
        matches!(&denied, Err(e) if e.is_timeout()),
        "client is outside every range and must be dropped: {denied:?}"
    );
}

#[test]
fn three_thousand_ipv4_source_ranges_leave_every_other_service_working() {
    // The size that made the table silently never appear.
    source_ranges_are_programmed(IpFamily::V4, 3_000);
}

#[test]
fn ten_thousand_ipv4_source_ranges_are_programmed() {
    source_ranges_are_programmed(IpFamily::V4, 10_000);
}

#[test]
fn ten_thousand_ipv6_source_ranges_are_programmed() {
    source_ranges_are_programmed(IpFamily::V6, 10_000);
}

/// The address of `pod` in `family`.
fn pod_address(topology: &Topology, pod: &str, family: IpFamily) -> IpAddr {
    match family {
        IpFamily::V4 => pod_ip(topology, pod),
        IpFamily::V6 => pod_ip_v6(topology, pod),
    }
}

/// Where a ClusterIP of `family` is reached from: the client for IPv4, pod
/// ep2 for IPv6 (an IPv6 ClusterIP is not routed from the clients).
fn cluster_client(topology: &Topology, family: IpFamily) -> &kp_testkit::netns::Netns {
    match family {
        IpFamily::V4 => topology.client(),
        IpFamily::V6 => topology.pod("ep2"),
    }
}

fn a_thousand_endpoints_all_answer(family: IpFamily, layout: Layout) {
    require();
    let topology = build(three_pods());
    // ep1 answers on every address of a range of its own (its echo servers
    // listen on the wildcard address), and the node routes it to ep1.
    let (range, endpoints, cluster_ip): (&str, Vec<IpAddr>, &str) = match family {
        IpFamily::V4 => (
            "10.244.8.0/22",
            (0..1_000u32)
                .map(|i| IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 244, 8, 0)) + i)))
                .collect(),
            "10.96.0.20",
        ),
        IpFamily::V6 => (
            "fd00:10:244:8::/64",
            (1..=1_000u16)
                .map(|i| IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0x244, 8, 0, 0, 0, i)))
                .collect(),
            "fd00:10:96::20",
        ),
    };
    topology.route_range_to_pod("ep1", range).unwrap();
    let proxy = Proxy::start_in(&topology, family, layout);
    let (web, web_slice) = ordinary(&topology, family);
    let families: &[&str] = match family {
        IpFamily::V4 => &["IPv4"],
        IpFamily::V6 => &["IPv6"],
    };
    proxy.apply(
        &[
            web,
            service("ns1", "big", |s| {
                s.ip_families(families)
                    .cluster_ip(cluster_ip)
                    .port("http", 80, "TCP")
            }),
        ],
        &[web_slice, slice("big", &endpoints, &[])],
    );
    proxy.sync();

    let listing = assert_table_listed(&proxy);
    let chains = listing
        .lines()
        .filter(|line| {
            line.trim_start().starts_with("chain endpoint-") && line.contains("ns1/big/")
        })
        .count();
    match layout {
        Layout::Chains => {
            assert_eq!(chains, 1_000, "one chain per endpoint");
            // Endpoint i of n is picked with probability 1/(n-i): 999
            // choices, then the last endpoint.
            assert_eq!(listing.matches("numgen random mod").count(), 999);
        }
        Layout::Data => {
            assert_eq!(chains, 0, "no endpoint chains");
            // One draw over 1,000 slots, each an element of its map.
            assert_eq!(
                listing
                    .matches("numgen random mod 1000 map @service-endpoints-tcp")
                    .count(),
                1
            );
            let values: &[&str] = match family {
                IpFamily::V4 => &[": 10.244.8.", ": 10.244.9.", ": 10.244.10.", ": 10.244.11."],
                IpFamily::V6 => &[": fd00:10:244:8::"],
            };
            let slots: usize = values
                .iter()
                .map(|value| listing.matches(value).count())
                .sum();
            assert_eq!(slots, 1_000, "one element per endpoint");
        }
    }
    assert_ordinary_answers(&topology, family);
    for _ in 0..40 {
        let reply = connect(cluster_client(&topology, family), at(cluster_ip, 80)).unwrap();
        assert_eq!(reply.backend, "ep1");
    }
}

#[test]
fn a_thousand_ipv4_endpoints_behind_one_service_all_answer() {
    a_thousand_endpoints_all_answer(IpFamily::V4, Layout::Chains);
}

#[test]
fn a_thousand_ipv4_endpoints_behind_one_service_all_answer_in_the_data_layout() {
    a_thousand_endpoints_all_answer(IpFamily::V4, Layout::Data);
}

#[test]
fn a_thousand_ipv6_endpoints_behind_one_service_all_answer() {
    a_thousand_endpoints_all_answer(IpFamily::V6, Layout::Chains);
}

#[test]
fn a_thousand_ipv6_endpoints_behind_one_service_all_answer_in_the_data_layout() {
    a_thousand_endpoints_all_answer(IpFamily::V6, Layout::Data);
}

fn a_hundred_external_ips_all_answer(family: IpFamily, layout: Layout) {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start_in(&topology, family, layout);
    let (web, web_slice) = ordinary(&topology, family);
    let external = |i: u16| match family {
        IpFamily::V4 => format!("203.0.113.{i}"),
        IpFamily::V6 => format!("2001:db8:203:113::{i:x}"),
    };
    proxy.apply(
        &[
            web,
            service("ns1", "ext", |s| {
                let mut s = match family {
                    IpFamily::V4 => s.cluster_ip("10.96.0.21"),
                    IpFamily::V6 => s.ip_families(&["IPv6"]).cluster_ip("fd00:10:96::21"),
                }
                .port("http", 80, "TCP");
                for i in 100..200 {
                    s = s.external_ip(external(i));
                }
                s
            }),
        ],
        &[
            web_slice,
            slice("ext", &[pod_address(&topology, "ep2", family)], &[]),
        ],
    );
    proxy.sync();

    let listing = assert_table_listed(&proxy);
    let prefix = match family {
        IpFamily::V4 => "203.0.113.",
        IpFamily::V6 => "2001:db8:203:113::",
    };
    // Each address is an element of `service-ips`; in the data layout
    // also of its count set, its group set and, with its one endpoint, of
    // the slot map.
    let elements_per_address = match layout {
        Layout::Chains => 1,
        Layout::Data => 4,
    };
    assert_eq!(
        listing.matches(prefix).count(),
        100 * elements_per_address,
        "{listing}"
    );
    assert_ordinary_answers(&topology, family);
    for i in [100, 101, 150, 198, 199] {
        let addr = at(&external(i), 80);
        let reply = connect(topology.client(), addr);
        assert_eq!(reply.unwrap().backend, "ep2", "external IP {addr}");
    }
}

#[test]
fn a_hundred_ipv4_external_ips_all_answer() {
    a_hundred_external_ips_all_answer(IpFamily::V4, Layout::Chains);
}

#[test]
fn a_hundred_ipv4_external_ips_all_answer_in_the_data_layout() {
    a_hundred_external_ips_all_answer(IpFamily::V4, Layout::Data);
}

#[test]
fn a_hundred_ipv6_external_ips_all_answer() {
    a_hundred_external_ips_all_answer(IpFamily::V6, Layout::Chains);
}

#[test]
fn a_hundred_ipv6_external_ips_all_answer_in_the_data_layout() {
    a_hundred_external_ips_all_answer(IpFamily::V6, Layout::Data);
}

fn two_hundred_ports_all_answer(family: IpFamily, layout: Layout) {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start_in(&topology, family, layout);
    let (web, web_slice) = ordinary(&topology, family);
    let cluster_ip = match family {
        IpFamily::V4 => "10.96.0.22",
        IpFamily::V6 => "fd00:10:96::22",
    };
    let ports = service("ns1", "ports", |s| {
        let mut s = match family {
            IpFamily::V4 => s.cluster_ip(cluster_ip),
            IpFamily::V6 => s.ip_families(&["IPv6"]).cluster_ip(cluster_ip),
        };
        for i in 0..200 {
            s = s.port(&format!("p{i}"), 1000 + i, "TCP");
        }
        s
    });
    let ep2 = pod_address(&topology, "ep2", family);
    let ports_slice = endpoint_slice("ns1", "ports-1", "ports", |s| {
        let mut s = s.address_type(match family {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        });
        for i in 0..200 {
            s = s.port(&format!("p{i}"), i32::from(POD_TCP_PORT), "TCP");
        }
        s.endpoint(ep2, |e| e.ready(true).node(NODE_NAME))
    });
    proxy.apply(&[web, ports], &[web_slice, ports_slice]);
    proxy.sync();

    let listing = assert_table_listed(&proxy);
    let chains = listing
        .lines()
        .filter(|line| {
            line.trim_start().starts_with("chain service-") && line.contains("ns1/ports/")
        })
        .count();
    assert_eq!(chains, 200, "one service chain per port");
    assert_ordinary_answers(&topology, family);
    // From pod ep1: ep2 is the endpoint, and an IPv6 ClusterIP is not
    // routed from the clients.
    let from = match family {
        IpFamily::V4 => topology.client(),
        IpFamily::V6 => topology.pod("ep1"),
    };
    for port in [1000, 1001, 1100, 1198, 1199] {
        let reply = connect(from, at(cluster_ip, port));
        assert_eq!(reply.unwrap().backend, "ep2", "port {port}");
    }
}

#[test]
fn two_hundred_ipv4_ports_on_one_service_all_answer() {
    two_hundred_ports_all_answer(IpFamily::V4, Layout::Chains);
}

#[test]
fn two_hundred_ipv4_ports_on_one_service_all_answer_in_the_data_layout() {
    two_hundred_ports_all_answer(IpFamily::V4, Layout::Data);
}

#[test]
fn two_hundred_ipv6_ports_on_one_service_all_answer() {
    two_hundred_ports_all_answer(IpFamily::V6, Layout::Chains);
}

#[test]
fn two_hundred_ipv6_ports_on_one_service_all_answer_in_the_data_layout() {
    two_hundred_ports_all_answer(IpFamily::V6, Layout::Data);
}

#[test]
fn a_transaction_of_more_messages_than_are_acknowledged_one_by_one_is_applied() {
    // 1,500 Service ports are some 20,000 messages, in transactions of
    // (at least one) more messages than are acknowledged one by one: only
    // the last message of such a batch asks for an answer (and a refused
    // one is answered anyway).
    require();
    let topology = build(three_pods());
    let mut backend = kernel::netlink_backend_v4();
    let node = kernel::node_v4();
    let mut ports = kernel::web_and_fillers(pod_ip(&topology, "ep1"), 0);
    for n in 0..1_500u32 {
        let (name, state) = kp_sync::testing::service(
            "ns1",
            &format!("many{n}"),
            &format!("10.96.{}.{}", 1 + n / 256, n % 256),
            80,
        )
        .remote_endpoint(
            &format!("10.244.{}.{}", 16 + n / 256, n % 256),
            POD_TCP_PORT,
        )
        .build();
        ports.insert(name, state);
    }
    let outcome = kernel::sync_backend(&topology, &mut backend, IpFamily::V4, &node, &ports, true);
    assert!(outcome.objects_written > 8_192, "{outcome:?}");
    assert_eq!(
        connect(topology.client(), at("10.96.0.10", 80))
            .unwrap()
            .backend,
        "ep1"
    );
}
