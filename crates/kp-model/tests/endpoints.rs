//! Merging EndpointSlices into endpoints.
//!
//! Address plan: this node is `node-1`; pods 10.244.1.0/24 on it, 10.244.2.0/24
//! on `node-2`; IPv6 pods fd00:10:244::/48.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_model::{
    endpoints_from_slices, Endpoint, EndpointsMap, IpFamily, NamespacedName, Protocol,
    ServicePortName,
};
use kp_testkit::builders::endpoint_slice;
use pretty_assertions::assert_eq;

const NODE: &str = "node-1";

fn port_name(port: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName::new(NamespacedName::new("ns1", "svc1"), port, protocol)
}

fn p80() -> ServicePortName {
    port_name("p80", Protocol::Tcp)
}

fn merge(slices: &[EndpointSlice]) -> EndpointsMap {
    endpoints_from_slices(slices, IpFamily::V4, NODE)
}

/// `ip:port` of each endpoint of `name`.
#[track_caller]
fn addresses(map: &EndpointsMap, name: &ServicePortName) -> Vec<String> {
    map.get(name)
        .map(|endpoints| endpoints.iter().map(ToString::to_string).collect())
        .unwrap_or_default()
}

#[track_caller]
fn single(map: &EndpointsMap) -> Arc<Endpoint> {
    let endpoints = map.get(&p80()).expect("endpoints of ns1/svc1:p80");
    assert_eq!(endpoints.len(), 1);
    Arc::clone(&endpoints[0])
}

#[test]
fn slices_of_one_service_merge_sorted_by_address() {
    let first = endpoint_slice("ns1", "svc1-a", "svc1", |e| {
        e.port("p80", 8080, "TCP")
            .endpoint("10.244.2.9", |ep| ep)
            .endpoint("10.244.1.2", |ep| ep)
    });
    let second = endpoint_slice("ns1", "svc1-b", "svc1", |e| {
        e.port("p80", 8080, "TCP").endpoint("10.244.1.10", |ep| ep)
    });

    let map = merge(&[first, second]);

    assert_eq!(
        addresses(&map, &p80()),
        vec!["10.244.1.2:8080", "10.244.1.10:8080", "10.244.2.9:8080"]
    );
}

#[test]
fn each_slice_port_becomes_a_service_port_of_its_own() {
    let slice = endpoint_slice("ns1", "svc1-a", "svc1", |e| {
        e.port("dns", 5353, "UDP")
            .port("", 8080, "")
            .endpoint("10.244.1.2", |ep| ep)
    });

    let map = merge(&[slice]);

    assert_eq!(
        addresses(&map, &port_name("dns", Protocol::Udp)),
        vec!["10.244.1.2:5353"]
    );
    assert_eq!(
        addresses(&map, &port_name("", Protocol::Tcp)),
        vec!["10.244.1.2:8080"]
    );
    assert_eq!(map.len(), 2);
}

#[test]
fn an_address_in_two_slices_is_kept_once_preferring_the_local_copy() {
    let remote_copy = endpoint_slice("ns1", "svc1-a", "svc1", |e| {
        e.port("p80", 8080, "TCP")
            .endpoint("10.244.1.2", |ep| ep.node("node-9"))
    });
    let local_copy = endpoint_slice("ns1", "svc1-b", "svc1", |e| {
        e.port("p80", 8080, "TCP")
            .endpoint("10.244.1.2", |ep| ep.node("node-1"))
    });

    let map = merge(&[remote_copy, local_copy]);

    let endpoint = single(&map);
    assert!(endpoint.is_local);
    assert_eq!(endpoint.node_name.as_deref(), Some("node-1"));
}

#[test]
fn without_a_local_copy_the_first_slice_by_name_wins() {
    let later = endpoint_slice("ns1", "svc1-b", "svc1", |e| {
        e.port("p80", 8080, "TCP")
            .endpoint("10.244.2.2", |ep| ep.zone("zone-b"))
    });
    let earlier = endpoint_slice("ns1", "svc1-a", "svc1", |e| {
        e.port("p80", 8080, "TCP")
            .endpoint("10.244.2.2", |ep| ep.zone("zone-a"))
    });

    let map = merge(&[later, earlier]);

    assert_eq!(single(&map).zone.as_deref(), Some("zone-a"));
}

#[test]
fn slices_of_other_address_types_are_ignored() {
    let fqdn = endpoint_slice("ns1", "svc1-fqdn", "svc1", |e| {
        e.address_type("FQDN")
            .port("p80", 8080, "TCP")
            .endpoint("db.example.com", |ep| ep)
    });
    let v6 = endpoint_slice("ns1", "svc1-v6", "svc1", |e| {
        e.address_type("IPv6")
            .port("p80", 8080, "TCP")
            .endpoint("fd00:10:244::2", |ep| ep)
    });

    assert_eq!(merge(&[fqdn, v6.clone()]), EndpointsMap::new());
    let v6_map = endpoints_from_slices(&[v6], IpFamily::V6, NODE);
    assert_eq!(addresses(&v6_map, &p80()), vec!["[fd00:10:244::2]:8080"]);
}

#[test]
fn endpoints_that_do_not_parse_or_belong_to_the_other_family_are_skipped() {
    let slice = endpoint_slice("ns1", "svc1-a", "svc1", |e| {
        e.port("p80", 8080, "TCP")
            .endpoint("10.244.1.300", |ep| ep)
            .endpoint("fd00:10:244::2", |ep| ep)
            .endpoint_addresses(&[] as &[&str], |ep| ep)
            .endpoint("10.244.1.2", |ep| ep)
    });

    assert_eq!(addresses(&merge(&[slice]), &p80()), vec!["10.244.1.2:8080"]);
}

#[test]
fn ports_without_a_usable_number_or_protocol_are_skipped() {
    let slice = endpoint_slice("ns1", "svc1-a", "svc1", |e| {
        e.port("zero", 0, "TCP")
            .port("big", 70000, "TCP")
            .port_without_number("none", "TCP")
            .port("quic", 443, "QUIC")
            .port("p80", 8080, "TCP")
            .endpoint("10.244.1.2", |ep| ep)
    });

    let map = merge(&[slice]);

    assert_eq!(map.keys().cloned().collect::<Vec<_>>(), vec![p80()]);
}

#[test]
fn a_slice_without_endpoints_or_service_label_adds_nothing() {
    let empty = endpoint_slice("ns1", "svc1-a", "svc1", |e| e.port("p80", 8080, "TCP"));
    let orphan = endpoint_slice("ns1", "orphan", "svc1", |e| {
        e.without_service_name()
            .port("p80", 8080, "TCP")
            .endpoint("10.244.1.2", |ep| ep)
    });

    assert_eq!(merge(&[empty, orphan]), EndpointsMap::new());
}

#[test]
fn unset_conditions_mean_ready_serving_and_not_terminating() {
    let slice = endpoint_slice("ns1", "svc1-a", "svc1", |e| {
        e.port("p80", 8080, "TCP").endpoint("10.244.1.2", |ep| ep)
    });

    let endpoint = single(&merge(&[slice]));

    assert!(endpoint.ready && endpoint.serving && !endpoint.terminating);
}

#[test]
fn unset_serving_follows_ready() {
    let slice = endpoint_slice("ns1", "svc1-a", "svc1", |e| {
        e.port("p80", 8080, "TCP")
            .endpoint("10.244.1.2", |ep| ep.ready(false).terminating(true))
    });

    let endpoint = single(&merge(&[slice]));

    assert!(!endpoint.ready && !endpoint.serving && endpoint.terminating);
}

#[test]
fn an_endpoint_carries_its_node_zone_and_hints() {
    let slice = endpoint_slice("ns1", "svc1-a", "svc1", |e| {
        e.port("p80", 8080, "TCP").endpoint("10.244.2.2", |ep| {
            ep.node("node-2")
                .zone("zone-b")
                .hints_zones(&["zone-b", "zone-c"])
                .hints_nodes(&[])
        })
    });

    let endpoint = single(&merge(&[slice]));

    assert!(!endpoint.is_local);
    assert_eq!(endpoint.node_name.as_deref(), Some("node-2"));
    assert_eq!(endpoint.zone.as_deref(), Some("zone-b"));
    let zones: BTreeSet<String> = ["zone-b", "zone-c"].map(String::from).into();
    assert_eq!(endpoint.zone_hints, Some(zones));
    assert_eq!(
        endpoint.node_hints, None,
        "an empty hint list counts as none"
    );
}

#[test]
fn without_a_node_name_of_our_own_nothing_is_local() {
    let slice = endpoint_slice("ns1", "svc1-a", "svc1", |e| {
        e.port("p80", 8080, "TCP").endpoint("10.244.1.2", |ep| ep)
    });

    let map = endpoints_from_slices(&[slice], IpFamily::V4, "");

    assert!(!map[&p80()][0].is_local);
}
