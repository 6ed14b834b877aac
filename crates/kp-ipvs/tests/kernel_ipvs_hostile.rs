//! Kernel test of the IPVS mode with the largest inputs the API server
//! accepts, next to many ordinary Services, in both families: every
//! object reaches the kernel (read back and compared with the plan), and
//! packets prove the source ranges and external IPs. Run in the VM by
//! scripts/ipvs-vm/run (see kernel_ipvs.rs); with `--show-output` after
//! the filter it prints how long each sync took (emulated figures).
//!
//! | object | IPv4 | IPv6 |
//! |---|---|---|
//! | 1,000 ordinary Services × 2 endpoints | 10.96.4.0/22, ep 10.244.2.0/21 | fd00:10:96::1000–13e7, fd00:10:244:2::/64 |
//! | ns1/ranges, LB with 10,000 source ranges | 203.0.113.9, client/32 + 198.18.0.0/15 /32s | 2001:db8:203:113::9, client/128 + 2001:db8:ffff::/112 |
//! | ns1/wide, 1,000 endpoints | 10.96.200.1, ep1 + 999 on node-2 | fd00:10:96::c801 |
//! | ns1/external, 100 external IPs | 203.0.113.100–199 | 2001:db8:203:113::100–163 |
//! | ns1/ports, 200 ports | 10.96.200.3:1000–1199 | fd00:10:96::c803 |
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::Instant;

use kp_iptables::{IptablesFlavor, SystemApplier};
use kp_ipvs::kernel::IpvsKernel;
use kp_ipvs::netlink::NetlinkKernel;
use kp_ipvs::testing::{service, Ports, RequestParts};
use kp_ipvs::{IpvsBackend, IpvsOptions, ServiceKey, SetKind};
use kp_model::{IpFamily, Protocol};
use kp_sync::Backend;
use kp_testkit::netns::{connect, expect_timeout, require_root, require_tool, Topology};

/// Ordinary Services beside the hostile ones, unless
/// `KP_IPVS_TEST_BACKGROUND_SERVICES` says otherwise (10,000 for the
/// figures in docs/BENCHMARKS.md; `scripts/ipvs-vm/run` passes it on).
const BACKGROUND_SERVICES: u32 = 1_000;

fn background_services() -> u32 {
    std::env::var("KP_IPVS_TEST_BACKGROUND_SERVICES")
        .ok()
        .map_or(BACKGROUND_SERVICES, |text| {
            text.parse().unwrap_or_else(|_| {
                panic!("KP_IPVS_TEST_BACKGROUND_SERVICES={text:?} is not a number")
            })
        })
}
const SOURCE_RANGES: u32 = 10_000;
const ENDPOINTS: u32 = 1_000;
const EXTERNAL_IPS: u32 = 100;
const PORTS: u16 = 200;

/// The `n`th address of a family's range: IPv4 `base` + n, IPv6 `base6` + n.
fn nth(family: IpFamily, base: Ipv4Addr, base6: Ipv6Addr, n: u32) -> String {
    match family {
        IpFamily::V4 => Ipv4Addr::from(u32::from(base) + n).to_string(),
        IpFamily::V6 => Ipv6Addr::from(u128::from(base6) + u128::from(n)).to_string(),
    }
}

fn v4(text: &str) -> Ipv4Addr {
    text.parse().unwrap()
}

fn v6(text: &str) -> Ipv6Addr {
    text.parse().unwrap()
}

/// Every Service of the table above for `family`; `ep1` and the clients
/// are the topology's.
fn hostile_ports(family: IpFamily, topology: &Topology) -> Ports {
    let addr = |base: &str, base6: &str, n: u32| nth(family, v4(base), v6(base6), n);
    let (ep1, client, host_bits) = match family {
        IpFamily::V4 => (
            topology.pod("ep1").ip().to_string(),
            topology.client_named("client").ip().to_string(),
            32,
        ),
        IpFamily::V6 => (
            topology.pod("ep1").ip_v6().to_string(),
            topology.client_named("client").ip_v6().to_string(),
            128,
        ),
    };
    let mut ports = Ports::new();
    for n in 0..background_services() {
        ports = ports.with(
            service(
                "bg",
                &format!("svc{n}"),
                &addr("10.96.4.0", "fd00:10:96::1000", n),
                80,
            )
            .endpoint(&addr("10.244.2.0", "fd00:10:244:2::", 2 * n), 8080, false)
            .endpoint(
                &addr("10.244.2.0", "fd00:10:244:2::", 2 * n + 1),
                8080,
                false,
            ),
        );
    }
    let mut ranges = service(
        "ns1",
        "ranges",
        &addr("10.96.200.0", "fd00:10:96::c800", 0),
        80,
    )
    .lb_ip(&addr("203.0.113.9", "2001:db8:203:113::9", 0))
    .source_range(&format!("{client}/{host_bits}"))
    .endpoint(&ep1, 80, true);
    for n in 0..SOURCE_RANGES - 1 {
        let range = addr("198.18.0.0", "2001:db8:ffff::", n);
        ranges = ranges.source_range(&format!("{range}/{host_bits}"));
    }
    let mut wide = service(
        "ns1",
        "wide",
        &addr("10.96.200.1", "fd00:10:96::c801", 0),
        80,
    )
    .endpoint(&ep1, 80, true);
    for n in 0..ENDPOINTS - 1 {
        wide = wide.endpoint(&addr("10.244.8.0", "fd00:10:244:8::", n + 1), 80, false);
    }
    let mut external = service(
        "ns1",
        "external",
        &addr("10.96.200.2", "fd00:10:96::c802", 0),
        80,
    )
    .endpoint(&ep1, 80, true);
    for n in 0..EXTERNAL_IPS {
        external = external.external_ip(&addr("203.0.113.100", "2001:db8:203:113::100", n));
    }
    ports = ports.with(ranges).with(wide).with(external);
    for port in 1000..1000 + PORTS {
        ports = ports.with(
            service(
                "ns1",
                "ports",
                &addr("10.96.200.3", "fd00:10:96::c803", 0),
                port,
            )
            .endpoint(&ep1, 80, true),
        );
    }
    ports
}

fn at(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap(), port)
}

fn check_family(family: IpFamily, topology: &Topology) {
    let node_ip = match family {
        IpFamily::V4 => "192.168.99.2",
        IpFamily::V6 => "fd00:192:168:99::2",
    };
    let parts = RequestParts::new(hostile_ports(family, topology).build(), node_ip);
    let mut backend = IpvsBackend::new(
        family,
        IpvsOptions::default(),
        Box::new(NetlinkKernel::new()),
        Box::new(SystemApplier::new(IptablesFlavor::Legacy)),
    );
    let started = Instant::now();
    let first = topology
        .node()
        .run(|| backend.sync(&parts.request(true)))
        .expect("the first sync programs every Service");
    let first_secs = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let again = topology
        .node()
        .run(|| backend.sync(&parts.request(true)))
        .unwrap();
    let again_secs = started.elapsed().as_secs_f64();
    println!(
        "hostile {family:?}: first sync {first_secs:.2} s ({} objects), full sync with nothing changed {again_secs:.2} s ({} objects)",
        first.objects_written, again.objects_written
    );
    assert_eq!(again.objects_written, 0, "the first sync left nothing out");

    // The kernel holds every object of the plan.
    let listed = topology
        .node()
        .run(|| NetlinkKernel::new().list(family))
        .unwrap();
    assert_eq!(&listed, backend.applied().unwrap());
    let addr = |base: &str, base6: &str, n: u32| -> IpAddr {
        nth(family, v4(base), v6(base6), n).parse().unwrap()
    };
    let key = |address: IpAddr, port: u16| ServiceKey {
        address,
        protocol: Protocol::Tcp,
        port,
    };
    assert_eq!(
        listed.entries(SetKind::LoadBalancerSourceCidr).count(),
        SOURCE_RANGES as usize
    );
    let wide = &listed.services[&key(addr("10.96.200.1", "fd00:10:96::c801", 0), 80)];
    assert_eq!(wide.reals.len(), ENDPOINTS as usize);
    for n in 0..EXTERNAL_IPS {
        let ip = addr("203.0.113.100", "2001:db8:203:113::100", n);
        assert!(listed.addresses.contains(&ip), "{ip} on kube-ipvs0");
        assert!(listed.services.contains_key(&key(ip, 80)));
    }
    let ports = listed
        .services
        .keys()
        .filter(|k| k.address == addr("10.96.200.3", "fd00:10:96::c803", 0))
        .count();
    assert_eq!(ports, usize::from(PORTS));

    // Packets: the allowed client passes the 10,000 ranges, the other one
    // does not; an external IP and a port of the 200 answer.
    let show = |ip: IpAddr| ip.to_string();
    let lb = show(addr("203.0.113.9", "2001:db8:203:113::9", 0));
    let client = topology.client_named("client");
    assert_eq!(connect(client, at(&lb, 80)).unwrap().backend, "ep1");
    expect_timeout(topology.client_named("client2"), at(&lb, 80));
    let external = show(addr("203.0.113.100", "2001:db8:203:113::100", 57));
    assert_eq!(connect(client, at(&external, 80)).unwrap().backend, "ep1");
    let ports_ip = show(addr("10.96.200.3", "fd00:10:96::c803", 0));
    assert_eq!(connect(client, at(&ports_ip, 1199)).unwrap().backend, "ep1");
}

#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_the_largest_inputs_are_programmed_whole_in_both_families_next_to_many_services() {
    require_root();
    assert!(
        Path::new("/proc/net/ip_vs").exists(),
        "this kernel has no IPVS: run scripts/ipvs-vm/run"
    );
    require_tool("iptables-legacy-restore");
    require_tool("ip6tables-legacy-restore");
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(80))
        .client("client")
        .client("client2")
        .build()
        .unwrap();
    let started = Instant::now();
    check_family(IpFamily::V4, &topology);
    check_family(IpFamily::V6, &topology);
    println!(
        "hostile: both families with their checks {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Seven LoadBalancer Services with 10,000 source ranges each: 70,000
/// members for `KUBE-LOAD-BALANCER-SOURCE-CIDR`, whose `maxelem` is
/// 65,536. The kernel refuses the members that do not fit; the sync names
/// the Service(s) they belong to, programs the others whole, and a sync
/// without the named ones leaves nothing of them.
#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_source_ranges_beyond_the_set_limit_fail_the_services_they_belong_to_by_name() {
    use kp_sync::BackendError;
    require_root();
    assert!(
        Path::new("/proc/net/ip_vs").exists(),
        "this kernel has no IPVS: run scripts/ipvs-vm/run"
    );
    require_tool("iptables-legacy-restore");
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(80))
        .client("client")
        .build()
        .unwrap();
    let ep1 = topology.pod("ep1").ip().to_string();
    let client = topology.client().ip().to_string();
    let lb_service = |n: u32| {
        let mut svc = service(
            "ns1",
            &format!("lb{n}"),
            &format!("10.96.201.{}", n + 1),
            80,
        )
        .lb_ip(&format!("203.0.113.{}", 20 + n))
        .source_range(&format!("{client}/32"))
        .endpoint(&ep1, 80, true);
        for r in 0..SOURCE_RANGES - 1 {
            let range = Ipv4Addr::from(u32::from(v4("198.18.0.0")) + r);
            svc = svc.source_range(&format!("{range}/32"));
        }
        svc
    };
    let ports = |skip: &[String]| {
        let mut ports = Ports::new();
        for n in 0..7 {
            if !skip.contains(&format!("ns1/lb{n}")) {
                ports = ports.with(lb_service(n));
            }
        }
        RequestParts::new(ports.build(), "192.168.99.2")
    };
    let mut backend = IpvsBackend::new(
        IpFamily::V4,
        IpvsOptions::default(),
        Box::new(NetlinkKernel::new()),
        Box::new(SystemApplier::new(IptablesFlavor::Legacy)),
    );
    let all = ports(&[]);
    let error = topology
        .node()
        .run(|| backend.sync(&all.request(true)))
        .expect_err("70,000 members do not fit a set of 65,536");
    let BackendError::Rejected { services, .. } = &error else {
        panic!("{error}");
    };
    let named: Vec<String> = services.iter().map(ToString::to_string).collect();
    println!(
        "beyond the set limit: named {named:?}; {}",
        kp_sync::error_chain(&error)
            .chars()
            .take(300)
            .collect::<String>()
    );
    assert!(
        !named.is_empty() && named.len() < 7,
        "the Services whose members did not fit, not all: {named:?}"
    );
    // A Service not named answers its allowed client.
    let fine = (0..7u32)
        .find(|n| !named.contains(&format!("ns1/lb{n}")))
        .unwrap();
    let lb = format!("203.0.113.{}", 20 + fine);
    assert_eq!(
        connect(topology.client(), at(&lb, 80)).unwrap().backend,
        "ep1"
    );

    // Without the named Services the sync succeeds and every member left
    // belongs to a Service that is programmed.
    let rest = ports(&named);
    topology
        .node()
        .run(|| backend.sync(&rest.request(true)))
        .expect("the others fit");
    let listed = topology
        .node()
        .run(|| NetlinkKernel::new().list(IpFamily::V4))
        .unwrap();
    assert_eq!(
        listed.entries(SetKind::LoadBalancerSourceCidr).count(),
        (7 - named.len()) * SOURCE_RANGES as usize
    );
    assert_eq!(&listed, backend.applied().unwrap());
}
