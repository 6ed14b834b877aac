//! The `--config` file watch against real files and the real inotify
//! watcher: what ends it (new bytes written, a file renamed over it, its
//! removal, a ConfigMap `..data` swap, a write to the file a symlink leads
//! to) and what does not (a neighbouring file written, a ConfigMap
//! republished with the same bytes).
//!
//! The test polls the watch itself: once before changing anything, so the
//! watch has read the file and every change must reach it through inotify,
//! then until it ends, with a deadline. "Does not end" is proved without
//! sleeping: the watch reports each burst of events after which it found
//! the file unchanged, so the test runs it until the report naming the
//! unrelated file, sees it still pending, and then makes a real change that
//! must end it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::future::Future;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::mpsc;

use super::*;

/// How long a change may take to reach the watch.
const DEADLINE: Duration = Duration::from_secs(10);

const OLD: &str =
    "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\n";
const NEW: &str =
    "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\n";

/// The future of a watch on the configuration file, polled by the test.
type Watching = Pin<Box<dyn Future<Output = Result<ConfigChanged, ConfigWatchError>> + Send>>;

/// A watch armed and waiting for events.
struct Running {
    watching: Watching,
    /// The paths of each burst of events that left the file unchanged.
    unchanged: mpsc::UnboundedReceiver<Vec<PathBuf>>,
}

/// A ConfigMap volume laid out as kubelet's atomic writer does it:
/// `config.conf -> ..data/config.conf`, `..data -> ..<timestamp>`.
struct ConfigMapVolume {
    dir: PathBuf,
    version: u32,
}

/// Arms a watch on `path` and polls it once, so that it has read the file
/// and waits for events: every change the test makes after this must reach
/// it through the watcher.
async fn watch(path: &Path) -> Running {
    let watch = ConfigWatch::start(path).unwrap();
    let (report, unchanged) = mpsc::unbounded_channel();
    let mut running = Running {
        watching: Box::pin(watch.changed_with(move |paths| {
            let _ = report.send(paths.to_vec());
        })),
        unchanged,
    };
    running.assert_pending().await;
    running
}

/// Polls `future` once.
async fn poll_once<F: Future + Unpin>(future: &mut F) -> Option<F::Output> {
    tokio::select! {
        biased;
        output = future => Some(output),
        () = std::future::ready(()) => None,
    }
}

impl Running {
    /// Polls the watch once; it must still be waiting.
    async fn assert_pending(&mut self) {
        if let Some(result) = poll_once(&mut self.watching).await {
            panic!("the watch ended though the configuration did not change: {result:?}");
        }
    }

    /// Runs the watch until it has looked at the file after an event naming
    /// `name` and found it unchanged; the watch must still be waiting.
    async fn saw_unchanged(&mut self, name: &str) {
        let seen = async {
            loop {
                tokio::select! {
                    result = &mut self.watching => panic!(
                        "the watch ended on an event that did not change the configuration: {result:?}"
                    ),
                    Some(paths) = self.unchanged.recv() => {
                        if paths.iter().any(|p| p.file_name().is_some_and(|n| n == name)) {
                            return;
                        }
                    }
                }
            }
        };
        tokio::time::timeout(DEADLINE, seen)
            .await
            .unwrap_or_else(|_| panic!("the watch did not look at {name} within {DEADLINE:?}"));
        self.assert_pending().await;
    }

    /// The change that ended the watch, within the deadline.
    async fn ended(self) -> ConfigChanged {
        tokio::time::timeout(DEADLINE, self.watching)
            .await
            .unwrap_or_else(|_| panic!("the watch did not end within {DEADLINE:?}"))
            .unwrap()
    }
}

impl ConfigMapVolume {
    /// The volume in `dir`, holding `content` as version 1.
    fn new(dir: &Path, content: &str) -> Self {
        let volume = ConfigMapVolume {
            dir: dir.to_path_buf(),
            version: 1,
        };
        volume.write_version(content);
        symlink(volume.version_dir(), dir.join("..data")).unwrap();
        symlink("..data/config.conf", volume.key()).unwrap();
        volume
    }

    /// The path kube-proxy is given: `<dir>/config.conf`.
    fn key(&self) -> PathBuf {
        self.dir.join("config.conf")
    }

    /// Where the current version's file really is.
    fn current_file(&self) -> PathBuf {
        fs::canonicalize(self.dir.join(self.version_dir()).join("config.conf")).unwrap()
    }

    /// Publishes `content` as kubelet does: a new timestamped directory, a
    /// `..data_tmp` link to it renamed over `..data`, the old one removed.
    fn publish(&mut self, content: &str) {
        let old = self.version_dir();
        self.version += 1;
        self.write_version(content);
        symlink(self.version_dir(), self.dir.join("..data_tmp")).unwrap();
        fs::rename(self.dir.join("..data_tmp"), self.dir.join("..data")).unwrap();
        fs::remove_dir_all(self.dir.join(old)).unwrap();
    }

    fn version_dir(&self) -> String {
        format!("..2026_11_22_10_{:02}_00.{:09}", self.version, self.version)
    }

    fn write_version(&self, content: &str) {
        let dir = self.dir.join(self.version_dir());
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("config.conf"), content).unwrap();
    }
}

#[tokio::test]
async fn writing_new_bytes_ends_the_watch() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.conf");
    fs::write(&config, OLD).unwrap();
    let running = watch(&config).await;

    fs::write(&config, NEW).unwrap();

    let changed = running.ended().await;
    assert_eq!(changed.change, ConfigChange::Modified);
    assert_eq!(changed.path, config);
    assert_eq!(
        changed.resolved_now.as_ref(),
        Some(&changed.resolved_before)
    );
}

#[tokio::test]
async fn an_editor_renaming_a_new_file_over_it_ends_the_watch() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.conf");
    fs::write(&config, OLD).unwrap();
    let running = watch(&config).await;

    let temporary = dir.path().join(".config.conf.swp");
    fs::write(&temporary, NEW).unwrap();
    fs::rename(&temporary, &config).unwrap();

    assert_eq!(running.ended().await.change, ConfigChange::Modified);
}

#[tokio::test]
async fn removing_it_ends_the_watch() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.conf");
    fs::write(&config, OLD).unwrap();
    let running = watch(&config).await;

    fs::remove_file(&config).unwrap();

    let changed = running.ended().await;
    assert_eq!(changed.change, ConfigChange::Removed);
    assert_eq!(changed.resolved_now, None);
}

#[tokio::test]
async fn a_configmap_update_swapping_the_data_link_ends_the_watch() {
    let dir = tempfile::tempdir().unwrap();
    let mut volume = ConfigMapVolume::new(dir.path(), OLD);
    let first = volume.current_file();
    let running = watch(&volume.key()).await;

    volume.publish(NEW);

    let changed = running.ended().await;
    assert_eq!(changed.change, ConfigChange::Modified);
    assert_eq!(changed.path, volume.key());
    assert_eq!(changed.resolved_before, first);
    assert_eq!(changed.resolved_now, Some(volume.current_file()));
}

#[tokio::test]
async fn a_configmap_republished_with_the_same_bytes_keeps_the_watch_until_it_really_changes() {
    let dir = tempfile::tempdir().unwrap();
    let mut volume = ConfigMapVolume::new(dir.path(), OLD);
    let mut running = watch(&volume.key()).await;

    // What kubelet does when another key of the same ConfigMap changes.
    volume.publish(OLD);
    running.saw_unchanged("..data").await;

    volume.publish(NEW);
    let changed = running.ended().await;
    assert_eq!(changed.change, ConfigChange::Modified);
    assert_eq!(changed.resolved_now, Some(volume.current_file()));
    assert!(volume.current_file().to_string_lossy().contains("10_03_00"));
}

#[tokio::test]
async fn writing_a_neighbouring_file_keeps_the_watch_until_the_file_itself_changes() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.conf");
    fs::write(&config, OLD).unwrap();
    let mut running = watch(&config).await;

    fs::write(dir.path().join("kubeconfig.conf"), "apiVersion: v1\n").unwrap();
    running.saw_unchanged("kubeconfig.conf").await;

    fs::write(&config, NEW).unwrap();
    assert_eq!(running.ended().await.change, ConfigChange::Modified);
}

#[tokio::test]
async fn a_write_to_the_file_a_symlink_leads_to_in_another_directory_ends_the_watch() {
    let dir = tempfile::tempdir().unwrap();
    let (real_dir, link_dir) = (dir.path().join("real"), dir.path().join("etc"));
    fs::create_dir(&real_dir).unwrap();
    fs::create_dir(&link_dir).unwrap();
    let real = real_dir.join("kube-proxy.yaml");
    fs::write(&real, OLD).unwrap();
    let config = link_dir.join("config.conf");
    symlink(&real, &config).unwrap();
    let running = watch(&config).await;

    fs::write(&real, NEW).unwrap();

    let changed = running.ended().await;
    assert_eq!(changed.change, ConfigChange::Modified);
    assert_eq!(changed.resolved_before, fs::canonicalize(&real).unwrap());
}

#[tokio::test]
async fn the_reported_change_reads_as_the_exit_message() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.conf");
    fs::write(&config, OLD).unwrap();
    let mut watching = Box::pin(ConfigWatch::start(&config).unwrap().changed());
    assert!(poll_once(&mut watching).await.is_none());

    fs::write(&config, NEW).unwrap();

    let changed = tokio::time::timeout(DEADLINE, watching)
        .await
        .expect("the watch ends within the deadline")
        .unwrap();
    assert_eq!(
        changed.to_string(),
        format!(
            "{CONFIG_CHANGED_MESSAGE}: {} was modified",
            config.display()
        )
    );
}

#[tokio::test]
async fn the_exit_message_says_where_a_configmap_now_leads() {
    let dir = tempfile::tempdir().unwrap();
    let mut volume = ConfigMapVolume::new(dir.path(), OLD);
    let first = volume.current_file();
    let running = watch(&volume.key()).await;

    volume.publish(NEW);

    let message = running.ended().await.to_string();
    assert!(
        message.ends_with(&format!(
            "was modified (it now leads to {} instead of {})",
            volume.current_file().display(),
            first.display()
        )),
        "{message}"
    );
}

#[tokio::test]
async fn a_missing_file_cannot_be_watched() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("config.conf");

    let error = ConfigWatch::start(&missing).unwrap_err();

    assert!(matches!(error, ConfigWatchError::Read { .. }), "{error:?}");
    assert!(error.to_string().contains("config.conf"), "{error}");
}
