//! The service and endpoint model of kube-proxy-rs.
//!
//! Everything here is pure: no IO, no clocks, no backend knowledge. Sources
//! feed Kubernetes objects into the change trackers ([`tracker`]); the sync
//! loop drains them into a [`ServicePortMap`] and an [`EndpointsMap`] and asks
//! [`categorize::categorize_endpoints`] which endpoints each service port uses.

pub mod categorize;
pub mod endpoints;
pub mod events;
mod ip;
pub mod node;
pub mod plan;
pub mod rule_text;
pub mod service;
pub mod tracker;
mod vec_map;

pub use categorize::{
    categorize_endpoints, categorize_endpoints_with, CategorizedEndpoints, TopologyOptions,
};
pub use endpoints::{endpoints_from_slices, Endpoint, EndpointsMap};
pub use events::{ObjectEvent, ProxyEventHandler, ResourceKind};
pub use node::NodeInfo;
pub use plan::{Refusal, TrafficPlan};
pub use service::{
    service_ports_from_service, IpFamily, NamespacedName, Protocol, ServiceError, ServicePort,
    ServicePortMap, ServicePortName, TrafficDistribution,
};
pub use tracker::{EndpointsChangeTracker, EndpointsUpdate, ServiceChangeTracker, ServiceUpdate};
pub use vec_map::VecMap;

/// Label on a Service that hands it to another proxy implementation.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Label on a Service that marks it headless (set by the endpoints controller).
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// Label on an EndpointSlice naming the Service it belongs to.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The EndpointSlice annotation the EndpointSlice controller sets to the
/// time of the Pod or Service change that led to the slice's last update
/// (RFC 3339); network-programming latency is measured from it.
pub const ANNOTATION_LAST_CHANGE_TRIGGER_TIME: &str =
    "endpoints.kubernetes.io/last-change-trigger-time";
/// Node label carrying the node's topology zone.
pub const LABEL_TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
