//! The portal rules: nat rules that send traffic for a Service address to
//! the proxy's listener of that service port, rendered as
//! iptables-restore input. Pure: the same input gives the same text.
//!
//! The chains are those of upstream's userspace proxier, so either
//! implementation's `--cleanup` removes the other's:
//!
//! | chain | jumped to from | holds |
//! |---|---|---|
//! | `KUBE-PORTALS-CONTAINER` | nat `PREROUTING` (first) | ClusterIP, external IP and load balancer IP of each port → `REDIRECT` to the listener |
//! | `KUBE-PORTALS-HOST` | nat `OUTPUT` (first) | the same for the node's own traffic → `DNAT` to node IP:listener |
//! | `KUBE-NODEPORT-CONTAINER` | nat `PREROUTING` (last) | NodePorts on local addresses → `REDIRECT` |
//! | `KUBE-NODEPORT-HOST` | nat `OUTPUT` (last) | the same for the node's own traffic → `DNAT` |
//!
//! Why `REDIRECT` for traffic that arrives and `DNAT` to the node IP for
//! traffic the node sends: `REDIRECT` in `OUTPUT` rewrites the destination
//! to the loopback address, and a UDP answer then leaves from another
//! address than the one conntrack expects (upstream's finding). Without
//! a node IP the host chains `REDIRECT` too, which still serves TCP.
//!
//! Differences from upstream's rules, all in the rule text only: the
//! `-m addrtype --dst-type LOCAL` match of the NodePort chains sits in each
//! NodePort rule rather than in the jump, so that the jumps have the
//! plain shape [`kp_iptables::JumpRule`] describes; external IPs are
//! matched without upstream's `-m physdev ! --physdev-is-in` (the
//! `br_netfilter` module is not on every node, and the iptables mode
//! matches them without it as well); a TCP service port without endpoints
//! is redirected to the relay's refusing port, so its clients get a reset
//! at once.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Arc;

use kp_iptables::{JumpRule, Table};
use kp_model::rule_text::write_service_port_comment;
use kp_model::{IpFamily, Protocol, ServicePort, ServicePortName};

/// Chain for Service addresses, traffic arriving at the node.
pub const KUBE_PORTALS_CONTAINER: &str = "KUBE-PORTALS-CONTAINER";
/// Chain for Service addresses, traffic from the node itself.
pub const KUBE_PORTALS_HOST: &str = "KUBE-PORTALS-HOST";
/// Chain for NodePorts, traffic arriving at the node.
pub const KUBE_NODEPORT_CONTAINER: &str = "KUBE-NODEPORT-CONTAINER";
/// Chain for NodePorts, traffic from the node itself.
pub const KUBE_NODEPORT_HOST: &str = "KUBE-NODEPORT-HOST";
/// The four portal chains, in the order they are declared.
pub const PORTAL_CHAINS: [&str; 4] = [
    KUBE_PORTALS_CONTAINER,
    KUBE_PORTALS_HOST,
    KUBE_NODEPORT_CONTAINER,
    KUBE_NODEPORT_HOST,
];

const PORTALS_COMMENT: &str = "handle ClusterIPs; NOTE: this must be before the NodePort rules";
const NODE_PORTS_COMMENT: &str =
    "handle service NodePorts; NOTE: this must be the last rule in the chain";

/// The jumps from the built-in nat chains into the portal chains. The
/// first two are inserted at the top of their chain, the last two appended.
pub const PORTAL_JUMPS: [JumpRule; 4] = [
    portal_jump("PREROUTING", KUBE_PORTALS_CONTAINER, PORTALS_COMMENT),
    portal_jump("OUTPUT", KUBE_PORTALS_HOST, PORTALS_COMMENT),
    portal_jump("PREROUTING", KUBE_NODEPORT_CONTAINER, NODE_PORTS_COMMENT),
    portal_jump("OUTPUT", KUBE_NODEPORT_HOST, NODE_PORTS_COMMENT),
];

/// Everything the portal rules depend on.
#[derive(Debug, Clone, Copy)]
pub struct PortalInput<'a> {
    /// The family the rules are for.
    pub family: IpFamily,
    /// The node IP the host chains `DNAT` to; `REDIRECT` without one.
    pub node_ip: Option<IpAddr>,
    /// The relay's refusing TCP port, for TCP service ports without
    /// endpoints.
    pub refusing_port: Option<u16>,
    /// Every service port with an open listener, sorted by name.
    pub services: &'a [PortalService],
    /// What to write of the jumps from the built-in chains.
    pub jumps: JumpLines,
}

/// The jump lines of one restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JumpLines {
    /// None: the rules of the portal chains only.
    Omit,
    /// Insert them (`-I`, `-A`), for built-in chains that do not hold them.
    Insert,
    /// Delete each and insert it again (`-D` then `-I`/`-A`), in the same
    /// transaction: the jumps stay in place, first (or last) in their
    /// chains, and when one is missing (someone flushed the nat table) the
    /// kernel refuses the whole restore, which tells the backend to insert
    /// them afresh. `iptables-restore` has no `-C`; this is its check.
    Replace,
}

/// One service port with its listener.
#[derive(Debug, Clone, PartialEq)]
pub struct PortalService {
    /// The service port's name (rule comments).
    pub name: ServicePortName,
    /// The service port.
    pub port: Arc<ServicePort>,
    /// The listener's port.
    pub proxy_port: u16,
    /// Whether some traffic has an endpoint to go to.
    pub has_endpoints: bool,
}

/// Renders the nat table's portal chains (flushed and refilled: every
/// chain is declared) as one iptables-restore section ending in `COMMIT`.
pub fn render_portals(input: &PortalInput<'_>) -> String {
    let mut out = String::with_capacity(256 + input.services.len() * 512);
    out.push_str("*nat\n");
    for chain in PORTAL_CHAINS {
        let _ = writeln!(out, ":{chain} - [0:0]");
    }
    if input.jumps != JumpLines::Omit {
        for (index, jump) in PORTAL_JUMPS.iter().enumerate() {
            let append = jump.restore_line();
            if input.jumps == JumpLines::Replace {
                let spec = append.strip_prefix("-A ").unwrap_or(&append);
                let _ = writeln!(out, "-D {spec}");
            }
            let line = if index < 2 {
                jump.insert_line()
            } else {
                append
            };
            out.push_str(&line);
            out.push('\n');
        }
    }
    for service in input.services {
        render_service(&mut out, input, service);
    }
    out.push_str("COMMIT\n");
    out
}

/// The rules of one service port.
fn render_service(out: &mut String, input: &PortalInput<'_>, service: &PortalService) {
    let port = &service.port;
    let target_port = match (service.has_endpoints, port.protocol, input.refusing_port) {
        (false, Protocol::Tcp, Some(refusing)) => refusing,
        _ => service.proxy_port,
    };
    let mut portal_ips = vec![port.cluster_ip];
    portal_ips.extend(&port.external_ips);
    portal_ips.extend(&port.load_balancer_ips);
    for ip in portal_ips {
        let matches = Matches {
            name: &service.name,
            protocol: port.protocol,
            port: port.port,
            destination: Some(ip),
        };
        rule(
            out,
            KUBE_PORTALS_CONTAINER,
            &matches,
            &redirect(target_port),
        );
        rule(
            out,
            KUBE_PORTALS_HOST,
            &matches,
            &host_target(input, target_port),
        );
    }
    if let Some(node_port) = port.node_port {
        let matches = Matches {
            name: &service.name,
            protocol: port.protocol,
            port: node_port,
            destination: None,
        };
        rule(
            out,
            KUBE_NODEPORT_CONTAINER,
            &matches,
            &redirect(target_port),
        );
        rule(
            out,
            KUBE_NODEPORT_HOST,
            &matches,
            &host_target(input, target_port),
        );
    }
}

/// The match part of a portal rule.
struct Matches<'a> {
    name: &'a ServicePortName,
    protocol: Protocol,
    port: u16,
    /// The Service address; `None` for a NodePort (any local address).
    destination: Option<IpAddr>,
}

fn rule(out: &mut String, chain: &str, matches: &Matches<'_>, target: &str) {
    let protocol = match matches.protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    };
    let _ = write!(out, "-A {chain} -m comment --comment \"");
    write_service_port_comment(out, matches.name);
    let _ = write!(
        out,
        "\" -p {protocol} -m {protocol} --dport {}",
        matches.port
    );
    match matches.destination {
        Some(ip) => {
            let prefix = if ip.is_ipv4() { 32 } else { 128 };
            let _ = write!(out, " -d {ip}/{prefix}");
        }
        None => out.push_str(" -m addrtype --dst-type LOCAL"),
    }
    let _ = writeln!(out, " {target}");
}

fn redirect(port: u16) -> String {
    format!("-j REDIRECT --to-ports {port}")
}

fn host_target(input: &PortalInput<'_>, port: u16) -> String {
    match input.node_ip {
        Some(IpAddr::V4(ip)) => format!("-j DNAT --to-destination {ip}:{port}"),
        Some(IpAddr::V6(ip)) => format!("-j DNAT --to-destination [{ip}]:{port}"),
        None => redirect(port),
    }
}

const fn portal_jump(
    builtin_chain: &'static str,
    target_chain: &'static str,
    comment: &'static str,
) -> JumpRule {
    JumpRule {
        table: Table::Nat,
        builtin_chain,
        target_chain,
        comment: Some(comment),
        only_new: false,
        shared_with_kubelet: false,
    }
}

#[cfg(test)]
#[path = "portal_tests.rs"]
mod tests;
