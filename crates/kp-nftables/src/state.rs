//! What the last successful transaction left in the `kube-proxy` table, as
//! far as partial syncs need to know it: per Service, its map and set
//! elements, its chains and its affinity sets; and the chains waiting to be
//! deleted. With the data layout ([`crate::options::Layout::Data`]) also
//! the endpoint in each slot of a service port, the draw rules its entries
//! need, and how many Services use each hairpin pair.
//!
//! Every transaction is atomic, so a failed one leaves the kernel as the
//! last successful one did and this record stays true; only someone else
//! editing the table can make it wrong, and the periodic full sync rewrites
//! everything it holds.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use kp_model::{NamespacedName, Protocol};

use crate::model::{Key, MapElement, SetElement, Verdict};
use crate::names::{count_set, group_of_count, group_set, slot_map, Pool};

/// One element of a set or verdict map of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element {
    /// The set or map, e.g. `service-ips`.
    pub map: &'static str,
    /// The key, e.g. `10.96.0.10 . tcp . 80` (see [`Element::key`]).
    key: RecordKey,
    /// What it maps to, if anything.
    pub data: ElementData,
    /// The element's comment (`ns/svc:port`), if any.
    pub comment: Option<Arc<str>>,
}

/// An element's key as the record holds it: the kinds of key the renderer
/// writes, inline, in 24 bytes. [`Key`] is 40 bytes since it can hold two
/// IPv6 addresses (affinity entries, which the record never holds); a
/// record holds a key for each element of every Service, so that size
/// would be paid 10,000s of times.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RecordKey {
    Addr(IpAddr),
    AddrProtoPort(IpAddr, Protocol, u16),
    ProtoPort(Protocol, u16),
    EntrySlot(IpAddr, u16, u32),
    PortSlot(u16, u32),
    /// `A . A` (a hairpin pair).
    SelfPair(IpAddr),
    /// Any other key.
    Other(Box<Key>),
}

impl RecordKey {
    fn new(key: Key) -> Self {
        match key {
            Key::Addr(address) => Self::Addr(address),
            Key::AddrProtoPort(address, protocol, port) => {
                Self::AddrProtoPort(address, protocol, port)
            }
            Key::ProtoPort(protocol, port) => Self::ProtoPort(protocol, port),
            Key::EntrySlot(address, port, slot) => Self::EntrySlot(address, port, slot),
            Key::PortSlot(port, slot) => Self::PortSlot(port, slot),
            Key::AddrPair(source, destination) if source == destination => Self::SelfPair(source),
            other @ Key::AddrPair(..) => Self::Other(Box::new(other)),
        }
    }

    fn key(&self) -> Key {
        match *self {
            Self::Addr(address) => Key::Addr(address),
            Self::AddrProtoPort(address, protocol, port) => {
                Key::AddrProtoPort(address, protocol, port)
            }
            Self::ProtoPort(protocol, port) => Key::ProtoPort(protocol, port),
            Self::EntrySlot(address, port, slot) => Key::EntrySlot(address, port, slot),
            Self::PortSlot(port, slot) => Key::PortSlot(port, slot),
            Self::SelfPair(address) => Key::AddrPair(address, address),
            Self::Other(ref key) => **key,
        }
    }
}

/// What an element maps to: one field rather than an optional verdict
/// beside an optional endpoint, so that the records of the chains layout
/// (which has no endpoint maps) stay as small as they were.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElementData {
    /// Nothing: a set element.
    None,
    /// A verdict, e.g. `goto service-…`.
    Verdict(Verdict),
    /// An endpoint, in a `service-endpoints-…` map (its address and port:
    /// a `SocketAddr` would make every element 8 bytes larger).
    Endpoint(IpAddr, u16),
}

/// What one Service holds in the table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceRecord {
    /// Its elements, sorted by map and key, without duplicate keys.
    pub elements: Vec<Element>,
    /// Its chains (`service-`, `local-`, `external-`, `firewall-`,
    /// `endpoint-`), sorted.
    pub chains: Vec<Arc<str>>,
    /// Its `affinity-` sets, sorted.
    pub affinity_sets: Vec<Arc<str>>,
    /// Rules in its chains.
    pub rules: usize,
    /// A fingerprint of its chains' commands (declarations and rules, as
    /// rendered): equal records mean equal chains, so a partial sync need
    /// not rewrite them.
    pub chain_text_hash: u64,
    /// What the data layout records besides (`None` in the default
    /// layout: boxed, so that its records stay as small as they were).
    pub data: Option<Box<DataRecord>>,
}

/// What a Service holds in the table in the data layout, besides what
/// every layout records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataRecord {
    /// Each chain's fingerprint, sorted by chain, so a partial sync
    /// rewrites only the chains whose commands changed.
    pub chain_hashes: Vec<(Arc<str>, u64)>,
    /// The endpoint draws of its service ports, sorted.
    pub draws: Vec<Draw>,
    /// The endpoint addresses whose `A . A` pair it needs in
    /// `hairpin-endpoints`, sorted, without duplicates.
    pub hairpin: Vec<IpAddr>,
    /// The draw rules (by pool, protocol and endpoint count) its entries
    /// need; sorted, without duplicates.
    pub classes: Vec<Class>,
}

/// One draw rule of the data layout's class chains: the entries of `pool`
/// and `protocol` that have `count` endpoints (those in the count set) draw
/// one of their `count` slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Class {
    /// The entries' pool; NodePorts sort after addresses.
    pub pool: Pool,
    /// Their protocol.
    pub protocol: Protocol,
    /// Their endpoint count.
    pub count: u32,
}

/// The data layout: one list of endpoints a service port draws from (its
/// cluster list, or its local list).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Draw {
    /// The service port's name (`port` of the Service's ports).
    pub port: Arc<str>,
    /// The service port's protocol.
    pub protocol: Protocol,
    /// Whether this is the local endpoint list (eTP/iTP Local).
    pub local: bool,
    /// The endpoint in each slot (slot `i` is `endpoints[i]`).
    pub endpoints: Vec<SocketAddr>,
    /// The entries that draw from it (none while it has no endpoint): each
    /// is an element of the count set of its pool and endpoint count, and
    /// has a slot element per endpoint in the slot map of its pool and
    /// protocol. Those elements are not recorded but derived
    /// ([`Draw::elements`]): at 5,000 service ports × 50 endpoints they
    /// would be 250,000 recorded elements that repeat the endpoints.
    pub entries: Vec<Entry>,
}

/// An entry of a [`Draw`]: where a packet's destination is looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Entry {
    /// An address (ClusterIP, external IP, load-balancer IP) and the
    /// service port: `address . protocol . port` in the count set.
    Addr(IpAddr, u16),
    /// A NodePort: `protocol . node port` in the count set.
    NodePort(u16),
}

impl Entry {
    /// Its key in its count set.
    pub fn key(self, protocol: Protocol) -> Key {
        match self {
            Self::Addr(ip, port) => Key::AddrProtoPort(ip, protocol, port),
            Self::NodePort(port) => Key::ProtoPort(protocol, port),
        }
    }

    /// The key of its slot `slot` in its slot map: `address . port . slot`
    /// or `node port . slot`.
    pub fn slot_key(self, slot: u32) -> Key {
        match self {
            Self::Addr(ip, port) => Key::EntrySlot(ip, port, slot),
            Self::NodePort(port) => Key::PortSlot(port, slot),
        }
    }
}

impl Draw {
    /// The pool of `entry` of this draw.
    pub fn pool(&self, entry: Entry) -> Pool {
        Pool {
            local: self.local,
            node_port: matches!(entry, Entry::NodePort(_)),
        }
    }

    /// The count-set, group-set and slot elements of its entries, in no
    /// particular order.
    pub fn elements(&self) -> impl Iterator<Item = Element> + '_ {
        // A draw's endpoints are a service port's, held in memory: far
        // fewer than 2^32.
        let count = u32::try_from(self.endpoints.len()).unwrap_or(u32::MAX);
        self.entries.iter().flat_map(move |&entry| {
            let pool = self.pool(entry);
            let key = entry.key(self.protocol);
            let sets = [
                Element::set(count_set(pool, count), key),
                Element::set(group_set(pool, group_of_count(count)), key),
            ];
            let map = slot_map(pool, self.protocol);
            let slots = (0..).zip(&self.endpoints).map(move |(slot, endpoint)| {
                Element::endpoint(map, entry.slot_key(slot), *endpoint)
            });
            sets.into_iter().chain(slots)
        })
    }

    /// How many elements [`Draw::elements`] gives.
    fn element_count(&self) -> usize {
        self.entries.len() * (2 + self.endpoints.len())
    }
}

/// The table as the last successful transaction left it.
#[derive(Debug, Clone, Default)]
pub struct Programmed {
    /// Per Service.
    pub services: BTreeMap<NamespacedName, ServiceRecord>,
    /// Chains flushed because no Service uses them any more, with the time
    /// they were flushed; deleted by a later transaction.
    pub stale_chains: BTreeMap<Arc<str>, Instant>,
    /// The data layout: the draw rules and count sets the table holds (kept
    /// until a full sync when no Service needs them any more); the group
    /// chains and group sets it holds are those of these classes.
    pub classes: BTreeSet<Class>,
    /// The data layout: for each address in `hairpin-endpoints`, how many
    /// Services need it.
    pub hairpin: BTreeMap<IpAddr, usize>,
}

/// The change a rendered transaction makes to [`Programmed`], applied once
/// the kernel accepted the transaction.
#[derive(Debug, Clone, Default)]
pub struct StateDelta {
    /// Replace everything (a full sync) instead of the listed Services.
    pub replace_all: bool,
    /// New records of Services; `None` removes the Service.
    pub services: Vec<(NamespacedName, Option<ServiceRecord>)>,
    /// Services whose record stays as it is (with `replace_all`, every
    /// other Service not in `services` is forgotten).
    pub unchanged: Vec<NamespacedName>,
    /// Chains flushed by this transaction, to delete later.
    pub newly_stale: Vec<Arc<str>>,
    /// Stale chains this transaction deleted or that are in use again.
    pub no_longer_stale: Vec<Arc<str>>,
    /// The data layout's classes this transaction wrote: every class the
    /// table holds after it (with `replace_all`), or those it added.
    pub classes: BTreeSet<Class>,
    /// The data layout's classes this transaction removed (without
    /// `replace_all`).
    pub classes_dropped: BTreeSet<Class>,
    /// The time of the sync.
    pub now: Option<Instant>,
}

impl Element {
    /// A set element.
    pub fn set(map: &'static str, key: Key) -> Self {
        Self {
            map,
            key: RecordKey::new(key),
            data: ElementData::None,
            comment: None,
        }
    }

    /// A map element.
    pub fn map(map: &'static str, key: Key, value: Verdict, comment: Option<Arc<str>>) -> Self {
        Self {
            map,
            key: RecordKey::new(key),
            data: ElementData::Verdict(value),
            comment,
        }
    }

    /// An element of a map whose data is an endpoint.
    pub fn endpoint(map: &'static str, key: Key, target: SocketAddr) -> Self {
        Self {
            map,
            key: RecordKey::new(key),
            data: ElementData::Endpoint(target.ip(), target.port()),
            comment: None,
        }
    }

    /// The element as `add element` writes it into a map whose data is an
    /// endpoint; `None` for other elements.
    pub fn to_map_element(&self) -> Option<MapElement> {
        match self.data {
            ElementData::Endpoint(address, port) => Some(MapElement {
                key: self.key(),
                comment: self.comment.clone(),
                target: SocketAddr::new(address, port),
            }),
            ElementData::None | ElementData::Verdict(_) => None,
        }
    }

    /// The element as `add element` writes it.
    pub fn to_set_element(&self) -> SetElement {
        SetElement {
            key: self.key(),
            comment: self.comment.clone(),
            verdict: match &self.data {
                ElementData::Verdict(verdict) => Some(verdict.clone()),
                ElementData::None | ElementData::Endpoint(..) => None,
            },
        }
    }

    /// Its key.
    pub fn key(&self) -> Key {
        self.key.key()
    }

    /// Same map and key.
    pub fn same_key(&self, other: &Element) -> bool {
        self.map == other.map && self.key == other.key
    }
}

impl ServiceRecord {
    /// Sorts the elements and drops later duplicates of a key (two ports of
    /// one Service share their ClusterIP in `cluster-ips`).
    /// The vectors are cut to their length: a record lives until the
    /// Service changes, and 10,000 of them held 1.6 MB of unused capacity.
    pub fn normalize(&mut self) {
        self.elements
            .sort_by(|a, b| (a.map, a.key()).cmp(&(b.map, b.key())));
        self.elements
            .dedup_by(|later, earlier| later.same_key(earlier));
        self.elements.shrink_to_fit();
        self.chains.sort_unstable();
        self.chains.dedup();
        self.chains.shrink_to_fit();
        self.affinity_sets.sort_unstable();
        self.affinity_sets.dedup();
        self.affinity_sets.shrink_to_fit();
        if let Some(data) = &mut self.data {
            data.normalize();
        }
    }

    /// Every element the Service holds in the table, sorted by map and
    /// key: those recorded, and those derived from the data layout's draws
    /// ([`Draw::elements`]).
    pub fn all_elements(&self) -> Vec<Element> {
        if self.data().draws.iter().all(|draw| draw.entries.is_empty()) {
            return self.elements.clone();
        }
        let mut all = Vec::with_capacity(self.element_count());
        all.extend(self.elements.iter().cloned());
        all.extend(self.data().draws.iter().flat_map(Draw::elements));
        all.sort_by(|a, b| (a.map, a.key()).cmp(&(b.map, b.key())));
        all
    }

    /// Hands every element the Service holds in the table to `each`, in no
    /// particular order, without collecting them.
    pub fn for_each_element(&self, mut each: impl FnMut(&Element)) {
        self.elements.iter().for_each(&mut each);
        for draw in &self.data().draws {
            for element in draw.elements() {
                each(&element);
            }
        }
    }

    /// How many elements the Service holds in the table.
    pub fn element_count(&self) -> usize {
        self.elements.len()
            + self
                .data()
                .draws
                .iter()
                .map(Draw::element_count)
                .sum::<usize>()
    }

    /// The data layout's part of the record (empty in the default layout).
    pub fn data(&self) -> &DataRecord {
        static EMPTY: DataRecord = DataRecord::new();
        self.data.as_deref().unwrap_or(&EMPTY)
    }

    /// The data layout's part of the record, made if there is none yet.
    pub fn data_mut(&mut self) -> &mut DataRecord {
        self.data.get_or_insert_with(Box::default)
    }
}

impl DataRecord {
    /// An empty one.
    pub const fn new() -> Self {
        Self {
            chain_hashes: Vec::new(),
            draws: Vec::new(),
            hairpin: Vec::new(),
            classes: Vec::new(),
        }
    }

    /// Sorts its lists and drops duplicates, cut to their length.
    fn normalize(&mut self) {
        self.chain_hashes.sort_unstable();
        self.chain_hashes.shrink_to_fit();
        self.draws.sort_unstable();
        self.draws.shrink_to_fit();
        self.hairpin.sort_unstable();
        self.hairpin.dedup();
        self.hairpin.shrink_to_fit();
        self.classes.sort_unstable();
        self.classes.dedup();
        self.classes.shrink_to_fit();
    }
}

impl Programmed {
    /// Applies `delta` (the kernel accepted its transaction).
    pub fn commit(&mut self, mut delta: StateDelta) {
        if delta.replace_all {
            delta.unchanged.sort_unstable();
            self.services
                .retain(|service, _| delta.unchanged.binary_search(service).is_ok());
        }
        let replace_all = delta.replace_all;
        for (service, record) in delta.services {
            if !replace_all {
                if let Some(old) = self.services.get(&service) {
                    uncount(&mut self.hairpin, old);
                }
            }
            match record {
                Some(record) => {
                    if !replace_all {
                        count(&mut self.hairpin, &record);
                    }
                    self.services.insert(service, record);
                }
                None => {
                    self.services.remove(&service);
                }
            }
        }
        if replace_all {
            self.hairpin.clear();
            for record in self.services.values() {
                count(&mut self.hairpin, record);
            }
        }
        if replace_all {
            self.classes = delta.classes;
        } else {
            self.classes.append(&mut delta.classes);
            for class in &delta.classes_dropped {
                self.classes.remove(class);
            }
        }
        for chain in delta.no_longer_stale {
            self.stale_chains.remove(&chain);
        }
        if let Some(now) = delta.now {
            for chain in delta.newly_stale {
                self.stale_chains.insert(chain, now);
            }
        }
    }

    /// Forgets everything (the table is deleted and written afresh).
    pub fn clear(&mut self) {
        self.services.clear();
        self.stale_chains.clear();
        self.classes.clear();
        self.hairpin.clear();
    }

    /// Chains and rules of every Service.
    pub fn totals(&self) -> (usize, usize, usize) {
        self.services
            .values()
            .fold((0, 0, 0), |(chains, rules, elements), record| {
                (
                    chains + record.chains.len(),
                    rules + record.rules,
                    elements + record.element_count(),
                )
            })
    }
}

/// Adds the hairpin pairs `record` holds to the counts.
fn count(hairpin: &mut BTreeMap<IpAddr, usize>, record: &ServiceRecord) {
    for ip in &record.data().hairpin {
        *hairpin.entry(*ip).or_default() += 1;
    }
}

/// Takes what `record` held off the counts.
fn uncount(hairpin: &mut BTreeMap<IpAddr, usize>, record: &ServiceRecord) {
    release(hairpin, &record.data().hairpin);
}

/// Takes one user off each of `keys`, forgetting those left without any.
fn release<K: Ord>(counts: &mut BTreeMap<K, usize>, keys: &[K]) {
    for key in keys {
        if let Some(users) = counts.get_mut(key) {
            *users = users.saturating_sub(1);
            if *users == 0 {
                counts.remove(key);
            }
        }
    }
}

#[cfg(test)]
mod size_tests {
    use super::*;

    /// A record holds an element for each set or map entry of every
    /// Service: its size is paid 10,000s of times at 10,000 Services.
    #[test]
    fn an_element_of_the_record_is_88_bytes() {
        assert_eq!(std::mem::size_of::<Element>(), 88);
    }
}
