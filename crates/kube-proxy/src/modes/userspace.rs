//! The userspace mode as the binary builds it: a relay in this process
//! (listeners on the runtime the binary runs) behind nat portal rules, and
//! the removal of those rules.

use kp_config::KubeProxyConfiguration;
use kp_iptables::{Applier, IptablesFlavor, SystemApplier};
use kp_model::IpFamily;
use kp_sync::Backend;

/// The userspace backend of `family`, its listeners on the current tokio
/// runtime (the binary calls this inside it), its connection counters in
/// the process's userspace metrics (`kp_userspace::metrics::register`
/// adds them to the metrics server); with `dry_run` the portal rules go to
/// stdout instead of the kernel.
pub fn backend(
    family: IpFamily,
    config: &KubeProxyConfiguration,
    dry_run: bool,
) -> anyhow::Result<Box<dyn Backend>> {
    let handle = tokio::runtime::Handle::try_current()
        .map_err(|_| anyhow::anyhow!("the userspace mode needs the proxy's runtime"))?;
    let backend = kp_userspace::UserspaceBackend::from_config(config, family, dry_run, handle)?;
    kp_userspace::metrics::process_metrics().watch(family, backend.stats_registry());
    Ok(Box::new(backend))
}

/// `--cleanup`: the portal chains and their jumps, in both families. Runs
/// before the iptables mode's cleanup, which cannot delete a chain that a
/// jump still uses.
pub fn cleanup() -> anyhow::Result<()> {
    let mut applier = SystemApplier::new(IptablesFlavor::detect());
    let mut removed = 0;
    for family in [IpFamily::V4, IpFamily::V6] {
        match kp_userspace::cleanup(&mut applier, family) {
            Ok(count) => removed += count,
            // A host without iptables for a family has no portals in it,
            // and the other modes' cleanups still run.
            Err(error) if missing_program(&error).is_some() => {
                tracing::warn!(
                    family = %family,
                    program = missing_program(&error).unwrap_or_default(),
                    "Skipping the userspace mode's portal rules of a family without its iptables program"
                );
            }
            Err(error) => return Err(error.into()),
        }
    }
    tracing::info!(removed, "Removed the userspace mode's portal rules");
    Ok(())
}

/// At the start of another mode: the portal rules a userspace proxy left
/// would send Service traffic to listeners that are gone. The mode creates
/// its chains together, so one lookup per family (one iptables run) tells
/// whether there is anything to remove.
pub fn remove_leftovers() {
    let mut applier = SystemApplier::new(IptablesFlavor::detect());
    for family in [IpFamily::V4, IpFamily::V6] {
        let chain = kp_userspace::portal::KUBE_PORTALS_CONTAINER;
        match applier.chain_exists(family, kp_iptables::Table::Nat, chain) {
            Ok(true) => {}
            Ok(false) => continue,
            // No iptables for this family: no portals either.
            Err(error) => {
                tracing::debug!(family = ?family, error = %error, "No userspace portal chains looked for");
                continue;
            }
        }
        match kp_userspace::cleanup(&mut applier, family) {
            Ok(0) => {}
            Ok(removed) => {
                tracing::info!(family = ?family, removed, "Removed the userspace mode's portal rules");
            }
            Err(error) => tracing::warn!(
                family = ?family,
                error = %kp_sync::error_chain(&error),
                "Cannot remove the userspace mode's portal rules"
            ),
        }
    }
}

/// The iptables program whose absence made `error`, if that was the cause.
fn missing_program(error: &kp_userspace::UserspaceError) -> Option<&str> {
    match error {
        kp_userspace::UserspaceError::Cleanup { source, .. } => source.missing_program(),
        _ => None,
    }
}
