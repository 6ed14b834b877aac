//! The data-plane modes this build offers, and how each is constructed.

use kp_config::{KubeProxyConfiguration, ProxyMode};
use kp_model::IpFamily;
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
}

/// The modes this build can run, in the order shown in messages.
const AVAILABLE: [ProxyMode; 0] = [];

/// The backend for `mode` and `family`; with `dry_run`, one that prints what
/// it would program instead of touching the kernel.
pub fn backend(
    mode: ProxyMode,
    family: IpFamily,
    config: &KubeProxyConfiguration,
    dry_run: bool,
) -> Result<Box<dyn Backend>, ModeError> {
    let _ = (family, config, dry_run);
    Err(unavailable(mode))
}

/// `--cleanup`: removes what every mode of this build (and upstream, whose
/// names we share) may have left behind.
pub fn cleanup(mode: ProxyMode) -> anyhow::Result<()> {
    Err(unavailable(mode).into())
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
