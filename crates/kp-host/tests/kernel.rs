//! The address cache against the real kernel, in a network namespace each
//! test creates (root only). The node's interface is one end of a veth
//! pair (this kernel may lack the dummy driver) in the namespace, `eth0`, holding
//! the node address of the test plan, 192.168.99.2/24 and
//! fd00:192:168:99::2/64.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;
use std::time::Duration;

use kp_host::HostAddresses;
use kp_testkit::netns::{require_root, wait_until, Netns};

const NODE_IP: &str = "192.168.99.2";
const NODE_IP_V6: &str = "fd00:192:168:99::2";
const ADDED_IP: &str = "192.168.99.20";
const ADDED_IP_V6: &str = "fd00:192:168:99::20";
/// IPv6 announces a new address from a work queue, after `ip` returned.
const NOTIFICATION_TIMEOUT: Duration = Duration::from_secs(2);

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// A namespace with `eth0` (and its veth peer `peer0`) up, holding the node
/// addresses.
fn node() -> Netns {
    require_root();
    let node = Netns::create("host").unwrap();
    node.ip_batch(&[
        "link add eth0 type veth peer name peer0".to_owned(),
        "link set peer0 up".to_owned(),
        "link set eth0 up".to_owned(),
        format!("address add {NODE_IP}/24 dev eth0"),
        // No duplicate address detection: the address is usable at once.
        format!("address add {NODE_IP_V6}/64 dev eth0 nodad"),
    ])
    .unwrap();
    node
}

fn has(cache: &mut HostAddresses, address: &str) -> bool {
    cache.addresses().unwrap().contains(&ip(address))
}

#[test]
fn the_cache_lists_every_address_of_the_namespace_of_its_first_read() {
    let node = node();
    let listed = node.run(|| HostAddresses::new().addresses().unwrap().to_vec());
    for address in ["127.0.0.1", "::1", NODE_IP, NODE_IP_V6] {
        assert!(
            listed.contains(&ip(address)),
            "{address} missing in {listed:?}"
        );
    }
    // The link's IPv6 link-local address counts, as upstream's does.
    assert!(
        listed
            .iter()
            .any(|a| matches!(a, IpAddr::V6(v6) if v6.segments()[0] == 0xfe80)),
        "no link-local address in {listed:?}"
    );
}

#[test]
fn the_cache_sees_added_addresses_and_forgets_removed_ones_in_both_families() {
    let node = node();
    node.run(|| {
        let mut cache = HostAddresses::new();
        assert!(has(&mut cache, NODE_IP) && !has(&mut cache, ADDED_IP));
        let dumps = cache.dumps();
        assert!(has(&mut cache, NODE_IP_V6));
        assert_eq!(
            cache.dumps(),
            dumps,
            "nothing changed, yet the cache dumped"
        );

        node.ip(&["address", "add", &format!("{ADDED_IP}/24"), "dev", "eth0"])
            .unwrap();
        let v6 = format!("{ADDED_IP_V6}/64");
        node.ip(&["address", "add", &v6, "dev", "eth0", "nodad"])
            .unwrap();
        let seen = wait_until(NOTIFICATION_TIMEOUT, || {
            has(&mut cache, ADDED_IP) && has(&mut cache, ADDED_IP_V6)
        });
        assert!(seen, "added addresses not seen: {:?}", cache.addresses());

        node.ip(&["address", "del", &format!("{ADDED_IP}/24"), "dev", "eth0"])
            .unwrap();
        node.ip(&["address", "del", &v6, "dev", "eth0"]).unwrap();
        let forgotten = wait_until(NOTIFICATION_TIMEOUT, || {
            !has(&mut cache, ADDED_IP) && !has(&mut cache, ADDED_IP_V6)
        });
        assert!(
            forgotten,
            "removed addresses still listed: {:?}",
            cache.addresses()
        );
        assert!(has(&mut cache, NODE_IP) && has(&mut cache, NODE_IP_V6));
    });
}

#[test]
fn a_burst_that_overflows_the_notification_queue_is_dumped_at_once() {
    let node = node();
    node.run(|| {
        let mut cache = HostAddresses::new();
        assert!(has(&mut cache, NODE_IP));
        // IPv4 announces within the `ip` call: once `ip` returns, the
        // queue has overflowed (ENOBUFS) and holds a few notifications.
        let burst: Vec<String> = (0..2000u32)
            .map(|n| format!("address add 10.1.{}.{}/32 dev eth0", n / 250, n % 250 + 1))
            .collect();
        node.ip_batch(&burst).unwrap();
        let listed = cache.addresses().unwrap();
        assert!(
            listed.contains(&ip("10.1.7.250")),
            "last address of the burst missing"
        );
        assert_eq!(listed.iter().filter(|a| a.is_ipv4()).count(), 2000 + 2);
    });
}
