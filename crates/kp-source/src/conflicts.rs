//! What the API server's allocators would refuse: two Services holding the
//! same ClusterIP, or the same NodePort (the node port range is one pool for
//! all protocols, health check node ports included).
//!
//! Manifests have no creation order, so the Service that comes first in
//! path order (file, then document, then list item) keeps the value and
//! every later one is rejected: the outcome does not depend on timing.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Service, ServiceSpec};
use kp_model::ResourceKind;

use crate::error::{DocumentLocation, Holder, ManifestError, ManifestProblem};
use crate::object::{KubeObject, ManifestObject, ObjectKey};
use crate::validate::go_string_list;

/// Upstream's `ipallocator.ErrAllocated`.
const IP_ALLOCATED: &str = "provided IP is already allocated";
/// Upstream's `portallocator.ErrAllocated`.
const PORT_ALLOCATED: &str = "provided port is already allocated";

/// Something a Service holds exclusively.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Claim {
    ClusterIp(IpAddr),
    NodePort(i32),
}

/// One claim with the field it comes from and the message if it is taken.
struct FieldClaim {
    claim: Claim,
    field: String,
    reason: String,
}

/// Removes from `desired` every Service that claims a ClusterIP or a node
/// port held by a Service earlier in path order, with an error naming both.
pub(crate) fn reject_conflicts(
    desired: &mut BTreeMap<ObjectKey, Arc<ManifestObject>>,
    errors: &mut Vec<ManifestError>,
) {
    let mut services: Vec<(&DocumentLocation, &ObjectKey, &Service)> = desired
        .iter()
        .filter_map(|(key, object)| match &object.object {
            KubeObject::Service(service) if key.kind == ResourceKind::Service => {
                Some((&object.location, key, service))
            }
            _ => None,
        })
        .collect();
    services.sort_by(|a, b| a.0.cmp(b.0));
    let mut holders: HashMap<Claim, (&ObjectKey, &DocumentLocation)> = HashMap::new();
    let mut rejected = Vec::new();
    for (location, key, service) in services {
        let claims = claims_of(service);
        let taken: Vec<ManifestError> = claims
            .iter()
            .filter_map(|claim| {
                let (holder, held_at) = holders.get(&claim.claim)?;
                let problem = ManifestProblem::Conflict {
                    field: claim.field.clone(),
                    reason: claim.reason.clone(),
                    held_by: Box::new(Holder {
                        object: holder.identity(),
                        location: (*held_at).clone(),
                    }),
                };
                Some(ManifestError::new(
                    location.clone(),
                    key.identity(),
                    problem,
                ))
            })
            .collect();
        if taken.is_empty() {
            for claim in claims {
                holders.insert(claim.claim, (key, location));
            }
        } else {
            errors.extend(taken);
            rejected.push(key.clone());
        }
    }
    for key in rejected {
        desired.remove(&key);
    }
}

/// The ClusterIPs and node ports `service` holds.
fn claims_of(service: &Service) -> Vec<FieldClaim> {
    let Some(spec) = &service.spec else {
        return Vec::new();
    };
    let mut claims = cluster_ip_claims(spec);
    if matches!(spec.type_.as_deref(), Some("NodePort" | "LoadBalancer")) {
        for (i, port) in spec.ports.iter().flatten().enumerate() {
            let Some(node_port) = port.node_port else {
                continue;
            };
            // One Service may use one node port for several protocols.
            if claims.iter().any(|c| c.claim == Claim::NodePort(node_port)) {
                continue;
            }
            claims.push(FieldClaim {
                claim: Claim::NodePort(node_port),
                field: format!("spec.ports[{i}].nodePort"),
                reason: format!("Invalid value: {node_port}: {PORT_ALLOCATED}"),
            });
        }
    }
    if let Some(port) = spec.health_check_node_port {
        claims.push(FieldClaim {
            claim: Claim::NodePort(port),
            field: "spec.healthCheckNodePort".to_owned(),
            reason: format!(
                "Internal error occurred: failed to allocate requested HealthCheck NodePort {port}: {PORT_ALLOCATED}"
            ),
        });
    }
    claims
}

fn cluster_ip_claims(spec: &ServiceSpec) -> Vec<FieldClaim> {
    let listed = spec.cluster_ips.clone().unwrap_or_default();
    let ips = match (&spec.cluster_ip, listed.is_empty()) {
        (Some(ip), true) => vec![ip.clone()],
        _ => listed,
    };
    let shown = go_string_list(&ips);
    ips.iter()
        .filter_map(|text| text.parse::<IpAddr>().ok())
        .map(|ip| FieldClaim {
            claim: Claim::ClusterIp(ip),
            field: "spec.clusterIPs".to_owned(),
            reason: format!("Invalid value: {shown}: failed to allocate IP {ip}: {IP_ALLOCATED}"),
        })
        .collect()
}
