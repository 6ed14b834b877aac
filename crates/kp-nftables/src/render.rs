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
//! chains are rewritten (add, flush, rules) and their elements are added or
//! deleted by comparing with what the last transaction left
//! ([`Programmed`]). Nothing needs to be listed from the kernel.
//!
//! Text order inside one transaction: fixed objects, Service sets and
//! chains (so elements can name them), element deletions, element
//! additions, then stale chains (flushed now, deleted at least
//! [`STALE_CHAIN_DELAY`] later: with kernels before 6.2, a chain whose last
//! map element was just deleted still counts as referenced for a moment,
//! which upstream works around the same way).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::ops::Bound;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kp_model::{IpFamily, NamespacedName, NodeInfo, Protocol, ServicePortName};
use kp_sync::ServicePortState;

use crate::names::NameCache;
use crate::options::{family_keyword, NftDetector, NftablesOptions};
use crate::state::{Element, Programmed, ServiceRecord, StateDelta};
use crate::NftablesError;

mod head;
mod service;

/// How long a flushed chain waits before it is deleted.
pub const STALE_CHAIN_DELAY: Duration = Duration::from_secs(1);

/// Everything one render looks at, for one IP family.
#[derive(Debug, Clone, Copy)]
pub struct RenderInput<'a> {
    /// The family.
    pub family: IpFamily,
    /// Rewrite everything, not only the changed Services.
    pub full: bool,
    /// Delete the table first (only with `full`): the first sync of a
    /// process, or after a full sync failed.
    pub reset: bool,
    /// Every service port of this family, with its endpoints.
    pub service_ports: &'a BTreeMap<ServicePortName, ServicePortState>,
    /// Services that changed since the last successful transaction (used by
    /// a partial render).
    pub changed_services: &'a BTreeSet<NamespacedName>,
    /// This node.
    pub node: &'a NodeInfo,
    /// `nodePortAddresses` resolved to this host's addresses: `None` accepts
    /// NodePorts on every local address (`fib daddr type local`).
    pub node_port_addresses: Option<&'a [IpAddr]>,
    /// The time of the sync; stale chains older than
    /// [`STALE_CHAIN_DELAY`] are deleted.
    pub now: Instant,
}

/// Counts of one render, for logs and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenderStats {
    /// Service ports whose chains and elements were written.
    pub service_ports_written: usize,
    /// Lines (commands) of the transaction.
    pub commands: usize,
    /// Elements added.
    pub elements_added: usize,
    /// Elements deleted.
    pub elements_deleted: usize,
    /// Chains flushed because they became stale.
    pub chains_flushed: usize,
    /// Stale chains deleted.
    pub chains_deleted: usize,
    /// Service ports with `internalTrafficPolicy: Local` and no local endpoint.
    pub no_local_endpoints_internal: usize,
    /// Service ports with `externalTrafficPolicy: Local` and no local endpoint.
    pub no_local_endpoints_external: usize,
}

/// The result of a render.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// The family rendered.
    pub family: IpFamily,
    /// Whether everything was written.
    pub full: bool,
    /// `nft -f` input: one transaction.
    pub text: String,
    /// What the transaction changes in [`Programmed`], once it succeeded.
    pub delta: StateDelta,
    /// Counts.
    pub stats: RenderStats,
}

/// Renders transactions, keeping name hashes across syncs. One per family.
#[derive(Debug)]
pub struct Renderer {
    options: NftablesOptions,
    names: NameCache,
    capacity_hint: usize,
}

/// What every service port's rendering needs to know.
#[derive(Debug)]
pub(crate) struct Context {
    /// `ip` or `ip6`.
    pub ipx: &'static str,
    /// `ip kube-proxy` or `ip6 kube-proxy`.
    pub table: String,
    pub masquerade_all: bool,
    pub detector: Option<NftDetector>,
    /// The node's first address of the family (a source range holding it
    /// also admits the load balancer IPs, for VIP-like load balancers).
    pub node_ip: Option<IpAddr>,
}

/// The text of a transaction, by section.
#[derive(Debug, Default)]
pub(crate) struct Sections {
    pub head: String,
    pub chains: String,
    pub deletions: String,
    pub additions: String,
    pub tail: String,
}

impl Renderer {
    /// A renderer with `options`, after checking them.
    pub fn new(options: NftablesOptions) -> Result<Self, NftablesError> {
        options.validate()?;
        Ok(Self {
            options,
            names: NameCache::new(),
            capacity_hint: 0,
        })
    }

    /// The options this renderer was built with.
    pub fn options(&self) -> &NftablesOptions {
        &self.options
    }

    /// Renders `input` against what the table holds (`programmed`). Pure
    /// apart from the name cache: the same input gives the same text.
    pub fn render(&mut self, input: &RenderInput<'_>, programmed: &Programmed) -> Rendered {
        let full = input.full || input.reset;
        let ctx = Context {
            ipx: family_keyword(input.family),
            table: format!("{} {}", family_keyword(input.family), crate::names::TABLE),
            masquerade_all: self.options.masquerade_all,
            detector: self
                .options
                .resolve_detector(input.family, &input.node.pod_cidrs),
            node_ip: input.node.addresses_of(input.family).next(),
        };
        let mut out = Sections::default();
        if full {
            let estimate = input.service_ports.len() * 900;
            out.chains.reserve(self.capacity_hint.max(estimate));
            out.additions.reserve(input.service_ports.len() * 160);
            head::write_head(&ctx, &self.options, input, &mut out.head);
        }
        let mut stats = RenderStats::default();
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
        for service in services {
            let record = self.render_service(&ctx, input, service, &mut out, &mut stats);
            let old = if input.reset {
                None
            } else {
                programmed.services.get(service)
            };
            diff_service(
                &ctx,
                full,
                old,
                record.as_ref(),
                &mut out,
                &mut stats,
                &mut delta,
            );
            if record.is_some() || old.is_some() {
                delta.services.push((service.clone(), record));
            }
        }
        if full && !input.reset {
            flush_vanished_services(&ctx, input, programmed, &mut out, &mut stats, &mut delta);
        }
        if !input.reset {
            delete_stale_chains(
                &ctx, input.now, programmed, &mut out, &mut stats, &mut delta,
            );
        }
        if full {
            self.names
                .retain(|port| input.service_ports.contains_key(port));
        }
        let text = join(out);
        self.capacity_hint = self.capacity_hint.max(text.len());
        stats.commands = text.lines().count();
        Rendered {
            family: input.family,
            full,
            text,
            delta,
            stats,
        }
    }

    /// Renders every port of `service` (none: the Service is gone).
    fn render_service(
        &mut self,
        ctx: &Context,
        input: &RenderInput<'_>,
        service: &NamespacedName,
        out: &mut Sections,
        stats: &mut RenderStats,
    ) -> Option<ServiceRecord> {
        let mut record = ServiceRecord::default();
        let mut any = false;
        for (name, state) in ports_of(input.service_ports, service) {
            any = true;
            stats.service_ports_written += 1;
            service::render_port(ctx, &mut self.names, name, state, &mut record, out, stats);
        }
        if !any {
            return None;
        }
        record.normalize();
        Some(record)
    }
}

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

/// Element changes between what `old` left and `new` needs, and the chains
/// and sets of `old` that `new` no longer uses. A full render flushed the
/// maps, so it adds every element of `new`.
fn diff_service(
    ctx: &Context,
    full: bool,
    old: Option<&ServiceRecord>,
    new: Option<&ServiceRecord>,
    out: &mut Sections,
    stats: &mut RenderStats,
    delta: &mut StateDelta,
) {
    let empty = ServiceRecord::default();
    let new = new.unwrap_or(&empty);
    let old_elements: &[Element] = match old {
        Some(old) if !full => &old.elements,
        _ => &[],
    };
    for element in &new.elements {
        match find(old_elements, element) {
            Some(kept) if kept == element => {}
            Some(_) => {
                write_delete(ctx, element, out);
                write_add(ctx, element, out);
                stats.elements_deleted += 1;
                stats.elements_added += 1;
            }
            None => {
                write_add(ctx, element, out);
                stats.elements_added += 1;
            }
        }
    }
    for element in old_elements {
        if find(&new.elements, element).is_none() {
            write_delete(ctx, element, out);
            stats.elements_deleted += 1;
        }
    }
    let Some(old) = old else { return };
    for chain in &old.chains {
        if new.chains.binary_search(chain).is_err() {
            // `add` first: someone may have deleted the table meanwhile.
            let _ = writeln!(out.tail, "add chain {} {chain}", ctx.table);
            let _ = writeln!(out.tail, "flush chain {} {chain}", ctx.table);
            stats.chains_flushed += 1;
            delta.newly_stale.push(Arc::clone(chain));
        }
    }
    for set in &old.affinity_sets {
        if new.affinity_sets.binary_search(set).is_err() {
            let _ = writeln!(out.tail, "delete set {} {set}", ctx.table);
        }
    }
}

/// A full render without reset: Services in the record that no longer
/// exist lose their chains and sets (their elements went with the flushed
/// maps).
fn flush_vanished_services(
    ctx: &Context,
    input: &RenderInput<'_>,
    programmed: &Programmed,
    out: &mut Sections,
    stats: &mut RenderStats,
    delta: &mut StateDelta,
) {
    for (service, old) in &programmed.services {
        if ports_of(input.service_ports, service).next().is_none() {
            diff_service(ctx, true, Some(old), None, out, stats, delta);
        }
    }
}

/// Deletes the stale chains flushed at least [`STALE_CHAIN_DELAY`] ago,
/// unless a Service uses them again. `add` first makes the deletion succeed
/// even if someone else removed the chain.
fn delete_stale_chains(
    ctx: &Context,
    now: Instant,
    programmed: &Programmed,
    out: &mut Sections,
    stats: &mut RenderStats,
    delta: &mut StateDelta,
) {
    let in_use: BTreeSet<&Arc<str>> = delta
        .services
        .iter()
        .filter_map(|(_, record)| record.as_ref())
        .flat_map(|record| record.chains.iter())
        .collect();
    for (chain, since) in &programmed.stale_chains {
        if in_use.contains(chain) {
            delta.no_longer_stale.push(Arc::clone(chain));
        } else if now.saturating_duration_since(*since) >= STALE_CHAIN_DELAY
            && !delta.newly_stale.contains(chain)
        {
            let _ = writeln!(out.tail, "add chain {} {chain}", ctx.table);
            let _ = writeln!(out.tail, "delete chain {} {chain}", ctx.table);
            stats.chains_deleted += 1;
            delta.no_longer_stale.push(Arc::clone(chain));
        }
    }
}

fn find<'e>(elements: &'e [Element], wanted: &Element) -> Option<&'e Element> {
    elements
        .binary_search_by(|e| (e.map, e.key.as_str()).cmp(&(wanted.map, wanted.key.as_str())))
        .ok()
        .map(|index| &elements[index])
}

fn write_add(ctx: &Context, element: &Element, out: &mut Sections) {
    let _ = writeln!(
        out.additions,
        "add element {} {} {element}",
        ctx.table, element.map
    );
}

fn write_delete(ctx: &Context, element: &Element, out: &mut Sections) {
    let _ = writeln!(
        out.deletions,
        "delete element {} {} {{ {} }}",
        ctx.table, element.map, element.key
    );
}

/// The sections in transaction order; the chains, the largest, become the
/// text, so the biggest part is not copied.
fn join(mut out: Sections) -> String {
    let mut text = std::mem::take(&mut out.chains);
    text.insert_str(0, &out.head);
    text.reserve(out.deletions.len() + out.additions.len() + out.tail.len());
    text.push_str(&out.deletions);
    text.push_str(&out.additions);
    text.push_str(&out.tail);
    text
}
