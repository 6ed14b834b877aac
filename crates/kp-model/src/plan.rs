//! Where each kind of traffic to a service port goes: the decisions every
//! mode shares (upstream's `usesClusterPolicyChain`, `hasInternalEndpoints`,
//! …), made once here so the modes only turn them into kernel objects.

use std::net::IpAddr;

use crate::categorize::CategorizedEndpoints;
use crate::service::ServicePort;

/// The traffic decisions for one service port and its categorized endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrafficPlan {
    /// Reachable other than through the ClusterIP (NodePort, external IP or
    /// load balancer IP).
    pub externally_accessible: bool,
    /// `internalTrafficPolicy: Local`: internal traffic goes to local
    /// endpoints only.
    pub internal_policy_local: bool,
    /// `externalTrafficPolicy: Local` on an externally accessible port.
    pub external_policy_local: bool,
    /// Some usable endpoint exists anywhere in the cluster.
    pub has_endpoints: bool,
    /// Internal traffic (to the ClusterIP) has an endpoint to go to.
    pub has_internal_endpoints: bool,
    /// External traffic has an endpoint to go to.
    pub has_external_endpoints: bool,
    /// Some traffic is balanced over the cluster endpoints (and there are
    /// some): the mode needs its cluster-policy object (`KUBE-SVC-…`).
    pub uses_cluster_endpoints: bool,
    /// Some traffic is balanced over the local endpoints (and there are
    /// some): the mode needs its local-policy object (`KUBE-SVL-…`).
    pub uses_local_endpoints: bool,
    /// External traffic has its own path (`KUBE-EXT-…`): the port is
    /// externally accessible and has endpoints.
    pub uses_external_path: bool,
    /// Traffic to the load balancer IPs is filtered by
    /// `loadBalancerSourceRanges` first (`KUBE-FW-…`).
    pub uses_source_ranges_filter: bool,
    /// A `loadBalancerSourceRanges` range contains the node's own address
    /// (whether or not the filter is used), so the filter also lets in the load balancer IPs themselves as
    /// sources: a load balancer IP is often local to the node (a VIP), and
    /// the node's own requests to it then arrive with it as their source.
    pub source_ranges_admit_node: bool,
}

/// What happens to traffic that has no endpoint to go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No usable endpoint anywhere in the cluster: rejected (the client
    /// gets an ICMP unreachable at once).
    NoEndpoints,
    /// Endpoints exist, but the Local policy allows none on this node:
    /// dropped, so a load balancer's health check moves traffic elsewhere.
    NoLocalEndpoints,
}

impl TrafficPlan {
    /// The plan for `port` with `endpoints` (categorized for this node),
    /// on a node whose address of the port's family is `node_ip`.
    pub fn new(
        port: &ServicePort,
        endpoints: &CategorizedEndpoints,
        node_ip: Option<IpAddr>,
    ) -> Self {
        let externally_accessible = port.externally_accessible();
        let internal_policy_local = port.internal_policy_local;
        let external_policy_local = port.external_policy_local && externally_accessible;
        let has_endpoints = endpoints.has_any_endpoints;
        let local_is_empty = endpoints.local.is_empty();
        let uses_source_ranges_filter = has_endpoints
            && !port.load_balancer_ips.is_empty()
            && !port.load_balancer_source_ranges.is_empty();
        Self {
            externally_accessible,
            internal_policy_local,
            external_policy_local,
            has_endpoints,
            has_internal_endpoints: has_endpoints && (!internal_policy_local || !local_is_empty),
            has_external_endpoints: has_endpoints && (!external_policy_local || !local_is_empty),
            uses_cluster_endpoints: !endpoints.cluster.is_empty() && port.uses_cluster_endpoints(),
            uses_local_endpoints: !local_is_empty && port.uses_local_endpoints(),
            uses_external_path: has_endpoints && externally_accessible,
            uses_source_ranges_filter,
            source_ranges_admit_node: node_ip.is_some_and(|ip| {
                port.load_balancer_source_ranges
                    .iter()
                    .any(|range| range.trunc().contains(&ip))
            }),
        }
    }

    /// Internal traffic is dropped because `internalTrafficPolicy: Local`
    /// leaves it no endpoint while endpoints exist elsewhere (upstream's
    /// `kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy="internal"}`).
    pub fn no_local_endpoints_internal(&self) -> bool {
        self.has_endpoints && !self.has_internal_endpoints
    }

    /// External traffic from outside the node is dropped because
    /// `externalTrafficPolicy: Local` leaves it no endpoint while endpoints
    /// exist elsewhere (`…{traffic_policy="external"}`).
    pub fn no_local_endpoints_external(&self) -> bool {
        self.has_endpoints && !self.has_external_endpoints
    }

    /// How traffic without an endpoint is refused. The same answer holds for
    /// internal and external traffic: only whether any endpoint exists in
    /// the cluster matters.
    pub fn refusal(&self) -> Refusal {
        if self.has_endpoints {
            Refusal::NoLocalEndpoints
        } else {
            Refusal::NoEndpoints
        }
    }
}
