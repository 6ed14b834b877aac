//! The userspace mode of kube-proxy-rs: Service traffic is redirected by
//! nat "portal" rules to listeners inside the proxy, which relay it to the
//! endpoints.
//!
//! - [`relay`]: the listeners, one per service port, on tokio; TCP
//!   connections are served by worker threads ([`workers`]), each with
//!   a listening socket of its own on every TCP service port.
//!   [`balancer`] picks endpoints (round robin, ClientIP affinity);
//!   [`tcp`] and [`udp`] move the bytes ([`copy`] keeps idle TCP
//!   connections free of buffers).
//! - [`portal`]: the pure renderer of the portal chains
//!   (`KUBE-PORTALS-CONTAINER`, `KUBE-PORTALS-HOST`,
//!   `KUBE-NODEPORT-CONTAINER`, `KUBE-NODEPORT-HOST`, as upstream's
//!   userspace proxier named them) as iptables-restore input.
//! - [`backend`]: [`UserspaceBackend`], the `--proxy-mode userspace`
//!   implementation of [`kp_sync::Backend`], and [`cleanup`].
//! - [`routes_file`]: the relay's routing table, published as a JSON
//!   file after each sync (by default
//!   `/run/kube-proxy/userspace-routes-IPv4.json`) for `kube-proxy trace`;
//!   [`trace`] follows a packet through the portal rules read from the
//!   kernel and that table.
//! - [`metrics`]: [`UserspaceMetrics`], connection counts per service
//!   port for `/metrics`.

#![forbid(unsafe_code)]

pub mod backend;
pub mod balancer;
pub mod conntrack;
pub mod copy;
pub mod jump_check;
pub mod metrics;
pub mod portal;
pub mod relay;
pub mod route;
pub mod routes_file;
pub mod sockets;
pub mod stats;
pub mod tcp;
pub mod trace;
pub mod udp;
mod workers;

use std::time::Duration;

pub use backend::{cleanup, UserspaceBackend, UserspaceError, MODE};
pub use balancer::Balancer;
pub use jump_check::JumpCheck;
pub use metrics::UserspaceMetrics;
pub use portal::{render_portals, PortalInput, PortalService};
pub use relay::{DesiredListener, ListenerInfo, OpenError, Relay};
pub use route::{Route, TrafficKind};
pub use stats::{StatsRegistry, StatsSnapshot};

/// Upstream's default `--udp-timeout`: a UDP session with no traffic for
/// this long is closed.
pub const DEFAULT_UDP_IDLE_TIMEOUT: Duration = Duration::from_millis(250);

/// Timeouts of the successive attempts to reach an endpoint for one
/// connection, as upstream's userspace proxier used them; each attempt
/// tries another endpoint.
pub const DEFAULT_DIAL_TIMEOUTS: [Duration; 4] = [
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
];

/// Size of the buffer a TCP direction takes while data flows (none while
/// idle). 64 KiB moves a full TCP window per system call pair.
pub const DEFAULT_BUFFER_SIZE: usize = 64 * 1024;

/// The most UDP sessions a relay (one IP family) keeps open at once, over
/// all its service ports; at the bound the oldest is closed for a new one.
/// Each session holds a socket: a descriptor and an ephemeral port of the
/// node (Linux's default range, 32768–60999, has 28,232). Upstream's
/// userspace proxier had no bound and no matching setting. See also
/// [`udp_session_limit`].
pub const DEFAULT_MAX_UDP_SESSIONS: usize = 4096;

/// Idle time before a relayed TCP connection's first keepalive probe, and
/// the time between probes: 15 s, what Go sets on every connection it
/// dials or accepts (`net.Dialer.KeepAlive`, `net.ListenConfig.KeepAlive`),
/// and so what upstream's userspace proxier had on both sides.
pub const TCP_KEEPALIVE: Duration = Duration::from_secs(15);

/// Unanswered keepalive probes after which a peer counts as gone: 9, Go's
/// (and Linux's) default. With [`TCP_KEEPALIVE`] a vanished peer ends its
/// connection after 150 s.
pub const TCP_KEEPALIVE_PROBES: u32 = 9;

/// A relayed TCP connection with no byte in either direction for this long
/// is reset, by default: upstream's `conntrack.tcpEstablishedTimeout`
/// default, after which the node forgets the connection's NAT anyway.
pub const DEFAULT_TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// How the relay behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayOptions {
    /// Buffer size per active TCP direction.
    pub buffer_size: usize,
    /// Move bulk TCP data with `splice(2)` (no copy into the process; a
    /// pipe, two descriptors, per direction while data flows).
    pub splice: bool,
    /// Timeout of each attempt to reach an endpoint; the number of entries
    /// is the number of endpoints tried.
    pub dial_timeouts: Vec<Duration>,
    /// A UDP session idle this long is closed.
    pub udp_idle_timeout: Duration,
    /// At most this many UDP sessions are open at once over the relay's
    /// listeners; at the bound the oldest is closed for a new one.
    pub max_udp_sessions: usize,
    /// A relayed TCP connection with no byte in either direction for this
    /// long is reset (both sides also send keepalive probes, see
    /// [`TCP_KEEPALIVE`]).
    pub tcp_idle_timeout: Duration,
    /// `portRange`: the ports listeners may use (inclusive); any free port
    /// when `None`.
    pub port_range: Option<(u16, u16)>,
    /// Threads serving TCP, each with its own listening socket on every
    /// TCP service port (`SO_REUSEPORT`) and serving the connections it
    /// accepted to their end; 0 serves TCP on the runtime the relay was
    /// given, with one listening socket per service port. By default one
    /// per CPU the process may use.
    pub workers: usize,
}

impl Default for RelayOptions {
    fn default() -> Self {
        Self {
            buffer_size: DEFAULT_BUFFER_SIZE,
            splice: true,
            dial_timeouts: DEFAULT_DIAL_TIMEOUTS.to_vec(),
            udp_idle_timeout: DEFAULT_UDP_IDLE_TIMEOUT,
            max_udp_sessions: udp_session_limit(),
            tcp_idle_timeout: DEFAULT_TCP_IDLE_TIMEOUT,
            port_range: None,
            workers: workers::default_count(),
        }
    }
}

/// [`DEFAULT_MAX_UDP_SESSIONS`], or a quarter of the process's soft limit
/// of open descriptors (`RLIMIT_NOFILE`) when that is less, so that a flood
/// of UDP sessions leaves descriptors for TCP connections, the other
/// family's relay and the proxy's own work (iptables-restore's pipes, the
/// API connection).
pub fn udp_session_limit() -> usize {
    let descriptors = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(u64::MAX, |(soft, _hard)| soft);
    let quarter = usize::try_from(descriptors / 4).unwrap_or(usize::MAX);
    DEFAULT_MAX_UDP_SESSIONS.min(quarter).max(1)
}
