//! Validation errors, with their exact messages.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kp_config::*;
use pretty_assertions::assert_eq;

fn valid() -> KubeProxyConfiguration {
    KubeProxyConfiguration::defaulted()
}

/// Validates `cfg` and returns the messages (the configuration must be invalid).
#[track_caller]
fn messages(cfg: &KubeProxyConfiguration) -> Vec<String> {
    validate(cfg)
        .expect_err("configuration should be invalid")
        .messages()
}

#[track_caller]
fn assert_only_error(cfg: KubeProxyConfiguration, expected: &str) {
    assert_eq!(messages(&cfg), vec![expected.to_string()]);
}

fn d(text: &str) -> GoDuration {
    GoDuration::parse(text).unwrap()
}

#[test]
fn defaults_are_valid() {
    validate(&valid()).unwrap();
}

#[test]
fn masquerade_bit_out_of_range() {
    let mut c = valid();
    c.iptables.masquerade_bit = Some(32);
    assert_only_error(
        c,
        "iptables.masqueradeBit: Invalid value: 32: must be within the range [0, 31]",
    );
}

#[test]
fn nftables_masquerade_bit_checked_in_nftables_mode() {
    let mut c = valid();
    c.mode = "nftables".into();
    c.nftables.masquerade_bit = Some(-1);
    assert_only_error(
        c,
        "nftables.masqueradeBit: Invalid value: -1: must be within the range [0, 31]",
    );
}

#[test]
fn sync_period_must_be_positive() {
    let mut c = valid();
    c.iptables.sync_period = d("-1s");
    c.iptables.min_sync_period = d("-2s");
    assert_eq!(
        messages(&c),
        vec![
            "iptables.syncPeriod: Invalid value: \"-1s\": must be greater than 0",
            "iptables.minSyncPeriod: Invalid value: \"-2s\": must be greater than or equal to 0",
        ]
    );
}

#[test]
fn min_sync_period_may_not_exceed_sync_period_of_the_mode_in_use() {
    let mut c = valid();
    c.mode = "ipvs".into();
    c.ipvs.sync_period = d("10s");
    c.ipvs.min_sync_period = d("1m");
    assert_only_error(
        c,
        "ipvs.syncPeriod: Invalid value: \"10s\": must be greater than or equal to ipvs.minSyncPeriod (1m0s)",
    );
}

#[test]
fn unknown_mode_and_windows_mode() {
    let mut c = valid();
    c.mode = "ebpf".into();
    assert_only_error(c, "mode: Invalid value: \"ebpf\": must be iptables, ipvs, nftables, userspace or blank (blank means the best-available proxy [currently iptables])");
    let mut c = valid();
    c.mode = "kernelspace".into();
    assert_only_error(c, "mode: Invalid value: \"kernelspace\": kernelspace is only supported on Windows; on Linux use iptables, ipvs, nftables or userspace");
}

#[test]
fn userspace_mode_is_accepted() {
    let mut c = valid();
    c.mode = "userspace".into();
    validate(&c).unwrap();
    assert_eq!(c.effective_mode().unwrap(), ProxyMode::Userspace);
}

#[test]
fn ipvs_scheduler_timeouts_and_exclude_cidrs() {
    let mut c = valid();
    c.mode = "ipvs".into();
    c.ipvs.scheduler = "fastest".into();
    c.ipvs.tcp_timeout = d("-5s");
    c.ipvs.exclude_cidrs = Some(vec!["10.96.0.0/16".into(), "10.96.0.0".into()]);
    assert_eq!(
        messages(&c),
        vec![
            "ipvs.tcpTimeout: Invalid value: \"-5s\": must be greater than or equal to 0",
            "ipvs.scheduler: Unsupported value: \"fastest\": supported values: \"rr\", \"wrr\", \"lc\", \"wlc\", \"lblc\", \"lblcr\", \"dh\", \"sh\", \"sed\", \"nq\", \"fo\", \"ovf\", \"mh\", \"twos\", \"\"",
            "ipvs.excludeCIDRs[1]: Invalid value: \"10.96.0.0\": must be a valid CIDR",
        ]
    );
}

#[test]
fn conntrack_values_must_not_be_negative() {
    let mut c = valid();
    c.conntrack.max_per_core = Some(-1);
    c.conntrack.udp_stream_timeout = d("-1m");
    assert_eq!(
        messages(&c),
        vec![
            "conntrack.maxPerCore: Invalid value: -1: must be greater than or equal to 0",
            "conntrack.udpStreamTimeout: Invalid value: \"-1m0s\": must be greater than or equal to 0",
        ]
    );
}

#[test]
fn oom_score_adj_range() {
    let mut c = valid();
    c.oom_score_adj = Some(1001);
    assert_only_error(
        c,
        "oomScoreAdj: Invalid value: 1001: must be within the range [-1000, 1000]",
    );
}

#[test]
fn burst_must_not_be_negative() {
    let mut c = valid();
    c.client_connection.burst = -1;
    assert_only_error(
        c,
        "clientConnection.burst: Invalid value: -1: must be greater than or equal to 0",
    );
}

#[test]
fn config_sync_period_must_be_positive() {
    let mut c = valid();
    c.config_sync_period = d("-15m");
    assert_only_error(
        c,
        "configSyncPeriod: Invalid value: \"-15m0s\": must be greater than 0",
    );
}

#[test]
fn udp_idle_timeout_must_be_positive_in_every_mode() {
    let mut c = valid();
    c.udp_idle_timeout = d("-1s");
    assert_only_error(
        c,
        "udpIdleTimeout: Invalid value: \"-1s\": must be greater than 0",
    );
    // Defaulting fills zero; zero set after defaulting is still rejected,
    // and not only in the userspace mode (upstream checked every mode).
    let mut c = valid();
    c.mode = "iptables".into();
    c.udp_idle_timeout = GoDuration::ZERO;
    assert_only_error(
        c,
        "udpIdleTimeout: Invalid value: \"0s\": must be greater than 0",
    );
}

#[test]
fn bind_address_must_be_an_ip() {
    let mut c = valid();
    c.bind_address = "node-1".into();
    assert_only_error(c, "bindAddress: Invalid value: \"node-1\": not a valid textual representation of an IP address");
}

#[test]
fn server_addresses_must_be_ip_and_port() {
    let mut c = valid();
    c.healthz_bind_address = "0.0.0.0".into();
    c.metrics_bind_address = "localhost:0".into();
    assert_eq!(
        messages(&c),
        vec![
            "healthzBindAddress: Invalid value: \"0.0.0.0\": must be IP:port (e.g. 0.0.0.0:10256 or [::]:10256)",
            "metricsBindAddress: Invalid value: \"localhost\": must be a valid IP",
            "metricsBindAddress: Invalid value: \"0\": must be a valid port (1-65535)",
        ]
    );
}

#[test]
fn empty_server_addresses_disable_the_servers() {
    let mut c = valid();
    c.healthz_bind_address.clear();
    c.metrics_bind_address.clear();
    validate(&c).unwrap();
    assert_eq!(c.healthz_socket_addr().unwrap(), None);
}

#[test]
fn port_range_syntax() {
    for ok in ["", "0-0", "300-2000", "300+100", "8080"] {
        let mut c = valid();
        c.port_range = ok.into();
        validate(&c).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
    }
    let mut c = valid();
    c.port_range = "2000-300".into();
    assert_only_error(c, "portRange: Invalid value: \"2000-300\": must be a valid port range (e.g. 300-2000): end port cannot be less than start port");
}

#[test]
fn cluster_cidr_single_or_dual_stack() {
    for ok in ["10.244.0.0/16", "10.244.0.0/16,fd00:10:244::/48"] {
        let mut c = valid();
        c.cluster_cidr = ok.into();
        validate(&c).unwrap();
    }
    let mut c = valid();
    c.cluster_cidr = "10.244.0.0/16,10.245.0.0/16".into();
    assert_only_error(c, "clusterCIDR: Invalid value: [\"10.244.0.0/16\", \"10.245.0.0/16\"]: must be a either a single CIDR or dual-stack pair of CIDRs (e.g. 10.100.0.0/16,fde4:8dba:82e1::/48)");
    let mut c = valid();
    c.cluster_cidr = "10.244.0.0/33".into();
    assert_only_error(c, "clusterCIDR[0]: Invalid value: \"10.244.0.0/33\": must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)");
}

#[test]
fn node_port_addresses_are_cidrs_or_primary_or_all_alone() {
    let mut c = valid();
    c.node_port_addresses = Some(vec!["primary".into()]);
    validate(&c).unwrap();
    c.node_port_addresses = Some(vec!["all".into()]);
    validate(&c).unwrap();
    c.mode = "nftables".into();
    assert!(
        c.effective_node_port_addresses().is_empty(),
        "'all' means every local address, also in nftables mode"
    );
    c.mode = String::new();
    c.node_port_addresses = Some(vec!["all".into(), "10.0.0.0/8".into()]);
    assert_only_error(
        c.clone(),
        "nodePortAddresses[0]: Invalid value: \"all\": can't use both 'all' and other values",
    );
    c.node_port_addresses = Some(vec![
        "192.168.99.0/24".into(),
        "primary".into(),
        "nodes".into(),
    ]);
    assert_eq!(
        messages(&c),
        vec![
            "nodePortAddresses[1]: Invalid value: \"primary\": can't use both 'primary' and other values",
            "nodePortAddresses[2]: Invalid value: \"nodes\": must be a valid CIDR (e.g. 10.0.0.0/8) or the single value 'primary' or 'all'",
        ]
    );
}

#[test]
fn detect_local_mode_values_and_required_fields() {
    let mut c = valid();
    c.detect_local_mode = "PodCIDR".into();
    assert_only_error(c, "detectLocalMode: Unsupported value: \"PodCIDR\": supported values: \"ClusterCIDR\", \"NodeCIDR\", \"BridgeInterface\", \"InterfaceNamePrefix\", \"\"");
    let mut c = valid();
    c.detect_local_mode = "BridgeInterface".into();
    assert_only_error(c, "detectLocal.bridgeInterface: Invalid value: \"\": must not be empty when detectLocalMode is BridgeInterface");
    let mut c = valid();
    c.detect_local_mode = "InterfaceNamePrefix".into();
    c.detect_local.interface_name_prefix = "veth".into();
    validate(&c).unwrap();
}

#[test]
fn logging_format_vmodule_and_alpha_options() {
    let mut c = valid();
    c.logging.format = "xml".into();
    c.logging.vmodule = vec![VModuleItem {
        file_pattern: "a=b".into(),
        verbosity: 2,
    }];
    c.logging.options.json.split_stream = true;
    assert_eq!(
        messages(&c),
        vec![
            "logging.format: Invalid value: \"xml\": Unsupported log format (supported: text, json)",
            "logging.vmodule: Forbidden: Only supported for text log format",
            "logging.vmodule[0].filePattern: Invalid value: \"a=b\": must be a non-empty file name or glob without '=' or ','",
            "logging.options.json.splitStream: Forbidden: Feature LoggingAlphaOptions is disabled",
        ]
    );
    let mut c = valid();
    c.feature_gates.insert("LoggingAlphaOptions".into(), true);
    c.logging.options.json.split_stream = true;
    c.logging.options.json.info_buffer_size = Quantity("64Ki".into());
    validate(&c).unwrap();
}

#[test]
fn show_hidden_metrics_only_for_the_previous_minor() {
    let (major, minor) = KUBERNETES_COMPAT_VERSION;
    let mut c = valid();
    c.show_hidden_metrics_for_version = format!("{major}.{}", minor - 1);
    validate(&c).unwrap();
    c.show_hidden_metrics_for_version = "1.10".into();
    assert_only_error(c, &format!("showHiddenMetricsForVersion: Invalid value: \"1.10\": must be omitted or have the value '{major}.{}'. Only the previous minor version is allowed", minor - 1));
}

#[test]
fn malformed_feature_gate_names_are_errors_and_unknown_ones_warnings() {
    let mut c = valid();
    c.feature_gates.insert("Not A Gate".into(), true);
    c.feature_gates.insert("SomeFutureGate".into(), true);
    assert_only_error(c.clone(), "featureGates[Not A Gate]: Invalid value: \"Not A Gate\": must be a feature gate name (letters and digits, e.g. LoggingAlphaOptions)");
    assert_eq!(
        feature_gate_warnings(&c),
        vec!["feature gate \"SomeFutureGate\" is not a kube-proxy feature gate of Kubernetes v1.34 known to kube-proxy-rs; it has no effect (upstream kube-proxy v1.34 rejects names it does not know)"]
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let mut c = valid();
    c.iptables.masquerade_bit = Some(40);
    c.oom_score_adj = Some(-2000);
    c.bind_address = "x".into();
    c.conntrack.min = Some(-5);
    c.mode = "bpf".into();
    c.logging.format = "yaml".into();
    let fields: Vec<String> = validate(&c)
        .unwrap_err()
        .0
        .into_iter()
        .map(|e| e.field)
        .collect();
    assert_eq!(
        fields,
        vec![
            "iptables.masqueradeBit",
            "mode",
            "conntrack.min",
            "oomScoreAdj",
            "bindAddress",
            "logging.format"
        ]
    );
}
