//! The real API server's rules for names and `metadata` on create
//! (apimachinery's `IsDNS1123Subdomain`, `IsDNS1123Label`,
//! `IsQualifiedName`, `IsValidLabelValue`, `IsPathSegmentName` and
//! `ValidateObjectMetaAccessor`), with their exact messages. Managed fields
//! are not checked: no client of this server sends them.

use serde_json::Value;

use super::field_error::{BadValue, ErrorType, FieldError};

/// How a name (or generateName prefix) is checked.
pub(crate) type NameRule = fn(&str, bool) -> Vec<String>;

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const LABEL_KEY_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
/// Annotations may hold at most this many bytes of keys and values.
const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

/// `IsDNS1123Subdomain`.
pub(crate) fn dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 253 {
        errors.push(max_len(253));
    }
    if !is_subdomain(value) {
        errors.push(regex_error(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errors
}

/// `IsDNS1123Label`.
pub(crate) fn dns1123_label(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 63 {
        errors.push(max_len(63));
    }
    if !is_label(value) {
        if is_subdomain(value) {
            errors.push("must not contain dots".to_owned());
        } else {
            errors.push(regex_error(
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
                DNS1123_LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    errors
}

/// `NameIsDNSSubdomain`: a generateName prefix may end with `-`.
pub(crate) fn name_is_dns_subdomain(name: &str, prefix: bool) -> Vec<String> {
    dns1123_subdomain(&mask_trailing_dash(name, prefix))
}

/// `ValidateNamespaceName` (`NameIsDNSLabel`).
pub(crate) fn namespace_name(name: &str, prefix: bool) -> Vec<String> {
    dns1123_label(&mask_trailing_dash(name, prefix))
}

/// `IsPathSegmentName` / `IsPathSegmentPrefix`: what every object's name
/// must be so that it can be a URL path segment.
pub(crate) fn path_segment_name(name: &str, prefix: bool) -> Vec<String> {
    if !prefix {
        if let Some(bad) = [".", ".."].into_iter().find(|bad| name == *bad) {
            return vec![format!("may not be '{bad}'")];
        }
    }
    ["/", "%"]
        .into_iter()
        .filter(|bad| name.contains(bad))
        .map(|bad| format!("may not contain '{bad}'"))
        .collect()
}

/// `IsQualifiedName`: an optional DNS subdomain prefix and `/`, then a
/// name of at most 63 characters.
pub(crate) fn qualified_name(value: &str) -> Vec<String> {
    let name_error = || {
        regex_error(
            "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
            LABEL_KEY_FMT,
            &["MyName", "my.name", "123-abc"],
        )
    };
    let parts: Vec<&str> = value.split('/').collect();
    let mut errors = Vec::new();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errors.push("prefix part must be non-empty".to_owned());
            } else {
                errors.extend(
                    dns1123_subdomain(prefix)
                        .into_iter()
                        .map(|e| format!("prefix part {e}")),
                );
            }
            *name
        }
        _ => {
            return vec![format!(
                "a valid label key {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                name_error()
            )]
        }
    };
    if name.is_empty() {
        errors.push("name part must be non-empty".to_owned());
    } else if name.len() > 63 {
        errors.push(format!("name part {}", max_len(63)));
    }
    if !is_label_key_name(name) {
        errors.push(format!("name part {}", name_error()));
    }
    errors
}

/// `IsValidLabelValue`.
fn label_value(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 63 {
        errors.push(max_len(63));
    }
    if !value.is_empty() && !is_label_key_name(value) {
        errors.push(regex_error(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errors
}

/// `ValidateObjectMetaAccessor` for a namespaced object, names checked
/// with `name_rule`; `metadata` is the object's metadata as sent.
pub(crate) fn object_meta(metadata: &Value, name_rule: NameRule) -> Vec<FieldError> {
    let text = |field: &str| metadata.get(field).and_then(Value::as_str).unwrap_or("");
    let mut errors = Vec::new();
    let generate_name = text("generateName");
    if !generate_name.is_empty() {
        for message in name_rule(generate_name, true) {
            errors.push(FieldError::invalid(
                "metadata.generateName",
                generate_name,
                &message,
            ));
        }
    }
    let name = text("name");
    if name.is_empty() {
        errors.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        ));
    }
    for message in name_rule(name, false)
        .into_iter()
        .filter(|_| !name.is_empty())
    {
        errors.push(FieldError::invalid("metadata.name", name, &message));
    }
    let namespace = text("namespace");
    if namespace.is_empty() {
        errors.push(FieldError::required("metadata.namespace", ""));
    }
    for message in namespace_name(namespace, false)
        .into_iter()
        .filter(|_| !namespace.is_empty())
    {
        errors.push(FieldError::invalid(
            "metadata.namespace",
            namespace,
            &message,
        ));
    }
    if let Some(generation) = metadata
        .get("generation")
        .and_then(Value::as_i64)
        .filter(|g| *g < 0)
    {
        errors.push(FieldError::new(
            ErrorType::Invalid,
            "metadata.generation",
            BadValue::Int(generation),
            "must be greater than or equal to 0",
        ));
    }
    errors.extend(labels(metadata.get("labels")));
    errors.extend(annotations(metadata.get("annotations")));
    errors.extend(super::owner_validation::owner_references(
        metadata.get("ownerReferences"),
    ));
    errors.extend(super::owner_validation::finalizers(
        metadata.get("finalizers"),
    ));
    errors
}

fn labels(labels: Option<&Value>) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for (key, value) in labels.and_then(Value::as_object).into_iter().flatten() {
        for message in qualified_name(key) {
            errors.push(FieldError::invalid("metadata.labels", key, &message));
        }
        let value = value.as_str().unwrap_or("");
        for message in label_value(value) {
            errors.push(FieldError::invalid("metadata.labels", value, &message));
        }
    }
    errors
}

fn annotations(annotations: Option<&Value>) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut total = 0;
    for (key, value) in annotations.and_then(Value::as_object).into_iter().flatten() {
        // Case does not matter in annotation keys.
        for message in qualified_name(&key.to_lowercase()) {
            errors.push(FieldError::invalid("metadata.annotations", key, &message));
        }
        total += key.len() + value.as_str().map_or(0, str::len);
    }
    if total > TOTAL_ANNOTATION_SIZE_LIMIT {
        errors.push(FieldError::too_long(
            "metadata.annotations",
            TOTAL_ANNOTATION_SIZE_LIMIT,
        ));
    }
    errors
}

fn mask_trailing_dash(name: &str, prefix: bool) -> String {
    match name.strip_suffix('-') {
        Some(stem) if prefix && name.len() > 1 => format!("{stem}a"),
        _ => name.to_owned(),
    }
}

fn max_len(length: usize) -> String {
    format!("must be no more than {length} characters")
}

fn regex_error(message: &str, format: &str, examples: &[&str]) -> String {
    let examples: Vec<String> = examples.iter().map(|e| format!("'{e}', ")).collect();
    format!(
        "{message} (e.g. {}regex used for validation is '{format}')",
        examples.join(" or ")
    )
}

fn is_label(value: &str) -> bool {
    let bytes = value.as_bytes();
    let edge = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            edge(first) && edge(last) && bytes.iter().all(|b| edge(b) || *b == b'-')
        }
        _ => false,
    }
}

fn is_subdomain(value: &str) -> bool {
    value.split('.').all(is_label)
}

fn is_label_key_name(value: &str) -> bool {
    let bytes = value.as_bytes();
    let edge = |b: &u8| b.is_ascii_alphanumeric();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            edge(first)
                && edge(last)
                && bytes
                    .iter()
                    .all(|b| edge(b) || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names_follow_rfc_1123() {
        assert!(dns1123_subdomain("node-1.17a3f0c2e4b5d6e7").is_empty());
        assert!(dns1123_label("kube-system").is_empty());
        assert_eq!(dns1123_label("a.b"), ["must not contain dots"]);
        assert_eq!(
            dns1123_subdomain("Node_1"),
            ["a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"]
        );
        // The regex bounds no label; only the whole length counts.
        assert_eq!(
            dns1123_subdomain(&"a".repeat(254)),
            ["must be no more than 253 characters"]
        );
        assert!(name_is_dns_subdomain("event-", true).is_empty());
        assert_eq!(name_is_dns_subdomain("event-", false).len(), 1);
    }

    #[test]
    fn qualified_names_have_an_optional_prefix() {
        assert!(qualified_name("kube-proxy").is_empty());
        assert!(qualified_name("example.com/My_name.1").is_empty());
        assert_eq!(qualified_name("/x"), ["prefix part must be non-empty"]);
        assert_eq!(qualified_name("a/b/c").len(), 1);
        let bad = qualified_name("-x");
        assert_eq!(bad.len(), 1);
        assert!(bad[0].starts_with("name part must consist of alphanumeric characters"));
        // Go's RegexError puts two spaces before each "or".
        assert!(
            bad[0].ends_with("(e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"),
            "{bad:?}"
        );
    }

    #[test]
    fn metadata_limits_annotations_labels_and_generation() {
        let metadata = serde_json::json!({
            "name": "e.1",
            "namespace": "default",
            "generation": -1,
            "labels": {"app": "-bad"},
            "annotations": {"Example.com/Mixed-Case": "x".repeat(TOTAL_ANNOTATION_SIZE_LIMIT)},
        });
        let messages: Vec<String> = object_meta(&metadata, name_is_dns_subdomain)
            .iter()
            .map(FieldError::message)
            .collect();
        assert_eq!(messages.len(), 3, "{messages:#?}");
        assert_eq!(
            messages[0],
            "metadata.generation: Invalid value: -1: must be greater than or equal to 0"
        );
        assert!(messages[1].starts_with(
            "metadata.labels: Invalid value: \"-bad\": a valid label must be an empty string"
        ));
        assert_eq!(
            messages[2],
            "metadata.annotations: Too long: must have at most 262144 bytes"
        );
    }

    #[test]
    fn metadata_needs_a_name_and_a_namespace() {
        let messages: Vec<String> = object_meta(&serde_json::json!({}), path_segment_name)
            .iter()
            .map(FieldError::message)
            .collect();
        assert_eq!(
            messages,
            [
                "metadata.name: Required value: name or generateName is required",
                "metadata.namespace: Required value"
            ]
        );
    }

    #[test]
    fn path_segment_names_avoid_dots_slashes_and_percent() {
        assert_eq!(path_segment_name("..", false), ["may not be '..'"]);
        assert_eq!(
            path_segment_name("a/b%", false),
            ["may not contain '/'", "may not contain '%'"]
        );
        assert!(path_segment_name("..", true).is_empty());
    }
}
