//! Network-namespace harness for kernel and system tests.
//!
//! A [`Topology`] is a small cluster made of network namespaces, built with
//! iproute2 (`ip netns add`, `ip -n NS link add …`) and removed on drop, even
//! when the test panics:
//!
//! ```text
//!   client  eth0 192.168.99.10 ──veth── cl0  ┐
//!   client2 eth0 192.168.99.11 ──veth── cl1  │ node: 192.168.99.2 on every clN,
//!   ep1     eth0 10.244.1.2    ──veth── pod0 │ 169.254.1.1 on every podN,
//!   ep2     eth0 10.244.1.3    ──veth── pod1 │ a /32 (/128) route per host,
//!   ep3     eth0 10.244.2.2    ──veth── pod2 ┘ forwarding on
//! ```
//!
//! - The *node* namespace is where the proxy runs: IP forwarding on, and
//!   one routed veth per pod and per client, like a CNI plugin in ptp mode.
//!   Its end of a client veth (`clN`) holds the node IP as /32 (/128); its
//!   end of a pod veth (`podN`) holds the pods' gateway 169.254.1.1 and
//!   fe80::1. Each pod and client has a host route on the node, with the
//!   node IP as source.
//! - *Pod* namespaces have `eth0` with the pod IP and a default route via the
//!   gateway, and run in-process TCP/UDP echo servers that answer
//!   `"<pod name> <client source ip>"`. Pods declared with
//!   [`TopologyBuilder::remote_pod`] take addresses of the other node's range
//!   ([`plan::OTHER_NODE_POD_CIDR`]) but are wired the same way.
//! - *Client* namespaces stand outside the node: `eth0` with an address of
//!   the node network (/24, /64, so the node is on-link) and routes to the
//!   service, pod and external ranges via the node IP.
//! - With [`TopologyBuilder::with_second_node`], a *second node*
//!   namespace (`node-2`) holds the remote pods instead:
//!
//! ```text
//!   client eth0 192.168.99.10 ──veth── cl0   ┐
//!   ep1    eth0 10.244.1.2    ──veth── pod0  ├ node 192.168.99.2
//!   node-2 eth0 192.168.99.3  ──veth── node2 ┘
//!   ep3    eth0 10.244.2.2    ──veth── pod1 of node-2 (gateway 169.254.1.1)
//!
//!   node:   10.244.2.0/24 via 192.168.99.3 dev node2
//!   node-2: 192.168.99.2/32 dev eth0, 10.244.1.0/24 via 192.168.99.2,
//!           a host route per pod; no default route
//! ```
//!
//!   The second node is reached only over its own veth from the proxy's
//!   node, and it has no route to the clients (192.168.99.10, …): the
//!   clients' /24 makes 192.168.99.3 look on-link to them, but nothing on
//!   their link answers for it. A pod there can reply to a client's
//!   connection only when the proxy's node masqueraded it to the node's
//!   address; without SNAT, the reply to 192.168.99.10 dies on node-2
//!   ("network unreachable") and the client times out. The same holds for
//!   IPv6 (fd00:192:168:99::3, fd00:10:244:2::/64).
//!
//! Nothing is configured in the root namespace: links are created directly
//! inside the namespaces (`ip -n NODE link add podN type veth peer name eth0
//! netns POD`) and sysctls are written by a thread that entered the namespace.
//!
//! Namespace names are `kpt-<pid>-<n>-<role>`; a topology being built first
//! deletes leftovers of crashed runs: namespaces with that prefix whose pid
//! is no longer alive.
//!
//! A [`Cluster`] is several such nodes joined by a *fabric*, for tests
//! that run one proxy per node:
//!
//! ```text
//!   fabric: br0 192.168.99.1 (the test API server listens here)
//!     ├─ n0 ── node-a eth0 192.168.99.2  pods 10.244.1.0/24 (routed veths)
//!     ├─ n1 ── node-b eth0 192.168.99.3  pods 10.244.2.0/24
//!     ├─ n2 ── node-c eth0 192.168.99.4  pods 10.244.3.0/24
//!     └─ c0 ── client eth0 192.168.99.10
//! ```
//!
//! Each node routes every other node's pod range via that node's address
//! (host-gw) and has a default route via the fabric, which forwards
//! nothing. Pods are wired to their node as in a [`Topology`]; clients
//! reach every node on-link and the external range via one node
//! ([`Cluster::route_external_via`]).
//!
//! Probes ([`connect`], [`hits`], [`hits_until_all`], [`udp_roundtrip`], [`expect_refused`],
//! [`expect_timeout`], [`TcpSession`]) run from any namespace on a thread
//! that entered it, with deadlines of about one second.
//!
//! [`plan::OTHER_NODE_POD_CIDR`]: crate::plan::OTHER_NODE_POD_CIDR

mod cluster;
mod echo;
mod env;
mod namespace;
mod probe;
mod topology;

use std::path::PathBuf;
use std::process::ExitStatus;

pub use cluster::{Cluster, ClusterBuilder, ClusterNode, ClusterNodeBuilder};
pub use env::{require_root, require_tool, wait_until};
pub use namespace::{remove_leftovers, Netns, NsChild};
pub use probe::{
    connect, expect_refused, expect_timeout, hits, hits_until_all, udp_roundtrip, ProbeError,
    Reply, TcpSession, PROBE_TIMEOUT,
};
pub use topology::{
    Host, PodBuilder, Topology, TopologyBuilder, POD_GATEWAY, POD_GATEWAY_V6, SECOND_NODE_LINK,
};

/// What went wrong while building, entering or using a test namespace.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// A program could not be started at all.
    #[error("starting `{command}` failed (is it installed?)")]
    Spawn {
        /// The command line.
        command: String,
        /// Why it could not start.
        #[source]
        source: std::io::Error,
    },
    /// A program ran and failed.
    #[error("`{command}` failed with {status}: {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status.
        status: ExitStatus,
        /// What it printed on stderr.
        stderr: String,
    },
    /// `/run/netns/NAME` could not be opened.
    #[error("opening network namespace {path} failed")]
    Open {
        /// The namespace file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// `setns(CLONE_NEWNET)` on a namespace failed.
    #[error("entering network namespace {namespace} failed")]
    Enter {
        /// The namespace name.
        namespace: String,
        /// The cause.
        #[source]
        source: nix::Error,
    },
    /// Writing a sysctl inside a namespace failed.
    #[error("setting sysctl {key} in network namespace {namespace} failed")]
    Sysctl {
        /// The namespace name.
        namespace: String,
        /// The sysctl, e.g. `net/ipv4/ip_forward`.
        key: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A pod or client name cannot be used.
    #[error("invalid name {name:?}: {reason}")]
    InvalidName {
        /// The name given by the test.
        name: String,
        /// What a valid name looks like.
        reason: &'static str,
    },
    /// An echo server could not listen on its port.
    #[error("echo server of pod {pod} could not bind {protocol} port {port}")]
    Bind {
        /// The pod name.
        pod: String,
        /// `TCP` or `UDP`.
        protocol: &'static str,
        /// The port.
        port: u16,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A thread for an echo server could not be started.
    #[error("starting an echo server thread for pod {pod} failed")]
    Thread {
        /// The pod name.
        pod: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}
