//! The events kube-proxy posts: about its node when it starts, as
//! upstream's "birth cry" does through client-go's `tools/events`
//! recorder, and about a Service whose rules the kernel refused.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kp_model::NamespacedName;
use kube::api::{Api, PostParams};
use kube::Client;

use super::ApiError;

/// The component reporting kube-proxy's events.
const REPORTING_CONTROLLER: &str = "kube-proxy";
/// Events about a cluster-scoped object (the Node) go to this namespace,
/// as the recorder puts them.
const EVENT_NAMESPACE: &str = "default";
/// Where Linux publishes the host name (Go's `os.Hostname()`).
const HOSTNAME_FILE: &str = "/proc/sys/kernel/hostname";
/// The reason of the event about a Service whose rules the kernel refused.
pub const REFUSED_RULES_REASON: &str = "FailedToProgramServiceRules";
/// The most bytes `events.k8s.io/v1` takes in an event's note.
const NOTE_MAX_BYTES: usize = 1024;

/// The `Starting` event about node `node_name`, reported from host
/// `hostname` at time `now`, exactly as upstream's recorder makes it
/// (`Eventf(nodeRef, nil, Normal, "Starting", "StartKubeProxy", "")`):
/// named `<node>.<unix nanoseconds in hex>`, in `default`, reported by
/// `kube-proxy` from instance `kube-proxy-<hostname>`, about the Node
/// (whose uid upstream sets to the node name), with an empty note.
///
/// The `events.k8s.io/v1` API refuses the deprecated fields
/// (`deprecatedSource`, `deprecatedFirstTimestamp`, `deprecatedCount`, …)
/// with 422 `… needs to be unset`, so none is set.
pub fn starting_event(node_name: &str, hostname: &str, now: Timestamp) -> Event {
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{node_name}.{:x}", now.as_nanosecond())),
            namespace: Some(EVENT_NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(now)),
        action: Some("StartKubeProxy".to_owned()),
        reason: Some("Starting".to_owned()),
        type_: Some("Normal".to_owned()),
        regarding: Some(ObjectReference {
            kind: Some("Node".to_owned()),
            name: Some(node_name.to_owned()),
            uid: Some(node_name.to_owned()),
            ..ObjectReference::default()
        }),
        reporting_controller: Some(REPORTING_CONTROLLER.to_owned()),
        reporting_instance: Some(format!("{REPORTING_CONTROLLER}-{hostname}")),
        ..Event::default()
    }
}

/// The Warning event about `service` whose rules the kernel of node
/// `node_name` refused for `why`, reported from host `hostname` at `now`:
/// the proxy leaves the Service out of its rules until it changes, and
/// says so where the Service's owner looks (`kubectl describe service`).
/// The note is cut at the API's 1 KiB, on a character boundary.
pub fn refused_rules_event(
    service: &NamespacedName,
    node_name: &str,
    hostname: &str,
    now: Timestamp,
    why: &str,
) -> Event {
    let mut note = format!(
        "node {node_name} left this Service out of its proxy rules until it changes: {why}"
    );
    if note.len() > NOTE_MAX_BYTES {
        let mut end = NOTE_MAX_BYTES;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
    }
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{}.{:x}", service.name, now.as_nanosecond())),
            namespace: Some(service.namespace.to_string()),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(now)),
        action: Some("SyncProxyRules".to_owned()),
        reason: Some(REFUSED_RULES_REASON.to_owned()),
        type_: Some("Warning".to_owned()),
        regarding: Some(ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Service".to_owned()),
            namespace: Some(service.namespace.to_string()),
            name: Some(service.name.to_string()),
            ..ObjectReference::default()
        }),
        note: Some(note),
        reporting_controller: Some(REPORTING_CONTROLLER.to_owned()),
        reporting_instance: Some(format!("{REPORTING_CONTROLLER}-{hostname}")),
        ..Event::default()
    }
}

/// Posts the [`refused_rules_event`] about `service`, reported from this
/// host. A failure is logged and returned; the proxy works without it.
pub async fn post_refused_rules_event(
    client: &Client,
    service: &NamespacedName,
    node_name: &str,
    why: &str,
) -> Result<(), ApiError> {
    let event = refused_rules_event(service, node_name, &os_hostname(), Timestamp::now(), why);
    post(client, &service.namespace, &event, |source| {
        ApiError::PostServiceEvent {
            service: service.to_string(),
            reason: REFUSED_RULES_REASON.to_owned(),
            source,
        }
    })
    .await
}

/// Posts the [`starting_event`] for `node_name`, reported from this host.
/// A failure is logged and otherwise ignored: the proxy works without its
/// events, and returns the error only for callers that want to report it.
pub async fn post_starting_event(client: &Client, node_name: &str) -> Result<(), ApiError> {
    let event = starting_event(node_name, &os_hostname(), Timestamp::now());
    post(client, EVENT_NAMESPACE, &event, |source| {
        ApiError::PostEvent {
            node: node_name.to_owned(),
            reason: "Starting".to_owned(),
            source,
        }
    })
    .await
}

/// Creates `event` in `namespace`; a refusal becomes the error `failed`
/// makes of it, logged as a warning.
async fn post(
    client: &Client,
    namespace: &str,
    event: &Event,
    failed: impl FnOnce(kube::Error) -> ApiError,
) -> Result<(), ApiError> {
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    match events.create(&PostParams::default(), event).await {
        Ok(_) => {
            tracing::debug!(namespace, reason = ?event.reason, "posted an event");
            Ok(())
        }
        Err(source) => {
            let error = failed(source);
            let cause = std::error::Error::source(&error)
                .map(ToString::to_string)
                .unwrap_or_default();
            tracing::warn!(error = %error, cause = %cause, "could not post an event");
            Err(error)
        }
    }
}

/// The OS host name, which upstream's recorder puts in `reportingInstance`
/// (not the node name: they differ under `--hostname-override`). Upstream
/// ignores an error and uses an empty name; so do we.
fn os_hostname() -> String {
    match std::fs::read_to_string(HOSTNAME_FILE) {
        Ok(name) => name.trim().to_owned(),
        Err(error) => {
            tracing::warn!(%error, file = HOSTNAME_FILE, "cannot read the host name for the event's reporting instance");
            String::new()
        }
    }
}
