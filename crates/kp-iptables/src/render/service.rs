//! Rules of one service port, following upstream `syncProxyRules` rule for
//! rule: entry rules in the top-level chains first (always written), then
//! the service port's own chains (written only when it is rewritten).

use std::fmt::{self, Write as _};
use std::net::SocketAddr;
use std::sync::Arc;

use kp_model::{Endpoint, Refusal, TrafficPlan};

use super::{Buffers, Context, Out, ServicePortState, NFACCT_LOCALHOST_NODE_PORTS};
use crate::names::{
    CachedService, ChainKind, ChainName, KUBE_EXTERNAL_SERVICES, KUBE_MARK_MASQ, KUBE_NODEPORTS,
    KUBE_PROXY_FIREWALL, KUBE_SERVICES,
};

/// One service port as the renderer sees it.
pub(super) struct ServiceView<'a> {
    pub state: &'a ServicePortState,
    /// `ns/name:port` (upstream `ServicePortName.String()`).
    pub name: &'a str,
    pub names: &'a CachedService,
    pub protocol: &'static str,
    /// Write the service port's own chains (false: only count them).
    pub rewrite: bool,
}

/// The shared traffic decisions of a service port with the chains that
/// carry them out.
#[derive(Debug)]
struct Plan {
    traffic: TrafficPlan,
    cluster_chain: ChainName,
    local_chain: ChainName,
    internal_chain: ChainName,
    external_policy_chain: ChainName,
    external_chain: ChainName,
    firewall_chain: ChainName,
    load_balancer_chain: ChainName,
}

/// `"ns/svc:port has no endpoints"` with its quotes.
struct RefusalComment<'a>(&'a str, Refusal);

/// The target that refuses traffic: REJECT when the Service has no
/// endpoint at all, DROP when the Local policy allows none on this node.
fn refusal_target(refusal: Refusal) -> &'static str {
    match refusal {
        Refusal::NoEndpoints => "REJECT",
        Refusal::NoLocalEndpoints => "DROP",
    }
}

impl fmt::Display for RefusalComment<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.1 {
            Refusal::NoEndpoints => write!(f, "\"{} has no endpoints\"", self.0),
            Refusal::NoLocalEndpoints => write!(f, "\"{} has no local endpoints\"", self.0),
        }
    }
}

/// Writes every rule of one service port. `service.rewrite` is false for
/// an unchanged service port in a partial render: its own chains are then
/// only counted, not written.
pub(super) fn render_service(
    ctx: &Context<'_>,
    buffers: &mut Buffers,
    service: &ServiceView<'_>,
    active: &mut Vec<ChainName>,
) {
    let plan = Plan::new(service);
    write_cluster_ip_rules(buffers, service, &plan);
    write_external_ip_rules(buffers, service, &plan);
    write_load_balancer_rules(buffers, service, &plan);
    write_node_port_rules(ctx, buffers, service, &plan);

    buffers.nat_chains.discard = !service.rewrite;
    buffers.nat_rules.discard = !service.rewrite;
    write_internal_masquerade(ctx, &mut buffers.nat_rules, service, &plan);
    write_external_chain(ctx, buffers, service, &plan, active);
    write_firewall_chain(buffers, service, &plan, active);
    let endpoints = &service.state.endpoints;
    if plan.traffic.uses_cluster_endpoints {
        write_policy_chain(
            ctx,
            buffers,
            service,
            plan.cluster_chain,
            &endpoints.cluster,
            active,
        );
    }
    if plan.traffic.uses_local_endpoints {
        write_policy_chain(
            ctx,
            buffers,
            service,
            plan.local_chain,
            &endpoints.local,
            active,
        );
    }
    write_endpoint_chains(ctx, buffers, service, active);
    buffers.nat_chains.discard = false;
    buffers.nat_rules.discard = false;
}

impl Plan {
    fn new(service: &ServiceView<'_>) -> Plan {
        let traffic = service.state.plan;
        let names = service.names;
        let cluster_chain = names.chain(ChainKind::Cluster);
        let local_chain = names.chain(ChainKind::Local);
        let external_chain = names.chain(ChainKind::External);
        let firewall_chain = names.chain(ChainKind::Firewall);
        let pick = |local: bool| if local { local_chain } else { cluster_chain };
        Plan {
            traffic,
            cluster_chain,
            local_chain,
            internal_chain: pick(traffic.internal_policy_local),
            external_policy_chain: pick(traffic.external_policy_local),
            external_chain,
            firewall_chain,
            load_balancer_chain: if traffic.uses_source_ranges_filter {
                firewall_chain
            } else {
                external_chain
            },
        }
    }
}

fn write_cluster_ip_rules(buffers: &mut Buffers, service: &ServiceView<'_>, plan: &Plan) {
    let (name, p) = (service.name, service.protocol);
    let (ip, port) = (service.state.port.cluster_ip, service.state.port.port);
    if plan.traffic.has_internal_endpoints {
        emit!(
            &mut buffers.nat_rules,
            "-A {KUBE_SERVICES} -m comment --comment \"{name} cluster IP\" -m {p} -p {p} -d {ip} --dport {port} -j {}",
            plan.internal_chain
        );
    } else {
        let refusal = plan.traffic.refusal();
        emit!(
            &mut buffers.filter_rules,
            "-A {KUBE_SERVICES} -m comment --comment {} -m {p} -p {p} -d {ip} --dport {port} -j {}",
            RefusalComment(name, refusal),
            refusal_target(refusal)
        );
    }
}

fn write_external_ip_rules(buffers: &mut Buffers, service: &ServiceView<'_>, plan: &Plan) {
    let (name, p) = (service.name, service.protocol);
    let port = service.state.port.port;
    let refusal = plan.traffic.refusal();
    for ip in &service.state.port.external_ips {
        if plan.traffic.has_endpoints {
            emit!(
                &mut buffers.nat_rules,
                "-A {KUBE_SERVICES} -m comment --comment \"{name} external IP\" -m {p} -p {p} -d {ip} --dport {port} -j {}",
                plan.external_chain
            );
        }
        if !plan.traffic.has_external_endpoints {
            // Either no endpoints at all (REJECT), or none for external
            // traffic: DROP what the EXT chain did not short-circuit.
            emit!(
                &mut buffers.filter_rules,
                "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {} -m {p} -p {p} -d {ip} --dport {port} -j {}",
                RefusalComment(name, refusal),
                refusal_target(refusal)
            );
        }
    }
}

fn write_load_balancer_rules(buffers: &mut Buffers, service: &ServiceView<'_>, plan: &Plan) {
    let (name, p) = (service.name, service.protocol);
    let port = service.state.port.port;
    let lb_ips = &service.state.port.load_balancer_ips;
    for ip in lb_ips {
        if plan.traffic.has_endpoints {
            emit!(
                &mut buffers.nat_rules,
                "-A {KUBE_SERVICES} -m comment --comment \"{name} loadbalancer IP\" -m {p} -p {p} -d {ip} --dport {port} -j {}",
                plan.load_balancer_chain
            );
        }
        if plan.traffic.uses_source_ranges_filter {
            emit!(
                &mut buffers.filter_rules,
                "-A {KUBE_PROXY_FIREWALL} -m comment --comment \"{name} traffic not accepted by {}\" -m {p} -p {p} -d {ip} --dport {port} -j DROP",
                plan.firewall_chain
            );
        }
    }
    if !plan.traffic.has_external_endpoints {
        let refusal = plan.traffic.refusal();
        for ip in lb_ips {
            emit!(
                &mut buffers.filter_rules,
                "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {} -m {p} -p {p} -d {ip} --dport {port} -j {}",
                RefusalComment(name, refusal),
                refusal_target(refusal)
            );
        }
    }
}

fn write_node_port_rules(
    ctx: &Context<'_>,
    buffers: &mut Buffers,
    service: &ServiceView<'_>,
    plan: &Plan,
) {
    let (name, p) = (service.name, service.protocol);
    if let Some(node_port) = service.state.port.node_port {
        let ext = plan.external_chain;
        if plan.traffic.has_endpoints {
            let nat = &mut buffers.nat_rules;
            if ctx.localhost_node_ports && ctx.nfacct_localhost_node_ports {
                emit!(
                    nat,
                    "-A {KUBE_NODEPORTS} -m comment --comment {name} -m {p} -p {p} -d 127.0.0.0/8 --dport {node_port} -m nfacct --nfacct-name {NFACCT_LOCALHOST_NODE_PORTS} -j {ext}"
                );
            }
            // NodePorts are not subject to loadBalancerSourceRanges, for
            // better or worse, and that cannot change now.
            emit!(
                nat,
                "-A {KUBE_NODEPORTS} -m comment --comment {name} -m {p} -p {p} --dport {node_port} -j {ext}"
            );
        }
        if !plan.traffic.has_external_endpoints {
            let refusal = plan.traffic.refusal();
            emit!(
                &mut buffers.filter_rules,
                "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {} -m addrtype --dst-type LOCAL -m {p} -p {p} --dport {node_port} -j {}",
                RefusalComment(name, refusal),
                refusal_target(refusal)
            );
        }
    }
    if let Some(health_port) = service.state.port.health_check_node_port {
        // Accepted whether or not the node has local endpoints: the health
        // check is how the load balancer learns that it has none.
        emit!(
            &mut buffers.filter_rules,
            "-A {KUBE_NODEPORTS} -m comment --comment \"{name} health check node port\" -m tcp -p tcp --dport {health_port} -j ACCEPT"
        );
    }
}

/// Masquerades ClusterIP traffic from outside the cluster (or everything,
/// with masqueradeAll): it may have been routed here by a static route for
/// the service range and could bounce off-node.
fn write_internal_masquerade(
    ctx: &Context<'_>,
    nat: &mut Out,
    service: &ServiceView<'_>,
    plan: &Plan,
) {
    if !plan.traffic.has_internal_endpoints {
        return;
    }
    let (name, p) = (service.name, service.protocol);
    let (ip, port) = (service.state.port.cluster_ip, service.state.port.port);
    let chain = plan.internal_chain;
    if ctx.masquerade_all {
        emit!(
            nat,
            "-A {chain} -m comment --comment \"{name} cluster IP\" -m {p} -p {p} -d {ip} --dport {port} -j {KUBE_MARK_MASQ}"
        );
    } else if let Some(detector) = &ctx.detector {
        emit!(
            nat,
            "-A {chain} -m comment --comment \"{name} cluster IP\" -m {p} -p {p} -d {ip} --dport {port} {} -j {KUBE_MARK_MASQ}",
            detector.if_not_local
        );
    }
}

fn write_external_chain(
    ctx: &Context<'_>,
    buffers: &mut Buffers,
    service: &ServiceView<'_>,
    plan: &Plan,
    active: &mut Vec<ChainName>,
) {
    if !plan.traffic.uses_external_path {
        return;
    }
    let (ext, svc, name) = (plan.external_chain, plan.cluster_chain, service.name);
    emit!(&mut buffers.nat_chains, ":{ext} - [0:0]");
    active.push(ext);
    let nat = &mut buffers.nat_rules;
    if !plan.traffic.external_policy_local {
        // Cluster endpoints may be on another node: masquerade so replies
        // come back through this one.
        emit!(
            nat,
            "-A {ext} -m comment --comment \"masquerade traffic for {name} external destinations\" -j {KUBE_MARK_MASQ}"
        );
    } else {
        if let Some(detector) = &ctx.detector {
            // Pods reaching an external address bypass both policies, as if
            // they had gone out to the load balancer and come back.
            emit!(
                nat,
                "-A {ext} -m comment --comment \"pod traffic for {name} external destinations\" {} -j {svc}",
                detector.if_local
            );
        }
        // The host itself picks the external address as source, so its
        // traffic must be masqueraded and may use any endpoint.
        emit!(
            nat,
            "-A {ext} -m comment --comment \"masquerade LOCAL traffic for {name} external destinations\" -m addrtype --src-type LOCAL -j {KUBE_MARK_MASQ}"
        );
        emit!(
            nat,
            "-A {ext} -m comment --comment \"route LOCAL traffic for {name} external destinations\" -m addrtype --src-type LOCAL -j {svc}"
        );
    }
    if plan.traffic.has_external_endpoints {
        emit!(nat, "-A {ext} -j {}", plan.external_policy_chain);
    }
}

fn write_firewall_chain(
    buffers: &mut Buffers,
    service: &ServiceView<'_>,
    plan: &Plan,
    active: &mut Vec<ChainName>,
) {
    if !plan.traffic.uses_source_ranges_filter {
        return;
    }
    let (fw, ext, name) = (plan.firewall_chain, plan.external_chain, service.name);
    emit!(&mut buffers.nat_chains, ":{fw} - [0:0]");
    active.push(fw);
    let port = &*service.state.port;
    let nat = &mut buffers.nat_rules;
    for range in &port.load_balancer_source_ranges {
        let range = range.trunc();
        emit!(
            nat,
            "-A {fw} -m comment --comment \"{name} loadbalancer IP\" -s {range} -j {ext}"
        );
    }
    if plan.traffic.source_ranges_admit_node {
        for ip in &port.load_balancer_ips {
            emit!(
                nat,
                "-A {fw} -m comment --comment \"{name} loadbalancer IP\" -s {ip} -j {ext}"
            );
        }
    }
    // A packet reaching the end was not DNATed, so KUBE-PROXY-FIREWALL in
    // the filter table drops it.
    emit!(
        nat,
        "-A {fw} -m comment --comment \"other traffic to {name} will be dropped by KUBE-PROXY-FIREWALL\""
    );
}

/// KUBE-SVC- or KUBE-SVL-: session affinity checks, then random balancing
/// with probabilities 1/n, 1/(n-1), …, the last rule unconditional.
fn write_policy_chain(
    ctx: &Context<'_>,
    buffers: &mut Buffers,
    service: &ServiceView<'_>,
    chain: ChainName,
    endpoints: &[Arc<Endpoint>],
    active: &mut Vec<ChainName>,
) {
    emit!(&mut buffers.nat_chains, ":{chain} - [0:0]");
    active.push(chain);
    let name = service.name;
    let resolved = || {
        endpoints
            .iter()
            .filter_map(|ep| service.names.endpoint(&SocketAddr::new(ep.ip, ep.port)))
    };
    let nat = &mut buffers.nat_rules;
    if let Some(timeout) = service.state.port.session_affinity_timeout {
        let seconds = timeout.as_secs();
        for ep in resolved() {
            let comment = ArrowComment(ctx.large_cluster_mode, name, &ep.address);
            let sep = ep.chain;
            emit!(nat, "-A {chain} {comment}-m recent --name {sep} --rcheck --seconds {seconds} --reap -j {sep}");
        }
    }
    let count = resolved().count();
    for (i, ep) in resolved().enumerate() {
        let comment = ArrowComment(ctx.large_cluster_mode, name, &ep.address);
        let sep = ep.chain;
        match ctx.probabilities.get(count - i).filter(|_| i + 1 < count) {
            Some(probability) => emit!(
                nat,
                "-A {chain} {comment}-m statistic --mode random --probability {probability} -j {sep}"
            ),
            None => emit!(nat, "-A {chain} {comment}-j {sep}"),
        }
    }
}

/// One KUBE-SEP- chain per reachable endpoint: masquerade hairpin traffic
/// (a pod reaching itself through the Service), then DNAT.
fn write_endpoint_chains(
    ctx: &Context<'_>,
    buffers: &mut Buffers,
    service: &ServiceView<'_>,
    active: &mut Vec<ChainName>,
) {
    let (name, p) = (service.name, service.protocol);
    let affinity = service.state.port.session_affinity_timeout.is_some();
    for endpoint in &service.state.endpoints.all_reachable {
        let address = SocketAddr::new(endpoint.ip, endpoint.port);
        let Some(ep) = service.names.endpoint(&address) else {
            continue; // unreachable: the renderer touched every reachable endpoint
        };
        let sep = ep.chain;
        emit!(&mut buffers.nat_chains, ":{sep} - [0:0]");
        active.push(sep);
        let comment = NameComment(ctx.large_cluster_mode, name);
        let nat = &mut buffers.nat_rules;
        emit!(
            nat,
            "-A {sep} {comment}-s {} -j {KUBE_MARK_MASQ}",
            endpoint.ip
        );
        let recent = if affinity {
            format!("-m recent --name {sep} --set ")
        } else {
            String::new()
        };
        emit!(
            nat,
            "-A {sep} {comment}{recent}-m {p} -p {p} -j DNAT --to-destination {}",
            ep.address
        );
    }
}

/// `-m comment --comment ns/svc:port ` unless comments are left out.
struct NameComment<'a>(bool, &'a str);

/// `-m comment --comment "ns/svc:port -> ip:port" ` unless comments are left out.
struct ArrowComment<'a>(bool, &'a str, &'a SocketAddr);

impl fmt::Display for NameComment<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NameComment(true, _) => Ok(()),
            NameComment(false, name) => write!(f, "-m comment --comment {name} "),
        }
    }
}

impl fmt::Display for ArrowComment<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArrowComment(true, ..) => Ok(()),
            ArrowComment(false, name, address) => {
                write!(f, "-m comment --comment \"{name} -> {address}\" ")
            }
        }
    }
}
