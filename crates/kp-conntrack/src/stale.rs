//! Which conntrack entries are stale after a sync: a pure function of the
//! synced state and the listed entries.
//!
//! UDP has no connection for the kernel to see end: a client that keeps
//! sending from one socket keeps its conntrack entry alive, and the entry
//! keeps the DNAT decision made for its first packet. When that endpoint
//! goes away the client's datagrams keep going to it until the entry is
//! deleted. TCP and SCTP end their connections (and a dead endpoint
//! answers with a reset), so, as upstream, only UDP entries are deleted.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use kp_model::Protocol;
use kp_sync::SyncRequest;

use crate::flow::{Flow, IPPROTO_UDP};

/// The UDP flows among `flows` that must be deleted after `request` was
/// applied.
///
/// Upstream's reconciler (`pkg/proxy/conntrack/cleanup.go`,
/// `CleanStaleEntries`) compares every UDP entry with the current state; so
/// does this function, with the same rules plus two that use what the sync
/// knows changed:
///
/// 1. For every UDP service port with at least one serving endpoint
///    (`conditions.serving`, whatever the traffic policies, topology or
///    terminating state): an entry sent to one of its frontends — ClusterIP,
///    external IP or load balancer IP with the service port
///    (`--orig-dst IP --orig-port-dst PORT`), or any address with its
///    NodePort (`--orig-port-dst NODEPORT`) — whose reply source IP and port
///    (`--reply-src`, `--reply-port-src`) is not one of those serving
///    endpoints is stale. This also removes entries cached while the
///    service port had no endpoint.
/// 2. For a UDP service port whose endpoints all went away (upstream leaves
///    those alone): entries to its frontends that reply from an endpoint
///    the sync reported stale ([`StaleConntrack::stale_endpoints`]) are
///    stale, so clients are told at once that the Service has no endpoint
///    instead of talking to the removed pod.
/// 3. An entry sent to a ClusterIP of a removed UDP service port
///    ([`StaleConntrack::deleted_udp_cluster_ips`]) is stale unless that
///    address and port belong to a current service port
///    (`conntrack -D -p udp --orig-dst IP`).
///
/// [`StaleConntrack::stale_endpoints`]: kp_sync::StaleConntrack::stale_endpoints
/// [`StaleConntrack::deleted_udp_cluster_ips`]: kp_sync::StaleConntrack::deleted_udp_cluster_ips
pub fn stale_flows(request: &SyncRequest<'_>, flows: &[Flow]) -> Vec<Flow> {
    let frontends = Frontends::of(request);
    let deleted_ips: BTreeSet<IpAddr> = request
        .stale_conntrack
        .deleted_udp_cluster_ips
        .iter()
        .filter(|ip| request.family.matches(ip))
        .copied()
        .collect();
    flows
        .iter()
        .filter(|flow| flow.protocol == IPPROTO_UDP && flow.family() == request.family)
        .filter(|flow| frontends.is_stale(flow, &deleted_ips))
        .copied()
        .collect()
}

/// The endpoints behind one UDP service port.
#[derive(Debug, Default)]
struct Backends {
    /// Serving endpoints (`ip:port`).
    serving: HashSet<SocketAddr>,
    /// Endpoints the sync reported stale that are not serving now.
    stale: HashSet<SocketAddr>,
}

/// Every frontend of every UDP service port of the request's family.
#[derive(Debug, Default)]
struct Frontends {
    /// ClusterIP, external IPs and load balancer IPs, with the port.
    by_address: HashMap<SocketAddr, Arc<Backends>>,
    /// NodePorts, on any address.
    by_node_port: HashMap<u16, Arc<Backends>>,
}

impl Frontends {
    fn of(request: &SyncRequest<'_>) -> Self {
        let mut stale_by_port: HashMap<_, HashSet<SocketAddr>> = HashMap::new();
        for (name, endpoint) in &request.stale_conntrack.stale_endpoints {
            stale_by_port
                .entry(name)
                .or_default()
                .insert(endpoint.socket_addr());
        }
        let mut frontends = Self::default();
        for (name, state) in request.service_ports {
            let port = &state.port;
            if port.protocol != Protocol::Udp {
                continue;
            }
            let serving: HashSet<SocketAddr> = state
                .all_endpoints
                .iter()
                .filter(|endpoint| endpoint.serving)
                .map(|endpoint| endpoint.socket_addr())
                .collect();
            let stale = stale_by_port
                .remove(name)
                .unwrap_or_default()
                .into_iter()
                .filter(|endpoint| !serving.contains(endpoint))
                .collect();
            let backends = Arc::new(Backends { serving, stale });
            let addresses = std::iter::once(&port.cluster_ip)
                .chain(&port.external_ips)
                .chain(&port.load_balancer_ips)
                .filter(|ip| request.family.matches(ip) && !ip.is_unspecified());
            for ip in addresses {
                frontends
                    .by_address
                    .insert(SocketAddr::new(*ip, port.port), Arc::clone(&backends));
            }
            if let Some(node_port) = port.node_port.filter(|&p| p != 0) {
                frontends.by_node_port.insert(node_port, backends);
            }
        }
        frontends
    }

    fn is_stale(&self, flow: &Flow, deleted_ips: &BTreeSet<IpAddr>) -> bool {
        let destination = flow.original_destination();
        let reply_source = flow.reply_source();
        let by_address = self.by_address.get(&destination);
        if by_address.is_some_and(|backends| backends.is_stale(reply_source)) {
            return true;
        }
        let by_node_port = self.by_node_port.get(&destination.port());
        if by_node_port.is_some_and(|backends| backends.is_stale(reply_source)) {
            return true;
        }
        by_address.is_none() && deleted_ips.contains(&destination.ip())
    }
}

impl Backends {
    fn is_stale(&self, reply_source: SocketAddr) -> bool {
        if self.serving.contains(&reply_source) {
            return false;
        }
        !self.serving.is_empty() || self.stale.contains(&reply_source)
    }
}

#[cfg(test)]
#[path = "stale_tests.rs"]
mod tests;
