//! `--write-config-to` output: compared byte for byte with a golden file and
//! loaded back unchanged.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use kp_config::{load_file, load_str, to_yaml, write_file, KubeProxyConfiguration};
use pretty_assertions::assert_eq;

fn golden_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/defaults.yaml")
}

#[test]
fn defaults_serialize_exactly_as_the_golden_file() {
    let yaml = to_yaml(&KubeProxyConfiguration::defaulted()).unwrap();
    kp_testkit::golden::assert_golden(&golden_path(), &yaml);
}

#[test]
fn written_defaults_load_back_identical_and_without_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    let original = KubeProxyConfiguration::defaulted();

    write_file(&original, &path).unwrap();
    let (loaded, warnings) = load_file(&path).unwrap();

    assert_eq!(loaded, original);
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[test]
fn a_customised_configuration_round_trips() {
    let mut original = KubeProxyConfiguration::defaulted();
    original.mode = "ipvs".into();
    original
        .feature_gates
        .insert("LoggingAlphaOptions".into(), true);
    original.ipvs.exclude_cidrs = Some(vec!["10.96.0.0/16".into(), "fd00:10:96::/112".into()]);
    original.ipvs.scheduler = "wrr".into();
    original.node_port_addresses = Some(vec!["192.168.99.0/24".into()]);
    original.client_connection.qps = 7.5;
    original.logging.vmodule = vec![kp_config::VModuleItem {
        file_pattern: "proxier*".into(),
        verbosity: 4,
    }];
    original.logging.options.json.split_stream = true;
    original.hostname_override = "true".into();
    original.healthz_bind_address = "[::]:10256".into();
    original.conntrack.udp_timeout = kp_config::GoDuration::from_millis(1500);
    original.udp_idle_timeout = kp_config::GoDuration::from_secs(2);

    let yaml = to_yaml(&original).unwrap();
    let (loaded, warnings) = load_str(&yaml, "roundtrip").unwrap();

    assert_eq!(loaded, original, "yaml was:\n{yaml}");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(yaml.contains("hostnameOverride: \"true\"\n"), "{yaml}");
    assert!(
        yaml.contains("excludeCIDRs:\n  - 10.96.0.0/16\n  - fd00:10:96::/112\n"),
        "{yaml}"
    );
    assert!(
        yaml.contains("vmodule:\n  - filePattern: proxier*\n    verbosity: 4\n"),
        "{yaml}"
    );
    assert!(yaml.contains("  qps: 7.5\n"), "{yaml}");
    assert!(yaml.contains("\nudpIdleTimeout: 2s\n"), "{yaml}");
}

#[test]
fn the_default_udp_idle_timeout_is_left_out_and_loads_back() {
    // Upstream's v1alpha1 lost udpIdleTimeout with its userspace mode, so a
    // default configuration is written without it (the golden file above),
    // and upstream up to v1.25, which wrote it, is read without a warning.
    let yaml = to_yaml(&KubeProxyConfiguration::defaulted()).unwrap();
    assert!(!yaml.contains("udpIdleTimeout"), "{yaml}");
    let (loaded, warnings) = load_str(&yaml, "defaults").unwrap();
    assert_eq!(
        loaded.udp_idle_timeout,
        kp_config::GoDuration::from_millis(250)
    );
    assert!(warnings.is_empty(), "{warnings:?}");

    let old = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nudpIdleTimeout: 250ms\n";
    let (loaded, warnings) = load_str(old, "v1.25").unwrap();
    assert_eq!(loaded, KubeProxyConfiguration::defaulted());
    assert!(warnings.is_empty(), "{warnings:?}");
}
