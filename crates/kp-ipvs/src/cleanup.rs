//! `--cleanup`: removes everything the IPVS mode (ours or upstream's)
//! leaves on a node — our virtual servers, the iptables chains and jumps,
//! the ipsets, kube-ipvs0 — and nothing else: a virtual server someone
//! else made stays (upstream flushes the whole IPVS table instead).
//!
//! A virtual server is ours when its address is on kube-ipvs0, when one of
//! our service sets holds its address and port, or when it is a NodePort
//! (its protocol and port in our NodePort sets). The iptables rules go
//! before the sets, since the kernel refuses to destroy a set a rule uses.

use std::collections::BTreeSet;

use kp_iptables::{Applier, Table};
use kp_model::{IpFamily, Protocol};

use crate::diff::Op;
use crate::kernel::{IpvsKernel, KernelError};
use crate::rules::{FILTER_CHAINS, JUMP_RULES, NAT_CHAINS};
use crate::state::{KernelState, ServiceKey, SetEntry, SetKind};

/// What a cleanup removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Virtual servers deleted.
    pub services: Vec<ServiceKey>,
    /// Sets destroyed.
    pub sets: Vec<&'static str>,
    /// kube-ipvs0 was deleted.
    pub link: bool,
    /// iptables chains deleted (per applier).
    pub chains: usize,
}

/// A cleanup step failed; the steps after it still ran.
#[derive(Debug, thiserror::Error)]
#[error("IPVS cleanup: {}", .failures.join("; "))]
pub struct CleanupError {
    /// What failed, one entry per step.
    pub failures: Vec<String>,
    /// What was removed anyway.
    pub report: CleanupReport,
}

/// Cleans up with `kernel` and the iptables `appliers` (one per iptables
/// flavor that may hold our rules).
pub fn cleanup_with(
    kernel: &mut dyn IpvsKernel,
    appliers: &mut [&mut dyn Applier],
) -> Result<CleanupReport, CleanupError> {
    let mut report = CleanupReport::default();
    let mut failures = Vec::new();
    for family in [IpFamily::V4, IpFamily::V6] {
        match kernel.list(family) {
            Ok(state) => {
                let ours = our_services(&state);
                let ops: Vec<Op> = ours.iter().map(|key| Op::DeleteService(*key)).collect();
                match kernel.apply(family, &ops) {
                    Ok(()) => report.services.extend(ours),
                    Err(error) => failures.push(error.to_string()),
                }
            }
            Err(error) if is_missing(&error) => {}
            Err(error) => failures.push(error.to_string()),
        }
    }
    for applier in appliers.iter_mut() {
        remove_rules(&mut **applier, &mut report, &mut failures);
    }
    for kind in SetKind::ALL {
        for family in [IpFamily::V4, IpFamily::V6] {
            let name = kind.name(family);
            match kernel.destroy_set(name) {
                Ok(true) => report.sets.push(name),
                Ok(false) => {}
                Err(error) => failures.push(error.to_string()),
            }
        }
    }
    match kernel.delete_link() {
        Ok(deleted) => report.link = deleted,
        Err(error) => failures.push(error.to_string()),
    }
    if failures.is_empty() {
        Ok(report)
    } else {
        Err(CleanupError { failures, report })
    }
}

/// The virtual servers of `state` that the IPVS mode made.
pub fn our_services(state: &KernelState) -> Vec<ServiceKey> {
    let mut service_entries = BTreeSet::new();
    for kind in [
        SetKind::ClusterIp,
        SetKind::ExternalIp,
        SetKind::ExternalIpLocal,
        SetKind::LoadBalancer,
    ] {
        service_entries.extend(state.entries(kind).copied());
    }
    let node_port = |protocol: Protocol, port: u16, address| {
        let (set, entry) = match protocol {
            Protocol::Tcp => (SetKind::NodePortTcp, SetEntry::Port(port)),
            Protocol::Udp => (SetKind::NodePortUdp, SetEntry::Port(port)),
            Protocol::Sctp => (
                SetKind::NodePortSctp,
                SetEntry::IpPort(address, protocol, port),
            ),
        };
        state.entries(set).any(|e| *e == entry)
    };
    state
        .services
        .keys()
        .filter(|key| {
            state.addresses.contains(&key.address)
                || service_entries.contains(&SetEntry::IpPort(key.address, key.protocol, key.port))
                || node_port(key.protocol, key.port, key.address)
        })
        .copied()
        .collect()
}

fn remove_rules(applier: &mut dyn Applier, report: &mut CleanupReport, failures: &mut Vec<String>) {
    for family in [IpFamily::V4, IpFamily::V6] {
        for rule in &JUMP_RULES {
            if let Err(error) = applier.delete_jump(family, rule) {
                failures.push(format!(
                    "removing the jump to {}: {error}",
                    rule.target_chain
                ));
            }
        }
        let chains = FILTER_CHAINS
            .iter()
            .map(|c| (Table::Filter, *c))
            .chain(NAT_CHAINS.iter().map(|c| (Table::Nat, *c)));
        for (table, chain) in chains {
            match applier.flush_and_delete_chain(family, table, chain) {
                Ok(true) => report.chains += 1,
                Ok(false) => {}
                Err(error) => failures.push(format!(
                    "removing chain {chain} from table {table}: {error}"
                )),
            }
        }
    }
}

/// The kernel has no IPVS at all: nothing of ours can be there.
fn is_missing(error: &KernelError) -> bool {
    error.source.kind() == std::io::ErrorKind::NotFound
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::backend::{IpvsBackend, IpvsOptions};
    use crate::kernel::FakeKernel;
    use crate::testing::{ip, service, Ports, RequestParts};
    use kp_sync::Backend;

    #[test]
    fn cleanup_removes_ours_and_keeps_a_foreign_virtual_server() {
        let kernel = FakeKernel::new();
        let mut iptables = kp_iptables::FakeKernel::new().applier();
        let mut backend = IpvsBackend::new(
            IpFamily::V4,
            IpvsOptions::default(),
            Box::new(kernel.clone()),
            Box::new(NullApplier),
        )
        .with_sysctl(Box::new(kp_node::MemorySysctl::new()))
        .with_local_addresses(Box::new(|| Ok(vec![ip("192.168.99.2")])));
        let parts = RequestParts::new(
            Ports::new()
                .with(
                    service("ns1", "web", "10.96.0.10", 80)
                        .node_port(30080)
                        .endpoint("10.244.1.2", 80, true),
                )
                .build(),
            "192.168.99.2",
        );
        backend.sync(&parts.request(true)).unwrap();
        let foreign = ServiceKey {
            address: ip("192.168.99.2"),
            protocol: Protocol::Tcp,
            port: 8443,
        };
        kernel.add_foreign_service(foreign, "wlc");

        let mut kernel_handle = kernel.clone();
        let report = cleanup_with(&mut kernel_handle, &mut [&mut iptables]).unwrap();
        assert_eq!(
            report.services.len(),
            2,
            "ClusterIP and NodePort: {report:?}"
        );
        assert!(report.link);
        assert_eq!(report.sets.len(), SetKind::ALL.len());
        let left = kernel.family(IpFamily::V4);
        assert_eq!(left.services.keys().copied().collect::<Vec<_>>(), [foreign]);
        assert!(left.sets.is_empty() && !left.link);
        // A second cleanup finds nothing to do.
        let again = cleanup_with(&mut kernel_handle, &mut []).unwrap();
        assert_eq!(again, CleanupReport::default());
    }

    #[test]
    fn a_set_iptables_still_uses_is_not_destroyed_and_the_failure_names_it() {
        let iptables = kp_iptables::FakeKernel::new();
        // Our rules use our sets as long as our chains exist.
        let rules = iptables.clone();
        let kernel = FakeKernel::new().with_set_users(Box::new(move |_name| {
            !rules.chains(IpFamily::V4, Table::Nat).is_empty()
        }));
        let mut backend = IpvsBackend::new(
            IpFamily::V4,
            IpvsOptions::default(),
            Box::new(kernel.clone()),
            Box::new(NullApplier),
        )
        .with_sysctl(Box::new(kp_node::MemorySysctl::new()))
        .with_local_addresses(Box::new(|| Ok(vec![ip("192.168.99.2")])));
        let parts = RequestParts::new(
            Ports::new()
                .with(service("ns1", "web", "10.96.0.10", 80).endpoint("10.244.1.2", 80, true))
                .build(),
            "192.168.99.2",
        );
        backend.sync(&parts.request(true)).unwrap();
        // The fake iptables does not parse `-m set`: the chain that holds
        // the rules using the sets stands for them.
        iptables
            .applier()
            .ensure_chain(IpFamily::V4, Table::Nat, "KUBE-SERVICES")
            .unwrap();

        // Without the iptables side, the sets are still in use.
        let mut kernel_handle = kernel.clone();
        let error = cleanup_with(&mut kernel_handle, &mut []).unwrap_err();
        assert!(
            error.to_string().contains("ipset destroy KUBE-CLUSTER-IP"),
            "{error}"
        );
        assert!(error.report.sets.is_empty());
        assert!(kernel
            .family(IpFamily::V4)
            .sets
            .contains_key(&SetKind::ClusterIp));

        // With it, the rules go first and the sets after them.
        let mut applier = iptables.applier();
        let report = cleanup_with(&mut kernel_handle, &mut [&mut applier]).unwrap();
        assert_eq!(report.sets.len(), SetKind::ALL.len());
    }

    struct NullApplier;

    impl Applier for NullApplier {
        fn restore(&mut self, _: IpFamily, _: &str) -> Result<(), kp_iptables::ApplyError> {
            Ok(())
        }
        fn save_table(
            &mut self,
            _: IpFamily,
            _: Table,
        ) -> Result<kp_iptables::SavedTable, kp_iptables::ApplyError> {
            Ok(kp_iptables::SavedTable::default())
        }
        fn chain_exists(
            &mut self,
            _: IpFamily,
            _: Table,
            _: &str,
        ) -> Result<bool, kp_iptables::ApplyError> {
            Ok(false)
        }
        fn ensure_chain(
            &mut self,
            _: IpFamily,
            _: Table,
            _: &str,
        ) -> Result<(), kp_iptables::ApplyError> {
            Ok(())
        }
        fn delete_jump(
            &mut self,
            _: IpFamily,
            _: &kp_iptables::JumpRule,
        ) -> Result<bool, kp_iptables::ApplyError> {
            Ok(false)
        }
        fn flush_and_delete_chain(
            &mut self,
            _: IpFamily,
            _: Table,
            _: &str,
        ) -> Result<bool, kp_iptables::ApplyError> {
            Ok(false)
        }
    }
}
