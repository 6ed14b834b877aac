//! Tests of `logging`: which entries `-v`/`--vmodule` let through and where
//! klog's flags send them. Each test installs its subscriber only for itself.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use super::*;

fn item(pattern: &str, verbosity: u32) -> VModuleItem {
    VModuleItem {
        file_pattern: pattern.to_owned(),
        verbosity,
    }
}

fn settings_logging_to(path: &Path) -> LogSettings {
    LogSettings {
        verbosity: 0,
        vmodule: Vec::new(),
        json: false,
        split_stream: false,
        klog: KlogOptions {
            logtostderr: false,
            log_file: Some(path.to_owned()),
            stderr_threshold: Severity::Fatal,
            ..KlogOptions::default()
        },
    }
}

/// Logs one INFO and one DEBUG entry from this file with `settings`, and
/// returns what reached the log file.
fn log_through(settings: &LogSettings, path: &Path) -> String {
    let (subscriber, _) = build(settings, None).unwrap();
    tracing::subscriber::with_default(subscriber, || {
        tracing::info!(entry = "routine", "Routine entry");
        tracing::debug!(entry = "detail", "Detailed entry");
    });
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn an_entry_is_written_at_the_verbosity_it_names() {
    assert_eq!(entry_verbosity(Level::ERROR, Some(2)), None);
    assert_eq!(entry_verbosity(Level::WARN, None), Some(0));
    assert_eq!(entry_verbosity(Level::INFO, None), Some(0));
    assert_eq!(entry_verbosity(Level::INFO, Some(2)), Some(2));
    assert_eq!(entry_verbosity(Level::DEBUG, None), Some(4));
    assert_eq!(entry_verbosity(Level::DEBUG, Some(5)), Some(5));
    assert_eq!(entry_verbosity(Level::TRACE, None), Some(6));

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kube-proxy.log");
    let mut settings = settings_logging_to(&path);
    settings.json = true;
    let (subscriber, verbosity) = build(&settings, None).unwrap();
    let verbosity = verbosity.unwrap();
    let entries = |verbosity_now: u32| {
        std::fs::write(&path, "").unwrap();
        verbosity.set(verbosity_now);
        tracing::info!("Always");
        tracing::info!(v = 2, "At two");
        tracing::info!(v = 3, "At three");
        tracing::debug!("At four");
        let text = std::fs::read_to_string(&path).unwrap();
        text.lines()
            .map(|line| {
                let entry: serde_json::Value = serde_json::from_str(line).unwrap();
                format!("{} v={}", entry["msg"].as_str().unwrap(), entry["v"])
            })
            .collect::<Vec<_>>()
    };
    tracing::subscriber::with_default(subscriber, || {
        assert_eq!(entries(0), ["Always v=0"]);
        assert_eq!(entries(1), ["Always v=0"]);
        assert_eq!(entries(2), ["Always v=0", "At two v=2"]);
        assert_eq!(
            entries(4),
            ["Always v=0", "At two v=2", "At three v=3", "At four v=4"]
        );
        assert_eq!(entries(0), ["Always v=0"]);
    });
}

#[test]
fn the_verbosity_is_set_from_text_as_component_base_answers() {
    let verbosity = Verbosity::new(0);
    assert_eq!(
        verbosity.set_from_text("4\n"),
        Ok("successfully set klog.logging.verbosity to 4".to_owned())
    );
    assert_eq!(verbosity.get(), 4);
    assert_eq!(
        verbosity.set_from_text("x"),
        Err(
            "failed set klog.logging.verbosity x: strconv.ParseInt: parsing \"x\": invalid syntax"
                .to_owned()
        )
    );
    assert_eq!(
        verbosity.set_from_text("99999999999"),
        Err("failed set klog.logging.verbosity 99999999999: strconv.ParseInt: parsing \"99999999999\": value out of range".to_owned())
    );
    assert_eq!(verbosity.get(), 4, "a refused value changes nothing");
    assert!(verbosity.set_from_text("-1").is_ok());
    assert_eq!(verbosity.get(), 0);
}

#[test]
fn verbosity_maps_to_levels_as_klog_users_expect() {
    assert_eq!(level_for_verbosity(0), LevelFilter::INFO);
    assert_eq!(level_for_verbosity(2), LevelFilter::INFO);
    assert_eq!(level_for_verbosity(4), LevelFilter::DEBUG);
    assert_eq!(level_for_verbosity(9), LevelFilter::TRACE);
}

#[test]
fn vmodule_patterns_match_file_names_as_klog_does() {
    let modules = [
        ("proxier".to_owned(), LevelFilter::TRACE),
        ("topo*".to_owned(), LevelFilter::DEBUG),
        ("kp-iptables/src/app?ier".to_owned(), LevelFilter::DEBUG),
    ];
    let level = |file| level_for_file(Some(file), &modules);
    assert_eq!(
        level("crates/kp-sync/src/proxier.rs"),
        Some(LevelFilter::TRACE)
    );
    assert_eq!(
        level("crates/kp-model/src/topology_hints.rs"),
        Some(LevelFilter::DEBUG)
    );
    assert_eq!(
        level("crates/kp-iptables/src/applier.rs"),
        Some(LevelFilter::DEBUG)
    );
    assert_eq!(level("crates/kp-nftables/src/applier.rs"), None);
    assert_eq!(level("crates/kp-sync/src/proxier_tests.rs"), None);
    assert_eq!(level_for_file(None, &modules), None);
}

#[test]
fn globs_match_whole_names() {
    assert!(glob_match("*", ""));
    assert!(glob_match("a*c", "abbbc"));
    assert!(glob_match("a?c", "abc"));
    assert!(!glob_match("a?c", "ac"));
    assert!(!glob_match("abc", "abcd"));
    assert!(glob_match("*er", "proxier"));
}

#[test]
fn log_file_receives_entries_at_the_verbosity_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kube-proxy.log");
    let written = log_through(&settings_logging_to(&path), &path);
    assert!(written.contains("Routine entry"), "{written}");
    assert!(!written.contains("Detailed entry"), "{written}");
}

#[test]
fn vmodule_raises_the_verbosity_of_the_files_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kube-proxy.log");
    let mut settings = settings_logging_to(&path);
    settings.vmodule = vec![item("other_file", 9), item("logging_tests", 4)];
    let written = log_through(&settings, &path);
    assert!(written.contains("Detailed entry"), "{written}");

    std::fs::remove_file(&path).unwrap();
    settings.vmodule = vec![item("other_file", 9)];
    let written = log_through(&settings, &path);
    assert!(!written.contains("Detailed entry"), "{written}");
}

#[test]
fn the_log_file_is_appended_to_in_json_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kube-proxy.log");
    std::fs::write(&path, "earlier line\n").unwrap();
    let mut settings = settings_logging_to(&path);
    settings.json = true;
    let written = log_through(&settings, &path);
    assert!(written.starts_with("earlier line\n"), "{written}");
    let entry: serde_json::Value = serde_json::from_str(written.lines().nth(1).unwrap()).unwrap();
    assert_eq!(entry["msg"], "Routine entry", "{written}");
    assert_eq!(entry["entry"], "routine", "{written}");
    assert_eq!(entry["v"], 0, "{written}");
}

#[test]
fn without_logtostderr_false_the_log_file_is_not_used() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kube-proxy.log");
    let mut settings = settings_logging_to(&path);
    settings.klog.logtostderr = true;
    drop(build(&settings, None).unwrap());
    assert!(!path.exists());
}

#[test]
fn an_unwritable_log_file_is_an_error_naming_it() {
    let settings = settings_logging_to(Path::new("/nonexistent-dir/kube-proxy.log"));
    let error = build(&settings, None).err().unwrap();
    assert_eq!(
        error.to_string(),
        "opening --log-file /nonexistent-dir/kube-proxy.log"
    );
}

#[test]
fn settings_follow_the_configuration() {
    let mut logging = LoggingConfiguration {
        verbosity: 5,
        format: "text".to_owned(),
        vmodule: vec![item("proxier", 7)],
        ..LoggingConfiguration::default()
    };
    logging.options.text.split_stream = true;
    let klog = KlogOptions::default();
    let settings = LogSettings::from_config(&logging, &klog, false);
    assert_eq!(
        (settings.verbosity, settings.json, settings.split_stream),
        (5, false, true)
    );
    assert_eq!(settings.vmodule, [item("proxier", 7)]);
    assert!(!LogSettings::from_config(&logging, &klog, true).split_stream);
    logging.format = "json".to_owned();
    assert!(!LogSettings::from_config(&logging, &klog, false).split_stream);
}

#[test]
fn kube_rs_repeats_of_api_failures_are_dropped_and_its_other_entries_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kube-proxy.log");
    let (subscriber, _) = build(&settings_logging_to(&path), None).unwrap();
    tracing::subscriber::with_default(subscriber, || {
        tracing::error!(target: "kube_client::client::builder", "failed with error client error (Connect)");
        tracing::warn!(target: "kube_runtime::watcher", "watch list error with 403");
        tracing::warn!(target: "kube_client::client", "eof in poll");
        tracing::info!(target: "kube_client::client::builder", "an informational entry");
        tracing::warn!(target: "kp_source::api::retry", "the API server cannot be reached");
    });
    let written = std::fs::read_to_string(&path).unwrap();
    assert_eq!(written.lines().count(), 2, "{written}");
    assert!(written.contains("an informational entry"), "{written}");
    assert!(written.contains("cannot be reached"), "{written}");
}
