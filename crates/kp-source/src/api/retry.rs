//! Keeping the watches alive when the API server goes away: a short,
//! bounded, jittered backoff per watch; which errors are those of an API
//! server that is down or starting; and one account of an outage across
//! every watch, so an outage is logged once, not once per retry per watch.
//!
//! # Why these numbers
//!
//! The proxy must have the cluster's state again within 2 s of the API
//! server answering, however long the outage was. A watch therefore never
//! waits more than [`MAX_RETRY`] (plus its jitter) between attempts: the
//! first retry comes after [`FIRST_RETRY`], each further one after twice
//! the previous, up to 1 s, and every delay gets up to a quarter more at
//! random so that the nodes of a cluster, all cut at the same moment, do
//! not come back in step. Once the outage is long, a watch tries once every
//! 1–1.25 s: three watches make at most three requests a second per node.
//! A refused connection costs the API server nothing; a 403 from a
//! starting server is answered before any storage is read; a 429 is the
//! server's own flow control telling us to slow down, which this bound
//! respects.
//!
//! client-go's reflector backs off from 0.8 s, doubling, with full jitter
//! (each delay up to twice as long), up to 30 s, and resets after 2 minutes
//! without a failure: after a 60 s outage its next attempt can be 30–60 s
//! away, which is the recovery time this replaces. It chose 30 s for a
//! 98 % cut in requests to an unhealthy server with every controller of a
//! cluster in mind; kube-proxy has three watches per node and its data
//! path goes stale while it waits, so we pay at most 3 requests a second
//! per node for recovery in under 2 s.
//!
//! The backoff starts over at the first event a watch delivers after a
//! failure. A watch that resumes without relisting and then sees no change
//! delivers nothing; it counts as healthy again after [`QUIET_IS_HEALTHY`]
//! without an error (longer than a connection attempt may take, so a hung
//! attempt is not mistaken for a working watch).

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kp_model::ResourceKind;
use kube::runtime::watcher;
use tokio::time::Instant;

/// The delay before the first retry of a watch.
pub const FIRST_RETRY: Duration = Duration::from_millis(200);
/// The longest delay between two attempts of a watch, before jitter.
pub const MAX_RETRY: Duration = Duration::from_secs(1);
/// How long a watch that failed must go without an error (and without an
/// event) to count as working again. kube-rs' connection timeout is 30 s.
pub const QUIET_IS_HEALTHY: Duration = Duration::from_secs(35);

/// Watch failures counted since the process started, per kind (for the
/// `kubeproxy_rs_api_watch_failures_total` metric). Process-wide, as
/// Prometheus' default registry is: a process runs one API source.
static FAILURES: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

/// Failed list or watch requests of each kind since the process started:
/// every failed attempt counts, 410 Gone (a normal request to list again)
/// does not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatchFailures {
    /// Of the Service watch.
    pub services: u64,
    /// Of the EndpointSlice watch.
    pub endpoint_slices: u64,
    /// Of the Node watch.
    pub nodes: u64,
}

/// The delays between the attempts of one watch.
#[derive(Debug)]
pub(super) struct Backoff {
    next: Duration,
}

/// How an error of the watcher is to be treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failure {
    /// 410 Gone: the watch resumed from too old a resourceVersion; the
    /// watcher lists again at once. Not a failure of the API server.
    Expired,
    /// What an API server that is down, restarting or overloaded answers:
    /// no connection, a connection cut (reset, EOF, TLS without
    /// close_notify), 403 while its authorizer warms up, 429, 5xx.
    Transient,
    /// Anything else (a response that does not parse, 400, 404, …): still
    /// retried, but worth a warning each time it changes.
    Other,
}

/// The state of the API server as every watch sees it, shared by the
/// watches so that an outage is reported once.
#[derive(Debug)]
pub(super) struct Health {
    watches: usize,
    state: Mutex<Outage>,
}

/// The outage in progress, if any.
#[derive(Debug, Default)]
struct Outage {
    /// The watches failing now, with the last error of each.
    failing: BTreeMap<&'static str, String>,
    /// Whether the outage was reported.
    reported: bool,
    started: Option<Instant>,
    /// Failed attempts during the outage.
    attempts: u64,
}

/// Targets of kube-rs whose warnings and errors repeat, once per failed
/// request, what the API source reports once per outage: kube-client's
/// request tracing (`failed with error client error (Connect)` at ERROR),
/// its watch decoder (`eof in poll` at WARN when a watch is cut) and
/// kube-runtime's watcher (`watch list error with 403` at WARN).
const RETRY_NOISE_TARGETS: [&str; 3] = [
    "kube_client::client::builder",
    "kube_client::client",
    "kube_runtime::watcher",
];

/// Whether a log event is kube-rs repeating, at WARN or ERROR, a failure
/// the API source already reports (once per outage, each retry at debug
/// level). A logging setup drops these so that an outage of the API server
/// costs two lines, not two per retry per watch; kube-rs' debug and trace
/// events stay.
pub fn is_retry_noise(metadata: &tracing::Metadata<'_>) -> bool {
    *metadata.level() <= tracing::Level::WARN && RETRY_NOISE_TARGETS.contains(&metadata.target())
}

/// The counts of [`FAILURES`].
pub fn watch_failures() -> WatchFailures {
    let read = |kind: ResourceKind| FAILURES[index(kind)].load(Ordering::Relaxed);
    WatchFailures {
        services: read(ResourceKind::Service),
        endpoint_slices: read(ResourceKind::EndpointSlice),
        nodes: read(ResourceKind::Node),
    }
}

impl Backoff {
    /// A backoff whose first delay is [`FIRST_RETRY`].
    pub(super) fn new() -> Self {
        Self { next: FIRST_RETRY }
    }

    /// The delay before the next attempt: the current step plus up to a
    /// quarter of it at random; the step doubles up to [`MAX_RETRY`].
    pub(super) fn next_delay(&mut self) -> Duration {
        let step = self.next;
        self.next = (step * 2).min(MAX_RETRY);
        step + jitter(step / 4)
    }

    /// Starts over from [`FIRST_RETRY`], after a success.
    pub(super) fn reset(&mut self) {
        self.next = FIRST_RETRY;
    }
}

impl Failure {
    /// How `error` is to be treated.
    pub(super) fn of(error: &watcher::Error) -> Self {
        match error {
            watcher::Error::WatchError(status) => Self::of_status(status.code),
            watcher::Error::InitialListFailed(error)
            | watcher::Error::WatchStartFailed(error)
            | watcher::Error::WatchFailed(error) => Self::of_client(error),
            watcher::Error::NoResourceVersion => Self::Other,
        }
    }

    fn of_client(error: &kube::Error) -> Self {
        match error {
            kube::Error::Api(status) => Self::of_status(status.code),
            // The connection: refused, reset, cut in the middle of a
            // response or of the TLS session, timed out.
            kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
                Self::Transient
            }
            _ => Self::Other,
        }
    }

    fn of_status(code: u16) -> Self {
        match code {
            410 => Self::Expired,
            403 | 429 | 500..=599 => Self::Transient,
            _ => Self::Other,
        }
    }
}

impl Health {
    /// The health of `watches` watches, none failing.
    pub(super) fn new(watches: usize) -> Self {
        Self {
            watches,
            state: Mutex::new(Outage::default()),
        }
    }

    /// Records a failed attempt of watch `kind`. The first time every watch
    /// has failed, or one has failed twice, the outage is reported once, at
    /// WARN, naming the failing watches and their errors; every other
    /// attempt is logged at debug level. Returns whether this call
    /// reported the outage.
    pub(super) fn failed(&self, kind: ResourceKind, error: &str) -> bool {
        FAILURES[index(kind)].fetch_add(1, Ordering::Relaxed);
        let name = name(kind);
        let mut outage = self.lock();
        let again = outage.failing.insert(name, error.to_owned()).is_some();
        outage.started.get_or_insert_with(Instant::now);
        outage.attempts += 1;
        if !outage.reported && (again || outage.failing.len() >= self.watches) {
            outage.reported = true;
            let watches = outage.failing.keys().copied().collect::<Vec<_>>().join(",");
            tracing::warn!(
                watches = %watches,
                error = %error,
                retry_max_ms = MAX_RETRY.as_millis(),
                "the API server cannot be reached; the rules stay as they are, retrying"
            );
            true
        } else {
            tracing::debug!(watch = name, error = %error, "watch attempt failed; retrying");
            false
        }
    }

    /// Records that watch `kind` works again. When it was the last one
    /// failing of a reported outage, logs once, at INFO, that the API
    /// server is back, and returns true.
    pub(super) fn recovered(&self, kind: ResourceKind) -> bool {
        let mut outage = self.lock();
        if outage.failing.remove(name(kind)).is_none() || !outage.failing.is_empty() {
            return false;
        }
        let ended = std::mem::take(&mut *outage);
        let outage_ms = ended
            .started
            .map_or(0, |started| started.elapsed().as_millis());
        if ended.reported {
            tracing::info!(
                outage_ms,
                failed_attempts = ended.attempts,
                "the API server answers again; every watch is back"
            );
        } else {
            tracing::debug!(
                outage_ms,
                failed_attempts = ended.attempts,
                "watch failed briefly and is back"
            );
        }
        ended.reported
    }

    /// Counts a failed attempt of watch `kind` that is not part of an
    /// outage (see [`Failure::Other`]).
    pub(super) fn count_other(kind: ResourceKind) {
        FAILURES[index(kind)].fetch_add(1, Ordering::Relaxed);
    }

    /// Whether watch `kind` is failing now.
    #[cfg(test)]
    pub(super) fn is_failing(&self, kind: ResourceKind) -> bool {
        self.lock().failing.contains_key(name(kind))
    }

    fn lock(&self) -> MutexGuard<'_, Outage> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn index(kind: ResourceKind) -> usize {
    match kind {
        ResourceKind::Service => 0,
        ResourceKind::EndpointSlice => 1,
        ResourceKind::Node => 2,
    }
}

/// The resource a watch follows, as `kubectl` and the API name it.
pub(super) fn name(kind: ResourceKind) -> &'static str {
    match kind {
        ResourceKind::Service => "services",
        ResourceKind::EndpointSlice => "endpointslices",
        ResourceKind::Node => "nodes",
    }
}

/// A random duration in `[0, max]`. The standard library's per-hasher
/// random keys are random enough to spread retries; no crate needed.
fn jitter(max: Duration) -> Duration {
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    // The top 53 bits as a fraction in [0, 1).
    #[allow(clippy::cast_precision_loss)]
    let fraction = (random >> 11) as f64 / (1_u64 << 53) as f64;
    max.mul_f64(fraction)
}

#[cfg(test)]
mod tests;
