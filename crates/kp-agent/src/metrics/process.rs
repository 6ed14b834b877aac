//! The standard process metrics (`process_*`), read from `/proc/self` when
//! scraped.

use std::fs;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Clock ticks per second of `/proc/<pid>/stat` times: `USER_HZ`, 100 on
/// every Linux architecture Kubernetes runs on.
const TICKS_PER_SECOND: f64 = 100.0;

/// The process metrics, refreshed before each scrape.
pub(super) struct ProcessMetrics {
    cpu_seconds: Counter<f64, AtomicU64>,
    resident_bytes: Gauge,
    virtual_bytes: Gauge,
    start_time: Gauge<f64, AtomicU64>,
    open_fds: Gauge,
    max_fds: Gauge,
}

impl ProcessMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            cpu_seconds: Counter::default(),
            resident_bytes: Gauge::default(),
            virtual_bytes: Gauge::default(),
            start_time: Gauge::default(),
            open_fds: Gauge::default(),
            max_fds: Gauge::default(),
        };
        registry.register(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            metrics.cpu_seconds.clone(),
        );
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            metrics.resident_bytes.clone(),
        );
        registry.register(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            metrics.virtual_bytes.clone(),
        );
        registry.register(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds",
            metrics.start_time.clone(),
        );
        registry.register(
            "process_open_fds",
            "Number of open file descriptors",
            metrics.open_fds.clone(),
        );
        registry.register(
            "process_max_fds",
            "Maximum number of open file descriptors",
            metrics.max_fds.clone(),
        );
        metrics.refresh();
        metrics
    }

    /// Reads `/proc/self`; a value that cannot be read keeps its last one.
    pub(super) fn refresh(&self) {
        if let Some(stat) = read("/proc/self/stat").as_deref().and_then(stat_fields) {
            let cpu = (stat.utime + stat.stime) as f64 / TICKS_PER_SECOND;
            let counted = self.cpu_seconds.get();
            if cpu > counted {
                self.cpu_seconds.inc_by(cpu - counted);
            }
            if let Some(boot) = read("/proc/stat").as_deref().and_then(boot_time) {
                self.start_time
                    .set(boot as f64 + stat.start_ticks as f64 / TICKS_PER_SECOND);
            }
        }
        if let Some(status) = read("/proc/self/status") {
            if let Some(kib) = status_kib(&status, "VmRSS:") {
                self.resident_bytes.set(kib.saturating_mul(1024));
            }
            if let Some(kib) = status_kib(&status, "VmSize:") {
                self.virtual_bytes.set(kib.saturating_mul(1024));
            }
        }
        if let Ok(entries) = fs::read_dir("/proc/self/fd") {
            self.open_fds
                .set(i64::try_from(entries.count()).unwrap_or(i64::MAX));
        }
        if let Some(limit) = read("/proc/self/limits")
            .as_deref()
            .and_then(max_open_files)
        {
            self.max_fds.set(limit);
        }
    }
}

struct Stat {
    utime: u64,
    stime: u64,
    start_ticks: u64,
}

fn read(path: &str) -> Option<String> {
    fs::read_to_string(path).ok()
}

/// utime, stime and starttime (fields 14, 15 and 22) of `/proc/<pid>/stat`;
/// the fields are counted after the command name, which may hold spaces.
fn stat_fields(stat: &str) -> Option<Stat> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Field 3 (state) is the first after the name.
    let field = |n: usize| fields.get(n - 3)?.parse().ok();
    Some(Stat {
        utime: field(14)?,
        stime: field(15)?,
        start_ticks: field(22)?,
    })
}

fn boot_time(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("btime "))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn status_kib(status: &str, key: &str) -> Option<i64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn max_open_files(limits: &str) -> Option<i64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_a_name_with_spaces() {
        let stat =
            "42 (kube proxy) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 12345 1000 200";
        let fields = stat_fields(stat).unwrap();
        assert_eq!(
            (fields.utime, fields.stime, fields.start_ticks),
            (250, 50, 12345)
        );
    }

    #[test]
    fn limits_and_status_values() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1048576              1048576              files\n";
        assert_eq!(max_open_files(limits), Some(1_048_576));
        assert_eq!(
            status_kib("Name:\tx\nVmRSS:\t  5120 kB\n", "VmRSS:"),
            Some(5120)
        );
        assert_eq!(
            boot_time("cpu 1 2\nbtime 1700000000\n"),
            Some(1_700_000_000)
        );
    }
}
