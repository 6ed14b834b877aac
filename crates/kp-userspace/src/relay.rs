//! The set of listeners: one per service port (for TCP, one socket per
//! worker thread, see [`crate::workers`]), opened, updated and closed
//! from the sync thread without waiting on any connection.
//!
//! [`Relay::apply`] takes the desired routes of every service port and
//! makes the listeners match: a new service port gets a listener on a
//! port of the configured range (any free port without one), a changed
//! one gets its new route swapped into its balancer (connections keep
//! running), a removed one has its listener closed (its connections keep
//! running too, until either end closes). A port that cannot be opened is
//! reported for that service port alone; every other one is served.
//!
//! TCP connections to a service port without endpoints must be refused
//! at once, with a reset, as the iptables mode's REJECT does. A socket
//! that is bound but not listening does exactly that in the kernel, so
//! the relay holds one such "refusing" port per family and the portal
//! rules send those service ports there.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use kp_model::{IpFamily, Protocol, ServicePortName};
use socket2::Socket;
use tokio::net::{TcpListener, UdpSocket};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use crate::balancer::Balancer;
use crate::route::Route;
use crate::sockets::{bind_tcp, bind_tcp_group, bind_udp, set_keepalive, LISTEN_BACKLOG};
use crate::stats::{ConnectionStats, StatsRegistry, StatsSnapshot};
use crate::udp::{SessionTable, UdpListener};
use crate::workers::Workers;
use crate::{tcp, udp, RelayOptions};

/// What the relay should serve for one service port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredListener {
    /// TCP or UDP.
    pub protocol: Protocol,
    /// Where its connections go.
    pub route: Route,
}

/// A listener the relay has open.
#[derive(Debug)]
struct Listener {
    protocol: Protocol,
    port: u16,
    balancer: Arc<Balancer>,
    stats: Arc<ConnectionStats>,
    /// The accept (or receive) loops: one per worker thread for TCP, one
    /// on the relay's runtime for UDP or without workers.
    tasks: Vec<JoinHandle<()>>,
    /// Connections accepted by each of the TCP accept loops.
    accepted_per_socket: Vec<Arc<AtomicU64>>,
}

/// The relay of one IP family.
#[derive(Debug)]
pub struct Relay {
    handle: Handle,
    family: IpFamily,
    options: Arc<RelayOptions>,
    listeners: HashMap<ServicePortName, Listener>,
    refusing: Option<(Socket, u16)>,
    next_in_range: u32,
    registry: StatsRegistry,
    /// The sessions of every UDP listener.
    udp_sessions: Arc<SessionTable>,
    /// Started with the first TCP listener; `None` before, or while they
    /// cannot be started (TCP is then served on `handle`).
    workers: Option<Workers>,
}

/// A listener that could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Every port of `portRange` is taken.
    #[error("service port {service}: no free {protocol} port in portRange {low}-{high}")]
    RangeExhausted {
        /// The service port.
        service: ServicePortName,
        /// Its protocol.
        protocol: Protocol,
        /// First port of the range.
        low: u16,
        /// Last port of the range.
        high: u16,
    },
    /// The socket could not be created, bound or made to listen.
    #[error("service port {service}: opening a {protocol} listener failed")]
    Socket {
        /// The service port (empty for the refusing port).
        service: String,
        /// Its protocol.
        protocol: Protocol,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The relay has no TCP/UDP data path for the protocol.
    #[error("service port {service}: protocol {protocol} is not supported by the userspace mode")]
    UnsupportedProtocol {
        /// The service port.
        service: ServicePortName,
        /// Its protocol (SCTP).
        protocol: Protocol,
    },
}

/// One open listener, as the portal rules need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerInfo {
    /// TCP or UDP.
    pub protocol: Protocol,
    /// The proxy's port.
    pub port: u16,
    /// Whether some traffic has an endpoint to go to.
    pub has_endpoints: bool,
}

impl Relay {
    /// A relay for `family`: its TCP connections run on
    /// [`RelayOptions::workers`] threads of its own (on `handle` when that
    /// is 0), its UDP sessions on `handle`. Dropping the relay stops the
    /// worker threads and closes their connections.
    pub fn new(handle: Handle, family: IpFamily, options: RelayOptions) -> Self {
        let udp_sessions = Arc::new(SessionTable::new(options.max_udp_sessions));
        Self {
            handle,
            family,
            options: Arc::new(options),
            listeners: HashMap::new(),
            refusing: None,
            next_in_range: 0,
            registry: StatsRegistry::default(),
            udp_sessions,
            workers: None,
        }
    }

    /// How many UDP sessions are open, over every listener.
    pub fn udp_sessions(&self) -> usize {
        self.udp_sessions.len()
    }

    /// The address listeners bind: every address of the family.
    pub fn listen_ip(&self) -> IpAddr {
        match self.family {
            IpFamily::V4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpFamily::V6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        }
    }

    /// Makes the listeners match `desired`; returns what could not be
    /// opened (those service ports are not served until a later call
    /// succeeds).
    pub fn apply(
        &mut self,
        desired: &BTreeMap<ServicePortName, DesiredListener>,
    ) -> Vec<OpenError> {
        let registry = &self.registry;
        let udp_sessions = &self.udp_sessions;
        self.listeners.retain(|name, listener| {
            let keep = desired
                .get(name)
                .is_some_and(|want| want.protocol == listener.protocol);
            if !keep {
                tracing::info!(v = 2, service = %name, port = listener.port, "closing listener");
                listener.close();
                if listener.protocol == Protocol::Udp {
                    // Its endpoints are no longer the Service's.
                    udp_sessions.close_listener(listener.port);
                }
                registry.remove(name);
            }
            keep
        });
        let mut errors = Vec::new();
        if let Err(error) = self.ensure_refusing_port() {
            errors.push(error);
        }
        for (name, want) in desired {
            if let Some(listener) = self.listeners.get(name) {
                if *listener.balancer.route() != want.route {
                    listener.balancer.update(want.route.clone());
                    if listener.protocol == Protocol::Udp {
                        // A session to an endpoint the route no longer
                        // picks would keep its client there for as long
                        // as the client keeps sending.
                        let closed = self.udp_sessions.close_unused(listener.port, &want.route);
                        if closed > 0 {
                            tracing::debug!(service = %name, sessions = closed, "closed UDP sessions to endpoints no longer used");
                        }
                    }
                }
                continue;
            }
            match self.open(name, want) {
                Ok(listener) => {
                    self.registry
                        .insert(name.clone(), Arc::clone(&listener.stats));
                    tracing::info!(v = 2, service = %name, port = listener.port, protocol = %want.protocol, "opened listener");
                    self.listeners.insert(name.clone(), listener);
                }
                Err(error) => errors.push(error),
            }
        }
        errors
    }

    /// The listener of `name`, if open.
    pub fn listener(&self, name: &ServicePortName) -> Option<ListenerInfo> {
        self.listeners.get(name).map(|listener| ListenerInfo {
            protocol: listener.protocol,
            port: listener.port,
            has_endpoints: listener.balancer.route().has_endpoints(),
        })
    }

    /// How many connections each of `name`'s TCP listening sockets (one
    /// per worker thread) has accepted, in worker order; `None` when
    /// `name` has no listener. Shows how evenly the kernel spreads
    /// connections over the workers.
    pub fn accepted_per_worker(&self, name: &ServicePortName) -> Option<Vec<u64>> {
        self.listeners.get(name).map(|listener| {
            listener
                .accepted_per_socket
                .iter()
                .map(|accepted| accepted.load(Ordering::Relaxed))
                .collect()
        })
    }

    /// The port that refuses every TCP connection, once opened.
    pub fn refusing_port(&self) -> Option<u16> {
        self.refusing.as_ref().map(|(_, port)| *port)
    }

    /// Connection counters of every open listener.
    pub fn stats(&self) -> BTreeMap<ServicePortName, StatsSnapshot> {
        self.registry.snapshot()
    }

    /// A shared view of the counters of every open listener, for a
    /// metrics server on another thread.
    pub fn stats_registry(&self) -> StatsRegistry {
        self.registry.clone()
    }

    /// Drops remembered affinity clients idle past their timeout.
    pub fn sweep_affinity(&self) {
        let now = std::time::Instant::now();
        for listener in self.listeners.values() {
            listener.balancer.sweep(now);
        }
    }

    fn ensure_refusing_port(&mut self) -> Result<(), OpenError> {
        if self.refusing.is_some() {
            return Ok(());
        }
        let error = |source| OpenError::Socket {
            service: "(refusing port)".to_owned(),
            protocol: Protocol::Tcp,
            source,
        };
        let socket = bind_tcp(SocketAddr::new(self.listen_ip(), 0)).map_err(error)?;
        let port = local_port(&socket).map_err(error)?;
        self.refusing = Some((socket, port));
        Ok(())
    }

    fn open(
        &mut self,
        name: &ServicePortName,
        want: &DesiredListener,
    ) -> Result<Listener, OpenError> {
        match want.protocol {
            Protocol::Tcp => self.open_tcp(name, want),
            Protocol::Udp => self.open_udp(name, want),
            Protocol::Sctp => Err(OpenError::UnsupportedProtocol {
                service: name.clone(),
                protocol: want.protocol,
            }),
        }
    }

    /// One listening socket per TCP runtime, all on one port, each with
    /// its accept loop on its own runtime.
    fn open_tcp(
        &mut self,
        name: &ServicePortName,
        want: &DesiredListener,
    ) -> Result<Listener, OpenError> {
        let runtimes = self.tcp_runtimes();
        let sockets = self.bind_in_range(name, Protocol::Tcp, runtimes.len())?;
        let socket_error = |source| OpenError::Socket {
            service: name.to_string(),
            protocol: Protocol::Tcp,
            source,
        };
        let mut port = 0;
        let mut listeners = Vec::with_capacity(sockets.len());
        for (socket, runtime) in sockets.into_iter().zip(&runtimes) {
            port = local_port(&socket).map_err(socket_error)?;
            socket.set_tcp_nodelay(true).map_err(socket_error)?;
            set_keepalive(&socket).map_err(socket_error)?;
            socket.listen(LISTEN_BACKLOG).map_err(socket_error)?;
            // Registered with the runtime that will accept on it.
            let _runtime = runtime.enter();
            let listener = TcpListener::from_std(socket.into()).map_err(socket_error)?;
            listeners.push(listener);
        }
        let balancer = Arc::new(Balancer::new(want.route.clone()));
        let stats = Arc::new(ConnectionStats::default());
        let mut tasks = Vec::with_capacity(listeners.len());
        let mut accepted_per_socket = Vec::with_capacity(listeners.len());
        for (listener, runtime) in listeners.into_iter().zip(&runtimes) {
            let accepted = Arc::new(AtomicU64::new(0));
            let acceptor = tcp::Acceptor {
                balancer: Arc::clone(&balancer),
                stats: Arc::clone(&stats),
                accepted: Arc::clone(&accepted),
                options: Arc::clone(&self.options),
            };
            tasks.push(runtime.spawn(tcp::serve(listener, acceptor)));
            accepted_per_socket.push(accepted);
        }
        Ok(Listener {
            protocol: Protocol::Tcp,
            port,
            balancer,
            stats,
            tasks,
            accepted_per_socket,
        })
    }

    fn open_udp(
        &mut self,
        name: &ServicePortName,
        want: &DesiredListener,
    ) -> Result<Listener, OpenError> {
        let mut sockets = self.bind_in_range(name, Protocol::Udp, 1)?;
        let socket_error = |source| OpenError::Socket {
            service: name.to_string(),
            protocol: Protocol::Udp,
            source,
        };
        let socket = sockets
            .pop()
            .ok_or_else(|| socket_error(io::Error::other("no socket was bound")))?;
        let port = local_port(&socket).map_err(socket_error)?;
        let balancer = Arc::new(Balancer::new(want.route.clone()));
        let stats = Arc::new(ConnectionStats::default());
        let _runtime = self.handle.enter();
        let socket = UdpSocket::from_std(socket.into()).map_err(socket_error)?;
        udp::enable_packet_info(&socket, self.family == IpFamily::V6).map_err(socket_error)?;
        let serve = udp::serve(UdpListener {
            socket: Arc::new(socket),
            balancer: Arc::clone(&balancer),
            stats: Arc::clone(&stats),
            options: Arc::clone(&self.options),
            sessions: Arc::clone(&self.udp_sessions),
        });
        Ok(Listener {
            protocol: Protocol::Udp,
            port,
            balancer,
            stats,
            tasks: vec![self.handle.spawn(serve)],
            accepted_per_socket: Vec::new(),
        })
    }

    /// The runtimes TCP listeners are served on: the worker threads',
    /// started now if they are not running yet, or the relay's runtime
    /// without workers (configured so, or when the threads cannot be
    /// started: the service ports are served all the same, and starting
    /// them is tried again with the next listener).
    fn tcp_runtimes(&mut self) -> Vec<Handle> {
        if self.options.workers == 0 {
            return vec![self.handle.clone()];
        }
        if self.workers.is_none() {
            match Workers::start(self.options.workers, &self.family.to_string()) {
                Ok(workers) => {
                    tracing::info!(family = %self.family, workers = self.options.workers, "started relay worker threads");
                    self.workers = Some(workers);
                }
                Err(error) => {
                    tracing::warn!(family = %self.family, %error, "cannot start relay worker threads; serving TCP on the proxy's runtime");
                }
            }
        }
        match &self.workers {
            Some(workers) => workers.handles().cloned().collect(),
            None => vec![self.handle.clone()],
        }
    }

    /// Binds `count` sockets (TCP; UDP binds one) on one free port of
    /// `portRange` (trying each once, starting after the last one handed
    /// out), or on any free port without a range.
    fn bind_in_range(
        &mut self,
        name: &ServicePortName,
        protocol: Protocol,
        count: usize,
    ) -> Result<Vec<Socket>, OpenError> {
        let bind = |port: u16| {
            let addr = SocketAddr::new(self.listen_ip(), port);
            match protocol {
                Protocol::Udp => bind_udp(addr).map(|socket| vec![socket]),
                _ => bind_tcp_group(addr, count),
            }
        };
        let Some((low, high)) = self.options.port_range else {
            return bind(0).map_err(|source| OpenError::Socket {
                service: name.to_string(),
                protocol,
                source,
            });
        };
        let mut ours: Vec<u16> = self
            .listeners
            .values()
            .filter(|listener| listener.protocol == protocol)
            .map(|listener| listener.port)
            .collect();
        if protocol == Protocol::Tcp {
            ours.extend(self.refusing_port());
        }
        let size = u32::from(high) - u32::from(low) + 1;
        for step in 0..size {
            let offset = (self.next_in_range + step) % size;
            let Ok(port) = u16::try_from(u32::from(low) + offset) else {
                continue;
            };
            if ours.contains(&port) {
                continue;
            }
            match bind(port) {
                Ok(socket) => {
                    self.next_in_range = offset + 1;
                    return Ok(socket);
                }
                Err(error) if error.kind() == io::ErrorKind::AddrInUse => continue,
                Err(source) => {
                    return Err(OpenError::Socket {
                        service: name.to_string(),
                        protocol,
                        source,
                    })
                }
            }
        }
        Err(OpenError::RangeExhausted {
            service: name.clone(),
            protocol,
            low,
            high,
        })
    }
}

impl Listener {
    /// Stops every accept loop, closing its socket (on its own runtime,
    /// soon after); accepted connections run on.
    fn close(&self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        for (name, listener) in &self.listeners {
            listener.close();
            if listener.protocol == Protocol::Udp {
                self.udp_sessions.close_listener(listener.port);
            }
            self.registry.remove(name);
        }
    }
}

fn local_port(socket: &Socket) -> io::Result<u16> {
    socket
        .local_addr()?
        .as_socket()
        .map(|addr| addr.port())
        .ok_or_else(|| io::Error::other("socket has no IP address"))
}
