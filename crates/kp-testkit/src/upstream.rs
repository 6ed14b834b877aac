//! Names operators rely on, as upstream kube-proxy spells them, for tests
//! that check ours against them.

/// The metrics upstream kube-proxy exposes in iptables mode
/// (`pkg/proxy/metrics`, the conntrack reconciler and the nfacct
/// counters): histograms by their family name, counters with `_total`.
/// A sample of each starts with its name.
pub const IPTABLES_METRICS: &[&str] = &[
    "kubeproxy_sync_proxy_rules_duration_seconds",
    "kubeproxy_sync_full_proxy_rules_duration_seconds",
    "kubeproxy_sync_partial_proxy_rules_duration_seconds",
    "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
    "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
    "kubeproxy_network_programming_duration_seconds",
    "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
    "kubeproxy_sync_proxy_rules_endpoint_changes_total",
    "kubeproxy_sync_proxy_rules_service_changes_pending",
    "kubeproxy_sync_proxy_rules_service_changes_total",
    "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
    "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
    "kubeproxy_sync_proxy_rules_iptables_total",
    "kubeproxy_sync_proxy_rules_iptables_last",
    "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
    "kubeproxy_proxy_healthz_total",
    "kubeproxy_proxy_livez_total",
    "kubeproxy_conntrack_reconciler_sync_duration_seconds",
    "kubeproxy_conntrack_reconciler_deleted_entries_total",
    "kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
    "kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
];

/// The metrics upstream registers in every mode (`RegisterMetrics` before
/// its switch on the mode).
pub const COMMON_METRICS: &[&str] = &[
    "kubeproxy_sync_proxy_rules_duration_seconds",
    "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
    "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
    "kubeproxy_network_programming_duration_seconds",
    "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
    "kubeproxy_sync_proxy_rules_endpoint_changes_total",
    "kubeproxy_sync_proxy_rules_service_changes_pending",
    "kubeproxy_sync_proxy_rules_service_changes_total",
    "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
    "kubeproxy_proxy_healthz_total",
    "kubeproxy_proxy_livez_total",
];

/// What upstream registers in IPVS mode beyond [`COMMON_METRICS`].
pub const IPVS_METRICS: &[&str] = &["kubeproxy_sync_proxy_rules_iptables_restore_failures_total"];

/// What upstream registers in nftables mode beyond [`COMMON_METRICS`].
pub const NFTABLES_METRICS: &[&str] = &[
    "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
    "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
];

/// What upstream registers only in iptables mode: none of it may show in
/// another mode.
pub const IPTABLES_ONLY_METRICS: &[&str] = &[
    "kubeproxy_sync_full_proxy_rules_duration_seconds",
    "kubeproxy_sync_partial_proxy_rules_duration_seconds",
    "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
    "kubeproxy_sync_proxy_rules_iptables_total",
    "kubeproxy_sync_proxy_rules_iptables_last",
    "kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
];

/// The series the kubernetes-mixin "Proxy" dashboard queries
/// (`dashboards/proxy.libsonnet`), less the Go runtime's `go_goroutines`
/// and Prometheus' own `up`, with their type. A histogram is queried through
/// its `_bucket` and `_count` series.
pub const MIXIN_PROXY_SERIES: &[(&str, &str)] = &[
    ("kubeproxy_sync_proxy_rules_duration_seconds", "histogram"),
    (
        "kubeproxy_network_programming_duration_seconds",
        "histogram",
    ),
    ("rest_client_requests_total", "counter"),
    ("rest_client_request_duration_seconds", "histogram"),
    ("process_resident_memory_bytes", "gauge"),
    ("process_cpu_seconds_total", "counter"),
];
