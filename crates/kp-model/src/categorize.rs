//! Which endpoints a service port uses, for cluster and for local traffic.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::endpoints::Endpoint;
use crate::service::ServicePort;

/// The result of [`categorize_endpoints`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CategorizedEndpoints {
    /// Endpoints for traffic with cluster policy (empty when the service port
    /// uses no cluster endpoints).
    pub cluster: Vec<Arc<Endpoint>>,
    /// Endpoints for traffic with local policy (empty when the service port
    /// uses no local endpoints).
    pub local: Vec<Arc<Endpoint>>,
    /// The union of `cluster` and `local`: every endpoint some traffic can reach.
    pub all_reachable: Vec<Arc<Endpoint>>,
    /// Some usable endpoint exists anywhere in the cluster, even one this
    /// node's traffic policy cannot reach (decides REJECT versus DROP).
    pub has_any_endpoints: bool,
}

/// Splits a service port's endpoints into those cluster traffic uses, those
/// local traffic uses, and all reachable ones (see [`CategorizedEndpoints`]).
pub fn categorize_endpoints(
    endpoints: &[Arc<Endpoint>],
    service_port: &ServicePort,
    node_name: &str,
    node_labels: &BTreeMap<String, String>,
) -> CategorizedEndpoints {
    let _ = (endpoints, service_port, node_name, node_labels);
    todo!("kp-model: categorize_endpoints")
}
