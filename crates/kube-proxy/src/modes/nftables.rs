//! The nftables mode as the binary builds it, and the removal of its
//! tables (`ip kube-proxy`, `ip6 kube-proxy`, owned entirely by the mode).

use kp_config::KubeProxyConfiguration;
use kp_model::IpFamily;
use kp_sync::Backend;

/// The nftables backend of `family`: printing every transaction to stdout
/// with `dry_run`, otherwise committing over netlink.
pub fn backend(
    family: IpFamily,
    config: &KubeProxyConfiguration,
    dry_run: bool,
) -> anyhow::Result<Box<dyn Backend>> {
    Ok(Box::new(kp_nftables::from_config(config, family, dry_run)?))
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
