//! The relay's TCP worker threads: each an OS thread running a
//! current-thread tokio runtime of its own, with its own epoll instance
//! and timers.
//!
//! Every TCP service port has one listening socket per worker, all bound
//! to the same port with `SO_REUSEPORT`; the kernel spreads new
//! connections over them by a hash of the addresses. A worker accepts on
//! its own socket and serves what it accepted on its own thread, to the
//! end: no connection is ever handed to another thread, so accepting one
//! costs no cross-thread wake-up (on a shared multi-thread runtime, the
//! task of an accepted connection was mostly woken on the other worker: a
//! futex pair and an eventfd write per connection).
//!
//! The threads are started by the relay when it first opens a TCP
//! listener, from the thread that calls [`Relay::apply`]: a thread is
//! born in its creator's network namespace, so the workers dial endpoints
//! from the namespace the listeners were opened in.
//!
//! [`Relay::apply`]: crate::Relay::apply

use std::io;

use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;

/// The running worker threads. Dropping this stops them: each drops its
/// runtime, and with it the listeners and connections it was serving.
#[derive(Debug)]
pub(crate) struct Workers {
    workers: Vec<Worker>,
}

/// One worker thread.
#[derive(Debug)]
struct Worker {
    handle: Handle,
    /// Dropped to stop the thread.
    _stop: oneshot::Sender<()>,
}

impl Workers {
    /// Starts `count` worker threads (at least one), named
    /// `kp-relay-<family>-<index>`.
    pub(crate) fn start(count: usize, family: &str) -> io::Result<Self> {
        let mut workers = Vec::with_capacity(count.max(1));
        for index in 0..count.max(1) {
            // Each runtime is built, run and dropped on its own thread:
            // dropping a runtime panics in an async context, which the
            // caller may be in, and a thread that fails to start would
            // drop it there.
            let (started, handle) = std::sync::mpsc::sync_channel(1);
            let (stop, stopped) = oneshot::channel::<()>();
            std::thread::Builder::new()
                .name(format!("kp-relay-{family}-{index}"))
                .spawn(move || {
                    let runtime = match Builder::new_current_thread().enable_all().build() {
                        Ok(runtime) => runtime,
                        Err(error) => {
                            let _ = started.send(Err(error));
                            return;
                        }
                    };
                    if started.send(Ok(runtime.handle().clone())).is_err() {
                        return;
                    }
                    // Ends when the sender is dropped.
                    let _ = runtime.block_on(stopped);
                })?;
            let handle = handle
                .recv()
                .map_err(|_| io::Error::other("a relay worker thread ended while starting"))??;
            workers.push(Worker {
                handle,
                _stop: stop,
            });
        }
        Ok(Self { workers })
    }

    /// The runtimes of the workers, one per thread.
    pub(crate) fn handles(&self) -> impl Iterator<Item = &Handle> {
        self.workers.iter().map(|worker| &worker.handle)
    }
}

/// The number of workers by default: one per CPU the process may run on.
pub(crate) fn default_count() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use super::Workers;

    #[tokio::test]
    async fn each_worker_runs_its_tasks_on_its_own_thread() {
        let workers = Workers::start(2, "test").unwrap();

        let mut names = Vec::new();
        for handle in workers.handles() {
            // A task spawned by a task stays on that worker's thread.
            let name = handle
                .spawn(async {
                    tokio::spawn(async { std::thread::current().name().map(str::to_owned) }).await
                })
                .await
                .unwrap()
                .unwrap();
            names.push(name);
        }

        assert_eq!(
            names,
            [
                Some("kp-relay-test-0".to_owned()),
                Some("kp-relay-test-1".to_owned())
            ]
        );
    }

    #[tokio::test]
    async fn dropping_the_workers_stops_their_runtimes() {
        let workers = Workers::start(1, "test").unwrap();
        let handle = workers.handles().next().unwrap().clone();
        let running = handle.spawn(std::future::pending::<()>());

        drop(workers);

        let ended = tokio::time::timeout(Duration::from_secs(5), running).await;
        assert!(
            matches!(&ended, Ok(Err(error)) if error.is_cancelled()),
            "the worker's tasks are cancelled: {ended:?}"
        );
    }
}
