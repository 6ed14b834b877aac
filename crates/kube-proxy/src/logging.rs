//! Log output: upstream's `-v`, `--vmodule`, `--logging-format` and split
//! streams, and klog's `--logtostderr`/`--log-file`, on `tracing`.

use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use kp_config::{KlogOptions, LoggingConfiguration, Severity, VModuleItem};

use crate::klog::Klog;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::filter::{EnvFilter, FilterExt, FilterFn, LevelFilter};
use tracing_subscriber::fmt::writer::{MakeWriter, MakeWriterExt};
use tracing_subscriber::layer::{Context, Filter};
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

/// The least severe `tracing` level that can carry an entry of klog
/// verbosity `verbosity`: 0–3 INFO, 4–5 DEBUG, 6 and more TRACE (whole
/// rulesets).
pub fn level_for_verbosity(verbosity: u32) -> LevelFilter {
    match verbosity {
        0..=3 => LevelFilter::INFO,
        4..=5 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

/// The klog verbosity of an entry at `level` whose `v` field (if any) is
/// `v`: an INFO entry is written at `-v` 0 unless it names a higher
/// verbosity (`tracing::info!(v = 2, …)`, upstream's `klog.V(2).InfoS`), a
/// DEBUG entry at 4 and a TRACE entry at 6 unless they name theirs;
/// warnings and errors at every verbosity (`None` for errors, which klog
/// gives no verbosity).
pub fn entry_verbosity(level: Level, v: Option<u64>) -> Option<u32> {
    let named = v.map(|v| u32::try_from(v).unwrap_or(u32::MAX));
    match level {
        Level::ERROR => None,
        Level::WARN => Some(0),
        Level::INFO => Some(named.unwrap_or(0)),
        Level::DEBUG => Some(named.unwrap_or(4)),
        Level::TRACE => Some(named.unwrap_or(6)),
    }
}

/// The running `-v`: what `/debug/flags/v` reads and changes.
#[derive(Debug, Clone, Default)]
pub struct Verbosity(Arc<AtomicU32>);

impl Verbosity {
    fn new(verbosity: u32) -> Self {
        Self(Arc::new(AtomicU32::new(verbosity)))
    }

    /// The verbosity now.
    pub fn get(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }

    /// Sets the verbosity of every file `--vmodule` does not name, from
    /// the next entry on.
    pub fn set(&self, verbosity: u32) {
        self.0.store(verbosity, Ordering::Relaxed);
        // Call sites cache whether they are enabled; ask them again.
        tracing::callsite::rebuild_interest_cache();
    }

    /// Sets the verbosity from `text` as `PUT /debug/flags/v` sends it,
    /// answering with upstream's (component-base's) texts.
    pub fn set_from_text(&self, text: &str) -> Result<String, String> {
        let text = text.trim();
        match text.parse::<i32>() {
            Ok(verbosity) => {
                // klog takes a negative level too; below 0 nothing more is
                // hidden than at 0 (entries without `v`).
                let verbosity = u32::try_from(verbosity).unwrap_or(0);
                self.set(verbosity);
                tracing::info!(verbosity, "Log verbosity changed through /debug/flags/v");
                Ok(format!("successfully set klog.logging.verbosity to {text}"))
            }
            Err(error) => Err(format!(
                "failed set klog.logging.verbosity {text}: strconv.ParseInt: parsing {text:?}: {}",
                match error.kind() {
                    std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow =>
                        "value out of range",
                    _ => "invalid syntax",
                }
            )),
        }
    }
}

/// The verbosity of the installed subscriber, once [`init_with`] ran
/// without `RUST_LOG` (which then decides alone).
static INSTALLED: OnceLock<Verbosity> = OnceLock::new();

/// The running verbosity, when `-v` decides what is logged.
pub fn installed_verbosity() -> Option<Verbosity> {
    INSTALLED.get().cloned()
}

/// Installs the global subscriber. `RUST_LOG`, when set, overrides `-v` and
/// `--vmodule`. A subscriber is already installed only when this runs twice,
/// which main never does; nothing to report then.
pub fn init_with(settings: &LogSettings) -> Result<(), LoggingError> {
    let (subscriber, verbosity) = build(settings, EnvFilter::try_from_default_env().ok())?;
    if subscriber.try_init().is_ok() {
        if let Some(verbosity) = verbosity {
            let _ = INSTALLED.set(verbosity);
        }
    }
    Ok(())
}

/// The subscriber `settings` ask for, not yet installed, with `RUST_LOG`'s
/// filter (if any) given; and its verbosity, unless `RUST_LOG` decides.
fn build(
    settings: &LogSettings,
    env: Option<EnvFilter>,
) -> Result<(impl Subscriber + Send + Sync, Option<Verbosity>), LoggingError> {
    let (filter, verbosity) = match env {
        Some(env) => (FilterExt::<Registry>::boxed(env), None),
        None => {
            let verbosity = Verbosity::new(settings.verbosity);
            let filter = VerbosityFilter::new(verbosity.clone(), &settings.vmodule);
            (FilterExt::<Registry>::boxed(filter), Some(verbosity))
        }
    };
    // kube-rs logs every failed request of a watch at WARN or ERROR; the
    // API source reports an outage once and each retry at debug level.
    let filter = filter.and(FilterFn::new(|meta: &Metadata<'_>| {
        !kp_source::api::is_retry_noise(meta)
    }));
    let layer = output_layer(settings)?.with_filter(filter);
    Ok((Registry::default().with(layer), verbosity))
}

/// `-v` (changed at run time through [`Verbosity`]) for every file,
/// `--vmodule` for the files it names; an entry passes when its
/// [`entry_verbosity`] is at most its file's verbosity.
struct VerbosityFilter {
    verbosity: Verbosity,
    modules: Vec<(String, u32)>,
}

impl VerbosityFilter {
    fn new(verbosity: Verbosity, vmodule: &[VModuleItem]) -> Self {
        let modules = vmodule
            .iter()
            .map(|item| (item.file_pattern.clone(), item.verbosity))
            .collect();
        Self { verbosity, modules }
    }

    fn verbosity_of(&self, meta: &Metadata<'_>) -> u32 {
        level_for_file(meta.file(), &self.modules).unwrap_or_else(|| self.verbosity.get())
    }
}

impl<S> Filter<S> for VerbosityFilter {
    fn enabled(&self, meta: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        *meta.level() <= level_for_verbosity(self.verbosity_of(meta))
    }

    fn event_enabled(&self, event: &Event<'_>, _: &Context<'_, S>) -> bool {
        let meta = event.metadata();
        let mut v = VField(None);
        event.record(&mut v);
        entry_verbosity(*meta.level(), v.0).is_none_or(|entry| entry <= self.verbosity_of(meta))
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        let most = self
            .modules
            .iter()
            .map(|(_, verbosity)| *verbosity)
            .fold(self.verbosity.get(), u32::max);
        Some(level_for_verbosity(most))
    }
}

/// The `v` field of an entry.
struct VField(Option<u64>);

impl Visit for VField {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "v" {
            self.0 = Some(value);
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if field.name() == "v" {
            self.0 = Some(u64::try_from(value).unwrap_or(0));
        }
    }

    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

/// The level of the first `--vmodule` pattern that matches `file`, as klog
/// matches Go files: without the extension, the base name, or for a pattern
/// with a `/` the path (here also any part of it that starts after a `/`,
/// since Rust records paths relative to the workspace).
fn level_for_file<T: Copy>(file: Option<&str>, modules: &[(String, T)]) -> Option<T> {
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
    tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .event_format(Klog { json })
        .boxed()
}

#[cfg(test)]
#[path = "logging_tests.rs"]
mod tests;
