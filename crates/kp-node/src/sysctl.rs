//! Kernel parameters (`sysctl`): how they are read and written, and the
//! settings a mode needs. Each mode lists its own settings; the mode (at
//! start) and `--init-only` (before the proxy starts) apply them with
//! [`ensure_sysctl`].

use std::collections::BTreeMap;
use std::fmt;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Reads and writes kernel parameters (`sysctl net.ipv4.conf.all.route_localnet`).
pub trait Sysctl: Send {
    /// The value of `name` (dotted, e.g. `net.ipv4.conf.all.route_localnet`),
    /// trimmed. `ErrorKind::NotFound` when the parameter does not exist (for
    /// the bridge parameters: the `br_netfilter` module is not loaded).
    fn get(&self, name: &str) -> io::Result<String>;

    /// Sets `name` to `value` (`sysctl -w name=value`).
    fn set(&mut self, name: &str, value: &str) -> io::Result<()>;
}

/// A kernel parameter and the value a mode needs in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SysctlSetting {
    /// Dotted name, as `sysctl` takes it: `net.ipv4.conf.all.route_localnet`.
    pub name: &'static str,
    /// The value to ensure.
    pub value: u32,
    /// What needs it, for logs and `--init-only`'s plan.
    pub reason: &'static str,
}

impl fmt::Display for SysctlSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={} ({})", self.name, self.value, self.reason)
    }
}

/// What [`ensure_sysctl`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SysctlOutcome {
    /// The parameter had another value and was written.
    Written,
    /// The parameter already had the value.
    AlreadySet,
}

/// Gives `setting.name` its value unless it already has it.
pub fn ensure_sysctl(
    sysctl: &mut dyn Sysctl,
    setting: &SysctlSetting,
) -> io::Result<SysctlOutcome> {
    let current = sysctl.get(setting.name).ok();
    if current.and_then(|text| text.parse::<u32>().ok()) == Some(setting.value) {
        return Ok(SysctlOutcome::AlreadySet);
    }
    sysctl.set(setting.name, &setting.value.to_string())?;
    Ok(SysctlOutcome::Written)
}

/// Sysctls through `/proc/sys` (or another root, for tests). Network
/// parameters belong to the network namespace of the thread that opens
/// the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcSysctl {
    root: PathBuf,
}

impl ProcSysctl {
    /// `/proc/sys`.
    pub const ROOT: &'static str = "/proc/sys";

    /// Parameters under `root` instead of `/proc/sys`.
    pub fn under(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The file of parameter `name`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.root.join(name.replace('.', "/"))
    }
}

impl Default for ProcSysctl {
    fn default() -> Self {
        Self::under(Self::ROOT)
    }
}

impl Sysctl for ProcSysctl {
    fn get(&self, name: &str) -> io::Result<String> {
        Ok(std::fs::read_to_string(self.path(name))?.trim().to_owned())
    }

    /// Writes the parameter's file, which must exist: a kernel parameter
    /// is never created, and a missing one (its module not loaded) is an
    /// error.
    fn set(&mut self, name: &str, value: &str) -> io::Result<()> {
        write_existing(&self.path(name), value)
    }
}

fn write_existing(path: &Path, text: &str) -> io::Result<()> {
    OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)?
        .write_all(text.as_bytes())
}

/// Sysctls in memory, for tests and dry runs. Clones share the values.
#[derive(Debug, Clone, Default)]
pub struct MemorySysctl(Arc<Mutex<BTreeMap<String, String>>>);

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

    fn values(&self) -> MutexGuard<'_, BTreeMap<String, String>> {
        // Every update under the lock leaves the map whole.
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    const FORWARD: SysctlSetting = SysctlSetting {
        name: "net.ipv4.ip_forward",
        value: 1,
        reason: "a test",
    };

    #[test]
    fn ensure_writes_only_a_different_value() {
        let mut sysctl = MemorySysctl::new().with("net.ipv4.ip_forward", "0");
        assert_eq!(
            ensure_sysctl(&mut sysctl, &FORWARD).unwrap(),
            SysctlOutcome::Written
        );
        assert_eq!(sysctl.get("net.ipv4.ip_forward").unwrap(), "1");
        assert_eq!(
            ensure_sysctl(&mut sysctl, &FORWARD).unwrap(),
            SysctlOutcome::AlreadySet
        );
    }

    #[test]
    fn proc_sysctl_reads_trimmed_and_never_creates_a_parameter() {
        let root = tempfile::tempdir().unwrap();
        let mut sysctl = ProcSysctl::under(root.path());
        let missing = sysctl.set("net.ipv4.ip_forward", "1").unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        assert!(!root.path().join("net/ipv4/ip_forward").exists());
        std::fs::create_dir_all(root.path().join("net/ipv4")).unwrap();
        std::fs::write(root.path().join("net/ipv4/ip_forward"), "0\n").unwrap();
        assert_eq!(sysctl.get("net.ipv4.ip_forward").unwrap(), "0");
        assert_eq!(
            ensure_sysctl(&mut sysctl, &FORWARD).unwrap(),
            SysctlOutcome::Written
        );
        assert_eq!(sysctl.get("net.ipv4.ip_forward").unwrap(), "1");
    }

    #[test]
    fn memory_sysctl_reports_missing_parameters_as_not_found() {
        let sysctl = MemorySysctl::new();
        assert_eq!(
            sysctl.get("net.ipv4.ip_forward").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }
}
