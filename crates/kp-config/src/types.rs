//! The `kubeproxy.config.k8s.io/v1alpha1` `KubeProxyConfiguration` wire type.
//!
//! Field names, nesting, optionality and serialized forms follow upstream's
//! `k8s.io/kube-proxy/config/v1alpha1` so that files move freely between
//! upstream kube-proxy and kube-proxy-rs. Go pointer fields are `Option`s
//! (`None` is "unset", filled by defaulting); Go value fields use their zero
//! value when missing. `Default` gives that all-zero value, exactly what an
//! empty file decodes to; [`KubeProxyConfiguration::defaulted`] gives the
//! value upstream's defaulting produces.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::duration::GoDuration;

/// The API group and version this crate reads and writes.
pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
/// The object kind this crate reads and writes.
pub const KIND: &str = "KubeProxyConfiguration";

/// Everything needed to configure the proxy (upstream `KubeProxyConfiguration`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct KubeProxyConfiguration {
    /// Always `kubeproxy.config.k8s.io/v1alpha1`.
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    /// Always `KubeProxyConfiguration`.
    #[serde(rename = "kind")]
    pub kind: String,
    /// Feature names mapped to enabled/disabled.
    #[serde(rename = "featureGates", skip_serializing_if = "BTreeMap::is_empty")]
    pub feature_gates: BTreeMap<String, bool>,
    /// Kubeconfig file and API client settings.
    #[serde(rename = "clientConnection")]
    pub client_connection: ClientConnectionConfiguration,
    /// Logging options (component-base `LoggingConfiguration`).
    #[serde(rename = "logging")]
    pub logging: LoggingConfiguration,
    /// Name of this node's Node object, if not the hostname.
    #[serde(rename = "hostnameOverride")]
    pub hostname_override: String,
    /// Overrides the node's primary IP; no socket is bound to it.
    #[serde(rename = "bindAddress")]
    pub bind_address: String,
    /// `IP:port` of the health server; empty disables it.
    #[serde(rename = "healthzBindAddress")]
    pub healthz_bind_address: String,
    /// `IP:port` of the metrics server; empty disables it.
    #[serde(rename = "metricsBindAddress")]
    pub metrics_bind_address: String,
    /// Treat failure to bind a port as fatal.
    #[serde(rename = "bindAddressHardFail")]
    pub bind_address_hard_fail: bool,
    /// Serve `/debug/pprof`-style profiling on the metrics server.
    #[serde(rename = "enableProfiling")]
    pub enable_profiling: bool,
    /// Previous minor version whose hidden metrics are shown again.
    #[serde(rename = "showHiddenMetricsForVersion")]
    pub show_hidden_metrics_for_version: String,
    /// Proxy mode name; empty means the platform default (iptables on Linux).
    #[serde(rename = "mode")]
    pub mode: String,
    /// iptables mode settings.
    #[serde(rename = "iptables")]
    pub iptables: KubeProxyIPTablesConfiguration,
    /// IPVS mode settings.
    #[serde(rename = "ipvs")]
    pub ipvs: KubeProxyIPVSConfiguration,
    /// nftables mode settings.
    #[serde(rename = "nftables")]
    pub nftables: KubeProxyNFTablesConfiguration,
    /// Windows HNS settings (unused on Linux, kept for compatibility).
    #[serde(rename = "winkernel")]
    pub winkernel: KubeProxyWinkernelConfiguration,
    /// How local traffic is detected; empty means `ClusterCIDR`.
    #[serde(rename = "detectLocalMode")]
    pub detect_local_mode: String,
    /// Settings for the interface-based local traffic detectors.
    #[serde(rename = "detectLocal")]
    pub detect_local: DetectLocalConfiguration,
    /// Pod CIDR, or a comma-separated dual-stack pair.
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: String,
    /// CIDRs (or `primary`) whose node IPs accept NodePort traffic; `None` is unset.
    #[serde(rename = "nodePortAddresses")]
    pub node_port_addresses: Option<Vec<String>>,
    /// OOM score adjustment of the process, in [-1000, 1000].
    #[serde(rename = "oomScoreAdj")]
    pub oom_score_adj: Option<i32>,
    /// Connection-tracking sysctls.
    #[serde(rename = "conntrack")]
    pub conntrack: KubeProxyConntrackConfiguration,
    /// How often configuration from the API server is refreshed.
    #[serde(rename = "configSyncPeriod")]
    pub config_sync_period: GoDuration,
    /// Formerly the userspace proxy's port range; validated, otherwise unused.
    #[serde(rename = "portRange")]
    pub port_range: String,
    /// How long the userspace mode keeps an idle UDP session open (zero is
    /// unset: defaulting makes it 250ms). Upstream dropped the field with
    /// its userspace mode (v1.26); it is written only when it differs from
    /// the default, so a default configuration reads the same in upstream.
    #[serde(
        rename = "udpIdleTimeout",
        skip_serializing_if = "crate::defaults::is_default_udp_idle_timeout"
    )]
    pub udp_idle_timeout: GoDuration,
    /// Windows service-manager integration (Windows only).
    #[serde(rename = "windowsRunAsService", skip_serializing_if = "is_false")]
    pub windows_run_as_service: bool,
}

/// API client settings (component-base `ClientConnectionConfiguration`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClientConnectionConfiguration {
    /// Path to a kubeconfig file.
    #[serde(rename = "kubeconfig")]
    pub kubeconfig: String,
    /// `Accept` header sent to the API server.
    #[serde(rename = "acceptContentTypes")]
    pub accept_content_types: String,
    /// Content type of requests sent to the API server.
    #[serde(rename = "contentType")]
    pub content_type: String,
    /// Queries per second allowed to the API server.
    #[serde(rename = "qps")]
    pub qps: f32,
    /// Extra queries allowed in a burst.
    #[serde(rename = "burst")]
    pub burst: i32,
}

/// Logging options (component-base `logs/api/v1` `LoggingConfiguration`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LoggingConfiguration {
    /// `text` or `json`.
    #[serde(rename = "format", skip_serializing_if = "String::is_empty")]
    pub format: String,
    /// Maximum time between log flushes.
    #[serde(rename = "flushFrequency")]
    pub flush_frequency: FlushFrequency,
    /// Verbosity threshold; higher logs more.
    #[serde(rename = "verbosity")]
    pub verbosity: u32,
    /// Per-file verbosity overrides (text format only).
    #[serde(rename = "vmodule", skip_serializing_if = "Vec::is_empty")]
    pub vmodule: Vec<VModuleItem>,
    /// Format-specific options (alpha upstream).
    #[serde(rename = "options")]
    pub options: FormatOptions,
}

/// One per-file verbosity override.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct VModuleItem {
    /// File name (without `.go`) or glob pattern.
    #[serde(rename = "filePattern")]
    pub file_pattern: String,
    /// Verbosity for matching files.
    #[serde(rename = "verbosity")]
    pub verbosity: u32,
}

/// Options of the individual log formats.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FormatOptions {
    /// Options of the `text` format.
    #[serde(rename = "text")]
    pub text: OutputRoutingOptions,
    /// Options of the `json` format.
    #[serde(rename = "json")]
    pub json: OutputRoutingOptions,
}

/// Stream routing shared by the `text` and `json` formats.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct OutputRoutingOptions {
    /// Errors to stderr, info to stdout.
    #[serde(rename = "splitStream", skip_serializing_if = "is_false")]
    pub split_stream: bool,
    /// Buffer size of the info stream when split, as a Kubernetes quantity.
    #[serde(rename = "infoBufferSize")]
    pub info_buffer_size: Quantity,
}

/// A Kubernetes resource quantity kept in its textual form (`0`, `512`, `2Ki`, `1M`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Quantity(pub String);

/// `flushFrequency`: a duration that upstream accepts as a string or as
/// integer nanoseconds, and writes back in the form it was read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlushFrequency {
    /// The duration.
    pub duration: GoDuration,
    /// Written as a duration string (true) or integer nanoseconds (false).
    pub serialize_as_string: bool,
}

/// iptables mode settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct KubeProxyIPTablesConfiguration {
    /// fwmark bit used to mark packets for SNAT, in [0, 31].
    #[serde(rename = "masqueradeBit")]
    pub masquerade_bit: Option<i32>,
    /// SNAT all traffic sent to Service cluster IPs.
    #[serde(rename = "masqueradeAll")]
    pub masquerade_all: bool,
    /// Allow NodePorts on localhost (iptables mode, IPv4 only).
    #[serde(rename = "localhostNodePorts")]
    pub localhost_node_ports: Option<bool>,
    /// SNAT service traffic to the node's InternalIP; written only when set.
    #[serde(rename = "snatNodeInternalIP", skip_serializing_if = "Option::is_none")]
    pub snat_node_internal_ip: Option<bool>,
    /// Maximum interval between full resyncs.
    #[serde(rename = "syncPeriod")]
    pub sync_period: GoDuration,
    /// Minimum interval between resyncs.
    #[serde(rename = "minSyncPeriod")]
    pub min_sync_period: GoDuration,
}

/// IPVS mode settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct KubeProxyIPVSConfiguration {
    /// Maximum interval between full resyncs.
    #[serde(rename = "syncPeriod")]
    pub sync_period: GoDuration,
    /// Minimum interval between resyncs.
    #[serde(rename = "minSyncPeriod")]
    pub min_sync_period: GoDuration,
    /// IPVS scheduler name; empty means `rr`.
    #[serde(rename = "scheduler")]
    pub scheduler: String,
    /// CIDRs whose IPVS services cleanup must not touch; `None` is unset.
    #[serde(rename = "excludeCIDRs")]
    pub exclude_cidrs: Option<Vec<String>>,
    /// Set arp_ignore/arp_announce so kube-ipvs0 addresses are not announced.
    #[serde(rename = "strictARP")]
    pub strict_arp: bool,
    /// Idle IPVS TCP session timeout; 0 leaves the kernel value.
    #[serde(rename = "tcpTimeout")]
    pub tcp_timeout: GoDuration,
    /// IPVS TCP timeout after FIN; 0 leaves the kernel value.
    #[serde(rename = "tcpFinTimeout")]
    pub tcp_fin_timeout: GoDuration,
    /// IPVS UDP timeout; 0 leaves the kernel value.
    #[serde(rename = "udpTimeout")]
    pub udp_timeout: GoDuration,
}

/// nftables mode settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct KubeProxyNFTablesConfiguration {
    /// fwmark bit used to mark packets for SNAT, in [0, 31].
    #[serde(rename = "masqueradeBit")]
    pub masquerade_bit: Option<i32>,
    /// SNAT all traffic sent to Service cluster IPs.
    #[serde(rename = "masqueradeAll")]
    pub masquerade_all: bool,
    /// Maximum interval between full resyncs.
    #[serde(rename = "syncPeriod")]
    pub sync_period: GoDuration,
    /// Minimum interval between resyncs.
    #[serde(rename = "minSyncPeriod")]
    pub min_sync_period: GoDuration,
}

/// Windows HNS settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct KubeProxyWinkernelConfiguration {
    /// HNS network used for endpoints and policies.
    #[serde(rename = "networkName")]
    pub network_name: String,
    /// Source VIP used for NAT when load balancing.
    #[serde(rename = "sourceVip")]
    pub source_vip: String,
    /// Create HNS policies with DSR.
    #[serde(rename = "enableDSR")]
    pub enable_dsr: bool,
    /// HNS endpoint attached to the root namespace's l2bridge.
    #[serde(rename = "rootHnsEndpointName")]
    pub root_hns_endpoint_name: String,
    /// Forward the Service VIP for health-check ports.
    #[serde(rename = "forwardHealthCheckVip")]
    pub forward_health_check_vip: bool,
}

/// Settings of the interface-based local traffic detectors.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DetectLocalConfiguration {
    /// Bridge whose traffic is local (`BridgeInterface` mode).
    #[serde(rename = "bridgeInterface")]
    pub bridge_interface: String,
    /// Interface name prefix whose traffic is local (`InterfaceNamePrefix` mode).
    #[serde(rename = "interfaceNamePrefix")]
    pub interface_name_prefix: String,
}

/// Connection-tracking settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct KubeProxyConntrackConfiguration {
    /// Tracked connections per CPU core; 0 leaves the limit as it is.
    #[serde(rename = "maxPerCore")]
    pub max_per_core: Option<i32>,
    /// Minimum conntrack table size, regardless of `maxPerCore`.
    #[serde(rename = "min")]
    pub min: Option<i32>,
    /// Idle timeout of established TCP connections; 0 leaves it as is.
    #[serde(rename = "tcpEstablishedTimeout")]
    pub tcp_established_timeout: Option<GoDuration>,
    /// Timeout of TCP connections in CLOSE_WAIT; 0 leaves it as is.
    #[serde(rename = "tcpCloseWaitTimeout")]
    pub tcp_close_wait_timeout: Option<GoDuration>,
    /// Do not mark out-of-window TCP packets INVALID.
    #[serde(rename = "tcpBeLiberal")]
    pub tcp_be_liberal: bool,
    /// Timeout of UNREPLIED UDP entries; 0 leaves it as is.
    #[serde(rename = "udpTimeout")]
    pub udp_timeout: GoDuration,
    /// Timeout of ASSURED UDP entries; 0 leaves it as is.
    #[serde(rename = "udpStreamTimeout")]
    pub udp_stream_timeout: GoDuration,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(QuantityVisitor)
    }
}

struct QuantityVisitor;

impl Visitor<'_> for QuantityVisitor {
    type Value = Quantity;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a quantity such as \"0\", \"512\", \"2Ki\" or \"1M\"")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Quantity, E> {
        Ok(Quantity(v.to_owned()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Quantity, E> {
        Ok(Quantity(v.to_string()))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Quantity, E> {
        Ok(Quantity(v.to_string()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Quantity, E> {
        Ok(Quantity(v.to_string()))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Quantity, E> {
        Ok(Quantity::default())
    }
}

impl Serialize for FlushFrequency {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.serialize_as_string {
            self.duration.serialize(serializer)
        } else {
            serializer.serialize_i64(self.duration.as_nanos())
        }
    }
}

impl<'de> Deserialize<'de> for FlushFrequency {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(FlushFrequencyVisitor)
    }
}

struct FlushFrequencyVisitor;

impl Visitor<'_> for FlushFrequencyVisitor {
    type Value = FlushFrequency;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a duration string such as \"5s\" or integer nanoseconds")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<FlushFrequency, E> {
        Ok(FlushFrequency {
            duration: GoDuration::parse(v).map_err(E::custom)?,
            serialize_as_string: true,
        })
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<FlushFrequency, E> {
        Ok(FlushFrequency {
            duration: GoDuration::from_nanos(v),
            serialize_as_string: false,
        })
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<FlushFrequency, E> {
        let nanos = i64::try_from(v).map_err(|_| E::custom("flushFrequency is too large"))?;
        self.visit_i64(nanos)
    }

    fn visit_unit<E: de::Error>(self) -> Result<FlushFrequency, E> {
        Ok(FlushFrequency::default())
    }
}
