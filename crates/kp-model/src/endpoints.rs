//! Endpoints: the backends of a service port, merged from EndpointSlices.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use crate::service::ServicePortName;

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
    pub node_name: Option<String>,
    /// `zone`, when set.
    pub zone: Option<String>,
    /// `hints.forZones[].name`; `None` when the endpoint has no zone hints.
    pub zone_hints: Option<BTreeSet<String>>,
    /// `hints.forNodes[].name`; `None` when the endpoint has no node hints.
    pub node_hints: Option<BTreeSet<String>>,
}

/// Every service port's endpoints, for one IP family. Endpoints of one
/// service port are sorted by (ip, port) and free of duplicates.
pub type EndpointsMap = HashMap<ServicePortName, Vec<Arc<Endpoint>>>;
