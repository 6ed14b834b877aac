//! The proxy's health as upstream's healthz server judges it.
//!
//! The proxy is healthy while no change has waited longer than the health
//! timeout (2 × `syncPeriod`) for a sync, in every IP family, and no family's
//! mode has found that it cannot run on this host (a missing program): that
//! does not heal by waiting, so it is reported at once. `/healthz`
//! also requires the node to be eligible: a Node being deleted or tainted
//! `ToBeDeletedByClusterAutoscaler` answers 503 there, so load balancers
//! drain it, while `/livez` ignores the node, so the pod is not restarted.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kp_sync::Proxier;
use tokio::time::Instant;

use crate::time_format::go_time;

/// The health of the proxy at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// No change has waited longer than the health timeout.
    pub healthy: bool,
    /// The node is neither being deleted nor about to be removed by the
    /// cluster autoscaler.
    pub node_eligible: bool,
    /// The last successful sync of every family (`None` before the first).
    pub last_updated: Option<SystemTime>,
    /// When this was judged.
    pub current_time: SystemTime,
}

/// Judges the health of the proxiers of every family.
#[derive(Debug, Clone)]
pub struct ProxyHealth {
    proxiers: Vec<Arc<Proxier>>,
    timeout: Duration,
}

impl ProxyHealth {
    /// Health of `proxiers`, unhealthy once a change waits longer than
    /// `timeout` (upstream: 2 × `syncPeriod`).
    pub fn new(proxiers: Vec<Arc<Proxier>>, timeout: Duration) -> Self {
        Self { proxiers, timeout }
    }

    /// The health now.
    pub fn check(&self) -> Health {
        self.check_at(Instant::now(), SystemTime::now())
    }

    /// The health at `now` (monotonic) and `wall` (the same moment on the
    /// wall clock).
    pub fn check_at(&self, now: Instant, wall: SystemTime) -> Health {
        let healthy = self.proxiers.iter().all(|proxier| {
            let status = proxier.status();
            status.unavailable().is_none()
                && status
                    .queued_since()
                    .is_none_or(|queued| now.saturating_duration_since(queued) < self.timeout)
        });
        let node_eligible = self.proxiers.iter().all(|proxier| {
            let node = proxier.node();
            !node.deleting && !node.to_be_deleted_by_autoscaler
        });
        let last_updated = self
            .proxiers
            .iter()
            .map(|proxier| proxier.status().last_successful_sync())
            .collect::<Option<Vec<_>>>()
            .and_then(|times| times.into_iter().min())
            .map(|at| wall - now.saturating_duration_since(at));
        Health {
            healthy,
            node_eligible,
            last_updated,
            current_time: wall,
        }
    }
}

impl Health {
    /// Whether `/healthz` answers 200.
    pub fn healthz_ok(&self) -> bool {
        self.healthy && self.node_eligible
    }

    /// Upstream's `/healthz` body. When healthy, `lastUpdated` is the
    /// current time, as upstream reports it for compatibility.
    pub fn healthz_json(&self) -> String {
        format!(
            "{{\"lastUpdated\": {},\"currentTime\": {}, \"nodeEligible\": {}}}",
            quoted(self.shown_last_updated(self.healthz_ok())),
            quoted(self.current_time),
            self.node_eligible
        )
    }

    /// Upstream's `/livez` body.
    pub fn livez_json(&self) -> String {
        format!(
            "{{\"lastUpdated\": {},\"currentTime\": {}}}",
            quoted(self.shown_last_updated(self.healthy)),
            quoted(self.current_time)
        )
    }

    fn shown_last_updated(&self, ok: bool) -> Option<SystemTime> {
        if ok {
            Some(self.current_time)
        } else {
            self.last_updated
        }
    }
}

/// Go's zero `time.Time`, which upstream shows before the first sync.
const GO_ZERO_TIME: &str = "0001-01-01 00:00:00 +0000 UTC";

fn quoted(t: impl Into<Option<SystemTime>>) -> String {
    let text = t.into().map_or_else(|| GO_ZERO_TIME.to_owned(), go_time);
    serde_json::Value::String(text).to_string()
}

#[cfg(test)]
#[path = "health_tests.rs"]
mod tests;
