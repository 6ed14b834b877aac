//! Log output: upstream's `-v` levels and `--logging-format` on `tracing`.

use std::io::IsTerminal;

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::EnvFilter;

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

/// Installs the global subscriber, writing to stderr (stdout is reserved for
/// `--dry-run` output). `RUST_LOG`, when set, overrides the level.
pub fn init(verbosity: u32, format: &str) {
    let filter = EnvFilter::builder()
        .with_default_directive(level_for_verbosity(verbosity).into())
        .from_env_lossy();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false);
    // Validation accepted only "text" (or empty) and "json".
    let result = if format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
    // A subscriber is already installed only when init runs twice, which
    // main never does; nothing to report then.
    drop(result);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbosity_maps_to_levels_as_klog_users_expect() {
        assert_eq!(level_for_verbosity(0), LevelFilter::INFO);
        assert_eq!(level_for_verbosity(2), LevelFilter::INFO);
        assert_eq!(level_for_verbosity(4), LevelFilter::DEBUG);
        assert_eq!(level_for_verbosity(9), LevelFilter::TRACE);
    }
}
