//! The `kube-proxy` binary under test, and what its own metrics say about
//! its IPv4 syncs.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kp_testkit::http;
use kp_testkit::netns::NsChild;
use kp_testkit::plan::{NODE_NAME, POD_CIDR};

use crate::mode::Mode;

/// How often the driver reads `/metrics` while it waits for a sync, by
/// default (`KP_E2E_POLL_MS`).
const POLL_MS: u64 = 5;
/// Time for the metrics of a sync that just ended to be all updated (the
/// proxy sets them one after the other, `last_timestamp` last but not
/// necessarily encoded last).
const SETTLE: Duration = Duration::from_millis(2);

const LAST_SYNC: &str = "kubeproxy_sync_proxy_rules_last_timestamp_seconds";
const SYNCS: &str = "kubeproxy_sync_proxy_rules_duration_seconds";
const FULL_SYNCS: &str = "kubeproxy_sync_full_proxy_rules_duration_seconds";
const PARTIAL_SYNCS: &str = "kubeproxy_sync_partial_proxy_rules_duration_seconds";
const PROGRAMMING: &str = "kubeproxy_network_programming_duration_seconds";
const RESTORE_FAILURES: &str = "kubeproxy_sync_proxy_rules_iptables_restore_failures_total";

/// The running binary; killed on drop.
pub struct Proxy {
    child: NsChild,
    /// When it was spawned (Unix time, s).
    pub spawned: f64,
    log: PathBuf,
}

/// A histogram's count and sum.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Histogram {
    pub count: u64,
    pub sum: f64,
}

/// The proxy's IPv4 sync metrics at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// End of the last successful sync (Unix time, s).
    pub last_sync: Option<f64>,
    pub syncs: Histogram,
    pub full: Histogram,
    pub partial: Histogram,
    /// Network programming latencies observed: one per changed Service
    /// whose slice carried a trigger time, in the sync that applied it.
    pub programming: Histogram,
    pub restore_failures: u64,
}

/// Full or partial, as the proxy's histograms tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncKind {
    Full,
    Partial,
}

/// One IPv4 sync, as two settled snapshots tell it.
#[derive(Debug, Clone, Copy)]
pub struct SeenSync {
    /// When it ended (Unix time, s).
    pub end: f64,
    /// How long it ran (s).
    pub duration: f64,
    pub kind: SyncKind,
    /// Syncs that ended between the two snapshots (1 unless the driver
    /// fell behind; then `duration` is theirs together).
    pub syncs: u64,
    /// Network programming latencies it observed.
    pub programmed: u64,
}

/// Follows the proxy's syncs through its metrics.
pub struct SyncWatch {
    /// The snapshot at the last sync seen.
    pub seen: Snapshot,
}

/// VmHWM and VmRSS of a process (KiB), and VmRSS split into heap and
/// stacks (RssAnon) and mapped files, the binary's own pages among them
/// (RssFile), so that a change in code size is told apart from one in
/// the heap.
#[derive(Debug, Clone, Copy)]
pub struct Memory {
    pub hwm_kib: u64,
    pub rss_kib: u64,
    pub anon_kib: u64,
    pub file_kib: u64,
}

impl Proxy {
    /// Starts the binary in the calling thread's namespace as an operator
    /// runs it, against the API server of `kubeconfig`, logging to `log`.
    /// `path_first` goes before the PATH (the lone-restore capture).
    pub fn spawn(mode: Mode, kubeconfig: &Path, log: &Path, path_first: Option<&Path>) -> Self {
        // KP_E2E_BINARY runs another build of the binary (two trees built
        // into one target directory share the path below).
        let binary = std::env::var_os("KP_E2E_BINARY")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_kube-proxy").into());
        let mut command = Command::new(binary);
        command
            .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
            .args(["--hostname-override", NODE_NAME])
            .args(["--cluster-cidr", &POD_CIDR.to_string()])
            .args(mode.flags())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(log).unwrap()));
        if let Some(dir) = path_first {
            let path = std::env::var_os("PATH").unwrap_or_default();
            let paths = std::iter::once(dir.to_owned()).chain(std::env::split_paths(&path));
            command.env("PATH", std::env::join_paths(paths).unwrap());
        }
        let spawned = unix_now();
        let child = NsChild::spawn(&mut command).unwrap();
        Self {
            child,
            spawned,
            log: log.to_owned(),
        }
    }

    pub fn memory(&self) -> Memory {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kib = |field: &str| {
            let line = status.lines().find(|l| l.starts_with(field)).unwrap();
            line.split_whitespace().nth(1).unwrap().parse().unwrap()
        };
        Memory {
            hwm_kib: kib("VmHWM:"),
            rss_kib: kib("VmRSS:"),
            anon_kib: kib("RssAnon:"),
            file_kib: kib("RssFile:"),
        }
    }

    /// The last lines of its log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Waits for the end of the first successful IPv4 sync.
    pub fn first_sync(&self, timeout: Duration) -> SyncWatch {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(snapshot) = Snapshot::read().filter(|s| s.last_sync.is_some()) {
                std::thread::sleep(SETTLE);
                let seen = Snapshot::read().unwrap_or(snapshot);
                return SyncWatch { seen };
            }
            self.check_alive(deadline, "the first sync");
            std::thread::sleep(poll());
        }
    }

    #[track_caller]
    fn check_alive(&self, deadline: Instant, what: &str) {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; the log's end:\n{}",
            self.log_tail()
        );
    }
}

impl SyncWatch {
    /// Reads the metrics again, so that the next sync is measured from
    /// now (a sync that ended since is taken as seen).
    pub fn refresh(&mut self) {
        if let Some(now) = Snapshot::read() {
            if now.last_sync != self.seen.last_sync {
                std::thread::sleep(SETTLE);
                self.seen = Snapshot::read().unwrap_or(now);
            }
        }
    }

    /// Waits for the next IPv4 sync to end, reading the metrics every
    /// [`poll`] interval.
    pub fn next(&mut self, proxy: &Proxy, timeout: Duration) -> SeenSync {
        let deadline = Instant::now() + timeout;
        loop {
            std::thread::sleep(poll());
            let Some(now) = Snapshot::read() else {
                proxy.check_alive(deadline, "the metrics server");
                continue;
            };
            if now.last_sync == self.seen.last_sync {
                proxy.check_alive(deadline, "a sync");
                continue;
            }
            std::thread::sleep(SETTLE);
            let now = Snapshot::read().unwrap_or(now);
            let before = std::mem::replace(&mut self.seen, now);
            let now = &self.seen;
            return SeenSync {
                end: now.last_sync.unwrap(),
                duration: now.syncs.sum - before.syncs.sum,
                kind: if now.partial.count > before.partial.count {
                    SyncKind::Partial
                } else {
                    SyncKind::Full
                },
                syncs: now.syncs.count - before.syncs.count,
                programmed: now.programming.count - before.programming.count,
            };
        }
    }
}

impl SeenSync {
    /// When it started (Unix time, s): its end minus its duration.
    pub fn start(&self) -> f64 {
        self.end - self.duration
    }
}

impl Snapshot {
    /// `GET /metrics` of the binary (127.0.0.1:10249 in the calling
    /// thread's namespace), if it answers.
    pub fn read() -> Option<Self> {
        let reply = http::get(("127.0.0.1", 10249), "/metrics").ok()?;
        (reply.code == 200).then(|| Self::parse(&reply.body))
    }

    fn parse(text: &str) -> Self {
        let histogram = |name: &str| Histogram {
            count: series(text, &format!("{name}_count")).map_or(0, |v| v as u64),
            sum: series(text, &format!("{name}_sum")).unwrap_or(0.0),
        };
        Self {
            last_sync: series(text, LAST_SYNC),
            syncs: histogram(SYNCS),
            full: histogram(FULL_SYNCS),
            partial: histogram(PARTIAL_SYNCS),
            programming: histogram(PROGRAMMING),
            restore_failures: series(text, RESTORE_FAILURES).map_or(0, |v| v as u64),
        }
    }
}

/// The IPv4 series of metric `name` (`name{ip_family="IPv4"} VALUE`).
fn series(text: &str, name: &str) -> Option<f64> {
    let prefix = format!("{name}{{ip_family=\"IPv4\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.trim().parse().ok())
}

/// How often the driver reads `/metrics` while it waits for a sync:
/// `KP_E2E_POLL_MS`, [`POLL_MS`] by default. Each read costs the proxy an
/// encoding of its metrics; a longer interval shows what the polling costs.
pub fn poll() -> Duration {
    static POLL: OnceLock<Duration> = OnceLock::new();
    *POLL.get_or_init(|| {
        let ms = std::env::var("KP_E2E_POLL_MS").map_or(POLL_MS, |text| {
            text.parse()
                .unwrap_or_else(|_| panic!("KP_E2E_POLL_MS: {text:?} is not a number"))
        });
        Duration::from_millis(ms)
    })
}

/// Now, as Unix time in seconds.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}
