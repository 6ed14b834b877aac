//! The bound on one server's open connections, and which connection gives
//! way at the bound.
//!
//! At the bound, a new connection is admitted by closing the connection
//! that has waited longest for a request: an idle kept-alive connection, or
//! one that was opened and never sent (all of a) request head. Our handlers
//! answer at once, so a connection that holds a slot for long is one whose
//! client is idle or slow; closing the new connection instead, or leaving
//! it in the listen backlog, would let anyone who opens enough idle
//! connections keep load balancers and kubelet from ever reaching
//! `/healthz`. Only when every connection is in the middle of a request
//! does a new one wait (in the listen backlog) for a slot to free up.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

/// The open connections of one listening socket.
#[derive(Debug)]
pub(crate) struct Connections {
    max: usize,
    slots: Mutex<Slots>,
    /// Told when a slot frees up or a connection starts waiting for a
    /// request (and so may give way); the accept loop is its only waiter.
    changed: Notify,
}

#[derive(Debug, Default)]
struct Slots {
    next_id: u64,
    open: HashMap<u64, Slot>,
}

#[derive(Debug)]
struct Slot {
    /// Since when the connection waits for a request head; `None` while a
    /// request is being answered.
    waiting_since: Option<Instant>,
    /// When the connection was accepted or its last request head arrived.
    last_request: Instant,
    /// Closes the connection when it has to give way; `None` once it was
    /// told to (it keeps its slot until it has closed).
    evict: Option<oneshot::Sender<()>>,
}

/// A connection's slot, freed on drop.
#[derive(Debug)]
pub(crate) struct Admitted {
    id: u64,
    connections: Arc<Connections>,
}

/// Completes when a connection has to give way to a new one.
pub(crate) type Evicted = oneshot::Receiver<()>;

impl Connections {
    /// At most `max` connections at once (at least one).
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            slots: Mutex::new(Slots::default()),
            changed: Notify::new(),
        })
    }

    /// A slot for a new connection: at once below the bound; at the bound,
    /// once the connection that has waited longest for a request has been
    /// told to give way and has closed; when every connection is busy with
    /// a request, once one is done. A connection keeps its slot until its
    /// socket is closed, so the bound holds for descriptors too.
    pub(crate) async fn admit(self: &Arc<Self>) -> (Admitted, Evicted) {
        loop {
            {
                let mut slots = self.lock();
                if slots.open.len() < self.max {
                    return self.insert(&mut slots);
                }
                if !slots.giving_way() {
                    slots.evict_longest_waiting();
                }
            }
            // `notify_one` keeps a permit when nobody waits, so a change
            // between the check above and this await is not missed.
            self.changed.notified().await;
        }
    }

    /// How many connections are open.
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        self.lock().open.len()
    }

    fn insert(self: &Arc<Self>, slots: &mut Slots) -> (Admitted, Evicted) {
        let id = slots.next_id;
        slots.next_id += 1;
        let (evict, evicted) = oneshot::channel();
        let now = Instant::now();
        slots.open.insert(
            id,
            Slot {
                waiting_since: Some(now),
                last_request: now,
                evict: Some(evict),
            },
        );
        let admitted = Admitted {
            id,
            connections: Arc::clone(self),
        };
        (admitted, evicted)
    }

    fn lock(&self) -> MutexGuard<'_, Slots> {
        // Every update under the lock leaves the slots whole.
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Slots {
    /// Whether a connection was told to give way and has not closed yet.
    fn giving_way(&self) -> bool {
        self.open.values().any(|slot| slot.evict.is_none())
    }

    /// Tells the connection that has waited longest for a request to
    /// close, if any connection waits for one.
    fn evict_longest_waiting(&mut self) {
        let longest = self
            .open
            .values_mut()
            .filter(|slot| slot.evict.is_some())
            .filter_map(|slot| slot.waiting_since.map(|since| (since, slot)))
            .min_by_key(|(since, _)| *since);
        if let Some(evict) = longest.and_then(|(_, slot)| slot.evict.take()) {
            // A connection that ended meanwhile dropped its receiver; its
            // slot is freed all the same.
            let _ = evict.send(());
        }
    }
}

impl Admitted {
    /// A request head arrived.
    pub(crate) fn request_started(&self) {
        if let Some(slot) = self.connections.lock().open.get_mut(&self.id) {
            let now = Instant::now();
            slot.waiting_since = None;
            slot.last_request = now;
        }
    }

    /// The request was answered; the connection waits for the next one.
    pub(crate) fn request_answered(&self) {
        if let Some(slot) = self.connections.lock().open.get_mut(&self.id) {
            slot.waiting_since = Some(Instant::now());
        }
        self.connections.changed.notify_one();
    }

    /// When the connection was accepted or its last request arrived.
    pub(crate) fn last_request(&self) -> Option<Instant> {
        self.connections
            .lock()
            .open
            .get(&self.id)
            .map(|slot| slot.last_request)
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.connections.lock().open.remove(&self.id);
        self.connections.changed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use super::*;

    /// A slot for a new connection, failing the test when none comes in a
    /// minute (of paused time).
    async fn admit(connections: &Arc<Connections>) -> (Admitted, Evicted) {
        tokio::time::timeout(Duration::from_secs(60), connections.admit())
            .await
            .expect("a slot within a minute")
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_bound_the_connection_waiting_longest_gives_way() {
        let connections = Connections::new(2);
        let (first, first_evicted) = admit(&connections).await;
        tokio::time::advance(Duration::from_secs(1)).await;
        let (_second, mut second_evicted) = admit(&connections).await;
        let closing = tokio::spawn(async move {
            first_evicted.await.unwrap();
            drop(first);
        });

        let _third = admit(&connections).await;

        closing.await.unwrap();
        assert_eq!(connections.open(), 2);
        assert!(second_evicted.try_recv().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_stays_taken_until_the_connection_giving_way_has_closed() {
        let connections = Connections::new(1);
        let (first, mut first_evicted) = admit(&connections).await;
        let third = tokio::spawn({
            let connections = Arc::clone(&connections);
            async move { admit(&connections).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;

        assert!(first_evicted.try_recv().is_ok(), "told to give way");
        assert!(!third.is_finished(), "not admitted while the first is open");
        drop(first);
        let _third = third.await.unwrap();
        assert_eq!(connections.open(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_answering_a_request_does_not_give_way_and_a_new_one_waits() {
        let connections = Connections::new(1);
        let (busy, mut busy_evicted) = admit(&connections).await;
        busy.request_started();

        let waiting = tokio::spawn({
            let connections = Arc::clone(&connections);
            async move { admit(&connections).await }
        });
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(!waiting.is_finished(), "no slot while the request runs");
        assert!(busy_evicted.try_recv().is_err(), "a busy connection stays");

        busy.request_answered();
        tokio::time::timeout(Duration::from_secs(1), &mut busy_evicted)
            .await
            .expect("the now idle connection gives way")
            .unwrap();
        drop(busy);
        let (_admitted, mut evicted) = waiting.await.unwrap();
        assert_eq!(connections.open(), 1);
        assert!(evicted.try_recv().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_connection_frees_its_slot() {
        let connections = Connections::new(1);
        let (first, _first_evicted) = admit(&connections).await;
        first.request_started();
        drop(first);

        let (_second, mut second_evicted) = admit(&connections).await;

        assert!(second_evicted.try_recv().is_err());
        assert_eq!(connections.open(), 1);
    }
}
