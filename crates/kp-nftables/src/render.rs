//! The renderer: service ports and endpoints in, one nft transaction out.
//!
//! The transaction is `nft -f` input for table `ip kube-proxy` (or `ip6
//! kube-proxy`) with upstream's layout: base chains at upstream's hooks and
//! priorities, dispatch through the `service-ips` and `service-nodeports`
//! verdict maps, refusals through `no-endpoint-services` and
//! `no-endpoint-nodeports`, source ranges through `firewall-ips`, and per
//! service port `service-`, `local-`, `external-`, `firewall-` and
//! `endpoint-` chains with `affinity-` sets.
//!
//! **Full render**: declares and flushes the fixed chains, sets and maps,
//! then writes every Service's chains and elements. With `reset` the table
//! is deleted first in the same transaction, which removes whatever an
//! earlier process left; otherwise chains of Services that are gone are
//! flushed and left for a later transaction to delete.
//!
//! **Partial render**: only the Services in `changed_services`: their
//! chains are rewritten (add, flush, rules) unless their commands are what
//! the last transaction left (the record keeps a fingerprint of them), and their
//! elements are added or deleted by comparing with that record
//! ([`Programmed`]). Nothing needs to be listed from the kernel.
//!
//! The transaction is built as typed commands ([`crate::model`]), printed
//! as text for `nft -f` and `--dry-run` and encoded as netlink messages
//! from the same values.
//!
//! A full render goes over the Services twice: first it builds every
//! Service's record (what [`Programmed`] keeps once the transaction is
//! committed), then it writes their commands. The records live on and the
//! commands go with their transaction; built side by side, the records
//! would pin the holes the commands leave on the heap once freed.
//!
//! Command order inside one transaction: fixed objects, Service sets and
//! chains (so elements can name them), element deletions, element
//! additions, then the chains no Service uses any more, flushed.
//!
//! **The data layout** ([`Layout::Data`], chosen with
//! [`Renderer::with_layout`]) keeps the same machinery; its differences are
//! in `service` and `head`. A service port's endpoints keep their slots
//! while they stay (the record's [`crate::state::Draw`]); a partial render
//! rewrites only the chains whose commands changed (so an endpoint
//! replaced, or a change of the endpoint count, is elements only), adds the
//! class rule of an endpoint count no entry had before (class rules are
//! kept until the next full render), and adds or deletes a
//! `hairpin-endpoints` pair only when the first Service needs it or the
//! last one stops.
//!
//! **Stale chain cleanup** ([`stale_chain_cleanup`]): a flushed chain is
//! deleted at least [`STALE_CHAIN_DELAY`] later, in a transaction of its
//! own that runs before a later sync's, as upstream does: with kernels
//! before 6.2, a chain whose last map element was just deleted still counts
//! as referenced for a moment, and a failed deletion must not fail the
//! sync.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::hash::Hash;
use std::net::IpAddr;
use std::ops::Bound;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kp_model::{IpFamily, NamespacedName, NodeInfo, Protocol, ServicePortName};
use kp_sync::ServicePortState;

use crate::model::{ChainKind, Command, Key, Name, Transaction};
use crate::names::{is_slot_map_or_count_set, HAIRPIN_ENDPOINTS};
use crate::options::{Layout, NftDetector, NftablesOptions};
use crate::state::{Class, Element, Programmed, ServiceRecord, StateDelta};
use crate::NftablesError;

mod head;
mod service;

/// How long a flushed chain waits before it is deleted.
pub const STALE_CHAIN_DELAY: Duration = Duration::from_secs(1);

/// Service chain text after which a full render that may be split starts
/// another transaction (at a Service boundary): 1 MiB of text is about
/// 1,100 Service ports with two endpoints and a 3 MiB netlink batch. A
/// larger table gets larger transactions, at most [`SPLIT_PIECES`] or so.
pub const TRANSACTION_TEXT_MAX: usize = 1 << 20;

/// About how many transactions a split full render is cut into at most:
/// each one that adds rules makes the kernel validate the whole table
/// (a quarter of a second at 5,000 Service ports × 50 endpoints), so the
/// number of pieces, not only their size, must stay bounded.
pub const SPLIT_PIECES: usize = 8;

/// Everything one render looks at, for one IP family.
#[derive(Debug, Clone, Copy)]
pub struct RenderInput<'a> {
    /// The family.
    pub family: IpFamily,
    /// Rewrite everything, not only the changed Services.
    pub full: bool,
    /// Delete the table first (only with `full`): the first sync of a
    /// process, or after a full sync failed. A render that is split (see
    /// `split`) does not delete it: it rewrites it in place, without the
    /// record.
    pub reset: bool,
    /// Whether a full render may be split into several transactions when
    /// its Service chains pass the renderer's bound
    /// ([`Renderer::with_transaction_text_max`]); a partial render is
    /// always one transaction.
    pub split: bool,
    /// Every service port of this family, with its endpoints.
    pub service_ports: &'a BTreeMap<ServicePortName, ServicePortState>,
    /// Services that changed since the last successful transaction (used by
    /// a partial render).
    pub changed_services: &'a BTreeSet<NamespacedName>,
    /// For a partial render: also drop what only a full render drops (the
    /// data layout's classes no Service needs any more), so that the table
    /// ends as a full render would leave it. A full sync of a table nobody
    /// else touched is sent so, as its differences.
    pub prune: bool,
    /// This node.
    pub node: &'a NodeInfo,
    /// `nodePortAddresses` resolved to this host's addresses: `None` accepts
    /// NodePorts on every local address (`fib daddr type local`).
    pub node_port_addresses: Option<&'a [IpAddr]>,
    /// The time of the sync: chains it flushes are stale from then.
    pub now: Instant,
}

/// Counts of one render, for logs and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenderStats {
    /// Service ports whose chains and elements were written.
    pub service_ports_written: usize,
    /// Lines (commands) of the transactions.
    pub commands: usize,
    /// `add rule` lines of the transactions.
    pub rules_written: usize,
    /// Elements added.
    pub elements_added: usize,
    /// Elements deleted.
    pub elements_deleted: usize,
    /// Chains flushed because they became stale.
    pub chains_flushed: usize,
}

/// The result of a render.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// The family rendered.
    pub family: IpFamily,
    /// Whether everything was written.
    pub full: bool,
    /// `nft -f` input: the transactions' text in order
    /// ([`Renderer::render`]); empty from [`Renderer::render_streamed`].
    pub text: String,
    /// Transactions written (more than one for a split full render).
    pub transactions: usize,
    /// Of those, the ones that certainly change the table
    /// ([`Command::certainly_changes`]: a rule, an element added or
    /// deleted, an object deleted), so that the kernel counts their commit
    /// as a new ruleset generation; one with none of these (objects
    /// declared or flushed only) may change nothing.
    ///
    /// An element added is a change only if the table does not hold it
    /// already, which holds wherever the commit's generation is trusted
    /// (the table is then exactly the record the render compared with). If
    /// the table held it after all, the generation stays, the commits do
    /// not explain it, and the backend trusts the table no more: a full
    /// rewrite, never a wrong trust.
    pub transactions_with_changes: usize,
    /// A fingerprint of the fixed part of a full render (see
    /// [`Renderer::head_fingerprint`]); `None` for a partial one.
    pub head_hash: Option<u64>,
    /// What the transaction changes in [`Programmed`], once it succeeded.
    pub delta: StateDelta,
    /// Counts.
    pub stats: RenderStats,
}

/// How a render's commits move the ruleset generation on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commits {
    /// By exactly this many: each transaction changes the table, and the
    /// kernel counts each such commit as a new generation.
    Changes(usize),
    /// One transaction that may change nothing.
    MaybeNone,
    /// Several transactions, some of which may change nothing: unknown.
    Unknown,
}

impl Rendered {
    /// How this render's transactions, once committed, moved the ruleset
    /// generation on.
    pub fn commits(&self) -> Commits {
        if self.transactions_with_changes == self.transactions {
            Commits::Changes(self.transactions)
        } else if self.transactions == 1 {
            Commits::MaybeNone
        } else {
            Commits::Unknown
        }
    }
}

/// A transaction deleting stale chains ([`stale_chain_cleanup`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleChainCleanup {
    /// The transaction.
    pub transaction: Transaction,
    /// The chains it deletes.
    pub chains: Vec<Arc<str>>,
}

/// A piece of a streamed render ([`Renderer::render_streamed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Commands of the current transaction, in order.
    Commands(Vec<Command>),
    /// The current transaction ends here; commit it before going on.
    Commit,
}

/// Renders transactions; one per family.
#[derive(Debug)]
pub struct Renderer {
    options: NftablesOptions,
    layout: Layout,
    capacity_hint: usize,
    /// The longest text a render to text wrote, in bytes, to size the next.
    text_hint: usize,
    transaction_text_max: usize,
}

/// What every service port's rendering needs to know.
#[derive(Debug)]
pub(crate) struct Context {
    /// The family of the table.
    pub family: IpFamily,
    pub masquerade_all: bool,
    pub detector: Option<NftDetector>,
    pub layout: Layout,
}

/// The commands of a transaction, by section.
#[derive(Debug, Default)]
pub(crate) struct Sections {
    /// The deletion of the table, with `reset`.
    pub reset: Vec<Command>,
    pub head: Vec<Command>,
    pub chains: Vec<Command>,
    /// Service chains already printed (a render to text), in place of
    /// their commands.
    pub chains_text: String,
    /// Commands and rules of `chains_text`.
    pub chains_printed: (usize, usize),
    pub deletions: Vec<Command>,
    pub additions: Vec<Command>,
    /// For each map whose elements share commands, the command in
    /// `additions` that takes its next element (see `write_add`).
    pub shared_additions: Vec<(&'static str, usize)>,
    pub tail: Vec<Command>,
}

impl Sections {
    /// The additions written so far, once `in_piece` (the elements written
    /// since the last piece) reaches [`ELEMENTS_PER_PIECE`]; the count
    /// starts again, and the next element of a map starts a command of its
    /// own.
    fn full_piece(&mut self, in_piece: &mut usize) -> Option<Vec<Command>> {
        if *in_piece < ELEMENTS_PER_PIECE {
            return None;
        }
        *in_piece = 0;
        self.shared_additions.clear();
        Some(std::mem::take(&mut self.additions))
    }
}

/// Where the first pass of a full render put a Service's record.
#[derive(Debug, Clone, Copy)]
enum Kept {
    /// A new record, in `StateDelta::services` at this index.
    New(usize),
    /// The record the table holds already, in [`Programmed`].
    Old,
    /// None: the Service has no port.
    Gone,
}

impl Renderer {
    /// A renderer with `options`, after checking them.
    pub fn new(options: NftablesOptions) -> Result<Self, NftablesError> {
        options.validate()?;
        Ok(Self {
            options,
            layout: Layout::default(),
            capacity_hint: 0,
            text_hint: 0,
            transaction_text_max: TRANSACTION_TEXT_MAX,
        })
    }

    /// Splits full renders (that may be split) into transactions of about
    /// `bytes` of Service chain text each (more for a table larger than
    /// [`SPLIT_PIECES`] times that), instead of [`TRANSACTION_TEXT_MAX`].
    #[must_use]
    pub fn with_transaction_text_max(mut self, bytes: usize) -> Self {
        self.transaction_text_max = bytes.max(1);
        self
    }

    /// Renders `layout` instead of [`Layout::Chains`].
    #[must_use]
    pub fn with_layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    /// The layout this renderer writes.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The options this renderer was built with.
    pub fn options(&self) -> &NftablesOptions {
        &self.options
    }

    /// Renders `input` against what the table holds (`programmed`), every
    /// transaction's text in [`Rendered::text`]. Pure: the same input gives
    /// the same text.
    pub fn render(&mut self, input: &RenderInput<'_>, programmed: &Programmed) -> Rendered {
        let mut text = String::with_capacity(self.text_hint);
        let result = self.render_into(input, programmed, Some(&mut text), |_| {
            Ok::<(), std::convert::Infallible>(())
        });
        let Ok(mut rendered) = result;
        self.text_hint = self.text_hint.max(text.len());
        rendered.text = text;
        rendered
    }

    /// Renders `input` like [`Renderer::render`], handing the commands to
    /// `emit` in pieces, each transaction closed by [`Piece::Commit`]. An
    /// error of `emit` stops the render.
    ///
    /// A full render is one transaction (fixed objects first, then every
    /// Service's chains, element deletions, element additions, stale
    /// chains), unless `input.split` allows a split and the Service chains
    /// pass the bound: then each transaction but the last holds the table,
    /// the `mark-for-masquerade` chain and the complete chains and sets of
    /// some Services (never part of one), and the last one holds the fixed
    /// objects with their maps and sets flushed, every element, and the
    /// stale chains. Each leaves a consistent table: until the last,
    /// elements still lead where the previous sync sent them, and chains are
    /// rewritten whole, every chain they name written in the same
    /// transaction (a Service whose chains were rewritten but whose element
    /// changes wait serves its new endpoints through the old dispatch; one
    /// whose dispatch changes serves as before until the last transaction).
    pub fn render_streamed<E>(
        &mut self,
        input: &RenderInput<'_>,
        programmed: &Programmed,
        emit: impl FnMut(Piece) -> Result<(), E>,
    ) -> Result<Rendered, E> {
        self.render_into(input, programmed, None, emit)
    }

    /// Renders to `emit`, or, given `text`, prints every command into it
    /// instead (and hands `emit` only the commits): a Service's chains are
    /// then printed once, which also measures them for the split.
    fn render_into<E>(
        &mut self,
        input: &RenderInput<'_>,
        programmed: &Programmed,
        text: Option<&mut String>,
        mut emit: impl FnMut(Piece) -> Result<(), E>,
    ) -> Result<Rendered, E> {
        let full = input.full || input.reset;
        let ctx = self.context(input);
        let mut out = Sections::default();
        let mut stats = RenderStats::default();
        let may_split = full && input.split;
        let limit = self
            .transaction_text_max
            .max(estimated_chain_text(input.service_ports, self.layout) / SPLIT_PIECES);
        let mut split = false;
        let mut emitted = Emitted {
            family: input.family,
            layout: self.layout,
            text,
            lines: 0,
            rules: 0,
            transactions: 0,
            transactions_with_changes: 0,
            current_changes: 0,
        };
        // Service chain text written since the last split, in bytes.
        let mut chain_text = 0;
        if full {
            let estimate = input.service_ports.len() * 10;
            let wanted = self.capacity_hint.max(estimate);
            out.chains.reserve(if may_split {
                wanted.min(limit / COMMAND_BYTES_MIN)
            } else {
                wanted
            });
            out.additions
                .reserve((input.service_ports.len() * 2).min(ELEMENTS_PER_PIECE));
            if input.reset {
                out.reset = head::reset();
            }
            if emitted.text.is_some() {
                out.chains_text.reserve(self.text_hint);
            }
            let shared = head::Shared::of(&ctx, input);
            head::write_head(&ctx, &self.options, input, &shared, &mut out.head);
        }
        let mut delta = StateDelta {
            replace_all: full,
            now: Some(input.now),
            ..StateDelta::default()
        };
        let services: Vec<&NamespacedName> = if full {
            let mut all: Vec<&NamespacedName> = input
                .service_ports
                .keys()
                .map(|port| &port.service)
                .collect();
            all.dedup();
            all
        } else {
            input.changed_services.iter().collect()
        };
        let kept = if full {
            self.build_records(&ctx, input, programmed, &services, &mut delta)
        } else {
            Vec::new()
        };
        for (index, &service) in services.iter().enumerate() {
            let chains_before = out.chains.len();
            let old = if input.reset {
                None
            } else {
                programmed.services.get(service)
            };
            let rendered = self.render_service(&ctx, input, service, old, &mut out, &mut stats);
            let record = if let Some(&kept) = kept.get(index) {
                // The first pass built the record (the same one); this pass
                // only writes the commands.
                drop(rendered);
                kept.record(old, &delta.services)
            } else {
                let mut record = rendered;
                if let Some(record) = &mut record {
                    record.chain_text_hash = fingerprint(&out.chains[chains_before..]);
                }
                if old.is_some() && record.as_ref() == old {
                    // The kernel holds exactly these chains already (the
                    // record is what the last transaction left): nothing to
                    // rewrite.
                    out.chains.truncate(chains_before);
                    delta.unchanged.push(service.clone());
                    old
                } else if record.is_none() && old.is_none() {
                    None
                } else {
                    if let (Layout::Data, Some(old), Some(new)) = (ctx.layout, old, &record) {
                        keep_changed_chains(&mut out.chains, chains_before, old, new);
                    }
                    delta.services.push((service.clone(), record));
                    delta
                        .services
                        .last()
                        .and_then(|(_, record)| record.as_ref())
                }
            };
            if emitted.text.is_some() {
                chain_text += out.print_chains(ctx.family, chains_before);
            } else if may_split {
                chain_text += text_len(ctx.family, &out.chains[chains_before..]);
            }
            if !full {
                diff_elements(old, record, &mut out, &mut stats);
            }
            flush_unused(old, record, &mut out, &mut stats, &mut delta.newly_stale);
            if may_split && chain_text >= limit {
                split = true;
                emitted.chain_transaction(&mut emit, &mut out)?;
                chain_text = 0;
            }
        }
        if ctx.layout == Layout::Data {
            if full {
                delta.classes = head::classes_to_hold(input);
                if !input.reset {
                    delete_unused_count_sets(programmed, &delta.classes, &mut out.head);
                }
            } else {
                write_hairpin(programmed, &delta, &mut out, &mut stats);
                let wanted = input.prune.then(|| head::classes_to_hold(input));
                write_class_change(input.family, programmed, wanted, &mut delta, &mut out);
            }
        }
        if full && !input.reset {
            flush_vanished_services(input, programmed, &mut out, &mut stats, &mut delta);
        }
        if !input.reset {
            revive_stale_chains(programmed, &mut delta);
        }
        let head_hash = full.then(|| self.head_fingerprint(input));
        if split {
            if out.has_chains() {
                emitted.chain_transaction(&mut emit, &mut out)?;
            }
            // In place: the table is not deleted (that would leave the
            // Services of the transactions above without their elements).
            emitted.emit(&mut emit, std::mem::take(&mut out.head))?;
        } else {
            emitted.emit(&mut emit, std::mem::take(&mut out.reset))?;
            emitted.emit(&mut emit, std::mem::take(&mut out.head))?;
            emitted.chains(&mut emit, &mut out)?;
        }
        emitted.emit(&mut emit, std::mem::take(&mut out.deletions))?;
        // A full render flushed the maps and adds every element again,
        // written only now, after everything else of the last transaction
        // was handed on, and handed on in pieces: held from the start, the
        // elements would lie between the commands of the transactions
        // above, and an applier that encodes pieces as they come holds a
        // piece's commands, never all the elements' at once.
        let mut in_piece = 0;
        for (&service, kept) in services.iter().zip(&kept) {
            let old = programmed.services.get(service);
            if let Some(record) = kept.record(old, &delta.services) {
                record.for_each_element(|element| {
                    write_add(element, &mut out);
                    stats.elements_added += 1;
                    in_piece += 1;
                });
            }
            if let Some(piece) = out.full_piece(&mut in_piece) {
                emitted.emit(&mut emit, piece)?;
            }
        }
        if full && ctx.layout == Layout::Data {
            for ip in hairpin_of_all(programmed, &services, &kept, &delta) {
                write_add(&hairpin_pair(ip), &mut out);
                stats.elements_added += 1;
                in_piece += 1;
                if let Some(piece) = out.full_piece(&mut in_piece) {
                    emitted.emit(&mut emit, piece)?;
                }
            }
        }
        for section in [out.additions, out.tail] {
            emitted.emit(&mut emit, section)?;
        }
        // Every render commits at least one transaction (an empty one for a
        // partial sync with nothing to change), so each sync reaches the
        // applier.
        emitted.commit(&mut emit)?;
        self.capacity_hint = self.capacity_hint.max(emitted.lines);
        stats.commands = emitted.lines;
        stats.rules_written = emitted.rules;
        Ok(Rendered {
            family: input.family,
            full,
            text: String::new(),
            transactions: emitted.transactions,
            transactions_with_changes: emitted.transactions_with_changes,
            head_hash,
            delta,
            stats,
        })
    }

    /// A fingerprint of the fixed part a full render of `input` writes
    /// (base chains, fixed sets and maps, their rules), without the table's
    /// deletion, and without what the data layout holds there for the
    /// Services (their count classes, which partial renders keep up to
    /// date): a full sync whose fixed part and Services'
    /// chains match what the kernel holds has nothing to rewrite.
    pub fn head_fingerprint(&self, input: &RenderInput<'_>) -> u64 {
        let ctx = self.context(input);
        let mut head = Vec::new();
        head::write_head(&ctx, &self.options, input, &head::Shared::none(), &mut head);
        fingerprint(&head)
    }

    fn context(&self, input: &RenderInput<'_>) -> Context {
        Context {
            family: input.family,
            layout: self.layout,
            masquerade_all: self.options.masquerade_all,
            detector: self
                .options
                .resolve_detector(input.family, &input.node.pod_cidrs),
        }
    }

    /// The first pass of a full render: the record of each of `services`
    /// into `delta` (only its name, into `delta.unchanged`, when the table
    /// holds that record already), each Service's commands dropped as soon
    /// as they are fingerprinted; returns where each record is. The second
    /// pass writes the commands.
    ///
    /// The records outlive the render (in [`Programmed`]) while the
    /// commands go with their transaction. Records built between the
    /// commands they were rendered with pinned the holes the commands left
    /// once committed, and the heap kept them: 1.8 MiB more anonymous
    /// resident memory at the end of the e2e bench at 10,000 Services
    /// (docs/BENCHMARKS.md, issue 24). Built first, the records lie
    /// together, and the commands after them.
    fn build_records(
        &mut self,
        ctx: &Context,
        input: &RenderInput<'_>,
        programmed: &Programmed,
        services: &[&NamespacedName],
        delta: &mut StateDelta,
    ) -> Vec<Kept> {
        let mut scratch = Sections::default();
        let mut stats = RenderStats::default();
        if input.reset {
            delta.services.reserve_exact(services.len());
        }
        let mut kept = Vec::with_capacity(services.len());
        for &service in services {
            let old = if input.reset {
                None
            } else {
                programmed.services.get(service)
            };
            let record = self
                .render_service(ctx, input, service, old, &mut scratch, &mut stats)
                .map(|mut record| {
                    record.chain_text_hash = fingerprint(&scratch.chains);
                    record
                });
            scratch.chains.clear();
            kept.push(match (record, old) {
                // Kept as it is, so a full sync does not hold a second
                // copy of every record until it commits.
                (Some(new), Some(old)) if new == *old => {
                    delta.unchanged.push(service.clone());
                    Kept::Old
                }
                (None, None) => Kept::Gone,
                (record, _) => {
                    delta.services.push((service.clone(), record));
                    Kept::New(delta.services.len() - 1)
                }
            });
        }
        kept
    }

    /// Renders every port of `service` (none: the Service is gone); `old`
    /// is its record, if the table holds it.
    fn render_service(
        &mut self,
        ctx: &Context,
        input: &RenderInput<'_>,
        service: &NamespacedName,
        old: Option<&ServiceRecord>,
        out: &mut Sections,
        stats: &mut RenderStats,
    ) -> Option<ServiceRecord> {
        let mut record = ServiceRecord::default();
        let mut any = false;
        for (name, state) in ports_of(input.service_ports, service) {
            any = true;
            stats.service_ports_written += 1;
            service::render_port(ctx, name, state, old, &mut record, out);
        }
        if !any {
            return None;
        }
        record.normalize();
        Some(record)
    }
}

impl Sections {
    /// Prints the Service chain commands from `start` on into
    /// `chains_text` in their place; returns the bytes printed.
    fn print_chains(&mut self, family: IpFamily, start: usize) -> usize {
        let before = self.chains_text.len();
        let printed = &self.chains[start..];
        let rules = printed.iter().filter(|command| command.is_rule()).count();
        self.chains_printed.0 += printed.len();
        self.chains_printed.1 += rules;
        for command in printed {
            let _ = writeln!(self.chains_text, "{}", command.line(family));
        }
        self.chains.truncate(start);
        self.chains_text.len() - before
    }

    fn has_chains(&self) -> bool {
        !self.chains.is_empty() || !self.chains_text.is_empty()
    }
}

impl Kept {
    /// The record: in `services` (the delta's new records) or `old`.
    fn record<'r>(
        self,
        old: Option<&'r ServiceRecord>,
        services: &'r [(NamespacedName, Option<ServiceRecord>)],
    ) -> Option<&'r ServiceRecord> {
        match self {
            Self::New(index) => services.get(index).and_then(|(_, record)| record.as_ref()),
            Self::Old => old,
            Self::Gone => None,
        }
    }
}

/// A fingerprint of commands (a Service's chains, or the fixed part).
fn fingerprint(commands: &[Command]) -> u64 {
    use std::hash::Hasher;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    commands.hash(&mut hasher);
    hasher.finish()
}

/// The length of the text of `commands`, counted without writing it.
fn text_len(family: IpFamily, commands: &[Command]) -> usize {
    let mut counter = ByteCounter(0);
    for command in commands {
        let _ = writeln!(counter, "{}", command.line(family));
    }
    counter.0
}

/// Counts the bytes written to it.
struct ByteCounter(usize);

impl std::fmt::Write for ByteCounter {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0 += s.len();
        Ok(())
    }
}

/// The fewest bytes of text a command takes, to size a section.
const COMMAND_BYTES_MIN: usize = 40;

/// The ports of `service`: the map is sorted by service first.
fn ports_of<'m>(
    ports: &'m BTreeMap<ServicePortName, ServicePortState>,
    service: &NamespacedName,
) -> impl Iterator<Item = (&'m ServicePortName, &'m ServicePortState)> + 'm {
    let first = ServicePortName {
        service: service.clone(),
        port: Arc::from(""),
        protocol: Protocol::Tcp,
    };
    let service = service.clone();
    ports
        .range((Bound::Included(first), Bound::Unbounded))
        .take_while(move |(name, _)| name.service == service)
}

/// Element changes between what `old` left and `new` needs (a partial
/// render; a full one flushed the maps and adds every element).
fn diff_elements(
    old: Option<&ServiceRecord>,
    new: Option<&ServiceRecord>,
    out: &mut Sections,
    stats: &mut RenderStats,
) {
    let old_elements = old.map(ServiceRecord::all_elements).unwrap_or_default();
    let new_elements = new.map(ServiceRecord::all_elements).unwrap_or_default();
    for element in &new_elements {
        match find(&old_elements, element) {
            Some(kept) if kept == element => {}
            Some(_) => {
                write_delete(element, out);
                write_add(element, out);
                stats.elements_deleted += 1;
                stats.elements_added += 1;
            }
            None => {
                write_add(element, out);
                stats.elements_added += 1;
            }
        }
    }
    for element in &old_elements {
        if find(&new_elements, element).is_none() {
            write_delete(element, out);
            stats.elements_deleted += 1;
        }
    }
}

/// The chains and sets of `old` that `new` no longer uses: chains are
/// flushed (and deleted later), sets deleted.
fn flush_unused(
    old: Option<&ServiceRecord>,
    new: Option<&ServiceRecord>,
    out: &mut Sections,
    stats: &mut RenderStats,
    newly_stale: &mut Vec<Arc<str>>,
) {
    let Some(old) = old else { return };
    let empty = ServiceRecord::default();
    let new = new.unwrap_or(&empty);
    for chain in &old.chains {
        if new.chains.binary_search(chain).is_err() {
            // `add` first: someone may have deleted the table meanwhile.
            out.tail.push(Command::AddChain {
                name: Name::from(chain),
                kind: ChainKind::Regular,
            });
            out.tail.push(Command::FlushChain(Name::from(chain)));
            stats.chains_flushed += 1;
            newly_stale.push(Arc::clone(chain));
        }
    }
    for set in &old.affinity_sets {
        if new.affinity_sets.binary_search(set).is_err() {
            out.tail.push(Command::DeleteSet {
                name: Name::from(set),
                map: false,
            });
        }
    }
}

/// A full render without reset: Services in the record that no longer
/// exist lose their chains and sets (their elements went with the flushed
/// maps).
fn flush_vanished_services(
    input: &RenderInput<'_>,
    programmed: &Programmed,
    out: &mut Sections,
    stats: &mut RenderStats,
    delta: &mut StateDelta,
) {
    for (service, old) in &programmed.services {
        if ports_of(input.service_ports, service).next().is_none() {
            flush_unused(Some(old), None, out, stats, &mut delta.newly_stale);
        }
    }
}

/// Stale chains that a Service of this render uses again are no longer
/// stale: the render declared them afresh.
fn revive_stale_chains(programmed: &Programmed, delta: &mut StateDelta) {
    let in_use: BTreeSet<&Arc<str>> = delta
        .services
        .iter()
        .filter_map(|(_, record)| record.as_ref())
        .flat_map(|record| record.chains.iter())
        .collect();
    let revived: Vec<Arc<str>> = programmed
        .stale_chains
        .keys()
        .filter(|chain| in_use.contains(chain))
        .cloned()
        .collect();
    delta.no_longer_stale.extend(revived);
}

/// The transaction that deletes the stale chains flushed at least
/// [`STALE_CHAIN_DELAY`] before `now`, and those chains; `None` when no
/// chain is due.
///
/// It runs before the sync's own transaction (upstream's order): a chain in
/// the record's stale list was flushed and is referenced by nothing, and a
/// render that uses it again declares it afresh, so deleting it first is
/// safe. `add` before each `delete` makes the deletion succeed even if
/// someone else removed the chain; it fails when the kernel still counts
/// the chain as referenced, or the table is gone.
pub fn stale_chain_cleanup(
    family: IpFamily,
    now: Instant,
    programmed: &Programmed,
) -> Option<StaleChainCleanup> {
    let mut cleanup = StaleChainCleanup {
        transaction: Transaction::new(family),
        chains: Vec::new(),
    };
    for (chain, since) in &programmed.stale_chains {
        if now.saturating_duration_since(*since) >= STALE_CHAIN_DELAY {
            let commands = &mut cleanup.transaction.commands;
            commands.push(Command::AddChain {
                name: Name::from(chain),
                kind: ChainKind::Regular,
            });
            commands.push(Command::DeleteChain(Name::from(chain)));
            cleanup.chains.push(Arc::clone(chain));
        }
    }
    (!cleanup.chains.is_empty()).then_some(cleanup)
}

fn find<'e>(elements: &'e [Element], wanted: &Element) -> Option<&'e Element> {
    elements
        .binary_search_by(|e| (e.map, e.key()).cmp(&(wanted.map, wanted.key())))
        .ok()
        .map(|index| &elements[index])
}

/// About how many elements a full render hands on in one piece: 4,096
/// elements are a few hundred kB of commands.
const ELEMENTS_PER_PIECE: usize = 4096;

/// The most elements one command of the data layout's maps carries: its
/// netlink message nests them in one attribute, whose length is 16 bits
/// (an IPv6 slot element with its endpoint is under 100 bytes).
const ELEMENTS_PER_COMMAND: usize = 256;

fn write_add(element: &Element, out: &mut Sections) {
    // The data layout's slot elements, count-set elements and hairpin
    // pairs name no Service (a refusal of one cannot be blamed on one), so
    // the elements of a map share commands, across Services: a full sync
    // at 10,000 × 2 writes 40,000 of them, and a command each held 12 MB at
    // once (and as much again while the list of commands grew).
    let shared = element.comment.is_none()
        && (element.map == HAIRPIN_ENDPOINTS || is_slot_map_or_count_set(element.map));
    if shared {
        let open = out
            .shared_additions
            .iter()
            .find(|(map, _)| *map == element.map)
            .map(|(_, index)| *index);
        let command = open.and_then(|index| out.additions.get_mut(index));
        match (command, element.to_map_element()) {
            (Some(Command::AddMapElements { elements, .. }), Some(map_element))
                if elements.len() < ELEMENTS_PER_COMMAND =>
            {
                elements.push(map_element);
                return;
            }
            (Some(Command::AddElements { elements, .. }), None)
                if elements.len() < ELEMENTS_PER_COMMAND =>
            {
                elements.push(element.to_set_element());
                return;
            }
            _ => {}
        }
        let index = out.additions.len();
        match out
            .shared_additions
            .iter_mut()
            .find(|(map, _)| *map == element.map)
        {
            Some(open) => open.1 = index,
            None => out.shared_additions.push((element.map, index)),
        }
    }
    match element.to_map_element() {
        Some(map_element) => out.additions.push(Command::AddMapElements {
            map: Name::Fixed(element.map),
            elements: vec![map_element],
        }),
        None => out.additions.push(Command::AddElements {
            set: Name::Fixed(element.map),
            elements: vec![element.to_set_element()],
        }),
    }
}

fn write_delete(element: &Element, out: &mut Sections) {
    out.deletions.push(Command::DeleteElements {
        set: Name::Fixed(element.map),
        keys: vec![element.key()],
    });
}

/// About how much Service chain text a full render of `ports` writes in
/// `layout` (about 500 bytes a service port and 400 an endpoint, as the
/// golden texts show; the data layout has no endpoint chains).
fn estimated_chain_text(
    ports: &BTreeMap<ServicePortName, ServicePortState>,
    layout: Layout,
) -> usize {
    let per_endpoint = match layout {
        Layout::Chains => 400,
        Layout::Data => 0,
    };
    ports
        .values()
        .map(|state| 500 + per_endpoint * state.endpoints.all_reachable.len())
        .sum()
}

/// Counts of what a render handed on, and where: to the emitter, or
/// printed into `text`.
struct Emitted<'t> {
    family: IpFamily,
    layout: Layout,
    text: Option<&'t mut String>,
    lines: usize,
    rules: usize,
    transactions: usize,
    transactions_with_changes: usize,
    /// Commands of the transaction being written that certainly change
    /// the table.
    current_changes: usize,
}

impl Emitted<'_> {
    fn count(&mut self, lines: usize, rules: usize, changes: usize) {
        self.lines += lines;
        self.rules += rules;
        self.current_changes += changes;
    }

    /// Hands `commands` on (nothing when empty), counting them.
    fn emit<E>(
        &mut self,
        emit: &mut impl FnMut(Piece) -> Result<(), E>,
        commands: Vec<Command>,
    ) -> Result<(), E> {
        if commands.is_empty() {
            return Ok(());
        }
        let rules = commands.iter().filter(|command| command.is_rule()).count();
        let changes = commands
            .iter()
            .filter(|command| command.certainly_changes())
            .count();
        self.count(commands.len(), rules, changes);
        match self.text.as_deref_mut() {
            Some(text) => {
                for command in &commands {
                    let _ = writeln!(text, "{}", command.line(self.family));
                }
                Ok(())
            }
            None => emit(Piece::Commands(commands)),
        }
    }

    /// Hands the Service chains of `out` on, printed or not.
    fn chains<E>(
        &mut self,
        emit: &mut impl FnMut(Piece) -> Result<(), E>,
        out: &mut Sections,
    ) -> Result<(), E> {
        if let Some(text) = self.text.as_deref_mut() {
            text.push_str(&out.chains_text);
            out.chains_text.clear();
            // Service chains: their rules are what changes the table.
            let (lines, rules) = std::mem::take(&mut out.chains_printed);
            self.count(lines, rules, rules);
        }
        self.emit(emit, std::mem::take(&mut out.chains))
    }

    /// Ends the current transaction.
    fn commit<E>(&mut self, emit: &mut impl FnMut(Piece) -> Result<(), E>) -> Result<(), E> {
        self.transactions += 1;
        self.transactions_with_changes += usize::from(self.current_changes > 0);
        self.current_changes = 0;
        emit(Piece::Commit)
    }

    /// A transaction of a split render ahead of the last: what Service
    /// chains need, and the chains of complete Services.
    fn chain_transaction<E>(
        &mut self,
        emit: &mut impl FnMut(Piece) -> Result<(), E>,
        out: &mut Sections,
    ) -> Result<(), E> {
        self.emit(emit, head::prelude(self.layout))?;
        self.chains(emit, out)?;
        self.commit(emit)
    }
}

/// The chain a Service chain command declares, flushes or appends to.
pub(crate) fn chain_of(command: &Command) -> Option<&str> {
    match command {
        Command::AddChain { name, .. } | Command::FlushChain(name) => Some(name.as_str()),
        Command::AddRule(rule) => Some(rule.chain.as_str()),
        _ => None,
    }
}

/// Drops from `chains[start..]` the commands of the chains whose commands
/// `old` recorded already (same fingerprint): the kernel holds them.
fn keep_changed_chains(
    chains: &mut Vec<Command>,
    start: usize,
    old: &ServiceRecord,
    new: &ServiceRecord,
) {
    let unchanged = |chain: &str| {
        let hash = |record: &ServiceRecord| {
            record
                .data()
                .chain_hashes
                .binary_search_by(|(name, _)| (**name).cmp(chain))
                .ok()
                .map(|index| record.data().chain_hashes[index].1)
        };
        let new_hash = hash(new);
        new_hash.is_some() && new_hash == hash(old)
    };
    let mut index = start;
    chains.retain(|command| {
        index += 1;
        index <= start || chain_of(command).is_none_or(|chain| !unchanged(chain))
    });
}

/// A `hairpin-endpoints` pair.
fn hairpin_pair(ip: IpAddr) -> Element {
    Element::set(HAIRPIN_ENDPOINTS, Key::AddrPair(ip, ip))
}

/// The addresses whose `hairpin-endpoints` pair a full render of the data
/// layout adds (the set was flushed): every one a Service needs.
fn hairpin_of_all(
    programmed: &Programmed,
    services: &[&NamespacedName],
    kept: &[Kept],
    delta: &StateDelta,
) -> BTreeSet<IpAddr> {
    let mut all = BTreeSet::new();
    for (&service, kept) in services.iter().zip(kept) {
        let old = programmed.services.get(service);
        if let Some(record) = kept.record(old, &delta.services) {
            all.extend(record.data().hairpin.iter().copied());
        }
    }
    all
}

/// The data layout's `hairpin-endpoints` pairs of a partial render: the
/// pairs the first Service needs now, and the deletion of those the last
/// Service stopped needing (`programmed.hairpin` counts the Services). A
/// full render adds [`hairpin_of_all`] with the other elements.
fn write_hairpin(
    programmed: &Programmed,
    delta: &StateDelta,
    out: &mut Sections,
    stats: &mut RenderStats,
) {
    let mut change: BTreeMap<IpAddr, isize> = BTreeMap::new();
    for (service, record) in &delta.services {
        if let Some(old) = programmed.services.get(service) {
            for ip in &old.data().hairpin {
                *change.entry(*ip).or_default() -= 1;
            }
        }
        for ip in record.iter().flat_map(|record| &record.data().hairpin) {
            *change.entry(*ip).or_default() += 1;
        }
    }
    for (ip, change) in change {
        let before = programmed.hairpin.get(&ip).copied().unwrap_or(0);
        let after = before.saturating_add_signed(change);
        if before == 0 && after > 0 {
            write_add(&hairpin_pair(ip), out);
            stats.elements_added += 1;
        } else if before > 0 && after == 0 {
            write_delete(&hairpin_pair(ip), out);
            stats.elements_deleted += 1;
        }
    }
}

/// The data layout's class rules after a partial render's changes: when
/// the changed Services need a class the table does not hold (an endpoint
/// count no entry of that pool and protocol had, nor one more or one
/// fewer), it and its neighbours ([`head::with_neighbours`]) are added:
/// their count and group sets declared and their group chains written
/// anew, with the classes they held, in order, and a class chain too when
/// it gains a group (with the fixed part, ahead of the elements that fill
/// the sets); `delta` records them. Classes no Service needs any more stay
/// until the next full render (deleting them would be one more change,
/// and the count may come back). Given the classes a full render would
/// hold now (`wanted`), the table ends holding exactly those: the missing
/// ones are added as above, and those no Service needs go, their group
/// chains (and class chain, when a group goes) written anew without them,
/// a group chain left without a class deleted, and their count and group
/// sets deleted last.
fn write_class_change(
    family: IpFamily,
    programmed: &Programmed,
    wanted: Option<BTreeSet<Class>>,
    delta: &mut StateDelta,
    out: &mut Sections,
) {
    let missing: BTreeSet<Class> = delta
        .services
        .iter()
        .flat_map(|(_, record)| record.iter().flat_map(|record| &record.data().classes))
        .filter(|class| !programmed.classes.contains(class))
        .copied()
        .collect();
    let mut new: BTreeSet<Class> = if missing.is_empty() {
        BTreeSet::new()
    } else {
        head::with_neighbours(&missing)
            .difference(&programmed.classes)
            .copied()
            .collect()
    };
    if let Some(wanted) = &wanted {
        new.extend(wanted.difference(&programmed.classes));
    }
    let dropped: BTreeSet<Class> = match &wanted {
        Some(wanted) => programmed
            .classes
            .difference(wanted)
            .filter(|class| !new.contains(class))
            .copied()
            .collect(),
        None => BTreeSet::new(),
    };
    if new.is_empty() && dropped.is_empty() {
        return;
    }
    head::count_sets(family, &new, false, &mut out.head);
    let held: BTreeSet<Class> = programmed
        .classes
        .union(&new)
        .filter(|class| !dropped.contains(class))
        .copied()
        .collect();
    let changed: BTreeSet<Class> = new.union(&dropped).copied().collect();
    // Only the group chains whose classes change are written anew; a
    // group left without a class goes with the count sets below.
    let held_groups = head::group_chains_of(&held);
    for (local, protocol, first) in head::group_chains_of(&changed) {
        if held_groups.contains(&(local, protocol, first)) {
            head::group_chain_rules(&held, local, protocol, first, &mut out.head);
        }
    }
    // A class chain only when a group comes or goes.
    let chains: BTreeSet<(bool, Protocol)> = changed
        .iter()
        .map(|class| (class.pool.local, class.protocol))
        .collect();
    for (local, protocol) in chains {
        let groups = head::groups_in_chain(&held, local, protocol);
        if groups != head::groups_in_chain(&programmed.classes, local, protocol) {
            head::class_chain_rules(&held, local, protocol, &mut out.head);
        }
    }
    if !dropped.is_empty() {
        // Last: the entries that leave them are deleted from them above.
        delete_unused_count_sets(programmed, &held, &mut out.tail);
    }
    delta.classes = new;
    delta.classes_dropped = dropped;
}

/// The count sets, group sets and group chains the table holds that the
/// classes held after a render (`held`) no longer use, deleted into `out`:
/// at the end of a full render's fixed part (after the class chains that
/// named them were flushed and written anew without them), or at the end
/// of a partial render's transaction (after the entries that left them).
/// A group chain is flushed before it is deleted, and before the count
/// sets its rules name.
fn delete_unused_count_sets(
    programmed: &Programmed,
    held: &BTreeSet<Class>,
    out: &mut Vec<Command>,
) {
    let in_use = head::group_chains_of(held);
    for (local, protocol, first) in head::group_chains_of(&programmed.classes).difference(&in_use) {
        let chain = Name::Fixed(crate::names::group_chain(*local, *protocol, *first));
        out.push(Command::FlushChain(chain.clone()));
        out.push(Command::DeleteChain(chain));
    }
    let counts_held = head::count_sets_of(held);
    let groups_held = head::group_sets_of(held);
    let counts = head::count_sets_of(&programmed.classes)
        .into_iter()
        .filter(|set| !counts_held.contains(set))
        .map(|(pool, count)| crate::names::count_set(pool, count));
    let groups = head::group_sets_of(&programmed.classes)
        .into_iter()
        .filter(|set| !groups_held.contains(set))
        .map(|(pool, first)| crate::names::group_set(pool, first));
    for set in counts.chain(groups) {
        out.push(Command::DeleteSet {
            name: Name::Fixed(set),
            map: false,
        });
    }
}
