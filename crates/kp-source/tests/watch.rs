//! Stories of a running source following its files through the real file
//! watcher. Each change must reach the handler within a second; the tests
//! wait on the handler with a generous deadline and then check how long the
//! change took.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{replace_by_rename, write, Recorder, NODE_NAME};
use kp_model::ProxyEventHandler;
use kp_source::{ManifestSource, SourceError};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long a change may take to reach the handler.
const PROMPTLY: Duration = Duration::from_secs(1);
/// How long a test waits before declaring a change lost.
const GIVE_UP: Duration = Duration::from_secs(5);

fn web(port: u16) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{namespace: demo, name: web}}\nspec: {{clusterIP: 10.96.0.10, ports: [{{port: {port}}}]}}\n"
    )
}

const WEB_SLICE: &str = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {namespace: demo, name: web-abc, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nendpoints: [{addresses: [10.244.1.11]}]\n";

const SHOP: &str = "apiVersion: v1\nkind: Service\nmetadata: {namespace: demo, name: shop}\nspec: {clusterIP: 10.96.0.20, ports: [{port: 443}]}\n";

/// A source running in the background until the sender is dropped or used.
struct Running {
    recorder: Arc<Recorder>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), SourceError>>,
}

fn start(path: &Path) -> Running {
    let recorder = Arc::new(Recorder::default());
    let handler: Arc<dyn ProxyEventHandler> = recorder.clone();
    let (stop, stopped) = oneshot::channel();
    let source = ManifestSource::new(path, NODE_NAME);
    let task = tokio::spawn(source.run(handler, async {
        let _ = stopped.await;
    }));
    recorder
        .wait_for_line("synced Node", GIVE_UP)
        .expect("the first load");
    Running {
        recorder,
        stop,
        task,
    }
}

impl Running {
    /// Runs `change`, waits for `line` and checks that it came promptly.
    #[track_caller]
    fn expect_after(&self, line: &str, change: impl FnOnce()) {
        let changed_at = Instant::now();
        change();
        let seen_at = self
            .recorder
            .wait_for_line(line, GIVE_UP)
            .unwrap_or_else(|| panic!("{line:?} never came; saw {:?}", self.recorder.lines()));
        let took = seen_at - changed_at;
        assert!(took < PROMPTLY, "{line:?} took {took:?}");
    }

    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.task.await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_additions_and_removals_reach_the_handler_promptly() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "web.yaml",
        &format!("{}---\n{WEB_SLICE}", web(80)),
    );
    let running = start(dir.path());
    running.recorder.take_lines();

    running.expect_after("apply Service demo/web", || {
        write(
            dir.path(),
            "web.yaml",
            &format!("{}---\n{WEB_SLICE}", web(81)),
        );
    });
    running.expect_after("apply Service demo/shop", || {
        write(dir.path(), "more/shop.yaml", SHOP);
    });
    running.expect_after("delete Service demo/shop", || {
        std::fs::remove_file(dir.path().join("more/shop.yaml")).unwrap();
    });

    // The unchanged EndpointSlice was never sent again.
    assert_eq!(
        running.recorder.lines(),
        [
            "apply Service demo/web",
            "apply Service demo/shop",
            "delete Service demo/shop"
        ]
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_file_replaced_by_a_rename_is_followed() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "web.yaml", &web(80));
    write(dir.path(), "shop.yaml", SHOP);
    let running = start(&dir.path().join("web.yaml"));

    running.expect_after("apply Service demo/web", || {
        running.recorder.take_lines();
        replace_by_rename(dir.path(), "web.yaml", &web(8080));
    });
    running.expect_after("delete Service demo/web", || {
        std::fs::remove_file(dir.path().join("web.yaml")).unwrap();
    });

    // shop.yaml sits next to the file but is not part of the manifests.
    let lines = running.recorder.lines();
    assert!(!lines.iter().any(|line| line.contains("shop")), "{lines:?}");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_update_swapping_its_data_link_is_followed() {
    // A mounted ConfigMap: web.yaml -> ..data/web.yaml, ..data -> ..v1; an
    // update writes ..v2 and renames a new link over ..data.
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "..v1/web.yaml", &web(80));
    symlink("..v1", dir.path().join("..data")).unwrap();
    symlink("..data/web.yaml", dir.path().join("web.yaml")).unwrap();
    let running = start(dir.path());
    running.recorder.take_lines();

    running.expect_after("apply Service demo/web", || {
        write(dir.path(), "..v2/web.yaml", &web(8080));
        symlink("..v2", dir.path().join("..data_tmp")).unwrap();
        std::fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data")).unwrap();
    });

    let recorded = running.recorder.recorded();
    assert_eq!(
        recorded.lines,
        ["apply Service demo/web"],
        "hidden ..v1/..v2 copies are not read"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_periodic_reread_catches_what_no_file_event_shows() {
    // The manifest is a link to a file elsewhere: editing that file makes no
    // event in the watched directory, so only the periodic re-read sees it.
    let elsewhere = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    write(elsewhere.path(), "web.yaml", &web(80));
    symlink(
        elsewhere.path().join("web.yaml"),
        dir.path().join("web.yaml"),
    )
    .unwrap();
    let recorder = Arc::new(Recorder::default());
    let handler: Arc<dyn ProxyEventHandler> = recorder.clone();
    let source = ManifestSource::new(dir.path().join("web.yaml"), NODE_NAME)
        .with_resync_period(Duration::from_millis(200));
    let task = tokio::spawn(source.run(handler, std::future::pending()));
    recorder
        .wait_for_line("synced Node", GIVE_UP)
        .expect("the first load");
    recorder.take_lines();

    write(elsewhere.path(), "web.yaml", &web(8080));

    assert!(recorder
        .wait_for_line("apply Service demo/web", GIVE_UP)
        .is_some());
    task.abort();
}

#[tokio::test]
async fn a_missing_directory_fails_at_start() {
    let recorder: Arc<dyn ProxyEventHandler> = Arc::new(Recorder::default());
    let source = ManifestSource::new("/nonexistent/manifests", NODE_NAME);

    let result = source.run(recorder, std::future::pending()).await;

    assert!(
        matches!(result, Err(SourceError::PathNotFound { .. })),
        "{result:?}"
    );
}
