//! Stories of what the API server's allocators and ClusterIP checks would
//! refuse: the Service first in path order keeps the value, later ones are
//! rejected with the API server's message naming both.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{write, Recorder, NODE_NAME};
use kp_source::{LoadReport, ManifestSource};

fn service(name: &str, spec: &str) -> String {
    format!("apiVersion: v1\nkind: Service\nmetadata: {{namespace: demo, name: {name}}}\nspec: {spec}\n")
}

/// Loads the files; returns the delivered events and the rejections.
fn load(files: &[(&str, &str)]) -> (Vec<String>, Vec<String>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        write(dir.path(), name, text);
    }
    let recorder = Recorder::default();
    let report: LoadReport = ManifestSource::new(dir.path(), NODE_NAME)
        .load(&recorder)
        .unwrap();
    let events = recorder
        .lines()
        .into_iter()
        .filter(|line| !line.starts_with("synced"))
        .collect();
    let rejected = report.rejected().map(ToString::to_string).collect();
    (events, rejected, dir)
}

#[test]
fn the_first_service_in_path_order_keeps_its_node_port() {
    let first = service(
        "web",
        "{type: NodePort, clusterIP: 10.96.0.10, ports: [{port: 80, nodePort: 30080}]}",
    );
    let second = service("api", "{type: NodePort, clusterIP: 10.96.0.11, ports: [{port: 80, protocol: UDP, nodePort: 30080}]}");

    let (events, rejected, dir) = load(&[("b.yaml", &first), ("a.yaml", &second)]);

    assert_eq!(events, ["apply Service demo/api"]);
    let (a, b) = (dir.path().join("a.yaml"), dir.path().join("b.yaml"));
    assert_eq!(
        rejected,
        [format!(
            "{}:1 (document 0): Service demo/web: spec.ports[0].nodePort: Invalid value: 30080: provided port is already allocated (held by Service demo/api at {}:1 (document 0))",
            b.display(),
            a.display()
        )]
    );
}

#[test]
fn one_service_may_use_a_node_port_for_tcp_and_udp() {
    let dns = service("dns", "{type: NodePort, clusterIP: 10.96.0.10, ports: [{name: a, port: 53, nodePort: 30053}, {name: b, port: 53, protocol: UDP, nodePort: 30053}]}");
    let (events, rejected, _dir) = load(&[("dns.yaml", &dns)]);
    assert_eq!((events.len(), rejected.len()), (1, 0), "{rejected:?}");
}

#[test]
fn a_health_check_node_port_shares_the_node_port_range() {
    let web = service(
        "web",
        "{type: NodePort, clusterIP: 10.96.0.10, ports: [{port: 80, nodePort: 30080}]}",
    );
    let lb = service("lb", "{type: LoadBalancer, clusterIP: 10.96.0.11, externalTrafficPolicy: Local, healthCheckNodePort: 30080, ports: [{port: 80, nodePort: 30081}]}");
    let (events, rejected, _dir) = load(&[("a.yaml", &web), ("b.yaml", &lb)]);
    assert_eq!(events, ["apply Service demo/web"]);
    assert!(
        rejected[0].contains("Service demo/lb: spec.healthCheckNodePort: Internal error occurred: failed to allocate requested HealthCheck NodePort 30080: provided port is already allocated (held by Service demo/web at "),
        "{rejected:?}"
    );
}

#[test]
fn two_services_cannot_share_a_cluster_ip() {
    let web = service("web", "{clusterIP: 10.96.0.10, ports: [{port: 80}]}");
    let api = service(
        "api",
        "{clusterIP: 10.96.0.10, clusterIPs: [10.96.0.10], ports: [{port: 80}]}",
    );
    let (events, rejected, _dir) = load(&[("all.yaml", &format!("{web}---\n{api}"))]);
    assert_eq!(events, ["apply Service demo/web"]);
    assert!(
        rejected[0].contains(":6 (document 1): Service demo/api: spec.clusterIPs: Invalid value: []string{\"10.96.0.10\"}: failed to allocate IP 10.96.0.10: provided IP is already allocated (held by Service demo/web at "),
        "{rejected:?}"
    );
}

#[test]
fn cluster_ips_are_checked_as_the_api_server_does() {
    let cases = [
        ("{clusterIP: 0.0.0.0, ports: [{port: 80}]}", "spec.clusterIPs: Invalid value: []string{\"0.0.0.0\"}: failed to allocate IP 0.0.0.0: provided IP 0.0.0.0 is not in the valid range"),
        ("{clusterIP: \"::\", ports: [{port: 80}]}", "spec.clusterIPs: Invalid value: []string{\"::\"}: failed to allocate IP ::: provided IP :: is not in the valid range"),
        ("{clusterIP: 10.96.0.10, clusterIPs: [10.96.0.10, 10.96.0.11], ports: [{port: 80}]}", "spec.clusterIPs: Invalid value: []string{\"10.96.0.10\", \"10.96.0.11\"}: may specify no more than one IP for each IP family"),
        ("{clusterIP: 10.96.0.10, clusterIPs: [10.96.0.11], ports: [{port: 80}]}", "spec.clusterIPs: Invalid value: []string{\"10.96.0.11\"}: first value must match `clusterIP`"),
    ];
    for (spec, expected) in cases {
        let (events, rejected, _dir) = load(&[("web.yaml", &service("web", spec))]);
        assert_eq!(events, Vec::<String>::new(), "{spec}");
        assert_eq!(rejected.len(), 1, "{rejected:?}");
        assert!(
            rejected[0].ends_with(&format!("Service demo/web: {expected}")),
            "{rejected:?}"
        );
    }
}
