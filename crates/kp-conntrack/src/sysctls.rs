//! The conntrack sysctls kube-proxy sets at start (upstream
//! `pkg/proxy/conntrack/sysctls.go`, called from `platformSetup`).
//!
//! Each value is written only when it is configured (non-zero) and differs
//! from the current one. Unlike upstream, a failure is not fatal: it is
//! logged with the sysctl's name and the error, reported in
//! [`SysctlReport::failures`], and the remaining sysctls are still set.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use kp_config::{GoDuration, KubeProxyConntrackConfiguration};
use kp_node::{ProcSysctl, Sysctl};

/// Where the sysctls live, and how to tell whether this thread is in the
/// initial network namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysctlPaths {
    /// `/proc/sys`.
    pub proc_sys: PathBuf,
    /// `/sys/module/nf_conntrack/parameters/hashsize`.
    pub hashsize: PathBuf,
    /// The calling thread's network namespace: `/proc/thread-self/ns/net`.
    pub own_netns: PathBuf,
    /// The initial network namespace (that of PID 1): `/proc/1/ns/net`.
    pub initial_netns: PathBuf,
}

/// What [`apply_sysctls`] did.
#[derive(Debug, Default)]
pub struct SysctlReport {
    /// Sysctls written, with their new value (`nf_conntrack_max`, …; the
    /// hash size as `hashsize`).
    pub written: Vec<(&'static str, u64)>,
    /// Sysctls that already had the configured value.
    pub unchanged: Vec<&'static str>,
    /// Sysctls left alone on purpose, and why.
    pub skipped: Vec<(&'static str, &'static str)>,
    /// Sysctls that could not be set.
    pub failures: Vec<SysctlError>,
}

/// A conntrack sysctl could not be set.
#[derive(Debug, thiserror::Error)]
pub enum SysctlError {
    /// Writing the value failed (read-only `/proc/sys` or `/sys`, no
    /// permission, or no conntrack support).
    #[error("setting {name} to {value} through {} failed", path.display())]
    Write {
        /// The sysctl, e.g. `nf_conntrack_max`.
        name: &'static str,
        /// The value that was to be written.
        value: u64,
        /// The file written.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The current hash size could not be read, so it is unknown whether it
    /// must grow.
    #[error("reading the conntrack hash size from {} failed", path.display())]
    ReadHashsize {
        /// The file read.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// One sysctl under `net/netfilter/` and the value to give it.
struct Setting {
    name: &'static str,
    value: u64,
}

impl Default for SysctlPaths {
    fn default() -> Self {
        Self::under(Path::new("/"))
    }
}

impl SysctlPaths {
    /// The standard paths below `root` instead of `/` (for tests).
    pub fn under(root: &Path) -> Self {
        Self {
            proc_sys: root.join("proc/sys"),
            hashsize: root.join("sys/module/nf_conntrack/parameters/hashsize"),
            own_netns: root.join("proc/thread-self/ns/net"),
            initial_netns: root.join("proc/1/ns/net"),
        }
    }

    /// True when this thread's network namespace is the initial one (both
    /// links name the same namespace). Unknown counts as not initial.
    fn in_initial_netns(&self) -> bool {
        match (
            fs::read_link(&self.own_netns),
            fs::read_link(&self.initial_netns),
        ) {
            (Ok(own), Ok(initial)) => own == initial,
            _ => false,
        }
    }
}

/// Applies `config` with the machine's core count and the real paths:
/// [`apply_sysctls`] with [`std::thread::available_parallelism`] and
/// [`SysctlPaths::default`].
pub fn apply_conntrack_sysctls(config: &KubeProxyConntrackConfiguration) -> SysctlReport {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    apply_sysctls(config, cores, &SysctlPaths::default())
}

/// Sets the conntrack sysctls of `config` for a machine with `cores` cores:
///
/// - `nf_conntrack_max` = max(`maxPerCore` × `cores`, `min`), only when
///   `maxPerCore` > 0 (`sysctl -w net.netfilter.nf_conntrack_max=…`); then,
///   when the hash table has fewer than a quarter as many buckets, the hash
///   size becomes `nf_conntrack_max` / 4. The kernel accepts that write only
///   from the initial network namespace, so elsewhere it is skipped.
/// - `nf_conntrack_tcp_timeout_established`, `…_tcp_timeout_close_wait`,
///   `nf_conntrack_udp_timeout`, `…_udp_timeout_stream`: the configured
///   duration in whole seconds, when above zero.
/// - `nf_conntrack_tcp_be_liberal` = 1 when `tcpBeLiberal` is true.
pub fn apply_sysctls(
    config: &KubeProxyConntrackConfiguration,
    cores: usize,
    paths: &SysctlPaths,
) -> SysctlReport {
    let mut report = SysctlReport::default();
    if let Some(max) = conntrack_max(config, cores) {
        let set = Setting {
            name: "nf_conntrack_max",
            value: max,
        };
        // As upstream, the hash size follows only a working limit.
        if set.apply(paths, &mut report) {
            grow_hashsize(max / 4, paths, &mut report);
        }
    }
    let timeouts = [
        (
            "nf_conntrack_tcp_timeout_established",
            config.tcp_established_timeout,
        ),
        (
            "nf_conntrack_tcp_timeout_close_wait",
            config.tcp_close_wait_timeout,
        ),
        ("nf_conntrack_udp_timeout", Some(config.udp_timeout)),
        (
            "nf_conntrack_udp_timeout_stream",
            Some(config.udp_stream_timeout),
        ),
    ];
    for (name, timeout) in timeouts {
        if let Some(value) = timeout.and_then(whole_seconds) {
            Setting { name, value }.apply(paths, &mut report);
        }
    }
    if config.tcp_be_liberal {
        let set = Setting {
            name: "nf_conntrack_tcp_be_liberal",
            value: 1,
        };
        set.apply(paths, &mut report);
    }
    report
}

/// `nf_conntrack_max` for `cores` cores, or `None` to leave it alone.
pub fn conntrack_max(config: &KubeProxyConntrackConfiguration, cores: usize) -> Option<u64> {
    let per_core = u64::try_from(config.max_per_core.unwrap_or(0))
        .ok()
        .filter(|&n| n > 0)?;
    let floor = u64::try_from(config.min.unwrap_or(0)).unwrap_or(0);
    let scaled = per_core.saturating_mul(cores as u64);
    Some(scaled.max(floor))
}

/// A positive duration in whole seconds (rounded down, as upstream).
fn whole_seconds(duration: GoDuration) -> Option<u64> {
    let seconds = duration.to_std()?.as_secs();
    (!duration.is_zero()).then_some(seconds)
}

impl Setting {
    /// Writes the value (`net.netfilter.<name>`) unless it is already set;
    /// returns false on failure.
    fn apply(&self, paths: &SysctlPaths, report: &mut SysctlReport) -> bool {
        let mut sysctl = ProcSysctl::under(&paths.proc_sys);
        let name = format!("net.netfilter.{}", self.name);
        let current = sysctl.get(&name).ok();
        if current.and_then(|text| text.parse::<u64>().ok()) == Some(self.value) {
            report.unchanged.push(self.name);
            return true;
        }
        let written = sysctl.set(&name, &self.value.to_string());
        self.record(written, sysctl.path(&name), report)
    }
}

/// Raises the conntrack hash size to `wanted` buckets when it has fewer.
fn grow_hashsize(wanted: u64, paths: &SysctlPaths, report: &mut SysctlReport) {
    const NAME: &str = "hashsize";
    let current = match read_number(&paths.hashsize) {
        Ok(current) => current,
        Err(source) => {
            let error = SysctlError::ReadHashsize {
                path: paths.hashsize.clone(),
                source,
            };
            tracing::warn!(sysctl = NAME, error = %kp_sync::error_chain(&error), "reading conntrack hash size failed");
            report.failures.push(error);
            return;
        }
    };
    if current >= wanted {
        report.unchanged.push(NAME);
        return;
    }
    if !paths.in_initial_netns() {
        // Linux refuses this write outside the initial network namespace
        // (nf_conntrack_set_hashsize), e.g. when the proxy runs in a
        // container with its own network namespace.
        tracing::info!(
            sysctl = NAME,
            current,
            wanted,
            "not in the initial network namespace; leaving the conntrack hash size as it is"
        );
        report
            .skipped
            .push((NAME, "not in the initial network namespace"));
        return;
    }
    let written = fs::write(&paths.hashsize, wanted.to_string());
    Setting {
        name: NAME,
        value: wanted,
    }
    .record(written, paths.hashsize.clone(), report);
}

impl Setting {
    /// Reports the outcome of writing the value to `path`; returns false on
    /// failure.
    fn record(&self, written: io::Result<()>, path: PathBuf, report: &mut SysctlReport) -> bool {
        match written {
            Ok(()) => {
                tracing::info!(
                    sysctl = self.name,
                    value = self.value,
                    "set conntrack sysctl"
                );
                report.written.push((self.name, self.value));
                true
            }
            Err(source) => {
                let error = SysctlError::Write {
                    name: self.name,
                    value: self.value,
                    path,
                    source,
                };
                tracing::warn!(sysctl = self.name, value = self.value, error = %kp_sync::error_chain(&error), "setting conntrack sysctl failed");
                report.failures.push(error);
                false
            }
        }
    }
}

fn read_number(path: &Path) -> io::Result<u64> {
    let text = fs::read_to_string(path)?;
    text.trim()
        .parse()
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))
}
