//! [`HostAddresses`]: the cache, and the decision when to dump again.

use std::net::IpAddr;

use crate::message::address_in;
use crate::netlink::NetlinkTransport;
use crate::HostError;

/// Notifications read per call at most. A host whose addresses change
/// faster than this is dumped again anyway; what is left in the queue
/// makes the next call dump once more.
const MAX_DRAINED: usize = 1024;

/// What the notification socket had pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notification {
    /// Nothing: the queue is empty.
    Nothing,
    /// One address change notification (its content does not matter).
    Changed,
    /// The queue overflowed (`ENOBUFS`): notifications were lost.
    Lost,
}

/// The two rtnetlink sockets the cache uses: one for address dumps, one
/// subscribed to address changes. [`NetlinkTransport`] is the real one;
/// tests use a fake.
pub trait RouteTransport {
    /// Dumps every address of both families (`ip address show`): hands
    /// each message of the kernel's answer (`RTM_NEWADDR`, whole) to
    /// `on_message`, up to the end of the dump, or fails.
    fn dump_addresses(&mut self, on_message: &mut dyn FnMut(&[u8])) -> Result<(), HostError>;

    /// Takes the next pending notification, never waiting.
    fn next_notification(&mut self) -> Result<Notification, HostError>;
}

/// The host's addresses, dumped with rtnetlink and cached until the kernel
/// announces a change (see the crate documentation).
///
/// The transport is opened on the first read, in the network namespace of
/// the thread doing it; after a failed read it is closed and opened again
/// on the next one.
pub struct HostAddresses<T = NetlinkTransport> {
    open: Box<dyn FnMut() -> Result<T, HostError> + Send>,
    transport: Option<T>,
    /// Sorted, without duplicates; `None` until a dump succeeded.
    cached: Option<Vec<IpAddr>>,
    dumps: u64,
}

impl HostAddresses<NetlinkTransport> {
    /// A cache over rtnetlink sockets, opened on first use.
    pub fn new() -> Self {
        Self::with_opener(NetlinkTransport::open)
    }
}

impl Default for HostAddresses<NetlinkTransport> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: RouteTransport> HostAddresses<T> {
    /// A cache over the transport `open` returns, called on first use and
    /// again after a failure.
    pub fn with_opener(open: impl FnMut() -> Result<T, HostError> + Send + 'static) -> Self {
        Self {
            open: Box::new(open),
            transport: None,
            cached: None,
            dumps: 0,
        }
    }

    /// Every address of the host, sorted: the cache, dumped again first if
    /// an address changed since the last call (or notifications were lost).
    pub fn addresses(&mut self) -> Result<&[IpAddr], HostError> {
        self.read(false)
    }

    /// Every address of the host, sorted, from a new dump whatever the
    /// notifications say.
    pub fn refresh(&mut self) -> Result<&[IpAddr], HostError> {
        self.read(true)
    }

    /// How many dumps this cache has made: a figure for tests and
    /// benchmarks.
    pub fn dumps(&self) -> u64 {
        self.dumps
    }

    fn read(&mut self, force: bool) -> Result<&[IpAddr], HostError> {
        if let Err(error) = self.update(force) {
            // A half-read dump or queue leaves the sockets in an unknown
            // state: start afresh next time.
            self.transport = None;
            self.cached = None;
            return Err(error);
        }
        Ok(self.cached.as_deref().unwrap_or_default())
    }

    fn update(&mut self, force: bool) -> Result<(), HostError> {
        let transport = match &mut self.transport {
            Some(transport) => transport,
            slot @ None => {
                self.cached = None;
                slot.insert((self.open)()?)
            }
        };
        // Drain first, dump second: a change during the dump leaves a
        // notification behind, and the next call dumps again.
        let changed = drain_notifications(transport)?;
        if !(changed || force || self.cached.is_none()) {
            return Ok(());
        }
        let addresses = dump(transport)?;
        self.dumps += 1;
        tracing::debug!(
            addresses = addresses.len(),
            changed,
            force,
            "dumped the host's addresses"
        );
        self.cached = Some(addresses);
        Ok(())
    }
}

/// Reads every pending notification; whether any said something changed
/// or was lost.
fn drain_notifications(transport: &mut impl RouteTransport) -> Result<bool, HostError> {
    let mut changed = false;
    for _ in 0..MAX_DRAINED {
        match transport.next_notification()? {
            Notification::Nothing => return Ok(changed),
            Notification::Changed => changed = true,
            Notification::Lost => {
                tracing::debug!("address change notifications were lost; dumping again");
                changed = true;
            }
        }
    }
    Ok(true)
}

/// One address dump: every address of both families, sorted, without
/// duplicates (an IPv6 link-local address may sit on many interfaces). A
/// message that cannot be decoded fails the dump: the address it held
/// could be the one a caller looks for.
fn dump(transport: &mut impl RouteTransport) -> Result<Vec<IpAddr>, HostError> {
    let mut found = Vec::new();
    let mut undecodable = None;
    transport.dump_addresses(&mut |message| match address_in(message) {
        Ok(address) => found.extend(address),
        Err(error) => {
            undecodable.get_or_insert(error);
        }
    })?;
    if let Some(error) = undecodable {
        return Err(error);
    }
    found.sort_unstable();
    found.dedup();
    Ok(found)
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
