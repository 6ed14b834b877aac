//! The handler trait every source (kube API, `--manifests`) feeds.
//!
//! A source only records: it hands whole objects to a [`ProxyEventHandler`]
//! and never writes rules. The sync crate implements the handler by recording
//! into the change trackers and asking the runner for a sync.

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// One change to one object, as a source observed it.
#[derive(Debug, Clone, PartialEq)]
pub enum ObjectEvent<T> {
    /// The object was created or updated; this is its whole new state.
    Apply(T),
    /// The object was deleted; this is its last known state, or only its
    /// namespace and name when a source found it gone without seeing the
    /// deletion (a relist after a broken watch).
    Delete(T),
}

/// The kinds of object a source delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceKind {
    /// `v1/Service`
    Service,
    /// `discovery.k8s.io/v1/EndpointSlice`
    EndpointSlice,
    /// `v1/Node` (only the proxy's own node)
    Node,
}

/// Receives the events of a source. Implementations must be cheap: record and
/// return; never block on IO.
pub trait ProxyEventHandler: Send + Sync {
    /// A Service changed.
    fn on_service(&self, event: ObjectEvent<Service>);
    /// An EndpointSlice changed.
    fn on_endpoint_slice(&self, event: ObjectEvent<EndpointSlice>);
    /// The proxy's own Node changed.
    fn on_node(&self, event: ObjectEvent<Node>);
    /// The source delivered its first complete list of `kind`. Called once per
    /// kind; nothing is programmed before Services and EndpointSlices have
    /// both reported it.
    fn on_synced(&self, kind: ResourceKind);
}

impl<T> ObjectEvent<T> {
    /// The object the event carries (its new state, or its last known state
    /// when deleted).
    pub fn object(&self) -> &T {
        match self {
            Self::Apply(object) | Self::Delete(object) => object,
        }
    }

    /// The event is a deletion.
    pub fn is_delete(&self) -> bool {
        matches!(self, Self::Delete(_))
    }
}
