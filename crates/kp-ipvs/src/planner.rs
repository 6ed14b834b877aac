//! The planner: from the service ports of one sync to the kernel state the
//! IPVS mode wants — addresses on `kube-ipvs0`, virtual servers with real
//! servers, ipset members — and the iptables rules that go with it
//! ([`crate::rules`]). Pure: the same input gives the same plan.
//!
//! Upstream's `syncProxyRules` (pkg/proxy/ipvs/proxier.go) decides per
//! service port: the ClusterIP gets a virtual server balancing over the
//! endpoints internal traffic may use; every external IP and load balancer
//! IP gets one over the endpoints external traffic may use, and so does
//! every node address for a NodePort. The traffic decisions themselves come
//! from [`kp_model::TrafficPlan`] and the categorized endpoints.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use kp_model::{Endpoint, IpFamily, Protocol, ServicePort, ServicePortName, TrafficPlan};
use kp_sync::ServicePortState;

use crate::rules::{self, NoNodeAccess, RuleOptions};
use crate::state::{
    KernelState, ServiceKey, ServiceState, SetEntry, SetKind, VirtualServer, FLAG_PERSISTENT,
    FLAG_SOURCE_HASH,
};

/// What the planner needs besides the service ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanInput<'a> {
    /// The family of this plan.
    pub family: IpFamily,
    /// The scheduler of every virtual server (`rr` when unset).
    pub scheduler: &'a str,
    /// The node's addresses of this family that are not on kube-ipvs0: an
    /// external or load balancer IP among them is not bound to kube-ipvs0.
    pub node_addresses: &'a [IpAddr],
    /// The addresses NodePorts answer on (virtual servers per address).
    pub node_port_addresses: &'a [IpAddr],
    /// Masquerade and local-traffic settings of the iptables rules.
    pub rules: &'a RuleOptions,
}

/// The planned state and rules for one family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The kernel objects.
    pub state: KernelState,
    /// iptables-restore input for the nat and filter tables (without the
    /// jump rules from the built-in chains).
    pub iptables: String,
}

/// Builds the plan for `service_ports` (sorted by name).
pub fn plan<'p>(
    input: &PlanInput<'_>,
    service_ports: impl IntoIterator<Item = (&'p ServicePortName, &'p ServicePortState)>,
) -> Plan {
    let mut state = KernelState::empty();
    let mut no_node_access = Vec::new();
    for (name, port_state) in service_ports {
        plan_service_port(input, name, port_state, &mut state, &mut no_node_access);
    }
    let ipvs_ips: Vec<IpAddr> = state.addresses.iter().copied().collect();
    for address in ipvs_ips {
        state.add_entry(SetKind::IpvsIps, SetEntry::Ip(address));
    }
    let iptables = rules::render(input.family, input.rules, &state, &no_node_access);
    Plan { state, iptables }
}

/// The kernel objects of one service port alone (without the
/// `KUBE-IPVS-IPS` members, which follow the addresses): what tells which
/// Service an operation belongs to.
pub fn plan_one(
    input: &PlanInput<'_>,
    name: &ServicePortName,
    port_state: &ServicePortState,
) -> KernelState {
    let mut state = KernelState::default();
    plan_service_port(input, name, port_state, &mut state, &mut Vec::new());
    state
}

/// The virtual server settings every address of `port` shares.
pub fn virtual_server(scheduler: &str, port: &ServicePort) -> VirtualServer {
    let mut flags = 0;
    let mut timeout_secs = 0;
    if port.session_affinity_timeout.is_some() {
        flags |= FLAG_PERSISTENT;
        timeout_secs = u32::try_from(port.session_affinity_timeout_secs()).unwrap_or(u32::MAX);
    }
    if scheduler == "mh" {
        flags |= FLAG_SOURCE_HASH;
    }
    VirtualServer {
        scheduler: scheduler.to_owned(),
        flags,
        timeout_secs,
    }
}

fn plan_service_port(
    input: &PlanInput<'_>,
    name: &ServicePortName,
    port_state: &ServicePortState,
    state: &mut KernelState,
    no_node_access: &mut Vec<NoNodeAccess>,
) {
    let port = &*port_state.port;
    let endpoints = &port_state.endpoints;
    let traffic = port_state.plan;
    let server = virtual_server(input.scheduler, port);
    let internal = endpoints.for_internal_traffic(port);
    let external = endpoints.for_traffic_from_outside(port);
    let protocol = name.protocol;
    for endpoint in port_state.all_endpoints.iter().filter(|e| e.is_local) {
        state.add_entry(
            SetKind::LoopBack,
            SetEntry::IpPortIp(endpoint.ip, protocol, endpoint.port, endpoint.ip),
        );
    }

    let cluster = ServiceKey {
        address: port.cluster_ip,
        protocol,
        port: port.port,
    };
    state.add_entry(
        SetKind::ClusterIp,
        SetEntry::IpPort(port.cluster_ip, protocol, port.port),
    );
    add_service(state, cluster, &server, internal, true);

    for &address in &port.external_ips {
        let kind = if traffic.external_policy_local {
            SetKind::ExternalIpLocal
        } else {
            SetKind::ExternalIp
        };
        state.add_entry(kind, SetEntry::IpPort(address, protocol, port.port));
        let key = ServiceKey { address, ..cluster };
        let bind = !input.node_addresses.contains(&address);
        add_service(state, key, &server, external, bind);
    }

    for &address in &port.load_balancer_ips {
        plan_load_balancer_ip(port, address, traffic, state, no_node_access);
        let key = ServiceKey { address, ..cluster };
        let bind = !input.node_addresses.contains(&address);
        add_service(state, key, &server, external, bind);
    }

    if let Some(node_port) = port.node_port {
        plan_node_port(input, protocol, node_port, traffic, state);
        for &address in input.node_port_addresses {
            let key = ServiceKey {
                address,
                protocol,
                port: node_port,
            };
            add_service(state, key, &server, external, false);
        }
    }
    if let Some(health) = port.health_check_node_port {
        state.add_entry(SetKind::HealthCheckNodePort, SetEntry::Port(health));
    }
}

fn plan_load_balancer_ip(
    port: &ServicePort,
    address: IpAddr,
    traffic: TrafficPlan,
    state: &mut KernelState,
    no_node_access: &mut Vec<NoNodeAccess>,
) {
    let protocol = port.protocol;
    let entry = SetEntry::IpPort(address, protocol, port.port);
    state.add_entry(SetKind::LoadBalancer, entry);
    if traffic.external_policy_local {
        state.add_entry(SetKind::LoadBalancerLocal, entry);
    }
    if port.load_balancer_source_ranges.is_empty() {
        return;
    }
    state.add_entry(SetKind::LoadBalancerFw, entry);
    for range in &port.load_balancer_source_ranges {
        state.add_entry(
            SetKind::LoadBalancerSourceCidr,
            SetEntry::IpPortNet(address, protocol, port.port, range.trunc()),
        );
    }
    if traffic.source_ranges_admit_node {
        state.add_entry(
            SetKind::LoadBalancerSourceIp,
            SetEntry::IpPortIp(address, protocol, port.port, address),
        );
    } else {
        no_node_access.push(NoNodeAccess {
            address,
            protocol,
            port: port.port,
        });
    }
}

fn plan_node_port(
    input: &PlanInput<'_>,
    protocol: Protocol,
    node_port: u16,
    traffic: TrafficPlan,
    state: &mut KernelState,
) {
    let (all, local) = match protocol {
        Protocol::Tcp => (SetKind::NodePortTcp, SetKind::NodePortLocalTcp),
        Protocol::Udp => (SetKind::NodePortUdp, SetKind::NodePortLocalUdp),
        Protocol::Sctp => (SetKind::NodePortSctp, SetKind::NodePortLocalSctp),
    };
    let entries: Vec<SetEntry> = if protocol == Protocol::Sctp {
        // SCTP has no bitmap:port set: one hash:ip,port member per address.
        input
            .node_port_addresses
            .iter()
            .map(|&ip| SetEntry::IpPort(ip, protocol, node_port))
            .collect()
    } else {
        vec![SetEntry::Port(node_port)]
    };
    for entry in entries {
        state.add_entry(all, entry);
        if traffic.external_policy_local {
            state.add_entry(local, entry);
        }
    }
}

/// Adds a virtual server (and its address to kube-ipvs0 when `bind`) with
/// one real server of weight 1 per endpoint.
fn add_service(
    state: &mut KernelState,
    key: ServiceKey,
    server: &VirtualServer,
    endpoints: &[Arc<Endpoint>],
    bind: bool,
) {
    let reals: BTreeMap<SocketAddr, u32> = endpoints
        .iter()
        .map(|endpoint| (SocketAddr::new(endpoint.ip, endpoint.port), 1))
        .collect();
    if bind {
        state.addresses.insert(key.address);
    }
    state.services.insert(
        key,
        ServiceState {
            server: server.clone(),
            reals,
        },
    );
}

#[cfg(test)]
#[path = "planner_tests.rs"]
mod tests;
