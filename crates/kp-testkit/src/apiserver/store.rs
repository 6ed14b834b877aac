//! What the test API server holds: the objects, the history of changes that
//! watches replay, posted events, and the record of requests.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

use super::selector::{labels_of, FieldSelector, LabelSelector};

/// Timestamp given to every object the server stores; tests need no clock.
const CREATION_TIMESTAMP: &str = "2024-01-01T00:00:00Z";

/// The kinds of object the test API server serves to list and watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ServedKind {
    /// `v1/Service`, at `/api/v1/services`.
    Service,
    /// `discovery.k8s.io/v1/EndpointSlice`, at
    /// `/apis/discovery.k8s.io/v1/endpointslices`.
    EndpointSlice,
    /// `v1/Node`, at `/api/v1/nodes` (cluster-scoped).
    Node,
}

/// An object type the test API server stores: Service, EndpointSlice, Node.
pub trait ServedResource: Serialize + DeserializeOwned {
    /// The kind this type is served as.
    const KIND: ServedKind;
}

impl ServedResource for Service {
    const KIND: ServedKind = ServedKind::Service;
}

impl ServedResource for EndpointSlice {
    const KIND: ServedKind = ServedKind::EndpointSlice;
}

impl ServedResource for Node {
    const KIND: ServedKind = ServedKind::Node;
}

/// An event a client posted (`POST .../namespaces/{ns}/events`).
#[derive(Debug, Clone, PartialEq)]
pub struct PostedEvent {
    /// `v1` (core events) or `events.k8s.io/v1`.
    pub api_version: String,
    /// The namespace of the request path.
    pub namespace: String,
    /// The event as stored (with `metadata.resourceVersion` set).
    pub object: Value,
}

/// One request the server received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// `GET`, `POST`, …
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The raw query string (empty when there is none).
    pub query: String,
    /// The request was refused with 403 Forbidden (see
    /// [`TestApiServer::forbid`](super::TestApiServer::forbid)).
    pub forbidden: bool,
}

/// The identity of a stored object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ObjectKey {
    pub(crate) kind: ServedKind,
    pub(crate) namespace: String,
    pub(crate) name: String,
}

/// One change to one object, kept for watches to replay.
#[derive(Debug, Clone)]
struct Change {
    resource_version: u64,
    key: ObjectKey,
    old: Option<Value>,
    new: Option<Value>,
}

/// Which objects a list or watch asks for.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filter {
    pub(crate) namespace: Option<String>,
    pub(crate) labels: LabelSelector,
    pub(crate) fields: FieldSelector,
}

/// A watch event type, as written on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WatchEventType {
    Added,
    Modified,
    Deleted,
}

/// A watch asked to resume from a resourceVersion older than the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Expired {
    pub(crate) requested: u64,
    pub(crate) oldest: u64,
}

/// How many changes the server keeps for watches to resume from. The real
/// API server's watch cache keeps a bounded window too (100 events per
/// resource by default, growing with the event rate), and a watch resuming
/// from before it gets 410 Gone; this one keeps the last 10,000 changes of
/// all kinds together, so it expires no later than the real one would for
/// the same changes of one kind. Unbounded, a long run (a soak of 100,000
/// EndpointSlice updates) held every old and new object, 1.3 GB, and every
/// watch rescanned them all on each change.
pub const HISTORY_LIMIT: usize = 10_000;

/// Everything the server holds.
#[derive(Debug, Default)]
pub(crate) struct Store {
    pub(crate) resource_version: u64,
    objects: BTreeMap<ObjectKey, Value>,
    /// The last [`HISTORY_LIMIT`] changes, oldest first.
    history: VecDeque<Change>,
    /// Watches from a resourceVersion older than this get 410 Gone.
    pub(crate) oldest_watchable: u64,
    pub(crate) events: Vec<PostedEvent>,
    pub(crate) requests: Vec<RequestRecord>,
    pub(crate) protocol_errors: Vec<String>,
}

impl ServedKind {
    /// Every served kind.
    pub const ALL: [ServedKind; 3] = [Self::Service, Self::EndpointSlice, Self::Node];

    /// The `kind` field.
    pub fn kind(self) -> &'static str {
        match self {
            Self::Service => "Service",
            Self::EndpointSlice => "EndpointSlice",
            Self::Node => "Node",
        }
    }

    /// The `apiVersion` field.
    pub fn api_version(self) -> &'static str {
        match self {
            Self::Service | Self::Node => "v1",
            Self::EndpointSlice => "discovery.k8s.io/v1",
        }
    }

    /// The resource name in paths (`services`).
    pub fn plural(self) -> &'static str {
        match self {
            Self::Service => "services",
            Self::EndpointSlice => "endpointslices",
            Self::Node => "nodes",
        }
    }

    /// Whether objects of the kind live in a namespace.
    pub fn namespaced(self) -> bool {
        !matches!(self, Self::Node)
    }

    /// The path of the cluster-wide collection.
    pub fn collection_path(self) -> String {
        match self {
            Self::EndpointSlice => format!("/apis/discovery.k8s.io/v1/{}", self.plural()),
            Self::Service | Self::Node => format!("/api/v1/{}", self.plural()),
        }
    }
}

impl fmt::Display for RequestRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.query.is_empty() {
            write!(f, "{} {}", self.method, self.path)
        } else {
            write!(f, "{} {}?{}", self.method, self.path, self.query)
        }
    }
}

impl Filter {
    fn matches(&self, key: &ObjectKey, object: &Value) -> bool {
        self.namespace
            .as_ref()
            .is_none_or(|namespace| *namespace == key.namespace)
            && self.fields.matches(&key.namespace, &key.name)
            && self.labels.matches(&labels_of(object))
    }
}

impl WatchEventType {
    /// The `type` field of the event.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

impl Store {
    /// Stores a new object; panics if it exists.
    #[track_caller]
    pub(crate) fn create(&mut self, kind: ServedKind, object: Value) -> Value {
        let key = key_of(kind, &object);
        if self.objects.contains_key(&key) {
            panic!("test API server: {key:?} already exists; use update");
        }
        self.write(key, None, object)
    }

    /// Replaces an existing object; panics if it does not exist.
    #[track_caller]
    pub(crate) fn update(&mut self, kind: ServedKind, object: Value) -> Value {
        let key = key_of(kind, &object);
        let Some(old) = self.objects.get(&key).cloned() else {
            panic!("test API server: {key:?} does not exist; use create");
        };
        let mut object = object;
        object["metadata"]["uid"] = old["metadata"]["uid"].clone();
        self.write(key, Some(old), object)
    }

    /// Removes an object and returns its last state; panics if it does not
    /// exist.
    #[track_caller]
    pub(crate) fn delete(&mut self, kind: ServedKind, namespace: &str, name: &str) -> Value {
        let key = ObjectKey {
            kind,
            namespace: if kind.namespaced() {
                namespace.to_owned()
            } else {
                String::new()
            },
            name: name.to_owned(),
        };
        let Some(mut old) = self.objects.remove(&key) else {
            panic!("test API server: {key:?} does not exist");
        };
        self.resource_version += 1;
        old["metadata"]["resourceVersion"] = json!(self.resource_version.to_string());
        self.remember(Change {
            resource_version: self.resource_version,
            key,
            old: Some(old.clone()),
            new: None,
        });
        old
    }

    /// Keeps `change` for watches, forgetting the oldest beyond
    /// [`HISTORY_LIMIT`]: a watch from before what is kept gets 410 Gone.
    fn remember(&mut self, change: Change) {
        self.history.push_back(change);
        while self.history.len() > HISTORY_LIMIT {
            if let Some(forgotten) = self.history.pop_front() {
                self.oldest_watchable = self.oldest_watchable.max(forgotten.resource_version);
            }
        }
    }

    /// Forgets the history: every watch resuming from before now, and every
    /// list continuing a page from before now, gets 410 Gone.
    pub(crate) fn expire_history(&mut self) {
        self.resource_version += 1;
        self.oldest_watchable = self.resource_version;
        self.history.clear();
    }

    /// Whether namespace `namespace` exists: the namespaces every cluster
    /// has, and those of the stored objects (which a real server could not
    /// hold without their namespace).
    pub(crate) fn has_namespace(&self, namespace: &str) -> bool {
        ["default", "kube-system", "kube-public", "kube-node-lease"].contains(&namespace)
            || self.objects.keys().any(|key| key.namespace == namespace)
    }

    /// Assigns the next resourceVersion to a posted event.
    pub(crate) fn next_resource_version(&mut self) -> u64 {
        self.resource_version += 1;
        self.resource_version
    }

    /// The objects of `kind` selected by `filter`, in key order.
    pub(crate) fn list(&self, kind: ServedKind, filter: &Filter) -> Vec<(&ObjectKey, &Value)> {
        self.objects
            .iter()
            .filter(|(key, object)| key.kind == kind && filter.matches(key, object))
            .collect()
    }

    /// The watch events of `kind` after `since`, as a watch with `filter`
    /// sees them: an object that starts matching is ADDED, one that stops
    /// matching is DELETED.
    pub(crate) fn changes_since(
        &self,
        kind: ServedKind,
        filter: &Filter,
        since: u64,
    ) -> Result<Vec<(WatchEventType, Value)>, Expired> {
        if since < self.oldest_watchable {
            return Err(Expired {
                requested: since,
                oldest: self.oldest_watchable,
            });
        }
        let mut events = Vec::new();
        // The history is in resourceVersion order: start after `since`.
        let first = self
            .history
            .partition_point(|c| c.resource_version <= since);
        for change in self.history.range(first..) {
            if change.key.kind != kind {
                continue;
            }
            let matched = |object: &Option<Value>| {
                object
                    .as_ref()
                    .is_some_and(|object| filter.matches(&change.key, object))
            };
            let event = match (matched(&change.old), matched(&change.new), &change.new) {
                (false, true, Some(new)) => (WatchEventType::Added, new.clone()),
                (true, true, Some(new)) => (WatchEventType::Modified, new.clone()),
                (true, false, Some(new)) => (WatchEventType::Deleted, new.clone()),
                (true, false, None) => match &change.old {
                    Some(old) => {
                        let mut old = old.clone();
                        old["metadata"]["resourceVersion"] =
                            json!(change.resource_version.to_string());
                        (WatchEventType::Deleted, old)
                    }
                    None => continue,
                },
                _ => continue,
            };
            events.push(event);
        }
        Ok(events)
    }

    fn write(&mut self, key: ObjectKey, old: Option<Value>, mut object: Value) -> Value {
        self.resource_version += 1;
        let metadata = &mut object["metadata"];
        metadata["resourceVersion"] = json!(self.resource_version.to_string());
        if metadata.get("uid").is_none_or(Value::is_null) {
            metadata["uid"] = json!(format!("uid-{}-{}", key.name, self.resource_version));
        }
        if metadata.get("creationTimestamp").is_none_or(Value::is_null) {
            metadata["creationTimestamp"] = json!(CREATION_TIMESTAMP);
        }
        if key.kind.namespaced() {
            metadata["namespace"] = json!(key.namespace);
        }
        self.objects.insert(key.clone(), object.clone());
        self.remember(Change {
            resource_version: self.resource_version,
            key,
            old,
            new: Some(object.clone()),
        });
        object
    }
}

/// The key of `object`; namespaced kinds default to namespace `default`.
#[track_caller]
fn key_of(kind: ServedKind, object: &Value) -> ObjectKey {
    let Some(name) = object.pointer("/metadata/name").and_then(Value::as_str) else {
        panic!("test API server: a {} needs metadata.name", kind.kind());
    };
    let namespace = if kind.namespaced() {
        object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_owned()
    } else {
        String::new()
    };
    ObjectKey {
        kind,
        namespace,
        name: name.to_owned(),
    }
}
