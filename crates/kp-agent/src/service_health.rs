//! Health-check node ports: for every `externalTrafficPolicy: Local`
//! LoadBalancer Service with a `healthCheckNodePort`, an HTTP server on that
//! port tells the cloud load balancer whether this node has local endpoints
//! (200) or not (503), with upstream's JSON and headers.
//!
//! The servers follow the syncs: an observer on each family's proxier opens
//! and closes them as Services change. A port that cannot be bound (taken by
//! another process) is logged with its Service and tried again after the
//! next sync; it never stops the proxy. Servers listen where NodePorts
//! answer (`nodePortAddresses`), as upstream: on every address unless the
//! configuration narrows them ([`ServiceHealthServers::listening_on`]).
//! While the selection matches no address yet, the port is not opened but
//! tried again after the next sync: with `primary` (nftables mode's
//! default) the node's address is only known once its Node object arrived,
//! which may be after the first sync, whereas upstream reads the Node
//! before its proxier starts. The Node's arrival forces a full sync.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener as StdListener};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use kp_model::{IpFamily, NamespacedName, NodeInfo};
use kp_sync::{SyncObserver, SyncOutcome, SyncRequest};
use tokio::runtime::Handle;
use tokio::sync::watch;

use crate::connections::Connections;
use crate::health::ProxyHealth;
use crate::http::{serve_sharing, ConnectionLimits, Handler, Response};

/// What the health-check node ports allow their clients, all ports
/// together.
const LIMITS: ConnectionLimits = ConnectionLimits::DEFAULT;

/// The health-check servers of one proxy process.
#[derive(Clone)]
pub struct ServiceHealthServers {
    inner: Arc<Inner>,
}

/// The addresses of `family` on which health-check servers listen for the
/// node as a sync saw it; `None` means every address.
pub type ListenAddresses = Arc<dyn Fn(IpFamily, &NodeInfo) -> Option<Vec<IpAddr>> + Send + Sync>;

struct Inner {
    runtime: Handle,
    health: OnceLock<ProxyHealth>,
    listen: ListenAddresses,
    /// One connection bound for every health-check port and address: a
    /// node may serve hundreds of ports, and a flood of all of them holds
    /// no more descriptors than a flood of one.
    connections: Arc<Connections>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Per family: health-check port → Service and its local ready
    /// endpoints, as the family's last sync saw them.
    wanted: HashMap<IpFamily, BTreeMap<u16, (NamespacedName, usize)>>,
    /// Per family: the addresses to listen on (`None`: every address), as
    /// of the family's last sync.
    listen: HashMap<IpFamily, Option<Vec<IpAddr>>>,
    /// Ports with a running server, and how to stop it.
    serving: BTreeMap<u16, watch::Sender<bool>>,
}

impl ServiceHealthServers {
    /// Servers spawned on `runtime`, listening on every address.
    pub fn new(runtime: Handle) -> Self {
        Self::listening_on(runtime, Arc::new(|_, _| None))
    }

    /// Servers that listen on the addresses `listen` gives for each family
    /// (call before the first sync). Servers already listening keep their
    /// addresses, as upstream resolves them once.
    pub fn listening_on(runtime: Handle, listen: ListenAddresses) -> Self {
        Self {
            inner: Arc::new(Inner {
                runtime,
                health: OnceLock::new(),
                listen,
                connections: Connections::new(LIMITS.max_connections),
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// Reports `health` as `serviceProxyHealthy` (healthy until set: the
    /// proxiers this judges are built with these servers as observers).
    pub fn set_proxy_health(&self, health: ProxyHealth) {
        // Set once at start; a second call keeps the first.
        let _ = self.inner.health.set(health);
    }

    /// The ports with a running server.
    pub fn serving(&self) -> Vec<u16> {
        self.inner.lock().serving.keys().copied().collect()
    }

    /// The answer of the server on `port` now, as `(status, body)`.
    pub fn answer(&self, port: u16) -> Response {
        let (name, local) = {
            let state = self.inner.lock();
            let mut found = None;
            for ports in state.wanted.values() {
                if let Some((name, count)) = ports.get(&port) {
                    let total = found.as_ref().map_or(0, |(_, c)| *c) + count;
                    found = Some((name.clone(), total));
                }
            }
            match found {
                Some(found) => found,
                None => return Response::not_found(),
            }
        };
        let healthy = self
            .inner
            .health
            .get()
            .is_none_or(|health| health.check().healthy);
        let body = serde_json::json!({
            "service": { "namespace": &*name.namespace, "name": &*name.name },
            "localEndpoints": local,
            "serviceProxyHealthy": healthy,
        });
        let code = if local > 0 && healthy { 200 } else { 503 };
        Response::new(code, "application/json", body.to_string())
            .with_header("X-Content-Type-Options", "nosniff")
            .with_header("X-Load-Balancing-Endpoint-Weight", local.to_string())
    }

    /// Stops every server.
    pub fn stop_all(&self) {
        let mut state = self.inner.lock();
        for (_, stop) in std::mem::take(&mut state.serving) {
            // A server that already ended has dropped its receiver.
            let _ = stop.send(true);
        }
    }

    fn reconcile(&self) {
        let mut state = self.inner.lock();
        let mut wanted: BTreeMap<u16, NamespacedName> = BTreeMap::new();
        for ports in state.wanted.values() {
            for (port, (name, _)) in ports {
                wanted.insert(*port, name.clone());
            }
        }
        state.serving.retain(|port, stop| {
            let keep = wanted.contains_key(port);
            if !keep {
                tracing::info!(v = 2, port, "Closing health-check node port");
                let _ = stop.send(true);
            }
            keep
        });
        for (port, service) in wanted {
            if state.serving.contains_key(&port) {
                continue;
            }
            let addresses = listen_addresses(&state, port);
            if addresses.as_ref().is_some_and(BTreeSet::is_empty) {
                tracing::warn!(
                    port,
                    service = %service,
                    "No node address matches nodePortAddresses yet; opening the health-check node port after the next sync"
                );
                continue;
            }
            match self.start(port, addresses.as_ref()) {
                Ok(stop) => {
                    tracing::info!(v = 2, port, service = %service, "Serving health-check node port");
                    state.serving.insert(port, stop);
                }
                Err(error) => tracing::warn!(
                    port,
                    service = %service,
                    %error,
                    "Cannot listen on health-check node port; retrying after the next sync"
                ),
            }
        }
    }

    /// Serves `port` on `addresses` (every address when `None`); binds all
    /// of them before serving any, so a taken port opens nothing.
    fn start(
        &self,
        port: u16,
        addresses: Option<&BTreeSet<IpAddr>>,
    ) -> std::io::Result<watch::Sender<bool>> {
        let listeners = match addresses {
            None => vec![bind_all(port)?],
            Some(addresses) => addresses
                .iter()
                .map(|ip| StdListener::bind(SocketAddr::new(*ip, port)))
                .collect::<Result<Vec<_>, _>>()?,
        };
        let _entered = self.inner.runtime.enter();
        let (stop, stopped) = watch::channel(false);
        let servers = self.clone();
        let handler: Handler = Arc::new(move |_request| servers.answer(port));
        for listener in listeners {
            listener.set_nonblocking(true)?;
            let listener = tokio::net::TcpListener::from_std(listener)?;
            let handler = Arc::clone(&handler);
            self.inner.runtime.spawn(serve_sharing(
                listener,
                handler,
                LIMITS,
                Arc::clone(&self.inner.connections),
                stopped.clone(),
            ));
        }
        Ok(stop)
    }
}

/// Where `port` listens: the addresses of the families whose Services want
/// it (a single-stack Service's port is not opened on the other family's
/// addresses); `None`, every address, when one of them listens everywhere.
fn listen_addresses(state: &State, port: u16) -> Option<BTreeSet<IpAddr>> {
    let mut all = BTreeSet::new();
    for (family, ports) in &state.wanted {
        if ports.contains_key(&port) {
            all.extend(state.listen.get(family)?.as_ref()?);
        }
    }
    Some(all)
}

/// Listens on `port` of every address: IPv6 and IPv4 when the host has
/// IPv6, IPv4 only otherwise.
fn bind_all(port: u16) -> std::io::Result<StdListener> {
    StdListener::bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)))
        .or_else(|_| StdListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))))
}

impl SyncObserver for ServiceHealthServers {
    fn on_synced(&self, request: &SyncRequest<'_>, _outcome: &SyncOutcome) {
        let mut ports = BTreeMap::new();
        for (name, state) in request.service_ports {
            let Some(health_port) = state
                .port
                .health_check_node_port
                .filter(|_| state.plan.external_policy_local)
            else {
                continue;
            };
            let local = state.endpoints.local_ready;
            ports.insert(health_port, (name.service.clone(), local));
        }
        let listen = (self.inner.listen)(request.family, request.node);
        {
            let mut state = self.inner.lock();
            state.wanted.insert(request.family, ports);
            state.listen.insert(request.family, listen);
        }
        self.reconcile();
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update under the lock leaves the state whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
#[path = "service_health_tests.rs"]
mod tests;
