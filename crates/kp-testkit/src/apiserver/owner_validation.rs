//! The real API server's rules for `metadata.ownerReferences` and
//! `metadata.finalizers` on create (apimachinery's
//! `ValidateOwnerReferences` and `ValidateFinalizers`).

use serde_json::Value;

use super::field_error::{go_quote, BadValue, ErrorType, FieldError};
use super::meta_validation::qualified_name;

const OWNER_REFERENCES: &str = "metadata.ownerReferences";
const FINALIZERS: &str = "metadata.finalizers";

/// `ValidateOwnerReferences`.
pub(crate) fn owner_references(references: Option<&Value>) -> Vec<FieldError> {
    let references: &[Value] = references
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    let mut errors = Vec::new();
    let mut first_controller: Option<String> = None;
    for reference in references {
        errors.extend(owner_reference(reference));
        if reference.get("controller").and_then(Value::as_bool) == Some(true) {
            let this = format!("{}/{}", text(reference, "kind"), text(reference, "name"));
            match &first_controller {
                Some(first) => errors.push(FieldError::new(
                    ErrorType::Invalid,
                    OWNER_REFERENCES,
                    BadValue::Printed(format!(
                        "[]v1.OwnerReference{{{}}}",
                        references.iter().map(go_owner).collect::<Vec<_>>().join(", ")
                    )),
                    &format!(
                        "Only one reference can have Controller set to true. Found \"true\" in references for {first} and {this}"
                    ),
                )),
                None => first_controller = Some(this),
            }
        }
    }
    errors
}

/// `ValidateFinalizers`.
pub(crate) fn finalizers(finalizers: Option<&Value>) -> Vec<FieldError> {
    let names: Vec<&str> = finalizers
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let mut errors = Vec::new();
    for name in &names {
        for message in qualified_name(name) {
            errors.push(FieldError::invalid(FINALIZERS, name, &message));
        }
    }
    if names.contains(&"orphan") && names.contains(&"foregroundDeletion") {
        let printed: Vec<String> = names.iter().map(|n| go_quote(n)).collect();
        errors.push(FieldError::new(
            ErrorType::Invalid,
            FINALIZERS,
            BadValue::Printed(format!("[]string{{{}}}", printed.join(", "))),
            "finalizer orphan and foregroundDeletion cannot be both set",
        ));
    }
    errors
}

fn owner_reference(reference: &Value) -> Vec<FieldError> {
    let field = |name: &str| format!("{OWNER_REFERENCES}.{name}");
    let api_version = text(reference, "apiVersion");
    let (group, version) = parse_group_version(api_version);
    let kind = text(reference, "kind");
    let mut errors = Vec::new();
    if version.is_empty() {
        errors.push(FieldError::invalid(
            field("apiVersion"),
            api_version,
            "version must not be empty",
        ));
    }
    for (name, value) in [
        ("kind", kind),
        ("name", text(reference, "name")),
        ("uid", text(reference, "uid")),
    ] {
        if value.is_empty() {
            errors.push(FieldError::invalid(field(name), value, "must not be empty"));
        }
    }
    // Events may not own anything (BannedOwners).
    if group.is_empty() && version == "v1" && kind == "Event" {
        errors.push(FieldError::new(
            ErrorType::Invalid,
            OWNER_REFERENCES,
            BadValue::Printed(go_owner(reference)),
            "/v1, Kind=Event is disallowed from being an owner",
        ));
    }
    errors
}

/// `schema.ParseGroupVersion`: `v1`, `group/version`; anything else has no
/// version.
fn parse_group_version(api_version: &str) -> (&str, &str) {
    match api_version.split('/').collect::<Vec<_>>().as_slice() {
        [version] => ("", version),
        [group, version] => (group, version),
        _ => ("", ""),
    }
}

/// An owner reference as Go's `%#v` prints it (pointers as nil or set).
fn go_owner(reference: &Value) -> String {
    let pointer = |name: &str| match reference.get(name).and_then(Value::as_bool) {
        Some(_) => "(*bool)(0xc000000000)",
        None => "(*bool)(nil)",
    };
    format!(
        "v1.OwnerReference{{APIVersion:{}, Kind:{}, Name:{}, UID:{}, Controller:{}, BlockOwnerDeletion:{}}}",
        go_quote(text(reference, "apiVersion")),
        go_quote(text(reference, "kind")),
        go_quote(text(reference, "name")),
        go_quote(text(reference, "uid")),
        pointer("controller"),
        pointer("blockOwnerDeletion"),
    )
}

fn text<'a>(object: &'a Value, field: &str) -> &'a str {
    object.get(field).and_then(Value::as_str).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn messages(errors: Vec<FieldError>) -> Vec<String> {
        errors.iter().map(FieldError::message).collect()
    }

    #[test]
    fn an_owner_needs_a_version_kind_name_and_uid_and_is_no_event() {
        let references = json!([{"apiVersion": "v1", "kind": "Event", "name": "e", "uid": ""}]);
        assert_eq!(
            messages(owner_references(Some(&references))),
            [
                "metadata.ownerReferences.uid: Invalid value: \"\": must not be empty",
                "metadata.ownerReferences: Invalid value: v1.OwnerReference{APIVersion:\"v1\", Kind:\"Event\", Name:\"e\", UID:\"\", Controller:(*bool)(nil), BlockOwnerDeletion:(*bool)(nil)}: /v1, Kind=Event is disallowed from being an owner",
            ]
        );
        let no_version =
            json!([{"apiVersion": "apps/", "kind": "ReplicaSet", "name": "r", "uid": "u"}]);
        assert_eq!(
            messages(owner_references(Some(&no_version))),
            ["metadata.ownerReferences.apiVersion: Invalid value: \"apps/\": version must not be empty"]
        );
    }

    #[test]
    fn only_one_owner_is_the_controller() {
        let owner = |name: &str| json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name, "uid": name, "controller": true});
        let references = json!([owner("a"), owner("b")]);
        let errors = messages(owner_references(Some(&references)));
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].ends_with("Only one reference can have Controller set to true. Found \"true\" in references for ReplicaSet/a and ReplicaSet/b"),
            "{errors:?}"
        );
    }

    #[test]
    fn finalizers_are_qualified_names_and_not_both_orphan_and_foreground() {
        let finalizers_list = json!(["orphan", "foregroundDeletion", "example.com/ok"]);
        assert_eq!(
            messages(finalizers(Some(&finalizers_list))),
            ["metadata.finalizers: Invalid value: []string{\"orphan\", \"foregroundDeletion\", \"example.com/ok\"}: finalizer orphan and foregroundDeletion cannot be both set"]
        );
        let bad = json!(["a/b/c"]);
        assert_eq!(finalizers(Some(&bad)).len(), 1);
    }
}
