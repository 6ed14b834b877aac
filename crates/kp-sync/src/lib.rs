//! The sync stage of kube-proxy-rs.
//!
//! - [`runner`]: the bounded-frequency runner that coalesces sync requests
//!   (upstream's `BoundedFrequencyRunner`), on tokio time.
//! - [`backend`]: the [`Backend`] trait every data-plane mode implements and
//!   the categorized [`SyncRequest`] it receives.
//! - [`proxier`]: the one sync loop every backend shares, one [`Proxier`] per
//!   IP family, which is also the sources' event handler.
//! - [`fan_out`]: feeds both families' proxiers from one source (dual-stack).
//! - [`status`]: what the loop did, for health and metrics.
//! - [`testing`]: [`FakeBackend`](testing::FakeBackend), a strict in-memory
//!   backend for tests.

pub mod backend;
pub mod expect;
pub mod fan_out;
pub mod proxier;
pub mod runner;
pub mod status;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
pub mod trace;

pub use backend::{
    Backend, BackendError, ServicePortState, StaleConntrack, SyncOutcome, SyncRequest,
};
pub use fan_out::FanOutHandler;
pub use proxier::{error_chain, Proxier, ProxierConfig, RepairHandle, SyncError, SyncObserver};
pub use runner::{BoundedFrequencyRunner, RunReason, RunResult, RunnerConfig};
pub use status::{ChangeCounts, ChangeKind, SyncStats, SyncStatus, SyncTotals};
