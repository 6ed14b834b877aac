//! Combining flags and the configuration file into the configuration to run.
//!
//! Upstream's precedence: without `--config`, flags override the defaults;
//! with `--config`, the file wins and every configuration flag is ignored
//! except the logging flags (`-v`, `--vmodule`, `--logging-format`, ...) and
//! `--hostname-override`. Each ignored flag that was set explicitly produces
//! a warning naming it.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches};

use crate::decode::load_file;
use crate::defaults::{DEFAULT_HEALTHZ_PORT, DEFAULT_METRICS_PORT};
use crate::error::ConfigError;
use crate::feature_gates::feature_gate_warnings;
use crate::flags::Flags;
use crate::log_flags::{klog_flag_warning, logging_option_warnings, KlogOptions, KLOG_FLAGS};
use crate::netutil::{append_port_if_needed, with_port};
use crate::types::KubeProxyConfiguration;
use crate::validation::validate;

/// Flags that are not configuration fields, or that upstream honours even
/// when `--config` is given (every logging flag: upstream copies the ones
/// set on the command line over the file's `logging` section).
const HONOURED_WITH_CONFIG: [&str; 32] = [
    "config",
    "write_config_to",
    "cleanup",
    "init_only",
    "master",
    "hostname_override",
    "v",
    "logging_format",
    "log_flush_frequency",
    "vmodule",
    "log_text_split_stream",
    "log_text_info_buffer_size",
    "log_json_split_stream",
    "log_json_info_buffer_size",
    "logtostderr",
    "alsologtostderr",
    "log_file",
    "log_dir",
    "log_file_max_size",
    "stderrthreshold",
    "add_dir_header",
    "skip_headers",
    "skip_log_headers",
    "one_output",
    "log_backtrace_at",
    "version",
    "manifests",
    "dry_run",
    "state_check_service_ports",
    "state_check_interval",
    "config_change_exit_jitter",
    "nftables_layout",
];

/// The validated configuration plus the options only the binary uses.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The configuration to run with (defaulted and validated).
    pub config: KubeProxyConfiguration,
    /// Human-readable warnings (ignored flags, deprecated flags, lenient
    /// decoding, unknown gates), for the caller to log once logging is set up.
    pub warnings: Vec<String>,
    /// `--config`, when given.
    pub config_file: Option<PathBuf>,
    /// `--write-config-to`: write `config` there and exit.
    pub write_config_to: Option<PathBuf>,
    /// `--cleanup`: remove rules and exit.
    pub cleanup: bool,
    /// `--init-only`: do privileged setup and exit.
    pub init_only: bool,
    /// `--master`: API server URL overriding the kubeconfig's.
    pub master: Option<String>,
    /// `--manifests`: serve from this file or directory instead of the API server.
    pub manifests: Option<PathBuf>,
    /// `--dry-run`: print the rules of one sync and exit.
    pub dry_run: bool,
    /// `--state-check-service-ports`: how many service ports each check of
    /// the kernel's state covers (0: no checks).
    pub state_check_service_ports: usize,
    /// `--state-check-interval`: the least time between two checks.
    pub state_check_interval: std::time::Duration,
    /// `--config-change-exit-jitter`: the longest random wait before the
    /// exit that a changed `--config` file causes.
    pub config_change_exit_jitter: std::time::Duration,
    /// `--nftables-layout`: how the nftables mode lays out its table.
    pub nftables_layout: crate::flags::NftablesLayout,
    /// Where logs go, from klog's flags (`--logtostderr`, `--log-file`, ...).
    pub klog: KlogOptions,
}

/// The duration of the flag `name`, which must not be negative.
fn not_negative(name: &str, value: crate::GoDuration) -> Result<std::time::Duration, ConfigError> {
    value.to_std().ok_or_else(|| {
        ConfigError::Invalid(crate::validation::ValidationErrors(vec![
            crate::validation::FieldError {
                field: name.to_owned(),
                kind: crate::validation::FieldErrorKind::Invalid,
                value: value.to_string(),
                detail: "must not be negative".to_owned(),
            },
        ]))
    })
}

/// Parses a command line (the first item is the program name).
pub fn parse_args<I, T>(args: I) -> Result<(Flags, ArgMatches), clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let matches = Flags::command().try_get_matches_from(args)?;
    let flags = Flags::from_arg_matches(&matches)?;
    Ok((flags, matches))
}

/// Builds the configuration to run from parsed flags and, with `--config`,
/// the configuration file; then validates it.
pub fn resolve(flags: &Flags, matches: &ArgMatches) -> Result<Resolved, ConfigError> {
    let explicit = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
    let mut warnings = Vec::new();
    let mut config = match &flags.config {
        Some(path) => {
            let (config, load_warnings) = load_file(path)?;
            warnings.extend(load_warnings);
            warnings.extend(ignored_flag_warnings(matches));
            config
        }
        None => {
            let mut config = KubeProxyConfiguration::defaulted();
            apply_config_flags(flags, &explicit, &mut config);
            apply_deprecated_ports(flags, &explicit, &mut config, &mut warnings)?;
            config
        }
    };
    apply_logging_flags(flags, &explicit, &mut config);
    let klog = klog_options(flags);
    if explicit("hostname_override") {
        apply_hostname_override(&flags.hostname_override, &mut config)?;
    }
    warnings.extend(feature_gate_warnings(&config));
    validate(&config).map_err(ConfigError::Invalid)?;
    warnings.extend(
        KLOG_FLAGS
            .iter()
            .filter(|(flag, _)| explicit(&flag.replace('-', "_")))
            .map(|(flag, _)| klog_flag_warning(flag, &klog)),
    );
    warnings.extend(logging_option_warnings(&config.logging, flags.dry_run));
    Ok(Resolved {
        config,
        warnings,
        config_file: flags.config.clone(),
        write_config_to: flags.write_config_to.clone(),
        cleanup: flags.cleanup,
        init_only: flags.init_only,
        master: flags.master.clone(),
        manifests: flags.manifests.clone(),
        dry_run: flags.dry_run,
        state_check_service_ports: flags.state_check_service_ports,
        state_check_interval: not_negative("--state-check-interval", flags.state_check_interval)?,
        config_change_exit_jitter: not_negative(
            "--config-change-exit-jitter",
            flags.config_change_exit_jitter,
        )?,
        nftables_layout: flags.nftables_layout,
        klog,
    })
}

fn klog_options(flags: &Flags) -> KlogOptions {
    KlogOptions {
        logtostderr: flags.logtostderr,
        alsologtostderr: flags.alsologtostderr,
        log_file: flags.log_file.clone().filter(|p| !p.as_os_str().is_empty()),
        stderr_threshold: flags.stderrthreshold,
    }
}

/// One warning per configuration flag set on the command line while `--config` is in force.
fn ignored_flag_warnings(matches: &ArgMatches) -> Vec<String> {
    let command = Flags::command();
    command
        .get_arguments()
        .filter(|arg| !HONOURED_WITH_CONFIG.contains(&arg.get_id().as_str()))
        .filter(|arg| matches.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine))
        .map(|arg| {
            let name = arg.get_long().unwrap_or(arg.get_id().as_str());
            format!("flag --{name} is ignored because --config is set; set the matching field in the configuration file instead")
        })
        .collect()
}

fn apply_logging_flags(
    flags: &Flags,
    explicit: &dyn Fn(&str) -> bool,
    config: &mut KubeProxyConfiguration,
) {
    if explicit("v") {
        config.logging.verbosity = flags.v;
    }
    if explicit("logging_format") {
        config.logging.format.clone_from(&flags.logging_format);
    }
    let logging = &mut config.logging;
    if explicit("log_flush_frequency") {
        logging.flush_frequency.duration = flags.log_flush_frequency;
        logging.flush_frequency.serialize_as_string = true;
    }
    // Like component-base's flag, each --vmodule adds to the list.
    for items in &flags.vmodule {
        logging.vmodule.extend(items.0.iter().cloned());
    }
    let options = &mut logging.options;
    set(
        explicit("log_text_split_stream"),
        &mut options.text.split_stream,
        &flags.log_text_split_stream,
    );
    set(
        explicit("log_json_split_stream"),
        &mut options.json.split_stream,
        &flags.log_json_split_stream,
    );
    if let Some(size) = &flags.log_text_info_buffer_size {
        options.text.info_buffer_size.clone_from(size);
    }
    if let Some(size) = &flags.log_json_info_buffer_size {
        options.json.info_buffer_size.clone_from(size);
    }
}

/// Upstream trims and lower-cases the name; a name of only spaces is an error.
fn apply_hostname_override(
    value: &str,
    config: &mut KubeProxyConfiguration,
) -> Result<(), ConfigError> {
    if value.is_empty() {
        return Ok(());
    }
    let name = value.trim();
    if name.is_empty() {
        return Err(ConfigError::InvalidFlag {
            flag: "hostname-override",
            value: value.to_owned(),
            reason: "empty hostname-override is invalid; give a node name or omit the flag"
                .to_owned(),
        });
    }
    config.hostname_override = name.to_lowercase();
    Ok(())
}

/// `--healthz-port`/`--metrics-port` set only the port of the bind address;
/// 0 disables the server. A bind address given as a bare IP gets the
/// (possibly default) port appended, as upstream does.
fn apply_deprecated_ports(
    flags: &Flags,
    explicit: &dyn Fn(&str) -> bool,
    config: &mut KubeProxyConfiguration,
    warnings: &mut Vec<String>,
) -> Result<(), ConfigError> {
    let servers = [
        (
            "healthz-port",
            "healthz_port",
            flags.healthz_port,
            DEFAULT_HEALTHZ_PORT,
            "--healthz-bind-address",
        ),
        (
            "metrics-port",
            "metrics_port",
            flags.metrics_port,
            DEFAULT_METRICS_PORT,
            "--metrics-bind-address",
        ),
    ];
    for (flag, id, port, default_port, replacement) in servers {
        let address = if flag == "healthz-port" {
            &mut config.healthz_bind_address
        } else {
            &mut config.metrics_bind_address
        };
        if !explicit(id) {
            *address = append_port_if_needed(address, default_port);
            continue;
        }
        warnings.push(format!(
            "flag --{flag} has been deprecated, This flag is deprecated and will be removed in a future release. Please use {replacement} instead."
        ));
        let port = u16::try_from(port).map_err(|_| ConfigError::InvalidFlag {
            flag,
            value: port.to_string(),
            reason: "must be a port number in [0, 65535] (0 disables the server)".to_owned(),
        })?;
        *address = if port == 0 {
            String::new()
        } else {
            with_port(address, port)
        };
    }
    Ok(())
}

/// Copies every explicitly set configuration flag into `config`.
fn apply_config_flags(
    flags: &Flags,
    explicit: &dyn Fn(&str) -> bool,
    config: &mut KubeProxyConfiguration,
) {
    for pairs in &flags.feature_gates {
        pairs.merge_into(&mut config.feature_gates);
    }
    let c = &mut config.client_connection;
    set(explicit("kubeconfig"), &mut c.kubeconfig, &flags.kubeconfig);
    set(
        explicit("kube_api_content_type"),
        &mut c.content_type,
        &flags.kube_api_content_type,
    );
    set(explicit("kube_api_qps"), &mut c.qps, &flags.kube_api_qps);
    set(
        explicit("kube_api_burst"),
        &mut c.burst,
        &flags.kube_api_burst,
    );

    set(
        explicit("bind_address"),
        &mut config.bind_address,
        &flags.bind_address,
    );
    set(
        explicit("bind_address_hard_fail"),
        &mut config.bind_address_hard_fail,
        &flags.bind_address_hard_fail,
    );
    set(
        explicit("healthz_bind_address"),
        &mut config.healthz_bind_address,
        &flags.healthz_bind_address,
    );
    set(
        explicit("metrics_bind_address"),
        &mut config.metrics_bind_address,
        &flags.metrics_bind_address,
    );
    set(
        explicit("profiling"),
        &mut config.enable_profiling,
        &flags.profiling,
    );
    set(
        explicit("show_hidden_metrics_for_version"),
        &mut config.show_hidden_metrics_for_version,
        &flags.show_hidden_metrics_for_version,
    );
    set(explicit("proxy_mode"), &mut config.mode, &flags.proxy_mode);
    set(
        explicit("config_sync_period"),
        &mut config.config_sync_period,
        &flags.config_sync_period,
    );
    set(
        explicit("udp_timeout"),
        &mut config.udp_idle_timeout,
        &flags.udp_timeout,
    );
    set(
        explicit("oom_score_adj"),
        &mut config.oom_score_adj,
        &Some(flags.oom_score_adj),
    );

    apply_backend_flags(flags, explicit, config);
    apply_local_detection_flags(flags, explicit, config);
    apply_conntrack_flags(flags, explicit, config);
}

fn apply_backend_flags(
    flags: &Flags,
    explicit: &dyn Fn(&str) -> bool,
    config: &mut KubeProxyConfiguration,
) {
    set(
        explicit("iptables_masquerade_bit"),
        &mut config.iptables.masquerade_bit,
        &Some(flags.iptables_masquerade_bit),
    );
    set(
        explicit("iptables_localhost_nodeports"),
        &mut config.iptables.localhost_node_ports,
        &Some(flags.iptables_localhost_nodeports),
    );
    // Upstream keeps one masqueradeAll and one pair of sync periods for the
    // iptables and nftables backends; the iptables flags set both sections.
    for (masquerade_all, sync, min_sync) in [
        (
            &mut config.iptables.masquerade_all,
            &mut config.iptables.sync_period,
            &mut config.iptables.min_sync_period,
        ),
        (
            &mut config.nftables.masquerade_all,
            &mut config.nftables.sync_period,
            &mut config.nftables.min_sync_period,
        ),
    ] {
        set(
            explicit("masquerade_all"),
            masquerade_all,
            &flags.masquerade_all,
        );
        set(
            explicit("iptables_sync_period"),
            sync,
            &flags.iptables_sync_period,
        );
        set(
            explicit("iptables_min_sync_period"),
            min_sync,
            &flags.iptables_min_sync_period,
        );
    }
    let ipvs = &mut config.ipvs;
    set(
        explicit("ipvs_sync_period"),
        &mut ipvs.sync_period,
        &flags.ipvs_sync_period,
    );
    set(
        explicit("ipvs_min_sync_period"),
        &mut ipvs.min_sync_period,
        &flags.ipvs_min_sync_period,
    );
    set(
        explicit("ipvs_scheduler"),
        &mut ipvs.scheduler,
        &flags.ipvs_scheduler,
    );
    set(
        explicit("ipvs_strict_arp"),
        &mut ipvs.strict_arp,
        &flags.ipvs_strict_arp,
    );
    set(
        explicit("ipvs_tcp_timeout"),
        &mut ipvs.tcp_timeout,
        &flags.ipvs_tcp_timeout,
    );
    set(
        explicit("ipvs_tcpfin_timeout"),
        &mut ipvs.tcp_fin_timeout,
        &flags.ipvs_tcpfin_timeout,
    );
    set(
        explicit("ipvs_udp_timeout"),
        &mut ipvs.udp_timeout,
        &flags.ipvs_udp_timeout,
    );
    if explicit("ipvs_exclude_cidrs") {
        ipvs.exclude_cidrs = Some(non_empty(&flags.ipvs_exclude_cidrs));
    }
}

fn apply_local_detection_flags(
    flags: &Flags,
    explicit: &dyn Fn(&str) -> bool,
    config: &mut KubeProxyConfiguration,
) {
    set(
        explicit("detect_local_mode"),
        &mut config.detect_local_mode,
        &flags.detect_local_mode,
    );
    set(
        explicit("pod_bridge_interface"),
        &mut config.detect_local.bridge_interface,
        &flags.pod_bridge_interface,
    );
    set(
        explicit("pod_interface_name_prefix"),
        &mut config.detect_local.interface_name_prefix,
        &flags.pod_interface_name_prefix,
    );
    set(
        explicit("cluster_cidr"),
        &mut config.cluster_cidr,
        &flags.cluster_cidr,
    );
    if explicit("nodeport_addresses") {
        config.node_port_addresses = Some(non_empty(&flags.nodeport_addresses));
    }
}

fn apply_conntrack_flags(
    flags: &Flags,
    explicit: &dyn Fn(&str) -> bool,
    config: &mut KubeProxyConfiguration,
) {
    let ct = &mut config.conntrack;
    set(
        explicit("conntrack_max_per_core"),
        &mut ct.max_per_core,
        &Some(flags.conntrack_max_per_core),
    );
    set(
        explicit("conntrack_min"),
        &mut ct.min,
        &Some(flags.conntrack_min),
    );
    set(
        explicit("conntrack_tcp_timeout_established"),
        &mut ct.tcp_established_timeout,
        &Some(flags.conntrack_tcp_timeout_established),
    );
    set(
        explicit("conntrack_tcp_timeout_close_wait"),
        &mut ct.tcp_close_wait_timeout,
        &Some(flags.conntrack_tcp_timeout_close_wait),
    );
    set(
        explicit("conntrack_tcp_be_liberal"),
        &mut ct.tcp_be_liberal,
        &flags.conntrack_tcp_be_liberal,
    );
    set(
        explicit("conntrack_udp_timeout"),
        &mut ct.udp_timeout,
        &flags.conntrack_udp_timeout,
    );
    set(
        explicit("conntrack_udp_timeout_stream"),
        &mut ct.udp_stream_timeout,
        &flags.conntrack_udp_timeout_stream,
    );
}

fn set<T: Clone>(explicit: bool, field: &mut T, value: &T) {
    if explicit {
        field.clone_from(value);
    }
}

fn non_empty(items: &[String]) -> Vec<String> {
    items.iter().filter(|s| !s.is_empty()).cloned().collect()
}
