//! Logging flags: upstream v1.34's (component-base) and klog's, their syntax,
//! their place in the configuration and their warnings.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::PathBuf;

use kp_config::*;
use pretty_assertions::assert_eq;

#[track_caller]
fn resolve_args(args: &[&str]) -> Resolved {
    let mut argv = vec!["kube-proxy"];
    argv.extend_from_slice(args);
    let (flags, matches) = parse_args(argv).unwrap();
    resolve(&flags, &matches).unwrap()
}

#[track_caller]
fn parse_error(args: &[&str]) -> String {
    let mut argv = vec!["kube-proxy"];
    argv.extend_from_slice(args);
    parse_args(argv).unwrap_err().to_string()
}

fn item(pattern: &str, verbosity: u32) -> VModuleItem {
    VModuleItem {
        file_pattern: pattern.to_owned(),
        verbosity,
    }
}

#[test]
fn component_base_logging_flags_reach_the_logging_section() {
    let r = resolve_args(&[
        "-v=4",
        "--vmodule=proxier=6,topology*=5",
        "--vmodule",
        "runner=2,",
        "--log-flush-frequency=2s",
        "--feature-gates=LoggingAlphaOptions=true",
        "--log-text-split-stream",
        "--log-text-info-buffer-size=0",
        "--log-json-split-stream=false",
        "--log-json-info-buffer-size=0",
    ]);
    let logging = &r.config.logging;
    assert_eq!(logging.verbosity, 4);
    assert_eq!(
        logging.vmodule,
        [item("proxier", 6), item("topology*", 5), item("runner", 2)]
    );
    assert_eq!(logging.flush_frequency.duration.to_string(), "2s");
    assert!(logging.options.text.split_stream);
    assert!(!logging.options.json.split_stream);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
}

#[test]
fn logging_flags_are_honoured_beside_config() {
    let mut file = tempfile::Builder::new().suffix(".yaml").tempfile().unwrap();
    write!(
        file,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nlogging:\n  verbosity: 1\n  vmodule:\n  - filePattern: applier\n    verbosity: 3\n"
    )
    .unwrap();
    let path = file.path().to_str().unwrap();
    let r = resolve_args(&[
        "--config",
        path,
        "--vmodule=proxier=5",
        "--log-flush-frequency=1s",
    ]);
    assert_eq!(r.config.logging.verbosity, 1);
    assert_eq!(
        r.config.logging.vmodule,
        [item("applier", 3), item("proxier", 5)]
    );
    assert_eq!(r.config.logging.flush_frequency.duration.to_string(), "1s");
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
}

#[test]
fn malformed_logging_values_are_errors_naming_the_flag() {
    for (args, flag, why) in [
        (&["--vmodule=proxier"][..], "--vmodule", "pattern=N"),
        (&["--vmodule==3"][..], "--vmodule", "pattern=N"),
        (&["--vmodule=a=b"][..], "--vmodule", "invalid verbosity"),
        (
            &["--vmodule=a=2147483648"][..],
            "--vmodule",
            "invalid verbosity",
        ),
        (&["-v=-1"][..], "-v", "invalid verbosity"),
        (&["--v=2147483648"][..], "--v", "invalid verbosity"),
        (
            &["--log-flush-frequency=5"][..],
            "--log-flush-frequency",
            "",
        ),
        (
            &["--log-text-info-buffer-size=lots"][..],
            "--log-text-info-buffer-size",
            "quantity",
        ),
        (
            &["--log-json-split-stream=maybe"][..],
            "--log-json-split-stream",
            "boolean",
        ),
        (
            &["--stderrthreshold=LOUD"][..],
            "--stderrthreshold",
            "unknown severity",
        ),
        (
            &["--stderrthreshold=4"][..],
            "--stderrthreshold",
            "unknown severity",
        ),
        (
            &["--log-backtrace-at=main"][..],
            "--log-backtrace-at",
            "file.go:234",
        ),
        (&["--log-file-max-size=-1"][..], "--log-file-max-size", ""),
        (&["--logtostderr=yes"][..], "--logtostderr", "boolean"),
    ] {
        let error = parse_error(args);
        assert!(
            error.contains(flag) && error.contains(why),
            "{args:?}: {error}"
        );
    }
}

#[test]
fn the_alpha_logging_options_need_their_gate() {
    let (flags, matches) = parse_args(["kube-proxy", "--log-json-split-stream"]).unwrap();
    let error = resolve(&flags, &matches).unwrap_err().to_string();
    assert!(
        error.contains(
            "logging.options.json.splitStream: Forbidden: Feature LoggingAlphaOptions is disabled"
        ),
        "{error}"
    );
}

#[test]
fn vmodule_is_only_for_the_text_format() {
    let (flags, matches) =
        parse_args(["kube-proxy", "--logging-format=json", "--vmodule=proxier=4"]).unwrap();
    let error = resolve(&flags, &matches).unwrap_err().to_string();
    assert!(
        error.contains("logging.vmodule: Forbidden: Only supported for text log format"),
        "{error}"
    );
}

#[test]
fn severities_by_name_or_number() {
    for (text, severity) in [
        ("INFO", Severity::Info),
        ("warning", Severity::Warning),
        ("1", Severity::Warning),
        ("Error", Severity::Error),
        ("3", Severity::Fatal),
    ] {
        assert_eq!(parse_severity(text).unwrap(), severity, "{text}");
    }
}

#[test]
fn klog_flags_are_accepted_in_both_spellings_with_one_warning_each() {
    let r = resolve_args(&[
        "--logtostderr=false",
        "--alsologtostderr",
        "--log_file=/var/log/kube-proxy.log",
        "--log-dir=/var/log",
        "--log_file_max_size=100",
        "--stderrthreshold=WARNING",
        "--add_dir_header",
        "--skip-headers=true",
        "--skip_log_headers",
        "--one-output=false",
        "--log_backtrace_at=proxier.go:12",
    ]);
    assert_eq!(
        r.klog,
        KlogOptions {
            logtostderr: false,
            alsologtostderr: true,
            log_file: Some(PathBuf::from("/var/log/kube-proxy.log")),
            stderr_threshold: Severity::Warning,
        }
    );
    assert_eq!(r.warnings.len(), KLOG_FLAGS.len(), "{:#?}", r.warnings);
    for (flag, meaning) in KLOG_FLAGS {
        let warning = r
            .warnings
            .iter()
            .find(|w| w.starts_with(&format!("flag --{flag} is a klog flag")))
            .unwrap_or_else(|| panic!("no warning for --{flag}: {:#?}", r.warnings));
        assert!(warning.contains("removed in v1.26"), "{warning}");
        match meaning {
            Some(meaning) => assert!(warning.ends_with(meaning), "{warning}"),
            None => assert!(warning.ends_with("but it has no effect"), "{warning}"),
        }
    }
}

#[test]
fn a_log_file_without_logtostderr_false_is_unused_as_with_klog() {
    let r = resolve_args(&["--log-file=/tmp/kp.log"]);
    assert_eq!(r.klog.file(), None);
    assert_eq!(r.warnings.len(), 1);
    assert!(
        r.warnings[0].ends_with("but --logtostderr is true, so it has no effect"),
        "{:?}",
        r.warnings
    );
}

#[test]
fn an_info_buffer_size_warns_that_it_has_no_effect() {
    let r = resolve_args(&[
        "--feature-gates=LoggingAlphaOptions=true",
        "--log-text-split-stream",
        "--log-text-info-buffer-size=64Ki",
    ]);
    assert_eq!(
        r.warnings,
        ["logging.options.text.infoBufferSize (--log-text-info-buffer-size) has no effect in kube-proxy-rs: info messages are written unbuffered"]
    );
}
