//! [`NftablesBackend`]: the nftables mode as a [`kp_sync::Backend`].
//!
//! One sync is one transaction, except a large full sync, which is split
//! into bounded transactions of complete Services with the elements last
//! ([`Renderer::render_streamed`]), each leaving a consistent table; a
//! failed piece makes the next sync full and one transaction. The sync
//! loop asks for a full sync once per
//! `syncPeriod` and after any failure; the backend also syncs in full until
//! its first success and after a failed transaction. A full transaction
//! declares and flushes every fixed object and rewrites every Service, so
//! it repairs whatever someone else did to the table (`nft flush ruleset`,
//! `nft delete table ip kube-proxy`, a flushed chain) within one
//! `syncPeriod`: that is this mode's canary. A partial transaction that
//! meets a deleted table fails on its first chain and makes the next sync
//! full at once.
//!
//! The first transaction of a process (unless its sync is split: then it
//! rewrites the table in place), and the one after a failed one, deletes
//! the table first (in the same transaction), which removes stale chains an
//! earlier process left without listing the table and lets base chains
//! change priority. Other stale chains are flushed at
//! once and deleted at least a second later by a transaction of their own
//! at the start of a later sync, as upstream does: its failure is counted
//! (`kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total`), does not
//! fail the sync, and the chains are tried again at the next one.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use kp_model::{IpFamily, NamespacedName, NodeInfo};
use kp_node::NodePortAddresses;
use kp_sync::{Backend, BackendError, SyncOutcome, SyncRequest};

use crate::applier::{Applier, ApplyError, DryRunApplier, NftApplier};
use crate::generation::{self, Ruleset, SharedRuleset};
use crate::model::{Command, Key, Lines, Transaction};
use crate::names::TABLE;
use crate::netlink::NetlinkApplier;
use crate::options::{Layout, NftablesOptions};
use crate::render::{stale_chain_cleanup, Commits, Piece, RenderInput, RenderStats, Renderer};
use crate::state::Programmed;
use crate::NftablesError;

mod table_state;

use table_state::{commits_explain, TableState};

/// The mode's name, as `--proxy-mode` spells it.
pub const MODE: &str = "nftables";

/// Lists the host's addresses (for `nodePortAddresses` CIDRs); `true` asks
/// for a fresh listing.
type AddressLister = Box<dyn FnMut(bool) -> io::Result<Vec<IpAddr>> + Send>;

/// The nftables mode for one IP family.
pub struct NftablesBackend {
    family: IpFamily,
    renderer: Renderer,
    node_port_addresses: NodePortAddresses,
    applier: Box<dyn Applier>,
    local_addresses: AddressLister,
    clock: Box<dyn FnMut() -> Instant + Send>,
    programmed: Programmed,
    /// What is known of the table, and so what the next sync does.
    state: TableState,
    cleanup_failures: usize,
    /// The commits of this process to the ruleset (shared with the other
    /// family's backend in the binary).
    ruleset: SharedRuleset,
}

/// The nftables backend of `family` with `options` and NodePorts on
/// `node_port_addresses`: with `dry_run` every transaction is written to
/// stdout and nothing is touched; otherwise it commits over netlink, and
/// both families' backends of the process share one ruleset. The binary
/// maps the configuration to the options.
pub fn build(
    family: IpFamily,
    options: NftablesOptions,
    node_port_addresses: NodePortAddresses,
    dry_run: bool,
) -> Result<NftablesBackend, NftablesError> {
    if dry_run {
        NftablesBackend::dry_run(family, options, node_port_addresses, Box::new(io::stdout()))
    } else {
        NftablesBackend::system(family, options, node_port_addresses)
            .map(|backend| backend.with_shared_ruleset(generation::process_ruleset()))
    }
}

/// Deletes the `kube-proxy` tables of both families over netlink
/// (`--cleanup`, and what another mode does at start). A table that does
/// not exist is no error.
pub fn cleanup() -> Result<(), BackendError> {
    cleanup_with(&mut NetlinkApplier::new())
}

/// Like [`cleanup`], through `applier`.
pub fn cleanup_with(applier: &mut dyn Applier) -> Result<(), BackendError> {
    for family in [IpFamily::V4, IpFamily::V6] {
        let transaction = Transaction {
            family,
            commands: vec![Command::AddTable { comment: None }, Command::DeleteTable],
        };
        match applier.apply(&transaction) {
            // Without nf_tables there can be no table of ours.
            Ok(()) | Err(ApplyError::NoNftables { .. }) => {}
            Err(error) => return Err(apply_error("deleting the kube-proxy table", error)),
        }
    }
    Ok(())
}

impl NftablesBackend {
    /// A backend for `family` committing through `applier`, with the
    /// host's addresses from rtnetlink (of the namespace of the thread
    /// that runs the first sync needing them).
    pub fn new(
        family: IpFamily,
        options: NftablesOptions,
        node_port_addresses: NodePortAddresses,
        applier: Box<dyn Applier>,
    ) -> Result<Self, NftablesError> {
        let mut host = None::<kp_host::HostAddresses>;
        let local_addresses: AddressLister = Box::new(move |fresh| {
            let host = host.get_or_insert_with(kp_host::HostAddresses::new);
            let listed = if fresh {
                host.refresh()
            } else {
                host.addresses()
            };
            listed.map(<[IpAddr]>::to_vec).map_err(io::Error::other)
        });
        Ok(Self {
            family,
            renderer: Renderer::new(options)?,
            node_port_addresses,
            applier,
            local_addresses,
            clock: Box::new(Instant::now),
            programmed: Programmed::default(),
            state: TableState::Unknown,
            cleanup_failures: 0,
            ruleset: SharedRuleset::default(),
        })
    }

    /// A backend committing over netlink ([`NetlinkApplier`]): what the
    /// proxy runs. `nft` is not needed.
    pub fn system(
        family: IpFamily,
        options: NftablesOptions,
        node_port_addresses: NodePortAddresses,
    ) -> Result<Self, NftablesError> {
        let applier = Box::new(NetlinkApplier::new());
        Self::new(family, options, node_port_addresses, applier)
    }

    /// A backend running `nft -f -` for every transaction: the same
    /// transactions as [`NftablesBackend::system`], slower by the time nft
    /// needs to list the table first (kept to compare).
    pub fn with_nft(
        family: IpFamily,
        options: NftablesOptions,
        node_port_addresses: NodePortAddresses,
    ) -> Result<Self, NftablesError> {
        let applier = Box::new(NftApplier::new());
        Self::new(family, options, node_port_addresses, applier)
    }

    /// A backend that writes every transaction, exactly as it would commit
    /// it, to `out` and touches nothing (`--dry-run`).
    pub fn dry_run(
        family: IpFamily,
        options: NftablesOptions,
        node_port_addresses: NodePortAddresses,
        out: Box<dyn io::Write + Send>,
    ) -> Result<Self, NftablesError> {
        let applier = Box::new(DryRunApplier::new(out));
        Self::new(family, options, node_port_addresses, applier)
    }

    /// Lists the host's addresses with `list` (given `true` when a fresh
    /// listing is wanted) instead of rtnetlink.
    pub fn with_local_addresses(
        mut self,
        list: impl FnMut(bool) -> io::Result<Vec<IpAddr>> + Send + 'static,
    ) -> Self {
        self.local_addresses = Box::new(list);
        self
    }

    /// Writes the table in `layout` ([`Layout::Chains`] unless told), for
    /// the backend's life. The first sync of a process deletes the table,
    /// so a restart in the other layout leaves nothing of the earlier one,
    /// unless that sync is split: it then rewrites the table in place and
    /// the earlier layout's objects no Service names stay, unused, until
    /// a later reset.
    #[must_use]
    pub fn with_layout(mut self, layout: Layout) -> Self {
        self.renderer = self.renderer.with_layout(layout);
        self
    }

    /// Splits full syncs into transactions of about `bytes` of Service
    /// chain text each ([`Renderer::with_transaction_text_max`]).
    #[must_use]
    pub fn with_transaction_text_max(mut self, bytes: usize) -> Self {
        self.renderer = self.renderer.with_transaction_text_max(bytes);
        self
    }

    /// Shares the bookkeeping of ruleset generations with the backend of
    /// the other family in the same network namespace
    /// ([`crate::generation`]), so neither takes the other's commits for
    /// someone else's.
    #[must_use]
    pub fn with_shared_ruleset(mut self, ruleset: SharedRuleset) -> Self {
        self.ruleset = ruleset;
        self
    }

    /// Reads the time from `clock` (stale chains wait a second).
    pub fn with_clock(mut self, clock: impl FnMut() -> Instant + Send + 'static) -> Self {
        self.clock = Box::new(clock);
        self
    }

    /// What the table holds after the last successful transaction.
    pub fn programmed(&self) -> &Programmed {
        &self.programmed
    }

    /// Stale-chain cleanup transactions that failed since this backend was
    /// made (upstream's `nftables_cleanup_failures_total`).
    pub fn cleanup_failures(&self) -> usize {
        self.cleanup_failures
    }

    /// Deletes the stale chains that are due, in a transaction of their
    /// own (`nft delete chain`); returns how many such transactions failed
    /// (0 or 1). A failure leaves the chains in the record's stale list, so
    /// the next sync tries again, and does not fail the sync: an
    /// unreferenced empty chain does no harm meanwhile.
    fn delete_stale_chains(&mut self, now: Instant, own: &mut Ruleset) -> usize {
        let Some(cleanup) = stale_chain_cleanup(self.family, now, &self.programmed) else {
            return 0;
        };
        match self.apply_own(own, &cleanup.transaction) {
            Ok(()) => {
                for chain in &cleanup.chains {
                    self.programmed.stale_chains.remove(chain);
                }
                tracing::debug!(family = %self.family, chains = cleanup.chains.len(), "deleted stale nftables chains");
                0
            }
            Err(error) => {
                self.cleanup_failures += 1;
                tracing::warn!(
                    family = %self.family,
                    chains = cleanup.chains.len(),
                    error = %error,
                    "could not delete stale nftables chains; trying again at the next sync"
                );
                1
            }
        }
    }

    /// Commits `transaction`, one of the proxy's own outside a sync's (the
    /// deletion of stale chains), and keeps the table trusted if it was.
    /// Such a transaction only deletes objects, which the kernel refuses
    /// unless each one is there, so once taken it is a change: one
    /// generation.
    fn apply_own(
        &mut self,
        own: &mut Ruleset,
        transaction: &Transaction,
    ) -> Result<(), ApplyError> {
        let before = self.current_generation();
        self.applier.apply(transaction)?;
        let trusted = self.settle(
            own,
            self.state.trusted(),
            before,
            Commits::Changes(1),
            false,
        );
        self.state = self.state.with_trusted(trusted);
        Ok(())
    }

    /// After a failed commit: the kernel may hold anything the record does
    /// not know (someone else may have changed the table), so the next sync
    /// deletes the table and writes it afresh in one transaction, which
    /// needs no record. Affinity state is lost then, as after a restart.
    fn forget_kernel(&mut self) {
        self.state = TableState::Failed;
    }

    /// The ruleset generation now, where the applier can tell.
    fn current_generation(&mut self) -> Option<u32> {
        match self.applier.generation()? {
            Ok(generation) => Some(generation),
            Err(error) => {
                tracing::debug!(family = %self.family, error = %error, "cannot read the nftables ruleset generation");
                None
            }
        }
    }

    /// Settles what the proxy knows of the ruleset after its commits
    /// (made since `before`, the generation read just before them), and
    /// returns the generation at which the table is trusted now: when the
    /// commits alone explain the generation now, it records them as its
    /// own and trusts the table at the new generation if it was `trusted`
    /// before (no one else's commit since) or `rewrote` it whole;
    /// otherwise it trusts nothing until a full rewrite.
    fn settle(
        &mut self,
        own: &mut Ruleset,
        trusted: Option<u32>,
        before: Option<u32>,
        commits: Commits,
        rewrote: bool,
    ) -> Option<u32> {
        let after = self.current_generation();
        let (Some(before), Some(after)) = (before, after) else {
            return None;
        };
        if !commits_explain(before, after, commits) {
            return None;
        }
        own.record(before, after);
        let trusted_before =
            trusted.is_some_and(|trusted| own.untouched_between(self.family, trusted, before));
        (rewrote || trusted_before).then_some(after)
    }

    /// A full sync of a table nobody else touched since the proxy's last
    /// commit: every commit since then (the ruleset generation counts
    /// them) was this process's own or one its watch saw leave this table
    /// alone ([`crate::generation`]), so the table is exactly
    /// [`Programmed`], and only what differs from it is sent, in a
    /// transaction the kernel takes only at the generation checked
    /// (checked and committed in one step). Rewriting every
    /// rule of a large table costs the kernel seconds (it parses and
    /// validates each one); a table someone else changed, or a changed
    /// fixed part, gets the full rewrite (`None`).
    fn untouched_full_sync(
        &mut self,
        own: &mut Ruleset,
        request: &SyncRequest<'_>,
        node_ports: Option<&[IpAddr]>,
        now: Instant,
        cleanup_failures: usize,
    ) -> Result<Option<SyncOutcome>, BackendError> {
        let Some(trusted) = self.state.trusted() else {
            return Ok(None);
        };
        let Some(current) = self.current_generation() else {
            return Ok(None);
        };
        if !own.untouched_between(self.family, trusted, current) {
            tracing::debug!(family = %self.family, "the nftables table may have been changed by someone else since the last commit; rewriting it");
            return Ok(None);
        }
        let mut input = RenderInput {
            family: self.family,
            full: true,
            reset: false,
            split: false,
            service_ports: request.service_ports,
            changed_services: request.changed_services,
            prune: false,
            node: request.node,
            node_port_addresses: node_ports,
            now,
        };
        if Some(self.renderer.head_fingerprint(&input)) != self.state.head_hash() {
            return Ok(None);
        }
        // The table is the record, which the previous successful sync
        // left: only the Services that changed since then (the sync loop
        // names them, for a full sync too) can render differently, and,
        // to be safe, those the record and the request do not both have.
        let mut changed = request.changed_services.clone();
        changed.extend(services_in_one_only(
            request.service_ports,
            &self.programmed,
        ));
        input.full = false;
        input.prune = true;
        input.changed_services = &changed;
        let mut transaction = Transaction::new(self.family);
        let rendered = self
            .renderer
            .render_streamed(&input, &self.programmed, |piece| {
                if let Piece::Commands(mut commands) = piece {
                    transaction.commands.append(&mut commands);
                }
                Ok::<(), std::convert::Infallible>(())
            })
            .unwrap_or_else(|never| match never {});
        match self.applier.apply_at(&transaction, current) {
            Ok(()) => {}
            Err(ApplyError::GenerationMoved) => {
                tracing::debug!(family = %self.family, "the nftables ruleset changed meanwhile; rewriting the table");
                return Ok(None);
            }
            Err(error) => {
                // Bound to a generation at which the table is exactly the
                // record: the refused lines are at fault, not the table.
                self.forget_kernel();
                return Err(rejected(error, request.service_ports, Blame::Lines));
            }
        }
        let trusted = self.settle(own, Some(current), Some(current), rendered.commits(), false);
        self.state = self.state.with_trusted(trusted);
        self.programmed.commit(rendered.delta);
        let mut outcome = outcome(true, &rendered.stats, &self.programmed);
        outcome.cleanup_failures = cleanup_failures;
        tracing::debug!(
            family = %self.family,
            commands = rendered.stats.commands,
            "full sync of an untouched nftables table: only the differences were sent"
        );
        Ok(Some(outcome))
    }

    /// `error` with the refused lines of a streamed transaction
    /// ([`ApplyError::RefusedLines`]) named: the applier encoded its
    /// commands as they came and kept none, so the same render is made
    /// again (rendering is deterministic, and the record is as it was),
    /// collected this time, and the lines are read from its transaction.
    fn name_refused_lines(&mut self, error: ApplyError, input: &RenderInput<'_>) -> ApplyError {
        let ApplyError::RefusedLines { transaction, .. } = &error else {
            return error;
        };
        let wanted = *transaction;
        let mut current = Transaction::new(self.family);
        let mut found = None;
        let mut index = 0;
        let rendered = self
            .renderer
            .render_streamed(input, &self.programmed, |piece| {
                match piece {
                    Piece::Commands(mut commands) if index == wanted => {
                        current.commands.append(&mut commands);
                    }
                    Piece::Commands(_) => {}
                    Piece::Commit => {
                        if index == wanted {
                            found = Some(std::mem::replace(
                                &mut current,
                                Transaction::new(self.family),
                            ));
                        }
                        index += 1;
                    }
                }
                Ok::<(), std::convert::Infallible>(())
            });
        let Ok(_) = rendered;
        match found {
            Some(transaction) => crate::netlink::name_refused_lines(error, &transaction),
            None => error,
        }
    }

    /// The addresses NodePorts answer on; `None` means every local address.
    fn resolve_node_ports(
        &mut self,
        node: &NodeInfo,
        full: bool,
    ) -> Result<Option<Vec<IpAddr>>, BackendError> {
        let needs_host = matches!(
            &self.node_port_addresses,
            NodePortAddresses::Select { cidrs, .. } if !cidrs.is_empty()
        );
        let local = if needs_host {
            (self.local_addresses)(full).map_err(|source| BackendError::Apply {
                mode: MODE,
                attempted: "listing the host's addresses for nodePortAddresses".to_owned(),
                source: Box::new(source),
            })?
        } else {
            Vec::new()
        };
        Ok(self.node_port_addresses.resolve(self.family, node, &local))
    }
}

impl Backend for NftablesBackend {
    fn mode(&self) -> &'static str {
        MODE
    }

    /// A full sync of a table trusted at the current generation sends
    /// only the differences from the record; after this the next sync
    /// rebuilds the table from nothing in one transaction, as after a
    /// failed one, which also removes what the record does not know of.
    fn distrust_kernel(&mut self) {
        self.forget_kernel();
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncOutcome, BackendError> {
        if request.family != self.family {
            return Err(BackendError::Render {
                mode: MODE,
                reason: format!(
                    "a sync of {} rules reached the {} backend",
                    request.family, self.family
                ),
            });
        }
        let plan = self.state.plan(request.full);
        let (full, reset) = (plan.full, plan.reset);
        let node_ports = self.resolve_node_ports(request.node, full)?;
        let now = (self.clock)();
        // The other family's commits wait until this sync's are done and
        // settled ([`crate::generation`]).
        let ruleset = Arc::clone(&self.ruleset);
        let applier = &mut self.applier;
        let mut own = generation::lock_for_commits(&ruleset, || applier.watch());
        // A reset deletes the table, stale chains with it.
        let cleanup_failures = if reset {
            0
        } else {
            self.delete_stale_chains(now, &mut own)
        };
        if plan.differences_only {
            if let Some(outcome) = self.untouched_full_sync(
                &mut own,
                request,
                node_ports.as_deref(),
                now,
                cleanup_failures,
            )? {
                return Ok(outcome);
            }
        }
        if full {
            own.quiet();
        }
        let before = self.current_generation();
        let input = RenderInput {
            family: self.family,
            full,
            reset,
            split: plan.split,
            service_ports: request.service_ports,
            changed_services: request.changed_services,
            prune: false,
            node: request.node,
            node_port_addresses: node_ports.as_deref(),
            now,
        };
        let family = self.family;
        let mut stream = self.applier.stream(family);
        let committed = self.renderer.render_streamed(
            &input,
            &self.programmed,
            |piece| match piece {
                Piece::Commands(commands) => {
                    let lines = Lines::new(family, &commands);
                    tracing::trace!(family = %family, lines = %lines, "nftables transaction text");
                    stream.write(commands)
                }
                Piece::Commit => stream.commit(),
            },
        );
        drop(stream);
        let rendered = match committed {
            Ok(rendered) => rendered,
            Err(error) => {
                // The kernel kept the table as the last transaction left
                // it (with a split sync: some Services rewritten, each
                // whole), but someone else may have changed it behind the
                // record (a deleted table fails a partial transaction).
                // Only a transaction that built the table from nothing
                // (the retry after a failure) tells that the refused lines
                // themselves are at fault.
                let error = self.name_refused_lines(error, &input);
                self.forget_kernel();
                let blame = if reset { Blame::Lines } else { Blame::Nobody };
                return Err(rejected(error, request.service_ports, blame));
            }
        };
        if reset {
            self.programmed.clear();
        }
        let trusted = self.settle(
            &mut own,
            self.state.trusted(),
            before,
            rendered.commits(),
            rendered.full,
        );
        self.state = self.state.succeeded(rendered.head_hash, trusted);
        self.programmed.commit(rendered.delta);
        let mut outcome = outcome(rendered.full, &rendered.stats, &self.programmed);
        outcome.cleanup_failures = cleanup_failures;
        tracing::debug!(
            family = %self.family,
            full,
            reset,
            transactions = rendered.transactions,
            commands = rendered.stats.commands,
            elements_added = rendered.stats.elements_added,
            elements_deleted = rendered.stats.elements_deleted,
            cleanup_failures,
            "committed nftables transaction"
        );
        Ok(outcome)
    }
}

impl std::fmt::Debug for NftablesBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NftablesBackend")
            .field("family", &self.family)
            .field("node_port_addresses", &self.node_port_addresses)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

/// Counts after the transaction, for logs and metrics, from the record
/// it left (`programmed`).
/// The Services that have service ports in `service_ports` but no record
/// in `programmed`, or a record but no service port: a merge of the two
/// sorted name sequences.
fn services_in_one_only(
    service_ports: &BTreeMap<kp_model::ServicePortName, kp_sync::ServicePortState>,
    programmed: &Programmed,
) -> Vec<NamespacedName> {
    use std::cmp::Ordering;
    let mut requested = service_ports.keys().map(|port| &port.service).peekable();
    let mut recorded = programmed.services.keys().peekable();
    let mut only = Vec::new();
    loop {
        let order = match (requested.peek(), recorded.peek()) {
            (None, None) => return only,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some(a), Some(b)) => a.cmp(b),
        };
        match order {
            Ordering::Less => {
                if let Some(service) = requested.next() {
                    only.push(service.clone());
                    // The Service's other ports.
                    while requested.next_if(|next| *next == service).is_some() {}
                }
            }
            Ordering::Greater => only.extend(recorded.next().cloned()),
            Ordering::Equal => {
                if let Some(service) = requested.next() {
                    while requested.next_if(|next| *next == service).is_some() {}
                }
                recorded.next();
            }
        }
    }
}

fn outcome(full: bool, stats: &RenderStats, programmed: &Programmed) -> SyncOutcome {
    let (chains, rules, _) = programmed.totals();
    let table = TABLE.to_owned();
    SyncOutcome {
        full,
        rules_per_table: vec![(table.clone(), rules)],
        chains_per_table: vec![(table.clone(), chains)],
        rules_written_per_table: vec![(table, stats.rules_written)],
        objects_written: stats.commands,
        cleanup_failures: 0,
    }
}

/// Who a refused transaction is blamed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blame {
    /// The Services of the refused lines: the transaction met the table as
    /// the proxy knew it (built from nothing, or bound to the generation
    /// of its own last commit).
    Lines,
    /// Nobody: the table may have been changed by someone else since the
    /// proxy's last commit (a deleted table refuses every line of a partial
    /// transaction), so the refusal says nothing of the lines; the full
    /// rebuild that follows tells.
    Nobody,
}

/// A transaction the kernel (or the encoder) refused, as the sync loop's
/// [`BackendError::Rejected`], naming the Services whose lines were
/// refused when they are to `blame`: the sync loop leaves those out of the
/// next syncs, so that the others are programmed.
fn rejected(
    error: ApplyError,
    service_ports: &std::collections::BTreeMap<
        kp_model::ServicePortName,
        kp_sync::ServicePortState,
    >,
    blame: Blame,
) -> BackendError {
    let refused = match blame {
        Blame::Lines => error.refused_commands(),
        Blame::Nobody => Vec::new(),
    };
    let services: BTreeSet<NamespacedName> = refused
        .into_iter()
        .filter_map(|command| {
            crate::names::service_of_command(command)
                .or_else(|| service_of_address(command, service_ports))
        })
        .collect();
    match apply_error("committing the transaction", error).rejected() {
        BackendError::Rejected {
            mode,
            attempted,
            source,
            ..
        } => BackendError::Rejected {
            mode,
            attempted,
            services,
            source,
        },
        other => other,
    }
}

/// The Service whose address an element command's first key starts with
/// (`add element … cluster-ips { 10.96.0.10 }`): elements of the fixed sets
/// name no chain and have no comment.
fn service_of_address(
    command: &Command,
    service_ports: &std::collections::BTreeMap<
        kp_model::ServicePortName,
        kp_sync::ServicePortState,
    >,
) -> Option<NamespacedName> {
    // A command of several elements (the data layout's count sets share
    // commands) may hold several Services' elements: none is blamed.
    let key = match command {
        Command::AddElements { elements, .. } if elements.len() == 1 => {
            elements.first().map(|element| element.key)
        }
        Command::DeleteElements { keys, .. } if keys.len() == 1 => keys.first().copied(),
        _ => None,
    }?;
    let address = match key {
        Key::Addr(address) | Key::AddrProtoPort(address, _, _) => address,
        Key::ProtoPort(..) | Key::EntrySlot(..) | Key::PortSlot(..) | Key::AddrPair(..) => {
            return None
        }
    };
    service_ports
        .iter()
        .find(|(_, state)| {
            let port = &state.port;
            port.cluster_ip == address
                || port.external_ips.contains(&address)
                || port.load_balancer_ips.contains(&address)
        })
        .map(|(name, _)| name.service.clone())
}

/// What to install when `nft` is missing.
const INSTALL_NFT: &str =
    "install the nftables package (Debian and Ubuntu: apt-get install nftables)";

/// A backend error for a failed step; a missing `nft` makes the mode
/// unavailable, reported once.
fn apply_error(step: &str, error: ApplyError) -> BackendError {
    if let Some(program) = error.missing_program() {
        return BackendError::Unavailable {
            mode: MODE,
            missing: format!("program {program} not found"),
            remedy: INSTALL_NFT.to_owned(),
        };
    }
    if let ApplyError::NoNftables { message } = &error {
        return BackendError::Unavailable {
            mode: MODE,
            missing: format!("nf_tables in the kernel ({message})"),
            remedy: "load the nf_tables module (modprobe nf_tables) or run a kernel built with CONFIG_NF_TABLES".to_owned(),
        };
    }
    BackendError::Apply {
        mode: MODE,
        attempted: format!("{step}: {error}"),
        source: Box::new(error),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use kp_sync::testing::service;

    #[test]
    fn a_refused_line_names_its_service_by_name_comment_or_address() {
        use crate::model::{ChainKind, Name, SetElement, Verdict};
        use kp_model::Protocol;
        let ports: std::collections::BTreeMap<_, _> = [
            service("ns1", "web", "10.96.0.10", 80).build(),
            service("ns1", "lb", "10.96.0.11", 80)
                .lb_ip("203.0.113.9")
                .build(),
        ]
        .into_iter()
        .collect();
        let refused = |command: Command| {
            let error = ApplyError::Kernel {
                message: "No such file or directory (os error 2)".to_owned(),
                line: Some((7, command.line(IpFamily::V4).to_string())),
                also_refused: Vec::new(),
                refused: vec![command],
            };
            match rejected(error, &ports, Blame::Lines) {
                BackendError::Rejected { services, .. } => services,
                other => panic!("expected a rejected transaction, got {other:?}"),
            }
        };
        let chain = |name: &str| Command::AddChain {
            name: Name::Shared(Arc::from(name)),
            kind: ChainKind::Regular,
        };
        let element =
            |set: &'static str, key: Key, verdict: Option<Verdict>| Command::AddElements {
                set: Name::Fixed(set),
                elements: vec![SetElement {
                    key,
                    comment: None,
                    verdict,
                }],
            };
        let address = |text: &str| text.parse::<IpAddr>().unwrap();
        let web: BTreeSet<_> = [NamespacedName::new("ns1", "web")].into();
        let lb: BTreeSet<_> = [NamespacedName::new("ns1", "lb")].into();
        assert_eq!(refused(chain("service-AAAAAAAA-ns1/web/tcp/http")), web);
        assert_eq!(
            refused(element(
                "cluster-ips",
                Key::Addr(address("10.96.0.10")),
                None
            )),
            web
        );
        let external = Name::Shared(Arc::from("external-AAAAAAAA-ns1/lb/tcp/http"));
        assert_eq!(
            refused(element(
                "service-ips",
                Key::AddrProtoPort(address("203.0.113.9"), Protocol::Tcp, 80),
                Some(Verdict::Goto(external))
            )),
            lb
        );
        assert_eq!(
            refused(element(
                "cluster-ips",
                Key::Addr(address("203.0.113.9")),
                None
            )),
            lb
        );
        assert_eq!(
            refused(chain("services")),
            BTreeSet::new(),
            "a fixed chain belongs to no Service"
        );
    }

    #[test]
    fn a_refusal_of_a_table_someone_else_may_have_changed_names_no_service() {
        let ports: std::collections::BTreeMap<_, _> =
            [service("ns1", "web", "10.96.0.10", 80).build()]
                .into_iter()
                .collect();
        let command = Command::AddChain {
            name: crate::model::Name::Shared(Arc::from("service-AAAAAAAA-ns1/web/tcp/http")),
            kind: crate::model::ChainKind::Regular,
        };
        let error = ApplyError::Kernel {
            message: "No such file or directory (os error 2)".to_owned(),
            line: Some((7, command.line(IpFamily::V4).to_string())),
            also_refused: Vec::new(),
            refused: vec![command],
        };
        match rejected(error, &ports, Blame::Nobody) {
            BackendError::Rejected { services, .. } => assert_eq!(services, BTreeSet::new()),
            other => panic!("expected a rejected transaction, got {other:?}"),
        }
    }
}
