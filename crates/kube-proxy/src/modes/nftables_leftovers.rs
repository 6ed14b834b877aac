//! What upstream's nftables mode leaves behind: everything it programs lives
//! in the tables `ip kube-proxy` and `ip6 kube-proxy`, which it owns
//! entirely. A proxy started in iptables mode on a node that ran the
//! nftables mode removes them, as upstream does, or both modes would
//! rewrite the same traffic; `--cleanup` removes them too.

use std::io::Write;
use std::process::{Command, Stdio};

/// The nftables mode's tables, as `nft` names them (`FAMILY NAME`).
pub const TABLES: [&str; 2] = ["ip kube-proxy", "ip6 kube-proxy"];

/// Removing the tables failed.
#[derive(Debug, thiserror::Error)]
pub enum LeftoverError {
    /// `nft` could not be run.
    #[error("running `nft {args}` failed")]
    Spawn {
        /// Its arguments.
        args: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// `nft` ran and failed.
    #[error("`nft {args}` failed: {stderr}")]
    Failed {
        /// Its arguments.
        args: &'static str,
        /// What it said.
        stderr: String,
    },
}

/// Deletes whichever of [`TABLES`] exist, in one `nft` transaction, and
/// returns them. Without an `nft` program there is nothing it could have
/// left (upstream's nftables mode needs one too).
pub fn remove() -> Result<Vec<&'static str>, LeftoverError> {
    let listing = match Command::new("nft").args(["list", "tables"]).output() {
        Ok(output) if output.status.success() => output.stdout,
        Ok(output) => {
            return Err(LeftoverError::Failed {
                args: "list tables",
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            })
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            tracing::debug!("no nft program: no nftables leftovers to look for");
            return Ok(Vec::new());
        }
        Err(source) => {
            return Err(LeftoverError::Spawn {
                args: "list tables",
                source,
            })
        }
    };
    let found = present(&String::from_utf8_lossy(&listing));
    if found.is_empty() {
        return Ok(found);
    }
    let script: String = found
        .iter()
        .map(|table| format!("delete table {table}\n"))
        .collect();
    run_script(&script)?;
    Ok(found)
}

/// The tables of [`TABLES`] that `nft list tables` output shows.
fn present(listing: &str) -> Vec<&'static str> {
    TABLES
        .into_iter()
        .filter(|table| {
            listing
                .lines()
                .any(|line| line.trim().strip_prefix("table ") == Some(*table))
        })
        .collect()
}

fn run_script(script: &str) -> Result<(), LeftoverError> {
    let spawn_error = |source| LeftoverError::Spawn {
        args: "-f -",
        source,
    };
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_error)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes()).map_err(spawn_error)?;
    }
    let output = child.wait_with_output().map_err(spawn_error)?;
    if output.status.success() {
        Ok(())
    } else {
        Err(LeftoverError::Failed {
            args: "-f -",
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_nftables_modes_own_tables_are_found() {
        let listing =
            "table inet filter\ntable ip kube-proxy\ntable ip6 nat\ntable ip kube-proxy-other\n";

        assert_eq!(present(listing), ["ip kube-proxy"]);
        assert_eq!(
            present("table ip6 kube-proxy\ntable ip kube-proxy\n"),
            ["ip kube-proxy", "ip6 kube-proxy"]
        );
        assert!(present("").is_empty());
    }
}
