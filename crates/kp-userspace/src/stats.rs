//! Connection counters per service port, for metrics.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use kp_model::ServicePortName;

/// Counters of one service port's relay. TCP counts connections; UDP
/// counts client sessions.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    active: AtomicU64,
    accepted: AtomicU64,
    refused: AtomicU64,
    dial_failures: AtomicU64,
}

/// A point-in-time copy of [`ConnectionStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Connections (sessions) open now.
    pub active: u64,
    /// Connections accepted (sessions started) since the listener opened.
    pub accepted: u64,
    /// Connections reset because no endpoint could serve them or the
    /// client was not allowed.
    pub refused: u64,
    /// Attempts to reach an endpoint that failed (refused or timed out).
    pub dial_failures: u64,
}

/// The counters of every open listener, shared: the relay adds and
/// removes listeners, a metrics server reads a snapshot from any thread.
#[derive(Debug, Clone, Default)]
pub struct StatsRegistry(Arc<Mutex<BTreeMap<ServicePortName, Arc<ConnectionStats>>>>);

/// Counts a connection as active until dropped.
#[derive(Debug)]
pub struct ActiveGuard<'a> {
    stats: &'a ConnectionStats,
}

impl ConnectionStats {
    /// Counts an accepted connection.
    pub fn accepted(&self) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a refused connection.
    pub fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a failed attempt to reach an endpoint.
    pub fn dial_failed(&self) {
        self.dial_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a connection as active for the guard's life.
    pub fn active_guard(&self) -> ActiveGuard<'_> {
        self.active.fetch_add(1, Ordering::Relaxed);
        ActiveGuard { stats: self }
    }

    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            active: self.active.load(Ordering::Relaxed),
            accepted: self.accepted.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            dial_failures: self.dial_failures.load(Ordering::Relaxed),
        }
    }
}

impl StatsRegistry {
    /// The counters of every open listener now.
    pub fn snapshot(&self) -> BTreeMap<ServicePortName, StatsSnapshot> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(name, stats)| (name.clone(), stats.snapshot()))
            .collect()
    }

    pub(crate) fn insert(&self, name: ServicePortName, stats: Arc<ConnectionStats>) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name, stats);
    }

    pub(crate) fn remove(&self, name: &ServicePortName) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
    }
}

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.stats.active.fetch_sub(1, Ordering::Relaxed);
    }
}
