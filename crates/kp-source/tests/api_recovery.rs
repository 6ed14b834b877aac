//! Stories of the API source through an outage as a real kube-apiserver
//! restart makes it: connections refused, watches cut, then 403 Forbidden
//! while its authorizer warms up, then the same objects from a new watch
//! cache. Every watch must be back within 2 s of the server serving again,
//! and the outage must be told in two lines. (This file holds one test: it
//! installs the process' log subscriber.)
//!
//! Address plan (kp-testkit `plan`): services in 10.96.0.0/16, this node's
//! pods in 10.244.1.0/24; the proxy runs on `node-1`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Recorder, NODE_NAME};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_model::ProxyEventHandler;
use kp_source::api::{client_from, is_retry_noise, watch_failures, ApiSource};
use kp_testkit::apiserver::TestApiServer;
use kp_testkit::{endpoint_slice, node, service};
use tokio::sync::oneshot;
use tracing_subscriber::filter::FilterFn;
use tracing_subscriber::layer::SubscriberExt;

/// How long the API server is away: long enough for kube-rs' default
/// backoff (0.8 s doubling up to 30 s) to wait several seconds.
const OUTAGE: Duration = Duration::from_secs(10);
/// How long the restarted server answers 403 while its authorizer warms up.
const FORBIDDEN_FOR: Duration = Duration::from_secs(2);
/// The bound on recovery once the server serves again.
const RECOVERY: Duration = Duration::from_secs(2);
/// How long a test waits before declaring a change lost.
const GIVE_UP: Duration = Duration::from_secs(30);

fn web_slice(addresses: &[&str]) -> EndpointSlice {
    endpoint_slice("demo", "web-abc", "web", |mut s| {
        s = s.port("http", 8080, "TCP");
        for address in addresses {
            s = s.endpoint(address, |e| e.node(NODE_NAME));
        }
        s
    })
}

/// A log written to memory, for counting lines.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Write for Log {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    /// The lines logged so far.
    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn clear(&self) {
        self.0.lock().unwrap().clear();
    }
}

/// A server holding web (Service and slice) and the node, and a source
/// following it that has listed everything.
async fn cluster() -> (
    TestApiServer,
    Arc<Recorder>,
    oneshot::Sender<()>,
    tempfile::NamedTempFile,
) {
    let server = TestApiServer::start().await.unwrap();
    server.create(service("demo", "web", |s| {
        s.cluster_ip("10.96.0.10").port("http", 80, "TCP")
    }));
    server.create(web_slice(&["10.244.1.11", "10.244.1.12"]));
    server.create(node(NODE_NAME, |n| n.internal_ip("192.168.99.2")));
    let kubeconfig = tempfile::NamedTempFile::new().unwrap();
    server.write_kubeconfig(kubeconfig.path()).unwrap();
    let client = client_from(Some(kubeconfig.path()), None, 5.0, 10)
        .await
        .unwrap();
    let recorder = Arc::new(Recorder::default());
    let handler: Arc<dyn ProxyEventHandler> = recorder.clone();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(ApiSource::new(client, NODE_NAME).run(handler, async {
        let _ = stopped.await;
    }));
    for line in common::synced_lines() {
        wait_for(&recorder, &line).await;
    }
    recorder.take_lines();
    (server, recorder, stop, kubeconfig)
}

async fn wait_for(recorder: &Arc<Recorder>, line: &str) -> Instant {
    let waiting = Arc::clone(recorder);
    let wanted = line.to_owned();
    let seen = tokio::task::spawn_blocking(move || waiting.wait_for_line(&wanted, GIVE_UP))
        .await
        .unwrap();
    seen.unwrap_or_else(|| panic!("{line:?} never came; lines: {:#?}", recorder.lines()))
}

/// Keeps the server away for [`OUTAGE`], checking all along that the source
/// delivers nothing meanwhile.
async fn outage(server: &TestApiServer, recorder: &Recorder) {
    server.stop().await;
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    while started.elapsed() < OUTAGE {
        tick.tick().await;
        assert_eq!(
            recorder.lines(),
            Vec::<String>::new(),
            "nothing changes while unreachable"
        );
    }
}

/// Brings the server back as a restarted kube-apiserver and returns when it
/// serves again (after its 403 phase).
async fn come_back(server: &TestApiServer) -> Instant {
    server.restart_as_new(FORBIDDEN_FOR).await.unwrap();
    let deadline = Instant::now() + GIVE_UP;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    while server.is_forbidding() {
        assert!(Instant::now() < deadline, "the 403 phase never ended");
        tick.tick().await;
    }
    Instant::now()
}

#[tokio::test]
async fn after_an_outage_and_a_403_phase_every_watch_is_back_within_two_seconds() {
    let log = Log::default();
    let writer = log.clone();
    // INFO and above, without kube-rs' per-request repeats of what the
    // source reports, as the binary logs.
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .finish()
        .with(FilterFn::new(|metadata| !is_retry_noise(metadata)));
    // Global: this file holds this one test, and a thread-local subscriber
    // misses events whose callsites other threads registered first.
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let (server, recorder, _stop, _kubeconfig) = cluster().await;
    let failures_before = watch_failures();
    log.clear();

    outage(&server, &recorder).await;
    // Changes made while it was away, one per watch.
    server.update(web_slice(&["10.244.1.11"]));
    server.create(service("demo", "shop", |s| s.cluster_ip("10.96.0.30")));
    server.update(node(NODE_NAME, |n| {
        n.internal_ip("192.168.99.2").label("zone", "b")
    }));
    let serving = come_back(&server).await;
    assert!(
        server.forbidden_answers() > 0,
        "the source met the 403 phase"
    );

    let mut caught_up = serving;
    for line in [
        "apply EndpointSlice demo/web-abc",
        "apply Service demo/shop",
        "apply Node node-1",
    ] {
        caught_up = caught_up.max(wait_for(&recorder, line).await);
    }
    let recovery = caught_up - serving;
    assert!(
        recovery <= RECOVERY,
        "every watch must be back within {RECOVERY:?} of the server serving again; took {recovery:?}"
    );
    assert!(
        server.forbidden_answers() > 0,
        "the source met the 403 phase"
    );
    let failures = watch_failures();
    assert!(
        failures.services > failures_before.services
            && failures.endpoint_slices > failures_before.endpoint_slices
            && failures.nodes > failures_before.nodes,
        "each watch's failures are counted: {failures_before:?} -> {failures:?}"
    );
    let lines = log.lines();
    assert_eq!(
        lines.len(),
        2,
        "one WARN for the outage, one INFO at its end: {lines:#?}"
    );
    assert!(
        lines[0].contains("WARN") && lines[0].contains("cannot be reached"),
        "{lines:#?}"
    );
    assert!(
        ["services", "endpointslices", "nodes"]
            .iter()
            .all(|watch| lines[0].contains(watch)),
        "the WARN names the watches: {lines:#?}"
    );
    assert!(
        lines[1].contains("INFO") && lines[1].contains("answers again"),
        "{lines:#?}"
    );
    server.assert_no_protocol_errors();
}
