//! Random clusters for differential tests: Services of every type and
//! traffic policy, endpoints ready, serving and terminating, on this node,
//! another node or none, in both families, as manifests for `--manifests`.
//! A seed names a cluster, so a failing case can be repeated.
//!
//! The addresses follow the plan of [`plan`](crate::plan): the node is
//! `node-1` at 192.168.99.2 / fd00:192:168:99::2 with the pods of
//! 10.244.1.0/24 / fd00:10:244:1::/64; other endpoints are on `node-2`
//! (10.244.2.0/24) or on no node; Services live in namespace `diff`.

use std::fmt::Write as _;

/// One random cluster of both families as manifests (YAML documents
/// separated by `---`): the Node `node-1`, the Services and their
/// EndpointSlices. The same seed gives the same text.
pub fn random_manifests(seed: u64) -> String {
    let mut rng = Rng::new(seed);
    let mut out = String::new();
    write_node(&mut out);
    let services = 12 + rng.below(12);
    let mut node_port = 30100;
    for n in 0..services {
        write_service(&mut out, &mut rng, n, &mut node_port);
    }
    out
}

/// A small deterministic generator (xorshift64*), so a seed names a case:
/// the random source of every generated test input.
#[derive(Debug, Clone)]
pub struct Rng(u64);

/// An address family of one Service.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

impl Rng {
    /// The generator of `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n`; `n` is not 0.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// True `percent` times in 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One of `items`, which is not empty.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        // Below `items.len()`, so in range.
        items[self.below(items.len() as u64) as usize]
    }
}

impl Family {
    fn name(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }
}

fn write_node(out: &mut String) {
    out.push_str(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-1\n  labels: {kubernetes.io/hostname: node-1}\n\
         spec:\n  podCIDR: 10.244.1.0/24\n  podCIDRs: [10.244.1.0/24, fd00:10:244:1::/64]\n\
         status:\n  addresses:\n    - {type: InternalIP, address: 192.168.99.2}\n    - {type: InternalIP, address: fd00:192:168:99::2}\n",
    );
}

/// The `n`th Service (`svc-n`) with its EndpointSlices, one per family.
fn write_service(out: &mut String, rng: &mut Rng, n: u64, node_port: &mut u64) {
    let name = format!("svc-{n}");
    let families: Vec<Family> = match rng.below(4) {
        0 => vec![Family::V6],
        1 => vec![Family::V4, Family::V6],
        _ => vec![Family::V4],
    };
    let kind = rng.pick(&["ClusterIP", "ClusterIP", "NodePort", "LoadBalancer"]);
    let external = kind != "ClusterIP";
    let etp_local = external && rng.chance(40);
    let itp_local = rng.chance(20);
    let affinity = rng.chance(20);
    let ports = 1 + rng.below(2);
    let cluster_ips: Vec<String> = families
        .iter()
        .map(|family| match family {
            Family::V4 => format!("10.96.{}.{}", 10 + n / 200, 1 + n % 200),
            Family::V6 => format!("fd00:10:96::{:x}", 0x100 + n),
        })
        .collect();
    let _ = write!(
        out,
        "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: diff, name: {name}}}\nspec:\n  type: {kind}\n\
         \x20 clusterIP: {}\n  clusterIPs: [{}]\n  ipFamilies: [{}]\n  ipFamilyPolicy: {}\n",
        cluster_ips.first().map_or("", String::as_str),
        cluster_ips.join(", "),
        families.iter().map(|f| f.name()).collect::<Vec<_>>().join(", "),
        if families.len() == 2 {
            "RequireDualStack"
        } else {
            "SingleStack"
        },
    );
    if external {
        let _ = writeln!(
            out,
            "  externalTrafficPolicy: {}",
            if etp_local { "Local" } else { "Cluster" }
        );
    }
    if itp_local {
        out.push_str("  internalTrafficPolicy: Local\n");
    }
    if affinity {
        out.push_str(
            "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}\n",
        );
    }
    if rng.chance(20) {
        let ips: Vec<String> = families
            .iter()
            .map(|family| match family {
                Family::V4 => format!("203.0.113.{}", 100 + n),
                Family::V6 => format!("2001:db8:203:113::{:x}", 0x100 + n),
            })
            .collect();
        let _ = writeln!(out, "  externalIPs: [{}]", ips.join(", "));
    }
    let ranges = kind == "LoadBalancer" && rng.chance(50);
    if ranges {
        out.push_str(
            "  loadBalancerSourceRanges: [198.51.100.0/24, 192.168.99.8/29, 2001:db8:1::/48]\n",
        );
    }
    if etp_local && kind == "LoadBalancer" {
        let _ = writeln!(out, "  healthCheckNodePort: {}", 32000 + n);
    }
    out.push_str("  ports:\n");
    let mut port_specs = Vec::new();
    for p in 0..ports {
        let protocol = rng.pick(&["TCP", "TCP", "UDP", "SCTP"]);
        let port = 80 + p;
        let target = 8080 + p;
        let _ = write!(
            out,
            "    - {{name: p{p}, port: {port}, targetPort: {target}, protocol: {protocol}"
        );
        if external {
            let _ = write!(out, ", nodePort: {node_port}");
            *node_port += 1;
        }
        out.push_str("}\n");
        port_specs.push((p, target, protocol));
    }
    if kind == "LoadBalancer" {
        out.push_str("status:\n  loadBalancer:\n    ingress:\n");
        for family in &families {
            let _ = writeln!(
                out,
                "      - ip: {}",
                match family {
                    Family::V4 => format!("203.0.113.{}", 10 + n),
                    Family::V6 => format!("2001:db8:203:113::{:x}", 0x10 + n),
                }
            );
        }
    }
    for family in &families {
        let endpoints = rng.below(5);
        let _ = write!(
            out,
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: diff\n\
             \x20 name: {name}-{}\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: {}\nports:\n",
            if *family == Family::V4 { "v4" } else { "v6" },
            family.name(),
        );
        for (p, target, protocol) in &port_specs {
            let _ = writeln!(
                out,
                "  - {{name: p{p}, port: {target}, protocol: {protocol}}}"
            );
        }
        out.push_str("endpoints:\n");
        if endpoints == 0 {
            out.pop();
            out.push_str(" []\n");
        }
        for e in 0..endpoints {
            let node = rng.pick(&["node-1", "node-2", "node-2", ""]);
            let subnet = if node == "node-1" { 1 } else { 2 };
            let host = 2 + (n * 5 + e) % 250;
            let address = match family {
                Family::V4 => format!("10.244.{subnet}.{host}"),
                Family::V6 => format!("fd00:10:244:{subnet}::{host:x}"),
            };
            let (ready, serving, terminating) = rng.pick(&[
                (true, true, false),
                (true, true, false),
                (true, true, false),
                (false, true, true),
                (false, false, true),
                (false, false, false),
            ]);
            let _ = writeln!(
                out,
                "  - addresses: [{address}]\n    conditions: {{ready: {ready}, serving: {serving}, terminating: {terminating}}}"
            );
            if !node.is_empty() {
                let _ = writeln!(out, "    nodeName: {node}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_covers_every_kind_of_service() {
        let all: String = (1..4).chain(10..20).map(random_manifests).collect();
        for needle in [
            "type: ClusterIP",
            "type: NodePort",
            "type: LoadBalancer",
            "externalTrafficPolicy: Local",
            "externalTrafficPolicy: Cluster",
            "internalTrafficPolicy: Local",
            "sessionAffinity: ClientIP",
            "externalIPs:",
            "loadBalancerSourceRanges:",
            "ipFamilies: [IPv4, IPv6]",
            "ipFamilies: [IPv6]",
            "protocol: UDP",
            "protocol: SCTP",
            "terminating: true",
            "nodeName: node-1",
            "nodeName: node-2",
            "endpoints: []",
        ] {
            assert!(all.contains(needle), "no case has {needle:?}");
        }
    }

    #[test]
    fn a_seed_names_one_cluster() {
        assert_eq!(random_manifests(7), random_manifests(7));
        assert_ne!(random_manifests(7), random_manifests(8));
    }
}
