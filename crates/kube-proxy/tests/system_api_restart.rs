//! The `kube-proxy` binary through a restart of its API server as a real
//! kube-apiserver restarts: gone for [`OUTAGE`] (connections refused, open
//! watches cut), then answering 403 Forbidden for [`FORBIDDEN_FOR`] while
//! its authorizer warms up, then serving the same objects from a new watch
//! cache. Every watch must be back within 2 s of the server serving again,
//! the relist of unchanged objects must write no rule, an endpoint removed
//! then must reach the kernel at once, and the log must tell the outage in
//! a few lines. The test API server listens on the node namespace's
//! loopback: everything runs on a thread inside that namespace.
//!
//! The outage lasts the minute of the field report this test reproduces:
//! by then kube-rs' default backoff had grown to delays of tens of seconds,
//! far past the 2 s bound; the bounded backoff's delays stop growing after
//! 1.25 s (1 s plus jitter).
//!
//! Address plan: kp-testkit's (pods 10.244.1.2–3); Service 10.96.0.41,
//! port 80 → 8080.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_testkit::apiserver::TestApiServer;
use kp_testkit::builders::{endpoint_slice, node, service};
use kp_testkit::netns::{connect, require_root, wait_until, Netns, NsChild, Topology};

/// How long the API server is away: the outage of the field report. The
/// retries stop growing at about 1.25 s, so a longer outage recovers alike.
const OUTAGE: Duration = Duration::from_secs(60);
/// How long the restarted server answers 403 Forbidden.
const FORBIDDEN_FOR: Duration = Duration::from_secs(3);
/// The bound on recovery once the server serves again.
const RECOVERY: Duration = Duration::from_secs(2);
/// The most lines the log may hold about the outage.
const OUTAGE_LOG_LINES: usize = 3;

const WATCHED: [&str; 3] = [
    "/api/v1/services",
    "/apis/discovery.k8s.io/v1/endpointslices",
    "/api/v1/nodes",
];

fn web(addresses: &[&str]) -> EndpointSlice {
    endpoint_slice("demo", "web-1", "web", |mut e| {
        e = e.address_type("IPv4").port("http", 8080, "TCP");
        for address in addresses {
            e = e.endpoint(address, |ep| ep.ready(true).node("node-1"));
        }
        e
    })
}

fn web_service() -> Service {
    service("demo", "web", |s| {
        s.cluster_ip("10.96.0.41")
            .port("http", 80, "TCP")
            .target_port(8080)
    })
}

/// The Node as the kubelet rewrites it with a new heartbeat: only its
/// status conditions change.
fn node_with_heartbeat() -> k8s_openapi::api::core::v1::Node {
    use k8s_openapi::api::core::v1::NodeCondition;
    let mut node = node("node-1", |n| n.internal_ip("192.168.99.2"));
    let status = node.status.get_or_insert_with(Default::default);
    status.conditions = Some(vec![NodeCondition {
        type_: "Ready".to_owned(),
        status: "True".to_owned(),
        reason: Some("KubeletReady".to_owned()),
        ..NodeCondition::default()
    }]);
    node
}

/// Syncs of the proxy's rules so far, from its metrics (the calling thread
/// is in the node namespace).
fn syncs() -> u64 {
    let reply = kp_testkit::http::get(("127.0.0.1", 10249), "/metrics").unwrap();
    reply
        .body
        .lines()
        .filter(|l| l.starts_with("kubeproxy_sync_proxy_rules_duration_seconds_count"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// [`syncs`] once a second has passed without one: the Node listed after
/// the first sync may ask for a second.
fn settled_syncs() -> u64 {
    loop {
        let count = syncs();
        if !wait_until(Duration::from_secs(1), || syncs() != count) {
            return count;
        }
    }
}

/// One series of the proxy's metrics.
fn metric(series: &str) -> f64 {
    let reply = kp_testkit::http::get(("127.0.0.1", 10249), "/metrics").unwrap();
    let line = reply
        .body
        .lines()
        .find(|l| l.starts_with(series))
        .unwrap_or_else(|| panic!("no {series} in\n{}", reply.body));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// Whether the nat table has a DNAT rule to `endpoint` (the calling thread
/// is in the node namespace).
fn dnat_to(endpoint: &str) -> bool {
    let out = Command::new("iptables-save")
        .args(["-t", "nat"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .contains(&format!("--to-destination {endpoint}"))
}

/// Whether each watched kind was listed by a request after `since` (an
/// index into the request log) that the server answered (not refused
/// with 403).
fn relisted_since(server: &TestApiServer, since: usize) -> bool {
    let log = server.request_log();
    WATCHED.iter().all(|path| {
        log[since..].iter().any(|r| {
            r.method == "GET" && r.path == *path && !r.query.contains("watch=") && !r.forbidden
        })
    })
}

fn log_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_binary_recovers_from_an_api_server_restart_within_two_seconds() {
    require_root();
    let cluster = Topology::builder()
        .pod("ep1", |p| p.tcp(8080))
        .pod("ep2", |p| p.tcp(8080))
        .build()
        .unwrap();
    cluster.add_node_default_route().unwrap();
    let pod = cluster.pod("ep1");
    cluster.node().block_on(|| story(pod));
}

async fn story(pod: &Netns) {
    let server = TestApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let stderr = dir.path().join("stderr");
    server.write_kubeconfig(&kubeconfig).unwrap();
    server.create(node("node-1", |n| n.internal_ip("192.168.99.2")));
    server.create(web_service());
    server.create(web(&["10.244.1.2", "10.244.1.3"]));
    let _proxy = NsChild::spawn(
        Command::new(env!("CARGO_BIN_EXE_kube-proxy"))
            .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
            .args(["--hostname-override", "node-1"])
            .args(["--cluster-cidr", "10.244.0.0/16"])
            .args(["--iptables-min-sync-period", "0s"])
            // No periodic sync: every sync in this story has a cause.
            .args(["--iptables-sync-period", "1h"])
            .env_remove("KUBECONFIG")
            .env_remove("RUST_LOG")
            .stderr(Stdio::from(File::create(&stderr).unwrap())),
    )
    .unwrap();
    let web_ip: SocketAddr = "10.96.0.41:80".parse().unwrap();
    let up = wait_until(Duration::from_secs(20), || {
        dnat_to("10.244.1.2:8080") && connect(pod, web_ip).is_ok()
    });
    assert!(up, "the Service is programmed from the API");
    let syncs_before = settled_syncs();
    let failures_before =
        metric("kubeproxy_rs_api_watch_failures_total{resource=\"endpointslices\"}");
    let lines_before = log_lines(&stderr).len();

    server.stop().await;
    let outage = Instant::now();
    let mut every_half_second = tokio::time::interval(Duration::from_millis(500));
    while outage.elapsed() < OUTAGE {
        every_half_second.tick().await;
        assert!(
            connect(pod, web_ip).is_ok(),
            "rules stay while the API server is down"
        );
    }
    // Meanwhile the kubelet reported its Node's status: the relist brings a
    // Node whose labels, addresses and pod CIDRs are unchanged.
    server.update(node_with_heartbeat());
    // Lists answered from here on are the relists. (Counting from the end
    // of the 403 phase instead would miss a list answered in the moment
    // between the phase's end and the test seeing it.)
    let requests_at_restart = server.request_log().len();
    server.restart_as_new(FORBIDDEN_FOR).await.unwrap();
    let restarted = Instant::now();
    while server.is_forbidding() {
        assert!(restarted.elapsed() < OUTAGE, "the 403 phase never ended");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let serving = Instant::now();

    let relisted = wait_until(Duration::from_secs(30), || {
        relisted_since(&server, requests_at_restart)
    });
    let back_after = serving.elapsed();
    assert!(relisted, "every watch lists again after the restart");
    eprintln!("every watch listed again {back_after:?} after the server served again");
    assert!(
        back_after <= RECOVERY,
        "every watch must be back within {RECOVERY:?} of the server serving again; took {back_after:?}"
    );
    assert!(
        server.forbidden_answers() > 0,
        "the proxy met the 403 phase"
    );
    let rewritten = wait_until(Duration::from_secs(1), || syncs() != syncs_before);
    assert!(
        !rewritten,
        "the relist of unchanged objects synced the rules"
    );

    // One endpoint goes: the kernel has it at once.
    server.update(web(&["10.244.1.3"]));
    let changed = Instant::now();
    let applied = wait_until(Duration::from_secs(10), || !dnat_to("10.244.1.2:8080"));
    let change_latency = changed.elapsed();
    let since_serving = serving.elapsed();
    assert!(applied, "the endpoint removal reaches the kernel");
    eprintln!(
        "endpoint removal in the kernel {change_latency:?} after the change, \
         {since_serving:?} after the server served again"
    );
    assert!(change_latency <= RECOVERY, "took {change_latency:?}");
    assert_eq!(syncs(), syncs_before + 1, "one sync, for the change");
    assert!(
        metric("kubeproxy_rs_api_watch_failures_total{resource=\"endpointslices\"}")
            > failures_before,
        "the failures are counted"
    );

    let outage_lines = log_lines(&stderr).split_off(lines_before);
    assert!(
        outage_lines.len() <= OUTAGE_LOG_LINES,
        "at most {OUTAGE_LOG_LINES} lines about the outage: {outage_lines:#?}"
    );
    assert!(
        outage_lines.iter().any(|l| l.contains("cannot be reached"))
            && outage_lines.iter().any(|l| l.contains("answers again")),
        "the outage and its end are logged: {outage_lines:#?}"
    );
    server.assert_no_protocol_errors();
}
