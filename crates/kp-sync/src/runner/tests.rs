//! Runner timing under a paused tokio clock: every run reports the virtual
//! time at which it started, so the tests read as a timeline.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::*;

const MIN: Duration = Duration::from_secs(1);
const MAX: Duration = Duration::from_secs(3600);
const RETRY: Duration = Duration::from_secs(5);

/// A runner driven in the background whose runs are observable.
struct Timeline {
    runner: BoundedFrequencyRunner,
    runs: mpsc::UnboundedReceiver<(RunReason, Duration)>,
    /// Results handed out to the coming runs; `Succeeded` once empty.
    results: Arc<Mutex<VecDeque<RunResult>>>,
    start: Instant,
    stop: Option<oneshot::Sender<()>>,
    loop_task: tokio::task::JoinHandle<()>,
}

impl Timeline {
    fn start(min_interval: Duration, max_interval: Duration) -> Self {
        let runner = BoundedFrequencyRunner::new(RunnerConfig {
            min_interval,
            max_interval,
            retry_interval: RETRY,
        });
        let (runs_tx, runs) = mpsc::unbounded_channel();
        let results = Arc::new(Mutex::new(VecDeque::new()));
        let (stop, stopped) = oneshot::channel::<()>();
        let start = Instant::now();
        let task_results = Arc::clone(&results);
        let driven = runner.clone();
        let loop_task = tokio::spawn(async move {
            let task = |reason| {
                runs_tx.send((reason, start.elapsed())).unwrap();
                let result = task_results.lock().unwrap().pop_front();
                async move { result.unwrap_or(RunResult::Succeeded) }
            };
            driven
                .drive(task, async {
                    let _ = stopped.await;
                })
                .await;
        });
        Self {
            runner,
            runs,
            results,
            start,
            stop: Some(stop),
            loop_task,
        }
    }

    fn fail_next_run(&self) {
        self.results.lock().unwrap().push_back(RunResult::Failed);
    }

    /// Waits (in virtual time) for the next run and returns when it started,
    /// counted from the start of the timeline.
    async fn next_run(&mut self) -> (RunReason, Duration) {
        self.runs.recv().await.expect("the runner stopped")
    }

    /// Asserts that no run started since the last one the test saw.
    #[track_caller]
    fn assert_no_run_yet(&mut self) {
        assert!(
            self.runs.try_recv().is_err(),
            "unexpected run at {:?}",
            self.start.elapsed()
        );
    }
}

/// Lets the runner task catch up with what the test just did.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_requests_gives_one_run() {
    let mut timeline = Timeline::start(MIN, MAX);
    for _ in 0..100 {
        timeline.runner.run();
    }

    assert_eq!(
        timeline.next_run().await,
        (RunReason::Requested, Duration::ZERO)
    );
    // The next run is the periodic one: the burst left nothing behind.
    assert_eq!(timeline.next_run().await, (RunReason::Periodic, MAX));
}

#[tokio::test(start_paused = true)]
async fn two_runs_may_follow_each_other_then_requests_wait_for_the_min_interval() {
    let mut timeline = Timeline::start(MIN, MAX);
    timeline.runner.run();
    assert_eq!(timeline.next_run().await.1, Duration::ZERO);

    // After a quiet spell the second run need not wait (upstream's burst).
    tokio::time::advance(Duration::from_millis(300)).await;
    timeline.runner.run();
    assert_eq!(
        timeline.next_run().await,
        (RunReason::Requested, Duration::from_millis(300))
    );

    // The third waits until a whole run is earned again: 0.3 s of the
    // 1 s interval were, so 0.7 s more after the second run.
    tokio::time::advance(Duration::from_millis(100)).await;
    timeline.runner.run();
    timeline.runner.run();
    settle().await;
    timeline.assert_no_run_yet();
    assert_eq!(timeline.next_run().await, (RunReason::Requested, MIN));
}

#[tokio::test(start_paused = true)]
async fn a_steady_stream_of_requests_runs_once_per_min_interval() {
    let mut timeline = Timeline::start(MIN, MAX);
    settle().await;
    let mut runs = Vec::new();
    // A request every 100 ms for 5 s.
    for _ in 0..50 {
        timeline.runner.run();
        settle().await;
        while let Ok((_, at)) = timeline.runs.try_recv() {
            runs.push(at.as_millis());
        }
        tokio::time::advance(Duration::from_millis(100)).await;
    }

    // Two at once at the start, then one a second.
    assert_eq!(runs, [0, 100, 1000, 2000, 3000, 4000]);
}

#[tokio::test(start_paused = true)]
async fn without_requests_runs_come_every_max_interval() {
    let mut timeline = Timeline::start(MIN, MAX);

    assert_eq!(timeline.next_run().await, (RunReason::Periodic, MAX));
    assert_eq!(timeline.next_run().await, (RunReason::Periodic, MAX * 2));
}

#[tokio::test(start_paused = true)]
async fn a_request_does_not_postpone_the_periodic_run() {
    let mut timeline = Timeline::start(MIN, MAX);
    settle().await;
    tokio::time::advance(Duration::from_secs(600)).await;
    timeline.runner.run();

    assert_eq!(
        timeline.next_run().await,
        (RunReason::Requested, Duration::from_secs(600))
    );
    assert_eq!(timeline.next_run().await, (RunReason::Periodic, MAX));
}

#[tokio::test(start_paused = true)]
async fn under_steady_requests_a_periodic_run_still_comes_every_max_interval() {
    let max = Duration::from_secs(30);
    let mut timeline = Timeline::start(MIN, max);
    settle().await;
    let mut periodic = Vec::new();
    // A change every 2 s for 100 s: requested runs all the time.
    for second in 0..100 {
        if second % 2 == 0 {
            timeline.runner.run();
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        settle().await;
        while let Ok((reason, at)) = timeline.runs.try_recv() {
            if reason == RunReason::Periodic {
                periodic.push(at);
            }
        }
    }

    let seconds: Vec<u64> = periodic.iter().map(Duration::as_secs).collect();
    assert_eq!(seconds, [30, 60, 90]);
}

#[tokio::test(start_paused = true)]
async fn a_failed_run_is_retried_after_the_retry_interval() {
    let mut timeline = Timeline::start(MIN, MAX);
    timeline.fail_next_run();
    timeline.runner.run();
    assert_eq!(
        timeline.next_run().await,
        (RunReason::Requested, Duration::ZERO)
    );

    assert_eq!(timeline.next_run().await, (RunReason::Retry, RETRY));
    // The retry succeeded: no more retries, the periodic timer takes over.
    assert_eq!(
        timeline.next_run().await,
        (RunReason::Periodic, RETRY + MAX)
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_after_a_failure_runs_before_the_retry_is_due() {
    let mut timeline = Timeline::start(MIN, MAX);
    timeline.fail_next_run();
    timeline.runner.run();
    assert_eq!(timeline.next_run().await.1, Duration::ZERO);

    // The bucket still holds a run: no wait for the min interval.
    timeline.runner.run();
    assert_eq!(
        timeline.next_run().await,
        (RunReason::Requested, Duration::ZERO)
    );
    // That run succeeded, so the retry is no longer needed; the periodic
    // run still counts from the start.
    assert_eq!(timeline.next_run().await, (RunReason::Periodic, MAX));
}

#[tokio::test(start_paused = true)]
async fn a_zero_min_interval_runs_every_request_at_once() {
    let mut timeline = Timeline::start(Duration::ZERO, MAX);
    timeline.runner.run();
    assert_eq!(
        timeline.next_run().await,
        (RunReason::Requested, Duration::ZERO)
    );

    timeline.runner.run();
    assert_eq!(
        timeline.next_run().await,
        (RunReason::Requested, Duration::ZERO)
    );
}

#[tokio::test(start_paused = true)]
async fn a_zero_max_interval_never_runs_unasked() {
    let mut timeline = Timeline::start(MIN, Duration::ZERO);
    tokio::time::advance(MAX * 24).await;
    settle().await;
    timeline.assert_no_run_yet();

    timeline.runner.run();
    assert_eq!(timeline.next_run().await, (RunReason::Requested, MAX * 24));
}

#[tokio::test(start_paused = true)]
async fn requests_from_another_thread_are_seen() {
    let mut timeline = Timeline::start(MIN, MAX);
    let runner = timeline.runner.clone();
    std::thread::spawn(move || runner.run()).join().unwrap();

    assert_eq!(
        timeline.next_run().await,
        (RunReason::Requested, Duration::ZERO)
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_ends_the_loop() {
    let mut timeline = Timeline::start(MIN, MAX);
    timeline.stop.take().unwrap().send(()).unwrap();

    timeline.loop_task.await.unwrap();
    timeline.runner.run();
    assert!(timeline.runs.recv().await.is_none(), "a run after shutdown");
}
