//! The IPVS mode as the binary builds it: the backend (after the kernel
//! capability check, which ends the start with upstream's message when the
//! node cannot run IPVS) and the removal of what the mode leaves behind.

use ipnet::IpNet;
use kp_config::{InvalidValue, KubeProxyConfiguration};
use kp_ipvs::{IpvsBackend, IpvsOptions, KernelVersion};
use kp_model::IpFamily;
use kp_node::{LocalDetector, MasqueradeMark, NodePortAddresses};
use kp_sync::Backend;

/// The IPVS backend of `family`. With `dry_run` it prints each sync's plan
/// to stdout and checks nothing; otherwise it runs the mode's start-up
/// check first (an error here ends the process with status 1: upstream
/// does not fall back to another mode) and programs this host's kernel.
pub fn backend(
    family: IpFamily,
    config: &KubeProxyConfiguration,
    dry_run: bool,
) -> anyhow::Result<Box<dyn Backend>> {
    if dry_run {
        let options = options(config, None)?;
        let output = Box::new(std::io::stdout());
        return Ok(Box::new(IpvsBackend::dry_run(family, options, output)));
    }
    let version = kp_ipvs::check_host(&config.ipvs.scheduler)?;
    let options = options(config, Some(version))?;
    Ok(Box::new(kp_ipvs::system_backend(family, options)))
}

/// The mode's settings from the configuration, on a kernel of
/// `kernel_version` (`None`: unknown, as for a dry run).
pub fn options(
    config: &KubeProxyConfiguration,
    kernel_version: Option<KernelVersion>,
) -> anyhow::Result<IpvsOptions> {
    let mut exclude_cidrs = Vec::new();
    for text in config.ipvs.exclude_cidrs.iter().flatten() {
        let cidr: IpNet = text.parse().map_err(|_| InvalidValue {
            field: "ipvs.excludeCIDRs",
            value: text.clone(),
            expected: "CIDRs such as 10.0.0.0/8",
        })?;
        exclude_cidrs.push(cidr);
    }
    let scheduler = kp_ipvs::capability::scheduler_or_default(&config.ipvs.scheduler)?;
    let duration = |value: kp_config::GoDuration| value.to_std().unwrap_or_default();
    Ok(IpvsOptions {
        scheduler: scheduler.to_owned(),
        exclude_cidrs,
        strict_arp: config.ipvs.strict_arp,
        timeouts: [
            duration(config.ipvs.tcp_timeout),
            duration(config.ipvs.tcp_fin_timeout),
            duration(config.ipvs.udp_timeout),
        ],
        masquerade_mark: MasqueradeMark::from_config(
            config.iptables.masquerade_bit,
            "iptables.masqueradeBit",
        )?,
        masquerade_all: config.iptables.masquerade_all,
        local_detector: LocalDetector::from_config(config)?,
        node_port_addresses: NodePortAddresses::from_config(config)?,
        kernel_version,
    })
}

/// `--cleanup`: `kube-ipvs0`, the mode's ipsets, its virtual servers (and
/// no one else's) and its chains.
pub fn cleanup() -> anyhow::Result<()> {
    let report = kp_ipvs::cleanup()?;
    tracing::info!(report = ?report, "Removed the IPVS mode's state");
    Ok(())
}

/// At the start of another mode: what a former IPVS proxy left on the node
/// would catch the same traffic, so it goes. A failure is logged.
pub fn remove_leftovers() {
    if !kp_ipvs::has_leftovers() {
        return;
    }
    match kp_ipvs::cleanup() {
        Ok(report) => tracing::info!(report = ?report, "Removed the IPVS mode's leftovers"),
        Err(error) => tracing::warn!(
            error = %kp_sync::error_chain(&error),
            "Cannot remove the IPVS mode's leftovers"
        ),
    }
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
        let error = format!("{:#}", super::options(&config, None).unwrap_err());
        assert!(
            error.contains("ipvs.excludeCIDRs") && error.contains("10.0.0.0/33"),
            "{error}"
        );
        config.ipvs.exclude_cidrs = None;
        config.ipvs.scheduler = "fastest".into();
        let error = format!("{:#}", super::options(&config, None).unwrap_err());
        assert!(error.contains("ipvs.scheduler"), "{error}");
    }
}
