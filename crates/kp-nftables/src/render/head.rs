//! The fixed part of the table, written by every full render: the table,
//! its sets and maps (flushed, to be filled again), the base chains at
//! upstream's hooks and priorities, and the rules of the fixed chains.

use std::fmt::Write as _;

use super::{Context, RenderInput};
use crate::names::{
    CLUSTER_IPS, CLUSTER_IPS_CHECK, FILTER_FORWARD, FILTER_INPUT, FILTER_OUTPUT,
    FILTER_OUTPUT_PRE_DNAT, FILTER_PREROUTING_PRE_DNAT, FIREWALL_CHECK, FIREWALL_IPS,
    MARK_FOR_MASQUERADE, MASQUERADING, NAT_OUTPUT, NAT_POSTROUTING, NAT_PREROUTING,
    NODEPORT_ENDPOINTS_CHECK, NODEPORT_IPS, NO_ENDPOINT_NODEPORTS, NO_ENDPOINT_SERVICES,
    REJECT_CHAIN, SERVICES, SERVICE_ENDPOINTS_CHECK, SERVICE_IPS, SERVICE_NODEPORTS,
};
use crate::options::NftablesOptions;

/// A base chain: name, type, hook, priority. Filtering happens on the
/// original destination (before DNAT, priority dstnat − 10) where source
/// ranges are checked, and after DNAT (priority 0) where refusals are.
const BASE_CHAINS: [(&str, &str, &str, i32); 8] = [
    (FILTER_PREROUTING_PRE_DNAT, "filter", "prerouting", -110),
    (FILTER_OUTPUT_PRE_DNAT, "filter", "output", -110),
    (FILTER_FORWARD, "filter", "forward", 0),
    (FILTER_INPUT, "filter", "input", 0),
    (FILTER_OUTPUT, "filter", "output", 0),
    (NAT_OUTPUT, "nat", "output", -100),
    (NAT_POSTROUTING, "nat", "postrouting", 100),
    (NAT_PREROUTING, "nat", "prerouting", -100),
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

/// Jumps from base chains: (from, condition, to). `reject` is only valid
/// in input, forward and output hooks on kernels before 5.9, so refusals
/// are checked there, not in prerouting.
const JUMPS: [(&str, &str, &str); 11] = [
    (FILTER_PREROUTING_PRE_DNAT, "ct state new ", FIREWALL_CHECK),
    (FILTER_FORWARD, "ct state new ", SERVICE_ENDPOINTS_CHECK),
    (FILTER_FORWARD, "ct state new ", CLUSTER_IPS_CHECK),
    (FILTER_INPUT, "ct state new ", NODEPORT_ENDPOINTS_CHECK),
    (FILTER_INPUT, "ct state new ", SERVICE_ENDPOINTS_CHECK),
    (FILTER_OUTPUT, "ct state new ", SERVICE_ENDPOINTS_CHECK),
    (FILTER_OUTPUT_PRE_DNAT, "ct state new ", FIREWALL_CHECK),
    (FILTER_OUTPUT, "ct state new ", CLUSTER_IPS_CHECK),
    (NAT_OUTPUT, "", SERVICES),
    (NAT_POSTROUTING, "", MASQUERADING),
    (NAT_PREROUTING, "", SERVICES),
];

/// The first lines of each transaction of a split render but the last:
/// what Service chains need (the table, and the chain their rules jump
/// to), declared without flushing anything.
pub(super) fn prelude(ctx: &Context) -> String {
    let table = &ctx.table;
    format!(
        "add table {table} {{ comment \"rules for kube-proxy\" ; }}\nadd chain {table} {MARK_FOR_MASQUERADE}\n"
    )
}

/// `head` without the deletion of the table a reset starts with.
pub(super) fn without_reset<'h>(ctx: &Context, head: &'h str) -> &'h str {
    let table = &ctx.table;
    head.strip_prefix(&format!("add table {table}\ndelete table {table}\n"))
        .unwrap_or(head)
}

/// Writes the fixed part of a full transaction into `out`.
pub(super) fn write_head(
    ctx: &Context,
    options: &NftablesOptions,
    input: &RenderInput<'_>,
    out: &mut String,
) {
    let table = &ctx.table;
    if input.reset {
        // Deleting what an earlier process left, in the same transaction
        // that writes the new table, removes its stale chains without
        // listing them, and lets base chains change priority.
        let _ = writeln!(out, "add table {table}");
        let _ = writeln!(out, "delete table {table}");
    }
    let _ = writeln!(
        out,
        "add table {table} {{ comment \"rules for kube-proxy\" ; }}"
    );
    write_sets_and_maps(ctx, input, out);
    for (name, kind, hook, priority) in BASE_CHAINS {
        let _ = writeln!(
            out,
            "add chain {table} {name} {{ type {kind} hook {hook} priority {priority} ; }}"
        );
    }
    for name in FIXED_CHAINS {
        if name == REJECT_CHAIN {
            let _ = writeln!(
                out,
                "add chain {table} {name} {{ comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\" ; }}"
            );
        } else {
            let _ = writeln!(out, "add chain {table} {name}");
        }
    }
    for name in BASE_CHAINS.iter().map(|chain| chain.0).chain(FIXED_CHAINS) {
        let _ = writeln!(out, "flush chain {table} {name}");
    }
    if input.node_port_addresses.is_none() {
        let _ = writeln!(out, "delete set {table} {NODEPORT_IPS}");
    }
    for (from, condition, to) in JUMPS {
        let _ = writeln!(out, "add rule {table} {from} {condition}jump {to}");
    }
    write_fixed_rules(ctx, options, input, out);
}

fn write_sets_and_maps(ctx: &Context, input: &RenderInput<'_>, out: &mut String) {
    let (table, ipx) = (&ctx.table, ctx.ipx);
    let addr = if ipx == "ip" {
        "ipv4_addr"
    } else {
        "ipv6_addr"
    };
    let _ = writeln!(
        out,
        "add set {table} {CLUSTER_IPS} {{ type {addr} ; comment \"Active ClusterIPs\" ; }}"
    );
    let _ = writeln!(out, "flush set {table} {CLUSTER_IPS}");
    let _ = writeln!(
        out,
        "add set {table} {NODEPORT_IPS} {{ type {addr} ; comment \"IPs that accept NodePort traffic\" ; }}"
    );
    match input.node_port_addresses {
        // Deleted below, once the chains that may refer to it are flushed.
        None => {}
        Some(addresses) => {
            let _ = writeln!(out, "flush set {table} {NODEPORT_IPS}");
            // Upstream's nftables mode has no localhost NodePorts.
            let usable: Vec<String> = addresses
                .iter()
                .filter(|ip| !ip.is_loopback() && (ip.is_ipv4() == (ipx == "ip")))
                .map(ToString::to_string)
                .collect();
            if !usable.is_empty() {
                let _ = writeln!(
                    out,
                    "add element {table} {NODEPORT_IPS} {{ {} }}",
                    usable.join(", ")
                );
            }
        }
    }
    let ip_key = format!("{addr} . inet_proto . inet_service : verdict");
    let port_key = "inet_proto . inet_service : verdict";
    let maps = [
        (
            FIREWALL_IPS,
            ip_key.as_str(),
            "destinations that are subject to LoadBalancerSourceRanges",
        ),
        (
            NO_ENDPOINT_NODEPORTS,
            port_key,
            "vmap to drop or reject packets to service nodeports with no endpoints",
        ),
        (
            NO_ENDPOINT_SERVICES,
            ip_key.as_str(),
            "vmap to drop or reject packets to services with no endpoints",
        ),
        (
            SERVICE_IPS,
            ip_key.as_str(),
            "ClusterIP, ExternalIP and LoadBalancer IP traffic",
        ),
        (SERVICE_NODEPORTS, port_key, "NodePort traffic"),
    ];
    for (name, kind, comment) in maps {
        let _ = writeln!(
            out,
            "add map {table} {name} {{ type {kind} ; comment \"{comment}\" ; }}"
        );
        let _ = writeln!(out, "flush map {table} {name}");
    }
}

fn write_fixed_rules(
    ctx: &Context,
    options: &NftablesOptions,
    input: &RenderInput<'_>,
    out: &mut String,
) {
    let (table, ipx) = (&ctx.table, ctx.ipx);
    let mark = options.masquerade_mark();
    let dispatch = format!("{ipx} daddr . meta l4proto . th dport vmap");
    let rules = [
        format!("{CLUSTER_IPS_CHECK} {ipx} daddr @{CLUSTER_IPS} reject comment \"Reject traffic to invalid ports of ClusterIPs\""),
        format!("{FIREWALL_CHECK} {dispatch} @{FIREWALL_IPS}"),
        format!("{MARK_FOR_MASQUERADE} mark set mark or {mark}"),
        format!("{MASQUERADING} mark and {mark} == 0 return"),
        format!("{MASQUERADING} mark set mark xor {mark}"),
        format!("{MASQUERADING} masquerade fully-random"),
        format!("{REJECT_CHAIN} reject"),
        format!("{SERVICES} {dispatch} @{SERVICE_IPS}"),
        format!("{SERVICE_ENDPOINTS_CHECK} {dispatch} @{NO_ENDPOINT_SERVICES}"),
    ];
    for rule in rules {
        let _ = writeln!(out, "add rule {table} {rule}");
    }
    let node_ports = match input.node_port_addresses {
        None => {
            let loopback = if ipx == "ip" { "127.0.0.0/8" } else { "::1" };
            format!("fib daddr type local {ipx} daddr != {loopback}")
        }
        Some(_) => format!("{ipx} daddr @{NODEPORT_IPS}"),
    };
    let _ = writeln!(
        out,
        "add rule {table} {NODEPORT_ENDPOINTS_CHECK} {node_ports} meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS}"
    );
    let _ = writeln!(
        out,
        "add rule {table} {SERVICES} {node_ports} meta l4proto . th dport vmap @{SERVICE_NODEPORTS}"
    );
}
