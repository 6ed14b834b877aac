//! The address a UDP datagram was sent to before a portal rule rewrote it,
//! read from the conntrack table over ctnetlink.
//!
//! For TCP the kernel answers `SO_ORIGINAL_DST` on the accepted socket; for
//! UDP it refuses (`getorigdst` serves TCP and SCTP only), and the
//! listener's socket is not tied to one client anyway. The conntrack entry
//! is there all the same: a datagram from `C:cp` to `VIP:vp` redirected to
//! the listener `L:lp` has the reply tuple `L:lp → C:cp`, which the relay
//! knows (the client's address from `recvmsg`, `L` from `IP_PKTINFO`), and
//! the entry's original tuple names `VIP:vp`. The same question on the
//! command line:
//!
//! ```text
//! conntrack -G -p udp --reply-src L --reply-dst C --reply-port-src lp --reply-port-dst cp
//! ```
//!
//! The entry exists by the time the listener reads the datagram: conntrack
//! confirms it in `INPUT`, before the socket's queue. The kernel handles a
//! netlink request inside `sendmsg`, so the answer is queued when `send`
//! returns and reading it never blocks.

use std::net::SocketAddr;

use kp_conntrack::NetlinkConntrack;

/// Looks up original destinations of UDP datagrams; one per listener, its
/// socket opened on first use in the namespace of the calling thread, and
/// opened again after a failure.
#[derive(Debug)]
pub struct OriginalDestinations {
    table: NetlinkConntrack,
}

impl Default for OriginalDestinations {
    fn default() -> Self {
        Self::new()
    }
}

impl OriginalDestinations {
    /// A lookup whose socket is opened on first use.
    pub fn new() -> Self {
        Self {
            table: NetlinkConntrack::for_lookups(),
        }
    }

    /// Where the datagram from `client`, received at `local` (after the
    /// rewrite), was sent; `None` when conntrack does not know it or
    /// cannot be asked.
    pub fn udp(&mut self, client: SocketAddr, local: SocketAddr) -> Option<SocketAddr> {
        match self.table.udp_original_destination(client, local) {
            Ok(found) => found,
            Err(error) => {
                tracing::debug!(%client, %local, %error, "asking conntrack for a datagram's original destination failed");
                None
            }
        }
    }
}
