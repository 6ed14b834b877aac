//! Command-line parsing and the flag/config-file precedence rules.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;

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

fn config_file(body: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new().suffix(".yaml").tempfile().unwrap();
    write!(
        file,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n{body}"
    )
    .unwrap();
    file
}

#[test]
fn no_flags_give_the_defaults() {
    let r = resolve_args(&[]);
    assert_eq!(r.config, KubeProxyConfiguration::defaulted());
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    assert!(!r.cleanup && !r.init_only && !r.dry_run);
}

#[test]
fn durations_in_go_syntax() {
    let r = resolve_args(&[
        "--iptables-sync-period=2h22m",
        "--iptables-min-sync-period",
        "300ms",
        "--config-sync-period=1m30s",
    ]);
    assert_eq!(r.config.iptables.sync_period.to_string(), "2h22m0s");
    assert_eq!(r.config.iptables.min_sync_period.to_string(), "300ms");
    assert_eq!(
        r.config.nftables.sync_period.to_string(),
        "2h22m0s",
        "upstream shares the period with nftables"
    );
    assert_eq!(r.config.config_sync_period, GoDuration::from_secs(90));
}

#[test]
fn udp_timeout_sets_the_userspace_udp_idle_timeout() {
    assert_eq!(
        resolve_args(&[]).config.udp_idle_timeout,
        GoDuration::from_millis(250)
    );
    let r = resolve_args(&["--udp-timeout=2s"]);
    assert_eq!(r.config.udp_idle_timeout, GoDuration::from_secs(2));
    assert_eq!(r.config.udp_idle_timeout_std().as_millis(), 2000);
    let r = resolve_args(&["--udp-timeout", "100ms"]);
    assert_eq!(r.config.udp_idle_timeout, GoDuration::from_millis(100));

    let err = parse_error(&["--udp-timeout=5"]);
    assert!(
        err.contains("invalid duration \"5\": missing unit"),
        "{err}"
    );
    let (flags, matches) = parse_args(["kube-proxy", "--udp-timeout=-1s"]).unwrap();
    let err = resolve(&flags, &matches).unwrap_err().to_string();
    assert!(
        err.contains("udpIdleTimeout: Invalid value: \"-1s\": must be greater than 0"),
        "{err}"
    );
}

#[test]
fn udp_timeout_beside_a_config_file_is_ignored_with_a_warning() {
    let file = config_file("udpIdleTimeout: 750ms\n");
    let r = resolve_args(&[
        "--config",
        file.path().to_str().unwrap(),
        "--udp-timeout=2s",
    ]);
    assert_eq!(r.config.udp_idle_timeout, GoDuration::from_millis(750));
    assert_eq!(
        r.warnings,
        vec!["flag --udp-timeout is ignored because --config is set; set the matching field in the configuration file instead"]
    );
}

#[test]
fn bad_durations_are_rejected_clearly() {
    let err = parse_error(&["--iptables-sync-period=30"]);
    assert!(
        err.contains("invalid duration \"30\": missing unit"),
        "{err}"
    );
    assert!(err.contains("--iptables-sync-period"), "{err}");
    let err = parse_error(&["--conntrack-tcp-timeout-established", "1d"]);
    assert!(
        err.contains("invalid duration \"1d\": unknown unit"),
        "{err}"
    );
}

#[test]
fn booleans_accept_every_pflag_form() {
    for (form, expected) in [
        ("--masquerade-all", true),
        ("--masquerade-all=true", true),
        ("--masquerade-all=1", true),
        ("--masquerade-all=t", true),
        ("--masquerade-all=T", true),
        ("--masquerade-all=TRUE", true),
        ("--masquerade-all=True", true),
        ("--masquerade-all=false", false),
        ("--masquerade-all=0", false),
        ("--masquerade-all=f", false),
        ("--masquerade-all=F", false),
        ("--masquerade-all=FALSE", false),
        ("--masquerade-all=False", false),
    ] {
        let r = resolve_args(&[form]);
        assert_eq!(r.config.iptables.masquerade_all, expected, "{form}");
        assert_eq!(r.config.nftables.masquerade_all, expected, "{form}");
    }
    let err = parse_error(&["--masquerade-all=yes"]);
    assert!(err.contains("invalid boolean \"yes\""), "{err}");
}

#[test]
fn a_bare_boolean_does_not_swallow_the_next_argument() {
    let r = resolve_args(&["--ipvs-strict-arp", "--proxy-mode", "ipvs"]);
    assert!(r.config.ipvs.strict_arp);
    assert_eq!(r.config.mode, "ipvs");
    let err = parse_error(&["--cleanup", "false"]);
    assert!(err.contains("unexpected argument 'false'"), "{err}");
}

#[test]
fn localhost_nodeports_defaults_true_and_can_be_turned_off() {
    assert_eq!(
        resolve_args(&[]).config.iptables.localhost_node_ports,
        Some(true)
    );
    let r = resolve_args(&["--iptables-localhost-nodeports=false"]);
    assert_eq!(r.config.iptables.localhost_node_ports, Some(false));
}

#[test]
fn deprecated_port_flags_change_only_the_port() {
    let r = resolve_args(&[
        "--healthz-bind-address=192.168.99.2:10256",
        "--healthz-port=9999",
        "--metrics-port",
        "0",
    ]);
    assert_eq!(r.config.healthz_bind_address, "192.168.99.2:9999");
    assert_eq!(
        r.config.metrics_bind_address, "",
        "port 0 disables the metrics server"
    );
    assert_eq!(
        r.warnings,
        vec![
            "flag --healthz-port has been deprecated, This flag is deprecated and will be removed in a future release. Please use --healthz-bind-address instead.",
            "flag --metrics-port has been deprecated, This flag is deprecated and will be removed in a future release. Please use --metrics-bind-address instead.",
        ]
    );
}

#[test]
fn a_bare_ip_bind_address_gets_the_port() {
    let r = resolve_args(&[
        "--metrics-bind-address=0.0.0.0",
        "--healthz-bind-address=fd00::2",
    ]);
    assert_eq!(r.config.metrics_bind_address, "0.0.0.0:10249");
    assert_eq!(r.config.healthz_bind_address, "[fd00::2]:10256");
    let err = parse_error(&["--healthz-bind-address=node1:80"]);
    assert!(
        err.contains("\"node1:80\" is not a valid IP address"),
        "{err}"
    );
}

#[test]
fn feature_gates_accumulate() {
    let r = resolve_args(&[
        "--feature-gates",
        "LoggingAlphaOptions=true,ContextualLogging=false",
        "--feature-gates=NFTablesNetlink=f",
    ]);
    let gates: Vec<(&str, bool)> = r
        .config
        .feature_gates
        .iter()
        .map(|(k, v)| (k.as_str(), *v))
        .collect();
    assert_eq!(
        gates,
        vec![
            ("ContextualLogging", false),
            ("LoggingAlphaOptions", true),
            ("NFTablesNetlink", false)
        ]
    );
    let err = parse_error(&["--feature-gates=LoggingAlphaOptions"]);
    assert!(
        err.contains("missing bool value for \"LoggingAlphaOptions\""),
        "{err}"
    );
}

#[test]
fn list_flags_split_on_commas() {
    let r = resolve_args(&[
        "--nodeport-addresses=192.168.99.0/24,fd00:192:168:99::/64",
        "--ipvs-exclude-cidrs",
        "10.0.0.0/8",
    ]);
    assert_eq!(
        r.config.node_port_addresses,
        Some(vec![
            "192.168.99.0/24".to_string(),
            "fd00:192:168:99::/64".to_string()
        ])
    );
    assert_eq!(
        r.config.ipvs.exclude_cidrs,
        Some(vec!["10.0.0.0/8".to_string()])
    );
}

#[test]
fn numbers_and_strings_map_to_their_fields() {
    let r = resolve_args(&[
        "--oom-score-adj=-500",
        "--conntrack-max-per-core=0",
        "--conntrack-min",
        "1024",
        "--kube-api-qps=20.5",
        "--kube-api-burst=40",
        "--kubeconfig=/etc/kp/kubeconfig",
        "--cluster-cidr=10.244.0.0/16",
        "--detect-local-mode=InterfaceNamePrefix",
        "--pod-interface-name-prefix=veth",
        "--iptables-masquerade-bit=15",
        "--master=https://192.168.99.1:6443",
        "--bind-address=192.168.99.2",
        "--ipvs-tcpfin-timeout=5s",
    ]);
    let c = &r.config;
    assert_eq!(c.oom_score_adj, Some(-500));
    assert_eq!(
        (c.conntrack.max_per_core, c.conntrack.min),
        (Some(0), Some(1024))
    );
    assert_eq!(
        (c.client_connection.qps, c.client_connection.burst),
        (20.5, 40)
    );
    assert_eq!(c.client_connection.kubeconfig, "/etc/kp/kubeconfig");
    assert_eq!(c.cluster_cidr, "10.244.0.0/16");
    assert_eq!(
        c.effective_detect_local_mode().unwrap(),
        LocalMode::InterfaceNamePrefix
    );
    assert_eq!(c.detect_local.interface_name_prefix, "veth");
    assert_eq!(c.iptables.masquerade_bit, Some(15));
    assert_eq!(c.bind_address, "192.168.99.2");
    assert_eq!(
        c.healthz_bind_address, "0.0.0.0:10256",
        "as upstream, the default is not re-derived"
    );
    assert_eq!(c.ipvs.tcp_fin_timeout, GoDuration::from_secs(5));
    assert_eq!(r.master.as_deref(), Some("https://192.168.99.1:6443"));
}

#[test]
fn the_config_file_wins_and_each_ignored_flag_is_named() {
    let file = config_file("mode: nftables\nclusterCIDR: 10.244.0.0/16\n");
    let r = resolve_args(&[
        "--config",
        file.path().to_str().unwrap(),
        "--proxy-mode=ipvs",
        "--masquerade-all",
        "--healthz-port=1",
        "--cleanup",
        "--master=https://192.168.99.1:6443",
    ]);
    assert_eq!(r.config.mode, "nftables");
    assert!(!r.config.nftables.masquerade_all);
    assert_eq!(r.config.healthz_bind_address, "0.0.0.0:10256");
    assert_eq!(
        r.warnings,
        vec![
            "flag --proxy-mode is ignored because --config is set; set the matching field in the configuration file instead",
            "flag --masquerade-all is ignored because --config is set; set the matching field in the configuration file instead",
            "flag --healthz-port is ignored because --config is set; set the matching field in the configuration file instead",
        ]
    );
    assert!(
        r.cleanup,
        "--cleanup is not a configuration field and still applies"
    );
    assert_eq!(r.config_file.as_deref(), Some(file.path()));
}

#[test]
fn hostname_override_and_logging_flags_apply_over_the_config_file() {
    let file = config_file("hostnameOverride: from-file\nlogging:\n  verbosity: 1\n");
    let path = file.path().to_str().unwrap();
    let r = resolve_args(&[
        "--config",
        path,
        "--hostname-override=  Node-1 ",
        "-v",
        "4",
        "--logging-format=json",
    ]);
    assert_eq!(r.config.hostname_override, "node-1");
    assert_eq!(r.config.logging.verbosity, 4);
    assert_eq!(r.config.logging.format, "json");
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);

    for form in [&["--v=5"][..], &["-v=5"], &["-v5"], &["--v", "5"]] {
        assert_eq!(resolve_args(form).config.logging.verbosity, 5, "{form:?}");
    }
}

#[test]
fn a_blank_hostname_override_is_an_error() {
    let (flags, matches) = parse_args(["kube-proxy", "--hostname-override", "   "]).unwrap();
    let err = resolve(&flags, &matches).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid value \"   \" for flag --hostname-override: empty hostname-override is invalid; give a node name or omit the flag"
    );
}

#[test]
fn invalid_results_fail_resolution_with_every_error() {
    let (flags, matches) = parse_args([
        "kube-proxy",
        "--proxy-mode=kernelspace",
        "--oom-score-adj=5000",
    ])
    .unwrap();
    let ConfigError::Invalid(errors) = resolve(&flags, &matches).unwrap_err() else {
        panic!("expected a validation error");
    };
    let fields: Vec<&str> = errors.0.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(fields, vec!["mode", "oomScoreAdj"]);
}

#[test]
fn lenient_decoding_warnings_come_through() {
    let file = config_file("bogus: 1\n");
    let r = resolve_args(&["--config", file.path().to_str().unwrap()]);
    assert_eq!(r.warnings.len(), 1);
    assert!(
        r.warnings[0]
            .ends_with("strict decoding failed, loaded leniently: unknown field \"bogus\""),
        "{:?}",
        r.warnings
    );
}

#[test]
fn project_additions_and_binary_options() {
    let r = resolve_args(&[
        "--manifests",
        "examples/",
        "--dry-run",
        "--init-only=true",
        "--write-config-to=/tmp/out.yaml",
    ]);
    assert_eq!(
        r.manifests.as_deref(),
        Some(std::path::Path::new("examples/"))
    );
    assert!(r.dry_run && r.init_only);
    assert_eq!(
        r.write_config_to.as_deref(),
        Some(std::path::Path::new("/tmp/out.yaml"))
    );

    let (flags, _) = parse_args(["kube-proxy", "--version"]).unwrap();
    assert_eq!(flags.version.as_deref(), Some("true"));
    let (flags, _) = parse_args(["kube-proxy", "--version=raw"]).unwrap();
    assert_eq!(flags.version.as_deref(), Some("raw"));
}

#[test]
fn help_lists_project_additions_separately() {
    use clap::CommandFactory;
    let help = Flags::command().render_long_help().to_string();
    let additions = help
        .find("Project additions (not in upstream kube-proxy)")
        .expect(&help);
    assert!(help[additions..].contains("--manifests"));
    assert!(help[additions..].contains("--dry-run"));
    assert!(help[..additions].contains("--iptables-sync-period"));
}
