//! The HTTP side of the test API server: routing, list and watch, each
//! checked strictly against what the Kubernetes API accepts; event
//! creation is in `events`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use super::forbidden::{self, Attributes};
use super::selector::{FieldSelector, LabelSelector};
use super::store::{Filter, RequestRecord, ServedKind, Store};
use super::{events, watching, Shared};

/// The response body every handler returns.
pub(crate) type Body = BoxBody<Bytes, Infallible>;

/// Query parameters a list accepts.
const LIST_PARAMS: &[&str] = &[
    "labelSelector",
    "fieldSelector",
    "limit",
    "continue",
    "resourceVersion",
    "resourceVersionMatch",
    "timeoutSeconds",
];

/// What a request path names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    /// A collection to list or watch, optionally within one namespace.
    Collection {
        kind: ServedKind,
        namespace: Option<String>,
    },
    /// The events of a namespace, of API version `v1` or `events.k8s.io/v1`.
    Events {
        api_version: &'static str,
        namespace: String,
    },
}

/// A refused request: the HTTP status, the Status reason and a message.
pub(super) struct Refusal {
    pub(super) status: StatusCode,
    pub(super) reason: &'static str,
    pub(super) message: String,
    /// The whole Status body when it carries more than the message (the
    /// causes of a 422); otherwise one is made of the fields above.
    pub(super) body: Option<Value>,
}

/// Answers one request, recording it, and recording it as a protocol error
/// when it is refused as not understood.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or_default().to_owned();
    let params = parse_query(&query);
    let route = route(&path);
    // Read once: the record says what this request was answered, even
    // when the refusals end while it is handled.
    let forbidden_user = shared.lock_settings().forbidden_user.clone();
    let record = RequestRecord {
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
        forbidden: forbidden_user.is_some() && route.is_some(),
    };
    shared.lock().requests.push(record.clone());
    if let (Some(user), Some(route)) = (forbidden_user, &route) {
        shared.lock_settings().forbidden_answers += 1;
        let refusal = forbidden::refusal(&user, &attributes(route, &method, &params));
        let body = refusal.body.unwrap_or_default();
        return Ok(json_response(refusal.status, &body));
    }
    let result = match (route, method) {
        (Some(Route::Collection { kind, namespace }), Method::GET) => {
            if matches!(params.get("watch").map(String::as_str), Some("true" | "1")) {
                watching::start(&shared, kind, namespace, &params)
            } else {
                list(&shared, kind, namespace, &params)
            }
        }
        (
            Some(Route::Events {
                api_version,
                namespace,
            }),
            Method::POST,
        ) => events::create(&shared, api_version, namespace, &params, request).await,
        (Some(_), _) => Err(Refusal {
            status: StatusCode::METHOD_NOT_ALLOWED,
            reason: "MethodNotAllowed",
            message: format!("the test API server does not support {record}"),
            body: None,
        }),
        (None, _) => Err(Refusal {
            status: StatusCode::NOT_FOUND,
            reason: "NotFound",
            message: format!("the test API server does not serve {record}"),
            body: None,
        }),
    };
    Ok(result.unwrap_or_else(|refusal| {
        if refusal.status != StatusCode::GONE {
            tracing::warn!(
                request = %record,
                message = %refusal.message,
                "test API server refused a request"
            );
            shared
                .lock()
                .protocol_errors
                .push(format!("{record}: {}", refusal.message));
        }
        let body = refusal
            .body
            .unwrap_or_else(|| status_object(refusal.status, refusal.reason, &refusal.message));
        json_response(refusal.status, &body)
    }))
}

/// What `route` asks for, as kube-apiserver's authorizer sees it.
fn attributes<'a>(
    route: &'a Route,
    method: &Method,
    params: &BTreeMap<String, String>,
) -> Attributes<'a> {
    match route {
        Route::Collection { kind, namespace } => {
            let watch = matches!(params.get("watch").map(String::as_str), Some("true" | "1"));
            Attributes {
                verb: match (method, watch) {
                    (&Method::GET, true) => "watch",
                    (&Method::GET, false) => "list",
                    _ => "create",
                },
                resource: kind.plural(),
                group: kind.api_version().strip_suffix("/v1").unwrap_or_default(),
                namespace: namespace.as_deref(),
            }
        }
        Route::Events {
            api_version,
            namespace,
        } => Attributes {
            verb: "create",
            resource: "events",
            group: api_version.strip_suffix("/v1").unwrap_or_default(),
            namespace: Some(namespace),
        },
    }
}

fn route(path: &str) -> Option<Route> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group, "v1", rest @ ..] => (*group, rest),
        _ => return None,
    };
    let (namespace, plural) = match rest {
        [plural] => (None, *plural),
        ["namespaces", namespace, plural] if !namespace.is_empty() => {
            (Some((*namespace).to_owned()), *plural)
        }
        _ => return None,
    };
    match (group, plural, namespace) {
        ("", "events", Some(namespace)) => Some(Route::Events {
            api_version: "v1",
            namespace,
        }),
        ("events.k8s.io", "events", Some(namespace)) => Some(Route::Events {
            api_version: "events.k8s.io/v1",
            namespace,
        }),
        (group, plural, namespace) => {
            let api_version = if group.is_empty() {
                "v1".to_owned()
            } else {
                format!("{group}/v1")
            };
            let kind = ServedKind::ALL
                .into_iter()
                .find(|kind| kind.plural() == plural && kind.api_version() == api_version)?;
            if namespace.is_some() && !kind.namespaced() {
                return None;
            }
            Some(Route::Collection { kind, namespace })
        }
    }
}

fn list(
    shared: &Shared,
    kind: ServedKind,
    namespace: Option<String>,
    params: &BTreeMap<String, String>,
) -> Result<Response<Body>, Refusal> {
    check_params(params, LIST_PARAMS)?;
    let filter = filter(namespace, params)?;
    let limit =
        match params.get("limit") {
            Some(limit) => Some(limit.parse::<usize>().map_err(|_| {
                bad_request(format!("limit {limit:?} is not a non-negative integer"))
            })?),
            None => None,
        }
        .filter(|limit| *limit > 0);
    // resourceVersion=0 ("any version") is served from the real server's
    // watch cache, which ignores `limit` and answers in one page.
    let from_cache = params.get("resourceVersion").is_some_and(|v| v == "0")
        && params
            .get("resourceVersionMatch")
            .is_none_or(|m| m.is_empty() || m == "NotOlderThan");
    let limit = limit.filter(|_| !from_cache);
    let store = shared.lock();
    check_list_resource_version(&store, params)?;
    let (list_version, after) = match params.get("continue").filter(|token| !token.is_empty()) {
        Some(token) => parse_continue(&store, token)?,
        None => (store.resource_version, None),
    };
    let selected = store.list(kind, &filter);
    let remaining: Vec<_> = selected
        .into_iter()
        .filter(|(key, _)| {
            after
                .as_ref()
                .is_none_or(|(namespace, name)| (&key.namespace, &key.name) > (namespace, name))
        })
        .collect();
    let take = limit.unwrap_or(remaining.len()).min(remaining.len());
    let mut metadata = json!({ "resourceVersion": list_version.to_string() });
    if take < remaining.len() {
        if let Some((key, _)) = remaining.get(take.wrapping_sub(1)) {
            metadata["continue"] = json!(format!("{list_version}/{}/{}", key.namespace, key.name));
        }
    }
    // Written straight from the store, item by item, as a real server
    // encodes its cache: no copy of the objects, no document built first.
    let head = json!({
        "apiVersion": kind.api_version(),
        "kind": format!("{}List", kind.kind()),
        "metadata": metadata,
    });
    let mut body = head.to_string().into_bytes();
    // `{"apiVersion":…,"metadata":{…}}` becomes `{…,"items":[…]}`.
    body.pop();
    body.extend_from_slice(br#","items":["#);
    for (index, (_, object)) in remaining[..take].iter().enumerate() {
        if index > 0 {
            body.push(b',');
        }
        // Writing JSON into memory cannot fail.
        let _ = serde_json::to_writer(&mut body, &ListItem(object));
    }
    body.extend_from_slice(b"]}");
    Ok(bytes_response(StatusCode::OK, body))
}

/// A list item as the real server writes it: without `apiVersion`/`kind`.
struct ListItem<'a>(&'a Value);

impl serde::Serialize for ListItem<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let Some(fields) = self.0.as_object() else {
            return self.0.serialize(serializer);
        };
        let mut map = serializer.serialize_map(None)?;
        for (name, value) in fields {
            if name != "apiVersion" && name != "kind" {
                map.serialize_entry(name, value)?;
            }
        }
        map.end()
    }
}

fn check_list_resource_version(
    store: &Store,
    params: &BTreeMap<String, String>,
) -> Result<(), Refusal> {
    let version = params.get("resourceVersion").filter(|v| !v.is_empty());
    let version_match = params.get("resourceVersionMatch").filter(|v| !v.is_empty());
    if params
        .get("continue")
        .is_some_and(|token| !token.is_empty())
        && version.is_some()
    {
        return Err(bad_request(
            "specifying resourceVersion is not allowed when using continue".to_owned(),
        ));
    }
    match (version, version_match.map(String::as_str)) {
        (None, Some(_)) => Err(bad_request(
            "resourceVersionMatch is forbidden unless resourceVersion is provided".to_owned(),
        )),
        (None, None) | (Some(_), None | Some("NotOlderThan")) => Ok(()),
        (Some(version), Some("Exact")) if *version == store.resource_version.to_string() => Ok(()),
        (Some(version), Some("Exact")) => Err(Refusal {
            status: StatusCode::GONE,
            reason: "Expired",
            message: format!(
                "resourceVersion {version} is not the current one; \
                 only the current version can be listed exactly"
            ),
            body: None,
        }),
        (Some(_), Some(other)) => Err(bad_request(format!(
            "resourceVersionMatch {other:?} is not valid (valid: Exact, NotOlderThan)"
        ))),
    }
}

/// Reads a continue token `<resourceVersion>/<namespace>/<name>`.
fn parse_continue(store: &Store, token: &str) -> Result<(u64, Option<(String, String)>), Refusal> {
    let invalid = || bad_request(format!("continue token {token:?} is not valid"));
    let mut parts = token.splitn(3, '/');
    let version = parts
        .next()
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or_else(invalid)?;
    let namespace = parts.next().ok_or_else(invalid)?.to_owned();
    let name = parts.next().ok_or_else(invalid)?.to_owned();
    if version < store.oldest_watchable {
        return Err(Refusal {
            status: StatusCode::GONE,
            reason: "Expired",
            message: "The provided continue parameter is too old to display a consistent list \
                      result. You can start a new list without the continue parameter."
                .to_owned(),
            body: None,
        });
    }
    Ok((version, Some((namespace, name))))
}

pub(super) fn filter(
    namespace: Option<String>,
    params: &BTreeMap<String, String>,
) -> Result<Filter, Refusal> {
    let labels = LabelSelector::parse(params.get("labelSelector").map_or("", String::as_str))
        .map_err(bad_request)?;
    let fields = FieldSelector::parse(params.get("fieldSelector").map_or("", String::as_str))
        .map_err(bad_request)?;
    Ok(Filter {
        namespace,
        labels,
        fields,
    })
}

pub(super) fn check_params(
    params: &BTreeMap<String, String>,
    allowed: &[&str],
) -> Result<(), Refusal> {
    match params.keys().find(|name| !allowed.contains(&name.as_str())) {
        Some(name) => Err(bad_request(format!(
            "query parameter {name:?} is not supported here (valid: {})",
            allowed.join(", ")
        ))),
        None => Ok(()),
    }
}

pub(super) fn flag(params: &BTreeMap<String, String>, name: &str) -> Result<bool, Refusal> {
    match params.get(name).map(String::as_str) {
        None | Some("false" | "0") => Ok(false),
        Some("true" | "1") => Ok(true),
        Some(other) => Err(bad_request(format!("{name}={other:?} is not a boolean"))),
    }
}

pub(super) fn bad_request(message: String) -> Refusal {
    Refusal {
        status: StatusCode::BAD_REQUEST,
        reason: "BadRequest",
        message,
        body: None,
    }
}

pub(super) fn status_object(status: StatusCode, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": status.as_u16(),
    })
}

pub(super) fn event_line(event_type: &str, object: &Value) -> Bytes {
    let mut line = json!({ "type": event_type, "object": object }).to_string();
    line.push('\n');
    Bytes::from(line)
}

pub(super) fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    bytes_response(status, body.to_string().into_bytes())
}

fn bytes_response(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

/// Splits a query string into decoded name/value pairs.
fn parse_query(query: &str) -> BTreeMap<String, String> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(name), percent_decode(value))
        })
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while let Some(&byte) = bytes.get(index) {
        let hex = bytes
            .get(index + 1..index + 3)
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (byte, hex) {
            (b'%', Some(value)) => {
                decoded.push(value);
                index += 3;
            }
            (b'+', _) => {
                decoded.push(b' ');
                index += 1;
            }
            (byte, _) => {
                decoded.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}
