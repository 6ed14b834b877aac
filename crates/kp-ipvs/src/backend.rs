//! The `--proxy-mode ipvs` implementation of [`kp_sync::Backend`].
//!
//! Every sync plans the whole family (planning is pure and cheap), then
//! compares the plan with what the backend last applied — or, on a full
//! sync, with what the kernel lists — and sends only the difference. A
//! one-endpoint change therefore sends one request. The iptables rules
//! change only when a set turns empty or non-empty or a source-range
//! exception changes; they are restored in one step per table.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use kp_iptables::{Applier, ResolvedDetector, Table};
use kp_model::{IpFamily, NodeInfo, ServicePortName};
use kp_node::{
    ensure_sysctl, LocalDetector, MasqueradeMark, NodePortAddresses, Sysctl, SysctlSetting,
};
use kp_sync::{Backend, BackendError, ServicePortState, SyncOutcome, SyncRequest};

use crate::capability::KernelVersion;
use crate::diff::{diff, drained_real_servers, Op};
use crate::kernel::{ApplyError, IpvsKernel, KernelError, Refusal};
use crate::planner::{plan, PlanInput};
use crate::refused::refused_services;
use crate::rules::{self, RuleOptions, JUMP_RULES, KUBE_IPVS_FILTER, KUBE_LOAD_BALANCER};
use crate::state::KernelState;
use crate::text::dry_run_text;

/// The mode's name.
pub const MODE: &str = "ipvs";
/// Oldest kernel with `net.ipv4.vs.conn_reuse_mode`.
const CONN_REUSE_MIN: KernelVersion = KernelVersion {
    major: 4,
    minor: 1,
    patch: 0,
};
/// First kernel where `conn_reuse_mode` 1 no longer delays reused ports by a
/// second (kubernetes issue 93297): left as it is from here on.
const CONN_REUSE_FIXED: KernelVersion = KernelVersion {
    major: 5,
    minor: 9,
    patch: 0,
};

/// `net.ipv4.vs.conntrack`: IPVS connections visible to conntrack.
const SYSCTL_VS_CONNTRACK: SysctlSetting = SysctlSetting {
    name: "net.ipv4.vs.conntrack",
    value: 1,
    reason: "IPVS connections visible to conntrack, for masquerading",
};

/// The sysctls the IPVS mode always ensures, in upstream's order.
const SYSCTLS: [SysctlSetting; 4] = [
    SYSCTL_VS_CONNTRACK,
    SysctlSetting {
        name: "net.ipv4.vs.expire_nodest_conn",
        value: 1,
        reason: "IPVS drops connections to removed real servers",
    },
    SysctlSetting {
        name: "net.ipv4.vs.expire_quiescent_template",
        value: 1,
        reason: "IPVS session affinity leaves real servers of weight 0",
    },
    SysctlSetting {
        name: "net.ipv4.ip_forward",
        value: 1,
        reason: "IPVS forwards to endpoints",
    },
];

/// `net.ipv4.vs.conn_reuse_mode` 0 on kernels from 4.1 to 5.8, whose
/// connection reuse drops packets (upstream issue 81775).
const SYSCTL_CONN_REUSE: SysctlSetting = SysctlSetting {
    name: "net.ipv4.vs.conn_reuse_mode",
    value: 0,
    reason: "IPVS connection reuse on kernels before 5.9",
};

/// The sysctls of `ipvs.strictARP`: the node does not answer ARP for the
/// Service addresses on `kube-ipvs0`.
const STRICT_ARP_SYSCTLS: [SysctlSetting; 2] = [
    SysctlSetting {
        name: "net.ipv4.conf.all.arp_ignore",
        value: 1,
        reason: "ipvs.strictARP",
    },
    SysctlSetting {
        name: "net.ipv4.conf.all.arp_announce",
        value: 2,
        reason: "ipvs.strictARP",
    },
];

/// The kernel parameters the IPVS mode needs with `options`, in upstream's
/// order: what the backend ensures at start and `--init-only` sets. The
/// connection-reuse fix needs the kernel's version; without one it is left
/// alone.
pub fn node_sysctls(options: &IpvsOptions) -> Vec<SysctlSetting> {
    let mut settings = SYSCTLS.to_vec();
    if let Some(version) = options.kernel_version {
        if version >= CONN_REUSE_MIN && version < CONN_REUSE_FIXED {
            settings.push(SYSCTL_CONN_REUSE);
        }
    }
    if options.strict_arp {
        settings.extend(STRICT_ARP_SYSCTLS);
    }
    settings
}

/// Settings of the IPVS mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsOptions {
    /// `ipvs.scheduler` (`rr` when empty).
    pub scheduler: String,
    /// `ipvs.excludeCIDRs`: virtual servers there are never deleted.
    pub exclude_cidrs: Vec<IpNet>,
    /// `ipvs.strictARP`.
    pub strict_arp: bool,
    /// `ipvs.tcpTimeout`, `ipvs.tcpFinTimeout`, `ipvs.udpTimeout` (zero
    /// leaves the kernel's value).
    pub timeouts: [Duration; 3],
    /// `iptables.masqueradeBit` (0..=31).
    pub masquerade_mark: MasqueradeMark,
    /// `iptables.masqueradeAll`.
    pub masquerade_all: bool,
    /// `detectLocalMode` and its parameters.
    pub local_detector: LocalDetector,
    /// `nodePortAddresses`.
    pub node_port_addresses: NodePortAddresses,
    /// The running kernel, for `conn_reuse_mode` (none: left alone).
    pub kernel_version: Option<KernelVersion>,
}

/// Lists the host's addresses (of every interface).
pub type AddressLister = Box<dyn FnMut() -> io::Result<Vec<IpAddr>> + Send>;

/// The IPVS mode for one IP family.
pub struct IpvsBackend {
    family: IpFamily,
    options: IpvsOptions,
    target: Target,
    sysctl: Box<dyn Sysctl>,
    local_addresses: AddressLister,
    /// What the kernel holds after the last successful sync; `None` makes
    /// the next sync list the kernel.
    applied: Option<KernelState>,
    /// The iptables text last restored; `None` forces a restore.
    iptables_written: Option<String>,
    host_ready: bool,
}

enum Target {
    Kernel {
        kernel: Box<dyn IpvsKernel>,
        applier: Box<dyn Applier>,
    },
    DryRun(Box<dyn Write + Send>),
}

impl Default for IpvsOptions {
    fn default() -> Self {
        Self {
            scheduler: String::new(),
            exclude_cidrs: Vec::new(),
            strict_arp: false,
            timeouts: [Duration::ZERO; 3],
            masquerade_mark: MasqueradeMark::default(),
            masquerade_all: false,
            local_detector: LocalDetector::None,
            node_port_addresses: NodePortAddresses::All,
            kernel_version: None,
        }
    }
}

impl IpvsBackend {
    /// A backend programming `kernel` and restoring iptables rules through
    /// `applier`, with sysctls under `/proc/sys` and the host's addresses
    /// from rtnetlink.
    pub fn new(
        family: IpFamily,
        options: IpvsOptions,
        kernel: Box<dyn IpvsKernel>,
        applier: Box<dyn Applier>,
    ) -> Self {
        let mut addresses = kp_host::HostAddresses::new();
        Self::with_target(family, options, Target::Kernel { kernel, applier }).with_local_addresses(
            Box::new(move || {
                addresses
                    .addresses()
                    .map(<[IpAddr]>::to_vec)
                    .map_err(io::Error::other)
            }),
        )
    }

    /// A backend that prints each sync's plan to `out` (`--dry-run`).
    pub fn dry_run(family: IpFamily, options: IpvsOptions, out: Box<dyn Write + Send>) -> Self {
        Self::with_target(family, options, Target::DryRun(out))
            .with_sysctl(Box::new(kp_node::MemorySysctl::new()))
    }

    fn with_target(family: IpFamily, options: IpvsOptions, target: Target) -> Self {
        Self {
            family,
            options,
            target,
            sysctl: Box::new(kp_node::ProcSysctl::default()),
            local_addresses: Box::new(|| Ok(Vec::new())),
            applied: None,
            iptables_written: None,
            host_ready: false,
        }
    }

    /// Uses `sysctl` instead of `/proc/sys`.
    pub fn with_sysctl(mut self, sysctl: Box<dyn Sysctl>) -> Self {
        self.sysctl = sysctl;
        self
    }

    /// Uses `lister` for the host's addresses.
    pub fn with_local_addresses(mut self, lister: AddressLister) -> Self {
        self.local_addresses = lister;
        self
    }

    /// The state the backend believes the kernel holds (tests).
    pub fn applied(&self) -> Option<&KernelState> {
        self.applied.as_ref()
    }

    /// Requests sent to the kernel so far (0 for a dry run).
    pub fn kernel_messages(&self) -> u64 {
        match &self.target {
            Target::Kernel { kernel, .. } => kernel.messages_sent(),
            Target::DryRun(_) => 0,
        }
    }

    fn rule_options(&self, node: &NodeInfo) -> RuleOptions {
        let not_local =
            ResolvedDetector::resolve(&self.options.local_detector, self.family, &node.pod_cidrs)
                .map(|detector| detector.if_not_local);
        RuleOptions {
            masquerade_mark: self.options.masquerade_mark.to_string(),
            masquerade_all: self.options.masquerade_all,
            not_local,
            random_fully: true,
        }
    }

    /// Upstream's start-up settings: the IPVS sysctls and timeouts, once.
    fn prepare_host(&mut self) -> Result<(), BackendError> {
        for setting in node_sysctls(&self.options) {
            ensure_sysctl(self.sysctl.as_mut(), &setting).map_err(|source| {
                BackendError::Apply {
                    mode: MODE,
                    attempted: format!("setting sysctl {}={}", setting.name, setting.value),
                    source: Box::new(source),
                }
            })?;
        }
        let timeouts = self.options.timeouts;
        if timeouts.iter().any(|t| !t.is_zero()) {
            if let Target::Kernel { kernel, .. } = &mut self.target {
                if let Err(error) = kernel.set_timeouts(timeouts[0], timeouts[1], timeouts[2]) {
                    tracing::error!(error = %error, "Failed to configure IPVS timeouts");
                }
            }
        }
        Ok(())
    }

    /// The host's addresses of this family that NodePorts and the bind
    /// decision consider: not loopback, not IPv6 link-local, not on
    /// kube-ipvs0 (`ours`), as upstream's `GetAllLocalAddressesExcept`.
    fn node_addresses(&mut self, ours: &BTreeSet<IpAddr>) -> Result<Vec<IpAddr>, BackendError> {
        let listed = (self.local_addresses)().map_err(|source| BackendError::Apply {
            mode: MODE,
            attempted: "listing the host's addresses".to_owned(),
            source: Box::new(source),
        })?;
        let mut addresses: Vec<IpAddr> = listed
            .into_iter()
            .filter(|ip| self.family.matches(ip) && !ip.is_loopback() && !is_link_local(ip))
            .filter(|ip| !ours.contains(ip))
            .collect();
        addresses.sort_unstable();
        addresses.dedup();
        Ok(addresses)
    }
}

impl Backend for IpvsBackend {
    fn mode(&self) -> &'static str {
        MODE
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncOutcome, BackendError> {
        if !self.host_ready {
            self.prepare_host()?;
            self.host_ready = true;
        }
        let full = request.full || self.applied.is_none();
        // A full sync starts from what the kernel holds, so that after a
        // restart the service addresses already on kube-ipvs0 are not
        // mistaken for the node's own.
        let current = self.current_state(full)?;
        let node_addresses = self.node_addresses(&current.addresses)?;
        let node_port_addresses = self
            .options
            .node_port_addresses
            .resolve(self.family, request.node, &node_addresses)
            .unwrap_or_else(|| node_addresses.clone());
        let rule_options = self.rule_options(request.node);
        let scheduler = crate::capability::scheduler_or_default(&self.options.scheduler)
            .map_err(|e| BackendError::Render {
                mode: MODE,
                reason: e.to_string(),
            })?
            .to_owned();
        let input = PlanInput {
            family: self.family,
            scheduler: &scheduler,
            node_addresses: &node_addresses,
            node_port_addresses: &node_port_addresses,
            rules: &rule_options,
        };
        let planned = plan(&input, request.service_ports);
        match &mut self.target {
            Target::DryRun(out) => {
                let text = dry_run_text(&planned.state, self.family, &planned.iptables);
                out.write_all(text.as_bytes())
                    .and_then(|()| out.flush())
                    .map_err(|source| BackendError::Apply {
                        mode: MODE,
                        attempted: "writing the dry-run output".to_owned(),
                        source: Box::new(source),
                    })?;
                self.applied = Some(planned.state.clone());
                Ok(outcome(full, &planned.iptables, 0))
            }
            Target::Kernel { .. } => {
                let (outcome, refused) = self.apply_plan(full, planned, current)?;
                if refused.is_empty() {
                    Ok(outcome)
                } else {
                    Err(rejected(&input, request.service_ports, refused))
                }
            }
        }
    }
}

impl IpvsBackend {
    /// What the kernel holds: listed for a full sync, else what the last
    /// sync left (taken, so a failure below forces the next sync to list).
    fn current_state(&mut self, full: bool) -> Result<KernelState, BackendError> {
        match (&mut self.target, self.applied.take()) {
            (_, Some(applied)) if !full => Ok(applied),
            (Target::Kernel { kernel, .. }, _) => kernel.list(self.family).map_err(kernel_error),
            (Target::DryRun(_), _) => Ok(KernelState::default()),
        }
    }

    /// Applies the difference between `planned` and `current`, then the
    /// iptables rules. Operations the kernel refuses do not stop the
    /// others, nor the rules: they are returned with the operation each
    /// refused, and the next sync lists the kernel again.
    fn apply_plan(
        &mut self,
        full: bool,
        planned: crate::planner::Plan,
        mut current: KernelState,
    ) -> Result<(SyncOutcome, Vec<(Op, Refusal)>), BackendError> {
        let Target::Kernel { kernel, applier } = &mut self.target else {
            return Ok((SyncOutcome::default(), Vec::new()));
        };
        let family = self.family;
        if full {
            // Virtual servers inside excludeCIDRs are never removed.
            let exclude = &self.options.exclude_cidrs;
            current.services.retain(|key, _| {
                planned.state.services.contains_key(key)
                    || !exclude.iter().any(|cidr| cidr.contains(&key.address))
            });
        }
        let mut ops = diff(&planned.state, &current);
        ops.extend(reap_drained(kernel.as_mut(), &planned.state, &current)?);
        let refusals = match kernel.apply(family, &ops) {
            Ok(()) => Vec::new(),
            Err(ApplyError::Refused(refusals)) => refusals,
            Err(ApplyError::Broken(error)) => return Err(kernel_error(error)),
        };
        let mut tracked = refusals.is_empty();
        for op in &ops {
            if tracked && current.apply(op).is_err() {
                tracked = false;
            }
        }
        let restore_needed = full || self.iptables_written.as_deref() != Some(&planned.iptables);
        if restore_needed {
            let text = if full {
                let jumps = missing_jumps(applier.as_mut(), family)?;
                rules::with_jumps(&planned.iptables, &jumps)
            } else {
                planned.iptables.clone()
            };
            self.iptables_written = None;
            applier
                .restore(family, &text)
                .map_err(|source| BackendError::Rejected {
                    mode: MODE,
                    attempted: format!("restoring the {family} iptables rules"),
                    services: Default::default(),
                    source: Box::new(source),
                })?;
            self.iptables_written = Some(planned.iptables.clone());
        }
        // After a refusal what the kernel holds is listed again by the
        // next sync rather than guessed.
        if tracked {
            self.applied = Some(current);
        }
        let refused = refusals
            .into_iter()
            .filter_map(|refusal| Some((ops.get(refusal.index)?.clone(), refusal)))
            .collect();
        Ok((outcome(full, &planned.iptables, ops.len()), refused))
    }
}

/// The failure of a sync whose `refused` operations the kernel refused
/// (every other operation was applied), naming the Services they belong
/// to. The sync loop logs the failure once; each refusal is logged at
/// debug level.
fn rejected<'p>(
    input: &PlanInput<'_>,
    service_ports: impl IntoIterator<Item = (&'p ServicePortName, &'p ServicePortState)>,
    refused: Vec<(Op, Refusal)>,
) -> BackendError {
    // A refusal that found the wanted state already there means the
    // kernel changed behind the proxy's back: the next sync lists it again,
    // and no Service is at fault.
    let ops: Vec<&Op> = refused
        .iter()
        .filter(|(_, refusal)| !refusal.drift)
        .map(|(op, _)| op)
        .collect();
    let services = refused_services(input, service_ports, &ops);
    for (_, refusal) in &refused {
        tracing::debug!(
            attempted = %refusal.error.attempted,
            error = %refusal.error.source,
            "The kernel refused an IPVS mode operation; the others were applied"
        );
    }
    let first = refused
        .first()
        .map(|(_, refusal)| refusal.error.attempted.clone())
        .unwrap_or_default();
    let attempted = match refused.len() {
        1 => first,
        n => format!("{first} (and {} more operations)", n - 1),
    };
    BackendError::Rejected {
        mode: MODE,
        attempted,
        services,
        source: Box::new(ApplyError::Refused(
            refused.into_iter().map(|(_, refusal)| refusal).collect(),
        )),
    }
}

/// Deletes drained real servers whose connections are gone.
fn reap_drained(
    kernel: &mut dyn IpvsKernel,
    desired: &KernelState,
    current: &KernelState,
) -> Result<Vec<Op>, BackendError> {
    let mut by_service: BTreeMap<_, Vec<_>> = BTreeMap::new();
    for (service, real) in drained_real_servers(desired, current) {
        by_service.entry(service).or_default().push(real);
    }
    let mut ops = Vec::new();
    for (service, reals) in by_service {
        let connections = kernel.connections(&service).map_err(kernel_error)?;
        for real in reals {
            if connections.get(&real).copied().unwrap_or(0) == 0 {
                ops.push(Op::DeleteReal(service, real));
            }
        }
    }
    Ok(ops)
}

/// The jump rules of tables where our marker chain is absent: such a table
/// has none of our rules yet, so its jumps go into the same restore that
/// creates the chains.
fn missing_jumps(
    applier: &mut dyn Applier,
    family: IpFamily,
) -> Result<Vec<kp_iptables::JumpRule>, BackendError> {
    let mut jumps = Vec::new();
    for (table, marker) in [
        (Table::Nat, KUBE_LOAD_BALANCER),
        (Table::Filter, KUBE_IPVS_FILTER),
    ] {
        let exists = applier
            .chain_exists(family, table, marker)
            .map_err(|source| BackendError::Apply {
                mode: MODE,
                attempted: format!("looking for chain {marker} in table {table}"),
                source: Box::new(source),
            })?;
        if !exists {
            jumps.extend(JUMP_RULES.iter().filter(|j| j.table == table).copied());
        }
    }
    Ok(jumps)
}

fn outcome(full: bool, iptables: &str, objects_written: usize) -> SyncOutcome {
    let mut rules_per_table = Vec::new();
    let mut chains_per_table = Vec::new();
    let mut table = "";
    let (mut rules, mut chains) = (0, 0);
    for line in iptables.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = name;
        } else if line == "COMMIT" {
            rules_per_table.push((table.to_owned(), rules));
            chains_per_table.push((table.to_owned(), chains));
            (rules, chains) = (0, 0);
        } else if line.starts_with("-A ") {
            rules += 1;
        } else if line.starts_with(':') {
            chains += 1;
        }
    }
    SyncOutcome {
        full,
        rules_written_per_table: if objects_written > 0 || full {
            rules_per_table.clone()
        } else {
            Vec::new()
        },
        rules_per_table,
        chains_per_table,
        objects_written,
        cleanup_failures: 0,
    }
}

fn kernel_error(error: KernelError) -> BackendError {
    BackendError::Apply {
        mode: MODE,
        attempted: error.attempted.clone(),
        source: Box::new(error),
    }
}

/// IPv6 link-local addresses take no NodePorts (upstream's
/// `isValidForSet`); IPv4 link-local ones do, as upstream.
fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(_) => false,
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

#[cfg(test)]
#[path = "backend_tests.rs"]
mod tests;
