//! Checks that stand in for the API server's validation: manifests reach the
//! proxy without any server having looked at them.
//!
//! Each check names the field (`spec.ports[0].port`) and says what would be
//! valid. Decoded objects lose the difference between "absent" and "zero"
//! for a few required fields, so those are checked on the raw document.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kp_model::{ResourceKind, LABEL_SERVICE_NAME};
use serde_json::Value;

use crate::names;

/// One invalid field: its path and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldProblem {
    /// Path of the field, e.g. `spec.ports[0].port`.
    pub(crate) field: String,
    /// What is wrong and what would be valid.
    pub(crate) reason: String,
}

/// Which of the API server's name rules a `metadata.name` follows.
#[derive(Debug, Clone, Copy)]
enum NameRule {
    /// Services: `ValidateServiceName`, a DNS-1035 label.
    Dns1035Label,
    /// EndpointSlices and Nodes: a DNS-1123 subdomain.
    Dns1123Subdomain,
}

/// Collects the problems of one object.
#[derive(Debug, Default)]
struct Problems(Vec<FieldProblem>);

const PROTOCOLS: &[&str] = &["TCP", "UDP", "SCTP"];
const SERVICE_TYPES: &[&str] = &["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"];
const TRAFFIC_POLICIES: &[&str] = &["Cluster", "Local"];
const SESSION_AFFINITIES: &[&str] = &["None", "ClientIP"];
const ADDRESS_TYPES: &[&str] = &["IPv4", "IPv6", "FQDN"];

/// Required fields that decoding would silently turn into zero values.
pub(crate) fn check_required_fields(kind: ResourceKind, document: &Value) -> Vec<FieldProblem> {
    let mut problems = Problems::default();
    match kind {
        ResourceKind::Service => {
            let ports = document.pointer("/spec/ports").and_then(Value::as_array);
            for (i, port) in ports.into_iter().flatten().enumerate() {
                if port.is_object() && port.get("port").is_none() {
                    problems.push(
                        format!("spec.ports[{i}].port"),
                        "required field is missing (expected a port number 1-65535)",
                    );
                }
            }
        }
        ResourceKind::EndpointSlice => {
            if document.get("addressType").is_none() {
                problems.push(
                    "addressType",
                    "required field is missing (expected IPv4, IPv6 or FQDN)",
                );
            }
            let endpoints = document.get("endpoints").and_then(Value::as_array);
            for (i, endpoint) in endpoints.into_iter().flatten().enumerate() {
                if endpoint.is_object() && endpoint.get("addresses").is_none() {
                    problems.push(
                        format!("endpoints[{i}].addresses"),
                        "required field is missing (expected a list of addresses)",
                    );
                }
            }
        }
        ResourceKind::Node => {}
    }
    problems.0
}

/// Checks a decoded Service.
pub(crate) fn validate_service(service: &Service) -> Vec<FieldProblem> {
    let mut problems = Problems::default();
    check_metadata(&mut problems, &service.metadata, NameRule::Dns1035Label);
    let Some(spec) = &service.spec else {
        problems.push("spec", "required field is missing");
        return problems.0;
    };
    problems.one_of("spec.type", spec.type_.as_deref(), SERVICE_TYPES);
    problems.one_of(
        "spec.externalTrafficPolicy",
        spec.external_traffic_policy.as_deref(),
        TRAFFIC_POLICIES,
    );
    problems.one_of(
        "spec.internalTrafficPolicy",
        spec.internal_traffic_policy.as_deref(),
        TRAFFIC_POLICIES,
    );
    problems.one_of(
        "spec.sessionAffinity",
        spec.session_affinity.as_deref(),
        SESSION_AFFINITIES,
    );
    if let Some(port) = spec.health_check_node_port {
        problems.port("spec.healthCheckNodePort", port);
    }
    check_service_ports(&mut problems, spec);
    check_service_ips(&mut problems, spec);
    let ingress = service
        .status
        .as_ref()
        .and_then(|status| status.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or_default();
    for (i, ingress) in ingress.iter().enumerate() {
        if let Some(ip) = ingress.ip.as_deref().filter(|ip| !ip.is_empty()) {
            problems.ip(format!("status.loadBalancer.ingress[{i}].ip"), ip);
        }
    }
    problems.0
}

/// Checks a decoded EndpointSlice.
pub(crate) fn validate_endpoint_slice(slice: &EndpointSlice) -> Vec<FieldProblem> {
    let mut problems = Problems::default();
    check_metadata(&mut problems, &slice.metadata, NameRule::Dns1123Subdomain);
    let service_name = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(LABEL_SERVICE_NAME));
    let label_field = format!("metadata.labels[{LABEL_SERVICE_NAME}]");
    match service_name {
        Some(name) if !name.is_empty() => {
            problems.each_invalid(&label_field, name, names::label_value(name));
        }
        _ => problems.push(
            label_field,
            "required label is missing (expected the name of the EndpointSlice's Service)",
        ),
    }
    let address_type = slice.address_type.as_str();
    if !ADDRESS_TYPES.contains(&address_type) {
        problems.push(
            "addressType",
            format!("{address_type:?} is not valid (expected IPv4, IPv6 or FQDN)"),
        );
    }
    for (i, endpoint) in slice.endpoints.iter().enumerate() {
        if endpoint.addresses.is_empty() {
            problems.push(
                format!("endpoints[{i}].addresses"),
                "must hold at least one address",
            );
        }
        for (j, address) in endpoint.addresses.iter().enumerate() {
            let field = format!("endpoints[{i}].addresses[{j}]");
            check_endpoint_address(&mut problems, field, address_type, address);
        }
        if let Some(node_name) = &endpoint.node_name {
            let problems_found = names::dns1123_subdomain(node_name);
            problems.each_invalid(
                format!("endpoints[{i}].nodeName"),
                node_name,
                problems_found,
            );
        }
        if let Some(hostname) = &endpoint.hostname {
            let problems_found = names::dns1123_label(hostname);
            problems.each_invalid(format!("endpoints[{i}].hostname"), hostname, problems_found);
        }
    }
    let mut port_names = BTreeSet::new();
    for (i, port) in slice.ports.iter().flatten().enumerate() {
        let name = port.name.as_deref().unwrap_or_default();
        check_port_name(
            &mut problems,
            format!("ports[{i}].name"),
            name,
            &mut port_names,
        );
        if let Some(number) = port.port {
            problems.port(format!("ports[{i}].port"), number);
        }
        problems.one_of(
            format!("ports[{i}].protocol"),
            port.protocol.as_deref(),
            PROTOCOLS,
        );
    }
    problems.0
}

/// Checks a decoded Node.
pub(crate) fn validate_node(node: &Node) -> Vec<FieldProblem> {
    let mut problems = Problems::default();
    check_metadata(&mut problems, &node.metadata, NameRule::Dns1123Subdomain);
    if let Some(spec) = &node.spec {
        if let Some(cidr) = spec.pod_cidr.as_deref().filter(|cidr| !cidr.is_empty()) {
            problems.cidr("spec.podCIDR", cidr);
        }
        for (i, cidr) in spec.pod_cidrs.iter().flatten().enumerate() {
            problems.cidr(format!("spec.podCIDRs[{i}]"), cidr);
        }
    }
    let addresses = node.status.as_ref().and_then(|s| s.addresses.as_deref());
    for (i, address) in addresses.unwrap_or_default().iter().enumerate() {
        if address.type_ == "InternalIP" || address.type_ == "ExternalIP" {
            problems.ip(format!("status.addresses[{i}].address"), &address.address);
        }
    }
    problems.0
}

/// `metadata.name` by `rule`, and `metadata.namespace` (a DNS-1123 label)
/// when the object has one, as upstream's `ValidateObjectMeta` does.
fn check_metadata(problems: &mut Problems, metadata: &ObjectMeta, rule: NameRule) {
    match metadata.name.as_deref().filter(|name| !name.is_empty()) {
        None => problems.push(
            "metadata.name",
            "Required value: name or generateName is required",
        ),
        Some(name) => {
            let found = match rule {
                NameRule::Dns1035Label => names::dns1035_label(name),
                NameRule::Dns1123Subdomain => names::dns1123_subdomain(name),
            };
            problems.each_invalid("metadata.name", name, found);
        }
    }
    if let Some(namespace) = metadata.namespace.as_deref() {
        problems.each_invalid(
            "metadata.namespace",
            namespace,
            names::dns1123_label(namespace),
        );
    }
}

/// A port name: a DNS-1123 label when set, and unique among its siblings.
fn check_port_name<'a>(
    problems: &mut Problems,
    field: String,
    name: &'a str,
    seen: &mut BTreeSet<&'a str>,
) {
    if !name.is_empty() {
        problems.each_invalid(&field, name, names::dns1123_label(name));
    }
    if !seen.insert(name) {
        problems.push(field, format!("Duplicate value: {}", names::quoted(name)));
    }
}

fn check_service_ports(problems: &mut Problems, spec: &ServiceSpec) {
    let ports = spec.ports.as_deref().unwrap_or_default();
    let headless = spec.cluster_ip.as_deref() == Some("None");
    let external_name = spec.type_.as_deref() == Some("ExternalName");
    if ports.is_empty() && !headless && !external_name {
        problems.push(
            "spec.ports",
            "at least one port is required (unless the Service is headless or ExternalName)",
        );
    }
    let mut names = BTreeSet::new();
    let mut port_protocols = BTreeSet::new();
    for (i, port) in ports.iter().enumerate() {
        check_service_port(problems, i, port);
        let name = port.name.as_deref().unwrap_or_default();
        let field = format!("spec.ports[{i}].name");
        if ports.len() > 1 && name.is_empty() {
            problems.push(field, "Required value");
        } else {
            check_port_name(problems, field, name, &mut names);
        }
        let protocol = port.protocol.as_deref().unwrap_or("TCP");
        if !port_protocols.insert((port.port, protocol)) {
            problems.push(
                format!("spec.ports[{i}]"),
                format!("duplicate port {}/{protocol}", port.port),
            );
        }
    }
}

fn check_service_port(problems: &mut Problems, i: usize, port: &ServicePort) {
    problems.port(format!("spec.ports[{i}].port"), port.port);
    if let Some(node_port) = port.node_port {
        problems.port(format!("spec.ports[{i}].nodePort"), node_port);
    }
    problems.one_of(
        format!("spec.ports[{i}].protocol"),
        port.protocol.as_deref(),
        PROTOCOLS,
    );
    match &port.target_port {
        Some(IntOrString::Int(target)) => {
            problems.port(format!("spec.ports[{i}].targetPort"), *target);
        }
        Some(IntOrString::String(name)) if name.is_empty() => problems.push(
            format!("spec.ports[{i}].targetPort"),
            "must be a port number 1-65535 or a port name",
        ),
        _ => {}
    }
}

fn check_service_ips(problems: &mut Problems, spec: &ServiceSpec) {
    let cluster_ip = spec.cluster_ip.as_deref().filter(|ip| !ip.is_empty());
    if let Some(ip) = cluster_ip.filter(|ip| *ip != "None") {
        problems.ip("spec.clusterIP", ip);
    }
    for (i, ip) in spec.cluster_ips.iter().flatten().enumerate() {
        if ip != "None" {
            problems.ip(format!("spec.clusterIPs[{i}]"), ip);
        }
    }
    check_cluster_ip_list(
        problems,
        cluster_ip,
        spec.cluster_ips.as_deref().unwrap_or_default(),
    );
    for (i, ip) in spec.external_ips.iter().flatten().enumerate() {
        problems.ip(format!("spec.externalIPs[{i}]"), ip);
    }
    if let Some(ip) = spec.load_balancer_ip.as_deref().filter(|ip| !ip.is_empty()) {
        problems.ip("spec.loadBalancerIP", ip);
    }
    for (i, range) in spec
        .load_balancer_source_ranges
        .iter()
        .flatten()
        .enumerate()
    {
        problems.cidr(format!("spec.loadBalancerSourceRanges[{i}]"), range);
    }
}

/// `spec.clusterIPs` against `spec.clusterIP`, as upstream's
/// `ValidateServiceClusterIPsRelatedFields` and IP allocator do.
fn check_cluster_ip_list(problems: &mut Problems, cluster_ip: Option<&str>, ips: &[String]) {
    let field = "spec.clusterIPs";
    let shown = go_string_list(ips);
    match (cluster_ip, ips.first()) {
        (Some(ip), Some(first)) if ip != first => problems.push(
            field,
            format!("Invalid value: {shown}: first value must match `clusterIP`"),
        ),
        (None, Some(_)) => problems.push(
            field,
            format!("Invalid value: {shown}: must be empty when `clusterIP` is not specified"),
        ),
        _ => {}
    }
    if ips.len() > 2 {
        problems.push(
            field,
            format!("Invalid value: {shown}: may only hold up to 2 values"),
        );
    }
    let parsed: Vec<IpAddr> = ips.iter().filter_map(|ip| ip.parse().ok()).collect();
    if parsed.len() == 2 && parsed[0].is_ipv4() == parsed[1].is_ipv4() {
        problems.push(
            field,
            format!("Invalid value: {shown}: may specify no more than one IP for each IP family"),
        );
    }
    // The API server fills clusterIPs from clusterIP when only that is set.
    let (parsed, shown) = match (cluster_ip, ips.is_empty()) {
        (Some(ip), true) => (
            ip.parse().into_iter().collect(),
            go_string_list(&[ip.to_owned()]),
        ),
        _ => (parsed, shown),
    };
    // An unspecified address is in no service range: the allocator refuses it.
    for ip in parsed.iter().filter(|ip| ip.is_unspecified()) {
        problems.push(
            field,
            format!("Invalid value: {shown}: failed to allocate IP {ip}: provided IP {ip} is not in the valid range"),
        );
    }
}

/// A list of strings as upstream's error messages print it (Go's `%#v`).
pub(crate) fn go_string_list(values: &[String]) -> String {
    let quoted: Vec<String> = values.iter().map(|value| names::quoted(value)).collect();
    format!("[]string{{{}}}", quoted.join(", "))
}

fn check_endpoint_address(
    problems: &mut Problems,
    field: String,
    address_type: &str,
    address: &str,
) {
    let valid = match address_type {
        "IPv4" => address.parse::<Ipv4Addr>().is_ok(),
        "IPv6" => address.parse::<Ipv6Addr>().is_ok(),
        "FQDN" => is_fqdn(address),
        // The address type itself is reported; its addresses cannot be judged.
        _ => true,
    };
    if !valid {
        let expected = match address_type {
            "IPv4" => "an IPv4 address, as addressType is IPv4",
            "IPv6" => "an IPv6 address, as addressType is IPv6",
            _ => "a DNS name, as addressType is FQDN",
        };
        problems.push(field, format!("{address:?} is not {expected}"));
    }
}

fn is_fqdn(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .split('.')
            .all(|label| !label.is_empty() && label.len() <= 63 && label.bytes().all(is_dns_byte))
}

fn is_dns_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'-'
}

impl Problems {
    fn push(&mut self, field: impl Into<String>, reason: impl Into<String>) {
        self.0.push(FieldProblem {
            field: field.into(),
            reason: reason.into(),
        });
    }

    /// One `Invalid value` problem per message in `found`.
    fn each_invalid(&mut self, field: impl Into<String>, value: &str, found: Vec<String>) {
        let field = field.into();
        for detail in found {
            self.push(field.clone(), names::invalid_value(value, &detail));
        }
    }

    fn port(&mut self, field: impl Into<String>, port: i32) {
        if !(1..=65535).contains(&port) {
            self.push(field, format!("{port} is not a valid port (1-65535)"));
        }
    }

    fn ip(&mut self, field: impl Into<String>, ip: &str) {
        if ip.parse::<IpAddr>().is_err() {
            self.push(field, format!("{ip:?} is not a valid IP address"));
        }
    }

    fn cidr(&mut self, field: impl Into<String>, cidr: &str) {
        if cidr.trim().parse::<IpNet>().is_err() {
            self.push(
                field,
                format!("{cidr:?} is not a valid CIDR (expected e.g. 203.0.113.0/24)"),
            );
        }
    }

    fn one_of(&mut self, field: impl Into<String>, value: Option<&str>, allowed: &[&str]) {
        if let Some(value) = value {
            if !allowed.contains(&value) {
                let allowed = allowed.join(", ");
                self.push(
                    field,
                    format!("{value:?} is not valid (expected one of {allowed})"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fqdn_names_need_non_empty_dns_labels() {
        assert!(is_fqdn("api.example.com"));
        assert!(is_fqdn("db-0"));
        assert!(!is_fqdn(""));
        assert!(!is_fqdn("a..b"));
        assert!(!is_fqdn("under_score.example"));
    }
}
