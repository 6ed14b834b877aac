//! What the proxy knows about its own Node.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

use crate::ip::{parse_cidr, parse_ip};
use crate::service::IpFamily;
use crate::LABEL_TOPOLOGY_ZONE;

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

/// Taint the cluster autoscaler puts on a node it is about to remove.
pub const TAINT_TO_BE_DELETED_BY_AUTOSCALER: &str = "ToBeDeletedByClusterAutoscaler";

impl NodeInfo {
    /// What the proxy needs from its Node object. Addresses and pod CIDRs that
    /// do not parse are skipped (with a warning): the rest of the Node is
    /// still useful.
    pub fn from_node(node: &Node) -> Self {
        let name = node.metadata.name.clone().unwrap_or_default();
        let spec = node.spec.as_ref();
        let addresses = node
            .status
            .as_ref()
            .and_then(|status| status.addresses.as_deref())
            .unwrap_or_default()
            .iter()
            .filter(|address| matches!(address.type_.as_str(), "InternalIP" | "ExternalIP"))
            .filter_map(|address| {
                let parsed = parse_ip(&address.address);
                if parsed.is_none() {
                    tracing::warn!(node = %name, address = %address.address, "ignoring node address that is not an IP address");
                }
                parsed
            })
            .collect();
        let mut cidr_texts: Vec<&String> = spec
            .and_then(|spec| spec.pod_cidrs.as_ref())
            .map(|cidrs| cidrs.iter().collect())
            .unwrap_or_default();
        if cidr_texts.is_empty() {
            cidr_texts.extend(spec.and_then(|spec| spec.pod_cidr.as_ref()));
        }
        let pod_cidrs = cidr_texts
            .into_iter()
            .filter_map(|text| {
                let parsed = parse_cidr(text);
                if parsed.is_none() {
                    tracing::warn!(node = %name, pod_cidr = %text, "ignoring node pod CIDR that is not a CIDR");
                }
                parsed
            })
            .collect();
        let to_be_deleted_by_autoscaler =
            spec.and_then(|spec| spec.taints.as_ref())
                .is_some_and(|taints| {
                    taints
                        .iter()
                        .any(|taint| taint.key == TAINT_TO_BE_DELETED_BY_AUTOSCALER)
                });
        Self {
            labels: node.metadata.labels.clone().unwrap_or_default(),
            addresses,
            pod_cidrs,
            deleting: node.metadata.deletion_timestamp.is_some(),
            to_be_deleted_by_autoscaler,
            name,
        }
    }

    /// The node's topology zone (label `topology.kubernetes.io/zone`), if set.
    pub fn zone(&self) -> Option<&str> {
        self.labels.get(LABEL_TOPOLOGY_ZONE).map(String::as_str)
    }

    /// The node's addresses of `family`, in order.
    pub fn addresses_of(&self, family: IpFamily) -> impl Iterator<Item = IpAddr> + '_ {
        self.addresses
            .iter()
            .copied()
            .filter(move |ip| family.matches(ip))
    }
}
