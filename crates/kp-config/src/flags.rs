//! Upstream kube-proxy's Linux command line, with pflag's syntax.
//!
//! Values may follow as `--flag=value` or `--flag value`. Boolean flags take
//! Go's `strconv.ParseBool` forms and only with `=` (`--masquerade-all`,
//! `--masquerade-all=false`), so a bare boolean never consumes the next
//! argument. Durations use Go syntax (`2h22m`, `300ms`).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use clap::{ArgAction, Parser};

use crate::duration::GoDuration;
use crate::log_flags::{
    parse_backtrace_at, parse_quantity, parse_severity, parse_verbosity, parse_vmodule, Severity,
    VModuleFlag,
};
use crate::netutil::split_host_port;
use crate::types::Quantity;

const PROJECT_HEADING: &str = "Project additions (not in upstream kube-proxy)";
const LOGGING_HEADING: &str = "Logging flags";
const KLOG_HEADING: &str =
    "klog flags (removed from upstream kube-proxy in v1.26; accepted for older manifests)";

/// kube-proxy's command-line flags.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "kube-proxy",
    about = "The Kubernetes network proxy runs on each node and reflects Services as defined in the Kubernetes API, programming iptables, IPVS, nftables or a userspace proxy.",
    disable_version_flag = true
)]
pub struct Flags {
    /// The path to the configuration file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// If set, write the default configuration values to this file and exit.
    #[arg(long, value_name = "FILE")]
    pub write_config_to: Option<PathBuf>,
    /// If true cleanup iptables and ipvs rules and exit.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set)]
    pub cleanup: bool,
    /// If true, perform any initialization steps that must be done with full root privileges, and then exit.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set)]
    pub init_only: bool,
    /// A set of key=value pairs that describe feature gates for alpha/experimental features. This parameter is ignored if a config file is specified by --config.
    #[arg(long, value_name = "NAME=BOOL,...", value_parser = parse_feature_gates, action = ArgAction::Append)]
    pub feature_gates: Vec<FeatureGatePairs>,
    /// Path to kubeconfig file with authorization information (the master location can be overridden by the master flag).
    #[arg(long, value_name = "FILE", default_value = "")]
    pub kubeconfig: String,
    /// The address of the Kubernetes API server (overrides any value in kubeconfig).
    #[arg(long, value_name = "URL")]
    pub master: Option<String>,
    /// Content type of requests sent to apiserver.
    #[arg(
        long,
        value_name = "TYPE",
        default_value = "application/vnd.kubernetes.protobuf"
    )]
    pub kube_api_content_type: String,
    /// QPS to use while talking with kubernetes apiserver.
    #[arg(long, value_name = "FLOAT", default_value = "5")]
    pub kube_api_qps: f32,
    /// Burst to use while talking with kubernetes apiserver.
    #[arg(
        long,
        value_name = "INT",
        default_value = "10",
        allow_negative_numbers = true
    )]
    pub kube_api_burst: i32,
    /// If non-empty, will be used as the name of the Node that kube-proxy is running on. If unset, the node name is assumed to be the same as the node's hostname.
    #[arg(long, value_name = "NAME", default_value = "")]
    pub hostname_override: String,
    /// Overrides kube-proxy's idea of what its node's primary IP is. This parameter is ignored if a config file is specified by --config.
    #[arg(long, value_name = "IP", default_value = "0.0.0.0", value_parser = parse_ip)]
    pub bind_address: String,
    /// If true kube-proxy will treat failure to bind to a port as fatal and exit.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set)]
    pub bind_address_hard_fail: bool,
    /// The IP address and port for the health check server to serve on. This parameter is ignored if a config file is specified by --config.
    #[arg(long, value_name = "IP[:PORT]", default_value = "0.0.0.0:10256", value_parser = parse_ip_port)]
    pub healthz_bind_address: String,
    /// The IP address and port for the metrics server to serve on (set to "0.0.0.0:10249" / "[::]:10249" to bind on all interfaces). Set empty to disable. This parameter is ignored if a config file is specified by --config.
    #[arg(long, value_name = "IP[:PORT]", default_value = "127.0.0.1:10249", value_parser = parse_ip_port)]
    pub metrics_bind_address: String,
    /// If true enables profiling via web interface on /debug/pprof handler. This parameter is ignored if a config file is specified by --config.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set)]
    pub profiling: bool,
    /// Which proxy mode to use: 'iptables' (default), 'ipvs', 'nftables' or 'userspace'. This parameter is ignored if a config file is specified by --config.
    #[arg(long, value_name = "MODE", default_value = "")]
    pub proxy_mode: String,
    /// If using the iptables or ipvs proxy mode, the bit of the fwmark space to mark packets requiring SNAT with. Must be within the range [0, 31].
    #[arg(
        long,
        value_name = "INT",
        default_value = "14",
        allow_negative_numbers = true
    )]
    pub iptables_masquerade_bit: i32,
    /// SNAT all traffic sent via Service cluster IPs. This may be required with some CNI plugins.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set)]
    pub masquerade_all: bool,
    /// If false, kube-proxy will disable the legacy behavior of allowing NodePort services to be accessed via localhost (iptables mode and IPv4 only).
    #[arg(long = "iptables-localhost-nodeports", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "true", default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set)]
    pub iptables_localhost_nodeports: bool,
    /// An interval (e.g. '5s', '1m', '2h22m') indicating how frequently various re-synchronizing and cleanup operations are performed. Must be greater than 0.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = GoDuration::parse)]
    pub iptables_sync_period: GoDuration,
    /// The minimum period between iptables rule resyncs (e.g. '5s', '1m', '2h22m'). A value of 0 means every Service or EndpointSlice change will result in an immediate iptables resync.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = GoDuration::parse)]
    pub iptables_min_sync_period: GoDuration,
    /// An interval (e.g. '5s', '1m', '2h22m') indicating how frequently various re-synchronizing and cleanup operations are performed. Must be greater than 0.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = GoDuration::parse)]
    pub ipvs_sync_period: GoDuration,
    /// The minimum period between IPVS rule resyncs (e.g. '5s', '1m', '2h22m'). A value of 0 means every Service or EndpointSlice change will result in an immediate IPVS resync.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = GoDuration::parse)]
    pub ipvs_min_sync_period: GoDuration,
    /// The ipvs scheduler type when proxy mode is ipvs.
    #[arg(long, value_name = "NAME", default_value = "")]
    pub ipvs_scheduler: String,
    /// A comma-separated list of CIDRs which the ipvs proxier should not touch when cleaning up IPVS rules.
    #[arg(long, value_name = "CIDRS", value_delimiter = ',', action = ArgAction::Append)]
    pub ipvs_exclude_cidrs: Vec<String>,
    /// Enable strict ARP by setting arp_ignore to 1 and arp_announce to 2.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set)]
    pub ipvs_strict_arp: bool,
    /// The timeout for idle IPVS TCP connections, 0 to leave as-is (e.g. '5s', '1m', '2h22m').
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = GoDuration::parse)]
    pub ipvs_tcp_timeout: GoDuration,
    /// The timeout for IPVS TCP connections after receiving a FIN packet, 0 to leave as-is (e.g. '5s', '1m', '2h22m').
    #[arg(long = "ipvs-tcpfin-timeout", value_name = "DURATION", default_value = "0s", value_parser = GoDuration::parse)]
    pub ipvs_tcpfin_timeout: GoDuration,
    /// The timeout for IPVS UDP packets, 0 to leave as-is (e.g. '5s', '1m', '2h22m').
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = GoDuration::parse)]
    pub ipvs_udp_timeout: GoDuration,
    /// Mode to use to detect local traffic: ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix. This parameter is ignored if a config file is specified by --config.
    #[arg(long, value_name = "MODE", default_value = "")]
    pub detect_local_mode: String,
    /// A bridge interface name. When --detect-local-mode is set to BridgeInterface, traffic from this bridge is local.
    #[arg(long, value_name = "NAME", default_value = "")]
    pub pod_bridge_interface: String,
    /// An interface name prefix. When --detect-local-mode is set to InterfaceNamePrefix, traffic from interfaces whose name begins with this prefix is local.
    #[arg(long, value_name = "PREFIX", default_value = "")]
    pub pod_interface_name_prefix: String,
    /// The CIDR range of the pods in the cluster (a comma-separated dual-stack pair for dual-stack clusters). Used when --detect-local-mode is ClusterCIDR. This parameter is ignored if a config file is specified by --config.
    #[arg(long, value_name = "CIDR[,CIDR]", default_value = "")]
    pub cluster_cidr: String,
    /// A list of CIDR ranges that contain valid node IPs, or alternatively, the single string 'primary'. NodePort connections are only accepted on matching node IPs. If unset, all local IPs (nftables mode: 'primary'). This parameter is ignored if a config file is specified by --config.
    #[arg(long = "nodeport-addresses", value_name = "CIDRS", value_delimiter = ',', action = ArgAction::Append)]
    pub nodeport_addresses: Vec<String>,
    /// The oom-score-adj value for kube-proxy process. Values must be within the range [-1000, 1000]. This parameter is ignored if a config file is specified by --config.
    #[arg(
        long,
        value_name = "INT",
        default_value = "-999",
        allow_negative_numbers = true
    )]
    pub oom_score_adj: i32,
    /// Maximum number of NAT connections to track per CPU core (0 to leave the limit as-is and ignore conntrack-min).
    #[arg(
        long,
        value_name = "INT",
        default_value = "32768",
        allow_negative_numbers = true
    )]
    pub conntrack_max_per_core: i32,
    /// Minimum number of conntrack entries to allocate, regardless of conntrack-max-per-core (set conntrack-max-per-core=0 to leave the limit as-is).
    #[arg(
        long,
        value_name = "INT",
        default_value = "131072",
        allow_negative_numbers = true
    )]
    pub conntrack_min: i32,
    /// Idle timeout for established TCP connections (0 to leave as-is).
    #[arg(long, value_name = "DURATION", default_value = "24h0m0s", value_parser = GoDuration::parse)]
    pub conntrack_tcp_timeout_established: GoDuration,
    /// NAT timeout for TCP connections in the CLOSE_WAIT state.
    #[arg(long, value_name = "DURATION", default_value = "1h0m0s", value_parser = GoDuration::parse)]
    pub conntrack_tcp_timeout_close_wait: GoDuration,
    /// Enable liberal mode for tracking TCP packets by setting nf_conntrack_tcp_be_liberal to 1.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set)]
    pub conntrack_tcp_be_liberal: bool,
    /// Idle timeout for UNREPLIED UDP connections (0 to leave as-is).
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = GoDuration::parse)]
    pub conntrack_udp_timeout: GoDuration,
    /// Idle timeout for ASSURED UDP connections (0 to leave as-is).
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = GoDuration::parse)]
    pub conntrack_udp_timeout_stream: GoDuration,
    /// How often configuration from the apiserver is refreshed. Must be greater than 0.
    #[arg(long, value_name = "DURATION", default_value = "15m0s", value_parser = GoDuration::parse)]
    pub config_sync_period: GoDuration,
    /// How long an idle UDP connection will be kept open (e.g. '250ms', '2s').  Must be greater than 0. Only applicable for proxy-mode=userspace
    #[arg(long, value_name = "DURATION", default_value = "250ms", value_parser = GoDuration::parse)]
    pub udp_timeout: GoDuration,
    /// DEPRECATED (use --healthz-bind-address): the port to bind the health check server. Use 0 to disable.
    #[arg(
        long,
        value_name = "PORT",
        default_value = "10256",
        allow_negative_numbers = true
    )]
    pub healthz_port: i32,
    /// DEPRECATED (use --metrics-bind-address): the port to bind the metrics server. Use 0 to disable.
    #[arg(
        long,
        value_name = "PORT",
        default_value = "10249",
        allow_negative_numbers = true
    )]
    pub metrics_port: i32,
    /// The previous version for which you want to show hidden metrics, as <major>.<minor> (e.g. '1.33'). Only the previous minor version is meaningful. This parameter is ignored if a config file is specified by --config.
    #[arg(long, value_name = "VERSION", default_value = "")]
    pub show_hidden_metrics_for_version: String,
    /// Number for the log level verbosity.
    #[arg(short = 'v', long = "v", value_name = "LEVEL", default_value = "0", value_parser = parse_verbosity, help_heading = LOGGING_HEADING)]
    pub v: u32,
    /// Sets the log format. Permitted formats: "json", "text".
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"], help_heading = LOGGING_HEADING)]
    pub logging_format: String,
    /// Maximum number of seconds between log flushes.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = GoDuration::parse, help_heading = LOGGING_HEADING)]
    pub log_flush_frequency: GoDuration,
    /// Comma-separated list of pattern=N settings for file-filtered logging (only works for text log format).
    #[arg(long, value_name = "PATTERN=N,...", value_parser = parse_vmodule, action = ArgAction::Append, help_heading = LOGGING_HEADING)]
    pub vmodule: Vec<VModuleFlag>,
    /// [Alpha] In text format, write error messages to stderr and info messages to stdout. Enable the LoggingAlphaOptions feature gate to use this.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set, help_heading = LOGGING_HEADING)]
    pub log_text_split_stream: bool,
    /// [Alpha] In text format with split output streams, the info messages can be buffered (e.g. 512, 1K, 2Ki). Enable the LoggingAlphaOptions feature gate to use this.
    #[arg(long, value_name = "QUANTITY", value_parser = parse_quantity, help_heading = LOGGING_HEADING)]
    pub log_text_info_buffer_size: Option<Quantity>,
    /// [Alpha] In JSON format, write error messages to stderr and info messages to stdout. Enable the LoggingAlphaOptions feature gate to use this.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set, help_heading = LOGGING_HEADING)]
    pub log_json_split_stream: bool,
    /// [Alpha] In JSON format with split output streams, the info messages can be buffered (e.g. 512, 1K, 2Ki). Enable the LoggingAlphaOptions feature gate to use this.
    #[arg(long, value_name = "QUANTITY", value_parser = parse_quantity, help_heading = LOGGING_HEADING)]
    pub log_json_info_buffer_size: Option<Quantity>,
    /// klog: log to standard error instead of files.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "true", default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set, help_heading = KLOG_HEADING)]
    pub logtostderr: bool,
    /// klog: log to standard error as well as files (no effect when -logtostderr=true).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set, help_heading = KLOG_HEADING)]
    pub alsologtostderr: bool,
    /// klog: if non-empty, use this log file (no effect when -logtostderr=true).
    #[arg(long = "log-file", alias = "log_file", value_name = "FILE", help_heading = KLOG_HEADING)]
    pub log_file: Option<PathBuf>,
    /// klog: if non-empty, write log files in this directory (no effect in kube-proxy-rs).
    #[arg(long = "log-dir", alias = "log_dir", value_name = "DIR", help_heading = KLOG_HEADING)]
    pub log_dir: Option<PathBuf>,
    /// klog: maximum size in megabytes a log file can grow to, 0 for unlimited (no effect in kube-proxy-rs).
    #[arg(long = "log-file-max-size", alias = "log_file_max_size", value_name = "MB", default_value = "1800", help_heading = KLOG_HEADING)]
    pub log_file_max_size: u64,
    /// klog: logs at or above this threshold go to stderr when writing to a file (INFO, WARNING, ERROR, FATAL or 0-3).
    #[arg(long, value_name = "SEVERITY", default_value = "2", value_parser = parse_severity, help_heading = KLOG_HEADING)]
    pub stderrthreshold: Severity,
    /// klog: if true, adds the file directory to the header of the log messages (no effect in kube-proxy-rs).
    #[arg(long = "add-dir-header", alias = "add_dir_header", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set, help_heading = KLOG_HEADING)]
    pub add_dir_header: bool,
    /// klog: if true, avoid header prefixes in the log messages (no effect in kube-proxy-rs).
    #[arg(long = "skip-headers", alias = "skip_headers", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set, help_heading = KLOG_HEADING)]
    pub skip_headers: bool,
    /// klog: if true, avoid headers when opening log files (no effect in kube-proxy-rs).
    #[arg(long = "skip-log-headers", alias = "skip_log_headers", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set, help_heading = KLOG_HEADING)]
    pub skip_log_headers: bool,
    /// klog: if true, only write logs to their native severity level (no effect in kube-proxy-rs).
    #[arg(long = "one-output", alias = "one_output", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set, help_heading = KLOG_HEADING)]
    pub one_output: bool,
    /// klog: when logging hits line file:N, emit a stack trace (no effect in kube-proxy-rs).
    #[arg(long = "log-backtrace-at", alias = "log_backtrace_at", value_name = "FILE:N", default_value = "", value_parser = parse_backtrace_at, help_heading = KLOG_HEADING)]
    pub log_backtrace_at: String,
    /// --version, --version=raw prints version information and quits; --version=false does not.
    #[arg(long, value_name = "BOOL|raw", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_version_flag)]
    pub version: Option<String>,
    /// Run from a manifest file or directory of Service/EndpointSlice manifests instead of the API server.
    #[arg(long, value_name = "PATH", help_heading = PROJECT_HEADING)]
    pub manifests: Option<PathBuf>,
    /// Print the rules one sync would program, then exit without changing anything.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set, help_heading = PROJECT_HEADING)]
    pub dry_run: bool,
    /// After a full sync, hold the kernel's rules of up to this many service ports (a rotating sample) against the model, log the first difference, export kubeproxy_rs_state_drift_services and rewrite a drifted family's rules; 0 turns the check off.
    #[arg(long, value_name = "N", default_value = "100", help_heading = PROJECT_HEADING)]
    pub state_check_service_ports: usize,
    /// The least time between two such checks.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = GoDuration::parse, help_heading = PROJECT_HEADING)]
    pub state_check_interval: GoDuration,
    /// When the --config file changes, wait a random time of up to this long before exiting to load it, so that the nodes of a fleet whose ConfigMap changed do not all restart, and list the API server, in the same second; 0 exits at once.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = GoDuration::parse, help_heading = PROJECT_HEADING)]
    pub config_change_exit_jitter: GoDuration,
    /// How the nftables mode lays out its table: `data` (the default) keeps a service port's endpoints as elements of maps that one rule per endpoint count draws from, so that an endpoint change adds no rule and a new connection's cost does not grow with the endpoints (docs/DESIGN.md); `chains` selects an endpoint by one rule and one chain per endpoint, as upstream's nftables mode does. A service port with ClientIP affinity has endpoint chains in either.
    #[arg(long, value_name = "LAYOUT", default_value = "data", value_enum, help_heading = PROJECT_HEADING)]
    pub nftables_layout: NftablesLayout,
}

/// `--nftables-layout`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum NftablesLayout {
    /// One `endpoint-` chain per endpoint, chosen by one rule each.
    Chains,
    /// Endpoints as elements of `service-endpoints-*` maps.
    #[default]
    Data,
}

/// The `name=bool` pairs of one `--feature-gates` occurrence, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FeatureGatePairs(pub Vec<(String, bool)>);

impl FeatureGatePairs {
    /// Adds the pairs to `gates`; later pairs win.
    pub fn merge_into(&self, gates: &mut BTreeMap<String, bool>) {
        for (name, value) in &self.0 {
            gates.insert(name.clone(), *value);
        }
    }
}

/// Go's `strconv.ParseBool`: 1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False.
pub fn parse_go_bool(value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!(
            "invalid boolean {value:?}: use true or false (also accepted: 1, t, T, TRUE, True, 0, f, F, FALSE, False)"
        )),
    }
}

/// `--feature-gates` syntax: comma-separated `Name=bool` pairs.
pub fn parse_feature_gates(value: &str) -> Result<FeatureGatePairs, String> {
    let mut pairs = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, flag) = item.split_once('=').ok_or_else(|| {
            format!("missing bool value for {item:?}: expected Name=true or Name=false")
        })?;
        let flag = parse_go_bool(flag.trim())
            .map_err(|e| format!("invalid value of {}: {e}", name.trim()))?;
        pairs.push((name.trim().to_owned(), flag));
    }
    Ok(FeatureGatePairs(pairs))
}

fn parse_ip(value: &str) -> Result<String, String> {
    value
        .parse::<IpAddr>()
        .map(|_| value.to_owned())
        .map_err(|_| format!("{value:?} is not a valid IP address"))
}

/// upstream `IPPortVar`: empty, an IP, or `IP:port`.
fn parse_ip_port(value: &str) -> Result<String, String> {
    if value.trim().is_empty() {
        return Ok(String::new());
    }
    if value.parse::<IpAddr>().is_ok() {
        return Ok(value.to_owned());
    }
    let (host, port) = split_host_port(value)
        .ok_or_else(|| format!("{value:?} is not in a valid format (ip or ip:port)"))?;
    host.parse::<IpAddr>()
        .map_err(|_| format!("{value:?} is not a valid IP address"))?;
    port.parse::<u16>()
        .map_err(|_| format!("{port:?} is not a valid port number (0-65535)"))?;
    Ok(value.to_owned())
}

fn parse_version_flag(value: &str) -> Result<String, String> {
    if value == "raw" {
        return Ok(value.to_owned());
    }
    parse_go_bool(value).map(|b| b.to_string())
}
