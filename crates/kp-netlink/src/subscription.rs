//! [`Subscription`]: a socket in multicast groups of the kernel's
//! notifications (as `ip monitor` listens), read without blocking.

use std::io;

use netlink_sys::Socket;
use nix::sys::socket::{setsockopt, sockopt};

use crate::Error;

/// A netlink socket of one protocol subscribed to multicast groups, in the
/// network namespace of the thread that opens it. Kept apart from a
/// [`Channel`](crate::Channel), so that notifications never mix with the
/// answers to requests.
#[derive(Debug)]
pub struct Subscription {
    socket: Socket,
}

impl Subscription {
    /// A non-blocking socket of `protocol` in each of `groups`
    /// (`RTNLGRP_*`, `NFNLGRP_*`).
    pub fn open(protocol: isize, groups: &[u32]) -> Result<Self, Error> {
        let step = |step: &'static str| move |source| Error::Open { step, source };
        let mut socket = Socket::new(protocol).map_err(step("creating the notification socket"))?;
        socket
            .bind_auto()
            .map_err(step("binding the notification socket"))?;
        for group in groups {
            socket
                .add_membership(*group)
                .map_err(step("subscribing to notifications"))?;
        }
        socket
            .set_non_blocking(true)
            .map_err(step("making the notification socket non-blocking"))?;
        Ok(Self { socket })
    }

    /// Raises the socket's receive buffer to `bytes`, so that more
    /// notifications wait between two reads before the kernel drops them
    /// (`ENOBUFS`). Past `net.core.rmem_max` this needs `CAP_NET_ADMIN`.
    pub fn set_receive_buffer(&self, bytes: usize) -> io::Result<()> {
        setsockopt(&self.socket, sockopt::RcvBufForce, &bytes).map_err(io::Error::from)
    }

    /// Joins multicast group `group` (again, after [`Subscription::leave`]).
    pub fn join(&self, group: u32) -> io::Result<()> {
        self.socket.add_membership(group)
    }

    /// Leaves multicast group `group`: no notification of it is queued
    /// until it is joined again.
    pub fn leave(&self, group: u32) -> io::Result<()> {
        self.socket.drop_membership(group)
    }

    /// Reads the next pending notification datagram into `buffer` (its
    /// capacity bounds what is kept of it) and returns its length;
    /// `WouldBlock` when none is pending, `ENOBUFS` once after the queue
    /// overflowed and notifications were lost (netlink(7)).
    pub fn receive(&self, buffer: &mut Vec<u8>) -> io::Result<usize> {
        buffer.clear();
        self.socket.recv(buffer, 0)
    }
}
