//! Which conntrack entries are stale after a sync: a pure function of the
//! synced state and the listed entries.
//!
//! UDP has no connection for the kernel to see end: a client that keeps
//! sending from one socket keeps its conntrack entry alive, and the entry
//! keeps the DNAT decision made for its first packet. When that endpoint
//! stops being one the Service uses, the client's datagrams keep going to
//! it until the entry is deleted. SCTP associations are pinned the same
//! way (an association's entry outlives the endpoint that answered it, and
//! a multi-homed client keeps it alive). TCP ends its connections, and a
//! dead endpoint answers with a reset, so TCP entries are left alone, as
//! upstream does.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use kp_model::{Endpoint, Protocol};
use kp_sync::SyncRequest;

use crate::flow::{Flow, IPPROTO_SCTP, IPPROTO_UDP};

/// The UDP and SCTP flows among `flows` that must be deleted after
/// `request` was applied.
///
/// A flow belongs to a *frontend* of a UDP or SCTP service port by its
/// original destination: the ClusterIP, an external IP or a load balancer
/// IP with the service port (`--orig-dst IP --orig-port-dst PORT`), or the
/// NodePort on any other address (`--orig-port-dst NODEPORT`). Each
/// frontend has the endpoints new traffic to it goes to after this sync,
/// as categorized for this node: for the ClusterIP
/// [`CategorizedEndpoints::for_internal_traffic`], for the others
/// [`CategorizedEndpoints::for_external_traffic`]. Ready endpoints, and
/// serving terminating ones only while no endpoint is ready, after
/// topology hints and traffic policies.
///
/// 1. A flow DNATed to an endpoint (its reply source, `--reply-src` and
///    `--reply-port-src`, is not its original destination) is stale when
///    that endpoint is not among the frontend's endpoints any more: it was
///    removed, stopped serving, is terminating while others are ready, or
///    moved off this node under a Local policy. When the frontend has no
///    endpoint left the flow is stale too, so the client is refused at its
///    next datagram instead of talking to a pod that is gone.
///    Under `externalTrafficPolicy: Local`, a flow to a frontend other than
///    the ClusterIP from outside the node (its source is neither a node
///    address nor in the Node's pod CIDRs) may only reply from a local
///    endpoint.
/// 2. A flow that was not DNATed (cached while the frontend had no
///    endpoint) is stale once the frontend has one. For a NodePort this
///    holds only when the flow was sent to one of the Node's addresses:
///    other traffic may use the same port number.
/// 3. A flow sent to the ClusterIP of a removed UDP or SCTP service port
///    ([`StaleConntrack::deleted_cluster_ips`]) is stale unless that
///    address and port belong to a current service port.
///
/// Upstream's reconciler (`pkg/proxy/conntrack/cleanup.go`) keeps flows to
/// any serving endpoint, so a UDP client stays on a terminating endpoint
/// while others are ready; here it moves to an endpoint the rules would
/// pick for a new flow. Upstream also compares only the reply's address
/// and lets a NodePort match flows to any Service address with that port
/// number; here the endpoint's port counts and a flow to a Service address
/// belongs to that address's service port alone.
///
/// [`CategorizedEndpoints::for_internal_traffic`]: kp_model::CategorizedEndpoints::for_internal_traffic
/// [`CategorizedEndpoints::for_external_traffic`]: kp_model::CategorizedEndpoints::for_external_traffic
/// [`StaleConntrack::deleted_cluster_ips`]: kp_sync::StaleConntrack::deleted_cluster_ips
pub fn stale_flows(request: &SyncRequest<'_>, flows: &[Flow]) -> Vec<Flow> {
    let frontends = Frontends::of(request);
    flows
        .iter()
        .filter(|flow| is_reconciled(flow.protocol) && flow.family() == request.family)
        .filter(|flow| frontends.is_stale(flow))
        .copied()
        .collect()
}

/// True when a sync needs a reconcile of the conntrack table: it was a full
/// one, it removed a UDP or SCTP ClusterIP, or it changed a Service with a
/// UDP or SCTP port (its endpoints, their conditions or its policies).
pub fn sync_may_leave_stale_flows(request: &SyncRequest<'_>) -> bool {
    if request.full || !request.stale_conntrack.deleted_cluster_ips.is_empty() {
        return true;
    }
    // Few Services change in a partial sync: look only at theirs.
    request.service_ports.iter().any(|(name, state)| {
        is_reconciled_protocol(state.port.protocol)
            && request.changed_services.contains(&name.service)
    })
}

/// The protocols whose flows are reconciled.
fn is_reconciled_protocol(protocol: Protocol) -> bool {
    matches!(protocol, Protocol::Udp | Protocol::Sctp)
}

/// [`is_reconciled_protocol`] for a flow's IANA protocol number.
fn is_reconciled(protocol: u8) -> bool {
    matches!(protocol, IPPROTO_UDP | IPPROTO_SCTP)
}

/// The IANA number of a reconciled protocol.
fn protocol_number(protocol: Protocol) -> Option<u8> {
    match protocol {
        Protocol::Udp => Some(IPPROTO_UDP),
        Protocol::Sctp => Some(IPPROTO_SCTP),
        Protocol::Tcp => None,
    }
}

/// Where one frontend's new traffic goes.
#[derive(Debug, Default)]
struct Endpoints {
    /// The endpoints of traffic from this node's pods and processes, and of
    /// any traffic when `from_outside` is `None`.
    any: HashSet<SocketAddr>,
    /// Under `externalTrafficPolicy: Local`, the endpoints of traffic from
    /// outside the node (the local ones), for a frontend other than the
    /// ClusterIP.
    from_outside: Option<HashSet<SocketAddr>>,
}

/// Every frontend of every UDP and SCTP service port of the request's
/// family.
#[derive(Debug, Default)]
struct Frontends<'a> {
    /// ClusterIP, external IPs and load balancer IPs, with the protocol and
    /// the port.
    by_address: HashMap<(u8, SocketAddr), Endpoints>,
    /// NodePorts, on any address, with the protocol.
    by_node_port: HashMap<(u8, u16), Endpoints>,
    /// Every Service address of the family (of any protocol and port): a
    /// flow sent to one is never a NodePort's.
    service_ips: HashSet<IpAddr>,
    /// The Node's own addresses.
    node_ips: &'a [IpAddr],
    /// The Node's pod CIDRs.
    pod_cidrs: &'a [IpNet],
    /// ClusterIPs of removed UDP and SCTP service ports.
    deleted_ips: BTreeSet<IpAddr>,
}

impl<'a> Frontends<'a> {
    fn of(request: &SyncRequest<'a>) -> Self {
        let family = request.family;
        let mut frontends = Self {
            node_ips: &request.node.addresses,
            pod_cidrs: &request.node.pod_cidrs,
            deleted_ips: request
                .stale_conntrack
                .deleted_cluster_ips
                .iter()
                .filter(|ip| family.matches(ip))
                .copied()
                .collect(),
            ..Self::default()
        };
        for state in request.service_ports.values() {
            let port = &state.port;
            let usable = |ip: &&IpAddr| family.matches(ip) && !ip.is_unspecified();
            let external_addresses = || {
                port.external_ips
                    .iter()
                    .chain(&port.load_balancer_ips)
                    .filter(usable)
            };
            frontends.service_ips.extend(
                std::iter::once(&port.cluster_ip)
                    .filter(usable)
                    .chain(external_addresses()),
            );
            let Some(protocol) = protocol_number(port.protocol) else {
                continue;
            };
            let endpoints = &state.endpoints;
            let external = || Endpoints {
                any: addresses_of(endpoints.for_external_traffic(port)),
                from_outside: port
                    .external_policy_local
                    .then(|| addresses_of(&endpoints.local)),
            };
            if family.matches(&port.cluster_ip) && !port.cluster_ip.is_unspecified() {
                let internal = Endpoints {
                    any: addresses_of(endpoints.for_internal_traffic(port)),
                    from_outside: None,
                };
                let frontend = SocketAddr::new(port.cluster_ip, port.port);
                frontends.by_address.insert((protocol, frontend), internal);
            }
            for ip in external_addresses() {
                let frontend = SocketAddr::new(*ip, port.port);
                frontends
                    .by_address
                    .insert((protocol, frontend), external());
            }
            if let Some(node_port) = port.node_port.filter(|&p| p != 0) {
                frontends
                    .by_node_port
                    .insert((protocol, node_port), external());
            }
        }
        frontends
    }

    fn is_stale(&self, flow: &Flow) -> bool {
        let destination = flow.original_destination();
        if let Some(endpoints) = self.by_address.get(&(flow.protocol, destination)) {
            return self.is_stale_at(endpoints, flow, true);
        }
        if self.service_ips.contains(&destination.ip()) {
            return self.deleted_ips.contains(&destination.ip());
        }
        if let Some(endpoints) = self.by_node_port.get(&(flow.protocol, destination.port())) {
            let to_node = self.node_ips.contains(&destination.ip());
            return self.is_stale_at(endpoints, flow, to_node);
        }
        self.deleted_ips.contains(&destination.ip())
    }

    /// Whether `flow`, sent to a frontend with `endpoints`, is stale (rules
    /// 1 and 2 of [`stale_flows`]); `surely_ours` says that a flow that was
    /// not DNATed was still sent to this frontend.
    fn is_stale_at(&self, endpoints: &Endpoints, flow: &Flow, surely_ours: bool) -> bool {
        let used = match &endpoints.from_outside {
            Some(local) if self.is_from_outside(flow.original.src) => local,
            _ => &endpoints.any,
        };
        let reply_source = flow.reply_source();
        if used.contains(&reply_source) {
            return false;
        }
        let dnated = reply_source != flow.original_destination();
        dnated || (surely_ours && !used.is_empty())
    }

    /// Whether `source` is outside this node: neither one of its addresses
    /// nor in its pod CIDRs. Without known pod CIDRs a source cannot be
    /// told apart from a local pod, so it counts as the node's own, whose
    /// traffic may use more endpoints: such a flow is kept rather than
    /// moved for nothing.
    fn is_from_outside(&self, source: IpAddr) -> bool {
        !self.pod_cidrs.is_empty()
            && !self.node_ips.contains(&source)
            && !self.pod_cidrs.iter().any(|cidr| cidr.contains(&source))
    }
}

/// The address and port of each of `endpoints`.
fn addresses_of(endpoints: &[Arc<Endpoint>]) -> HashSet<SocketAddr> {
    endpoints.iter().map(|ep| ep.socket_addr()).collect()
}

#[cfg(test)]
#[path = "stale_tests.rs"]
mod tests;
