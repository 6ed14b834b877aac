//! Stories of Event creation on the test API server, told through kube-rs:
//! it refuses what a real kube-apiserver refuses, with the real 422 Status
//! (reason `Invalid`, the causes' fields and messages, the message
//! `Event "<name>" is invalid: …`), and accepts what it accepts.
//!
//! The expected texts are those of kube-apiserver (v1.28 and later):
//! `ValidateEventCreate` in `pkg/apis/core/validation/events.go` and
//! apimachinery's field errors.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::client;
use k8s_openapi::api::core::v1::{EventSource, ObjectReference};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kp_testkit::apiserver::TestApiServer;
use kube::api::PostParams;
use kube::core::Status;
use kube::Api;
use serde_json::{json, Value};

const NAME: &str = "node-1.17a3f0c2e4b5d6e7";

/// The event upstream kube-proxy's recorder (client-go `tools/events`)
/// posts when it starts.
fn upstream_starting_event() -> Event {
    Event {
        metadata: ObjectMeta {
            name: Some(NAME.to_owned()),
            namespace: Some("default".to_owned()),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime("2024-05-01T10:00:00.123456Z".parse().unwrap())),
        action: Some("StartKubeProxy".to_owned()),
        reason: Some("Starting".to_owned()),
        type_: Some("Normal".to_owned()),
        regarding: Some(ObjectReference {
            kind: Some("Node".to_owned()),
            name: Some("node-1".to_owned()),
            uid: Some("node-1".to_owned()),
            ..ObjectReference::default()
        }),
        reporting_controller: Some("kube-proxy".to_owned()),
        reporting_instance: Some("kube-proxy-node-1".to_owned()),
        ..Event::default()
    }
}

/// Posts `event` to `events.k8s.io/v1` in `default`; the refusal's Status.
async fn refusal(server: &TestApiServer, event: &Event) -> Status {
    let events: Api<Event> = Api::namespaced(client(server), "default");
    match events.create(&PostParams::default(), event).await {
        Err(kube::Error::Api(status)) => *status,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The (field, message) of each cause.
fn causes(status: &Status) -> Vec<(String, String)> {
    let details = status.details.as_ref().expect("details");
    details
        .causes
        .iter()
        .map(|c| (c.field.clone(), c.message.clone()))
        .collect()
}

/// Posts raw JSON to `path`; the status code, body and `Warning` headers.
async fn post_json(server: &TestApiServer, path: &str, body: &Value) -> (u16, Value, Vec<String>) {
    let request = http::Request::post(path)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(body.to_string().into_bytes()))
        .unwrap();
    let response = client(server).send(request).await.unwrap();
    let code = response.status().as_u16();
    let warnings = response
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap(), warnings)
}

#[tokio::test]
async fn the_event_with_a_deprecated_source_is_refused_as_a_real_server_refuses_it() {
    let server = TestApiServer::start().await.unwrap();
    let mut event = upstream_starting_event();
    event.deprecated_source = Some(EventSource {
        component: Some("kube-proxy".to_owned()),
        host: Some("node-1".to_owned()),
    });

    let status = refusal(&server, &event).await;

    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        status.message,
        format!("Event \"{NAME}\" is invalid: source: Invalid value: \"\": needs to be unset")
    );
    let details = status.details.as_ref().unwrap();
    assert_eq!(
        (details.name.as_str(), details.kind.as_str()),
        (NAME, "Event")
    );
    assert_eq!(details.causes[0].reason, "FieldValueInvalid");
    assert!(server.events().is_empty(), "nothing is stored");
    assert_eq!(server.protocol_errors().len(), 1, "the refusal is recorded");
}

#[tokio::test]
async fn the_event_upstream_posts_is_accepted() {
    let server = TestApiServer::start().await.unwrap();
    let events: Api<Event> = Api::namespaced(client(&server), "default");

    let created = events
        .create(&PostParams::default(), &upstream_starting_event())
        .await
        .unwrap();

    assert_eq!(created.metadata.name.as_deref(), Some(NAME));
    assert!(created.metadata.uid.is_some());
    assert_eq!(server.events().len(), 1);
    server.assert_no_protocol_errors();
}

#[tokio::test]
async fn each_invalid_event_is_refused_with_the_real_field_and_message() {
    type Change = fn(&mut Event);
    let table: Vec<(Change, &str, &str)> = vec![
        (|e| e.reporting_controller = None, "reportingController", "Required value"),
        (
            |e| e.reporting_controller = Some("kube proxy".to_owned()),
            "reportingController",
            "Invalid value: \"kube proxy\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
        ),
        (|e| e.reporting_instance = None, "reportingInstance", "Required value"),
        (
            |e| e.reporting_instance = Some("x".repeat(129)),
            "reportingInstance",
            "Invalid value: \"\": can have at most 128 characters",
        ),
        (|e| e.action = None, "action", "Required value"),
        (|e| e.action = Some("x".repeat(129)), "action", "Invalid value: \"\": can have at most 128 characters"),
        (|e| e.reason = None, "reason", "Required value"),
        (|e| e.reason = Some("x".repeat(129)), "reason", "Invalid value: \"\": can have at most 128 characters"),
        (|e| e.note = Some("x".repeat(1025)), "message", "Invalid value: \"\": can have at most 1024 characters"),
        (|e| e.type_ = Some("Info".to_owned()), "type", "Invalid value: \"\": has invalid value: Info"),
        (|e| e.type_ = None, "type", "Invalid value: \"\": has invalid value: "),
        (|e| e.deprecated_count = Some(1), "count", "Invalid value: \"\": needs to be unset"),
        (
            |e| e.deprecated_first_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2024-05-01T10:00:00Z".parse().unwrap())),
            "firstTimestamp",
            "Invalid value: \"\": needs to be unset",
        ),
        (
            |e| e.deprecated_last_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2024-05-01T10:00:00Z".parse().unwrap())),
            "lastTimestamp",
            "Invalid value: \"\": needs to be unset",
        ),
        (
            |e| e.series = Some(k8s_openapi::api::events::v1::EventSeries { count: 1, last_observed_time: MicroTime("2024-05-01T10:00:00Z".parse().unwrap()) }),
            "series.count",
            "Invalid value: \"\": should be at least 2",
        ),
        (
            |e| e.metadata.name = Some("Node-1.1".to_owned()),
            "metadata.name",
            "Invalid value: \"Node-1.1\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
        ),
        (
            |e| e.metadata.labels = Some([("a/b/c".to_owned(), "v".to_owned())].into()),
            "metadata.labels",
            "Invalid value: \"a/b/c\": a valid label key must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
        ),
    ];
    for (index, (change, field, message)) in table.into_iter().enumerate() {
        let server = TestApiServer::start().await.unwrap();
        let mut event = upstream_starting_event();
        change(&mut event);
        let status = refusal(&server, &event).await;
        assert_eq!(status.code, 422, "case {index}: {status:?}");
        let found = causes(&status);
        assert!(
            found.contains(&(field.to_owned(), message.to_owned())),
            "case {index}: expected {field}: {message}\n got {found:#?}"
        );
    }
}

#[tokio::test]
async fn an_event_about_a_cluster_scoped_object_belongs_in_default_or_kube_system() {
    let server = TestApiServer::start().await.unwrap();
    server.create(kp_testkit::service("demo", "web", |s| s));
    let mut event = upstream_starting_event();
    event.metadata.namespace = Some("demo".to_owned());
    let events: Api<Event> = Api::namespaced(client(&server), "demo");

    let Err(kube::Error::Api(status)) = events.create(&PostParams::default(), &event).await else {
        panic!("an event about the Node is accepted in demo");
    };

    assert_eq!(
        causes(&status),
        [(
            "involvedObject.namespace".to_owned(),
            "Invalid value: \"\": does not match event.namespace".to_owned()
        )]
    );
    event.metadata.namespace = Some("kube-system".to_owned());
    let kube_system: Api<Event> = Api::namespaced(client(&server), "kube-system");
    kube_system
        .create(&PostParams::default(), &event)
        .await
        .unwrap();
}

#[tokio::test]
async fn an_event_without_event_time_is_refused_with_every_cause_in_order() {
    let server = TestApiServer::start().await.unwrap();
    let mut event = upstream_starting_event();
    event.event_time = None;
    event.type_ = None;

    let status = refusal(&server, &event).await;

    assert_eq!(
        status.message,
        format!(
            "Event \"{NAME}\" is invalid: [eventTime: Required value, type: Invalid value: \"\": has invalid value: ]"
        )
    );
    let fields: Vec<String> = causes(&status).into_iter().map(|(f, _)| f).collect();
    assert_eq!(fields, ["eventTime", "type"]);
}

#[tokio::test]
async fn core_v1_events_pass_only_the_legacy_rules() {
    let server = TestApiServer::start().await.unwrap();
    // An old-style Event (no eventTime) with a source and a count: fine in v1.
    let old_style = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "node-1.1", "namespace": "default"},
        "involvedObject": {"kind": "Node", "name": "node-1"},
        "reason": "Starting", "source": {"component": "kube-proxy", "host": "node-1"},
        "count": 1, "type": "Normal",
    });
    let (code, _, _) = post_json(&server, "/api/v1/namespaces/default/events", &old_style).await;
    assert_eq!(code, 201);

    // With an eventTime, the reporting fields are required.
    let mut new_style = old_style.clone();
    new_style["metadata"]["name"] = json!("node-1.2");
    new_style["eventTime"] = json!("2024-05-01T10:00:00.000000Z");
    let (code, body, _) = post_json(&server, "/api/v1/namespaces/default/events", &new_style).await;
    assert_eq!(code, 422);
    assert_eq!(
        body["message"],
        "Event \"node-1.2\" is invalid: [reportingController: Required value, reportingController: Invalid value: \"\": name part must be non-empty, reportingController: Invalid value: \"\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]'), reportingInstance: Required value, action: Required value]"
    );
}

#[tokio::test]
async fn unknown_fields_are_warned_about_and_refused_only_when_strict() {
    let server = TestApiServer::start().await.unwrap();
    let mut event = serde_json::to_value(upstream_starting_event()).unwrap();
    event["apiVersion"] = json!("events.k8s.io/v1");
    event["kind"] = json!("Event");
    event["colour"] = json!("blue");
    event["metadata"]["shape"] = json!("round");
    let path = "/apis/events.k8s.io/v1/namespaces/default/events";

    let (code, _, warnings) = post_json(&server, path, &event).await;
    assert_eq!(code, 201);
    assert_eq!(
        warnings,
        [
            r#"299 - "unknown field \"colour\"""#,
            r#"299 - "unknown field \"metadata.shape\"""#
        ]
    );

    event["metadata"]["name"] = json!("node-1.2");
    let strict = format!("{path}?fieldValidation=Strict");
    let (code, body, _) = post_json(&server, &strict, &event).await;
    assert_eq!((code, body["reason"].as_str()), (400, Some("BadRequest")));
    assert!(
        body["message"].as_str().unwrap().ends_with(
            r#"strict decoding error: unknown field "colour", unknown field "metadata.shape""#
        ),
        "{body}"
    );
}

#[tokio::test]
async fn a_wrong_type_is_a_bad_request() {
    let server = TestApiServer::start().await.unwrap();
    let mut event = serde_json::to_value(upstream_starting_event()).unwrap();
    event["apiVersion"] = json!("events.k8s.io/v1");
    event["kind"] = json!("Event");
    event["reason"] = json!(7);

    let path = "/apis/events.k8s.io/v1/namespaces/default/events";
    let (code, body, _) = post_json(&server, path, &event).await;

    assert_eq!((code, body["reason"].as_str()), (400, Some("BadRequest")));
    assert!(server.events().is_empty());
}

#[tokio::test]
async fn generated_names_missing_namespaces_and_taken_names_are_handled_as_for_real() {
    let server = TestApiServer::start().await.unwrap();
    let events: Api<Event> = Api::namespaced(client(&server), "default");
    let mut generated = upstream_starting_event();
    generated.metadata.name = None;
    generated.metadata.generate_name = Some("node-1-".to_owned());
    let created = events
        .create(&PostParams::default(), &generated)
        .await
        .unwrap();
    let name = created.metadata.name.unwrap();
    assert!(
        name.starts_with("node-1-") && name.len() == "node-1-".len() + 5,
        "{name}"
    );

    events
        .create(&PostParams::default(), &upstream_starting_event())
        .await
        .unwrap();
    let again = events
        .create(&PostParams::default(), &upstream_starting_event())
        .await;
    assert!(
        matches!(again, Err(kube::Error::Api(ref s)) if s.code == 409 && s.reason == "AlreadyExists"),
        "{again:?}"
    );

    let elsewhere: Api<Event> = Api::namespaced(client(&server), "nowhere");
    let mut event = upstream_starting_event();
    event.metadata.namespace = Some("nowhere".to_owned());
    event.regarding.as_mut().unwrap().namespace = Some("nowhere".to_owned());
    let missing = elsewhere.create(&PostParams::default(), &event).await;
    assert!(
        matches!(missing, Err(kube::Error::Api(ref s)) if s.code == 404 && s.message == "namespaces \"nowhere\" not found"),
        "{missing:?}"
    );
}
