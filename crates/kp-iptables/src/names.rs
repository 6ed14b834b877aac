//! Chain names, exactly as upstream kube-proxy spells them.
//!
//! Per-service chains are a prefix plus the first 16 characters of
//! base32(sha256(`ns/name:port` + lower-case protocol)), and per-endpoint
//! chains hash `ns/name:port` + protocol + `ip:port` the same way
//! (upstream `portProtoHash` and `servicePortEndpointChainName`). Keeping the
//! names identical lets `--cleanup` of either implementation remove the
//! other's rules.
//!
//! Hashing is the hot path of a render, so [`ChainNameCache`] keeps every
//! hash (and the strings written next to it) across syncs.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::net::SocketAddr;

use kp_model::ServicePortName;
use sha2::{Digest, Sha256};

/// nat and filter: entry chain for Service traffic (`-j KUBE-SERVICES` from
/// PREROUTING and OUTPUT).
pub const KUBE_SERVICES: &str = "KUBE-SERVICES";
/// filter: REJECT/DROP for externally-visible addresses without endpoints.
pub const KUBE_EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
/// nat: NodePort dispatch; filter: health-check node port ACCEPTs.
pub const KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";
/// nat: masquerades packets carrying the masquerade mark.
pub const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
/// nat: sets the masquerade mark.
pub const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
/// filter: ACCEPTs forwarded Service traffic and drops INVALID packets.
pub const KUBE_FORWARD: &str = "KUBE-FORWARD";
/// filter: DROPs load balancer traffic not allowed by `loadBalancerSourceRanges`.
pub const KUBE_PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
/// filter: kubelet's chain, shared with it; holds the rule that blocks
/// martian packets to 127.0.0.0/8 when localhost NodePorts are enabled
/// (CVE-2020-8558, <https://issues.k8s.io/90259>). Never deleted by cleanup.
pub const KUBE_FIREWALL: &str = "KUBE-FIREWALL";
/// mangle, nat and filter: an empty chain whose disappearance tells the
/// applier that someone flushed the tables and a full sync is due.
pub const KUBE_PROXY_CANARY: &str = "KUBE-PROXY-CANARY";

/// Which per-service chain a [`ChainName`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChainKind {
    /// `KUBE-SVC-`: dispatch to endpoints under `Cluster` policy.
    Cluster,
    /// `KUBE-SVL-`: dispatch to local endpoints under `Local` policy.
    Local,
    /// `KUBE-EXT-`: entry for external destinations (NodePort, externalIPs,
    /// load balancer IPs).
    External,
    /// `KUBE-FW-`: `loadBalancerSourceRanges` filtering.
    Firewall,
    /// `KUBE-SEP-`: DNAT to one endpoint.
    Endpoint,
}

/// The name of a per-service or per-endpoint chain, e.g.
/// `KUBE-SVC-XPGD46QRK7WJZT7O`. Small and `Copy`; `Display` writes the name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChainName {
    kind: ChainKind,
    hash: [u8; 16],
}

/// Hashes and strings of the chain names of every service port and endpoint
/// seen by the last render. A renderer keeps one across syncs; entries not
/// used by a render are dropped at its end by [`ChainNameCache::prune`].
#[derive(Debug, Default)]
pub struct ChainNameCache {
    services: HashMap<ServicePortName, CachedService>,
    generation: u64,
}

/// Cached names of one service port. Its `ns/name:port` text is not kept:
/// the renderer writes it from the name when it needs it, and 10,000 copies
/// of it cost more than writing it.
#[derive(Debug)]
pub struct CachedService {
    hash: [u8; 16],
    /// Sorted by address. A service port has a handful of endpoints; a
    /// vector of exactly those is a fraction of a hash table's size.
    endpoints: Vec<CachedEndpoint>,
    seen: u64,
}

/// Cached names of one endpoint of one service port.
#[derive(Debug)]
pub struct CachedEndpoint {
    /// `ip:port`; its `Display` (`[ip]:port` for IPv6) is what
    /// `--to-destination` and the comments write.
    pub address: SocketAddr,
    /// The `KUBE-SEP-` chain.
    pub chain: ChainName,
    seen: u64,
}

impl ChainKind {
    /// The chain name prefix, e.g. `KUBE-SVC-`.
    pub fn prefix(self) -> &'static str {
        match self {
            ChainKind::Cluster => "KUBE-SVC-",
            ChainKind::Local => "KUBE-SVL-",
            ChainKind::External => "KUBE-EXT-",
            ChainKind::Firewall => "KUBE-FW-",
            ChainKind::Endpoint => "KUBE-SEP-",
        }
    }

    const ALL: [ChainKind; 5] = [
        ChainKind::Cluster,
        ChainKind::Local,
        ChainKind::External,
        ChainKind::Firewall,
        ChainKind::Endpoint,
    ];
}

impl ChainName {
    /// Parses a chain name of our per-service form; `None` for any other name.
    pub fn parse(name: &str) -> Option<ChainName> {
        ChainKind::ALL.iter().find_map(|&kind| {
            let rest = name.strip_prefix(kind.prefix())?;
            let hash: [u8; 16] = rest.as_bytes().try_into().ok()?;
            hash.iter()
                .all(|b| b.is_ascii_uppercase() || (b'2'..=b'7').contains(b))
                .then_some(ChainName { kind, hash })
        })
    }

    /// Which chain this is.
    pub fn kind(self) -> ChainKind {
        self.kind
    }
}

impl fmt::Display for ChainName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.prefix())?;
        self.hash
            .iter()
            .try_for_each(|&b| f.write_char(char::from(b)))
    }
}

impl ChainNameCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a render: entries not touched from now until [`Self::prune`]
    /// are dropped by it.
    pub fn begin(&mut self) {
        self.generation += 1;
    }

    /// Looks up (computing on first use) the names of `service_port` and of
    /// each of `endpoints`. Always `Some`; an `Option` only because the map
    /// is searched again after an insert.
    pub fn touch(
        &mut self,
        service_port: &ServicePortName,
        endpoints: impl Iterator<Item = SocketAddr>,
    ) -> Option<&CachedService> {
        let generation = self.generation;
        if !self.services.contains_key(service_port) {
            self.services
                .insert(service_port.clone(), CachedService::new(service_port));
        }
        let entry = self.services.get_mut(service_port)?;
        entry.seen = generation;
        let protocol = service_port.protocol.as_rule_str();
        // Written only when an endpoint is new, to hash its chain name.
        let mut name: Option<String> = None;
        for address in endpoints {
            let endpoints = &mut entry.endpoints;
            let index = match endpoints.binary_search_by(|ep| ep.address.cmp(&address)) {
                Ok(index) => index,
                Err(index) => {
                    if endpoints.len() == endpoints.capacity() {
                        endpoints.reserve_exact(1);
                    }
                    let name = name.get_or_insert_with(|| service_port_name_string(service_port));
                    endpoints.insert(index, CachedEndpoint::new(name, protocol, address));
                    index
                }
            };
            endpoints[index].seen = generation;
        }
        Some(entry)
    }

    /// Drops every service port and endpoint not touched since [`Self::begin`].
    pub fn prune(&mut self) {
        let generation = self.generation;
        self.services.retain(|_, service| {
            service.endpoints.retain(|ep| ep.seen == generation);
            service.seen == generation
        });
    }

    /// Number of cached service ports.
    pub fn len(&self) -> usize {
        self.services.len()
    }

    /// The cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }
}

impl CachedService {
    fn new(service_port: &ServicePortName) -> Self {
        let name = service_port_name_string(service_port);
        let hash = hash16(&[
            name.as_bytes(),
            service_port.protocol.as_rule_str().as_bytes(),
        ]);
        CachedService {
            hash,
            endpoints: Vec::new(),
            seen: 0,
        }
    }

    /// The chain of `kind` for this service port (not for
    /// [`ChainKind::Endpoint`], whose names come from [`Self::endpoint`]).
    pub fn chain(&self, kind: ChainKind) -> ChainName {
        ChainName {
            kind,
            hash: self.hash,
        }
    }

    /// The cached names of one endpoint, when it was touched.
    pub fn endpoint(&self, address: &SocketAddr) -> Option<&CachedEndpoint> {
        let index = self
            .endpoints
            .binary_search_by(|ep| ep.address.cmp(address))
            .ok()?;
        self.endpoints.get(index)
    }
}

impl CachedEndpoint {
    fn new(service_port_name: &str, protocol: &str, address: SocketAddr) -> Self {
        let text = address.to_string();
        let hash = hash16(&[
            service_port_name.as_bytes(),
            protocol.as_bytes(),
            text.as_bytes(),
        ]);
        CachedEndpoint {
            address,
            chain: ChainName {
                kind: ChainKind::Endpoint,
                hash,
            },
            seen: 0,
        }
    }
}

/// `ns/name:port`, or `ns/name` for an unnamed port (upstream
/// `ServicePortName.String()`).
pub fn service_port_name_string(name: &ServicePortName) -> String {
    let service = &name.service;
    if name.port.is_empty() {
        format!("{}/{}", service.namespace, service.name)
    } else {
        format!("{}/{}:{}", service.namespace, service.name, name.port)
    }
}

/// The name of `kind`'s chain for `service_port`, computed without a cache.
pub fn service_chain_name(service_port: &ServicePortName, kind: ChainKind) -> ChainName {
    CachedService::new(service_port).chain(kind)
}

/// The `KUBE-SEP-` chain of `endpoint` of `service_port`, computed without a
/// cache.
pub fn endpoint_chain_name(service_port: &ServicePortName, endpoint: SocketAddr) -> ChainName {
    let name = service_port_name_string(service_port);
    CachedEndpoint::new(&name, service_port.protocol.as_rule_str(), endpoint).chain
}

/// `true` for the names of per-service and per-endpoint chains (upstream
/// `isServiceChainName`): the chains a sync may delete when stale.
pub fn is_service_chain_name(name: &str) -> bool {
    ChainKind::ALL
        .iter()
        .any(|kind| name.starts_with(kind.prefix()))
}

/// First 16 characters of base32(sha256(parts…)). Base32 turns each 5 bytes
/// into 8 characters, so those are exactly the encoding of the first 10
/// bytes and padding never shows.
fn hash16(parts: &[&[u8]]) -> [u8; 16] {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    let digest = hasher.finalize();
    let mut out = [0u8; 16];
    data_encoding::BASE32.encode_mut(&digest[..10], &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_accepts_only_our_shape() {
        let name = "KUBE-SVC-XPGD46QRK7WJZT7O";
        let parsed = ChainName::parse(name);
        assert_eq!(parsed.map(|n| n.to_string()).as_deref(), Some(name));
        assert_eq!(parsed.map(ChainName::kind), Some(ChainKind::Cluster));
        assert_eq!(ChainName::parse("KUBE-SVC-short"), None);
        assert_eq!(ChainName::parse("KUBE-SERVICES"), None);
        assert_eq!(ChainName::parse("KUBE-FW-xpgd46qrk7wjzt7o"), None);
    }

    #[test]
    fn service_chain_names_recognised_by_prefix() {
        assert!(is_service_chain_name("KUBE-SEP-ANYTHING"));
        assert!(is_service_chain_name("KUBE-FW-X"));
        assert!(!is_service_chain_name("KUBE-SERVICES"));
        assert!(!is_service_chain_name("KUBE-MARK-MASQ"));
    }
}
