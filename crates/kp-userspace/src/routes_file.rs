//! The relay's routing table, published as a JSON file so that
//! `kube-proxy trace` and `kube-proxy check`, run in the proxy's container
//! on the node, can tell where the relay sends a connection without asking
//! the API server.
//!
//! The backend writes the file after every sync (a temporary file in the
//! same directory, then `rename(2)`, so a reader sees the old or the new
//! table whole), by default at [`default_path`]:
//! `/run/kube-proxy/userspace-routes-IPv4-4026531840.json` and
//! `…-IPv6-….json`, the number being the network namespace's inode, so
//! proxies in different network namespaces of one host (tests, or a node
//! running more than one) never share a file, and `kube-proxy trace` run
//! in the proxy's namespace finds the proxy's. When the directory cannot be created or the file
//! written, the backend logs it once and carries on: the file is a view
//! for tools, the relay does not depend on it.
//!
//! The content ([`RoutesFile`]):
//!
//! ```json
//! {
//!   "family": "IPv4",
//!   "refusing_port": 40001,
//!   "ports": [
//!     {
//!       "name": "ns1/web:http",
//!       "protocol": "TCP",
//!       "relay_port": 40123,
//!       "cluster": "10.96.0.10:80",
//!       "node_port": 30080,
//!       "external_ips": ["203.0.113.5"],
//!       "load_balancer_ips": [],
//!       "source_ranges": [],
//!       "source_ranges_admit_node": false,
//!       "internal": ["10.244.1.2:8080", "10.244.1.3:8080"],
//!       "external": ["10.244.1.2:8080", "10.244.1.3:8080"],
//!       "affinity_timeout_secs": 10800,
//!       "external_traffic_local": false
//!     }
//!   ]
//! }
//! ```
//!
//! `refusing_port` is the relay's port that resets every TCP connection
//! (the portal rules of a TCP service port without endpoints point
//! there). Per service port: `relay_port` is the listener the portal rules
//! redirect to; `internal` are the endpoints of traffic to the ClusterIP,
//! `external` those of traffic to the NodePort, external IPs and load
//! balancer IPs, each in the order the relay's round robin takes them;
//! `source_ranges` (`loadBalancerSourceRanges`) limit who may use the load
//! balancer IPs (`source_ranges_admit_node`: the load balancer IPs
//! themselves may too); `affinity_timeout_secs` is set under ClientIP
//! session affinity; `external_traffic_local` is
//! `externalTrafficPolicy: Local` (the `external` list then holds only
//! this node's endpoints).

use std::fs;
use std::io::{self, Write as _};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use kp_model::{IpFamily, Protocol};
use serde::{Deserialize, Serialize};

use crate::route::Route;

/// The directory the routing files go to by default: the proxy's run
/// directory.
pub const DEFAULT_ROUTES_DIR: &str = "/run/kube-proxy";

/// The routing table of one family's relay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutesFile {
    /// `IPv4` or `IPv6`.
    pub family: String,
    /// The relay's port that resets TCP connections, if open.
    pub refusing_port: Option<u16>,
    /// One entry per open listener, sorted by service port name.
    pub ports: Vec<PublishedPort>,
}

/// The route of one service port as the relay holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedPort {
    /// The service port's name, `namespace/service:port`.
    pub name: String,
    /// `TCP` or `UDP`.
    pub protocol: String,
    /// The listener's port on the node.
    pub relay_port: u16,
    /// ClusterIP and service port.
    pub cluster: SocketAddr,
    /// The NodePort, when allocated.
    pub node_port: Option<u16>,
    /// External IPs of this family.
    pub external_ips: Vec<IpAddr>,
    /// Load balancer ingress IPs of this family.
    pub load_balancer_ips: Vec<IpAddr>,
    /// `loadBalancerSourceRanges`.
    pub source_ranges: Vec<IpNet>,
    /// The load balancer IPs are allowed sources as well.
    pub source_ranges_admit_node: bool,
    /// Endpoints of traffic to the ClusterIP, in round robin order.
    pub internal: Vec<SocketAddr>,
    /// Endpoints of traffic to the NodePort, external and load balancer
    /// IPs, in round robin order.
    pub external: Vec<SocketAddr>,
    /// ClientIP session affinity timeout, when affinity is on.
    pub affinity_timeout_secs: Option<u64>,
    /// `externalTrafficPolicy: Local`.
    pub external_traffic_local: bool,
}

/// Why the routing file could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum RoutesFileError {
    /// Creating the directory, writing or renaming the file failed.
    #[error("writing the userspace routing file {path} failed")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The file could not be opened or read.
    #[error(
        "reading the userspace routing file {path} failed (the userspace proxy writes it \
         on every sync; is it running in this container?)"
    )]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The file is not a routing table.
    #[error("the userspace routing file {path} is not valid: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the line and column.
        reason: String,
    },
}

/// The routing file of `family` for the network namespace of the calling
/// thread, in [`DEFAULT_ROUTES_DIR`]:
/// `/run/kube-proxy/userspace-routes-IPv4-4026531840.json` (without the
/// number when the namespace cannot be read).
pub fn default_path(family: IpFamily) -> PathBuf {
    let name = match network_namespace_id() {
        Some(id) => format!("userspace-routes-{}-{id}.json", family.as_api_str()),
        None => file_name(family),
    };
    Path::new(DEFAULT_ROUTES_DIR).join(name)
}

/// The inode of the calling thread's network namespace
/// (`/proc/thread-self/ns/net` links to `net:[INODE]`).
fn network_namespace_id() -> Option<u64> {
    let link = std::fs::read_link("/proc/thread-self/ns/net").ok()?;
    link.to_str()?
        .strip_prefix("net:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// `userspace-routes-IPv4.json`.
pub fn file_name(family: IpFamily) -> String {
    format!("userspace-routes-{}.json", family.as_api_str())
}

impl RoutesFile {
    /// Writes the table to `path` atomically: into `path` with `.tmp`
    /// appended, then renamed over `path`. Creates the directory.
    pub fn write_atomically(&self, path: &Path) -> Result<(), RoutesFileError> {
        let error = |source| RoutesFileError::Write {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(error)?;
        }
        let text = serde_json::to_vec_pretty(self).map_err(|e| error(io::Error::other(e)))?;
        let mut temporary = path.as_os_str().to_owned();
        temporary.push(".tmp");
        let temporary = PathBuf::from(temporary);
        let mut file = fs::File::create(&temporary).map_err(error)?;
        // No fsync: the file is a view of the running relay (on tmpfs by
        // default) and is rewritten by every sync; the rename alone keeps
        // readers from seeing half a table.
        file.write_all(&text).map_err(error)?;
        drop(file);
        fs::rename(&temporary, path).map_err(error)
    }

    /// Reads the table at `path`.
    pub fn read(path: &Path) -> Result<Self, RoutesFileError> {
        let text = fs::read(path).map_err(|source| RoutesFileError::Read {
            path: path.to_owned(),
            source,
        })?;
        serde_json::from_slice(&text).map_err(|error| RoutesFileError::Invalid {
            path: path.to_owned(),
            reason: error.to_string(),
        })
    }

    /// The entry whose listener is `relay_port` for `protocol`.
    pub fn by_relay_port(&self, protocol: Protocol, relay_port: u16) -> Option<&PublishedPort> {
        self.ports
            .iter()
            .find(|port| port.relay_port == relay_port && port.protocol == protocol.as_api_str())
    }
}

impl PublishedPort {
    /// The entry of service port `name`, listening on `relay_port`, routed
    /// by `route`.
    pub fn new(
        name: String,
        protocol: Protocol,
        relay_port: u16,
        route: &Route,
        external_traffic_local: bool,
    ) -> Self {
        Self {
            name,
            protocol: protocol.as_api_str().to_owned(),
            relay_port,
            cluster: route.cluster,
            node_port: route.node_port,
            external_ips: route.external_ips.clone(),
            load_balancer_ips: route.load_balancer_ips.clone(),
            source_ranges: route.source_ranges.clone(),
            source_ranges_admit_node: route.source_ranges_admit_node,
            internal: route.internal.to_vec(),
            external: route.external.to_vec(),
            affinity_timeout_secs: route.affinity_timeout.map(|timeout| timeout.as_secs()),
            external_traffic_local,
        }
    }

    /// The route the relay holds for this entry (it refuses connections no
    /// portal rule sent, as every route built from a Service does).
    pub fn route(&self) -> Route {
        Route {
            cluster: self.cluster,
            node_port: self.node_port,
            external_ips: self.external_ips.clone(),
            load_balancer_ips: self.load_balancer_ips.clone(),
            source_ranges: self.source_ranges.clone(),
            source_ranges_admit_node: self.source_ranges_admit_node,
            internal: Arc::from(self.internal.as_slice()),
            external: Arc::from(self.external.as_slice()),
            affinity_timeout: self.affinity_timeout_secs.map(Duration::from_secs),
            accept_unredirected: false,
        }
    }
}
