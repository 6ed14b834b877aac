//! The process's descriptor limit (`RLIMIT_NOFILE`).
//!
//! Linux starts most processes with a soft limit of 1,024 open files, kept
//! low for programs that still use `select(2)`, whose `fd_set` holds
//! descriptors below 1,024 only; the hard limit is usually far higher
//! (containerd and Docker: 1,048,576). Go programs, upstream kube-proxy
//! among them, raise their soft limit to the hard one when they start
//! (Go 1.19, `os/rlimit.go`), since Go never uses `select(2)`; neither do
//! we. The health-check and relay connections, the netlink sockets and
//! the pipes to `iptables-restore` all count against this one limit.

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// The soft limit before and after [`raise_nofile_soft_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NofileRaise {
    /// The soft limit the process started with.
    pub soft_before: u64,
    /// The soft limit now: the hard limit.
    pub soft_after: u64,
}

/// Why the soft descriptor limit could not be raised.
#[derive(Debug, thiserror::Error)]
pub enum DescriptorLimitError {
    /// `getrlimit(RLIMIT_NOFILE)` failed.
    #[error("reading the descriptor limit (RLIMIT_NOFILE)")]
    Read(#[source] nix::Error),
    /// `setrlimit(RLIMIT_NOFILE)` refused the hard limit as soft limit.
    #[error(
        "raising the soft descriptor limit (RLIMIT_NOFILE) from {soft} to the hard limit {hard}"
    )]
    Raise {
        /// The soft limit, unchanged.
        soft: u64,
        /// The hard limit.
        hard: u64,
        /// What `setrlimit` said.
        #[source]
        source: nix::Error,
    },
}

/// Raises the soft `RLIMIT_NOFILE` of this process to its hard limit
/// (`prlimit --pid $$ --nofile=HARD:HARD`), as Go programs do at start;
/// child processes inherit the raised limit.
pub fn raise_nofile_soft_limit() -> Result<NofileRaise, DescriptorLimitError> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(DescriptorLimitError::Read)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
            .map_err(|source| DescriptorLimitError::Raise { soft, hard, source })?;
    }
    Ok(NofileRaise {
        soft_before: soft,
        soft_after: soft.max(hard),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    // The test process starts as a container would, with a soft limit of
    // 1,024 (or its hard limit, if lower); the other tests of this crate
    // open a few dozen descriptors at most.
    #[test]
    fn a_soft_limit_of_1024_becomes_the_hard_limit() {
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        let low = hard.min(1024);
        setrlimit(Resource::RLIMIT_NOFILE, low, hard).unwrap();

        let raised = raise_nofile_soft_limit().unwrap();

        assert_eq!(
            raised,
            NofileRaise {
                soft_before: low,
                soft_after: hard
            }
        );
        assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).unwrap(), (hard, hard));
    }
}
