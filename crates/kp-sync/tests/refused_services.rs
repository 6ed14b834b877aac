//! One Service whose rules the kernel refuses does not keep the others from
//! being programmed: the sync loop leaves it out until it changes. The cast
//! is in `common/mod.rs`; the fake backend refuses the rules of a Service
//! as the kernel refuses an oversized object.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use kp_model::{IpFamily, NamespacedName, ObjectEvent, ProxyEventHandler};
use kp_sync::testing::FakeBackend;
use kp_sync::{BackendError, Proxier, SyncError, SyncObserver};
use pretty_assertions::assert_eq;

fn dns_name() -> NamespacedName {
    NamespacedName::new("ns1", "dns")
}

/// A proxier whose first sync holds web, db and dns, and whose backend
/// refuses dns; the observer hears of every refusal.
fn refusing_dns() -> (Proxier, FakeBackend, Arc<Refusals>) {
    let refusals = Arc::new(Refusals::default());
    let (proxier, backend) = proxier(IpFamily::V4);
    let proxier = proxier.with_observer(refusals.clone());
    apply(
        &proxier,
        &[web(), db(), dns()],
        &[
            web_endpoints(&["10.244.1.2"]),
            db_endpoints(),
            dns_endpoints(&["10.244.1.6"]),
        ],
    );
    sources_synced(&proxier);
    backend.refuse_service(dns_name());
    (proxier, backend, refusals)
}

#[test]
fn the_sync_after_a_refusal_programs_every_other_service() {
    let (proxier, backend, refusals) = refusing_dns();

    let error = proxier.sync_once().unwrap_err();

    let SyncError::Backend {
        source: BackendError::Rejected { services, .. },
        ..
    } = &error
    else {
        panic!("{error}");
    };
    assert_eq!(*services, [dns_name()].into());
    assert!(error
        .to_string()
        .contains("syncing IPv4 proxy rules failed"));
    assert_eq!(proxier.status().totals().failed_syncs, 1);
    assert_eq!(proxier.status().refused_services(), [dns_name()]);
    assert_eq!(refusals.names(), ["ns1/dns"]);

    proxier.sync_once().unwrap();

    let requests = backend.take_requests();
    let retry = requests.last().unwrap();
    assert!(retry.full, "the retry after a failure is full");
    assert_eq!(retry.service_port_names(), ["ns1/db:pg", "ns1/web:http"]);
    assert_eq!(refusals.names(), ["ns1/dns"], "told once");
}

#[test]
fn a_refused_service_stays_out_until_it_changes_and_is_tried_again_then() {
    let (proxier, backend, refusals) = refusing_dns();
    proxier.sync_once().unwrap_err();
    proxier.sync_once().unwrap();
    backend.take_requests();

    // Other changes go on without it.
    apply(
        &proxier,
        &[],
        &[web_endpoints(&["10.244.1.2", "10.244.1.3"])],
    );
    proxier.sync_once().unwrap();
    let partial = backend.take_single_request();
    assert!(!partial.full);
    assert_eq!(partial.service_port_names(), ["ns1/db:pg", "ns1/web:http"]);
    assert_eq!(proxier.status().refused_services(), [dns_name()]);

    // Its own change is tried again, and refused again.
    apply(&proxier, &[], &[dns_endpoints(&["10.244.1.7"])]);
    proxier.sync_once().unwrap_err();
    let tried = backend.take_single_request();
    assert_eq!(tried.changed_service_names(), ["ns1/dns"]);
    assert_eq!(
        tried.service_port_names(),
        ["ns1/db:pg", "ns1/dns:dns", "ns1/web:http"]
    );
    assert_eq!(refusals.names(), ["ns1/dns", "ns1/dns"]);

    // Once the kernel takes it, it is programmed like any other.
    backend.refuse_service_no_more();
    apply(&proxier, &[], &[dns_endpoints(&["10.244.1.8"])]);
    proxier.sync_once().unwrap();
    let accepted = backend.take_requests().pop().unwrap();
    assert_eq!(
        accepted.service_port_names(),
        ["ns1/db:pg", "ns1/dns:dns", "ns1/web:http"]
    );
    assert_eq!(proxier.status().refused_services(), []);
}

#[test]
fn a_refused_service_that_is_deleted_is_forgotten() {
    let (proxier, backend, _) = refusing_dns();
    proxier.sync_once().unwrap_err();
    proxier.sync_once().unwrap();

    proxier.on_service(ObjectEvent::Delete(dns()));
    proxier.sync_once().unwrap();

    assert_eq!(proxier.status().refused_services(), []);
    let last = backend.take_requests().pop().unwrap();
    assert_eq!(last.service_port_names(), ["ns1/db:pg", "ns1/web:http"]);
}

/// The Services observers were told of, in order.
#[derive(Default)]
struct Refusals(Mutex<Vec<String>>);

impl Refusals {
    fn names(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

impl SyncObserver for Refusals {
    fn on_synced(&self, _: &kp_sync::SyncRequest<'_>, _: &kp_sync::SyncOutcome) {}

    fn on_service_refused(&self, _family: IpFamily, service: &NamespacedName, reason: &str) {
        assert!(reason.contains("ns1/dns"), "{reason}");
        self.0.lock().unwrap().push(service.to_string());
    }
}
