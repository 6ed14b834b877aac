//! Change trackers: the state at the last sync and the state now, per object.
//!
//! Sources record events; the sync loop drains. An update that returns an
//! object to its state at the last drain cancels out and reports no change.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::endpoints::{Endpoint, EndpointsMap};
use crate::events::ObjectEvent;
use crate::service::{IpFamily, NamespacedName, ServicePortMap, ServicePortName};

/// What a drain of the [`ServiceChangeTracker`] reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServiceUpdate {
    /// Services whose service ports differ from the last drain.
    pub changed: BTreeSet<NamespacedName>,
    /// ClusterIPs of UDP service ports that were removed (their conntrack
    /// entries are stale).
    pub deleted_udp_cluster_ips: BTreeSet<IpAddr>,
}

/// What a drain of the [`EndpointsChangeTracker`] reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EndpointsUpdate {
    /// Services whose endpoints differ from the last drain.
    pub changed: BTreeSet<NamespacedName>,
    /// Endpoints that were removed or stopped being ready, per service port.
    pub stale_endpoints: Vec<(ServicePortName, Arc<Endpoint>)>,
    /// Service ports that had no ready endpoint and now have one.
    pub newly_active: BTreeSet<ServicePortName>,
}

/// Tracks Services for one IP family.
#[derive(Debug)]
pub struct ServiceChangeTracker {
    family: IpFamily,
}

/// Tracks EndpointSlices for one IP family.
#[derive(Debug)]
pub struct EndpointsChangeTracker {
    family: IpFamily,
    node_name: String,
}

impl ServiceChangeTracker {
    /// A tracker for Services of `family`.
    pub fn new(family: IpFamily) -> Self {
        Self { family }
    }

    /// Records one Service event. Returns true when some Service now differs
    /// from its state at the last drain (the caller should ask for a sync).
    pub fn record(&mut self, event: &ObjectEvent<Service>) -> bool {
        let _ = (event, self.family);
        todo!("kp-model: ServiceChangeTracker::record")
    }

    /// Number of Services whose state differs from the last drain.
    pub fn pending(&self) -> usize {
        todo!("kp-model: ServiceChangeTracker::pending")
    }

    /// Applies every pending change to the service port map and reports what changed.
    pub fn drain(&mut self) -> ServiceUpdate {
        todo!("kp-model: ServiceChangeTracker::drain")
    }

    /// The service ports as of the last drain.
    pub fn service_ports(&self) -> &ServicePortMap {
        todo!("kp-model: ServiceChangeTracker::service_ports")
    }
}

impl EndpointsChangeTracker {
    /// A tracker for EndpointSlices of `family`; endpoints whose `nodeName`
    /// is `node_name` are local.
    pub fn new(family: IpFamily, node_name: impl Into<String>) -> Self {
        Self {
            family,
            node_name: node_name.into(),
        }
    }

    /// Records one EndpointSlice event. Returns true when some Service's
    /// endpoints now differ from the last drain.
    pub fn record(&mut self, event: &ObjectEvent<EndpointSlice>) -> bool {
        let _ = (event, self.family, &self.node_name);
        todo!("kp-model: EndpointsChangeTracker::record")
    }

    /// Number of Services whose endpoints differ from the last drain.
    pub fn pending(&self) -> usize {
        todo!("kp-model: EndpointsChangeTracker::pending")
    }

    /// Applies every pending change to the endpoints map and reports what changed.
    pub fn drain(&mut self) -> EndpointsUpdate {
        todo!("kp-model: EndpointsChangeTracker::drain")
    }

    /// The endpoints as of the last drain.
    pub fn endpoints(&self) -> &EndpointsMap {
        todo!("kp-model: EndpointsChangeTracker::endpoints")
    }
}
