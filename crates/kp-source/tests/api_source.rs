//! Stories of the API source against the test API server: what the proxy's
//! handler sees as the cluster changes, as watches break and resume, and as
//! the server goes away and comes back.
//!
//! Address plan (kp-testkit `plan`): services in 10.96.0.0/16, this node's
//! pods in 10.244.1.0/24; the proxy runs on `node-1`, `node-2` is another
//! node.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Recorder, NODE_NAME};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_model::ProxyEventHandler;
use kp_source::api::{
    client_from, post_refused_rules_event, post_starting_event, ApiError, ApiSource,
};
use kp_testkit::apiserver::TestApiServer;
use kp_testkit::plan::OTHER_NODE_NAME;
use kp_testkit::{endpoint_slice, node, service};
use tokio::sync::oneshot;

/// How long a test waits before declaring a change lost.
const GIVE_UP: Duration = Duration::from_secs(15);

/// A test API server and a source following it in the background.
struct Cluster {
    server: TestApiServer,
    recorder: Arc<Recorder>,
    _kubeconfig: tempfile::NamedTempFile,
    _stop: oneshot::Sender<()>,
}

fn web() -> Service {
    service("demo", "web", |s| {
        s.cluster_ip("10.96.0.10").port("http", 80, "TCP")
    })
}

fn web_slice() -> EndpointSlice {
    endpoint_slice("demo", "web-abc", "web", |s| {
        s.port("http", 8080, "TCP")
            .endpoint("10.244.1.11", |e| e.node(NODE_NAME))
    })
}

fn db() -> Service {
    service("demo", "db", |s| {
        s.cluster_ip("10.96.0.20").port("pg", 5432, "TCP")
    })
}

fn db_slice() -> EndpointSlice {
    endpoint_slice("demo", "db-abc", "db", |s| {
        s.port("pg", 5432, "TCP")
            .endpoint("10.244.1.12", |e| e.node(NODE_NAME))
    })
}

/// A cluster holding web and db (Services and slices) and both nodes, with
/// a source that has reported every kind synced; the lines of that first
/// list are returned sorted.
async fn cluster() -> (Cluster, Vec<String>) {
    let server = TestApiServer::start().await.unwrap();
    server.create(web());
    server.create(web_slice());
    server.create(db());
    server.create(db_slice());
    server.create(node(NODE_NAME, |n| n.internal_ip("192.168.99.2")));
    server.create(node(OTHER_NODE_NAME, |n| n.internal_ip("192.168.99.3")));
    let kubeconfig = tempfile::NamedTempFile::new().unwrap();
    server.write_kubeconfig(kubeconfig.path()).unwrap();
    let client = client_from(Some(kubeconfig.path()), None, 50.0, 100)
        .await
        .unwrap();
    let recorder = Arc::new(Recorder::default());
    let handler: Arc<dyn ProxyEventHandler> = recorder.clone();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(ApiSource::new(client, NODE_NAME).run(handler, async {
        let _ = stopped.await;
    }));
    let cluster = Cluster {
        server,
        recorder,
        _kubeconfig: kubeconfig,
        _stop: stop,
    };
    for line in common::synced_lines() {
        cluster.wait_for(&line).await;
    }
    let mut lines = cluster.recorder.take_lines();
    lines.sort();
    (cluster, lines)
}

impl Cluster {
    /// Waits until `line` was recorded.
    async fn wait_for(&self, line: &str) {
        let recorder = Arc::clone(&self.recorder);
        let wanted = line.to_owned();
        let seen = tokio::task::spawn_blocking(move || recorder.wait_for_line(&wanted, GIVE_UP))
            .await
            .unwrap();
        assert!(
            seen.is_some(),
            "{line:?} was never recorded; lines: {:#?}",
            self.recorder.lines()
        );
    }

    /// Waits for every line of `lines`, then returns everything recorded
    /// since the last take, sorted.
    async fn take_after(&self, lines: &[&str]) -> Vec<String> {
        for line in lines {
            self.wait_for(line).await;
        }
        let mut taken = self.recorder.take_lines();
        taken.sort();
        taken
    }

    /// Changes one object of each kind, so that whatever the source does
    /// before these changes arrive has been recorded by then.
    fn mark(&self) -> [&'static str; 3] {
        self.server
            .create(service("demo", "marker", |s| s.cluster_ip("10.96.0.99")));
        self.server
            .create(endpoint_slice("demo", "marker-abc", "marker", |s| s));
        self.server.update(node(NODE_NAME, |n| {
            n.internal_ip("192.168.99.2").label("marked", "yes")
        }));
        [
            "apply EndpointSlice demo/marker-abc",
            "apply Node node-1",
            "apply Service demo/marker",
        ]
    }

    fn lists_of(&self, path: &str) -> usize {
        let log = self.server.request_log();
        log.iter()
            .filter(|r| r.path == path && !r.query.contains("watch="))
            .count()
    }
}

#[tokio::test]
async fn the_first_list_delivers_every_kind_and_reports_each_synced() {
    let (cluster, lines) = cluster().await;

    assert_eq!(
        lines,
        [
            "apply EndpointSlice demo/db-abc",
            "apply EndpointSlice demo/web-abc",
            "apply Node node-1",
            "apply Service demo/db",
            "apply Service demo/web",
            "synced EndpointSlice",
            "synced Node",
            "synced Service",
        ]
    );
    let log: Vec<String> = cluster
        .server
        .request_log()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        log.iter()
            .any(|r| r.contains("/api/v1/nodes?")
                && r.contains("fieldSelector=metadata.name%3Dnode-1")),
        "{log:#?}"
    );
    cluster.server.assert_no_protocol_errors();
}

#[tokio::test]
async fn creates_updates_and_deletes_flow_through() {
    let (cluster, _) = cluster().await;

    cluster.server.create(service("demo", "shop", |s| {
        s.cluster_ip("10.96.0.30").port("https", 443, "TCP")
    }));
    cluster.wait_for("apply Service demo/shop").await;
    cluster.server.update(service("demo", "shop", |s| {
        s.cluster_ip("10.96.0.30").port("https", 8443, "TCP")
    }));
    cluster.server.delete::<EndpointSlice>("demo", "web-abc");
    cluster.server.delete::<Service>("demo", "shop");

    let lines = cluster
        .take_after(&[
            "delete Service demo/shop",
            "delete EndpointSlice demo/web-abc",
        ])
        .await;
    assert_eq!(
        lines,
        [
            "apply Service demo/shop",
            "apply Service demo/shop",
            "delete EndpointSlice demo/web-abc",
            "delete Service demo/shop"
        ]
    );
    let ports: Vec<i32> = cluster
        .recorder
        .recorded()
        .services
        .iter()
        .filter(|event| {
            !event.is_delete() && event.object().metadata.name.as_deref() == Some("shop")
        })
        .map(|event| {
            event
                .object()
                .spec
                .as_ref()
                .unwrap()
                .ports
                .as_ref()
                .unwrap()[0]
                .port
        })
        .collect();
    assert_eq!(ports, [443, 8443], "the update carries the new port");
    cluster.server.assert_no_protocol_errors();
}

#[tokio::test]
async fn services_of_other_proxies_and_headless_services_are_never_delivered() {
    let (cluster, _) = cluster().await;

    cluster.server.create(service("demo", "other", |s| {
        s.cluster_ip("10.96.0.40")
            .label("service.kubernetes.io/service-proxy-name", "other-proxy")
    }));
    cluster
        .server
        .create(endpoint_slice("demo", "other-abc", "other", |s| {
            s.label("service.kubernetes.io/service-proxy-name", "other-proxy")
        }));
    cluster.server.create(service("demo", "headless", |s| {
        s.headless().label("service.kubernetes.io/headless", "")
    }));
    cluster.server.create(node("node-3", |n| n));
    let marks = cluster.mark();

    assert_eq!(cluster.take_after(&marks).await, marks);
    cluster.server.assert_no_protocol_errors();
}

#[tokio::test]
async fn a_forced_relist_redelivers_nothing_that_stayed_the_same() {
    let (cluster, _) = cluster().await;

    cluster.server.expire_history();
    let marks = cluster.mark();

    assert_eq!(cluster.take_after(&marks).await, marks);
    for path in [
        "/api/v1/services",
        "/apis/discovery.k8s.io/v1/endpointslices",
        "/api/v1/nodes",
    ] {
        assert_eq!(cluster.lists_of(path), 2, "{path} was listed again");
    }
    cluster.server.assert_no_protocol_errors();
}

#[tokio::test]
async fn deletions_hidden_by_a_410_are_delivered_after_the_relist() {
    let (cluster, _) = cluster().await;

    cluster.server.stop().await;
    cluster.server.delete::<Service>("demo", "db");
    cluster.server.delete::<EndpointSlice>("demo", "db-abc");
    cluster.server.expire_history();
    cluster.server.restart().await.unwrap();

    let lines = cluster
        .take_after(&["delete Service demo/db", "delete EndpointSlice demo/db-abc"])
        .await;
    assert_eq!(
        lines,
        ["delete EndpointSlice demo/db-abc", "delete Service demo/db"]
    );
    let marks = cluster.mark();
    assert_eq!(
        cluster.take_after(&marks).await,
        marks,
        "nothing else was delivered"
    );
    cluster.server.assert_no_protocol_errors();
}

#[tokio::test]
async fn changes_made_during_an_outage_arrive_when_the_server_returns() {
    let (cluster, _) = cluster().await;

    cluster.server.stop().await;
    cluster
        .server
        .create(service("demo", "shop", |s| s.cluster_ip("10.96.0.30")));
    cluster.server.delete::<EndpointSlice>("demo", "web-abc");
    // While down, the port answers connections by closing them; the source
    // keeps retrying and must not delete anything meanwhile.
    let outage = tokio::net::TcpListener::bind(cluster.server.addr())
        .await
        .unwrap();
    for _ in 0..3 {
        let (connection, _) = tokio::time::timeout(GIVE_UP, outage.accept())
            .await
            .unwrap()
            .unwrap();
        drop(connection);
    }
    assert_eq!(
        cluster.recorder.lines(),
        Vec::<String>::new(),
        "nothing changes while unreachable"
    );
    drop(outage);
    cluster.server.restart().await.unwrap();

    let lines = cluster
        .take_after(&[
            "apply Service demo/shop",
            "delete EndpointSlice demo/web-abc",
        ])
        .await;
    assert_eq!(
        lines,
        [
            "apply Service demo/shop",
            "delete EndpointSlice demo/web-abc"
        ]
    );
    cluster.server.assert_no_protocol_errors();
}

#[tokio::test]
async fn a_restart_that_relists_the_same_objects_with_new_versions_changes_nothing() {
    let (cluster, _) = cluster().await;

    cluster.server.stop().await;
    // Rewritten with the same content: each gets a new resourceVersion.
    for object in [web(), db()] {
        cluster.server.update(object);
    }
    for object in [web_slice(), db_slice()] {
        cluster.server.update(object);
    }
    cluster
        .server
        .update(node(NODE_NAME, |n| n.internal_ip("192.168.99.2")));
    cluster
        .server
        .restart_as_new(Duration::from_millis(500))
        .await
        .unwrap();
    let marks = cluster.mark();

    assert_eq!(
        cluster.take_after(&marks).await,
        marks,
        "the relist of unchanged objects reached the handler"
    );
    for path in [
        "/api/v1/services",
        "/apis/discovery.k8s.io/v1/endpointslices",
        "/api/v1/nodes",
    ] {
        assert_eq!(cluster.lists_of(path), 2, "{path} was listed again");
    }
    assert!(cluster.server.forbidden_answers() > 0);
    cluster.server.assert_no_protocol_errors();
}

#[tokio::test]
async fn the_starting_event_is_posted_about_the_node() {
    let server = TestApiServer::start().await.unwrap();
    let client = client_from(None, Some(&server.url()), 5.0, 10)
        .await
        .unwrap();

    post_starting_event(&client, NODE_NAME).await.unwrap();

    let events = server.events();
    assert_eq!(events.len(), 1);
    let event = &events[0];
    assert_eq!(
        (event.api_version.as_str(), event.namespace.as_str()),
        ("events.k8s.io/v1", "default")
    );
    // As upstream's recorder (client-go tools/events) makes it; the test
    // API server refuses (422) what kube-apiserver refuses.
    let object = &event.object;
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(object["reason"], "Starting");
    assert_eq!(object["action"], "StartKubeProxy");
    assert_eq!(object["type"], "Normal");
    assert_eq!(object["reportingController"], "kube-proxy");
    assert_eq!(
        object["reportingInstance"],
        format!("kube-proxy-{}", hostname.trim())
    );
    assert_eq!(
        object["regarding"],
        serde_json::json!({"kind": "Node", "name": NODE_NAME, "uid": NODE_NAME})
    );
    let name = object["metadata"]["name"].as_str().unwrap();
    let (node, nanos) = name.split_once('.').unwrap();
    assert_eq!(node, NODE_NAME);
    assert!(u128::from_str_radix(nanos, 16).is_ok(), "{name}");
    assert!(object["eventTime"].is_string());
    let mut fields: Vec<&str> = object
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "action",
            "apiVersion",
            "eventTime",
            "kind",
            "metadata",
            "reason",
            "regarding",
            "reportingController",
            "reportingInstance",
            "type"
        ],
        "no note (upstream's is empty) and no deprecated field"
    );
    server.assert_no_protocol_errors();
}

#[tokio::test]
async fn a_service_whose_rules_the_kernel_refused_gets_a_warning_event_the_api_accepts() {
    let server = TestApiServer::start().await.unwrap();
    let client = client_from(None, Some(&server.url()), 5.0, 10)
        .await
        .unwrap();
    server.create(kp_testkit::builders::service("ns1", "big", |s| {
        s.cluster_ip("10.96.0.50").port("http", 80, "TCP")
    }));
    let service = kp_model::NamespacedName::new("ns1", "big");
    let why = format!("nftables backend: committing failed: {}", "x".repeat(2_000));

    post_refused_rules_event(&client, &service, NODE_NAME, &why)
        .await
        .unwrap();

    let events = server.events();
    assert_eq!(events.len(), 1, "{:#?}", server.protocol_errors());
    let event = &events[0];
    assert_eq!(
        (event.api_version.as_str(), event.namespace.as_str()),
        ("events.k8s.io/v1", "ns1")
    );
    let object = &event.object;
    assert_eq!(object["reason"], "FailedToProgramServiceRules");
    assert_eq!(object["type"], "Warning");
    assert_eq!(
        object["regarding"],
        serde_json::json!({"apiVersion": "v1", "kind": "Service", "namespace": "ns1", "name": "big"})
    );
    let note = object["note"].as_str().unwrap();
    assert!(
        note.starts_with(&format!("node {NODE_NAME} left this Service out")),
        "{note}"
    );
    assert_eq!(note.len(), 1024, "cut at the API's limit");
    server.assert_no_protocol_errors();
}

#[tokio::test]
async fn a_failed_starting_event_is_reported_not_fatal() {
    let server = TestApiServer::start().await.unwrap();
    let client = client_from(None, Some(&server.url()), 5.0, 10)
        .await
        .unwrap();
    server.stop().await;

    let error = post_starting_event(&client, NODE_NAME).await.unwrap_err();

    assert!(
        matches!(error, ApiError::PostEvent { ref node, .. } if node == NODE_NAME),
        "{error}"
    );
}

#[tokio::test]
async fn master_overrides_the_server_of_the_kubeconfig() {
    let server = TestApiServer::start().await.unwrap();
    server.create(node(NODE_NAME, |n| n));
    let kubeconfig = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        kubeconfig.path(),
        server
            .kubeconfig()
            .replace(&server.url(), "http://127.0.0.1:9"),
    )
    .unwrap();

    let client = client_from(Some(kubeconfig.path()), Some(&server.url()), 5.0, 10)
        .await
        .unwrap();
    let nodes = kube::Api::<Node>::all(client)
        .list(&Default::default())
        .await
        .unwrap();

    assert_eq!(nodes.items.len(), 1);
}

#[tokio::test]
async fn a_missing_kubeconfig_is_named_in_the_error() {
    let Err(error) = client_from(Some("/nonexistent/kubeconfig".as_ref()), None, 5.0, 10).await
    else {
        panic!("a missing kubeconfig is an error");
    };

    assert!(
        matches!(error, ApiError::ReadKubeconfig { .. }),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("/nonexistent/kubeconfig"),
        "{error}"
    );
}
