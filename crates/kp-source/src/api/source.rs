//! Following Services, EndpointSlices and the own Node through kube-rs'
//! watcher, and turning its events into the handler's calls.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_model::{ObjectEvent, ProxyEventHandler, ResourceKind};
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use super::compact::Compact;
use super::retry::{self, Backoff, Failure, Health, QUIET_IS_HEALTHY};

/// The label selector upstream lists Services and EndpointSlices with: no
/// `service.kubernetes.io/service-proxy-name` (the Service belongs to
/// another proxy) and no `service.kubernetes.io/headless`.
pub const PROXY_LABEL_SELECTOR: &str =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

/// Serves the cluster's Services and EndpointSlices and the proxy's own Node
/// to a [`ProxyEventHandler`], from the API server's watches.
#[derive(Clone)]
pub struct ApiSource {
    client: Client,
    node_name: String,
}

/// An object kind the source follows.
trait Followed:
    Resource<DynamicType = ()> + Clone + Debug + Default + DeserializeOwned + Send + 'static
{
    /// The kind, as the handler knows it.
    const KIND: ResourceKind;
    /// Hands `event` to the handler method of the kind.
    fn deliver(handler: &dyn ProxyEventHandler, event: ObjectEvent<Self>);
}

/// What the handler has been given of one kind, so that a relist delivers
/// only the differences. Only a fingerprint of each object is kept, not the
/// object: at 10,000 Services the objects themselves would be the largest
/// thing in the process, and the handler keeps what it needs of them.
#[derive(Default)]
struct Delivered {
    objects: HashMap<Key, Seen>,
    /// Keys listed so far by a relist in progress; what the handler has
    /// and the relist did not list is deleted at its end.
    relist: Option<HashSet<Key>>,
    synced: bool,
}

/// `namespace/name` (`/name` for a cluster-scoped object) in one string:
/// neither part can contain a slash. One allocation per object, where a
/// pair of strings took two.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Key(Box<str>);

/// What identifies the content of a delivered object.
#[derive(PartialEq)]
struct Seen {
    resource_version: Option<Version>,
    /// A hash of the object without its bookkeeping metadata
    /// (resourceVersion, managedFields).
    content: u64,
}

/// A resourceVersion, compared as the opaque string it is; the decimal
/// numbers etcd-backed API servers hand out are kept without a string.
#[derive(PartialEq)]
enum Version {
    Number(u64),
    Text(Box<str>),
}

impl Followed for Service {
    const KIND: ResourceKind = ResourceKind::Service;
    fn deliver(handler: &dyn ProxyEventHandler, event: ObjectEvent<Self>) {
        handler.on_service(event);
    }
}

impl Followed for EndpointSlice {
    const KIND: ResourceKind = ResourceKind::EndpointSlice;
    fn deliver(handler: &dyn ProxyEventHandler, event: ObjectEvent<Self>) {
        handler.on_endpoint_slice(event);
    }
}

impl Followed for Node {
    const KIND: ResourceKind = ResourceKind::Node;
    fn deliver(handler: &dyn ProxyEventHandler, event: ObjectEvent<Self>) {
        handler.on_node(event);
    }
}

impl ApiSource {
    /// A source reading through `client` for the proxy running on node
    /// `node_name`. Nothing is requested until [`run`](Self::run).
    pub fn new(client: Client, node_name: impl Into<String>) -> Self {
        Self {
            client,
            node_name: node_name.into(),
        }
    }

    /// Lists and watches Services and EndpointSlices (with
    /// [`PROXY_LABEL_SELECTOR`]) and the Node named like this node, until
    /// `shutdown` completes, handing every change to `handler`.
    ///
    /// Each kind reports `on_synced` once, after its first complete list.
    /// When a watch cannot resume (410 Gone) the kind is listed again and
    /// only the differences are delivered: objects gone meanwhile as
    /// `Delete`, new or changed ones as `Apply`, unchanged ones not at all.
    /// Failed requests are retried forever, after a short jittered backoff
    /// of at most 1.25 s (see the `retry` module), so every watch is back
    /// within about a second of the API server answering again; an outage
    /// is logged once (WARN) and its end once (INFO), each retry at debug
    /// level. An unreachable API server never deletes anything.
    pub async fn run(
        self,
        handler: Arc<dyn ProxyEventHandler>,
        shutdown: impl Future<Output = ()>,
    ) {
        let node_selector = format!("metadata.name={}", self.node_name);
        // Lists ask for any resourceVersion ("0"), as client-go's reflector
        // does for its first list: the API server answers from its watch
        // cache in one response. The default (most recent) costs a quorum
        // read of etcd per page of 500, and at 10,000 Services the 40 pages
        // queue for seconds behind the client's 5 requests per second.
        // Without a page size: kube-rs drops resourceVersion=0 from a list
        // that has a limit (the server ignores that limit anyway).
        let config = || {
            watcher::Config {
                page_size: None,
                ..watcher::Config::default()
            }
            .any_semantic()
        };
        let health = Arc::new(Health::new(3));
        let services = follow::<Service>(
            Api::all(self.client.clone()),
            config().labels(PROXY_LABEL_SELECTOR),
            Arc::clone(&handler),
            Arc::clone(&health),
        );
        let slices = follow::<EndpointSlice>(
            Api::all(self.client.clone()),
            config().labels(PROXY_LABEL_SELECTOR),
            Arc::clone(&handler),
            Arc::clone(&health),
        );
        let node = follow::<Node>(
            Api::all(self.client),
            config().fields(&node_selector),
            handler,
            health,
        );
        tracing::info!(node = %self.node_name, "watching the API server");
        tokio::select! {
            () = shutdown => tracing::debug!("API source stopped"),
            _ = futures::future::join3(services, slices, node) => {}
        }
    }
}

/// Follows one kind forever: each watcher event is turned into handler
/// calls; after a failed request the watcher is polled again after a
/// [`Backoff`] delay, which starts over at the next event (or after
/// [`QUIET_IS_HEALTHY`] without an error).
///
/// The watcher holds the objects as [`Compact`] text; each becomes a typed
/// object only when it is delivered.
async fn follow<K: Followed>(
    api: Api<Compact<K>>,
    config: watcher::Config,
    handler: Arc<dyn ProxyEventHandler>,
    health: Arc<Health>,
) {
    let mut delivered = Delivered::default();
    let mut backoff = Backoff::new();
    let mut failing = false;
    let mut last_other = String::new();
    let mut events = watcher(api, config).boxed();
    loop {
        let next = if failing {
            match tokio::time::timeout(QUIET_IS_HEALTHY, events.next()).await {
                Ok(next) => next,
                Err(_quiet) => {
                    failing = false;
                    backoff.reset();
                    health.recovered(K::KIND);
                    continue;
                }
            }
        } else {
            events.next().await
        };
        match next {
            None => break,
            Some(Ok(event)) => {
                // Init only says a list is being tried; it may still fail.
                if failing && !matches!(event, watcher::Event::Init) {
                    failing = false;
                    backoff.reset();
                    last_other.clear();
                    health.recovered(K::KIND);
                }
                delivered.handle(event, handler.as_ref());
            }
            Some(Err(error)) => {
                let failure = Failure::of(&error);
                failing |= failure != Failure::Expired;
                if let Some(delay) =
                    on_error::<K>(&error, failure, &health, &mut backoff, &mut last_other)
                {
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }
}

/// Logs and counts a failed request of watch `K`; returns how long to wait
/// before the watcher tries again (nothing after 410 Gone: it lists again at
/// once, as client-go's reflector does).
fn on_error<K: Followed>(
    error: &watcher::Error,
    failure: Failure,
    health: &Health,
    backoff: &mut Backoff,
    last_other: &mut String,
) -> Option<Duration> {
    let described = describe(error);
    match failure {
        Failure::Expired => {
            tracing::debug!(watch = retry::name(K::KIND), error = %described, "the watch cannot resume; listing again");
            return None;
        }
        Failure::Transient => {
            health.failed(K::KIND, &described);
        }
        Failure::Other => {
            Health::count_other(K::KIND);
            if *last_other == described {
                tracing::debug!(watch = retry::name(K::KIND), error = %described, "watch attempt failed again; retrying");
            } else {
                tracing::warn!(watch = retry::name(K::KIND), error = %described, "watching the API server failed; retrying");
                last_other.clone_from(&described);
            }
        }
    }
    Some(backoff.next_delay())
}

/// `error` with every cause that adds something (the watcher's error says
/// "client error (Connect)"; its source says "Connection refused").
fn describe(error: &watcher::Error) -> String {
    let mut text = error.to_string();
    let mut cause = std::error::Error::source(error);
    while let Some(inner) = cause {
        let inner_text = inner.to_string();
        if !text.contains(&inner_text) {
            text.push_str(": ");
            text.push_str(&inner_text);
        }
        cause = inner.source();
    }
    text
}

impl Delivered {
    fn handle<K: Followed>(
        &mut self,
        event: watcher::Event<Compact<K>>,
        handler: &dyn ProxyEventHandler,
    ) {
        match event {
            watcher::Event::Init => {
                tracing::debug!(kind = ?K::KIND, "listing");
                self.relist = Some(HashSet::new());
            }
            watcher::Event::InitApply(object) => {
                if let Some(listed) = self.relist.as_mut() {
                    listed.insert(Key::of(&object));
                }
                self.apply(&object, handler);
            }
            watcher::Event::InitDone => self.finish_relist::<K>(handler),
            watcher::Event::Apply(object) => self.apply(&object, handler),
            watcher::Event::Delete(object) => {
                let key = Key::of(&object);
                if self.objects.remove(&key).is_some() {
                    // The handler needs only the namespace and name of a
                    // deleted object.
                    let deleted = object.object().unwrap_or_else(|_| tombstone(&key));
                    K::deliver(handler, ObjectEvent::Delete(deleted));
                }
            }
        }
    }

    /// Delivers `object` unless the handler has it already. An object that
    /// does not type is refused alone (logged): the handler keeps what it
    /// had of it, and a relist does not delete it.
    fn apply<K: Followed>(&mut self, object: &Compact<K>, handler: &dyn ProxyEventHandler) {
        let seen = Seen::of(object);
        let key = Key::of(object);
        if self
            .objects
            .get(&key)
            .is_some_and(|known| known.same(&seen))
        {
            return;
        }
        match object.object() {
            Ok(typed) => {
                self.objects.insert(key, seen);
                K::deliver(handler, ObjectEvent::Apply(typed));
            }
            Err(error) => tracing::warn!(
                kind = ?K::KIND,
                object = object.key(),
                %error,
                "refusing an object that does not match its kind's schema; keeping what was had of it"
            ),
        }
    }

    /// Ends a relist: what the handler has and the relist did not list was
    /// deleted meanwhile. A relist after an outage or a 410 thus delivers
    /// nothing for the objects that stayed the same.
    fn finish_relist<K: Followed>(&mut self, handler: &dyn ProxyEventHandler) {
        let listed = self.relist.take().unwrap_or_default();
        let gone: Vec<Key> = self
            .objects
            .keys()
            .filter(|key| !listed.contains(*key))
            .cloned()
            .collect();
        for key in &gone {
            self.objects.remove(key);
            K::deliver(handler, ObjectEvent::Delete(tombstone(key)));
        }
        tracing::debug!(kind = ?K::KIND, objects = self.objects.len(), deleted = gone.len(), "listed");
        if !self.synced {
            self.synced = true;
            handler.on_synced(K::KIND);
        }
    }
}

impl Seen {
    fn of<K>(object: &Compact<K>) -> Self {
        Self {
            resource_version: object.resource_version().map(Version::of),
            content: object.content_hash(),
        }
    }

    /// Whether `new` is the object this was seen of: the same
    /// resourceVersion, or the same content apart from bookkeeping metadata.
    fn same(&self, new: &Self) -> bool {
        let same_version =
            self.resource_version.is_some() && self.resource_version == new.resource_version;
        same_version || self.content == new.content
    }
}

impl Version {
    fn of(text: &str) -> Self {
        match text.parse::<u64>() {
            // Only the canonical spelling: "007" must stay unequal to "7".
            Ok(number) if number.to_string() == text => Self::Number(number),
            _ => Self::Text(text.into()),
        }
    }
}

impl Key {
    fn of<K>(object: &Compact<K>) -> Self {
        Self(object.key().into())
    }

    /// Namespace (empty for a cluster-scoped object) and name.
    fn parts(&self) -> (&str, &str) {
        self.0.split_once('/').unwrap_or(("", &self.0))
    }
}

/// The deleted object a relist found missing, as far as it is known: its
/// namespace and name, all the handler needs to forget it.
fn tombstone<K: Followed>(key: &Key) -> K {
    let mut object = K::default();
    let meta = object.meta_mut();
    let (namespace, name) = key.parts();
    meta.namespace = Some(namespace.to_owned()).filter(|namespace| !namespace.is_empty());
    meta.name = Some(name.to_owned());
    object
}

#[cfg(test)]
mod tests;
