//! Stories of bad manifests: each problem is reported with the file, the
//! document, the object and the field, and everything else keeps working.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;

use common::{write, Recorder, NODE_NAME};
use kp_source::{parse_documents, ManifestSource, Severity};

const SERVICE_HEAD: &str =
    "apiVersion: v1\nkind: Service\nmetadata: {namespace: demo, name: web}\n";

/// Parses `text` as the file `m.yaml`; returns the names of the objects
/// read and the error messages.
fn parse(text: &str) -> (Vec<String>, Vec<String>) {
    parse_named("m.yaml", text)
}

fn parse_named(file: &str, text: &str) -> (Vec<String>, Vec<String>) {
    let (objects, errors) = parse_documents(Path::new(file), text);
    let names = objects.iter().map(|o| o.object.key().to_string()).collect();
    let messages = errors.iter().map(ToString::to_string).collect();
    (names, messages)
}

#[track_caller]
fn assert_single_error(text: &str, expected: &str) {
    let (objects, errors) = parse(text);
    assert_eq!(errors, vec![expected.to_owned()]);
    assert!(
        objects.is_empty(),
        "the bad document was delivered: {objects:?}"
    );
}

fn service_with_port(port: &str) -> String {
    format!("{SERVICE_HEAD}spec:\n  clusterIP: 10.96.0.10\n  ports:\n  - {port}\n")
}

#[test]
fn malformed_yaml_names_the_line_in_the_file() {
    // Line 7 opens a flow sequence that the end of the file (line 8) leaves
    // unclosed.
    let text = format!(
        "{SERVICE_HEAD}spec: {{ports: [{{port: 80}}]}}\n---\nkind: Service\nmetadata: {{name: [\n"
    );
    let (objects, errors) = parse(&text);
    assert_eq!(objects, vec!["Service demo/web"]);
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].starts_with("m.yaml:8 (document 1): malformed YAML: ")
            && errors[0].contains("at line 8 column 1"),
        "{}",
        errors[0]
    );
}

#[test]
fn malformed_json_is_reported_with_its_position() {
    let (objects, errors) = parse_named("m.json", "{\"apiVersion\": \"v1\", \"kind\": \n");
    assert!(objects.is_empty());
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].starts_with(
            "m.json:2 (document 0): malformed JSON: EOF while parsing a value at line 2"
        ),
        "{}",
        errors[0]
    );
}

#[test]
fn an_unknown_kind_is_named() {
    assert_single_error(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n",
        "m.yaml:1 (document 0): Deployment web: kind Deployment is not supported (expected Service, EndpointSlice, Node, or a List of them)",
    );
}

#[test]
fn an_empty_kind_is_a_missing_kind() {
    // `kind: |` followed by no indented line is an empty block scalar.
    assert_single_error(
        "apiVersion: v1\nkind: |\nmetadata: {name: web}\n",
        "m.yaml:1 (document 0): object web: kind is missing (expected a string such as \"Service\")",
    );
    assert_single_error(
        "apiVersion: \"\"\nkind: Service\nmetadata: {name: web}\n",
        "m.yaml:1 (document 0): Service web: apiVersion is missing (expected a string such as \"v1\")",
    );
}

#[test]
fn an_unknown_kind_that_is_not_plain_text_is_quoted() {
    assert_single_error(
        "apiVersion: v1\nkind: \" \"\nmetadata: {name: web}\n",
        "m.yaml:1 (document 0): \" \" web: kind \" \" is not supported (expected Service, EndpointSlice, Node, or a List of them)",
    );
}

#[test]
fn a_wrong_api_version_names_the_right_one() {
    assert_single_error(
        "apiVersion: discovery.k8s.io/v1beta1\nkind: EndpointSlice\nmetadata: {name: web-abc}\n",
        "m.yaml:1 (document 0): EndpointSlice web-abc: apiVersion discovery.k8s.io/v1beta1 is not valid for kind EndpointSlice (expected discovery.k8s.io/v1)",
    );
}

#[test]
fn an_invalid_endpoint_address_is_named() {
    assert_single_error(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-abc, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nendpoints:\n- addresses: [10.244.1.300]\n",
        "m.yaml:1 (document 0): EndpointSlice default/web-abc: endpoints[0].addresses[0]: \"10.244.1.300\" is not an IPv4 address, as addressType is IPv4",
    );
}

#[test]
fn an_ipv6_address_in_an_ipv4_slice_is_named() {
    assert_single_error(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-abc, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nendpoints:\n- addresses: [\"fd00:10:244::1\"]\n",
        "m.yaml:1 (document 0): EndpointSlice default/web-abc: endpoints[0].addresses[0]: \"fd00:10:244::1\" is not an IPv4 address, as addressType is IPv4",
    );
}

#[test]
fn ports_out_of_range_are_named() {
    assert_single_error(
        &service_with_port("{name: http, port: 0}"),
        "m.yaml:1 (document 0): Service demo/web: spec.ports[0].port: 0 is not a valid port (1-65535)",
    );
    assert_single_error(
        &service_with_port("{name: http, port: 70000}"),
        "m.yaml:1 (document 0): Service demo/web: spec.ports[0].port: 70000 is not a valid port (1-65535)",
    );
    assert_single_error(
        &service_with_port("{name: http, port: 80, nodePort: 70000}"),
        "m.yaml:1 (document 0): Service demo/web: spec.ports[0].nodePort: 70000 is not a valid port (1-65535)",
    );
}

#[test]
fn a_missing_port_is_a_missing_required_field() {
    assert_single_error(
        &service_with_port("{name: http, targetPort: 8080}"),
        "m.yaml:1 (document 0): Service demo/web: spec.ports[0].port: required field is missing (expected a port number 1-65535)",
    );
}

#[test]
fn a_field_of_the_wrong_type_is_named_by_its_path() {
    assert_single_error(
        &service_with_port("{name: http, port: http}"),
        "m.yaml:1 (document 0): Service demo/web: spec.ports[0].port: invalid type: string \"http\", expected i32",
    );
}

#[test]
fn a_missing_name_is_reported() {
    assert_single_error(
        "apiVersion: v1\nkind: Service\nspec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}\n",
        "m.yaml:1 (document 0): Service in namespace default (no name): metadata.name: Required value: name or generateName is required",
    );
}

#[test]
fn invalid_addresses_protocols_and_ranges_of_a_service_are_each_named() {
    let text = format!(
        "{SERVICE_HEAD}spec:\n  clusterIP: 10.96.0.999\n  externalIPs: [203.0.113.5, nope]\n  loadBalancerSourceRanges: [203.0.113.0/33]\n  ports: [{{port: 80, protocol: ICMP}}]\nstatus:\n  loadBalancer: {{ingress: [{{ip: 203.0.113.x}}]}}\n"
    );
    let (objects, errors) = parse(&text);
    assert!(objects.is_empty());
    let prefix = "m.yaml:1 (document 0): Service demo/web: ";
    assert_eq!(
        errors,
        [
            "spec.ports[0].protocol: \"ICMP\" is not valid (expected one of TCP, UDP, SCTP)",
            "spec.clusterIP: \"10.96.0.999\" is not a valid IP address",
            "spec.externalIPs[1]: \"nope\" is not a valid IP address",
            "spec.loadBalancerSourceRanges[0]: \"203.0.113.0/33\" is not a valid CIDR (expected e.g. 203.0.113.0/24)",
            "status.loadBalancer.ingress[0].ip: \"203.0.113.x\" is not a valid IP address",
        ]
        .map(|reason| format!("{prefix}{reason}"))
    );
}

#[test]
fn a_slice_without_its_service_label_is_rejected() {
    assert_single_error(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-abc}\naddressType: IPv4\nendpoints: []\n",
        "m.yaml:1 (document 0): EndpointSlice default/web-abc: metadata.labels[kubernetes.io/service-name]: required label is missing (expected the name of the EndpointSlice's Service)",
    );
}

#[test]
fn a_bad_list_item_is_located_by_its_index() {
    let text = "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Node, metadata: {name: node-1}}\n- {apiVersion: v1, kind: Service, metadata: {name: web}, spec: {ports: [{port: 0}]}}\n";
    let (objects, errors) = parse(text);
    assert_eq!(objects, vec!["Node node-1"]);
    assert_eq!(
        errors,
        vec!["m.yaml:1 (document 0, item 1): Service default/web: spec.ports[0].port: 0 is not a valid port (1-65535)"]
    );
}

#[test]
fn the_other_documents_of_a_file_still_load() {
    let good = |name: &str| format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {name}}}\n");
    let text = [
        good("node-a"),
        "apiVersion: v1\nkind: Node\nmetadata: {name: [unclosed\n".to_owned(),
        good("node-b"),
        "apiVersion: v2\nkind: Node\nmetadata: {name: node-x}\n".to_owned(),
        "# only a comment\n".to_owned(),
        good("node-c"),
    ]
    .join("---\n");
    let (objects, errors) = parse(&text);
    assert_eq!(objects, vec!["Node node-a", "Node node-b", "Node node-c"]);
    let documents: Vec<&str> = errors
        .iter()
        .map(|e| e.split(": ").next().unwrap())
        .collect();
    // Where parsing broke in document 1; where document 3 starts.
    assert_eq!(
        documents,
        ["m.yaml:8 (document 1)", "m.yaml:13 (document 3)"]
    );
}

#[test]
fn a_slice_for_an_unknown_service_is_reported_but_delivered() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "slices.yaml",
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {namespace: demo, name: ghost-abc, labels: {kubernetes.io/service-name: ghost}}\naddressType: IPv4\nendpoints: [{addresses: [10.244.1.11]}]\n",
    );
    let recorder = Recorder::default();

    let report = ManifestSource::new(dir.path(), NODE_NAME)
        .load(&recorder)
        .unwrap();

    assert_eq!(recorder.lines()[0], "apply EndpointSlice demo/ghost-abc");
    assert_eq!(report.errors.len(), 1);
    assert_eq!(report.errors[0].severity(), Severity::Warning);
    assert_eq!(
        report.errors[0].to_string(),
        format!(
            "{}:1 (document 0): EndpointSlice demo/ghost-abc: the Service demo/ghost named by label kubernetes.io/service-name is not in the manifests (the EndpointSlice is used anyway)",
            dir.path().join("slices.yaml").display()
        )
    );
}

#[test]
fn a_file_that_is_not_text_is_reported_and_the_others_load() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), [0xff, 0xfe, 0x00, 0x80]).unwrap();
    write(
        dir.path(),
        "b.yaml",
        "apiVersion: v1\nkind: Node\nmetadata: {name: node-1}\n",
    );
    let recorder = Recorder::default();

    let report = ManifestSource::new(dir.path(), NODE_NAME)
        .load(&recorder)
        .unwrap();

    let messages: Vec<String> = report.errors.iter().map(ToString::to_string).collect();
    let a = dir.path().join("a.yaml");
    assert_eq!(
        messages,
        vec![format!("{}: the file is not valid UTF-8 text", a.display())]
    );
    assert_eq!(recorder.lines()[0], "apply Node node-1");
}
