//! Typed views of a configuration, with upstream's platform defaults applied
//! (what the running proxy actually uses).

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ipnet::IpNet;

use crate::duration::GoDuration;
use crate::netutil::split_host_port;
use crate::types::KubeProxyConfiguration;

/// The proxy implementation to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProxyMode {
    /// iptables NAT rules (the Linux default).
    Iptables,
    /// Kernel IPVS virtual servers.
    Ipvs,
    /// An nftables table `kube-proxy`.
    Nftables,
    /// A userspace TCP/UDP proxy (offered by kube-proxy-rs; removed upstream).
    Userspace,
    /// Windows HNS; never valid on Linux.
    KernelSpace,
}

/// How traffic from local pods is recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LocalMode {
    /// Source IP inside `clusterCIDR` (the default).
    ClusterCidr,
    /// Source IP inside the Node's `podCIDR`.
    NodeCidr,
    /// Arrives from `detectLocal.bridgeInterface`.
    BridgeInterface,
    /// Arrives from an interface whose name starts with `detectLocal.interfaceNamePrefix`.
    InterfaceNamePrefix,
}

/// A value of the configuration that cannot be interpreted; [`crate::validate`]
/// reports the same problems with full detail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: invalid value {value:?}: {expected}")]
pub struct InvalidValue {
    /// Dotted path of the field.
    pub field: &'static str,
    /// The value found.
    pub value: String,
    /// What would be valid.
    pub expected: &'static str,
}

impl ProxyMode {
    /// Every mode name accepted on Linux, in the order shown in messages.
    pub const LINUX_NAMES: [&'static str; 4] = ["iptables", "ipvs", "nftables", "userspace"];

    /// Parses a mode name; the empty string is the Linux default, iptables.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "" | "iptables" => Some(ProxyMode::Iptables),
            "ipvs" => Some(ProxyMode::Ipvs),
            "nftables" => Some(ProxyMode::Nftables),
            "userspace" => Some(ProxyMode::Userspace),
            "kernelspace" => Some(ProxyMode::KernelSpace),
            _ => None,
        }
    }

    /// The name used in flags and files.
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyMode::Iptables => "iptables",
            ProxyMode::Ipvs => "ipvs",
            ProxyMode::Nftables => "nftables",
            ProxyMode::Userspace => "userspace",
            ProxyMode::KernelSpace => "kernelspace",
        }
    }
}

impl fmt::Display for ProxyMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl LocalMode {
    /// Every accepted name (the empty string means `ClusterCIDR`).
    pub const NAMES: [&'static str; 5] = [
        "ClusterCIDR",
        "NodeCIDR",
        "BridgeInterface",
        "InterfaceNamePrefix",
        "",
    ];

    /// Parses a detectLocalMode name; the empty string means `ClusterCIDR`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "" | "ClusterCIDR" => Some(LocalMode::ClusterCidr),
            "NodeCIDR" => Some(LocalMode::NodeCidr),
            "BridgeInterface" => Some(LocalMode::BridgeInterface),
            "InterfaceNamePrefix" => Some(LocalMode::InterfaceNamePrefix),
            _ => None,
        }
    }
}

/// The sync periods the selected backend uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncPeriods {
    /// Maximum interval between full syncs.
    pub sync_period: Duration,
    /// Minimum interval between syncs.
    pub min_sync_period: Duration,
}

impl KubeProxyConfiguration {
    /// The proxy mode in force; empty means iptables.
    pub fn effective_mode(&self) -> Result<ProxyMode, InvalidValue> {
        ProxyMode::parse(&self.mode).ok_or_else(|| InvalidValue {
            field: "mode",
            value: self.mode.clone(),
            expected: "one of iptables, ipvs, nftables, userspace, or empty",
        })
    }

    /// The local-traffic detector in force; empty means ClusterCIDR.
    pub fn effective_detect_local_mode(&self) -> Result<LocalMode, InvalidValue> {
        LocalMode::parse(&self.detect_local_mode).ok_or_else(|| InvalidValue {
            field: "detectLocalMode",
            value: self.detect_local_mode.clone(),
            expected:
                "one of ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix, or empty",
        })
    }

    /// The raw (Go) sync periods of the section the mode uses: `ipvs` for
    /// IPVS, `nftables` for nftables, `iptables` otherwise, as upstream's
    /// conversion does.
    pub fn mode_sync_periods(&self) -> (GoDuration, GoDuration) {
        match ProxyMode::parse(&self.mode) {
            Some(ProxyMode::Ipvs) => (self.ipvs.sync_period, self.ipvs.min_sync_period),
            Some(ProxyMode::Nftables) => (self.nftables.sync_period, self.nftables.min_sync_period),
            _ => (self.iptables.sync_period, self.iptables.min_sync_period),
        }
    }

    /// The sync periods in force, or `None` when one is negative.
    pub fn sync_periods(&self) -> Option<SyncPeriods> {
        let (sync, min_sync) = self.mode_sync_periods();
        Some(SyncPeriods {
            sync_period: sync.to_std()?,
            min_sync_period: min_sync.to_std()?,
        })
    }

    /// Whether all Service traffic is SNATed (the selected backend's masqueradeAll).
    pub fn effective_masquerade_all(&self) -> bool {
        match ProxyMode::parse(&self.mode) {
            Some(ProxyMode::Nftables) => self.nftables.masquerade_all,
            _ => self.iptables.masquerade_all,
        }
    }

    /// The node IP override, if bindAddress is not a wildcard.
    pub fn bind_ip(&self) -> Result<Option<IpAddr>, InvalidValue> {
        let ip: IpAddr = self.bind_address.parse().map_err(|_| InvalidValue {
            field: "bindAddress",
            value: self.bind_address.clone(),
            expected: "an IP address",
        })?;
        Ok((!ip.is_unspecified()).then_some(ip))
    }

    /// The health server address; `None` when disabled (empty).
    pub fn healthz_socket_addr(&self) -> Result<Option<SocketAddr>, InvalidValue> {
        parse_socket_addr("healthzBindAddress", &self.healthz_bind_address)
    }

    /// The metrics server address; `None` when disabled (empty).
    pub fn metrics_socket_addr(&self) -> Result<Option<SocketAddr>, InvalidValue> {
        parse_socket_addr("metricsBindAddress", &self.metrics_bind_address)
    }

    /// The pod CIDRs from clusterCIDR (empty when unset).
    pub fn cluster_cidrs(&self) -> Result<Vec<IpNet>, InvalidValue> {
        if self.cluster_cidr.is_empty() {
            return Ok(Vec::new());
        }
        self.cluster_cidr
            .split(',')
            .map(|cidr| {
                cidr.parse::<IpNet>().map_err(|_| InvalidValue {
                    field: "clusterCIDR",
                    value: self.cluster_cidr.clone(),
                    expected: "a CIDR or a comma-separated dual-stack pair of CIDRs",
                })
            })
            .collect()
    }

    /// nodePortAddresses with the platform default applied: unset means
    /// `["primary"]` in nftables mode and all addresses (empty) otherwise.
    /// `["all"]` (a kube-proxy-rs addition) asks for all addresses in every
    /// mode, which upstream's nftables mode cannot express.
    pub fn effective_node_port_addresses(&self) -> Vec<String> {
        match &self.node_port_addresses {
            Some(list) if list.len() == 1 && list[0] == "all" => Vec::new(),
            Some(list) if !list.is_empty() => list.clone(),
            _ if self.effective_mode() == Ok(ProxyMode::Nftables) => vec!["primary".to_owned()],
            _ => Vec::new(),
        }
    }

    /// configSyncPeriod as a `Duration` (zero if negative; validation rejects that).
    pub fn config_sync_period_std(&self) -> Duration {
        self.config_sync_period.to_std().unwrap_or_default()
    }

    /// udpIdleTimeout as a `Duration` (zero if negative; validation rejects that).
    pub fn udp_idle_timeout_std(&self) -> Duration {
        self.udp_idle_timeout.to_std().unwrap_or_default()
    }

    /// `portRange` as its first and last port (`None`: empty, any port), as
    /// upstream's `utilnet.ParsePortRange` reads `N`, `A-B` and `A+N`.
    pub fn effective_port_range(&self) -> Result<Option<(u16, u16)>, InvalidValue> {
        crate::validation::parse_port_range(&self.port_range).map_err(|reason| InvalidValue {
            field: "portRange",
            value: self.port_range.clone(),
            expected: reason,
        })
    }
}

fn parse_socket_addr(field: &'static str, value: &str) -> Result<Option<SocketAddr>, InvalidValue> {
    if value.is_empty() {
        return Ok(None);
    }
    let invalid = || InvalidValue {
        field,
        value: value.to_owned(),
        expected: "IP:port (e.g. 0.0.0.0:10256 or [::]:10256), or empty to disable",
    };
    let (host, port) = split_host_port(value).ok_or_else(invalid)?;
    let ip: IpAddr = host.parse().map_err(|_| invalid())?;
    let port: u16 = port.parse().map_err(|_| invalid())?;
    Ok(Some(SocketAddr::new(ip, port)))
}
