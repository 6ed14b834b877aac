//! What the `kube-proxy` binary writes to the API server: only its
//! `Starting` event, which the test API server validates as strictly as
//! kube-apiserver does (a refusal would be a protocol error and no event).
//! The proxy runs in a node network namespace, against a test API server
//! on that namespace's loopback.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::Duration;

use kp_testkit::apiserver::TestApiServer;
use kp_testkit::builders::node;
use kp_testkit::netns::{require_root, wait_until, Netns, NsChild};
use serde_json::json;

#[test]
fn the_binary_posts_its_starting_event_as_upstream_does() {
    require_root();
    let node_ns = Netns::create("events").unwrap();
    node_ns.block_on(story);
}

async fn story() {
    let server = TestApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    server.create(node("node-1", |n| n.internal_ip("192.168.99.2")));

    let _proxy = NsChild::spawn(
        Command::new(env!("CARGO_BIN_EXE_kube-proxy"))
            .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
            .args(["--hostname-override", "node-1"])
            .args(["--cluster-cidr", "10.244.0.0/16"])
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null()),
    )
    .unwrap();

    let posted = wait_until(Duration::from_secs(20), || !server.events().is_empty());
    assert!(
        posted,
        "the Starting event is accepted; refused: {:#?}",
        server.protocol_errors()
    );
    let events = server.events();
    assert_eq!(events.len(), 1, "{events:#?}");
    let event = &events[0];
    assert_eq!(
        (event.api_version.as_str(), event.namespace.as_str()),
        ("events.k8s.io/v1", "default")
    );
    let object = &event.object;
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(object["reason"], "Starting");
    assert_eq!(object["action"], "StartKubeProxy");
    assert_eq!(object["type"], "Normal");
    assert_eq!(object["reportingController"], "kube-proxy");
    assert_eq!(
        object["reportingInstance"],
        format!("kube-proxy-{}", hostname.trim()),
        "the OS host name, not the overridden node name, as upstream"
    );
    assert_eq!(
        object["regarding"],
        json!({"kind": "Node", "name": "node-1", "uid": "node-1"})
    );
    assert!(object["metadata"]["name"]
        .as_str()
        .unwrap()
        .starts_with("node-1."));
    for deprecated in [
        "deprecatedSource",
        "deprecatedFirstTimestamp",
        "deprecatedLastTimestamp",
        "deprecatedCount",
    ] {
        assert!(object.get(deprecated).is_none(), "{deprecated} is set");
    }
    let writes: Vec<_> = server
        .request_log()
        .into_iter()
        .filter(|r| r.method != "GET")
        .map(|r| r.path)
        .collect();
    assert_eq!(
        writes,
        ["/apis/events.k8s.io/v1/namespaces/default/events"],
        "the event is the only write"
    );
    server.assert_no_protocol_errors();
}
