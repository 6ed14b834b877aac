//! Stories of the test API server going away and coming back as a real
//! kube-apiserver does: connections refused, open watches cut without a
//! clean end, then 403 Forbidden while its authorizer warms up, then the
//! same objects again from a new watch cache.
//!
//! Address plan: services in 10.96.0.0/16 (kp-testkit `plan`).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::client;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_testkit::apiserver::{TestApiServer, KUBE_PROXY_USER};
use kp_testkit::service;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::{Api, ResourceExt};

/// How long a test waits for something that should happen at once.
const GIVE_UP: Duration = Duration::from_secs(5);

fn web() -> Service {
    service("demo", "web", |s| {
        s.cluster_ip("10.96.0.10").port("http", 80, "TCP")
    })
}

/// The Status of a request refused by the API server.
#[track_caller]
fn status_of<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> kube::core::Status {
    match result {
        Err(kube::Error::Api(status)) => *status,
        other => panic!("expected a Status from the server, got {other:?}"),
    }
}

#[tokio::test]
async fn a_forbidding_server_answers_with_the_real_status() {
    let server = TestApiServer::start().await.unwrap();
    server.create(web());
    server.forbid(KUBE_PROXY_USER);
    let slices = Api::<EndpointSlice>::all(client(&server));

    let watch = status_of(slices.watch(&WatchParams::default(), "0").await.map(|_| ()));
    let list = status_of(
        Api::<Service>::all(client(&server))
            .list(&ListParams::default())
            .await,
    );

    assert_eq!((watch.code, watch.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        watch.message,
        "endpointslices.discovery.k8s.io is forbidden: User \
         \"system:serviceaccount:kube-system:kube-proxy\" cannot watch resource \
         \"endpointslices\" in API group \"discovery.k8s.io\" at the cluster scope"
    );
    let details = watch.details.unwrap();
    assert_eq!(
        (details.group.as_str(), details.kind.as_str()),
        ("discovery.k8s.io", "endpointslices")
    );
    assert_eq!(
        list.message,
        "services is forbidden: User \"system:serviceaccount:kube-system:kube-proxy\" \
         cannot list resource \"services\" in API group \"\" at the cluster scope"
    );
    assert_eq!(server.forbidden_answers(), 2);

    server.allow();
    let services = Api::<Service>::all(client(&server))
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(services.items.len(), 1, "it serves again once allowed");
    server.assert_no_protocol_errors();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_watch_is_cut_without_a_clean_end() {
    use std::io::{Read, Write};
    let server = TestApiServer::start().await.unwrap();
    server.create(web());
    let mut watch = std::net::TcpStream::connect(server.addr()).unwrap();
    watch.set_read_timeout(Some(GIVE_UP)).unwrap();
    watch
        .write_all(b"GET /api/v1/services?watch=true HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    let mut received = Vec::new();
    tokio::task::block_in_place(|| {
        while !String::from_utf8_lossy(&received).contains("ADDED") {
            let mut chunk = [0; 4096];
            let read = watch.read(&mut chunk).unwrap();
            assert!(read > 0, "the watch sent its first event");
            received.extend_from_slice(&chunk[..read]);
        }
    });

    server.stop().await;

    tokio::task::block_in_place(|| watch.read_to_end(&mut received)).unwrap();
    let text = String::from_utf8_lossy(&received);
    assert!(text.contains("transfer-encoding: chunked"), "{text}");
    assert!(
        !text.ends_with("0\r\n\r\n"),
        "the chunked body has no last chunk: the watch broke off: {text}"
    );
    let refused = Api::<Service>::all(client(&server))
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert!(
        format!("{refused:?}").contains("ConnectionRefused"),
        "new connections are refused: {refused:?}"
    );
}

#[tokio::test]
async fn a_restarted_server_forbids_for_a_moment_then_relists_the_same_objects() {
    let server = TestApiServer::start().await.unwrap();
    let stored = server.create(web());
    let api = Api::<Service>::all(client(&server));
    let before = server.resource_version().to_string();
    server.stop().await;

    let forbidden_for = Duration::from_millis(300);
    let restarted = Instant::now();
    server.restart_as_new(forbidden_for).await.unwrap();

    let refused = status_of(api.list(&ListParams::default()).await);
    assert_eq!(refused.code, 403);
    while server.is_forbidding() {
        assert!(restarted.elapsed() < GIVE_UP, "the 403 phase never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(restarted.elapsed() >= forbidden_for);
    let mut resumed = api
        .watch(&WatchParams::default(), &before)
        .await
        .unwrap()
        .boxed();
    let gone = tokio::time::timeout(GIVE_UP, resumed.try_next())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(gone, Some(WatchEvent::Error(ref e)) if e.code == 410),
        "a watch from before the restart must list again: {gone:?}"
    );
    let list = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].name_any(), "web");
    assert_eq!(
        list.items[0].metadata.resource_version, stored.metadata.resource_version,
        "the objects are kept as they were"
    );
    server.assert_no_protocol_errors();
}
