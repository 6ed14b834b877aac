//! The UDP side of the relay: one receive loop per service port, one
//! session per client address.
//!
//! A client's first datagram opens a session: a socket connected to an
//! endpoint picked by the port's [`Balancer`]. Later datagrams from the
//! same client address go to the same endpoint, and the endpoint's answers
//! go back to the client, sent from the very address the client's datagram
//! arrived at (`IP_PKTINFO`), so that conntrack recognises them as replies
//! and reverses the portal rule's address rewrite. A session with no
//! datagram in either direction for the idle timeout is closed (upstream's
//! `--udp-timeout`, 250 ms by default).
//!
//! Like a TCP connection, a session is classified by the address its first
//! datagram was sent to (asked of conntrack, see [`crate::conntrack`], only
//! when the route needs it): internal or external endpoints, and
//! `loadBalancerSourceRanges`. A datagram from a client outside the ranges
//! opens no session and is dropped, as the iptables mode's firewall chain
//! drops it.

use std::collections::HashMap;
use std::io::{self, IoSlice, IoSliceMut};
use std::net::{IpAddr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::libc;
use nix::sys::socket::{
    recvmsg, sendmsg, setsockopt, sockopt, ControlMessage, ControlMessageOwned, MsgFlags,
    SockaddrIn, SockaddrIn6, SockaddrStorage,
};
use tokio::io::Interest;
use tokio::net::UdpSocket;

use crate::balancer::Balancer;
use crate::conntrack::OriginalDestinations;
use crate::stats::ConnectionStats;
use crate::RelayOptions;

/// Largest datagram relayed (the largest a UDP payload can be).
const MAX_DATAGRAM: usize = 65_535;

/// The sessions of one listener, by client address.
type Sessions = Arc<Mutex<HashMap<SocketAddr, Arc<Session>>>>;

/// One client's session.
#[derive(Debug)]
struct Session {
    /// Connected to the endpoint.
    upstream: UdpSocket,
    /// The address the client sent to, and the interface it came in on;
    /// replies are sent from there.
    reply_from: Option<LocalAddress>,
    /// Milliseconds since `epoch` at the last datagram either way.
    last_active_ms: AtomicU64,
    epoch: Instant,
}

/// One datagram received on the listener.
struct Received {
    len: usize,
    client: SocketAddr,
    destination: Option<LocalAddress>,
}

/// Where a datagram arrived: its destination address and the index of the
/// interface it came in on. A `REDIRECT` rule for IPv6 rewrites the
/// destination to the interface's first address, which may be link-local
/// (`fe80::1` on a pod's veth): an answer from it needs the interface too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LocalAddress {
    ip: IpAddr,
    interface: u32,
}

/// Asks the kernel to report each datagram's destination address
/// (`IP_PKTINFO`, `IPV6_RECVPKTINFO`).
pub fn enable_packet_info(socket: &UdpSocket, ipv6: bool) -> io::Result<()> {
    if ipv6 {
        setsockopt(socket, sockopt::Ipv6RecvPacketInfo, &true)?;
    } else {
        setsockopt(socket, sockopt::Ipv4PacketInfo, &true)?;
    }
    Ok(())
}

/// Relays datagrams arriving on `socket` until the task is aborted.
/// Sessions end by their idle timeout, not with the listener.
pub async fn serve(
    socket: Arc<UdpSocket>,
    balancer: Arc<Balancer>,
    stats: Arc<ConnectionStats>,
    options: Arc<crate::RelayOptions>,
) {
    let sessions: Sessions = Arc::default();
    let mut buffer = vec![0u8; MAX_DATAGRAM];
    let listen_port = socket.local_addr().map_or(0, |addr| addr.port());
    let mut destinations = OriginalDestinations::new();
    loop {
        let received = match receive(&socket, &mut buffer).await {
            Ok(received) => received,
            Err(error) => {
                tracing::debug!(%error, "receiving a datagram failed");
                continue;
            }
        };
        let existing = lock(&sessions).get(&received.client).cloned();
        let session = match existing {
            Some(session) => session,
            None => {
                let listener = Listener {
                    socket: &socket,
                    port: listen_port,
                    balancer: &balancer,
                    stats: &stats,
                    options: &options,
                };
                let started = listener.open_session(&sessions, &received, &mut destinations);
                match started {
                    Some(session) => session,
                    None => continue,
                }
            }
        };
        session.touch();
        // A UDP send waits only for room in the socket buffer.
        if let Err(error) = session.upstream.send(&buffer[..received.len]).await {
            tracing::trace!(client = %received.client, %error, "forwarding a datagram failed");
        }
    }
}

/// What opening a session needs of its listener.
struct Listener<'a> {
    socket: &'a Arc<UdpSocket>,
    port: u16,
    balancer: &'a Balancer,
    stats: &'a Arc<ConnectionStats>,
    options: &'a RelayOptions,
}

impl Listener<'_> {
    /// Starts a session for the sender of `received`, or `None` when the
    /// client is not allowed or no endpoint can take it.
    fn open_session(
        &self,
        sessions: &Sessions,
        received: &Received,
        destinations: &mut OriginalDestinations,
    ) -> Option<Arc<Session>> {
        let client = received.client;
        let route = self.balancer.route();
        let original = match received.destination {
            Some(local) if route.needs_classification() => {
                destinations.udp(client, SocketAddr::new(local.ip, self.port))
            }
            _ => None,
        };
        let kind = match route.classify(original, client.ip()) {
            Ok(kind) => kind,
            Err(denied) => {
                tracing::debug!(%client, ?original, ?denied, "datagram not allowed; dropped");
                self.stats.refused();
                return None;
            }
        };
        drop(route);
        let Some(endpoint) = self.balancer.pick(client.ip(), kind, Instant::now(), &[]) else {
            self.stats.refused();
            return None;
        };
        let upstream = match connect_upstream(endpoint) {
            Ok(socket) => socket,
            Err(error) => {
                tracing::debug!(%client, %endpoint, %error, "opening a UDP session failed");
                self.stats.dial_failed();
                return None;
            }
        };
        self.stats.accepted();
        let session = Arc::new(Session {
            upstream,
            reply_from: received.destination,
            last_active_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        });
        lock(sessions).insert(client, Arc::clone(&session));
        tokio::spawn(reply_loop(
            Arc::clone(self.socket),
            Arc::clone(&session),
            client,
            Arc::clone(sessions),
            Arc::clone(self.stats),
            self.options.udp_idle_timeout,
        ));
        Some(session)
    }
}

fn connect_upstream(endpoint: SocketAddr) -> io::Result<UdpSocket> {
    let unspecified: SocketAddr = match endpoint {
        SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = std::net::UdpSocket::bind(unspecified)?;
    socket.connect(endpoint)?;
    socket.set_nonblocking(true)?;
    UdpSocket::from_std(socket)
}

/// Passes the endpoint's answers back to `client` until the session idles
/// out, then removes it.
async fn reply_loop(
    listener: Arc<UdpSocket>,
    session: Arc<Session>,
    client: SocketAddr,
    sessions: Sessions,
    stats: Arc<ConnectionStats>,
    idle_timeout: Duration,
) {
    let _active = stats.active_guard();
    loop {
        let wait = idle_timeout.saturating_sub(session.idle());
        if wait.is_zero() {
            break;
        }
        match tokio::time::timeout(wait, session.upstream.readable()).await {
            Err(_) => continue,
            Ok(Err(_)) => break,
            Ok(Ok(())) => {}
        }
        let mut buffer = Vec::with_capacity(MAX_DATAGRAM);
        match session.upstream.try_recv_buf(&mut buffer) {
            Ok(_) => {
                session.touch();
                if let Err(error) = send_from(&listener, &buffer, client, session.reply_from).await
                {
                    tracing::trace!(%client, %error, "answering a client failed");
                }
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
            // The endpoint's port is closed (ICMP unreachable): the
            // session is over.
            Err(_) => break,
        }
    }
    let mut sessions = lock(&sessions);
    if sessions
        .get(&client)
        .is_some_and(|current| Arc::ptr_eq(current, &session))
    {
        sessions.remove(&client);
    }
}

impl Session {
    fn touch(&self) {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_active_ms.fetch_max(now, Ordering::Relaxed);
    }

    fn idle(&self) -> Duration {
        let last = Duration::from_millis(self.last_active_ms.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(last)
    }
}

/// Receives one datagram with its sender and destination address.
async fn receive(socket: &UdpSocket, buffer: &mut [u8]) -> io::Result<Received> {
    let fd = socket.as_raw_fd();
    socket
        .async_io(Interest::READABLE, || {
            let mut iov = [IoSliceMut::new(buffer)];
            let mut control = nix::cmsg_space!(libc::in6_pktinfo);
            let message =
                recvmsg::<SockaddrStorage>(fd, &mut iov, Some(&mut control), MsgFlags::empty())
                    .map_err(io::Error::from)?;
            let client = message.address.as_ref().and_then(socket_addr);
            let mut destination = None;
            for control in message.cmsgs().map_err(io::Error::from)? {
                match control {
                    ControlMessageOwned::Ipv4PacketInfo(info) => {
                        let octets = info.ipi_addr.s_addr.to_ne_bytes();
                        destination = Some(LocalAddress {
                            ip: IpAddr::from(octets),
                            // Routing picks the interface of an IPv4 answer.
                            interface: 0,
                        });
                    }
                    ControlMessageOwned::Ipv6PacketInfo(info) => {
                        destination = Some(LocalAddress {
                            ip: IpAddr::from(info.ipi6_addr.s6_addr),
                            interface: info.ipi6_ifindex,
                        });
                    }
                    _ => {}
                }
            }
            let client = client.ok_or_else(|| io::Error::other("datagram without a sender"))?;
            Ok(Received {
                len: message.bytes,
                client,
                destination,
            })
        })
        .await
}

fn socket_addr(storage: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = storage.as_sockaddr_in() {
        return Some(SocketAddr::V4(SocketAddrV4::from(*v4)));
    }
    storage
        .as_sockaddr_in6()
        .map(|v6| SocketAddr::V6(SocketAddrV6::from(*v6)))
}

/// Sends `data` to `to` from the address `from` (or from whatever address
/// routing picks, without one).
async fn send_from(
    socket: &UdpSocket,
    data: &[u8],
    to: SocketAddr,
    from: Option<LocalAddress>,
) -> io::Result<usize> {
    let Some(LocalAddress {
        ip: from,
        interface,
    }) = from.filter(|from| from.ip.is_ipv4() == to.is_ipv4())
    else {
        return socket.send_to(data, to).await;
    };
    let fd = socket.as_raw_fd();
    let iov = [IoSlice::new(data)];
    socket
        .async_io(Interest::WRITABLE, || {
            let sent = match (to, from) {
                (SocketAddr::V4(to), IpAddr::V4(from)) => {
                    let info = libc::in_pktinfo {
                        ipi_ifindex: 0,
                        ipi_spec_dst: libc::in_addr {
                            s_addr: u32::from_ne_bytes(from.octets()),
                        },
                        ipi_addr: libc::in_addr { s_addr: 0 },
                    };
                    let control = [ControlMessage::Ipv4PacketInfo(&info)];
                    let to = SockaddrIn::from(to);
                    sendmsg(fd, &iov, &control, MsgFlags::empty(), Some(&to))
                }
                (SocketAddr::V6(to), IpAddr::V6(from)) => {
                    let info = libc::in6_pktinfo {
                        ipi6_addr: libc::in6_addr {
                            s6_addr: from.octets(),
                        },
                        ipi6_ifindex: interface,
                    };
                    let control = [ControlMessage::Ipv6PacketInfo(&info)];
                    let to = SockaddrIn6::from(to);
                    sendmsg(fd, &iov, &control, MsgFlags::empty(), Some(&to))
                }
                // Families were matched above.
                _ => return Err(io::ErrorKind::InvalidInput.into()),
            };
            sent.map_err(io::Error::from)
        })
        .await
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
