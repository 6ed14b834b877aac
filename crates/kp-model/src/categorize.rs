//! Which endpoints a service port uses, for cluster and for local traffic.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::endpoints::Endpoint;
use crate::service::ServicePort;
use crate::LABEL_TOPOLOGY_ZONE;

/// The result of [`categorize_endpoints`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CategorizedEndpoints {
    /// Endpoints for traffic with cluster policy (empty when the service port
    /// uses no cluster endpoints).
    pub cluster: Vec<Arc<Endpoint>>,
    /// Endpoints for traffic with local policy (empty when the service port
    /// uses no local endpoints).
    pub local: Vec<Arc<Endpoint>>,
    /// The union of `cluster` and `local`: every endpoint some traffic can reach.
    pub all_reachable: Vec<Arc<Endpoint>>,
    /// Some usable endpoint exists anywhere in the cluster, even one this
    /// node's traffic policy cannot reach (decides REJECT versus DROP).
    pub has_any_endpoints: bool,
    /// How many endpoints on this node are ready: what a health-check node
    /// port reports. Serving terminating endpoints do not count, even when
    /// `local` falls back to them, so that a load balancer stops sending
    /// new connections to a node whose endpoints are all going away (as
    /// upstream's `LocalReadyEndpoints`).
    pub local_ready: usize,
}

impl CategorizedEndpoints {
    /// The endpoints new traffic to the service port's ClusterIP goes to:
    /// the local ones under `internalTrafficPolicy: Local`, else the
    /// cluster ones. `port` is the service port these were categorized for.
    pub fn for_internal_traffic(&self, port: &ServicePort) -> &[Arc<Endpoint>] {
        if port.internal_policy_local {
            &self.local
        } else {
            &self.cluster
        }
    }

    /// The endpoints new traffic from outside the node to the service
    /// port's external addresses (NodePort, external IPs, load balancer
    /// IPs) goes to: the local ones under `externalTrafficPolicy: Local`,
    /// else the cluster ones. The IPVS and userspace modes send all
    /// external traffic there (they cannot tell the node's own pods apart
    /// per packet, as upstream's IPVS mode cannot either).
    pub fn for_traffic_from_outside(&self, port: &ServicePort) -> &[Arc<Endpoint>] {
        if port.external_policy_local {
            &self.local
        } else {
            &self.cluster
        }
    }

    /// The endpoints new traffic to the service port's external addresses
    /// (NodePort, external IPs, load balancer IPs) may go to: the cluster
    /// ones; under `externalTrafficPolicy: Local`, clients outside the node
    /// go to the local ones while the node's own pods and processes are
    /// sent on to the cluster ones (as upstream's `KUBE-EXT-` chain does),
    /// so both.
    pub fn for_external_traffic(&self, port: &ServicePort) -> &[Arc<Endpoint>] {
        if port.external_policy_local {
            &self.all_reachable
        } else {
            &self.cluster
        }
    }
}

/// Feature gates that change how [`categorize_endpoints_with`] reads
/// topology hints. The default is Kubernetes v1.34's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopologyOptions {
    /// `PreferSameTrafficDistribution` (beta, on by default in 1.34): node
    /// hints (`hints.forNodes`, written for `trafficDistribution:
    /// PreferSameNode`) may narrow the endpoints. When off they are ignored
    /// and only zone hints count, as upstream's `topologyModeFromHints` does;
    /// the EndpointSlice controller writes zone hints beside node hints so
    /// such a proxy still keeps traffic in its zone.
    pub prefer_same_node_hints: bool,
}

impl Default for TopologyOptions {
    fn default() -> Self {
        Self {
            prefer_same_node_hints: true,
        }
    }
}

/// How topology hints narrow the cluster endpoints of one service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TopologyMode {
    /// Hints are not used: every ready endpoint is a cluster endpoint.
    None,
    /// Only endpoints hinted for this node's zone.
    SameZone,
    /// Only endpoints hinted for this node.
    SameNode,
}

/// Splits a service port's endpoints into those cluster traffic uses, those
/// local traffic uses, and all reachable ones (see [`CategorizedEndpoints`]).
///
/// "Usable" means ready; when no endpoint is ready, serving terminating
/// endpoints are used instead, decided separately for cluster and for local
/// traffic, so that connections drain gracefully during a rollout.
///
/// Cluster endpoints are narrowed by topology hints when the EndpointSlice
/// controller wrote them for every ready endpoint and at least one names this
/// node (`hints.forNodes`, from `trafficDistribution: PreferSameNode`; only
/// with [`TopologyOptions::prefer_same_node_hints`]) or,
/// failing that, this node's zone (`hints.forZones`, from `PreferClose`,
/// `PreferSameZone` or `topology-mode: Auto`). Like upstream since 1.33, the
/// hints alone decide: the controller only writes them when the Service asks
/// for them, so the Service's fields are not consulted again here.
///
/// `endpoints` must be sorted by (ip, port), as the [`crate::EndpointsMap`]
/// keeps them; every list in the result is sorted the same way.
///
/// This uses the default [`TopologyOptions`]; see [`categorize_endpoints_with`].
pub fn categorize_endpoints(
    endpoints: &[Arc<Endpoint>],
    service_port: &ServicePort,
    node_name: &str,
    node_labels: &BTreeMap<String, String>,
) -> CategorizedEndpoints {
    categorize_endpoints_with(
        endpoints,
        service_port,
        node_name,
        node_labels,
        TopologyOptions::default(),
    )
}

/// [`categorize_endpoints`] with the topology feature gates given explicitly.
pub fn categorize_endpoints_with(
    endpoints: &[Arc<Endpoint>],
    service_port: &ServicePort,
    node_name: &str,
    node_labels: &BTreeMap<String, String>,
    options: TopologyOptions,
) -> CategorizedEndpoints {
    let mut result = CategorizedEndpoints {
        local_ready: endpoints
            .iter()
            .filter(|ep| ep.is_local && ep.ready)
            .count(),
        ..CategorizedEndpoints::default()
    };
    if endpoints.is_empty() {
        return result;
    }
    let mut topology = TopologyMode::None;
    if service_port.uses_cluster_endpoints() {
        let zone = node_labels
            .get(LABEL_TOPOLOGY_ZONE)
            .map_or("", String::as_str);
        topology = topology_mode_from_hints(endpoints, node_name, zone, options);
        result.cluster = filter(endpoints, |ep| {
            ep.ready && available_for_topology(ep, topology, node_name, zone)
        });
        // Topology already falls back to "no hints" when no ready endpoint is
        // hinted for us, so an empty list here means nothing is ready anywhere.
        if result.cluster.is_empty() {
            result.cluster = filter(endpoints, serving_terminating);
        }
        result.has_any_endpoints = !result.cluster.is_empty();
    }
    if !service_port.uses_local_endpoints() {
        result.all_reachable = result.cluster.clone();
        return result;
    }
    let local_uses_terminating = categorize_local(endpoints, &mut result);
    if !service_port.uses_cluster_endpoints() {
        result.all_reachable = result.local.clone();
    } else if topology == TopologyMode::None && !local_uses_terminating {
        // Cluster holds every ready endpoint and local only ready ones, so
        // cluster is already the union.
        result.all_reachable = result.cluster.clone();
    } else {
        result.all_reachable = union(&result.cluster, &result.local);
    }
    result
}

/// Fills `local` (ready local endpoints, else serving terminating local ones)
/// and `has_any_endpoints`; returns true when `local` fell back to
/// terminating endpoints.
fn categorize_local(endpoints: &[Arc<Endpoint>], result: &mut CategorizedEndpoints) -> bool {
    let mut local_ready = false;
    let mut local_serving_terminating = false;
    for ep in endpoints {
        if ep.ready {
            result.has_any_endpoints = true;
            local_ready |= ep.is_local;
        } else if serving_terminating(ep) {
            result.has_any_endpoints = true;
            local_serving_terminating |= ep.is_local;
        }
    }
    if local_ready {
        result.local = filter(endpoints, |ep| ep.is_local && ep.ready);
        false
    } else if local_serving_terminating {
        result.local = filter(endpoints, |ep| ep.is_local && serving_terminating(ep));
        true
    } else {
        false
    }
}

/// Picks the topology mode the hints allow (see [`categorize_endpoints`]).
fn topology_mode_from_hints(
    endpoints: &[Arc<Endpoint>],
    node_name: &str,
    zone: &str,
    options: TopologyOptions,
) -> TopologyMode {
    let mut any_ready = false;
    let mut all_have_node_hints = true;
    let mut hinted_for_node = false;
    let mut all_have_zone_hints = true;
    let mut hinted_for_zone = false;
    for ep in endpoints.iter().filter(|ep| ep.ready) {
        any_ready = true;
        match &ep.node_hints {
            None => all_have_node_hints = false,
            Some(nodes) => hinted_for_node |= nodes.contains(node_name),
        }
        match &ep.zone_hints {
            None => all_have_zone_hints = false,
            Some(zones) => hinted_for_zone |= zones.contains(zone),
        }
    }
    if !any_ready {
        return TopologyMode::None;
    }
    if options.prefer_same_node_hints && all_have_node_hints && hinted_for_node {
        return TopologyMode::SameNode;
    }
    if all_have_zone_hints && hinted_for_zone {
        return TopologyMode::SameZone;
    }
    if all_have_zone_hints {
        tracing::debug!(
            node = node_name,
            zone,
            "ignoring zone hints: none is for this node's zone"
        );
    }
    TopologyMode::None
}

fn available_for_topology(ep: &Endpoint, mode: TopologyMode, node_name: &str, zone: &str) -> bool {
    match mode {
        TopologyMode::None => true,
        TopologyMode::SameNode => ep
            .node_hints
            .as_ref()
            .is_some_and(|nodes| nodes.contains(node_name)),
        TopologyMode::SameZone => ep
            .zone_hints
            .as_ref()
            .is_some_and(|zones| zones.contains(zone)),
    }
}

fn serving_terminating(ep: &Arc<Endpoint>) -> bool {
    ep.serving && ep.terminating
}

fn filter(
    endpoints: &[Arc<Endpoint>],
    keep: impl Fn(&Arc<Endpoint>) -> bool,
) -> Vec<Arc<Endpoint>> {
    endpoints.iter().filter(|ep| keep(ep)).cloned().collect()
}

/// Merges two lists sorted by (ip, port) into one, without duplicates.
fn union(a: &[Arc<Endpoint>], b: &[Arc<Endpoint>]) -> Vec<Arc<Endpoint>> {
    let mut merged: BTreeMap<(std::net::IpAddr, u16), Arc<Endpoint>> = BTreeMap::new();
    for ep in a.iter().chain(b) {
        merged
            .entry((ep.ip, ep.port))
            .or_insert_with(|| Arc::clone(ep));
    }
    merged.into_values().collect()
}
