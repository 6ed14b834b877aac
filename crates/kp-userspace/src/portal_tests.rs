//! Portal rules: golden text, and what a small tracer over the rendered
//! rules says happens to packets.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web:http TCP | ClusterIP 10.96.0.10:80, listener 40001, endpoints |
//! | ns1/np:http TCP | ClusterIP 10.96.0.11:80, NodePort 30080, externalIP 203.0.113.5, LB 203.0.113.9, listener 40002, endpoints |
//! | ns1/empty:http TCP | ClusterIP 10.96.0.14:80, listener 40003, no endpoints |
//! | ns1/dns:dns UDP | ClusterIP 10.96.0.12:53, listener 40004, no endpoints |
//!
//! Node IP 192.168.99.2; the relay's refusing port is 40099.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;
use std::sync::Arc;

use kp_model::{IpFamily, NamespacedName, Protocol, ServicePort, ServicePortName};
use pretty_assertions::assert_eq;

use super::*;

const REFUSING_PORT: u16 = 40099;

fn service_port(cluster_ip: &str, port: u16, protocol: Protocol) -> ServicePort {
    ServicePort {
        cluster_ip: cluster_ip.parse().unwrap(),
        port,
        protocol,
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

fn portal(
    name: &str,
    port_name: &str,
    port: ServicePort,
    proxy_port: u16,
    has_endpoints: bool,
) -> PortalService {
    PortalService {
        name: ServicePortName::new(NamespacedName::new("ns1", name), port_name, port.protocol),
        port: Arc::new(port),
        proxy_port,
        has_endpoints,
    }
}

fn services() -> Vec<PortalService> {
    let mut np = service_port("10.96.0.11", 80, Protocol::Tcp);
    np.node_port = Some(30080);
    np.external_ips = vec!["203.0.113.5".parse().unwrap()];
    np.load_balancer_ips = vec!["203.0.113.9".parse().unwrap()];
    vec![
        portal(
            "dns",
            "dns",
            service_port("10.96.0.12", 53, Protocol::Udp),
            40004,
            false,
        ),
        portal(
            "empty",
            "http",
            service_port("10.96.0.14", 80, Protocol::Tcp),
            40003,
            false,
        ),
        portal("np", "http", np, 40002, true),
        portal(
            "web",
            "http",
            service_port("10.96.0.10", 80, Protocol::Tcp),
            40001,
            true,
        ),
    ]
}

fn render(services: &[PortalService], with_jumps: bool) -> String {
    let jumps = if with_jumps {
        JumpLines::Insert
    } else {
        JumpLines::Omit
    };
    render_portals(&PortalInput {
        family: IpFamily::V4,
        node_ip: Some("192.168.99.2".parse().unwrap()),
        refusing_port: Some(REFUSING_PORT),
        services,
        jumps,
    })
}

const GOLDEN: &str = r#"*nat
:KUBE-PORTALS-CONTAINER - [0:0]
:KUBE-PORTALS-HOST - [0:0]
:KUBE-NODEPORT-CONTAINER - [0:0]
:KUBE-NODEPORT-HOST - [0:0]
-I PREROUTING -m comment --comment "handle ClusterIPs; NOTE: this must be before the NodePort rules" -j KUBE-PORTALS-CONTAINER
-I OUTPUT -m comment --comment "handle ClusterIPs; NOTE: this must be before the NodePort rules" -j KUBE-PORTALS-HOST
-A PREROUTING -m comment --comment "handle service NodePorts; NOTE: this must be the last rule in the chain" -j KUBE-NODEPORT-CONTAINER
-A OUTPUT -m comment --comment "handle service NodePorts; NOTE: this must be the last rule in the chain" -j KUBE-NODEPORT-HOST
-A KUBE-PORTALS-CONTAINER -m comment --comment "ns1/dns:dns" -p udp -m udp --dport 53 -d 10.96.0.12/32 -j REDIRECT --to-ports 40004
-A KUBE-PORTALS-HOST -m comment --comment "ns1/dns:dns" -p udp -m udp --dport 53 -d 10.96.0.12/32 -j DNAT --to-destination 192.168.99.2:40004
-A KUBE-PORTALS-CONTAINER -m comment --comment "ns1/empty:http" -p tcp -m tcp --dport 80 -d 10.96.0.14/32 -j REDIRECT --to-ports 40099
-A KUBE-PORTALS-HOST -m comment --comment "ns1/empty:http" -p tcp -m tcp --dport 80 -d 10.96.0.14/32 -j DNAT --to-destination 192.168.99.2:40099
-A KUBE-PORTALS-CONTAINER -m comment --comment "ns1/np:http" -p tcp -m tcp --dport 80 -d 10.96.0.11/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST -m comment --comment "ns1/np:http" -p tcp -m tcp --dport 80 -d 10.96.0.11/32 -j DNAT --to-destination 192.168.99.2:40002
-A KUBE-PORTALS-CONTAINER -m comment --comment "ns1/np:http" -p tcp -m tcp --dport 80 -d 203.0.113.5/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST -m comment --comment "ns1/np:http" -p tcp -m tcp --dport 80 -d 203.0.113.5/32 -j DNAT --to-destination 192.168.99.2:40002
-A KUBE-PORTALS-CONTAINER -m comment --comment "ns1/np:http" -p tcp -m tcp --dport 80 -d 203.0.113.9/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST -m comment --comment "ns1/np:http" -p tcp -m tcp --dport 80 -d 203.0.113.9/32 -j DNAT --to-destination 192.168.99.2:40002
-A KUBE-NODEPORT-CONTAINER -m comment --comment "ns1/np:http" -p tcp -m tcp --dport 30080 -m addrtype --dst-type LOCAL -j REDIRECT --to-ports 40002
-A KUBE-NODEPORT-HOST -m comment --comment "ns1/np:http" -p tcp -m tcp --dport 30080 -m addrtype --dst-type LOCAL -j DNAT --to-destination 192.168.99.2:40002
-A KUBE-PORTALS-CONTAINER -m comment --comment "ns1/web:http" -p tcp -m tcp --dport 80 -d 10.96.0.10/32 -j REDIRECT --to-ports 40001
-A KUBE-PORTALS-HOST -m comment --comment "ns1/web:http" -p tcp -m tcp --dport 80 -d 10.96.0.10/32 -j DNAT --to-destination 192.168.99.2:40001
COMMIT
"#;

#[test]
fn golden_first_sync_with_jumps() {
    assert_eq!(render(&services(), true), GOLDEN);
}

#[test]
fn later_syncs_leave_the_jumps_alone_and_differ_only_there() {
    let without: Vec<&str> = GOLDEN
        .lines()
        .filter(|line| {
            !line.starts_with("-I ")
                && !line.starts_with("-A PREROUTING")
                && !line.starts_with("-A OUTPUT")
        })
        .collect();
    assert_eq!(render(&services(), false), without.join("\n") + "\n");
}

#[test]
fn rendering_is_deterministic() {
    assert_eq!(render(&services(), true), render(&services(), true));
}

/// Where a packet of the tracer goes.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Rewritten to this proxy port (REDIRECT) …
    Redirect(u16),
    /// … or to this address and port (DNAT).
    Dnat(String),
    /// No portal rule matched.
    Untouched,
}

/// Follows a packet through the rendered portal chains: `from_host` picks
/// OUTPUT (the node's own traffic) over PREROUTING; `local` says whether
/// the destination is one of the node's addresses.
fn trace(
    text: &str,
    from_host: bool,
    protocol: &str,
    destination: IpAddr,
    port: u16,
    local: bool,
) -> Verdict {
    let chains = if from_host {
        [KUBE_PORTALS_HOST, KUBE_NODEPORT_HOST]
    } else {
        [KUBE_PORTALS_CONTAINER, KUBE_NODEPORT_CONTAINER]
    };
    for chain in chains {
        for line in text
            .lines()
            .filter(|l| l.starts_with(&format!("-A {chain} ")))
        {
            let words: Vec<&str> = line.split_whitespace().collect();
            let value = |flag: &str| words.iter().position(|w| *w == flag).map(|i| words[i + 1]);
            if value("-p") != Some(protocol) || value("--dport") != Some(&port.to_string()) {
                continue;
            }
            if let Some(cidr) = value("-d") {
                if cidr.split('/').next().unwrap().parse::<IpAddr>().unwrap() != destination {
                    continue;
                }
            }
            if value("--dst-type") == Some("LOCAL") && !local {
                continue;
            }
            if let Some(to) = value("--to-ports") {
                return Verdict::Redirect(to.parse().unwrap());
            }
            return Verdict::Dnat(value("--to-destination").unwrap().to_owned());
        }
    }
    Verdict::Untouched
}

#[test]
fn a_pod_reaching_a_cluster_ip_is_redirected_to_the_services_listener() {
    let text = render(&services(), false);
    let web = "10.96.0.10".parse().unwrap();
    assert_eq!(
        trace(&text, false, "tcp", web, 80, false),
        Verdict::Redirect(40001)
    );
    assert_eq!(
        trace(&text, false, "tcp", web, 81, false),
        Verdict::Untouched,
        "another port is not the Service's"
    );
    assert_eq!(
        trace(&text, false, "udp", web, 80, false),
        Verdict::Untouched,
        "another protocol neither"
    );
}

#[test]
fn the_node_reaching_a_cluster_ip_is_sent_to_the_listener_on_the_node_ip() {
    let text = render(&services(), false);
    let web = "10.96.0.10".parse().unwrap();
    assert_eq!(
        trace(&text, true, "tcp", web, 80, false),
        Verdict::Dnat("192.168.99.2:40001".into())
    );
}

#[test]
fn node_ports_external_ips_and_load_balancer_ips_reach_the_same_listener() {
    let text = render(&services(), false);
    let node: IpAddr = "192.168.99.2".parse().unwrap();
    assert_eq!(
        trace(&text, false, "tcp", node, 30080, true),
        Verdict::Redirect(40002)
    );
    assert_eq!(
        trace(&text, true, "tcp", node, 30080, true),
        Verdict::Dnat("192.168.99.2:40002".into())
    );
    let elsewhere: IpAddr = "10.244.1.2".parse().unwrap();
    assert_eq!(
        trace(&text, false, "tcp", elsewhere, 30080, false),
        Verdict::Untouched,
        "a NodePort is only on the node's addresses"
    );
    for ip in ["203.0.113.5", "203.0.113.9"] {
        assert_eq!(
            trace(&text, false, "tcp", ip.parse().unwrap(), 80, false),
            Verdict::Redirect(40002)
        );
    }
}

#[test]
fn a_tcp_service_without_endpoints_goes_to_the_refusing_port_and_udp_to_its_listener() {
    let text = render(&services(), false);
    let empty = "10.96.0.14".parse().unwrap();
    assert_eq!(
        trace(&text, false, "tcp", empty, 80, false),
        Verdict::Redirect(REFUSING_PORT)
    );
    let dns = "10.96.0.12".parse().unwrap();
    assert_eq!(
        trace(&text, false, "udp", dns, 53, false),
        Verdict::Redirect(40004)
    );
}

#[test]
fn ipv6_rules_use_128_bit_prefixes_and_bracketed_dnat_targets() {
    let services = vec![portal(
        "web6",
        "http",
        service_port("fd00:10:96::10", 80, Protocol::Tcp),
        40010,
        true,
    )];
    let text = render_portals(&PortalInput {
        family: IpFamily::V6,
        node_ip: Some("fd00:192:168:99::2".parse().unwrap()),
        refusing_port: None,
        services: &services,
        jumps: JumpLines::Omit,
    });
    assert!(
        text.contains("-d fd00:10:96::10/128 -j REDIRECT --to-ports 40010"),
        "{text}"
    );
    assert!(
        text.contains("-j DNAT --to-destination [fd00:192:168:99::2]:40010"),
        "{text}"
    );
}

#[test]
fn without_a_node_ip_the_host_chains_redirect_too() {
    let services = vec![portal(
        "web",
        "http",
        service_port("10.96.0.10", 80, Protocol::Tcp),
        40001,
        true,
    )];
    let text = render_portals(&PortalInput {
        family: IpFamily::V4,
        node_ip: None,
        refusing_port: None,
        services: &services,
        jumps: JumpLines::Omit,
    });
    let web = "10.96.0.10".parse().unwrap();
    assert_eq!(
        trace(&text, true, "tcp", web, 80, false),
        Verdict::Redirect(40001)
    );
}

#[test]
fn a_hostile_name_cannot_escape_its_comment() {
    let mut service = portal(
        "web",
        "http",
        service_port("10.96.0.10", 80, Protocol::Tcp),
        40001,
        true,
    );
    service.name = ServicePortName::new(
        NamespacedName::new("ns1", "x\" -j ACCEPT\n-A"),
        "p",
        Protocol::Tcp,
    );
    let text = render(&[service], false);
    assert_eq!(text.lines().count(), 8, "no line was added: {text}");
    assert!(!text.contains("-j ACCEPT"), "{text}");
}
