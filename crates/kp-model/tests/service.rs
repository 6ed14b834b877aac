//! Turning Services into service ports.
//!
//! Address plan: ClusterIPs 10.96.0.0/16 and fd00:10:96::/112, external and
//! load balancer IPs 203.0.113.0/24 and fd00:203::/64, clients 192.168.99.0/24.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kp_model::{
    service_ports_from_service, IpFamily, NamespacedName, Protocol, ServiceError, ServicePort,
    ServicePortName, TrafficDistribution,
};
use kp_testkit::builders::{service, ServiceBuilder};
use pretty_assertions::assert_eq;

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

#[track_caller]
fn only_port(svc: &Service, family: IpFamily) -> (ServicePortName, ServicePort) {
    let mut ports = service_ports_from_service(svc, family).unwrap();
    assert_eq!(ports.len(), 1, "expected exactly one service port");
    ports.remove(0)
}

#[track_caller]
fn ignored(build: impl FnOnce(ServiceBuilder) -> ServiceBuilder) {
    let svc = service("ns1", "svc1", build);
    assert_eq!(
        service_ports_from_service(&svc, IpFamily::V4).unwrap(),
        vec![]
    );
}

#[track_caller]
fn error_of(build: impl FnOnce(ServiceBuilder) -> ServiceBuilder) -> String {
    let svc = service("ns1", "svc1", build);
    service_ports_from_service(&svc, IpFamily::V4)
        .unwrap_err()
        .to_string()
}

#[test]
fn a_load_balancer_service_carries_every_field_into_its_port() {
    let svc = service("ns1", "svc1", |s| {
        s.service_type("LoadBalancer")
            .cluster_ip("10.96.0.41")
            .port("p80", 80, "TCP")
            .node_port(30080)
            .external_ip("203.0.113.5")
            .lb_ingress_ip("203.0.113.9")
            .lb_source_range("192.168.99.10/32")
            .session_affinity_client_ip(600)
            .external_traffic_policy_local()
            .health_check_node_port(30500)
            .internal_traffic_policy_local()
            .traffic_distribution("PreferClose")
            .annotation("service.kubernetes.io/topology-mode", "Auto")
    });

    let (name, port) = only_port(&svc, IpFamily::V4);

    assert_eq!(
        name,
        ServicePortName::new(NamespacedName::new("ns1", "svc1"), "p80", Protocol::Tcp)
    );
    assert_eq!(name.to_string(), "ns1/svc1:p80");
    assert_eq!(
        port,
        ServicePort {
            cluster_ip: ip("10.96.0.41"),
            port: 80,
            protocol: Protocol::Tcp,
            node_port: Some(30080),
            external_ips: vec![ip("203.0.113.5")],
            load_balancer_ips: vec![ip("203.0.113.9")],
            load_balancer_source_ranges: vec!["192.168.99.10/32".parse().unwrap()],
            session_affinity_timeout: Some(Duration::from_secs(600)),
            external_policy_local: true,
            internal_policy_local: true,
            health_check_node_port: Some(30500),
            traffic_distribution: Some(TrafficDistribution::PreferClose),
            topology_mode: Some("Auto".to_owned()),
        }
    );
    assert_eq!(port.to_string(), "10.96.0.41:80/TCP");
}

#[test]
fn a_plain_cluster_ip_service_has_defaults_everywhere() {
    let svc = service("ns1", "svc1", |s| {
        s.cluster_ip("10.96.0.41").port("", 53, "")
    });

    let (name, port) = only_port(&svc, IpFamily::V4);

    assert_eq!(name.to_string(), "ns1/svc1");
    assert_eq!(name.protocol, Protocol::Tcp);
    assert_eq!(port.node_port, None);
    assert!(port.external_ips.is_empty() && port.load_balancer_ips.is_empty());
    assert_eq!(port.session_affinity_timeout, None);
    assert!(!port.external_policy_local && !port.internal_policy_local);
    assert_eq!(port.health_check_node_port, None);
    assert_eq!(port.traffic_distribution, None);
    assert_eq!(port.topology_mode, None);
    assert!(!port.externally_accessible());
}

#[test]
fn every_port_becomes_a_service_port_with_its_protocol() {
    let svc = service("ns1", "dns", |s| {
        s.cluster_ip("10.96.0.10")
            .port("dns", 53, "UDP")
            .port("dns-tcp", 53, "TCP")
            .port("sctp", 9999, "SCTP")
    });

    let ports = service_ports_from_service(&svc, IpFamily::V4).unwrap();

    let summary: Vec<(String, Protocol, u16)> = ports
        .iter()
        .map(|(name, port)| (name.to_string(), name.protocol, port.port))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("ns1/dns:dns".to_owned(), Protocol::Udp, 53),
            ("ns1/dns:dns-tcp".to_owned(), Protocol::Tcp, 53),
            ("ns1/dns:sctp".to_owned(), Protocol::Sctp, 9999),
        ]
    );
    assert_eq!(Protocol::Udp.to_string(), "udp");
}

#[test]
fn client_ip_affinity_without_a_timeout_lasts_three_hours() {
    let svc = service("ns1", "svc1", |s| {
        s.cluster_ip("10.96.0.41")
            .port("p80", 80, "TCP")
            .session_affinity_client_ip_default()
    });
    let (_, port) = only_port(&svc, IpFamily::V4);
    assert_eq!(
        port.session_affinity_timeout,
        Some(Duration::from_secs(10_800))
    );
}

#[test]
fn the_health_check_node_port_only_counts_for_local_load_balancers() {
    let local_lb = service("ns1", "svc1", |s| {
        s.service_type("LoadBalancer")
            .cluster_ip("10.96.0.41")
            .port("p80", 80, "TCP")
            .external_traffic_policy_local()
            .health_check_node_port(30500)
    });
    let cluster_lb = service("ns1", "svc1", |s| {
        s.service_type("LoadBalancer")
            .cluster_ip("10.96.0.41")
            .port("p80", 80, "TCP")
            .health_check_node_port(30500)
    });
    let local_node_port = service("ns1", "svc1", |s| {
        s.service_type("NodePort")
            .cluster_ip("10.96.0.41")
            .port("p80", 80, "TCP")
            .external_traffic_policy_local()
            .health_check_node_port(30500)
    });

    assert_eq!(
        only_port(&local_lb, IpFamily::V4).1.health_check_node_port,
        Some(30500)
    );
    assert_eq!(
        only_port(&cluster_lb, IpFamily::V4)
            .1
            .health_check_node_port,
        None
    );
    assert_eq!(
        only_port(&local_node_port, IpFamily::V4)
            .1
            .health_check_node_port,
        None
    );
    assert!(
        only_port(&local_node_port, IpFamily::V4)
            .1
            .external_policy_local
    );
}

#[test]
fn external_traffic_policy_local_needs_an_externally_reachable_type() {
    let svc = service("ns1", "svc1", |s| {
        s.cluster_ip("10.96.0.41")
            .port("p80", 80, "TCP")
            .external_traffic_policy_local()
    });
    assert!(!only_port(&svc, IpFamily::V4).1.external_policy_local);
}

#[test]
fn the_older_topology_annotation_wins_over_the_newer_one() {
    let svc = service("ns1", "svc1", |s| {
        s.cluster_ip("10.96.0.41")
            .port("p80", 80, "TCP")
            .annotation("service.kubernetes.io/topology-mode", "Auto")
            .annotation("service.kubernetes.io/topology-aware-hints", "Disabled")
    });
    assert_eq!(
        only_port(&svc, IpFamily::V4).1.topology_mode.as_deref(),
        Some("Disabled")
    );
}

#[test]
fn unknown_traffic_distribution_is_kept_as_other() {
    let svc = service("ns1", "svc1", |s| {
        s.cluster_ip("10.96.0.41")
            .port("p80", 80, "TCP")
            .traffic_distribution("PreferFarAway")
    });
    assert_eq!(
        only_port(&svc, IpFamily::V4).1.traffic_distribution,
        Some(TrafficDistribution::Other("PreferFarAway".to_owned()))
    );
}

#[test]
fn services_the_proxy_does_not_handle_have_no_ports() {
    ignored(|s| s.headless().port("p80", 80, "TCP"));
    ignored(|s| s.port("p80", 80, "TCP"));
    ignored(|s| {
        s.cluster_ip("10.96.0.41")
            .external_name("db.example.com")
            .port("p80", 80, "TCP")
    });
    ignored(|s| {
        s.cluster_ip("10.96.0.41")
            .port("p80", 80, "TCP")
            .label("service.kubernetes.io/service-proxy-name", "other-proxy")
    });
    ignored(|s| {
        s.cluster_ip("10.96.0.41")
            .port("p80", 80, "TCP")
            .label("service.kubernetes.io/headless", "")
    });
    ignored(|s| s.cluster_ip("fd00:10:96::41").port("p80", 80, "TCP"));
}

#[test]
fn an_ignored_service_is_not_checked_for_errors() {
    ignored(|s| s.headless().port("p80", 0, "QUIC"));
}

#[test]
fn a_dual_stack_service_gives_each_family_its_own_addresses() {
    let svc = service("ns1", "svc1", |s| {
        s.service_type("LoadBalancer")
            .cluster_ips(&["fd00:10:96::41", "10.96.0.41"])
            .ip_families(&["IPv6", "IPv4"])
            .port("p80", 80, "TCP")
            .external_ip("203.0.113.5")
            .external_ip("fd00:203::5")
            .lb_ingress_ip("fd00:203::9")
            .lb_ingress_ip("203.0.113.9")
            .lb_source_range("192.168.99.0/24")
            .lb_source_range("fd00:192:168:99::/64")
    });

    let (_, v4) = only_port(&svc, IpFamily::V4);
    let (_, v6) = only_port(&svc, IpFamily::V6);

    assert_eq!(v4.cluster_ip, ip("10.96.0.41"));
    assert_eq!(v4.external_ips, vec![ip("203.0.113.5")]);
    assert_eq!(v4.load_balancer_ips, vec![ip("203.0.113.9")]);
    assert_eq!(
        v4.load_balancer_source_ranges,
        vec!["192.168.99.0/24".parse().unwrap()]
    );
    assert_eq!(v6.cluster_ip, ip("fd00:10:96::41"));
    assert_eq!(v6.external_ips, vec![ip("fd00:203::5")]);
    assert_eq!(v6.load_balancer_ips, vec![ip("fd00:203::9")]);
    assert_eq!(
        v6.load_balancer_source_ranges,
        vec!["fd00:192:168:99::/64".parse().unwrap()]
    );
}

#[test]
fn a_service_with_only_the_old_cluster_ip_field_still_works() {
    let svc = service("ns1", "svc1", |s| {
        s.cluster_ip_only("10.96.0.41").port("p80", 80, "TCP")
    });
    assert_eq!(only_port(&svc, IpFamily::V4).1.cluster_ip, ip("10.96.0.41"));
    assert_eq!(
        service_ports_from_service(&svc, IpFamily::V6).unwrap(),
        vec![]
    );
}

#[test]
fn load_balancer_ips_in_proxy_mode_are_left_to_the_load_balancer() {
    let svc = service("ns1", "svc1", |s| {
        s.service_type("LoadBalancer")
            .cluster_ip("10.96.0.41")
            .port("p80", 80, "TCP")
            .lb_ingress_ip_mode("203.0.113.9", "Proxy")
            .lb_ingress_ip_mode("203.0.113.10", "VIP")
            .lb_ingress_hostname("lb.example.com")
    });
    assert_eq!(
        only_port(&svc, IpFamily::V4).1.load_balancer_ips,
        vec![ip("203.0.113.10")]
    );
}

#[test]
fn source_ranges_tolerate_padding_and_host_bits() {
    let svc = service("ns1", "svc1", |s| {
        s.cluster_ip("10.96.0.41")
            .port("p80", 80, "TCP")
            .lb_source_range(" 192.168.99.10/24 ")
    });
    assert_eq!(
        only_port(&svc, IpFamily::V4).1.load_balancer_source_ranges,
        vec!["192.168.99.0/24".parse().unwrap()]
    );
}

#[test]
fn invalid_values_are_errors_that_name_the_service_field_and_what_is_valid() {
    let base = |s: ServiceBuilder| s.cluster_ip("10.96.0.41");
    assert_eq!(
        error_of(|s| base(s).port("p80", 0, "TCP")),
        "service ns1/svc1: field spec.ports[0].port: invalid value \"0\": must be between 1 and 65535"
    );
    assert_eq!(
        error_of(|s| base(s).port("a", 80, "TCP").port("b", 65536, "TCP")),
        "service ns1/svc1: field spec.ports[1].port: invalid value \"65536\": must be between 1 and 65535"
    );
    assert_eq!(
        error_of(|s| base(s).port("p80", 80, "TCP").node_port(70000)),
        "service ns1/svc1: field spec.ports[0].nodePort: invalid value \"70000\": must be between 1 and 65535"
    );
    assert_eq!(
        error_of(|s| base(s).port("p80", 80, "tcp")),
        "service ns1/svc1: field spec.ports[0].protocol: invalid value \"tcp\": must be one of TCP, UDP, SCTP"
    );
    assert_eq!(
        error_of(|s| s.cluster_ip("10.96.0.400").port("p80", 80, "TCP")),
        "service ns1/svc1: field spec.clusterIPs[0]: invalid value \"10.96.0.400\": must be an IPv4 or IPv6 address"
    );
    assert_eq!(
        error_of(|s| base(s).port("p80", 80, "TCP").external_ip("example.com")),
        "service ns1/svc1: field spec.externalIPs[0]: invalid value \"example.com\": must be an IPv4 or IPv6 address"
    );
    assert_eq!(
        error_of(|s| base(s).port("p80", 80, "TCP").lb_ingress_ip("203.0.113")),
        "service ns1/svc1: field status.loadBalancer.ingress[0].ip: invalid value \"203.0.113\": must be an IPv4 or IPv6 address"
    );
    assert_eq!(
        error_of(|s| base(s).port("p80", 80, "TCP").lb_source_range("192.168.99.10")),
        "service ns1/svc1: field spec.loadBalancerSourceRanges[0]: invalid value \"192.168.99.10\": must be a CIDR such as 192.168.0.0/16 or fd00::/64"
    );
    assert_eq!(
        error_of(|s| base(s).port("p80", 80, "TCP").session_affinity_client_ip(0)),
        "service ns1/svc1: field spec.sessionAffinityConfig.clientIP.timeoutSeconds: invalid value \"0\": must be between 1 and 86400"
    );
    assert_eq!(
        error_of(|s| {
            base(s)
                .service_type("LoadBalancer")
                .port("p80", 80, "TCP")
                .external_traffic_policy_local()
                .health_check_node_port(-1)
        }),
        "service ns1/svc1: field spec.healthCheckNodePort: invalid value \"-1\": must be between 1 and 65535"
    );
}

#[test]
fn a_service_error_can_be_matched_on() {
    let svc = service("ns1", "svc1", |s| {
        s.cluster_ip("10.96.0.41").port("p80", 0, "TCP")
    });
    let error = service_ports_from_service(&svc, IpFamily::V4).unwrap_err();
    let ServiceError::InvalidField { field, value, .. } = error;
    assert_eq!(
        (field.as_str(), value.as_str()),
        ("spec.ports[0].port", "0")
    );
}
