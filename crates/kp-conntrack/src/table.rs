//! The conntrack table as the cleaner uses it: list one family's flows,
//! delete flows. [`NetlinkConntrack`](crate::NetlinkConntrack) is the real
//! table; [`FakeConntrack`] an in-memory one for tests.

use std::io;
#[cfg(test)]
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use kp_model::IpFamily;

use crate::flow::Flow;

/// Lists and deletes conntrack entries of the calling thread's network
/// namespace.
pub trait ConntrackTable: Send {
    /// Every entry of `family` (`conntrack -L -f ipv4` or `-f ipv6`).
    fn list(&mut self, family: IpFamily) -> Result<Listing, ConntrackError>;

    /// Deletes each of `flows`, found by its original tuple and zone
    /// (`conntrack -D -p udp -s SRC -d DST --sport SPORT --dport DPORT`).
    /// A flow that is already gone is not an error. An `Err` means the
    /// table could not be reached at all; failures of single flows are
    /// reported in [`Deletion::failed`].
    fn delete(&mut self, flows: &[Flow]) -> Result<Deletion, ConntrackError>;
}

/// The result of [`ConntrackTable::list`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// The entries, in the kernel's order.
    pub flows: Vec<Flow>,
    /// The kernel reported that the table changed while it was dumped
    /// (`NLM_F_DUMP_INTR`): some entries may be missing or listed twice.
    pub interrupted: bool,
    /// Entries that could not be decoded (skipped).
    pub undecodable: usize,
}

/// The result of [`ConntrackTable::delete`].
#[derive(Debug, Default)]
pub struct Deletion {
    /// Entries the kernel deleted.
    pub deleted: usize,
    /// Entries that were gone already (`ENOENT`).
    pub already_gone: usize,
    /// Entries the kernel refused to delete, with its error.
    pub failed: Vec<(Flow, io::Error)>,
}

/// The conntrack table could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    /// Opening the `NETLINK_NETFILTER` socket failed (no permission, or no
    /// netfilter netlink support in the kernel).
    #[error("opening a NETLINK_NETFILTER socket failed")]
    OpenSocket(#[source] io::Error),
    /// Sending a request to the kernel failed.
    #[error("sending the {request} request to ctnetlink failed")]
    Send {
        /// `dump`, `delete` or `lookup`.
        request: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Receiving the kernel's answer failed, or it could not be
    /// understood.
    #[error("receiving the answer to the {request} request from ctnetlink failed")]
    Receive {
        /// `dump`, `delete` or `lookup`.
        request: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The kernel refused the request.
    #[error("ctnetlink refused the {request} request")]
    Kernel {
        /// `dump`, `delete` or `lookup`.
        request: &'static str,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
}

#[cfg(test)]
/// An in-memory conntrack table for this crate's tests: clones share one table, so a
/// test keeps one clone to look at what the cleaner left.
#[derive(Debug, Clone, Default)]
pub struct FakeConntrack {
    state: Arc<Mutex<FakeState>>,
}

#[cfg(test)]
#[derive(Debug, Default)]
struct FakeState {
    flows: Vec<Flow>,
    fail_listing: bool,
    lists: usize,
}

#[cfg(test)]
impl FakeConntrack {
    /// A table holding `flows`.
    pub fn with_flows(flows: impl IntoIterator<Item = Flow>) -> Self {
        let fake = Self::default();
        fake.lock().flows.extend(flows);
        fake
    }

    /// Adds `flow`.
    pub fn insert(&self, flow: Flow) {
        self.lock().flows.push(flow);
    }

    /// The flows now in the table.
    pub fn flows(&self) -> Vec<Flow> {
        self.lock().flows.clone()
    }

    /// Makes every [`list`](ConntrackTable::list) fail (`true`) or work
    /// again (`false`).
    pub fn fail_listing(&self, fail: bool) {
        self.lock().fail_listing = fail;
    }

    /// How many times the table was listed.
    pub fn list_calls(&self) -> usize {
        self.lock().lists
    }

    fn lock(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
impl ConntrackTable for FakeConntrack {
    fn list(&mut self, family: IpFamily) -> Result<Listing, ConntrackError> {
        let mut state = self.lock();
        state.lists += 1;
        if state.fail_listing {
            return Err(ConntrackError::Kernel {
                request: "dump",
                source: io::Error::from(io::ErrorKind::PermissionDenied),
            });
        }
        let flows = state
            .flows
            .iter()
            .filter(|flow| flow.family() == family)
            .copied()
            .collect();
        Ok(Listing {
            flows,
            ..Listing::default()
        })
    }

    fn delete(&mut self, flows: &[Flow]) -> Result<Deletion, ConntrackError> {
        let mut state = self.lock();
        let mut deletion = Deletion::default();
        for flow in flows {
            let before = state.flows.len();
            state.flows.retain(|kept| {
                (kept.protocol, kept.original, kept.zone)
                    != (flow.protocol, flow.original, flow.zone)
            });
            if state.flows.len() < before {
                deletion.deleted += 1;
            } else {
                deletion.already_gone += 1;
            }
        }
        Ok(deletion)
    }
}
