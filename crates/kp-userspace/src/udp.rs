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
//! drops it; so is one that no portal rule sent (see [`Route::classify`]).
//!
//! The sessions of every UDP listener of a relay live in one
//! [`SessionTable`] with a bound ([`crate::RelayOptions::max_udp_sessions`]):
//! each session holds a socket, that is a descriptor and an ephemeral port
//! of the node, and a flood of datagrams from spoofed sources would
//! otherwise take them all. At the bound, the oldest session is closed for
//! the new one (a session that saw traffic since it was last looked at is
//! given a second chance first, so a client that is talking survives a
//! flood of one-datagram sessions). When a sync takes an endpoint out of a
//! service port's route, the sessions to it are closed at once (upstream
//! deletes the conntrack entries of such flows in the same sync), so a
//! client sending from a fixed port reaches a remaining endpoint with its
//! next datagram.
//!
//! [`Route::classify`]: crate::route::Route::classify

use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{self, IoSlice, IoSliceMut};
use std::net::{IpAddr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::libc;
use nix::sys::socket::{
    recvmsg, sendmsg, setsockopt, sockopt, ControlMessage, ControlMessageOwned, MsgFlags,
    SockaddrIn, SockaddrIn6, SockaddrStorage,
};
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::task::AbortHandle;

use crate::balancer::Balancer;
use crate::conntrack::OriginalDestinations;
use crate::route::{Route, TrafficKind};
use crate::stats::ConnectionStats;
use crate::RelayOptions;

/// Largest datagram relayed (the largest a UDP payload can be).
const MAX_DATAGRAM: usize = 65_535;

thread_local! {
    /// The buffer answers from endpoints are read into and sent on from,
    /// one per thread of the runtime: reading and sending an answer does
    /// not wait, so no two sessions use it at once, and no session holds
    /// (or allocates) a buffer of its own.
    static ANSWER_BUFFER: RefCell<Box<[u8]>> = RefCell::new(vec![0; MAX_DATAGRAM].into_boxed_slice());
}

/// The UDP sessions of a relay's listeners, at most a fixed number.
#[derive(Debug)]
pub struct SessionTable {
    limit: usize,
    inner: Mutex<Table>,
}

/// A session's key: the listener's port and the client's address.
type SessionKey = (u16, SocketAddr);

#[derive(Debug, Default)]
struct Table {
    /// Sessions by listener port, then client.
    by_port: HashMap<u16, HashMap<SocketAddr, Entry>>,
    len: usize,
    /// Sessions in the order they were opened (or last given a second
    /// chance), with their ids; an entry whose session has ended is
    /// skipped when it comes up.
    order: VecDeque<(SessionKey, u64)>,
    next_id: u64,
}

#[derive(Debug)]
struct Entry {
    id: u64,
    session: Arc<Session>,
    /// The session's task passing answers back; aborting it ends the
    /// session (its socket closes with the last reference).
    answers: AbortHandle,
}

/// One client's session.
#[derive(Debug)]
struct Session {
    /// Connected to the endpoint.
    upstream: UdpSocket,
    /// The endpoint, and which of the route's lists it was picked from.
    endpoint: SocketAddr,
    kind: TrafficKind,
    /// The address the client sent to, and the interface it came in on;
    /// replies are sent from there.
    reply_from: Option<LocalAddress>,
    /// Milliseconds since `epoch` at the last datagram either way.
    last_active_ms: AtomicU64,
    epoch: Instant,
    /// A datagram passed since the table last looked at the session.
    used_again: AtomicBool,
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

impl SessionTable {
    /// A table of at most `limit` sessions (at least one).
    pub fn new(limit: usize) -> Self {
        Self {
            limit: limit.max(1),
            inner: Mutex::default(),
        }
    }

    /// How many sessions are open.
    pub fn len(&self) -> usize {
        lock(&self.inner).len
    }

    /// Whether no session is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most sessions open at once.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Closes the sessions of the listener on `port` whose endpoint is not
    /// among those `route` picks from for the session's kind of traffic;
    /// returns how many were closed.
    pub fn close_unused(&self, port: u16, route: &Route) -> usize {
        let internal: HashSet<SocketAddr> = route.internal.iter().copied().collect();
        let external: HashSet<SocketAddr> = route.external.iter().copied().collect();
        let mut table = lock(&self.inner);
        let Some(sessions) = table.by_port.get_mut(&port) else {
            return 0;
        };
        let before = sessions.len();
        sessions.retain(|_, entry| {
            let used = match entry.session.kind {
                TrafficKind::Internal => &internal,
                TrafficKind::External => &external,
            };
            let keep = used.contains(&entry.session.endpoint);
            if !keep {
                entry.answers.abort();
            }
            keep
        });
        let closed = before - sessions.len();
        table.len -= closed;
        closed
    }

    /// Closes every session of the listener on `port`.
    pub fn close_listener(&self, port: u16) -> usize {
        let mut table = lock(&self.inner);
        let Some(sessions) = table.by_port.remove(&port) else {
            return 0;
        };
        for entry in sessions.values() {
            entry.answers.abort();
        }
        table.len -= sessions.len();
        sessions.len()
    }

    fn get(&self, key: SessionKey) -> Option<Arc<Session>> {
        let table = lock(&self.inner);
        let session = table.by_port.get(&key.0)?.get(&key.1)?;
        Some(Arc::clone(&session.session))
    }

    /// Adds `session`, first closing the oldest sessions past the limit;
    /// `start` starts its answer loop, with the table locked, so that the
    /// loop cannot end and remove the session before it is in.
    fn insert(&self, key: SessionKey, session: Arc<Session>, start: impl FnOnce() -> AbortHandle) {
        let mut table = lock(&self.inner);
        let answers = start();
        while table.len >= self.limit && table.evict_oldest() {}
        let id = table.next_id;
        table.next_id += 1;
        let replaced = table.by_port.entry(key.0).or_default().insert(
            key.1,
            Entry {
                id,
                session,
                answers,
            },
        );
        match replaced {
            Some(old) => old.answers.abort(),
            None => table.len += 1,
        }
        table.order.push_back((key, id));
        // Entries of sessions that ended on their own pile up in the
        // order; dropping them when they outnumber the sessions keeps it
        // within twice the table, at a cost spread over the inserts.
        if table.order.len() > 2 * table.len + 64 {
            let Table { by_port, order, .. } = &mut *table;
            order.retain(|(key, id)| {
                by_port
                    .get(&key.0)
                    .and_then(|sessions| sessions.get(&key.1))
                    .is_some_and(|entry| entry.id == *id)
            });
        }
    }

    /// Removes `session` of `key` if it is still the one in the table.
    fn remove(&self, key: SessionKey, session: &Arc<Session>) {
        let mut table = lock(&self.inner);
        let Some(sessions) = table.by_port.get_mut(&key.0) else {
            return;
        };
        if sessions
            .get(&key.1)
            .is_some_and(|entry| Arc::ptr_eq(&entry.session, session))
        {
            sessions.remove(&key.1);
            if sessions.is_empty() {
                table.by_port.remove(&key.0);
            }
            table.len -= 1;
        }
    }
}

impl Table {
    /// Closes the oldest session, giving each that was used since it was
    /// queued one more round; false when there is nothing to close.
    fn evict_oldest(&mut self) -> bool {
        // Every live session is in the order; each is given at most one
        // second chance per call, so this ends.
        let mut chances = self.order.len();
        while let Some((key, id)) = self.order.pop_front() {
            let Some(sessions) = self.by_port.get_mut(&key.0) else {
                continue;
            };
            let Some(entry) = sessions.get(&key.1).filter(|entry| entry.id == id) else {
                continue;
            };
            if chances > 0 && entry.session.used_again.swap(false, Ordering::Relaxed) {
                chances -= 1;
                self.order.push_back((key, id));
                continue;
            }
            entry.answers.abort();
            sessions.remove(&key.1);
            if sessions.is_empty() {
                self.by_port.remove(&key.0);
            }
            self.len -= 1;
            return true;
        }
        false
    }
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

/// What a listener's receive loop shares with the relay.
#[derive(Debug)]
pub struct UdpListener {
    /// The listening socket.
    pub socket: Arc<UdpSocket>,
    /// The service port's endpoint selection.
    pub balancer: Arc<Balancer>,
    /// The service port's counters.
    pub stats: Arc<ConnectionStats>,
    /// The relay's options.
    pub options: Arc<RelayOptions>,
    /// The relay's sessions.
    pub sessions: Arc<SessionTable>,
}

/// Relays datagrams arriving on the listener's socket until the task is
/// aborted. Sessions end by their idle timeout, when their endpoint leaves
/// the route, when the relay closes the listener, or to make room.
pub async fn serve(listener: UdpListener) {
    // One buffer per listener for the clients' datagrams, for its life.
    let mut buffer = vec![0u8; MAX_DATAGRAM];
    let port = listener.socket.local_addr().map_or(0, |addr| addr.port());
    let mut destinations = OriginalDestinations::new();
    loop {
        let received = match receive(&listener.socket, &mut buffer).await {
            Ok(received) => received,
            Err(error) => {
                tracing::debug!(%error, "receiving a datagram failed");
                continue;
            }
        };
        let key = (port, received.client);
        let session = match listener.sessions.get(key) {
            Some(session) => {
                session.used_again.store(true, Ordering::Relaxed);
                session
            }
            None => match listener.open_session(port, &received, &mut destinations) {
                Some(session) => session,
                None => continue,
            },
        };
        session.touch();
        // A UDP send waits only for room in the socket buffer.
        if let Err(error) = session.upstream.send(&buffer[..received.len]).await {
            tracing::trace!(client = %received.client, %error, "forwarding a datagram failed");
        }
    }
}

impl UdpListener {
    /// Starts a session for the sender of `received`, or `None` when the
    /// client is not allowed or no endpoint can take it.
    fn open_session(
        &self,
        port: u16,
        received: &Received,
        destinations: &mut OriginalDestinations,
    ) -> Option<Arc<Session>> {
        let client = received.client;
        let route = self.balancer.route();
        let original = match received.destination {
            Some(local) if route.needs_classification() => {
                destinations.udp(client, SocketAddr::new(local.ip, port))
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
            endpoint,
            kind,
            reply_from: received.destination,
            last_active_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            used_again: AtomicBool::new(false),
        });
        let key = (port, client);
        self.sessions.insert(key, Arc::clone(&session), || {
            tokio::spawn(answer_loop(
                Arc::clone(&self.socket),
                Arc::clone(&session),
                key,
                Arc::clone(&self.sessions),
                Arc::clone(&self.stats),
                self.options.udp_idle_timeout,
            ))
            .abort_handle()
        });
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

/// Passes the endpoint's answers back to the client of `key` until the
/// session idles out, then removes it. Aborted when the table closes the
/// session.
async fn answer_loop(
    listener: Arc<UdpSocket>,
    session: Arc<Session>,
    key: SessionKey,
    sessions: Arc<SessionTable>,
    stats: Arc<ConnectionStats>,
    idle_timeout: Duration,
) {
    let _active = stats.active_guard();
    let client = key.1;
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
        let answered = ANSWER_BUFFER.with_borrow_mut(|buffer| {
            let len = session.upstream.try_recv(buffer)?;
            session.touch();
            // An answer that finds the listener's send buffer full is
            // dropped, as the network would drop it: waiting here would
            // hold the thread's buffer.
            if let Err(error) = send_from(
                listener.as_raw_fd(),
                &buffer[..len],
                client,
                session.reply_from,
            ) {
                tracing::trace!(%client, %error, "answering a client failed");
            }
            Ok::<_, io::Error>(())
        });
        match answered {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
            // The endpoint's port is closed (ICMP unreachable): the
            // session is over.
            Err(_) => break,
        }
    }
    sessions.remove(key, &session);
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
/// routing picks, without one) on the non-blocking socket `fd`, without
/// waiting: `WouldBlock` when its send buffer is full.
fn send_from(
    fd: RawFd,
    data: &[u8],
    to: SocketAddr,
    from: Option<LocalAddress>,
) -> io::Result<usize> {
    let iov = [IoSlice::new(data)];
    let from = from.filter(|from| from.ip.is_ipv4() == to.is_ipv4());
    let sent = match (to, from) {
        (
            SocketAddr::V4(to),
            Some(LocalAddress {
                ip: IpAddr::V4(from),
                ..
            }),
        ) => {
            let info = libc::in_pktinfo {
                ipi_ifindex: 0,
                ipi_spec_dst: libc::in_addr {
                    s_addr: u32::from_ne_bytes(from.octets()),
                },
                ipi_addr: libc::in_addr { s_addr: 0 },
            };
            let control = [ControlMessage::Ipv4PacketInfo(&info)];
            sendmsg(
                fd,
                &iov,
                &control,
                MsgFlags::MSG_DONTWAIT,
                Some(&SockaddrIn::from(to)),
            )
        }
        (
            SocketAddr::V6(to),
            Some(LocalAddress {
                ip: IpAddr::V6(from),
                interface,
            }),
        ) => {
            let info = libc::in6_pktinfo {
                ipi6_addr: libc::in6_addr {
                    s6_addr: from.octets(),
                },
                ipi6_ifindex: interface,
            };
            let control = [ControlMessage::Ipv6PacketInfo(&info)];
            sendmsg(
                fd,
                &iov,
                &control,
                MsgFlags::MSG_DONTWAIT,
                Some(&SockaddrIn6::from(to)),
            )
        }
        (SocketAddr::V4(to), _) => sendmsg(
            fd,
            &iov,
            &[],
            MsgFlags::MSG_DONTWAIT,
            Some(&SockaddrIn::from(to)),
        ),
        (SocketAddr::V6(to), _) => sendmsg(
            fd,
            &iov,
            &[],
            MsgFlags::MSG_DONTWAIT,
            Some(&SockaddrIn6::from(to)),
        ),
    };
    sent.map_err(io::Error::from)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
