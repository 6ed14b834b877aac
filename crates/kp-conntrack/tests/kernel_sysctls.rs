//! Kernel test: the conntrack sysctls set through the real `/proc/sys`,
//! inside a network namespace of the test's own (the per-namespace
//! timeouts and `tcp_be_liberal`; `nf_conntrack_max` and the hash size are
//! global and stay untouched).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;

use kp_config::{GoDuration, KubeProxyConntrackConfiguration};
use kp_conntrack::apply_conntrack_sysctls;
use kp_testkit::netns::{require_root, Netns};
use pretty_assertions::assert_eq;

const NAMES: [&str; 4] = [
    "nf_conntrack_tcp_timeout_close_wait",
    "nf_conntrack_tcp_be_liberal",
    "nf_conntrack_udp_timeout",
    "nf_conntrack_udp_timeout_stream",
];

/// The values of [`NAMES`] as the calling thread's namespace sees them.
fn read_all() -> Vec<String> {
    NAMES
        .iter()
        .map(|name| {
            let path = format!("/proc/sys/net/netfilter/{name}");
            fs::read_to_string(&path).unwrap().trim().to_owned()
        })
        .collect()
}

#[test]
fn timeouts_and_be_liberal_are_set_in_the_proxys_namespace_only() {
    require_root();
    let node = Netns::create("node").unwrap();
    let outside_before = read_all();
    let config = KubeProxyConntrackConfiguration {
        max_per_core: Some(0),
        min: Some(0),
        tcp_established_timeout: Some(GoDuration::ZERO),
        tcp_close_wait_timeout: Some(GoDuration::from_secs(1234)),
        tcp_be_liberal: true,
        udp_timeout: GoDuration::from_secs(45),
        udp_stream_timeout: GoDuration::from_secs(101),
    };

    let (report, inside) = node.run(|| (apply_conntrack_sysctls(&config), read_all()));

    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(inside, ["1234", "1", "45", "101"]);
    assert_eq!(
        read_all(),
        outside_before,
        "the test's own namespace is unchanged"
    );
}
