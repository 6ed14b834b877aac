//! The `kube-proxy` binary's servers as a node runs them: the healthz
//! server (10256), the metrics server (10249) and a health-check node port,
//! checked by HTTP from inside the node network namespace while the proxy
//! follows manifest edits.
//!
//! The LoadBalancer Service `demo/lb` (10.96.0.43:80, NodePort 30081,
//! `externalTrafficPolicy: Local`, health-check node port 32000) has one
//! endpoint on this node (10.244.1.2) and one on node-2.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_testkit::builders::{self, endpoint_slice, service};
use kp_testkit::files::{manifest, write_atomically};
use kp_testkit::http::{self, HttpReply};
use kp_testkit::netns::{require_root, wait_until, Netns};
use kp_testkit::upstream;

fn lb_service() -> Service {
    service("demo", "lb", |s| {
        s.service_type("LoadBalancer")
            .cluster_ip("10.96.0.43")
            .external_traffic_policy_local()
            .health_check_node_port(32000)
            .port("http", 80, "TCP")
            .target_port(8080)
            .node_port(30081)
    })
}

/// `demo/lb-1` with one ready endpoint per `(address, node)`.
fn slice(endpoints: &[(&str, &str)]) -> EndpointSlice {
    endpoint_slice("demo", "lb-1", "lb", |mut e| {
        e = e.address_type("IPv4").port("http", 8080, "TCP");
        for (address, node) in endpoints {
            e = e.endpoint(address, |ep| ep.ready(true).node(node));
        }
        e
    })
}

/// `GET path` on `port` of the node's loopback.
fn get(node: &Netns, port: u16, path: &str) -> std::io::Result<HttpReply> {
    node.run(|| http::get(("127.0.0.1", port), path))
}

fn json(answer: &HttpReply) -> serde_json::Value {
    serde_json::from_str(&answer.body).unwrap_or_else(|e| panic!("{e}: {}", answer.body))
}

/// The value of the metric sample `series` (name and labels, exactly).
fn sample(metrics: &str, series: &str) -> Option<f64> {
    let line = metrics.lines().find(|l| l.starts_with(series))?;
    line[series.len()..].trim().parse().ok()
}

/// The annotation the EndpointSlice controller sets, stamped now.
fn changed_now(mut slice: EndpointSlice) -> EndpointSlice {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    slice.metadata.annotations = Some(
        [(
            "endpoints.kubernetes.io/last-change-trigger-time".to_owned(),
            now,
        )]
        .into(),
    );
    slice
}

#[test]
fn the_servers_answer_as_upstreams_do_and_follow_the_syncs() {
    require_root();
    let node = Netns::create("agent").unwrap();
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("lb.json"), manifest(&lb_service())).unwrap();
    let slice_file = dir.path().join("slice.json");
    let both = slice(&[("10.244.1.2", "node-1"), ("10.244.2.2", "node-2")]);
    fs::write(&slice_file, manifest(&both)).unwrap();
    let _proxy = node.spawn(
        env!("CARGO_BIN_EXE_kube-proxy"),
        &[
            "--manifests",
            dir.path().to_str().unwrap(),
            "--hostname-override",
            "node-1",
            "--cluster-cidr",
            "10.244.0.0/16",
            "--iptables-min-sync-period",
            "0s",
        ],
    );
    let up = wait_until(Duration::from_secs(15), || {
        get(&node, 32000, "/").is_ok_and(|a| a.code == 200)
    });
    assert!(
        up,
        "the health-check node port answers once the proxy synced"
    );

    // Health-check node port: one local endpoint.
    let answer = get(&node, 32000, "/").unwrap();
    assert_eq!(
        json(&answer),
        serde_json::json!({
            "service": {"namespace": "demo", "name": "lb"},
            "localEndpoints": 1,
            "serviceProxyHealthy": true
        })
    );
    assert!(
        answer.head.contains("X-Load-Balancing-Endpoint-Weight: 1")
            || answer
                .head
                .to_lowercase()
                .contains("x-load-balancing-endpoint-weight: 1")
    );

    // healthz and livez on 10256.
    let healthz = get(&node, 10256, "/healthz").unwrap();
    assert_eq!(healthz.code, 200);
    let body = json(&healthz);
    assert_eq!(body["nodeEligible"], true);
    assert!(body["lastUpdated"]
        .as_str()
        .unwrap()
        .ends_with(" +0000 UTC"));
    assert!(body["currentTime"].is_string());
    let livez = get(&node, 10256, "/livez").unwrap();
    assert_eq!(livez.code, 200);
    let keys: Vec<_> = json(&livez).as_object().unwrap().keys().cloned().collect();
    assert_eq!(keys, ["currentTime", "lastUpdated"]);
    assert_eq!(get(&node, 10256, "/other").unwrap().code, 404);

    // The metrics server on 10249.
    assert_eq!(get(&node, 10249, "/proxyMode").unwrap().body, "iptables");
    assert_eq!(get(&node, 10249, "/healthz").unwrap().body, "ok");
    let configz = json(&get(&node, 10249, "/configz").unwrap());
    assert_eq!(
        configz["kubeproxy.config.k8s.io"]["hostnameOverride"],
        "node-1"
    );
    let metrics = get(&node, 10249, "/metrics").unwrap();
    assert_eq!(metrics.code, 200);
    let syncs = "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}";
    let before = sample(&metrics.body, syncs).unwrap();
    assert!(before >= 1.0, "{}", metrics.body);
    assert!(sample(&metrics.body, "kubeproxy_proxy_healthz_total{code=\"200\"}").unwrap() >= 1.0);
    assert!(
        sample(
            &metrics.body,
            "kubeproxy_sync_proxy_rules_iptables_total{ip_family=\"IPv4\",table=\"nat\"}"
        )
        .unwrap()
            > 0.0
    );
    assert!(sample(&metrics.body, "process_resident_memory_bytes").unwrap() > 0.0);
    // The version dashboards show, under component-base's name.
    let build_info = metrics
        .body
        .lines()
        .find(|l| l.starts_with("kubernetes_build_info{major=\"1\",minor=\""))
        .unwrap_or_else(|| panic!("no kubernetes_build_info:\n{}", metrics.body));
    assert!(
        build_info.contains(&format!(
            "git_version=\"v{}-kube-proxy-rs\"",
            env!("CARGO_PKG_VERSION")
        )) && build_info.contains("compiler=\"rustc\"")
            && build_info.contains("platform=\"linux/")
            && build_info.ends_with("} 1"),
        "{build_info}"
    );
    assert!(metrics.body.contains("# TYPE kubernetes_build_info gauge"));
    assert!(
        sample(
            &metrics.body,
            "kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family=\"IPv4\"}"
        )
        .unwrap()
            >= 1.0,
        "the conntrack reconciler ran after the first sync"
    );

    // A connection to a NodePort on the node's loopback is counted.
    node.run(|| {
        let address = "127.0.0.1:30081".parse().unwrap();
        // The endpoint is not there; the SYN is counted all the same.
        let _ = std::net::TcpStream::connect_timeout(&address, Duration::from_millis(300));
    });
    let metrics = get(&node, 10249, "/metrics").unwrap().body;
    let missing: Vec<_> = upstream::IPTABLES_METRICS
        .iter()
        .filter(|name| !metrics.lines().any(|l| l.starts_with(*name)))
        .collect();
    assert!(missing.is_empty(), "missing {missing:?}:\n{metrics}");
    assert!(
        sample(
            &metrics,
            "kubeproxy_iptables_localhost_nodeports_accepted_packets_total"
        )
        .unwrap()
            >= 1.0,
        "{metrics}"
    );
    assert!(
        sample(
            &metrics,
            "kubeproxy_sync_proxy_rules_iptables_last{ip_family=\"IPv4\",table=\"nat\"}"
        )
        .unwrap()
            > 0.0
    );
    let programmed = "kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv4\"}";
    assert_eq!(sample(&metrics, programmed), Some(0.0), "no change yet");

    // The last local endpoint goes away: the health-check port says 503,
    // and the metrics count the sync and its network-programming latency.
    let remote_only = changed_now(slice(&[("10.244.2.2", "node-2")]));
    write_atomically(&slice_file, &manifest(&remote_only));
    let drained = wait_until(Duration::from_secs(10), || {
        get(&node, 32000, "/").is_ok_and(|a| a.code == 503)
    });
    assert!(drained, "503 without local endpoints");
    assert_eq!(json(&get(&node, 32000, "/").unwrap())["localEndpoints"], 0);
    let after = sample(&get(&node, 10249, "/metrics").unwrap().body, syncs).unwrap();
    assert!(
        after > before,
        "the edit's sync is counted: {before} → {after}"
    );
    let changes = get(&node, 10249, "/metrics").unwrap().body;
    assert!(
        sample(
            &changes,
            "kubeproxy_sync_proxy_rules_endpoint_changes_total"
        )
        .unwrap()
            >= 2.0
    );
    assert_eq!(sample(&changes, programmed), Some(1.0), "{changes}");

    // Profiling is off: no pprof endpoint, as upstream.
    assert_eq!(get(&node, 10249, "/debug/pprof/").unwrap().code, 404);

    // The cluster autoscaler is about to delete the node: load balancers
    // must stop sending to it (/healthz 503), but the proxy is alive.
    let leaving = builders::node("node-1", |n| {
        n.internal_ip("192.168.99.2")
            .taint("ToBeDeletedByClusterAutoscaler", "NoSchedule")
    });
    fs::write(dir.path().join("node.json"), manifest(&leaving)).unwrap();
    let ineligible = wait_until(Duration::from_secs(10), || {
        get(&node, 10256, "/healthz").is_ok_and(|a| a.code == 503)
    });
    assert!(ineligible, "/healthz answers 503 for a node being deleted");
    let healthz = get(&node, 10256, "/healthz").unwrap();
    assert_eq!(json(&healthz)["nodeEligible"], false);
    assert_eq!(get(&node, 10256, "/livez").unwrap().code, 200);
    let metrics = get(&node, 10249, "/metrics").unwrap().body;
    assert!(sample(&metrics, "kubeproxy_proxy_healthz_total{code=\"503\"}").unwrap() >= 1.0);
}

/// `PUT path` with `body` on `port` of the node's loopback: the status
/// line and the body.
fn put(node: &Netns, port: u16, path: &str, body: &str) -> (String, String) {
    use std::io::{Read, Write};
    node.run(|| {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            stream,
            "PUT {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply)?;
        let status = reply.lines().next().unwrap_or_default().to_owned();
        let body = reply.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
        Ok::<_, std::io::Error>((status, body))
    })
    .unwrap()
}

/// The log verbosity changes at run time through `/debug/flags/v` with
/// `--profiling`, as upstream's: at `-v=0` no sync is logged, after
/// `PUT 2` each sync is ("SyncProxyRules complete", upstream's verbosity 2),
/// and after `PUT 0` none again.
#[test]
fn the_verbosity_changes_at_run_time_through_debug_flags_v() {
    require_root();
    let node = Netns::create("verbosity").unwrap();
    node.ip(&["link", "set", "lo", "up"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    fs::create_dir_all(&manifests).unwrap();
    let log_path = dir.path().join("stderr");
    let mut command = node.command(env!("CARGO_BIN_EXE_kube-proxy"));
    command
        .args(["--manifests", manifests.to_str().unwrap()])
        .args([
            "--hostname-override",
            "node-1",
            "--cluster-cidr",
            "10.244.0.0/16",
        ])
        .args(["--profiling", "--iptables-sync-period", "1s", "-v", "0"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(fs::File::create(&log_path).unwrap());
    let _proxy = kp_testkit::netns::NsChild::spawn(&mut command).unwrap();
    let log = || fs::read_to_string(&log_path).unwrap_or_default();
    let syncs = || log().matches("\"SyncProxyRules complete\"").count();
    let synced = wait_until(Duration::from_secs(20), || {
        get(&node, 10256, "/healthz").is_ok_and(|reply| reply.code == 200)
    });
    assert!(synced, "the proxy never synced:\n{}", log());
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(syncs(), 0, "a sync was logged at -v=0:\n{}", log());

    let (status, body) = put(&node, 10249, "/debug/flags/v", "2");
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    assert_eq!(body, "successfully set klog.logging.verbosity to 2\n");
    let logged = wait_until(Duration::from_secs(10), || syncs() >= 2);
    assert!(logged, "no sync logged at -v=2:\n{}", log());
    assert!(log().contains("\"Log verbosity changed through /debug/flags/v\""));

    let (status, body) = put(&node, 10249, "/debug/flags/v", "two");
    assert_eq!(status, "HTTP/1.1 400 Bad Request", "{body}");
    let (status, _) = put(&node, 10249, "/debug/flags/v", "0");
    assert_eq!(status, "HTTP/1.1 200 OK");
    std::thread::sleep(Duration::from_millis(500));
    let at_zero = syncs();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        syncs(),
        at_zero,
        "syncs logged after -v went back to 0:\n{}",
        log()
    );
    let not_put = get(&node, 10249, "/debug/flags/v").unwrap();
    assert_eq!(not_put.code, 406);
}
