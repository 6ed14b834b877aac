//! The addresses of the host's interfaces, which the backend needs besides
//! iptables (its sysctls are [`kp_node::Sysctl`]s). Addresses are read in
//! the namespace of the thread that first asked for them (see
//! [`kp_host`]).

use std::io;
use std::net::IpAddr;

use kp_host::HostAddresses;

/// Every address of the host's interfaces, IPv4 and IPv6, sorted, in the
/// network namespace of the calling thread: an rtnetlink dump cached per
/// thread and dumped again only after the kernel announced an address
/// change (see [`kp_host`]).
pub fn local_addresses() -> io::Result<Vec<IpAddr>> {
    kp_host::local_addresses().map_err(io::Error::other)
}

/// Where the backend gets the host's addresses from.
pub(crate) trait LocalAddresses: Send {
    /// The addresses; with `refresh`, read from the kernel even when
    /// nothing says they changed.
    fn list(&mut self, refresh: bool) -> io::Result<Vec<IpAddr>>;
}

/// A function as [`LocalAddresses`], for tests: `refresh` changes nothing.
pub(crate) struct FromFn<F>(pub(crate) F);

impl LocalAddresses for HostAddresses {
    fn list(&mut self, refresh: bool) -> io::Result<Vec<IpAddr>> {
        let addresses = if refresh {
            self.refresh()
        } else {
            self.addresses()
        };
        addresses.map(<[IpAddr]>::to_vec).map_err(io::Error::other)
    }
}

impl<F: FnMut() -> io::Result<Vec<IpAddr>> + Send> LocalAddresses for FromFn<F> {
    fn list(&mut self, _refresh: bool) -> io::Result<Vec<IpAddr>> {
        (self.0)()
    }
}
