//! Stories of the test API server, told through kube-rs' own client: what a
//! real server would answer, it answers; what it does not understand, it
//! refuses and records.
//!
//! Address plan: services in 10.96.0.0/16 (kp-testkit `plan`); the proxy's
//! node is `node-1`, another node is `node-2`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::client;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_testkit::apiserver::{TestApiServer, HISTORY_LIMIT};
use kp_testkit::plan::{NODE_NAME, OTHER_NODE_NAME};
use kp_testkit::{endpoint_slice, node, service};
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

const PROXY_SELECTOR: &str =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";
/// How long a test waits for something that should happen at once.
const GIVE_UP: Duration = Duration::from_secs(5);

fn svc(name: &str, ip: &str) -> Service {
    service("demo", name, |s| s.cluster_ip(ip).port("http", 80, "TCP"))
}

async fn next<T>(stream: &mut (impl futures::Stream<Item = T> + Unpin)) -> T {
    tokio::time::timeout(GIVE_UP, stream.next())
        .await
        .expect("an event in time")
        .expect("the stream goes on")
}

fn names<K: ResourceExt>(objects: impl IntoIterator<Item = K>) -> Vec<String> {
    objects
        .into_iter()
        .map(|object| object.name_any())
        .collect()
}

#[tokio::test]
async fn a_list_returns_every_object_with_the_current_resource_version() {
    let server = TestApiServer::start().await.unwrap();
    server.create(svc("web", "10.96.0.10"));
    let db = server.create(svc("db", "10.96.0.20"));
    assert_eq!(db.metadata.resource_version.as_deref(), Some("2"));

    let list = Api::<Service>::all(client(&server))
        .list(&ListParams::default())
        .await
        .unwrap();

    assert_eq!(names(list.items), ["db", "web"]);
    assert_eq!(list.metadata.resource_version.as_deref(), Some("2"));
    server.assert_no_protocol_errors();
}

#[tokio::test]
async fn a_list_is_paged_with_limit_and_continue() {
    let server = TestApiServer::start().await.unwrap();
    for (index, name) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        server.create(svc(name, &format!("10.96.0.{}", index + 1)));
    }
    let api = Api::<Service>::all(client(&server));

    let first = api.list(&ListParams::default().limit(2)).await.unwrap();
    let token = first.metadata.continue_.clone().unwrap();
    let second = api
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    let token = second.metadata.continue_.clone().unwrap();
    let third = api
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();

    assert_eq!(names(first.items), ["a", "b"]);
    assert_eq!(names(second.items), ["c", "d"]);
    assert_eq!(names(third.items), ["e"]);
    assert_eq!(third.metadata.continue_, None);
    server.assert_no_protocol_errors();
}

#[tokio::test]
async fn a_list_at_any_version_ignores_limit_as_the_watch_cache_does() {
    let server = TestApiServer::start().await.unwrap();
    for (index, name) in ["a", "b", "c"].iter().enumerate() {
        server.create(svc(name, &format!("10.96.0.{}", index + 1)));
    }
    let api = Api::<Service>::all(client(&server));

    // client-go's reflector sends both; kube-rs drops resourceVersion=0
    // when a limit is set, so the request is written out.
    let request = http::Request::get("/api/v1/services?limit=2&resourceVersion=0")
        .body(Vec::new())
        .unwrap();
    let text = client(&server).request_text(request).await.unwrap();
    let list: k8s_openapi::List<Service> = serde_json::from_str(&text).unwrap();
    let paged = api.list(&ListParams::default().limit(2)).await.unwrap();

    let raw: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(raw["apiVersion"], "v1");
    assert_eq!(raw["kind"], "ServiceList");
    let items = raw["items"].as_array().unwrap();
    assert!(
        items
            .iter()
            .all(|item| item.get("kind").is_none() && item.get("apiVersion").is_none()),
        "items are written as a real server writes them: {text}"
    );
    assert_eq!(names(list.items), ["a", "b", "c"]);
    assert_eq!(list.metadata.continue_, None);
    assert_eq!(
        names(paged.items),
        ["a", "b"],
        "without resourceVersion=0 it pages"
    );
    server.assert_no_protocol_errors();
}

#[tokio::test]
async fn selectors_filter_by_label_and_by_name() {
    let server = TestApiServer::start().await.unwrap();
    server.create(svc("web", "10.96.0.10"));
    server.create(service("demo", "other", |s| {
        s.cluster_ip("10.96.0.11")
            .label("service.kubernetes.io/service-proxy-name", "other-proxy")
    }));
    server.create(service("demo", "headless", |s| {
        s.headless().label("service.kubernetes.io/headless", "")
    }));
    server.create(node(NODE_NAME, |n| n));
    server.create(node(OTHER_NODE_NAME, |n| n));
    let client = client(&server);

    let services = Api::<Service>::all(client.clone())
        .list(&ListParams::default().labels(PROXY_SELECTOR))
        .await
        .unwrap();
    let nodes = Api::<Node>::all(client)
        .list(&ListParams::default().fields(&format!("metadata.name={NODE_NAME}")))
        .await
        .unwrap();

    assert_eq!(names(services.items), ["web"]);
    assert_eq!(names(nodes.items), [NODE_NAME]);
    server.assert_no_protocol_errors();
}

#[tokio::test]
async fn a_watch_streams_changes_after_its_resource_version() {
    let server = TestApiServer::start().await.unwrap();
    server.create(svc("web", "10.96.0.10"));
    let api = Api::<Service>::all(client(&server));
    let version = server.resource_version().to_string();
    let mut events = api
        .watch(&WatchParams::default(), &version)
        .await
        .unwrap()
        .boxed();

    server.create(svc("db", "10.96.0.20"));
    let mut web = svc("web", "10.96.0.10");
    web.metadata.labels = Some([("tier".to_owned(), "front".to_owned())].into());
    server.update(web);
    server.delete::<Service>("demo", "db");

    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(match next(&mut events).await.unwrap() {
            WatchEvent::Added(s) => format!("ADDED {}", s.name_any()),
            WatchEvent::Modified(s) => format!("MODIFIED {}", s.name_any()),
            WatchEvent::Deleted(s) => format!("DELETED {}", s.name_any()),
            other => format!("{other:?}"),
        });
    }
    assert_eq!(seen, ["ADDED db", "MODIFIED web", "DELETED db"]);
    server.assert_no_protocol_errors();
}

#[tokio::test]
async fn an_object_leaving_the_selector_is_deleted_for_the_watch() {
    let server = TestApiServer::start().await.unwrap();
    server.create(svc("web", "10.96.0.10"));
    let api = Api::<Service>::all(client(&server));
    let version = server.resource_version().to_string();
    let params = WatchParams::default().labels(PROXY_SELECTOR);
    let mut events = api.watch(&params, &version).await.unwrap().boxed();

    server.update(service("demo", "web", |s| {
        s.cluster_ip("10.96.0.10")
            .label("service.kubernetes.io/service-proxy-name", "other-proxy")
    }));

    assert!(
        matches!(next(&mut events).await.unwrap(), WatchEvent::Deleted(s) if s.name_any() == "web")
    );
}

#[tokio::test]
async fn a_watch_that_allows_bookmarks_gets_them() {
    let server = TestApiServer::start().await.unwrap();
    server.set_bookmark_interval(Duration::from_millis(50));
    server.create(svc("web", "10.96.0.10"));
    let api = Api::<Service>::all(client(&server));
    let version = server.resource_version().to_string();
    let mut events = api
        .watch(&WatchParams::default(), &version)
        .await
        .unwrap()
        .boxed();

    match next(&mut events).await.unwrap() {
        WatchEvent::Bookmark(bookmark) => assert_eq!(bookmark.metadata.resource_version, version),
        other => panic!("expected a bookmark, got {other:?}"),
    }
}

#[tokio::test]
async fn a_watch_from_expired_history_gets_410_gone() {
    let server = TestApiServer::start().await.unwrap();
    server.create(svc("web", "10.96.0.10"));
    let api = Api::<Service>::all(client(&server));
    let old_version = server.resource_version().to_string();
    let mut open_watch = api
        .watch(&WatchParams::default(), &old_version)
        .await
        .unwrap()
        .boxed();

    server.expire_history();

    for mut events in [
        open_watch,
        api.watch(&WatchParams::default(), &old_version)
            .await
            .unwrap()
            .boxed(),
    ] {
        match next(&mut events).await.unwrap() {
            WatchEvent::Error(status) => {
                assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
            }
            other => panic!("expected 410 Gone, got {other:?}"),
        }
        assert!(tokio::time::timeout(GIVE_UP, events.next())
            .await
            .unwrap()
            .is_none());
    }
    open_watch = api
        .watch(
            &WatchParams::default(),
            &server.resource_version().to_string(),
        )
        .await
        .unwrap()
        .boxed();
    server.create(svc("db", "10.96.0.20"));
    assert!(matches!(
        next(&mut open_watch).await.unwrap(),
        WatchEvent::Added(_)
    ));
    server.assert_no_protocol_errors();
}

#[tokio::test]
async fn only_the_last_changes_are_kept_for_watches_as_a_real_watch_cache_does() {
    let server = TestApiServer::start().await.unwrap();
    server.create(svc("web", "10.96.0.10"));
    let api = Api::<Service>::all(client(&server));
    let oldest = server.resource_version().to_string();
    // One change more than is kept: the first one after `oldest` is gone.
    for _ in 0..=HISTORY_LIMIT {
        server.update(svc("web", "10.96.0.10"));
    }
    let recent = (server.resource_version() - 5).to_string();

    let mut expired = api
        .watch(&WatchParams::default(), &oldest)
        .await
        .unwrap()
        .boxed();
    match next(&mut expired).await.unwrap() {
        WatchEvent::Error(status) => assert_eq!(status.code, 410),
        other => panic!("expected 410 Gone from before the kept changes, got {other:?}"),
    }
    let mut resumed = api
        .watch(&WatchParams::default(), &recent)
        .await
        .unwrap()
        .boxed();
    for _ in 0..5 {
        assert!(matches!(
            next(&mut resumed).await.unwrap(),
            WatchEvent::Modified(_)
        ));
    }
    server.assert_no_protocol_errors();
}

#[tokio::test]
async fn the_runtime_watcher_lists_then_watches_and_relists_after_410() {
    let server = TestApiServer::start().await.unwrap();
    server.create(endpoint_slice("demo", "web-abc", "web", |s| s));
    let api = Api::<EndpointSlice>::all(client(&server));
    let mut events = watcher(api, watcher::Config::default().page_size(1)).boxed();

    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(describe(next(&mut events).await.unwrap()));
    }
    server.create(endpoint_slice("demo", "web-def", "web", |s| s));
    seen.push(describe(next(&mut events).await.unwrap()));
    server.expire_history();
    assert!(
        next(&mut events).await.is_err(),
        "the 410 surfaces as an error"
    );
    for _ in 0..4 {
        seen.push(describe(next(&mut events).await.unwrap()));
    }

    assert_eq!(
        seen,
        [
            "Init",
            "InitApply web-abc",
            "InitDone",
            "Apply web-def",
            "Init",
            "InitApply web-abc",
            "InitApply web-def",
            "InitDone"
        ]
    );
    server.assert_no_protocol_errors();
}

#[tokio::test]
async fn streaming_lists_send_initial_events_then_a_bookmark() {
    let server = TestApiServer::start().await.unwrap();
    server.create(svc("web", "10.96.0.10"));
    let api = Api::<Service>::all(client(&server));
    let mut events = watcher(api, watcher::Config::default().streaming_lists()).boxed();

    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(describe(next(&mut events).await.unwrap()));
    }

    assert_eq!(seen, ["Init", "InitApply web", "InitDone"]);
    server.assert_no_protocol_errors();
}

#[tokio::test]
async fn a_restarted_server_keeps_its_port_objects_and_history() {
    let server = TestApiServer::start().await.unwrap();
    server.create(svc("web", "10.96.0.10"));
    let api = Api::<Service>::all(client(&server));
    let version = server.resource_version().to_string();

    server.stop().await;
    assert!(
        api.list(&ListParams::default()).await.is_err(),
        "nothing listens while stopped"
    );
    server.create(svc("db", "10.96.0.20"));
    server.restart().await.unwrap();

    let list = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(names(list.items), ["db", "web"]);
    let mut events = api
        .watch(&WatchParams::default(), &version)
        .await
        .unwrap()
        .boxed();
    assert!(
        matches!(next(&mut events).await.unwrap(), WatchEvent::Added(s) if s.name_any() == "db")
    );
}

#[tokio::test]
async fn stopping_cuts_open_watches() {
    let server = TestApiServer::start().await.unwrap();
    let api = Api::<Service>::all(client(&server));
    let mut events = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();

    server.stop().await;

    let end = tokio::time::timeout(GIVE_UP, events.try_next())
        .await
        .unwrap();
    assert!(!matches!(end, Ok(Some(_))), "the watch ended: {end:?}");
}

#[tokio::test]
async fn posted_events_are_kept_for_the_test() {
    let server = TestApiServer::start().await.unwrap();
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client(&server), "default");
    let event = k8s_openapi::api::events::v1::Event {
        metadata: kube::api::ObjectMeta {
            name: Some("node-1.1".to_owned()),
            ..Default::default()
        },
        event_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            "2024-05-01T10:00:00Z".parse().unwrap(),
        )),
        reason: Some("Starting".to_owned()),
        action: Some("StartKubeProxy".to_owned()),
        type_: Some("Normal".to_owned()),
        reporting_controller: Some("kube-proxy".to_owned()),
        reporting_instance: Some("kube-proxy-node-1".to_owned()),
        ..Default::default()
    };

    let created = events.create(&Default::default(), &event).await.unwrap();

    assert!(created.metadata.resource_version.is_some());
    let posted = server.events();
    assert_eq!(posted.len(), 1);
    assert_eq!(posted[0].api_version, "events.k8s.io/v1");
    assert_eq!(posted[0].namespace, "default");
    assert_eq!(posted[0].object["reason"], "Starting");
    server.assert_no_protocol_errors();
}

#[tokio::test]
async fn requests_it_does_not_understand_are_refused_and_recorded() {
    let server = TestApiServer::start().await.unwrap();
    let client = client(&server);

    let pods = http::Request::get("/api/v1/pods").body(Vec::new()).unwrap();
    let odd_param = http::Request::get("/api/v1/services?pretty=true")
        .body(Vec::new())
        .unwrap();
    let set_selector = http::Request::get("/api/v1/services?labelSelector=app%20in%20(a)")
        .body(Vec::new())
        .unwrap();
    for request in [pods, odd_param, set_selector] {
        assert!(client.request_text(request).await.is_err());
    }

    let errors = server.protocol_errors();
    assert_eq!(errors.len(), 3, "{errors:#?}");
    assert!(errors[0].starts_with("GET /api/v1/pods: "), "{errors:#?}");
    assert!(errors[1].contains("\"pretty\""), "{errors:#?}");
    assert!(errors[2].contains("app in (a)"), "{errors:#?}");
    let refused = std::panic::catch_unwind(|| server.assert_no_protocol_errors());
    assert!(refused.is_err(), "the helper fails the test");
    assert_eq!(server.request_log().len(), 3);
}

#[tokio::test]
async fn its_kubeconfig_points_at_it() {
    let server = TestApiServer::start().await.unwrap();
    server.create(node(NODE_NAME, |n| n));
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&server.kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();

    let nodes = Api::<Node>::all(Client::try_from(common::plain_http(config)).unwrap())
        .list(&ListParams::default())
        .await
        .unwrap();

    assert_eq!(names(nodes.items), [NODE_NAME]);
}

fn describe<K: ResourceExt>(event: watcher::Event<K>) -> String {
    match event {
        watcher::Event::Init => "Init".to_owned(),
        watcher::Event::InitApply(object) => format!("InitApply {}", object.name_any()),
        watcher::Event::InitDone => "InitDone".to_owned(),
        watcher::Event::Apply(object) => format!("Apply {}", object.name_any()),
        watcher::Event::Delete(object) => format!("Delete {}", object.name_any()),
    }
}
