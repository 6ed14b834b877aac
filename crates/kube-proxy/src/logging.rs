//! Log output: upstream's `-v`, `--vmodule`, `--logging-format` and split
//! streams, and klog's `--logtostderr`/`--log-file`, on `tracing`.

use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::sync::Arc;

use kp_config::{KlogOptions, LoggingConfiguration, Severity, VModuleItem};

use crate::klog::{KlogJson, KlogText};
use tracing::{Level, Metadata, Subscriber};
use tracing_subscriber::filter::{EnvFilter, FilterExt, FilterFn, LevelFilter};
use tracing_subscriber::fmt::writer::{MakeWriter, MakeWriterExt};
use tracing_subscriber::layer::{Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Registry;

/// What can go wrong while setting up logging.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// `--log-file` could not be opened for appending.
    #[error("opening --log-file {path}")]
    OpenLogFile {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
}

/// Everything that decides where logs go and which are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// `-v` / `logging.verbosity`.
    pub verbosity: u32,
    /// `--vmodule` / `logging.vmodule`: per-file verbosity, first match wins.
    pub vmodule: Vec<VModuleItem>,
    /// `logging.format: json`.
    pub json: bool,
    /// Errors to stderr, the rest to stdout (`logging.options.<format>.splitStream`).
    pub split_stream: bool,
    /// klog's output flags.
    pub klog: KlogOptions,
}

impl LogSettings {
    /// The settings of a validated configuration; `dry_run` keeps stdout
    /// for the rules, so split streams are not used then.
    pub fn from_config(logging: &LoggingConfiguration, klog: &KlogOptions, dry_run: bool) -> Self {
        let json = logging.format == "json";
        let options = if json {
            &logging.options.json
        } else {
            &logging.options.text
        };
        Self {
            verbosity: logging.verbosity,
            vmodule: logging.vmodule.clone(),
            json,
            split_stream: options.split_stream && !dry_run,
            klog: klog.clone(),
        }
    }
}

/// Maps klog verbosity to a `tracing` level: 0–3 give INFO (upstream logs
/// its routine messages at 2 and below), 4–5 DEBUG, 6 and more TRACE
/// (whole rulesets).
pub fn level_for_verbosity(verbosity: u32) -> LevelFilter {
    match verbosity {
        0..=3 => LevelFilter::INFO,
        4..=5 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

/// Installs the global subscriber. `RUST_LOG`, when set, overrides `-v` and
/// `--vmodule`. A subscriber is already installed only when this runs twice,
/// which main never does; nothing to report then.
pub fn init_with(settings: &LogSettings) -> Result<(), LoggingError> {
    drop(subscriber(settings)?.try_init());
    Ok(())
}

/// The subscriber `settings` ask for, not yet installed.
pub fn subscriber(settings: &LogSettings) -> Result<impl Subscriber + Send + Sync, LoggingError> {
    build(settings, EnvFilter::try_from_default_env().ok())
}

/// [`subscriber`], with `RUST_LOG`'s filter (if any) given.
fn build(
    settings: &LogSettings,
    env: Option<EnvFilter>,
) -> Result<impl Subscriber + Send + Sync, LoggingError> {
    let filter = match env {
        Some(env) => FilterExt::<Registry>::boxed(env),
        None => {
            FilterExt::<Registry>::boxed(verbosity_filter(settings.verbosity, &settings.vmodule))
        }
    };
    // kube-rs logs every failed request of a watch at WARN or ERROR; the
    // API source reports an outage once and each retry at debug level.
    let filter = filter.and(FilterFn::new(|meta: &Metadata<'_>| {
        !kp_source::api::is_retry_noise(meta)
    }));
    let layer = output_layer(settings)?.with_filter(filter);
    Ok(Registry::default().with(layer))
}

/// `-v` for every file, `--vmodule` for the files it names.
fn verbosity_filter(
    verbosity: u32,
    vmodule: &[VModuleItem],
) -> FilterFn<impl Fn(&Metadata<'_>) -> bool> {
    let default = level_for_verbosity(verbosity);
    let modules: Vec<(String, LevelFilter)> = vmodule
        .iter()
        .map(|item| {
            (
                item.file_pattern.clone(),
                level_for_verbosity(item.verbosity),
            )
        })
        .collect();
    let max = modules
        .iter()
        .map(|(_, level)| *level)
        .fold(default, Ord::max);
    FilterFn::new(move |meta: &Metadata<'_>| {
        let level = level_for_file(meta.file(), &modules).unwrap_or(default);
        *meta.level() <= level
    })
    .with_max_level_hint(max)
}

/// The level of the first `--vmodule` pattern that matches `file`, as klog
/// matches Go files: without the extension, the base name, or for a pattern
/// with a `/` the path (here also any part of it that starts after a `/`,
/// since Rust records paths relative to the workspace).
fn level_for_file(file: Option<&str>, modules: &[(String, LevelFilter)]) -> Option<LevelFilter> {
    let path = file?;
    let path = path.strip_suffix(".rs").unwrap_or(path);
    let base = path.rsplit('/').next().unwrap_or(path);
    modules.iter().find_map(|(pattern, level)| {
        let matches = if pattern.contains('/') {
            glob_match(pattern, path)
                || path
                    .match_indices('/')
                    .any(|(i, _)| glob_match(pattern, &path[i + 1..]))
        } else {
            glob_match(pattern, base)
        };
        matches.then_some(*level)
    })
}

/// Glob matching with `*` (any run of characters) and `?` (one character).
fn glob_match(pattern: &str, text: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let text: Vec<char> = text.chars().collect();
    let (mut p, mut t) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some('*') => {
                backtrack = Some((p, t));
                p += 1;
            }
            Some(c) if *c == '?' || *c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match backtrack {
                Some((star, matched)) => {
                    p = star + 1;
                    t = matched + 1;
                    backtrack = Some((star, matched + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|c| *c == '*')
}

/// The formatting layer writing where klog's flags and split streams say.
fn output_layer(
    settings: &LogSettings,
) -> Result<Box<dyn Layer<Registry> + Send + Sync>, LoggingError> {
    let json = settings.json;
    let Some(path) = settings.klog.file() else {
        if settings.split_stream {
            let writer = std::io::stderr
                .with_max_level(Level::ERROR)
                .or_else(std::io::stdout);
            return Ok(fmt_layer(writer, json));
        }
        return Ok(fmt_layer(std::io::stderr, json));
    };
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| LoggingError::OpenLogFile {
            path: path.clone(),
            source,
        })?;
    let file = Arc::new(file);
    if settings.klog.alsologtostderr {
        return Ok(fmt_layer(file.and(std::io::stderr), json));
    }
    Ok(match stderr_level(settings.klog.stderr_threshold) {
        Some(level) => fmt_layer(file.and(std::io::stderr.with_max_level(level)), json),
        None => fmt_layer::<Arc<File>>(file, json),
    })
}

/// The least severe level `--stderrthreshold` copies to stderr (none for
/// FATAL: nothing in kube-proxy-rs logs at that severity).
fn stderr_level(threshold: Severity) -> Option<Level> {
    match threshold {
        Severity::Info => Some(Level::TRACE),
        Severity::Warning => Some(Level::WARN),
        Severity::Error => Some(Level::ERROR),
        Severity::Fatal => None,
    }
}

/// klog's text format, or component-base's JSON with `json`.
fn fmt_layer<W>(writer: W, json: bool) -> Box<dyn Layer<Registry> + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let layer = tracing_subscriber::fmt::layer().with_writer(writer);
    if json {
        layer.event_format(KlogJson).boxed()
    } else {
        layer.event_format(KlogText).boxed()
    }
}

#[cfg(test)]
#[path = "logging_tests.rs"]
mod tests;
