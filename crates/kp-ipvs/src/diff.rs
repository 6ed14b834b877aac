//! The difference between the planned and the current kernel state, as the
//! shortest list of operations: what is already right is not touched, so a
//! one-endpoint change is one operation whatever the number of Services.
//!
//! Order matters for traffic: a virtual server gets its real servers before
//! its address appears on kube-ipvs0 (so the address never answers without
//! a balancer behind it), and set members are added before and removed
//! after the objects they describe.
//!
//! A TCP real server that is no longer wanted is drained first (weight 0:
//! no new connections, open ones keep working) and deleted later, once its
//! connections are gone ([`drained_real_servers`]); UDP and SCTP real
//! servers are deleted at once, as upstream does (with
//! `expire_nodest_conn` their flows end on the next packet).

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use kp_model::Protocol;

use crate::state::{KernelState, ServiceKey, SetEntry, SetKind, VirtualServer};

/// One change to the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `ip link add kube-ipvs0 type dummy` (left down, as upstream).
    CreateLink,
    /// `ip addr add ADDRESS/32 dev kube-ipvs0`.
    AddAddress(IpAddr),
    /// `ip addr del ADDRESS/32 dev kube-ipvs0`.
    DeleteAddress(IpAddr),
    /// `ipset create NAME TYPE …`.
    CreateSet(SetKind),
    /// `ipset add NAME ENTRY`.
    AddEntry(SetKind, SetEntry),
    /// `ipset del NAME ENTRY`.
    DeleteEntry(SetKind, SetEntry),
    /// `ipvsadm -A -t ADDRESS:PORT -s SCHEDULER …`.
    AddService(ServiceKey, VirtualServer),
    /// `ipvsadm -E -t ADDRESS:PORT -s SCHEDULER …`.
    UpdateService(ServiceKey, VirtualServer),
    /// `ipvsadm -D -t ADDRESS:PORT`.
    DeleteService(ServiceKey),
    /// `ipvsadm -a -t ADDRESS:PORT -r REAL -m -w WEIGHT`.
    AddReal(ServiceKey, SocketAddr, u32),
    /// `ipvsadm -e -t ADDRESS:PORT -r REAL -m -w WEIGHT`.
    UpdateReal(ServiceKey, SocketAddr, u32),
    /// `ipvsadm -d -t ADDRESS:PORT -r REAL`.
    DeleteReal(ServiceKey, SocketAddr),
}

/// Why an operation was refused (the kernel's answer, or the fake's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    /// The object exists already (`EEXIST`).
    #[error("already exists")]
    Exists,
    /// The object, or its parent, does not exist (`ENOENT`/`ENODEV`).
    #[error("does not exist")]
    Missing,
}

/// The operations that turn `current` into `desired`.
pub fn diff(desired: &KernelState, current: &KernelState) -> Vec<Op> {
    let mut ops = Vec::new();
    if !current.link {
        ops.push(Op::CreateLink);
    }
    for kind in desired.sets.keys() {
        if !current.sets.contains_key(kind) {
            ops.push(Op::CreateSet(*kind));
        }
    }
    diff_services(desired, current, &mut ops);
    for address in desired.addresses.difference(&current.addresses) {
        ops.push(Op::AddAddress(*address));
    }
    let empty = BTreeSet::new();
    for (kind, wanted) in &desired.sets {
        let have = current.sets.get(kind).unwrap_or(&empty);
        ops.extend(wanted.difference(have).map(|e| Op::AddEntry(*kind, *e)));
    }
    for (kind, have) in &current.sets {
        let wanted = desired.sets.get(kind).unwrap_or(&empty);
        ops.extend(have.difference(wanted).map(|e| Op::DeleteEntry(*kind, *e)));
    }
    for address in current.addresses.difference(&desired.addresses) {
        ops.push(Op::DeleteAddress(*address));
    }
    for key in current.services.keys() {
        if !desired.services.contains_key(key) {
            ops.push(Op::DeleteService(*key));
        }
    }
    ops
}

/// TCP real servers of `current` that are drained (weight 0) and not
/// wanted by `desired`: candidates for deletion once their connections are
/// gone. UDP and SCTP ones are not: [`diff`] deletes them at once.
pub fn drained_real_servers(
    desired: &KernelState,
    current: &KernelState,
) -> Vec<(ServiceKey, SocketAddr)> {
    let mut drained = Vec::new();
    for (key, service) in &current.services {
        if key.protocol != Protocol::Tcp {
            continue;
        }
        let Some(wanted) = desired.services.get(key) else {
            continue;
        };
        for (real, weight) in &service.reals {
            if *weight == 0 && !wanted.reals.contains_key(real) {
                drained.push((*key, *real));
            }
        }
    }
    drained
}

fn diff_services(desired: &KernelState, current: &KernelState, ops: &mut Vec<Op>) {
    for (key, wanted) in &desired.services {
        let Some(have) = current.services.get(key) else {
            ops.push(Op::AddService(*key, wanted.server.clone()));
            ops.extend(
                wanted
                    .reals
                    .iter()
                    .map(|(real, weight)| Op::AddReal(*key, *real, *weight)),
            );
            continue;
        };
        if have.server != wanted.server {
            ops.push(Op::UpdateService(*key, wanted.server.clone()));
        }
        for (real, weight) in &wanted.reals {
            match have.reals.get(real) {
                Some(current_weight) if current_weight == weight => {}
                Some(_) => ops.push(Op::UpdateReal(*key, *real, *weight)),
                None => ops.push(Op::AddReal(*key, *real, *weight)),
            }
        }
        for (real, weight) in &have.reals {
            if wanted.reals.contains_key(real) {
                continue;
            }
            if key.protocol != Protocol::Tcp {
                ops.push(Op::DeleteReal(*key, *real));
            } else if *weight != 0 {
                ops.push(Op::UpdateReal(*key, *real, 0));
            }
        }
    }
}

impl Op {
    /// Whether the operation creates or adds an object.
    pub fn adds(&self) -> bool {
        matches!(
            self,
            Op::CreateLink
                | Op::AddAddress(_)
                | Op::CreateSet(_)
                | Op::AddEntry(..)
                | Op::AddService(..)
                | Op::AddReal(..)
        )
    }

    /// Whether the operation deletes an object.
    pub fn deletes(&self) -> bool {
        matches!(
            self,
            Op::DeleteAddress(_) | Op::DeleteEntry(..) | Op::DeleteService(_) | Op::DeleteReal(..)
        )
    }
}

impl KernelState {
    /// Applies `op` as the kernel would, refusing what the kernel refuses.
    pub fn apply(&mut self, op: &Op) -> Result<(), OpError> {
        match op {
            Op::CreateLink => {
                if self.link {
                    return Err(OpError::Exists);
                }
                self.link = true;
            }
            Op::AddAddress(address) => {
                if !self.link {
                    return Err(OpError::Missing);
                }
                insert(self.addresses.insert(*address))?;
            }
            Op::DeleteAddress(address) => remove(self.link && self.addresses.remove(address))?,
            Op::CreateSet(kind) => {
                if self.sets.contains_key(kind) {
                    return Err(OpError::Exists);
                }
                self.sets.insert(*kind, BTreeSet::new());
            }
            // Entry requests go without `NLM_F_EXCL`, so the kernel takes
            // an add of a present member and a delete of a missing one as
            // done (`ipset -exist`); only a missing set is refused.
            Op::AddEntry(kind, entry) => {
                self.sets
                    .get_mut(kind)
                    .ok_or(OpError::Missing)?
                    .insert(*entry);
            }
            Op::DeleteEntry(kind, entry) => {
                self.sets
                    .get_mut(kind)
                    .ok_or(OpError::Missing)?
                    .remove(entry);
            }
            _ => self.apply_ipvs(op)?,
        }
        Ok(())
    }

    fn apply_ipvs(&mut self, op: &Op) -> Result<(), OpError> {
        match op {
            Op::AddService(key, server) => {
                if self.services.contains_key(key) {
                    return Err(OpError::Exists);
                }
                self.services.insert(
                    *key,
                    crate::state::ServiceState {
                        server: server.clone(),
                        reals: Default::default(),
                    },
                );
            }
            Op::UpdateService(key, server) => {
                self.services.get_mut(key).ok_or(OpError::Missing)?.server = server.clone();
            }
            Op::DeleteService(key) => remove(self.services.remove(key).is_some())?,
            Op::AddReal(key, real, weight) => {
                let service = self.services.get_mut(key).ok_or(OpError::Missing)?;
                insert(service.reals.insert(*real, *weight).is_none())?;
            }
            Op::UpdateReal(key, real, weight) => {
                let service = self.services.get_mut(key).ok_or(OpError::Missing)?;
                *service.reals.get_mut(real).ok_or(OpError::Missing)? = *weight;
            }
            Op::DeleteReal(key, real) => {
                let service = self.services.get_mut(key).ok_or(OpError::Missing)?;
                remove(service.reals.remove(real).is_some())?;
            }
            _ => {}
        }
        Ok(())
    }
}

fn insert(inserted: bool) -> Result<(), OpError> {
    if inserted {
        Ok(())
    } else {
        Err(OpError::Exists)
    }
}

fn remove(removed: bool) -> Result<(), OpError> {
    if removed {
        Ok(())
    } else {
        Err(OpError::Missing)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::CreateLink => write!(f, "ip link add {} type dummy", crate::state::DUMMY_LINK),
            Op::AddAddress(ip) => write!(f, "ip addr add {ip} dev {}", crate::state::DUMMY_LINK),
            Op::DeleteAddress(ip) => write!(f, "ip addr del {ip} dev {}", crate::state::DUMMY_LINK),
            Op::CreateSet(kind) => write!(f, "ipset create {kind:?} {}", kind.set_type().as_str()),
            Op::AddEntry(kind, entry) => write!(f, "ipset add {kind:?} {entry}"),
            Op::DeleteEntry(kind, entry) => write!(f, "ipset del {kind:?} {entry}"),
            Op::AddService(key, server) => write!(f, "ipvsadm -A {key} -s {}", server.scheduler),
            Op::UpdateService(key, server) => write!(f, "ipvsadm -E {key} -s {}", server.scheduler),
            Op::DeleteService(key) => write!(f, "ipvsadm -D {key}"),
            Op::AddReal(key, real, weight) => {
                write!(f, "ipvsadm -a {key} -r {real} -m -w {weight}")
            }
            Op::UpdateReal(key, real, weight) => {
                write!(f, "ipvsadm -e {key} -r {real} -m -w {weight}")
            }
            Op::DeleteReal(key, real) => write!(f, "ipvsadm -d {key} -r {real}"),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// As the kernel takes an entry request without `NLM_F_EXCL`, which is
    /// how this crate's netlink layer sends them: an add of a present
    /// member and a delete of a missing one are done; an entry of a set
    /// that does not exist is refused.
    #[test]
    fn entry_requests_are_refused_only_for_a_missing_set() {
        let entry = SetEntry::IpPort("10.96.0.1".parse().unwrap(), kp_model::Protocol::Tcp, 80);
        let mut state = KernelState::default();
        assert_eq!(
            state.apply(&Op::AddEntry(SetKind::ClusterIp, entry)),
            Err(OpError::Missing)
        );
        state.apply(&Op::CreateSet(SetKind::ClusterIp)).unwrap();
        for op in [
            Op::AddEntry(SetKind::ClusterIp, entry),
            Op::AddEntry(SetKind::ClusterIp, entry),
            Op::DeleteEntry(SetKind::ClusterIp, entry),
            Op::DeleteEntry(SetKind::ClusterIp, entry),
        ] {
            state.apply(&op).unwrap();
        }
        assert!(state.sets[&SetKind::ClusterIp].is_empty());
    }
}
