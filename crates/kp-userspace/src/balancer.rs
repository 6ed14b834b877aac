//! Picks the endpoint of each new connection: round robin over the ready
//! endpoints, or the client's remembered endpoint under ClientIP session
//! affinity.
//!
//! The balancer is shared by a listener's accept loop and every connection
//! it starts; the sync thread swaps in a new [`Route`] when endpoints
//! change. Connections already relaying hold their own sockets and never
//! look at the balancer again, so an endpoint update cannot break them.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use crate::route::{Route, TrafficKind};

/// The most clients a service port remembers under ClientIP affinity; at
/// the bound the client remembered longest ago is forgotten for a new one
/// (one that came back since is given a second chance first). The
/// iptables mode's `recent` lists likewise forget their oldest entry when
/// full. 16,384 clients take about 1.5 MiB.
pub const MAX_AFFINITY_CLIENTS: usize = 16_384;

/// Expired clients at the front of the order dropped per new client, so
/// that the table sheds them as it goes without a sweep over all of it.
const EXPIRED_DROPPED_PER_INSERT: usize = 2;

/// Endpoint selection for one service port.
#[derive(Debug)]
pub struct Balancer {
    route: RwLock<Arc<Route>>,
    next_internal: AtomicUsize,
    next_external: AtomicUsize,
    affinity: Mutex<Affinity>,
}

/// The remembered clients of one service port.
#[derive(Debug, Default)]
struct Affinity {
    clients: HashMap<IpAddr, Sticky>,
    /// Clients in the order they were remembered (or last given a second
    /// chance), with the id of that entry; an entry whose client was
    /// forgotten or remembered anew is skipped when it comes up.
    order: VecDeque<(IpAddr, u64)>,
    next_id: u64,
}

/// A client's remembered endpoint.
#[derive(Debug, Clone, Copy)]
struct Sticky {
    endpoint: SocketAddr,
    last_used: Instant,
    /// The id of the client's entry in the order.
    id: u64,
    /// `last_used` when the entry was queued: a later use earns the client
    /// a second chance at the bound.
    queued_at: Instant,
}

impl Balancer {
    /// A balancer over `route`.
    pub fn new(route: Route) -> Self {
        Self {
            route: RwLock::new(Arc::new(route)),
            next_internal: AtomicUsize::new(0),
            next_external: AtomicUsize::new(0),
            affinity: Mutex::default(),
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
            *affinity = Affinity::default();
        } else {
            affinity.clients.retain(|_, sticky| {
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
        if let Some(sticky) = affinity.clients.get_mut(&client) {
            let fresh = now.saturating_duration_since(sticky.last_used) < timeout;
            if fresh && endpoints.contains(&sticky.endpoint) && !skip.contains(&sticky.endpoint) {
                sticky.last_used = now;
                return Some(sticky.endpoint);
            }
        }
        let endpoint = self.round_robin(kind, endpoints, skip)?;
        affinity.remember(client, endpoint, now, timeout);
        Some(endpoint)
    }

    /// Forgets `client`'s endpoint (it failed), so its next pick is fresh.
    pub fn forget(&self, client: IpAddr) {
        self.affinity
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clients
            .remove(&client);
    }

    /// Drops remembered clients idle for longer than the affinity timeout.
    pub fn sweep(&self, now: Instant) {
        let timeout = self.route().affinity_timeout.unwrap_or(Duration::ZERO);
        let mut affinity = self.affinity.lock().unwrap_or_else(PoisonError::into_inner);
        affinity
            .clients
            .retain(|_, s| now.saturating_duration_since(s.last_used) < timeout);
        affinity.compact();
    }

    /// How many clients are remembered.
    pub fn remembered_clients(&self) -> usize {
        self.affinity
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clients
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

impl Affinity {
    /// Remembers `endpoint` for `client`. Work per call is constant but
    /// for the rare compaction of the order, which is paid for by the
    /// inserts since the last one: no sweep over the table per client.
    fn remember(&mut self, client: IpAddr, endpoint: SocketAddr, now: Instant, timeout: Duration) {
        for _ in 0..EXPIRED_DROPPED_PER_INSERT {
            if !self.forget_front_if_expired(now, timeout) {
                break;
            }
        }
        if !self.clients.contains_key(&client) {
            // Each client in the table has an entry in the order, and each
            // is given at most one second chance here, so this ends.
            let mut chances = self.order.len();
            while self.clients.len() >= MAX_AFFINITY_CLIENTS {
                let second_chance = chances > 0;
                chances = chances.saturating_sub(1);
                if !self.forget_front(second_chance) {
                    break;
                }
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        self.clients.insert(
            client,
            Sticky {
                endpoint,
                last_used: now,
                id,
                queued_at: now,
            },
        );
        self.order.push_back((client, id));
        self.compact();
    }

    /// The live entry at the front of the order, dropping entries of
    /// clients forgotten or remembered anew on the way.
    fn front(&mut self) -> Option<IpAddr> {
        while let Some(&(client, id)) = self.order.front() {
            if self.clients.get(&client).is_some_and(|s| s.id == id) {
                return Some(client);
            }
            self.order.pop_front();
        }
        None
    }

    /// Forgets the client at the front of the order if it has expired.
    fn forget_front_if_expired(&mut self, now: Instant, timeout: Duration) -> bool {
        let Some(client) = self.front() else {
            return false;
        };
        let expired = self
            .clients
            .get(&client)
            .is_some_and(|s| now.saturating_duration_since(s.last_used) >= timeout);
        if expired {
            self.clients.remove(&client);
            self.order.pop_front();
        }
        expired
    }

    /// Forgets the client at the front of the order, or, with
    /// `second_chance` and when it came back since it was queued, queues
    /// it again at the back. False when nobody is remembered.
    fn forget_front(&mut self, second_chance: bool) -> bool {
        let Some(client) = self.front() else {
            return false;
        };
        let entry = self.order.pop_front();
        match self.clients.get_mut(&client) {
            Some(sticky) if second_chance && sticky.last_used > sticky.queued_at => {
                sticky.queued_at = sticky.last_used;
                self.order.extend(entry);
            }
            _ => {
                self.clients.remove(&client);
            }
        }
        true
    }

    /// Drops entries of forgotten clients from the order once they
    /// outnumber the remembered ones.
    fn compact(&mut self) {
        if self.order.len() > 2 * self.clients.len() + 64 {
            let clients = &self.clients;
            self.order
                .retain(|(client, id)| clients.get(client).is_some_and(|s| s.id == *id));
        }
    }
}

#[cfg(test)]
#[path = "balancer_tests.rs"]
mod tests;
