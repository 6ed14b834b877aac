//! The TCP side of the relay: one accept loop per service port, one task
//! per connection.
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
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};

use crate::balancer::Balancer;
use crate::copy::relay;
use crate::route::TrafficKind;
use crate::sockets::{original_destination, reset};
use crate::stats::ConnectionStats;
use crate::RelayOptions;

/// Pause after `accept` failed for lack of file descriptors or memory,
/// so the loop does not spin while connections close.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Accepts connections on `listener` until the task is aborted. Aborting
/// closes the listener only: connections already accepted run on in their
/// own tasks.
pub async fn serve(
    listener: TcpListener,
    balancer: Arc<Balancer>,
    stats: Arc<ConnectionStats>,
    options: Arc<RelayOptions>,
) {
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
        stats.accepted();
        let connection = Connection {
            ipv6,
            balancer: Arc::clone(&balancer),
            stats: Arc::clone(&stats),
            options: Arc::clone(&options),
        };
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
        )
        .await
        {
            tracing::trace!(client = %peer, %error, "relayed connection ended with an error");
            reset(&client);
            reset(&endpoint);
        }
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
            match tokio::time::timeout(*timeout, TcpStream::connect(endpoint)).await {
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
