//! Names of the `kube-proxy` table's objects, as upstream's nftables mode
//! names them, so that either implementation can take over the other's
//! table.
//!
//! Per-service chains and sets are named `PREFIX` + the first 8 characters
//! of base32(sha256(NAME)) + `-` + NAME, where NAME is
//! `namespace/service/protocol/port` for a service port and
//! `namespace/service/protocol/port__ip/port` for an endpoint (an IPv6
//! address with `:` replaced by `.`), e.g.
//! `service-ULMVA6XW-ns1/svc1/tcp/p80` and
//! `endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80`. The hash keeps names
//! unique when a long one is cut and tells apart names that differ in one
//! digit.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use kp_model::ServicePortName;
use sha2::{Digest, Sha256};

use crate::model::{Command, Expr, Name, Verdict};

/// The table, in both families.
pub const TABLE: &str = "kube-proxy";

/// Base chain: filter hook prerouting, before DNAT (priority -110).
pub const FILTER_PREROUTING_PRE_DNAT: &str = "filter-prerouting-pre-dnat";
/// Base chain: filter hook output, before DNAT (priority -110).
pub const FILTER_OUTPUT_PRE_DNAT: &str = "filter-output-pre-dnat";
/// Base chain: filter hook forward (priority 0).
pub const FILTER_FORWARD: &str = "filter-forward";
/// Base chain: filter hook input (priority 0).
pub const FILTER_INPUT: &str = "filter-input";
/// Base chain: filter hook output (priority 0).
pub const FILTER_OUTPUT: &str = "filter-output";
/// Base chain: nat hook output (priority -100, dstnat).
pub const NAT_OUTPUT: &str = "nat-output";
/// Base chain: nat hook postrouting (priority 100, srcnat).
pub const NAT_POSTROUTING: &str = "nat-postrouting";
/// Base chain: nat hook prerouting (priority -100, dstnat).
pub const NAT_PREROUTING: &str = "nat-prerouting";

/// Dispatch of Service traffic through the `service-ips` and
/// `service-nodeports` maps.
pub const SERVICES: &str = "services";
/// Rejects traffic to ports of a ClusterIP that no Service defines.
pub const CLUSTER_IPS_CHECK: &str = "cluster-ips-check";
/// Drops traffic to load balancer IPs from outside `loadBalancerSourceRanges`.
pub const FIREWALL_CHECK: &str = "firewall-check";
/// Refuses traffic to Service IPs without endpoints.
pub const SERVICE_ENDPOINTS_CHECK: &str = "service-endpoints-check";
/// Refuses traffic to NodePorts without endpoints.
pub const NODEPORT_ENDPOINTS_CHECK: &str = "nodeport-endpoints-check";
/// `reject`, as the verdict of a map element (a map cannot say `reject`).
pub const REJECT_CHAIN: &str = "reject-chain";
/// Sets the masquerade mark.
pub const MARK_FOR_MASQUERADE: &str = "mark-for-masquerade";
/// Masquerades marked packets.
pub const MASQUERADING: &str = "masquerading";

/// Set of every ClusterIP.
pub const CLUSTER_IPS: &str = "cluster-ips";
/// Set of the addresses NodePorts answer on (with `nodePortAddresses`).
pub const NODEPORT_IPS: &str = "nodeport-ips";
/// Verdict map: ClusterIP, external IP and load balancer IP traffic.
pub const SERVICE_IPS: &str = "service-ips";
/// Verdict map: NodePort traffic.
pub const SERVICE_NODEPORTS: &str = "service-nodeports";
/// Verdict map: Service IPs without endpoints.
pub const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
/// Verdict map: NodePorts without endpoints.
pub const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
/// Verdict map: load balancer IPs subject to `loadBalancerSourceRanges`.
pub const FIREWALL_IPS: &str = "firewall-ips";

/// The data layout's set of `endpoint . endpoint` address pairs that
/// masquerade (an endpoint reaching itself through a Service).
pub const HAIRPIN_ENDPOINTS: &str = "hairpin-endpoints";

/// Which of the data layout's slot maps, count sets and class chains a
/// draw uses: the cluster or the local endpoint list, of a Service entry
/// (an address and port) or of a NodePort (a port on any node address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pool {
    /// The local endpoint list (eTP/iTP Local), not the cluster one.
    pub local: bool,
    /// Keyed by the NodePort rather than by the entry's address and port.
    pub node_port: bool,
}

impl Pool {
    /// The four pools.
    pub const ALL: [Pool; 4] = [
        Pool {
            local: false,
            node_port: false,
        },
        Pool {
            local: false,
            node_port: true,
        },
        Pool {
            local: true,
            node_port: false,
        },
        Pool {
            local: true,
            node_port: true,
        },
    ];
}

/// The data layout's slot maps, by pool (in the order of [`Pool::ALL`])
/// and protocol (tcp, udp, sctp).
const SLOT_MAPS: [[&str; 3]; 4] = [
    [
        "service-endpoints-tcp",
        "service-endpoints-udp",
        "service-endpoints-sctp",
    ],
    [
        "nodeport-endpoints-tcp",
        "nodeport-endpoints-udp",
        "nodeport-endpoints-sctp",
    ],
    [
        "local-endpoints-tcp",
        "local-endpoints-udp",
        "local-endpoints-sctp",
    ],
    [
        "local-nodeport-endpoints-tcp",
        "local-nodeport-endpoints-udp",
        "local-nodeport-endpoints-sctp",
    ],
];

/// The data layout's class chains, cluster then local, by protocol.
const CLASS_CHAINS: [[&str; 3]; 2] = [
    [
        "endpoints-by-count-tcp",
        "endpoints-by-count-udp",
        "endpoints-by-count-sctp",
    ],
    [
        "local-endpoints-by-count-tcp",
        "local-endpoints-by-count-udp",
        "local-endpoints-by-count-sctp",
    ],
];

fn protocol_index(protocol: kp_model::Protocol) -> usize {
    match protocol {
        kp_model::Protocol::Tcp => 0,
        kp_model::Protocol::Udp => 1,
        kp_model::Protocol::Sctp => 2,
    }
}

/// The data layout's map of `pool`'s slots of `protocol`:
/// `service-endpoints-tcp` (entry address . port . slot : endpoint),
/// `nodeport-endpoints-tcp` (node port . slot : endpoint), and
/// `local-endpoints-tcp`, `local-nodeport-endpoints-tcp` for the local
/// lists.
pub fn slot_map(pool: Pool, protocol: kp_model::Protocol) -> &'static str {
    let row = usize::from(pool.node_port) + 2 * usize::from(pool.local);
    SLOT_MAPS[row][protocol_index(protocol)]
}

/// Whether `name` is one of the data layout's slot maps.
pub fn is_slot_map(name: &str) -> bool {
    SLOT_MAPS.iter().flatten().any(|map| *map == name)
}

/// Whether `name` is one of the data layout's slot maps, count sets or
/// group sets, whose elements name no Service.
pub fn is_slot_map_or_count_set(name: &str) -> bool {
    is_slot_map(name) || count_of_set(name).is_some() || group_of_set(name).is_some()
}

/// The pool and count of a count set's name (the inverse of
/// [`count_set`]).
pub fn count_of_set(name: &str) -> Option<(Pool, u32)> {
    let (pool, count) = pool_and_rest(name, "count-")?;
    Some((pool, parse_count(count)?))
}

/// How many consecutive endpoint counts one group of a class chain holds
/// (counts 1–8, 9–16, …): a new connection walks at most the rules of the
/// groups before its entry's and the class rules of its own group.
pub const GROUP_SIZE: u32 = 8;

/// The first count of the group `count` belongs to (1 for 1–8, 9 for
/// 9–16, …); counts start at 1.
pub fn group_of_count(count: u32) -> u32 {
    count.saturating_sub(1) / GROUP_SIZE * GROUP_SIZE + 1
}

/// The data layout's set of `pool`'s entries whose endpoint count is in
/// the group that starts at `first` (see [`group_of_count`]):
/// `endpoint-group-1-8`, `nodeport-group-9-16`, `local-endpoint-group-1-8`,
/// `local-nodeport-group-1-8`.
pub fn group_set(pool: Pool, first: u32) -> &'static str {
    let local = if pool.local { "local-" } else { "" };
    let kind = if pool.node_port {
        "nodeport-group"
    } else {
        "endpoint-group"
    };
    let last = group_last(first);
    intern(format!("{local}{kind}-{first}-{last}"))
}

/// The pool and first count of a group set's name (the inverse of
/// [`group_set`]).
pub fn group_of_set(name: &str) -> Option<(Pool, u32)> {
    let (pool, range) = pool_and_rest(name, "group-")?;
    Some((pool, parse_group_range(range)?))
}

/// The data layout's chain of the class rules of one endpoint list,
/// protocol and group of counts (the group that starts at `first`):
/// `endpoints-by-count-tcp-1-8`, `local-endpoints-by-count-udp-9-16`. The
/// class chain's rule for the group looks the entry up in the group's set
/// and goes there.
pub fn group_chain(local: bool, protocol: kp_model::Protocol, first: u32) -> &'static str {
    let last = group_last(first);
    intern(format!("{}-{first}-{last}", class_chain(local, protocol)))
}

/// The endpoint list, protocol and first count of a group chain's name
/// (the inverse of [`group_chain`]).
pub fn group_of_chain(name: &str) -> Option<(bool, kp_model::Protocol, u32)> {
    [false, true].into_iter().find_map(|local| {
        PROTOCOLS.into_iter().find_map(|protocol| {
            let range = name
                .strip_prefix(class_chain(local, protocol))?
                .strip_prefix('-')?;
            Some((local, protocol, parse_group_range(range)?))
        })
    })
}

const PROTOCOLS: [kp_model::Protocol; 3] = [
    kp_model::Protocol::Tcp,
    kp_model::Protocol::Udp,
    kp_model::Protocol::Sctp,
];

/// The last count of the group that starts at `first`.
fn group_last(first: u32) -> u32 {
    first.saturating_add(GROUP_SIZE - 1)
}

/// `local-` or not, then `nodeport-` or `endpoint-`, then `kind`: the pool
/// and what follows.
fn pool_and_rest<'a>(name: &'a str, kind: &str) -> Option<(Pool, &'a str)> {
    let (local, rest) = match name.strip_prefix("local-") {
        Some(rest) => (true, rest),
        None => (false, name),
    };
    let (node_port, rest) = if let Some(rest) = rest.strip_prefix("nodeport-") {
        (true, rest)
    } else {
        (false, rest.strip_prefix("endpoint-")?)
    };
    Some((Pool { local, node_port }, rest.strip_prefix(kind)?))
}

/// A count as the names write it: decimal, no leading zero, not 0.
fn parse_count(text: &str) -> Option<u32> {
    text.parse()
        .ok()
        .filter(|count| *count > 0 && !text.starts_with('0'))
}

/// `FIRST-LAST` of a group as [`group_set`] and [`group_chain`] write it:
/// the first count of a group and its last.
fn parse_group_range(text: &str) -> Option<u32> {
    let (first, last) = text.split_once('-')?;
    let (first, last) = (parse_count(first)?, parse_count(last)?);
    (group_of_count(first) == first && group_last(first) == last).then_some(first)
}

/// The data layout's set of `pool`'s entries that have `count` endpoints:
/// `endpoint-count-3`, `nodeport-count-3`, `local-endpoint-count-3`,
/// `local-nodeport-count-3`.
pub fn count_set(pool: Pool, count: u32) -> &'static str {
    let local = if pool.local { "local-" } else { "" };
    let kind = if pool.node_port {
        "nodeport-count"
    } else {
        "endpoint-count"
    };
    intern(format!("{local}{kind}-{count}"))
}

/// The data layout's chain of the draws of one endpoint list and protocol
/// (one rule per endpoint count in use): `endpoints-by-count-tcp`, or
/// `local-endpoints-by-count-tcp`.
pub fn class_chain(local: bool, protocol: kp_model::Protocol) -> &'static str {
    CLASS_CHAINS[usize::from(local)][protocol_index(protocol)]
}

/// Every slot map and class chain of the data layout.
pub fn data_layout_fixed_names() -> impl Iterator<Item = &'static str> {
    SLOT_MAPS
        .iter()
        .flatten()
        .chain(CLASS_CHAINS.iter().flatten())
        .copied()
}

/// `name`, kept for the life of the process: the count sets' and group
/// sets' names depend on the endpoint counts Services have had (a few
/// dozen, each name under 40 bytes), and the record keeps set names as
/// `&'static str`.
fn intern(name: String) -> &'static str {
    static NAMES: std::sync::LazyLock<std::sync::Mutex<std::collections::BTreeSet<&'static str>>> =
        std::sync::LazyLock::new(Default::default);
    // A panic while the set was held cannot leave it half-changed.
    let mut names = NAMES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(known) = names.get(name.as_str()) {
        return known;
    }
    let leaked: &'static str = Box::leak(name.into_boxed_str());
    names.insert(leaked);
    leaked
}

/// Every fixed chain, set and map name of the table (the per-service
/// ones hold a `/`).
pub const FIXED_NAMES: &[&str] = &[
    FILTER_PREROUTING_PRE_DNAT,
    FILTER_OUTPUT_PRE_DNAT,
    FILTER_FORWARD,
    FILTER_INPUT,
    FILTER_OUTPUT,
    NAT_OUTPUT,
    NAT_POSTROUTING,
    NAT_PREROUTING,
    SERVICES,
    CLUSTER_IPS_CHECK,
    FIREWALL_CHECK,
    SERVICE_ENDPOINTS_CHECK,
    NODEPORT_ENDPOINTS_CHECK,
    REJECT_CHAIN,
    MARK_FOR_MASQUERADE,
    MASQUERADING,
    CLUSTER_IPS,
    NODEPORT_IPS,
    SERVICE_IPS,
    SERVICE_NODEPORTS,
    NO_ENDPOINT_SERVICES,
    NO_ENDPOINT_NODEPORTS,
    FIREWALL_IPS,
    HAIRPIN_ENDPOINTS,
];

/// Comment of the rule of `cluster-ips-check`.
pub const COMMENT_INVALID_CLUSTER_IP_PORTS: &str = "Reject traffic to invalid ports of ClusterIPs";
/// Comment of an `external-…` rule that sends pods to the cluster policy.
pub const COMMENT_SHORT_CIRCUIT_PODS: &str = "short-circuit pod traffic";
/// Comment of an `external-…` rule that marks the host's own traffic.
pub const COMMENT_MASQUERADE_LOCAL: &str = "masquerade local traffic";
/// Comment of an `external-…` rule that sends the host's own traffic to
/// the cluster policy.
pub const COMMENT_SHORT_CIRCUIT_LOCAL: &str = "short-circuit local traffic";
/// Every comment a rule of the table carries.
pub const RULE_COMMENTS: &[&str] = &[
    COMMENT_INVALID_CLUSTER_IP_PORTS,
    COMMENT_SHORT_CIRCUIT_PODS,
    COMMENT_MASQUERADE_LOCAL,
    COMMENT_SHORT_CIRCUIT_LOCAL,
];

/// Longest object name nf_tables accepts (`NFT_NAME_MAXLEN` − 1).
pub const NAME_LENGTH_MAX: usize = 255;
/// Longest name part after the prefix (upstream `chainNameBaseLengthMax`).
const NAME_BASE_LENGTH_MAX: usize = NAME_LENGTH_MAX - 16;

/// The names of one service port's chains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceChains {
    /// `service-…`: cluster traffic policy.
    pub cluster: Arc<str>,
    /// `local-…`: local traffic policy.
    pub local: Arc<str>,
    /// `external-…`: external destinations.
    pub external: Arc<str>,
    /// `firewall-…`: `loadBalancerSourceRanges`.
    pub firewall: Arc<str>,
}

/// The names of one endpoint's chain and affinity set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointNames {
    /// `endpoint-…`.
    pub chain: Arc<str>,
    /// `affinity-…`.
    pub affinity_set: Arc<str>,
}

/// `HASH-ns/svc/proto/port` of a service port (upstream
/// `servicePortChainNameBase`).
pub fn service_port_base(port: &ServicePortName) -> String {
    let mut name = String::with_capacity(64);
    write_port_name(&mut name, port);
    hash_and_truncate(&name)
}

/// `HASH-ns/svc/proto/port__ip/port` of an endpoint (upstream
/// `servicePortEndpointChainNameBase`).
pub fn endpoint_base(port: &ServicePortName, endpoint: SocketAddr) -> String {
    let mut name = String::with_capacity(80);
    write_port_name(&mut name, port);
    let ip = match endpoint.ip() {
        IpAddr::V4(ip) => ip.to_string(),
        IpAddr::V6(ip) => ip.to_string().replace(':', "."),
    };
    // Writing into a String cannot fail.
    let _ = write!(name, "__{ip}/{}", endpoint.port());
    hash_and_truncate(&name)
}

/// Whether `name` is one of the per-service chains (they, unlike the fixed
/// chains, hold a `/`).
pub fn is_service_chain_name(name: &str) -> bool {
    name.contains('/')
}

/// The Service a per-service chain or set name belongs to: the inverse of
/// [`service_chains`] and [`endpoint_names`] (`PREFIX-HASH-ns/svc/…`).
/// `None` for the fixed objects and anonymous sets. Valid Kubernetes names
/// are never cut (a namespace and a Service name hold at most 63
/// characters each), so the name always holds the whole namespace and
/// Service name.
pub fn service_of_name(name: &str) -> Option<kp_model::NamespacedName> {
    let (prefix, rest) = name.split_once('-')?;
    if !matches!(
        prefix,
        "service" | "local" | "external" | "firewall" | "endpoint" | "affinity"
    ) {
        return None;
    }
    let (hash, base) = rest.split_once('-')?;
    if hash.len() != 8 {
        return None;
    }
    let mut parts = base.split('/');
    let (namespace, service) = (parts.next()?, parts.next()?);
    parts.next()?;
    Some(kp_model::NamespacedName::new(namespace, service))
}

/// The object `command` writes, for an error message, naming its Service
/// where the object belongs to one: `rule in chain C (Service ns/svc)`,
/// `elements of S`, `chain C`, `set S`, `map M`, `table ip kube-proxy`.
pub fn describe_command(command: &Command, family: kp_model::IpFamily) -> String {
    let name = |name: &Name| crate::applier::abbreviated(name.as_str()).into_owned();
    let set_kind = |map: bool| if map { "map" } else { "set" };
    let object = match command {
        Command::AddTable { .. } | Command::DeleteTable => {
            return format!("table {} {TABLE}", crate::options::family_keyword(family))
        }
        Command::AddChain { name: chain, .. }
        | Command::FlushChain(chain)
        | Command::DeleteChain(chain) => format!("chain {}", name(chain)),
        Command::AddSet(spec) => format!("{} {}", set_kind(spec.map), name(&spec.name)),
        Command::AddTypeofSet(spec) => {
            format!("{} {}", set_kind(!spec.data.is_empty()), name(&spec.name))
        }
        Command::FlushSet { name: set, map } | Command::DeleteSet { name: set, map } => {
            format!("{} {}", set_kind(*map), name(set))
        }
        Command::AddElements { set, .. }
        | Command::DeleteElements { set, .. }
        | Command::AddMapElements { map: set, .. } => format!("elements of {}", name(set)),
        Command::AddRule(rule) => format!("rule in chain {}", name(&rule.chain)),
    };
    match service_of_command(command) {
        Some(service) => format!("{object} (Service {service})"),
        None => object,
    }
}

/// The Service `command` belongs to, from the names it holds: the chain or
/// set it writes, a chain or set its rule or element names, or the
/// `ns/svc:port` comment of an element. `None` for the fixed objects and
/// for elements that name none (those of `cluster-ips`, found by address).
pub fn service_of_command(command: &Command) -> Option<kp_model::NamespacedName> {
    let of = |name: &Name| service_of_name(name.as_str());
    let of_verdict = |verdict: &Verdict| match verdict {
        Verdict::Jump(chain) | Verdict::Goto(chain) => of(chain),
        Verdict::Accept | Verdict::Drop | Verdict::Return => None,
    };
    match command {
        Command::AddTable { .. } | Command::DeleteTable => None,
        Command::AddChain { name, .. } | Command::FlushChain(name) | Command::DeleteChain(name) => {
            of(name)
        }
        Command::AddSet(spec) => of(&spec.name),
        Command::FlushSet { name, .. } | Command::DeleteSet { name, .. } => of(name),
        Command::DeleteElements { set, .. } => of(set),
        Command::AddTypeofSet(spec) => of(&spec.name),
        Command::AddMapElements { map, elements } => of(map).or_else(|| {
            elements
                .iter()
                .find_map(|element| element.comment.as_deref().and_then(service_of_comment))
        }),
        Command::AddElements { set, elements } => of(set)
            .or_else(|| {
                elements
                    .iter()
                    .find_map(|element| element.verdict.as_ref().and_then(of_verdict))
            })
            .or_else(|| {
                elements
                    .iter()
                    .find_map(|element| element.comment.as_deref().and_then(service_of_comment))
            }),
        Command::AddRule(rule) => of(&rule.chain).or_else(|| {
            rule.exprs.iter().find_map(|expr| match expr {
                Expr::AddrInSet { set, .. } | Expr::UpdateSourceSet(set) => of(set),
                Expr::DispatchVmap { map, .. } => of(map),
                Expr::Verdict(verdict) => of_verdict(verdict),
                _ => None,
            })
        }),
    }
}

/// The Service of an element's `ns/svc:port` comment.
fn service_of_comment(comment: &str) -> Option<kp_model::NamespacedName> {
    let (service, _port) = comment.rsplit_once(':').unwrap_or((comment, ""));
    let (namespace, name) = service.split_once('/')?;
    Some(kp_model::NamespacedName::new(namespace, name))
}

/// The chain names of service port `port`.
pub fn service_chains(port: &ServicePortName) -> ServiceChains {
    let base = service_port_base(port);
    ServiceChains {
        cluster: Arc::from(format!("service-{base}")),
        local: Arc::from(format!("local-{base}")),
        external: Arc::from(format!("external-{base}")),
        firewall: Arc::from(format!("firewall-{base}")),
    }
}

/// The chain and affinity set names of `endpoint` of `port`.
pub fn endpoint_names(port: &ServicePortName, endpoint: SocketAddr) -> EndpointNames {
    let base = endpoint_base(port, endpoint);
    EndpointNames {
        chain: Arc::from(format!("endpoint-{base}")),
        affinity_set: Arc::from(format!("affinity-{base}")),
    }
}

/// `ns/svc/proto/port`, every character outside the ones nft names may hold
/// (`[A-Za-z0-9_./-]`) replaced by `_`: valid Kubernetes names never hold
/// one, and a name from a hand-written manifest must not end the name in
/// the nft script.
fn write_port_name(out: &mut String, port: &ServicePortName) {
    let parts = [
        &*port.service.namespace,
        &*port.service.name,
        port.protocol.as_rule_str(),
        &*port.port,
    ];
    for (i, part) in parts.into_iter().enumerate() {
        if i > 0 {
            out.push('/');
        }
        out.extend(part.chars().map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_') {
                c
            } else {
                '_'
            }
        }));
    }
}

fn hash_and_truncate(name: &str) -> String {
    let hash = Sha256::digest(name.as_bytes());
    let encoded = data_encoding::BASE32.encode(&hash);
    let mut out = String::with_capacity(9 + name.len());
    out.push_str(&encoded[..8]);
    out.push('-');
    out.push_str(name);
    if out.len() > NAME_BASE_LENGTH_MAX {
        // Only ASCII is written above, so any index is a char boundary.
        out.truncate(NAME_BASE_LENGTH_MAX - 3);
        out.push_str("...");
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use kp_model::{NamespacedName, Protocol};

    fn port(ns: &str, name: &str, port: &str) -> ServicePortName {
        ServicePortName::new(NamespacedName::new(ns, name), port, Protocol::Tcp)
    }

    #[test]
    fn names_match_upstream() {
        // Names from upstream's nftables proxier tests.
        let p = port("ns1", "svc1", "p80");
        assert_eq!(service_port_base(&p), "ULMVA6XW-ns1/svc1/tcp/p80");
        assert_eq!(
            endpoint_base(&p, "10.180.0.1:80".parse().unwrap()),
            "5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
        );
        assert_eq!(
            service_port_base(&port("ns2", "svc2", "p80")),
            "42NFTM6N-ns2/svc2/tcp/p80"
        );
    }

    #[test]
    fn ipv6_colons_become_dots_and_odd_characters_underscores() {
        let p = port("ns1", "we b\"", "");
        let base = endpoint_base(&p, "[fd00::1]:80".parse().unwrap());
        assert!(base.ends_with("-ns1/we_b_/tcp/__fd00..1/80"), "{base}");
    }

    #[test]
    fn the_service_is_read_back_from_its_object_names() {
        let p = port("ns-1", "web-app", "http");
        let chains = service_chains(&p);
        let endpoint = endpoint_names(&p, "[fd00::1]:80".parse().unwrap());
        let expected = NamespacedName::new("ns-1", "web-app");
        for name in [
            &chains.cluster,
            &chains.local,
            &chains.external,
            &chains.firewall,
            &endpoint.chain,
            &endpoint.affinity_set,
        ] {
            assert_eq!(service_of_name(name), Some(expected.clone()), "{name}");
        }
        for fixed in [
            SERVICES,
            FIREWALL_CHECK,
            SERVICE_IPS,
            MARK_FOR_MASQUERADE,
            "__set1x2",
        ] {
            assert_eq!(service_of_name(fixed), None, "{fixed}");
        }
    }

    #[test]
    fn a_command_names_its_service_by_chain_verdict_or_comment() {
        use crate::model::{AddrField, Address, Key, Rule, SetElement};
        use kp_model::IpFamily;
        let p = port("ns1", "lb", "http");
        let fw = service_chains(&p).firewall;
        let rule = Command::AddRule(Rule::new(
            &fw,
            vec![
                Expr::AddrNotIn {
                    field: AddrField::Source,
                    values: vec![
                        Address::Prefix("10.0.0.0/8".parse().unwrap()),
                        Address::Prefix("10.1.0.0/16".parse().unwrap()),
                    ],
                },
                Expr::Verdict(Verdict::Drop),
            ],
        ));
        let lb = Some(NamespacedName::new("ns1", "lb"));
        assert_eq!(service_of_command(&rule), lb);
        assert_eq!(
            describe_command(&rule, IpFamily::V4),
            format!("rule in chain {fw} (Service ns1/lb)")
        );
        let key = Key::AddrProtoPort("10.96.0.1".parse().unwrap(), Protocol::Tcp, 80);
        let element = |comment: Option<&str>, verdict: Verdict| Command::AddElements {
            set: Name::Fixed(SERVICE_IPS),
            elements: vec![SetElement {
                key,
                comment: comment.map(Arc::from),
                verdict: Some(verdict),
            }],
        };
        let dispatch = element(None, Verdict::Goto(Name::from(&service_chains(&p).cluster)));
        assert_eq!(service_of_command(&dispatch), lb);
        let refusal = element(
            Some("ns1/lb:http"),
            Verdict::Goto(Name::Fixed(REJECT_CHAIN)),
        );
        assert_eq!(service_of_command(&refusal), lb);
        let services = Command::AddChain {
            name: Name::Fixed(SERVICES),
            kind: crate::model::ChainKind::Regular,
        };
        assert_eq!(service_of_command(&services), None);
        assert_eq!(
            describe_command(&Command::AddTable { comment: None }, IpFamily::V4),
            "table ip kube-proxy"
        );
    }

    #[test]
    fn counts_fall_in_groups_of_eight() {
        let firsts: Vec<u32> = [1, 2, 8, 9, 16, 17, 1000]
            .into_iter()
            .map(group_of_count)
            .collect();
        assert_eq!(firsts, [1, 1, 1, 9, 9, 17, 993]);
    }

    #[test]
    fn group_names_read_back_to_their_pool_and_group() {
        let cluster = Pool::ALL[0];
        let local_node_port = Pool::ALL[3];
        assert_eq!(group_set(cluster, 1), "endpoint-group-1-8");
        assert_eq!(group_set(local_node_port, 9), "local-nodeport-group-9-16");
        assert_eq!(
            group_chain(false, Protocol::Tcp, 9),
            "endpoints-by-count-tcp-9-16"
        );
        assert_eq!(
            group_chain(true, Protocol::Sctp, 993),
            "local-endpoints-by-count-sctp-993-1000"
        );
        for pool in Pool::ALL {
            for first in [1, 9, 993] {
                assert_eq!(group_of_set(group_set(pool, first)), Some((pool, first)));
                assert!(is_slot_map_or_count_set(group_set(pool, first)));
                assert_eq!(count_of_set(group_set(pool, first)), None);
                assert_eq!(group_of_set(count_set(pool, first)), None);
            }
        }
        for local in [false, true] {
            for protocol in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
                let chain = group_chain(local, protocol, 17);
                assert_eq!(group_of_chain(chain), Some((local, protocol, 17)));
            }
            assert_eq!(group_of_chain(class_chain(local, Protocol::Tcp)), None);
        }
        // Only the names the layout writes: a group starts after a
        // multiple of eight and holds eight counts.
        for name in [
            "endpoint-group-2-9",
            "endpoint-group-1-9",
            "endpoint-group-01-8",
            "endpoint-group-0-7",
            "endpoint-group-1",
            "service-group-1-8",
            "endpoints-by-count-tcp-9-17",
        ] {
            assert_eq!(group_of_set(name), None, "{name}");
            assert_eq!(group_of_chain(name), None, "{name}");
        }
        assert_eq!(
            count_of_set("local-nodeport-count-12"),
            Some((local_node_port, 12))
        );
        assert_eq!(count_of_set("endpoint-count-0"), None);
    }

    #[test]
    fn long_names_are_cut() {
        let long = "a".repeat(200);
        let base = endpoint_base(&port(&long, &long, &long), "10.0.0.1:80".parse().unwrap());
        assert_eq!(base.len(), NAME_BASE_LENGTH_MAX);
        assert!(base.ends_with("..."));
    }
}
