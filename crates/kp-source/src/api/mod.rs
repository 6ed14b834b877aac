//! The Kubernetes API source: watches Services, EndpointSlices and the
//! proxy's own Node through kube-rs' [`watcher`](kube::runtime::watcher)
//! and hands the changes to a [`ProxyEventHandler`](kp_model::ProxyEventHandler).
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use kp_model::ProxyEventHandler;
//! # use kp_source::api::ApiError;
//! # async fn example(handler: Arc<dyn ProxyEventHandler>) -> Result<(), ApiError> {
//! use kp_source::api::{client_from, post_starting_event, ApiSource};
//!
//! let client = client_from(Some("/var/lib/kube-proxy/kubeconfig".as_ref()), None, 5.0, 10).await?;
//! post_starting_event(&client, "node-1").await;
//! let shutdown = async { let _ = tokio::signal::ctrl_c().await; };
//! ApiSource::new(client, "node-1").run(handler, shutdown).await;
//! # Ok(())
//! # }
//! ```
//!
//! As upstream does, Services and EndpointSlices are listed and watched with
//! the label selector [`PROXY_LABEL_SELECTOR`], which leaves out objects of
//! headless Services and of Services handed to another proxy, and the Node
//! with the field selector `metadata.name=<node>`.
//!
//! The client speaks JSON; kube-rs has no protobuf support.

mod client;
mod compact;
mod event;
mod retry;
mod source;

use std::path::PathBuf;

pub use client::{
    client_from, config_origin, observed_client_from, ConfigOrigin, ObserveLayer, Observed,
    RateLimitLayer, RateLimited, RequestObserver, RequestOutcome,
};
pub use event::{
    post_refused_rules_event, post_starting_event, refused_rules_event, starting_event,
    REFUSED_RULES_REASON,
};
pub use retry::{
    is_retry_noise, watch_failures, WatchFailures, FIRST_RETRY, MAX_RETRY, QUIET_IS_HEALTHY,
};
pub use source::{ApiSource, PROXY_LABEL_SELECTOR};

/// What went wrong while setting up the API client or talking to the API.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The kubeconfig file could not be read or used.
    #[error(
        "reading kubeconfig {path} failed \
         (pass a readable kubeconfig with a current context and a cluster server URL)"
    )]
    ReadKubeconfig {
        /// The file.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The kubeconfig named by `KUBECONFIG` could not be read or used.
    #[error(
        "reading the kubeconfig named by KUBECONFIG failed \
         (set KUBECONFIG to readable kubeconfig files, or pass --kubeconfig)"
    )]
    KubeconfigEnv {
        /// Why it failed.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Neither a kubeconfig nor a master was given and the in-cluster
    /// configuration is not available.
    #[error(
        "loading the in-cluster configuration failed \
         (outside a pod, pass --kubeconfig or --master)"
    )]
    InCluster {
        /// Why it failed.
        #[source]
        source: kube::config::InClusterError,
    },
    /// `--master` is not a URL.
    #[error("--master {master:?} is not a valid URL (expected e.g. https://10.0.0.1:6443)")]
    InvalidMaster {
        /// The value given.
        master: String,
        /// Why it does not parse.
        #[source]
        source: http::uri::InvalidUri,
    },
    /// The HTTP client could not be built from the configuration (TLS
    /// settings, certificates).
    #[error("building the API client failed")]
    BuildClient {
        /// Why it failed.
        #[source]
        source: kube::Error,
    },
    /// The kubeconfig names no certificate authority for an HTTPS server
    /// and the system's trust store could not be loaded.
    #[error("building the API client failed: the kubeconfig names no certificate authority and the system's CA certificates could not be loaded (install the ca-certificates package, or set certificate-authority in the kubeconfig)")]
    NoTrustStore {
        /// Why the trust store could not be loaded.
        #[source]
        source: kube::Error,
    },
    /// Posting an event about the node failed.
    #[error("posting event {reason:?} about node {node:?} failed")]
    PostEvent {
        /// The node the event is about.
        node: String,
        /// The event's reason.
        reason: String,
        /// Why it failed.
        #[source]
        source: kube::Error,
    },
    /// Posting an event about a Service failed.
    #[error("posting event {reason:?} about Service {service} failed")]
    PostServiceEvent {
        /// The Service the event is about (`namespace/name`).
        service: String,
        /// The event's reason.
        reason: String,
        /// Why it failed.
        #[source]
        source: kube::Error,
    },
}
