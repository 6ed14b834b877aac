//! What the proxy knows about its own Node.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;

/// The proxy's own Node, as far as the data plane cares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels` (the topology zone label among them).
    pub labels: BTreeMap<String, String>,
    /// `status.addresses` of type InternalIP and ExternalIP, in order.
    pub addresses: Vec<IpAddr>,
    /// `spec.podCIDRs`.
    pub pod_cidrs: Vec<IpNet>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// The node carries the `ToBeDeletedByClusterAutoscaler` taint.
    pub to_be_deleted_by_autoscaler: bool,
}
