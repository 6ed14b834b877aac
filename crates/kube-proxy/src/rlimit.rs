//! The descriptor limit, raised when the process starts (as Go programs,
//! upstream kube-proxy among them, raise theirs) and logged once logging
//! is set up.

use std::sync::OnceLock;

use kp_agent::descriptors::{raise_nofile_soft_limit, DescriptorLimitError, NofileRaise};

/// What [`raise_nofile_limit`] did, for [`log_outcome`].
static OUTCOME: OnceLock<Result<NofileRaise, DescriptorLimitError>> = OnceLock::new();

/// Raises the soft descriptor limit to the hard limit. A failure leaves
/// the limit as it was and is logged as a warning by [`log_outcome`]; the
/// proxy runs on, as Go programs do.
pub fn raise_nofile_limit() {
    let _ = OUTCOME.set(raise_nofile_soft_limit());
}

/// Logs what [`raise_nofile_limit`] did: the change at debug level, a
/// failure as a warning.
pub fn log_outcome() {
    match OUTCOME.get() {
        Some(Ok(raise)) if raise.soft_after != raise.soft_before => tracing::debug!(
            from = raise.soft_before,
            to = raise.soft_after,
            "Raised the soft descriptor limit (RLIMIT_NOFILE) to the hard limit"
        ),
        Some(Ok(_)) | None => {}
        Some(Err(error)) => tracing::warn!(
            error = %error_chain(error),
            "Running with the soft descriptor limit the process started with"
        ),
    }
}

/// `error` and its causes, `: `-separated.
fn error_chain(error: &DescriptorLimitError) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
