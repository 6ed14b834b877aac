//! The 403 a starting kube-apiserver answers while its authorizer is still
//! warming up (RBAC has not read its roles yet): every request is refused
//! with the Status the real server writes for a denied request.
//!
//! The message is the one of apiserver's `responsewriters.Forbidden`:
//! `<resource>[.<group>] is forbidden: User "<user>" cannot <verb> resource
//! "<resource>" in API group "<group>" at the cluster scope` (or `in the
//! namespace "<ns>"` for a namespaced request), with `details` naming the
//! group (left out when empty) and the resource as `kind`.

use hyper::StatusCode;
use serde_json::{json, Value};

use super::http::Refusal;

/// The user a real cluster's kube-proxy authenticates as, named in the
/// messages unless a test picks another.
pub const KUBE_PROXY_USER: &str = "system:serviceaccount:kube-system:kube-proxy";

/// What a refused request asked for, as the authorizer sees it.
pub(super) struct Attributes<'a> {
    /// `list`, `watch`, `create`, …
    pub(super) verb: &'a str,
    /// The resource (plural), e.g. `endpointslices`.
    pub(super) resource: &'a str,
    /// The API group, empty for the core group.
    pub(super) group: &'a str,
    /// The namespace of a namespaced request.
    pub(super) namespace: Option<&'a str>,
}

/// The 403 Forbidden refusal for `user` asking for `attributes`.
pub(super) fn refusal(user: &str, attributes: &Attributes<'_>) -> Refusal {
    let message = message(user, attributes);
    let mut details = json!({ "kind": attributes.resource });
    if !attributes.group.is_empty() {
        details["group"] = json!(attributes.group);
    }
    let body: Value = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Forbidden",
        "details": details,
        "code": 403,
    });
    Refusal {
        status: StatusCode::FORBIDDEN,
        reason: "Forbidden",
        message,
        body: Some(body),
    }
}

/// `endpointslices.discovery.k8s.io is forbidden: User "…" cannot watch
/// resource "endpointslices" in API group "discovery.k8s.io" at the
/// cluster scope`.
pub(super) fn message(user: &str, attributes: &Attributes<'_>) -> String {
    let Attributes {
        verb,
        resource,
        group,
        namespace,
    } = attributes;
    let qualified = if group.is_empty() {
        (*resource).to_owned()
    } else {
        format!("{resource}.{group}")
    };
    let scope = match namespace {
        Some(namespace) => format!("in the namespace {namespace:?}"),
        None => "at the cluster scope".to_owned(),
    };
    format!(
        "{qualified} is forbidden: User {user:?} cannot {verb} resource {resource:?} \
         in API group {group:?} {scope}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_is_the_real_servers() {
        let attributes = Attributes {
            verb: "watch",
            resource: "endpointslices",
            group: "discovery.k8s.io",
            namespace: None,
        };
        assert_eq!(
            message(KUBE_PROXY_USER, &attributes),
            "endpointslices.discovery.k8s.io is forbidden: User \
             \"system:serviceaccount:kube-system:kube-proxy\" cannot watch resource \
             \"endpointslices\" in API group \"discovery.k8s.io\" at the cluster scope"
        );
        let core = Attributes {
            verb: "create",
            resource: "events",
            group: "",
            namespace: Some("default"),
        };
        assert_eq!(
            message("u", &core),
            "events is forbidden: User \"u\" cannot create resource \"events\" \
             in API group \"\" in the namespace \"default\""
        );
    }
}
