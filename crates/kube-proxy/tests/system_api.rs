//! The `kube-proxy` binary against an API server that speaks the real
//! list/watch protocol, programming real iptables in a node network
//! namespace: create, scale, a forced relist that rewrites nothing, a 10 s
//! outage, a Service of another proxy, no endpoints (refused), delete. The test API server listens
//! on the node namespace's loopback:
//! everything in this test runs on a thread inside that namespace.
//!
//! Address plan: kp-testkit's (pods 10.244.1.2–3); Services 10.96.0.41 and
//! 10.96.0.42, port 80 → 8080.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_testkit::apiserver::TestApiServer;
use kp_testkit::builders::{endpoint_slice, node, service};
use kp_testkit::netns::{
    connect, hits_until_all, require_root, wait_until, Netns, NsChild, Topology,
};

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

/// The pods answering `addr`, sampled until each of `expected` answered.
fn backends(from: &Netns, addr: SocketAddr, expected: &[&str]) -> BTreeSet<String> {
    hits_until_all(from, addr, expected, 200)
        .into_keys()
        .collect()
}

/// Packets counted by the nat DNAT rule to `endpoint` (the calling thread
/// is in the node namespace).
fn dnat_packets(endpoint: &str) -> u64 {
    let out = Command::new("iptables-save")
        .args(["-c", "-t", "nat"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains(&format!("--to-destination {endpoint}")))
        .unwrap_or_else(|| panic!("no DNAT rule to {endpoint}:\n{text}"));
    // "[packets:bytes] -A KUBE-SEP-… -j DNAT …"
    line.trim_start_matches('[')
        .split(':')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Whether any rule of the nat or filter table names `text` (the calling
/// thread is in the node namespace).
fn rules_mention(text: &str) -> bool {
    ["nat", "filter"].iter().any(|table| {
        let out = Command::new("iptables-save")
            .args(["-t", table])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap().contains(text)
    })
}

/// List (not watch) requests the server has answered.
fn list_requests(server: &TestApiServer) -> usize {
    server
        .request_log()
        .iter()
        .filter(|r| r.method == "GET" && !r.query.contains("watch="))
        .count()
}

/// `/metrics` as a Prometheus server reads it: the 0.0.4 text by default,
/// parsed by a Prometheus text-format parser, holds every series the
/// kubernetes-mixin's Proxy dashboard queries, with its type; OpenMetrics
/// only when asked for.
fn scraped_as_the_mixin_dashboard_reads_it(host: &str, metrics: &str) {
    use prometheus_parse::{Scrape, Value};

    let reply = kp_testkit::http::get(("127.0.0.1", 10249), "/metrics").unwrap();
    assert!(
        reply.head.contains("text/plain; version=0.0.4"),
        "{}",
        reply.head
    );
    let scrape = Scrape::parse(reply.body.lines().map(|l| Ok(l.to_owned()))).unwrap();
    let has = |name: &str, label: Option<(&str, &str)>, kind: &str| {
        scrape.samples.iter().any(|s| {
            let typed = matches!(
                (&s.value, kind),
                (Value::Histogram(_), "histogram")
                    | (Value::Counter(_), "counter")
                    | (Value::Gauge(_), "gauge")
                    | (Value::Untyped(_), "untyped")
            );
            s.metric == name
                && typed
                && label.is_none_or(|(key, value)| s.labels.get(key) == Some(value))
        })
    };
    for (name, kind) in kp_testkit::upstream::MIXIN_PROXY_SERIES {
        assert!(has(name, None, kind), "{name} as a {kind}:\n{}", reply.body);
        if *kind == "histogram" {
            // The rates and "by (le)" of the dashboard read these two.
            assert!(
                has(&format!("{name}_count"), None, "untyped"),
                "{name}_count"
            );
        }
    }
    for verb in ["GET", "POST"] {
        assert!(
            has(
                "rest_client_request_duration_seconds",
                Some(("verb", verb)),
                "histogram"
            ),
            "{verb} requests to {host} are timed"
        );
    }
    assert!(scrape
        .samples
        .iter()
        .any(|s| s.metric == "rest_client_requests_total"
            && s.labels
                .get("code")
                .is_some_and(|code| code.starts_with('2'))));
    // Every counter's samples are typed as counters: the 0.0.4 names carry
    // `_total` in TYPE as in the samples.
    for line in reply.body.lines().filter(|l| l.starts_with("# TYPE ")) {
        if line.ends_with(" counter") {
            assert!(
                line.split(' ')
                    .nth(2)
                    .is_some_and(|n| n.ends_with("_total")),
                "{line}"
            );
        }
    }

    let open = kp_testkit::http::get_accepting(
        ("127.0.0.1", 10249),
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
    )
    .unwrap();
    assert!(
        open.head.contains("application/openmetrics-text"),
        "{}",
        open.head
    );
    assert!(open.body.trim_end().ends_with("# EOF"));
    assert!(metrics.contains("rest_client_requests_total{"));
}

/// The value of the metric sample `series` (name and labels, exactly).
fn sample(metrics: &str, series: &str) -> Option<f64> {
    let line = metrics.lines().find(|l| l.starts_with(series))?;
    line[series.len()..].trim().parse().ok()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

#[test]
fn the_binary_follows_the_api_server_through_an_outage() {
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
    server.write_kubeconfig(&kubeconfig).unwrap();
    server.create(node("node-1", |n| n.internal_ip("192.168.99.2")));
    server.create(web_service());
    server.create(web(&["10.244.1.2", "10.244.1.3"]));
    server.create(service("demo", "elsewhere", |s| {
        s.cluster_ip("10.96.0.42")
            .port("http", 80, "TCP")
            .target_port(8080)
            .label("service.kubernetes.io/service-proxy-name", "another-proxy")
    }));
    server.create(endpoint_slice("demo", "elsewhere-1", "elsewhere", |e| {
        e.address_type("IPv4")
            .port("http", 8080, "TCP")
            .endpoint("10.244.1.2", |ep| ep.ready(true))
    }));

    let _proxy = NsChild::spawn(
        Command::new(env!("CARGO_BIN_EXE_kube-proxy"))
            .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
            .args([
                "--hostname-override",
                "node-1",
                "--cluster-cidr",
                "10.244.0.0/16",
            ])
            .args(["--iptables-min-sync-period", "0s"])
            // No periodic full sync in the middle of the story.
            .args(["--iptables-sync-period", "1h"])
            .env_remove("KUBECONFIG")
            // Its log (retries during the outage) would drown the test's.
            .stderr(Stdio::null()),
    )
    .unwrap();
    let web_ip: SocketAddr = "10.96.0.41:80".parse().unwrap();
    let up = wait_until(Duration::from_secs(20), || connect(pod, web_ip).is_ok());
    assert!(
        up,
        "creating the Service and its slice through the API programs it"
    );
    assert_eq!(backends(pod, web_ip, &["ep1", "ep2"]), set(&["ep1", "ep2"]));
    assert!(
        connect(pod, "10.96.0.42:80".parse().unwrap()).is_err(),
        "a Service labelled for another proxy is not programmed"
    );

    server.update(web(&["10.244.1.3"]));
    let scaled = wait_until(Duration::from_secs(10), || {
        backends(pod, web_ip, &["ep2"]) == set(&["ep2"])
    });
    assert!(scaled, "scaling the slice moves traffic");

    // A forced relist (410 Gone) that returns the same objects rewrites no
    // rule: the DNAT rule keeps its packet counter (a rewrite resets it).
    let before = dnat_packets("10.244.1.3:8080");
    assert!(before > 0, "traffic went through the DNAT rule");
    let lists = list_requests(&server);
    server.expire_history();
    let relisted = wait_until(Duration::from_secs(20), || {
        list_requests(&server) >= lists + 3
    });
    assert!(relisted, "every watcher relisted after the 410");
    // Give a (wrong) sync caused by the relist time to land.
    let rewritten = wait_until(Duration::from_secs(2), || {
        dnat_packets("10.244.1.3:8080") < before
    });
    assert!(!rewritten, "the relist rewrote the rules");

    // The API server goes away for 10 s: traffic keeps flowing, and a
    // change made meanwhile is applied once it is back.
    server.stop().await;
    server.update(web(&["10.244.1.2"]));
    let outage = Instant::now();
    let mut every_half_second = tokio::time::interval(Duration::from_millis(500));
    while outage.elapsed() < Duration::from_secs(10) {
        every_half_second.tick().await;
        let reply = connect(pod, web_ip).expect("rules stay while the API server is down");
        assert_eq!(reply.backend, "ep2");
    }
    server.restart().await.unwrap();
    let caught_up = wait_until(Duration::from_secs(45), || {
        backends(pod, web_ip, &["ep1"]) == set(&["ep1"])
    });
    assert!(
        caught_up,
        "the change made during the outage arrives after it"
    );

    // client-go's request metrics saw the lists and watches, the Starting
    // event, and the requests the outage refused.
    let metrics = kp_testkit::http::get(("127.0.0.1", 10249), "/metrics")
        .unwrap()
        .body;
    let host = server.addr().to_string();
    let requests = |code: &str, method: &str| {
        sample(
            &metrics,
            &format!(
                "rest_client_requests_total{{code=\"{code}\",method=\"{method}\",host=\"{host}\"}}"
            ),
        )
        .unwrap_or(0.0)
    };
    assert!(
        requests("200", "GET") >= 3.0,
        "lists and watches:\n{metrics}"
    );
    assert!(
        requests("201", "POST") >= 1.0,
        "the Starting event:\n{metrics}"
    );
    assert!(
        requests("<error>", "GET") >= 1.0,
        "refused during the outage:\n{metrics}"
    );
    scraped_as_the_mixin_dashboard_reads_it(&host, &metrics);
    let timed = sample(
        &metrics,
        &format!("rest_client_request_duration_seconds_count{{verb=\"GET\",host=\"{host}\"}}"),
    );
    assert!(timed.is_some_and(|n| n >= 3.0), "{metrics}");

    // Its last endpoint goes: the Service refuses connections.
    server.update(web(&[]));
    let refused = wait_until(Duration::from_secs(10), || {
        connect(pod, web_ip).is_err_and(|e| e.is_refused())
    });
    assert!(refused, "a Service without endpoints refuses connections");

    // Deleting the Service (and, as the garbage collector does, its slice)
    // removes every rule for its address, the REJECT included. What a
    // client sees then is up to the node's routes, as with upstream's
    // iptables mode; here no pod answers.
    server.delete::<Service>("demo", "web");
    server.delete::<EndpointSlice>("demo", "web-1");
    // Each watcher backs off on its own during the outage (up to 1.25 s
    // between tries): the Service watcher may reconnect after the
    // EndpointSlice watcher that delivered the changes above.
    let gone = wait_until(Duration::from_secs(45), || !rules_mention("10.96.0.41"));
    assert!(gone, "deleting the Service removes its rules");
    assert!(
        connect(pod, web_ip).is_err(),
        "no pod answers a deleted Service"
    );
    server.assert_no_protocol_errors();
}
