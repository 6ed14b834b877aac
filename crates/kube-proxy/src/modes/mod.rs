//! The data-plane modes this build offers, and how each is constructed.

mod iptables;
mod ipvs;
mod nftables;
mod userspace;

pub use iptables::node_port_addresses;

use kp_config::{KubeProxyConfiguration, NftablesLayout, ProxyMode};
use kp_model::IpFamily;
use kp_node::SysctlSetting;
use kp_sync::Backend;

/// A mode the operator asked for cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ModeError {
    /// This build does not contain the mode.
    #[error("mode {mode} is not available in this build (available: {available})")]
    Unavailable {
        /// The mode asked for.
        mode: &'static str,
        /// The modes this build offers.
        available: String,
    },
    /// The configuration cannot be turned into the mode's settings.
    #[error("mode {mode}: {source:#}")]
    Config {
        /// The mode asked for.
        mode: &'static str,
        /// What was wrong.
        #[source]
        source: anyhow::Error,
    },
}

/// The modes this build can run, in the order shown in messages.
const AVAILABLE: [ProxyMode; 4] = [
    ProxyMode::Iptables,
    ProxyMode::Nftables,
    ProxyMode::Ipvs,
    ProxyMode::Userspace,
];

/// The backend for `mode` and `family`; with `dry_run`, one that prints what
/// it would program (to stdout) instead of touching the kernel.
/// `nftables_layout` is `--nftables-layout`, read by the nftables mode only.
pub fn backend(
    mode: ProxyMode,
    family: IpFamily,
    config: &KubeProxyConfiguration,
    nftables_layout: NftablesLayout,
    dry_run: bool,
) -> Result<Box<dyn Backend>, ModeError> {
    match mode {
        ProxyMode::Iptables => {
            iptables::backend(family, config, dry_run).map_err(|source| ModeError::Config {
                mode: mode.as_str(),
                source,
            })
        }
        ProxyMode::Nftables => {
            nftables::backend(family, config, nftables_layout, dry_run).map_err(|source| {
                ModeError::Config {
                    mode: mode.as_str(),
                    source,
                }
            })
        }
        ProxyMode::Ipvs => {
            ipvs::backend(family, config, dry_run).map_err(|source| ModeError::Config {
                mode: mode.as_str(),
                source,
            })
        }
        ProxyMode::Userspace => {
            userspace::backend(family, config, dry_run).map_err(|source| ModeError::Config {
                mode: mode.as_str(),
                source,
            })
        }
        _ => Err(unavailable(mode)),
    }
}

/// The kernel parameters `mode` needs with `config`, as the mode lists
/// them (it ensures them itself when it starts; `--init-only` sets them
/// before): `route_localnet` for localhost NodePorts in the iptables mode,
/// the IPVS mode's own, none for the others.
pub fn node_sysctls(
    mode: ProxyMode,
    config: &KubeProxyConfiguration,
) -> anyhow::Result<Vec<SysctlSetting>> {
    Ok(match mode {
        ProxyMode::Iptables => {
            kp_iptables::node_sysctls(&iptables::options(config)?, &node_port_addresses(config)?)
        }
        ProxyMode::Ipvs => kp_ipvs::node_sysctls(&ipvs::options(config, None)?),
        _ => Vec::new(),
    })
}

/// The IP families `mode` serves on this host: for a dry run both, which
/// touches nothing; otherwise those the mode can program here (see
/// [`iptables::families`]).
pub fn families(mode: ProxyMode, dry_run: bool) -> Vec<IpFamily> {
    match mode {
        // The IPVS mode's masquerade and filter rules and the userspace
        // mode's portals are iptables rules.
        ProxyMode::Iptables | ProxyMode::Ipvs | ProxyMode::Userspace if !dry_run => {
            iptables::families()
        }
        _ => vec![IpFamily::V4, IpFamily::V6],
    }
}

/// `--cleanup`: removes what the modes of this build (and upstream, whose
/// names we share) may have left behind, whichever mode is configured.
pub fn cleanup(mode: ProxyMode) -> anyhow::Result<()> {
    tracing::info!(
        configured = mode.as_str(),
        "Removing the rules of every mode this build has"
    );
    // The portals' jumps go before the iptables mode removes our chains.
    let userspace = userspace::cleanup();
    let iptables = iptables::cleanup();
    let nftables = nftables::cleanup();
    let ipvs = ipvs::cleanup();
    userspace?;
    iptables?;
    nftables?;
    ipvs?;
    Ok(())
}

/// Removes, at start, what the other modes left behind that would act on
/// the same traffic, as upstream does: every other mode's tables, chains,
/// portals, link, sets and virtual servers, except the iptables mode's
/// chains in the IPVS mode (which programs the same chains). The portal
/// chains go before the iptables mode's chains, as in `--cleanup`. A failure
/// is logged; it does not stop the proxy.
pub fn remove_leftovers(mode: ProxyMode) {
    if mode != ProxyMode::Nftables {
        nftables::remove_leftovers();
    }
    if mode != ProxyMode::Userspace {
        userspace::remove_leftovers();
    }
    if matches!(mode, ProxyMode::Nftables | ProxyMode::Userspace) {
        if let Err(error) = iptables::cleanup() {
            tracing::warn!(error = %format!("{error:#}"), "Cannot remove the iptables mode's rules");
        }
    }
    if mode != ProxyMode::Ipvs {
        ipvs::remove_leftovers();
    }
}

fn unavailable(mode: ProxyMode) -> ModeError {
    let available = if AVAILABLE.is_empty() {
        "none yet".to_owned()
    } else {
        AVAILABLE
            .iter()
            .map(|m| m.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    ModeError::Unavailable {
        mode: mode.as_str(),
        available,
    }
}
