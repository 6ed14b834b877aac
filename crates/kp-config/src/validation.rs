//! Validation with upstream's rules (`pkg/proxy/apis/config/validation`).
//!
//! Every problem is reported, not only the first. Field paths use the
//! file's own names (`iptables.masqueradeBit`, `nodePortAddresses[1]`), and
//! messages follow Kubernetes' `field.Error` wording:
//! `iptables.masqueradeBit: Invalid value: 32: must be within the range [0, 31]`.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::duration::GoDuration;
use crate::effective::{LocalMode, ProxyMode};
use crate::feature_gates::{self, LOGGING_ALPHA_OPTIONS, LOGGING_BETA_OPTIONS};
use crate::netutil::split_host_port;
use crate::types::{KubeProxyConfiguration, LoggingConfiguration, OutputRoutingOptions};

/// The Kubernetes minor release whose behaviour this build follows; only its
/// previous minor is accepted by `showHiddenMetricsForVersion`.
pub const KUBERNETES_COMPAT_VERSION: (u32, u32) = (1, 34);

/// What is wrong with a field, in Kubernetes' `field.ErrorType` terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// The value is malformed or out of range.
    Invalid,
    /// The value is not one of a fixed set.
    NotSupported,
    /// The field may not be set in this situation.
    Forbidden,
}

/// One validation problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path of the field, e.g. `conntrack.min` or `nodePortAddresses[0]`.
    pub field: String,
    /// The kind of problem.
    pub kind: FieldErrorKind,
    /// The offending value, rendered (strings quoted).
    pub value: String,
    /// What would be valid.
    pub detail: String,
}

/// All problems found in one configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationErrors(pub Vec<FieldError>);

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            FieldErrorKind::Invalid => {
                write!(
                    f,
                    "{}: Invalid value: {}: {}",
                    self.field, self.value, self.detail
                )
            }
            FieldErrorKind::NotSupported => write!(
                f,
                "{}: Unsupported value: {}: supported values: {}",
                self.field, self.value, self.detail
            ),
            FieldErrorKind::Forbidden => write!(f, "{}: Forbidden: {}", self.field, self.detail),
        }
    }
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, err) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{err}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ValidationErrors {}

impl ValidationErrors {
    /// The messages, one per problem.
    pub fn messages(&self) -> Vec<String> {
        self.0.iter().map(ToString::to_string).collect()
    }
}

/// Checks a (defaulted) configuration and returns every problem found.
pub fn validate(cfg: &KubeProxyConfiguration) -> Result<(), ValidationErrors> {
    let mut v = Validator::default();
    v.feature_gates(cfg);
    v.mode_sections(cfg);
    v.conntrack(cfg);
    v.top_level(cfg);
    v.addresses(cfg);
    v.detect_local(cfg);
    v.logging(&cfg.logging, cfg);
    if v.errors.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors(v.errors))
    }
}

#[derive(Default)]
struct Validator {
    errors: Vec<FieldError>,
}

fn quoted(s: &str) -> String {
    format!("{s:?}")
}

fn quoted_list(items: &[String]) -> String {
    let inner: Vec<String> = items.iter().map(|s| quoted(s)).collect();
    format!("[{}]", inner.join(", "))
}

impl Validator {
    fn invalid(&mut self, field: impl Into<String>, value: String, detail: impl Into<String>) {
        self.errors.push(FieldError {
            field: field.into(),
            kind: FieldErrorKind::Invalid,
            value,
            detail: detail.into(),
        });
    }

    fn forbidden(&mut self, field: impl Into<String>, detail: impl Into<String>) {
        self.errors.push(FieldError {
            field: field.into(),
            kind: FieldErrorKind::Forbidden,
            value: String::new(),
            detail: detail.into(),
        });
    }

    fn not_supported(&mut self, field: &str, value: &str, supported: &[&str]) {
        let list: Vec<String> = supported.iter().map(|s| quoted(s)).collect();
        self.errors.push(FieldError {
            field: field.to_owned(),
            kind: FieldErrorKind::NotSupported,
            value: quoted(value),
            detail: list.join(", "),
        });
    }

    fn non_negative_duration(&mut self, field: &str, d: GoDuration) {
        if d.is_negative() {
            self.invalid(
                field,
                quoted(&d.to_string()),
                "must be greater than or equal to 0",
            );
        }
    }

    fn masquerade_bit(&mut self, field: &str, bit: Option<i32>) {
        if let Some(bit) = bit.filter(|b| !(0..=31).contains(b)) {
            self.invalid(field, bit.to_string(), "must be within the range [0, 31]");
        }
    }

    fn feature_gates(&mut self, cfg: &KubeProxyConfiguration) {
        for name in cfg.feature_gates.keys() {
            if !feature_gates::is_well_formed(name) {
                self.invalid(
                    format!("featureGates[{name}]"),
                    quoted(name),
                    "must be a feature gate name (letters and digits, e.g. LoggingAlphaOptions)",
                );
            }
        }
        for (name, message) in feature_gates::locked_gate_errors(cfg) {
            let value = cfg.feature_gates.get(&name).copied().unwrap_or_default();
            self.invalid(format!("featureGates[{name}]"), value.to_string(), message);
        }
    }

    /// Sync periods of the section the mode uses, plus that section's own checks.
    fn mode_sections(&mut self, cfg: &KubeProxyConfiguration) {
        self.masquerade_bit("iptables.masqueradeBit", cfg.iptables.masquerade_bit);
        let mode = ProxyMode::parse(&cfg.mode);
        let section = match mode {
            Some(ProxyMode::Ipvs) => "ipvs",
            Some(ProxyMode::Nftables) => "nftables",
            _ => "iptables",
        };
        let (sync, min_sync) = cfg.mode_sync_periods();
        self.sync_periods(section, sync, min_sync);
        match mode {
            Some(ProxyMode::Ipvs) => self.ipvs(cfg),
            Some(ProxyMode::Nftables) => {
                self.masquerade_bit("nftables.masqueradeBit", cfg.nftables.masquerade_bit);
            }
            Some(ProxyMode::KernelSpace) => self.invalid(
                "mode",
                quoted(&cfg.mode),
                "kernelspace is only supported on Windows; on Linux use iptables, ipvs, nftables or userspace",
            ),
            None => self.invalid(
                "mode",
                quoted(&cfg.mode),
                "must be iptables, ipvs, nftables, userspace or blank (blank means the best-available proxy [currently iptables])",
            ),
            _ => {}
        }
    }

    fn sync_periods(&mut self, section: &str, sync: GoDuration, min_sync: GoDuration) {
        if sync <= GoDuration::ZERO {
            self.invalid(
                format!("{section}.syncPeriod"),
                quoted(&sync.to_string()),
                "must be greater than 0",
            );
        }
        self.non_negative_duration(&format!("{section}.minSyncPeriod"), min_sync);
        if min_sync > sync {
            self.invalid(
                format!("{section}.syncPeriod"),
                quoted(&sync.to_string()),
                format!("must be greater than or equal to {section}.minSyncPeriod ({min_sync})"),
            );
        }
    }

    fn ipvs(&mut self, cfg: &KubeProxyConfiguration) {
        let ipvs = &cfg.ipvs;
        self.non_negative_duration("ipvs.tcpTimeout", ipvs.tcp_timeout);
        self.non_negative_duration("ipvs.tcpFinTimeout", ipvs.tcp_fin_timeout);
        self.non_negative_duration("ipvs.udpTimeout", ipvs.udp_timeout);
        // Every scheduler the kernel's IPVS offers; empty means rr.
        const SCHEDULERS: [&str; 15] = [
            "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh",
            "twos", "",
        ];
        if !SCHEDULERS.contains(&ipvs.scheduler.as_str()) {
            self.not_supported("ipvs.scheduler", &ipvs.scheduler, &SCHEDULERS);
        }
        for (i, cidr) in ipvs.exclude_cidrs.iter().flatten().enumerate() {
            if cidr.parse::<IpNet>().is_err() {
                self.invalid(
                    format!("ipvs.excludeCIDRs[{i}]"),
                    quoted(cidr),
                    "must be a valid CIDR",
                );
            }
        }
    }

    fn conntrack(&mut self, cfg: &KubeProxyConfiguration) {
        let ct = &cfg.conntrack;
        for (field, value) in [
            ("conntrack.maxPerCore", ct.max_per_core),
            ("conntrack.min", ct.min),
        ] {
            if let Some(n) = value.filter(|n| *n < 0) {
                self.invalid(field, n.to_string(), "must be greater than or equal to 0");
            }
        }
        let timeouts = [
            (
                "conntrack.tcpEstablishedTimeout",
                ct.tcp_established_timeout.unwrap_or_default(),
            ),
            (
                "conntrack.tcpCloseWaitTimeout",
                ct.tcp_close_wait_timeout.unwrap_or_default(),
            ),
            ("conntrack.udpTimeout", ct.udp_timeout),
            ("conntrack.udpStreamTimeout", ct.udp_stream_timeout),
        ];
        for (field, d) in timeouts {
            self.non_negative_duration(field, d);
        }
    }

    fn top_level(&mut self, cfg: &KubeProxyConfiguration) {
        let client = &cfg.client_connection;
        if client.burst < 0 {
            self.invalid(
                "clientConnection.burst",
                client.burst.to_string(),
                "must be greater than or equal to 0",
            );
        }
        if !client.qps.is_finite() {
            self.invalid(
                "clientConnection.qps",
                client.qps.to_string(),
                "must be a finite number",
            );
        }
        if let Some(adj) = cfg.oom_score_adj.filter(|a| !(-1000..=1000).contains(a)) {
            self.invalid(
                "oomScoreAdj",
                adj.to_string(),
                "must be within the range [-1000, 1000]",
            );
        }
        if cfg.config_sync_period <= GoDuration::ZERO {
            let value = quoted(&cfg.config_sync_period.to_string());
            self.invalid("configSyncPeriod", value, "must be greater than 0");
        }
        // Upstream checked this in every mode, though only its userspace
        // mode used it.
        if cfg.udp_idle_timeout <= GoDuration::ZERO {
            let value = quoted(&cfg.udp_idle_timeout.to_string());
            self.invalid("udpIdleTimeout", value, "must be greater than 0");
        }
        if let Err(reason) = parse_port_range(&cfg.port_range) {
            self.invalid(
                "portRange",
                quoted(&cfg.port_range),
                format!("must be a valid port range (e.g. 300-2000): {reason}"),
            );
        }
        self.show_hidden_metrics(&cfg.show_hidden_metrics_for_version);
    }

    fn show_hidden_metrics(&mut self, version: &str) {
        let (major, minor) = KUBERNETES_COMPAT_VERSION;
        let valid = format!("{major}.{}", minor.saturating_sub(1));
        if !version.is_empty() && version != valid {
            self.invalid(
                "showHiddenMetricsForVersion",
                quoted(version),
                format!("must be omitted or have the value '{valid}'. Only the previous minor version is allowed"),
            );
        }
    }

    fn addresses(&mut self, cfg: &KubeProxyConfiguration) {
        if cfg.bind_address.parse::<IpAddr>().is_err() {
            self.invalid(
                "bindAddress",
                quoted(&cfg.bind_address),
                "not a valid textual representation of an IP address",
            );
        }
        self.host_port("healthzBindAddress", &cfg.healthz_bind_address);
        self.host_port("metricsBindAddress", &cfg.metrics_bind_address);
        self.node_port_addresses(cfg.node_port_addresses.as_deref().unwrap_or_default());
    }

    /// `IP:port` with a port in [1, 65535]; empty disables the server.
    fn host_port(&mut self, field: &str, input: &str) {
        if input.is_empty() {
            return;
        }
        let Some((host, port)) = split_host_port(input) else {
            self.invalid(
                field,
                quoted(input),
                "must be IP:port (e.g. 0.0.0.0:10256 or [::]:10256)",
            );
            return;
        };
        if host.parse::<IpAddr>().is_err() {
            self.invalid(field, quoted(host), "must be a valid IP");
        }
        if !matches!(port.parse::<u32>(), Ok(1..=65535)) {
            self.invalid(field, quoted(port), "must be a valid port (1-65535)");
        }
    }

    fn node_port_addresses(&mut self, addresses: &[String]) {
        for (i, addr) in addresses.iter().enumerate() {
            let field = format!("nodePortAddresses[{i}]");
            if addr == "primary" || addr == "all" {
                if addresses.len() != 1 {
                    self.invalid(
                        field,
                        quoted(addr),
                        format!("can't use both '{addr}' and other values"),
                    );
                }
                continue;
            }
            if addr.parse::<IpNet>().is_err() {
                self.invalid(
                    field,
                    quoted(addr),
                    "must be a valid CIDR (e.g. 10.0.0.0/8) or the single value 'primary' or 'all'",
                );
            }
        }
    }

    fn detect_local(&mut self, cfg: &KubeProxyConfiguration) {
        let Some(mode) = LocalMode::parse(&cfg.detect_local_mode) else {
            self.not_supported("detectLocalMode", &cfg.detect_local_mode, &LocalMode::NAMES);
            return;
        };
        match mode {
            LocalMode::BridgeInterface if cfg.detect_local.bridge_interface.is_empty() => self
                .invalid(
                    "detectLocal.bridgeInterface",
                    quoted(""),
                    "must not be empty when detectLocalMode is BridgeInterface",
                ),
            LocalMode::InterfaceNamePrefix if cfg.detect_local.interface_name_prefix.is_empty() => {
                self.invalid(
                    "detectLocal.interfaceNamePrefix",
                    quoted(""),
                    "must not be empty when detectLocalMode is InterfaceNamePrefix",
                )
            }
            LocalMode::ClusterCidr if !cfg.cluster_cidr.is_empty() => {
                self.cluster_cidr(&cfg.cluster_cidr)
            }
            _ => {}
        }
    }

    fn cluster_cidr(&mut self, value: &str) {
        let parts: Vec<String> = value.split(',').map(str::to_owned).collect();
        if parts.len() > 2 {
            self.invalid(
                "clusterCIDR",
                quoted(value),
                "must be a either a single CIDR or dual-stack pair of CIDRs (e.g. 10.100.0.0/16,fde4:8dba:82e1::/48)",
            );
            return;
        }
        let parsed: Vec<Option<IpNet>> = parts.iter().map(|p| p.parse().ok()).collect();
        for (i, net) in parsed.iter().enumerate() {
            if net.is_none() {
                self.invalid(
                    format!("clusterCIDR[{i}]"),
                    quoted(&parts[i]),
                    "must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
                );
            }
        }
        if let [Some(a), Some(b)] = parsed.as_slice() {
            if matches!(a, IpNet::V4(_)) == matches!(b, IpNet::V4(_)) {
                self.invalid(
                    "clusterCIDR",
                    quoted_list(&parts),
                    "must be a either a single CIDR or dual-stack pair of CIDRs (e.g. 10.100.0.0/16,fde4:8dba:82e1::/48)",
                );
            }
        }
    }

    fn logging(&mut self, logging: &LoggingConfiguration, cfg: &KubeProxyConfiguration) {
        if !matches!(logging.format.as_str(), "text" | "json") {
            self.invalid(
                "logging.format",
                quoted(&logging.format),
                "Unsupported log format (supported: text, json)",
            );
        }
        if logging.format == "json" && !feature_gates::enabled(cfg, LOGGING_BETA_OPTIONS) {
            self.forbidden(
                "logging.format",
                "Log format json is disabled, see LoggingBetaOptions feature",
            );
        }
        // klog keeps verbosity in an int32.
        if i32::try_from(logging.verbosity).is_err() {
            self.invalid(
                "logging.verbosity",
                logging.verbosity.to_string(),
                format!("Must be <= {}", i32::MAX),
            );
        }
        if logging.format != "text" && !logging.vmodule.is_empty() {
            self.forbidden("logging.vmodule", "Only supported for text log format");
        }
        for (i, item) in logging.vmodule.iter().enumerate() {
            let pattern = &item.file_pattern;
            if pattern.is_empty() || pattern.contains(['=', ',']) {
                self.invalid(
                    format!("logging.vmodule[{i}].filePattern"),
                    quoted(pattern),
                    "must be a non-empty file name or glob without '=' or ','",
                );
            }
            if i32::try_from(item.verbosity).is_err() {
                self.invalid(
                    format!("logging.vmodule[{i}].verbosity"),
                    item.verbosity.to_string(),
                    format!("Must be <= {}", i32::MAX),
                );
            }
        }
        let alpha = feature_gates::enabled(cfg, LOGGING_ALPHA_OPTIONS);
        self.output_routing("logging.options.text", &logging.options.text, alpha);
        self.output_routing("logging.options.json", &logging.options.json, alpha);
    }

    fn output_routing(&mut self, path: &str, options: &OutputRoutingOptions, alpha_enabled: bool) {
        let size = &options.info_buffer_size.0;
        let is_zero = size.is_empty() || quantity_is_zero(size);
        if !size.is_empty() && !is_quantity(size) {
            self.invalid(
                format!("{path}.infoBufferSize"),
                quoted(size),
                "must be a quantity such as 0, 512, 1k, 2Ki or 1M",
            );
        }
        if !alpha_enabled && options.split_stream {
            self.forbidden(
                format!("{path}.splitStream"),
                "Feature LoggingAlphaOptions is disabled",
            );
        }
        if !alpha_enabled && !is_zero {
            self.forbidden(
                format!("{path}.infoBufferSize"),
                "Feature LoggingAlphaOptions is disabled",
            );
        }
    }
}

/// Upstream `utilnet.ParsePortRange`: empty, `N`, `A-B` or `A+N`, within 0..=65535.
pub(crate) fn parse_port_range(value: &str) -> Result<Option<(u16, u16)>, &'static str> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(None);
    }
    let number = |s: &str| -> Result<u32, &'static str> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err("ports must be decimal numbers");
        }
        s.parse::<u32>()
            .map_err(|_| "the port range cannot be greater than 65535")
    };
    let (low, high) = match (value.find('-'), value.find('+')) {
        (None, None) => (number(value)?, number(value)?),
        (Some(i), None) => (number(&value[..i])?, number(&value[i + 1..])?),
        (None, Some(i)) => {
            let low = number(&value[..i])?;
            (low, low.saturating_add(number(&value[i + 1..])?))
        }
        (Some(_), Some(_)) => return Err("use either A-B or A+N"),
    };
    if low > 65535 || high > 65535 {
        return Err("the port range cannot be greater than 65535");
    }
    if high < low {
        return Err("end port cannot be less than start port");
    }
    // Both bounds were checked to be at most 65535 just above.
    Ok(Some((low as u16, high as u16)))
}

/// Kubernetes quantity syntax: a signed decimal number with an optional
/// binary (Ki..Ei), decimal (n, u, m, k, M..E) or exponent suffix.
pub(crate) fn is_quantity(text: &str) -> bool {
    let body = text.strip_prefix(['+', '-']).unwrap_or(text);
    let num_len = body
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b'.')
        .count();
    let (number, suffix) = body.split_at(num_len);
    let digits = number.bytes().filter(u8::is_ascii_digit).count();
    if digits == 0 || number.matches('.').count() > 1 {
        return false;
    }
    const SUFFIXES: [&str; 17] = [
        "", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "",
    ];
    if SUFFIXES.contains(&suffix) {
        return true;
    }
    let exp = suffix.strip_prefix(['e', 'E']).unwrap_or("");
    let exp = exp.strip_prefix(['+', '-']).unwrap_or(exp);
    !exp.is_empty() && exp.bytes().all(|b| b.is_ascii_digit())
}

pub(crate) fn quantity_is_zero(text: &str) -> bool {
    let body = text.strip_prefix(['+', '-']).unwrap_or(text);
    is_quantity(text)
        && body
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .all(|b| b == b'0' || b == b'.')
}
