//! Feature gates: upstream kube-proxy v1.34's facts and what kube-proxy-rs
//! does with each.
//!
//! Upstream kube-proxy accepts every gate of the whole Kubernetes release
//! (several hundred) and rejects any other name with `unrecognized feature
//! gate`. kube-proxy-rs lists only the gates that concern kube-proxy
//! ([`FEATURE_GATES`]); a well-formed name it does not list is accepted with
//! a warning instead of an error (a malformed name is a validation error).
//!
//! The facts are those of Kubernetes v1.34
//! ([`crate::KUBERNETES_COMPAT_VERSION`]): the last versioned spec at or
//! before 1.34 in `pkg/features/kube_features.go` and in component-base's
//! logs and zpages gates.

use crate::types::KubeProxyConfiguration;

/// The gate that unlocks the `logging.options` fields.
pub const LOGGING_ALPHA_OPTIONS: &str = "LoggingAlphaOptions";
/// The gate that unlocks `logging.format: json`.
pub const LOGGING_BETA_OPTIONS: &str = "LoggingBetaOptions";
/// The gate that lets `hints.forNodes` (`trafficDistribution: PreferSameNode`)
/// narrow the endpoints.
pub const PREFER_SAME_TRAFFIC_DISTRIBUTION: &str = "PreferSameTrafficDistribution";
/// Sets every alpha gate not set explicitly.
pub const ALL_ALPHA: &str = "AllAlpha";
/// Sets every beta gate not set explicitly.
pub const ALL_BETA: &str = "AllBeta";

/// A gate's maturity (component-base `featuregate.prerelease`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Off by default, may change or vanish.
    Alpha,
    /// Usually on by default.
    Beta,
    /// Graduated; the gate stays a few releases for compatibility.
    Ga,
    /// On its way out.
    Deprecated,
}

/// What kube-proxy-rs does with a gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// The gate changes kube-proxy-rs's behaviour as it changes upstream's.
    Honoured(&'static str),
    /// Locked, so only its fixed value is accepted; that behaviour is always on.
    Fixed(&'static str),
    /// Accepted but changes nothing here; setting it gives a warning saying why.
    NoEffect(&'static str),
}

/// One feature gate as Kubernetes v1.34 defines it, and what we do with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateSpec {
    /// The gate's name, e.g. `PreferSameTrafficDistribution`.
    pub name: &'static str,
    /// The value when not set.
    pub default: bool,
    /// Maturity in v1.34.
    pub stage: Stage,
    /// `LockToDefault`: setting another value is an error.
    pub locked: bool,
    /// What kube-proxy-rs does with it.
    pub effect: Effect,
}

const fn gate(
    name: &'static str,
    default: bool,
    stage: Stage,
    locked: bool,
    effect: Effect,
) -> GateSpec {
    GateSpec {
        name,
        default,
        stage,
        locked,
        effect,
    }
}

/// The gates of Kubernetes v1.34 that concern kube-proxy, by name.
pub const FEATURE_GATES: &[GateSpec] = &[
    gate(ALL_ALPHA, false, Stage::Alpha, false, Effect::Honoured("sets every alpha gate below that is not set explicitly")),
    gate(ALL_BETA, false, Stage::Beta, false, Effect::Honoured("sets every beta gate below that is not set explicitly")),
    gate("ComponentFlagz", false, Stage::Alpha, false, Effect::NoEffect("kube-proxy-rs serves no /flagz page")),
    gate("ComponentStatusz", false, Stage::Alpha, false, Effect::NoEffect("kube-proxy-rs serves no /statusz page")),
    gate("ContextualLogging", true, Stage::Beta, false, Effect::NoEffect("it concerns Go's contextual loggers; kube-proxy-rs logs through tracing")),
    gate(LOGGING_ALPHA_OPTIONS, false, Stage::Alpha, false, Effect::Honoured("allows logging.options splitStream and infoBufferSize (--log-*-split-stream, --log-*-info-buffer-size)")),
    gate(LOGGING_BETA_OPTIONS, true, Stage::Beta, false, Effect::Honoured("allows --logging-format=json")),
    gate("MultiCIDRServiceAllocator", true, Stage::Ga, true, Effect::NoEffect("it concerns the API server's ClusterIP allocation")),
    gate("NFTablesProxyMode", true, Stage::Ga, true, Effect::Fixed("mode nftables is accepted")),
    gate(PREFER_SAME_TRAFFIC_DISTRIBUTION, true, Stage::Beta, false, Effect::Honoured("when off, node hints (trafficDistribution: PreferSameNode) are ignored and zone hints used instead")),
    gate("ServiceTrafficDistribution", true, Stage::Ga, true, Effect::Fixed("topology hints written for trafficDistribution are honoured")),
    gate("StrictIPCIDRValidation", false, Stage::Alpha, false, Effect::NoEffect("it concerns the API server's validation of objects")),
    gate("TopologyAwareHints", true, Stage::Ga, true, Effect::Fixed("EndpointSlice zone hints are honoured")),
    gate("WinDSR", true, Stage::Ga, true, Effect::NoEffect("it concerns Windows' kernelspace mode")),
    gate("WinOverlay", true, Stage::Ga, true, Effect::NoEffect("it concerns Windows' kernelspace mode")),
];

/// The v1.34 spec of `name`, when it is a gate kube-proxy-rs knows.
pub fn spec(name: &str) -> Option<&'static GateSpec> {
    FEATURE_GATES.iter().find(|gate| gate.name == name)
}

/// True when `name` looks like a gate name: an ASCII letter followed by letters and digits.
pub fn is_well_formed(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic())
        && bytes.all(|b| b.is_ascii_alphanumeric())
}

/// Whether `gate` is on in `cfg`, as component-base decides it: an explicit
/// value wins; otherwise `AllAlpha`/`AllBeta` set the unset alpha/beta gates;
/// otherwise the v1.34 default. An unknown gate is off.
pub fn enabled(cfg: &KubeProxyConfiguration, gate: &str) -> bool {
    if let Some(value) = cfg.feature_gates.get(gate) {
        return *value;
    }
    let Some(spec) = spec(gate) else {
        return false;
    };
    let all = match spec.stage {
        Stage::Alpha if gate != ALL_ALPHA => cfg.feature_gates.get(ALL_ALPHA),
        Stage::Beta if gate != ALL_BETA => cfg.feature_gates.get(ALL_BETA),
        _ => None,
    };
    all.copied().unwrap_or(spec.default)
}

/// Upstream's error for each gate set to a value other than its locked
/// default: `(gate, message)`, in name order.
pub fn locked_gate_errors(cfg: &KubeProxyConfiguration) -> Vec<(String, String)> {
    cfg.feature_gates
        .iter()
        .filter_map(|(name, value)| {
            let spec = spec(name)?;
            (spec.locked && spec.default != *value).then(|| {
                let message = format!(
                    "cannot set feature gate {name} to {value}, feature is locked to {}",
                    spec.default
                );
                (name.clone(), message)
            })
        })
        .collect()
}

/// One warning per explicitly set gate that deserves one: names this build
/// does not know, GA and deprecated gates (upstream's own warning), and
/// gates that have no effect in kube-proxy-rs. Malformed names and locked
/// gates set to the wrong value are validation errors instead.
pub fn feature_gate_warnings(cfg: &KubeProxyConfiguration) -> Vec<String> {
    let mut warnings = Vec::new();
    for (name, value) in cfg.feature_gates.iter().filter(|(n, _)| is_well_formed(n)) {
        let Some(spec) = spec(name) else {
            warnings.push(format!(
                "feature gate {name:?} is not a kube-proxy feature gate of Kubernetes v1.34 known to kube-proxy-rs; it has no effect (upstream kube-proxy v1.34 rejects names it does not know)"
            ));
            continue;
        };
        if spec.locked && spec.default != *value {
            continue;
        }
        match spec.stage {
            Stage::Ga => warnings.push(format!(
                "Setting GA feature gate {name}={value}. It will be removed in a future release."
            )),
            Stage::Deprecated => warnings.push(format!(
                "Setting deprecated feature gate {name}={value}. It will be removed in a future release."
            )),
            Stage::Alpha | Stage::Beta => {}
        }
        if let Effect::NoEffect(why) = spec.effect {
            warnings.push(format!(
                "feature gate {name} has no effect in kube-proxy-rs: {why}"
            ));
        }
    }
    warnings
}
