//! Story-style builders for Services, EndpointSlices and Nodes.
//!
//! Each entry point takes the object's identity and a closure that receives a
//! builder and returns it, so a test reads as one sentence:
//!
//! ```
//! use kp_testkit::builders::{endpoint_slice, service};
//!
//! let svc = service("ns1", "svc1", |s| {
//!     s.cluster_ip("10.96.0.41")
//!         .port("p80", 80, "TCP")
//!         .node_port(30080)
//!         .service_type("NodePort")
//! });
//! let slice = endpoint_slice("ns1", "svc1-abc", "svc1", |e| {
//!     e.port("p80", 8080, "TCP")
//!         .endpoint("10.244.1.2", |ep| ep.ready(true).node("node-1"))
//! });
//! assert_eq!(svc.spec.unwrap().cluster_ip.as_deref(), Some("10.96.0.41"));
//! assert_eq!(slice.endpoints.len(), 1);
//! ```
//!
//! Builders only fill what a test asks for: an endpoint without `.ready(..)`
//! has no `ready` condition at all, which is how tests cover the defaults.
//! Values are taken as they would appear in YAML (strings for addresses,
//! protocols and policies), so tests can also feed invalid values.

use std::collections::BTreeMap;
use std::fmt::Display;

use k8s_openapi::api::core::v1::{
    ClientIPConfig, LoadBalancerIngress, LoadBalancerStatus, Node, NodeAddress, NodeSpec,
    NodeStatus, Service, ServicePort, ServiceSpec, ServiceStatus, SessionAffinityConfig, Taint,
};
use k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForNode, ForZone,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;

/// Label on an EndpointSlice naming the Service it belongs to.
const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";

/// Builds a Service `namespace/name` of type `ClusterIP` with nothing else set,
/// then lets `build` describe the rest.
pub fn service(
    namespace: &str,
    name: &str,
    build: impl FnOnce(ServiceBuilder) -> ServiceBuilder,
) -> Service {
    let start = ServiceBuilder {
        service: Service {
            metadata: meta(namespace, name),
            spec: Some(ServiceSpec {
                type_: Some("ClusterIP".to_owned()),
                ..ServiceSpec::default()
            }),
            status: None,
        },
    };
    build(start).service
}

/// Builds an EndpointSlice `namespace/name` belonging to Service
/// `namespace/service_name` (label `kubernetes.io/service-name`), of address
/// type `IPv4` unless `build` says otherwise.
pub fn endpoint_slice(
    namespace: &str,
    name: &str,
    service_name: &str,
    build: impl FnOnce(EndpointSliceBuilder) -> EndpointSliceBuilder,
) -> EndpointSlice {
    let mut metadata = meta(namespace, name);
    metadata.labels = Some(BTreeMap::from([(
        LABEL_SERVICE_NAME.to_owned(),
        service_name.to_owned(),
    )]));
    let start = EndpointSliceBuilder {
        slice: EndpointSlice {
            address_type: "IPv4".to_owned(),
            endpoints: Vec::new(),
            metadata,
            ports: None,
        },
    };
    build(start).slice
}

/// Builds a Node `name` with nothing else set, then lets `build` describe it.
pub fn node(name: &str, build: impl FnOnce(NodeBuilder) -> NodeBuilder) -> Node {
    let start = NodeBuilder {
        node: Node {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: None,
            status: None,
        },
    };
    build(start).node
}

/// Describes a Service; see [`service`]. Every method consumes and returns
/// the builder.
#[derive(Debug, Clone)]
pub struct ServiceBuilder {
    service: Service,
}

/// Describes an EndpointSlice; see [`endpoint_slice`].
#[derive(Debug, Clone)]
pub struct EndpointSliceBuilder {
    slice: EndpointSlice,
}

/// Describes one endpoint of an EndpointSlice; see
/// [`EndpointSliceBuilder::endpoint`].
#[derive(Debug, Clone)]
pub struct EndpointBuilder {
    endpoint: Endpoint,
}

/// Describes a Node; see [`node`].
#[derive(Debug, Clone)]
pub struct NodeBuilder {
    node: Node,
}

impl ServiceBuilder {
    /// `metadata.labels[key] = value`.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        insert(&mut self.service.metadata.labels, key, value);
        self
    }

    /// `metadata.annotations[key] = value`.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        insert(&mut self.service.metadata.annotations, key, value);
        self
    }

    /// `spec.type` (`ClusterIP`, `NodePort`, `LoadBalancer`, `ExternalName`).
    pub fn service_type(mut self, service_type: &str) -> Self {
        self.spec().type_ = Some(service_type.to_owned());
        self
    }

    /// `spec.clusterIP = ip` and `spec.clusterIPs = [ip]`.
    pub fn cluster_ip(self, ip: impl Display) -> Self {
        self.cluster_ips(&[ip])
    }

    /// `spec.clusterIPs = ips` and `spec.clusterIP = ips[0]` (dual-stack).
    pub fn cluster_ips(mut self, ips: &[impl Display]) -> Self {
        let ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
        let spec = self.spec();
        spec.cluster_ip = ips.first().cloned();
        spec.cluster_ips = Some(ips);
        self
    }

    /// `spec.clusterIP` alone, leaving `spec.clusterIPs` untouched (as older
    /// manifests are written).
    pub fn cluster_ip_only(mut self, ip: impl Display) -> Self {
        self.spec().cluster_ip = Some(ip.to_string());
        self
    }

    /// A headless Service: `spec.clusterIP: None`.
    pub fn headless(self) -> Self {
        self.cluster_ip("None")
    }

    /// `spec.type: ExternalName` with `spec.externalName = name`.
    pub fn external_name(mut self, name: &str) -> Self {
        let spec = self.spec();
        spec.type_ = Some("ExternalName".to_owned());
        spec.external_name = Some(name.to_owned());
        self
    }

    /// `spec.ipFamilies` (`IPv4`, `IPv6`).
    pub fn ip_families(mut self, families: &[&str]) -> Self {
        self.spec().ip_families = Some(families.iter().map(|f| (*f).to_owned()).collect());
        self
    }

    /// Appends a port to `spec.ports`: `name` (empty for an unnamed port),
    /// `port`, `protocol` (empty leaves the protocol unset). The target port is
    /// left unset; see [`ServiceBuilder::target_port`].
    pub fn port(mut self, name: &str, port: i32, protocol: &str) -> Self {
        self.spec()
            .ports
            .get_or_insert_with(Vec::new)
            .push(ServicePort {
                name: non_empty(name),
                port,
                protocol: non_empty(protocol),
                ..ServicePort::default()
            });
        self
    }

    /// `nodePort` of the port added last.
    pub fn node_port(mut self, node_port: i32) -> Self {
        if let Some(port) = self.last_port() {
            port.node_port = Some(node_port);
        }
        self
    }

    /// `targetPort` (a number) of the port added last.
    pub fn target_port(mut self, target_port: i32) -> Self {
        if let Some(port) = self.last_port() {
            port.target_port = Some(IntOrString::Int(target_port));
        }
        self
    }

    /// Appends to `spec.externalIPs`.
    pub fn external_ip(mut self, ip: impl Display) -> Self {
        push(&mut self.spec().external_ips, ip);
        self
    }

    /// `spec.loadBalancerIP` (deprecated field, not used by the proxy).
    pub fn load_balancer_ip(mut self, ip: impl Display) -> Self {
        self.spec().load_balancer_ip = Some(ip.to_string());
        self
    }

    /// Appends `{ip}` to `status.loadBalancer.ingress`.
    pub fn lb_ingress_ip(self, ip: impl Display) -> Self {
        self.push_ingress(LoadBalancerIngress {
            ip: Some(ip.to_string()),
            ..LoadBalancerIngress::default()
        })
    }

    /// Appends `{ip, ipMode}` to `status.loadBalancer.ingress` (`VIP`, `Proxy`).
    pub fn lb_ingress_ip_mode(self, ip: impl Display, ip_mode: &str) -> Self {
        self.push_ingress(LoadBalancerIngress {
            ip: Some(ip.to_string()),
            ip_mode: Some(ip_mode.to_owned()),
            ..LoadBalancerIngress::default()
        })
    }

    /// Appends `{hostname}` to `status.loadBalancer.ingress`.
    pub fn lb_ingress_hostname(self, hostname: &str) -> Self {
        self.push_ingress(LoadBalancerIngress {
            hostname: Some(hostname.to_owned()),
            ..LoadBalancerIngress::default()
        })
    }

    /// Appends to `spec.loadBalancerSourceRanges`.
    pub fn lb_source_range(mut self, cidr: impl Display) -> Self {
        push(&mut self.spec().load_balancer_source_ranges, cidr);
        self
    }

    /// `sessionAffinity: ClientIP` with `timeoutSeconds`.
    pub fn session_affinity_client_ip(mut self, timeout_secs: i32) -> Self {
        let spec = self.spec();
        spec.session_affinity = Some("ClientIP".to_owned());
        spec.session_affinity_config = Some(SessionAffinityConfig {
            client_ip: Some(ClientIPConfig {
                timeout_seconds: Some(timeout_secs),
            }),
        });
        self
    }

    /// `sessionAffinity: ClientIP` without `sessionAffinityConfig` (the
    /// timeout takes its default).
    pub fn session_affinity_client_ip_default(mut self) -> Self {
        self.spec().session_affinity = Some("ClientIP".to_owned());
        self
    }

    /// `externalTrafficPolicy: Local`.
    pub fn external_traffic_policy_local(self) -> Self {
        self.external_traffic_policy("Local")
    }

    /// `externalTrafficPolicy` as given (`Cluster`, `Local`).
    pub fn external_traffic_policy(mut self, policy: &str) -> Self {
        self.spec().external_traffic_policy = Some(policy.to_owned());
        self
    }

    /// `internalTrafficPolicy: Local`.
    pub fn internal_traffic_policy_local(self) -> Self {
        self.internal_traffic_policy("Local")
    }

    /// `internalTrafficPolicy` as given (`Cluster`, `Local`).
    pub fn internal_traffic_policy(mut self, policy: &str) -> Self {
        self.spec().internal_traffic_policy = Some(policy.to_owned());
        self
    }

    /// `spec.healthCheckNodePort`.
    pub fn health_check_node_port(mut self, port: i32) -> Self {
        self.spec().health_check_node_port = Some(port);
        self
    }

    /// `spec.trafficDistribution` (`PreferClose`, `PreferSameZone`,
    /// `PreferSameNode`).
    pub fn traffic_distribution(mut self, value: &str) -> Self {
        self.spec().traffic_distribution = Some(value.to_owned());
        self
    }

    /// `metadata.deletionTimestamp` set (the Service is being deleted).
    pub fn deleting(mut self) -> Self {
        self.service.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        self
    }

    fn spec(&mut self) -> &mut ServiceSpec {
        self.service.spec.get_or_insert_with(ServiceSpec::default)
    }

    fn last_port(&mut self) -> Option<&mut ServicePort> {
        self.spec()
            .ports
            .as_mut()
            .and_then(|ports| ports.last_mut())
    }

    fn push_ingress(mut self, ingress: LoadBalancerIngress) -> Self {
        let status = self
            .service
            .status
            .get_or_insert_with(ServiceStatus::default);
        status
            .load_balancer
            .get_or_insert_with(LoadBalancerStatus::default)
            .ingress
            .get_or_insert_with(Vec::new)
            .push(ingress);
        self
    }
}

impl EndpointSliceBuilder {
    /// `addressType` (`IPv4`, `IPv6`, `FQDN`).
    pub fn address_type(mut self, address_type: &str) -> Self {
        self.slice.address_type = address_type.to_owned();
        self
    }

    /// `metadata.labels[key] = value`.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        insert(&mut self.slice.metadata.labels, key, value);
        self
    }

    /// `metadata.annotations[key] = value`.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        insert(&mut self.slice.metadata.annotations, key, value);
        self
    }

    /// Removes the `kubernetes.io/service-name` label (an orphan slice).
    pub fn without_service_name(mut self) -> Self {
        if let Some(labels) = self.slice.metadata.labels.as_mut() {
            labels.remove(LABEL_SERVICE_NAME);
        }
        self
    }

    /// Appends a port: `name` (empty for unnamed), `port`, `protocol` (empty
    /// leaves it unset).
    pub fn port(mut self, name: &str, port: i32, protocol: &str) -> Self {
        self.slice
            .ports
            .get_or_insert_with(Vec::new)
            .push(EndpointPort {
                name: non_empty(name),
                port: Some(port),
                protocol: non_empty(protocol),
                app_protocol: None,
            });
        self
    }

    /// Appends a port whose number is unset.
    pub fn port_without_number(mut self, name: &str, protocol: &str) -> Self {
        self.slice
            .ports
            .get_or_insert_with(Vec::new)
            .push(EndpointPort {
                name: non_empty(name),
                port: None,
                protocol: non_empty(protocol),
                app_protocol: None,
            });
        self
    }

    /// Appends an endpoint with one address, described by `build`.
    pub fn endpoint(
        self,
        address: impl Display,
        build: impl FnOnce(EndpointBuilder) -> EndpointBuilder,
    ) -> Self {
        self.endpoint_addresses(&[address], build)
    }

    /// Appends an endpoint with several addresses, described by `build`.
    pub fn endpoint_addresses(
        mut self,
        addresses: &[impl Display],
        build: impl FnOnce(EndpointBuilder) -> EndpointBuilder,
    ) -> Self {
        let start = EndpointBuilder {
            endpoint: Endpoint {
                addresses: addresses.iter().map(ToString::to_string).collect(),
                ..Endpoint::default()
            },
        };
        self.slice.endpoints.push(build(start).endpoint);
        self
    }
}

impl EndpointBuilder {
    /// `conditions.ready`.
    pub fn ready(mut self, ready: bool) -> Self {
        self.conditions().ready = Some(ready);
        self
    }

    /// `conditions.serving`.
    pub fn serving(mut self, serving: bool) -> Self {
        self.conditions().serving = Some(serving);
        self
    }

    /// `conditions.terminating`.
    pub fn terminating(mut self, terminating: bool) -> Self {
        self.conditions().terminating = Some(terminating);
        self
    }

    /// A terminating endpoint that still serves: ready false, serving true,
    /// terminating true.
    pub fn terminating_serving(self) -> Self {
        self.ready(false).serving(true).terminating(true)
    }

    /// A terminating endpoint that no longer serves: ready false, serving
    /// false, terminating true.
    pub fn terminating_not_serving(self) -> Self {
        self.ready(false).serving(false).terminating(true)
    }

    /// `nodeName`.
    pub fn node(mut self, node_name: &str) -> Self {
        self.endpoint.node_name = Some(node_name.to_owned());
        self
    }

    /// `zone`.
    pub fn zone(mut self, zone: &str) -> Self {
        self.endpoint.zone = Some(zone.to_owned());
        self
    }

    /// `hostname`.
    pub fn hostname(mut self, hostname: &str) -> Self {
        self.endpoint.hostname = Some(hostname.to_owned());
        self
    }

    /// `hints.forZones[].name`.
    pub fn hints_zones(mut self, zones: &[&str]) -> Self {
        self.hints().for_zones = Some(
            zones
                .iter()
                .map(|zone| ForZone {
                    name: (*zone).to_owned(),
                })
                .collect(),
        );
        self
    }

    /// `hints.forNodes[].name`.
    pub fn hints_nodes(mut self, nodes: &[&str]) -> Self {
        self.hints().for_nodes = Some(
            nodes
                .iter()
                .map(|node| ForNode {
                    name: (*node).to_owned(),
                })
                .collect(),
        );
        self
    }

    fn conditions(&mut self) -> &mut EndpointConditions {
        self.endpoint
            .conditions
            .get_or_insert_with(EndpointConditions::default)
    }

    fn hints(&mut self) -> &mut EndpointHints {
        self.endpoint
            .hints
            .get_or_insert_with(EndpointHints::default)
    }
}

impl NodeBuilder {
    /// `metadata.labels[key] = value`.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        insert(&mut self.node.metadata.labels, key, value);
        self
    }

    /// `metadata.labels["topology.kubernetes.io/zone"] = zone`.
    pub fn zone(self, zone: &str) -> Self {
        self.label("topology.kubernetes.io/zone", zone)
    }

    /// Appends an `InternalIP` to `status.addresses`.
    pub fn internal_ip(self, ip: impl Display) -> Self {
        self.address("InternalIP", ip)
    }

    /// Appends an `ExternalIP` to `status.addresses`.
    pub fn external_ip(self, ip: impl Display) -> Self {
        self.address("ExternalIP", ip)
    }

    /// Appends an address of any type (`Hostname`, `InternalDNS`, …).
    pub fn address(mut self, address_type: &str, address: impl Display) -> Self {
        self.node
            .status
            .get_or_insert_with(NodeStatus::default)
            .addresses
            .get_or_insert_with(Vec::new)
            .push(NodeAddress {
                address: address.to_string(),
                type_: address_type.to_owned(),
            });
        self
    }

    /// Appends to `spec.podCIDRs`; the first one is also `spec.podCIDR`.
    pub fn pod_cidr(mut self, cidr: impl Display) -> Self {
        let spec = self.spec();
        let cidr = cidr.to_string();
        spec.pod_cidr.get_or_insert_with(|| cidr.clone());
        spec.pod_cidrs.get_or_insert_with(Vec::new).push(cidr);
        self
    }

    /// Appends a taint `key` with `effect` (`NoSchedule`, …).
    pub fn taint(mut self, key: &str, effect: &str) -> Self {
        self.spec().taints.get_or_insert_with(Vec::new).push(Taint {
            key: key.to_owned(),
            effect: effect.to_owned(),
            ..Taint::default()
        });
        self
    }

    /// `metadata.deletionTimestamp` set (the Node is being deleted).
    pub fn deleting(mut self) -> Self {
        self.node.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        self
    }

    fn spec(&mut self) -> &mut NodeSpec {
        self.node.spec.get_or_insert_with(NodeSpec::default)
    }
}

fn meta(namespace: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        namespace: Some(namespace.to_owned()),
        name: Some(name.to_owned()),
        ..ObjectMeta::default()
    }
}

fn insert(map: &mut Option<BTreeMap<String, String>>, key: &str, value: &str) {
    map.get_or_insert_with(BTreeMap::new)
        .insert(key.to_owned(), value.to_owned());
}

fn push(list: &mut Option<Vec<String>>, value: impl Display) {
    list.get_or_insert_with(Vec::new).push(value.to_string());
}

fn non_empty(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_owned())
}

#[cfg(test)]
mod tests;

/// The NodePort Service `ns1/NAME` of the second-node tests, of one family
/// (IPv6 with `ipv6`): port `http` 80/TCP on `node_port`, its ClusterIP
/// `10.96.0.N` or `fd00:10:96::N` with N = `node_port` − 30000, and
/// `externalTrafficPolicy: Local` with `local` (else `Cluster`).
pub fn node_port_service(ipv6: bool, name: &str, node_port: u16, local: bool) -> Service {
    let host = node_port.saturating_sub(30000);
    let (family, cluster_ip) = if ipv6 {
        ("IPv6", format!("fd00:10:96::{host}"))
    } else {
        ("IPv4", format!("10.96.0.{host}"))
    };
    service("ns1", name, |s| {
        let s = s
            .service_type("NodePort")
            .ip_families(&[family])
            .cluster_ip(cluster_ip)
            .port("http", 80, "TCP")
            .node_port(i32::from(node_port));
        if local {
            s.external_traffic_policy_local()
        } else {
            s.external_traffic_policy("Cluster")
        }
    })
}
