//! The fixed part of the table, written by every full render: the table,
//! its sets and maps (flushed, to be filled again), the base chains at
//! upstream's hooks and priorities, and the rules of the fixed chains.
//! The data layout adds the slot maps, the count sets, group sets, class
//! chains and group chains of the endpoint counts in use, and the
//! `hairpin-endpoints` set, looked up first in `masquerading`.

use std::collections::BTreeSet;

use kp_model::{IpFamily, Protocol};

use super::{Context, RenderInput};
use crate::model::{
    AddrField, Address, ChainKind, ChainType, Command, Expr, Hook, Key, KeyType, Name, Rule,
    SetElement, SetSpec, TypeofField, TypeofSpec, Verdict, IPV4, IPV4_PROTO_PORT, IPV6,
    IPV6_PROTO_PORT, PROTO_PORT,
};
use crate::names::{
    class_chain, count_set, group_chain, group_of_count, group_set, slot_map, Pool,
    HAIRPIN_ENDPOINTS,
};
use crate::names::{
    CLUSTER_IPS, CLUSTER_IPS_CHECK, FILTER_FORWARD, FILTER_INPUT, FILTER_OUTPUT,
    FILTER_OUTPUT_PRE_DNAT, FILTER_PREROUTING_PRE_DNAT, FIREWALL_CHECK, FIREWALL_IPS,
    MARK_FOR_MASQUERADE, MASQUERADING, NAT_OUTPUT, NAT_POSTROUTING, NAT_PREROUTING,
    NODEPORT_ENDPOINTS_CHECK, NODEPORT_IPS, NO_ENDPOINT_NODEPORTS, NO_ENDPOINT_SERVICES,
    REJECT_CHAIN, SERVICES, SERVICE_ENDPOINTS_CHECK, SERVICE_IPS, SERVICE_NODEPORTS,
};
use crate::options::{Layout, NftablesOptions};
use crate::state::Class;

/// The protocols a service port can have, in the order their maps are
/// declared.
const PROTOCOLS: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

/// The table's comment.
const TABLE_COMMENT: &str = "rules for kube-proxy";

/// `127.0.0.0/8`, which NodePorts never answer on (checked when compiled).
const LOOPBACK_V4: ipnet::Ipv4Net =
    ipnet::Ipv4Net::new_assert(std::net::Ipv4Addr::new(127, 0, 0, 0), 8);

/// A base chain: name, type, hook, priority. Filtering happens on the
/// original destination (before DNAT, priority dstnat − 10) where source
/// ranges are checked, and after DNAT (priority 0) where refusals are.
const BASE_CHAINS: [(&str, ChainType, Hook, i32); 8] = [
    (
        FILTER_PREROUTING_PRE_DNAT,
        ChainType::Filter,
        Hook::Prerouting,
        -110,
    ),
    (
        FILTER_OUTPUT_PRE_DNAT,
        ChainType::Filter,
        Hook::Output,
        -110,
    ),
    (FILTER_FORWARD, ChainType::Filter, Hook::Forward, 0),
    (FILTER_INPUT, ChainType::Filter, Hook::Input, 0),
    (FILTER_OUTPUT, ChainType::Filter, Hook::Output, 0),
    (NAT_OUTPUT, ChainType::Nat, Hook::Output, -100),
    (NAT_POSTROUTING, ChainType::Nat, Hook::Postrouting, 100),
    (NAT_PREROUTING, ChainType::Nat, Hook::Prerouting, -100),
];

/// The regular fixed chains.
const FIXED_CHAINS: [&str; 8] = [
    CLUSTER_IPS_CHECK,
    FIREWALL_CHECK,
    MARK_FOR_MASQUERADE,
    MASQUERADING,
    NODEPORT_ENDPOINTS_CHECK,
    REJECT_CHAIN,
    SERVICES,
    SERVICE_ENDPOINTS_CHECK,
];

/// Jumps from base chains: (from, only new connections, to). `reject` is
/// only valid in input, forward and output hooks on kernels before 5.9, so
/// refusals are checked there, not in prerouting.
const JUMPS: [(&str, bool, &str); 11] = [
    (FILTER_PREROUTING_PRE_DNAT, true, FIREWALL_CHECK),
    (FILTER_FORWARD, true, SERVICE_ENDPOINTS_CHECK),
    (FILTER_FORWARD, true, CLUSTER_IPS_CHECK),
    (FILTER_INPUT, true, NODEPORT_ENDPOINTS_CHECK),
    (FILTER_INPUT, true, SERVICE_ENDPOINTS_CHECK),
    (FILTER_OUTPUT, true, SERVICE_ENDPOINTS_CHECK),
    (FILTER_OUTPUT_PRE_DNAT, true, FIREWALL_CHECK),
    (FILTER_OUTPUT, true, CLUSTER_IPS_CHECK),
    (NAT_OUTPUT, false, SERVICES),
    (NAT_POSTROUTING, false, MASQUERADING),
    (NAT_PREROUTING, false, SERVICES),
];

/// The first commands of each transaction of a split render but the last:
/// what Service chains need (the table, and the chain their rules jump
/// to), declared without flushing anything.
pub(super) fn prelude(layout: Layout) -> Vec<Command> {
    let mut commands = vec![
        Command::AddTable {
            comment: Some(TABLE_COMMENT),
        },
        Command::AddChain {
            name: Name::Fixed(MARK_FOR_MASQUERADE),
            kind: ChainKind::Regular,
        },
    ];
    if layout == Layout::Data {
        // The Service chains' gotos name them.
        commands.extend(class_chains());
    }
    commands
}

/// The data layout's slot maps, declared: `typeof ip daddr . tcp dport .
/// numgen random mod 1 : ip daddr . tcp dport` (NodePorts: `typeof tcp
/// dport . numgen random mod 1`). One map per pool and protocol: nft 1.0.6
/// reads a `dnat … map` rule into a map typed `th dport` only in the
/// transaction that creates the map (docs/nft-layout-experiment.md,
/// finding 3). Only the class rules look them up, so an element added is
/// checked against a handful of rules, not one per Service.
fn slot_maps() -> impl Iterator<Item = Command> {
    Pool::ALL.into_iter().flat_map(|pool| {
        PROTOCOLS.into_iter().map(move |protocol| {
            let dst = TypeofField::Addr(AddrField::Destination);
            let port = TypeofField::Port(protocol);
            let key = if pool.node_port {
                vec![port, TypeofField::Number]
            } else {
                vec![dst, port, TypeofField::Number]
            };
            Command::AddTypeofSet(TypeofSpec {
                name: Name::Fixed(slot_map(pool, protocol)),
                key,
                data: vec![dst, port],
                comment: None,
            })
        })
    })
}

/// The data layout's class chains, declared.
fn class_chains() -> impl Iterator<Item = Command> {
    [false, true].into_iter().flat_map(|local| {
        PROTOCOLS
            .into_iter()
            .map(move |protocol| Command::AddChain {
                name: Name::Fixed(class_chain(local, protocol)),
                kind: ChainKind::Regular,
            })
    })
}

/// The classes the service ports of `input` need in the data layout.
pub(super) fn classes_in_use(input: &RenderInput<'_>) -> BTreeSet<Class> {
    input
        .service_ports
        .iter()
        .flat_map(|(name, state)| super::service::classes_of(name, state))
        .collect()
}

/// The classes a full render writes for `input`: those in use, and for
/// each the counts one below and one above ([`with_neighbours`]).
pub(super) fn classes_to_hold(input: &RenderInput<'_>) -> BTreeSet<Class> {
    with_neighbours(&classes_in_use(input))
}

/// `classes` with, for each, the classes of one endpoint fewer (down to 1)
/// and one more. A class added later is a rule the kernel validates with
/// the whole table (and binds to a slot map of every entry's slots: 90–130
/// ms at 5,000 × 50); written ahead, the common count changes (an endpoint
/// added or removed, a readiness flip, a rolling update's surge) find
/// their class there and stay element-only.
pub(super) fn with_neighbours(classes: &BTreeSet<Class>) -> BTreeSet<Class> {
    classes
        .iter()
        .flat_map(|class| {
            let below = class.count.checked_sub(1).filter(|count| *count > 0);
            [below, Some(class.count), class.count.checked_add(1)]
                .into_iter()
                .flatten()
                .map(move |count| Class { count, ..*class })
        })
        .collect()
}

/// The count sets and group sets of `classes`, declared (an `add` of a
/// set that exists changes nothing), and flushed too with `flush`.
pub(super) fn count_sets(
    family: IpFamily,
    classes: &BTreeSet<Class>,
    flush: bool,
    out: &mut Vec<Command>,
) {
    let ip_key = match family {
        IpFamily::V4 => IPV4_PROTO_PORT,
        IpFamily::V6 => IPV6_PROTO_PORT,
    };
    let counts = count_sets_of(classes)
        .into_iter()
        .map(|(pool, count)| (pool, count_set(pool, count)));
    let groups = group_sets_of(classes)
        .into_iter()
        .map(|(pool, first)| (pool, group_set(pool, first)));
    for (pool, set) in counts.chain(groups) {
        let name = Name::Fixed(set);
        out.push(Command::AddSet(SetSpec {
            name: name.clone(),
            map: false,
            key: if pool.node_port { PROTO_PORT } else { ip_key },
            verdicts: false,
            dynamic_timeout_secs: None,
            comment: None,
        }));
        if flush {
            out.push(Command::FlushSet { name, map: false });
        }
    }
}

/// The count sets `classes` look up: one per pool and count.
pub(super) fn count_sets_of(classes: &BTreeSet<Class>) -> BTreeSet<(Pool, u32)> {
    classes
        .iter()
        .map(|class| (class.pool, class.count))
        .collect()
}

/// The group sets the class chains look up for `classes`: one per pool
/// and group of counts (by its first count).
pub(super) fn group_sets_of(classes: &BTreeSet<Class>) -> BTreeSet<(Pool, u32)> {
    classes
        .iter()
        .map(|class| (class.pool, group_of_count(class.count)))
        .collect()
}

/// The group chains `classes` fill: one per endpoint list (local or not),
/// protocol and group of counts (by its first count).
pub(super) fn group_chains_of(classes: &BTreeSet<Class>) -> BTreeSet<(bool, Protocol, u32)> {
    classes
        .iter()
        .map(|class| {
            (
                class.pool.local,
                class.protocol,
                group_of_count(class.count),
            )
        })
        .collect()
}

/// The class chains and group chains that `classes` fill, written anew
/// ([`group_chain_rules`], [`class_chain_rules`]); each group chain before
/// the class chain rule that names it.
pub(super) fn class_rules(classes: &BTreeSet<Class>, out: &mut Vec<Command>) {
    let chains: BTreeSet<(bool, Protocol)> = classes
        .iter()
        .map(|class| (class.pool.local, class.protocol))
        .collect();
    let groups = group_chains_of(classes);
    for (local, protocol) in chains {
        for &(_, _, first) in groups
            .iter()
            .filter(|group| (group.0, group.1) == (local, protocol))
        {
            group_chain_rules(classes, local, protocol, first, out);
        }
        class_chain_rules(classes, local, protocol, out);
    }
}

/// The group chain of `local`, `protocol` and the group that starts at
/// `first`, declared, flushed and filled with the rules of the classes of
/// `classes` in it: one per class, addresses before NodePorts (so that a
/// packet to a Service address never meets a NodePort's rule of the same
/// port first), each in order of count.
pub(super) fn group_chain_rules(
    classes: &BTreeSet<Class>,
    local: bool,
    protocol: Protocol,
    first: u32,
    out: &mut Vec<Command>,
) {
    let name = Name::Fixed(group_chain(local, protocol, first));
    out.push(Command::AddChain {
        name: name.clone(),
        kind: ChainKind::Regular,
    });
    out.push(Command::FlushChain(name));
    for class in classes.iter().filter(|class| {
        (
            class.pool.local,
            class.protocol,
            group_of_count(class.count),
        ) == (local, protocol, first)
    }) {
        out.push(Command::AddRule(super::service::class_rule(*class)));
    }
}

/// The class chain of `local` and `protocol`, flushed and filled with one
/// rule per group of `classes` in it, each going to its group chain:
/// address groups before NodePort groups (as in the group chains), each
/// in order of count.
pub(super) fn class_chain_rules(
    classes: &BTreeSet<Class>,
    local: bool,
    protocol: Protocol,
    out: &mut Vec<Command>,
) {
    out.push(Command::FlushChain(Name::Fixed(class_chain(
        local, protocol,
    ))));
    out.extend(
        groups_in_chain(classes, local, protocol)
            .into_iter()
            .map(|(pool, first)| {
                Command::AddRule(super::service::group_rule(pool, protocol, first))
            }),
    );
}

/// The groups (by pool and first count) of the classes of `classes` in
/// the class chain of `local` and `protocol`: the rules that chain holds.
pub(super) fn groups_in_chain(
    classes: &BTreeSet<Class>,
    local: bool,
    protocol: Protocol,
) -> BTreeSet<(Pool, u32)> {
    classes
        .iter()
        .filter(|class| class.pool.local == local && class.protocol == protocol)
        .map(|class| (class.pool, group_of_count(class.count)))
        .collect()
}

/// The data layout's sets, maps and class chains, declared and flushed,
/// with the count sets and class rules of `classes`.
fn write_data_sets_and_maps(family: IpFamily, classes: &BTreeSet<Class>, out: &mut Vec<Command>) {
    out.push(Command::AddTypeofSet(TypeofSpec {
        name: Name::Fixed(HAIRPIN_ENDPOINTS),
        key: vec![
            TypeofField::Addr(AddrField::Source),
            TypeofField::Addr(AddrField::Destination),
        ],
        data: Vec::new(),
        comment: None,
    }));
    out.push(Command::FlushSet {
        name: Name::Fixed(HAIRPIN_ENDPOINTS),
        map: false,
    });
    for map in slot_maps() {
        let name = match &map {
            Command::AddTypeofSet(spec) => spec.name.clone(),
            _ => continue,
        };
        out.push(map);
        out.push(Command::FlushSet { name, map: true });
    }
    count_sets(family, classes, true, out);
    for chain in class_chains() {
        let name = match &chain {
            Command::AddChain { name, .. } => name.clone(),
            _ => continue,
        };
        out.push(chain);
        out.push(Command::FlushChain(name));
    }
}

/// The deletion of the table a reset starts with: `add` first, so that
/// the deletion succeeds whether the table exists or not.
pub(super) fn reset() -> Vec<Command> {
    vec![Command::AddTable { comment: None }, Command::DeleteTable]
}

/// What the fixed part of the data layout holds for the Services: the
/// classes of their endpoint counts. Partial renders keep these up to date
/// as Services change, so they are left out of the fixed part's
/// fingerprint ([`Shared::none`]).
#[derive(Debug, Default)]
pub(super) struct Shared {
    pub classes: BTreeSet<Class>,
}

impl Shared {
    /// What the service ports of `input` need.
    pub fn of(ctx: &Context, input: &RenderInput<'_>) -> Self {
        if ctx.layout == Layout::Data {
            Self {
                classes: classes_to_hold(input),
            }
        } else {
            Self::none()
        }
    }

    /// Nothing: the fixed part alone.
    pub fn none() -> Self {
        Self::default()
    }
}

/// Writes the fixed part of a full transaction (without the reset) into
/// `out`, with `shared` (the data layout's).
pub(super) fn write_head(
    ctx: &Context,
    options: &NftablesOptions,
    input: &RenderInput<'_>,
    shared: &Shared,
    out: &mut Vec<Command>,
) {
    out.push(Command::AddTable {
        comment: Some(TABLE_COMMENT),
    });
    write_sets_and_maps(ctx, input, out);
    let classes = &shared.classes;
    if ctx.layout == Layout::Data {
        write_data_sets_and_maps(ctx.family, classes, out);
    }
    for (name, chain_type, hook, priority) in BASE_CHAINS {
        out.push(Command::AddChain {
            name: Name::Fixed(name),
            kind: ChainKind::Base {
                chain_type,
                hook,
                priority,
            },
        });
    }
    for name in FIXED_CHAINS {
        let kind = if name == REJECT_CHAIN {
            ChainKind::Commented("helper for @no-endpoint-services / @no-endpoint-nodeports")
        } else {
            ChainKind::Regular
        };
        out.push(Command::AddChain {
            name: Name::Fixed(name),
            kind,
        });
    }
    for name in BASE_CHAINS.iter().map(|chain| chain.0).chain(FIXED_CHAINS) {
        out.push(Command::FlushChain(Name::Fixed(name)));
    }
    if input.node_port_addresses.is_none() {
        out.push(Command::DeleteSet {
            name: Name::Fixed(NODEPORT_IPS),
            map: false,
        });
    }
    for (from, new_only, to) in JUMPS {
        let mut exprs = Vec::with_capacity(2);
        if new_only {
            exprs.push(Expr::CtStateNew);
        }
        exprs.push(jump(to));
        out.push(Command::AddRule(Rule::new(from, exprs)));
    }
    write_fixed_rules(ctx, options, input, out);
    if ctx.layout == Layout::Data {
        // The class chains were flushed with the other chains above.
        let mut rules = Vec::new();
        class_rules(classes, &mut rules);
        out.extend(rules.into_iter().filter(|command| {
            !matches!(command, Command::FlushChain(chain)
                if crate::names::group_of_chain(chain.as_str()).is_none())
        }));
    }
}

fn jump(chain: &'static str) -> Expr {
    Expr::Verdict(Verdict::Jump(Name::Fixed(chain)))
}

fn write_sets_and_maps(ctx: &Context, input: &RenderInput<'_>, out: &mut Vec<Command>) {
    let (addr, ip_key) = match ctx.family {
        IpFamily::V4 => (IPV4, IPV4_PROTO_PORT),
        IpFamily::V6 => (IPV6, IPV6_PROTO_PORT),
    };
    let set = |name: &'static str, comment: &'static str| {
        Command::AddSet(SetSpec {
            name: Name::Fixed(name),
            map: false,
            key: addr,
            verdicts: false,
            dynamic_timeout_secs: None,
            comment: Some(comment),
        })
    };
    let flush = |name: &'static str, map: bool| Command::FlushSet {
        name: Name::Fixed(name),
        map,
    };
    out.push(set(CLUSTER_IPS, "Active ClusterIPs"));
    out.push(flush(CLUSTER_IPS, false));
    out.push(set(NODEPORT_IPS, "IPs that accept NodePort traffic"));
    match input.node_port_addresses {
        // Deleted below, once the chains that may refer to it are flushed.
        None => {}
        Some(addresses) => {
            out.push(flush(NODEPORT_IPS, false));
            // Upstream's nftables mode has no localhost NodePorts.
            let usable: Vec<SetElement> = addresses
                .iter()
                .filter(|ip| !ip.is_loopback() && (IpFamily::of(ip) == ctx.family))
                .map(|ip| SetElement {
                    key: Key::Addr(*ip),
                    comment: None,
                    verdict: None,
                })
                .collect();
            if !usable.is_empty() {
                out.push(Command::AddElements {
                    set: Name::Fixed(NODEPORT_IPS),
                    elements: usable,
                });
            }
        }
    }
    let maps: [(&str, &'static [KeyType], &str); 5] = [
        (
            FIREWALL_IPS,
            ip_key,
            "destinations that are subject to LoadBalancerSourceRanges",
        ),
        (
            NO_ENDPOINT_NODEPORTS,
            PROTO_PORT,
            "vmap to drop or reject packets to service nodeports with no endpoints",
        ),
        (
            NO_ENDPOINT_SERVICES,
            ip_key,
            "vmap to drop or reject packets to services with no endpoints",
        ),
        (
            SERVICE_IPS,
            ip_key,
            "ClusterIP, ExternalIP and LoadBalancer IP traffic",
        ),
        (SERVICE_NODEPORTS, PROTO_PORT, "NodePort traffic"),
    ];
    for (name, key, comment) in maps {
        out.push(Command::AddSet(SetSpec {
            name: Name::Fixed(name),
            map: true,
            key,
            verdicts: true,
            dynamic_timeout_secs: None,
            comment: Some(comment),
        }));
        out.push(flush(name, true));
    }
}

fn write_fixed_rules(
    ctx: &Context,
    options: &NftablesOptions,
    input: &RenderInput<'_>,
    out: &mut Vec<Command>,
) {
    let mark = options.masquerade_mark.value();
    let dispatch = |map: &'static str| Expr::DispatchVmap {
        with_addr: true,
        map: Name::Fixed(map),
    };
    let rules = [
        Rule::new(
            CLUSTER_IPS_CHECK,
            vec![
                Expr::AddrInSet {
                    field: AddrField::Destination,
                    set: Name::Fixed(CLUSTER_IPS),
                },
                Expr::Reject,
            ],
        )
        .with_comment(crate::names::COMMENT_INVALID_CLUSTER_IP_PORTS),
        Rule::new(FIREWALL_CHECK, vec![dispatch(FIREWALL_IPS)]),
        Rule::new(MARK_FOR_MASQUERADE, vec![Expr::MarkSetOr(mark)]),
    ];
    out.extend(rules.into_iter().map(Command::AddRule));
    if ctx.layout == Layout::Data {
        // After DNAT, an endpoint reaching itself through a Service has its
        // own address as source and destination; nft cannot compare two
        // fields of a packet, so the pairs are a set.
        out.push(Command::AddRule(Rule::new(
            MASQUERADING,
            vec![
                Expr::AddrPairInSet(Name::Fixed(HAIRPIN_ENDPOINTS)),
                Expr::Verdict(Verdict::Jump(Name::Fixed(MARK_FOR_MASQUERADE))),
            ],
        )));
    }
    let rules = [
        Rule::new(
            MASQUERADING,
            vec![Expr::MarkLacks(mark), Expr::Verdict(Verdict::Return)],
        ),
        Rule::new(MASQUERADING, vec![Expr::MarkSetXor(mark)]),
        Rule::new(MASQUERADING, vec![Expr::MasqueradeFullyRandom]),
        Rule::new(REJECT_CHAIN, vec![Expr::Reject]),
        Rule::new(SERVICES, vec![dispatch(SERVICE_IPS)]),
        Rule::new(
            SERVICE_ENDPOINTS_CHECK,
            vec![dispatch(NO_ENDPOINT_SERVICES)],
        ),
    ];
    out.extend(rules.into_iter().map(Command::AddRule));
    let node_ports = || match input.node_port_addresses {
        None => {
            let loopback = match ctx.family {
                IpFamily::V4 => Address::Prefix(ipnet::IpNet::V4(LOOPBACK_V4)),
                IpFamily::V6 => Address::Host(std::net::Ipv6Addr::LOCALHOST.into()),
            };
            vec![
                Expr::FibLocal(AddrField::Destination),
                Expr::AddrIs {
                    field: AddrField::Destination,
                    negate: true,
                    value: loopback,
                },
            ]
        }
        Some(_) => vec![Expr::AddrInSet {
            field: AddrField::Destination,
            set: Name::Fixed(NODEPORT_IPS),
        }],
    };
    for (chain, map) in [
        (NODEPORT_ENDPOINTS_CHECK, NO_ENDPOINT_NODEPORTS),
        (SERVICES, SERVICE_NODEPORTS),
    ] {
        let mut exprs = node_ports();
        exprs.push(Expr::DispatchVmap {
            with_addr: false,
            map: Name::Fixed(map),
        });
        out.push(Command::AddRule(Rule::new(chain, exprs)));
    }
}
