//! The kernel objects of the IPVS mode as values: virtual servers with
//! their real servers, the addresses of `kube-ipvs0`, and ipset members.
//! The planner produces a [`KernelState`]; the kernel (or its fake) lists
//! one; [`crate::diff`](mod@crate::diff) turns the difference into operations.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use kp_model::{IpFamily, Protocol};

/// The dummy link holding every service address.
pub const DUMMY_LINK: &str = "kube-ipvs0";
/// `IP_VS_SVC_F_PERSISTENT`: session affinity (`ipvsadm -p`).
pub const FLAG_PERSISTENT: u32 = 0x1;
/// `IP_VS_SVC_F_HASHED`: set by the kernel on every listed service; never
/// compared.
pub const FLAG_HASHED: u32 = 0x2;
/// `IP_VS_SVC_F_SCHED2`: `mh-port`/`sh-port`, hash the source port too
/// (upstream sets it for `mh`).
pub const FLAG_SOURCE_HASH: u32 = 0x10;

/// Identifies a virtual server: `ipvsadm -t ADDRESS:PORT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    /// The virtual address.
    pub address: IpAddr,
    /// TCP, UDP or SCTP.
    pub protocol: Protocol,
    /// The virtual port.
    pub port: u16,
}

/// The settings of a virtual server.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VirtualServer {
    /// Scheduler name (`rr`, `wrr`, `lc`, `sh`, `mh`, …).
    pub scheduler: String,
    /// `IP_VS_SVC_F_*` flags, without [`FLAG_HASHED`].
    pub flags: u32,
    /// Persistence timeout in seconds (with [`FLAG_PERSISTENT`]), else 0.
    pub timeout_secs: u32,
}

/// A virtual server and its real servers (address:port → weight).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceState {
    /// The settings.
    pub server: VirtualServer,
    /// Real servers with their weights; weight 0 means draining.
    pub reals: BTreeMap<SocketAddr, u32>,
}

/// One of the ipsets upstream's IPVS mode uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetKind {
    /// `KUBE-LOOP-BACK` (hash:ip,port,ip): local endpoints, for hairpin SNAT.
    LoopBack,
    /// `KUBE-CLUSTER-IP` (hash:ip,port).
    ClusterIp,
    /// `KUBE-EXTERNAL-IP` (hash:ip,port).
    ExternalIp,
    /// `KUBE-EXTERNAL-IP-LOCAL` (hash:ip,port): externalTrafficPolicy Local.
    ExternalIpLocal,
    /// `KUBE-LOAD-BALANCER` (hash:ip,port).
    LoadBalancer,
    /// `KUBE-LOAD-BALANCER-FW` (hash:ip,port): with source ranges.
    LoadBalancerFw,
    /// `KUBE-LOAD-BALANCER-LOCAL` (hash:ip,port).
    LoadBalancerLocal,
    /// `KUBE-LOAD-BALANCER-SOURCE-IP` (hash:ip,port,ip).
    LoadBalancerSourceIp,
    /// `KUBE-LOAD-BALANCER-SOURCE-CIDR` (hash:ip,port,net).
    LoadBalancerSourceCidr,
    /// `KUBE-NODE-PORT-TCP` (bitmap:port).
    NodePortTcp,
    /// `KUBE-NODE-PORT-LOCAL-TCP` (bitmap:port).
    NodePortLocalTcp,
    /// `KUBE-NODE-PORT-UDP` (bitmap:port).
    NodePortUdp,
    /// `KUBE-NODE-PORT-LOCAL-UDP` (bitmap:port).
    NodePortLocalUdp,
    /// `KUBE-NODE-PORT-SCTP-HASH` (hash:ip,port).
    NodePortSctp,
    /// `KUBE-NODE-PORT-LOCAL-SCTP-HASH` (hash:ip,port).
    NodePortLocalSctp,
    /// `KUBE-HEALTH-CHECK-NODE-PORT` (bitmap:port).
    HealthCheckNodePort,
    /// `KUBE-IPVS-IPS` (hash:ip): every address on kube-ipvs0.
    IpvsIps,
}

/// The kernel type of an ipset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SetType {
    /// `hash:ip`
    HashIp,
    /// `hash:ip,port`
    HashIpPort,
    /// `hash:ip,port,ip`
    HashIpPortIp,
    /// `hash:ip,port,net`
    HashIpPortNet,
    /// `bitmap:port` over 0-65535
    BitmapPort,
}

/// One member of an ipset, as `ipset add` spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetEntry {
    /// `10.96.0.1`
    Ip(IpAddr),
    /// `10.96.0.1,tcp:80`
    IpPort(IpAddr, Protocol, u16),
    /// `10.244.1.2,tcp:8080,10.244.1.2`
    IpPortIp(IpAddr, Protocol, u16, IpAddr),
    /// `203.0.113.5,tcp:80,192.168.99.0/24`
    IpPortNet(IpAddr, Protocol, u16, IpNet),
    /// `30080`
    Port(u16),
}

/// The whole state of the IPVS mode for one family.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelState {
    /// kube-ipvs0 exists.
    pub link: bool,
    /// Addresses on kube-ipvs0.
    pub addresses: BTreeSet<IpAddr>,
    /// Virtual servers.
    pub services: BTreeMap<ServiceKey, ServiceState>,
    /// Members of each set (every set of [`SetKind::ALL`] is present, maybe
    /// empty).
    pub sets: BTreeMap<SetKind, BTreeSet<SetEntry>>,
}

impl SetKind {
    /// Every set, in upstream's order.
    pub const ALL: [SetKind; 17] = [
        SetKind::LoopBack,
        SetKind::ClusterIp,
        SetKind::ExternalIp,
        SetKind::ExternalIpLocal,
        SetKind::LoadBalancer,
        SetKind::LoadBalancerFw,
        SetKind::LoadBalancerLocal,
        SetKind::LoadBalancerSourceIp,
        SetKind::LoadBalancerSourceCidr,
        SetKind::NodePortTcp,
        SetKind::NodePortLocalTcp,
        SetKind::NodePortUdp,
        SetKind::NodePortLocalUdp,
        SetKind::NodePortSctp,
        SetKind::NodePortLocalSctp,
        SetKind::HealthCheckNodePort,
        SetKind::IpvsIps,
    ];

    /// The set's name for `family`: IPv6 sets say `KUBE-6-` instead of
    /// `KUBE-` (upstream, so both families' sets can coexist; all fit the
    /// 31-character limit).
    pub fn name(self, family: IpFamily) -> &'static str {
        let (v4, v6) = match self {
            SetKind::LoopBack => ("KUBE-LOOP-BACK", "KUBE-6-LOOP-BACK"),
            SetKind::ClusterIp => ("KUBE-CLUSTER-IP", "KUBE-6-CLUSTER-IP"),
            SetKind::ExternalIp => ("KUBE-EXTERNAL-IP", "KUBE-6-EXTERNAL-IP"),
            SetKind::ExternalIpLocal => ("KUBE-EXTERNAL-IP-LOCAL", "KUBE-6-EXTERNAL-IP-LOCAL"),
            SetKind::LoadBalancer => ("KUBE-LOAD-BALANCER", "KUBE-6-LOAD-BALANCER"),
            SetKind::LoadBalancerFw => ("KUBE-LOAD-BALANCER-FW", "KUBE-6-LOAD-BALANCER-FW"),
            SetKind::LoadBalancerLocal => {
                ("KUBE-LOAD-BALANCER-LOCAL", "KUBE-6-LOAD-BALANCER-LOCAL")
            }
            SetKind::LoadBalancerSourceIp => (
                "KUBE-LOAD-BALANCER-SOURCE-IP",
                "KUBE-6-LOAD-BALANCER-SOURCE-IP",
            ),
            SetKind::LoadBalancerSourceCidr => (
                "KUBE-LOAD-BALANCER-SOURCE-CIDR",
                "KUBE-6-LOAD-BALANCER-SOURCE-CID",
            ),
            SetKind::NodePortTcp => ("KUBE-NODE-PORT-TCP", "KUBE-6-NODE-PORT-TCP"),
            SetKind::NodePortLocalTcp => ("KUBE-NODE-PORT-LOCAL-TCP", "KUBE-6-NODE-PORT-LOCAL-TCP"),
            SetKind::NodePortUdp => ("KUBE-NODE-PORT-UDP", "KUBE-6-NODE-PORT-UDP"),
            SetKind::NodePortLocalUdp => ("KUBE-NODE-PORT-LOCAL-UDP", "KUBE-6-NODE-PORT-LOCAL-UDP"),
            SetKind::NodePortSctp => ("KUBE-NODE-PORT-SCTP-HASH", "KUBE-6-NODE-PORT-SCTP-HASH"),
            SetKind::NodePortLocalSctp => (
                "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
                "KUBE-6-NODE-PORT-LOCAL-SCTP-HAS",
            ),
            SetKind::HealthCheckNodePort => (
                "KUBE-HEALTH-CHECK-NODE-PORT",
                "KUBE-6-HEALTH-CHECK-NODE-PORT",
            ),
            SetKind::IpvsIps => ("KUBE-IPVS-IPS", "KUBE-6-IPVS-IPS"),
        };
        match family {
            IpFamily::V4 => v4,
            IpFamily::V6 => v6,
        }
    }

    /// The set with this name, of either family.
    pub fn from_name(name: &str) -> Option<(SetKind, IpFamily)> {
        SetKind::ALL.iter().find_map(|kind| {
            [IpFamily::V4, IpFamily::V6]
                .into_iter()
                .find(|family| kind.name(*family) == name)
                .map(|family| (*kind, family))
        })
    }

    /// The kernel type.
    pub fn set_type(self) -> SetType {
        match self {
            SetKind::LoopBack | SetKind::LoadBalancerSourceIp => SetType::HashIpPortIp,
            SetKind::LoadBalancerSourceCidr => SetType::HashIpPortNet,
            SetKind::NodePortTcp
            | SetKind::NodePortLocalTcp
            | SetKind::NodePortUdp
            | SetKind::NodePortLocalUdp
            | SetKind::HealthCheckNodePort => SetType::BitmapPort,
            SetKind::IpvsIps => SetType::HashIp,
            _ => SetType::HashIpPort,
        }
    }

    /// Upstream's comment for the set (used in iptables rule comments).
    pub fn comment(self) -> &'static str {
        match self {
            SetKind::LoopBack => {
                "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"
            }
            SetKind::ClusterIp => "Kubernetes service cluster ip + port for masquerade purpose",
            SetKind::ExternalIp => {
                "Kubernetes service external ip + port for masquerade and filter purpose"
            }
            SetKind::ExternalIpLocal => {
                "Kubernetes service external ip + port with externalTrafficPolicy=local"
            }
            SetKind::LoadBalancer => "Kubernetes service lb portal",
            SetKind::LoadBalancerFw => {
                "Kubernetes service load balancer ip + port for load balancer with sourceRange"
            }
            SetKind::LoadBalancerLocal => {
                "Kubernetes service load balancer ip + port with externalTrafficPolicy=local"
            }
            SetKind::LoadBalancerSourceIp => {
                "Kubernetes service load balancer ip + port + source IP for packet filter purpose"
            }
            SetKind::LoadBalancerSourceCidr => {
                "Kubernetes service load balancer ip + port + source cidr for packet filter purpose"
            }
            SetKind::NodePortTcp => "Kubernetes nodeport TCP port for masquerade purpose",
            SetKind::NodePortLocalTcp => {
                "Kubernetes nodeport TCP port with externalTrafficPolicy=local"
            }
            SetKind::NodePortUdp => "Kubernetes nodeport UDP port for masquerade purpose",
            SetKind::NodePortLocalUdp => {
                "Kubernetes nodeport UDP port with externalTrafficPolicy=local"
            }
            SetKind::NodePortSctp => {
                "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'"
            }
            SetKind::NodePortLocalSctp => "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'",
            SetKind::HealthCheckNodePort => "Kubernetes health check node port",
            SetKind::IpvsIps => "Addresses on the ipvs interface",
        }
    }
}

impl SetType {
    /// The ipset type name.
    pub fn as_str(self) -> &'static str {
        match self {
            SetType::HashIp => "hash:ip",
            SetType::HashIpPort => "hash:ip,port",
            SetType::HashIpPortIp => "hash:ip,port,ip",
            SetType::HashIpPortNet => "hash:ip,port,net",
            SetType::BitmapPort => "bitmap:port",
        }
    }
}

impl KernelState {
    /// A state with kube-ipvs0 and every set present and empty.
    pub fn empty() -> Self {
        Self {
            link: true,
            sets: SetKind::ALL
                .iter()
                .map(|kind| (*kind, BTreeSet::new()))
                .collect(),
            ..Self::default()
        }
    }

    /// Adds `entry` to the set `kind`.
    pub fn add_entry(&mut self, kind: SetKind, entry: SetEntry) {
        self.sets.entry(kind).or_default().insert(entry);
    }

    /// The members of `kind` (empty when the set is absent).
    pub fn entries(&self, kind: SetKind) -> impl Iterator<Item = &SetEntry> {
        self.sets.get(&kind).into_iter().flatten()
    }

    /// Whether `kind` has members.
    pub fn has_entries(&self, kind: SetKind) -> bool {
        self.sets.get(&kind).is_some_and(|set| !set.is_empty())
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefix = match self.protocol {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        };
        write!(f, "{prefix}  {}", SocketAddr::new(self.address, self.port))
    }
}

impl fmt::Display for SetEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetEntry::Ip(ip) => write!(f, "{ip}"),
            SetEntry::IpPort(ip, protocol, port) => {
                write!(f, "{ip},{}:{port}", protocol.as_rule_str())
            }
            SetEntry::IpPortIp(ip, protocol, port, ip2) => {
                write!(f, "{ip},{}:{port},{ip2}", protocol.as_rule_str())
            }
            SetEntry::IpPortNet(ip, protocol, port, net) => {
                write!(f, "{ip},{}:{port},{net}", protocol.as_rule_str())
            }
            SetEntry::Port(port) => write!(f, "{port}"),
        }
    }
}
