//! Label and field selectors, as the API server parses them from
//! `labelSelector=` and `fieldSelector=`.
//!
//! Only equality-based requirements are understood (`key`, `!key`,
//! `key=value`, `key==value`, `key!=value`, comma-separated); set-based ones
//! (`key in (a,b)`) are rejected, as no kube-proxy watch uses them.

use std::collections::BTreeMap;

use serde_json::Value;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LabelRequirement {
    /// `key`: the label is present.
    Exists(String),
    /// `!key`: the label is absent.
    DoesNotExist(String),
    /// `key=value`
    Equals(String, String),
    /// `key!=value`: absent, or present with another value.
    NotEquals(String, String),
}

/// A parsed `labelSelector`; empty selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LabelSelector(Vec<LabelRequirement>);

/// A parsed `fieldSelector` over `metadata.name` and `metadata.namespace`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldSelector(Vec<(FieldPath, bool, String)>);

/// The fields a field selector may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FieldPath {
    Name,
    Namespace,
}

impl LabelSelector {
    /// Parses `text`; the error says which requirement is not understood.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for part in text
            .split(',')
            .map(str::trim)
            .filter(|part| !part.is_empty())
        {
            requirements.push(parse_label_requirement(part)?);
        }
        Ok(Self(requirements))
    }

    /// Whether an object with `labels` is selected.
    pub(crate) fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|requirement| match requirement {
            LabelRequirement::Exists(key) => labels.contains_key(key),
            LabelRequirement::DoesNotExist(key) => !labels.contains_key(key),
            LabelRequirement::Equals(key, value) => labels.get(key) == Some(value),
            LabelRequirement::NotEquals(key, value) => labels.get(key) != Some(value),
        })
    }
}

impl FieldSelector {
    /// Parses `text`; the error names the field or operator not understood.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        for part in text
            .split(',')
            .map(str::trim)
            .filter(|part| !part.is_empty())
        {
            let (field, equal, value) = if let Some((field, value)) = part.split_once("!=") {
                (field, false, value)
            } else if let Some((field, value)) = part.split_once("==") {
                (field, true, value)
            } else if let Some((field, value)) = part.split_once('=') {
                (field, true, value)
            } else {
                return Err(format!("field selector term {part:?} has no operator"));
            };
            let path = match field.trim() {
                "metadata.name" => FieldPath::Name,
                "metadata.namespace" => FieldPath::Namespace,
                other => {
                    return Err(format!(
                        "field label {other:?} not supported \
                         (valid: metadata.name, metadata.namespace)"
                    ))
                }
            };
            terms.push((path, equal, value.trim().to_owned()));
        }
        Ok(Self(terms))
    }

    /// Whether an object with this namespace (empty when cluster-scoped) and
    /// name is selected.
    pub(crate) fn matches(&self, namespace: &str, name: &str) -> bool {
        self.0.iter().all(|(path, equal, value)| {
            let actual = match path {
                FieldPath::Name => name,
                FieldPath::Namespace => namespace,
            };
            (actual == value) == *equal
        })
    }
}

fn parse_label_requirement(part: &str) -> Result<LabelRequirement, String> {
    let invalid = || {
        format!(
            "label requirement {part:?} is not understood \
             (valid: key, !key, key=value, key!=value)"
        )
    };
    if part.contains('(') || part.contains(' ') {
        return Err(invalid());
    }
    let requirement = if let Some(key) = part.strip_prefix('!') {
        LabelRequirement::DoesNotExist(key.to_owned())
    } else if let Some((key, value)) = part.split_once("!=") {
        LabelRequirement::NotEquals(key.to_owned(), value.to_owned())
    } else if let Some((key, value)) = part.split_once("==") {
        LabelRequirement::Equals(key.to_owned(), value.to_owned())
    } else if let Some((key, value)) = part.split_once('=') {
        LabelRequirement::Equals(key.to_owned(), value.to_owned())
    } else {
        LabelRequirement::Exists(part.to_owned())
    };
    let key = match &requirement {
        LabelRequirement::Exists(key)
        | LabelRequirement::DoesNotExist(key)
        | LabelRequirement::Equals(key, _)
        | LabelRequirement::NotEquals(key, _) => key,
    };
    if key.is_empty() || key.contains(['=', '!']) {
        return Err(invalid());
    }
    Ok(requirement)
}

/// The labels of a stored object.
pub(crate) fn labels_of(object: &Value) -> BTreeMap<String, String> {
    object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(key, value)| Some((key.clone(), value.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect()
    }

    #[test]
    fn upstream_proxy_selector_skips_other_proxies_and_headless_services() {
        let selector = LabelSelector::parse(
            "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless",
        )
        .unwrap();
        assert!(selector.matches(&labels(&[("app", "web")])));
        assert!(!selector.matches(&labels(&[(
            "service.kubernetes.io/service-proxy-name",
            "other"
        )])));
        assert!(!selector.matches(&labels(&[("service.kubernetes.io/headless", "")])));
    }

    #[test]
    fn equality_requirements_compare_values() {
        let selector = LabelSelector::parse("app=web,tier!=db,zone").unwrap();
        assert!(selector.matches(&labels(&[("app", "web"), ("zone", "a")])));
        assert!(!selector.matches(&labels(&[("app", "web"), ("tier", "db"), ("zone", "a")])));
        assert!(!selector.matches(&labels(&[("app", "web")])));
    }

    #[test]
    fn set_based_requirements_are_refused() {
        assert!(LabelSelector::parse("app in (web,db)").is_err());
        assert!(LabelSelector::parse("!").is_err());
    }

    #[test]
    fn field_selector_on_name() {
        let selector = FieldSelector::parse("metadata.name=node-1").unwrap();
        assert!(selector.matches("", "node-1"));
        assert!(!selector.matches("", "node-2"));
        assert!(FieldSelector::parse("spec.nodeName=node-1").is_err());
    }
}
