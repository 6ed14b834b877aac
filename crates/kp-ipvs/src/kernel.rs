//! The seam between the backend and the kernel: [`IpvsKernel`] lists and
//! changes IPVS virtual servers, ipsets and kube-ipvs0. The real
//! implementation is [`crate::netlink::NetlinkKernel`]; tests use the
//! in-memory `FakeKernel` (feature `test-util`).

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use kp_model::IpFamily;

use crate::diff::{Op, OpError};
use crate::state::{KernelState, ServiceKey};

#[cfg(any(test, feature = "test-util"))]
mod fake;
#[cfg(any(test, feature = "test-util"))]
pub use fake::{members, FakeKernel, FakeState, SetUsers};

/// Lists and programs the IPVS mode's kernel objects.
pub trait IpvsKernel: Send {
    /// The current state for `family`: whether kube-ipvs0 exists and its
    /// addresses, every virtual server of the family with its real servers,
    /// and the members of those of our sets that exist.
    fn list(&mut self, family: IpFamily) -> Result<KernelState, KernelError>;

    /// Open connections (active + inactive) per real server of `service`
    /// (`ipvsadm -Ln -t SERVICE`).
    fn connections(
        &mut self,
        service: &ServiceKey,
    ) -> Result<BTreeMap<SocketAddr, u32>, KernelError>;

    /// Applies `ops` in order for `family`. An operation the kernel refuses
    /// does not stop the others: every operation is tried, and the refused
    /// ones are returned together ([`ApplyError::Refused`]).
    fn apply(&mut self, family: IpFamily, ops: &[Op]) -> Result<(), ApplyError>;

    /// `ipvsadm --set TCP TCPFIN UDP` (zero leaves a value as it is).
    fn set_timeouts(
        &mut self,
        tcp: Duration,
        tcp_fin: Duration,
        udp: Duration,
    ) -> Result<(), KernelError>;

    /// Deletes kube-ipvs0; false when it did not exist.
    fn delete_link(&mut self) -> Result<bool, KernelError>;

    /// Destroys the set `name`; false when it did not exist.
    fn destroy_set(&mut self, name: &str) -> Result<bool, KernelError>;

    /// Requests sent to the kernel so far (each operation, each dump).
    fn messages_sent(&self) -> u64;
}

/// A kernel request failed.
#[derive(Debug, thiserror::Error)]
#[error("{attempted}: {source}")]
pub struct KernelError {
    /// What was attempted, e.g. `ipvsadm -a -t 10.96.0.41:80 -r …`.
    pub attempted: String,
    /// The kernel's answer.
    #[source]
    pub source: io::Error,
}

/// What an [`IpvsKernel::apply`] could not do.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The kernel refused these operations (in the order of the apply);
    /// every other operation was applied.
    #[error("{}", refusals_text(.0))]
    Refused(Vec<Refusal>),
    /// The exchange with the kernel failed (a socket error, kube-ipvs0
    /// could not be created, the IPVS family is missing): whether the
    /// operations from the failing one on were applied is unknown.
    #[error(transparent)]
    Broken(KernelError),
}

/// One operation the kernel refused.
#[derive(Debug)]
pub struct Refusal {
    /// Its position in the applied operations.
    pub index: usize,
    /// What was attempted and the kernel's answer.
    pub error: KernelError,
    /// The kernel already held what the operation wanted (a delete of
    /// something gone, an add of something there): the kernel changed
    /// behind the proxy's back, which is no Service's fault.
    pub drift: bool,
}

impl ApplyError {
    /// The outcome of an apply that refused `refused`: success when it
    /// refused nothing.
    pub fn unless_none(refused: Vec<Refusal>) -> Result<(), Self> {
        if refused.is_empty() {
            Ok(())
        } else {
            Err(Self::Refused(refused))
        }
    }
}

impl KernelError {
    /// An error for `attempted` from an operation refusal.
    pub fn refused(attempted: impl Into<String>, error: &OpError) -> Self {
        let kind = match error {
            OpError::Exists => io::ErrorKind::AlreadyExists,
            OpError::Missing => io::ErrorKind::NotFound,
        };
        Self {
            attempted: attempted.into(),
            source: io::Error::new(kind, error.to_string()),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

/// How many refusals an [`ApplyError::Refused`] spells out; a full set
/// can refuse thousands, and the error is logged whole.
const REFUSALS_SHOWN: usize = 5;

/// `the kernel refused 2 operations: A: …; B: …`, the first
/// [`REFUSALS_SHOWN`] of them.
fn refusals_text(refusals: &[Refusal]) -> String {
    let noun = if refusals.len() == 1 {
        "operation"
    } else {
        "operations"
    };
    let mut each: Vec<String> = refusals
        .iter()
        .take(REFUSALS_SHOWN)
        .map(ToString::to_string)
        .collect();
    if refusals.len() > REFUSALS_SHOWN {
        each.push(format!("… ({} more)", refusals.len() - REFUSALS_SHOWN));
    }
    format!(
        "the kernel refused {} {noun}: {}",
        refusals.len(),
        each.join("; ")
    )
}
