//! The cleaner as a sync observer, over an in-memory table (address plan
//! in `stale_tests.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kp_model::IpFamily;
use kp_sync::{SyncObserver, SyncOutcome};
use pretty_assertions::assert_eq;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;

use super::{CleanupReport, ConntrackCleaner};
use crate::flow::Flow;
use crate::metrics::ConntrackMetrics;
use crate::table::FakeConntrack;
use crate::test_state::*;

fn udp(client_port: u16, to: &str, from: &str) -> Flow {
    Flow::udp(client(client_port), at(to), at(from))
}

fn to_ep1() -> Flow {
    udp(40001, "10.96.0.20:53", "10.244.1.2:5353")
}

fn to_ep2() -> Flow {
    udp(40002, "10.96.0.20:53", "10.244.1.3:5353")
}

fn cleaner(table: &FakeConntrack, metrics: &ConntrackMetrics) -> ConntrackCleaner {
    ConntrackCleaner::with_table(IpFamily::V4, Box::new(table.clone()), metrics.clone())
}

/// ep1 was replaced by ep2: a partial sync that changed the Service.
fn ep1_replaced_by_ep2() -> Synced {
    synced(&[dns()], &[slice("dns", &[(EP2, ready)])]).changing("dns")
}

fn metrics_text(metrics: &ConntrackMetrics) -> String {
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    text
}

#[test]
fn after_an_endpoint_is_replaced_its_flows_are_deleted_and_counted() {
    let table = FakeConntrack::with_flows([to_ep1(), to_ep2()]);
    let metrics = ConntrackMetrics::new();
    let state = ep1_replaced_by_ep2();

    let report = cleaner(&table, &metrics).clean(&state.request()).unwrap();

    assert_eq!(
        report,
        CleanupReport {
            listed: 2,
            stale: 1,
            deleted: 1,
            ..CleanupReport::default()
        }
    );
    assert_eq!(table.flows(), [to_ep2()]);
    assert_eq!(metrics.deleted_entries(IpFamily::V4), 1);
    let text = metrics_text(&metrics);
    assert!(
        text.contains("kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv4\"} 1"),
        "{text}"
    );
    assert!(
        text.contains(
            "kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family=\"IPv4\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains("# HELP kubeproxy_conntrack_reconciler_sync_duration_seconds ReconcileConntrackFlowsLatency latency in seconds."),
        "{text}"
    );
}

#[test]
fn the_first_sync_reconciles_and_later_syncs_only_when_they_touched_a_udp_service() {
    let table = FakeConntrack::with_flows([to_ep2()]);
    let cleaner = cleaner(&table, &ConntrackMetrics::new());
    let quiet = || {
        synced(
            &[dns(), web()],
            &[slice("dns", &[(EP2, ready)]), slice("web", &[(EP1, ready)])],
        )
    };

    cleaner.on_synced(&quiet().request(), &SyncOutcome::default());
    cleaner.on_synced(&quiet().request(), &SyncOutcome::default());
    cleaner.on_synced(&quiet().changing("web").request(), &SyncOutcome::default());
    assert_eq!(table.list_calls(), 1, "only the first sync lists the table");

    table.insert(to_ep1());
    cleaner.on_synced(&ep1_replaced_by_ep2().request(), &SyncOutcome::default());
    assert_eq!(table.list_calls(), 2);
    assert_eq!(table.flows(), [to_ep2()]);

    cleaner.on_synced(&quiet().full().request(), &SyncOutcome::default());
    assert_eq!(table.list_calls(), 3, "every full sync reconciles");
}

#[test]
fn a_failed_reconcile_is_retried_after_the_next_sync_and_records_nothing() {
    let table = FakeConntrack::with_flows([to_ep1(), to_ep2()]);
    let metrics = ConntrackMetrics::new();
    let cleaner = cleaner(&table, &metrics);
    table.fail_listing(true);

    cleaner.on_synced(&ep1_replaced_by_ep2().request(), &SyncOutcome::default());
    assert_eq!(
        table.flows().len(),
        2,
        "nothing deleted while the table cannot be listed"
    );
    assert!(
        !metrics_text(&metrics).contains("ip_family"),
        "no series recorded"
    );

    table.fail_listing(false);
    let quiet_but_same_state = synced(&[dns()], &[slice("dns", &[(EP2, ready)])]);
    cleaner.on_synced(&quiet_but_same_state.request(), &SyncOutcome::default());
    assert_eq!(table.flows(), [to_ep2()]);
    assert_eq!(metrics.deleted_entries(IpFamily::V4), 1);
}

#[test]
fn a_sync_of_the_other_family_is_ignored() {
    let table = FakeConntrack::with_flows([to_ep1()]);
    let v6_cleaner = ConntrackCleaner::with_table(
        IpFamily::V6,
        Box::new(table.clone()),
        ConntrackMetrics::new(),
    );

    v6_cleaner.on_synced(&ep1_replaced_by_ep2().request(), &SyncOutcome::default());

    assert_eq!(table.list_calls(), 0);
}
