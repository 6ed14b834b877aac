//! Following Services, EndpointSlices and the own Node through kube-rs'
//! watcher, and turning its events into the handler's calls.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_model::{ObjectEvent, ProxyEventHandler, ResourceKind};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

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
    Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + PartialEq + Send + 'static
{
    /// The kind, as the handler knows it.
    const KIND: ResourceKind;
    /// Hands `event` to the handler method of the kind.
    fn deliver(handler: &dyn ProxyEventHandler, event: ObjectEvent<Self>);
}

/// What the handler has been given of one kind, so that a relist delivers
/// only the differences.
struct Delivered<K> {
    objects: BTreeMap<(String, String), K>,
    /// Objects of a relist in progress, swapped in at its end.
    relist: Option<BTreeMap<(String, String), K>>,
    synced: bool,
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
    /// Errors are logged and retried with kube-rs' default backoff, forever;
    /// an unreachable API server never deletes anything.
    pub async fn run(
        self,
        handler: Arc<dyn ProxyEventHandler>,
        shutdown: impl Future<Output = ()>,
    ) {
        let node_selector = format!("metadata.name={}", self.node_name);
        let services = follow::<Service>(
            Api::all(self.client.clone()),
            watcher::Config::default().labels(PROXY_LABEL_SELECTOR),
            Arc::clone(&handler),
        );
        let slices = follow::<EndpointSlice>(
            Api::all(self.client.clone()),
            watcher::Config::default().labels(PROXY_LABEL_SELECTOR),
            Arc::clone(&handler),
        );
        let node = follow::<Node>(
            Api::all(self.client),
            watcher::Config::default().fields(&node_selector),
            handler,
        );
        tracing::info!(node = %self.node_name, "watching the API server");
        tokio::select! {
            () = shutdown => tracing::debug!("API source stopped"),
            _ = futures::future::join3(services, slices, node) => {}
        }
    }
}

/// Follows one kind forever: each watcher event is turned into handler
/// calls, each error is logged and retried after a backoff.
async fn follow<K: Followed>(
    api: Api<K>,
    config: watcher::Config,
    handler: Arc<dyn ProxyEventHandler>,
) {
    let mut delivered = Delivered::<K>::default();
    let mut events = watcher(api, config).default_backoff().boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => delivered.handle(event, handler.as_ref()),
            Err(error) => {
                let cause = std::error::Error::source(&error)
                    .map(ToString::to_string)
                    .unwrap_or_default();
                tracing::warn!(
                    kind = ?K::KIND,
                    error = %error,
                    cause = %cause,
                    "watching the API server failed; retrying after a backoff"
                );
            }
        }
    }
}

impl<K> Default for Delivered<K> {
    fn default() -> Self {
        Self {
            objects: BTreeMap::new(),
            relist: None,
            synced: false,
        }
    }
}

impl<K: Followed> Delivered<K> {
    fn handle(&mut self, event: watcher::Event<K>, handler: &dyn ProxyEventHandler) {
        match event {
            watcher::Event::Init => {
                tracing::debug!(kind = ?K::KIND, "listing");
                self.relist = Some(BTreeMap::new());
            }
            watcher::Event::InitApply(object) => match self.relist.as_mut() {
                Some(relist) => {
                    relist.insert(key_of(&object), object);
                }
                None => self.apply(object, handler),
            },
            watcher::Event::InitDone => self.finish_relist(handler),
            watcher::Event::Apply(object) => self.apply(object, handler),
            watcher::Event::Delete(object) => {
                if self.objects.remove(&key_of(&object)).is_some() {
                    K::deliver(handler, ObjectEvent::Delete(object));
                }
            }
        }
    }

    fn apply(&mut self, object: K, handler: &dyn ProxyEventHandler) {
        let key = key_of(&object);
        if !self
            .objects
            .get(&key)
            .is_some_and(|known| unchanged(known, &object))
        {
            K::deliver(handler, ObjectEvent::Apply(object.clone()));
        }
        self.objects.insert(key, object);
    }

    /// Swaps in the listed objects, delivering what changed since the last
    /// delivery: a relist after an outage or a 410 delivers nothing for the
    /// objects that stayed the same.
    fn finish_relist(&mut self, handler: &dyn ProxyEventHandler) {
        let listed = self.relist.take().unwrap_or_default();
        let (mut applied, mut deleted) = (0_usize, 0_usize);
        for (key, object) in &listed {
            if !self
                .objects
                .get(key)
                .is_some_and(|known| unchanged(known, object))
            {
                K::deliver(handler, ObjectEvent::Apply(object.clone()));
                applied += 1;
            }
        }
        let previous = std::mem::replace(&mut self.objects, listed);
        for (key, object) in previous {
            if !self.objects.contains_key(&key) {
                K::deliver(handler, ObjectEvent::Delete(object));
                deleted += 1;
            }
        }
        tracing::debug!(kind = ?K::KIND, objects = self.objects.len(), applied, deleted, "listed");
        if !self.synced {
            self.synced = true;
            handler.on_synced(K::KIND);
        }
    }
}

fn key_of<K: Resource>(object: &K) -> (String, String) {
    (object.namespace().unwrap_or_default(), object.name_any())
}

/// Whether `new` is the object the handler already has: the same
/// resourceVersion, or the same content apart from bookkeeping metadata.
fn unchanged<K: Followed>(known: &K, new: &K) -> bool {
    if known.resource_version().is_some() && known.resource_version() == new.resource_version() {
        return true;
    }
    let strip = |object: &K| {
        let mut object = object.clone();
        let meta = object.meta_mut();
        meta.resource_version = None;
        meta.managed_fields = None;
        object
    };
    strip(known) == strip(new)
}

#[cfg(test)]
mod tests;
