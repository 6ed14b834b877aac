//! The address plan every test uses (see TESTING.md).
//!
//! | what | range |
//! |---|---|
//! | pod IPs | 10.244.0.0/16 (this node's pods 10.244.1.0/24) |
//! | service ClusterIPs | 10.96.0.0/16 |
//! | node and client network | 192.168.99.0/24 (fabric .1, node .2, further nodes .3, .4, …, clients .10, .11, …) |
//! | external / LoadBalancer IPs | 203.0.113.0/24 (TEST-NET-3) |
//! | IPv6 | fd00:10:244::/48 pods, fd00:10:96::/112 services, fd00:192:168:99::/64 nodes |
//!
//! These addresses exist only inside test network namespaces.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

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
/// A second client outside the cluster (source-range tests).
pub const SECOND_CLIENT_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 99, 11);
/// The fabric's own address on the node network in a multi-node
/// [`Cluster`](crate::netns::Cluster): where the test API server listens,
/// reached by every node over the fabric.
pub const FABRIC_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 99, 1);
/// The fabric's IPv6 address.
pub const FABRIC_IP_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x192, 0x168, 0x99, 0, 0, 0, 1);
/// An address of the node network that no host owns: packets to it go
/// unanswered (ARP never resolves), which is how tests provoke a timeout.
pub const UNUSED_NODE_NETWORK_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 99, 250);
/// External and LoadBalancer IPs (TEST-NET-3, RFC 5737).
pub const EXTERNAL_CIDR: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(203, 0, 113, 0), 24);

/// Every IPv6 pod IP of the cluster.
pub const POD_CIDR_V6: Ipv6Net =
    Ipv6Net::new_assert(Ipv6Addr::new(0xfd00, 0x10, 0x244, 0, 0, 0, 0, 0), 48);
/// IPv6 pod IPs of this node.
pub const NODE_POD_CIDR_V6: Ipv6Net =
    Ipv6Net::new_assert(Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 0), 64);
/// IPv6 pod IPs of [`OTHER_NODE_NAME`].
pub const OTHER_NODE_POD_CIDR_V6: Ipv6Net =
    Ipv6Net::new_assert(Ipv6Addr::new(0xfd00, 0x10, 0x244, 2, 0, 0, 0, 0), 64);
/// IPv6 service ClusterIPs.
pub const SERVICE_CIDR_V6: Ipv6Net =
    Ipv6Net::new_assert(Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0), 112);
/// The IPv6 network of nodes and the outside client.
pub const NODE_NETWORK_V6: Ipv6Net =
    Ipv6Net::new_assert(Ipv6Addr::new(0xfd00, 0x192, 0x168, 0x99, 0, 0, 0, 0), 64);
/// This node's IPv6 address.
pub const NODE_IP_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x192, 0x168, 0x99, 0, 0, 0, 2);
/// The other node's IPv6 address.
pub const OTHER_NODE_IP_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x192, 0x168, 0x99, 0, 0, 0, 3);
/// The outside client's IPv6 address.
pub const CLIENT_IP_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x192, 0x168, 0x99, 0, 0, 0, 0x10);
/// The second client's IPv6 address.
pub const SECOND_CLIENT_IP_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x192, 0x168, 0x99, 0, 0, 0, 0x11);
/// IPv6 external and LoadBalancer IPs (inside the documentation prefix
/// 2001:db8::/32, RFC 3849).
pub const EXTERNAL_CIDR_V6: Ipv6Net =
    Ipv6Net::new_assert(Ipv6Addr::new(0x2001, 0xdb8, 0x203, 0x113, 0, 0, 0, 0), 64);

/// The `index`-th address of this node's pod range, counting from `.2`
/// (`.1` is left out, as CNI plugins keep it for the gateway): index 0 is
/// 10.244.1.2, index 252 is 10.244.1.254; larger indexes wrap around.
pub fn node_pod_ip(index: u8) -> Ipv4Addr {
    nth_host_v4(NODE_POD_CIDR, index)
}

/// The `index`-th IPv6 address of this node's pod range: index 0 is
/// fd00:10:244:1::2.
pub fn node_pod_ip_v6(index: u8) -> Ipv6Addr {
    nth_host_v6(NODE_POD_CIDR_V6, index)
}

/// The `index`-th address of the other node's pod range: index 0 is
/// 10.244.2.2.
pub fn other_node_pod_ip(index: u8) -> Ipv4Addr {
    nth_host_v4(OTHER_NODE_POD_CIDR, index)
}

/// The `index`-th IPv6 address of the other node's pod range: index 0 is
/// fd00:10:244:2::2.
pub fn other_node_pod_ip_v6(index: u8) -> Ipv6Addr {
    nth_host_v6(OTHER_NODE_POD_CIDR_V6, index)
}

/// The address of the `index`-th client outside the cluster: index 0 is
/// [`CLIENT_IP`], index 1 [`SECOND_CLIENT_IP`], and so on (.10 + index).
pub fn client_ip(index: u8) -> Ipv4Addr {
    let [a, b, c, d] = CLIENT_IP.octets();
    Ipv4Addr::new(a, b, c, d.wrapping_add(index))
}

/// The IPv6 address of the `index`-th client: index 0 is [`CLIENT_IP_V6`].
pub fn client_ip_v6(index: u8) -> Ipv6Addr {
    let mut segments = CLIENT_IP_V6.segments();
    segments[7] += u16::from(index);
    Ipv6Addr::from(segments)
}

/// The address of the `index`-th node of a multi-node cluster: index 0 is
/// [`NODE_IP`] (.2), index 1 [`OTHER_NODE_IP`] (.3), and so on (.2 + index).
pub fn cluster_node_ip(index: u8) -> Ipv4Addr {
    let [a, b, c, d] = NODE_IP.octets();
    Ipv4Addr::new(a, b, c, d.wrapping_add(index))
}

/// The IPv6 address of the `index`-th node: index 0 is [`NODE_IP_V6`].
pub fn cluster_node_ip_v6(index: u8) -> Ipv6Addr {
    let mut segments = NODE_IP_V6.segments();
    segments[7] += u16::from(index);
    Ipv6Addr::from(segments)
}

/// The pod range of the `index`-th node of a multi-node cluster,
/// 10.244.(1 + index).0/24: index 0 is [`NODE_POD_CIDR`], index 1
/// [`OTHER_NODE_POD_CIDR`].
pub fn cluster_pod_cidr(index: u8) -> Ipv4Net {
    Ipv4Net::new_assert(Ipv4Addr::new(10, 244, index.wrapping_add(1), 0), 24)
}

/// The IPv6 pod range of the `index`-th node, fd00:10:244:(1 + index)::/64.
pub fn cluster_pod_cidr_v6(index: u8) -> Ipv6Net {
    let mut segments = NODE_POD_CIDR_V6.network().segments();
    segments[3] += u16::from(index);
    Ipv6Net::new_assert(Ipv6Addr::from(segments), 64)
}

/// The `pod`-th address of the `node`-th node's pod range, counting from
/// `.2` as [`node_pod_ip`] does: `(0, 0)` is 10.244.1.2, `(2, 1)` is
/// 10.244.3.3.
pub fn cluster_pod_ip(node: u8, pod: u8) -> Ipv4Addr {
    nth_host_v4(cluster_pod_cidr(node), pod)
}

/// The IPv6 address of the `pod`-th pod of the `node`-th node.
pub fn cluster_pod_ip_v6(node: u8, pod: u8) -> Ipv6Addr {
    nth_host_v6(cluster_pod_cidr_v6(node), pod)
}

fn nth_host_v4(net: Ipv4Net, index: u8) -> Ipv4Addr {
    let mut octets = net.network().octets();
    octets[3] = index % 253 + 2;
    Ipv4Addr::from(octets)
}

fn nth_host_v6(net: Ipv6Net, index: u8) -> Ipv6Addr {
    let mut segments = net.network().segments();
    segments[7] = u16::from(index) + 2;
    Ipv6Addr::from(segments)
}

/// The node's address of one family (IPv6 with `ipv6`) at `port`.
pub fn node_at(ipv6: bool, port: u16) -> SocketAddr {
    let ip = if ipv6 {
        IpAddr::V6(NODE_IP_V6)
    } else {
        IpAddr::V4(NODE_IP)
    };
    SocketAddr::new(ip, port)
}

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
        assert!(NODE_NETWORK.contains(&SECOND_CLIENT_IP));
        assert!(NODE_NETWORK.contains(&UNUSED_NODE_NETWORK_IP));
        assert!(NODE_NETWORK_V6.contains(&SECOND_CLIENT_IP_V6));
        assert!(POD_CIDR_V6.contains(&OTHER_NODE_POD_CIDR_V6));
    }

    #[test]
    fn numbered_addresses_count_from_the_start_of_their_range() {
        assert_eq!(node_pod_ip(0).to_string(), "10.244.1.2");
        assert_eq!(node_pod_ip(3).to_string(), "10.244.1.5");
        assert_eq!(node_pod_ip_v6(0).to_string(), "fd00:10:244:1::2");
        assert_eq!(other_node_pod_ip(0).to_string(), "10.244.2.2");
        assert_eq!(other_node_pod_ip_v6(1).to_string(), "fd00:10:244:2::3");
        assert_eq!(client_ip(0), CLIENT_IP);
        assert_eq!(client_ip(1), SECOND_CLIENT_IP);
        assert_eq!(client_ip_v6(0), CLIENT_IP_V6);
        assert_eq!(client_ip_v6(1), SECOND_CLIENT_IP_V6);
        assert_eq!(node_pod_ip(252).to_string(), "10.244.1.254");
        assert_eq!(node_pod_ip(253), node_pod_ip(0));
    }

    #[test]
    fn cluster_nodes_extend_the_single_node_plan() {
        assert_eq!(cluster_node_ip(0), NODE_IP);
        assert_eq!(cluster_node_ip(1), OTHER_NODE_IP);
        assert_eq!(cluster_node_ip(2).to_string(), "192.168.99.4");
        assert_eq!(cluster_node_ip_v6(0), NODE_IP_V6);
        assert_eq!(cluster_node_ip_v6(1), OTHER_NODE_IP_V6);
        assert_eq!(cluster_pod_cidr(0), NODE_POD_CIDR);
        assert_eq!(cluster_pod_cidr(1), OTHER_NODE_POD_CIDR);
        assert_eq!(cluster_pod_cidr_v6(1), OTHER_NODE_POD_CIDR_V6);
        assert_eq!(cluster_pod_ip(0, 0), node_pod_ip(0));
        assert_eq!(cluster_pod_ip(2, 1).to_string(), "10.244.3.3");
        assert_eq!(cluster_pod_ip_v6(2, 0).to_string(), "fd00:10:244:3::2");
        assert!(NODE_NETWORK.contains(&FABRIC_IP));
        assert!(NODE_NETWORK_V6.contains(&FABRIC_IP_V6));
    }
}
