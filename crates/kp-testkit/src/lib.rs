//! Test kit of kube-proxy-rs.
//!
//! - [`builders`]: story-style builders for the Kubernetes objects the proxy
//!   consumes (`service("ns1", "svc1", |s| s.cluster_ip("10.96.0.41"))`).
//! - [`plan`]: the fixed address plan every test uses.
//!
//! This crate depends only on `k8s-openapi` and `ipnet`, so every other crate
//! of the workspace can use it as a dev-dependency without a cycle.

pub mod builders;
pub mod plan;

pub use builders::{
    endpoint_slice, node, service, EndpointBuilder, EndpointSliceBuilder, NodeBuilder,
    ServiceBuilder,
};
