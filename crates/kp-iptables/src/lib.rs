//! The iptables backend of kube-proxy-rs.
//!
//! [`Renderer::render`] turns the service ports of one IP family, with their
//! categorized endpoints, into iptables-restore input that programs the same
//! data plane as upstream kube-proxy's iptables mode (v1.31 and later), with
//! the same chain names ([`names`]), so either implementation can take over
//! from, or `--cleanup` after, the other. The jump rules from the built-in
//! chains that restore cannot own are listed in [`JUMP_RULES`].
//!
//! [`IptablesBackend`] is the `--proxy-mode iptables` implementation of
//! [`kp_sync::Backend`]: it renders and applies through an [`Applier`]
//! (the real [`SystemApplier`] for `iptables-legacy` or `iptables-nft`, the
//! in-memory [`FakeApplier`], or the [`DryRunApplier`]), keeps the canary
//! chain, and [`cleanup`] removes everything again.
//!
//! [`tracer`] parses rendered text, or the kernel's rules as
//! `iptables-save` lists them beside other software's, and follows a packet
//! through them, so tests can assert behaviour ("goes to one of these
//! endpoints", "is dropped") rather than rule text alone, and the kernel's
//! state can be compared with what was rendered.

pub mod applier;
pub mod backend;
pub mod cleanup;
pub mod host;
pub mod jumps;
pub mod names;
pub mod options;
pub mod render;
pub mod support;
pub mod tracer;

pub use applier::{
    Applier, ApplyError, DryRunApplier, IptablesFlavor, RestoreSink, SavedTable, SystemApplier,
};
#[cfg(any(test, feature = "test-util"))]
pub use applier::{FakeApplier, FakeCall, FakeKernel};
pub use backend::{node_sysctls, IptablesBackend, MODE};
pub use cleanup::{cleanup, cleanup_with, CleanupError, CleanupReport};
pub use host::local_addresses;
pub use jumps::{JumpRule, Table, JUMP_RULES};
pub use kp_node::{LocalDetector, NodePortAddresses};
pub use kp_sync::ServicePortState;
pub use names::{ChainKind, ChainName, ChainNameCache};
pub use options::{IptablesOptions, ResolvedDetector};
pub use render::{
    is_large_cluster, stale_chains, ListedChains, NatChains, RenderInput, RenderStats, Rendered,
    Renderer, LARGE_CLUSTER_ENDPOINTS_THRESHOLD, NFACCT_INVALID_DROPPED,
    NFACCT_LOCALHOST_NODE_PORTS, STREAM_CHUNK_BYTES,
};
pub use support::{check_family, check_family_with, FamilyUnsupported};

/// Why the iptables backend could not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IptablesError {
    /// A configuration value is out of range.
    #[error("invalid configuration: field {field}: value {value:?} is invalid; valid values are {valid}")]
    InvalidOption {
        /// The configuration field, e.g. `iptables.masqueradeBit`.
        field: &'static str,
        /// The offending value.
        value: String,
        /// What would be valid.
        valid: &'static str,
    },
}

impl From<kp_node::InvalidValue> for IptablesError {
    fn from(error: kp_node::InvalidValue) -> Self {
        Self::InvalidOption {
            field: error.field,
            value: error.value,
            valid: error.expected,
        }
    }
}
