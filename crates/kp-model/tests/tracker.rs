//! Change trackers: squashing, cancelling out, and what a drain reports.
//!
//! Address plan: this node is `node-1`; pods 10.244.1.0/24 on it, 10.244.2.0/24
//! on `node-2`; ClusterIPs 10.96.0.0/16.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_model::{
    EndpointsChangeTracker, IpFamily, NamespacedName, ObjectEvent, Protocol, ServiceChangeTracker,
    ServicePortName, ANNOTATION_LAST_CHANGE_TRIGGER_TIME,
};
use kp_testkit::builders::{endpoint_slice, service, EndpointBuilder};
use pretty_assertions::assert_eq;

const NODE: &str = "node-1";

fn svc1() -> NamespacedName {
    NamespacedName::new("ns1", "svc1")
}

fn web(port: i32) -> Service {
    service("ns1", "svc1", |s| {
        s.cluster_ip("10.96.0.41").port("p80", port, "TCP")
    })
}

fn dns() -> Service {
    service("ns1", "svc1", |s| {
        s.cluster_ip("10.96.0.10")
            .port("dns", 53, "UDP")
            .port("dns-tcp", 53, "TCP")
    })
}

fn apply<T>(object: T) -> ObjectEvent<T> {
    ObjectEvent::Apply(object)
}

fn delete<T>(object: T) -> ObjectEvent<T> {
    ObjectEvent::Delete(object)
}

fn services() -> ServiceChangeTracker {
    ServiceChangeTracker::new(IpFamily::V4)
}

fn endpoints() -> EndpointsChangeTracker {
    EndpointsChangeTracker::new(IpFamily::V4, NODE)
}

/// Describes one endpoint's conditions and node.
type Conditions = fn(EndpointBuilder) -> EndpointBuilder;

/// A UDP `dns` slice `name` with one endpoint per (address, conditions).
fn dns_slice(name: &str, endpoints: &[(&str, Conditions)]) -> EndpointSlice {
    endpoint_slice("ns1", name, "svc1", |mut e| {
        e = e.port("dns", 53, "UDP");
        for (address, conditions) in endpoints {
            e = e.endpoint(*address, conditions);
        }
        e
    })
}

fn ready(ep: EndpointBuilder) -> EndpointBuilder {
    ep.ready(true).node("node-2")
}

fn dns_port() -> ServicePortName {
    ServicePortName::new(svc1(), "dns", Protocol::Udp)
}

#[test]
fn a_new_service_is_reported_once_at_drain() {
    let mut tracker = services();

    assert!(tracker.record(&apply(web(80))));
    assert_eq!(tracker.pending(), 1);
    let update = tracker.drain();

    assert_eq!(update.changed, BTreeSet::from([svc1()]));
    assert_eq!(tracker.pending(), 0);
    assert_eq!(tracker.service_ports().len(), 1);
    assert_eq!(tracker.drain().changed, BTreeSet::new());
}

#[test]
fn several_updates_before_a_drain_are_one_change_with_the_last_state() {
    let mut tracker = services();

    tracker.record(&apply(web(80)));
    tracker.record(&apply(web(81)));
    tracker.record(&apply(web(82)));

    assert_eq!(tracker.pending(), 1);
    assert_eq!(tracker.drain().changed.len(), 1);
    let port = tracker.service_ports().values().next().unwrap();
    assert_eq!(port.port, 82);
}

#[test]
fn going_back_to_the_drained_state_cancels_out() {
    let mut tracker = services();
    tracker.record(&apply(web(80)));
    tracker.drain();

    assert!(tracker.record(&apply(web(81))));
    assert!(!tracker.record(&apply(web(80))));

    assert_eq!(tracker.pending(), 0);
    assert_eq!(tracker.drain().changed, BTreeSet::new());
}

#[test]
fn a_service_added_and_deleted_between_drains_leaves_nothing() {
    let mut tracker = services();

    tracker.record(&apply(web(80)));
    assert!(!tracker.record(&delete(web(80))));

    assert_eq!(tracker.pending(), 0);
    assert_eq!(tracker.drain(), Default::default());
    assert!(tracker.service_ports().is_empty());
}

#[test]
fn a_deleted_udp_service_reports_its_cluster_ip() {
    let mut tracker = services();
    tracker.record(&apply(dns()));
    tracker.drain();

    tracker.record(&delete(dns()));
    let update = tracker.drain();

    assert_eq!(update.changed, BTreeSet::from([svc1()]));
    assert_eq!(
        update.deleted_cluster_ips,
        BTreeSet::from(["10.96.0.10".parse().unwrap()])
    );
    assert!(tracker.service_ports().is_empty());
}

#[test]
fn a_deleted_sctp_service_reports_its_cluster_ip_too() {
    let mut tracker = services();
    let sctp = || {
        service("ns1", "svc1", |s| {
            s.cluster_ip("10.96.0.10").port("assoc", 3868, "SCTP")
        })
    };
    tracker.record(&apply(sctp()));
    tracker.drain();

    tracker.record(&delete(sctp()));

    assert_eq!(
        tracker.drain().deleted_cluster_ips,
        BTreeSet::from(["10.96.0.10".parse().unwrap()])
    );
}

#[test]
fn removing_only_a_tcp_port_reports_no_udp_address() {
    let mut tracker = services();
    tracker.record(&apply(dns()));
    tracker.drain();

    tracker.record(&apply(service("ns1", "svc1", |s| {
        s.cluster_ip("10.96.0.10").port("dns", 53, "UDP")
    })));
    let update = tracker.drain();

    assert_eq!(update.changed.len(), 1);
    assert!(update.deleted_cluster_ips.is_empty());
    assert_eq!(tracker.service_ports().len(), 1);
}

#[test]
fn a_service_that_turns_invalid_keeps_its_last_good_state() {
    let mut tracker = services();
    tracker.record(&apply(web(80)));
    tracker.drain();

    tracker.record(&apply(web(0)));

    assert_eq!(tracker.pending(), 0);
    assert_eq!(tracker.drain().changed, BTreeSet::new());
    assert_eq!(tracker.service_ports().values().next().unwrap().port, 80);
}

#[test]
fn a_service_that_becomes_headless_loses_its_ports() {
    let mut tracker = services();
    tracker.record(&apply(web(80)));
    tracker.drain();

    tracker.record(&apply(service("ns1", "svc1", |s| {
        s.headless().port("p80", 80, "TCP")
    })));

    assert_eq!(tracker.drain().changed, BTreeSet::from([svc1()]));
    assert!(tracker.service_ports().is_empty());
}

#[test]
fn a_service_of_the_other_family_is_not_a_change() {
    let mut tracker = services();
    let v6 = service("ns1", "svc1", |s| {
        s.cluster_ip("fd00:10:96::41").port("p80", 80, "TCP")
    });

    assert!(!tracker.record(&apply(v6)));
    assert_eq!(tracker.pending(), 0);
}

#[test]
fn new_endpoints_are_reported_and_merged_across_slices() {
    let mut tracker = endpoints();

    tracker.record(&apply(dns_slice("svc1-a", &[("10.244.2.2", ready)])));
    assert!(tracker.record(&apply(dns_slice("svc1-b", &[("10.244.2.3", ready)]))));
    assert_eq!(tracker.pending(), 1);
    let update = tracker.drain();

    assert_eq!(update.changed, BTreeSet::from([svc1()]));
    assert_eq!(tracker.endpoints()[&dns_port()].len(), 2);
}

#[test]
fn a_slice_update_that_returns_to_the_drained_state_cancels_out() {
    let mut tracker = endpoints();
    tracker.record(&apply(dns_slice("svc1-a", &[("10.244.2.2", ready)])));
    tracker.drain();

    assert!(tracker.record(&apply(dns_slice("svc1-a", &[("10.244.2.3", ready)]))));
    assert!(!tracker.record(&apply(dns_slice("svc1-a", &[("10.244.2.2", ready)]))));

    assert_eq!(tracker.pending(), 0);
    assert_eq!(tracker.drain(), Default::default());
}

#[test]
fn an_endpoint_moving_between_slices_is_no_change() {
    let mut tracker = endpoints();
    tracker.record(&apply(dns_slice("svc1-a", &[("10.244.2.2", ready)])));
    tracker.drain();

    tracker.record(&apply(dns_slice("svc1-b", &[("10.244.2.2", ready)])));
    tracker.record(&apply(dns_slice("svc1-a", &[])));

    assert_eq!(tracker.pending(), 0);
}

#[test]
fn a_slice_added_and_deleted_between_drains_leaves_nothing() {
    let mut tracker = endpoints();

    tracker.record(&apply(dns_slice("svc1-a", &[("10.244.2.2", ready)])));
    assert!(!tracker.record(&delete(dns_slice("svc1-a", &[]))));

    assert_eq!(tracker.drain(), Default::default());
    assert!(tracker.endpoints().is_empty());
}

#[test]
fn a_slice_that_moves_to_another_service_leaves_the_first() {
    let mut tracker = endpoints();
    tracker.record(&apply(dns_slice("shared", &[("10.244.2.2", ready)])));
    tracker.drain();

    let moved = endpoint_slice("ns1", "shared", "svc2", |e| {
        e.port("dns", 53, "UDP")
            .endpoint("10.244.2.2", |ep| ep.ready(true))
    });
    tracker.record(&apply(moved));
    let update = tracker.drain();

    assert_eq!(
        update.changed,
        BTreeSet::from([svc1(), NamespacedName::new("ns1", "svc2")])
    );
    assert!(!tracker.endpoints().contains_key(&dns_port()));
    assert_eq!(tracker.endpoints().len(), 1);
}

#[test]
fn fqdn_and_other_family_slices_are_not_changes() {
    let mut tracker = endpoints();
    let fqdn = endpoint_slice("ns1", "svc1-fqdn", "svc1", |e| {
        e.address_type("FQDN")
            .port("p80", 80, "TCP")
            .endpoint("db.example.com", |ep| ep)
    });
    let v6 = endpoint_slice("ns1", "svc1-v6", "svc1", |e| {
        e.address_type("IPv6")
            .port("p80", 80, "TCP")
            .endpoint("fd00:10:244::2", |ep| ep)
    });

    assert!(!tracker.record(&apply(fqdn)));
    assert!(!tracker.record(&apply(v6)));
    assert_eq!(tracker.pending(), 0);
}

#[test]
fn endpoints_on_this_node_are_local() {
    let mut tracker = endpoints();
    tracker.record(&apply(dns_slice(
        "svc1-a",
        &[
            ("10.244.1.2", |ep| ep.node("node-1")),
            ("10.244.2.2", ready),
        ],
    )));
    tracker.drain();

    let local: Vec<bool> = tracker.endpoints()[&dns_port()]
        .iter()
        .map(|ep| ep.is_local)
        .collect();
    assert_eq!(local, vec![true, false]);
}

/// The `dns` slice with `address` ready, updated by a change at `trigger`
/// (`None`: no annotation).
fn triggered_slice(address: &str, trigger: Option<&str>) -> EndpointSlice {
    endpoint_slice("ns1", "svc1-a", "svc1", |mut e| {
        e = e.port("dns", 53, "UDP").endpoint(address, ready);
        if let Some(time) = trigger {
            e = e.annotation(ANNOTATION_LAST_CHANGE_TRIGGER_TIME, time);
        }
        e
    })
}

fn at(unix_secs: u64, millis: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(unix_secs) + Duration::from_millis(millis)
}

#[test]
fn a_drain_hands_over_the_trigger_times_of_the_slice_updates_behind_each_change() {
    let mut tracker = endpoints();

    tracker.record(&apply(triggered_slice(
        "10.244.2.3",
        Some("2026-11-24T10:00:00.250Z"),
    )));
    tracker.record(&apply(triggered_slice(
        "10.244.2.4",
        Some("2026-11-24T10:00:01Z"),
    )));
    let update = tracker.drain();

    // 2026-11-24T10:00:00Z is 1_795_514_400 seconds after the epoch.
    assert_eq!(
        update.trigger_times.get(&svc1()),
        Some(&vec![at(1_795_514_400, 250), at(1_795_514_401, 0)])
    );
    assert!(tracker.drain().trigger_times.is_empty(), "handed over once");
}

#[test]
fn trigger_times_of_a_change_that_cancelled_out_or_of_a_deleted_slice_are_dropped() {
    let mut tracker = endpoints();
    tracker.record(&apply(triggered_slice("10.244.2.3", None)));
    tracker.drain();

    // A change and its reversal before the next sync: nothing is programmed.
    tracker.record(&apply(triggered_slice(
        "10.244.2.4",
        Some("2026-11-24T10:00:01Z"),
    )));
    tracker.record(&apply(triggered_slice(
        "10.244.2.3",
        Some("2026-11-24T10:00:02Z"),
    )));
    assert!(tracker.drain().trigger_times.is_empty());

    // A deleted slice's annotation tells when it was last updated.
    tracker.record(&apply(triggered_slice(
        "10.244.2.5",
        Some("2026-11-24T10:00:03Z"),
    )));
    tracker.record(&delete(triggered_slice(
        "10.244.2.5",
        Some("2026-11-24T10:00:03Z"),
    )));
    let update = tracker.drain();
    assert_eq!(update.changed, BTreeSet::from([svc1()]));
    assert!(update.trigger_times.is_empty());
}

#[test]
fn an_unparsable_trigger_time_is_ignored_and_the_change_still_counts() {
    let mut tracker = endpoints();

    tracker.record(&apply(triggered_slice("10.244.2.3", Some("yesterday"))));
    let update = tracker.drain();

    assert_eq!(update.changed, BTreeSet::from([svc1()]));
    assert!(update.trigger_times.is_empty());
}
