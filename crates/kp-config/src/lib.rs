//! Configuration of kube-proxy-rs: upstream's `KubeProxyConfiguration`
//! (`kubeproxy.config.k8s.io/v1alpha1`) and upstream's command-line flags.
//!
//! The `kube-proxy` binary parses its arguments with [`parse_args`], turns
//! them into the configuration to run with [`resolve`] (which loads
//! `--config`, applies flag precedence, defaults and [`validate`]s), and
//! writes `--write-config-to` with [`write_file`].
//!
//! ```
//! let (flags, matches) = kp_config::parse_args(["kube-proxy", "--proxy-mode=nftables"]).unwrap();
//! let resolved = kp_config::resolve(&flags, &matches).unwrap();
//! assert_eq!(resolved.config.effective_mode().unwrap(), kp_config::ProxyMode::Nftables);
//! ```

#![forbid(unsafe_code)]

mod decode;
mod defaults;
mod duration;
mod effective;
mod encode;
mod error;
mod feature_gates;
mod flags;
mod log_flags;
mod netutil;
mod resolve;
mod types;
mod validation;

pub use decode::{load_file, load_str, Loaded};
pub use defaults::*;
pub use duration::{DurationParseError, GoDuration};
pub use effective::{InvalidValue, LocalMode, ProxyMode, SyncPeriods};
pub use encode::{to_yaml, write_file};
pub use error::ConfigError;
pub use feature_gates::{
    enabled as feature_enabled, feature_gate_warnings, locked_gate_errors, spec as feature_gate,
    Effect as FeatureGateEffect, GateSpec, Stage as FeatureGateStage, ALL_ALPHA, ALL_BETA,
    FEATURE_GATES, LOGGING_ALPHA_OPTIONS, LOGGING_BETA_OPTIONS, PREFER_SAME_TRAFFIC_DISTRIBUTION,
};
pub use flags::{parse_feature_gates, parse_go_bool, FeatureGatePairs, Flags, NftablesLayout};
pub use log_flags::{
    klog_flag_warning, logging_option_warnings, parse_severity, parse_vmodule, KlogOptions,
    Severity, VModuleFlag, KLOG_FLAGS,
};
pub use resolve::{parse_args, resolve, Resolved};
pub use types::*;
pub use validation::{
    validate, FieldError, FieldErrorKind, ValidationErrors, KUBERNETES_COMPAT_VERSION,
};
