//! The event kube-proxy posts about its node when it starts, as upstream's
//! "birth cry" does.

use k8s_openapi::api::core::v1::{EventSource, ObjectReference};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::Client;

use super::ApiError;

/// The component reporting kube-proxy's events.
const REPORTING_CONTROLLER: &str = "kube-proxy";
/// Events about a cluster-scoped object (the Node) go to this namespace.
const EVENT_NAMESPACE: &str = "default";

/// The `Starting` event about node `node_name` at time `now`, in the
/// `events.k8s.io/v1` form upstream posts: reason `Starting`, action
/// `StartKubeProxy`, the Node (with the node name as uid, as upstream
/// refers to it) as the regarding object, reported by `kube-proxy` from
/// instance `kube-proxy-<node>`.
pub fn starting_event(node_name: &str, now: Timestamp) -> Event {
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{node_name}.{:x}", now.as_nanosecond())),
            namespace: Some(EVENT_NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(now)),
        action: Some("StartKubeProxy".to_owned()),
        reason: Some("Starting".to_owned()),
        note: Some("Starting kube-proxy.".to_owned()),
        type_: Some("Normal".to_owned()),
        regarding: Some(ObjectReference {
            kind: Some("Node".to_owned()),
            name: Some(node_name.to_owned()),
            uid: Some(node_name.to_owned()),
            ..ObjectReference::default()
        }),
        reporting_controller: Some(REPORTING_CONTROLLER.to_owned()),
        reporting_instance: Some(format!("{REPORTING_CONTROLLER}-{node_name}")),
        deprecated_source: Some(EventSource {
            component: Some(REPORTING_CONTROLLER.to_owned()),
            host: Some(node_name.to_owned()),
        }),
        ..Event::default()
    }
}

/// Posts the [`starting_event`] for `node_name`. A failure is logged and
/// otherwise ignored: the proxy works without its events, and returns the
/// error only for callers that want to report it.
pub async fn post_starting_event(client: &Client, node_name: &str) -> Result<(), ApiError> {
    let event = starting_event(node_name, Timestamp::now());
    let events: Api<Event> = Api::namespaced(client.clone(), EVENT_NAMESPACE);
    match events.create(&PostParams::default(), &event).await {
        Ok(_) => {
            tracing::debug!(node = node_name, "posted the Starting event");
            Ok(())
        }
        Err(source) => {
            let error = ApiError::PostEvent {
                node: node_name.to_owned(),
                reason: "Starting".to_owned(),
                source,
            };
            let cause = std::error::Error::source(&error)
                .map(ToString::to_string)
                .unwrap_or_default();
            tracing::warn!(error = %error, cause = %cause, "could not post an event");
            Err(error)
        }
    }
}
