//! The IPVS mode as the binary builds it: the backend (after the kernel
//! capability check, which ends the start with upstream's message when the
//! node cannot run IPVS) and the removal of what the mode leaves behind.

use kp_config::KubeProxyConfiguration;
use kp_model::IpFamily;
use kp_sync::Backend;

/// The IPVS backend of `family`: printing its plan to stdout with
/// `dry_run` (no kernel check), otherwise programming IPVS, ipsets,
/// `kube-ipvs0` and the mode's iptables rules.
pub fn backend(
    family: IpFamily,
    config: &KubeProxyConfiguration,
    dry_run: bool,
) -> anyhow::Result<Box<dyn Backend>> {
    Ok(kp_ipvs::build_backend(family, config, dry_run)?)
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
