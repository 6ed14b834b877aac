//! Loading files: YAML and JSON, strict with a lenient fallback, clear errors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kp_config::*;
use pretty_assertions::assert_eq;

const HEADER: &str = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";

fn load_yaml(body: &str) -> Result<Loaded, ConfigError> {
    load_str(&format!("{HEADER}{body}"), "test.yaml")
}

#[test]
fn yaml_fields_are_read_and_missing_ones_defaulted() {
    let (c, warnings) = load_yaml(
        "mode: nftables\nclusterCIDR: 10.244.0.0/16\nnftables:\n  masqueradeAll: true\n  syncPeriod: 2h22m\nconntrack:\n  tcpBeLiberal: true\n",
    )
    .unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(c.mode, "nftables");
    assert_eq!(c.cluster_cidr, "10.244.0.0/16");
    assert!(c.nftables.masquerade_all);
    assert_eq!(c.nftables.sync_period.to_string(), "2h22m0s");
    assert_eq!(c.nftables.min_sync_period.to_string(), "1s");
    assert!(c.conntrack.tcp_be_liberal);
    assert_eq!(c.conntrack.min, Some(131072));
    assert_eq!(c.healthz_bind_address, "0.0.0.0:10256");
}

#[test]
fn json_loads_too() {
    let text = r#"{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration",
        "mode":"ipvs","ipvs":{"scheduler":"lc","excludeCIDRs":["10.96.0.0/16"]},
        "featureGates":{"LoggingAlphaOptions":true},"logging":{"flushFrequency":1000000000}}"#;
    let (c, warnings) = load_str(text, "test.json").unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(c.mode, "ipvs");
    assert_eq!(c.ipvs.scheduler, "lc");
    assert_eq!(c.ipvs.exclude_cidrs, Some(vec!["10.96.0.0/16".to_string()]));
    assert_eq!(c.feature_gates.get("LoggingAlphaOptions"), Some(&true));
    assert_eq!(c.logging.flush_frequency.duration, GoDuration::from_secs(1));
    assert!(
        !c.logging.flush_frequency.serialize_as_string,
        "integer form is kept"
    );
}

#[test]
fn unknown_fields_warn_and_still_load() {
    let (c, warnings) =
        load_yaml("mode: ipvs\nfrobnicate: true\nipvs:\n  scheduler: rr\n  turbo: 3\n").unwrap();
    assert_eq!(c.mode, "ipvs");
    assert_eq!(
        warnings,
        vec!["test.yaml: strict decoding failed, loaded leniently: unknown field \"frobnicate\", unknown field \"ipvs.turbo\""]
    );
}

#[test]
fn duplicate_fields_warn_and_the_last_wins() {
    let (c, warnings) = load_yaml("mode: ipvs\nmode: nftables\n").unwrap();
    assert_eq!(c.mode, "nftables");
    assert_eq!(
        warnings,
        vec!["test.yaml: strict decoding failed, loaded leniently: duplicate field \"mode\""]
    );

    let json = r#"{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration","iptables":{"masqueradeBit":1,"masqueradeBit":2}}"#;
    let (c, warnings) = load_str(json, "dup.json").unwrap();
    assert_eq!(c.iptables.masquerade_bit, Some(2));
    assert_eq!(warnings, vec!["dup.json: strict decoding failed, loaded leniently: duplicate field \"iptables.masqueradeBit\""]);
}

#[test]
fn free_form_maps_are_not_unknown_fields() {
    let (_, warnings) = load_yaml("featureGates:\n  SomeGate: true\nlogging:\n  vmodule:\n  - filePattern: x\n    verbosity: 3\n").unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[test]
fn wrong_kind_or_version_fails_naming_what_is_expected() {
    let err = load_str(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n",
        "kubelet.yaml",
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "kubelet.yaml: apiVersion \"kubelet.config.k8s.io/v1beta1\" and kind \"KubeletConfiguration\" are not supported; expected apiVersion \"kubeproxy.config.k8s.io/v1alpha1\" and kind \"KubeProxyConfiguration\""
    );
    assert!(matches!(
        load_str("mode: ipvs\n", "x.yaml"),
        Err(ConfigError::WrongType { .. })
    ));
    assert!(matches!(
        load_str("", "empty.yaml"),
        Err(ConfigError::WrongType { .. })
    ));
}

#[test]
fn a_value_of_the_wrong_type_names_the_field() {
    let err = load_yaml("iptables:\n  masqueradeBit: lots\n").unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("test.yaml: field iptables.masqueradeBit: invalid type: string \"lots\""),
        "{text}"
    );

    let err = load_yaml("conntrack:\n  tcpCloseWaitTimeout: 1 hour\n").unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("field conntrack.tcpCloseWaitTimeout: invalid duration \"1 hour\""),
        "{text}"
    );
}

#[test]
fn syntax_errors_and_non_objects_are_errors() {
    assert!(matches!(
        load_str("mode: [unclosed\n", "bad.yaml"),
        Err(ConfigError::Syntax { .. })
    ));
    assert!(matches!(
        load_str("{\"mode\": ", "bad.json"),
        Err(ConfigError::Syntax { .. })
    ));
    assert!(matches!(
        load_str("- a\n- b\n", "list.yaml"),
        Err(ConfigError::NotAnObject { .. })
    ));
}

#[test]
fn a_missing_file_names_the_path() {
    let err = load_file("/nonexistent/kube-proxy.yaml").unwrap_err();
    assert_eq!(
        err.to_string(),
        "reading configuration file /nonexistent/kube-proxy.yaml"
    );
}

#[test]
fn null_values_mean_unset() {
    let (c, warnings) =
        load_yaml("oomScoreAdj: null\nnodePortAddresses: null\niptables:\n  syncPeriod: null\n")
            .unwrap();
    assert!(warnings.is_empty());
    assert_eq!(c.oom_score_adj, Some(-999));
    assert_eq!(c.node_port_addresses, None);
    assert_eq!(c.iptables.sync_period.to_string(), "30s");
}
