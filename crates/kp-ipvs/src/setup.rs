//! What the binary calls: the start-up check, the backend on this host's
//! kernel, and `--cleanup`. The binary maps the configuration to
//! [`IpvsOptions`].

use kp_iptables::{Applier, IptablesFlavor, SystemApplier};
use kp_model::IpFamily;

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
}

/// Upstream's start-up check on this host: kernel modules (loading missing
/// ones with modprobe) for `scheduler` (`ipvs.scheduler`), then the
/// kernel's ipset protocol.
pub fn check_host(scheduler: &str) -> Result<KernelVersion, SetupError> {
    let version = HostKernel::new().check_modules(scheduler)?;
    let protocol = NetlinkKernel::new()
        .ipset_protocol()
        .map_err(|error| CapabilityError::IpsetUnavailable(error.to_string()))?;
    check_ipset_version(u32::from(protocol))?;
    Ok(version)
}

/// The IPVS backend of `family` on this host's kernel: IPVS, ipsets and
/// `kube-ipvs0` over netlink, the mode's iptables rules with the detected
/// iptables flavor. Run [`check_host`] first: upstream does not start the
/// mode on a node that fails it. Logs upstream's deprecation warning once
/// per process, as upstream does (also when both families start).
pub fn system_backend(family: IpFamily, options: IpvsOptions) -> IpvsBackend {
    static ANNOUNCED: std::sync::Once = std::sync::Once::new();
    ANNOUNCED.call_once(|| {
        tracing::info!("Using ipvs Proxier");
        tracing::error!("{DEPRECATION_WARNING}");
    });
    let applier = SystemApplier::new(IptablesFlavor::detect());
    IpvsBackend::new(
        family,
        options,
        Box::new(NetlinkKernel::new()),
        Box::new(applier),
    )
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

    /// On a host without IPVS (the build machines) the real start-up check
    /// fails with upstream's message naming the modules.
    #[test]
    fn the_host_check_names_missing_modules_where_ipvs_is_absent() {
        if std::path::Path::new("/proc/net/ip_vs").exists() {
            check_host("").expect("this kernel has IPVS and ipset");
            return;
        }
        let error = check_host("").unwrap_err().to_string();
        assert!(
            error.starts_with("can't use the IPVS proxier: IPVS proxier will not be used because the following required kernel modules are not loaded: [ip_vs"),
            "{error}"
        );
    }
}
