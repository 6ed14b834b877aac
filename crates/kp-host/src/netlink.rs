//! [`NetlinkTransport`]: the real rtnetlink sockets.

use std::io;

use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use nix::errno::Errno;

use crate::cache::{Notification, RouteTransport};
use crate::message::{RTNLGRP_IPV4_IFADDR, RTNLGRP_IPV6_IFADDR};
use crate::HostError;

/// Notifications are only counted, never parsed: a short buffer is enough
/// (the rest of a longer datagram is discarded).
const NOTIFICATION_BUFFER: usize = 512;

/// Two `NETLINK_ROUTE` sockets of the namespace of the thread that opened
/// them: one for dump requests and their answers, one subscribed to
/// address changes (as `ip monitor address` is) and read without blocking.
///
/// Two sockets, so that notifications never mix with dump answers.
#[derive(Debug)]
pub struct NetlinkTransport {
    requests: Socket,
    notifications: Socket,
}

impl NetlinkTransport {
    /// Opens both sockets in the calling thread's network namespace. The
    /// notification socket is subscribed first, so that a change made
    /// before the first dump is either in the dump or in the queue.
    pub fn open() -> Result<Self, HostError> {
        let notifications = subscribed_socket()?;
        let mut requests = socket("creating the request socket")?;
        requests
            .bind_auto()
            .map_err(open_error("binding the request socket"))?;
        requests
            .connect(&SocketAddr::new(0, 0))
            .map_err(open_error("connecting the request socket to the kernel"))?;
        Ok(Self {
            requests,
            notifications,
        })
    }
}

impl RouteTransport for NetlinkTransport {
    fn send_request(&mut self, datagram: &[u8]) -> Result<(), HostError> {
        self.requests
            .send(datagram, 0)
            .map(drop)
            .map_err(HostError::Send)
    }

    fn receive_answer(&mut self, buffer: &mut Vec<u8>) -> Result<(), HostError> {
        buffer.clear();
        self.requests
            .recv(buffer, 0)
            .map(drop)
            .map_err(|source| HostError::Receive {
                step: "reading the address dump",
                source,
            })
    }

    fn next_notification(&mut self) -> Result<Notification, HostError> {
        let mut buffer = Vec::with_capacity(NOTIFICATION_BUFFER);
        classify_notification(self.notifications.recv(&mut buffer, 0))
    }
}

/// What one non-blocking receive on the notification socket means.
pub(crate) fn classify_notification(
    received: io::Result<usize>,
) -> Result<Notification, HostError> {
    match received {
        Ok(_) => Ok(Notification::Changed),
        Err(error) if error.kind() == io::ErrorKind::WouldBlock => Ok(Notification::Nothing),
        // The kernel reports a full receive queue once, on the next read,
        // and goes on queueing after it (netlink(7)).
        Err(error) if error.raw_os_error() == Some(Errno::ENOBUFS as i32) => Ok(Notification::Lost),
        Err(source) => Err(HostError::Receive {
            step: "reading address change notifications",
            source,
        }),
    }
}

/// A `NETLINK_ROUTE` socket in the groups of IPv4 and IPv6 address
/// changes, non-blocking.
fn subscribed_socket() -> Result<Socket, HostError> {
    let mut socket = socket("creating the notification socket")?;
    socket
        .bind_auto()
        .map_err(open_error("binding the notification socket"))?;
    for group in [RTNLGRP_IPV4_IFADDR, RTNLGRP_IPV6_IFADDR] {
        socket
            .add_membership(group)
            .map_err(open_error("subscribing to address changes"))?;
    }
    socket
        .set_non_blocking(true)
        .map_err(open_error("making the notification socket non-blocking"))?;
    Ok(socket)
}

fn socket(step: &'static str) -> Result<Socket, HostError> {
    Socket::new(NETLINK_ROUTE).map_err(open_error(step))
}

fn open_error(step: &'static str) -> impl FnOnce(io::Error) -> HostError {
    move |source| HostError::Open { step, source }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn an_empty_queue_is_nothing_a_datagram_a_change_and_enobufs_a_loss() {
        let nothing = classify_notification(Err(io::ErrorKind::WouldBlock.into()));
        assert_eq!(nothing.unwrap(), Notification::Nothing);
        assert_eq!(
            classify_notification(Ok(76)).unwrap(),
            Notification::Changed
        );
        let overflow = io::Error::from_raw_os_error(Errno::ENOBUFS as i32);
        assert_eq!(
            classify_notification(Err(overflow)).unwrap(),
            Notification::Lost
        );
    }

    #[test]
    fn other_receive_errors_are_reported() {
        let error = io::Error::from_raw_os_error(Errno::EBADF as i32);
        let error = classify_notification(Err(error)).unwrap_err();
        assert!(
            error.to_string().contains("notifications"),
            "unexpected error: {error}"
        );
    }
}
