//! Every field of a defaulted configuration carries upstream's default.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use kp_config::*;
use pretty_assertions::assert_eq;

fn d(text: &str) -> GoDuration {
    GoDuration::parse(text).unwrap()
}

#[test]
fn type_meta_and_top_level_fields() {
    let c = KubeProxyConfiguration::defaulted();
    assert_eq!(c.api_version, "kubeproxy.config.k8s.io/v1alpha1");
    assert_eq!(c.kind, "KubeProxyConfiguration");
    assert_eq!(c.feature_gates, BTreeMap::new());
    assert_eq!(c.hostname_override, "");
    assert_eq!(c.bind_address, "0.0.0.0");
    assert_eq!(c.healthz_bind_address, "0.0.0.0:10256");
    assert_eq!(c.metrics_bind_address, "127.0.0.1:10249");
    assert!(!c.bind_address_hard_fail);
    assert!(!c.enable_profiling);
    assert_eq!(c.show_hidden_metrics_for_version, "");
    assert_eq!(c.mode, "");
    assert_eq!(c.detect_local_mode, "");
    assert_eq!(c.cluster_cidr, "");
    assert_eq!(c.node_port_addresses, None);
    assert_eq!(c.oom_score_adj, Some(-999));
    assert_eq!(c.config_sync_period, d("15m"));
    assert_eq!(c.port_range, "");
    assert_eq!(c.udp_idle_timeout, d("250ms"));
    assert!(!c.windows_run_as_service);
}

#[test]
fn client_connection() {
    let c = KubeProxyConfiguration::defaulted().client_connection;
    assert_eq!(c.kubeconfig, "");
    assert_eq!(c.accept_content_types, "");
    assert_eq!(c.content_type, "application/vnd.kubernetes.protobuf");
    assert_eq!(c.qps, 5.0);
    assert_eq!(c.burst, 10);
}

#[test]
fn logging() {
    let l = KubeProxyConfiguration::defaulted().logging;
    assert_eq!(l.format, "text");
    assert_eq!(
        l.flush_frequency,
        FlushFrequency {
            duration: d("5s"),
            serialize_as_string: true
        }
    );
    assert_eq!(l.verbosity, 0);
    assert!(l.vmodule.is_empty());
    for options in [&l.options.text, &l.options.json] {
        assert!(!options.split_stream);
        assert_eq!(options.info_buffer_size, Quantity("0".into()));
    }
}

#[test]
fn iptables_ipvs_and_nftables() {
    let c = KubeProxyConfiguration::defaulted();
    let ipt = &c.iptables;
    assert_eq!(ipt.masquerade_bit, Some(14));
    assert!(!ipt.masquerade_all);
    assert_eq!(ipt.localhost_node_ports, Some(true));
    assert_eq!(ipt.snat_node_internal_ip, None);
    assert_eq!(ipt.sync_period, d("30s"));
    assert_eq!(ipt.min_sync_period, d("1s"));

    let ipvs = &c.ipvs;
    assert_eq!(ipvs.sync_period, d("30s"));
    assert_eq!(ipvs.min_sync_period, GoDuration::ZERO);
    assert_eq!(ipvs.scheduler, "");
    assert_eq!(ipvs.exclude_cidrs, None);
    assert!(!ipvs.strict_arp);
    assert_eq!(ipvs.tcp_timeout, GoDuration::ZERO);
    assert_eq!(ipvs.tcp_fin_timeout, GoDuration::ZERO);
    assert_eq!(ipvs.udp_timeout, GoDuration::ZERO);

    let nft = &c.nftables;
    assert_eq!(nft.masquerade_bit, Some(14));
    assert!(!nft.masquerade_all);
    assert_eq!(nft.sync_period, d("30s"));
    assert_eq!(nft.min_sync_period, d("1s"));
}

#[test]
fn winkernel_detect_local_and_conntrack() {
    let c = KubeProxyConfiguration::defaulted();
    assert_eq!(c.winkernel, KubeProxyWinkernelConfiguration::default());
    assert_eq!(c.winkernel.network_name, "");
    assert_eq!(c.winkernel.source_vip, "");
    assert!(!c.winkernel.enable_dsr);
    assert_eq!(c.winkernel.root_hns_endpoint_name, "");
    assert!(!c.winkernel.forward_health_check_vip);
    assert_eq!(c.detect_local.bridge_interface, "");
    assert_eq!(c.detect_local.interface_name_prefix, "");

    let ct = &c.conntrack;
    assert_eq!(ct.max_per_core, Some(32768));
    assert_eq!(ct.min, Some(131072));
    assert_eq!(ct.tcp_established_timeout, Some(d("24h")));
    assert_eq!(ct.tcp_close_wait_timeout, Some(d("1h")));
    assert!(!ct.tcp_be_liberal);
    assert_eq!(ct.udp_timeout, GoDuration::ZERO);
    assert_eq!(ct.udp_stream_timeout, GoDuration::ZERO);
}

#[test]
fn an_ipv6_bind_address_moves_the_servers_to_ipv6() {
    let mut c = KubeProxyConfiguration {
        bind_address: "fd00:192:168:99::2".into(),
        ..Default::default()
    };
    c.apply_defaults();
    assert_eq!(c.healthz_bind_address, "[::]:10256");
    assert_eq!(c.metrics_bind_address, "[::1]:10249");
}

#[test]
fn bare_server_ips_get_the_default_port() {
    let mut c = KubeProxyConfiguration {
        healthz_bind_address: "192.168.99.2".into(),
        metrics_bind_address: "fd00::2".into(),
        ..Default::default()
    };
    c.apply_defaults();
    assert_eq!(c.healthz_bind_address, "192.168.99.2:10256");
    assert_eq!(c.metrics_bind_address, "[fd00::2]:10249");
}

#[test]
fn set_values_survive_defaulting_and_defaulting_is_idempotent() {
    let mut c = KubeProxyConfiguration::default();
    c.iptables.masquerade_bit = Some(0);
    c.iptables.localhost_node_ports = Some(false);
    c.conntrack.max_per_core = Some(0);
    c.client_connection.qps = 0.5;
    c.apply_defaults();
    assert_eq!(c.iptables.masquerade_bit, Some(0));
    assert_eq!(c.iptables.localhost_node_ports, Some(false));
    assert_eq!(c.conntrack.max_per_core, Some(0));
    assert_eq!(c.client_connection.qps, 0.5);
    let once = c.clone();
    c.apply_defaults();
    assert_eq!(c, once);
}

#[test]
fn platform_defaults_are_computed_not_stored() {
    let mut c = KubeProxyConfiguration::defaulted();
    assert_eq!(c.effective_mode().unwrap(), ProxyMode::Iptables);
    assert_eq!(
        c.effective_detect_local_mode().unwrap(),
        LocalMode::ClusterCidr
    );
    assert!(c.effective_node_port_addresses().is_empty());
    let periods = c.sync_periods().unwrap();
    assert_eq!(periods.sync_period, std::time::Duration::from_secs(30));
    assert_eq!(periods.min_sync_period, std::time::Duration::from_secs(1));
    assert_eq!(
        c.healthz_socket_addr().unwrap(),
        Some("0.0.0.0:10256".parse().unwrap())
    );
    assert_eq!(
        c.metrics_socket_addr().unwrap(),
        Some("127.0.0.1:10249".parse().unwrap())
    );
    assert_eq!(c.bind_ip().unwrap(), None);

    c.mode = "nftables".into();
    assert_eq!(
        c.effective_node_port_addresses(),
        vec!["primary".to_string()]
    );
    c.mode = "ipvs".into();
    assert_eq!(
        c.sync_periods().unwrap().min_sync_period,
        std::time::Duration::ZERO
    );
}
