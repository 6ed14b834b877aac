//! Service ports: what one port of one Service asks the proxy to do.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Service, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::ip::{parse_cidr, parse_ip};
use crate::{LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME};

/// Annotation selecting topology-aware routing (`Auto`).
pub const ANNOTATION_TOPOLOGY_MODE: &str = "service.kubernetes.io/topology-mode";
/// The deprecated name of [`ANNOTATION_TOPOLOGY_MODE`]; it wins when both are set,
/// as upstream reads it first.
pub const ANNOTATION_TOPOLOGY_AWARE_HINTS: &str = "service.kubernetes.io/topology-aware-hints";
/// Session affinity timeout when `sessionAffinityConfig` does not give one
/// (the API default, 3 hours).
pub const DEFAULT_SESSION_AFFINITY_TIMEOUT: Duration = Duration::from_secs(10_800);
/// Largest session affinity timeout the API accepts (one day).
const MAX_SESSION_AFFINITY_TIMEOUT_SECS: i32 = 86_400;

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
///
/// The strings are shared (`Arc<str>`): the trackers, the flattened maps
/// and the backends' caches all key on the names of every Service, and a
/// clone costs a reference count instead of new strings (at 10,000
/// Services the copies were a third of the trackers' allocations).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamespacedName {
    /// The namespace.
    pub namespace: Arc<str>,
    /// The name.
    pub name: Arc<str>,
}

/// Identifies one port of one Service: `ns/name:port` (`ns/name` for an
/// unnamed port), plus the protocol, which upstream keeps in the struct but
/// not in the string form.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServicePortName {
    /// The Service.
    pub service: NamespacedName,
    /// The port's name; empty for the single unnamed port.
    pub port: Arc<str>,
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
///
/// Addresses of the other family (`externalIPs`, load balancer ingress IPs,
/// `loadBalancerSourceRanges`) are dropped: the other family's tracker uses
/// them. Load balancer ingress IPs whose `ipMode` is not `VIP` are dropped too.
/// A value that is not valid for any family is an error, so that the caller
/// can keep the Service's last good state.
pub fn service_ports_from_service(
    service: &Service,
    family: IpFamily,
) -> Result<Vec<(ServicePortName, ServicePort)>, ServiceError> {
    let name = NamespacedName::of(&service.metadata);
    let Some(spec) = service.spec.as_ref() else {
        return Ok(Vec::new());
    };
    if is_ignored(&service.metadata, spec) {
        return Ok(Vec::new());
    }
    let fields = FieldErrors {
        service: name.to_string(),
    };
    let Some(cluster_ip) = cluster_ip_of_family(spec, family, &fields)? else {
        return Ok(Vec::new());
    };
    let template = service_wide_fields(service, spec, family, cluster_ip, &fields)?;
    let mut ports = Vec::new();
    for (index, api_port) in spec.ports.iter().flatten().enumerate() {
        let field = |leaf: &str| format!("spec.ports[{index}].{leaf}");
        let protocol = match api_port.protocol.as_deref() {
            None | Some("") => Protocol::Tcp,
            Some(text) => Protocol::from_api(text).ok_or_else(|| {
                fields.invalid(field("protocol"), text, "must be one of TCP, UDP, SCTP")
            })?,
        };
        let port = port_number(api_port.port, &fields, field("port"))?;
        let node_port = match api_port.node_port {
            None | Some(0) => None,
            Some(value) => Some(port_number(value, &fields, field("nodePort"))?),
        };
        let port_name = ServicePortName {
            service: name.clone(),
            port: shared_str(api_port.name.as_deref().unwrap_or_default()),
            protocol,
        };
        let service_port = ServicePort {
            port,
            protocol,
            node_port,
            ..template.clone()
        };
        ports.push((port_name, service_port));
    }
    Ok(ports)
}

/// `text` as a shared string; every empty one (the unnamed port, an unset
/// namespace) is the same allocation.
pub(crate) fn shared_str(text: &str) -> Arc<str> {
    static EMPTY: OnceLock<Arc<str>> = OnceLock::new();
    if text.is_empty() {
        Arc::clone(EMPTY.get_or_init(|| Arc::from("")))
    } else {
        Arc::from(text)
    }
}

/// Builds error values naming one Service.
struct FieldErrors {
    service: String,
}

impl IpFamily {
    /// The family of `ip`.
    pub fn of(ip: &IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Self::V4,
            IpAddr::V6(_) => Self::V6,
        }
    }

    /// `ip` belongs to this family.
    pub fn matches(self, ip: &IpAddr) -> bool {
        Self::of(ip) == self
    }

    /// The API spelling: `IPv4` or `IPv6` (as in `spec.ipFamilies` and an
    /// EndpointSlice's `addressType`).
    pub fn as_api_str(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_api_str())
    }
}

impl Protocol {
    /// Parses the API spelling (`TCP`, `UDP`, `SCTP`; case-sensitive, as the
    /// API server validates it).
    pub fn from_api(text: &str) -> Option<Self> {
        match text {
            "TCP" => Some(Self::Tcp),
            "UDP" => Some(Self::Udp),
            "SCTP" => Some(Self::Sctp),
            _ => None,
        }
    }

    /// The API spelling: `TCP`, `UDP` or `SCTP`.
    pub fn as_api_str(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        }
    }

    /// Lower case (`tcp`, `udp`, `sctp`), as iptables, nft, ipvsadm and
    /// conntrack spell it; also the [`Display`](fmt::Display) form.
    pub fn as_rule_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Sctp => "sctp",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_rule_str())
    }
}

impl NamespacedName {
    /// `namespace/name`.
    pub fn new(namespace: impl AsRef<str>, name: impl AsRef<str>) -> Self {
        Self {
            namespace: shared_str(namespace.as_ref()),
            name: shared_str(name.as_ref()),
        }
    }

    /// The namespace and name of an object (empty strings when unset).
    pub fn of(meta: &ObjectMeta) -> Self {
        Self::new(
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        )
    }
}

/// `namespace/name`.
impl fmt::Display for NamespacedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl ServicePortName {
    /// Port `port` (empty for the unnamed port) of Service `service`.
    pub fn new(service: NamespacedName, port: impl AsRef<str>, protocol: Protocol) -> Self {
        Self {
            service,
            port: shared_str(port.as_ref()),
            protocol,
        }
    }
}

/// `ns/name:port`, or `ns/name` for the unnamed port, as upstream prints it
/// (and hashes it into chain names); the protocol is not part of it.
impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port.is_empty() {
            write!(f, "{}", self.service)
        } else {
            write!(f, "{}:{}", self.service, self.port)
        }
    }
}

impl TrafficDistribution {
    /// Parses `spec.trafficDistribution`.
    pub fn from_api(text: &str) -> Self {
        match text {
            "PreferClose" => Self::PreferClose,
            "PreferSameZone" => Self::PreferSameZone,
            "PreferSameNode" => Self::PreferSameNode,
            other => Self::Other(other.to_owned()),
        }
    }

    /// The API spelling.
    pub fn as_str(&self) -> &str {
        match self {
            Self::PreferClose => "PreferClose",
            Self::PreferSameZone => "PreferSameZone",
            Self::PreferSameNode => "PreferSameNode",
            Self::Other(other) => other,
        }
    }
}

impl ServicePort {
    /// Reachable other than through the ClusterIP: it has a NodePort, an
    /// external IP or a load balancer IP.
    pub fn externally_accessible(&self) -> bool {
        self.node_port.is_some()
            || !self.external_ips.is_empty()
            || !self.load_balancer_ips.is_empty()
    }

    /// Some traffic to this port is sent to endpoints chosen by the Cluster
    /// policy: internal traffic unless `internalTrafficPolicy: Local`, and
    /// external traffic always (even with `externalTrafficPolicy: Local`,
    /// traffic from pods on this node to an external address is short-circuited
    /// to cluster endpoints).
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_policy_local || self.externally_accessible()
    }

    /// Some traffic to this port is sent only to endpoints on this node.
    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_policy_local || (self.external_policy_local && self.externally_accessible())
    }

    /// The session affinity timeout in whole seconds (0 without affinity).
    pub fn session_affinity_timeout_secs(&self) -> u64 {
        self.session_affinity_timeout.map_or(0, |t| t.as_secs())
    }
}

/// `ip:port/protocol` of the ClusterIP, as upstream prints a service port.
impl fmt::Display for ServicePort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cluster_ip {
            IpAddr::V4(ip) => write!(f, "{ip}:{}/{}", self.port, self.protocol.as_api_str()),
            IpAddr::V6(ip) => write!(f, "[{ip}]:{}/{}", self.port, self.protocol.as_api_str()),
        }
    }
}

impl FieldErrors {
    fn invalid(
        &self,
        field: impl Into<String>,
        value: impl fmt::Display,
        reason: &str,
    ) -> ServiceError {
        ServiceError::InvalidField {
            service: self.service.clone(),
            field: field.into(),
            value: value.to_string(),
            reason: reason.to_owned(),
        }
    }

    fn ip(&self, field: String, text: &str) -> Result<IpAddr, ServiceError> {
        parse_ip(text).ok_or_else(|| self.invalid(field, text, "must be an IPv4 or IPv6 address"))
    }
}

/// Headless Services, ExternalName Services and Services handed to another
/// proxy (labels the kube API source also filters on) get no rules.
fn is_ignored(meta: &ObjectMeta, spec: &ServiceSpec) -> bool {
    let labelled = meta.labels.as_ref().is_some_and(|labels| {
        labels.contains_key(LABEL_SERVICE_PROXY_NAME) || labels.contains_key(LABEL_HEADLESS)
    });
    let first_listed = spec.cluster_ips.as_ref().and_then(|ips| ips.first());
    let cluster_ip = spec.cluster_ip.as_ref().or(first_listed);
    let headless = matches!(cluster_ip.map(String::as_str), None | Some("" | "None"));
    labelled || headless || spec.type_.as_deref() == Some("ExternalName")
}

/// The ClusterIP of `family`: from `spec.clusterIPs`, or from `spec.clusterIP`
/// when `spec.clusterIPs` is empty (objects written before dual-stack).
fn cluster_ip_of_family(
    spec: &ServiceSpec,
    family: IpFamily,
    fields: &FieldErrors,
) -> Result<Option<IpAddr>, ServiceError> {
    let listed = spec.cluster_ips.as_deref().unwrap_or_default();
    if listed.is_empty() {
        let text = spec.cluster_ip.as_deref().unwrap_or_default();
        let ip = fields.ip("spec.clusterIP".to_owned(), text)?;
        return Ok(family.matches(&ip).then_some(ip));
    }
    for (index, text) in listed.iter().enumerate() {
        if text == "None" {
            return Ok(None);
        }
        let ip = fields.ip(format!("spec.clusterIPs[{index}]"), text)?;
        if family.matches(&ip) {
            return Ok(Some(ip));
        }
    }
    Ok(None)
}

/// The fields every port of the Service shares; the port-specific ones are
/// placeholders the caller fills in.
fn service_wide_fields(
    service: &Service,
    spec: &ServiceSpec,
    family: IpFamily,
    cluster_ip: IpAddr,
    fields: &FieldErrors,
) -> Result<ServicePort, ServiceError> {
    let service_type = spec.type_.as_deref().unwrap_or("ClusterIP");
    let external_ips = external_ips(spec, family, fields)?;
    // Upstream's ExternallyAccessible: decided by the type, not per family.
    let accessible = matches!(service_type, "LoadBalancer" | "NodePort")
        || (service_type == "ClusterIP"
            && spec.external_ips.as_ref().is_some_and(|v| !v.is_empty()));
    let external_policy_local =
        accessible && spec.external_traffic_policy.as_deref() == Some("Local");
    let health_check_node_port = match spec.health_check_node_port {
        Some(port) if port != 0 && external_policy_local && service_type == "LoadBalancer" => Some(
            port_number(port, fields, "spec.healthCheckNodePort".to_owned())?,
        ),
        _ => None,
    };
    Ok(ServicePort {
        cluster_ip,
        port: 0,
        protocol: Protocol::Tcp,
        node_port: None,
        external_ips,
        load_balancer_ips: load_balancer_ips(service, family, fields)?,
        load_balancer_source_ranges: source_ranges(spec, family, fields)?,
        session_affinity_timeout: session_affinity_timeout(spec, fields)?,
        external_policy_local,
        internal_policy_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
        health_check_node_port,
        traffic_distribution: spec
            .traffic_distribution
            .as_deref()
            .filter(|text| !text.is_empty())
            .map(TrafficDistribution::from_api),
        topology_mode: topology_mode(&service.metadata),
    })
}

fn external_ips(
    spec: &ServiceSpec,
    family: IpFamily,
    fields: &FieldErrors,
) -> Result<Vec<IpAddr>, ServiceError> {
    let mut ips = Vec::new();
    for (index, text) in spec.external_ips.iter().flatten().enumerate() {
        let ip = fields.ip(format!("spec.externalIPs[{index}]"), text)?;
        keep_if_family(&mut ips, ip, family, "spec.externalIPs");
    }
    Ok(ips)
}

/// Ingress IPs in `VIP` mode (an unset `ipMode` means VIP); `Proxy` mode
/// load balancers deliver packets addressed to the node, so capturing their IP
/// would hijack traffic meant for the load balancer itself.
fn load_balancer_ips(
    service: &Service,
    family: IpFamily,
    fields: &FieldErrors,
) -> Result<Vec<IpAddr>, ServiceError> {
    let ingress = service
        .status
        .as_ref()
        .and_then(|status| status.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or_default();
    let mut ips = Vec::new();
    for (index, entry) in ingress.iter().enumerate() {
        let Some(text) = entry.ip.as_deref().filter(|text| !text.is_empty()) else {
            continue;
        };
        if !matches!(entry.ip_mode.as_deref(), None | Some("VIP")) {
            continue;
        }
        let ip = fields.ip(format!("status.loadBalancer.ingress[{index}].ip"), text)?;
        keep_if_family(&mut ips, ip, family, "status.loadBalancer.ingress");
    }
    Ok(ips)
}

fn source_ranges(
    spec: &ServiceSpec,
    family: IpFamily,
    fields: &FieldErrors,
) -> Result<Vec<IpNet>, ServiceError> {
    let mut ranges = Vec::new();
    for (index, text) in spec
        .load_balancer_source_ranges
        .iter()
        .flatten()
        .enumerate()
    {
        let range = parse_cidr(text).ok_or_else(|| {
            fields.invalid(
                format!("spec.loadBalancerSourceRanges[{index}]"),
                text,
                "must be a CIDR such as 192.168.0.0/16 or fd00::/64",
            )
        })?;
        if family.matches(&range.addr()) {
            ranges.push(range);
        } else {
            tracing::debug!(field = "spec.loadBalancerSourceRanges", %range, %family, "ignoring range of the other IP family");
        }
    }
    Ok(ranges)
}

fn keep_if_family(ips: &mut Vec<IpAddr>, ip: IpAddr, family: IpFamily, field: &'static str) {
    if family.matches(&ip) {
        ips.push(ip);
    } else {
        tracing::debug!(field, %ip, %family, "ignoring address of the other IP family");
    }
}

fn session_affinity_timeout(
    spec: &ServiceSpec,
    fields: &FieldErrors,
) -> Result<Option<Duration>, ServiceError> {
    if spec.session_affinity.as_deref() != Some("ClientIP") {
        return Ok(None);
    }
    let configured = spec
        .session_affinity_config
        .as_ref()
        .and_then(|config| config.client_ip.as_ref())
        .and_then(|client_ip| client_ip.timeout_seconds);
    match configured {
        None => Ok(Some(DEFAULT_SESSION_AFFINITY_TIMEOUT)),
        Some(secs @ 1..=MAX_SESSION_AFFINITY_TIMEOUT_SECS) => {
            Ok(Some(Duration::from_secs(u64::from(secs.unsigned_abs()))))
        }
        Some(secs) => Err(fields.invalid(
            "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
            secs,
            "must be between 1 and 86400",
        )),
    }
}

fn topology_mode(meta: &ObjectMeta) -> Option<String> {
    let annotations = meta.annotations.as_ref()?;
    [ANNOTATION_TOPOLOGY_AWARE_HINTS, ANNOTATION_TOPOLOGY_MODE]
        .iter()
        .filter_map(|key| annotations.get(*key))
        .find(|value| !value.is_empty())
        .cloned()
}

fn port_number(value: i32, fields: &FieldErrors, field: String) -> Result<u16, ServiceError> {
    u16::try_from(value)
        .ok()
        .filter(|port| *port != 0)
        .ok_or_else(|| fields.invalid(field, value, "must be between 1 and 65535"))
}
