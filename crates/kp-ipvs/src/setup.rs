//! What the binary calls: the start-up check, the backend built from the
//! configuration, and `--cleanup`.

use std::io;

use ipnet::IpNet;
use kp_config::KubeProxyConfiguration;
use kp_iptables::{Applier, IptablesFlavor, SystemApplier};
use kp_model::IpFamily;
use kp_node::{LocalDetector, MasqueradeMark, NodePortAddresses};
use kp_sync::Backend;

use crate::backend::{IpvsBackend, IpvsOptions};
use crate::capability::{check_ipset_version, CapabilityError, HostKernel, KernelVersion};
use crate::cleanup::{cleanup_with, CleanupError, CleanupReport};
use crate::netlink::NetlinkKernel;

/// Upstream's warning when the IPVS mode starts (v1.35, KEP-5495).
pub const DEPRECATION_WARNING: &str =
    "The ipvs proxier is now deprecated and may be removed in a future release. Please use 'nftables' instead.";

/// Why the IPVS mode cannot start.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The node cannot run the mode (`can't use the IPVS proxier: …`).
    #[error("can't use the IPVS proxier: {0}")]
    Capability(#[from] CapabilityError),
    /// A configuration value is invalid.
    #[error("invalid configuration: field {field}: value {value:?} is invalid; valid values are {valid}")]
    InvalidOption {
        /// The field, e.g. `ipvs.excludeCIDRs`.
        field: &'static str,
        /// The offending value.
        value: String,
        /// What would be valid.
        valid: &'static str,
    },
}

impl From<kp_node::InvalidValue> for SetupError {
    fn from(error: kp_node::InvalidValue) -> Self {
        Self::InvalidOption {
            field: error.field,
            value: error.value,
            valid: error.expected,
        }
    }
}

/// Upstream's start-up check on this host: kernel modules (loading missing
/// ones with modprobe), then the kernel's ipset protocol.
pub fn check_host(config: &KubeProxyConfiguration) -> Result<KernelVersion, SetupError> {
    let version = HostKernel::new().check_modules(&config.ipvs.scheduler)?;
    let protocol = NetlinkKernel::new()
        .ipset_protocol()
        .map_err(|error| CapabilityError::IpsetUnavailable(error.to_string()))?;
    check_ipset_version(u32::from(protocol))?;
    Ok(version)
}

/// The mode's settings from the configuration.
pub fn options(
    config: &KubeProxyConfiguration,
    kernel_version: Option<KernelVersion>,
) -> Result<IpvsOptions, SetupError> {
    let invalid = |field, value: String, valid| SetupError::InvalidOption {
        field,
        value,
        valid,
    };
    let mut exclude_cidrs = Vec::new();
    for text in config.ipvs.exclude_cidrs.iter().flatten() {
        let cidr: IpNet = text.parse().map_err(|_| {
            invalid(
                "ipvs.excludeCIDRs",
                text.clone(),
                "CIDRs such as 10.0.0.0/8",
            )
        })?;
        exclude_cidrs.push(cidr);
    }
    let scheduler = crate::capability::scheduler_or_default(&config.ipvs.scheduler)?.to_owned();
    let local_detector = LocalDetector::from_config(config)?;
    let masquerade_bit =
        MasqueradeMark::from_config(config.iptables.masquerade_bit, "iptables.masqueradeBit")?
            .bit();
    let node_port_addresses = NodePortAddresses::from_config(config)?;
    let duration = |value: kp_config::GoDuration| value.to_std().unwrap_or_default();
    Ok(IpvsOptions {
        scheduler,
        exclude_cidrs,
        strict_arp: config.ipvs.strict_arp,
        timeouts: [
            duration(config.ipvs.tcp_timeout),
            duration(config.ipvs.tcp_fin_timeout),
            duration(config.ipvs.udp_timeout),
        ],
        masquerade_bit,
        masquerade_all: config.iptables.masquerade_all,
        local_detector,
        node_port_addresses,
        kernel_version,
    })
}

/// The IPVS backend of `family`. With `dry_run` it prints each sync's plan
/// to stdout and checks nothing; otherwise it runs [`check_host`] first (an
/// error here must end the process with status 1: upstream does not fall
/// back to another mode), logs upstream's deprecation warning, and
/// programs the kernel with the detected iptables flavor.
pub fn backend(
    family: IpFamily,
    config: &KubeProxyConfiguration,
    dry_run: bool,
) -> Result<Box<dyn Backend>, SetupError> {
    if dry_run {
        let options = options(config, None)?;
        return Ok(Box::new(IpvsBackend::dry_run(
            family,
            options,
            Box::new(io::stdout()),
        )));
    }
    let version = check_host(config)?;
    let options = options(config, Some(version))?;
    // Once per process, as upstream, also when both families start.
    static ANNOUNCED: std::sync::Once = std::sync::Once::new();
    ANNOUNCED.call_once(|| {
        tracing::info!("Using ipvs Proxier");
        tracing::error!("{DEPRECATION_WARNING}");
    });
    let applier = SystemApplier::new(IptablesFlavor::detect());
    Ok(Box::new(IpvsBackend::new(
        family,
        options,
        Box::new(NetlinkKernel::new()),
        Box::new(applier),
    )))
}

/// `--cleanup` of the IPVS mode, on this host: with both iptables flavors
/// whose programs exist. Safe on a host without IPVS.
pub fn cleanup() -> Result<CleanupReport, CleanupError> {
    let mut kernel = NetlinkKernel::new();
    let mut legacy = SystemApplier::new(IptablesFlavor::Legacy);
    let mut nft = SystemApplier::new(IptablesFlavor::Nft);
    let mut appliers: Vec<&mut dyn Applier> = Vec::new();
    if program_exists("iptables-legacy-save") {
        appliers.push(&mut legacy);
    }
    if program_exists("iptables-nft-save") {
        appliers.push(&mut nft);
    }
    cleanup_with(&mut kernel, &mut appliers)
}

/// Whether the IPVS mode left something on this node (kube-ipvs0 or one of
/// its sets): a proxy starting in another mode then runs [`cleanup`], so
/// moving a node off IPVS leaves nothing behind. Errors count as "no".
pub fn has_leftovers() -> bool {
    let mut link = crate::netlink::link::DummyLink::new();
    if matches!(link.index(), Ok(Some(_))) {
        return true;
    }
    let mut ipset = crate::netlink::ipset::IpsetNetlink::new();
    [IpFamily::V4, IpFamily::V6].into_iter().any(|family| {
        let name = crate::state::SetKind::ClusterIp.name(family);
        matches!(ipset.list(name, family), Ok(Some(_)))
    })
}

fn program_exists(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(name).is_file()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn options_come_from_the_configuration_and_bad_values_name_their_field() {
        let mut config = KubeProxyConfiguration::default();
        config.ipvs.scheduler = "mh".into();
        config.ipvs.exclude_cidrs = Some(vec!["198.51.100.0/24".into()]);
        config.ipvs.tcp_timeout = kp_config::GoDuration::parse("15m").unwrap();
        config.cluster_cidr = "10.244.0.0/16".into();
        let options = options(&config, None).unwrap();
        assert_eq!(options.scheduler, "mh");
        assert_eq!(
            options.exclude_cidrs,
            ["198.51.100.0/24".parse::<IpNet>().unwrap()]
        );
        assert_eq!(options.timeouts[0].as_secs(), 900);
        assert!(matches!(
            options.local_detector,
            LocalDetector::ClusterCidr(_)
        ));

        config.ipvs.exclude_cidrs = Some(vec!["10.0.0.0/33".into()]);
        let error = super::options(&config, None).unwrap_err().to_string();
        assert!(
            error.contains("ipvs.excludeCIDRs") && error.contains("10.0.0.0/33"),
            "{error}"
        );
        config.ipvs.exclude_cidrs = None;
        config.ipvs.scheduler = "fastest".into();
        let error = super::options(&config, None).unwrap_err().to_string();
        assert!(error.contains("ipvs.scheduler"), "{error}");
    }

    /// On a host without IPVS (the build machines) the real start-up check
    /// fails with upstream's message naming the modules.
    #[test]
    fn the_host_check_names_missing_modules_where_ipvs_is_absent() {
        if std::path::Path::new("/proc/net/ip_vs").exists() {
            check_host(&KubeProxyConfiguration::default()).expect("this kernel has IPVS and ipset");
            return;
        }
        let error = check_host(&KubeProxyConfiguration::default())
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("can't use the IPVS proxier: IPVS proxier will not be used because the following required kernel modules are not loaded: [ip_vs"),
            "{error}"
        );
    }
}
