//! The whole pipeline without a kernel: the manifest source feeds the shared
//! sync loop, which hands a categorized view to a recording backend. The
//! example cluster in `examples/` is the input.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kp_model::{IpFamily, NodeInfo, ProxyEventHandler};
use kp_source::ManifestSource;
use kp_sync::testing::FakeBackend;
use kp_sync::{FanOutHandler, Proxier, ProxierConfig, RunnerConfig};

const NODE: &str = "node-1";

fn proxier(family: IpFamily, backend: &FakeBackend) -> Arc<Proxier> {
    let config = ProxierConfig {
        family,
        node: NodeInfo {
            name: NODE.to_owned(),
            ..NodeInfo::default()
        },
        runner: RunnerConfig {
            min_interval: Duration::ZERO,
            max_interval: Duration::from_secs(30),
            retry_interval: Duration::from_secs(1),
        },
    };
    Arc::new(Proxier::new(config, Box::new(backend.clone())))
}

fn copy_examples(to: &Path) {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    for entry in fs::read_dir(examples).unwrap() {
        let entry = entry.unwrap();
        fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

#[test]
fn the_example_cluster_reaches_the_backend_categorized() {
    let (v4, v6) = (FakeBackend::new(), FakeBackend::new());
    let proxiers = [proxier(IpFamily::V4, &v4), proxier(IpFamily::V6, &v6)];
    let handler = FanOutHandler::new(
        proxiers
            .iter()
            .map(|p| Arc::clone(p) as Arc<dyn ProxyEventHandler>)
            .collect(),
    );
    let dir = tempfile::tempdir().unwrap();
    copy_examples(dir.path());
    let mut source = ManifestSource::new(dir.path(), NODE);
    let report = source.load(&handler).unwrap();
    assert!(
        report.errors.is_empty(),
        "the examples are valid: {:?}",
        report.errors
    );

    proxiers[0].sync_once().unwrap();
    let sync = v4.take_single_request();
    assert!(sync.full, "the first sync is full");
    assert_eq!(
        sync.service_port_names(),
        [
            "demo/api-local:http",
            "demo/draining:http",
            "demo/empty:http",
            "demo/legacy",
            "demo/multi:http",
            "demo/multi:metrics",
            "demo/shop:https",
            "demo/sticky:http",
            "demo/web:http",
            "demo/web-nodeport:http",
            "kube-system/dns:dns",
        ]
    );
    let by_name = |wanted: &str| {
        sync.service_ports
            .iter()
            .find(|(name, _)| name.to_string() == wanted)
            .map(|(_, state)| state.clone())
            .unwrap()
    };
    let web = by_name("demo/web:http");
    assert_eq!(web.endpoints.cluster.len(), 3, "three ready backends");
    assert_eq!(
        web.endpoints.cluster.iter().filter(|e| e.is_local).count(),
        2,
        "two of them on node-1"
    );
    let draining = by_name("demo/draining:http");
    assert_eq!(
        draining.endpoints.cluster.len(),
        1,
        "a serving, terminating endpoint is used when no ready one exists"
    );
    assert!(draining.endpoints.cluster[0].terminating);
    let empty = by_name("demo/empty:http");
    assert!(empty.endpoints.all_reachable.is_empty());
    assert!(!empty.endpoints.has_any_endpoints);
    let api_local = by_name("demo/api-local:http");
    assert_eq!(
        api_local.endpoints.local.len(),
        1,
        "eTP Local uses node-1's endpoint"
    );
    assert_eq!(api_local.port.health_check_node_port, Some(30500));

    proxiers[1].sync_once().unwrap();
    let v6_sync = v6.take_single_request();
    assert!(
        v6_sync.service_ports.is_empty(),
        "the examples are IPv4 only"
    );
}

#[test]
fn editing_a_manifest_gives_a_partial_sync_of_that_service_only() {
    let backend = FakeBackend::new();
    let proxier = proxier(IpFamily::V4, &backend);
    let dir = tempfile::tempdir().unwrap();
    copy_examples(dir.path());
    let mut source = ManifestSource::new(dir.path(), NODE);
    source.load(proxier.as_ref()).unwrap();
    proxier.sync_once().unwrap();
    backend.take_requests();

    let slices = dir.path().join("endpointslices.yaml");
    let text = fs::read_to_string(&slices).unwrap();
    // Scale demo/web down: drop its remote endpoint.
    let edited = text.replacen(
        "  - addresses: [10.244.2.2]\n    conditions: {ready: true, serving: true, terminating: false}\n    nodeName: node-2\n    zone: zone-b\n",
        "",
        1,
    );
    assert_ne!(text, edited, "the edit applies");
    fs::write(&slices, edited).unwrap();
    let report = source.load(proxier.as_ref()).unwrap();
    assert_eq!(report.applied, 1, "only the edited slice is re-sent");

    proxier.sync_once().unwrap();
    let sync = backend.take_single_request();
    assert!(!sync.full);
    assert_eq!(sync.changed_service_names(), ["demo/web"]);
    let web = sync
        .service_ports
        .iter()
        .find(|(name, _)| name.to_string() == "demo/web:http")
        .map(|(_, state)| state)
        .unwrap();
    assert_eq!(web.endpoints.cluster.len(), 2);
}
