//! The data-plane modes this build offers, and how each is constructed.

mod iptables;

pub use iptables::node_port_addresses;

use kp_config::{KubeProxyConfiguration, ProxyMode};
use kp_model::{IpFamily, NodeInfo};
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
const AVAILABLE: [ProxyMode; 1] = [ProxyMode::Iptables];

/// The backend for `mode` and `family`; with `dry_run`, one that prints what
/// it would program (to stdout) instead of touching the kernel.
pub fn backend(
    mode: ProxyMode,
    family: IpFamily,
    config: &KubeProxyConfiguration,
    node: &NodeInfo,
    dry_run: bool,
) -> Result<Box<dyn Backend>, ModeError> {
    match mode {
        ProxyMode::Iptables => {
            iptables::backend(family, config, node, dry_run).map_err(|source| ModeError::Config {
                mode: mode.as_str(),
                source,
            })
        }
        _ => Err(unavailable(mode)),
    }
}

/// `--cleanup`: removes what the modes of this build (and upstream, whose
/// names we share) may have left behind, whichever mode is configured.
pub fn cleanup(mode: ProxyMode) -> anyhow::Result<()> {
    tracing::info!(
        configured = mode.as_str(),
        "Removing the rules of every mode this build has"
    );
    iptables::cleanup()
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
