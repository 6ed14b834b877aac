//! The address plan every test uses (see TESTING.md).
//!
//! | what | range |
//! |---|---|
//! | pod IPs | 10.244.0.0/16 (this node's pods 10.244.1.0/24) |
//! | service ClusterIPs | 10.96.0.0/16 |
//! | node and client network | 192.168.99.0/24 (node .2, client .10) |
//! | external / LoadBalancer IPs | 203.0.113.0/24 (TEST-NET-3) |
//! | IPv6 | fd00:10:244::/48 pods, fd00:10:96::/112 services, fd00:192:168:99::/64 nodes |
//!
//! These addresses exist only inside test network namespaces.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

/// Name of the node the proxy under test runs on.
pub const NODE_NAME: &str = "node-1";
/// Name of another node of the cluster.
pub const OTHER_NODE_NAME: &str = "node-2";
/// Zone of [`NODE_NAME`].
pub const NODE_ZONE: &str = "zone-a";
/// Another zone.
pub const OTHER_ZONE: &str = "zone-b";

/// Every pod IP of the cluster.
pub const POD_CIDR: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(10, 244, 0, 0), 16);
/// Pod IPs of this node ([`NODE_NAME`]).
pub const NODE_POD_CIDR: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(10, 244, 1, 0), 24);
/// Pod IPs of [`OTHER_NODE_NAME`].
pub const OTHER_NODE_POD_CIDR: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(10, 244, 2, 0), 24);
/// Service ClusterIPs.
pub const SERVICE_CIDR: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(10, 96, 0, 0), 16);
/// The network of nodes and the outside client.
pub const NODE_NETWORK: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(192, 168, 99, 0), 24);
/// This node's address.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 99, 2);
/// The other node's address.
pub const OTHER_NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 99, 3);
/// The client outside the cluster.
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 99, 10);
/// External and LoadBalancer IPs (TEST-NET-3, RFC 5737).
pub const EXTERNAL_CIDR: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(203, 0, 113, 0), 24);

/// Every IPv6 pod IP of the cluster.
pub const POD_CIDR_V6: Ipv6Net =
    Ipv6Net::new_assert(Ipv6Addr::new(0xfd00, 0x10, 0x244, 0, 0, 0, 0, 0), 48);
/// IPv6 pod IPs of this node.
pub const NODE_POD_CIDR_V6: Ipv6Net =
    Ipv6Net::new_assert(Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 0), 64);
/// IPv6 service ClusterIPs.
pub const SERVICE_CIDR_V6: Ipv6Net =
    Ipv6Net::new_assert(Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0), 112);
/// The IPv6 network of nodes and the outside client.
pub const NODE_NETWORK_V6: Ipv6Net =
    Ipv6Net::new_assert(Ipv6Addr::new(0xfd00, 0x192, 0x168, 0x99, 0, 0, 0, 0), 64);
/// This node's IPv6 address.
pub const NODE_IP_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x192, 0x168, 0x99, 0, 0, 0, 2);
/// The outside client's IPv6 address.
pub const CLIENT_IP_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x192, 0x168, 0x99, 0, 0, 0, 0x10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_addresses_lie_in_their_ranges() {
        assert!(POD_CIDR.contains(&NODE_POD_CIDR));
        assert!(POD_CIDR.contains(&OTHER_NODE_POD_CIDR));
        assert!(NODE_NETWORK.contains(&NODE_IP));
        assert!(NODE_NETWORK.contains(&CLIENT_IP));
        assert!(POD_CIDR_V6.contains(&NODE_POD_CIDR_V6));
        assert!(NODE_NETWORK_V6.contains(&NODE_IP_V6));
        assert!(NODE_NETWORK_V6.contains(&CLIENT_IP_V6));
        assert_eq!(SERVICE_CIDR_V6.to_string(), "fd00:10:96::/112");
    }
}
