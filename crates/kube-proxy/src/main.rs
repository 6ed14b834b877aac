//! `kube-proxy`: the kube-proxy-rs node proxy.
//!
//! This file only turns the command line into a run and the run's result into
//! an exit code; the work is in the library crates.

mod agent;
mod app;
mod check;
mod config_watch;
mod drift;
mod klog;
mod logging;
mod malloc_tuning;
mod modes;
mod node_name;
mod node_setup;
mod rlimit;
mod trace;

use std::process::ExitCode;

fn main() -> ExitCode {
    // `kube-proxy trace …` and `kube-proxy check …` read the node's rules
    // and exit; upstream's command line takes no positional argument, so
    // the words cannot clash.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|arg| arg == "trace") {
        return trace::main(&args);
    }
    if args.get(1).is_some_and(|arg| arg == "check") {
        return check::main(&args);
    }
    if args.get(1).is_some_and(|arg| arg == drift::WORKER) {
        return drift::worker_main(&args);
    }
    let (flags, matches) = match kp_config::parse_args(args) {
        Ok(parsed) => parsed,
        Err(error) => {
            // --help and --version end here with exit code 0; upstream exits 1
            // for any flag error, so we do too.
            let code = if error.use_stderr() { 1 } else { 0 };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    match flags.version.as_deref() {
        Some("true") => {
            println!("{}", version_line());
            return ExitCode::SUCCESS;
        }
        Some("raw") => {
            println!("{}", raw_version());
            return ExitCode::SUCCESS;
        }
        _ => {}
    }
    if cfg!(target_env = "gnu") {
        malloc_tuning::apply();
    }
    rlimit::raise_nofile_limit();
    match app::run(&flags, &matches) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            app::report_error(&error);
            ExitCode::FAILURE
        }
    }
}

/// What `--version` prints: our version and the Kubernetes minor release
/// whose kube-proxy we match.
fn version_line() -> String {
    let (major, minor) = kp_config::KUBERNETES_COMPAT_VERSION;
    format!(
        "kube-proxy-rs v{} (Kubernetes v{major}.{minor} compatible)",
        env!("CARGO_PKG_VERSION")
    )
}

/// What `--version=raw` prints: the same as key/value pairs.
fn raw_version() -> String {
    let (major, minor) = kp_config::KUBERNETES_COMPAT_VERSION;
    format!(
        "version.Info{{Program:\"kube-proxy-rs\", GitVersion:\"v{}\", Compatible:\"v{major}.{minor}\", Platform:\"{}/{}\"}}",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}
