//! Stories of one or more loads of a manifest directory: what reaches the
//! handler, and what does not.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{synced_lines, write, yaml, Recorder, NODE_NAME};
use kp_model::ObjectEvent;
use kp_source::{ManifestSource, SourceError};
use kp_testkit::{endpoint_slice, node, service};

const WEB: &str = "\
apiVersion: v1
kind: Service
metadata: {namespace: demo, name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
";

const SHOP: &str = "\
apiVersion: v1
kind: Service
metadata: {namespace: demo, name: shop}
spec:
  clusterIP: 10.96.0.20
  ports: [{name: https, port: 443}]
";

const WEB_SLICE: &str = "\
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: demo
  name: web-abc
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
  - addresses: [10.244.1.11]
";

fn lines(expected: &[&str]) -> Vec<String> {
    expected.iter().map(|line| line.to_string()).collect()
}

fn with_synced(mut expected: Vec<String>) -> Vec<String> {
    expected.extend(synced_lines());
    expected
}

#[test]
fn a_directory_of_services_slices_and_nodes_loads() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "services.yaml", &format!("{WEB}---\n{SHOP}"));
    write(dir.path(), "slices/web.yml", WEB_SLICE);
    let nodes = yaml(&[
        &node(NODE_NAME, |n| n.zone("zone-a")),
        &node("node-2", |n| n),
    ]);
    write(dir.path(), "nodes.yaml", &nodes);
    let recorder = Recorder::default();

    let report = ManifestSource::new(dir.path(), NODE_NAME)
        .load(&recorder)
        .unwrap();

    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!((report.files, report.objects, report.applied), (3, 4, 4));
    // Only the proxy's own Node is delivered; Services come before slices.
    assert_eq!(
        recorder.lines(),
        with_synced(lines(&[
            "apply Service demo/shop",
            "apply Service demo/web",
            "apply EndpointSlice demo/web-abc",
            "apply Node node-1",
        ]))
    );
}

#[test]
fn json_files_and_lists_load() {
    let dir = tempfile::tempdir().unwrap();
    let api = service("demo", "api", |s| {
        s.cluster_ip("10.96.0.30").port("http", 80, "TCP")
    });
    write(
        dir.path(),
        "api.json",
        &serde_json::to_string_pretty(&api).unwrap(),
    );
    write(
        dir.path(),
        "list.yaml",
        &format!(
            "apiVersion: v1\nkind: List\nitems:\n{}{}",
            indent_as_item(WEB),
            indent_as_item(WEB_SLICE)
        ),
    );
    // Typed lists, as `kubectl get services -o yaml` prints them, may leave
    // apiVersion and kind out of their items.
    write(
        dir.path(),
        "shop-list.yaml",
        "apiVersion: v1\nkind: ServiceList\nitems:\n- metadata: {namespace: demo, name: shop}\n  spec: {clusterIP: 10.96.0.20, ports: [{port: 443}]}\n",
    );
    let recorder = Recorder::default();

    let report = ManifestSource::new(dir.path(), NODE_NAME)
        .load(&recorder)
        .unwrap();

    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(
        recorder.lines(),
        with_synced(lines(&[
            "apply Service demo/api",
            "apply Service demo/shop",
            "apply Service demo/web",
            "apply EndpointSlice demo/web-abc",
        ]))
    );
    let ObjectEvent::Apply(delivered_api) = &recorder.recorded().services[0] else {
        panic!("expected an Apply");
    };
    assert_eq!(
        delivered_api, &api,
        "a JSON object arrives as it was written"
    );
}

#[test]
fn a_second_load_sends_only_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "web.yaml", &format!("{WEB}---\n{WEB_SLICE}"));
    write(dir.path(), "shop.yaml", SHOP);
    let recorder = Recorder::default();
    let mut source = ManifestSource::new(dir.path(), NODE_NAME);
    source.load(&recorder).unwrap();
    recorder.take_lines();

    // When web's port changes, shop.yaml goes away and api.yaml appears…
    write(
        dir.path(),
        "web.yaml",
        &format!("{}---\n{WEB_SLICE}", WEB.replace("port: 80,", "port: 81,")),
    );
    std::fs::remove_file(dir.path().join("shop.yaml")).unwrap();
    write(dir.path(), "api.yaml", &SHOP.replace("shop", "api"));
    let report = source.load(&recorder).unwrap();

    // …only those three changes are sent, and the slice is not re-sent.
    assert_eq!(
        recorder.lines(),
        lines(&[
            "apply Service demo/api",
            "apply Service demo/web",
            "delete Service demo/shop"
        ])
    );
    assert_eq!((report.applied, report.deleted, report.objects), (2, 1, 3));
    let recorded = recorder.recorded();
    let ObjectEvent::Delete(shop) = recorded.services.last().unwrap() else {
        panic!("expected a Delete");
    };
    assert_eq!(
        shop.spec.as_ref().unwrap().cluster_ip.as_deref(),
        Some("10.96.0.20")
    );

    // A load without changes sends nothing at all.
    source.load(&recorder).unwrap();
    assert_eq!(recorder.lines().len(), 3);
}

#[test]
fn synced_is_reported_once_per_kind_even_for_an_empty_directory() {
    let dir = tempfile::tempdir().unwrap();
    let recorder = Recorder::default();
    let mut source = ManifestSource::new(dir.path(), NODE_NAME);

    source.load(&recorder).unwrap();
    write(dir.path(), "web.yaml", WEB);
    source.load(&recorder).unwrap();
    source.load(&recorder).unwrap();

    assert_eq!(
        recorder.lines(),
        with_synced(Vec::new())
            .into_iter()
            .chain(lines(&["apply Service demo/web"]))
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_missing_path_is_fatal_at_start_and_empty_later() {
    let recorder = Recorder::default();
    let missing = ManifestSource::new("/nonexistent/manifests", NODE_NAME).load(&recorder);
    assert!(matches!(missing, Err(SourceError::PathNotFound { .. })));
    assert_eq!(
        missing.unwrap_err().to_string(),
        "manifest path /nonexistent/manifests does not exist (expected a YAML/JSON file or a directory of them)"
    );
    assert!(
        recorder.lines().is_empty(),
        "nothing is synced after a failed start"
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("web.yaml");
    write(dir.path(), "web.yaml", WEB);
    let mut source = ManifestSource::new(&path, NODE_NAME);
    source.load(&recorder).unwrap();
    std::fs::remove_file(&path).unwrap();
    let report = source.load(&recorder).unwrap();

    assert_eq!(report.deleted, 1);
    assert_eq!(recorder.lines().last().unwrap(), "delete Service demo/web");
}

#[test]
fn of_two_definitions_the_later_wins_with_a_warning_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", WEB);
    write(
        dir.path(),
        "b/web.yaml",
        &format!("{SHOP}---\n{}", WEB.replace("10.96.0.10", "10.96.0.11")),
    );
    let recorder = Recorder::default();

    let report = ManifestSource::new(dir.path(), NODE_NAME)
        .load(&recorder)
        .unwrap();

    let web = &recorder.recorded().services[1];
    let ObjectEvent::Apply(web) = web else {
        panic!("expected an Apply")
    };
    assert_eq!(
        web.spec.as_ref().unwrap().cluster_ip.as_deref(),
        Some("10.96.0.11")
    );
    let warnings: Vec<String> = report.warnings().map(ToString::to_string).collect();
    let (a, b) = (dir.path().join("a.yaml"), dir.path().join("b/web.yaml"));
    assert_eq!(
        warnings,
        vec![format!(
            "{}:8 (document 1): Service demo/web: also defined at {}:1 (document 0); this later definition is used",
            b.display(),
            a.display()
        )]
    );
    assert_eq!(report.rejected().count(), 0);
}

#[test]
fn hidden_editor_and_other_files_are_not_read() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        ".#web.yaml",
        "web.yaml~",
        ".web.yaml.swp",
        ".hidden/web.yaml",
        "notes.txt",
    ] {
        write(dir.path(), name, WEB);
    }
    let recorder = Recorder::default();

    let report = ManifestSource::new(dir.path(), NODE_NAME)
        .load(&recorder)
        .unwrap();

    assert_eq!((report.files, report.objects), (0, 0));
    assert_eq!(recorder.lines(), synced_lines());
}

#[test]
fn objects_without_a_namespace_land_in_default() {
    let dir = tempfile::tempdir().unwrap();
    let web = WEB.replace("namespace: demo, ", "");
    let slice = yaml(&[&endpoint_slice("", "web-abc", "web", |e| {
        e.port("http", 8080, "TCP")
    })]);
    write(dir.path(), "web.yaml", &format!("{web}---\n{slice}"));
    let recorder = Recorder::default();

    let report = ManifestSource::new(dir.path(), NODE_NAME)
        .load(&recorder)
        .unwrap();

    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(
        recorder.lines(),
        with_synced(lines(&[
            "apply Service default/web",
            "apply EndpointSlice default/web-abc"
        ]))
    );
}

#[test]
fn the_shipped_examples_load_without_problems() {
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let recorder = Recorder::default();

    let report = ManifestSource::new(&examples, NODE_NAME)
        .load(&recorder)
        .unwrap();

    let problems: Vec<String> = report.errors.iter().map(ToString::to_string).collect();
    assert_eq!(problems, Vec::<String>::new());
    assert!(report.objects > 0);
}

/// Turns a manifest into an item of a YAML list.
fn indent_as_item(manifest: &str) -> String {
    manifest
        .lines()
        .enumerate()
        .map(|(i, line)| {
            if i == 0 {
                format!("- {line}\n")
            } else {
                format!("  {line}\n")
            }
        })
        .collect()
}
