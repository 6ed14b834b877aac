//! Feature gates kube-proxy-rs knows by name.
//!
//! Upstream kube-proxy accepts every gate of the whole Kubernetes release
//! (several hundred) and rejects any other name. kube-proxy-rs cannot list
//! them all, so a well-formed name it does not know is accepted with a
//! warning instead of an error; a malformed name is a validation error.

use crate::types::KubeProxyConfiguration;

/// The gate that unlocks the `logging.options` fields.
pub const LOGGING_ALPHA_OPTIONS: &str = "LoggingAlphaOptions";

/// Gates relevant to kube-proxy, with their default state.
pub const KNOWN_FEATURE_GATES: &[(&str, bool)] = &[
    ("AllAlpha", false),
    ("AllBeta", false),
    ("ComponentFlagz", false),
    ("ComponentStatusz", false),
    ("ContextualLogging", true),
    ("KubeProxyDrainingTerminatingNodes", true),
    ("KubeProxyIPVS", true),
    ("KubeProxyNFTablesLocalhostNodePorts", false),
    (LOGGING_ALPHA_OPTIONS, false),
    ("LoggingBetaOptions", true),
    ("MultiCIDRServiceAllocator", true),
    ("NFTablesNetlink", true),
    ("NFTablesProxyMode", true),
    ("PreferSameTrafficDistribution", true),
    ("ServiceTrafficDistribution", true),
    ("StrictIPCIDRValidation", false),
    ("TopologyAwareHints", true),
];

/// True when `name` looks like a gate name: an ASCII letter followed by letters and digits.
pub fn is_well_formed(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic())
        && bytes.all(|b| b.is_ascii_alphanumeric())
}

/// Whether `gate` is on in `cfg`, honouring `AllAlpha`/`AllBeta` for gates that
/// are off by default.
pub fn enabled(cfg: &KubeProxyConfiguration, gate: &str) -> bool {
    if let Some(value) = cfg.feature_gates.get(gate) {
        return *value;
    }
    let default = KNOWN_FEATURE_GATES
        .iter()
        .find(|(name, _)| *name == gate)
        .is_some_and(|(_, on)| *on);
    default || (gate == LOGGING_ALPHA_OPTIONS && cfg.feature_gates.get("AllAlpha") == Some(&true))
}

/// Warnings for well-formed gate names this build does not know.
pub fn unknown_gate_warnings(cfg: &KubeProxyConfiguration) -> Vec<String> {
    cfg.feature_gates
        .keys()
        .filter(|name| is_well_formed(name))
        .filter(|name| !KNOWN_FEATURE_GATES.iter().any(|(known, _)| known == name))
        .map(|name| {
            format!("feature gate {name:?} is not known to kube-proxy-rs and has no effect")
        })
        .collect()
}
