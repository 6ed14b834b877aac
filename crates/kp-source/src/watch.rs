//! Keeping the proxy in step with the manifest files: a file watcher with a
//! short debounce, plus a slow periodic re-read in case an event was missed.

use std::future::Future;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kp_model::ProxyEventHandler;
use notify::event::{AccessKind, AccessMode};
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};

use crate::error::SourceError;
use crate::source::{LoadReport, ManifestSource};

/// A burst of events never delays a re-read by more than this many debounce
/// periods.
const MAX_DEBOUNCE_PERIODS: u32 = 5;

/// The file watcher and what it watches.
struct Watch {
    /// Dropping it stops the watch.
    _watcher: RecommendedWatcher,
    /// The watched directory.
    directory: PathBuf,
    /// Device and inode of the watched directory when the watch started; a
    /// directory replaced since needs a new watch.
    identity: Option<(u64, u64)>,
}

/// A re-read waiting for a burst of events to end.
#[derive(Debug, Clone, Copy)]
struct Pending {
    first_event: Instant,
    deadline: Instant,
}

impl ManifestSource {
    /// Loads the manifests once (failing as [`load`](Self::load) does), then
    /// follows every change to them until `shutdown` completes: file events
    /// are coalesced for the debounce period, and everything is read again
    /// every resync period regardless.
    ///
    /// A directory is watched with its subdirectories; a single file is
    /// watched through its parent directory, so replacing it by a rename (as
    /// editors and mounted ConfigMaps do) is seen too. Errors of later loads
    /// are logged and the last delivered state is kept.
    pub async fn run(
        self,
        handler: Arc<dyn ProxyEventHandler>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), SourceError> {
        let (events_tx, mut events) = mpsc::unbounded_channel();
        let mut watch = start_watch(&self.path, events_tx.clone());
        let (mut source, first) = self.load_in_background(&handler).await?;
        first?;
        let period = source.resync_period;
        let mut resync = tokio::time::interval_at(Instant::now() + period, period);
        resync.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut pending: Option<Pending> = None;
        tokio::pin!(shutdown);
        loop {
            let deadline = pending.map(|pending| pending.deadline);
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                Some(()) = events.recv() => {
                    pending = Some(source.debounce_event(pending, Instant::now()));
                    continue;
                }
                () = sleep_until_some(deadline), if deadline.is_some() => {}
                _ = resync.tick() => {}
            }
            pending = None;
            if watch.as_ref().is_none_or(|watch| !watch.is_current()) {
                watch = start_watch(&source.path, events_tx.clone());
            }
            let (reloaded, result) = source.load_in_background(&handler).await?;
            source = reloaded;
            if let Err(error) = result {
                tracing::warn!(error = %error, "reading the manifests failed; keeping the last state");
            }
        }
    }

    /// Runs [`load`](Self::load) on a blocking thread, as it reads files.
    async fn load_in_background(
        mut self,
        handler: &Arc<dyn ProxyEventHandler>,
    ) -> Result<(Self, Result<LoadReport, SourceError>), SourceError> {
        let handler = Arc::clone(handler);
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let result = self.load(handler.as_ref());
            (self, result)
        })
        .await
        .map_err(|source| SourceError::Task { path, source })
    }

    /// When to re-read after an event at `now`: once no event came for the
    /// debounce period, but no later than a few periods after the first.
    fn debounce_event(&self, pending: Option<Pending>, now: Instant) -> Pending {
        let first_event = pending.map_or(now, |pending| pending.first_event);
        let latest = first_event + self.debounce * MAX_DEBOUNCE_PERIODS;
        Pending {
            first_event,
            deadline: (now + self.debounce).min(latest),
        }
    }
}

impl Watch {
    /// Whether the watched directory is still the one the watch started on.
    fn is_current(&self) -> bool {
        directory_identity(&self.directory) == self.identity
    }
}

/// Starts watching `path`: a directory with its subdirectories, a file
/// through its parent. A watch that cannot be set up is logged and left to
/// the periodic re-read, which also tries to set it up again.
fn start_watch(path: &Path, events: mpsc::UnboundedSender<()>) -> Option<Watch> {
    let is_directory = path.is_dir();
    let (directory, file_name) = if is_directory {
        (path.to_path_buf(), None)
    } else {
        let parent = path
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty());
        let directory = parent.unwrap_or(Path::new(".")).to_path_buf();
        (directory, path.file_name().map(ToOwned::to_owned))
    };
    let identity = directory_identity(&directory);
    let handler = move |event: notify::Result<Event>| match event {
        Ok(event) if is_relevant(&event, file_name.as_deref()) => {
            // The receiver is gone only once the source stopped.
            let _ = events.send(());
        }
        Ok(_) => {}
        Err(error) => {
            tracing::warn!(error = %error, "the manifest watcher reported an error; reading again");
            let _ = events.send(());
        }
    };
    let mode = if is_directory {
        RecursiveMode::Recursive
    } else {
        RecursiveMode::NonRecursive
    };
    let started = notify::recommended_watcher(handler).and_then(|mut watcher| {
        watcher.watch(&directory, mode)?;
        Ok(watcher)
    });
    match started {
        Ok(watcher) => Some(Watch {
            _watcher: watcher,
            directory,
            identity,
        }),
        Err(source) => {
            let error = SourceError::Watch {
                path: directory,
                source,
            };
            tracing::warn!(error = %error, "manifest changes are only seen by the periodic re-read");
            None
        }
    }
}

/// Whether a file event may change the manifests. Opening or reading a file
/// does not (and the source's own reads must not wake it up). When a single
/// file is watched through its directory, only events on that file, or on
/// the `..data` entries a mounted ConfigMap swaps, matter.
fn is_relevant(event: &Event, file_name: Option<&std::ffi::OsStr>) -> bool {
    match event.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => {}
        EventKind::Access(_) => return false,
        _ => {}
    }
    let Some(file_name) = file_name else {
        return true;
    };
    event.need_rescan()
        || event.paths.iter().any(|path| {
            path.file_name()
                .is_some_and(|name| name == file_name || name.to_string_lossy().starts_with(".."))
        })
}

fn directory_identity(directory: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(directory)
        .ok()
        .map(|metadata| (metadata.dev(), metadata.ino()))
}

/// Sleeps until `deadline`; forever without one.
async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use notify::event::{CreateKind, ModifyKind, RenameMode};

    use super::*;

    fn event(kind: EventKind, path: &str) -> Event {
        Event::new(kind).add_path(PathBuf::from(path))
    }

    #[test]
    fn reading_a_file_does_not_count_as_a_change() {
        let open = event(
            EventKind::Access(AccessKind::Open(AccessMode::Any)),
            "/m/a.yaml",
        );
        let written = event(
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
            "/m/a.yaml",
        );
        assert!(!is_relevant(&open, None));
        assert!(is_relevant(&written, None));
    }

    #[test]
    fn a_single_file_ignores_its_neighbours_but_not_a_configmap_swap() {
        let name = Some(std::ffi::OsStr::new("web.yaml"));
        let rename = EventKind::Modify(ModifyKind::Name(RenameMode::To));
        assert!(is_relevant(&event(rename, "/etc/m/web.yaml"), name));
        assert!(is_relevant(&event(rename, "/etc/m/..data"), name));
        let neighbour = EventKind::Create(CreateKind::File);
        assert!(!is_relevant(&event(neighbour, "/etc/m/other.yaml"), name));
    }

    #[test]
    fn a_burst_of_events_is_read_once_but_not_postponed_forever() {
        let source = ManifestSource::new("/m", "node-1").with_debounce(Duration::from_millis(100));
        let start = Instant::now();
        let first = source.debounce_event(None, start);
        assert_eq!(first.deadline, start + Duration::from_millis(100));
        let mut pending = first;
        for step in 1..=10 {
            pending =
                source.debounce_event(Some(pending), start + Duration::from_millis(90 * step));
        }
        assert_eq!(pending.deadline, start + Duration::from_millis(500));
    }
}
