//! The TCP side of the relay: one accept loop per service port and worker
//! thread, one task per connection, on the thread that accepted it.
//!
//! A connection is classified by the address it was sent to (internal for
//! the ClusterIP, external for NodePorts, external IPs and load balancer
//! IPs), given an endpoint by the port's [`Balancer`], and relayed. An
//! endpoint that refuses or does not answer within the attempt's timeout
//! is skipped and the next one tried, with growing timeouts, as upstream's
//! userspace proxier did (250 ms, 500 ms, 1 s, 2 s); when every endpoint
//! has failed, the round starts again with the next timeout. A connection
//! nothing can serve is reset.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::balancer::Balancer;
use crate::copy::relay;
use crate::route::TrafficKind;
use crate::sockets::{original_destination, reset, set_keepalive};
use crate::stats::ConnectionStats;
use crate::RelayOptions;

/// Pause after `accept` failed for lack of file descriptors or memory,
/// so the loop does not spin while connections close.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// What an accept loop shares with the service port's other accept loops
/// (the balancer, the counters, the options) and what is its own.
#[derive(Debug)]
pub struct Acceptor {
    /// The service port's endpoint selection, shared by every worker.
    pub balancer: Arc<Balancer>,
    /// The service port's counters, shared by every worker.
    pub stats: Arc<ConnectionStats>,
    /// Connections this loop accepted.
    pub accepted: Arc<AtomicU64>,
    /// The relay's options.
    pub options: Arc<RelayOptions>,
}

/// Accepts connections on `listener` until the task is aborted, each
/// served by a task on the runtime this loop runs on. Aborting closes the
/// listener only: connections already accepted run on in their own tasks.
pub async fn serve(listener: TcpListener, acceptor: Acceptor) {
    let ipv6 = listener.local_addr().is_ok_and(|addr| addr.is_ipv6());
    loop {
        let (client, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "accepting a connection failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        acceptor.stats.accepted();
        acceptor.accepted.fetch_add(1, Ordering::Relaxed);
        let connection = Connection {
            ipv6,
            balancer: Arc::clone(&acceptor.balancer),
            stats: Arc::clone(&acceptor.stats),
            options: Arc::clone(&acceptor.options),
        };
        // On a worker's current-thread runtime, the task stays on the
        // thread that accepted the connection.
        tokio::spawn(connection.run(client, peer));
    }
}

/// What one connection's task needs.
struct Connection {
    ipv6: bool,
    balancer: Arc<Balancer>,
    stats: Arc<ConnectionStats>,
    options: Arc<RelayOptions>,
}

impl Connection {
    async fn run(self, client: TcpStream, peer: SocketAddr) {
        let _active = self.stats.active_guard();
        let route = self.balancer.route();
        let original = if route.needs_classification() {
            original_destination(&client, self.ipv6)
        } else {
            None
        };
        let kind = match route.classify(original, peer.ip()) {
            Ok(kind) => kind,
            Err(denied) => {
                tracing::debug!(client = %peer, ?original, ?denied, "connection not allowed");
                self.stats.refused();
                reset(&client);
                return;
            }
        };
        drop(route);
        // Boxed, so that the dial's timers and connect state are freed once
        // connected instead of sizing the task for the connection's life.
        let Some(endpoint) = Box::pin(self.dial(peer, kind)).await else {
            self.stats.refused();
            reset(&client);
            return;
        };
        // Latency matters more than packet count for a relay: what arrives
        // is passed on at once. (The client's socket has TCP_NODELAY from
        // the listener: Linux hands it on to accepted sockets.)
        let _ = endpoint.set_nodelay(true);
        if let Err(error) = relay(
            &client,
            &endpoint,
            self.options.buffer_size,
            self.options.splice,
            self.options.tcp_idle_timeout,
        )
        .await
        {
            tracing::trace!(client = %peer, %error, "relayed connection ended with an error");
            reset(&client);
            reset(&endpoint);
        }
        // Both sockets close here, which passes on the end of stream that
        // `relay` leaves to its caller.
    }

    /// Connects to an endpoint for `peer`, skipping endpoints that refuse
    /// or time out.
    async fn dial(&self, peer: SocketAddr, kind: TrafficKind) -> Option<TcpStream> {
        let mut failed: Vec<SocketAddr> = Vec::new();
        for timeout in &self.options.dial_timeouts {
            let now = Instant::now();
            // Once every endpoint has failed, they are tried again with the
            // next, longer timeout: a single slow endpoint (a SYN lost to a
            // full queue costs a 1 s retransmission) still gets its chance.
            let endpoint = match self.balancer.pick(peer.ip(), kind, now, &failed) {
                Some(endpoint) => endpoint,
                None if !failed.is_empty() => {
                    failed.clear();
                    self.balancer.pick(peer.ip(), kind, now, &failed)?
                }
                None => return None,
            };
            match tokio::time::timeout(*timeout, connect(endpoint)).await {
                Ok(Ok(stream)) => return Some(stream),
                Ok(Err(error)) => {
                    tracing::debug!(client = %peer, %endpoint, %error, "endpoint refused; trying the next one");
                }
                Err(_) => {
                    tracing::debug!(client = %peer, %endpoint, ?timeout, "endpoint did not answer; trying the next one");
                }
            }
            self.stats.dial_failed();
            failed.push(endpoint);
        }
        None
    }
}

/// Connects to `endpoint` from a socket that sends keepalive probes (the
/// client's side has them from the listener: Linux hands them on to
/// accepted sockets), so that a vanished endpoint ends the connection.
async fn connect(endpoint: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = if endpoint.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    set_keepalive(&socket)?;
    socket.connect(endpoint).await
}
