//! Logging flags: component-base's (`logs/api/v1` `AddFlags`, which upstream
//! kube-proxy v1.34 registers) and klog's own (which upstream kube-proxy
//! removed in v1.26 but older DaemonSets still pass).
//!
//! Value syntax follows upstream: `--vmodule` is a comma-separated list of
//! `pattern=N`, `-v` a decimal below 2^31, `--stderrthreshold` a severity
//! name or number, buffer sizes Kubernetes quantities.

use std::path::PathBuf;

use crate::types::{LoggingConfiguration, Quantity, VModuleItem};
use crate::validation::is_quantity;

/// The klog flags kube-proxy-rs honours; see [`KLOG_FLAGS`] for all of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KlogOptions {
    /// `--logtostderr` (default true): log to stderr instead of a file.
    pub logtostderr: bool,
    /// `--alsologtostderr`: with a log file, write every entry to stderr too.
    pub alsologtostderr: bool,
    /// `--log-file`: the file to log to when `logtostderr` is false.
    pub log_file: Option<PathBuf>,
    /// `--stderrthreshold` (default ERROR): with a log file, entries at or
    /// above this severity also go to stderr.
    pub stderr_threshold: Severity,
}

impl Default for KlogOptions {
    fn default() -> Self {
        Self {
            logtostderr: true,
            alsologtostderr: false,
            log_file: None,
            stderr_threshold: Severity::Error,
        }
    }
}

impl KlogOptions {
    /// The file logs go to, as klog decides: only when `logtostderr` is off.
    pub fn file(&self) -> Option<&PathBuf> {
        self.log_file.as_ref().filter(|_| !self.logtostderr)
    }
}

/// A klog severity (`--stderrthreshold`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// `INFO` or `0`.
    Info,
    /// `WARNING` or `1`.
    Warning,
    /// `ERROR` or `2`.
    Error,
    /// `FATAL` or `3`.
    Fatal,
}

/// The values of `--vmodule` occurrences, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VModuleFlag(pub Vec<VModuleItem>);

/// klog's flags, each with what kube-proxy-rs does with it (`None`: nothing).
pub const KLOG_FLAGS: [(&str, Option<&str>); 11] = [
    ("logtostderr", Some("false sends logs to --log-file")),
    (
        "alsologtostderr",
        Some("with --log-file, every entry also goes to stderr"),
    ),
    (
        "log-file",
        Some("logs go to this file when --logtostderr=false, as with klog"),
    ),
    (
        "stderrthreshold",
        Some("with --log-file, entries at or above this severity also go to stderr"),
    ),
    ("log-dir", None),
    ("log-file-max-size", None),
    ("add-dir-header", None),
    ("skip-headers", None),
    ("skip-log-headers", None),
    ("one-output", None),
    ("log-backtrace-at", None),
];

/// `--vmodule`: `pattern=N[,pattern=N...]`; empty items are skipped and N is
/// a decimal below 2^31, as component-base's `VModuleConfigurationPflag`.
pub fn parse_vmodule(value: &str) -> Result<VModuleFlag, String> {
    let mut items = Vec::new();
    for item in value.split(',').filter(|item| !item.is_empty()) {
        let parts: Vec<&str> = item.split('=').collect();
        let [pattern, level] = parts.as_slice() else {
            return Err(format!("{item:?} does not have the pattern=N format"));
        };
        if pattern.is_empty() || level.is_empty() {
            return Err(format!("{item:?} does not have the pattern=N format"));
        }
        let verbosity = parse_verbosity(level).map_err(|e| format!("in {item:?}: {e}"))?;
        items.push(VModuleItem {
            file_pattern: (*pattern).to_owned(),
            verbosity,
        });
    }
    Ok(VModuleFlag(items))
}

/// `-v`: a decimal number in [0, 2^31).
pub fn parse_verbosity(value: &str) -> Result<u32, String> {
    value
        .parse::<u32>()
        .ok()
        .filter(|v| i32::try_from(*v).is_ok())
        .ok_or_else(|| {
            format!(
                "invalid verbosity {value:?}: must be a number from 0 to {}",
                i32::MAX
            )
        })
}

/// `--stderrthreshold`: INFO, WARNING, ERROR or FATAL (any case), or 0–3.
pub fn parse_severity(value: &str) -> Result<Severity, String> {
    match value.to_ascii_uppercase().as_str() {
        "INFO" | "0" => Ok(Severity::Info),
        "WARNING" | "1" => Ok(Severity::Warning),
        "ERROR" | "2" => Ok(Severity::Error),
        "FATAL" | "3" => Ok(Severity::Fatal),
        _ => Err(format!(
            "unknown severity {value:?}: use INFO, WARNING, ERROR, FATAL or 0-3"
        )),
    }
}

/// `--log-backtrace-at`: empty, or `file.go:N` with N > 0.
pub fn parse_backtrace_at(value: &str) -> Result<String, String> {
    if value.is_empty() {
        return Ok(String::new());
    }
    let valid = value
        .split_once(':')
        .is_some_and(|(file, line)| file.contains('.') && line.parse::<u32>().is_ok_and(|n| n > 0));
    if valid {
        Ok(value.to_owned())
    } else {
        Err(format!("syntax error in {value:?}: expect file.go:234"))
    }
}

/// `--log-*-info-buffer-size`: a Kubernetes quantity (`0`, `512`, `1K`, `2Ki`, `3M`).
pub fn parse_quantity(value: &str) -> Result<Quantity, String> {
    if is_quantity(value) {
        Ok(Quantity(value.to_owned()))
    } else {
        Err(format!(
            "{value:?} is not a quantity: give bytes (512), multiples of 1000 (1K), of 1024 (2Ki), or powers of those (3M, 4G, 5Mi, 6Gi)"
        ))
    }
}

/// One warning for an explicitly set klog flag: upstream no longer has it,
/// and what kube-proxy-rs does with it.
pub fn klog_flag_warning(flag: &str, klog: &KlogOptions) -> String {
    let prefix = format!(
        "flag --{flag} is a klog flag that upstream kube-proxy removed in v1.26 (v1.34 exits with \"unknown flag\"); kube-proxy-rs accepts it"
    );
    match KLOG_FLAGS.iter().find(|(name, _)| *name == flag) {
        Some((_, Some(meaning))) if flag == "log-file" && klog.logtostderr => {
            format!("{prefix}: {meaning}, but --logtostderr is true, so it has no effect")
        }
        Some((_, Some(meaning))) => format!("{prefix}: {meaning}"),
        _ => format!("{prefix} but it has no effect"),
    }
}

/// Warnings for logging options that are valid but do nothing here.
pub fn logging_option_warnings(logging: &LoggingConfiguration, dry_run: bool) -> Vec<String> {
    let mut warnings = Vec::new();
    let formats = [
        ("text", &logging.options.text),
        ("json", &logging.options.json),
    ];
    for (format, options) in formats {
        let size = &options.info_buffer_size.0;
        if !size.is_empty() && !crate::validation::quantity_is_zero(size) {
            warnings.push(format!(
                "logging.options.{format}.infoBufferSize (--log-{format}-info-buffer-size) has no effect in kube-proxy-rs: info messages are written unbuffered"
            ));
        }
        if dry_run && options.split_stream && logging.format == format {
            warnings.push(format!(
                "logging.options.{format}.splitStream (--log-{format}-split-stream) is ignored with --dry-run: stdout carries the rules, so every message goes to stderr"
            ));
        }
    }
    warnings
}
