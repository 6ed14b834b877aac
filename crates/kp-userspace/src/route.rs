//! Where the connections of one service port go: which endpoints serve
//! internal and external traffic, and who may use the load balancer IPs.
//!
//! A [`Route`] is built once per sync from the sync loop's categorized view
//! ([`kp_model::TrafficPlan`] decides which endpoint list each kind of
//! traffic uses) and swapped into the service port's
//! [`Balancer`](crate::balancer::Balancer) whole, so a connection being
//! accepted sees either the old or the new route, never a mix.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use kp_model::ServicePort;
use kp_sync::ServicePortState;

/// The routing decisions of one service port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// ClusterIP and port: connections to them are internal traffic.
    pub cluster: SocketAddr,
    /// The NodePort, when allocated.
    pub node_port: Option<u16>,
    /// `spec.externalIPs` of this family.
    pub external_ips: Vec<IpAddr>,
    /// Load balancer ingress IPs of this family.
    pub load_balancer_ips: Vec<IpAddr>,
    /// `loadBalancerSourceRanges`: when not empty, only clients in these
    /// ranges may connect through a load balancer IP.
    pub source_ranges: Vec<IpNet>,
    /// A source range holds the node's own address, so the load balancer
    /// IPs themselves are allowed sources too (the node's own connections
    /// to a load balancer IP that is local to it come from that IP).
    pub source_ranges_admit_node: bool,
    /// Endpoints for traffic to the ClusterIP.
    pub internal: Arc<[SocketAddr]>,
    /// Endpoints for traffic to a NodePort, external IP or load balancer IP.
    pub external: Arc<[SocketAddr]>,
    /// ClientIP session affinity timeout, when affinity is on.
    pub affinity_timeout: Option<Duration>,
    /// Relay connections that no portal rule sent (their original
    /// destination is not one of the addresses above, or conntrack does
    /// not know them). Only loopback tests and benchmarks, which connect
    /// straight to the listener, turn this on: a route built from a
    /// Service refuses them, because the listener's port is open on every
    /// address of the node and would otherwise reach the endpoints around
    /// the Service's rules (ClusterIP-only Services from outside the node,
    /// load balancer endpoints from outside `loadBalancerSourceRanges`).
    pub accept_unredirected: bool,
}

/// Which traffic a connection is, by the address it was sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrafficKind {
    /// Sent to the ClusterIP (or straight to the proxy's own port).
    Internal,
    /// Sent to a NodePort, external IP or load balancer IP.
    External,
}

/// A connection the route does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// The client is outside `loadBalancerSourceRanges`.
    SourceRange,
    /// No portal rule sent the connection: it was sent straight to the
    /// listener's port, or to an address of no portal of this service port.
    NotRedirected,
}

impl Route {
    /// The route of `state`: internal traffic goes to the local endpoints
    /// under `internalTrafficPolicy: Local`, else to the cluster endpoints;
    /// external traffic likewise under `externalTrafficPolicy`. Only ready
    /// (or serving-terminating, when nothing is ready) endpoints are listed,
    /// as categorized by the sync loop.
    pub fn from_state(state: &ServicePortState) -> Self {
        let port: &ServicePort = &state.port;
        let plan = state.plan;
        let addresses = |list: &[Arc<kp_model::Endpoint>]| -> Arc<[SocketAddr]> {
            list.iter().map(|ep| ep.socket_addr()).collect()
        };
        let internal = addresses(state.endpoints.for_internal_traffic(port));
        let external = if plan.externally_accessible {
            addresses(state.endpoints.for_traffic_from_outside(port))
        } else {
            Arc::from([])
        };
        Self {
            cluster: SocketAddr::new(port.cluster_ip, port.port),
            node_port: port.node_port,
            external_ips: port.external_ips.clone(),
            load_balancer_ips: port.load_balancer_ips.clone(),
            source_ranges: port.load_balancer_source_ranges.clone(),
            source_ranges_admit_node: plan.source_ranges_admit_node,
            internal,
            external,
            affinity_timeout: port.session_affinity_timeout,
            accept_unredirected: false,
        }
    }

    /// Whether the address a connection was sent to matters: always for a
    /// Service's route (only redirected connections are relayed); for a
    /// route that accepts connections straight to the listener, when
    /// internal and external traffic have different endpoints or the load
    /// balancer IPs are limited to some sources. Otherwise the relay need
    /// not ask conntrack (a system call per connection).
    pub fn needs_classification(&self) -> bool {
        !self.accept_unredirected
            || self.internal != self.external
            || !self.source_ranges.is_empty()
    }

    /// Whether any traffic has an endpoint to go to.
    pub fn has_endpoints(&self) -> bool {
        !self.internal.is_empty() || !self.external.is_empty()
    }

    /// Classifies a connection from `client` by the address it was first
    /// sent to (`original_destination`, from conntrack; `None` when
    /// conntrack does not know it). Only the addresses the portal rules
    /// redirect are allowed: the ClusterIP, external and load balancer IPs
    /// at the service port, and the NodePort (the rule matched a local
    /// address). Anything else was sent straight to the listener's port
    /// and is [`Denied::NotRedirected`], unless the route
    /// [accepts that](Self::accept_unredirected).
    pub fn classify(
        &self,
        original_destination: Option<SocketAddr>,
        client: IpAddr,
    ) -> Result<TrafficKind, Denied> {
        let unredirected = if self.accept_unredirected {
            Ok(TrafficKind::Internal)
        } else {
            Err(Denied::NotRedirected)
        };
        let Some(destination) = original_destination else {
            return unredirected;
        };
        if destination == self.cluster {
            return Ok(TrafficKind::Internal);
        }
        let on_service_port = destination.port() == self.cluster.port();
        if on_service_port && self.load_balancer_ips.contains(&destination.ip()) {
            let allowed = self.source_ranges.is_empty()
                || self.source_ranges.iter().any(|net| net.contains(&client))
                || (self.source_ranges_admit_node && self.load_balancer_ips.contains(&client));
            return if allowed {
                Ok(TrafficKind::External)
            } else {
                Err(Denied::SourceRange)
            };
        }
        if on_service_port && self.external_ips.contains(&destination.ip()) {
            return Ok(TrafficKind::External);
        }
        if Some(destination.port()) == self.node_port {
            return Ok(TrafficKind::External);
        }
        unredirected
    }

    /// The endpoints for `kind` of traffic.
    pub fn endpoints(&self, kind: TrafficKind) -> &Arc<[SocketAddr]> {
        match kind {
            TrafficKind::Internal => &self.internal,
            TrafficKind::External => &self.external,
        }
    }

    /// A route with the same endpoints for internal and external traffic,
    /// accepting connections straight to the listener, and nothing else
    /// set: what loopback tests and benchmarks relay to.
    pub fn to_endpoints(endpoints: &[SocketAddr]) -> Self {
        let list: Arc<[SocketAddr]> = endpoints.into();
        Self {
            cluster: SocketAddr::from(([0, 0, 0, 0], 0)),
            node_port: None,
            external_ips: Vec::new(),
            load_balancer_ips: Vec::new(),
            source_ranges: Vec::new(),
            source_ranges_admit_node: false,
            internal: Arc::clone(&list),
            external: list,
            affinity_timeout: None,
            accept_unredirected: true,
        }
    }
}

#[cfg(test)]
#[path = "route_tests.rs"]
mod tests;
