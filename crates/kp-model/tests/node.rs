//! What the proxy takes from its own Node.
//!
//! Address plan: the node is 192.168.99.2 (fd00:192:168:99::2), its pods
//! 10.244.1.0/24 and fd00:10:244:1::/64.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use kp_model::{IpFamily, NodeInfo};
use kp_testkit::builders::node;
use pretty_assertions::assert_eq;

#[test]
fn a_node_yields_its_name_zone_addresses_and_pod_cidrs() {
    let info = NodeInfo::from_node(&node("node-1", |n| {
        n.zone("zone-a")
            .internal_ip("192.168.99.2")
            .address("Hostname", "node-1")
            .internal_ip("fd00:192:168:99::2")
            .external_ip("not-an-ip")
            .pod_cidr("10.244.1.0/24")
            .pod_cidr("fd00:10:244:1::/64")
    }));

    assert_eq!(info.name, "node-1");
    assert_eq!(info.zone(), Some("zone-a"));
    let addresses: Vec<String> = info.addresses.iter().map(ToString::to_string).collect();
    assert_eq!(addresses, vec!["192.168.99.2", "fd00:192:168:99::2"]);
    let v6: Vec<String> = info
        .addresses_of(IpFamily::V6)
        .map(|ip| ip.to_string())
        .collect();
    assert_eq!(v6, vec!["fd00:192:168:99::2"]);
    let cidrs: Vec<String> = info.pod_cidrs.iter().map(ToString::to_string).collect();
    assert_eq!(cidrs, vec!["10.244.1.0/24", "fd00:10:244:1::/64"]);
    assert!(!info.deleting && !info.to_be_deleted_by_autoscaler);
}

#[test]
fn a_node_on_its_way_out_says_so() {
    let info = NodeInfo::from_node(&node("node-1", |n| {
        n.deleting()
            .taint("ToBeDeletedByClusterAutoscaler", "NoSchedule")
    }));

    assert!(info.deleting);
    assert!(info.to_be_deleted_by_autoscaler);
    assert_eq!(info.zone(), None);
}
