//! What the last successful transaction left in the `kube-proxy` table, as
//! far as partial syncs need to know it: per Service, its map and set
//! elements, its chains and its affinity sets; and the chains waiting to be
//! deleted.
//!
//! Every transaction is atomic, so a failed one leaves the kernel as the
//! last successful one did and this record stays true; only someone else
//! editing the table can make it wrong, and the periodic full sync rewrites
//! everything it holds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use kp_model::NamespacedName;

use crate::model::{Key, SetElement, Verdict};

/// One element of a set or verdict map of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element {
    /// The set or map, e.g. `service-ips`.
    pub map: &'static str,
    /// The key, e.g. `10.96.0.10 . tcp . 80`.
    pub key: Key,
    /// The verdict, e.g. `goto service-…`; `None` for a set element.
    pub value: Option<Verdict>,
    /// The element's comment (`ns/svc:port`), if any.
    pub comment: Option<Arc<str>>,
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
}

/// The table as the last successful transaction left it.
#[derive(Debug, Clone, Default)]
pub struct Programmed {
    /// Per Service.
    pub services: BTreeMap<NamespacedName, ServiceRecord>,
    /// Chains flushed because no Service uses them any more, with the time
    /// they were flushed; deleted by a later transaction.
    pub stale_chains: BTreeMap<Arc<str>, Instant>,
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
    /// The time of the sync.
    pub now: Option<Instant>,
}

impl Element {
    /// A set element.
    pub fn set(map: &'static str, key: Key) -> Self {
        Self {
            map,
            key,
            value: None,
            comment: None,
        }
    }

    /// A map element.
    pub fn map(map: &'static str, key: Key, value: Verdict, comment: Option<Arc<str>>) -> Self {
        Self {
            map,
            key,
            value: Some(value),
            comment,
        }
    }

    /// The element as `add element` writes it.
    pub fn to_set_element(&self) -> SetElement {
        SetElement {
            key: self.key,
            comment: self.comment.clone(),
            verdict: self.value.clone(),
        }
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
            .sort_by(|a, b| (a.map, &a.key).cmp(&(b.map, &b.key)));
        self.elements
            .dedup_by(|later, earlier| later.same_key(earlier));
        self.elements.shrink_to_fit();
        self.chains.sort_unstable();
        self.chains.dedup();
        self.chains.shrink_to_fit();
        self.affinity_sets.sort_unstable();
        self.affinity_sets.dedup();
        self.affinity_sets.shrink_to_fit();
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
        for (service, record) in delta.services {
            match record {
                Some(record) => {
                    self.services.insert(service, record);
                }
                None => {
                    self.services.remove(&service);
                }
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
    }

    /// Chains and rules of every Service.
    pub fn totals(&self) -> (usize, usize, usize) {
        self.services
            .values()
            .fold((0, 0, 0), |(chains, rules, elements), record| {
                (
                    chains + record.chains.len(),
                    rules + record.rules,
                    elements + record.elements.len(),
                )
            })
    }
}
