//! A Kubernetes API server for tests: plain HTTP on `127.0.0.1`, serving
//! exactly what kube-proxy's watches and event posting use, and refusing
//! (and recording) everything else.
//!
//! Served:
//! - list and watch of Services (`/api/v1/services`), EndpointSlices
//!   (`/apis/discovery.k8s.io/v1/endpointslices`) and Nodes
//!   (`/api/v1/nodes`), cluster-wide or (for namespaced kinds) in one
//!   namespace, with `labelSelector`, `fieldSelector` (`metadata.name`,
//!   `metadata.namespace`), `limit`/`continue` paging, `resourceVersion`
//!   and `resourceVersionMatch` (`resourceVersion=0` answers in one page,
//!   as the real server's watch cache does);
//! - watches (`watch=true`) resuming from a `resourceVersion`, with
//!   `allowWatchBookmarks`, `sendInitialEvents` and `timeoutSeconds`, as
//!   newline-delimited JSON events; a watch from before the kept history
//!   gets an `ERROR` event with a 410 `Expired` Status, as the real server
//!   sends it, so the client lists again;
//! - `POST /api/v1/namespaces/{ns}/events` and
//!   `POST /apis/events.k8s.io/v1/namespaces/{ns}/events`, validated as
//!   strictly as the real server validates them: an Event it would refuse
//!   gets its 422 `Invalid` Status (same causes, fields and message), an
//!   unknown field its `Warning` header (or 400 with
//!   `fieldValidation=Strict`), a wrong type 400. Every refusal is also
//!   recorded as a protocol error, so a test of the proxy fails when the
//!   proxy writes what a real server would refuse.
//!
//! - going away and coming back as a restarted kube-apiserver does
//!   ([`TestApiServer::stop`], [`TestApiServer::restart_as_new`]): refused
//!   connections, open watches cut without a clean end, then 403
//!   `Forbidden` with the real Status while the authorizer warms up, then
//!   the same objects from a new watch cache (resuming watches get 410).
//!
//! Tests change objects directly ([`TestApiServer::create`],
//! [`update`](TestApiServer::update), [`delete`](TestApiServer::delete));
//! every change bumps one global resourceVersion and wakes the watches.
//!
//! Limits: a continued list returns the objects now present after the
//! page's last key (a real server returns its snapshot), and a watch from a
//! resourceVersion newer than the server's waits instead of failing.

mod event_validation;
mod events;
mod field_error;
mod forbidden;
mod http;
mod meta_validation;
mod owner_validation;
mod selector;
mod store;
mod watching;

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

pub use forbidden::KUBE_PROXY_USER;
pub use store::{PostedEvent, RequestRecord, ServedKind, ServedResource, HISTORY_LIMIT};

use store::Store;

/// How often a watch that allows bookmarks gets one, unless changed with
/// [`TestApiServer::set_bookmark_interval`].
pub const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(1);

/// A running (or stopped) test API server. Dropping it stops it.
#[derive(Debug)]
pub struct TestApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    serving: Mutex<Option<JoinHandle<()>>>,
}

/// State shared by the server's connections and the test.
#[derive(Debug)]
pub(crate) struct Shared {
    store: Mutex<Store>,
    settings: Mutex<Settings>,
    /// Carries the current resourceVersion; watches wait on it.
    changes: watch::Sender<u64>,
}

/// Server behaviour a test may adjust.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) bookmark_interval: Duration,
    /// While set, every request is refused with 403 Forbidden for this
    /// user, as by a starting server whose authorizer is not ready.
    pub(crate) forbidden_user: Option<String>,
    /// Requests refused with 403 so far.
    pub(crate) forbidden_answers: usize,
}

impl TestApiServer {
    /// Starts a server on `127.0.0.1` with a port chosen by the system.
    pub async fn start() -> io::Result<Self> {
        Self::start_on(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await
    }

    /// Starts a server on `addr` (port 0: chosen by the system), for
    /// proxies in other namespaces that reach it over a network, such as
    /// the nodes of a [`Cluster`](crate::netns::Cluster) reaching
    /// [`FABRIC_IP`](crate::plan::FABRIC_IP). IPv4 only.
    pub async fn start_on(addr: SocketAddr) -> io::Result<Self> {
        let listener = bind(addr)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::default()),
            settings: Mutex::new(Settings {
                bookmark_interval: DEFAULT_BOOKMARK_INTERVAL,
                forbidden_user: None,
                forbidden_answers: 0,
            }),
            changes: watch::Sender::new(0),
        });
        let serving = tokio::spawn(serve(listener, Arc::clone(&shared)));
        tracing::debug!(%addr, "test API server started");
        Ok(Self {
            shared,
            addr,
            serving: Mutex::new(Some(serving)),
        })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server's URL, `http://ADDRESS:PORT` (`http://127.0.0.1:PORT`
    /// unless started with [`start_on`](Self::start_on)).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig (YAML) whose current context points at this server,
    /// without credentials.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: {url}
contexts:
- name: test
  context:
    cluster: test
    user: test
    namespace: default
current-context: test
users:
- name: test
  user: {{}}
",
            url = self.url()
        )
    }

    /// Writes [`kubeconfig`](Self::kubeconfig) to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> io::Result<()> {
        std::fs::write(path, self.kubeconfig())
    }

    /// Stops serving, as a killed kube-apiserver does: the port is closed
    /// (new connections are refused) and every open connection is closed
    /// where it stands, so an open watch ends without the last chunk of its
    /// body (the client sees an unexpected end of the stream, not a clean
    /// end). The objects and history are kept.
    pub async fn stop(&self) {
        let serving = self.lock_serving().take();
        if let Some(serving) = serving {
            serving.abort();
            let _ = serving.await;
            tracing::debug!(addr = %self.addr, "test API server stopped");
        }
    }

    /// Serves again on the same port, with the same objects and history.
    pub async fn restart(&self) -> io::Result<()> {
        self.stop().await;
        let listener = bind(self.addr)?;
        let serving = tokio::spawn(serve(listener, Arc::clone(&self.shared)));
        *self.lock_serving() = Some(serving);
        tracing::debug!(addr = %self.addr, "test API server restarted");
        Ok(())
    }

    /// Comes back as a restarted kube-apiserver does: with the same objects,
    /// but a new watch cache (a watch resuming from before the restart gets
    /// 410 Gone, so clients list again) and, for `forbidden_for`, an
    /// authorizer that is still warming up and refuses every request with
    /// 403 Forbidden for [`KUBE_PROXY_USER`]. Then it serves as before.
    pub async fn restart_as_new(&self, forbidden_for: Duration) -> io::Result<()> {
        self.expire_history();
        if !forbidden_for.is_zero() {
            self.forbid(KUBE_PROXY_USER);
        }
        self.restart().await?;
        if !forbidden_for.is_zero() {
            let shared = Arc::clone(&self.shared);
            tokio::spawn(async move {
                tokio::time::sleep(forbidden_for).await;
                shared.lock_settings().forbidden_user = None;
                tracing::debug!("test API server authorizes requests again");
            });
        }
        Ok(())
    }

    /// Refuses every request with 403 Forbidden, naming `user`, until
    /// [`allow`](Self::allow).
    pub fn forbid(&self, user: &str) {
        self.shared.lock_settings().forbidden_user = Some(user.to_owned());
    }

    /// Answers requests again after [`forbid`](Self::forbid).
    pub fn allow(&self) {
        self.shared.lock_settings().forbidden_user = None;
    }

    /// Whether requests are refused with 403 now.
    pub fn is_forbidding(&self) -> bool {
        self.shared.lock_settings().forbidden_user.is_some()
    }

    /// How many requests were refused with 403 Forbidden so far.
    pub fn forbidden_answers(&self) -> usize {
        self.shared.lock_settings().forbidden_answers
    }

    /// Sets how often watches that allow bookmarks get one (new watches
    /// only).
    pub fn set_bookmark_interval(&self, interval: Duration) {
        self.shared.lock_settings().bookmark_interval = interval;
    }

    /// Stores a new object and returns it as stored (resourceVersion, uid,
    /// creationTimestamp and, for namespaced kinds without one, namespace
    /// `default` filled in). Panics if it exists.
    #[track_caller]
    pub fn create<K: ServedResource>(&self, object: K) -> K {
        let value = to_value(&object);
        self.change(|store| store.create(K::KIND, value))
    }

    /// Replaces an existing object and returns it as stored. Panics if it
    /// does not exist.
    #[track_caller]
    pub fn update<K: ServedResource>(&self, object: K) -> K {
        let value = to_value(&object);
        self.change(|store| store.update(K::KIND, value))
    }

    /// Deletes an object (`namespace` is ignored for Nodes) and returns its
    /// last state. Panics if it does not exist.
    #[track_caller]
    pub fn delete<K: ServedResource>(&self, namespace: &str, name: &str) -> K {
        self.change(|store| store.delete(K::KIND, namespace, name))
    }

    /// Forgets the history of changes: open watches get a 410 Gone `ERROR`
    /// event and end, and any watch resuming from an older resourceVersion
    /// gets one too, so clients list again.
    pub fn expire_history(&self) {
        let version = {
            let mut store = self.shared.lock();
            store.expire_history();
            store.resource_version
        };
        self.shared.changes.send_replace(version);
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().resource_version
    }

    /// Every event posted so far.
    pub fn events(&self) -> Vec<PostedEvent> {
        self.shared.lock().events.clone()
    }

    /// Every request received so far, in order.
    pub fn request_log(&self) -> Vec<RequestRecord> {
        self.shared.lock().requests.clone()
    }

    /// Every request refused as not understood, with the reason.
    pub fn protocol_errors(&self) -> Vec<String> {
        self.shared.lock().protocol_errors.clone()
    }

    /// Fails the test, listing them, if any request was refused as not
    /// understood.
    #[track_caller]
    pub fn assert_no_protocol_errors(&self) {
        let errors = self.protocol_errors();
        assert!(
            errors.is_empty(),
            "the test API server refused {} request(s):\n  {}",
            errors.len(),
            errors.join("\n  ")
        );
    }

    #[track_caller]
    fn change<K: ServedResource>(&self, apply: impl FnOnce(&mut Store) -> Value) -> K {
        let (stored, version) = {
            let mut store = self.shared.lock();
            let stored = apply(&mut store);
            (stored, store.resource_version)
        };
        self.shared.changes.send_replace(version);
        match serde_json::from_value(stored) {
            Ok(object) => object,
            Err(error) => panic!(
                "test API server: a stored {} does not decode: {error}",
                K::KIND.kind()
            ),
        }
    }

    fn lock_serving(&self) -> MutexGuard<'_, Option<JoinHandle<()>>> {
        self.serving.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        if let Some(serving) = self.lock_serving().take() {
            serving.abort();
        }
    }
}

impl Shared {
    /// The store; a test that panicked while holding it leaves it usable.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn lock_settings(&self) -> MutexGuard<'_, Settings> {
        self.settings.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[track_caller]
fn to_value<K: ServedResource>(object: &K) -> Value {
    match serde_json::to_value(object) {
        Ok(value) => value,
        Err(error) => panic!(
            "test API server: a {} does not encode: {error}",
            K::KIND.kind()
        ),
    }
}

/// Binds with `SO_REUSEADDR`, so a restart can take the same port while
/// connections of the previous run linger in TIME_WAIT.
fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(64)
}

/// Accepts connections until aborted; aborting drops the connection set,
/// which cuts every connection.
async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(%error, "test API server failed to accept a connection");
                continue;
            }
        };
        let shared = Arc::clone(&shared);
        connections.spawn(async move {
            let service = service_fn(move |request| http::handle(Arc::clone(&shared), request));
            if let Err(error) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%error, "test API server connection ended with an error");
            }
        });
    }
}
