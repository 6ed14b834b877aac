//! Forwarding one source's events to several handlers (dual-stack).

use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_model::{ObjectEvent, ProxyEventHandler, ResourceKind};

/// Hands every event to each of its handlers, in order. A dual-stack proxy
/// feeds its IPv4 and IPv6 [`Proxier`](crate::Proxier)s through one of
/// these; each one's trackers keep only the objects of its own family
/// (upstream's `metaProxier`).
#[derive(Clone)]
pub struct FanOutHandler {
    handlers: Vec<Arc<dyn ProxyEventHandler>>,
}

impl FanOutHandler {
    /// A handler forwarding to every one of `handlers`.
    pub fn new(handlers: Vec<Arc<dyn ProxyEventHandler>>) -> Self {
        Self { handlers }
    }

    /// Hands a clone of `event` to every handler but the last, which gets
    /// `event` itself.
    fn forward<E: Clone>(&self, event: E, deliver: impl Fn(&dyn ProxyEventHandler, E)) {
        if let Some((last, others)) = self.handlers.split_last() {
            for handler in others {
                deliver(handler.as_ref(), event.clone());
            }
            deliver(last.as_ref(), event);
        }
    }
}

impl fmt::Debug for FanOutHandler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FanOutHandler")
            .field("handlers", &self.handlers.len())
            .finish()
    }
}

impl ProxyEventHandler for FanOutHandler {
    fn on_service(&self, event: ObjectEvent<Service>) {
        self.forward(event, |handler, event| handler.on_service(event));
    }

    fn on_endpoint_slice(&self, event: ObjectEvent<EndpointSlice>) {
        self.forward(event, |handler, event| handler.on_endpoint_slice(event));
    }

    fn on_node(&self, event: ObjectEvent<Node>) {
        self.forward(event, |handler, event| handler.on_node(event));
    }

    fn on_synced(&self, kind: ResourceKind) {
        self.forward(kind, |handler, kind| handler.on_synced(kind));
    }
}
