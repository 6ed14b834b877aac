//! The nftables backend of kube-proxy-rs.
//!
//! [`Renderer::render`] turns the service ports of one IP family, with
//! their categorized endpoints, into one nft transaction for table `ip
//! kube-proxy` or `ip6 kube-proxy` with upstream's chain, set and map names
//! and meanings ([`names`]), so either implementation can take over from,
//! or `--cleanup` after, the other. A full render writes everything; a
//! partial render writes only the element and chain changes of the
//! Services that changed, found by comparing with what the last
//! transaction left ([`Programmed`]) instead of listing the table.
//!
//! The [`Layout`] is upstream's (`Layout::Chains`, the default) or the
//! data layout of issue 26 (`Layout::Data`, chosen with
//! [`NftablesBackend::with_layout`]): endpoints as elements of
//! `service-endpoints-PROTO-K` maps drawn by one rule per service port,
//! hairpin masquerade by a set of address pairs, ClientIP affinity by
//! dynamic maps; the sets, maps and chains that dispatch to a Service are
//! the same in both.
//!
//! A transaction is a list of typed commands ([`model`]): printed, it is
//! the `nft -f` text; encoded, the netlink batch; both from one value.
//!
//! [`NftablesBackend`] is the `--proxy-mode nftables` implementation of
//! [`kp_sync::Backend`]: it renders and commits through an [`Applier`]:
//! the [`NetlinkApplier`], which sends the transaction to the kernel as one
//! nf_tables netlink batch (what the proxy runs; no `nft` program), the
//! [`NftApplier`] running `nft -f -` (the same transactions, slower), the
//! in-memory `FakeApplier` (tests), or the [`DryRunApplier`]; [`cleanup`]
//! deletes both tables.
//!
//! [`tracer`] replays the typed transactions and follows a packet through
//! them, so tests can assert behaviour ("goes to one of these endpoints", "is
//! rejected") rather than rule text alone. [`live::read_table`] reads the
//! table the kernel holds back into the same model, so a packet can be
//! traced through what the kernel holds and compared with what was
//! rendered.

pub mod applier;
pub mod backend;
pub mod generation;
pub mod live;
pub mod model;
pub mod names;
pub mod netlink;
pub mod options;
pub mod render;
pub mod state;
pub mod tracer;

#[cfg(any(test, feature = "test-util"))]
pub use applier::FakeApplier;
pub use applier::{Applier, ApplyError, DryRunApplier, NftApplier, TransactionStream};
pub use backend::{build, cleanup, cleanup_with, NftablesBackend, MODE};
pub use model::{Command, Transaction};
pub use netlink::NetlinkApplier;
pub use options::{Layout, NftablesOptions};
pub use render::{
    stale_chain_cleanup, Piece, RenderInput, RenderStats, Rendered, Renderer, StaleChainCleanup,
    SPLIT_PIECES, STALE_CHAIN_DELAY, TRANSACTION_TEXT_MAX,
};
pub use state::{DataRecord, Draw, Element, Programmed, ServiceRecord, StateDelta};

/// Why the nftables backend could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NftablesError {
    /// A configuration value is out of range.
    #[error("invalid configuration: field {field}: value {value:?} is invalid; valid values are {valid}")]
    InvalidOption {
        /// The configuration field, e.g. `nftables.masqueradeBit`.
        field: &'static str,
        /// The offending value.
        value: String,
        /// What would be valid.
        valid: &'static str,
    },
}

impl From<kp_node::InvalidValue> for NftablesError {
    fn from(error: kp_node::InvalidValue) -> Self {
        Self::InvalidOption {
            field: error.field,
            value: error.value,
            valid: error.expected,
        }
    }
}
