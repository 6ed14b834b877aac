//! Which Services the kernel refused: the operations of a sync that the
//! kernel refused, traced back to the Services whose planned objects they
//! touch, so that the sync loop can leave those Services out and program
//! every other one (upstream's IPVS mode logs a refused Service and goes
//! on with the next).

use std::collections::BTreeSet;

use kp_model::{NamespacedName, ServicePortName};
use kp_sync::ServicePortState;

use crate::diff::Op;
use crate::planner::{plan_one, PlanInput};
use crate::state::{KernelState, SetEntry, SetKind};

/// The Services whose planned objects the `refused` operations touch.
/// Empty when one of them belongs to no Service (kube-ipvs0 or a set
/// itself): the node, not a Service, is at fault, and leaving Services
/// out would not help. The caller leaves out refusals that found the
/// wanted state already there ([`crate::kernel::Refusal::drift`]).
pub fn refused_services<'p>(
    input: &PlanInput<'_>,
    service_ports: impl IntoIterator<Item = (&'p ServicePortName, &'p ServicePortState)>,
    refused: &[&Op],
) -> BTreeSet<NamespacedName> {
    if refused.iter().any(|op| node_level(op)) {
        return BTreeSet::new();
    }
    let mut services = BTreeSet::new();
    for (name, port_state) in service_ports {
        let alone = plan_one(input, name, port_state);
        if refused.iter().any(|op| holds(&alone, op)) {
            services.insert(name.service.clone());
        }
    }
    services
}

/// Operations on objects of the node rather than of a Service.
fn node_level(op: &Op) -> bool {
    matches!(op, Op::CreateLink | Op::CreateSet(_))
}

/// Whether the plan of one service port holds the object `op` changes.
fn holds(state: &KernelState, op: &Op) -> bool {
    match op {
        Op::AddService(key, _)
        | Op::UpdateService(key, _)
        | Op::DeleteService(key)
        | Op::AddReal(key, ..)
        | Op::UpdateReal(key, ..)
        | Op::DeleteReal(key, _) => state.services.contains_key(key),
        Op::AddAddress(ip) | Op::DeleteAddress(ip) => state.addresses.contains(ip),
        Op::AddEntry(SetKind::IpvsIps, SetEntry::Ip(ip))
        | Op::DeleteEntry(SetKind::IpvsIps, SetEntry::Ip(ip)) => state.addresses.contains(ip),
        Op::AddEntry(kind, entry) | Op::DeleteEntry(kind, entry) => {
            state.sets.get(kind).is_some_and(|set| set.contains(entry))
        }
        Op::CreateLink | Op::CreateSet(_) => false,
    }
}
