//! [`IptablesBackend`]: the iptables mode as a [`kp_sync::Backend`].
//!
//! One sync is: decide full or partial, on a full sync list the filter and
//! nat tables and ensure the canary chains, render, and apply the rendered
//! text with one `iptables-restore`. The kernel replaces each table
//! atomically (filter, then nat) but has no transaction spanning both, so a
//! proxy killed mid-restore can leave the new filter table beside the old
//! nat table until the full sync of the next start replaces both
//! (`tests/system_crash.rs` of the binary kills it at every step of a full
//! sync). Meanwhile connections follow the old nat rules; the filter
//! table's REJECT rules only meet packets nat did not rewrite, so a Service
//! that just got its first endpoints goes unanswered instead of refused.
//! A full sync's text also inserts the jump rules from the built-in chains
//! into ours that the listing did not show.
//!
//! **Canary.** `KUBE-PROXY-CANARY` is created empty in the mangle, nat and
//! filter tables on every full sync, as upstream does. Upstream polls it
//! once per `syncPeriod` on a timer of its own to notice that someone
//! deleted our tables (a firewall reload) and then syncs in full. Here the
//! sync loop's periodic run is a full sync that comes once per `syncPeriod`
//! even under a steady stream of changes, and it repairs more than a poll
//! would notice (a flush that leaves the chains in place, `iptables -t nat
//! -F`); a partial restore that meets a wiped table fails on the first chain
//! it expects and makes the next sync full at once. So partial syncs check
//! nothing: with iptables-legacy each check read the whole nat table (0.13 s
//! at 10,000 Services).

use std::io;
use std::net::IpAddr;

use kp_model::{IpFamily, NamespacedName, NodeInfo};
use kp_sync::{Backend, BackendError, SyncOutcome, SyncRequest};

use crate::applier::{
    lines_around, Applier, ApplyError, DryRunApplier, IptablesFlavor, RestoreSink, SavedTable,
    SystemApplier,
};
use crate::host::{FromFn, LocalAddresses};
use crate::jumps::{JumpRule, Table, JUMP_RULES};
use crate::names::{ChainName, KUBE_FIREWALL, KUBE_PROXY_CANARY};
use crate::options::IptablesOptions;
use crate::render::{
    localhost_node_ports, ListedChains, NatChains, RenderInput, Rendered, Renderer,
};
use crate::IptablesError;
use kp_node::{ensure_sysctl, MemorySysctl, NodePortAddresses, ProcSysctl, Sysctl, SysctlSetting};

use self::unchanged::{ChainDigests, Recording};

/// The mode's name, as `--proxy-mode` spells it.
pub const MODE: &str = "iptables";

/// `net.ipv4.conf.all.route_localnet`: lets packets to 127.0.0.0/8 be
/// routed (DNATed) off the host, which localhost NodePorts need.
pub const SYSCTL_ROUTE_LOCALNET: &str = "net.ipv4.conf.all.route_localnet";

/// [`SYSCTL_ROUTE_LOCALNET`] as the mode ensures it.
const ROUTE_LOCALNET: SysctlSetting = SysctlSetting {
    name: SYSCTL_ROUTE_LOCALNET,
    value: 1,
    reason: "NodePorts on localhost, iptables.localhostNodePorts",
};

/// The kernel parameters the iptables mode needs with `options` and
/// `node_port_addresses`: what it ensures at its first sync and
/// `--init-only` sets. `route_localnet` when NodePorts answer on IPv4
/// loopback: for [`NodePortAddresses::All`], or a selection whose IPv4
/// CIDRs hold 127.0.0.1 (the address of `lo`).
pub fn node_sysctls(
    options: &IptablesOptions,
    node_port_addresses: &NodePortAddresses,
) -> Vec<SysctlSetting> {
    let loopback = [IpAddr::from([127, 0, 0, 1])];
    let resolved = node_port_addresses.resolve(IpFamily::V4, &NodeInfo::default(), &loopback);
    if localhost_node_ports(
        options.localhost_node_ports,
        IpFamily::V4,
        resolved.as_deref(),
    ) {
        vec![ROUTE_LOCALNET]
    } else {
        Vec::new()
    }
}
/// `net.bridge.bridge-nf-call-iptables`: bridged IPv4 traffic (pod to pod
/// on one node) goes through iptables, so Service DNAT applies to it.
pub const SYSCTL_BRIDGE_CALL_IPTABLES: &str = "net.bridge.bridge-nf-call-iptables";
/// `net.bridge.bridge-nf-call-ip6tables`: the same for IPv6.
pub const SYSCTL_BRIDGE_CALL_IP6TABLES: &str = "net.bridge.bridge-nf-call-ip6tables";

/// The tables holding a canary chain.
const CANARY_TABLES: [Table; 3] = [Table::Mangle, Table::Nat, Table::Filter];

/// The iptables mode for one IP family: renders with a [`Renderer`] and
/// programs through an [`Applier`].
pub struct IptablesBackend {
    family: IpFamily,
    renderer: Renderer,
    node_port_addresses: NodePortAddresses,
    applier: Box<dyn Applier>,
    sysctl: Box<dyn Sysctl>,
    local_addresses: Box<dyn LocalAddresses>,
    needs_full_sync: bool,
    host_checked: bool,
    /// A dry run: sysctls are only pretended, and logged as such.
    dry_run: bool,
    written: ChainDigests,
    /// The per-service nat chains the last successful sync left, sorted;
    /// `None` after a failure (the next sync is full and lists the table).
    recorded_chains: Option<Vec<ChainName>>,
}

impl IptablesBackend {
    /// A backend for `family` programming through `applier`, with sysctls
    /// under `/proc/sys` (of the calling thread's network namespace) and the
    /// host's addresses from rtnetlink (of the namespace of the thread that
    /// runs the first sync needing them).
    pub fn new(
        family: IpFamily,
        options: IptablesOptions,
        node_port_addresses: NodePortAddresses,
        applier: Box<dyn Applier>,
    ) -> Result<Self, IptablesError> {
        Ok(Self {
            family,
            renderer: Renderer::new(options)?,
            node_port_addresses,
            applier,
            sysctl: Box::new(ProcSysctl::default()),
            local_addresses: Box::new(kp_host::HostAddresses::new()),
            needs_full_sync: true,
            host_checked: false,
            dry_run: false,
            written: ChainDigests::default(),
            recorded_chains: None,
        })
    }

    /// A backend running the iptables programs of `flavor` (see
    /// [`IptablesFlavor::detect`]).
    pub fn system(
        family: IpFamily,
        options: IptablesOptions,
        node_port_addresses: NodePortAddresses,
        flavor: IptablesFlavor,
    ) -> Result<Self, IptablesError> {
        let applier = Box::new(SystemApplier::new(flavor));
        Self::new(family, options, node_port_addresses, applier)
    }

    /// A backend that writes what it would program to `out` and touches
    /// nothing (`--dry-run`); sysctls are only pretended.
    pub fn dry_run(
        family: IpFamily,
        options: IptablesOptions,
        node_port_addresses: NodePortAddresses,
        out: Box<dyn std::io::Write + Send>,
    ) -> Result<Self, IptablesError> {
        let applier = Box::new(DryRunApplier::new(out));
        let mut backend = Self::new(family, options, node_port_addresses, applier)?
            .with_sysctl(Box::new(MemorySysctl::new()));
        backend.dry_run = true;
        Ok(backend)
    }

    /// Uses `sysctl` instead of `/proc/sys`.
    pub fn with_sysctl(mut self, sysctl: Box<dyn Sysctl>) -> Self {
        self.sysctl = sysctl;
        self
    }

    /// Uses `addresses` to list the host's addresses for
    /// [`NodePortAddresses::Select`].
    pub fn with_local_addresses(
        mut self,
        addresses: impl FnMut() -> io::Result<Vec<IpAddr>> + Send + 'static,
    ) -> Self {
        self.local_addresses = Box::new(FromFn(addresses));
        self
    }

    /// A partial sync is enough unless asked otherwise, this is the first
    /// sync, or the previous one failed.
    fn decide_full(&self, request: &SyncRequest<'_>) -> bool {
        request.full || self.needs_full_sync
    }

    /// What a full sync does before the restore: host settings (once), a
    /// listing of the filter and nat tables, and the canary chains that
    /// listing did not show.
    ///
    /// With iptables-legacy every listing or `-N`/`-C` reads the whole
    /// table (0.15 s for the nat table of 10,000 Services), so the nat and
    /// filter tables are read once here and the canary chains and jump
    /// rules found there are left alone.
    fn prepare_full_sync(
        &mut self,
        node_ports: Option<&[IpAddr]>,
    ) -> Result<[SavedTable; 2], BackendError> {
        if !self.host_checked {
            self.check_host(node_ports)?;
            self.host_checked = true;
        }
        let mut save = |table| {
            self.applier
                .save_table(self.family, table)
                .map_err(|e| apply_error("listing the existing chains", e))
        };
        let saved = [save(Table::Filter)?, save(Table::Nat)?];
        // The restore declares every chain the jump rules target except
        // kubelet's KUBE-FIREWALL (declared only with localhost NodePorts).
        if !saved_of(&saved, Table::Filter).is_some_and(|s| s.has_chain(KUBE_FIREWALL)) {
            self.applier
                .ensure_chain(self.family, Table::Filter, KUBE_FIREWALL)
                .map_err(|e| apply_error("creating kubelet's firewall chain", e))?;
        }
        for table in CANARY_TABLES {
            let listed = saved_of(&saved, table);
            if listed.is_some_and(|saved| saved.has_chain(KUBE_PROXY_CANARY)) {
                continue;
            }
            self.applier
                .ensure_chain(self.family, table, KUBE_PROXY_CANARY)
                .map_err(|e| apply_error("creating the canary chain", e))?;
        }
        Ok(saved)
    }

    /// The jump rules from the built-in chains that the listing before a
    /// full sync did not show; the restore inserts them after declaring the
    /// chains they jump to, so a fresh host routes packets into our chains
    /// only once they are complete.
    fn missing_jumps(saved: &[SavedTable; 2]) -> Vec<JumpRule> {
        JUMP_RULES
            .iter()
            .filter(|rule| !saved_of(saved, rule.table).is_some_and(|s| s.has_jump(rule)))
            .copied()
            .collect()
    }

    /// Sets route_localnet when localhost NodePorts need it, and warns when
    /// bridged traffic bypasses iptables.
    fn check_host(&mut self, node_ports: Option<&[IpAddr]>) -> Result<(), BackendError> {
        let options = self.renderer.options();
        if localhost_node_ports(options.localhost_node_ports, self.family, node_ports) {
            ensure_sysctl(self.sysctl.as_mut(), &ROUTE_LOCALNET).map_err(|source| {
                BackendError::Apply {
                    mode: MODE,
                    attempted: format!(
                        "setting sysctl {SYSCTL_ROUTE_LOCALNET}=1 (needed by localhost NodePorts; \
                         set iptables.localhostNodePorts: false to do without)"
                    ),
                    source: Box::new(source),
                }
            })?;
            if self.dry_run {
                tracing::info!(
                    sysctl = SYSCTL_ROUTE_LOCALNET,
                    value = 1,
                    "dry run: would set sysctl for localhost NodePorts"
                );
            } else {
                tracing::info!(
                    sysctl = SYSCTL_ROUTE_LOCALNET,
                    value = 1,
                    "set sysctl for localhost NodePorts"
                );
            }
        }
        let bridge = match self.family {
            IpFamily::V4 => SYSCTL_BRIDGE_CALL_IPTABLES,
            IpFamily::V6 => SYSCTL_BRIDGE_CALL_IP6TABLES,
        };
        match self.sysctl.get(bridge) {
            Ok(value) if value == "1" => {}
            Ok(value) => tracing::warn!(
                sysctl = bridge,
                %value,
                "bridged traffic bypasses iptables: pods on one bridge may not reach Services; set the sysctl to 1"
            ),
            Err(_) => tracing::warn!(
                sysctl = bridge,
                "br_netfilter module not loaded: if pods are connected by a Linux bridge, they may not reach Services (modprobe br_netfilter)"
            ),
        }
        Ok(())
    }

    /// The addresses NodePorts answer on. The host's addresses come from a
    /// cache that follows the kernel's address notifications; a full sync
    /// reads them afresh anyway, in case a notification went astray.
    fn resolve_node_ports(
        &mut self,
        node: &NodeInfo,
        full: bool,
    ) -> Result<Option<Vec<IpAddr>>, BackendError> {
        if self.node_port_addresses == NodePortAddresses::All {
            return Ok(None);
        }
        let local = self
            .local_addresses
            .list(full)
            .map_err(|source| BackendError::Apply {
                mode: MODE,
                attempted: "listing the host's addresses for nodePortAddresses".to_owned(),
                source: Box::new(source),
            })?;
        Ok(self.node_port_addresses.resolve(self.family, node, &local))
    }
}

impl Backend for IptablesBackend {
    fn mode(&self) -> &'static str {
        MODE
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncOutcome, BackendError> {
        if request.family != self.family {
            return Err(BackendError::Render {
                mode: MODE,
                reason: format!(
                    "a sync of {} rules reached the {} backend",
                    request.family.as_api_str(),
                    self.family.as_api_str()
                ),
            });
        }
        let full = self.decide_full(request);
        // Until this sync succeeds, the kernel may hold anything.
        self.needs_full_sync = true;
        let node_ports = self.resolve_node_ports(request.node, full)?;
        let mut saved = if full {
            Some(self.prepare_full_sync(node_ports.as_deref())?)
        } else {
            None
        };
        // A full sync lists the nat table and deletes every stale chain of
        // ours, whoever left it. A partial sync lists nothing: the chains
        // the last sync left are recorded, and those a change makes stale
        // go in the same restore (upstream lists the table on every sync of
        // a small cluster and once per syncPeriod in a large one, so under
        // churn its stale chains wait for that listing).
        let listed = saved
            .as_mut()
            .map(|[_, nat]| ListedChains::from_listing(std::mem::take(&mut nat.kube_chains)));
        // Until this sync succeeds, nothing is known of the chains.
        let recorded = self.recorded_chains.take();
        let existing = match (&listed, &recorded) {
            (Some(listed), _) => NatChains::Listed(listed),
            (None, Some(recorded)) => NatChains::Recorded(recorded),
            (None, None) => NatChains::Unknown,
        };
        let jumps = saved.as_ref().map(Self::missing_jumps).unwrap_or_default();
        let input = RenderInput {
            family: self.family,
            full,
            service_ports: request.service_ports,
            changed_services: request.changed_services,
            node: request.node,
            node_port_addresses: node_ports.as_deref(),
            existing_nat_chains: existing,
            jumps: &jumps,
        };
        let applied = if full {
            self.apply_full(&input)
        } else {
            self.apply_partial(&input)
        };
        // A partial restore may meet chains someone else deleted: a line
        // it refuses says nothing of the line itself. A full restore
        // declares every chain it uses, so a line it refuses is at fault.
        let (mut rendered, rules_written) = applied.map_err(|error| {
            if full {
                name_refused_services(error, request)
            } else {
                error
            }
        })?;
        self.applier
            .end_sync()
            .map_err(|e| apply_error("finishing the sync", e))?;
        self.needs_full_sync = false;
        // The active chains (17 bytes each) are what the next partial sync
        // starts from.
        self.recorded_chains = Some(std::mem::take(&mut rendered.active_nat_chains));
        Ok(outcome(&rendered, rules_written))
    }
}

impl IptablesBackend {
    /// A full sync's render and restore in one stream: the restore program
    /// reads the text as it is rendered, so the text is never held whole
    /// (8.7 MB at 10,000 Services, most of the proxy's peak memory). The
    /// digests of what was written are taken on the way.
    fn apply_full(
        &mut self,
        input: &RenderInput<'_>,
    ) -> Result<(Rendered, Vec<(String, usize)>), BackendError> {
        self.written.clear();
        let family = self.family;
        let mut rules = RuleCounts::default();
        let mut rendered = None;
        let renderer = &mut self.renderer;
        let mut recording = self.written.recording();
        let applied = self.applier.restore_streamed(family, &mut |sink| {
            let mut tee = FullSyncSink {
                sink,
                recording: &mut recording,
                rules: &mut rules,
                family,
            };
            rendered = Some(renderer.render_streamed(input, &mut tee)?);
            Ok(())
        });
        recording.finish();
        if let Err(error) = applied {
            // The text was not kept: render it again (the same input gives
            // the same text) to name the line the program rejected.
            let error = match error {
                ApplyError::RestoreLine {
                    command,
                    line,
                    text,
                    stderr,
                } if text.is_empty() => {
                    let whole = self.renderer.render(input).restore;
                    log_rejected_line(&command, line, &whole, &stderr);
                    let text = whole.lines().nth(line - 1).unwrap_or_default().to_owned();
                    ApplyError::RestoreLine {
                        command,
                        line,
                        text,
                        stderr,
                    }
                }
                other => other,
            };
            return Err(apply_error("applying the rules", error).rejected());
        }
        let rendered = rendered.ok_or_else(|| BackendError::Render {
            mode: MODE,
            reason: "the restore finished without rendering its input".to_owned(),
        })?;
        Ok((rendered, rules.finish()))
    }

    /// A partial sync: the changed Services' chains and the top-level
    /// chains, less the chains whose rules the kernel already holds.
    fn apply_partial(
        &mut self,
        input: &RenderInput<'_>,
    ) -> Result<(Rendered, Vec<(String, usize)>), BackendError> {
        let rendered = self.renderer.render(input);
        let text = self.written.without_unchanged(&rendered.restore);
        tracing::trace!(family = self.family.as_api_str(), rules = %text, "applying iptables rules");
        self.applier
            .restore(self.family, &text)
            .map_err(|e| apply_error("applying the rules", e).rejected())?;
        self.written.record(&text);
        let rules = rules_per_table_in(&text);
        Ok((rendered, rules))
    }
}

/// Where a full sync's text goes on its way to the applier: the digests
/// of what is written and the rule counts are taken as it passes.
struct FullSyncSink<'a, 'd> {
    sink: &'a mut dyn RestoreSink,
    recording: &'a mut Recording<'d>,
    rules: &'a mut RuleCounts,
    family: IpFamily,
}

impl RestoreSink for FullSyncSink<'_, '_> {
    fn write_lines(&mut self, lines: &str) -> io::Result<()> {
        tracing::trace!(family = self.family.as_api_str(), rules = %lines, "applying iptables rules");
        self.recording.lines(lines);
        self.rules.lines(lines);
        self.sink.write_lines(lines)
    }
}

impl std::fmt::Debug for IptablesBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IptablesBackend")
            .field("family", &self.family)
            .field("node_port_addresses", &self.node_port_addresses)
            .field("needs_full_sync", &self.needs_full_sync)
            .finish_non_exhaustive()
    }
}

/// The listing of `table` among the filter and nat listings of a full sync
/// (`None` for mangle, which is not listed).
fn saved_of(saved: &[SavedTable; 2], table: Table) -> Option<&SavedTable> {
    match table {
        Table::Filter => Some(&saved[0]),
        Table::Nat => Some(&saved[1]),
        Table::Mangle => None,
    }
}

/// `rules_written` counts the rules of the restore input as applied: a
/// partial sync leaves out the chains the kernel already holds, so the
/// rendered stats overcount.
fn outcome(rendered: &Rendered, rules_written: Vec<(String, usize)>) -> SyncOutcome {
    let stats = &rendered.stats;
    SyncOutcome {
        full: rendered.full,
        rules_per_table: vec![
            ("filter".to_owned(), stats.filter_rules),
            ("nat".to_owned(), stats.nat_rules_total),
        ],
        chains_per_table: vec![
            ("filter".to_owned(), stats.filter_chains),
            ("nat".to_owned(), stats.nat_chains_total),
        ],
        rules_written_per_table: rules_written,
        objects_written: stats.filter_chains
            + stats.filter_rules
            + stats.nat_chains
            + stats.nat_rules
            + stats.deleted_chains,
        cleanup_failures: 0,
    }
}

/// The rules (`-A` and `-I` lines) of each `*table` section of a restore
/// input, in the order of the sections; filter and nat always appear.
fn rules_per_table_in(text: &str) -> Vec<(String, usize)> {
    let mut counts = RuleCounts::default();
    counts.lines(text);
    counts.finish()
}

/// [`rules_per_table_in`] over an input given piece by piece.
#[derive(Debug)]
struct RuleCounts {
    counts: Vec<(String, usize)>,
    current: Option<usize>,
}

impl Default for RuleCounts {
    fn default() -> Self {
        RuleCounts {
            counts: vec![("filter".to_owned(), 0), ("nat".to_owned(), 0)],
            current: None,
        }
    }
}

impl RuleCounts {
    fn lines(&mut self, text: &str) {
        for line in text.lines() {
            if let Some(table) = line.strip_prefix('*') {
                let known = self.counts.iter().position(|(name, _)| name == table);
                self.current = Some(known.unwrap_or_else(|| {
                    self.counts.push((table.to_owned(), 0));
                    self.counts.len() - 1
                }));
            } else if line.starts_with("-A ") || line.starts_with("-I ") {
                if let Some(index) = self.current {
                    self.counts[index].1 += 1;
                }
            }
        }
    }

    fn finish(self) -> Vec<(String, usize)> {
        self.counts
    }
}

/// Logs a line the restore program rejected, with its neighbours.
fn log_rejected_line(command: &str, line: usize, text: &str, stderr: &str) {
    tracing::error!(
        %command,
        line,
        rule = text.lines().nth(line - 1).unwrap_or_default(),
        context = %lines_around(text, line, REJECTED_LINE_CONTEXT),
        %stderr,
        "iptables-restore rejected a line of its input"
    );
}

/// Lines shown on each side of a line the restore program rejected.
const REJECTED_LINE_CONTEXT: usize = 2;

/// What to install when an iptables program is missing.
const INSTALL_IPTABLES: &str =
    "install the iptables package (Debian and Ubuntu: apt-get install iptables)";

/// A backend error for a failed step; a rejected restore line is named in
/// `attempted` so it shows in the one-line log of the sync loop. A program
/// that is not installed makes the mode unavailable, which is reported once
/// and marks the proxy unhealthy at once.
fn apply_error(step: &str, error: ApplyError) -> BackendError {
    if let Some(program) = error.missing_program() {
        return BackendError::Unavailable {
            mode: MODE,
            missing: format!("program {program} not found"),
            remedy: INSTALL_IPTABLES.to_owned(),
        };
    }
    let attempted = match &error {
        ApplyError::RestoreLine {
            command,
            line,
            text,
            ..
        } => format!("{step} with {command} (line {line}: {text})"),
        ApplyError::Spawn { command, .. } | ApplyError::Failed { command, .. } => {
            format!("{step} with {command}")
        }
        ApplyError::Write(_) => step.to_owned(),
    };
    BackendError::Apply {
        mode: MODE,
        attempted,
        source: Box::new(error),
    }
}

/// A rule set the kernel refused names, in `services`, the Service of the
/// refused line: the first word of a rule's comment is its service port
/// (`ns1/svc1:p80 cluster IP`) or Service (`ns1/svc1`), as upstream writes
/// them. Lines of no Service (the top-level chains) name none, and neither
/// does a name that is not a Service of `request`.
fn name_refused_services(error: BackendError, request: &SyncRequest<'_>) -> BackendError {
    let BackendError::Rejected {
        mode,
        attempted,
        mut services,
        source,
    } = error
    else {
        return error;
    };
    let line = source
        .downcast_ref::<ApplyError>()
        .and_then(|error| match error {
            ApplyError::RestoreLine { text, .. } => Some(text.as_str()),
            _ => None,
        });
    if let Some(service) = line.and_then(commented_service) {
        let known = request.service_ports.keys().any(|name| {
            name.service.namespace.as_ref() == service.0 && name.service.name.as_ref() == service.1
        });
        if known {
            services.insert(NamespacedName::new(service.0, service.1));
        }
    }
    BackendError::Rejected {
        mode,
        attempted,
        services,
        source,
    }
}

/// The namespace and name in the comment of restore line `line`
/// (`-m comment --comment "ns1/svc1:p80 …"`), if it names one.
fn commented_service(line: &str) -> Option<(&str, &str)> {
    let (_, rest) = line.split_once("--comment ")?;
    let comment = rest.strip_prefix('"').unwrap_or(rest);
    let first = comment.split([' ', '"']).next()?;
    let (namespace, rest) = first.split_once('/')?;
    let name = rest.split(':').next()?;
    (!namespace.is_empty() && !name.is_empty()).then_some((namespace, name))
}

mod unchanged;

#[cfg(test)]
mod tests;
