//! The iptables mode as the binary builds it: options from the
//! configuration, and the dry-run backend that prints the restore input.

use std::io::Write;
use std::net::IpAddr;

use ipnet::IpNet;
use kp_config::{KubeProxyConfiguration, LocalMode};
use kp_iptables::{IptablesOptions, LocalDetector, RenderInput, Renderer, JUMP_RULES};
use kp_model::IpFamily;
use kp_sync::{Backend, BackendError, SyncOutcome, SyncRequest};

/// The mode's name, as `--proxy-mode` spells it.
const MODE: &str = "iptables";

/// Renderer options from the configuration. The node's pod CIDRs are needed
/// only for `detectLocalMode: NodeCIDR`.
pub fn options(
    config: &KubeProxyConfiguration,
    node_pod_cidrs: &[IpNet],
) -> anyhow::Result<IptablesOptions> {
    let local_detector = match config.effective_detect_local_mode()? {
        LocalMode::ClusterCidr => {
            let cidrs = config.cluster_cidrs()?;
            if cidrs.is_empty() {
                tracing::info!(
                    "clusterCIDR not set: traffic from pods cannot be told from other traffic"
                );
                LocalDetector::None
            } else {
                LocalDetector::ClusterCidr(cidrs)
            }
        }
        LocalMode::NodeCidr => LocalDetector::NodeCidr(node_pod_cidrs.to_vec()),
        LocalMode::BridgeInterface => {
            LocalDetector::BridgeInterface(config.detect_local.bridge_interface.clone())
        }
        LocalMode::InterfaceNamePrefix => {
            LocalDetector::InterfaceNamePrefix(config.detect_local.interface_name_prefix.clone())
        }
    };
    let masquerade_bit = config.iptables.masquerade_bit.unwrap_or(14);
    let options = IptablesOptions {
        // Validation keeps the bit within 0..=31.
        masquerade_bit: u8::try_from(masquerade_bit)?,
        masquerade_all: config.iptables.masquerade_all,
        local_detector,
        localhost_node_ports: config.iptables.localhost_node_ports.unwrap_or(true),
        conntrack_tcp_be_liberal: config.conntrack.tcp_be_liberal,
        ..IptablesOptions::default()
    };
    options.validate()?;
    Ok(options)
}

/// Resolves `nodePortAddresses` for a render: `None` accepts NodePorts on
/// every local address; CIDRs select the node's addresses inside them.
pub fn node_port_addresses(
    config: &KubeProxyConfiguration,
    node_addresses: &[IpAddr],
) -> Option<Vec<IpAddr>> {
    let wanted = config.effective_node_port_addresses();
    if wanted.is_empty() {
        return None;
    }
    let cidrs: Vec<IpNet> = wanted.iter().filter_map(|c| c.parse().ok()).collect();
    let primary = wanted.iter().any(|w| w == "primary");
    let selected = node_addresses
        .iter()
        .enumerate()
        .filter(|(i, ip)| cidrs.iter().any(|c| c.contains(*ip)) || (primary && *i == 0))
        .map(|(_, ip)| *ip)
        .collect();
    Some(selected)
}

/// Prints, for each sync, the jump rules it would ensure and the exact
/// `iptables-restore` input it would apply. Touches nothing.
pub struct DryRunBackend {
    renderer: Renderer,
    node_port_addresses: Option<Vec<IpAddr>>,
    out: Box<dyn Write + Send>,
}

impl DryRunBackend {
    /// A dry-run backend writing to `out`.
    pub fn new(
        options: IptablesOptions,
        node_port_addresses: Option<Vec<IpAddr>>,
        out: Box<dyn Write + Send>,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            renderer: Renderer::new(options)?,
            node_port_addresses,
            out,
        })
    }

    fn write(&mut self, family: IpFamily, restore: &str) -> std::io::Result<()> {
        let (label, command) = match family {
            IpFamily::V4 => ("IPv4", "iptables"),
            IpFamily::V6 => ("IPv6", "ip6tables"),
        };
        writeln!(self.out, "# {label}: jump rules ensured in built-in chains")?;
        for rule in JUMP_RULES {
            let line = rule.restore_line();
            let insert = line.strip_prefix("-A ").unwrap_or(&line);
            writeln!(self.out, "# {command} -w -t {} -I {insert}", rule.table)?;
        }
        writeln!(
            self.out,
            "# {label}: {command}-restore --noflush --counters input"
        )?;
        self.out.write_all(restore.as_bytes())?;
        self.out.flush()
    }
}

impl Backend for DryRunBackend {
    fn mode(&self) -> &'static str {
        MODE
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncOutcome, BackendError> {
        let service_ports = request
            .service_ports
            .iter()
            .map(|(name, state)| {
                let state = kp_iptables::ServicePortState {
                    port: state.port.clone(),
                    endpoints: state.endpoints.clone(),
                };
                (name.clone(), state)
            })
            .collect();
        let input = RenderInput {
            family: request.family,
            full: true,
            service_ports: &service_ports,
            changed_services: request.changed_services,
            node: request.node,
            node_port_addresses: self.node_port_addresses.as_deref(),
            existing_nat_chains: None,
        };
        let rendered = self.renderer.render(&input);
        self.write(request.family, &rendered.restore)
            .map_err(|source| BackendError::Apply {
                mode: MODE,
                attempted: "writing the dry-run output".to_owned(),
                source: Box::new(source),
            })?;
        let stats = rendered.stats;
        Ok(SyncOutcome {
            full: true,
            rules_per_table: vec![
                ("filter".to_owned(), stats.filter_rules),
                ("nat".to_owned(), stats.nat_rules_total),
            ],
            chains_per_table: vec![
                ("filter".to_owned(), stats.filter_chains),
                ("nat".to_owned(), stats.nat_chains),
            ],
            objects_written: 0,
        })
    }
}
