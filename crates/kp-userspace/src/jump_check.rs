//! How a sync learns that someone removed the portal jumps from the
//! built-in chains (`iptables -t nat -F`, a deleted rule), so that it puts
//! them back instead of refilling chains that nothing jumps to.
//!
//! Two ways, each cheap where the other is not:
//! - [`JumpCheck::InRestore`]: every restore deletes each jump and inserts
//!   it again in the same transaction (`-D` then `-I`/`-A`); a missing one
//!   makes the kernel refuse the whole restore, and the backend writes the
//!   rules again with fresh jumps. iptables-legacy's restore reads and
//!   rewrites the whole table anyway, so this costs nothing there.
//! - [`JumpCheck::Probe`]: before each sync, `iptables -t nat -S
//!   PREROUTING` and `-S OUTPUT`, looking for the jump lines. iptables-nft
//!   (1.8.9) reads only the chain listed: 20 ms with 41,000 portal rules in
//!   the table, where a `-D` in the restore or an `iptables -C` makes it
//!   read every rule of the table first (17 s and 23 s on a loaded 2-core
//!   machine, against 0.1 s for the restore without them).
//!
//! `iptables-restore` has no `-C`, and [`kp_iptables::Applier`] offers no
//! listing of the built-in chains' rules that the iptables mode does not
//! own, hence the commands here.

use std::process::{Command, Stdio};

use kp_iptables::applier::Tool;
use kp_iptables::{ApplyError, IptablesFlavor, JumpRule};
use kp_model::IpFamily;

/// How the backend checks its jumps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JumpCheck {
    /// Delete and insert the jumps in every restore (see the module).
    InRestore,
    /// List the built-in chains with `flavor`'s `iptables -S` before each
    /// sync, in the network namespace of the thread that syncs.
    Probe(IptablesFlavor),
}

impl JumpCheck {
    /// The cheaper check for `flavor`: in the restore for iptables-legacy,
    /// probes for iptables-nft; for the `iptables` on the PATH, whichever
    /// `iptables -V` says it is (`(nf_tables)` or `(legacy)`).
    pub fn for_flavor(flavor: IptablesFlavor) -> Self {
        match flavor {
            IptablesFlavor::Legacy => JumpCheck::InRestore,
            IptablesFlavor::Nft => JumpCheck::Probe(flavor),
            IptablesFlavor::System => {
                let version = Command::new(flavor.program(IpFamily::V4, Tool::Iptables))
                    .arg("-V")
                    .stdin(Stdio::null())
                    .output();
                match version {
                    Ok(output) if String::from_utf8_lossy(&output.stdout).contains("nf_tables") => {
                        JumpCheck::Probe(flavor)
                    }
                    _ => JumpCheck::InRestore,
                }
            }
        }
    }
}

/// Whether every one of `jumps` (all in `table`) is in its built-in chain:
/// `iptables -w 5 -t TABLE -S CHAIN` with `flavor`'s program for each
/// chain, in the calling thread's network namespace, the jump's line
/// looked for as `iptables-save` prints it. Putting the jumps back deletes
/// every copy first, so a wrong "missing" costs a rewrite, never a
/// duplicate.
pub fn jumps_present(
    flavor: IptablesFlavor,
    family: IpFamily,
    jumps: &[JumpRule],
) -> Result<bool, ApplyError> {
    let program = flavor.program(family, Tool::Iptables);
    let mut chains: Vec<(&str, &str)> = jumps
        .iter()
        .map(|jump| (jump.table.as_str(), jump.builtin_chain))
        .collect();
    chains.dedup();
    let mut listed = String::new();
    for (table, chain) in chains {
        let args = ["-w", "5", "-t", table, "-S", chain];
        let command = || format!("{program} {}", args.join(" "));
        let output = Command::new(&program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| ApplyError::Spawn {
                command: command(),
                source,
            })?;
        if !output.status.success() {
            return Err(ApplyError::Failed {
                command: command(),
                status: output.status.to_string(),
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            });
        }
        listed.push_str(&String::from_utf8_lossy(&output.stdout));
    }
    Ok(jumps
        .iter()
        .all(|jump| listed.lines().any(|line| line == jump.restore_line())))
}
