//! One named network namespace: create, enter, run programs in, delete.

use std::fs::File;
use std::io::Write;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, Once};

use nix::sched::{setns, CloneFlags};

use super::NetnsError;

/// Prefix of every namespace this harness creates.
const PREFIX: &str = "kpt-";
/// Where iproute2 keeps named network namespaces.
const NETNS_DIR: &str = "/run/netns";
/// Longest role accepted in a namespace name.
const MAX_ROLE_LEN: usize = 16;

/// Numbers namespaces created by this process.
static SEQUENCE: AtomicU32 = AtomicU32::new(0);
/// The first `ip netns add` of a boot makes `/run/netns` a shared mount;
/// doing that from two threads at once can stack mounts, so creations of
/// this process take turns.
static CREATE_LOCK: Mutex<()> = Mutex::new(());
/// Leftovers of crashed runs are removed once per process.
static LEFTOVERS: Once = Once::new();

/// A named network namespace (`/run/netns/NAME`), deleted on drop.
///
/// Deleting the name also deletes the namespace and its links once no
/// process or socket uses it any more.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

/// A process started in a namespace with [`Netns::spawn`]; killed and
/// reaped on drop.
#[derive(Debug)]
pub struct NsChild {
    child: Child,
}

impl Netns {
    /// Creates the namespace `kpt-<pid>-<n>-<role>` with `lo` up
    /// (`ip netns add NAME; ip -n NAME link set lo up`), after removing
    /// leftovers of crashed runs.
    ///
    /// `role` says what the namespace is for (`node`, `ep1`, …): 1 to 16
    /// characters out of `a-z`, `0-9` and `-`.
    pub fn create(role: &str) -> Result<Self, NetnsError> {
        validate_name(role)?;
        LEFTOVERS.call_once(remove_leftovers);
        let sequence = SEQUENCE.fetch_add(1, Ordering::Relaxed);
        let name = format!("{PREFIX}{}-{sequence}-{role}", std::process::id());
        {
            // A poisoned lock only means another creation panicked; the
            // mutex guards no data.
            let _turn = CREATE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
            run_ip(&["netns", "add", &name], None)?;
        }
        let netns = Self { name };
        netns.ip(&["link", "set", "lo", "up"])?;
        tracing::debug!(namespace = %netns.name, "created network namespace");
        Ok(netns)
    }

    /// The namespace name, as `ip netns list` shows it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace file, `/run/netns/NAME`.
    pub fn path(&self) -> PathBuf {
        Path::new(NETNS_DIR).join(&self.name)
    }

    /// Runs `f` on a fresh thread that has entered this namespace
    /// (`setns(CLONE_NEWNET)`) and returns its result. Sockets created by
    /// `f` belong to this namespace, and so do processes it spawns.
    ///
    /// # Panics
    /// If the namespace cannot be entered (see [`Netns::try_run`]), or if
    /// `f` panics (the panic is passed on).
    #[track_caller]
    pub fn run<F, R>(&self, f: F) -> R
    where
        F: FnOnce() -> R + Send,
        R: Send,
    {
        match self.try_run(f) {
            Ok(result) => result,
            Err(error) => panic!("{}", error_chain(&error)),
        }
    }

    /// Runs the future `make` returns to completion on a two-worker tokio
    /// runtime built on a thread of this namespace (see [`Netns::run`]): the
    /// runtime's threads, and so every socket the future opens (a test API
    /// server, its clients) and every process it spawns, live here.
    ///
    /// # Panics
    /// As [`Netns::run`], or if the runtime cannot be built.
    #[track_caller]
    pub fn block_on<F, Fut>(&self, make: F) -> Fut::Output
    where
        F: FnOnce() -> Fut + Send,
        Fut: std::future::Future,
        Fut::Output: Send,
    {
        self.run(|| {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap_or_else(|error| panic!("building a tokio runtime: {error}"));
            runtime.block_on(make())
        })
    }

    /// Like [`Netns::run`], but reports a namespace that cannot be entered
    /// as an error.
    pub fn try_run<F, R>(&self, f: F) -> Result<R, NetnsError>
    where
        F: FnOnce() -> R + Send,
        R: Send,
    {
        let path = self.path();
        let file = File::open(&path).map_err(|source| NetnsError::Open { path, source })?;
        std::thread::scope(|scope| {
            let thread = scope.spawn(move || {
                setns(&file, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter {
                    namespace: self.name.clone(),
                    source,
                })?;
                Ok(f())
            });
            match thread.join() {
                Ok(result) => result,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Runs `ip -n NAME ARGS…` and returns its stdout.
    pub fn ip(&self, args: &[&str]) -> Result<String, NetnsError> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        run_ip(&all, None)
    }

    /// A node namespace without peers, for the binary run on manifests:
    /// `lo` up, and `eth0` (a veth whose other end, `eth1`, stays in the
    /// namespace) holding the plan's node addresses of both families,
    /// [`NODE_IP`](crate::plan::NODE_IP)/24 and
    /// [`NODE_IP_V6`](crate::plan::NODE_IP_V6)/64.
    pub fn bare_node(role: &str) -> Result<Self, NetnsError> {
        use crate::plan::{NODE_IP, NODE_IP_V6};
        let ns = Self::create(role)?;
        ns.ip_batch(&[
            "link set lo up".to_owned(),
            "link add eth0 type veth peer name eth1".to_owned(),
            format!("address add {NODE_IP}/24 dev eth0"),
            format!("address add {NODE_IP_V6}/64 dev eth0 nodad"),
            "link set eth0 up".to_owned(),
            "link set eth1 up".to_owned(),
        ])?;
        Ok(ns)
    }

    /// Declares kubelet's `KUBE-IPTABLES-HINT` chain in the mangle table of
    /// `iptables-FLAVOR` and `ip6tables-FLAVOR` (`legacy` or `nft`), as
    /// kubelet does to name the flavor the node uses.
    ///
    /// # Panics
    /// If a program fails; the message shows its stderr.
    #[track_caller]
    pub fn declare_iptables_hint(&self, flavor: &str) {
        for program in [format!("iptables-{flavor}"), format!("ip6tables-{flavor}")] {
            self.exec_ok(&program, &["-t", "mangle", "-N", "KUBE-IPTABLES-HINT"]);
        }
    }

    /// Runs many `ip` commands in this namespace in one process
    /// (`ip -n NAME -batch -`), stopping at the first that fails.
    pub fn ip_batch(&self, commands: &[String]) -> Result<(), NetnsError> {
        let script = commands.join("\n") + "\n";
        run_ip(&["-n", &self.name, "-batch", "-"], Some(&script)).map(drop)
    }

    /// Sets a sysctl of this namespace, e.g. `("net/ipv4/ip_forward", "1")`,
    /// by writing `/proc/sys/KEY` from a thread inside the namespace (never
    /// from the root namespace).
    pub fn sysctl(&self, key: &str, value: &str) -> Result<(), NetnsError> {
        let path = Path::new("/proc/sys").join(key);
        self.try_run(|| std::fs::write(&path, value))?
            .map_err(|source| NetnsError::Sysctl {
                namespace: self.name.clone(),
                key: key.to_owned(),
                source,
            })
    }

    /// A command that runs `program` in this namespace
    /// (`ip netns exec NAME program`), to add arguments, environment and
    /// stdio to.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name, program]);
        command
    }

    /// Runs `program ARGS…` in this namespace and waits for it.
    ///
    /// # Panics
    /// If `ip` or the program cannot be started.
    #[track_caller]
    pub fn exec(&self, program: &str, args: &[&str]) -> Output {
        match self.command(program).args(args).output() {
            Ok(output) => output,
            Err(error) => panic!("running {program} in {}: {error}", self.name),
        }
    }

    /// Runs `program ARGS…` in this namespace and returns its stdout.
    ///
    /// # Panics
    /// If it cannot be started or exits unsuccessfully; the message shows
    /// its stderr.
    #[track_caller]
    pub fn exec_ok(&self, program: &str, args: &[&str]) -> String {
        let output = self.exec(program, args);
        assert!(
            output.status.success(),
            "`{program} {}` in {} failed with {}: {}",
            args.join(" "),
            self.name,
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// How many chains of the IPv4 iptables `table` have names starting
    /// with `prefix` (from `iptables-save -t TABLE`).
    ///
    /// # Panics
    /// As [`exec_ok`](Self::exec_ok).
    #[track_caller]
    pub fn iptables_chains(&self, table: &str, prefix: &str) -> usize {
        let saved = self.exec_ok("iptables-save", &["-t", table]);
        saved
            .lines()
            .filter_map(|line| line.strip_prefix(':'))
            .filter(|chain| chain.starts_with(prefix))
            .count()
    }

    /// Starts the long-running `program ARGS…` in this namespace (stdin
    /// closed, stdout and stderr inherited); it is killed when the returned
    /// [`NsChild`] is dropped. Use [`Netns::command`] and
    /// [`NsChild::spawn`] for other stdio or environment.
    ///
    /// # Panics
    /// If `ip` cannot be started.
    #[track_caller]
    pub fn spawn(&self, program: &str, args: &[&str]) -> NsChild {
        let mut command = self.command(program);
        command.args(args).stdin(Stdio::null());
        match NsChild::spawn(&mut command) {
            Ok(child) => child,
            Err(error) => panic!("{}", error_chain(&error)),
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        remove_run_files(&self.path());
        if let Err(error) = run_ip(&["netns", "del", &self.name], None) {
            tracing::warn!(namespace = %self.name, error = %error_chain(&error), "deleting network namespace failed");
        }
    }
}

impl NsChild {
    /// Starts `command` (usually from [`Netns::command`]); the process is
    /// killed when the result is dropped.
    pub fn spawn(command: &mut Command) -> Result<Self, NetnsError> {
        let child = command.spawn().map_err(|source| NetnsError::Spawn {
            command: format!("{command:?}"),
            source,
        })?;
        Ok(Self { child })
    }
}

impl Deref for NsChild {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.child
    }
}

impl DerefMut for NsChild {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for NsChild {
    fn drop(&mut self) {
        // Already exited is fine: kill then fails and wait reaps it.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where a userspace-mode proxy publishes its routing table, one file per
/// family and network namespace (`userspace-routes-IPv4-<inode>.json`, see
/// kp-userspace's `routes_file`).
const ROUTES_DIR: &str = "/run/kube-proxy";

/// Removes the files a proxy in the namespace at `path` left in the host's
/// run directory (a test's proxy is killed, so it never removes them).
fn remove_run_files(path: &std::path::Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(inode) = std::fs::metadata(path).map(|m| m.ino()) else {
        return;
    };
    for family in ["IPv4", "IPv6"] {
        let file = format!("{ROUTES_DIR}/userspace-routes-{family}-{inode}.json");
        // Absent is the common case; nothing else can be done on failure.
        let _ = std::fs::remove_file(file);
    }
}

/// Deletes namespaces named `kpt-<pid>-…` whose process no longer exists:
/// what crashed or killed test runs left behind. [`Netns::create`] calls
/// this once per process.
pub fn remove_leftovers() {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = owner_pid(&name) else {
            continue;
        };
        if Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        match run_ip(&["netns", "del", &name], None) {
            Ok(_) => tracing::info!(namespace = %name, pid, "removed leftover network namespace"),
            Err(error) => {
                tracing::warn!(namespace = %name, error = %error_chain(&error), "removing leftover network namespace failed");
            }
        }
    }
}

/// The pid encoded in a namespace name of this harness, if it is one.
fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let (pid, _) = rest.split_once('-')?;
    pid.parse().ok()
}

/// Checks a role, pod or client name: it becomes part of a namespace name.
pub(crate) fn validate_name(name: &str) -> Result<(), NetnsError> {
    let valid_chars = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if name.is_empty() || name.len() > MAX_ROLE_LEN || !valid_chars {
        return Err(NetnsError::InvalidName {
            name: name.to_owned(),
            reason: "use 1 to 16 characters out of a-z, 0-9 and -",
        });
    }
    Ok(())
}

/// Runs `ip ARGS…`, feeding `stdin` if given, and returns its stdout.
fn run_ip(args: &[&str], stdin: Option<&str>) -> Result<String, NetnsError> {
    let command_line = format!("ip {}", args.join(" "));
    let spawn_error = |source| NetnsError::Spawn {
        command: command_line.clone(),
        source,
    };
    let mut child = Command::new("ip")
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_error)?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).map_err(spawn_error)?;
    }
    let output = child.wait_with_output().map_err(spawn_error)?;
    if !output.status.success() {
        let stdin_note = stdin.map(|s| format!("\ninput:\n{s}")).unwrap_or_default();
        return Err(NetnsError::Command {
            command: command_line,
            status: output.status,
            stderr: format!(
                "{}{stdin_note}",
                String::from_utf8_lossy(&output.stderr).trim_end()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// An error followed by its causes, separated by `: `, for panic messages.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_this_harness_carry_the_owner_pid() {
        assert_eq!(owner_pid("kpt-4711-3-node"), Some(4711));
        assert_eq!(owner_pid("kpt-4711-12-ep-1"), Some(4711));
        assert_eq!(owner_pid("kpt-legacy-4711"), None);
        assert_eq!(owner_pid("cni-1234-5678"), None);
    }

    #[test]
    fn names_must_fit_in_a_namespace_name() {
        assert!(validate_name("ep1").is_ok());
        assert!(validate_name("client-2").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("Ep1").is_err());
        assert!(validate_name("ep/1").is_err());
        assert!(validate_name("a-very-long-pod-name").is_err());
    }
}
