//! The elements and chains of one service port, following upstream's
//! nftables `syncProxyRules`, with the traffic decisions of
//! [`kp_model::TrafficPlan`] (shared with every other mode).
//!
//! The data layout ([`Layout::Data`]) writes the same elements and the same
//! `service-`, `local-`, `external-` and `firewall-` chains, but no
//! `endpoint-` chains: the `service-` (cluster endpoints) and `local-`
//! (local endpoints) chains each end in a goto to their class chain, where
//! one rule per endpoint count draws a slot of the packet's entry; the
//! port writes its entries' slots and count-set elements, and each
//! reachable endpoint's hairpin pair is recorded for `hairpin-endpoints`.

use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::Arc;

use kp_model::{Endpoint, Protocol, Refusal, ServicePortName, TrafficPlan};
use kp_sync::ServicePortState;

use super::{Context, Sections};
use crate::model::{AddrField, Address, Command, Expr, Key, KeyType, Name, Rule, SetSpec, Verdict};
use crate::names::{
    class_chain, count_set, group_chain, group_of_count, group_set, slot_map, Pool,
};
use crate::names::{
    endpoint_names, service_chains, EndpointNames, ServiceChains, CLUSTER_IPS, FIREWALL_IPS,
    MARK_FOR_MASQUERADE, NO_ENDPOINT_NODEPORTS, NO_ENDPOINT_SERVICES, REJECT_CHAIN, SERVICE_IPS,
    SERVICE_NODEPORTS,
};
use crate::options::Layout;
use crate::state::{Class, Draw, Element, Entry, ServiceRecord};

/// One service port while it is rendered.
struct Port<'a> {
    state: &'a ServicePortState,
    plan: TrafficPlan,
    chains: Arc<ServiceChains>,
    /// Names of every reachable endpoint, in the order of
    /// `endpoints.all_reachable`.
    endpoints: Vec<(&'a Arc<Endpoint>, Arc<EndpointNames>)>,
    /// `ns/svc:port`, safe for a comment.
    comment: Arc<str>,
    /// The port's protocol.
    protocol: Protocol,
}

/// Collects the rules of a service port's chains: every chain is declared
/// (and flushed) before any rule, since rules name other chains.
#[derive(Default)]
struct ChainWriter {
    declarations: Vec<Command>,
    rules: Vec<Command>,
}

/// Adds the elements, chains and sets of service port `name` to `record`,
/// and writes its chains and sets into `out.chains`.
///
/// Names are hashed afresh on every render rather than kept between syncs:
/// a cache of every service port's and endpoint's names held about 10 MB at
/// 10,000 Service ports, while hashing them all takes a few milliseconds of
/// a full sync.
pub(super) fn render_port(
    ctx: &Context,
    name: &ServicePortName,
    state: &ServicePortState,
    old: Option<&ServiceRecord>,
    record: &mut ServiceRecord,
    out: &mut Sections,
) {
    let plan = state.plan;
    let data = ctx.layout == Layout::Data && draws_from_maps(state);
    let endpoints = if data {
        // No endpoint chains, so no endpoint names.
        Vec::new()
    } else {
        state
            .endpoints
            .all_reachable
            .iter()
            .map(|ep| {
                let names = endpoint_names(name, SocketAddr::new(ep.ip, ep.port));
                (ep, Arc::new(names))
            })
            .collect()
    };
    let port = Port {
        state,
        plan,
        chains: Arc::new(service_chains(name)),
        endpoints,
        comment: Arc::from(kp_model::rule_text::comment_safe(&name.to_string())),
        protocol: name.protocol,
    };
    write_elements(&port, &mut record.elements);
    let mut writer = ChainWriter::default();
    write_affinity_sets(ctx, &port, record, &mut writer);
    write_internal_masquerade(ctx, &port, &mut writer, record);
    write_external_chain(ctx, &port, &mut writer, record);
    write_firewall_chain(&port, &mut writer, record);
    let endpoints = &state.endpoints;
    if data {
        let lists = [
            (
                plan.uses_cluster_endpoints,
                false,
                &port.chains.cluster,
                &endpoints.cluster,
            ),
            (
                plan.uses_local_endpoints,
                true,
                &port.chains.local,
                &endpoints.local,
            ),
        ];
        for (used, local, chain, list) in lists {
            if used {
                let draw = DrawList {
                    local,
                    endpoints: list,
                };
                write_draw_chain(name, &port, chain, &draw, old, &mut writer, record);
            }
        }
        record.data_mut().classes.extend(classes_of(name, state));
        record
            .data_mut()
            .hairpin
            .extend(endpoints.all_reachable.iter().map(|ep| ep.ip));
        write_chain_hashes(&writer, record);
    } else {
        if plan.uses_cluster_endpoints {
            let chain = Arc::clone(&port.chains.cluster);
            write_policy_chain(&port, &chain, &endpoints.cluster, &mut writer, record);
        }
        if plan.uses_local_endpoints {
            let chain = Arc::clone(&port.chains.local);
            write_policy_chain(&port, &chain, &endpoints.local, &mut writer, record);
        }
        write_endpoint_chains(&port, &mut writer, record);
    }
    record.rules += writer.rules.len();
    out.chains.append(&mut writer.declarations);
    out.chains.append(&mut writer.rules);
}

impl ChainWriter {
    /// Declares and flushes `chain` unless done already.
    fn declare(&mut self, chain: &Arc<str>, record: &mut ServiceRecord) {
        if record.chains.contains(chain) {
            return;
        }
        record.chains.push(Arc::clone(chain));
        self.declarations.push(Command::AddChain {
            name: Name::from(chain),
            kind: crate::model::ChainKind::Regular,
        });
        self.declarations
            .push(Command::FlushChain(Name::from(chain)));
    }

    fn rule(&mut self, chain: &Arc<str>, exprs: Vec<Expr>) {
        self.rules.push(Command::AddRule(Rule::new(chain, exprs)));
    }

    fn commented_rule(&mut self, chain: &Arc<str>, exprs: Vec<Expr>, comment: &'static str) {
        self.rules.push(Command::AddRule(
            Rule::new(chain, exprs).with_comment(comment),
        ));
    }
}

fn jump_to_masquerade() -> Expr {
    Expr::Verdict(Verdict::Jump(Name::Fixed(MARK_FOR_MASQUERADE)))
}

fn goto(chain: &Arc<str>) -> Expr {
    Expr::Verdict(Verdict::Goto(Name::from(chain)))
}

/// The verdict for traffic without an endpoint: `goto reject-chain` when
/// the Service has none at all, `drop` when the Local policy allows none on
/// this node.
fn refusal_verdict(refusal: Refusal) -> Verdict {
    match refusal {
        Refusal::NoEndpoints => Verdict::Goto(Name::Fixed(REJECT_CHAIN)),
        Refusal::NoLocalEndpoints => Verdict::Drop,
    }
}

fn write_elements(port: &Port<'_>, elements: &mut Vec<Element>) {
    let (plan, sp, p) = (&port.plan, &port.state.port, port.protocol);
    let comment = Some(Arc::clone(&port.comment));
    let refusal = refusal_verdict(plan.refusal());
    let ip_key = |ip: &std::net::IpAddr| Key::AddrProtoPort(*ip, p, sp.port);
    let goto = |chain: &Arc<str>| Verdict::Goto(Name::from(chain));
    elements.push(Element::set(CLUSTER_IPS, Key::Addr(sp.cluster_ip)));
    if plan.has_internal_endpoints {
        let internal = internal_chain(port);
        elements.push(Element::map(
            SERVICE_IPS,
            ip_key(&sp.cluster_ip),
            goto(internal),
            None,
        ));
    } else {
        let key = ip_key(&sp.cluster_ip);
        elements.push(Element::map(
            NO_ENDPOINT_SERVICES,
            key,
            refusal.clone(),
            comment.clone(),
        ));
    }
    let external = &port.chains.external;
    for ip in sp.external_ips.iter().chain(&sp.load_balancer_ips) {
        if plan.has_endpoints {
            elements.push(Element::map(SERVICE_IPS, ip_key(ip), goto(external), None));
        }
        if !plan.has_external_endpoints {
            let value = refusal.clone();
            elements.push(Element::map(
                NO_ENDPOINT_SERVICES,
                ip_key(ip),
                value,
                comment.clone(),
            ));
        }
    }
    if plan.uses_source_ranges_filter {
        for ip in &sp.load_balancer_ips {
            let value = goto(&port.chains.firewall);
            elements.push(Element::map(FIREWALL_IPS, ip_key(ip), value, None));
        }
    }
    if let Some(node_port) = sp.node_port {
        let key = Key::ProtoPort(p, node_port);
        if plan.has_endpoints {
            // NodePorts are not subject to loadBalancerSourceRanges, for
            // better or worse, and that cannot change now.
            elements.push(Element::map(SERVICE_NODEPORTS, key, goto(external), None));
        }
        if !plan.has_external_endpoints {
            elements.push(Element::map(NO_ENDPOINT_NODEPORTS, key, refusal, comment));
        }
    }
}

fn internal_chain<'p>(port: &'p Port<'_>) -> &'p Arc<str> {
    if port.plan.internal_policy_local {
        &port.chains.local
    } else {
        &port.chains.cluster
    }
}

/// One affinity set per reachable endpoint with ClientIP affinity: the
/// client addresses that last went to that endpoint, forgotten after the
/// timeout. `dynamic` is given because some kernels add it to a set that
/// rules update, and re-adding the set without it would then fail.
fn write_affinity_sets(
    ctx: &Context,
    port: &Port<'_>,
    record: &mut ServiceRecord,
    writer: &mut ChainWriter,
) {
    let Some(timeout) = port.state.port.session_affinity_timeout else {
        return;
    };
    let key: &'static [KeyType] = match ctx.family {
        kp_model::IpFamily::V4 => crate::model::IPV4,
        kp_model::IpFamily::V6 => crate::model::IPV6,
    };
    for (_, names) in &port.endpoints {
        let set = &names.affinity_set;
        if record.affinity_sets.contains(set) {
            continue;
        }
        record.affinity_sets.push(Arc::clone(set));
        writer.declarations.push(Command::AddSet(SetSpec {
            name: Name::from(set),
            map: false,
            key,
            verdicts: false,
            dynamic_timeout_secs: Some(timeout.as_secs()),
            comment: None,
        }));
    }
}

/// Masquerades ClusterIP traffic from outside the cluster (or everything,
/// with masqueradeAll): it may have been routed here by a static route for
/// the Service range and could bounce off-node.
fn write_internal_masquerade(
    ctx: &Context,
    port: &Port<'_>,
    writer: &mut ChainWriter,
    record: &mut ServiceRecord,
) {
    if !port.plan.has_internal_endpoints {
        return;
    }
    let sp = &port.state.port;
    let chain = internal_chain(port);
    let condition = if ctx.masquerade_all {
        None
    } else if let Some(detector) = &ctx.detector {
        Some(detector.if_not_local.clone())
    } else {
        return;
    };
    writer.declare(chain, record);
    let mut exprs = vec![
        Expr::AddrIs {
            field: AddrField::Destination,
            negate: false,
            value: Address::Host(sp.cluster_ip),
        },
        Expr::DestinationPort {
            protocol: port.protocol,
            port: sp.port,
        },
    ];
    exprs.extend(condition);
    exprs.push(jump_to_masquerade());
    writer.rule(chain, exprs);
}

fn write_external_chain(
    ctx: &Context,
    port: &Port<'_>,
    writer: &mut ChainWriter,
    record: &mut ServiceRecord,
) {
    let plan = &port.plan;
    if !plan.uses_external_path {
        return;
    }
    let (ext, svc) = (&port.chains.external, &port.chains.cluster);
    writer.declare(ext, record);
    let local_source = || Expr::FibLocal(AddrField::Source);
    if !plan.external_policy_local {
        // Cluster endpoints may be on another node: masquerade so replies
        // come back through this one.
        writer.rule(ext, vec![jump_to_masquerade()]);
    } else if plan.uses_cluster_endpoints {
        // (Without cluster endpoints there is no chain to short-circuit to.)
        if let Some(detector) = &ctx.detector {
            // Pods reaching an external address bypass both policies, as
            // if they had gone out to the load balancer and come back.
            writer.commented_rule(
                ext,
                vec![detector.if_local.clone(), goto(svc)],
                crate::names::COMMENT_SHORT_CIRCUIT_PODS,
            );
        }
        // The host itself picks the external address as source, so its
        // traffic must be masqueraded and may use any endpoint.
        writer.commented_rule(
            ext,
            vec![local_source(), jump_to_masquerade()],
            crate::names::COMMENT_MASQUERADE_LOCAL,
        );
        writer.commented_rule(
            ext,
            vec![local_source(), goto(svc)],
            crate::names::COMMENT_SHORT_CIRCUIT_LOCAL,
        );
    } else {
        writer.commented_rule(
            ext,
            vec![local_source(), jump_to_masquerade()],
            crate::names::COMMENT_MASQUERADE_LOCAL,
        );
    }
    if plan.has_external_endpoints {
        let policy = if plan.external_policy_local {
            &port.chains.local
        } else {
            svc
        };
        writer.rule(ext, vec![goto(policy)]);
    }
}

fn write_firewall_chain(port: &Port<'_>, writer: &mut ChainWriter, record: &mut ServiceRecord) {
    if !port.plan.uses_source_ranges_filter {
        return;
    }
    let sp = &port.state.port;
    let fw = &port.chains.firewall;
    writer.declare(fw, record);
    let mut sources: Vec<Address> = sp
        .load_balancer_source_ranges
        .iter()
        .map(|range| Address::Prefix(range.trunc()))
        .collect();
    if port.plan.source_ranges_admit_node {
        sources.extend(sp.load_balancer_ips.iter().copied().map(Address::Host));
    }
    writer.rule(
        fw,
        vec![
            Expr::AddrNotIn {
                field: AddrField::Source,
                values: sources,
            },
            Expr::Verdict(Verdict::Drop),
        ],
    );
}

/// `service-…` or `local-…`: affinity lookups, then a random choice of an
/// endpoint chain with `numgen`.
fn write_policy_chain(
    port: &Port<'_>,
    chain: &Arc<str>,
    endpoints: &[Arc<Endpoint>],
    writer: &mut ChainWriter,
    record: &mut ServiceRecord,
) {
    writer.declare(chain, record);
    let chosen: Vec<&EndpointNames> = endpoints
        .iter()
        .filter_map(|ep| {
            port.endpoints
                .iter()
                .find(|(known, _)| known.ip == ep.ip && known.port == ep.port)
                .map(|(_, names)| &**names)
        })
        .collect();
    if port.state.port.session_affinity_timeout.is_some() {
        for names in &chosen {
            writer.rule(
                chain,
                vec![
                    Expr::AddrInSet {
                        field: AddrField::Source,
                        set: Name::from(&names.affinity_set),
                    },
                    goto(&names.chain),
                ],
            );
        }
    }
    // Endpoint i of n is taken with probability 1/(n-i) among those left,
    // which spreads connections evenly, as iptables' statistic rules do.
    // Upstream writes one `numgen random mod n vmap { … }` instead, whose
    // anonymous map is a set of its own: the kernel finds sets by walking
    // the table's list of them, so with one per Service port every
    // message of a transaction cost time in proportion to the table
    // (the first sync at 10,000 Service ports took 20 s, see BENCHMARKS).
    let count = chosen.len();
    for (i, names) in chosen.iter().enumerate() {
        if i + 1 < count {
            let modulus = u32::try_from(count - i).unwrap_or(u32::MAX);
            writer.rule(
                chain,
                vec![Expr::NumgenIs { modulus, value: 0 }, goto(&names.chain)],
            );
        } else {
            writer.rule(chain, vec![goto(&names.chain)]);
        }
    }
}

/// One chain per reachable endpoint: masquerade hairpin traffic (a pod
/// reaching itself through the Service), record affinity, DNAT.
fn write_endpoint_chains(port: &Port<'_>, writer: &mut ChainWriter, record: &mut ServiceRecord) {
    let affinity = port.state.port.session_affinity_timeout.is_some();
    for (endpoint, names) in &port.endpoints {
        let chain = &names.chain;
        writer.declare(chain, record);
        writer.rule(
            chain,
            vec![
                Expr::AddrIs {
                    field: AddrField::Source,
                    negate: false,
                    value: Address::Host(endpoint.ip),
                },
                jump_to_masquerade(),
            ],
        );
        if affinity {
            writer.rule(
                chain,
                vec![Expr::UpdateSourceSet(Name::from(&names.affinity_set))],
            );
        }
        writer.rule(
            chain,
            vec![
                Expr::L4Proto(port.protocol),
                Expr::Dnat(SocketAddr::new(endpoint.ip, endpoint.port)),
            ],
        );
    }
}

/// One endpoint list of a service port, drawn from by one chain.
struct DrawList<'a> {
    /// The local list (eTP/iTP Local), not the cluster one.
    local: bool,
    endpoints: &'a [Arc<Endpoint>],
}

/// Which of a service port's entries reach its cluster or local chain, so
/// draw from that list.
#[derive(Debug, Clone, Copy)]
struct Reach {
    /// The ClusterIP.
    cluster_ip: bool,
    /// The external and load balancer IPs, and the NodePort.
    external: bool,
}

/// The entries that reach the chain of the `local` or cluster list
/// (`write_elements` and `write_external_chain` send them there): the
/// ClusterIP reaches the chain of its internal policy; the external
/// entries reach the local chain under `externalTrafficPolicy: Local`, and
/// the cluster chain under the Cluster policy or by a short-circuit.
fn reach(plan: &TrafficPlan, local: bool) -> Reach {
    let cluster_ip = plan.has_internal_endpoints && plan.internal_policy_local == local;
    let external = plan.uses_external_path
        && if local {
            plan.external_policy_local && plan.uses_local_endpoints
        } else {
            plan.uses_cluster_endpoints
        };
    Reach {
        cluster_ip,
        external,
    }
}

/// Whether the data layout draws service port `state`'s endpoints from its
/// maps. Not a port with ClientIP affinity: affinity as upstream has it
/// (per service port, through every entry) needs a chain per endpoint to
/// record the client in, so such a port is written as the chains layout
/// writes it, and needs no class.
fn draws_from_maps(state: &ServicePortState) -> bool {
    state.port.session_affinity_timeout.is_none()
}

/// The draw rules the data layout's class chains need for service port
/// `name`: per endpoint list in use with endpoints, one for its address
/// entries and one for its NodePort, if they reach it.
pub(super) fn classes_of(name: &ServicePortName, state: &ServicePortState) -> Vec<Class> {
    if !draws_from_maps(state) {
        return Vec::new();
    }
    let plan = &state.plan;
    let sp = &state.port;
    let lists = [
        (
            false,
            plan.uses_cluster_endpoints,
            state.endpoints.cluster.len(),
        ),
        (true, plan.uses_local_endpoints, state.endpoints.local.len()),
    ];
    let mut classes = Vec::new();
    for (local, used, count) in lists {
        let Some(count) = u32::try_from(count).ok().filter(|count| used && *count > 0) else {
            continue;
        };
        let reach = reach(plan, local);
        let external_addresses = !(sp.external_ips.is_empty() && sp.load_balancer_ips.is_empty());
        let addresses = reach.cluster_ip || (reach.external && external_addresses);
        let node_port = reach.external && sp.node_port.is_some();
        for (wanted, node_port) in [(addresses, false), (node_port, true)] {
            if wanted {
                classes.push(Class {
                    pool: Pool { local, node_port },
                    protocol: name.protocol,
                    count,
                });
            }
        }
    }
    classes
}

/// The data layout's `service-…` or `local-…` chain: the ClusterIP
/// masquerade rule (written before, by `write_internal_masquerade`), the
/// goto to the class chain that draws a slot of
/// the packet's entry; and the slots and count-set elements of every entry
/// that reaches the chain, into `record`.
///
/// The slots come from `old` (what the last transaction left): the port's
/// endpoints keep their slots ([`assign_slots`]), so an endpoint replaced
/// changes slot elements only, and a count change moves each entry from
/// one count set to another besides: no rule changes in either case.
fn write_draw_chain(
    name: &ServicePortName,
    port: &Port<'_>,
    chain: &Arc<str>,
    list: &DrawList<'_>,
    old: Option<&ServiceRecord>,
    writer: &mut ChainWriter,
    record: &mut ServiceRecord,
) {
    writer.declare(chain, record);
    let old_draw = old.and_then(|old| {
        old.data().draws.iter().find(|draw| {
            draw.local == list.local && draw.protocol == port.protocol && draw.port == name.port
        })
    });
    let wanted: Vec<SocketAddr> = list
        .endpoints
        .iter()
        .map(|ep| SocketAddr::new(ep.ip, ep.port))
        .collect();
    let slots = assign_slots(old_draw.map_or(&[], |draw| &draw.endpoints), &wanted);
    let sp = &port.state.port;
    let protocol = port.protocol;
    let mut entries = Vec::new();
    if !slots.is_empty() {
        let reach = reach(&port.plan, list.local);
        let mut addresses: Vec<std::net::IpAddr> = Vec::new();
        if reach.cluster_ip {
            addresses.push(sp.cluster_ip);
        }
        if reach.external {
            addresses.extend(sp.external_ips.iter().chain(&sp.load_balancer_ips));
        }
        // Each entry: its address (or NodePort) and port; its count-set
        // and slot elements are derived from the draw.
        entries = addresses
            .iter()
            .map(|ip| Entry::Addr(*ip, sp.port))
            .chain(sp.node_port.filter(|_| reach.external).map(Entry::NodePort))
            .collect();
        let class_chain = class_chain(list.local, protocol);
        writer.rule(
            chain,
            vec![Expr::Verdict(Verdict::Goto(Name::Fixed(class_chain)))],
        );
    }
    record.data_mut().draws.push(Draw {
        port: Arc::clone(&name.port),
        protocol,
        local: list.local,
        endpoints: slots,
        entries,
    });
}

/// The rule of the group of counts that starts at `first` in the class
/// chain of `pool`'s list and `protocol`: `ip daddr . meta l4proto . th
/// dport @endpoint-group-9-16 goto endpoints-by-count-tcp-9-16` (for a
/// NodePort, without the address). A new connection walks these, then the
/// class rules of its own group, rather than every class rule before its
/// own.
pub(super) fn group_rule(pool: Pool, protocol: Protocol, first: u32) -> Rule {
    Rule::new(
        class_chain(pool.local, protocol),
        vec![
            Expr::EntryInSet {
                with_addr: !pool.node_port,
                set: Name::Fixed(group_set(pool, first)),
            },
            Expr::Verdict(Verdict::Goto(Name::Fixed(group_chain(
                pool.local, protocol, first,
            )))),
        ],
    )
}

/// The rule of `class` in its group chain: `ip daddr . meta l4proto . th
/// dport @endpoint-count-3 dnat ip to ip daddr . tcp dport . numgen random
/// mod 3 map @service-endpoints-tcp` (for a NodePort, without the
/// address). A count change moves an entry from one count set to another
/// (and between group sets when it leaves its group); a count no entry of
/// the pool had before is the only rule it may add.
pub(super) fn class_rule(class: Class) -> Rule {
    let with_addr = !class.pool.node_port;
    Rule::new(
        group_chain(
            class.pool.local,
            class.protocol,
            group_of_count(class.count),
        ),
        vec![
            Expr::EntryInSet {
                with_addr,
                set: Name::Fixed(count_set(class.pool, class.count)),
            },
            Expr::DnatDraw {
                protocol: class.protocol,
                with_addr,
                endpoints: class.count,
                map: Name::Fixed(slot_map(class.pool, class.protocol)),
            },
        ],
    )
}

/// The endpoint of each slot, given the slots `old` held and the endpoints
/// `wanted` now: an endpoint that stays keeps its slot; a new one takes the
/// slot of one that left, in order; a slot left empty is filled by the
/// endpoint of the last slot (the count drops); new endpoints left over
/// take the slots after the last (the count grows).
pub(crate) fn assign_slots(old: &[SocketAddr], wanted: &[SocketAddr]) -> Vec<SocketAddr> {
    let mut slots: Vec<Option<SocketAddr>> = old
        .iter()
        .map(|endpoint| wanted.contains(endpoint).then_some(*endpoint))
        .collect();
    let mut arriving = wanted.iter().filter(|endpoint| !old.contains(endpoint));
    for slot in slots.iter_mut().filter(|slot| slot.is_none()) {
        match arriving.next() {
            Some(endpoint) => *slot = Some(*endpoint),
            None => break,
        }
    }
    slots.extend(arriving.map(|endpoint| Some(*endpoint)));
    // Fill the holes from the end.
    let mut index = 0;
    while index < slots.len() {
        if slots[index].is_some() {
            index += 1;
            continue;
        }
        let last = slots.pop().flatten();
        if let Some(hole) = slots.get_mut(index) {
            // When `last` was a hole too, this slot is looked at again.
            *hole = last;
        }
    }
    slots.into_iter().flatten().collect()
}

/// Each chain's fingerprint (its declaration and rules), so a partial sync
/// rewrites only the chains that changed.
fn write_chain_hashes(writer: &ChainWriter, record: &mut ServiceRecord) {
    let mut chains: Vec<(Arc<str>, std::collections::hash_map::DefaultHasher)> = Vec::new();
    for command in writer.declarations.iter().chain(&writer.rules) {
        let Some(chain) = super::chain_of(command) else {
            continue;
        };
        let index = match chains.iter().position(|(name, _)| **name == *chain) {
            Some(index) => index,
            None => {
                // The record's own name when it has one: no second copy.
                let name = record
                    .chains
                    .iter()
                    .find(|known| ***known == *chain)
                    .map_or_else(|| Arc::from(chain), Arc::clone);
                chains.push((name, std::collections::hash_map::DefaultHasher::new()));
                chains.len() - 1
            }
        };
        command.hash(&mut chains[index].1);
    }
    record.data_mut().chain_hashes.extend(
        chains
            .into_iter()
            .map(|(name, hasher)| (name, hasher.finish())),
    );
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn eps(texts: &[&str]) -> Vec<SocketAddr> {
        texts
            .iter()
            .map(|text| format!("{text}:80").parse().unwrap())
            .collect()
    }

    #[test]
    fn a_new_port_fills_its_slots_in_order() {
        assert_eq!(
            assign_slots(&[], &eps(&["10.0.0.1", "10.0.0.2"])),
            eps(&["10.0.0.1", "10.0.0.2"])
        );
    }

    #[test]
    fn a_replaced_endpoint_takes_the_slot_of_the_one_that_left() {
        let old = eps(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
        let wanted = eps(&["10.0.0.9", "10.0.0.1", "10.0.0.3"]);
        assert_eq!(
            assign_slots(&old, &wanted),
            eps(&["10.0.0.1", "10.0.0.9", "10.0.0.3"])
        );
    }

    #[test]
    fn a_removed_endpoints_slot_goes_to_the_last_one() {
        let old = eps(&["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]);
        let wanted = eps(&["10.0.0.1", "10.0.0.3", "10.0.0.4"]);
        assert_eq!(
            assign_slots(&old, &wanted),
            eps(&["10.0.0.1", "10.0.0.4", "10.0.0.3"])
        );
        // Two holes, one of them last.
        let wanted = eps(&["10.0.0.1", "10.0.0.3"]);
        assert_eq!(assign_slots(&old, &wanted), eps(&["10.0.0.1", "10.0.0.3"]));
        let wanted = eps(&["10.0.0.4"]);
        assert_eq!(assign_slots(&old, &wanted), eps(&["10.0.0.4"]));
        assert_eq!(assign_slots(&old, &[]), eps(&[]));
    }

    #[test]
    fn an_added_endpoint_takes_the_next_slot() {
        let old = eps(&["10.0.0.1", "10.0.0.2"]);
        let wanted = eps(&["10.0.0.3", "10.0.0.2", "10.0.0.1"]);
        assert_eq!(
            assign_slots(&old, &wanted),
            eps(&["10.0.0.1", "10.0.0.2", "10.0.0.3"])
        );
    }

    #[test]
    fn a_class_rule_draws_among_its_count() {
        let class = Class {
            pool: Pool {
                local: false,
                node_port: false,
            },
            protocol: Protocol::Udp,
            count: 3,
        };
        assert_eq!(
            Command::AddRule(class_rule(class)).line(kp_model::IpFamily::V4).to_string(),
            "add rule ip kube-proxy endpoints-by-count-udp-1-8 ip daddr . meta l4proto . th dport @endpoint-count-3 dnat ip to ip daddr . udp dport . numgen random mod 3 map @service-endpoints-udp"
        );
        let class = Class {
            pool: Pool {
                local: true,
                node_port: true,
            },
            protocol: Protocol::Tcp,
            count: 2,
        };
        assert_eq!(
            Command::AddRule(class_rule(class)).line(kp_model::IpFamily::V6).to_string(),
            "add rule ip6 kube-proxy local-endpoints-by-count-tcp-1-8 meta l4proto . th dport @local-nodeport-count-2 dnat ip6 to tcp dport . numgen random mod 2 map @local-nodeport-endpoints-tcp"
        );
        let class = Class { count: 9, ..class };
        assert_eq!(
            class_rule(class).chain.as_str(),
            "local-endpoints-by-count-tcp-9-16"
        );
    }

    #[test]
    fn a_group_rule_goes_to_its_group_chain() {
        let addresses = Pool {
            local: false,
            node_port: false,
        };
        assert_eq!(
            Command::AddRule(group_rule(addresses, Protocol::Tcp, 9))
                .line(kp_model::IpFamily::V4)
                .to_string(),
            "add rule ip kube-proxy endpoints-by-count-tcp ip daddr . meta l4proto . th dport @endpoint-group-9-16 goto endpoints-by-count-tcp-9-16"
        );
        let node_ports = Pool {
            local: true,
            node_port: true,
        };
        assert_eq!(
            Command::AddRule(group_rule(node_ports, Protocol::Udp, 1))
                .line(kp_model::IpFamily::V6)
                .to_string(),
            "add rule ip6 kube-proxy local-endpoints-by-count-udp meta l4proto . th dport @local-nodeport-group-1-8 goto local-endpoints-by-count-udp-1-8"
        );
    }
}
