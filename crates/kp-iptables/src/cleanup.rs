//! `--cleanup`: remove everything the iptables mode (ours or upstream's,
//! the names are the same) put into the kernel.
//!
//! Like upstream's `CleanupLeftovers`: the jump rules from built-in chains
//! are deleted one by one, then our chains of nat and filter are flushed
//! and deleted with one `iptables-restore` per family, then the mangle
//! canary. Kubelet's chains (`KUBE-FIREWALL` with its jump rules,
//! `KUBE-KUBELET-CANARY`, `KUBE-IPTABLES-HINT`, `KUBE-MARK-DROP`) stay, and
//! so does every chain of other programs. Running it twice is harmless.

use kp_model::IpFamily;

use crate::applier::{Applier, ApplyError, IptablesFlavor, SystemApplier};
use crate::jumps::{Table, JUMP_RULES};
use crate::names::{
    is_service_chain_name, KUBE_EXTERNAL_SERVICES, KUBE_FORWARD, KUBE_MARK_MASQ, KUBE_NODEPORTS,
    KUBE_POSTROUTING, KUBE_PROXY_CANARY, KUBE_PROXY_FIREWALL, KUBE_SERVICES,
};

/// Our fixed chains of the nat table (service chains come on top).
const NAT_CHAINS: [&str; 5] = [
    KUBE_SERVICES,
    KUBE_NODEPORTS,
    KUBE_POSTROUTING,
    KUBE_MARK_MASQ,
    KUBE_PROXY_CANARY,
];
/// Our chains of the filter table.
const FILTER_CHAINS: [&str; 6] = [
    KUBE_SERVICES,
    KUBE_EXTERNAL_SERVICES,
    KUBE_FORWARD,
    KUBE_NODEPORTS,
    KUBE_PROXY_FIREWALL,
    KUBE_PROXY_CANARY,
];

/// What a cleanup removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Jump rules deleted from built-in chains.
    pub jump_rules_removed: usize,
    /// Chains deleted, as `(family, table, chain)`.
    pub chains_removed: Vec<(IpFamily, Table, String)>,
    /// Families skipped because their iptables programs do not work here
    /// (no IPv6 support, say), with the reason.
    pub skipped_families: Vec<(IpFamily, String)>,
}

/// A cleanup step failed; earlier steps stay done.
#[derive(Debug, thiserror::Error)]
#[error("cleaning up {family} iptables rules: {attempted} failed")]
pub struct CleanupError {
    /// `IPv4` or `IPv6`.
    pub family: &'static str,
    /// The step, e.g. `deleting the nat and filter chains`.
    pub attempted: &'static str,
    /// The cause.
    #[source]
    pub source: ApplyError,
}

/// Removes the iptables mode's rules and chains for IPv4 and IPv6 with the
/// programs of `flavor`.
pub fn cleanup(flavor: IptablesFlavor) -> Result<CleanupReport, CleanupError> {
    cleanup_with(
        &mut SystemApplier::new(flavor),
        &[IpFamily::V4, IpFamily::V6],
    )
}

/// Removes the iptables mode's rules and chains of `families` through
/// `applier`.
pub fn cleanup_with(
    applier: &mut dyn Applier,
    families: &[IpFamily],
) -> Result<CleanupReport, CleanupError> {
    let mut report = CleanupReport::default();
    for &family in families {
        // A family whose tables cannot even be listed has nothing of ours.
        let filter = match applier.save_table(family, Table::Filter) {
            Ok(saved) => saved.kube_chains,
            Err(error) => {
                tracing::warn!(family = family.as_api_str(), error = %error, "skipping cleanup of a family whose iptables does not work");
                report.skipped_families.push((family, error.to_string()));
                continue;
            }
        };
        cleanup_family(applier, family, filter, &mut report)?;
    }
    tracing::info!(
        jump_rules = report.jump_rules_removed,
        chains = report.chains_removed.len(),
        "removed iptables rules"
    );
    Ok(report)
}

fn cleanup_family(
    applier: &mut dyn Applier,
    family: IpFamily,
    filter: Vec<String>,
    report: &mut CleanupReport,
) -> Result<(), CleanupError> {
    let step = |attempted| {
        move |source| CleanupError {
            family: family.as_api_str(),
            attempted,
            source,
        }
    };
    for rule in JUMP_RULES.iter().filter(|rule| !rule.shared_with_kubelet) {
        if applier
            .delete_jump(family, rule)
            .map_err(step("deleting a jump rule"))?
        {
            report.jump_rules_removed += 1;
        }
    }
    let nat = applier
        .save_table(family, Table::Nat)
        .map_err(step("listing the nat chains"))?
        .kube_chains;
    let nat: Vec<String> = nat
        .into_iter()
        .filter(|c| NAT_CHAINS.contains(&c.as_str()) || is_service_chain_name(c))
        .collect();
    let filter: Vec<String> = filter
        .into_iter()
        .filter(|c| FILTER_CHAINS.contains(&c.as_str()))
        .collect();
    if !nat.is_empty() || !filter.is_empty() {
        let text = delete_chains_text(&[(Table::Nat, &nat), (Table::Filter, &filter)]);
        applier
            .restore(family, &text)
            .map_err(step("deleting the nat and filter chains"))?;
        for (table, chains) in [(Table::Nat, nat), (Table::Filter, filter)] {
            let removed = chains.into_iter().map(|chain| (family, table, chain));
            report.chains_removed.extend(removed);
        }
    }
    if applier
        .flush_and_delete_chain(family, Table::Mangle, KUBE_PROXY_CANARY)
        .map_err(step("deleting the mangle canary chain"))?
    {
        let canary = (family, Table::Mangle, KUBE_PROXY_CANARY.to_owned());
        report.chains_removed.push(canary);
    }
    Ok(())
}

/// Restore input that flushes, then deletes, `chains` of each table.
/// Flushing every chain first removes the jumps between them.
fn delete_chains_text(tables: &[(Table, &Vec<String>)]) -> String {
    let mut text = String::new();
    for (table, chains) in tables.iter().filter(|(_, chains)| !chains.is_empty()) {
        text.push_str(&format!("*{table}\n"));
        for chain in chains.iter() {
            text.push_str(&format!(":{chain} - [0:0]\n"));
        }
        for chain in chains.iter() {
            text.push_str(&format!("-X {chain}\n"));
        }
        text.push_str("COMMIT\n");
    }
    text
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::applier::FakeKernel;

    /// A kernel holding our chains and jumps, kubelet's KUBE-FIREWALL and a
    /// foreign chain.
    fn programmed() -> FakeKernel {
        let kernel = FakeKernel::new();
        let mut applier = kernel.applier();
        let text = "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n\
                    :KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]\n:DOCKER - [0:0]\n\
                    -A KUBE-SVC-AAAAAAAAAAAAAAAA -j KUBE-SEP-BBBBBBBBBBBBBBBB\nCOMMIT\n\
                    *filter\n:KUBE-FORWARD - [0:0]\n:KUBE-FIREWALL - [0:0]\nCOMMIT\n";
        applier.restore(IpFamily::V4, text).unwrap();
        for table in [Table::Mangle, Table::Nat, Table::Filter] {
            applier
                .ensure_chain(IpFamily::V4, table, KUBE_PROXY_CANARY)
                .unwrap();
        }
        for rule in JUMP_RULES {
            applier
                .ensure_chain(IpFamily::V4, rule.table, rule.target_chain)
                .unwrap();
        }
        // The jump rules, inserted as a full sync's restore inserts them.
        let inserts: String = [Table::Filter, Table::Nat]
            .iter()
            .map(|table| {
                let rules = JUMP_RULES.iter().filter(|rule| rule.table == *table);
                let lines: String = rules.map(|rule| rule.insert_line() + "\n").collect();
                format!("*{table}\n{lines}COMMIT\n")
            })
            .collect();
        applier.restore(IpFamily::V4, &inserts).unwrap();
        kernel
    }

    #[test]
    fn removes_our_chains_and_jumps_and_keeps_kubelet_and_foreign_ones() {
        let kernel = programmed();
        let report = cleanup_with(&mut kernel.applier(), &[IpFamily::V4]).unwrap();

        let ours = JUMP_RULES.iter().filter(|r| !r.shared_with_kubelet).count();
        assert_eq!(report.jump_rules_removed, ours);
        assert_eq!(kernel.chains(IpFamily::V4, Table::Nat), ["DOCKER"]);
        assert_eq!(
            kernel.chains(IpFamily::V4, Table::Filter),
            ["KUBE-FIREWALL"]
        );
        assert!(kernel.chains(IpFamily::V4, Table::Mangle).is_empty());
        let left: Vec<_> = kernel
            .jumps(IpFamily::V4)
            .iter()
            .map(|r| r.target_chain)
            .collect();
        assert_eq!(left, ["KUBE-FIREWALL", "KUBE-FIREWALL"]);
    }

    #[test]
    fn a_second_cleanup_finds_nothing_to_do() {
        let kernel = programmed();
        cleanup_with(&mut kernel.applier(), &[IpFamily::V4, IpFamily::V6]).unwrap();
        let again = cleanup_with(&mut kernel.applier(), &[IpFamily::V4, IpFamily::V6]).unwrap();
        assert_eq!(again.jump_rules_removed, 0);
        assert!(again.chains_removed.is_empty());
    }
}
