//! Chain names against the literal names in upstream's proxier_test.go.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kp_iptables::names::{endpoint_chain_name, service_chain_name, ChainNameCache};
use kp_iptables::ChainKind;
use kp_model::{NamespacedName, Protocol, ServicePortName};

fn port(namespace: &str, name: &str, port: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName {
        service: NamespacedName {
            namespace: namespace.into(),
            name: name.into(),
        },
        port: port.into(),
        protocol,
    }
}

fn p80(n: u8) -> ServicePortName {
    port(&format!("ns{n}"), &format!("svc{n}"), "p80", Protocol::Tcp)
}

#[test]
fn service_chains_match_upstream_test_expectations() {
    let expected = [
        (1, "XPGD46QRK7WJZT7O"),
        (2, "GNZBNJ2PO5MGZ6GT"),
        (3, "X27LE4BHSL4DOUIK"),
        (4, "4SW47YFZTEDKD3PK"),
        (5, "NUKIZ6OKUXPJNT4C"),
    ];
    for (n, hash) in expected {
        let name = p80(n);
        assert_eq!(
            service_chain_name(&name, ChainKind::Cluster).to_string(),
            format!("KUBE-SVC-{hash}")
        );
        assert_eq!(
            service_chain_name(&name, ChainKind::Local).to_string(),
            format!("KUBE-SVL-{hash}")
        );
        assert_eq!(
            service_chain_name(&name, ChainKind::External).to_string(),
            format!("KUBE-EXT-{hash}")
        );
        assert_eq!(
            service_chain_name(&name, ChainKind::Firewall).to_string(),
            format!("KUBE-FW-{hash}")
        );
    }
}

#[test]
fn endpoint_chains_match_upstream_test_expectations() {
    let expected = [
        (1, "10.180.0.1:80", "KUBE-SEP-SXIVWICOYRO3J4NJ"),
        (2, "10.180.0.2:80", "KUBE-SEP-RS4RBKLTHTF2IUXJ"),
        (3, "10.180.0.3:80", "KUBE-SEP-OYPFS5VJICHGATKP"),
        (4, "10.180.0.4:80", "KUBE-SEP-UKSFD7AGPMPPLUHC"),
        (4, "10.180.0.5:80", "KUBE-SEP-C6EBXVWJJZMIWKLZ"),
        (5, "10.180.0.3:80", "KUBE-SEP-I77PXRDZVX7PMWMN"),
    ];
    for (n, endpoint, chain) in expected {
        let got = endpoint_chain_name(&p80(n), endpoint.parse().unwrap());
        assert_eq!(got.to_string(), chain, "ns{n}/svc{n}:p80 -> {endpoint}");
    }
}

#[test]
fn protocol_is_part_of_the_hash() {
    let tcp = port("ns1", "svc1", "p80", Protocol::Tcp);
    let udp = port("ns1", "svc1", "p80", Protocol::Udp);
    assert_ne!(
        service_chain_name(&tcp, ChainKind::Cluster),
        service_chain_name(&udp, ChainKind::Cluster)
    );
}

#[test]
fn cache_gives_the_same_names_and_forgets_unused_ones() {
    let mut cache = ChainNameCache::new();
    let endpoint = "10.180.0.1:80".parse().unwrap();
    cache.begin();
    let cached = cache.touch(&p80(1), [endpoint].into_iter()).unwrap();
    // The text the renderer writes in comments and hashes into chain names.
    assert_eq!(p80(1).to_string(), "ns1/svc1:p80");
    assert_eq!(
        cached.chain(ChainKind::Cluster).to_string(),
        "KUBE-SVC-XPGD46QRK7WJZT7O"
    );
    assert_eq!(
        cached.endpoint(&endpoint).unwrap().chain.to_string(),
        "KUBE-SEP-SXIVWICOYRO3J4NJ"
    );
    cache.prune();
    assert_eq!(cache.len(), 1);

    cache.begin();
    cache.touch(&p80(2), std::iter::empty()).unwrap();
    cache.prune();
    assert_eq!(cache.len(), 1, "ns1/svc1 was not used by the second render");
}
