//! The renderer: service ports and endpoints in, iptables-restore text out.
//!
//! The text has the layout upstream `syncProxyRules` writes: `*filter`, its
//! chain declarations, its rules, `COMMIT`, then the same for `*nat`. It is
//! meant for `iptables-restore --noflush --counters`: a `:CHAIN` line
//! creates or flushes one of our chains and nothing else is touched.
//!
//! Full and partial renders: the top-level chains (KUBE-SERVICES,
//! KUBE-NODEPORTS, KUBE-EXTERNAL-SERVICES, …) are rewritten every time. A
//! service port's own chains (KUBE-SVC/SVL/EXT/FW/SEP) are written only in a
//! full render or when its Service is in `changed_services`; otherwise they
//! are left out of the text entirely, so the kernel keeps them as they are
//! (a `:CHAIN` line would flush them). This is upstream's partial sync.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io;
use std::net::{IpAddr, SocketAddr};

use kp_model::{IpFamily, NamespacedName, NodeInfo, ServicePortName};
use kp_sync::ServicePortState;

use crate::applier::RestoreSink;
use crate::jumps::{JumpRule, Table};
use crate::names::{
    is_service_chain_name, ChainName, ChainNameCache, KUBE_EXTERNAL_SERVICES, KUBE_FIREWALL,
    KUBE_FORWARD, KUBE_MARK_MASQ, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_PROXY_FIREWALL,
    KUBE_SERVICES,
};
use crate::options::{IptablesOptions, ResolvedDetector};
use crate::IptablesError;

/// Appends one line to an [`Out`], or only counts it when the buffer is
/// discarding (a service port whose chains a partial render leaves alone).
macro_rules! emit {
    ($out:expr, $($arg:tt)*) => {{
        let out: &mut $crate::render::Out = $out;
        if out.muted {
            // A streamed render's other pass writes this part.
        } else if out.discard {
            out.skipped += 1;
        } else {
            out.written += 1;
            // Writing into a String cannot fail.
            let _ = writeln!(out.text, $($arg)*);
        }
    }};
}

mod service;

/// Above this many endpoints in total (every endpoint of every service port,
/// usable or not, as upstream counts them), per-endpoint rules carry no
/// comment (upstream `largeClusterEndpointsThreshold`): it shrinks the
/// ruleset by a third, and the backend looks for stale chains only on full
/// syncs.
pub const LARGE_CLUSTER_ENDPOINTS_THRESHOLD: usize = 1000;

/// nfacct counter of localhost NodePort packets.
pub const NFACCT_LOCALHOST_NODE_PORTS: &str = "localhost_nps_accepted_pkts";
/// nfacct counter of INVALID packets dropped in KUBE-FORWARD.
pub const NFACCT_INVALID_DROPPED: &str = "ct_state_invalid_dropped_pkts";

/// Everything one render looks at, for one IP family.
#[derive(Debug, Clone, Copy)]
pub struct RenderInput<'a> {
    /// The family; ip6tables takes the same text format.
    pub family: IpFamily,
    /// Rewrite every service port's chains, not only the changed ones.
    pub full: bool,
    /// Every service port of this family, with its endpoints.
    pub service_ports: &'a BTreeMap<ServicePortName, ServicePortState>,
    /// Services whose service ports or endpoints changed since the last
    /// successful apply (ignored by a full render).
    pub changed_services: &'a BTreeSet<NamespacedName>,
    /// This node.
    pub node: &'a NodeInfo,
    /// `nodePortAddresses` resolved to this host's addresses: `None` accepts
    /// NodePorts on every local address (`-m addrtype --dst-type LOCAL`).
    pub node_port_addresses: Option<&'a [IpAddr]>,
    /// What the nat table holds before this sync; the per-service chains
    /// among it that the render no longer uses are deleted.
    pub existing_nat_chains: NatChains<'a>,
    /// Jump rules from built-in chains into ours to insert (`-I`) at the
    /// end of their table's section: a full sync passes those its listing
    /// did not show, so they land in the same transaction as the chains
    /// they jump to. (One `iptables -I` per rule would read and rewrite the
    /// whole table each time with iptables-legacy: 0.5 s per nat rule at
    /// 10,000 Services.)
    pub jumps: &'a [JumpRule],
}

/// What the proxy knows of the nat table's chains before a sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatChains<'a> {
    /// Nothing: no chain is deleted.
    Unknown,
    /// Every per-service chain the table holds, listed from the kernel
    /// (`iptables-save -t nat`): a full sync's view, which also finds
    /// chains this process never wrote (left by an earlier one, or by
    /// upstream kube-proxy).
    Listed(&'a ListedChains),
    /// The per-service chains the last successful sync left, sorted: a
    /// partial sync's view, kept by the backend instead of listing the
    /// table, so chains made stale by a change go in the same sync.
    Recorded(&'a [ChainName]),
}

/// The per-service chains (`KUBE-SVC-`, `KUBE-SEP-`, …) of a nat table
/// listing, as a full sync keeps them through its render and restore: the
/// names of our shape as 17-byte [`ChainName`]s rather than strings (some
/// 40,000 at 10,000 Services: 0.7 MB instead of 2.5), and the few with a
/// per-service prefix but another shape as they are (no render uses them,
/// so they are always stale).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListedChains {
    /// The chains of our shape, in listing order.
    pub chains: Vec<ChainName>,
    /// Names with a per-service prefix that are not of our shape.
    pub misshapen: Vec<String>,
}

impl ListedChains {
    /// Keeps the per-service chains among the `names` of a listing; other
    /// chains, ours or not, are never stale.
    pub fn from_listing(names: Vec<String>) -> Self {
        let mut listed = ListedChains::default();
        for name in names {
            if !is_service_chain_name(&name) {
                continue;
            }
            match ChainName::parse(&name) {
                Some(chain) => listed.chains.push(chain),
                None => listed.misshapen.push(name),
            }
        }
        listed.chains.shrink_to_fit();
        listed
    }

    /// The listed chains `active` (sorted) does not hold, by name.
    fn stale(&self, active: &[ChainName]) -> Vec<String> {
        let unused = self
            .chains
            .iter()
            .filter(|c| active.binary_search(c).is_err());
        let mut stale: Vec<String> = unused.map(ChainName::to_string).collect();
        stale.extend(self.misshapen.iter().cloned());
        stale
    }
}

/// Whether `service_ports` hold more than
/// [`LARGE_CLUSTER_ENDPOINTS_THRESHOLD`] endpoints in total.
pub fn is_large_cluster(service_ports: &BTreeMap<ServicePortName, ServicePortState>) -> bool {
    endpoint_counts(service_ports).0 > LARGE_CLUSTER_ENDPOINTS_THRESHOLD
}

/// Line counts of one render, for the `sync_proxy_rules_iptables_total`
/// metrics and logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenderStats {
    /// Chains declared in `*filter`.
    pub filter_chains: usize,
    /// Rules in `*filter`.
    pub filter_rules: usize,
    /// Chains declared in `*nat` (written in this render).
    pub nat_chains: usize,
    /// Chains the nat table holds after applying, including the chains of
    /// unchanged service ports a partial render left out.
    pub nat_chains_total: usize,
    /// Rules written in `*nat`, `-X` lines excluded.
    pub nat_rules: usize,
    /// Rules the nat table holds after applying, including the chains of
    /// unchanged service ports a partial render left out.
    pub nat_rules_total: usize,
    /// Stale chains deleted with `-X`.
    pub deleted_chains: usize,
}

/// The result of a render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// The family rendered.
    pub family: IpFamily,
    /// Whether every service port's chains were written.
    pub full: bool,
    /// Input for `iptables-restore --noflush --counters` (`ip6tables-restore`
    /// for IPv6): `*filter … COMMIT` then `*nat … COMMIT`.
    pub restore: String,
    /// Line counts.
    pub stats: RenderStats,
    /// Every per-service chain the nat table should hold after applying
    /// (also those a partial render left untouched), sorted.
    pub active_nat_chains: Vec<ChainName>,
    /// Stale chains this render deletes.
    pub deleted_chains: Vec<String>,
    /// More than [`LARGE_CLUSTER_ENDPOINTS_THRESHOLD`] endpoints: comments
    /// were left out.
    pub large_cluster_mode: bool,
}

/// Renders rulesets, keeping chain-name hashes and probability strings
/// across syncs. One per IP family.
#[derive(Debug)]
pub struct Renderer {
    options: IptablesOptions,
    names: ChainNameCache,
    probabilities: Vec<String>,
    /// The size of the last partial render's text, and of the last full
    /// one's: a text is about the size of the last one of its kind, and a
    /// partial text at scale is a fraction of a full one.
    capacity_hints: [usize; 2],
}

/// One of the four parts of the text: lines plus their counts.
#[derive(Debug, Default)]
pub(crate) struct Out {
    pub text: String,
    pub written: usize,
    pub skipped: usize,
    /// Lines of an unchanged service port in a partial render: only counted.
    pub discard: bool,
    /// Neither written nor counted: this pass of a streamed render leaves
    /// the part to the other pass.
    pub muted: bool,
}

/// The four parts of the text, in the order they are joined.
#[derive(Debug, Default)]
pub(crate) struct Buffers {
    pub filter_chains: Out,
    pub filter_rules: Out,
    pub nat_chains: Out,
    pub nat_rules: Out,
}

/// What every service port's rendering needs to know.
#[derive(Debug)]
pub(crate) struct Context<'a> {
    pub family: IpFamily,
    pub masquerade_all: bool,
    pub detector: Option<ResolvedDetector>,
    pub localhost_node_ports: bool,
    pub nfacct_localhost_node_ports: bool,
    pub large_cluster_mode: bool,
    pub probabilities: &'a [String],
}

impl Renderer {
    /// A renderer with `options`, after checking them.
    pub fn new(options: IptablesOptions) -> Result<Self, IptablesError> {
        options.validate()?;
        Ok(Renderer {
            options,
            names: ChainNameCache::new(),
            probabilities: vec!["<bad value>".to_owned()],
            capacity_hints: [0; 2],
        })
    }

    /// The options this renderer was built with.
    pub fn options(&self) -> &IptablesOptions {
        &self.options
    }

    /// Renders `input`. Pure apart from the caches: the same input gives the
    /// same text, byte for byte.
    pub fn render(&mut self, input: &RenderInput<'_>) -> Rendered {
        self.names.begin();
        let (total_endpoints, max_endpoints) = endpoint_counts(input.service_ports);
        self.precompute_probabilities(max_endpoints);
        let ctx = context(&self.options, &self.probabilities, input, total_endpoints);
        // The first render of each kind guesses from the input (about 450
        // bytes per service port and 200 per endpoint, plus a quarter so
        // that the head fits in front of the nat rules when `join` puts it
        // there); later ones go by the last text of the same kind. Growing
        // a multi-megabyte string would copy it and leave the old block
        // behind in the heap: with the bare estimate, `join` reallocated
        // the 8.5 MB of nat rules at 10,000 Services, and the heap peak was
        // 4.3 MB higher (heaptrack); a periodic full sync that started from
        // the last partial sync's size grew its text by doubling.
        let kind = usize::from(input.full);
        let hint = match self.capacity_hints[kind] {
            0 => input.service_ports.len() * 560 + total_endpoints * 250,
            last => last,
        };
        let mut buffers = Buffers::with_capacity(hint);
        let mut stats = RenderStats::default();
        let (active, deleted) = render_lines(
            &ctx,
            &mut self.names,
            input,
            &mut buffers,
            &self.options,
            total_endpoints,
        );
        self.names.prune();
        buffers.count_into(&mut stats, deleted.len());
        let restore = buffers.join();
        self.capacity_hints[kind] = restore.len() + restore.len() / 8;
        log_render(input, total_endpoints, &stats);
        Rendered {
            family: input.family,
            full: input.full,
            restore,
            stats,
            active_nat_chains: active,
            deleted_chains: deleted,
            large_cluster_mode: ctx.large_cluster_mode,
        }
    }

    /// Renders `input` into `sink` as it goes instead of into
    /// [`Rendered::restore`] (left empty): the same text, byte for byte, as
    /// [`Self::render`], without ever holding the nat rules whole (8.5 MB
    /// at 10,000 Services, the largest thing a full sync held).
    ///
    /// The text must declare every chain before a rule jumps to it, and the
    /// filter table comes first (a kill between the two tables' commits
    /// then leaves new filter rules, which only refuse, beside the old nat
    /// rules). So the service ports are walked twice: the first pass keeps
    /// the filter table, the nat chain declarations, the active chains and
    /// the counts (some 2 MB at 10,000 Services) and sends them; the second
    /// writes only the nat rules, handing them to `sink` every
    /// [`STREAM_CHUNK_BYTES`]. The second pass costs about as much as a
    /// partial render; the restore program reads while it runs.
    ///
    /// Fails only when `sink` does, and then sends no `COMMIT` for the nat
    /// table.
    pub fn render_streamed(
        &mut self,
        input: &RenderInput<'_>,
        sink: &mut dyn RestoreSink,
    ) -> io::Result<Rendered> {
        self.names.begin();
        let (total_endpoints, max_endpoints) = endpoint_counts(input.service_ports);
        self.precompute_probabilities(max_endpoints);
        let mark = self.options.masquerade_mark.to_string();
        let ctx = context(&self.options, &self.probabilities, input, total_endpoints);

        // First pass: everything but the nat rules.
        let mut head = Buffers::for_head(input.service_ports.len(), total_endpoints);
        let mut stats = RenderStats::default();
        let (active, deleted) = render_lines(
            &ctx,
            &mut self.names,
            input,
            &mut head,
            &self.options,
            total_endpoints,
        );
        sink.write_lines("*filter\n")?;
        sink.write_lines(&head.filter_chains.text)?;
        sink.write_lines(&head.filter_rules.text)?;
        sink.write_lines("COMMIT\n*nat\n")?;
        sink.write_lines(&head.nat_chains.text)?;
        for out in [
            &mut head.filter_chains,
            &mut head.filter_rules,
            &mut head.nat_chains,
        ] {
            out.text = String::new();
        }

        // Second pass: the nat rules, in the same order as `render`'s.
        let mut rules = Buffers::for_nat_rules(STREAM_CHUNK_BYTES + STREAM_CHUNK_BYTES / 4);
        write_head(&ctx, &mut rules, &mark, self.options.random_fully);
        let mut scratch_active = Vec::new();
        render_service_ports::<io::Error>(&mut self.names, input, &mut rules, |buffers, view| {
            service::render_service(&ctx, buffers, view, &mut scratch_active);
            scratch_active.clear();
            let text = &mut buffers.nat_rules.text;
            if text.len() >= STREAM_CHUNK_BYTES {
                sink.write_lines(text)?;
                text.clear();
            }
            Ok(())
        })?;
        self.names.prune();
        write_chain_deletions(&mut rules, &deleted);
        write_tail(&ctx, &mut rules, input, &mark, &self.options);
        rules.nat_rules.text.push_str("COMMIT\n");
        sink.write_lines(&rules.nat_rules.text)?;

        head.nat_rules = std::mem::take(&mut rules.nat_rules);
        head.count_into(&mut stats, deleted.len());
        log_render(input, total_endpoints, &stats);
        Ok(Rendered {
            family: input.family,
            full: input.full,
            restore: String::new(),
            stats,
            active_nat_chains: active,
            deleted_chains: deleted,
            large_cluster_mode: ctx.large_cluster_mode,
        })
    }

    /// Probabilities `1/n` formatted as upstream does (`%0.10f`), for every
    /// n up to `max`.
    fn precompute_probabilities(&mut self, max: usize) {
        for n in self.probabilities.len()..=max {
            self.probabilities.push(format!("{:.10}", 1.0 / n as f64));
        }
    }
}

/// The existing per-service chains (`KUBE-SVC-`, `KUBE-SVL-`, `KUBE-EXT-`,
/// `KUBE-FW-`, `KUBE-SEP-`) that `rendered` no longer uses, in listing
/// order (names of another shape than ours last). Other chains, ours or
/// not, are never stale.
pub fn stale_chains(existing: &[String], rendered: &Rendered) -> Vec<String> {
    ListedChains::from_listing(existing.to_vec()).stale(&rendered.active_nat_chains)
}

impl Buffers {
    fn with_capacity(total: usize) -> Self {
        let mut buffers = Buffers::default();
        buffers.filter_chains.text.reserve(256);
        buffers.filter_rules.text.reserve(4096 + total / 32);
        buffers.nat_chains.text.reserve(total / 5);
        buffers.nat_rules.text.reserve(total);
        buffers
    }

    /// The first pass of a streamed render: the nat rules are muted.
    fn for_head(service_ports: usize, endpoints: usize) -> Self {
        let mut buffers = Buffers::default();
        buffers.filter_chains.text.reserve(256);
        buffers.filter_rules.text.reserve(4096 + service_ports * 16);
        buffers
            .nat_chains
            .text
            .reserve(service_ports * 60 + endpoints * 30);
        buffers.nat_rules.muted = true;
        buffers
    }

    /// The second pass of a streamed render: only the nat rules are
    /// written, into a buffer of `capacity` bytes that is sent and cleared
    /// whenever it passes [`STREAM_CHUNK_BYTES`].
    fn for_nat_rules(capacity: usize) -> Self {
        let mut buffers = Buffers::default();
        buffers.filter_chains.muted = true;
        buffers.filter_rules.muted = true;
        buffers.nat_chains.muted = true;
        buffers.nat_rules.text.reserve(capacity);
        buffers
    }

    /// Fills the line counts of `stats`; `-X` lines are not rules.
    fn count_into(&self, stats: &mut RenderStats, deleted_chains: usize) {
        stats.filter_chains = self.filter_chains.written;
        stats.filter_rules = self.filter_rules.written;
        stats.nat_chains = self.nat_chains.written;
        stats.nat_chains_total = self.nat_chains.written + self.nat_chains.skipped - deleted_chains;
        stats.nat_rules = self.nat_rules.written - deleted_chains;
        stats.nat_rules_total = stats.nat_rules + self.nat_rules.skipped;
        stats.deleted_chains = deleted_chains;
    }

    /// The restore text. The nat rules, the largest part by far, become
    /// the text: the rest is put in front of them in place rather than
    /// everything being copied into a new string, which at 10,000 Services
    /// would briefly hold the whole ruleset twice. Each part is inserted
    /// and freed on its own (a few moves of the text, milliseconds), so no
    /// copy of the head (1.6 MB) is made either.
    fn join(&mut self) -> String {
        let head_len = "*filter\n".len()
            + self.filter_chains.text.len()
            + self.filter_rules.text.len()
            + "COMMIT\n*nat\n".len()
            + self.nat_chains.text.len();
        let mut text = std::mem::take(&mut self.nat_rules.text);
        text.reserve_exact(head_len + "COMMIT\n".len());
        // Last part of the head first: each goes in front of the previous.
        text.insert_str(0, &std::mem::take(&mut self.nat_chains.text));
        text.insert_str(0, "COMMIT\n*nat\n");
        text.insert_str(0, &std::mem::take(&mut self.filter_rules.text));
        text.insert_str(0, &std::mem::take(&mut self.filter_chains.text));
        text.insert_str(0, "*filter\n");
        text.push_str("COMMIT\n");
        text
    }
}

/// How many bytes of nat rules a streamed render gathers before it hands
/// them on: large enough that each write to the restore program's pipe
/// moves a lot, small enough to be nothing beside the rest of the state.
pub const STREAM_CHUNK_BYTES: usize = 64 * 1024;

/// Calls `each` for every service port of `input` in order, with its names
/// looked up (and computed on first use) in `names`.
fn render_service_ports<E>(
    names: &mut ChainNameCache,
    input: &RenderInput<'_>,
    buffers: &mut Buffers,
    mut each: impl FnMut(&mut Buffers, &service::ServiceView<'_>) -> Result<(), E>,
) -> Result<(), E> {
    let mut name_text = String::new();
    for (name, state) in input.service_ports {
        let endpoints = state.endpoints.all_reachable.iter();
        let addresses = endpoints.map(|ep| SocketAddr::new(ep.ip, ep.port));
        let Some(cached) = names.touch(name, addresses) else {
            continue; // unreachable: touch inserts what it does not find
        };
        name_text.clear();
        // Names reach the restore input only through this text.
        kp_model::rule_text::write_service_port_comment(&mut name_text, name);
        let view = service::ServiceView {
            state,
            name: &name_text,
            names: cached,
            protocol: name.protocol.as_rule_str(),
            rewrite: input.full || input.changed_services.contains(&name.service),
        };
        each(buffers, &view)?;
    }
    Ok(())
}

/// Every line of a render, into those of `buffers` that are not muted:
/// the head, each service port, the deletions of stale chains and the
/// tail. Returns the active chains (sorted) and the stale chains deleted.
fn render_lines(
    ctx: &Context<'_>,
    names: &mut ChainNameCache,
    input: &RenderInput<'_>,
    buffers: &mut Buffers,
    options: &IptablesOptions,
    total_endpoints: usize,
) -> (Vec<ChainName>, Vec<String>) {
    let mark = options.masquerade_mark.to_string();
    write_head(ctx, buffers, &mark, options.random_fully);
    let mut active = Vec::with_capacity(input.service_ports.len() * 2 + total_endpoints);
    let walked: Result<(), std::convert::Infallible> =
        render_service_ports(names, input, buffers, |buffers, view| {
            service::render_service(ctx, buffers, view, &mut active);
            Ok(())
        });
    let Ok(()) = walked;
    active.sort_unstable();
    active.dedup();
    let deleted = delete_stale_chains(buffers, input.existing_nat_chains, &active);
    write_tail(ctx, buffers, input, &mark, options);
    (active, deleted)
}

/// What every service port's rendering needs to know about this render.
fn context<'a>(
    options: &IptablesOptions,
    probabilities: &'a [String],
    input: &RenderInput<'_>,
    total_endpoints: usize,
) -> Context<'a> {
    Context {
        family: input.family,
        masquerade_all: options.masquerade_all,
        detector: options.resolve_detector(input.family, &input.node.pod_cidrs),
        localhost_node_ports: localhost_node_ports(
            options.localhost_node_ports,
            input.family,
            input.node_port_addresses,
        ),
        nfacct_localhost_node_ports: options.nfacct_localhost_node_ports,
        large_cluster_mode: total_endpoints > LARGE_CLUSTER_ENDPOINTS_THRESHOLD,
        probabilities,
    }
}

fn log_render(input: &RenderInput<'_>, total_endpoints: usize, stats: &RenderStats) {
    tracing::debug!(
        family = ?input.family,
        full = input.full,
        service_ports = input.service_ports.len(),
        endpoints = total_endpoints,
        filter_rules = stats.filter_rules,
        nat_rules = stats.nat_rules,
        nat_chains = stats.nat_chains,
        deleted_chains = stats.deleted_chains,
        "rendered iptables rules"
    );
}

fn endpoint_counts(service_ports: &BTreeMap<ServicePortName, ServicePortState>) -> (usize, usize) {
    service_ports.values().fold((0, 0), |(total, max), state| {
        let endpoints = &state.endpoints;
        let most = endpoints.cluster.len().max(endpoints.local.len());
        (total + state.all_endpoints.len(), max.max(most))
    })
}

/// Whether NodePorts answer on 127.0.0.0/8: `iptables.localhostNodePorts`
/// is on (`enabled`), the family is IPv4, and the node port addresses
/// (`None`: every address) include IPv4 loopback (upstream turns the
/// option off otherwise).
pub(crate) fn localhost_node_ports(
    enabled: bool,
    family: IpFamily,
    node_port_addresses: Option<&[IpAddr]>,
) -> bool {
    enabled
        && family == IpFamily::V4
        && node_port_addresses
            .is_none_or(|addresses| addresses.iter().any(|ip| ip.is_ipv4() && ip.is_loopback()))
}

/// Top-level chain declarations and the rules that do not depend on
/// Services: KUBE-POSTROUTING, KUBE-MARK-MASQ and kubelet's KUBE-FIREWALL.
fn write_head(ctx: &Context<'_>, buffers: &mut Buffers, mark: &str, random_fully: bool) {
    let filter_chains = [
        KUBE_SERVICES,
        KUBE_EXTERNAL_SERVICES,
        KUBE_FORWARD,
        KUBE_NODEPORTS,
        KUBE_PROXY_FIREWALL,
    ];
    for chain in filter_chains {
        emit!(&mut buffers.filter_chains, ":{chain} - [0:0]");
    }
    for chain in [
        KUBE_SERVICES,
        KUBE_NODEPORTS,
        KUBE_POSTROUTING,
        KUBE_MARK_MASQ,
    ] {
        emit!(&mut buffers.nat_chains, ":{chain} - [0:0]");
    }
    let nat = &mut buffers.nat_rules;
    emit!(
        nat,
        "-A {KUBE_POSTROUTING} -m mark ! --mark {mark}/{mark} -j RETURN"
    );
    // Clearing the mark keeps a packet that goes through the stack again
    // from being masqueraded twice.
    emit!(nat, "-A {KUBE_POSTROUTING} -j MARK --xor-mark {mark}");
    let random = if random_fully { " --random-fully" } else { "" };
    emit!(
        nat,
        "-A {KUBE_POSTROUTING} -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE{random}"
    );
    emit!(nat, "-A {KUBE_MARK_MASQ} -j MARK --or-mark {mark}");
    if ctx.localhost_node_ports {
        // route_localnet, which localhost NodePorts need, lets remote hosts
        // reach 127.0.0.0/8 services (CVE-2020-8558); kubelet writes the
        // same rule.
        emit!(&mut buffers.filter_chains, ":{KUBE_FIREWALL} - [0:0]");
        emit!(
            &mut buffers.filter_rules,
            "-A {KUBE_FIREWALL} -m comment --comment \"block incoming localnet connections\" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"
        );
    }
}

/// Flushes and deletes the stale per-service chains among `existing`.
fn delete_stale_chains(
    buffers: &mut Buffers,
    existing: NatChains<'_>,
    active: &[ChainName],
) -> Vec<String> {
    let mut stale = match existing {
        NatChains::Unknown => return Vec::new(),
        NatChains::Listed(listed) => listed.stale(active),
        NatChains::Recorded(recorded) => recorded
            .iter()
            .filter(|chain| active.binary_search(chain).is_err())
            .map(ChainName::to_string)
            .collect(),
    };
    stale.sort_unstable();
    stale.dedup();
    for chain in &stale {
        emit!(&mut buffers.nat_chains, ":{chain} - [0:0]");
    }
    write_chain_deletions(buffers, &stale);
    stale
}

/// The `-X` lines of the stale chains, after every rule that could jump to
/// them was flushed or rewritten.
fn write_chain_deletions(buffers: &mut Buffers, stale: &[String]) {
    for chain in stale {
        emit!(&mut buffers.nat_rules, "-X {chain}");
    }
}

/// The NodePort catch-all that must end KUBE-SERVICES, and KUBE-FORWARD.
fn write_tail(
    ctx: &Context<'_>,
    buffers: &mut Buffers,
    input: &RenderInput<'_>,
    mark: &str,
    options: &IptablesOptions,
) {
    let comment = "-m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\"";
    let nat = &mut buffers.nat_rules;
    match input.node_port_addresses {
        None => {
            // Localhost NodePorts never work for IPv6, and for IPv4 only
            // with route_localnet.
            let loopback = match ctx.family {
                IpFamily::V6 => " ! -d ::1/128",
                IpFamily::V4 if !ctx.localhost_node_ports => " ! -d 127.0.0.0/8",
                IpFamily::V4 => "",
            };
            emit!(
                nat,
                "-A {KUBE_SERVICES} {comment} -m addrtype --dst-type LOCAL{loopback} -j {KUBE_NODEPORTS}"
            );
        }
        Some(addresses) => {
            let usable = addresses.iter().filter(|ip| {
                (ip.is_ipv4() == (ctx.family == IpFamily::V4))
                    && (!ip.is_loopback() || ctx.localhost_node_ports)
            });
            for ip in usable {
                emit!(
                    nat,
                    "-A {KUBE_SERVICES} {comment} -d {ip} -j {KUBE_NODEPORTS}"
                );
            }
        }
    }
    for rule in input.jumps {
        let out = match rule.table {
            Table::Filter => &mut buffers.filter_rules,
            Table::Nat => &mut buffers.nat_rules,
            // No jump rule lives in mangle.
            Table::Mangle => continue,
        };
        // Not counted: these are rules of built-in chains, not ours.
        if !out.muted {
            out.text.push_str(&rule.insert_line());
            out.text.push('\n');
        }
    }
    let filter = &mut buffers.filter_rules;
    if !options.conntrack_tcp_be_liberal {
        // Without be_liberal, an out-of-window packet marked INVALID would
        // reach the pod un-NATed and reset the connection (upstream 74839).
        let nfacct = if options.nfacct_invalid_dropped {
            format!(" -m nfacct --nfacct-name {NFACCT_INVALID_DROPPED}")
        } else {
            String::new()
        };
        emit!(
            filter,
            "-A {KUBE_FORWARD} -m conntrack --ctstate INVALID{nfacct} -j DROP"
        );
    }
    emit!(
        filter,
        "-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {mark}/{mark} -j ACCEPT"
    );
    emit!(
        filter,
        "-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
    );
}
