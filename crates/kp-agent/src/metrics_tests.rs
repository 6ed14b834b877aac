#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, SystemTime};

use kp_model::{ObjectEvent, ProxyEventHandler, ResourceKind};
use kp_sync::testing::{fake_proxier, FakeBackend, IMMEDIATE};
use kp_testkit::builders::service;
use kp_testkit::upstream;

use super::*;

/// A proxier whose syncs `metrics` observe, with its sources synced.
fn proxier(metrics: &ProxyMetrics) -> (Arc<Proxier>, FakeBackend) {
    let (proxier, backend) = fake_proxier(IpFamily::V4, "node-1", IMMEDIATE);
    let proxier = Arc::new(proxier.with_observer(metrics.observer()));
    proxier.on_synced(ResourceKind::Service);
    proxier.on_synced(ResourceKind::EndpointSlice);
    metrics.watch(&[Arc::clone(&proxier)]);
    (proxier, backend)
}

/// The metric named in a `# TYPE` line; counters are declared without
/// their `_total` suffix.
fn declared(text: &str, name: &str) -> bool {
    let counter_base = name.strip_suffix("_total").unwrap_or(name);
    text.contains(&format!("# TYPE {name} "))
        || text.contains(&format!("# TYPE {counter_base} counter"))
}

fn sample(text: &str, series: &str) -> Option<f64> {
    let line = text.lines().find(|line| line.starts_with(series))?;
    line[series.len()..].trim().parse().ok()
}

/// A sync outcome as the iptables backend reports it.
fn iptables_sync(full: bool) -> SyncStats {
    SyncStats {
        finished_at: tokio::time::Instant::now(),
        finished_at_wall: SystemTime::now(),
        duration: Duration::from_millis(30),
        full,
        service_ports: 1,
        endpoints: 2,
        result: Ok(SyncOutcome {
            full,
            rules_per_table: vec![("filter".into(), 4), ("nat".into(), 12)],
            chains_per_table: vec![("filter".into(), 6), ("nat".into(), 9)],
            rules_written_per_table: vec![
                ("filter".into(), 4),
                ("nat".into(), if full { 12 } else { 3 }),
            ],
            objects_written: 16,
            cleanup_failures: 0,
        }),
        rejected: false,
        network_programming: vec![Duration::from_millis(700), Duration::from_secs(2)],
    }
}

#[test]
fn every_upstream_iptables_metric_is_declared_once_the_proxy_ran() {
    let metrics = ProxyMetrics::new("iptables");
    metrics.count_nfacct(Box::new(FakeNfacct), "invalid", "localhost");
    let (proxier, _) = proxier(&metrics);
    proxier.sync_once().unwrap();
    metrics.on_sync_finished(IpFamily::V4, &iptables_sync(true));
    metrics.healthz_answered(200);
    metrics.livez_answered(200);

    let text = metrics.render();

    // The conntrack reconciler registers its own metrics.
    let missing: Vec<_> = upstream::IPTABLES_METRICS
        .iter()
        .filter(|name| !name.starts_with("kubeproxy_conntrack_") && !declared(&text, name))
        .collect();

    assert!(missing.is_empty(), "missing: {missing:?}\n{text}");
    assert!(declared(&text, "process_resident_memory_bytes"));
    assert!(!declared(
        &text,
        "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"
    ));
}

/// The metrics a mode declares once the proxy ran, against upstream's:
/// every one of `wanted`, none of `unwanted`.
fn check_mode_metrics(mode: &'static str, wanted: &[&[&str]], unwanted: &[&[&str]]) {
    let metrics = ProxyMetrics::new(mode);
    let (proxier, _) = proxier(&metrics);
    proxier.sync_once().unwrap();
    metrics.healthz_answered(200);
    metrics.livez_answered(200);
    let text = metrics.render();

    let missing: Vec<_> = wanted
        .iter()
        .flat_map(|names| names.iter())
        .filter(|name| !declared(&text, name))
        .collect();
    let extra: Vec<_> = unwanted
        .iter()
        .flat_map(|names| names.iter())
        .filter(|name| declared(&text, name))
        .collect();
    assert!(missing.is_empty(), "{mode}: missing {missing:?}\n{text}");
    assert!(extra.is_empty(), "{mode}: not upstream's {extra:?}\n{text}");
}

#[test]
fn nftables_mode_has_upstreams_metrics_and_no_iptables_ones() {
    check_mode_metrics(
        "nftables",
        &[upstream::COMMON_METRICS, upstream::NFTABLES_METRICS],
        &[upstream::IPTABLES_ONLY_METRICS, upstream::IPVS_METRICS],
    );
}

#[test]
fn ipvs_mode_has_upstreams_metrics_and_no_others() {
    check_mode_metrics(
        "ipvs",
        &[upstream::COMMON_METRICS, upstream::IPVS_METRICS],
        &[upstream::IPTABLES_ONLY_METRICS, upstream::NFTABLES_METRICS],
    );
}

/// A failed sync as the sync loop reports it.
fn failed_sync(full: bool, rejected: bool) -> SyncStats {
    SyncStats {
        result: Err("ipvs backend: adding virtual server failed".to_owned()),
        rejected,
        network_programming: Vec::new(),
        ..iptables_sync(full)
    }
}

#[test]
fn only_a_refused_rule_set_counts_as_a_restore_failure() {
    let metrics = ProxyMetrics::new("ipvs");
    let series = "kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family=\"IPv4\"}";

    metrics.on_sync_finished(IpFamily::V4, &failed_sync(true, false));
    assert_eq!(sample(&metrics.render(), series), None);

    metrics.on_sync_finished(IpFamily::V4, &failed_sync(true, true));
    assert_eq!(sample(&metrics.render(), series), Some(1.0));
}

#[test]
fn nftables_cleanup_failures_are_counted_from_successful_syncs() {
    let metrics = ProxyMetrics::new("nftables");
    let mut stats = iptables_sync(true);
    if let Ok(outcome) = &mut stats.result {
        outcome.cleanup_failures = 2;
    }
    metrics.on_sync_finished(IpFamily::V4, &stats);
    metrics.on_sync_finished(IpFamily::V4, &iptables_sync(false));

    let text = metrics.render();
    assert_eq!(
        sample(
            &text,
            "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total{ip_family=\"IPv4\"}"
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &text,
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=\"IPv4\"}"
        ),
        None
    );
}

#[test]
fn syncs_move_the_sync_metrics_with_upstreams_buckets() {
    let metrics = ProxyMetrics::new("iptables");
    let (proxier, _) = proxier(&metrics);

    proxier.sync_once().unwrap();
    let web = service("ns1", "web", |s| {
        s.cluster_ip("10.96.0.10").port("http", 80, "TCP")
    });
    proxier.on_service(ObjectEvent::Apply(web));
    let queued = metrics.render();
    proxier.sync_once().unwrap();
    let synced = metrics.render();

    let family = "{ip_family=\"IPv4\"}";
    assert_eq!(
        sample(
            &synced,
            &format!("kubeproxy_sync_proxy_rules_duration_seconds_count{family}")
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &synced,
            &format!("kubeproxy_sync_full_proxy_rules_duration_seconds_count{family}")
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &synced,
            &format!("kubeproxy_sync_partial_proxy_rules_duration_seconds_count{family}")
        ),
        Some(1.0)
    );
    assert!(
        sample(
            &synced,
            &format!("kubeproxy_sync_proxy_rules_last_timestamp_seconds{family}")
        )
        .unwrap()
            > 1.7e9
    );
    assert!(
        synced.contains(
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.001\",ip_family=\"IPv4\"}"
        ) || synced.contains(
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.001\"}"
        )
    );
    assert!(
        synced.contains("le=\"16.384\""),
        "15 exponential buckets from 1 ms"
    );
    assert_eq!(
        sample(&queued, "kubeproxy_sync_proxy_rules_service_changes_total"),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &queued,
            "kubeproxy_sync_proxy_rules_service_changes_pending"
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &synced,
            "kubeproxy_sync_proxy_rules_service_changes_pending"
        ),
        Some(0.0)
    );
    assert!(sample(
        &synced,
        &format!("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{family}")
    )
    .is_some());
}

#[test]
fn a_failed_sync_counts_as_a_restore_failure() {
    let metrics = ProxyMetrics::new("iptables");
    let (proxier, backend) = proxier(&metrics);
    backend.fail_next(1);

    assert!(proxier.sync_once().is_err());

    let text = metrics.render();
    assert_eq!(
        sample(
            &text,
            "kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family=\"IPv4\"}"
        ),
        Some(1.0)
    );
}

#[test]
fn rule_counts_show_what_the_table_holds_and_what_the_last_sync_wrote() {
    let metrics = ProxyMetrics::new("iptables");
    proxier(&metrics);

    metrics.on_sync_finished(IpFamily::V4, &iptables_sync(true));
    let after_full = metrics.render();
    metrics.on_sync_finished(IpFamily::V4, &iptables_sync(false));
    let after_partial = metrics.render();

    let series = |name: &str, table: &str| {
        format!(
            "kubeproxy_sync_proxy_rules_iptables_{name}{{ip_family=\"IPv4\",table=\"{table}\"}}"
        )
    };
    assert_eq!(sample(&after_full, &series("last", "nat")), Some(12.0));
    assert_eq!(sample(&after_partial, &series("last", "nat")), Some(3.0));
    assert_eq!(sample(&after_partial, &series("total", "nat")), Some(12.0));
    assert_eq!(sample(&after_partial, &series("last", "filter")), Some(4.0));
}

#[test]
fn each_applied_change_is_one_network_programming_observation() {
    let metrics = ProxyMetrics::new("iptables");
    proxier(&metrics);

    metrics.on_sync_finished(IpFamily::V4, &iptables_sync(false));
    let text = metrics.render();

    let family = "ip_family=\"IPv4\"";
    let series = |suffix: &str| format!("kubeproxy_network_programming_duration_seconds_{suffix}");
    assert_eq!(
        sample(&text, &format!("{}{{{family}}}", series("count"))),
        Some(2.0)
    );
    assert_eq!(
        sample(&text, &format!("{}{{{family}}}", series("sum"))),
        Some(2.7)
    );
    let bucket = |le: &str| {
        text.lines()
            .find(|l| l.starts_with(&series("bucket")) && l.contains(&format!("le=\"{le}\"")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    assert_eq!(bucket("0.5"), Some(0.0));
    assert_eq!(bucket("1.0"), Some(1.0));
    assert_eq!(bucket("2.0"), Some(2.0));
}

#[test]
fn network_programming_buckets_are_upstreams() {
    let metrics = ProxyMetrics::new("iptables");
    proxier(&metrics);
    let text = metrics.render();
    for bound in [
        "0.25", "0.5", "1.0", "59.0", "60.0", "115.0", "120.0", "300.0",
    ] {
        assert!(
            text.contains(&format!("le=\"{bound}\"")),
            "bucket {bound}:\n{text}"
        );
    }
    assert!(!text.contains("le=\"330.0\""));
    assert!(
        text.contains("kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv4\"} 0")
    );
}

#[derive(Debug)]
struct FakeNfacct;

impl kp_nfacct::CounterReader for FakeNfacct {
    fn counts(&mut self, name: &str) -> Result<kp_nfacct::Counts, kp_nfacct::NfacctError> {
        let packets = match name {
            "invalid" => 7,
            "localhost" => 3,
            _ => panic!("unexpected counter {name}"),
        };
        Ok(kp_nfacct::Counts { packets, bytes: 0 })
    }
}

#[test]
fn nfacct_counters_are_published_under_upstreams_names() {
    let metrics = ProxyMetrics::new("iptables");
    metrics.count_nfacct(Box::new(FakeNfacct), "invalid", "localhost");

    let text = metrics.render();

    assert_eq!(
        sample(
            &text,
            "kubeproxy_iptables_ct_state_invalid_dropped_packets_total"
        ),
        Some(7.0)
    );
    assert_eq!(
        sample(
            &text,
            "kubeproxy_iptables_localhost_nodeports_accepted_packets_total"
        ),
        Some(3.0)
    );
}

#[test]
fn healthz_answers_are_counted_by_code() {
    let metrics = ProxyMetrics::new("iptables");
    metrics.healthz_answered(200);
    metrics.healthz_answered(503);
    metrics.livez_answered(200);

    let text = metrics.render();

    assert_eq!(
        sample(&text, "kubeproxy_proxy_healthz_total{code=\"503\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "kubeproxy_proxy_livez_total{code=\"200\"}"),
        Some(1.0)
    );
}

#[test]
fn api_watch_failures_show_per_resource_under_our_own_prefix() {
    let metrics = ProxyMetrics::new("iptables");

    let text = metrics.render();

    assert!(declared(&text, "kubeproxy_rs_api_watch_failures_total"));
    // The counts are the API source's (none in this process: no source ran).
    let counts = kp_source::api::watch_failures();
    for (resource, count) in [
        ("services", counts.services),
        ("endpointslices", counts.endpoint_slices),
        ("nodes", counts.nodes),
    ] {
        #[allow(clippy::cast_precision_loss)]
        let expected = count as f64;
        assert_eq!(
            sample(
                &text,
                &format!("kubeproxy_rs_api_watch_failures_total{{resource=\"{resource}\"}}")
            ),
            Some(expected),
            "{text}"
        );
    }
}

#[test]
fn api_requests_are_counted_and_timed_with_client_gos_labels_and_buckets() {
    let metrics = ProxyMetrics::new("iptables");
    let observer = metrics.api_requests();
    let request = |code, millis| kp_source::api::RequestOutcome {
        method: "GET",
        host: "10.0.0.1:6443",
        code,
        duration: Duration::from_millis(millis),
    };
    observer.observe(&request(Some(200), 3));
    observer.observe(&request(Some(200), 40));
    observer.observe(&request(None, 1_000));

    let text = metrics.render();
    let series = |labels: &str| sample(&text, &format!("rest_client_{labels}"));
    assert_eq!(
        series("requests_total{code=\"200\",method=\"GET\",host=\"10.0.0.1:6443\"}"),
        Some(2.0)
    );
    assert_eq!(
        series("requests_total{code=\"<error>\",method=\"GET\",host=\"10.0.0.1:6443\"}"),
        Some(1.0)
    );
    let bucket = |le: &str| {
        series(&format!(
            "request_duration_seconds_bucket{{le=\"{le}\",verb=\"GET\",host=\"10.0.0.1:6443\"}}"
        ))
    };
    assert_eq!(bucket("0.005"), Some(1.0), "{text}");
    assert_eq!(bucket("0.1"), Some(2.0));
    assert_eq!(bucket("1.0"), Some(3.0));
    assert_eq!(bucket("60.0"), Some(3.0));
}
