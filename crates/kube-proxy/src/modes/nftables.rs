//! The nftables mode as the binary builds it, and the removal of its
//! tables (`ip kube-proxy`, `ip6 kube-proxy`, owned entirely by the mode).

use kp_config::{KubeProxyConfiguration, NftablesLayout};
use kp_model::IpFamily;
use kp_nftables::NftablesOptions;
use kp_node::{LocalDetector, MasqueradeMark, NodePortAddresses};
use kp_sync::Backend;

/// The nftables backend of `family`: printing every transaction to stdout
/// with `dry_run`, otherwise committing over netlink. `nodePortAddresses`
/// unset means `primary` in this mode. `layout` is `--nftables-layout`.
pub fn backend(
    family: IpFamily,
    config: &KubeProxyConfiguration,
    layout: NftablesLayout,
    dry_run: bool,
) -> anyhow::Result<Box<dyn Backend>> {
    let options = options(config)?;
    let addresses = NodePortAddresses::from_config(config)?;
    let layout = match layout {
        NftablesLayout::Chains => kp_nftables::Layout::Chains,
        NftablesLayout::Data => kp_nftables::Layout::Data,
    };
    Ok(Box::new(
        kp_nftables::build(family, options, addresses, dry_run)?.with_layout(layout),
    ))
}

/// The mode's settings: `nftables.masqueradeBit`, `nftables.masqueradeAll`,
/// and `detectLocalMode` with `clusterCIDR` or `detectLocal`.
fn options(config: &KubeProxyConfiguration) -> anyhow::Result<NftablesOptions> {
    let options = NftablesOptions {
        masquerade_mark: MasqueradeMark::from_config(
            config.nftables.masquerade_bit,
            "nftables.masqueradeBit",
        )?,
        masquerade_all: config.nftables.masquerade_all,
        local_detector: LocalDetector::from_config(config)?,
    };
    options.validate()?;
    Ok(options)
}

/// Deletes both tables (a table that does not exist is no error).
pub fn cleanup() -> anyhow::Result<()> {
    kp_nftables::cleanup()?;
    tracing::info!("Removed the nftables mode's tables");
    Ok(())
}

/// At the start of another mode: the nftables mode's tables would act on
/// the same traffic, so they go, as upstream removes them. A failure is
/// logged.
pub fn remove_leftovers() {
    if let Err(error) = kp_nftables::cleanup() {
        tracing::warn!(
            error = %kp_sync::error_chain(&error),
            "Cannot remove the nftables mode's tables"
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn the_configuration_maps_onto_the_options() {
        let mut config = KubeProxyConfiguration::defaulted();
        config.mode = "nftables".to_owned();
        config.cluster_cidr = "10.244.0.0/16".to_owned();
        config.nftables.masquerade_bit = Some(40);
        let error = format!(
            "{:#}",
            backend(IpFamily::V4, &config, NftablesLayout::Chains, true)
                .err()
                .unwrap()
        );
        assert!(error.contains("nftables.masqueradeBit"), "{error}");

        config.nftables.masquerade_bit = Some(15);
        config.node_port_addresses = Some(vec!["not-a-cidr".to_owned()]);
        let error = format!(
            "{:#}",
            backend(IpFamily::V4, &config, NftablesLayout::Chains, true)
                .err()
                .unwrap()
        );
        assert!(error.contains("nodePortAddresses"), "{error}");

        config.node_port_addresses = None;
        let options = options(&config).unwrap();
        assert_eq!(options.masquerade_mark.to_string(), "0x00008000");
        assert!(matches!(
            options.local_detector,
            LocalDetector::ClusterCidr(_)
        ));
        assert!(backend(IpFamily::V4, &config, NftablesLayout::Chains, true).is_ok());
    }
}
