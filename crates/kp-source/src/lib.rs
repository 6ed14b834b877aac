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
//! proxy relies on as the API server would, with its messages: names
//! (Service names are DNS-1035 labels, namespaces and port names DNS-1123
//! labels, EndpointSlice and Node names DNS-1123 subdomains, the
//! `kubernetes.io/service-name` label a label value), ports, protocols, IP
//! addresses, CIDRs, address types, and what its allocators refuse (two
//! Services with one ClusterIP or one node port: the first in path order
//! keeps it). Every problem is a [`ManifestError`] naming the file and line,
//! the document, the object and the field; only the offending object is
//! affected.
//!
//! An object disappears only when its document is removed from the files.
//! A document that stops parsing or passing the checks keeps delivering the
//! object's last good state until it is fixed; a brand-new invalid object is
//! not delivered. Files over 64 MiB and documents nesting brackets more than
//! 64 levels are refused before parsing, and a file is parsed again only
//! when its content changed.

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
    DocumentLocation, Holder, ManifestError, ManifestProblem, ObjectIdentity, Severity, SourceError,
};
pub use object::{KubeObject, ManifestObject, ObjectKey};
pub use parse::{parse_documents, DEFAULT_NAMESPACE};
pub use source::{LoadReport, ManifestSource, DEFAULT_DEBOUNCE, DEFAULT_RESYNC_PERIOD};
