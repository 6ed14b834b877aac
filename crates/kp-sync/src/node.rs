//! Turning the proxy's own `v1/Node` into [`NodeInfo`].

use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kp_model::NodeInfo;

/// Taint the cluster autoscaler puts on a node it is about to remove.
pub const TAINT_TO_BE_DELETED_BY_AUTOSCALER: &str = "ToBeDeletedByClusterAutoscaler";

/// What the data plane needs of `node`. Addresses of type `InternalIP` and
/// `ExternalIP` are kept in their order; addresses and pod CIDRs that do not
/// parse are skipped with a warning (the API server validates them, so this
/// only happens with hand-written manifests).
pub fn node_info(node: &Node) -> NodeInfo {
    let name = node.metadata.name.clone().unwrap_or_default();
    let addresses = node
        .status
        .iter()
        .flat_map(|status| status.addresses.iter().flatten())
        .filter(|address| matches!(address.type_.as_str(), "InternalIP" | "ExternalIP"))
        .filter_map(|address| match address.address.parse::<IpAddr>() {
            Ok(ip) => Some(ip),
            Err(_) => {
                tracing::warn!(node = %name, address = %address.address, "ignoring node address that is not an IP address");
                None
            }
        })
        .collect();
    let spec = node.spec.as_ref();
    let pod_cidrs = spec
        .and_then(|spec| spec.pod_cidrs.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|cidr| match cidr.parse::<IpNet>() {
            Ok(net) => Some(net),
            Err(_) => {
                tracing::warn!(node = %name, cidr = %cidr, "ignoring node pod CIDR that is not a CIDR");
                None
            }
        })
        .collect();
    let to_be_deleted_by_autoscaler = spec
        .and_then(|spec| spec.taints.as_ref())
        .into_iter()
        .flatten()
        .any(|taint| taint.key == TAINT_TO_BE_DELETED_BY_AUTOSCALER);
    NodeInfo {
        labels: node.metadata.labels.clone().unwrap_or_default(),
        addresses,
        pod_cidrs,
        deleting: node.metadata.deletion_timestamp.is_some(),
        to_be_deleted_by_autoscaler,
        name,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use kp_testkit::builders::node;
    use kp_testkit::plan::{NODE_IP, NODE_NAME, NODE_POD_CIDR, NODE_ZONE};
    use pretty_assertions::assert_eq;

    use super::*;

    #[test]
    fn a_node_keeps_its_labels_ip_addresses_and_pod_cidrs() {
        let node = node(NODE_NAME, |n| {
            n.zone(NODE_ZONE)
                .internal_ip(NODE_IP)
                .address("Hostname", NODE_NAME)
                .external_ip("203.0.113.7")
                .pod_cidr(NODE_POD_CIDR)
        });

        let info = node_info(&node);

        assert_eq!(info.name, NODE_NAME);
        assert_eq!(
            info.labels
                .get(kp_model::LABEL_TOPOLOGY_ZONE)
                .map(String::as_str),
            Some(NODE_ZONE)
        );
        assert_eq!(
            info.addresses,
            vec![IpAddr::V4(NODE_IP), "203.0.113.7".parse().unwrap()]
        );
        assert_eq!(info.pod_cidrs, vec![IpNet::V4(NODE_POD_CIDR)]);
        assert!(!info.deleting && !info.to_be_deleted_by_autoscaler);
    }

    #[test]
    fn a_node_on_its_way_out_says_so() {
        let node = node(NODE_NAME, |n| {
            n.deleting()
                .taint(TAINT_TO_BE_DELETED_BY_AUTOSCALER, "NoSchedule")
                .internal_ip("not-an-ip")
        });

        let info = node_info(&node);

        assert!(info.deleting && info.to_be_deleted_by_autoscaler);
        assert!(info.addresses.is_empty());
    }
}
