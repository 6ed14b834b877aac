//! Feature gates: upstream v1.34's locks, defaults and warnings.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kp_config::*;
use pretty_assertions::assert_eq;

fn with_gates(gates: &[(&str, bool)]) -> KubeProxyConfiguration {
    let mut c = KubeProxyConfiguration::defaulted();
    for (name, value) in gates {
        c.feature_gates.insert((*name).to_owned(), *value);
    }
    c
}

#[test]
fn a_locked_gate_set_against_its_lock_is_rejected_with_upstreams_message() {
    let c = with_gates(&[("NFTablesProxyMode", false), ("TopologyAwareHints", false)]);
    assert_eq!(
        validate(&c).unwrap_err().messages(),
        vec![
            "featureGates[NFTablesProxyMode]: Invalid value: false: cannot set feature gate NFTablesProxyMode to false, feature is locked to true",
            "featureGates[TopologyAwareHints]: Invalid value: false: cannot set feature gate TopologyAwareHints to false, feature is locked to true",
        ]
    );
}

#[test]
fn every_locked_gate_accepts_its_locked_value_and_rejects_the_other() {
    for spec in FEATURE_GATES.iter().filter(|g| g.locked) {
        validate(&with_gates(&[(spec.name, spec.default)])).unwrap();
        let errors = validate(&with_gates(&[(spec.name, !spec.default)])).unwrap_err();
        assert_eq!(errors.0.len(), 1, "{}", spec.name);
        assert!(
            errors.0[0].detail.contains("feature is locked to"),
            "{errors}"
        );
    }
}

#[test]
fn a_locked_gate_rejected_on_the_command_line_too() {
    let (flags, matches) = parse_args([
        "kube-proxy",
        "--feature-gates=ServiceTrafficDistribution=false",
    ])
    .unwrap();
    let error = resolve(&flags, &matches).unwrap_err().to_string();
    assert!(
        error.contains("cannot set feature gate ServiceTrafficDistribution to false, feature is locked to true"),
        "{error}"
    );
}

#[test]
fn ga_gates_set_to_their_value_warn_as_upstream_does() {
    let c = with_gates(&[("NFTablesProxyMode", true)]);
    validate(&c).unwrap();
    assert_eq!(
        feature_gate_warnings(&c),
        vec!["Setting GA feature gate NFTablesProxyMode=true. It will be removed in a future release."]
    );
}

#[test]
fn gates_without_effect_here_warn_once_each_and_honoured_ones_stay_quiet() {
    let c = with_gates(&[
        ("ContextualLogging", false),
        ("StrictIPCIDRValidation", true),
        (PREFER_SAME_TRAFFIC_DISTRIBUTION, false),
        (LOGGING_ALPHA_OPTIONS, true),
    ]);
    assert_eq!(
        feature_gate_warnings(&c),
        vec![
            "feature gate ContextualLogging has no effect in kube-proxy-rs: it concerns Go's contextual loggers; kube-proxy-rs logs through tracing",
            "feature gate StrictIPCIDRValidation has no effect in kube-proxy-rs: it concerns the API server's validation of objects",
        ]
    );
}

#[test]
fn gates_of_other_releases_are_unknown_warnings_not_errors() {
    // Removed in 1.33, and added after 1.34.
    let c = with_gates(&[
        ("KubeProxyDrainingTerminatingNodes", true),
        ("NFTablesNetlink", true),
    ]);
    validate(&c).unwrap();
    let warnings = feature_gate_warnings(&c);
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings[0].starts_with("feature gate \"KubeProxyDrainingTerminatingNodes\" is not a kube-proxy feature gate of Kubernetes v1.34"));
    assert!(warnings[1].contains("upstream kube-proxy v1.34 rejects names it does not know"));
}

#[test]
fn defaults_are_those_of_v1_34() {
    let c = KubeProxyConfiguration::defaulted();
    assert!(feature_enabled(&c, PREFER_SAME_TRAFFIC_DISTRIBUTION));
    assert!(feature_enabled(&c, LOGGING_BETA_OPTIONS));
    assert!(!feature_enabled(&c, LOGGING_ALPHA_OPTIONS));
    assert!(feature_enabled(&c, "TopologyAwareHints"));
    assert!(!feature_enabled(&c, "NoSuchGate"));
    let stage = |name| feature_gate(name).unwrap().stage;
    assert_eq!(
        stage(PREFER_SAME_TRAFFIC_DISTRIBUTION),
        FeatureGateStage::Beta
    );
    assert_eq!(stage("ServiceTrafficDistribution"), FeatureGateStage::Ga);
}

#[test]
fn all_alpha_and_all_beta_set_only_the_unset_gates_of_their_stage() {
    let c = with_gates(&[(ALL_ALPHA, true)]);
    assert!(feature_enabled(&c, LOGGING_ALPHA_OPTIONS));
    assert!(feature_enabled(&c, "StrictIPCIDRValidation"));

    let c = with_gates(&[(ALL_ALPHA, true), (LOGGING_ALPHA_OPTIONS, false)]);
    assert!(!feature_enabled(&c, LOGGING_ALPHA_OPTIONS));

    let c = with_gates(&[(ALL_BETA, false)]);
    assert!(!feature_enabled(&c, PREFER_SAME_TRAFFIC_DISTRIBUTION));
    assert!(!feature_enabled(&c, LOGGING_BETA_OPTIONS));
    assert!(
        feature_enabled(&c, "TopologyAwareHints"),
        "GA gates are not beta"
    );
}

#[test]
fn json_logs_need_logging_beta_options() {
    let mut c = with_gates(&[(LOGGING_BETA_OPTIONS, false)]);
    c.logging.format = "json".into();
    assert_eq!(
        validate(&c).unwrap_err().messages(),
        vec!["logging.format: Forbidden: Log format json is disabled, see LoggingBetaOptions feature"]
    );
    c.feature_gates.clear();
    validate(&c).unwrap();
}

#[test]
fn all_alpha_unlocks_the_logging_alpha_options() {
    let mut c = with_gates(&[(ALL_ALPHA, true)]);
    c.logging.options.text.split_stream = true;
    validate(&c).unwrap();
}
