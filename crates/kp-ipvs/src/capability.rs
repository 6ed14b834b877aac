//! Can this node run the IPVS mode? Upstream's start-up check: the kernel
//! version (`/proc/sys/kernel/osrelease`), the required modules (`ip_vs`,
//! `ip_vs_rr`, `ip_vs_wrr`, `ip_vs_sh`, `nf_conntrack` — `nf_conntrack_ipv4`
//! before Linux 4.19 — and the module of the configured scheduler) found in
//! `/proc/modules`, in `/lib/modules/<version>/modules.builtin`, or, on a
//! kernel without loadable modules, as `CONFIG_<MODULE>=y` in
//! `/boot/config-<version>`; a missing module is loaded with `modprobe` when
//! it can be. The ipset protocol must be at least version 6.
//!
//! [`check_modules`] is the pure decision over the files' contents and a
//! module loader; [`HostKernel`] reads the real files and runs `modprobe`.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The scheduler used when the configuration names none.
pub const DEFAULT_SCHEDULER: &str = "rr";
/// Oldest ipset version (and netlink protocol version) the mode needs: IPv6
/// support arrived with ipset 6.
pub const MIN_IPSET_VERSION: u32 = 6;
/// The first kernel whose conntrack module is `nf_conntrack` for both
/// families (4.19 merged `nf_conntrack_ipv4` into it).
const CONNTRACK_MERGED: KernelVersion = KernelVersion {
    major: 4,
    minor: 19,
    patch: 0,
};
/// Schedulers the kernel ships (`ip_vs_<name>` modules).
pub const KNOWN_SCHEDULERS: &[&str] = &[
    "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos",
];

/// The contents of the kernel files the check reads (`None`: the file could
/// not be read).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelFiles {
    /// `/proc/sys/kernel/osrelease`, e.g. `6.1.0-27-amd64`.
    pub osrelease: String,
    /// `/proc/modules`; missing on a kernel without loadable modules.
    pub proc_modules: Option<String>,
    /// `/lib/modules/<osrelease>/modules.builtin`.
    pub modules_builtin: Option<String>,
    /// `/boot/config-<osrelease>`.
    pub boot_config: Option<String>,
}

/// A kernel version, `major.minor.patch` (the rest of osrelease ignored).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct KernelVersion {
    /// e.g. 6 in 6.1.0.
    pub major: u32,
    /// e.g. 1 in 6.1.0.
    pub minor: u32,
    /// e.g. 0 in 6.1.0 (0 when absent).
    pub patch: u32,
}

/// Why the IPVS mode cannot run here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapabilityError {
    /// Upstream's message, word for word, then where we looked.
    #[error("IPVS proxier will not be used because the following required kernel modules are not loaded: [{}]{hint}", .modules.join(" "))]
    MissingModules {
        /// The missing modules, in the order the check wants them.
        modules: Vec<String>,
        /// Where the check looked, when that helps (empty otherwise).
        hint: String,
    },
    /// `/proc/sys/kernel/osrelease` does not start with a version.
    #[error("can't determine the kernel version: /proc/sys/kernel/osrelease holds {osrelease:?}, expected e.g. 6.1.0-27-amd64")]
    KernelVersion {
        /// What the file held.
        osrelease: String,
    },
    /// The configured scheduler is not one the kernel has.
    #[error("invalid configuration: field ipvs.scheduler: value {scheduler:?} is not an IPVS scheduler; valid values are {}", KNOWN_SCHEDULERS.join(", "))]
    UnknownScheduler {
        /// The configured value.
        scheduler: String,
    },
    /// The kernel's ipset is too old or absent.
    #[error("ipset version: {found} is less than min required version: {MIN_IPSET_VERSION}.0")]
    IpsetTooOld {
        /// The protocol version the kernel reported.
        found: u32,
    },
    /// The kernel's ipset could not be asked for its version.
    #[error("error getting ipset version, error: {0}")]
    IpsetUnavailable(String),
}

/// Loads a kernel module (`modprobe -- NAME`); true when it loaded.
pub trait ModuleLoader {
    /// Tries to load `module`.
    fn load(&mut self, module: &str) -> bool;
}

/// The real host: files under a root (normally `/`) and `modprobe`.
#[derive(Debug, Clone)]
pub struct HostKernel {
    root: PathBuf,
    modprobe: bool,
}

/// `modprobe -- NAME`, quietly.
#[derive(Debug, Clone, Copy, Default)]
pub struct Modprobe;

impl KernelVersion {
    /// Parses the leading `major.minor[.patch]` of `text`.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let end = text
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(text.len());
        let mut numbers = text[..end].split('.').filter(|part| !part.is_empty());
        let major = numbers.next()?.parse().ok()?;
        let minor = numbers.next()?.parse().ok()?;
        let patch = numbers.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        Some(Self {
            major,
            minor,
            patch,
        })
    }
}

impl fmt::Display for KernelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The scheduler to use: `configured`, or `rr` when empty. An unknown name
/// is an error, before any module is looked for.
pub fn scheduler_or_default(configured: &str) -> Result<&str, CapabilityError> {
    let scheduler = if configured.is_empty() {
        DEFAULT_SCHEDULER
    } else {
        configured
    };
    if KNOWN_SCHEDULERS.contains(&scheduler) {
        Ok(scheduler)
    } else {
        Err(CapabilityError::UnknownScheduler {
            scheduler: configured.to_owned(),
        })
    }
}

/// The modules the IPVS mode needs on `version` with `scheduler`, in
/// upstream's order, the scheduler's module last (once).
pub fn required_modules(version: KernelVersion, scheduler: &str) -> Vec<String> {
    let conntrack = if version < CONNTRACK_MERGED {
        "nf_conntrack_ipv4"
    } else {
        "nf_conntrack"
    };
    let mut modules: Vec<String> = ["ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh", conntrack]
        .into_iter()
        .map(str::to_owned)
        .collect();
    let scheduler_module = format!("ip_vs_{scheduler}");
    if !modules.contains(&scheduler_module) {
        modules.push(scheduler_module);
    }
    modules
}

/// Decides whether every module the IPVS mode needs is there, loading the
/// missing ones through `loader` (not on a kernel without loadable modules).
/// Returns the kernel version on success.
pub fn check_modules(
    files: &KernelFiles,
    scheduler: &str,
    loader: &mut dyn ModuleLoader,
) -> Result<KernelVersion, CapabilityError> {
    let scheduler = scheduler_or_default(scheduler)?;
    let version =
        KernelVersion::parse(&files.osrelease).ok_or_else(|| CapabilityError::KernelVersion {
            osrelease: files.osrelease.clone(),
        })?;
    let wanted = required_modules(version, scheduler);
    let osrelease = files.osrelease.trim();
    let (missing, hint) = match &files.proc_modules {
        Some(loaded) => {
            let loaded = first_column(loaded);
            let builtin = files.modules_builtin.as_deref().map(builtin_modules);
            let missing: Vec<String> = wanted
                .iter()
                .filter(|module| !loaded.iter().any(|name| same_module(name, module)))
                .filter(|module| {
                    !builtin
                        .as_ref()
                        .is_some_and(|names| names.iter().any(|name| same_module(name, module)))
                })
                .filter(|module| !loader.load(module))
                .cloned()
                .collect();
            (missing, String::new())
        }
        None => {
            let config = files.boot_config.as_deref().unwrap_or_default();
            let missing = wanted
                .iter()
                .filter(|module| !config_builtin(config, module))
                .cloned()
                .collect();
            let hint = if files.boot_config.is_none() {
                format!(" (this kernel has no /proc/modules, and /boot/config-{osrelease} could not be read to find built-in modules)")
            } else {
                format!(" (this kernel has no /proc/modules; /boot/config-{osrelease} does not build them in)")
            };
            (missing, hint)
        }
    };
    if missing.is_empty() {
        Ok(version)
    } else {
        Err(CapabilityError::MissingModules {
            modules: missing,
            hint,
        })
    }
}

/// Checks the ipset netlink protocol version the kernel reported.
pub fn check_ipset_version(protocol: u32) -> Result<(), CapabilityError> {
    if protocol >= MIN_IPSET_VERSION {
        Ok(())
    } else {
        Err(CapabilityError::IpsetTooOld { found: protocol })
    }
}

impl HostKernel {
    /// The running kernel: files under `/`, modules loaded with `modprobe`.
    pub fn new() -> Self {
        Self::with_root("/")
    }

    /// Files under `root` instead of `/` (tests), `modprobe` still run.
    pub fn with_root(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            modprobe: true,
        }
    }

    /// Never runs `modprobe` (tests, dry runs).
    pub fn without_modprobe(mut self) -> Self {
        self.modprobe = false;
        self
    }

    /// Reads the kernel files. A missing osrelease is an error; the other
    /// files may be missing.
    pub fn read_files(&self) -> io::Result<KernelFiles> {
        let osrelease = std::fs::read_to_string(self.path("proc/sys/kernel/osrelease"))?;
        let release = osrelease.trim().to_owned();
        let read = |path: PathBuf| std::fs::read_to_string(path).ok();
        Ok(KernelFiles {
            proc_modules: read(self.path("proc/modules")),
            modules_builtin: read(self.path(&format!("lib/modules/{release}/modules.builtin"))),
            boot_config: read(self.path(&format!("boot/config-{release}"))),
            osrelease,
        })
    }

    /// Runs the module check against this host (see [`check_modules`]).
    pub fn check_modules(&self, scheduler: &str) -> Result<KernelVersion, CapabilityError> {
        let files = self
            .read_files()
            .map_err(|error| CapabilityError::KernelVersion {
                osrelease: format!("<unreadable: {error}>"),
            })?;
        if self.modprobe {
            check_modules(&files, scheduler, &mut Modprobe)
        } else {
            check_modules(&files, scheduler, &mut |_: &str| false)
        }
    }

    fn path(&self, relative: &str) -> PathBuf {
        Path::new(&self.root).join(relative)
    }
}

impl Default for HostKernel {
    fn default() -> Self {
        Self::new()
    }
}

impl ModuleLoader for Modprobe {
    fn load(&mut self, module: &str) -> bool {
        let loaded = Command::new("modprobe")
            .args(["--", module])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if !loaded {
            tracing::info!(module, "failed to load kernel module with modprobe; ignore this when running inside a container without /lib/modules");
        }
        loaded
    }
}

impl<F: FnMut(&str) -> bool> ModuleLoader for F {
    fn load(&mut self, module: &str) -> bool {
        self(module)
    }
}

/// The first word of every line (`/proc/modules` lists `name size refs …`).
fn first_column(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect()
}

/// Module names in modules.builtin (`kernel/net/netfilter/ipvs/ip_vs.ko`).
fn builtin_modules(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|line| line.trim().rsplit('/').next())
        .filter_map(|file| file.strip_suffix(".ko"))
        .collect()
}

/// `CONFIG_IP_VS_RR=y` for `ip_vs_rr`.
fn config_builtin(config: &str, module: &str) -> bool {
    let wanted = format!("CONFIG_{}=y", module.to_ascii_uppercase());
    config.lines().any(|line| line.trim() == wanted)
}

/// Module names compare with `-` and `_` as one (the kernel does so).
fn same_module(name: &str, module: &str) -> bool {
    name.len() == module.len()
        && name
            .bytes()
            .zip(module.bytes())
            .all(|(a, b)| a == b || (a == b'-' && b == b'_') || (a == b'_' && b == b'-'))
}

#[cfg(test)]
#[path = "capability_tests.rs"]
mod tests;
