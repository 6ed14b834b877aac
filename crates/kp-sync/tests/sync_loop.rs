//! The shared sync loop, one sync at a time (`sync_once`), with real change
//! trackers and the fake backend. The cast is in `common/mod.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_model::{
    IpFamily, ObjectEvent, ProxyEventHandler, ResourceKind, ANNOTATION_LAST_CHANGE_TRIGGER_TIME,
};
use kp_sync::testing::{FakeBackend, RecordedSync};
use kp_sync::{Proxier, SyncError, SyncObserver, SyncOutcome, SyncRequest};
use kp_testkit::builders::node;
use kp_testkit::plan::{NODE_IP, NODE_NAME, NODE_ZONE, OTHER_NODE_NAME};
use pretty_assertions::assert_eq;

#[test]
fn nothing_reaches_the_backend_before_both_sources_are_synced() {
    let (proxier, backend) = proxier(IpFamily::V4);
    apply(&proxier, &[web()], &[web_endpoints(&["10.244.1.2"])]);
    proxier.on_synced(ResourceKind::Service);

    let error = proxier.sync_once().unwrap_err();

    assert!(
        matches!(
            error,
            SyncError::NotSynced {
                waiting_for: "the first complete list of EndpointSlices",
                ..
            }
        ),
        "{error}"
    );
    backend.assert_no_requests();
    assert_eq!(proxier.status().last_sync(), None);
    assert_eq!(proxier.status().queued_since(), None);

    proxier.on_synced(ResourceKind::EndpointSlice);
    assert!(proxier.sync_once().is_ok());
    assert_eq!(backend.take_requests().len(), 1);
}

#[test]
fn the_first_sync_is_full_and_has_every_service_port() {
    let (proxier, backend) = proxier(IpFamily::V4);
    apply(
        &proxier,
        &[web(), db()],
        &[web_endpoints(&["10.244.1.2", "10.244.2.2"]), db_endpoints()],
    );
    sources_synced(&proxier);

    let outcome = proxier.sync_once().unwrap();

    let request = backend.take_single_request();
    assert!(request.full && outcome.full);
    assert_eq!(request.family, IpFamily::V4);
    assert_eq!(request.service_port_names(), ["ns1/db:pg", "ns1/web:http"]);
    assert_eq!(request.changed_service_names(), ["ns1/db", "ns1/web"]);
    assert_eq!(request.node.name, NODE_NAME);
    let web = request.service_ports.values().nth(1).unwrap();
    assert_eq!(
        endpoint_ips(&web.all_endpoints),
        ["10.244.1.2", "10.244.2.2"]
    );
    assert_eq!(
        endpoint_ips(&web.endpoints.cluster),
        ["10.244.1.2", "10.244.2.2"]
    );

    let stats = proxier.status().last_sync().unwrap();
    assert_eq!(
        (stats.full, stats.service_ports, stats.endpoints),
        (true, 2, 3)
    );
    assert_eq!(stats.result, Ok(outcome));
    assert_eq!(proxier.status().queued_since(), None);
}

#[test]
fn an_endpoint_change_gives_a_partial_sync_naming_only_its_service() {
    let (proxier, backend) = proxier_after_first_sync();

    apply(
        &*proxier,
        &[],
        &[web_endpoints(&["10.244.1.2", "10.244.1.3"])],
    );
    assert!(proxier.status().queued_since().is_some());
    proxier.sync_once().unwrap();

    let request = backend.take_single_request();
    assert!(!request.full);
    assert_eq!(request.changed_service_names(), ["ns1/web"]);
    // A partial sync still sees every service port.
    assert_eq!(
        request.service_port_names(),
        ["ns1/db:pg", "ns1/dns:dns", "ns1/web:http"]
    );
    assert_eq!(proxier.status().queued_since(), None);
    assert_eq!(proxier.status().totals().partial_syncs, 1);
}

#[test]
fn a_removed_udp_service_is_handed_on_as_stale_conntrack() {
    let (proxier, backend) = proxier_after_first_sync();

    proxier.on_service(ObjectEvent::Delete(dns()));
    proxier.sync_once().unwrap();

    let request = backend.take_single_request();
    assert_eq!(deleted_cluster_ips(&request), [ip("10.96.0.12")]);
    assert_eq!(request.changed_service_names(), ["ns1/dns"]);
}

#[test]
fn a_mode_that_cannot_run_here_is_marked_unavailable_until_a_sync_succeeds() {
    let (proxier, backend) = proxier_after_first_sync();
    backend.unavailable_next(2);
    apply(&*proxier, &[], &[dns_endpoints(&["10.244.1.7"])]);
    let status = proxier.status();

    proxier.sync_once().unwrap_err();
    proxier.sync_once().unwrap_err();

    let why = status.unavailable().expect("the status says why");
    assert!(why.contains("fake-restore not found"), "{why}");
    assert!(why.contains("install the fake package"), "{why}");

    proxier.sync_once().unwrap();

    assert_eq!(status.unavailable(), None, "a successful sync clears it");
}

#[test]
fn an_ordinary_backend_failure_does_not_mark_the_mode_unavailable() {
    let (proxier, backend) = proxier_after_first_sync();
    backend.fail_next(1);
    apply(&*proxier, &[], &[dns_endpoints(&["10.244.1.7"])]);

    proxier.sync_once().unwrap_err();

    assert_eq!(proxier.status().unavailable(), None);
}

#[test]
fn a_backend_failure_makes_the_next_sync_full() {
    let (proxier, backend) = proxier_after_first_sync();
    backend.fail_next(1);
    proxier.on_service(ObjectEvent::Delete(dns()));

    let error = proxier.sync_once().unwrap_err();

    assert!(matches!(error, SyncError::Backend { .. }), "{error}");
    assert!(!backend.take_single_request().full);
    let status = proxier.status();
    assert_eq!(status.totals().failed_syncs, 1);
    assert!(status
        .last_sync()
        .unwrap()
        .result
        .unwrap_err()
        .contains("told to fail"));
    assert!(
        status.queued_since().is_some(),
        "the change is still not applied"
    );

    proxier.sync_once().unwrap();

    let retry = backend.take_single_request();
    assert!(retry.full);
    // The removed ClusterIP of the failed sync is not forgotten, nor is
    // its Service among the changed ones.
    assert_eq!(deleted_cluster_ips(&retry), [ip("10.96.0.12")]);
    assert_eq!(retry.changed_service_names(), ["ns1/dns"]);
    assert_eq!(status.queued_since(), None);
}

/// The endpoints of web at `ips`, written by a change made `ago` before now.
fn web_endpoints_changed(ips: &[&str], ago: Duration) -> EndpointSlice {
    let trigger = SystemTime::now() - ago;
    let nanos = trigger.duration_since(UNIX_EPOCH).unwrap().as_nanos();
    let text = k8s_openapi::jiff::Timestamp::from_nanosecond(nanos as i128)
        .unwrap()
        .to_string();
    let mut slice = web_endpoints(ips);
    slice.metadata.annotations =
        Some([(ANNOTATION_LAST_CHANGE_TRIGGER_TIME.to_owned(), text)].into());
    slice
}

/// A proxier started a minute ago, after its first sync, and its backend;
/// web's endpoints change `ago` before now.
fn proxier_with_web_changed(ago: Duration) -> (Proxier, FakeBackend) {
    let (proxier, backend) = proxier(IpFamily::V4);
    let proxier = proxier.measuring_changes_since(SystemTime::now() - Duration::from_secs(60));
    sources_synced(&proxier);
    proxier.sync_once().unwrap();
    apply(
        &proxier,
        &[web()],
        &[web_endpoints_changed(&["10.244.1.3"], ago)],
    );
    (proxier, backend)
}

#[test]
fn a_sync_reports_the_network_programming_latency_of_each_change_it_applied() {
    let (proxier, _backend) = proxier_with_web_changed(Duration::from_secs(3));

    proxier.sync_once().unwrap();

    let latencies = proxier.status().last_sync().unwrap().network_programming;
    assert_eq!(latencies.len(), 1, "{latencies:?}");
    assert!(
        latencies[0] >= Duration::from_secs(3) && latencies[0] < Duration::from_secs(60),
        "{latencies:?}"
    );
}

#[test]
fn changes_made_before_the_proxy_started_report_no_latency() {
    let (proxier, _backend) = proxier_after_first_sync();
    // A slice listed at start carries the time of a change made before.
    let old = web_endpoints_changed(&["10.244.1.3"], Duration::from_secs(3600));
    apply(&*proxier, &[], &[old]);

    proxier.sync_once().unwrap();

    let stats = proxier.status().last_sync().unwrap();
    assert!(stats.result.is_ok());
    assert_eq!(stats.network_programming, []);
}

#[test]
fn the_latency_of_a_change_whose_sync_failed_is_reported_by_the_retry() {
    let (proxier, backend) = proxier_with_web_changed(Duration::from_secs(1));
    backend.fail_next(1);

    proxier.sync_once().unwrap_err();
    assert_eq!(
        proxier.status().last_sync().unwrap().network_programming,
        []
    );
    proxier.sync_once().unwrap();

    let latencies = proxier.status().last_sync().unwrap().network_programming;
    assert_eq!(latencies.len(), 1, "{latencies:?}");
}

#[test]
fn an_update_that_reverts_before_the_sync_changes_no_service() {
    let (proxier, backend) = proxier_after_first_sync();

    apply(&*proxier, &[], &[web_endpoints(&["10.244.1.9"])]);
    apply(&*proxier, &[], &[web_endpoints(&["10.244.1.2"])]);
    proxier.sync_once().unwrap();

    let request = backend.take_single_request();
    assert!(!request.full);
    assert_eq!(request.changed_service_names(), Vec::<String>::new());
    assert!(request.stale_conntrack.is_empty());
}

#[test]
fn a_node_label_change_forces_a_full_sync_with_the_new_labels() {
    let (proxier, backend) = proxier_after_first_sync();

    proxier.on_node(ObjectEvent::Apply(node(NODE_NAME, |n| {
        n.zone(NODE_ZONE).internal_ip(NODE_IP)
    })));
    proxier.sync_once().unwrap();

    let request = backend.take_single_request();
    assert!(request.full);
    assert_eq!(
        request
            .node
            .labels
            .get(kp_model::LABEL_TOPOLOGY_ZONE)
            .unwrap(),
        NODE_ZONE
    );
    assert_eq!(request.node.addresses, [IpAddr::V4(NODE_IP)]);
    // Topology depends on the labels: every Service may differ.
    assert_eq!(
        request.changed_service_names(),
        ["ns1/db", "ns1/dns", "ns1/web"]
    );
}

/// The periodic full sync names the Services that changed since the last
/// sync, none when nothing did, and hands on the same categorized view a
/// proxier started afresh builds.
#[test]
fn a_periodic_full_sync_names_only_the_services_that_changed() {
    let (proxier, backend) = proxier_after_first_sync();
    backend.take_requests();

    proxier.sync_once_full().unwrap();
    let untouched = backend.take_single_request();
    assert!(untouched.full);
    assert!(untouched.changed_services.is_empty(), "{untouched:?}");
    assert_eq!(
        untouched.service_port_names(),
        ["ns1/db:pg", "ns1/dns:dns", "ns1/web:http"]
    );

    let slice = web_endpoints(&["10.244.1.2", "10.244.2.9"]);
    proxier.on_endpoint_slice(ObjectEvent::Apply(slice.clone()));
    proxier.sync_once_full().unwrap();
    let changed = backend.take_single_request();
    assert!(changed.full);
    assert_eq!(changed.changed_service_names(), ["ns1/web"]);
    let services = [web(), db(), dns()];
    let slices = [slice, db_endpoints(), dns_endpoints(&["10.244.1.6"])];
    let (fresh, fresh_backend) = proxier_with_objects(&services, &slices);
    fresh.sync_once().unwrap();
    assert_eq!(
        changed.service_ports,
        fresh_backend.take_single_request().service_ports
    );
}

#[test]
fn with_node_cidr_detection_nothing_is_written_until_the_node_has_pod_cidrs() {
    let (proxier, backend) = proxier(IpFamily::V4);
    let proxier = proxier.waiting_for_pod_cidrs();
    sources_synced(&proxier);
    apply(&proxier, &[web()], &[web_endpoints(&["10.244.1.2"])]);

    let error = proxier.sync_once().unwrap_err();

    assert!(
        error.to_string().contains("the Node's spec.podCIDRs"),
        "{error}"
    );
    assert!(!proxier.is_synced());
    backend.assert_no_requests();

    proxier.on_node(ObjectEvent::Apply(node(NODE_NAME, |n| {
        n.pod_cidr("10.244.1.0/24")
    })));
    proxier.sync_once().unwrap();

    let request = backend.take_single_request();
    assert_eq!(request.node.pod_cidrs, ["10.244.1.0/24".parse().unwrap()]);
    assert_eq!(request.service_port_names(), ["ns1/web:http"]);
}

#[test]
fn a_pod_cidr_change_forces_a_full_sync_with_the_new_cidrs() {
    let (proxier, backend) = proxier_after_first_sync();

    proxier.on_node(ObjectEvent::Apply(node(NODE_NAME, |n| {
        n.pod_cidr("10.244.9.0/24")
    })));
    proxier.sync_once().unwrap();

    let request = backend.take_single_request();
    assert!(request.full);
    assert_eq!(request.node.pod_cidrs, ["10.244.9.0/24".parse().unwrap()]);
}

#[test]
fn events_of_another_node_are_ignored() {
    let (proxier, backend) = proxier_after_first_sync();

    proxier.on_node(ObjectEvent::Apply(node(OTHER_NODE_NAME, |n| {
        n.zone("zone-b")
    })));
    proxier.sync_once().unwrap();

    assert!(!backend.take_single_request().full);
    assert!(proxier.node().labels.is_empty());
}

#[test]
fn dual_stack_fan_out_gives_each_family_only_its_own_objects() {
    let (v4, v4_backend) = proxier(IpFamily::V4);
    let (v6, v6_backend) = proxier(IpFamily::V6);
    let (v4, v6) = (Arc::new(v4), Arc::new(v6));
    let handler = kp_sync::FanOutHandler::new(vec![v4.clone(), v6.clone()]);

    apply(
        &handler,
        &[web(), dual()],
        &[web_endpoints(&["10.244.1.2"])],
    );
    apply(&handler, &[], &dual_endpoints());
    sources_synced(&handler);
    v4.sync_once().unwrap();
    v6.sync_once().unwrap();

    let v4_request = v4_backend.take_single_request();
    assert_eq!(
        v4_request.service_port_names(),
        ["ns1/dual:http", "ns1/web:http"]
    );
    assert!(all_addresses(&v4_request).iter().all(IpAddr::is_ipv4));
    let v6_request = v6_backend.take_single_request();
    assert_eq!(v6_request.family, IpFamily::V6);
    assert_eq!(v6_request.service_port_names(), ["ns1/dual:http"]);
    assert_eq!(
        all_addresses(&v6_request),
        [ip("fd00:10:96::20"), ip("fd00:10:244:1::7")]
    );
}

#[test]
fn observers_hear_of_successful_syncs_only() {
    let seen = Arc::new(Recorder::default());
    let (proxier, backend) = proxier(IpFamily::V4);
    let proxier = proxier.with_observer(seen.clone());
    apply(&proxier, &[web()], &[web_endpoints(&["10.244.1.2"])]);
    sources_synced(&proxier);
    backend.fail_next(1);

    assert!(proxier.sync_once().is_err());
    proxier.sync_once().unwrap();

    assert_eq!(*seen.0.lock().unwrap(), [(true, 1)]);
}

/// Records (full, objects written) of every sync it hears of.
#[derive(Default)]
struct Recorder(Mutex<Vec<(bool, usize)>>);

impl SyncObserver for Recorder {
    fn on_synced(&self, request: &SyncRequest<'_>, outcome: &SyncOutcome) {
        self.0
            .lock()
            .unwrap()
            .push((request.full, outcome.objects_written));
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn endpoint_ips(endpoints: &[Arc<kp_model::Endpoint>]) -> Vec<String> {
    endpoints.iter().map(|ep| ep.ip.to_string()).collect()
}

fn deleted_cluster_ips(request: &RecordedSync) -> Vec<IpAddr> {
    let stale = &request.stale_conntrack.deleted_cluster_ips;
    stale.iter().copied().collect()
}

/// Every ClusterIP and endpoint address of a request, in order.
fn all_addresses(request: &RecordedSync) -> Vec<IpAddr> {
    request
        .service_ports
        .values()
        .flat_map(|state| {
            std::iter::once(state.port.cluster_ip).chain(state.all_endpoints.iter().map(|ep| ep.ip))
        })
        .collect()
}

/// A partial sync hands the backend the last sync's categorized view with
/// only the changed Services categorized again: after each step below, its
/// view must equal what a proxier started afresh on the same objects
/// builds from scratch.
#[test]
fn a_partial_syncs_categorized_view_equals_one_built_afresh() {
    use kp_testkit::builders::service;
    let two_ports = || {
        service("ns1", "web", |s| {
            s.cluster_ip("10.96.0.10")
                .port("http", 80, "TCP")
                .port("https", 443, "TCP")
        })
    };
    type Step = (
        &'static str,
        Vec<ObjectEvent<k8s_openapi::api::core::v1::Service>>,
        Vec<ObjectEvent<EndpointSlice>>,
    );
    let steps: Vec<Step> = vec![
        (
            "an endpoint replaced",
            vec![],
            vec![ObjectEvent::Apply(web_endpoints(&[
                "10.244.1.2",
                "10.244.2.9",
            ]))],
        ),
        (
            "a port added",
            vec![ObjectEvent::Apply(two_ports())],
            vec![],
        ),
        ("a port removed", vec![ObjectEvent::Apply(web())], vec![]),
        (
            "a Service deleted",
            vec![ObjectEvent::Delete(db())],
            vec![ObjectEvent::Delete(db_endpoints())],
        ),
        (
            "a Service added back",
            vec![ObjectEvent::Apply(db())],
            vec![ObjectEvent::Apply(db_endpoints())],
        ),
    ];
    let (proxier, backend) = proxier_after_first_sync();
    backend.take_requests();
    let mut services = vec![web(), db(), dns()];
    let mut slices = vec![
        web_endpoints(&["10.244.1.2"]),
        db_endpoints(),
        dns_endpoints(&["10.244.1.6"]),
    ];
    for (step, service_events, slice_events) in steps {
        for event in service_events {
            record(&mut services, &event);
            proxier.on_service(event);
        }
        for event in slice_events {
            record(&mut slices, &event);
            proxier.on_endpoint_slice(event);
        }
        proxier.sync_once().unwrap();
        let partial = backend.take_single_request();
        assert!(!partial.full, "{step}: not a partial sync");

        let (fresh, fresh_backend) = proxier_with_objects(&services, &slices);
        fresh.sync_once().unwrap();
        let afresh = fresh_backend.take_single_request();
        assert_eq!(partial.service_ports, afresh.service_ports, "{step}");
    }
}

/// Keeps `objects` as the API server would after `event` (by name).
fn record<K>(objects: &mut Vec<K>, event: &ObjectEvent<K>)
where
    K: k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>
        + Clone,
{
    let name = |object: &K| object.metadata().name.clone();
    objects.retain(|kept| name(kept) != name(event.object()));
    if let ObjectEvent::Apply(object) = event {
        objects.push(object.clone());
    }
}

/// A proxier that synced nothing yet, holding `services` and `slices`.
fn proxier_with_objects(
    services: &[k8s_openapi::api::core::v1::Service],
    slices: &[EndpointSlice],
) -> (Proxier, FakeBackend) {
    let (proxier, backend) = proxier(IpFamily::V4);
    apply(&proxier, services, slices);
    sources_synced(&proxier);
    (proxier, backend)
}
