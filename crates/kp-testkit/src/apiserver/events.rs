//! Event creation (`POST /api/v1/namespaces/{ns}/events` and
//! `POST /apis/events.k8s.io/v1/namespaces/{ns}/events`), in the real API
//! server's order: decode (400 on a wrong type; unknown fields warned
//! about, or refused with `fieldValidation=Strict`), generate the name,
//! check the namespace against the path (400), validate (422 with the real
//! causes), check the namespace exists (404) and the name is free (409).

use std::collections::BTreeMap;

use http_body_util::BodyExt;
use hyper::body::{Bytes, Incoming};
use hyper::header::HeaderValue;
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};

use super::event_validation::{validate_create, validate_generic_meta, EventApi};
use super::field_error::{go_quote, invalid_status, FieldError};
use super::http::{bad_request, check_params, json_response, status_object, Body, Refusal};
use super::store::{PostedEvent, Store};
use super::Shared;

/// Query parameters an event creation accepts.
const CREATE_PARAMS: &[&str] = &["fieldManager", "fieldValidation"];
/// The characters of a generated name's suffix (apiserver's
/// `SimpleNameGenerator`: no vowels, no look-alikes).
const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Creates the Event in `request`, posted as `api_version` to `namespace`.
pub(crate) async fn create(
    shared: &Shared,
    api_version: &'static str,
    namespace: String,
    params: &BTreeMap<String, String>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Refusal> {
    check_params(params, CREATE_PARAMS)?;
    let api = match api_version {
        "v1" => EventApi::CoreV1,
        _ => EventApi::EventsV1,
    };
    let field_validation = params.get("fieldValidation").map_or("", String::as_str);
    if !matches!(field_validation, "" | "Ignore" | "Warn" | "Strict") {
        return Err(bad_request(format!(
            "fieldValidation {field_validation:?} is not valid (valid: Ignore, Warn, Strict)"
        )));
    }
    check_content_type(&request)?;
    let body = request
        .into_body()
        .collect()
        .await
        .map_err(|error| bad_request(format!("reading the body failed: {error}")))?
        .to_bytes();
    let (mut event, understood) = decode(&body, api, api_version)?;
    let mut unknown = Vec::new();
    unknown_fields(&event, &understood, "", &mut unknown);
    if field_validation == "Strict" && !unknown.is_empty() {
        let listed: Vec<String> = unknown
            .iter()
            .map(|path| format!("unknown field {}", go_quote(path)))
            .collect();
        return Err(bad_request(format!(
            "Event in version \"v1\" cannot be handled as a Event: strict decoding error: {}",
            listed.join(", ")
        )));
    }
    let mut store = shared.lock();
    prepare(&mut event, &namespace, store.resource_version + 1)?;
    validate(&event, api)?;
    admit(&store, &event, &namespace)?;
    let version = store.next_resource_version();
    event["metadata"]["resourceVersion"] = json!(version.to_string());
    event["metadata"]["uid"] = json!(format!("event-uid-{version}"));
    store.events.push(PostedEvent {
        api_version: api_version.to_owned(),
        namespace,
        object: event.clone(),
    });
    let mut response = json_response(StatusCode::CREATED, &event);
    if field_validation != "Ignore" {
        add_warnings(&mut response, &unknown);
    }
    Ok(response)
}

/// The kind's own validation, then (when it passes) the generic metadata
/// check; the first that fails is the 422.
fn validate(event: &Value, api: EventApi) -> Result<(), Refusal> {
    let mut errors = validate_create(event, api);
    if errors.is_empty() {
        errors = validate_generic_meta(event);
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(invalid(event, &errors))
    }
}

/// What admission and storage refuse after validation: a namespace that
/// does not exist (404), a name already taken (409).
fn admit(store: &Store, event: &Value, namespace: &str) -> Result<(), Refusal> {
    if !store.has_namespace(namespace) {
        return Err(refusal(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("namespaces {} not found", go_quote(namespace)),
        ));
    }
    let name = &event["metadata"]["name"];
    let taken = store
        .events
        .iter()
        .any(|e| e.namespace == namespace && e.object["metadata"]["name"] == *name);
    if taken {
        return Err(refusal(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!(
                "events {} already exists",
                go_quote(name.as_str().unwrap_or(""))
            ),
        ));
    }
    Ok(())
}

fn check_content_type(request: &Request<Incoming>) -> Result<(), Refusal> {
    let content_type = request
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    if content_type.starts_with("application/json") {
        return Ok(());
    }
    Err(refusal(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "UnsupportedMediaType",
        format!("content type {content_type:?} is not supported (valid: application/json)"),
    ))
}

/// The body as JSON and as the server understood it, refused (400) unless
/// it is an Event of `api_version` whose every field has the right type.
fn decode(body: &Bytes, api: EventApi, api_version: &str) -> Result<(Value, Value), Refusal> {
    let event: Value = serde_json::from_slice(body)
        .map_err(|error| bad_request(format!("the body is not JSON: {error}")))?;
    if event["apiVersion"].as_str() != Some(api_version) || event["kind"].as_str() != Some("Event")
    {
        return Err(bad_request(format!(
            "the body is not an {api_version} Event (apiVersion {}, kind {})",
            event["apiVersion"], event["kind"]
        )));
    }
    let understood = typed(&event, api)?;
    Ok((event, understood))
}

/// The Event decoded as its type and encoded again: what the server
/// understood of it. Go zero-fills absent structs where k8s-openapi
/// requires them, so those are filled in first.
fn typed(event: &Value, api: EventApi) -> Result<Value, Refusal> {
    let mut filled = event.clone();
    let required: &[&str] = match api {
        EventApi::CoreV1 => &["metadata", "involvedObject"],
        EventApi::EventsV1 => &["metadata"],
    };
    for field in required {
        if filled.get(field).is_none_or(Value::is_null) {
            filled[*field] = json!({});
        }
    }
    let cannot = |error: serde_json::Error| {
        bad_request(format!(
            "Event in version \"v1\" cannot be handled as a Event: {error}"
        ))
    };
    let understood = match api {
        EventApi::CoreV1 => serde_json::from_value::<k8s_openapi::api::core::v1::Event>(filled)
            .and_then(serde_json::to_value),
        EventApi::EventsV1 => serde_json::from_value::<k8s_openapi::api::events::v1::Event>(filled)
            .and_then(serde_json::to_value),
    };
    understood.map_err(cannot)
}

/// Adds to `unknown` the paths of the fields `sent` has and `understood`
/// (the same object decoded and encoded again) lacks.
fn unknown_fields(sent: &Value, understood: &Value, path: &str, unknown: &mut Vec<String>) {
    match (sent, understood) {
        (Value::Object(sent), Value::Object(understood)) => {
            for (key, value) in sent {
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match understood.get(key) {
                    Some(known) => unknown_fields(value, known, &child, unknown),
                    // A null is dropped when encoding again, known or not.
                    None if !value.is_null() => unknown.push(child),
                    None => {}
                }
            }
        }
        (Value::Array(sent), Value::Array(understood)) => {
            for (index, (value, known)) in sent.iter().zip(understood).enumerate() {
                unknown_fields(value, known, &format!("{path}[{index}]"), unknown);
            }
        }
        _ => {}
    }
}

/// Fills in what the server sets before validating: the name from
/// `generateName` (its suffix derived from `seed`) and the namespace from
/// the path (400 when the body names another).
fn prepare(event: &mut Value, namespace: &str, seed: u64) -> Result<(), Refusal> {
    let metadata = &mut event["metadata"];
    if !metadata.is_object() {
        *metadata = json!({});
    }
    match metadata.get("namespace").and_then(Value::as_str) {
        Some(body) if !body.is_empty() && body != namespace => {
            return Err(bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
                    .to_owned(),
            ));
        }
        _ => metadata["namespace"] = json!(namespace),
    }
    let name = metadata.get("name").and_then(Value::as_str).unwrap_or("");
    let prefix = metadata
        .get("generateName")
        .and_then(Value::as_str)
        .unwrap_or("");
    if name.is_empty() && !prefix.is_empty() {
        metadata["name"] = json!(generated_name(prefix, seed));
    }
    Ok(())
}

/// `prefix` (cut to 58 characters) and 5 characters of the name alphabet,
/// derived from `seed` so that tests are repeatable.
fn generated_name(prefix: &str, seed: u64) -> String {
    let prefix: String = prefix.chars().take(58).collect();
    let base = NAME_ALPHABET.len() as u64;
    let suffix: String = (0..5)
        .scan(seed, |rest, _| {
            let index = usize::try_from(*rest % base).unwrap_or(0);
            *rest /= base;
            NAME_ALPHABET.get(index).map(|c| char::from(*c))
        })
        .collect();
    format!("{prefix}{suffix}")
}

fn invalid(event: &Value, errors: &[FieldError]) -> Refusal {
    let name = event["metadata"]["name"].as_str().unwrap_or("");
    let body = invalid_status("Event", name, errors);
    Refusal {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        reason: "Invalid",
        message: body["message"].as_str().unwrap_or("").to_owned(),
        body: Some(body),
    }
}

fn refusal(status: StatusCode, reason: &'static str, message: String) -> Refusal {
    let body = status_object(status, reason, &message);
    Refusal {
        status,
        reason,
        message,
        body: Some(body),
    }
}

/// One `Warning: 299 - "unknown field \"path\""` header per unknown field,
/// as the real server warns by default.
fn add_warnings(response: &mut Response<Body>, unknown: &[String]) {
    for path in unknown {
        let text = format!("unknown field {}", go_quote(path));
        let warning = format!("299 - {}", go_quote(&text));
        if let Ok(value) = HeaderValue::from_str(&warning) {
            response.headers_mut().append("warning", value);
        }
    }
}
