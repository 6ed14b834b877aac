//! The objects a manifest holds, and how they are told apart.

use std::fmt;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_model::ResourceKind;

use crate::error::{DocumentLocation, ObjectIdentity};

/// One object of a kind the proxy reads.
// Objects are held once per manifest entry and moved rarely; boxing the
// larger variants would buy nothing measurable.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum KubeObject {
    /// A `v1/Service`.
    Service(Service),
    /// A `discovery.k8s.io/v1/EndpointSlice`.
    EndpointSlice(EndpointSlice),
    /// A `v1/Node`.
    Node(Node),
}

/// The identity of an object: kind, namespace (empty for a Node) and name.
/// Two manifests with the same key define the same object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// The object's kind.
    pub kind: ResourceKind,
    /// `metadata.namespace`; empty for cluster-scoped kinds.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

/// A valid object together with the place it was read from.
#[derive(Debug, Clone, PartialEq)]
pub struct ManifestObject {
    /// Where the object was defined.
    pub location: DocumentLocation,
    /// The object, with `metadata.namespace` defaulted.
    pub object: KubeObject,
}

impl KubeObject {
    /// The object's kind.
    pub fn kind(&self) -> ResourceKind {
        match self {
            Self::Service(_) => ResourceKind::Service,
            Self::EndpointSlice(_) => ResourceKind::EndpointSlice,
            Self::Node(_) => ResourceKind::Node,
        }
    }

    /// The object's identity.
    pub fn key(&self) -> ObjectKey {
        let metadata = match self {
            Self::Service(service) => &service.metadata,
            Self::EndpointSlice(slice) => &slice.metadata,
            Self::Node(node) => &node.metadata,
        };
        ObjectKey {
            kind: self.kind(),
            namespace: metadata.namespace.clone().unwrap_or_default(),
            name: metadata.name.clone().unwrap_or_default(),
        }
    }
}

impl ObjectKey {
    /// The identity in the form used by error reports.
    pub fn identity(&self) -> ObjectIdentity {
        ObjectIdentity {
            kind: Some(kind_name(self.kind).to_owned()),
            namespace: (!self.namespace.is_empty()).then(|| self.namespace.clone()),
            name: Some(self.name.clone()),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.identity().fmt(f)
    }
}

/// The `kind` string of `kind`.
pub(crate) fn kind_name(kind: ResourceKind) -> &'static str {
    match kind {
        ResourceKind::Service => "Service",
        ResourceKind::EndpointSlice => "EndpointSlice",
        ResourceKind::Node => "Node",
    }
}
