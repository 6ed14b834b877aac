//! Change trackers: the state at the last sync and the state now, per object.
//!
//! Sources record events; the sync loop drains. An update that returns an
//! object to its state at the last drain cancels out and reports no change.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::endpoints::{merge_slices, EndpointsMap, ServiceEndpoints, SliceInfo};
use crate::events::ObjectEvent;
use crate::service::{
    service_ports_from_service, IpFamily, NamespacedName, Protocol, ServicePort, ServicePortMap,
    ServicePortName,
};
use crate::vec_map::VecMap;
use crate::ANNOTATION_LAST_CHANGE_TRIGGER_TIME;

/// What a drain of the [`ServiceChangeTracker`] reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServiceUpdate {
    /// Services whose service ports differ from the last drain.
    pub changed: BTreeSet<NamespacedName>,
    /// ClusterIPs of UDP and SCTP service ports that were removed (their
    /// conntrack entries are stale).
    pub deleted_cluster_ips: BTreeSet<IpAddr>,
}

/// What a drain of the [`EndpointsChangeTracker`] reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EndpointsUpdate {
    /// Services whose endpoints differ from the last drain.
    pub changed: BTreeSet<NamespacedName>,
    /// Per changed Service, the `endpoints.kubernetes.io/last-change-trigger-time`
    /// of each slice update behind the change, oldest first: once the sync
    /// applied the change, now minus each is one network-programming latency.
    pub trigger_times: BTreeMap<NamespacedName, Vec<SystemTime>>,
}

/// Tracks Services for one IP family.
#[derive(Debug)]
pub struct ServiceChangeTracker {
    family: IpFamily,
    /// Each Service's ports as of the last drain (Services without ports of
    /// this family are absent).
    applied: HashMap<NamespacedName, ServicePorts>,
    /// The state now of every Service whose ports differ from `applied`
    /// (empty when the Service is gone or ignored).
    pending: BTreeMap<NamespacedName, ServicePorts>,
    /// `applied`, flattened; shared with the sync in progress, and copied
    /// by a drain only while one still holds it.
    service_ports: Arc<ServicePortMap>,
}

/// Tracks EndpointSlices for one IP family.
#[derive(Debug)]
pub struct EndpointsChangeTracker {
    family: IpFamily,
    node_name: String,
    /// The slices now, per Service, by slice name.
    slices: HashMap<NamespacedName, VecMap<Arc<str>, SliceInfo>>,
    /// Which Service each recorded slice (`namespace/name`) belongs to.
    slice_owners: HashMap<NamespacedName, NamespacedName>,
    /// Each Service's merged endpoints as of the last drain.
    applied: HashMap<NamespacedName, ServiceEndpoints>,
    /// The merged endpoints now of every Service whose endpoints differ from
    /// `applied` (empty when it has none).
    pending: BTreeMap<NamespacedName, ServiceEndpoints>,
    /// `applied`, flattened; shared like the service port map.
    endpoints: Arc<EndpointsMap>,
    /// Trigger times of the slice updates behind each pending change.
    trigger_times: HashMap<NamespacedName, Vec<SystemTime>>,
}

/// The ports of one Service, in a stable order.
type ServicePorts = VecMap<ServicePortName, Arc<ServicePort>>;

impl ServiceChangeTracker {
    /// A tracker for Services of `family`.
    pub fn new(family: IpFamily) -> Self {
        Self {
            family,
            applied: HashMap::new(),
            pending: BTreeMap::new(),
            service_ports: Arc::default(),
        }
    }

    /// Records one Service event. Returns true when some Service now differs
    /// from its state at the last drain (the caller should ask for a sync).
    ///
    /// A Service that cannot be converted (see
    /// [`service_ports_from_service`]) keeps its last good state, so that a bad
    /// edit does not tear down working rules; the error is logged.
    pub fn record(&mut self, event: &ObjectEvent<Service>) -> bool {
        match event {
            ObjectEvent::Apply(service) => {
                let name = NamespacedName::of(&service.metadata);
                match service_ports_from_service(service, self.family) {
                    Ok(ports) => {
                        let ports = ports
                            .into_iter()
                            .map(|(port_name, port)| (port_name, Arc::new(port)))
                            .collect();
                        self.set_state(name, ports);
                    }
                    Err(error) => {
                        tracing::warn!(service = %name, family = %self.family, %error, "keeping the last good state of a Service that cannot be used");
                    }
                }
            }
            ObjectEvent::Delete(service) => {
                self.set_state(NamespacedName::of(&service.metadata), ServicePorts::new());
            }
        }
        !self.pending.is_empty()
    }

    /// Number of Services whose state differs from the last drain.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Applies every pending change to the service port map and reports what changed.
    pub fn drain(&mut self) -> ServiceUpdate {
        let mut update = ServiceUpdate::default();
        if self.pending.is_empty() {
            return update;
        }
        let service_ports = Arc::make_mut(&mut self.service_ports);
        // The first drain fills the maps from nothing: room for every
        // pending Service up front, rather than growing by doubling and
        // briefly holding both tables each time.
        if self.applied.is_empty() {
            service_ports.reserve(self.pending.len());
            self.applied.reserve(self.pending.len());
        }
        for (name, current) in std::mem::take(&mut self.pending) {
            let previous = self.applied.remove(&name).unwrap_or_default();
            for (port_name, old) in &previous {
                let new = current.get(port_name);
                if new.is_none() {
                    service_ports.remove(port_name);
                }
                let address_gone = new.is_none_or(|new| new.cluster_ip != old.cluster_ip);
                let pinned = matches!(port_name.protocol, Protocol::Udp | Protocol::Sctp);
                if pinned && address_gone {
                    update.deleted_cluster_ips.insert(old.cluster_ip);
                }
            }
            for (port_name, port) in &current {
                service_ports.insert(port_name.clone(), Arc::clone(port));
            }
            tracing::debug!(service = %name, family = %self.family, ports = current.len(), "service ports changed");
            if !current.is_empty() {
                self.applied.insert(name.clone(), current);
            }
            update.changed.insert(name);
        }
        update
    }

    /// The service ports as of the last drain.
    pub fn service_ports(&self) -> &ServicePortMap {
        &self.service_ports
    }

    /// The service ports as of the last drain, shared rather than copied:
    /// a sync renders from this while events keep arriving.
    pub fn service_ports_snapshot(&self) -> Arc<ServicePortMap> {
        Arc::clone(&self.service_ports)
    }

    fn set_state(&mut self, name: NamespacedName, current: ServicePorts) {
        let unchanged = match self.applied.get(&name) {
            Some(applied) => *applied == current,
            None => current.is_empty(),
        };
        if unchanged {
            self.pending.remove(&name);
        } else {
            self.pending.insert(name, current);
        }
    }
}

impl EndpointsChangeTracker {
    /// A tracker for EndpointSlices of `family`; endpoints whose `nodeName`
    /// is `node_name` are local.
    pub fn new(family: IpFamily, node_name: impl Into<String>) -> Self {
        Self {
            family,
            node_name: node_name.into(),
            slices: HashMap::new(),
            slice_owners: HashMap::new(),
            applied: HashMap::new(),
            pending: BTreeMap::new(),
            endpoints: Arc::default(),
            trigger_times: HashMap::new(),
        }
    }

    /// Records one EndpointSlice event. Returns true when some Service's
    /// endpoints now differ from the last drain.
    ///
    /// Slices of another address type (`FQDN`, the other family) and slices
    /// without the `kubernetes.io/service-name` label are ignored.
    ///
    /// An update that changes its Service's endpoints notes the slice's
    /// last-change trigger time; a deletion forgets the Service's noted
    /// times, since a deleted slice's annotation tells when it was last
    /// updated, not when it was deleted (upstream does the same).
    pub fn record(&mut self, event: &ObjectEvent<EndpointSlice>) -> bool {
        match event {
            ObjectEvent::Apply(slice) => {
                let key = NamespacedName::of(&slice.metadata);
                match SliceInfo::parse(slice, self.family, &self.node_name) {
                    Some(info) => {
                        let service = info.service.clone();
                        self.put_slice(key, info);
                        if let Some(time) = last_change_trigger_time(&slice.metadata) {
                            if self.pending.contains_key(&service) {
                                self.trigger_times.entry(service).or_default().push(time);
                            }
                        }
                    }
                    // A slice that lost its service label no longer counts.
                    None => {
                        self.remove_slice(&key);
                    }
                }
            }
            ObjectEvent::Delete(slice) => {
                if let Some(service) = self.remove_slice(&NamespacedName::of(&slice.metadata)) {
                    self.trigger_times.remove(&service);
                }
            }
        }
        !self.pending.is_empty()
    }

    /// Number of Services whose endpoints differ from the last drain.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Applies every pending change to the endpoints map and reports what changed.
    pub fn drain(&mut self) -> EndpointsUpdate {
        let mut update = EndpointsUpdate::default();
        if self.pending.is_empty() {
            return update;
        }
        let flat = Arc::make_mut(&mut self.endpoints);
        // As for service ports: no doubling on the first drain.
        if self.applied.is_empty() {
            flat.reserve(self.pending.len());
            self.applied.reserve(self.pending.len());
        }
        for (name, current) in std::mem::take(&mut self.pending) {
            let previous = self.applied.remove(&name).unwrap_or_default();
            for port_name in previous.keys() {
                flat.remove(port_name);
            }
            for (port_name, endpoints) in &current {
                flat.insert(port_name.clone(), endpoints.clone());
            }
            tracing::debug!(service = %name, family = %self.family, ports = current.len(), "endpoints changed");
            if !current.is_empty() {
                self.applied.insert(name.clone(), current);
            }
            if let Some(mut times) = self.trigger_times.remove(&name) {
                times.sort_unstable();
                update.trigger_times.insert(name.clone(), times);
            }
            update.changed.insert(name);
        }
        // Times of changes that cancelled out belong to no applied change.
        self.trigger_times.clear();
        update
    }

    /// The endpoints as of the last drain.
    pub fn endpoints(&self) -> &EndpointsMap {
        &self.endpoints
    }

    /// The endpoints as of the last drain, shared rather than copied.
    pub fn endpoints_snapshot(&self) -> Arc<EndpointsMap> {
        Arc::clone(&self.endpoints)
    }

    fn put_slice(&mut self, key: NamespacedName, info: SliceInfo) {
        let service = info.service.clone();
        if let Some(owner) = self.slice_owners.get(&key) {
            if *owner != service {
                // The slice moved to another Service (its label changed).
                self.remove_slice(&key);
            }
        }
        self.slice_owners.insert(key.clone(), service.clone());
        self.slices
            .entry(service.clone())
            .or_default()
            .insert(key.name, info);
        self.refresh(service);
    }

    /// Forgets a slice; returns the Service it belonged to, if it was known.
    fn remove_slice(&mut self, key: &NamespacedName) -> Option<NamespacedName> {
        let service = self.slice_owners.remove(key)?;
        if let Some(slices) = self.slices.get_mut(&service) {
            slices.remove(&key.name);
            if slices.is_empty() {
                self.slices.remove(&service);
            }
        }
        self.refresh(service.clone());
        Some(service)
    }

    /// Re-merges one Service's slices and compares with the last drain.
    fn refresh(&mut self, service: NamespacedName) {
        let current = self
            .slices
            .get(&service)
            .map(|slices| merge_slices(slices.values()))
            .unwrap_or_default();
        let unchanged = match self.applied.get(&service) {
            Some(applied) => *applied == current,
            None => current.is_empty(),
        };
        if unchanged {
            self.pending.remove(&service);
            self.trigger_times.remove(&service);
        } else {
            self.pending.insert(service, current);
        }
    }
}

/// The slice's `endpoints.kubernetes.io/last-change-trigger-time`, when it
/// is set and valid RFC 3339.
fn last_change_trigger_time(meta: &ObjectMeta) -> Option<SystemTime> {
    let text = meta
        .annotations
        .as_ref()?
        .get(ANNOTATION_LAST_CHANGE_TRIGGER_TIME)?;
    match text.parse::<k8s_openapi::jiff::Timestamp>() {
        // Times before 1970 are not trigger times of anything.
        Ok(time) => u64::try_from(time.as_nanosecond())
            .ok()
            .map(|nanos| UNIX_EPOCH + Duration::from_nanos(nanos)),
        Err(error) => {
            tracing::debug!(value = %text, %error, "ignoring an unparsable last-change-trigger-time annotation");
            None
        }
    }
}
