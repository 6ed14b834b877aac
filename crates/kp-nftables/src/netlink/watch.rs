//! The ruleset's commit notifications over netlink: [`NetlinkWatch`].
//!
//! A `NETLINK_NETFILTER` socket in the `NFNLGRP_NFTABLES` group receives,
//! for every commit in its network namespace, one message per object the
//! commit changed, each naming its table, then an `NFT_MSG_NEWGEN` with
//! the generation the commit produced. The kernel moves the generation on
//! before it sends a commit's notifications, so a commit whose generation
//! is later than one read after joining the group was received whole.

use std::io;

use kp_netlink::{Channel, Subscription, NETLINK_NETFILTER};

use super::msg::{self, Notification};
use crate::generation::{Observed, Touched, Watch};
use crate::names::TABLE;
use kp_model::IpFamily;

/// `NFNLGRP_NFTABLES`.
const GROUP_NFTABLES: u32 = 7;
/// The receive buffer: room for the notifications of many ordinary
/// commits between two syncs. A commit too large for it is lost and
/// counts as unknown.
const RECEIVE_BUFFER: usize = 4 << 20;
/// Bytes read at once: the kernel sends a commit's notifications in
/// datagrams of at most a page or two (`NLMSG_GOODSIZE`).
const DATAGRAM_BYTES: usize = 64 << 10;
/// `ENOBUFS`: notifications were dropped because the buffer was full.
const ENOBUFS: i32 = 105;

/// Commits up to which the watch may have missed notifications.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blind {
    /// Commits up to this generation may have been received in part.
    UpTo(u32),
    /// The generation could not be read: nothing counts until it can.
    Everything,
}

/// Receives the notifications of every commit in the network namespace
/// of the thread that opens it.
#[derive(Debug)]
pub struct NetlinkWatch {
    notifications: Subscription,
    /// Asks the generation on a socket of its own.
    asker: Channel,
    blind: Blind,
    /// What the commit being received changed so far.
    pending: Touched,
    buffer: Vec<u8>,
}

/// Whether generation `a` came after `b` (the counter wraps).
fn later(a: u32, b: u32) -> bool {
    a != b && a.wrapping_sub(b) < u32::MAX / 2
}

impl NetlinkWatch {
    /// Joins the group in the calling thread's network namespace.
    pub fn open() -> io::Result<Self> {
        let notifications = Subscription::open(NETLINK_NETFILTER, &[])?;
        // Past net.core.rmem_max only with CAP_NET_ADMIN, which the proxy
        // has; without it the default buffer still works, losing more.
        let _ = notifications.set_receive_buffer(RECEIVE_BUFFER);
        let mut watch = Self {
            notifications,
            asker: Channel::new(NETLINK_NETFILTER),
            blind: Blind::Everything,
            pending: Touched::default(),
            buffer: Vec::with_capacity(DATAGRAM_BYTES),
        };
        watch.join()?;
        Ok(watch)
    }

    /// Joins the group, then reads the generation: commits up to it may
    /// have been received in part.
    fn join(&mut self) -> io::Result<()> {
        self.notifications.join(GROUP_NFTABLES)?;
        self.mark_blind();
        Ok(())
    }

    /// Nothing up to the generation now counts as seen whole. A commit
    /// after it sends all its notifications after this, so what is
    /// pending now belongs to commits up to it, and their generation
    /// messages, still to come, drop it.
    fn mark_blind(&mut self) {
        self.pending = Touched::default();
        self.blind = match super::ask_generation(&mut self.asker) {
            Ok(generation) => Blind::UpTo(generation),
            Err(error) => {
                tracing::debug!(error = %error, "cannot read the nftables ruleset generation; commit notifications count as unknown");
                Blind::Everything
            }
        };
    }

    /// Takes in one notification.
    fn take(&mut self, notification: &Notification<'_>, out: &mut Vec<Observed>) {
        match *notification {
            Notification::Change { family, table } => {
                let family = match family {
                    2 => Some(IpFamily::V4),
                    10 => Some(IpFamily::V6),
                    _ => None,
                };
                match (family, table) {
                    (Some(family), Some(table)) if table == TABLE.as_bytes() => {
                        self.pending.add(family);
                    }
                    // A table of another name or family: not the proxy's.
                    (_, Some(_)) => {}
                    (_, None) => self.pending = Touched::BOTH,
                }
            }
            Notification::Generation(generation) => {
                let whole = match self.blind {
                    Blind::UpTo(blind) => later(generation, blind),
                    Blind::Everything => false,
                };
                if whole {
                    out.push(Observed {
                        generation,
                        touched: self.pending,
                    });
                }
                self.pending = Touched::default();
            }
        }
    }
}

impl Watch for NetlinkWatch {
    fn drain(&mut self, out: &mut Vec<Observed>) {
        let mut buffer = std::mem::take(&mut self.buffer);
        loop {
            match self.notifications.receive(&mut buffer) {
                Ok(received) => {
                    let mut notifications = Vec::new();
                    msg::parse_notifications(&buffer[..received], &mut notifications);
                    for notification in &notifications {
                        self.take(notification, out);
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) if error.raw_os_error() == Some(ENOBUFS) => {
                    tracing::debug!("nftables commit notifications were lost; the commits until now count as unknown");
                    self.mark_blind();
                }
                Err(error) => {
                    tracing::debug!(error = %error, "reading nftables commit notifications");
                    self.mark_blind();
                    break;
                }
            }
        }
        self.buffer = buffer;
    }

    fn pause(&mut self) {
        if let Err(error) = self.notifications.leave(GROUP_NFTABLES) {
            tracing::debug!(error = %error, "leaving the nftables notification group");
        }
    }

    fn resume(&mut self) {
        if let Err(error) = self.join() {
            tracing::debug!(error = %error, "joining the nftables notification group");
            self.blind = Blind::Everything;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_compare_across_the_wrap() {
        assert!(later(8, 7));
        assert!(!later(7, 7));
        assert!(!later(6, 7));
        assert!(later(1, u32::MAX));
        assert!(!later(u32::MAX, 1));
    }
}
