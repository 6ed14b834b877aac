//! The userspace mode as the binary builds it: a relay in this process
//! (listeners on the runtime the binary runs) behind nat portal rules, and
//! the removal of those rules.

use kp_config::KubeProxyConfiguration;
use kp_iptables::{Applier, DryRunApplier, IptablesFlavor, SystemApplier};
use kp_model::IpFamily;
use kp_sync::Backend;
use kp_userspace::{JumpCheck, RelayOptions, UserspaceBackend};

/// The userspace backend of `family`, its listeners on the current tokio
/// runtime (the binary calls this inside it), its connection counters in
/// the process's userspace metrics (`kp_userspace::metrics::register`
/// adds them to the metrics server); with `dry_run` the portal rules go to
/// stdout instead of the kernel, otherwise to the iptables flavor the host
/// uses.
pub fn backend(
    family: IpFamily,
    config: &KubeProxyConfiguration,
    dry_run: bool,
) -> anyhow::Result<Box<dyn Backend>> {
    let handle = tokio::runtime::Handle::try_current()
        .map_err(|_| anyhow::anyhow!("the userspace mode needs the proxy's runtime"))?;
    let options = relay_options(config)?;
    let backend = if dry_run {
        let applier = Box::new(DryRunApplier::new(Box::new(std::io::stdout())));
        // A dry run changes nothing: no routing file either.
        UserspaceBackend::new(handle, family, options, applier).with_routes_file(None)
    } else {
        let flavor = IptablesFlavor::detect();
        let applier = Box::new(SystemApplier::new(flavor));
        UserspaceBackend::new(handle, family, options, applier)
            .with_jump_check(JumpCheck::for_flavor(flavor))
    };
    kp_userspace::metrics::process_metrics().watch(family, backend.stats_registry());
    Ok(Box::new(backend))
}

/// The relay's options from the configuration: listener ports from
/// `portRange`, the UDP session idle timeout from `udpIdleTimeout` (unset,
/// as in a configuration that was never defaulted: upstream's 250ms), the
/// TCP idle timeout from `conntrack.tcpEstablishedTimeout` (the time the
/// node keeps an idle connection's NAT; unset or zero: its default, 24h).
fn relay_options(config: &KubeProxyConfiguration) -> anyhow::Result<RelayOptions> {
    let udp_idle_timeout = match config.udp_idle_timeout_std() {
        timeout if timeout.is_zero() => kp_userspace::DEFAULT_UDP_IDLE_TIMEOUT,
        timeout => timeout,
    };
    let tcp_idle_timeout = config
        .conntrack
        .tcp_established_timeout
        .and_then(|timeout| timeout.to_std())
        .filter(|timeout| !timeout.is_zero())
        .unwrap_or(kp_userspace::DEFAULT_TCP_IDLE_TIMEOUT);
    Ok(RelayOptions {
        port_range: config.effective_port_range()?,
        udp_idle_timeout,
        tcp_idle_timeout,
        ..RelayOptions::default()
    })
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
    let kp_userspace::UserspaceError::Cleanup { source, .. } = error;
    source.missing_program()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use super::*;

    #[test]
    fn relay_options_take_port_range_and_idle_timeouts_from_the_configuration() {
        let mut config = KubeProxyConfiguration::defaulted();
        assert_eq!(
            relay_options(&config).unwrap().udp_idle_timeout,
            Duration::from_millis(250)
        );
        config.port_range = "30000-30010".into();
        config.udp_idle_timeout = kp_config::GoDuration::from_secs(3);
        let options = relay_options(&config).unwrap();
        assert_eq!(options.port_range, Some((30000, 30010)));
        assert_eq!(options.udp_idle_timeout, Duration::from_secs(3));
        config.port_range = "30000+10".into();
        assert_eq!(
            relay_options(&config).unwrap().port_range,
            Some((30000, 30010))
        );
        config.port_range = "20-10".into();
        let error = relay_options(&config).unwrap_err().to_string();
        assert!(error.contains("portRange"), "{error}");
        assert_eq!(
            relay_options(&KubeProxyConfiguration::default())
                .unwrap()
                .udp_idle_timeout,
            Duration::from_millis(250),
            "unset means upstream's default"
        );
    }
}
