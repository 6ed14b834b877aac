//! The bounded-frequency runner: turns bursts of sync requests into runs that
//! are at least `min_interval` and at most `max_interval` apart.
//!
//! This is upstream's `BoundedFrequencyRunner` (`pkg/util/async`) on tokio
//! time, so tests drive it with a paused clock. As upstream's, it spaces runs
//! with a token bucket: one token per `min_interval`, at most [`BURST`]
//! saved, so after a quiet spell two runs may follow each other at once (a
//! change right after a periodic run is not held back by it) while a steady
//! stream of requests runs once per `min_interval`. Differences from
//! upstream:
//! - a failed run is retried after an explicit `retry_interval` (upstream's
//!   proxiers pass a retry interval to `RetryAfter` themselves), and the retry
//!   is reported as [`RunReason::Retry`] so the caller can force a full sync;
//! - requested runs do not postpone the periodic run: it comes
//!   `max_interval` after the previous periodic run (or retry) ended. Upstream
//!   restarts its timer after every run, so under a steady stream of changes
//!   its periodic run never comes; the proxier makes periodic runs full
//!   syncs, and operators expect one every `syncPeriod` whatever the churn.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Runs that may start back to back after a quiet spell; upstream's
/// proxiers pass the same (`burstSyncs`).
pub const BURST: f64 = 2.0;

/// Timing of a [`BoundedFrequencyRunner`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunnerConfig {
    /// Time to earn the right to one more run (`minSyncPeriod`): over time,
    /// runs start at most once per `min_interval`, with up to [`BURST`] back
    /// to back after a quiet spell. Zero runs every request at once.
    pub min_interval: Duration,
    /// Time from the end of one periodic run (or retry) to the start of the
    /// next periodic run (`syncPeriod`), whether or not requested runs
    /// happened between: a run happens even when nobody asked, and at least
    /// this often while requests keep coming. Zero disables periodic runs.
    pub max_interval: Duration,
    /// Time from a failed run to its retry (and not before the runs spaced
    /// by `min_interval` allow another).
    pub retry_interval: Duration,
}

/// Why the runner started a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunReason {
    /// Someone called [`BoundedFrequencyRunner::run`].
    Requested,
    /// `max_interval` passed without a run.
    Periodic,
    /// The previous run failed and `retry_interval` passed.
    Retry,
}

/// What a run reports back to the runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunResult {
    /// The run did its work.
    Succeeded,
    /// The run failed; the runner schedules a retry.
    Failed,
}

/// Coalesces run requests and runs a task within the bounds of a
/// [`RunnerConfig`]. Cloning yields another handle to the same runner.
#[derive(Debug, Clone)]
pub struct BoundedFrequencyRunner {
    config: RunnerConfig,
    requests: Arc<Notify>,
}

/// The runner's pure scheduling state: when the next run is due, and why.
#[derive(Debug)]
struct Schedule {
    config: RunnerConfig,
    /// When the runner started looping; the periodic timer counts from here
    /// until the first run.
    epoch: Instant,
    /// Runs that may start now without waiting, as of `tokens_at`: one is
    /// earned per `min_interval`, up to [`BURST`].
    tokens: f64,
    tokens_at: Instant,
    /// The reason of the run in progress, if one is.
    running: Option<RunReason>,
    /// When the last periodic run or retry ended.
    last_periodic_end: Option<Instant>,
    requested: bool,
    retry_at: Option<Instant>,
}

impl BoundedFrequencyRunner {
    /// A runner with `config`. Nothing runs until [`drive`](Self::drive) is
    /// awaited.
    pub fn new(config: RunnerConfig) -> Self {
        Self {
            config,
            requests: Arc::new(Notify::new()),
        }
    }

    /// The timing this runner was built with.
    pub fn config(&self) -> RunnerConfig {
        self.config
    }

    /// Asks for a run. Never blocks, may be called from any thread, and any
    /// number of calls before the run starts result in one run.
    pub fn run(&self) {
        // `notify_one` stores at most one permit, which is exactly the
        // coalescing we want: a burst leaves one pending request.
        self.requests.notify_one();
    }

    /// Runs `task` whenever the schedule says so, until `shutdown` completes.
    /// A run in progress is finished before shutdown is noticed.
    pub async fn drive<F, Fut, S>(&self, mut task: F, shutdown: S)
    where
        F: FnMut(RunReason) -> Fut,
        Fut: Future<Output = RunResult>,
        S: Future<Output = ()>,
    {
        tokio::pin!(shutdown);
        let mut schedule = Schedule::new(self.config, Instant::now());
        loop {
            let next = schedule.next_run();
            let due = async {
                match next {
                    Some((at, _)) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = &mut shutdown => return,
                () = self.requests.notified() => schedule.request(),
                () = due => {
                    let reason = next.map_or(RunReason::Requested, |(_, reason)| reason);
                    schedule.start(Instant::now(), reason);
                    tracing::trace!(?reason, "runner starting a run");
                    let result = task(reason).await;
                    schedule.finish(Instant::now(), result);
                }
            }
        }
    }
}

impl Schedule {
    fn new(config: RunnerConfig, epoch: Instant) -> Self {
        Self {
            config,
            epoch,
            tokens: BURST,
            tokens_at: epoch,
            running: None,
            last_periodic_end: None,
            requested: false,
            retry_at: None,
        }
    }

    fn request(&mut self) {
        self.requested = true;
    }

    fn start(&mut self, now: Instant, reason: RunReason) {
        let min = self.config.min_interval;
        if !min.is_zero() {
            let earned =
                now.saturating_duration_since(self.tokens_at).as_secs_f64() / min.as_secs_f64();
            self.tokens = (self.tokens + earned).min(BURST) - 1.0;
            self.tokens_at = now;
        }
        self.running = Some(reason);
        self.requested = false;
        self.retry_at = None;
    }

    fn finish(&mut self, now: Instant, result: RunResult) {
        if matches!(
            self.running.take(),
            Some(RunReason::Periodic | RunReason::Retry)
        ) {
            self.last_periodic_end = Some(now);
        }
        if result == RunResult::Failed {
            self.retry_at = Some(now + self.config.retry_interval);
        }
    }

    /// The earliest due run and its reason. On a tie the reason that asks
    /// for more work wins (retry, then periodic, then requested).
    fn next_run(&self) -> Option<(Instant, RunReason)> {
        // When the bucket holds a whole token again.
        let not_before = if self.tokens >= 1.0 || self.config.min_interval.is_zero() {
            self.tokens_at
        } else {
            self.tokens_at + self.config.min_interval.mul_f64(1.0 - self.tokens)
        };
        let retry = self
            .retry_at
            .map(|at| (at.max(not_before), RunReason::Retry));
        let periodic = (!self.config.max_interval.is_zero()).then(|| {
            let from = self.last_periodic_end.unwrap_or(self.epoch);
            (
                (from + self.config.max_interval).max(not_before),
                RunReason::Periodic,
            )
        });
        let requested = self.requested.then_some((not_before, RunReason::Requested));
        [retry, periodic, requested]
            .into_iter()
            .flatten()
            .min_by_key(|(at, _)| *at)
    }
}

#[cfg(test)]
mod tests;
