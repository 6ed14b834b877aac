//! Service ports: what one port of one Service asks the proxy to do.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;

/// An IP family. Each family has its own trackers and sync loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpFamily {
    /// IPv4
    V4,
    /// IPv6
    V6,
}

/// Transport protocol of a service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// TCP
    Tcp,
    /// UDP
    Udp,
    /// SCTP
    Sctp,
}

/// `namespace/name` of an object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamespacedName {
    /// The namespace.
    pub namespace: String,
    /// The name.
    pub name: String,
}

/// Identifies one port of one Service: `ns/name:port` (`ns/name` for an
/// unnamed port), plus the protocol, which upstream keeps in the struct but
/// not in the string form.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServicePortName {
    /// The Service.
    pub service: NamespacedName,
    /// The port's name; empty for the single unnamed port.
    pub port: String,
    /// The port's protocol.
    pub protocol: Protocol,
}

/// `spec.trafficDistribution` of a Service.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TrafficDistribution {
    /// `PreferClose`: prefer endpoints in the node's zone (uses zone hints).
    PreferClose,
    /// `PreferSameZone`: same as PreferClose under its newer name.
    PreferSameZone,
    /// `PreferSameNode`: prefer endpoints on this node (uses node hints).
    PreferSameNode,
    /// A value this proxy does not know; treated as unset.
    Other(String),
}

/// Everything the data plane needs to know about one service port, for one IP
/// family. Built from a Service by [`service_ports_from_service`].
#[derive(Debug, Clone, PartialEq)]
pub struct ServicePort {
    /// The ClusterIP of this family.
    pub cluster_ip: IpAddr,
    /// `spec.ports[].port`.
    pub port: u16,
    /// `spec.ports[].protocol`.
    pub protocol: Protocol,
    /// `spec.ports[].nodePort`, when allocated.
    pub node_port: Option<u16>,
    /// `spec.externalIPs` of this family.
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress[].ip` of this family, without those whose
    /// `ipMode` is `Proxy` (the load balancer delivers those to the node with
    /// their own destination, so the proxy must not capture them).
    pub load_balancer_ips: Vec<IpAddr>,
    /// `spec.loadBalancerSourceRanges` of this family.
    pub load_balancer_source_ranges: Vec<IpNet>,
    /// Session affinity timeout when `sessionAffinity: ClientIP`.
    pub session_affinity_timeout: Option<Duration>,
    /// `externalTrafficPolicy: Local` (only meaningful for external addresses).
    pub external_policy_local: bool,
    /// `internalTrafficPolicy: Local`.
    pub internal_policy_local: bool,
    /// `spec.healthCheckNodePort`, when set.
    pub health_check_node_port: Option<u16>,
    /// `spec.trafficDistribution`.
    pub traffic_distribution: Option<TrafficDistribution>,
    /// `service.kubernetes.io/topology-mode` (or the older
    /// `service.kubernetes.io/topology-aware-hints`) annotation value.
    pub topology_mode: Option<String>,
}

/// Every service port the proxy knows, for one IP family.
pub type ServicePortMap = HashMap<ServicePortName, Arc<ServicePort>>;

/// Why a Service could not be turned into service ports.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceError {
    /// A field holds a value the proxy cannot use.
    #[error("service {service}: field {field}: invalid value {value:?}: {reason}")]
    InvalidField {
        /// `namespace/name` of the Service.
        service: String,
        /// Path of the field, e.g. `spec.ports[1].port`.
        field: String,
        /// The offending value.
        value: String,
        /// What would be valid.
        reason: String,
    },
}

/// Turns a Service into its service ports for `family`. A Service the proxy
/// ignores (headless, ExternalName, no ClusterIP of this family, labelled for
/// another proxy) yields an empty list.
pub fn service_ports_from_service(
    service: &Service,
    family: IpFamily,
) -> Result<Vec<(ServicePortName, ServicePort)>, ServiceError> {
    let _ = (service, family);
    todo!("kp-model: service_ports_from_service")
}
