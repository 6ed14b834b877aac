//! What the backend needs of the host besides iptables: sysctls and the
//! addresses of its interfaces. Both are read in the network namespace of
//! the calling thread.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

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

/// Every address of the host's interfaces, IPv4 and IPv6, from
/// `/proc/thread-self/net/fib_trie` (local routes) and
/// `/proc/thread-self/net/if_inet6` (the thread's namespace, not the
/// process's: the proxy may run in a namespace entered by one thread).
pub fn local_addresses() -> io::Result<Vec<IpAddr>> {
    let net = PathBuf::from("/proc/thread-self/net");
    let mut addresses = local_ipv4_addresses(&std::fs::read_to_string(net.join("fib_trie"))?);
    match std::fs::read_to_string(net.join("if_inet6")) {
        Ok(text) => addresses.extend(ipv6_addresses(&text)),
        // IPv6 disabled: no file.
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    Ok(addresses)
}

/// The addresses with a `/32 host LOCAL` entry in `fib_trie` output.
pub(crate) fn local_ipv4_addresses(fib_trie: &str) -> Vec<IpAddr> {
    let mut found = BTreeSet::new();
    let mut last: Option<Ipv4Addr> = None;
    for line in fib_trie.lines() {
        let trimmed = line.trim_start_matches([' ', '|', '+', '-']).trim();
        if let Ok(ip) = trimmed.parse::<Ipv4Addr>() {
            last = Some(ip);
        } else if trimmed.starts_with("/32 host LOCAL") {
            found.extend(last);
        }
    }
    found.into_iter().map(IpAddr::V4).collect()
}

/// The addresses in `if_inet6` output (32 hex digits per line first).
pub(crate) fn ipv6_addresses(if_inet6: &str) -> Vec<IpAddr> {
    if_inet6
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter_map(|hex| u128::from_str_radix(hex, 16).ok())
        .map(|bits| IpAddr::V6(Ipv6Addr::from(bits)))
        .collect()
}

fn proc_path(name: &str) -> PathBuf {
    PathBuf::from("/proc/sys").join(name.replace('.', "/"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn fib_trie_local_routes_are_the_host_addresses() {
        let fib_trie = "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 127.0.0.1\n        /32 host LOCAL\n\
                        \x20    +-- 192.168.99.0/24 2 0 2\n        |-- 192.168.99.0\n           /24 link UNICAST\n\
                        \x20       |-- 192.168.99.2\n           /32 host LOCAL\n\
                        Local:\n     |-- 192.168.99.2\n           /32 host LOCAL\n";
        assert_eq!(
            local_ipv4_addresses(fib_trie),
            ["127.0.0.1", "192.168.99.2"].map(|a| a.parse::<IpAddr>().unwrap())
        );
    }

    #[test]
    fn if_inet6_lines_give_addresses() {
        let text = "fd000192016800990000000000000002 02 40 00 80 eth0\n\
                    00000000000000000000000000000001 01 80 10 80 lo\n";
        assert_eq!(
            ipv6_addresses(text),
            ["fd00:192:168:99::2", "::1"].map(|a| a.parse::<IpAddr>().unwrap())
        );
    }

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
