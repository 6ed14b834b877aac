//! Endpoints: the backends of a service port, merged from EndpointSlices.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::{Endpoint as ApiEndpoint, EndpointSlice};

use crate::ip::parse_ip;
use crate::service::{IpFamily, NamespacedName, Protocol, ServicePortName};
use crate::vec_map::VecMap;
use crate::LABEL_SERVICE_NAME;

/// One backend of one service port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// The endpoint's address.
    pub ip: IpAddr,
    /// The target port.
    pub port: u16,
    /// `conditions.ready` (unset counts as ready).
    pub ready: bool,
    /// `conditions.serving` (unset falls back to `ready`).
    pub serving: bool,
    /// `conditions.terminating` (unset counts as false).
    pub terminating: bool,
    /// `nodeName` equals this proxy's node name.
    pub is_local: bool,
    /// `nodeName`, when set.
    pub node_name: Option<Arc<str>>,
    /// `zone`, when set.
    pub zone: Option<Arc<str>>,
    /// `hints.forZones[].name`; `None` when the endpoint has no zone hints.
    pub zone_hints: Option<BTreeSet<String>>,
    /// `hints.forNodes[].name`; `None` when the endpoint has no node hints.
    pub node_hints: Option<BTreeSet<String>>,
}

/// Every service port's endpoints, for one IP family. Endpoints of one
/// service port are sorted by (ip, port) and free of duplicates.
pub type EndpointsMap = HashMap<ServicePortName, Vec<Arc<Endpoint>>>;

/// The endpoints of one Service's ports, in a stable order.
pub(crate) type ServiceEndpoints = VecMap<ServicePortName, Vec<Arc<Endpoint>>>;

/// One EndpointSlice, reduced to what the proxy uses.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SliceInfo {
    /// The Service the slice belongs to.
    pub(crate) service: NamespacedName,
    /// Usable ports, each with the slice's usable endpoints on that port.
    /// The endpoints are the very ones a merge hands out, so a Service's
    /// endpoints are held once, not once per slice and once merged.
    ports: Box<[(ServicePortName, SliceEndpoints)]>,
}

/// The endpoints of one slice on one of its ports.
type SliceEndpoints = Box<[Arc<Endpoint>]>;

/// Node and zone names seen in one slice: its endpoints share one string
/// per name (a slice's endpoints mostly sit on a few nodes of one zone).
#[derive(Default)]
struct Names {
    seen: Vec<Arc<str>>,
}

/// Merges EndpointSlices into the endpoints of every service port of
/// `family`, as the [`crate::EndpointsChangeTracker`] does: slices of another
/// address type (`FQDN`, the other family) and slices without the
/// `kubernetes.io/service-name` label are ignored, endpoints and ports that do
/// not parse are skipped with a warning, and an `ip:port` listed by several
/// slices is kept once (a local copy wins, then the slice first by name).
pub fn endpoints_from_slices(
    slices: &[EndpointSlice],
    family: IpFamily,
    node_name: &str,
) -> EndpointsMap {
    let mut by_service: BTreeMap<NamespacedName, BTreeMap<String, SliceInfo>> = BTreeMap::new();
    for slice in slices {
        if let Some(info) = SliceInfo::parse(slice, family, node_name) {
            let slice_name = slice.metadata.name.clone().unwrap_or_default();
            by_service
                .entry(info.service.clone())
                .or_default()
                .insert(slice_name, info);
        }
    }
    by_service
        .values()
        .flat_map(|slices| merge_slices(slices.values()))
        .collect()
}

impl Endpoint {
    /// `ip:port`.
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.port)
    }
}

/// `ip:port` (`[ip]:port` for IPv6), as upstream prints an endpoint (and
/// hashes it into `KUBE-SEP-` chain names).
impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.socket_addr())
    }
}

impl SliceInfo {
    /// Reduces `slice`; `None` when the slice is not for `family` or names no
    /// Service.
    pub(crate) fn parse(slice: &EndpointSlice, family: IpFamily, node_name: &str) -> Option<Self> {
        let slice_name = slice_key(slice);
        if slice.address_type != family.as_api_str() {
            tracing::trace!(slice = %slice_name, address_type = %slice.address_type, %family, "ignoring EndpointSlice of another address type");
            return None;
        }
        let service = service_of(slice)?;
        let ports = parse_ports(slice, &service, &slice_name);
        let mut names = Names::default();
        let endpoints: Vec<Endpoint> = slice
            .endpoints
            .iter()
            .filter_map(|endpoint| {
                parse_endpoint(endpoint, family, node_name, &slice_name, &mut names)
            })
            .collect();
        let ports = ports
            .into_iter()
            .map(|(port_name, port)| {
                let with_port = endpoints
                    .iter()
                    .map(|endpoint| {
                        Arc::new(Endpoint {
                            port,
                            ..endpoint.clone()
                        })
                    })
                    .collect();
                (port_name, with_port)
            })
            .collect();
        Some(Self { service, ports })
    }
}

impl Names {
    fn shared(&mut self, name: &str) -> Arc<str> {
        if let Some(known) = self.seen.iter().find(|known| ***known == *name) {
            return Arc::clone(known);
        }
        let new: Arc<str> = Arc::from(name);
        self.seen.push(Arc::clone(&new));
        new
    }
}

/// The Service an EndpointSlice belongs to, from its
/// `kubernetes.io/service-name` label.
pub(crate) fn service_of(slice: &EndpointSlice) -> Option<NamespacedName> {
    let service_name = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(LABEL_SERVICE_NAME))
        .filter(|name| !name.is_empty());
    let Some(service_name) = service_name else {
        tracing::debug!(slice = %slice_key(slice), label = LABEL_SERVICE_NAME, "ignoring EndpointSlice without service name label");
        return None;
    };
    let namespace = slice.metadata.namespace.clone().unwrap_or_default();
    Some(NamespacedName::new(namespace, service_name.clone()))
}

/// Merges the slices of one Service (in the order given, which callers keep
/// stable by sorting by slice name).
pub(crate) fn merge_slices<'a>(slices: impl Iterator<Item = &'a SliceInfo>) -> ServiceEndpoints {
    let mut by_port: BTreeMap<&ServicePortName, BTreeMap<(IpAddr, u16), &Arc<Endpoint>>> =
        BTreeMap::new();
    for slice in slices {
        for (port_name, endpoints) in slice.ports.iter() {
            let merged = by_port.entry(port_name).or_default();
            for endpoint in endpoints.iter() {
                let key = (endpoint.ip, endpoint.port);
                // The same address may sit in two slices while it moves between
                // them; keep the first copy, unless a later one is local.
                let replace = merged
                    .get(&key)
                    .is_none_or(|kept| endpoint.is_local && !kept.is_local);
                if replace {
                    merged.insert(key, endpoint);
                }
            }
        }
    }
    by_port
        .into_iter()
        .filter(|(_, endpoints)| !endpoints.is_empty())
        .map(|(name, endpoints)| {
            let endpoints: Vec<Arc<Endpoint>> = endpoints.into_values().map(Arc::clone).collect();
            (name.clone(), endpoints)
        })
        .collect()
}

/// `namespace/name` of a slice, for log fields.
fn slice_key(slice: &EndpointSlice) -> NamespacedName {
    NamespacedName::of(&slice.metadata)
}

fn parse_ports(
    slice: &EndpointSlice,
    service: &NamespacedName,
    slice_name: &NamespacedName,
) -> Vec<(ServicePortName, u16)> {
    let mut ports = Vec::new();
    for port in slice.ports.iter().flatten() {
        let name = port.name.as_deref().unwrap_or_default();
        let protocol = match port.protocol.as_deref() {
            None | Some("") => Some(Protocol::Tcp),
            Some(text) => Protocol::from_api(text),
        };
        let Some(protocol) = protocol else {
            tracing::warn!(slice = %slice_name, port = %name, protocol = ?port.protocol, "ignoring EndpointSlice port with unknown protocol");
            continue;
        };
        let number = port
            .port
            .and_then(|number| u16::try_from(number).ok())
            .filter(|number| *number != 0);
        let Some(number) = number else {
            tracing::warn!(slice = %slice_name, port = %name, number = ?port.port, "ignoring EndpointSlice port without a number in 1..=65535");
            continue;
        };
        ports.push((
            ServicePortName::new(service.clone(), name, protocol),
            number,
        ));
    }
    ports
}

fn parse_endpoint(
    endpoint: &ApiEndpoint,
    family: IpFamily,
    node_name: &str,
    slice_name: &NamespacedName,
    names: &mut Names,
) -> Option<Endpoint> {
    // Like upstream, only the first address is used: the API defines the
    // others as interchangeable and no controller sets more than one.
    let Some(address) = endpoint.addresses.first() else {
        tracing::warn!(slice = %slice_name, "ignoring endpoint without addresses");
        return None;
    };
    let Some(ip) = parse_ip(address) else {
        tracing::warn!(slice = %slice_name, %address, "ignoring endpoint whose address is not an IP address");
        return None;
    };
    if !family.matches(&ip) {
        tracing::warn!(slice = %slice_name, %ip, %family, "ignoring endpoint of the wrong IP family");
        return None;
    }
    let conditions = endpoint.conditions.as_ref();
    let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
    let hints = endpoint.hints.as_ref();
    Some(Endpoint {
        ip,
        port: 0,
        ready,
        serving: conditions.and_then(|c| c.serving).unwrap_or(ready),
        terminating: conditions.and_then(|c| c.terminating).unwrap_or(false),
        is_local: !node_name.is_empty() && endpoint.node_name.as_deref() == Some(node_name),
        node_name: endpoint.node_name.as_deref().map(|name| names.shared(name)),
        zone: endpoint.zone.as_deref().map(|zone| names.shared(zone)),
        zone_hints: hint_names(
            hints
                .and_then(|h| h.for_zones.as_ref())
                .map(|zones| zones.iter().map(|zone| zone.name.clone()).collect()),
        ),
        node_hints: hint_names(
            hints
                .and_then(|h| h.for_nodes.as_ref())
                .map(|nodes| nodes.iter().map(|node| node.name.clone()).collect()),
        ),
    })
}

/// An empty hint list counts as no hints, as upstream treats it.
fn hint_names(names: Option<BTreeSet<String>>) -> Option<BTreeSet<String>> {
    names.filter(|names| !names.is_empty())
}
