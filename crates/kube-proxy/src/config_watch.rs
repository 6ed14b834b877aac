//! Ending the run when the `--config` file changes, so that the DaemonSet
//! restarts the proxy with the new configuration. Like upstream, the proxy
//! does not reload in place: it exits with an error and starts afresh.
//!
//! Upstream watches the file itself. A ConfigMap volume never writes that
//! file: kubelet projects each key as `config.conf -> ..data/config.conf`,
//! with `..data -> ..2026_11_22_10_00_00.123456789`, and publishes a new
//! version by filling a new timestamped directory and renaming a new
//! `..data_tmp` link over `..data`. An inotify watch on the file follows the
//! links to the old version's inode, which only ever sees its own removal,
//! so upstream misses the update and every later one (kubernetes issue
//! 132877).
//!
//! This watch follows the directory the path is in, plus the directory of
//! the file it resolves to when a symlink leads elsewhere. On any event there
//! it reads the path afresh, following links, and compares the bytes with
//! those the file held when the watch started. So writes, renames over the
//! file, removals and `..data` swaps all end the watch, while events on
//! neighbouring files do not, nor do replacements with identical bytes
//! (kubelet re-projecting a ConfigMap after another key changed, `touch`),
//! which upstream would restart for.

use std::collections::BTreeSet;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use notify::event::{AccessKind, AccessMode};
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// What the proxy logs, with the file's path, before it exits because its
/// configuration file changed.
pub const CONFIG_CHANGED_MESSAGE: &str =
    "Configuration file changed; exiting so the new configuration takes effect";

/// The configuration file changed since the watch started. Its `Display`
/// is [`CONFIG_CHANGED_MESSAGE`] followed by the path, the kind of change
/// and, when a symlink now leads elsewhere, where; so it can be returned as
/// the error that ends the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigChanged {
    /// The path as given to `--config`.
    pub path: PathBuf,
    /// What happened to it.
    pub change: ConfigChange,
    /// The file the path led to, following symlinks, when the watch started.
    pub resolved_before: PathBuf,
    /// The file it leads to now, if it still leads to one.
    pub resolved_now: Option<PathBuf>,
}

/// How the configuration file changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigChange {
    /// The path now holds different bytes (written in place, renamed over,
    /// or a symlink on the way swapped).
    Modified,
    /// The path no longer exists, or a symlink on the way dangles.
    Removed,
    /// The path exists but cannot be read.
    Unreadable(io::ErrorKind),
}

/// Watching the configuration file could not start or go on.
#[derive(Debug, thiserror::Error)]
pub enum ConfigWatchError {
    /// The file could not be read when the watch started.
    #[error("reading the configuration file {} to watch it for changes failed", path.display())]
    Read {
        /// The `--config` path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A directory could not be watched (inotify watches exhausted, no
    /// permission).
    #[error("watching {} for changes of the configuration file failed (a full inotify table shows in fs.inotify.max_user_watches)", directory.display())]
    Watch {
        /// The directory.
        directory: PathBuf,
        /// The cause.
        #[source]
        source: notify::Error,
    },
    /// The file watcher stopped delivering events.
    #[error("the watcher of the configuration file {} stopped", path.display())]
    Stopped {
        /// The `--config` path.
        path: PathBuf,
    },
}

/// A watch on the configuration file, armed by [`ConfigWatch::start`] and
/// waited on with [`ConfigWatch::changed`]. Arm it right after the file was
/// loaded: what the file holds at that moment is what later reads are
/// compared with.
pub struct ConfigWatch {
    /// The path as given.
    path: PathBuf,
    /// What the file held when the watch started.
    baseline: Snapshot,
    /// Dropping it stops the watch.
    watcher: RecommendedWatcher,
    /// The directories watched now.
    watched: BTreeSet<PathBuf>,
    events: mpsc::UnboundedReceiver<notify::Result<Event>>,
}

/// The file a path leads to and its bytes.
struct Snapshot {
    resolved: PathBuf,
    content: Vec<u8>,
}

impl ConfigWatch {
    /// Starts watching the file at `path`: a change from this moment on ends
    /// [`changed`](Self::changed). Fails when the file cannot be read or its
    /// directory cannot be watched.
    pub fn start(path: &Path) -> Result<Self, ConfigWatchError> {
        let (sender, events) = mpsc::unbounded_channel();
        let directory = containing_directory(path);
        let watch_error = |directory: &Path| {
            let directory = directory.to_path_buf();
            move |source| ConfigWatchError::Watch { directory, source }
        };
        let mut watcher = notify::recommended_watcher(move |event| {
            // Fails only once the watch was dropped, when nobody listens.
            let _ = sender.send(event);
        })
        .map_err(watch_error(&directory))?;
        // Watch before reading, so that no change falls between the two.
        watcher
            .watch(&directory, RecursiveMode::NonRecursive)
            .map_err(watch_error(&directory))?;
        let baseline = Snapshot::take(path).map_err(|source| ConfigWatchError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut watch = ConfigWatch {
            path: path.to_path_buf(),
            watched: BTreeSet::from([directory]),
            baseline,
            watcher,
            events,
        };
        let resolved = watch.baseline.resolved.clone();
        watch.follow(&resolved)?;
        Ok(watch)
    }

    /// Completes when the file's bytes differ from those it held when the
    /// watch started, or when it can no longer be read.
    pub async fn changed(self) -> Result<ConfigChanged, ConfigWatchError> {
        self.changed_with(|paths| {
            tracing::debug!(
                ?paths,
                "Files next to the configuration file changed; the configuration did not"
            );
        })
        .await
    }

    /// [`changed`](Self::changed), calling `unchanged` with the paths of
    /// every burst of events after which the file was found as it was.
    pub async fn changed_with(
        mut self,
        mut unchanged: impl FnMut(&[PathBuf]),
    ) -> Result<ConfigChanged, ConfigWatchError> {
        // The first look, before any event, covers a change that came
        // between reading the file and the last watch being in place.
        let mut burst: Option<Vec<PathBuf>> = None;
        loop {
            if let Some(changed) = self.compare() {
                return Ok(changed);
            }
            // A symlink may now lead elsewhere with the same bytes.
            if let Ok(resolved) = fs::canonicalize(&self.path) {
                if let Err(error) = self.follow(&resolved) {
                    tracing::warn!(%error, "Changes of the configuration file's target may go unnoticed");
                }
            }
            if let Some(paths) = burst.take() {
                unchanged(&paths);
            }
            burst = Some(self.next_burst().await?);
        }
    }

    /// The change since the watch started, if any.
    fn compare(&self) -> Option<ConfigChanged> {
        let (change, resolved_now) = match Snapshot::take(&self.path) {
            Ok(now) if now.content == self.baseline.content => return None,
            Ok(now) => (ConfigChange::Modified, Some(now.resolved)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => (ConfigChange::Removed, None),
            Err(error) => (
                ConfigChange::Unreadable(error.kind()),
                fs::canonicalize(&self.path).ok(),
            ),
        };
        Some(ConfigChanged {
            path: self.path.clone(),
            change,
            resolved_before: self.baseline.resolved.clone(),
            resolved_now,
        })
    }

    /// Watches the directory of the path and that of the file it resolves
    /// to, and stops watching directories no longer on the way.
    fn follow(&mut self, resolved: &Path) -> Result<(), ConfigWatchError> {
        let mut wanted = BTreeSet::from([containing_directory(&self.path)]);
        wanted.extend(resolved.parent().map(Path::to_path_buf));
        for directory in wanted.difference(&self.watched) {
            self.watcher
                .watch(directory, RecursiveMode::NonRecursive)
                .map_err(|source| ConfigWatchError::Watch {
                    directory: directory.clone(),
                    source,
                })?;
        }
        for directory in self.watched.difference(&wanted) {
            // The kernel drops the watch of a removed directory (an old
            // ConfigMap version) by itself, so failing here is expected.
            let _ = self.watcher.unwatch(directory);
        }
        self.watched = wanted;
        Ok(())
    }

    /// Waits for events that may change the file, then takes every event
    /// already queued with them; returns the paths they name.
    async fn next_burst(&mut self) -> Result<Vec<PathBuf>, ConfigWatchError> {
        let mut paths = Vec::new();
        let mut relevant = false;
        while !relevant {
            let first = self
                .events
                .recv()
                .await
                .ok_or_else(|| ConfigWatchError::Stopped {
                    path: self.path.clone(),
                })?;
            relevant = take_event(first, &mut paths);
            while let Ok(next) = self.events.try_recv() {
                relevant |= take_event(next, &mut paths);
            }
        }
        Ok(paths)
    }
}

impl Snapshot {
    /// Resolves `path` through its symlinks and reads the file it leads to.
    fn take(path: &Path) -> io::Result<Self> {
        let resolved = fs::canonicalize(path)?;
        let content = fs::read(&resolved)?;
        Ok(Snapshot { resolved, content })
    }
}

impl fmt::Display for ConfigChanged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{CONFIG_CHANGED_MESSAGE}: {} {}",
            self.path.display(),
            self.change
        )?;
        match &self.resolved_now {
            Some(now) if *now != self.resolved_before => write!(
                f,
                " (it now leads to {} instead of {})",
                now.display(),
                self.resolved_before.display()
            ),
            _ => Ok(()),
        }
    }
}

impl std::error::Error for ConfigChanged {}

impl fmt::Display for ConfigChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigChange::Modified => f.write_str("was modified"),
            ConfigChange::Removed => f.write_str("was removed"),
            ConfigChange::Unreadable(kind) => write!(f, "cannot be read ({kind})"),
        }
    }
}

impl fmt::Debug for ConfigWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfigWatch")
            .field("path", &self.path)
            .field("resolved", &self.baseline.resolved)
            .field("watched", &self.watched)
            .finish_non_exhaustive()
    }
}

/// Adds the paths of one watcher report to `paths`; returns whether it may
/// mean the file changed. Opening and reading files does not (the watch's
/// own reads must not wake it up); a watcher error might (events may have
/// been lost), so it is logged and the file looked at.
fn take_event(event: notify::Result<Event>, paths: &mut Vec<PathBuf>) -> bool {
    match event {
        Ok(event) => {
            let relevant = match event.kind {
                EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
                EventKind::Access(_) => false,
                _ => true,
            };
            if relevant {
                paths.extend(event.paths);
            }
            relevant
        }
        Err(error) => {
            tracing::warn!(%error, "The configuration file watcher reported an error; checking the file");
            true
        }
    }
}

/// The directory holding `path` (`.` for a bare file name).
fn containing_directory(path: &Path) -> PathBuf {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
#[path = "config_watch_tests.rs"]
mod tests;
