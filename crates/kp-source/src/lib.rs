//! Sources of kube-proxy-rs: what turns the outside world into events for
//! the proxy's [`ProxyEventHandler`](kp_model::ProxyEventHandler).
//!
//! The [`api`] module holds the Kubernetes API source (kube-rs watchers).
//!
//! This crate holds the manifest source (`--manifests PATH`), which lets the
//! proxy run without any cluster: Services, EndpointSlices and the proxy's
//! own Node are read from YAML or JSON files and followed as they change.
//!
//! ```no_run
//! # async fn example(handler: std::sync::Arc<dyn kp_model::ProxyEventHandler>) {
//! use kp_source::ManifestSource;
//!
//! let source = ManifestSource::new("/etc/kube-proxy/manifests", "node-1");
//! let shutdown = async { let _ = tokio::signal::ctrl_c().await; };
//! if let Err(error) = source.run(handler, shutdown).await {
//!     eprintln!("{error}");
//! }
//! # }
//! ```
//!
//! What the files may hold:
//! - one file, or a directory whose `*.yaml`, `*.yml` and `*.json` files
//!   (subdirectories included, hidden and editor files skipped) are read in
//!   path order;
//! - YAML with several `---`-separated documents, or JSON;
//! - `v1/Service`, `discovery.k8s.io/v1/EndpointSlice`, `v1/Node`, and
//!   `v1/List` (or `ServiceList`, …) of them.
//!
//! No API server has validated these objects, so the source checks what the
//! proxy relies on (ports, protocols, IP addresses, CIDRs, address types, the
//! `kubernetes.io/service-name` label) and skips every document that fails,
//! reporting a [`ManifestError`] naming the file, the document, the object
//! and the field.

pub mod api;
mod conflicts;
mod discover;
mod error;
mod files;
mod limits;
mod names;
mod object;
mod parse;
mod source;
mod validate;
mod watch;

pub use error::{
    DocumentLocation, ManifestError, ManifestProblem, ObjectIdentity, Severity, SourceError,
};
pub use object::{KubeObject, ManifestObject, ObjectKey};
pub use parse::{parse_documents, DEFAULT_NAMESPACE};
pub use source::{LoadReport, ManifestSource, DEFAULT_DEBOUNCE, DEFAULT_RESYNC_PERIOD};
