//! The iptables rules upstream's IPVS mode adds around IPVS: masquerade
//! marks matched through the ipsets, NodePort and load balancer handling,
//! source-range filtering and the filter that keeps other ports of service
//! addresses closed — rendered as iptables-restore input for the nat and
//! filter tables, so each table changes in one atomic step.
//!
//! Chains and rules follow upstream's `writeIptablesRules`
//! (pkg/proxy/ipvs/proxier.go, v1.31+), so either implementation can clean
//! up after the other.

use std::fmt::Write as _;
use std::net::IpAddr;

use kp_iptables::{JumpRule, Table};
use kp_model::{IpFamily, Protocol};

use crate::state::{KernelState, SetKind};

/// `KUBE-SERVICES` (nat): entry from PREROUTING and OUTPUT.
pub const KUBE_SERVICES: &str = "KUBE-SERVICES";
/// `KUBE-POSTROUTING` (nat): masquerade marked packets.
pub const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
/// `KUBE-NODE-PORT` (nat and filter).
pub const KUBE_NODE_PORT: &str = "KUBE-NODE-PORT";
/// `KUBE-LOAD-BALANCER` (nat).
pub const KUBE_LOAD_BALANCER: &str = "KUBE-LOAD-BALANCER";
/// `KUBE-MARK-MASQ` (nat).
pub const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
/// `KUBE-FORWARD` (filter).
pub const KUBE_FORWARD: &str = "KUBE-FORWARD";
/// `KUBE-PROXY-FIREWALL` (filter).
pub const KUBE_PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
/// `KUBE-SOURCE-RANGES-FIREWALL` (filter).
pub const KUBE_SOURCE_RANGES_FIREWALL: &str = "KUBE-SOURCE-RANGES-FIREWALL";
/// `KUBE-IPVS-FILTER` (filter): other ports of service addresses are closed
/// (upstream issue 72236).
pub const KUBE_IPVS_FILTER: &str = "KUBE-IPVS-FILTER";
/// `KUBE-IPVS-OUT-FILTER` (filter): the node may not reach load balancer IPs
/// whose source ranges exclude it (upstream issue 119656).
pub const KUBE_IPVS_OUT_FILTER: &str = "KUBE-IPVS-OUT-FILTER";

/// The chains of each table, in upstream's order.
pub const NAT_CHAINS: [&str; 5] = [
    KUBE_SERVICES,
    KUBE_POSTROUTING,
    KUBE_NODE_PORT,
    KUBE_LOAD_BALANCER,
    KUBE_MARK_MASQ,
];
/// The filter chains, in upstream's order.
pub const FILTER_CHAINS: [&str; 6] = [
    KUBE_FORWARD,
    KUBE_NODE_PORT,
    KUBE_PROXY_FIREWALL,
    KUBE_SOURCE_RANGES_FIREWALL,
    KUBE_IPVS_FILTER,
    KUBE_IPVS_OUT_FILTER,
];

/// The jump rules from the built-in chains, as upstream ensures them.
pub const JUMP_RULES: [JumpRule; 9] = [
    jump(
        Table::Nat,
        "OUTPUT",
        KUBE_SERVICES,
        "kubernetes service portals",
    ),
    jump(
        Table::Nat,
        "PREROUTING",
        KUBE_SERVICES,
        "kubernetes service portals",
    ),
    jump(
        Table::Nat,
        "POSTROUTING",
        KUBE_POSTROUTING,
        "kubernetes postrouting rules",
    ),
    jump(
        Table::Filter,
        "FORWARD",
        KUBE_FORWARD,
        "kubernetes forwarding rules",
    ),
    jump(
        Table::Filter,
        "INPUT",
        KUBE_NODE_PORT,
        "kubernetes health check rules",
    ),
    jump(
        Table::Filter,
        "INPUT",
        KUBE_PROXY_FIREWALL,
        "kube-proxy firewall rules",
    ),
    jump(
        Table::Filter,
        "FORWARD",
        KUBE_PROXY_FIREWALL,
        "kube-proxy firewall rules",
    ),
    jump(
        Table::Filter,
        "INPUT",
        KUBE_IPVS_FILTER,
        "kubernetes ipvs access filter",
    ),
    jump(
        Table::Filter,
        "OUTPUT",
        KUBE_IPVS_OUT_FILTER,
        "kubernetes ipvs access filter",
    ),
];

/// Settings of the rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleOptions {
    /// The masquerade mark, e.g. `0x00004000`.
    pub masquerade_mark: String,
    /// `masqueradeAll`: mark all traffic to ClusterIPs.
    pub masquerade_all: bool,
    /// Match for traffic not from this cluster's pods (`! -s 10.244.0.0/16`),
    /// when a local-traffic detector is configured.
    pub not_local: Option<String>,
    /// `MASQUERADE --random-fully`.
    pub random_fully: bool,
}

/// A load balancer address whose source ranges do not include the node:
/// the node itself must not reach it through IPVS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoNodeAccess {
    /// The load balancer IP.
    pub address: IpAddr,
    /// The protocol.
    pub protocol: Protocol,
    /// The service port.
    pub port: u16,
}

/// One rule that matches an ipset and jumps somewhere (upstream's
/// `ipsetWithIptablesChain`), written only when the set has members.
struct SetJump {
    set: SetKind,
    table: Table,
    from: &'static str,
    to: &'static str,
    match_type: &'static str,
    protocol: Option<Protocol>,
}

/// Upstream's table; the local NodePort sets come before the others.
const SET_JUMPS: [SetJump; 12] = [
    set_jump(
        SetKind::LoopBack,
        Table::Nat,
        KUBE_POSTROUTING,
        "MASQUERADE",
        "dst,dst,src",
        None,
    ),
    set_jump(
        SetKind::LoadBalancer,
        Table::Nat,
        KUBE_SERVICES,
        KUBE_LOAD_BALANCER,
        "dst,dst",
        None,
    ),
    set_jump(
        SetKind::LoadBalancerLocal,
        Table::Nat,
        KUBE_LOAD_BALANCER,
        "RETURN",
        "dst,dst",
        None,
    ),
    set_jump(
        SetKind::NodePortLocalTcp,
        Table::Nat,
        KUBE_NODE_PORT,
        "RETURN",
        "dst",
        Some(Protocol::Tcp),
    ),
    set_jump(
        SetKind::NodePortTcp,
        Table::Nat,
        KUBE_NODE_PORT,
        KUBE_MARK_MASQ,
        "dst",
        Some(Protocol::Tcp),
    ),
    set_jump(
        SetKind::NodePortLocalUdp,
        Table::Nat,
        KUBE_NODE_PORT,
        "RETURN",
        "dst",
        Some(Protocol::Udp),
    ),
    set_jump(
        SetKind::NodePortUdp,
        Table::Nat,
        KUBE_NODE_PORT,
        KUBE_MARK_MASQ,
        "dst",
        Some(Protocol::Udp),
    ),
    set_jump(
        SetKind::NodePortLocalSctp,
        Table::Nat,
        KUBE_NODE_PORT,
        "RETURN",
        "dst,dst",
        Some(Protocol::Sctp),
    ),
    set_jump(
        SetKind::NodePortSctp,
        Table::Nat,
        KUBE_NODE_PORT,
        KUBE_MARK_MASQ,
        "dst,dst",
        Some(Protocol::Sctp),
    ),
    set_jump(
        SetKind::LoadBalancerFw,
        Table::Filter,
        KUBE_PROXY_FIREWALL,
        KUBE_SOURCE_RANGES_FIREWALL,
        "dst,dst",
        None,
    ),
    set_jump(
        SetKind::LoadBalancerSourceCidr,
        Table::Filter,
        KUBE_SOURCE_RANGES_FIREWALL,
        "RETURN",
        "dst,dst,src",
        None,
    ),
    set_jump(
        SetKind::LoadBalancerSourceIp,
        Table::Filter,
        KUBE_SOURCE_RANGES_FIREWALL,
        "RETURN",
        "dst,dst,src",
        None,
    ),
];

/// Renders the nat and filter tables for `state`.
pub fn render(
    family: IpFamily,
    options: &RuleOptions,
    state: &KernelState,
    no_node_access: &[NoNodeAccess],
) -> String {
    let mut nat = String::with_capacity(4096);
    let mut filter = String::with_capacity(2048);
    let set = |kind: SetKind| kind.name(family);
    let loopback = match family {
        IpFamily::V4 => "127.0.0.0/8",
        IpFamily::V6 => "::1/128",
    };
    line(
        &mut nat,
        format_args!("-A {KUBE_SERVICES} -s {loopback} -j RETURN"),
    );
    for jump in SET_JUMPS.iter().filter(|j| state.has_entries(j.set)) {
        let out = if jump.table == Table::Nat {
            &mut nat
        } else {
            &mut filter
        };
        let protocol = jump
            .protocol
            .map(|p| format!(" -p {}", p.as_rule_str()))
            .unwrap_or_default();
        line(
            out,
            format_args!(
                "-A {}{protocol} -m comment --comment \"{}\" -m set --match-set {} {} -j {}",
                jump.from,
                jump.set.comment(),
                set(jump.set),
                jump.match_type,
                jump.to
            ),
        );
    }
    render_masquerade(&mut nat, family, options, state);
    render_nat_tail(&mut nat, family, options, state);
    render_filter(&mut filter, family, options, no_node_access);

    let mut text = String::with_capacity(nat.len() + filter.len() + 512);
    text.push_str("*nat\n");
    for chain in NAT_CHAINS {
        line(&mut text, format_args!(":{chain} - [0:0]"));
    }
    text.push_str(&nat);
    text.push_str("COMMIT\n*filter\n");
    for chain in FILTER_CHAINS {
        line(&mut text, format_args!(":{chain} - [0:0]"));
    }
    text.push_str(&filter);
    text.push_str("COMMIT\n");
    text
}

/// `text` with `jumps` inserted at the end of their table (before its
/// `COMMIT`), so the jumps appear in the same atomic step as the chains.
pub fn with_jumps(text: &str, jumps: &[JumpRule]) -> String {
    let mut out = String::with_capacity(text.len() + jumps.len() * 96);
    let mut table = None;
    for text_line in text.lines() {
        if let Some(name) = text_line.strip_prefix('*') {
            table = Some(name.to_owned());
        }
        if text_line == "COMMIT" {
            for jump in jumps
                .iter()
                .filter(|j| table.as_deref() == Some(j.table.as_str()))
            {
                line(&mut out, format_args!("{}", jump.insert_line()));
            }
        }
        line(&mut out, format_args!("{text_line}"));
    }
    out
}

/// The ClusterIP and external IP masquerade rules.
fn render_masquerade(
    out: &mut String,
    family: IpFamily,
    options: &RuleOptions,
    state: &KernelState,
) {
    if state.has_entries(SetKind::ClusterIp) {
        let head = format!(
            "-A {KUBE_SERVICES} -m comment --comment \"{}\" -m set --match-set {}",
            SetKind::ClusterIp.comment(),
            SetKind::ClusterIp.name(family)
        );
        if options.masquerade_all {
            line(out, format_args!("{head} dst,dst -j {KUBE_MARK_MASQ}"));
        } else if let Some(not_local) = &options.not_local {
            line(
                out,
                format_args!("{head} dst,dst {not_local} -j {KUBE_MARK_MASQ}"),
            );
        } else {
            // Node-originated traffic gets a VIP source (the VIPs are on
            // kube-ipvs0); masquerading it makes the replies come back.
            line(out, format_args!("{head} src,dst -j {KUBE_MARK_MASQ}"));
        }
    }
    for kind in [SetKind::ExternalIp, SetKind::ExternalIpLocal] {
        if !state.has_entries(kind) {
            continue;
        }
        let head = format!(
            "-A {KUBE_SERVICES} -m comment --comment \"{}\" -m set --match-set {} dst,dst",
            kind.comment(),
            kind.name(family)
        );
        if kind == SetKind::ExternalIp {
            line(out, format_args!("{head} -j {KUBE_MARK_MASQ}"));
        }
        line(
            out,
            format_args!(
                "{head} -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT"
            ),
        );
        line(
            out,
            format_args!("{head} -m addrtype --dst-type LOCAL -j ACCEPT"),
        );
    }
}

/// NodePort dispatch, load balancer marking, accepting IPVS traffic, and
/// the postrouting and mark chains.
fn render_nat_tail(out: &mut String, family: IpFamily, options: &RuleOptions, state: &KernelState) {
    line(
        out,
        format_args!("-A {KUBE_SERVICES} -m addrtype --dst-type LOCAL -j {KUBE_NODE_PORT}"),
    );
    line(
        out,
        format_args!("-A {KUBE_LOAD_BALANCER} -j {KUBE_MARK_MASQ}"),
    );
    for kind in [SetKind::ClusterIp, SetKind::LoadBalancer] {
        if state.has_entries(kind) {
            line(
                out,
                format_args!(
                    "-A {KUBE_SERVICES} -m set --match-set {} dst,dst -j ACCEPT",
                    kind.name(family)
                ),
            );
        }
    }
    let mark = &options.masquerade_mark;
    line(
        out,
        format_args!("-A {KUBE_POSTROUTING} -m mark ! --mark {mark}/{mark} -j RETURN"),
    );
    line(
        out,
        format_args!("-A {KUBE_POSTROUTING} -j MARK --xor-mark {mark}"),
    );
    let random = if options.random_fully {
        " --random-fully"
    } else {
        ""
    };
    line(
        out,
        format_args!("-A {KUBE_POSTROUTING} -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE{random}"),
    );
    line(
        out,
        format_args!("-A {KUBE_MARK_MASQ} -j MARK --or-mark {mark}"),
    );
}

fn render_filter(
    out: &mut String,
    family: IpFamily,
    options: &RuleOptions,
    no_node_access: &[NoNodeAccess],
) {
    let set = |kind: SetKind| kind.name(family);
    line(
        out,
        format_args!("-A {KUBE_SOURCE_RANGES_FIREWALL} -j DROP"),
    );
    for entry in no_node_access {
        line(
            out,
            format_args!(
                "-A {KUBE_IPVS_OUT_FILTER} -s {ip} -m ipvs --vaddr {ip} --vproto {proto} --vport {port} -j DROP",
                ip = entry.address,
                proto = entry.protocol.as_rule_str(),
                port = entry.port
            ),
        );
    }
    let mark = &options.masquerade_mark;
    line(
        out,
        format_args!("-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {mark}/{mark} -j ACCEPT"),
    );
    line(
        out,
        format_args!("-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"),
    );
    line(
        out,
        format_args!(
            "-A {KUBE_NODE_PORT} -m comment --comment \"{}\" -m set --match-set {} dst -j ACCEPT",
            SetKind::HealthCheckNodePort.comment(),
            set(SetKind::HealthCheckNodePort)
        ),
    );
    for (kind, match_type) in [
        (SetKind::LoadBalancer, "dst,dst"),
        (SetKind::ClusterIp, "dst,dst"),
        (SetKind::ExternalIp, "dst,dst"),
        (SetKind::ExternalIpLocal, "dst,dst"),
        (SetKind::HealthCheckNodePort, "dst"),
    ] {
        line(
            out,
            format_args!(
                "-A {KUBE_IPVS_FILTER} -m set --match-set {} {match_type} -j RETURN",
                set(kind)
            ),
        );
    }
    line(
        out,
        format_args!(
            "-A {KUBE_IPVS_FILTER} -m conntrack --ctstate NEW -m set --match-set {} dst -j REJECT",
            set(SetKind::IpvsIps)
        ),
    );
}

fn line(out: &mut String, args: std::fmt::Arguments<'_>) {
    // Writing to a String cannot fail.
    let _ = out.write_fmt(args);
    out.push('\n');
}

const fn jump(
    table: Table,
    builtin_chain: &'static str,
    target_chain: &'static str,
    comment: &'static str,
) -> JumpRule {
    JumpRule {
        table,
        builtin_chain,
        target_chain,
        comment: Some(comment),
        only_new: false,
        shared_with_kubelet: false,
    }
}

const fn set_jump(
    set: SetKind,
    table: Table,
    from: &'static str,
    to: &'static str,
    match_type: &'static str,
    protocol: Option<Protocol>,
) -> SetJump {
    SetJump {
        set,
        table,
        from,
        to,
        match_type,
        protocol,
    }
}
