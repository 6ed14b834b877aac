//! Tests of `trace`: destinations, the node's own source, the summed
//! outcome and the data layout's draw in words.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

#[test]
fn destination_parses_address_port_and_protocol() {
    let d: Destination = "10.96.0.10:53/UDP".parse().unwrap();
    assert_eq!(d.addr, "10.96.0.10:53".parse().unwrap());
    assert_eq!(d.protocol, Protocol::Udp);
    let d: Destination = "[fd00:10:96::a]:80".parse().unwrap();
    assert_eq!(d.protocol, Protocol::Tcp);
    assert_eq!(d.addr.port(), 80);
    let error = "10.96.0.10/tcp".parse::<Destination>().unwrap_err();
    assert!(error.contains("ADDRESS:PORT"), "{error}");
    let error = "10.96.0.10:80/icmp".parse::<Destination>().unwrap_err();
    assert!(error.contains("\"icmp\""), "{error}");
}

#[test]
fn a_process_of_the_node_reaches_an_address_of_the_node_from_that_address() {
    let ip = |text: &str| text.parse::<IpAddr>().unwrap();
    // The IPVS mode's kube-ipvs0 holds the Service addresses.
    let local = [
        ip("127.0.0.1"),
        ip("10.96.0.10"),
        ip("10.96.0.17"),
        ip("192.168.99.2"),
    ];
    assert_eq!(
        own_source(&local, IpFamily::V4, ip("10.96.0.17")),
        ip("10.96.0.17")
    );
    assert_eq!(
        own_source(&local, IpFamily::V4, ip("192.168.99.2")),
        ip("192.168.99.2")
    );
    // Not an address of the node (a ClusterIP in the iptables modes):
    // the first address that is not a loopback one.
    let iptables_node = [ip("127.0.0.1"), ip("192.168.99.2")];
    assert_eq!(
        own_source(&iptables_node, IpFamily::V4, ip("10.96.0.17")),
        ip("192.168.99.2")
    );
    assert_eq!(
        own_source(&local, IpFamily::V4, ip("127.0.0.1")),
        ip("127.0.0.1")
    );
    assert_eq!(
        own_source(&[], IpFamily::V6, ip("fd00:10:96::a")),
        ip("::1")
    );
}

#[test]
fn only_einval_says_the_kernel_has_no_nftables() {
    // EINVAL is 22 on every Linux architecture; EPERM, ENOENT, EACCES,
    // EOPNOTSUPP (x86) and ENOBUFS are failures of another kind.
    assert!(is_invalid_argument(22));
    for other in [1, 2, 13, 95, 105] {
        assert!(!is_invalid_argument(other), "errno {other}");
    }
}

fn path(verdict: Verdict, endpoint: Option<&str>, probability: f64, masq: bool) -> Path {
    Path {
        probability,
        verdict,
        endpoint: endpoint.map(|e| e.parse().unwrap()),
        masqueraded: masq,
        affinity: Vec::new(),
        rules: Vec::new(),
        elements: Vec::new(),
        not_followed: Vec::new(),
    }
}

#[test]
fn a_data_layout_path_names_its_count_set_slot_map_and_endpoint() {
    let mut drawn = path(Verdict::Accept, Some("10.244.1.3:8080"), 1.0 / 3.0, false);
    drawn.rules = vec![
        "service-ips: 10.96.0.10 . tcp . 80 : goto service-X".to_owned(),
        "service-X: goto endpoints-by-count-tcp".to_owned(),
        "endpoints-by-count-tcp: ip daddr . meta l4proto . th dport @endpoint-count-3 dnat ip \
         to ip daddr . tcp dport . numgen random mod 3 map @service-endpoints-tcp"
            .to_owned(),
    ];
    drawn.elements = vec![
        "endpoint-count-3: 10.96.0.10 . tcp . 80".to_owned(),
        "service-endpoints-tcp: 10.96.0.10 . 80 . 1 : 10.244.1.3 . 8080".to_owned(),
    ];
    assert_eq!(
        drawn_slot(&drawn).as_deref(),
        Some(
            "drawn: the entry 10.96.0.10 . 80 is in endpoint-count-3, so slot 1 of 3 was drawn: \
             element 10.96.0.10 . 80 . 1 of map service-endpoints-tcp holds the endpoint \
             10.244.1.3:8080"
        )
    );
    drawn.elements = vec![
        "nodeport-count-3: tcp . 30080".to_owned(),
        "nodeport-endpoints-tcp: 30080 . 1 : fd00:10:244::3 . 8080".to_owned(),
    ];
    let text = drawn_slot(&drawn).unwrap();
    assert!(
        text.starts_with("drawn: the entry 30080 is in nodeport-count-3, so slot 1 of 3"),
        "{text}"
    );
    assert!(
        text.ends_with("holds the endpoint [fd00:10:244::3]:8080"),
        "{text}"
    );
    // The chains layout: no draw.
    assert_eq!(drawn_slot(&path(Verdict::Accept, None, 1.0, false)), None);
}

#[test]
fn outcome_sums_the_paths_per_endpoint() {
    let paths = [
        path(Verdict::Accept, Some("10.244.1.2:80"), 0.25, true),
        path(Verdict::Accept, Some("10.244.1.3:80"), 0.5, false),
        path(Verdict::Accept, Some("10.244.1.2:80"), 0.25, true),
    ];
    let Outcome::Dnat {
        endpoints,
        masqueraded,
    } = outcome(&paths)
    else {
        panic!("not DNAT");
    };
    assert_eq!(masqueraded, Masquerade::Some);
    assert_eq!(endpoints.len(), 2);
    assert_eq!(endpoints[0].endpoint, "10.244.1.2:80".parse().unwrap());
    assert!((endpoints[0].probability - 0.5).abs() < 1e-9);
    assert_eq!(
        outcome(&[path(Verdict::Reject, None, 1.0, false)]),
        Outcome::Reject
    );
    assert_eq!(
        outcome(&[path(Verdict::Drop, None, 1.0, false)]),
        Outcome::Drop
    );
    assert_eq!(
        outcome(&[path(Verdict::Accept, None, 1.0, false)]),
        Outcome::NotAService
    );
    assert_eq!(
        outcome(&[
            path(Verdict::Drop, None, 0.5, false),
            path(Verdict::Accept, Some("10.244.1.2:80"), 0.5, false)
        ]),
        Outcome::Mixed
    );
    assert_eq!(outcome(&[]), Outcome::Mixed);
}
