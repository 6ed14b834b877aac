//! Stories of hostile names: every name that reaches rule text is checked
//! as the API server checks it, with its messages, and only the offending
//! object is rejected.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;

use kp_source::parse_documents;

/// Names a crafted manifest might carry to break out of rule text.
const HOSTILE: &[&str] = &[
    "web\" -j ACCEPT\n-A INPUT -j ACCEPT\n#",
    "web\n-A INPUT -j ACCEPT",
    "web #",
    "web x",
    "Web",
];

const DNS1035: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_LABEL: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const SUBDOMAIN: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_VALUE: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

fn json(value: &str) -> String {
    serde_json::to_string(value).unwrap()
}

fn service(namespace: &str, name: &str, port_names: [&str; 2]) -> String {
    format!(
        r#"{{"apiVersion": "v1", "kind": "Service", "metadata": {{"namespace": {}, "name": {}}},
  "spec": {{"clusterIP": "10.96.0.41", "ports": [{{"name": {}, "port": 80}}, {{"name": {}, "port": 81}}]}}}}"#,
        json(namespace),
        json(name),
        json(port_names[0]),
        json(port_names[1])
    )
}

fn slice(name: &str, service: &str, port_name: &str) -> String {
    format!(
        r#"{{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
  "metadata": {{"namespace": "demo", "name": {}, "labels": {{"kubernetes.io/service-name": {}}}}},
  "addressType": "IPv4", "ports": [{{"name": {}, "port": 8080}}],
  "endpoints": [{{"addresses": ["10.244.1.2"]}}]}}"#,
        json(name),
        json(service),
        json(port_name)
    )
}

fn node(name: &str) -> String {
    format!(
        r#"{{"apiVersion": "v1", "kind": "Node", "metadata": {{"name": {}}}}}"#,
        json(name)
    )
}

/// Parses `document` next to a valid Service; returns the errors and
/// checks that the valid Service, and nothing else, was read.
#[track_caller]
fn rejected_next_to_a_good_service(document: &str) -> Vec<String> {
    let good = service("demo", "good", ["http", "https"]);
    let text = format!("{good}\n{document}\n");
    let (objects, errors) = parse_documents(Path::new("m.json"), &text);
    let names: Vec<String> = objects.iter().map(|o| o.object.key().to_string()).collect();
    assert_eq!(
        names,
        ["Service demo/good"],
        "only the good Service is read"
    );
    errors.iter().map(ToString::to_string).collect()
}

#[track_caller]
fn assert_names_field(errors: &[String], field: &str, value: &str, message: &str) {
    let expected = format!(
        "{field}: Invalid value: {}: {message}",
        format!("{value:?}").chars().take(102).collect::<String>()
    );
    assert!(
        errors.iter().any(|error| error.contains(&expected)),
        "expected an error with {expected:?} in {errors:#?}"
    );
    for error in errors {
        assert!(!error.contains('\n'), "a message spans lines: {error:?}");
    }
}

#[test]
fn hostile_service_names_are_rejected_with_the_api_servers_message() {
    for name in HOSTILE {
        let errors = rejected_next_to_a_good_service(&service("demo", name, ["http", "https"]));
        assert_names_field(&errors, "metadata.name", name, DNS1035);
    }
    let long = "a".repeat(64);
    let errors = rejected_next_to_a_good_service(&service("demo", &long, ["http", "https"]));
    assert!(
        errors.iter().any(|e| e.ends_with("metadata.name: Invalid value: \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\": must be no more than 63 characters")),
        "{errors:#?}"
    );
}

#[test]
fn hostile_namespaces_are_rejected() {
    for namespace in HOSTILE {
        let errors = rejected_next_to_a_good_service(&service(namespace, "web", ["http", "https"]));
        assert_names_field(&errors, "metadata.namespace", namespace, DNS1123_LABEL);
    }
}

#[test]
fn hostile_service_port_names_are_rejected() {
    for name in HOSTILE {
        let errors = rejected_next_to_a_good_service(&service("demo", "web", [name, "https"]));
        assert_names_field(&errors, "spec.ports[0].name", name, DNS1123_LABEL);
    }
}

#[test]
fn port_names_are_required_and_unique_when_a_service_has_several() {
    let errors = rejected_next_to_a_good_service(&service("demo", "web", ["", "https"]));
    assert_eq!(
        errors,
        ["m.json:3 (document 1): Service demo/web: spec.ports[0].name: Required value"]
    );
    let errors = rejected_next_to_a_good_service(&service("demo", "web", ["http", "http"]));
    assert_eq!(
        errors,
        ["m.json:3 (document 1): Service demo/web: spec.ports[1].name: Duplicate value: \"http\""]
    );
}

#[test]
fn hostile_endpoint_slice_names_are_rejected() {
    for name in HOSTILE {
        let errors = rejected_next_to_a_good_service(&slice(name, "good", "http"));
        assert_names_field(&errors, "metadata.name", name, SUBDOMAIN);
        let errors = rejected_next_to_a_good_service(&slice("good-1", "good", name));
        assert_names_field(&errors, "ports[0].name", name, DNS1123_LABEL);
    }
    // "Web" is a valid label value; the others are not.
    for name in &HOSTILE[..4] {
        let errors = rejected_next_to_a_good_service(&slice("good-1", name, "http"));
        assert_names_field(
            &errors,
            "metadata.labels[kubernetes.io/service-name]",
            name,
            LABEL_VALUE,
        );
    }
}

#[test]
fn hostile_node_names_are_rejected() {
    for name in HOSTILE {
        let errors = rejected_next_to_a_good_service(&node(name));
        assert_names_field(&errors, "metadata.name", name, SUBDOMAIN);
    }
}

#[test]
fn the_object_named_in_an_error_is_escaped() {
    let errors = rejected_next_to_a_good_service(&service("demo", "a\nb", ["http", "https"]));
    assert!(
        errors[0].starts_with("m.json:3 (document 1): Service demo/\"a\\nb\": metadata.name: "),
        "{errors:#?}"
    );
}
