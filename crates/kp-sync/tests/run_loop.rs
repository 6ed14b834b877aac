//! The sync loop driven by its runner (`Proxier::run`), with real change
//! trackers and the fake backend. Syncs run on the blocking pool, so these
//! tests use real time and wait for conditions with a deadline.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use kp_model::IpFamily;
use kp_sync::testing::FakeBackend;
use kp_sync::{Proxier, RunnerConfig};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const DEADLINE: Duration = Duration::from_secs(20);

/// A proxier whose loop runs in the background until [`Running::stop`].
struct Running {
    proxier: Arc<Proxier>,
    backend: FakeBackend,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Running {
    fn start(runner: RunnerConfig) -> Self {
        let (proxier, backend) = proxier_with(IpFamily::V4, runner);
        let proxier = Arc::new(proxier);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(Arc::clone(&proxier).run(async {
            let _ = stopped.await;
        }));
        Self {
            proxier,
            backend,
            stop,
            task,
        }
    }

    async fn stop(self) {
        self.stop.send(()).unwrap();
        within_deadline(self.task).await.unwrap();
    }
}

async fn within_deadline<T>(condition: impl Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, condition)
        .await
        .expect("condition not met within the deadline")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loop_syncs_fully_once_the_sources_are_synced_then_partially() {
    let running = Running::start(IMMEDIATE);
    apply(
        &*running.proxier,
        &[web(), db()],
        &[web_endpoints(&["10.244.1.2"])],
    );
    sources_synced(&*running.proxier);

    within_deadline(running.backend.wait_for_syncs(1)).await;
    let first = running.backend.take_single_request();
    assert!(first.full);
    assert_eq!(first.service_port_names(), ["ns1/db:pg", "ns1/web:http"]);

    apply(&*running.proxier, &[], &[db_endpoints()]);
    within_deadline(running.backend.wait_for_syncs(2)).await;
    let second = running.backend.take_single_request();
    assert!(!second.full);
    assert_eq!(second.changed_service_names(), ["ns1/db"]);
    assert!(running.proxier.status().last_successful_sync().is_some());

    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_sync_is_retried_as_a_full_sync() {
    let running = Running::start(IMMEDIATE);
    apply(
        &*running.proxier,
        &[web()],
        &[web_endpoints(&["10.244.1.2"])],
    );
    sources_synced(&*running.proxier);
    within_deadline(running.backend.wait_for_syncs(1)).await;
    running.backend.take_requests();

    running.backend.fail_next(1);
    apply(&*running.proxier, &[], &[web_endpoints(&["10.244.1.3"])]);
    within_deadline(running.backend.wait_for_syncs(3)).await;

    let [failed, retry] = <[_; 2]>::try_from(running.backend.take_requests()).unwrap();
    assert!(failed.failed && !failed.full);
    assert!(!retry.failed && retry.full);
    assert_eq!(running.proxier.status().totals().failed_syncs, 1);

    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_request_syncs_in_full_at_once_after_the_backend_distrusts_the_kernel() {
    let running = Running::start(IMMEDIATE);
    apply(
        &*running.proxier,
        &[web()],
        &[web_endpoints(&["10.244.1.2"])],
    );
    sources_synced(&*running.proxier);
    within_deadline(running.backend.wait_for_syncs(1)).await;
    let first = running.backend.take_single_request();
    assert!(first.full && !first.distrusted);

    let repair = running.proxier.repair_handle();
    assert_eq!(repair.family(), IpFamily::V4);
    repair.request();
    within_deadline(running.backend.wait_for_syncs(2)).await;
    let repaired = running.backend.take_single_request();
    assert!(repaired.full && repaired.distrusted, "{repaired:#?}");
    assert_eq!(repaired.service_port_names(), ["ns1/web:http"]);

    // One request, one repair: the next change is an ordinary partial sync.
    apply(&*running.proxier, &[], &[web_endpoints(&["10.244.1.3"])]);
    within_deadline(running.backend.wait_for_syncs(3)).await;
    let next = running.backend.take_single_request();
    assert!(!next.full && !next.distrusted, "{next:#?}");

    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_syncs_are_full() {
    let running = Running::start(RunnerConfig {
        max_interval: Duration::from_millis(20),
        ..IMMEDIATE
    });
    apply(
        &*running.proxier,
        &[web()],
        &[web_endpoints(&["10.244.1.2"])],
    );
    sources_synced(&*running.proxier);

    within_deadline(running.backend.wait_for_syncs(3)).await;

    let requests = running.backend.take_requests();
    assert!(requests.iter().all(|request| request.full), "{requests:#?}");
    running.stop().await;
}
