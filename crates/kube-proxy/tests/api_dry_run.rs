//! The binary against an API server that speaks the real list/watch
//! protocol: `--dry-run --kubeconfig` prints the rules of the cluster's
//! Services, and posts the "Starting" event only when it really runs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use kp_testkit::apiserver::TestApiServer;
use kp_testkit::builders::{endpoint_slice, node, service};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_prints_the_rules_of_the_api_servers_services() {
    let server = TestApiServer::start().await.unwrap();
    server.create(node("node-1", |n| n.internal_ip("192.168.99.2")));
    server.create(service("ns1", "web", |s| {
        s.cluster_ip("10.96.0.41").port("http", 80, "TCP")
    }));
    server.create(endpoint_slice("ns1", "web-1", "web", |e| {
        e.address_type("IPv4")
            .port("http", 8080, "TCP")
            .endpoint("10.244.1.2", |ep| ep.ready(true).node("node-1"))
    }));
    server.create(service("ns1", "other-proxy", |s| {
        s.cluster_ip("10.96.0.42")
            .port("http", 80, "TCP")
            .label("service.kubernetes.io/service-proxy-name", "someone-else")
    }));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();

    let binary = env!("CARGO_BIN_EXE_kube-proxy");
    let out = tokio::process::Command::new(binary)
        .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
        .args(["--hostname-override", "node-1", "--dry-run"])
        .env_remove("KUBECONFIG")
        .output()
        .await
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    let rules = String::from_utf8(out.stdout).unwrap();
    assert!(
        rules.contains(
            "--comment \"ns1/web:http cluster IP\" -m tcp -p tcp -d 10.96.0.41 --dport 80"
        ),
        "{rules}"
    );
    assert!(
        rules.contains("-j DNAT --to-destination 10.244.1.2:8080"),
        "{rules}"
    );
    assert!(
        !rules.contains("10.96.0.42"),
        "a Service of another proxy is not programmed:\n{rules}"
    );
    assert!(server.events().is_empty(), "a dry run posts no event");
    server.assert_no_protocol_errors();
}
