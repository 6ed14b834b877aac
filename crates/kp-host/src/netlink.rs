//! [`NetlinkTransport`]: the real rtnetlink sockets.

use std::io;

use kp_netlink::{Channel, Subscription, NETLINK_ROUTE};
use nix::errno::Errno;

use crate::cache::{Notification, RouteTransport};
use crate::message::{dump_error, dump_request, RTNLGRP_IPV4_IFADDR, RTNLGRP_IPV6_IFADDR};
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
    requests: Channel,
    notifications: Subscription,
}

impl NetlinkTransport {
    /// Subscribes to address changes in the calling thread's network
    /// namespace; the request socket is opened by the first dump, in the
    /// same thread. The subscription comes first, so that a change made
    /// before the first dump is either in the dump or in the queue.
    pub fn open() -> Result<Self, HostError> {
        let notifications =
            Subscription::open(NETLINK_ROUTE, &[RTNLGRP_IPV4_IFADDR, RTNLGRP_IPV6_IFADDR])
                .map_err(dump_error)?;
        Ok(Self {
            requests: Channel::new(NETLINK_ROUTE),
            notifications,
        })
    }
}

impl RouteTransport for NetlinkTransport {
    fn dump_addresses(&mut self, on_message: &mut dyn FnMut(&[u8])) -> Result<(), HostError> {
        self.requests
            .dump(dump_request(), |reply| on_message(reply.bytes))
            .map_err(dump_error)
    }

    fn next_notification(&mut self) -> Result<Notification, HostError> {
        let mut buffer = Vec::with_capacity(NOTIFICATION_BUFFER);
        classify_notification(self.notifications.receive(&mut buffer))
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
