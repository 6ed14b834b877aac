//! The `kube-proxy` binary as an operator runs it: flags, configuration
//! files, exit codes and messages. No privileges needed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

fn kube_proxy(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kube-proxy"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("the kube-proxy binary runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `--dry-run` of the examples in `mode`, as node-1.
fn dry_run_of_examples(mode: &str) -> Output {
    let examples = examples();
    kube_proxy(&[
        "--proxy-mode",
        mode,
        "--manifests",
        examples.to_str().unwrap(),
        "--hostname-override",
        "node-1",
        "--dry-run",
    ])
}

/// Asserts that `mode`'s dry run of the examples succeeds and prints each
/// of `expected`.
fn assert_dry_run_prints(mode: &str, expected: &[&str]) {
    let out = dry_run_of_examples(mode);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    for expected in expected {
        assert!(text.contains(expected), "no {expected:?} in:\n{text}");
    }
}

#[test]
fn version_and_help_exit_zero_and_name_upstream_flags() {
    let version = kube_proxy(&["--version"]);
    assert!(version.status.success());
    assert!(stdout(&version).contains(env!("CARGO_PKG_VERSION")));

    let help = kube_proxy(&["--help"]);
    assert!(help.status.success());
    let text = stdout(&help);
    for flag in [
        "--config",
        "--write-config-to",
        "--cleanup",
        "--proxy-mode",
        "--iptables-masquerade-bit",
        "--conntrack-max-per-core",
        "--ipvs-scheduler",
        "--manifests",
        "--dry-run",
    ] {
        assert!(text.contains(flag), "--help lacks {flag}:\n{text}");
    }
}

#[test]
fn an_unknown_flag_fails_with_exit_code_one() {
    let output = kube_proxy(&["--no-such-flag"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("--no-such-flag"));
}

#[test]
fn written_config_loads_back_to_the_same_file() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first.yaml");
    let second = dir.path().join("second.yaml");
    let out = kube_proxy(&[
        "--write-config-to",
        first.to_str().unwrap(),
        "--masquerade-all",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = fs::read_to_string(&first).unwrap();
    assert!(text.contains("apiVersion: kubeproxy.config.k8s.io/v1alpha1"));
    assert!(
        text.contains("masqueradeAll: true"),
        "the flag reaches the file:\n{text}"
    );

    let out = kube_proxy(&[
        "--config",
        first.to_str().unwrap(),
        "--write-config-to",
        second.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(text, fs::read_to_string(&second).unwrap());
}

#[test]
fn flags_beside_config_are_ignored_with_a_warning_naming_each() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    let written = dir.path().join("written.yaml");
    let out = kube_proxy(&["--write-config-to", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));

    let out = kube_proxy(&[
        "--config",
        config.to_str().unwrap(),
        "--masquerade-all",
        "--iptables-sync-period=10s",
        "--hostname-override=Node-7",
        "--write-config-to",
        written.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let log = stderr(&out);
    assert!(log.contains("--masquerade-all is ignored"), "{log}");
    assert!(log.contains("--iptables-sync-period is ignored"), "{log}");
    assert!(!log.contains("--hostname-override is ignored"), "{log}");
    let text = fs::read_to_string(&written).unwrap();
    assert!(text.contains("masqueradeAll: false"), "{text}");
    assert!(text.contains("syncPeriod: 30s"), "{text}");
    assert!(text.contains("hostnameOverride: node-7"), "{text}");
}

#[test]
fn an_invalid_config_file_reports_every_problem_and_exits_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.yaml");
    fs::write(
        &config,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\n\
         kind: KubeProxyConfiguration\n\
         mode: fastest\n\
         iptables:\n  masqueradeBit: 40\n\
         oomScoreAdj: 5000\n",
    )
    .unwrap();
    let out = kube_proxy(&["--config", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let log = stderr(&out);
    assert!(log.contains("mode"), "{log}");
    assert!(log.contains("fastest"), "{log}");
    assert!(log.contains("iptables.masqueradeBit"), "{log}");
    assert!(log.contains("40"), "{log}");
    assert!(log.contains("oomScoreAdj"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn a_missing_config_file_names_the_file() {
    let out = kube_proxy(&["--config", "/nonexistent/kube-proxy.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("/nonexistent/kube-proxy.yaml"));
}

#[test]
fn dry_run_without_any_source_says_how_to_give_one() {
    let out = Command::new(env!("CARGO_BIN_EXE_kube-proxy"))
        .args(["--dry-run", "--proxy-mode", "iptables"])
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("pass --kubeconfig or --master"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn userspace_dry_run_prints_the_portal_rules_of_the_examples() {
    assert_dry_run_prints(
        "userspace",
        &[
            "KUBE-PORTALS-CONTAINER",
            "KUBE-PORTALS-HOST",
            "10.96.0.10",
            "COMMIT",
        ],
    );
}

#[test]
fn nftables_dry_run_prints_the_transaction_of_the_examples() {
    assert_dry_run_prints(
        "nftables",
        &[
            "table ip kube-proxy",
            "table ip6 kube-proxy",
            "service-ips",
            "10.96.0.10",
        ],
    );
}

#[test]
fn ipvs_dry_run_prints_virtual_servers_sets_and_rules_of_the_examples() {
    assert_dry_run_prints(
        "ipvs",
        &["kube-ipvs0", "KUBE-CLUSTER-IP", "-> ", "*nat", "COMMIT"],
    );
}

#[test]
fn kernelspace_mode_is_rejected_on_linux() {
    let out = kube_proxy(&["--proxy-mode", "kernelspace", "--dry-run"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("kernelspace"), "{}", stderr(&out));
}

#[test]
fn a_written_config_drives_a_dry_run_of_the_examples() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("out.yaml");
    let out = kube_proxy(&["--write-config-to", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let examples = examples();
    let out = kube_proxy(&[
        "--config",
        config.to_str().unwrap(),
        "--manifests",
        examples.to_str().unwrap(),
        "--hostname-override",
        "node-1",
        "--dry-run",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rules = stdout(&out);
    assert!(rules.contains("*nat\n:KUBE-SERVICES - [0:0]"), "{rules}");
    assert!(
        rules.contains("--comment demo/web-nodeport:http -m tcp -p tcp --dport 30080"),
        "the NodePort is programmed:\n{rules}"
    );
}

#[test]
fn every_logging_flag_of_upstream_and_klog_is_accepted_with_a_warning_for_klogs() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("out.yaml");
    let log = dir.path().join("kube-proxy.log");
    let out = kube_proxy(&[
        "--write-config-to",
        config.to_str().unwrap(),
        // component-base's logging flags, as upstream v1.34 registers them.
        "-v=2",
        "--vmodule=proxier=4,runner=5",
        "--log-flush-frequency=2s",
        "--logging-format=text",
        "--feature-gates=LoggingAlphaOptions=true",
        "--log-text-split-stream=false",
        "--log-text-info-buffer-size=0",
        "--log-json-split-stream=false",
        "--log-json-info-buffer-size=0",
        // klog's flags, which upstream removed in v1.26.
        "--logtostderr=false",
        "--alsologtostderr",
        "--log-file",
        log.to_str().unwrap(),
        "--log_dir",
        dir.path().to_str().unwrap(),
        "--log-file-max-size=10",
        "--stderrthreshold=WARNING",
        "--add_dir_header",
        "--skip-headers",
        "--skip_log_headers=true",
        "--one-output",
        "--log-backtrace-at=proxier.go:1",
    ]);
    let log_text = stderr(&out);
    assert!(out.status.success(), "{log_text}");
    for flag in [
        "logtostderr",
        "alsologtostderr",
        "log-file",
        "log-dir",
        "log-file-max-size",
        "stderrthreshold",
        "add-dir-header",
        "skip-headers",
        "skip-log-headers",
        "one-output",
        "log-backtrace-at",
    ] {
        let warning =
            format!("flag --{flag} is a klog flag that upstream kube-proxy removed in v1.26");
        assert_eq!(
            log_text.matches(&warning).count(),
            1,
            "--{flag}:\n{log_text}"
        );
    }
    let text = fs::read_to_string(&config).unwrap();
    assert!(text.contains("flushFrequency: 2s"), "{text}");
    assert!(
        text.contains("- filePattern: proxier\n    verbosity: 4"),
        "{text}"
    );
}

#[test]
fn a_wrong_logging_value_exits_one_naming_the_flag() {
    for (flag, value) in [
        ("--vmodule", "proxier"),
        ("--stderrthreshold", "LOUD"),
        ("--log-flush-frequency", "often"),
    ] {
        let out = kube_proxy(&[&format!("{flag}={value}"), "--dry-run"]);
        assert_eq!(out.status.code(), Some(1), "{flag}");
        assert!(stderr(&out).contains(flag), "{flag}: {}", stderr(&out));
    }
}

#[test]
fn a_locked_feature_gate_set_against_its_lock_exits_one() {
    let out = kube_proxy(&["--feature-gates=NFTablesProxyMode=false", "--dry-run"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(
            "cannot set feature gate NFTablesProxyMode to false, feature is locked to true"
        ),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_feature_gate_without_effect_here_is_a_one_line_warning() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("out.yaml");
    let out = kube_proxy(&[
        "--feature-gates=ContextualLogging=false,KubeProxyDrainingTerminatingNodes=true",
        "--write-config-to",
        config.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let log = stderr(&out);
    assert_eq!(
        log.matches("feature gate ContextualLogging has no effect in kube-proxy-rs")
            .count(),
        1,
        "{log}"
    );
    // The message is quoted as klog quotes it.
    assert_eq!(log.matches("feature gate \\\"KubeProxyDrainingTerminatingNodes\\\" is not a kube-proxy feature gate of Kubernetes v1.34").count(), 1, "{log}");
}

#[test]
fn logs_go_to_the_log_file_when_klogs_flags_ask_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("kube-proxy.log");
    let log_flag = format!("--log-file={}", log.display());

    let run = kube_proxy(&[
        "--manifests",
        examples().to_str().unwrap(),
        "--hostname-override",
        "node-1",
        "--dry-run",
        "--logtostderr=false",
        &log_flag,
    ]);

    assert!(run.status.success(), "{}", stderr(&run));
    let written = fs::read_to_string(&log).unwrap();
    assert!(written.contains("Starting kube-proxy"), "{written}");
    assert!(
        !stderr(&run).contains("Starting kube-proxy"),
        "info lines go to the file only: {}",
        stderr(&run)
    );
}

#[test]
fn prefer_same_traffic_distribution_off_reaches_the_rules() {
    let dir = tempfile::tempdir().unwrap();
    // demo/web's slice carries node hints? Written here: one endpoint on
    // this node, one elsewhere, both hinted for node-1's zone and the
    // local one for node-1 itself.
    fs::write(
        dir.path().join("objects.yaml"),
        "apiVersion: v1
kind: Service
metadata: {namespace: demo, name: near}
spec:
  clusterIP: 10.96.0.77
  trafficDistribution: PreferSameNode
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: demo
  name: near-1
  labels: {kubernetes.io/service-name: near}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
  - addresses: [10.244.1.7]
    conditions: {ready: true}
    nodeName: node-1
    zone: zone-a
    hints: {forNodes: [{name: node-1}], forZones: [{name: zone-a}]}
  - addresses: [10.244.2.7]
    conditions: {ready: true}
    nodeName: node-2
    zone: zone-a
    hints: {forNodes: [{name: node-2}], forZones: [{name: zone-a}]}
---
apiVersion: v1
kind: Node
metadata:
  name: node-1
  labels: {topology.kubernetes.io/zone: zone-a}
",
    )
    .unwrap();
    let manifests = dir.path().to_str().unwrap();
    let endpoints_of = |gates: &[&str]| {
        let mut args = vec!["--manifests", manifests, "--hostname-override", "node-1"];
        args.extend_from_slice(gates);
        args.push("--dry-run");
        let run = kube_proxy(&args);
        assert!(run.status.success(), "{}", stderr(&run));
        let text = stdout(&run);
        ["10.244.1.7", "10.244.2.7"]
            .into_iter()
            .filter(|ip| text.contains(&format!("--to-destination {ip}:8080")))
            .collect::<Vec<_>>()
    };

    assert_eq!(
        endpoints_of(&[]),
        ["10.244.1.7"],
        "node hints keep traffic here"
    );
    assert_eq!(
        endpoints_of(&["--feature-gates=PreferSameTrafficDistribution=false"]),
        ["10.244.1.7", "10.244.2.7"],
        "without the gate the zone hints hold"
    );
}

/// The proxy with a `--master` of `scheme` on a system whose CA
/// certificates cannot be found (the trust store's environment variables
/// point nowhere), as in a minimal image without ca-certificates.
fn without_ca_certificates(master: &str) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_kube-proxy"))
        .args([
            "--master",
            master,
            "--hostname-override",
            "node-1",
            "--dry-run",
        ])
        .env("SSL_CERT_FILE", "/nonexistent/ca-certificates.crt")
        .env("SSL_CERT_DIR", "/nonexistent")
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the kube-proxy binary runs")
}

#[test]
fn a_plain_http_master_needs_no_ca_certificates() {
    let mut child = without_ca_certificates("http://127.0.0.1:1");
    let stderr = child.stderr.take().unwrap();
    let (lines_tx, lines_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = lines_tx.send(line);
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut seen = Vec::new();
    let watching = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match lines_rx.recv_timeout(left) {
            Ok(line) if line.contains("watching the API server") => break true,
            Ok(line) => seen.push(line),
            Err(_) => break false,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(watching, "the client was built and watches: {seen:#?}");
}

#[test]
fn an_https_master_without_any_ca_says_what_to_install() {
    let child = without_ca_certificates("https://127.0.0.1:1");

    let output = child.wait_with_output().unwrap();

    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(
        text.contains(
            "install the ca-certificates package, or set certificate-authority in the kubeconfig"
        ),
        "{text}"
    );
}

/// The binary starts itself once more with glibc's malloc tunables set, as
/// the same process, unless the operator set `GLIBC_TUNABLES`.
#[test]
fn the_binary_runs_with_its_malloc_tunables_unless_the_operator_set_them() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    let run = |tunables: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_kube-proxy"));
        command
            .args(["--write-config-to", config.to_str().unwrap(), "--v=4"])
            .env_remove("RUST_LOG")
            .env_remove("GLIBC_TUNABLES")
            .env_remove("KUBE_PROXY_MALLOC_TUNED")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        if let Some(value) = tunables {
            command.env("GLIBC_TUNABLES", value);
        }
        let child = command.spawn().unwrap();
        let pid = child.id();
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
        (pid, stderr(&output))
    };

    let (pid, log) = run(None);
    let line = log
        .lines()
        .find(|line| line.contains("glibc malloc tunables set"))
        .unwrap_or_else(|| panic!("no tunables line in:\n{log}"));
    assert!(
        line.contains("glibc.malloc.arena_max=1") && line.contains("mmap_threshold=262144"),
        "{line}"
    );
    assert!(
        line.contains(&format!("pid={pid}")),
        "the second start is not the same process ({pid}): {line}"
    );
    assert!(config.exists(), "the second start did not do the work");

    let (_, log) = run(Some("glibc.malloc.arena_max=2"));
    assert!(
        log.contains("GLIBC_TUNABLES is set") && log.contains("glibc.malloc.arena_max=2"),
        "{log}"
    );
    assert!(!log.contains("glibc malloc tunables set"), "{log}");
}

/// Whether `line` is a klog text entry: `Lmmdd hh:mm:ss.uuuuuu`, the thread
/// id right-aligned in seven columns, `file:line]`, a Go-quoted message,
/// then `key=value` pairs whose values are Go-quoted or bare words.
fn is_klog_line(line: &str) -> Result<(), String> {
    let fail = |what: &str| Err(format!("{what}: {line:?}"));
    let b = line.as_bytes();
    if !matches!(b.first(), Some(b'I' | b'W' | b'E' | b'F')) {
        return fail("severity");
    }
    let digits = |range: std::ops::Range<usize>| {
        b.get(range)
            .is_some_and(|d| d.iter().all(u8::is_ascii_digit))
    };
    let header_ok = digits(1..5)
        && b.get(5) == Some(&b' ')
        && digits(6..8)
        && b.get(8) == Some(&b':')
        && digits(9..11)
        && b.get(11) == Some(&b':')
        && digits(12..14)
        && b.get(14) == Some(&b'.')
        && digits(15..21)
        && b.get(21) == Some(&b' ');
    if !header_ok {
        return fail("time");
    }
    let Some(thread) = line.get(22..29) else {
        return fail("thread id");
    };
    if !thread.trim_start().chars().all(|c| c.is_ascii_digit()) || thread.trim().is_empty() {
        return fail("thread id");
    }
    let Some((caller, rest)) = line[30..].split_once("] ") else {
        return fail("caller");
    };
    let Some((file, number)) = caller.rsplit_once(':') else {
        return fail("caller");
    };
    if file.is_empty() || file.contains(' ') || number.parse::<u32>().is_err() {
        return fail("caller");
    }
    // A Go-quoted string at the start of `text`; what follows it.
    fn quoted(text: &str) -> Option<&str> {
        let mut chars = text.strip_prefix('"')?.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    chars.next()?;
                }
                '"' => return Some(&text[i + 2..]),
                c if c.is_control() => return None,
                _ => {}
            }
        }
        None
    }
    let Some(mut rest) = quoted(rest) else {
        return fail("message");
    };
    while !rest.is_empty() {
        let Some(pair) = rest.strip_prefix(' ') else {
            return fail("pair separator");
        };
        let Some((key, value)) = pair.split_once('=') else {
            return fail("key");
        };
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return fail("key");
        }
        rest = if value.starts_with('"') {
            let Some(after) = quoted(value) else {
                return fail("quoted value");
            };
            after
        } else {
            let end = value.find(' ').unwrap_or(value.len());
            if end == 0 {
                return fail("bare value");
            }
            &value[end..]
        };
    }
    Ok(())
}

#[test]
fn every_log_line_is_in_klogs_text_format() {
    let out = dry_run_of_examples("iptables");
    let log = stderr(&out);
    assert!(log.lines().count() >= 3, "{log}");
    for line in log.lines() {
        if let Err(error) = is_klog_line(line) {
            panic!("not klog's format at {error}\n{log}");
        }
    }
    assert!(
        log.contains("] \"Starting kube-proxy\" node=\"node-1\" mode=\"iptables\""),
        "{log}"
    );
    // The checker refuses what klog would not write.
    for wrong in [
        "2026-11-24T23:45:17.960775Z  INFO Starting kube-proxy node=node-1",
        "I1124 23:45:17.960775    1234 app.rs:60] Starting kube-proxy",
        "I1124 23:45:17.960775    1234 app.rs:60] \"Starting\" node=node 1",
    ] {
        assert!(is_klog_line(wrong).is_err(), "{wrong}");
    }
}

#[test]
fn json_logs_have_component_bases_keys() {
    let examples = examples();
    let out = kube_proxy(&[
        "--manifests",
        examples.to_str().unwrap(),
        "--hostname-override",
        "node-1",
        "--logging-format",
        "json",
        "--dry-run",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let log = stderr(&out);
    for line in log.lines() {
        let entry: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(entry["ts"].as_f64().is_some_and(|ts| ts > 1.7e9), "{line}");
        assert!(
            entry["caller"].as_str().is_some_and(|c| c.contains(".rs:")),
            "{line}"
        );
        assert!(entry["msg"].is_string(), "{line}");
    }
    assert!(
        log.lines()
            .any(|l| l.contains("\"msg\":\"Starting kube-proxy\",\"v\":0,\"node\":\"node-1\"")),
        "{log}"
    );
}
