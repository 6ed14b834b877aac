//! The set of listeners: one per service port, opened, updated and closed
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
use std::sync::Arc;

use kp_model::{IpFamily, Protocol, ServicePortName};
use socket2::Socket;
use tokio::net::{TcpListener, UdpSocket};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use crate::balancer::Balancer;
use crate::route::Route;
use crate::sockets::{bind_tcp, bind_udp, LISTEN_BACKLOG};
use crate::stats::{ConnectionStats, StatsRegistry, StatsSnapshot};
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
    task: JoinHandle<()>,
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
    /// A relay for `family` whose tasks run on `handle`.
    pub fn new(handle: Handle, family: IpFamily, options: RelayOptions) -> Self {
        Self {
            handle,
            family,
            options: Arc::new(options),
            listeners: HashMap::new(),
            refusing: None,
            next_in_range: 0,
            registry: StatsRegistry::default(),
        }
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
        self.listeners.retain(|name, listener| {
            let keep = desired
                .get(name)
                .is_some_and(|want| want.protocol == listener.protocol);
            if !keep {
                tracing::info!(service = %name, port = listener.port, "closing listener");
                listener.task.abort();
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
                }
                continue;
            }
            match self.open(name, want) {
                Ok(listener) => {
                    self.registry
                        .insert(name.clone(), Arc::clone(&listener.stats));
                    tracing::info!(service = %name, port = listener.port, protocol = %want.protocol, "opened listener");
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
        if want.protocol == Protocol::Sctp {
            return Err(OpenError::UnsupportedProtocol {
                service: name.clone(),
                protocol: want.protocol,
            });
        }
        let socket = self.bind_in_range(name, want.protocol)?;
        let socket_error = |source| OpenError::Socket {
            service: name.to_string(),
            protocol: want.protocol,
            source,
        };
        let port = local_port(&socket).map_err(socket_error)?;
        let balancer = Arc::new(Balancer::new(want.route.clone()));
        let stats = Arc::new(ConnectionStats::default());
        let options = Arc::clone(&self.options);
        let _runtime = self.handle.enter();
        let task = if want.protocol == Protocol::Tcp {
            socket.set_tcp_nodelay(true).map_err(socket_error)?;
            socket.listen(LISTEN_BACKLOG).map_err(socket_error)?;
            let listener = TcpListener::from_std(socket.into()).map_err(socket_error)?;
            let serve = tcp::serve(listener, Arc::clone(&balancer), Arc::clone(&stats), options);
            self.handle.spawn(serve)
        } else {
            let socket = UdpSocket::from_std(socket.into()).map_err(socket_error)?;
            udp::enable_packet_info(&socket, self.family == IpFamily::V6).map_err(socket_error)?;
            let serve = udp::serve(
                Arc::new(socket),
                Arc::clone(&balancer),
                Arc::clone(&stats),
                options,
            );
            self.handle.spawn(serve)
        };
        Ok(Listener {
            protocol: want.protocol,
            port,
            balancer,
            stats,
            task,
        })
    }

    /// Binds a socket on a free port of `portRange` (trying each once,
    /// starting after the last one handed out), or on any free port
    /// without a range.
    fn bind_in_range(
        &mut self,
        name: &ServicePortName,
        protocol: Protocol,
    ) -> Result<Socket, OpenError> {
        let bind = |port: u16| {
            let addr = SocketAddr::new(self.listen_ip(), port);
            match protocol {
                Protocol::Udp => bind_udp(addr),
                _ => bind_tcp(addr),
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

impl Drop for Relay {
    fn drop(&mut self) {
        for (name, listener) in &self.listeners {
            listener.task.abort();
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
