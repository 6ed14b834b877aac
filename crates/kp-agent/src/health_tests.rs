#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kp_model::{IpFamily, ObjectEvent, ProxyEventHandler, ResourceKind};
use kp_sync::testing::{fake_proxier, IMMEDIATE};
use kp_sync::Proxier;
use kp_testkit::builders::{node, service};
use tokio::time::Instant;

use super::*;

const TIMEOUT: Duration = Duration::from_secs(60);

fn proxier() -> Arc<Proxier> {
    let (proxier, _) = fake_proxier(IpFamily::V4, "node-1", IMMEDIATE);
    let proxier = Arc::new(proxier);
    proxier.on_synced(ResourceKind::Service);
    proxier.on_synced(ResourceKind::EndpointSlice);
    proxier
}

fn queue_a_change(proxier: &Proxier) {
    let web = service("ns1", "web", |s| {
        s.cluster_ip("10.96.0.10").port("http", 80, "TCP")
    });
    proxier.on_service(ObjectEvent::Apply(web));
}

#[tokio::test(start_paused = true)]
async fn a_proxy_with_nothing_queued_is_healthy_and_says_so_in_upstreams_json() {
    let health = ProxyHealth::new(vec![proxier()], TIMEOUT);
    let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_348_800);

    let now = health.check_at(Instant::now(), wall);

    assert!(now.healthz_ok());
    assert_eq!(
        now.healthz_json(),
        "{\"lastUpdated\": \"2026-11-22 12:00:00 +0000 UTC\",\"currentTime\": \"2026-11-22 12:00:00 +0000 UTC\", \"nodeEligible\": true}"
    );
    assert_eq!(
        now.livez_json(),
        "{\"lastUpdated\": \"2026-11-22 12:00:00 +0000 UTC\",\"currentTime\": \"2026-11-22 12:00:00 +0000 UTC\"}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_change_waiting_longer_than_the_timeout_makes_the_proxy_unhealthy() {
    let proxier = proxier();
    let health = ProxyHealth::new(vec![Arc::clone(&proxier)], TIMEOUT);
    proxier.sync_once().unwrap();
    let synced = Instant::now();
    let wall = SystemTime::now();
    queue_a_change(&proxier);

    let in_time = health.check_at(synced + TIMEOUT - Duration::from_millis(1), wall);
    let late = health.check_at(synced + TIMEOUT + Duration::from_millis(1), wall);

    assert!(in_time.healthy && in_time.healthz_ok());
    assert!(!late.healthy && !late.healthz_ok());
    assert!(
        late.livez_json().contains(&format!(
            "\"lastUpdated\": \"{}\"",
            crate::time_format::go_time(wall - TIMEOUT - Duration::from_millis(1))
        )),
        "an unhealthy proxy reports its last successful sync: {}",
        late.livez_json()
    );

    proxier.sync_once().unwrap();
    assert!(
        health.check_at(synced + 3 * TIMEOUT, wall).healthy,
        "a sync makes it healthy again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_mode_that_cannot_run_here_is_unhealthy_at_once_and_healthy_after_it_recovers() {
    let (proxier, backend) = fake_proxier(IpFamily::V4, "node-1", IMMEDIATE);
    let proxier = Arc::new(proxier);
    proxier.on_synced(ResourceKind::Service);
    proxier.on_synced(ResourceKind::EndpointSlice);
    let health = ProxyHealth::new(vec![Arc::clone(&proxier)], TIMEOUT);
    backend.unavailable_next(1);

    proxier.sync_once().unwrap_err();

    let now = health.check_at(Instant::now(), SystemTime::now());
    assert!(
        !now.healthy && !now.healthz_ok(),
        "no need to wait for the health timeout: the missing program will not appear by itself"
    );

    proxier.sync_once().unwrap();

    assert!(health.check().healthz_ok());
}

#[tokio::test(start_paused = true)]
async fn a_node_being_deleted_fails_healthz_but_not_livez() {
    let proxier = proxier();
    let health = ProxyHealth::new(vec![Arc::clone(&proxier)], TIMEOUT);
    proxier.on_node(ObjectEvent::Apply(node("node-1", |n| n.deleting())));
    proxier.sync_once().unwrap();

    let now = health.check();

    assert!(now.healthy, "livez is fine");
    assert!(!now.healthz_ok());
    assert!(now.healthz_json().ends_with("\"nodeEligible\": false}"));
}

#[tokio::test(start_paused = true)]
async fn a_node_tainted_for_removal_by_the_autoscaler_fails_healthz() {
    let proxier = proxier();
    let health = ProxyHealth::new(vec![Arc::clone(&proxier)], TIMEOUT);
    let tainted = node("node-1", |n| {
        n.taint("ToBeDeletedByClusterAutoscaler", "NoSchedule")
    });
    proxier.on_node(ObjectEvent::Apply(tainted));

    assert!(!health.check().node_eligible);

    proxier.on_node(ObjectEvent::Apply(node("node-1", |n| n)));
    assert!(
        health.check().node_eligible,
        "the taint removed, eligible again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_deleted_node_is_not_eligible() {
    let proxier = proxier();
    let health = ProxyHealth::new(vec![Arc::clone(&proxier)], TIMEOUT);

    proxier.on_node(ObjectEvent::Delete(node("node-1", |n| n)));

    assert!(!health.check().healthz_ok());
    assert!(health.check().healthy);
}
