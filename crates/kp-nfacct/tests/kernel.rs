//! Kernel tests: nfacct counters in a namespace of their own, counting real
//! packets that an `iptables -m nfacct` rule matches.
//!
//! Address plan: loopback only (127.0.0.1 inside the test namespace).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::UdpSocket;

use kp_nfacct::{Counts, NfacctClient};
use kp_testkit::netns::{require_root, require_tool, Netns};

const COUNTER: &str = "kp_test_pkts";

#[test]
fn a_created_counter_counts_the_packets_a_rule_matches() {
    require_root();
    require_tool("iptables-legacy");
    let ns = Netns::create("nfacct").unwrap();

    let created = ns.run(|| {
        let mut client = NfacctClient::new();
        client.ensure(COUNTER).unwrap();
        // A second start finds it in place.
        client.ensure(COUNTER).unwrap();
        client.get(COUNTER).unwrap()
    });
    assert_eq!(created, Counts::default());

    ns.exec_ok(
        "iptables-legacy",
        &[
            "-A",
            "OUTPUT",
            "-p",
            "udp",
            "--dport",
            "9",
            "-m",
            "nfacct",
            "--nfacct-name",
            COUNTER,
        ],
    );
    let counted = ns.run(|| {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..3 {
            socket.send_to(b"ping", "127.0.0.1:9").unwrap();
        }
        NfacctClient::new().get(COUNTER).unwrap()
    });

    assert_eq!(counted.packets, 3);
    assert_eq!(
        counted.bytes,
        3 * (20 + 8 + 4),
        "IPv4 and UDP headers and 4 bytes"
    );
}

#[test]
fn a_missing_counter_is_reported_as_not_found() {
    require_root();
    let ns = Netns::create("nfacct-none").unwrap();

    let error = ns.run(|| NfacctClient::new().get("kp_never_created").unwrap_err());

    assert!(error.is_not_found(), "{error}");
}
