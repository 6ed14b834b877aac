//! Address plan (kp_testkit::plan): pods 10.244.0.0/16 (this node's
//! 10.244.1.0/24), ClusterIPs 10.96.0.0/16, node 192.168.99.2, client
//! 192.168.99.10, external and load balancer IPs 203.0.113.0/24.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use kp_model::{IpFamily, Protocol, ServicePortName};
use kp_sync::ServicePortState;
use pretty_assertions::assert_eq;

use super::*;
use crate::rules::RuleOptions;
use crate::state::{SetEntry, SetKind};
use crate::testing::{ip, service, Ports};
use crate::text::{ipset_text, ipvsadm_text};

pub(crate) fn rule_options() -> RuleOptions {
    RuleOptions {
        masquerade_mark: "0x00004000".into(),
        masquerade_all: false,
        not_local: Some("! -s 10.244.0.0/16".into()),
        random_fully: true,
    }
}

fn plan_of(ports: &BTreeMap<ServicePortName, ServicePortState>, scheduler: &str) -> Plan {
    let node = [ip("192.168.99.2")];
    let options = rule_options();
    let input = PlanInput {
        family: IpFamily::V4,
        scheduler,
        node_addresses: &node,
        node_port_addresses: &node,
        rules: &options,
    };
    plan(&input, ports)
}

fn sock(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

#[test]
fn a_cluster_ip_balances_over_its_endpoints_and_is_bound() {
    let ports = Ports::new()
        .with(
            service("ns1", "svc1", "10.96.0.41", 80)
                .endpoint("10.244.1.2", 8080, true)
                .endpoint("10.244.2.3", 8080, false),
        )
        .build();
    let planned = plan_of(&ports, "rr");
    assert_eq!(
        ipvsadm_text(&planned.state),
        "Prot LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port           Forward Weight\n\
         TCP  10.96.0.41:80 rr\n\
         \x20 -> 10.244.1.2:8080              Masq    1\n\
         \x20 -> 10.244.2.3:8080              Masq    1\n"
    );
    assert!(planned.state.addresses.contains(&ip("10.96.0.41")));
    let members = |kind| {
        planned
            .state
            .entries(kind)
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(members(SetKind::ClusterIp), ["10.96.0.41,tcp:80"]);
    // Only the local endpoint can hairpin.
    assert_eq!(
        members(SetKind::LoopBack),
        ["10.244.1.2,tcp:8080,10.244.1.2"]
    );
    assert_eq!(members(SetKind::IpvsIps), ["10.96.0.41"]);
}

#[test]
fn golden_ipset_and_rules_for_a_cluster_ip() {
    let ports = Ports::new()
        .with(service("ns1", "svc1", "10.96.0.41", 80).endpoint("10.244.1.2", 8080, true))
        .build();
    let planned = plan_of(&ports, "rr");
    let text = ipset_text(&planned.state, IpFamily::V4);
    assert!(text.starts_with("Name: KUBE-LOOP-BACK\nType: hash:ip,port,ip\nMembers:\n10.244.1.2,tcp:8080,10.244.1.2\n\nName: KUBE-CLUSTER-IP\nType: hash:ip,port\nMembers:\n10.96.0.41,tcp:80\n\n"), "{text}");
    assert_eq!(
        planned.iptables,
        include_str!("../tests/golden/cluster_ip.rules")
    );
}

#[test]
fn session_affinity_is_persistence_with_its_timeout() {
    let ports = Ports::new()
        .with(
            service("ns1", "svc1", "10.96.0.41", 80)
                .affinity_secs(600)
                .endpoint("10.244.1.2", 80, false),
        )
        .build();
    let planned = plan_of(&ports, "rr");
    assert!(ipvsadm_text(&planned.state).contains("TCP  10.96.0.41:80 rr persistent 600\n"));
    let planned = plan_of(&ports, "mh");
    let server = &planned.state.services.values().next().unwrap().server;
    assert_eq!(
        server.flags,
        crate::state::FLAG_PERSISTENT | crate::state::FLAG_SOURCE_HASH
    );
    assert!(
        ipvsadm_text(&planned.state).contains("TCP  10.96.0.41:80 mh (mh-port) persistent 600\n")
    );
}

#[test]
fn a_service_without_endpoints_keeps_an_empty_virtual_server() {
    // IPVS answers a virtual server without real servers with ICMP port
    // unreachable: the client is refused, as with upstream.
    let ports = Ports::new()
        .with(service("ns1", "empty", "10.96.0.50", 80))
        .build();
    let planned = plan_of(&ports, "rr");
    let (key, service) = planned.state.services.iter().next().unwrap();
    assert_eq!(key.address, ip("10.96.0.50"));
    assert!(service.reals.is_empty());
}

#[test]
fn node_ports_get_a_virtual_server_per_node_address_and_their_set() {
    let ports = Ports::new()
        .with(
            service("ns1", "np", "10.96.0.42", 80)
                .node_port(30080)
                .endpoint("10.244.2.3", 80, false),
        )
        .with(
            service("ns1", "npu", "10.96.0.43", 53)
                .protocol(Protocol::Udp)
                .node_port(30053)
                .etp_local()
                .health_check_node_port(30999)
                .endpoint("10.244.1.5", 53, true)
                .endpoint("10.244.2.5", 53, false),
        )
        .build();
    let planned = plan_of(&ports, "rr");
    let tcp = &planned.state.services[&ServiceKey {
        address: ip("192.168.99.2"),
        protocol: Protocol::Tcp,
        port: 30080,
    }];
    assert_eq!(
        tcp.reals.keys().copied().collect::<Vec<_>>(),
        [sock("10.244.2.3:80")]
    );
    // externalTrafficPolicy Local: the NodePort only reaches the local endpoint.
    let udp = &planned.state.services[&ServiceKey {
        address: ip("192.168.99.2"),
        protocol: Protocol::Udp,
        port: 30053,
    }];
    assert_eq!(
        udp.reals.keys().copied().collect::<Vec<_>>(),
        [sock("10.244.1.5:53")]
    );
    // The node address is not bound to kube-ipvs0.
    assert!(!planned.state.addresses.contains(&ip("192.168.99.2")));
    let members = |kind| planned.state.entries(kind).copied().collect::<Vec<_>>();
    assert_eq!(members(SetKind::NodePortTcp), [SetEntry::Port(30080)]);
    assert_eq!(members(SetKind::NodePortUdp), [SetEntry::Port(30053)]);
    assert_eq!(members(SetKind::NodePortLocalUdp), [SetEntry::Port(30053)]);
    assert!(planned.iptables.contains("-A KUBE-NODE-PORT -p udp -m comment --comment \"Kubernetes nodeport UDP port with externalTrafficPolicy=local\" -m set --match-set KUBE-NODE-PORT-LOCAL-UDP dst -j RETURN\n-A KUBE-NODE-PORT -p udp"));
}

#[test]
fn load_balancer_source_ranges_fill_the_firewall_sets() {
    let ports = Ports::new()
        .with(
            service("ns1", "lb", "10.96.0.44", 80)
                .lb_ip("203.0.113.7")
                .source_range("192.168.99.0/28")
                .endpoint("10.244.2.3", 80, false),
        )
        .with(
            service("ns1", "lb2", "10.96.0.45", 80)
                .lb_ip("203.0.113.8")
                .source_range("198.51.100.0/24")
                .endpoint("10.244.2.4", 80, false),
        )
        .build();
    let planned = plan_of(&ports, "rr");
    let members = |kind| {
        planned
            .state
            .entries(kind)
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        members(SetKind::LoadBalancer),
        ["203.0.113.7,tcp:80", "203.0.113.8,tcp:80"]
    );
    assert_eq!(
        members(SetKind::LoadBalancerFw),
        ["203.0.113.7,tcp:80", "203.0.113.8,tcp:80"]
    );
    assert_eq!(
        members(SetKind::LoadBalancerSourceCidr),
        [
            "203.0.113.7,tcp:80,192.168.99.0/28",
            "203.0.113.8,tcp:80,198.51.100.0/24"
        ]
    );
    // The node (192.168.99.2) is inside the first range only.
    assert_eq!(
        members(SetKind::LoadBalancerSourceIp),
        ["203.0.113.7,tcp:80,203.0.113.7"]
    );
    assert!(planned.iptables.contains(
        "-A KUBE-IPVS-OUT-FILTER -s 203.0.113.8 -m ipvs --vaddr 203.0.113.8 --vproto tcp --vport 80 -j DROP\n"
    ));
    assert!(!planned.iptables.contains("--vaddr 203.0.113.7"));
    assert!(planned.state.addresses.contains(&ip("203.0.113.7")));
}

#[test]
fn external_ips_on_the_node_are_not_bound_and_local_policy_uses_its_own_set() {
    let ports = Ports::new()
        .with(
            service("ns1", "ext", "10.96.0.46", 80)
                .external_ip("203.0.113.9")
                .external_ip("192.168.99.2")
                .etp_local()
                .health_check_node_port(30999)
                .endpoint("10.244.1.2", 80, true),
        )
        .build();
    let planned = plan_of(&ports, "rr");
    assert!(planned.state.addresses.contains(&ip("203.0.113.9")));
    assert!(!planned.state.addresses.contains(&ip("192.168.99.2")));
    assert!(!planned.state.has_entries(SetKind::ExternalIp));
    assert_eq!(planned.state.entries(SetKind::ExternalIpLocal).count(), 2);
    assert!(planned.iptables.contains(
        "--match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -m addrtype --dst-type LOCAL -j ACCEPT"
    ));
    assert!(!planned
        .iptables
        .contains("--match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -j KUBE-MARK-MASQ"));
}

#[test]
fn internal_traffic_policy_local_narrows_the_cluster_ip_only() {
    let ports = Ports::new()
        .with(
            service("ns1", "itp", "10.96.0.47", 80)
                .itp_local()
                .node_port(30081)
                .endpoint("10.244.1.2", 80, true)
                .endpoint("10.244.2.2", 80, false),
        )
        .build();
    let planned = plan_of(&ports, "rr");
    let reals = |address: &str, port| {
        planned.state.services[&ServiceKey {
            address: ip(address),
            protocol: Protocol::Tcp,
            port,
        }]
            .reals
            .keys()
            .copied()
            .collect::<Vec<_>>()
    };
    assert_eq!(reals("10.96.0.47", 80), [sock("10.244.1.2:80")]);
    assert_eq!(
        reals("192.168.99.2", 30081),
        [sock("10.244.1.2:80"), sock("10.244.2.2:80")]
    );
}

#[test]
fn ipv6_sets_are_named_kube_6_and_fit_the_kernel_limit() {
    for kind in SetKind::ALL {
        let name = kind.name(IpFamily::V6);
        assert!(name.starts_with("KUBE-6-"), "{name}");
        assert!(name.len() <= 31, "{name} is {} characters", name.len());
        assert_eq!(SetKind::from_name(name), Some((kind, IpFamily::V6)));
    }
    let ports = Ports::new()
        .with(service("ns1", "v6", "fd00:10:96::41", 80).endpoint("fd00:10:244:1::2", 80, true))
        .build();
    let node = [ip("fd00:192:168:99::2")];
    let options = RuleOptions {
        not_local: None,
        ..rule_options()
    };
    let input = PlanInput {
        family: IpFamily::V6,
        scheduler: "rr",
        node_addresses: &node,
        node_port_addresses: &node,
        rules: &options,
    };
    let planned = plan(&input, &ports);
    assert!(planned
        .iptables
        .contains("-A KUBE-SERVICES -s ::1/128 -j RETURN"));
    assert!(planned
        .iptables
        .contains("--match-set KUBE-6-CLUSTER-IP src,dst -j KUBE-MARK-MASQ"));
    assert!(ipvsadm_text(&planned.state)
        .contains("TCP  [fd00:10:96::41]:80 rr\n  -> [fd00:10:244:1::2]:80"));
    let _: IpAddr = ip("fd00:10:96::41");
}

/// Every kind of address at once, as `--dry-run` prints it.
#[test]
fn golden_dry_run_of_every_service_kind() {
    let ports = Ports::new()
        .with(
            service("ns1", "np", "10.96.0.42", 80)
                .node_port(30080)
                .external_ip("203.0.113.5")
                .endpoint("10.244.1.2", 8080, true)
                .endpoint("10.244.2.3", 8080, false),
        )
        .with(
            service("ns1", "lb", "10.96.0.44", 443)
                .lb_ip("203.0.113.7")
                .source_range("198.51.100.0/24")
                .etp_local()
                .health_check_node_port(30999)
                .node_port(30443)
                .affinity_secs(600)
                .endpoint("10.244.1.3", 8443, true),
        )
        .with(
            service("ns1", "dns", "10.96.0.10", 53)
                .protocol(Protocol::Udp)
                .endpoint("10.244.2.9", 53, false),
        )
        .build();
    let planned = plan_of(&ports, "rr");
    let text = crate::text::dry_run_text(&planned.state, IpFamily::V4, &planned.iptables);
    assert_eq!(text, include_str!("../tests/golden/every_kind.txt"));
}
