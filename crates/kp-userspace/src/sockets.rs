//! Socket set-up the relay needs beyond what tokio offers: binding with
//! `SO_REUSEADDR`, one TCP port shared by several sockets of this process
//! (`SO_REUSEPORT`), a TCP port held without listening, the address a
//! redirected connection was first sent to, and resets.

use std::io;
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::AsFd;
use std::time::Duration;

use nix::sys::socket::{getsockopt, setsockopt, sockopt, SockaddrIn, SockaddrIn6};
use socket2::{Domain, Protocol, SockRef, Socket, TcpKeepalive, Type};

use crate::{TCP_KEEPALIVE, TCP_KEEPALIVE_PROBES};

/// Listen backlog of every TCP listener: as deep as the kernel allows
/// (`net.core.somaxconn` caps it), so bursts of connections queue instead
/// of being dropped.
pub const LISTEN_BACKLOG: i32 = 4096;

/// A TCP socket bound to `addr` (port 0: any free port) with
/// `SO_REUSEADDR`, so the port can be bound again while connections of an
/// earlier listener on it are still open. IPv6 sockets are IPv6 only.
pub fn bind_tcp(addr: SocketAddr) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    prepare(&socket, addr)?;
    socket.bind(&addr.into())?;
    Ok(socket)
}

/// `count` TCP sockets (at least one) bound to the same port of `addr`'s
/// address (port 0: any free port), to listen on side by side: the kernel
/// spreads new connections over them.
///
/// The first is bound without `SO_REUSEPORT`, so a port that any other
/// socket holds is refused as [`bind_tcp`] refuses it, with
/// `AddrInUse`: a socket of another program (or another listener of this
/// relay, or one still closing) that has `SO_REUSEPORT` would otherwise
/// share its port with ours, and take some of its connections. Only then
/// is `SO_REUSEPORT` turned on and the others bound next to it (Linux
/// checks each bind against the flags the bound sockets have at that
/// moment, and forms the group when they listen).
pub fn bind_tcp_group(addr: SocketAddr, count: usize) -> io::Result<Vec<Socket>> {
    let first = bind_tcp(addr)?;
    if count <= 1 {
        return Ok(vec![first]);
    }
    set_reuse_port(&first)?;
    let bound = first
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::other("socket has no IP address"))?;
    let mut group = Vec::with_capacity(count);
    group.push(first);
    for _ in 1..count {
        let socket = Socket::new(
            Domain::for_address(bound),
            Type::STREAM,
            Some(Protocol::TCP),
        )?;
        socket.set_reuse_address(true)?;
        set_reuse_port(&socket)?;
        prepare(&socket, bound)?;
        socket.bind(&bound.into())?;
        group.push(socket);
    }
    Ok(group)
}

/// Turns on TCP keepalive with [`TCP_KEEPALIVE`] idle time and interval
/// and [`TCP_KEEPALIVE_PROBES`] probes (`SO_KEEPALIVE`, `TCP_KEEPIDLE`,
/// `TCP_KEEPINTVL`, `TCP_KEEPCNT`). Set on a listening socket, it is
/// handed on to every connection accepted from it.
pub fn set_keepalive(socket: &impl AsFd) -> io::Result<()> {
    let keepalive = TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE)
        .with_interval(TCP_KEEPALIVE)
        .with_retries(TCP_KEEPALIVE_PROBES);
    SockRef::from(socket).set_tcp_keepalive(&keepalive)
}

/// A UDP socket bound to `addr`, non-blocking, without `SO_REUSEADDR`
/// (which would let two UDP sockets share a port).
pub fn bind_udp(addr: SocketAddr) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    prepare(&socket, addr)?;
    socket.bind(&addr.into())?;
    Ok(socket)
}

fn set_reuse_port(socket: &Socket) -> io::Result<()> {
    setsockopt(socket, sockopt::ReusePort, &true).map_err(io::Error::from)
}

fn prepare(socket: &Socket, addr: SocketAddr) -> io::Result<()> {
    socket.set_nonblocking(true)?;
    socket.set_cloexec(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    Ok(())
}

/// The address a connection was sent to before a `REDIRECT` or `DNAT`
/// rule rewrote it (`SO_ORIGINAL_DST`, `IP6T_SO_ORIGINAL_DST`); `None`
/// when conntrack does not know the connection. Without a rewrite it is
/// the socket's own address.
pub fn original_destination(socket: &impl AsFd, ipv6: bool) -> Option<SocketAddr> {
    if ipv6 {
        getsockopt(socket, sockopt::Ip6tOriginalDst)
            .ok()
            .map(|raw| SocketAddr::V6(SocketAddrV6::from(SockaddrIn6::from(raw))))
    } else {
        getsockopt(socket, sockopt::OriginalDst)
            .ok()
            .map(|raw| SocketAddr::V4(SocketAddrV4::from(SockaddrIn::from(raw))))
    }
}

/// Closes `socket` with a reset instead of an orderly close
/// (`SO_LINGER` with a zero timeout), so the client learns at once that
/// nothing will answer.
pub fn reset(socket: &impl AsFd) {
    // Best effort: the socket is closed right after, reset or not.
    let _ = SockRef::from(socket).set_linger(Some(Duration::ZERO));
}

/// Half-closes `socket` for writing (`shutdown(SHUT_WR)`), passing an
/// end of stream on to the peer.
pub fn shutdown_write(socket: &impl AsFd) -> io::Result<()> {
    match SockRef::from(socket).shutdown(std::net::Shutdown::Write) {
        Err(error) if error.kind() == io::ErrorKind::NotConnected => Ok(()),
        other => other,
    }
}
