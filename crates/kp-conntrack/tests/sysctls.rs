//! The conntrack sysctl rules, on a fake `/proc` and `/sys` in a temporary
//! directory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use kp_config::{GoDuration, KubeProxyConntrackConfiguration};
use kp_conntrack::{apply_sysctls, conntrack_max, SysctlError, SysctlPaths, SysctlReport};
use pretty_assertions::assert_eq;
use tempfile::TempDir;

/// A fake root with every conntrack sysctl at the kernel's usual value, and
/// the thread in the initial network namespace unless told otherwise.
struct FakeRoot {
    dir: TempDir,
}

impl FakeRoot {
    fn new() -> Self {
        let root = Self {
            dir: tempfile::tempdir().unwrap(),
        };
        for (name, value) in [
            ("nf_conntrack_max", "262144"),
            ("nf_conntrack_tcp_timeout_established", "432000"),
            ("nf_conntrack_tcp_timeout_close_wait", "60"),
            ("nf_conntrack_tcp_be_liberal", "0"),
            ("nf_conntrack_udp_timeout", "30"),
            ("nf_conntrack_udp_timeout_stream", "120"),
        ] {
            root.write(&root.netfilter(name), value);
        }
        root.write(&root.paths().hashsize, "65536");
        root.netns("net:[4026531840]", "net:[4026531840]");
        root
    }

    fn paths(&self) -> SysctlPaths {
        SysctlPaths::under(self.dir.path())
    }

    fn netfilter(&self, name: &str) -> PathBuf {
        self.paths().proc_sys.join("net/netfilter").join(name)
    }

    fn write(&self, path: &Path, value: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, format!("{value}\n")).unwrap();
    }

    fn read(&self, path: &Path) -> String {
        fs::read_to_string(path).unwrap().trim().to_owned()
    }

    fn sysctl(&self, name: &str) -> String {
        self.read(&self.netfilter(name))
    }

    /// Makes `/proc/thread-self/ns/net` and `/proc/1/ns/net` name `own`
    /// and `initial`.
    fn netns(&self, own: &str, initial: &str) {
        let paths = self.paths();
        for (link, target) in [(&paths.own_netns, own), (&paths.initial_netns, initial)] {
            fs::create_dir_all(link.parent().unwrap()).unwrap();
            let _ = fs::remove_file(link);
            symlink(target, link).unwrap();
        }
    }

    fn apply(&self, config: &KubeProxyConntrackConfiguration, cores: usize) -> SysctlReport {
        apply_sysctls(config, cores, &self.paths())
    }
}

fn nothing_configured() -> KubeProxyConntrackConfiguration {
    KubeProxyConntrackConfiguration {
        max_per_core: Some(0),
        min: Some(0),
        tcp_established_timeout: Some(GoDuration::ZERO),
        tcp_close_wait_timeout: Some(GoDuration::ZERO),
        tcp_be_liberal: false,
        udp_timeout: GoDuration::ZERO,
        udp_stream_timeout: GoDuration::ZERO,
    }
}

fn max_config(per_core: i32, min: i32) -> KubeProxyConntrackConfiguration {
    KubeProxyConntrackConfiguration {
        max_per_core: Some(per_core),
        min: Some(min),
        ..nothing_configured()
    }
}

#[test]
fn the_limit_is_max_per_core_times_cores_but_at_least_min() {
    assert_eq!(conntrack_max(&max_config(32768, 131072), 8), Some(262144));
    assert_eq!(conntrack_max(&max_config(32768, 131072), 2), Some(131072));
    assert_eq!(
        conntrack_max(&max_config(0, 131072), 8),
        None,
        "0 leaves the limit alone"
    );
    assert_eq!(conntrack_max(&max_config(-1, 131072), 8), None);
    assert_eq!(
        conntrack_max(&KubeProxyConntrackConfiguration::default(), 8),
        None
    );
}

#[test]
fn with_nothing_configured_nothing_is_written() {
    let root = FakeRoot::new();

    let report = root.apply(&nothing_configured(), 4);

    assert!(report.written.is_empty(), "{report:?}");
    assert!(report.failures.is_empty(), "{report:?}");
    assert_eq!(root.sysctl("nf_conntrack_max"), "262144");
}

#[test]
fn a_raised_limit_grows_the_hash_table_to_a_quarter_of_it() {
    let root = FakeRoot::new();

    let report = root.apply(&max_config(131072, 131072), 4);

    assert_eq!(
        report.written,
        [("nf_conntrack_max", 524288), ("hashsize", 131072)]
    );
    assert_eq!(root.sysctl("nf_conntrack_max"), "524288");
    assert_eq!(root.read(&root.paths().hashsize), "131072");
}

#[test]
fn a_limit_already_in_place_and_a_big_enough_hash_table_are_left_as_they_are() {
    let root = FakeRoot::new();

    let report = root.apply(&max_config(65536, 0), 4);

    assert!(report.written.is_empty(), "{report:?}");
    assert_eq!(report.unchanged, ["nf_conntrack_max", "hashsize"]);
}

#[test]
fn outside_the_initial_network_namespace_the_hash_size_is_not_touched() {
    let root = FakeRoot::new();
    root.netns("net:[4026532999]", "net:[4026531840]");

    let report = root.apply(&max_config(131072, 0), 4);

    assert_eq!(report.written, [("nf_conntrack_max", 524288)]);
    assert_eq!(
        report.skipped,
        [("hashsize", "not in the initial network namespace")]
    );
    assert_eq!(root.read(&root.paths().hashsize), "65536");
}

#[test]
fn timeouts_are_written_in_whole_seconds_and_be_liberal_as_one() {
    let root = FakeRoot::new();
    let config = KubeProxyConntrackConfiguration {
        tcp_established_timeout: Some(GoDuration::from_hours(24)),
        tcp_close_wait_timeout: Some(GoDuration::from_mins(60)),
        tcp_be_liberal: true,
        udp_timeout: GoDuration::from_millis(45_900),
        udp_stream_timeout: GoDuration::from_secs(120),
        ..nothing_configured()
    };

    let report = root.apply(&config, 4);

    assert_eq!(
        report.written,
        [
            ("nf_conntrack_tcp_timeout_established", 86400),
            ("nf_conntrack_tcp_timeout_close_wait", 3600),
            ("nf_conntrack_udp_timeout", 45),
            ("nf_conntrack_tcp_be_liberal", 1),
        ]
    );
    assert_eq!(report.unchanged, ["nf_conntrack_udp_timeout_stream"]);
    assert_eq!(root.sysctl("nf_conntrack_tcp_timeout_established"), "86400");
    assert_eq!(root.sysctl("nf_conntrack_udp_timeout"), "45");
    assert_eq!(root.sysctl("nf_conntrack_tcp_be_liberal"), "1");
}

#[test]
fn unset_and_negative_timeouts_leave_the_sysctls_alone() {
    let root = FakeRoot::new();
    let config = KubeProxyConntrackConfiguration {
        tcp_established_timeout: None,
        tcp_close_wait_timeout: Some(GoDuration::from_secs(-5)),
        ..nothing_configured()
    };

    let report = root.apply(&config, 4);

    assert!(
        report.written.is_empty() && report.failures.is_empty(),
        "{report:?}"
    );
    assert_eq!(root.sysctl("nf_conntrack_tcp_timeout_close_wait"), "60");
}

#[test]
fn a_failing_sysctl_is_reported_by_name_and_the_others_are_still_set() {
    let root = FakeRoot::new();
    // A directory where the file should be: writing it fails, as a
    // read-only /proc/sys would (root ignores file permissions).
    let established = root.netfilter("nf_conntrack_tcp_timeout_established");
    fs::remove_file(&established).unwrap();
    fs::create_dir(&established).unwrap();
    let config = KubeProxyConntrackConfiguration {
        tcp_established_timeout: Some(GoDuration::from_hours(24)),
        udp_timeout: GoDuration::from_secs(45),
        ..max_config(131072, 0)
    };

    let report = root.apply(&config, 4);

    let failed: Vec<&str> = report
        .failures
        .iter()
        .map(|failure| match failure {
            SysctlError::Write { name, .. } => *name,
            SysctlError::ReadHashsize { .. } => "hashsize",
        })
        .collect();
    assert_eq!(failed, ["nf_conntrack_tcp_timeout_established"]);
    let message = report.failures[0].to_string();
    assert!(
        message.contains("nf_conntrack_tcp_timeout_established"),
        "{message}"
    );
    assert_eq!(root.sysctl("nf_conntrack_udp_timeout"), "45");
    assert_eq!(root.sysctl("nf_conntrack_max"), "524288");
}

#[test]
fn when_the_limit_cannot_be_set_the_hash_size_is_left_alone() {
    let root = FakeRoot::new();
    let max = root.netfilter("nf_conntrack_max");
    fs::remove_file(&max).unwrap();
    fs::create_dir(&max).unwrap();
    let hashsize = root.paths().hashsize;

    let report = root.apply(&max_config(131072, 0), 4);

    assert_eq!(report.failures.len(), 1, "{report:?}");
    assert!(report.written.is_empty(), "{report:?}");
    assert_eq!(root.read(&hashsize), "65536");
}

#[test]
fn an_unreadable_hash_size_is_a_failure_too() {
    let root = FakeRoot::new();
    fs::remove_file(root.paths().hashsize).unwrap();

    let report = root.apply(&max_config(131072, 0), 4);

    assert_eq!(report.written, [("nf_conntrack_max", 524288)]);
    assert!(
        matches!(report.failures[..], [SysctlError::ReadHashsize { .. }]),
        "{report:?}"
    );
}
