//! glibc's allocator, set for the proxy's pattern of allocation.
//!
//! A full sync at 10,000 Services builds a 9 MB restore text and a few
//! megabytes of other short-lived buffers, then frees them; partial syncs
//! build smaller ones of varying size. glibc's defaults fit that badly: a
//! freed block served by its own mapping raises the mapping threshold to
//! the block's size (up to 32 MiB), so the next buffers of that size come
//! from a heap instead and stay resident after they are freed; every
//! thread that allocates gets an arena of its own, each keeping what it
//! freed. Measured end to end (10,000 Services, iptables-legacy, 20 patches
//! and two periodic full syncs): resident memory climbed from 61 to 71 MiB
//! with the defaults, and stayed at 51–55 MiB with the settings below.
//!
//! The settings are glibc tunables, read once when the process starts, and
//! changing them from inside needs `mallopt` (foreign, unsafe code). So the
//! binary starts itself once more, at once, with `GLIBC_TUNABLES` set: the
//! same process (exec keeps the pid), arguments and environment. An
//! operator who sets `GLIBC_TUNABLES` keeps exactly what they set; a
//! failed exec leaves the defaults and is logged once logging is up.

use std::ffi::OsString;
use std::sync::OnceLock;

/// The tunables: one arena for all threads; blocks of 256 KiB and more in
/// mappings of their own, returned to the kernel when freed, whatever was
/// freed before; free memory at the top of the heap above 1 MiB returned.
pub const TUNABLES: &str = "glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold=262144:glibc.malloc.trim_threshold=1048576";

/// The environment variable glibc reads its tunables from.
const TUNABLES_VAR: &str = "GLIBC_TUNABLES";

/// Set in the environment of the second start, so a process whose
/// `GLIBC_TUNABLES` the loader removed (a setuid start) never starts itself
/// again.
const RESTARTED_VAR: &str = "KUBE_PROXY_MALLOC_TUNED";

/// What [`apply`] did, for [`log_outcome`].
static OUTCOME: OnceLock<Outcome> = OnceLock::new();

#[derive(Debug)]
enum Outcome {
    /// This process runs with [`TUNABLES`].
    Tuned,
    /// The operator set `GLIBC_TUNABLES`; it is left as it is.
    OperatorSet(OsString),
    /// Starting again failed; the defaults stay.
    Failed(String),
}

/// Starts the binary again with [`TUNABLES`] unless they are in effect, the
/// operator set their own, or this is the second start. Returns only when
/// it did not start again (or that failed).
pub fn apply() {
    let outcome = match std::env::var_os(TUNABLES_VAR) {
        Some(_) if std::env::var_os(RESTARTED_VAR).is_some() => Outcome::Tuned,
        Some(value) => Outcome::OperatorSet(value),
        None if std::env::var_os(RESTARTED_VAR).is_some() => {
            Outcome::Failed(format!("the loader removed {TUNABLES_VAR}"))
        }
        None => Outcome::Failed(restart()),
    };
    let _ = OUTCOME.set(outcome);
}

/// Replaces this process with the binary started with the tunables; returns
/// why that failed.
fn restart() -> String {
    use std::os::unix::process::CommandExt;

    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(error) => return format!("cannot find the binary: {error}"),
    };
    let mut args = std::env::args_os();
    let mut command = std::process::Command::new(&exe);
    if let Some(arg0) = args.next() {
        command.arg0(arg0);
    }
    let error = command
        .args(args)
        .env(TUNABLES_VAR, TUNABLES)
        .env(RESTARTED_VAR, "1")
        .exec();
    format!("cannot start {} again: {error}", exe.display())
}

/// Logs what [`apply`] did (once logging is set up).
pub fn log_outcome() {
    match OUTCOME.get() {
        Some(Outcome::Tuned) => tracing::debug!(
            tunables = TUNABLES,
            pid = std::process::id(),
            "glibc malloc tunables set"
        ),
        Some(Outcome::OperatorSet(value)) => tracing::info!(
            GLIBC_TUNABLES = %value.to_string_lossy(),
            recommended = TUNABLES,
            "GLIBC_TUNABLES is set; the proxy's own allocator settings are not applied"
        ),
        Some(Outcome::Failed(reason)) => tracing::warn!(
            %reason,
            "Running with glibc's default allocator settings, which keep more memory"
        ),
        None => {}
    }
}
