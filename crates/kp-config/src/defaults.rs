//! Upstream's v1alpha1 defaulting (`SetDefaults_KubeProxyConfiguration` plus
//! component-base's recommended logging configuration).
//!
//! Defaulting only fills unset (zero or `None`) fields, so applying it twice
//! changes nothing. Platform defaults that upstream applies at run time
//! (empty mode means iptables, empty detectLocalMode means ClusterCIDR,
//! nftables mode implies `nodePortAddresses: [primary]`) are not written into
//! the object; the `effective_*` accessors compute them.

use std::net::IpAddr;

use crate::duration::GoDuration;
use crate::netutil::append_port_if_needed;
use crate::types::{KubeProxyConfiguration, LoggingConfiguration, OutputRoutingOptions, Quantity};
use crate::types::{API_VERSION, KIND};

/// Default node IP override: unset, written as the IPv4 wildcard.
pub const DEFAULT_BIND_ADDRESS: &str = "0.0.0.0";
/// Port of the health server (upstream `ports.ProxyHealthzPort`).
pub const DEFAULT_HEALTHZ_PORT: u16 = 10256;
/// Port of the metrics server (upstream `ports.ProxyStatusPort`).
pub const DEFAULT_METRICS_PORT: u16 = 10249;
/// Default OOM score adjustment (upstream `qos.KubeProxyOOMScoreAdj`).
pub const DEFAULT_OOM_SCORE_ADJ: i32 = -999;
/// Default fwmark bit for SNAT.
pub const DEFAULT_MASQUERADE_BIT: i32 = 14;
/// Default maximum interval between full syncs.
pub const DEFAULT_SYNC_PERIOD: GoDuration = GoDuration::from_secs(30);
/// Default minimum interval between syncs (iptables and nftables).
pub const DEFAULT_MIN_SYNC_PERIOD: GoDuration = GoDuration::from_secs(1);
/// Default refresh interval of API server configuration.
pub const DEFAULT_CONFIG_SYNC_PERIOD: GoDuration = GoDuration::from_mins(15);
/// Default tracked connections per core.
pub const DEFAULT_CONNTRACK_MAX_PER_CORE: i32 = 32 * 1024;
/// Default minimum conntrack table size.
pub const DEFAULT_CONNTRACK_MIN: i32 = 128 * 1024;
/// Default established-TCP conntrack timeout (one day).
pub const DEFAULT_CONNTRACK_TCP_ESTABLISHED_TIMEOUT: GoDuration = GoDuration::from_hours(24);
/// Default CLOSE_WAIT conntrack timeout. One hour matches typical server
/// timeouts; shorter values break half-closed SNATed flows (kubernetes#32551).
pub const DEFAULT_CONNTRACK_TCP_CLOSE_WAIT_TIMEOUT: GoDuration = GoDuration::from_hours(1);
/// Default idle timeout of the userspace mode's UDP sessions (upstream's
/// `--udp-timeout` default until v1.25).
pub const DEFAULT_UDP_IDLE_TIMEOUT: GoDuration = GoDuration::from_millis(250);
/// Default API content type.
pub const DEFAULT_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";
/// Default API queries per second.
pub const DEFAULT_QPS: f32 = 5.0;
/// Default API burst.
pub const DEFAULT_BURST: i32 = 10;
/// Default log format.
pub const DEFAULT_LOG_FORMAT: &str = "text";
/// Default log flush frequency (component-base `LogFlushFreqDefault`).
pub const DEFAULT_LOG_FLUSH_FREQUENCY: GoDuration = GoDuration::from_secs(5);

impl KubeProxyConfiguration {
    /// A configuration with every upstream default applied, as an empty
    /// configuration file would load.
    pub fn defaulted() -> Self {
        let mut cfg = KubeProxyConfiguration::default();
        cfg.apply_defaults();
        cfg
    }

    /// Fills every unset field with upstream's default. Idempotent.
    pub fn apply_defaults(&mut self) {
        set_if_empty(&mut self.api_version, API_VERSION);
        set_if_empty(&mut self.kind, KIND);
        set_if_empty(&mut self.bind_address, DEFAULT_BIND_ADDRESS);
        self.default_server_addresses();

        self.oom_score_adj.get_or_insert(DEFAULT_OOM_SCORE_ADJ);

        let ipt = &mut self.iptables;
        set_duration_if_zero(&mut ipt.sync_period, DEFAULT_SYNC_PERIOD);
        set_duration_if_zero(&mut ipt.min_sync_period, DEFAULT_MIN_SYNC_PERIOD);
        ipt.localhost_node_ports.get_or_insert(true);
        ipt.masquerade_bit.get_or_insert(DEFAULT_MASQUERADE_BIT);

        // Upstream leaves ipvs.minSyncPeriod at 0 (resync on every change).
        set_duration_if_zero(&mut self.ipvs.sync_period, DEFAULT_SYNC_PERIOD);

        let nft = &mut self.nftables;
        set_duration_if_zero(&mut nft.sync_period, DEFAULT_SYNC_PERIOD);
        set_duration_if_zero(&mut nft.min_sync_period, DEFAULT_MIN_SYNC_PERIOD);
        nft.masquerade_bit.get_or_insert(DEFAULT_MASQUERADE_BIT);

        let ct = &mut self.conntrack;
        ct.max_per_core
            .get_or_insert(DEFAULT_CONNTRACK_MAX_PER_CORE);
        ct.min.get_or_insert(DEFAULT_CONNTRACK_MIN);
        ct.tcp_established_timeout
            .get_or_insert(DEFAULT_CONNTRACK_TCP_ESTABLISHED_TIMEOUT);
        ct.tcp_close_wait_timeout
            .get_or_insert(DEFAULT_CONNTRACK_TCP_CLOSE_WAIT_TIMEOUT);

        set_duration_if_zero(&mut self.config_sync_period, DEFAULT_CONFIG_SYNC_PERIOD);
        set_duration_if_zero(&mut self.udp_idle_timeout, DEFAULT_UDP_IDLE_TIMEOUT);

        let client = &mut self.client_connection;
        set_if_empty(&mut client.content_type, DEFAULT_CONTENT_TYPE);
        if client.qps == 0.0 {
            client.qps = DEFAULT_QPS;
        }
        if client.burst == 0 {
            client.burst = DEFAULT_BURST;
        }
        apply_logging_defaults(&mut self.logging);
    }

    /// healthz/metrics default to the wildcard/loopback of bindAddress's
    /// family; a bare IP gets the default port appended.
    fn default_server_addresses(&mut self) {
        let ipv4 = match self.bind_address.parse::<IpAddr>() {
            Ok(IpAddr::V4(_)) => true,
            Ok(IpAddr::V6(v6)) => v6.to_ipv4_mapped().is_some(),
            Err(_) => false,
        };
        let (healthz_host, metrics_host) = if ipv4 {
            ("0.0.0.0", "127.0.0.1")
        } else {
            ("[::]", "[::1]")
        };
        if self.healthz_bind_address.is_empty() {
            self.healthz_bind_address = format!("{healthz_host}:{DEFAULT_HEALTHZ_PORT}");
        } else {
            self.healthz_bind_address =
                append_port_if_needed(&self.healthz_bind_address, DEFAULT_HEALTHZ_PORT);
        }
        if self.metrics_bind_address.is_empty() {
            self.metrics_bind_address = format!("{metrics_host}:{DEFAULT_METRICS_PORT}");
        } else {
            self.metrics_bind_address =
                append_port_if_needed(&self.metrics_bind_address, DEFAULT_METRICS_PORT);
        }
    }
}

/// component-base `SetRecommendedLoggingConfiguration`.
fn apply_logging_defaults(logging: &mut LoggingConfiguration) {
    set_if_empty(&mut logging.format, DEFAULT_LOG_FORMAT);
    if logging.flush_frequency.duration.is_zero() {
        logging.flush_frequency.duration = DEFAULT_LOG_FLUSH_FREQUENCY;
        logging.flush_frequency.serialize_as_string = true;
    }
    default_output_routing(&mut logging.options.text);
    default_output_routing(&mut logging.options.json);
}

fn default_output_routing(options: &mut OutputRoutingOptions) {
    if options.info_buffer_size.0.is_empty() {
        options.info_buffer_size = Quantity("0".to_owned());
    }
}

/// Whether `udpIdleTimeout` may be left out of written configuration:
/// unset, or the default that loading fills in again.
pub(crate) fn is_default_udp_idle_timeout(timeout: &GoDuration) -> bool {
    timeout.is_zero() || *timeout == DEFAULT_UDP_IDLE_TIMEOUT
}

fn set_if_empty(field: &mut String, value: &str) {
    if field.is_empty() {
        value.clone_into(field);
    }
}

fn set_duration_if_zero(field: &mut GoDuration, value: GoDuration) {
    if field.is_zero() {
        *field = value;
    }
}
