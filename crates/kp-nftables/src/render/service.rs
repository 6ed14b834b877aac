//! The elements and chains of one service port, following upstream's
//! nftables `syncProxyRules`, with the traffic decisions of
//! [`kp_model::TrafficPlan`] (shared with every other mode).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

use kp_model::{Endpoint, Refusal, ServicePortName, TrafficPlan};
use kp_sync::ServicePortState;

use super::{Context, Sections};
use crate::names::{
    endpoint_names, service_chains, EndpointNames, ServiceChains, CLUSTER_IPS, FIREWALL_IPS,
    MARK_FOR_MASQUERADE, NO_ENDPOINT_NODEPORTS, NO_ENDPOINT_SERVICES, REJECT_CHAIN, SERVICE_IPS,
    SERVICE_NODEPORTS,
};
use crate::state::{Element, ServiceRecord};

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
    /// `tcp`, `udp` or `sctp`.
    protocol: &'static str,
}

/// Collects the rules of a service port's chains: every chain is declared
/// (and flushed) before any rule, since rules name other chains.
#[derive(Default)]
struct ChainWriter {
    declarations: String,
    rules: String,
    count: usize,
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
    record: &mut ServiceRecord,
    out: &mut Sections,
) {
    let plan = state.plan;
    let endpoints = state
        .endpoints
        .all_reachable
        .iter()
        .map(|ep| {
            let names = endpoint_names(name, SocketAddr::new(ep.ip, ep.port));
            (ep, Arc::new(names))
        })
        .collect();
    let port = Port {
        state,
        plan,
        chains: Arc::new(service_chains(name)),
        endpoints,
        comment: Arc::from(kp_model::rule_text::comment_safe(&name.to_string())),
        protocol: protocol_name(name),
    };
    write_elements(&port, &mut record.elements);
    let mut writer = ChainWriter::default();
    write_affinity_sets(ctx, &port, record, &mut writer);
    write_internal_masquerade(ctx, &port, &mut writer, record);
    write_external_chain(ctx, &port, &mut writer, record);
    write_firewall_chain(ctx, &port, &mut writer, record);
    let endpoints = &state.endpoints;
    if plan.uses_cluster_endpoints {
        let chain = Arc::clone(&port.chains.cluster);
        write_policy_chain(ctx, &port, &chain, &endpoints.cluster, &mut writer, record);
    }
    if plan.uses_local_endpoints {
        let chain = Arc::clone(&port.chains.local);
        write_policy_chain(ctx, &port, &chain, &endpoints.local, &mut writer, record);
    }
    write_endpoint_chains(ctx, &port, &mut writer, record);
    out.chains.push_str(&writer.declarations);
    out.chains.push_str(&writer.rules);
    record.rules += writer.count;
}

impl ChainWriter {
    /// Declares and flushes `chain` unless done already.
    fn declare(&mut self, ctx: &Context, chain: &Arc<str>, record: &mut ServiceRecord) {
        if record.chains.contains(chain) {
            return;
        }
        record.chains.push(Arc::clone(chain));
        let table = &ctx.table;
        let _ = writeln!(self.declarations, "add chain {table} {chain}");
        let _ = writeln!(self.declarations, "flush chain {table} {chain}");
    }

    fn rule(&mut self, ctx: &Context, chain: &str, rule: std::fmt::Arguments<'_>) {
        self.count += 1;
        let _ = writeln!(self.rules, "add rule {} {chain} {rule}", ctx.table);
    }
}

/// The verdict for traffic without an endpoint: `goto reject-chain` when
/// the Service has none at all, `drop` when the Local policy allows none on
/// this node.
fn refusal_verdict(refusal: Refusal) -> String {
    match refusal {
        Refusal::NoEndpoints => format!("goto {REJECT_CHAIN}"),
        Refusal::NoLocalEndpoints => "drop".to_owned(),
    }
}

fn write_elements(port: &Port<'_>, elements: &mut Vec<Element>) {
    let (plan, sp, p) = (&port.plan, &port.state.port, port.protocol);
    let comment = Some(Arc::clone(&port.comment));
    let refusal = refusal_verdict(plan.refusal());
    let ip_key = |ip: &std::net::IpAddr| format!("{ip} . {p} . {}", sp.port);
    let goto = |chain: &Arc<str>| format!("goto {chain}");
    elements.push(Element::set(CLUSTER_IPS, sp.cluster_ip.to_string()));
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
        let key = format!("{p} . {node_port}");
        if plan.has_endpoints {
            // NodePorts are not subject to loadBalancerSourceRanges, for
            // better or worse, and that cannot change now.
            elements.push(Element::map(
                SERVICE_NODEPORTS,
                key.clone(),
                goto(external),
                None,
            ));
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
    let addr = if ctx.ipx == "ip" {
        "ipv4_addr"
    } else {
        "ipv6_addr"
    };
    for (_, names) in &port.endpoints {
        let set = &names.affinity_set;
        if record.affinity_sets.contains(set) {
            continue;
        }
        record.affinity_sets.push(Arc::clone(set));
        let _ = writeln!(
            writer.declarations,
            "add set {} {set} {{ type {addr} ; flags dynamic,timeout ; timeout {}s ; }}",
            ctx.table,
            timeout.as_secs()
        );
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
    let (ipx, p) = (ctx.ipx, port.protocol);
    let chain = internal_chain(port);
    let condition = if ctx.masquerade_all {
        String::new()
    } else if let Some(detector) = &ctx.detector {
        format!(" {}", detector.if_not_local)
    } else {
        return;
    };
    writer.declare(ctx, chain, record);
    writer.rule(
        ctx,
        chain,
        format_args!(
            "{ipx} daddr {} {p} dport {}{condition} jump {MARK_FOR_MASQUERADE}",
            sp.cluster_ip, sp.port
        ),
    );
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
    writer.declare(ctx, ext, record);
    if !plan.external_policy_local {
        // Cluster endpoints may be on another node: masquerade so replies
        // come back through this one.
        writer.rule(ctx, ext, format_args!("jump {MARK_FOR_MASQUERADE}"));
    } else if plan.uses_cluster_endpoints {
        // (Without cluster endpoints there is no chain to short-circuit to.)
        if let Some(detector) = &ctx.detector {
            // Pods reaching an external address bypass both policies, as
            // if they had gone out to the load balancer and come back.
            writer.rule(
                ctx,
                ext,
                format_args!(
                    "{} goto {svc} comment \"short-circuit pod traffic\"",
                    detector.if_local
                ),
            );
        }
        // The host itself picks the external address as source, so its
        // traffic must be masqueraded and may use any endpoint.
        writer.rule(
            ctx,
            ext,
            format_args!(
                "fib saddr type local jump {MARK_FOR_MASQUERADE} comment \"masquerade local traffic\""
            ),
        );
        writer.rule(
            ctx,
            ext,
            format_args!("fib saddr type local goto {svc} comment \"short-circuit local traffic\""),
        );
    } else {
        writer.rule(
            ctx,
            ext,
            format_args!(
                "fib saddr type local jump {MARK_FOR_MASQUERADE} comment \"masquerade local traffic\""
            ),
        );
    }
    if plan.has_external_endpoints {
        let policy = if plan.external_policy_local {
            &port.chains.local
        } else {
            svc
        };
        writer.rule(ctx, ext, format_args!("goto {policy}"));
    }
}

fn write_firewall_chain(
    ctx: &Context,
    port: &Port<'_>,
    writer: &mut ChainWriter,
    record: &mut ServiceRecord,
) {
    if !port.plan.uses_source_ranges_filter {
        return;
    }
    let sp = &port.state.port;
    let fw = &port.chains.firewall;
    writer.declare(ctx, fw, record);
    let mut sources: Vec<String> = sp
        .load_balancer_source_ranges
        .iter()
        .map(|range| range.trunc().to_string())
        .collect();
    if port.plan.source_ranges_admit_node {
        sources.extend(sp.load_balancer_ips.iter().map(ToString::to_string));
    }
    writer.rule(
        ctx,
        fw,
        format_args!("{} saddr != {{ {} }} drop", ctx.ipx, sources.join(", ")),
    );
}

/// `service-…` or `local-…`: affinity lookups, then a random choice of an
/// endpoint chain with `numgen`.
fn write_policy_chain(
    ctx: &Context,
    port: &Port<'_>,
    chain: &Arc<str>,
    endpoints: &[Arc<Endpoint>],
    writer: &mut ChainWriter,
    record: &mut ServiceRecord,
) {
    writer.declare(ctx, chain, record);
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
                ctx,
                chain,
                format_args!(
                    "{} saddr @{} goto {}",
                    ctx.ipx, names.affinity_set, names.chain
                ),
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
            writer.rule(
                ctx,
                chain,
                format_args!("numgen random mod {} 0 goto {}", count - i, names.chain),
            );
        } else {
            writer.rule(ctx, chain, format_args!("goto {}", names.chain));
        }
    }
}

/// One chain per reachable endpoint: masquerade hairpin traffic (a pod
/// reaching itself through the Service), record affinity, DNAT.
fn write_endpoint_chains(
    ctx: &Context,
    port: &Port<'_>,
    writer: &mut ChainWriter,
    record: &mut ServiceRecord,
) {
    let affinity = port.state.port.session_affinity_timeout.is_some();
    for (endpoint, names) in &port.endpoints {
        let chain = &names.chain;
        writer.declare(ctx, chain, record);
        writer.rule(
            ctx,
            chain,
            format_args!(
                "{} saddr {} jump {MARK_FOR_MASQUERADE}",
                ctx.ipx, endpoint.ip
            ),
        );
        if affinity {
            writer.rule(
                ctx,
                chain,
                format_args!("update @{} {{ {} saddr }}", names.affinity_set, ctx.ipx),
            );
        }
        writer.rule(
            ctx,
            chain,
            format_args!(
                "meta l4proto {} dnat to {}",
                port.protocol,
                SocketAddr::new(endpoint.ip, endpoint.port)
            ),
        );
    }
}

fn protocol_name(name: &ServicePortName) -> &'static str {
    match name.protocol {
        kp_model::Protocol::Tcp => "tcp",
        kp_model::Protocol::Udp => "udp",
        kp_model::Protocol::Sctp => "sctp",
    }
}
