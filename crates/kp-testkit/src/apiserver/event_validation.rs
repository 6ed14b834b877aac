//! The real API server's create validation of Events
//! (`pkg/apis/core/validation/events.go`, `ValidateEventCreate`): the
//! legacy rules every Event passes, and for `events.k8s.io/v1` the strict
//! rules (metadata, `eventTime`, `type`, `series`, no deprecated fields).
//!
//! The server validates its internal (core) form of the Event, so errors
//! name core fields whatever the request's version: `note` is reported as
//! `message`, `deprecatedSource` as `source`, `regarding` as
//! `involvedObject`, `deprecatedCount` as `count`, and so on.

use serde_json::Value;

use super::field_error::FieldError;
use super::meta_validation::{self, dns1123_subdomain, qualified_name};

const REPORTING_INSTANCE_LENGTH_LIMIT: usize = 128;
const ACTION_LENGTH_LIMIT: usize = 128;
const REASON_LENGTH_LIMIT: usize = 128;
const NOTE_LENGTH_LIMIT: usize = 1024;

/// The API version an Event was posted with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventApi {
    /// `v1` (`/api/v1/namespaces/{ns}/events`): legacy rules only.
    CoreV1,
    /// `events.k8s.io/v1`: legacy and strict rules.
    EventsV1,
}

/// An Event in the server's internal form: the fields validation reads,
/// whatever version they came in.
struct CoreEvent<'a> {
    metadata: &'a Value,
    namespace: &'a str,
    involved_namespace: &'a str,
    reason: &'a str,
    message: &'a str,
    source_set: bool,
    first_timestamp_set: bool,
    last_timestamp_set: bool,
    count: i64,
    event_time_set: bool,
    series: Option<(i64, bool)>,
    reporting_controller: &'a str,
    reporting_instance: &'a str,
    action: &'a str,
    type_: &'a str,
}

/// The errors of `strategy.Validate` for a create of `event` (with its
/// namespace and name already filled in) through `api`.
pub(crate) fn validate_create(event: &Value, api: EventApi) -> Vec<FieldError> {
    let core = CoreEvent::read(event, api);
    let mut errors = legacy(&core);
    if api == EventApi::CoreV1 {
        // No more for backwards compatibility.
        return errors;
    }
    errors.extend(meta_validation::object_meta(
        core.metadata,
        meta_validation::name_is_dns_subdomain,
    ));
    if let Some((count, last_observed_set)) = core.series {
        if count < 2 {
            errors.push(FieldError::invalid(
                "series.count",
                "",
                "should be at least 2",
            ));
        }
        if !last_observed_set {
            errors.push(FieldError::required("series.lastObservedTime", ""));
        }
    }
    if !core.event_time_set {
        errors.push(FieldError::required("eventTime", ""));
    }
    if core.type_ != "Normal" && core.type_ != "Warning" {
        let detail = format!("has invalid value: {}", core.type_);
        errors.push(FieldError::invalid("type", "", &detail));
    }
    let deprecated = [
        ("firstTimestamp", core.first_timestamp_set),
        ("lastTimestamp", core.last_timestamp_set),
        ("count", core.count != 0),
        ("source", core.source_set),
    ];
    for (field, set) in deprecated {
        if set {
            errors.push(FieldError::invalid(field, "", "needs to be unset"));
        }
    }
    errors
}

/// The errors of the generic metadata check every create passes after the
/// kind's own validation: a namespaced object whose name is a URL path
/// segment.
pub(crate) fn validate_generic_meta(event: &Value) -> Vec<FieldError> {
    let metadata = event.get("metadata").unwrap_or(&Value::Null);
    meta_validation::object_meta(metadata, meta_validation::path_segment_name)
}

/// `legacyValidateEvent`.
fn legacy(event: &CoreEvent) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let namespace_mismatch = || {
        FieldError::invalid(
            "involvedObject.namespace",
            event.involved_namespace,
            "does not match event.namespace",
        )
    };
    if !event.event_time_set {
        // An old-style Event: its namespace is its object's, or (for a
        // cluster-scoped object) empty or `default`.
        let matches = if event.involved_namespace.is_empty() {
            event.namespace.is_empty() || event.namespace == "default"
        } else {
            event.namespace == event.involved_namespace
        };
        if !matches {
            errors.push(namespace_mismatch());
        }
    } else {
        if event.involved_namespace.is_empty()
            && event.namespace != "default"
            && event.namespace != "kube-system"
        {
            errors.push(namespace_mismatch());
        }
        errors.extend(reporting_controller(event.reporting_controller));
        let limited = [
            (
                "reportingInstance",
                event.reporting_instance,
                REPORTING_INSTANCE_LENGTH_LIMIT,
            ),
            ("action", event.action, ACTION_LENGTH_LIMIT),
            ("reason", event.reason, REASON_LENGTH_LIMIT),
        ];
        for (field, value, limit) in limited {
            if value.is_empty() {
                errors.push(FieldError::required(field, ""));
            }
            if value.len() > limit {
                errors.push(at_most(field, limit));
            }
        }
        if event.message.len() > NOTE_LENGTH_LIMIT {
            errors.push(at_most("message", NOTE_LENGTH_LIMIT));
        }
    }
    for message in dns1123_subdomain(event.namespace) {
        errors.push(FieldError::invalid("namespace", event.namespace, &message));
    }
    errors
}

fn reporting_controller(value: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if value.is_empty() {
        errors.push(FieldError::required("reportingController", ""));
    }
    for message in qualified_name(value) {
        errors.push(FieldError::invalid("reportingController", value, &message));
    }
    errors
}

fn at_most(field: &str, limit: usize) -> FieldError {
    FieldError::invalid(field, "", &format!("can have at most {limit} characters"))
}

impl<'a> CoreEvent<'a> {
    fn read(event: &'a Value, api: EventApi) -> Self {
        let text = |pointer: &str| event.pointer(pointer).and_then(Value::as_str).unwrap_or("");
        let set = |pointer: &str| is_set_time(event.pointer(pointer));
        let (involved, message, source, first, last, count, controller) = match api {
            EventApi::CoreV1 => (
                "/involvedObject",
                "/message",
                "/source",
                "/firstTimestamp",
                "/lastTimestamp",
                "/count",
                "/reportingComponent",
            ),
            EventApi::EventsV1 => (
                "/regarding",
                "/note",
                "/deprecatedSource",
                "/deprecatedFirstTimestamp",
                "/deprecatedLastTimestamp",
                "/deprecatedCount",
                "/reportingController",
            ),
        };
        let source_set = ["component", "host"]
            .iter()
            .any(|field| !text(&format!("{source}/{field}")).is_empty());
        let series = event.get("series").filter(|s| !s.is_null()).map(|series| {
            let count = series.get("count").and_then(Value::as_i64).unwrap_or(0);
            (count, is_set_time(series.get("lastObservedTime")))
        });
        Self {
            metadata: event.get("metadata").unwrap_or(&Value::Null),
            namespace: text("/metadata/namespace"),
            involved_namespace: text(&format!("{involved}/namespace")),
            reason: text("/reason"),
            message: text(message),
            source_set,
            first_timestamp_set: set(first),
            last_timestamp_set: set(last),
            count: event.pointer(count).and_then(Value::as_i64).unwrap_or(0),
            event_time_set: set("/eventTime"),
            series,
            reporting_controller: text(controller),
            reporting_instance: text("/reportingInstance"),
            action: text("/action"),
            type_: text("/type"),
        }
    }
}

/// Whether a time field holds a time other than Go's zero time (absent and
/// null are zero).
fn is_set_time(value: Option<&Value>) -> bool {
    value
        .and_then(Value::as_str)
        .is_some_and(|time| !time.is_empty() && !time.starts_with("0001-01-01T00:00:00"))
}
