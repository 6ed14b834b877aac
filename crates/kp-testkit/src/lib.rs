//! Test kit of kube-proxy-rs.
//!
//! - [`builders`]: story-style builders for the Kubernetes objects the proxy
//!   consumes (`service("ns1", "svc1", |s| s.cluster_ip("10.96.0.41"))`).
//! - [`plan`]: the fixed address plan every test uses.
//! - [`netns`]: the network-namespace harness of kernel and system tests:
//!   a node, pods with echo servers and outside clients, several nodes on
//!   a fabric, and probes.
//! - [`clusters`]: random clusters as manifests, a seed naming each, for
//!   the differential tests of the modes against the model.
//! - [`files`]: manifest files for `--manifests`; [`http`]: a plain `GET`.
//! - [`golden`]: comparison with golden files, which no test can rewrite.
//! - [`upstream`]: names upstream kube-proxy shows operators (metrics).
//!
//! This crate depends on no other crate of the workspace, so every crate can
//! use it as a dev-dependency without a cycle.

pub mod apiserver;
pub mod builders;
pub mod clusters;
pub mod files;
pub mod golden;
pub mod http;
pub mod netns;
pub mod plan;
pub mod upstream;

pub use builders::{
    endpoint_slice, node, service, EndpointBuilder, EndpointSliceBuilder, NodeBuilder,
    ServiceBuilder,
};
