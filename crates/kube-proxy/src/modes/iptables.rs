//! The iptables mode as the binary builds it: its settings from the
//! configuration, the backend, and `--cleanup`.

use kp_config::KubeProxyConfiguration;
use std::sync::OnceLock;

use kp_iptables::{
    IptablesBackend, IptablesFlavor, IptablesOptions, NFACCT_INVALID_DROPPED,
    NFACCT_LOCALHOST_NODE_PORTS,
};
use kp_model::IpFamily;
use kp_nfacct::NfacctClient;
use kp_node::{LocalDetector, MasqueradeMark, NodePortAddresses};
use kp_sync::Backend;

/// Renderer options from the configuration. With `detectLocalMode:
/// NodeCIDR` the renderer takes the pod CIDRs from the Node of each sync.
pub fn options(config: &KubeProxyConfiguration) -> anyhow::Result<IptablesOptions> {
    let mark =
        MasqueradeMark::from_config(config.iptables.masquerade_bit, "iptables.masqueradeBit")?;
    let options = IptablesOptions {
        masquerade_mark: mark,
        masquerade_all: config.iptables.masquerade_all,
        local_detector: LocalDetector::from_config(config)?,
        localhost_node_ports: config.iptables.localhost_node_ports.unwrap_or(true),
        conntrack_tcp_be_liberal: config.conntrack.tcp_be_liberal,
        ..IptablesOptions::default()
    };
    options.validate()?;
    Ok(options)
}

/// `nodePortAddresses` as the backend takes it (`all` and unset mean every
/// local address, except in nftables mode where unset means `primary`).
pub fn node_port_addresses(config: &KubeProxyConfiguration) -> anyhow::Result<NodePortAddresses> {
    Ok(NodePortAddresses::from_config(config)?)
}

/// The iptables backend of `family`: printing to stdout with `dry_run`,
/// otherwise programming the kernel with the detected iptables flavor.
pub fn backend(
    family: IpFamily,
    config: &KubeProxyConfiguration,
    dry_run: bool,
) -> anyhow::Result<Box<dyn Backend>> {
    let mut options = options(config)?;
    let addresses = node_port_addresses(config)?;
    let backend = if dry_run {
        IptablesBackend::dry_run(family, options, addresses, Box::new(std::io::stdout()))?
    } else {
        let counters = nfacct_counters();
        options.nfacct_invalid_dropped = counters.invalid_dropped;
        options.nfacct_localhost_node_ports = counters.localhost_node_ports;
        IptablesBackend::system(family, options, addresses, flavor())?
    };
    Ok(Box::new(backend))
}

/// The iptables flavor of this host, detected once per process: both
/// families and the start-up checks use the same one.
fn flavor() -> IptablesFlavor {
    static FLAVOR: OnceLock<IptablesFlavor> = OnceLock::new();
    *FLAVOR.get_or_init(IptablesFlavor::detect)
}

/// The families this host can serve, as upstream decides between single-
/// and dual-stack at start: each family whose programs and kernel support
/// work, logged when one is left out. With neither, IPv4 alone, whose
/// proxier then says what is missing and keeps `/healthz` unhealthy.
pub fn families() -> Vec<IpFamily> {
    let flavor = flavor();
    let [v4, v6] = [IpFamily::V4, IpFamily::V6].map(|family| {
        kp_iptables::check_family(flavor, family).map_err(|e| kp_sync::error_chain(&e))
    });
    match (v4, v6) {
        (Ok(()), Ok(())) => vec![IpFamily::V4, IpFamily::V6],
        (Ok(()), Err(reason)) => {
            tracing::info!(%reason, "No iptables support for family IPv6; running single-stack IPv4");
            vec![IpFamily::V4]
        }
        (Err(reason), Ok(())) => {
            tracing::info!(%reason, "No iptables support for family IPv4; running single-stack IPv6");
            vec![IpFamily::V6]
        }
        (Err(v4), Err(v6)) => {
            tracing::debug!(ipv4 = %v4, ipv6 = %v6, "No iptables support for either family");
            vec![IpFamily::V4]
        }
    }
}

/// Which of the mode's nfacct counters exist.
#[derive(Debug, Clone, Copy)]
struct NfacctCounters {
    invalid_dropped: bool,
    localhost_node_ports: bool,
}

/// Creates the nfacct counters the rules count with, once per process (both
/// families share them), as upstream does at start. A kernel without
/// `nfnetlink_acct` gets the rules without counting; a dry run creates
/// nothing and so prints the rules without them.
fn nfacct_counters() -> NfacctCounters {
    static COUNTERS: OnceLock<NfacctCounters> = OnceLock::new();
    *COUNTERS.get_or_init(|| {
        let mut client = NfacctClient::new();
        let mut ensure = |name: &str| match client.ensure(name) {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(counter = name, error = %kp_sync::error_chain(&error), "Cannot create the nfacct counter; its packets are not counted");
                false
            }
        };
        NfacctCounters {
            invalid_dropped: ensure(NFACCT_INVALID_DROPPED),
            localhost_node_ports: ensure(NFACCT_LOCALHOST_NODE_PORTS),
        }
    })
}

/// `--cleanup` for the iptables mode: removes our (and upstream's) chains
/// and jump rules with both iptables flavors whose programs exist, since
/// either may hold them.
pub fn cleanup() -> anyhow::Result<()> {
    let mut failures = Vec::new();
    for flavor in [IptablesFlavor::Legacy, IptablesFlavor::Nft] {
        match kp_iptables::cleanup(flavor) {
            Ok(report) => tracing::info!(%flavor, report = ?report, "Removed iptables rules"),
            Err(error) => failures.push(format!("{flavor}: {error:#}")),
        }
    }
    if failures.len() == 2 {
        anyhow::bail!("iptables cleanup failed: {}", failures.join("; "));
    }
    Ok(())
}
