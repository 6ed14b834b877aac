//! What the backend needs of the host besides iptables: sysctls and the
//! addresses of its interfaces. Sysctls are read in the network namespace
//! of the calling thread; addresses in the namespace of the thread that
//! first asked for them (see [`kp_host`]).

use std::collections::BTreeMap;
use std::io;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use kp_host::HostAddresses;

/// Reads and writes kernel parameters (`sysctl net.ipv4.conf.all.route_localnet`).
pub trait Sysctl: Send {
    /// The value of `name` (dotted, e.g. `net.ipv4.conf.all.route_localnet`),
    /// trimmed. `ErrorKind::NotFound` when the parameter does not exist (for
    /// the bridge parameters: the `br_netfilter` module is not loaded).
    fn get(&self, name: &str) -> io::Result<String>;

    /// Sets `name` to `value` (`sysctl -w name=value`).
    fn set(&mut self, name: &str, value: &str) -> io::Result<()>;
}

/// Sysctls through `/proc/sys`. Network parameters belong to the network
/// namespace of the thread that opens the file.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcSysctl;

/// Sysctls in memory, for tests and dry runs. Clones share the values.
#[derive(Debug, Clone, Default)]
pub struct MemorySysctl(Arc<Mutex<BTreeMap<String, String>>>);

impl Sysctl for ProcSysctl {
    fn get(&self, name: &str) -> io::Result<String> {
        Ok(std::fs::read_to_string(proc_path(name))?.trim().to_owned())
    }

    fn set(&mut self, name: &str, value: &str) -> io::Result<()> {
        std::fs::write(proc_path(name), value)
    }
}

impl MemorySysctl {
    /// No parameters at all.
    pub fn new() -> Self {
        Self::default()
    }

    /// With `name` set to `value`.
    pub fn with(self, name: &str, value: &str) -> Self {
        self.values().insert(name.to_owned(), value.to_owned());
        self
    }

    fn values(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Sysctl for MemorySysctl {
    fn get(&self, name: &str) -> io::Result<String> {
        self.values()
            .get(name)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no sysctl {name}")))
    }

    fn set(&mut self, name: &str, value: &str) -> io::Result<()> {
        self.values().insert(name.to_owned(), value.to_owned());
        Ok(())
    }
}

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

fn proc_path(name: &str) -> PathBuf {
    PathBuf::from("/proc/sys").join(name.replace('.', "/"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn memory_sysctl_reports_missing_parameters_as_not_found() {
        let mut sysctl = MemorySysctl::new().with("net.ipv4.ip_forward", "1");
        assert_eq!(sysctl.get("net.ipv4.ip_forward").unwrap(), "1");
        let missing = sysctl
            .get("net.bridge.bridge-nf-call-iptables")
            .unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        sysctl.set("net.ipv4.conf.all.route_localnet", "1").unwrap();
        assert_eq!(sysctl.get("net.ipv4.conf.all.route_localnet").unwrap(), "1");
    }
}
