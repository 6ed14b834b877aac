//! Every document the manifest source accepts renders rules the kernel
//! accepts. Batches of Services with their EndpointSlices are generated
//! near the API's limits (names of 63 characters, many ports, many source
//! ranges, both families, port names that are odd but valid, TCP, UDP and
//! SCTP, node ports and ports at the ends of their ranges, external and
//! LoadBalancer IPs, session affinity timeouts at their bounds, endpoints
//! ready, serving and terminating, topology hints) and by mutation of the
//! Services generated before them. Each batch is loaded by the binary
//! (`--manifests`) in a fresh node namespace, for iptables (legacy and nft
//! flavors), nftables (each table layout: a batch loads in about a second,
//! so the data layout takes every batch too) and userspace (its portal
//! rules and relay; the IPVS mode needs the VM, where
//! `vm_random_clusters_…` covers it); the
//! documents the source rejects (named in its
//! `invalid manifest` lines) are left aside, and for the rest the proxy's
//! syncs must succeed (a sync timestamp for both families, no sync or
//! restore failure counted, no refused Service) and `kube-proxy check`
//! with the same flags must exit 0.
//!
//! `KP_FUZZ_KERNEL_CASES` sets how many batches each mode loads (default
//! 6, about 50 documents each); `KP_FUZZ_KERNEL_SEED` the first batch's
//! seed (default 1). A failure names the seed, so
//! `KP_FUZZ_KERNEL_SEED=N KP_FUZZ_KERNEL_CASES=1` repeats it, and prints
//! the documents of the Services the proxy's log names.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs::{self, File};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use kp_testkit::clusters::Rng;
use kp_testkit::netns::{require_root, wait_until, Netns, NsChild};

const BIN: &str = env!("CARGO_BIN_EXE_kube-proxy");
/// Services in one batch.
const SERVICES: u64 = 20;
/// How long the proxy may take to report its first sync of both families.
const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Family {
    V4,
    V6,
}

impl Family {
    fn name(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }
}

#[derive(Clone, Debug)]
struct Port {
    name: String,
    port: u16,
    /// The endpoints' port; a named target port when `target_by_name`.
    target: u16,
    target_by_name: bool,
    protocol: &'static str,
    node_port: Option<u16>,
}

#[derive(Clone, Debug)]
struct Endpoint {
    host: u16,
    /// 1: this node's pod network, 2: another node's.
    subnet: u8,
    ready: bool,
    serving: bool,
    terminating: bool,
    node: Option<&'static str>,
    zone: Option<&'static str>,
    hint_zones: Vec<&'static str>,
    hint_nodes: Vec<&'static str>,
}

/// One Service with its EndpointSlices, written as one file.
#[derive(Clone, Debug)]
struct Svc {
    namespace: String,
    name: String,
    kind: &'static str,
    families: Vec<Family>,
    ports: Vec<Port>,
    external_ips: Vec<String>,
    lb_ips: Vec<String>,
    source_ranges: Vec<String>,
    affinity: Option<u32>,
    etp_local: bool,
    itp_local: bool,
    prefer_close: bool,
    health_check_node_port: Option<u16>,
    /// Endpoints of each slice, one slice per family (and a second slice
    /// of the first family now and then).
    slices: Vec<(Family, Vec<Endpoint>)>,
}

const KINDS: [&str; 4] = ["ClusterIP", "ClusterIP", "NodePort", "LoadBalancer"];
/// Services the proxy programs nothing for: `Headless` is a ClusterIP
/// Service with `clusterIP: None`.
const UNPROGRAMMED_KINDS: [&str; 2] = ["Headless", "ExternalName"];

/// Whether Services of `kind` have node ports.
fn has_node_ports(kind: &str) -> bool {
    matches!(kind, "NodePort" | "LoadBalancer")
}

/// Clears what a Service of an unprogrammed kind may not have.
fn strip_unprogrammed(svc: &mut Svc) {
    if UNPROGRAMMED_KINDS.contains(&svc.kind) {
        svc.external_ips.clear();
        svc.lb_ips.clear();
        svc.source_ranges.clear();
        svc.etp_local = false;
        svc.health_check_node_port = None;
    }
    if svc.kind == "ExternalName" {
        svc.affinity = None;
        svc.itp_local = false;
        svc.prefer_close = false;
        svc.slices.clear();
    }
}
const PROTOCOLS: [&str; 4] = ["TCP", "TCP", "UDP", "SCTP"];
const ZONES: [&str; 2] = ["zone-a", "zone-b"];
const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];
/// Session affinity timeouts: the bounds (1 and 86400 s) and between.
const TIMEOUTS: [u32; 5] = [1, 2, 10800, 86399, 86400];
/// Port numbers at the ends of their range and in between.
const PORT_NUMBERS: [u16; 8] = [1, 2, 53, 80, 443, 8080, 65534, 65535];

/// A DNS-1123 label of exactly `len` characters (1..=63) starting with `first`.
fn label(rng: &mut Rng, first: char, len: usize) -> String {
    let mut out = String::from(first);
    while out.len() < len {
        let last = out.ends_with('-');
        let c = if !last && out.len() + 1 < len && rng.chance(15) {
            '-'
        } else {
            rng.pick(&[
                'a', 'b', 'k', 'z', '0', '9', 'x', 'q', 'm', 'n', 'e', 'o', 'p', 's',
            ])
        };
        out.push(c);
    }
    out
}

/// A Service name (DNS-1035 label): short, or up to the 63-character limit.
fn service_name(rng: &mut Rng, n: u64) -> String {
    let base = format!("s{n}");
    if rng.chance(25) {
        let len = rng.pick(&[62usize, 63]);
        let tail = label(rng, 'x', len - base.len() - 1);
        format!("{base}-{tail}")
    } else {
        base
    }
}

/// A port name that is odd but valid (a DNS-1123 label), unique by `i`.
fn port_name(rng: &mut Rng, i: usize) -> String {
    match rng.below(6) {
        0 => format!("{i}"),
        1 => format!("p{i}"),
        2 => format!("a--{i}"),
        3 => {
            let len = rng.pick(&[15usize, 16, 63]);
            let prefix = format!("{i}-");
            let rest = label(rng, 'l', len - prefix.len());
            format!("{prefix}{rest}")
        }
        4 => format!("{i}x"),
        _ => format!("http-{i}"),
    }
}

/// Allocates the batch's node ports (the ends of the range now and then)
/// and its external and LoadBalancer IPs, each once: two Services sharing
/// an address and port leave which one answers to rule order, which is
/// not what this test is about.
struct NodePorts(BTreeSet<u16>, BTreeSet<String>);

impl NodePorts {
    /// Whether `count` more node ports fit, with room to spare.
    fn room(&self, count: usize) -> bool {
        self.0.len() + count < 2000
    }

    fn take(&mut self, rng: &mut Rng) -> u16 {
        loop {
            let port = if rng.chance(10) {
                rng.pick(&[30000, 32767])
            } else {
                30000 + rng.below(2768) as u16
            };
            if self.0.insert(port) {
                return port;
            }
        }
    }
}

fn cluster_ip(family: Family, n: u64) -> String {
    match family {
        Family::V4 => format!("10.96.{}.{}", n / 250, 1 + n % 250),
        Family::V6 => format!("fd00:10:96::{:x}", 0x100 + n),
    }
}

fn families(rng: &mut Rng) -> Vec<Family> {
    match rng.below(5) {
        0 => vec![Family::V6],
        1 => vec![Family::V4, Family::V6],
        2 => vec![Family::V6, Family::V4],
        _ => vec![Family::V4],
    }
}

fn external_ip(rng: &mut Rng, family: Family, taken: &mut NodePorts) -> String {
    loop {
        let ip = match family {
            Family::V4 => format!("203.0.113.{}", 1 + rng.below(254)),
            Family::V6 => format!("2001:db8:203:113::{:x}", 1 + rng.below(0xffff)),
        };
        if taken.1.insert(ip.clone()) {
            return ip;
        }
    }
}

fn source_range(rng: &mut Rng, i: u64) -> String {
    match rng.below(6) {
        0 => format!("2001:db8:{:x}::/48", i % 0xffff),
        1 => rng
            .pick(&["0.0.0.0/0", "::/0", "192.168.99.10/32"])
            .to_owned(),
        2 => format!("198.{}.{}.0/24", 18 + (i / 256) % 2, i % 256),
        _ => format!(
            "100.{}.{}.{}/32",
            64 + (i / 65536) % 64,
            (i / 256) % 256,
            i % 256
        ),
    }
}

fn endpoints(rng: &mut Rng, offset: u16) -> Vec<Endpoint> {
    let count = match rng.below(10) {
        0 => 0,
        1 => 20 + rng.below(80),
        _ => 1 + rng.below(5),
    };
    (0..count)
        .map(|e| {
            let (ready, serving, terminating) = rng.pick(&[
                (true, true, false),
                (true, true, false),
                (true, true, false),
                (false, true, true),
                (false, false, true),
                (false, false, false),
                (false, true, false),
            ]);
            let node = if rng.chance(15) {
                None
            } else {
                Some(rng.pick(&NODES))
            };
            let subnet = if node == Some("node-1") { 1 } else { 2 };
            let hinted = rng.chance(30);
            Endpoint {
                host: offset + e as u16,
                subnet,
                ready,
                serving,
                terminating,
                node,
                zone: rng.chance(60).then(|| rng.pick(&ZONES)),
                hint_zones: if hinted {
                    vec![rng.pick(&ZONES)]
                } else {
                    vec![]
                },
                hint_nodes: if hinted && rng.chance(50) {
                    vec![rng.pick(&NODES)]
                } else {
                    vec![]
                },
            }
        })
        .collect()
}

/// A new Service from nothing, near the API's limits now and then.
fn generate(rng: &mut Rng, n: u64, node_ports: &mut NodePorts) -> Svc {
    let port_count = match rng.below(10) {
        0 => 50 + rng.below(100) as usize,
        1 => 5 + rng.below(10) as usize,
        _ => 1 + rng.below(3) as usize,
    };
    let mut kind = if rng.chance(8) {
        rng.pick(&UNPROGRAMMED_KINDS)
    } else {
        rng.pick(&KINDS)
    };
    if !node_ports.room(port_count + 1) {
        kind = "ClusterIP";
    }
    let external = has_node_ports(kind);
    let families = families(rng);
    let mut seen = BTreeSet::new();
    let mut ports = Vec::new();
    for i in 0..port_count {
        let protocol = rng.pick(&PROTOCOLS);
        let mut port = if rng.chance(50) {
            rng.pick(&PORT_NUMBERS)
        } else {
            1 + rng.below(65535) as u16
        };
        while !seen.insert((port, protocol)) {
            port = port % 65535 + 1;
        }
        ports.push(Port {
            name: if port_count == 1 && rng.chance(30) {
                String::new()
            } else {
                port_name(rng, i)
            },
            port,
            target: if rng.chance(30) {
                rng.pick(&PORT_NUMBERS)
            } else {
                1 + rng.below(65535) as u16
            },
            target_by_name: false,
            protocol,
            node_port: external.then(|| node_ports.take(rng)),
        });
    }
    if let Some(first) = ports.first_mut() {
        first.target_by_name = !first.name.is_empty() && rng.chance(20);
    }
    let etp_local = external && rng.chance(40);
    let mut svc = Svc {
        namespace: if rng.chance(15) {
            label(rng, 'n', 63)
        } else {
            "fuzz".to_owned()
        },
        name: service_name(rng, n),
        kind,
        families: families.clone(),
        ports,
        external_ips: Vec::new(),
        lb_ips: Vec::new(),
        source_ranges: Vec::new(),
        affinity: rng.chance(25).then(|| rng.pick(&TIMEOUTS)),
        etp_local,
        itp_local: rng.chance(20),
        prefer_close: rng.chance(15),
        health_check_node_port: (etp_local && kind == "LoadBalancer").then(|| node_ports.take(rng)),
        slices: Vec::new(),
    };
    if rng.chance(25) {
        for _ in 0..1 + rng.below(4) {
            // Now and then an address of the family the Service lacks.
            let family = if rng.chance(15) {
                rng.pick(&[Family::V4, Family::V6])
            } else {
                rng.pick(&families)
            };
            svc.external_ips.push(external_ip(rng, family, node_ports));
        }
    }
    if kind == "LoadBalancer" {
        for &family in &families {
            svc.lb_ips.push(external_ip(rng, family, node_ports));
        }
        if rng.chance(50) {
            let count = if rng.chance(30) {
                100 + rng.below(400)
            } else {
                1 + rng.below(5)
            };
            svc.source_ranges = (0..count).map(|i| source_range(rng, i)).collect();
        }
    }
    let mut offset = 2 + (n as u16 % 50) * 100;
    for &family in &families {
        let eps = endpoints(rng, offset);
        offset += eps.len() as u16;
        svc.slices.push((family, eps));
        if rng.chance(15) {
            let eps = endpoints(rng, offset);
            offset += eps.len() as u16;
            svc.slices.push((family, eps));
        }
    }
    strip_unprogrammed(&mut svc);
    svc
}

/// A Service made from an earlier one by a few valid edits; it gets its
/// own name, ClusterIPs and node ports.
fn mutate(rng: &mut Rng, base: &Svc, n: u64, node_ports: &mut NodePorts) -> Svc {
    let mut svc = base.clone();
    svc.name = service_name(rng, n);
    for _ in 0..1 + rng.below(3) {
        match rng.below(10) {
            0 => {
                let protocol = rng.pick(&PROTOCOLS);
                let taken: BTreeSet<_> = svc.ports.iter().map(|p| (p.port, p.protocol)).collect();
                for p in &mut svc.ports {
                    if !taken.contains(&(p.port, protocol)) {
                        p.protocol = protocol;
                        break;
                    }
                }
            }
            1 => svc.affinity = Some(rng.pick(&TIMEOUTS)),
            2 => svc.affinity = None,
            3 => svc.kind = rng.pick(&KINDS),
            4 => {
                for p in &mut svc.ports {
                    if !p.name.is_empty() && rng.chance(50) {
                        let i = p.name.len();
                        p.name = format!("{}-{}", label(rng, 'r', 63 - 5), i % 1000);
                        p.name.truncate(63);
                        while p.name.ends_with('-') {
                            p.name.pop();
                        }
                    }
                }
                let mut names = BTreeSet::new();
                for (i, p) in svc.ports.iter_mut().enumerate() {
                    if !p.name.is_empty() && !names.insert(p.name.clone()) {
                        p.name = format!("d{i}");
                    }
                }
            }
            5 => {
                for (_, eps) in &mut svc.slices {
                    for ep in eps.iter_mut() {
                        ep.terminating = !ep.terminating;
                        ep.ready = ep.ready && !ep.terminating;
                        ep.serving = rng.chance(50);
                    }
                }
            }
            6 => {
                svc.families.reverse();
                if svc.families.len() == 1 && rng.chance(50) {
                    let other = if svc.families[0] == Family::V4 {
                        Family::V6
                    } else {
                        Family::V4
                    };
                    svc.families.push(other);
                    let eps = endpoints(rng, 2 + (n as u16 % 50) * 100 + 60);
                    svc.slices.push((other, eps));
                }
            }
            7 => svc.etp_local = !svc.etp_local,
            8 => svc.itp_local = !svc.itp_local,
            _ => {
                let family = rng.pick(&svc.families);
                svc.external_ips.push(external_ip(rng, family, node_ports));
            }
        }
    }
    if !node_ports.room(svc.ports.len() + 1) {
        svc.kind = "ClusterIP";
    }
    let families: Vec<Family> = svc
        .external_ips
        .iter()
        .map(|ip| {
            if ip.contains(':') {
                Family::V6
            } else {
                Family::V4
            }
        })
        .collect();
    svc.external_ips = families
        .into_iter()
        .map(|f| external_ip(rng, f, node_ports))
        .collect();
    let external = has_node_ports(svc.kind);
    for p in &mut svc.ports {
        p.node_port = external.then(|| node_ports.take(rng));
    }
    svc.etp_local &= external;
    svc.health_check_node_port =
        (svc.etp_local && svc.kind == "LoadBalancer").then(|| node_ports.take(rng));
    if svc.kind == "LoadBalancer" {
        let families = svc.families.clone();
        svc.lb_ips = families
            .iter()
            .map(|&f| external_ip(rng, f, node_ports))
            .collect();
    } else {
        svc.lb_ips.clear();
        svc.source_ranges.clear();
    }
    if svc.ports.len() > 1 {
        for (i, p) in svc.ports.iter_mut().enumerate() {
            if p.name.is_empty() {
                p.name = format!("u{i}");
            }
        }
    }
    strip_unprogrammed(&mut svc);
    svc
}

/// The Service and its slices as YAML documents.
fn render(svc: &Svc, n: u64) -> String {
    let mut out = String::new();
    let ips: Vec<String> = if svc.kind == "Headless" {
        vec!["None".to_owned()]
    } else {
        svc.families.iter().map(|&f| cluster_ip(f, n)).collect()
    };
    if svc.kind == "ExternalName" {
        let _ = write!(
            out,
            "apiVersion: v1\nkind: Service\nmetadata: {{namespace: \"{}\", name: \"{}\"}}\nspec:\n  type: ExternalName\n\
             \x20 externalName: db.example.com\n",
            svc.namespace, svc.name,
        );
    } else {
        let _ = write!(
            out,
            "apiVersion: v1\nkind: Service\nmetadata: {{namespace: \"{}\", name: \"{}\"}}\nspec:\n  type: {}\n\
             \x20 clusterIP: \"{}\"\n  clusterIPs: [{}]\n  ipFamilies: [{}]\n  ipFamilyPolicy: {}\n",
            svc.namespace,
            svc.name,
            if svc.kind == "Headless" { "ClusterIP" } else { svc.kind },
            ips[0],
            ips.iter()
                .map(|ip| format!("\"{ip}\""))
                .collect::<Vec<_>>()
                .join(", "),
            svc.families
                .iter()
                .map(|f| f.name())
                .collect::<Vec<_>>()
                .join(", "),
            if svc.families.len() == 2 {
                "RequireDualStack"
            } else {
                "SingleStack"
            },
        );
    }
    if has_node_ports(svc.kind) {
        let _ = writeln!(
            out,
            "  externalTrafficPolicy: {}",
            if svc.etp_local { "Local" } else { "Cluster" }
        );
    }
    if svc.itp_local {
        out.push_str("  internalTrafficPolicy: Local\n");
    }
    if svc.prefer_close {
        out.push_str("  trafficDistribution: PreferClose\n");
    }
    if let Some(timeout) = svc.affinity {
        let _ = writeln!(
            out,
            "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {{clientIP: {{timeoutSeconds: {timeout}}}}}"
        );
    }
    if !svc.external_ips.is_empty() {
        let _ = writeln!(out, "  externalIPs: [{}]", quoted(&svc.external_ips));
    }
    if !svc.source_ranges.is_empty() {
        let _ = writeln!(
            out,
            "  loadBalancerSourceRanges: [{}]",
            quoted(&svc.source_ranges)
        );
    }
    if let Some(port) = svc.health_check_node_port {
        let _ = writeln!(out, "  healthCheckNodePort: {port}");
    }
    out.push_str("  ports:\n");
    for p in &svc.ports {
        out.push_str("    - {");
        if !p.name.is_empty() {
            let _ = write!(out, "name: \"{}\", ", p.name);
        }
        let _ = write!(out, "port: {}, protocol: {}", p.port, p.protocol);
        if p.target_by_name {
            let _ = write!(out, ", targetPort: \"{}\"", p.name);
        } else {
            let _ = write!(out, ", targetPort: {}", p.target);
        }
        if let Some(node_port) = p.node_port {
            let _ = write!(out, ", nodePort: {node_port}");
        }
        out.push_str("}\n");
    }
    if !svc.lb_ips.is_empty() {
        out.push_str("status:\n  loadBalancer:\n    ingress:\n");
        for ip in &svc.lb_ips {
            let _ = writeln!(out, "      - ip: \"{ip}\"");
            // Either ipMode, or none (VIP).
            match n % 3 {
                0 => out.push_str("        ipMode: Proxy\n"),
                1 => out.push_str("        ipMode: VIP\n"),
                _ => {}
            }
        }
    }
    for (s, (family, eps)) in svc.slices.iter().enumerate() {
        let _ = write!(
            out,
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: \"{}\"\n\
             \x20 name: \"{}-{s}\"\n  labels: {{kubernetes.io/service-name: \"{}\"}}\naddressType: {}\nports:\n",
            svc.namespace,
            svc.name,
            svc.name,
            family.name(),
        );
        for p in &svc.ports {
            let _ = writeln!(
                out,
                "  - {{name: \"{}\", port: {}, protocol: {}}}",
                p.name, p.target, p.protocol
            );
        }
        if eps.is_empty() {
            out.push_str("endpoints: []\n");
            continue;
        }
        out.push_str("endpoints:\n");
        for ep in eps {
            let address = match family {
                Family::V4 => format!("10.244.{}.{}", ep.subnet, 2 + ep.host % 250),
                Family::V6 => format!("fd00:10:244:{}::{:x}", ep.subnet, 2 + ep.host),
            };
            let _ = writeln!(
                out,
                "  - addresses: [\"{address}\"]\n    conditions: {{ready: {}, serving: {}, terminating: {}}}",
                ep.ready, ep.serving, ep.terminating
            );
            if let Some(node) = ep.node {
                let _ = writeln!(out, "    nodeName: {node}");
            }
            if let Some(zone) = ep.zone {
                let _ = writeln!(out, "    zone: {zone}");
            }
            if !ep.hint_zones.is_empty() || !ep.hint_nodes.is_empty() {
                out.push_str("    hints:\n");
                if !ep.hint_zones.is_empty() {
                    let zones: Vec<String> = ep
                        .hint_zones
                        .iter()
                        .map(|z| format!("{{name: {z}}}"))
                        .collect();
                    let _ = writeln!(out, "      forZones: [{}]", zones.join(", "));
                }
                if !ep.hint_nodes.is_empty() {
                    let nodes: Vec<String> = ep
                        .hint_nodes
                        .iter()
                        .map(|z| format!("{{name: {z}}}"))
                        .collect();
                    let _ = writeln!(out, "      forNodes: [{}]", nodes.join(", "));
                }
            }
        }
    }
    out
}

fn quoted(values: &[String]) -> String {
    values
        .iter()
        .map(|v| format!("\"{v}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

const NODE: &str = "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-1\n  labels: {kubernetes.io/hostname: node-1, topology.kubernetes.io/zone: zone-a}\n\
     spec:\n  podCIDR: 10.244.1.0/24\n  podCIDRs: [10.244.1.0/24, fd00:10:244:1::/64]\n\
     status:\n  addresses:\n    - {type: InternalIP, address: 192.168.99.2}\n    - {type: InternalIP, address: fd00:192:168:99::2}\n";

/// One batch: the Services of `seed`, each as (file name, `ns/name`, text).
fn batch(seed: u64) -> Vec<(String, String, String)> {
    let mut rng = Rng::new(seed);
    let mut node_ports = NodePorts(BTreeSet::new(), BTreeSet::new());
    let mut made: Vec<Svc> = Vec::new();
    let mut out = Vec::new();
    for n in 0..SERVICES {
        let svc = if !made.is_empty() && rng.chance(40) {
            let base = made[rng.below(made.len() as u64) as usize].clone();
            mutate(&mut rng, &base, n, &mut node_ports)
        } else {
            generate(&mut rng, n, &mut node_ports)
        };
        out.push((
            format!("svc-{n:03}.yaml"),
            format!("{}/{}", svc.namespace, svc.name),
            render(&svc, n),
        ));
        made.push(svc);
    }
    out
}

/// The binary's flags for `mode` (and the nftables table `layout`, if
/// given) on the manifests in `dir`.
fn flags(mode: &str, layout: Option<&str>, dir: &Path) -> Vec<String> {
    let mut flags = [
        "--manifests",
        dir.to_str().unwrap(),
        "--hostname-override",
        "node-1",
        "--cluster-cidr",
        "10.244.0.0/16,fd00:10:244::/48",
        "--proxy-mode",
        mode,
    ]
    .map(str::to_owned)
    .to_vec();
    if let Some(layout) = layout {
        flags.extend(["--nftables-layout".to_owned(), layout.to_owned()]);
    }
    flags
}

fn node_namespace(hint: Option<&str>) -> Netns {
    let ns = Netns::bare_node("fuzzk").unwrap();
    if let Some(flavor) = hint {
        ns.declare_iptables_hint(flavor);
    }
    ns
}

/// The value of every sample of the metric families whose names start with
/// one of `prefixes`, as (series, value).
fn samples(metrics: &str, prefixes: &[&str]) -> Vec<(String, f64)> {
    metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| prefixes.iter().any(|p| line.starts_with(p)))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// What went wrong with one batch in one mode, for the failure message.
struct Failure {
    why: String,
    log: String,
}

/// Loads batch `seed` with `mode` (the nftables table in `layout`, if
/// given); returns how many Service files the source accepted whole, or
/// what failed.
fn load(
    seed: u64,
    mode: &str,
    layout: Option<&str>,
    hint: Option<&str>,
) -> Result<(usize, Vec<String>), Failure> {
    let services = batch(seed);
    let ns = node_namespace(hint);
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    fs::create_dir_all(&manifests).unwrap();
    fs::write(manifests.join("node.yaml"), NODE).unwrap();
    for (file, _, text) in &services {
        fs::write(manifests.join(file), text).unwrap();
    }
    let log = dir.path().join("proxy.log");
    let mut command = ns.command(BIN);
    command
        .args(flags(mode, layout, &manifests))
        .args(["--metrics-bind-address", "127.0.0.1:10249"])
        .args(["--healthz-bind-address", "127.0.0.1:10256"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(File::create(&log).unwrap()));
    let mut proxy = NsChild::spawn(&mut command).unwrap();
    let read_log = || fs::read_to_string(&log).unwrap_or_default();
    let fail = |why: String| Failure {
        why,
        log: read_log(),
    };

    let metrics = || {
        ns.run(|| kp_testkit::http::get(("127.0.0.1", 10249), "/metrics"))
            .ok()
            .filter(|reply| reply.code == 200)
            .map(|reply| reply.body)
    };
    let mut exited = None;
    let synced = wait_until(SYNC_TIMEOUT, || {
        if let Some(status) = proxy.try_wait().unwrap() {
            exited = Some(status);
            return true;
        }
        metrics().is_some_and(|body| {
            ["IPv4", "IPv6"].iter().all(|family| {
                body.contains(&format!(
                    "kubeproxy_sync_proxy_rules_last_timestamp_seconds{{ip_family=\"{family}\"}}"
                ))
            })
        })
    });
    if let Some(status) = exited {
        return Err(fail(format!("the proxy exited with {status}")));
    }
    if !synced {
        return Err(fail(format!(
            "no successful sync of both families within {SYNC_TIMEOUT:?}"
        )));
    }
    let healthy = wait_until(Duration::from_secs(10), || {
        ns.run(|| kp_testkit::http::get(("127.0.0.1", 10256), "/healthz"))
            .is_ok_and(|reply| reply.code == 200)
    });
    if !healthy {
        return Err(fail("/healthz never answered 200".to_owned()));
    }

    let mut last = String::new();
    let agreed = wait_until(Duration::from_secs(10), || {
        let output = ns
            .command(BIN)
            .arg("check")
            .args(flags(mode, layout, &manifests))
            .output()
            .unwrap();
        last = format!(
            "exit {:?}\n{}{}",
            output.status.code(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        output.status.code() == Some(0)
    });
    if !agreed {
        return Err(fail(format!("`kube-proxy check` failed:\n{last}")));
    }

    let Some(body) = metrics() else {
        return Err(fail("/metrics stopped answering".to_owned()));
    };
    let bad: Vec<String> = samples(
        &body,
        &[
            "kubeproxy_rs_sync_refused_services",
            "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
            "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
        ],
    )
    .into_iter()
    .filter(|(_, value)| *value > 0.0)
    .map(|(series, value)| format!("{series} {value}"))
    .collect();
    if !bad.is_empty() {
        return Err(fail(format!(
            "the proxy counted failed syncs or refused Services:\n{}",
            bad.join("\n")
        )));
    }
    if let Some(status) = proxy.try_wait().unwrap() {
        return Err(fail(format!("the proxy exited with {status}")));
    }

    // The files the source rejected a document of; the others were
    // accepted whole.
    let text = read_log();
    let rejections: Vec<String> = text
        .lines()
        .filter(|line| line.contains("invalid manifest"))
        .map(str::to_owned)
        .collect();
    let accepted = services
        .iter()
        .filter(|(file, _, _)| !rejections.iter().any(|line| line.contains(file.as_str())))
        .count();
    Ok((accepted, rejections))
}

/// Whether `line` names the Service `id` (`ns/name`), not one whose name
/// only starts the same.
fn names(line: &str, id: &str) -> bool {
    line.match_indices(id).any(|(at, _)| {
        !line[at + id.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-')
    })
}

/// The documents of the Services named by `why` or an error line of `log`,
/// or all of them when none is named.
fn culprits(seed: u64, why: &str, log: &str) -> String {
    let services = batch(seed);
    let named: Vec<&(String, String, String)> = services
        .iter()
        .filter(|(_, id, _)| {
            why.lines()
                .chain(log.lines().filter(|l| l.starts_with('E')))
                .any(|l| names(l, id))
        })
        .collect();
    let shown = if named.is_empty() {
        services.iter().collect()
    } else {
        named
    };
    shown
        .iter()
        .map(|(file, id, text)| format!("=== {file} ({id}) ===\n{text}"))
        .collect()
}

fn cases() -> std::ops::Range<u64> {
    let number = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .map(|v| {
                v.parse()
                    .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
            })
            .unwrap_or(default)
    };
    let first = number("KP_FUZZ_KERNEL_SEED", 1);
    first..first + number("KP_FUZZ_KERNEL_CASES", 6)
}

fn every_accepted_document_programs(mode: &str, hint: Option<&str>) {
    every_accepted_document_programs_in(mode, None, hint);
}

/// [`every_accepted_document_programs`], the nftables table in `layout` if
/// given.
fn every_accepted_document_programs_in(mode: &str, layout: Option<&str>, hint: Option<&str>) {
    require_root();
    let mut accepted = 0;
    let mut total = 0;
    let mut documents = 0;
    for seed in cases() {
        match load(seed, mode, layout, hint) {
            Ok((count, rejections)) => {
                accepted += count;
                total += SERVICES as usize;
                documents += batch(seed)
                    .iter()
                    .map(|(_, _, text)| text.matches("\n---\n").count() + 1)
                    .sum::<usize>();
                for line in rejections {
                    eprintln!("seed {seed}: rejected by the source: {line}");
                }
            }
            Err(failure) => {
                let documents = culprits(seed, &failure.why, &failure.log);
                panic!(
                    "seed {seed}, mode {mode} {layout:?} {hint:?}: {}\n\
                     (repeat with KP_FUZZ_KERNEL_SEED={seed} KP_FUZZ_KERNEL_CASES=1)\n\
                     the proxy's log:\n{}\nthe documents:\n{documents}",
                    failure.why, failure.log
                );
            }
        }
    }
    eprintln!(
        "{mode} {layout:?} {hint:?}: {accepted} of {total} Service files ({documents} documents) \
         accepted whole and programmed"
    );
    // Every generated document is valid; the source refusing most of them
    // would leave this test checking nothing.
    assert!(
        accepted * 10 >= total * 9,
        "{mode}: the source accepted only {accepted} of {total} generated Service files"
    );
}

#[test]
fn iptables_legacy_programs_every_accepted_document() {
    every_accepted_document_programs("iptables", Some("legacy"));
}

#[test]
fn iptables_nft_programs_every_accepted_document() {
    every_accepted_document_programs("iptables", Some("nft"));
}

#[test]
fn nftables_programs_every_accepted_document() {
    every_accepted_document_programs_in("nftables", Some("chains"), None);
}

#[test]
fn nftables_data_layout_programs_every_accepted_document() {
    every_accepted_document_programs_in("nftables", Some("data"), None);
}

#[test]
fn userspace_programs_every_accepted_document() {
    every_accepted_document_programs("userspace", None);
}

#[test]
fn the_generator_reaches_the_limits() {
    let all: String = cases()
        .chain(100..110)
        .flat_map(batch)
        .map(|(_, _, text)| text)
        .collect();
    for needle in [
        "type: ClusterIP",
        "type: NodePort",
        "type: LoadBalancer",
        "type: ExternalName",
        "clusterIP: \"None\"",
        "ipMode: Proxy",
        "ipMode: VIP",
        "externalTrafficPolicy: Local",
        "internalTrafficPolicy: Local",
        "trafficDistribution: PreferClose",
        "timeoutSeconds: 1}",
        "timeoutSeconds: 86400}",
        "externalIPs:",
        "loadBalancerSourceRanges:",
        "ipFamilies: [IPv4, IPv6]",
        "ipFamilies: [IPv6, IPv4]",
        "ipFamilies: [IPv6]",
        "protocol: UDP",
        "protocol: SCTP",
        "port: 65535",
        "port: 1,",
        "nodePort: 30000",
        "nodePort: 32767",
        "healthCheckNodePort:",
        "terminating: true",
        "forZones:",
        "forNodes:",
        "endpoints: []",
        "targetPort: \"",
    ] {
        assert!(all.contains(needle), "no batch has {needle:?}");
    }
    // Names at the 63-character limit, and a Service with many ports and
    // one with many source ranges.
    let longest = |prefix: &str| {
        all.lines()
            .filter_map(|l| l.split(prefix).nth(1))
            .filter_map(|rest| rest.split('"').next())
            .map(str::len)
            .max()
            .unwrap_or(0)
    };
    assert_eq!(
        longest(", name: \""),
        63,
        "no Service name of 63 characters"
    );
    assert_eq!(
        longest("{namespace: \""),
        63,
        "no namespace of 63 characters"
    );
    assert_eq!(
        longest("    - {name: \""),
        63,
        "no port name of 63 characters"
    );
    let most = |needle: &str| {
        all.split("kind: Service\n")
            .map(|doc| {
                doc.split("---")
                    .next()
                    .unwrap_or("")
                    .matches(needle)
                    .count()
            })
            .max()
            .unwrap_or(0)
    };
    assert!(most("    - {") >= 50, "no Service with 50 ports");
    let ranges = all
        .lines()
        .filter(|l| l.starts_with("  loadBalancerSourceRanges:"))
        .map(|l| l.matches(',').count() + 1)
        .max()
        .unwrap_or(0);
    assert!(ranges >= 100, "no Service with 100 source ranges");
}
