//! Picks the endpoint of each new connection: round robin over the ready
//! endpoints, or the client's remembered endpoint under ClientIP session
//! affinity.
//!
//! The balancer is shared by a listener's accept loop and every connection
//! it starts; the sync thread swaps in a new [`Route`] when endpoints
//! change. Connections already relaying hold their own sockets and never
//! look at the balancer again, so an endpoint update cannot break them.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use crate::route::{Route, TrafficKind};

/// Above this many remembered clients, expired entries are swept on the
/// next insert, so a port scanned by many short-lived clients does not
/// grow without bound.
const AFFINITY_SWEEP_THRESHOLD: usize = 4096;

/// Endpoint selection for one service port.
#[derive(Debug)]
pub struct Balancer {
    route: RwLock<Arc<Route>>,
    next_internal: AtomicUsize,
    next_external: AtomicUsize,
    affinity: Mutex<HashMap<IpAddr, Sticky>>,
}

/// A client's remembered endpoint.
#[derive(Debug, Clone, Copy)]
struct Sticky {
    endpoint: SocketAddr,
    last_used: Instant,
}

impl Balancer {
    /// A balancer over `route`.
    pub fn new(route: Route) -> Self {
        Self {
            route: RwLock::new(Arc::new(route)),
            next_internal: AtomicUsize::new(0),
            next_external: AtomicUsize::new(0),
            affinity: Mutex::new(HashMap::new()),
        }
    }

    /// The current route.
    pub fn route(&self) -> Arc<Route> {
        Arc::clone(&self.route.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Replaces the route. Remembered clients whose endpoint is gone, and
    /// every remembered client when affinity was turned off, are forgotten.
    pub fn update(&self, route: Route) {
        let mut affinity = self.affinity.lock().unwrap_or_else(PoisonError::into_inner);
        if route.affinity_timeout.is_none() {
            affinity.clear();
        } else {
            affinity.retain(|_, sticky| {
                route.internal.contains(&sticky.endpoint)
                    || route.external.contains(&sticky.endpoint)
            });
        }
        *self.route.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(route);
    }

    /// The endpoint for a new connection of `kind` from `client` at `now`,
    /// other than those in `skip` (endpoints that just failed for it).
    /// `None` when no endpoint is left.
    pub fn pick(
        &self,
        client: IpAddr,
        kind: TrafficKind,
        now: Instant,
        skip: &[SocketAddr],
    ) -> Option<SocketAddr> {
        let route = self.route();
        let endpoints = route.endpoints(kind);
        if endpoints.is_empty() {
            return None;
        }
        let Some(timeout) = route.affinity_timeout else {
            return self.round_robin(kind, endpoints, skip);
        };
        let mut affinity = self.affinity.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sticky) = affinity.get_mut(&client) {
            let fresh = now.saturating_duration_since(sticky.last_used) < timeout;
            if fresh && endpoints.contains(&sticky.endpoint) && !skip.contains(&sticky.endpoint) {
                sticky.last_used = now;
                return Some(sticky.endpoint);
            }
        }
        let endpoint = self.round_robin(kind, endpoints, skip)?;
        if affinity.len() >= AFFINITY_SWEEP_THRESHOLD {
            affinity.retain(|_, s| now.saturating_duration_since(s.last_used) < timeout);
        }
        affinity.insert(
            client,
            Sticky {
                endpoint,
                last_used: now,
            },
        );
        Some(endpoint)
    }

    /// Forgets `client`'s endpoint (it failed), so its next pick is fresh.
    pub fn forget(&self, client: IpAddr) {
        self.affinity
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&client);
    }

    /// Drops remembered clients idle for longer than the affinity timeout.
    pub fn sweep(&self, now: Instant) {
        let timeout = self.route().affinity_timeout.unwrap_or(Duration::ZERO);
        self.affinity
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, s| now.saturating_duration_since(s.last_used) < timeout);
    }

    /// How many clients are remembered.
    pub fn remembered_clients(&self) -> usize {
        self.affinity
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    fn round_robin(
        &self,
        kind: TrafficKind,
        endpoints: &[SocketAddr],
        skip: &[SocketAddr],
    ) -> Option<SocketAddr> {
        let counter = match kind {
            TrafficKind::Internal => &self.next_internal,
            TrafficKind::External => &self.next_external,
        };
        let start = counter.fetch_add(1, Ordering::Relaxed);
        (0..endpoints.len())
            .map(|offset| endpoints[(start + offset) % endpoints.len()])
            .find(|endpoint| !skip.contains(endpoint))
    }
}

#[cfg(test)]
#[path = "balancer_tests.rs"]
mod tests;
