//! Whether this host can run the iptables mode for an IP family, checked
//! once at start as upstream does before choosing single- or dual-stack.
//!
//! A family is supported when its `*-save` program of the chosen flavor runs
//! and lists the nat table (`ip6tables-nft-save -t nat`), which needs the
//! program and the kernel's nat table of the family; IPv6 also needs the
//! kernel's IPv6 support (`/proc/net/if_inet6`, absent with `ipv6.disable=1`).

use std::path::Path;

use kp_model::IpFamily;

use crate::applier::{Applier, ApplyError, IptablesFlavor, SystemApplier};
use crate::jumps::Table;

/// Where the kernel lists IPv6 addresses; it exists only with IPv6 support.
const IF_INET6: &str = "/proc/net/if_inet6";

/// Why the iptables mode cannot serve a family on this host.
#[derive(Debug, thiserror::Error)]
pub enum FamilyUnsupported {
    /// The kernel has no IPv6 support.
    #[error("the kernel has no IPv6 support ({IF_INET6} is missing)")]
    NoKernelIpv6,
    /// The family's program is not installed.
    #[error("program {program} not found")]
    MissingProgram {
        /// The program, e.g. `ip6tables-nft-save`.
        program: String,
    },
    /// The program runs but cannot list the nat table.
    #[error("listing the nat table failed")]
    NatTable(#[source] ApplyError),
}

/// Checks that the iptables mode can serve `family` with `flavor` here.
pub fn check_family(flavor: IptablesFlavor, family: IpFamily) -> Result<(), FamilyUnsupported> {
    check_family_with(&mut SystemApplier::new(flavor), family, Path::new(IF_INET6))
}

/// [`check_family`] through `applier`, with `if_inet6` as the kernel's IPv6
/// address list.
pub fn check_family_with(
    applier: &mut dyn Applier,
    family: IpFamily,
    if_inet6: &Path,
) -> Result<(), FamilyUnsupported> {
    if family == IpFamily::V6 && !if_inet6.exists() {
        return Err(FamilyUnsupported::NoKernelIpv6);
    }
    match applier.save_table(family, Table::Nat) {
        Ok(_) => Ok(()),
        Err(error) => match error.missing_program() {
            Some(program) => Err(FamilyUnsupported::MissingProgram {
                program: program.to_owned(),
            }),
            None => Err(FamilyUnsupported::NatTable(error)),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn ipv6_needs_the_kernels_ipv6_support() {
        let mut applier = SystemApplier::new(IptablesFlavor::Nft);
        let missing = Path::new("/nonexistent/if_inet6");

        let error = check_family_with(&mut applier, IpFamily::V6, missing).unwrap_err();

        assert!(matches!(error, FamilyUnsupported::NoKernelIpv6), "{error}");
    }
}
