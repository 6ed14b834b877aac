//! Differential test of the modes against the model: random clusters
//! (Services of every type and policy, endpoints ready, serving and
//! terminating, on this node, another node or none, both families) are
//! written as manifests; each mode in turn (iptables with either flavor,
//! nftables) programs them from the binary in a fresh node namespace, and
//! `kube-proxy check` with the same flags traces every Service address
//! through the kernel's live rules and must find each one doing what the
//! model (`kp_sync::expect`) says.
//!
//! `KP_DIFFERENTIAL_CASES` sets how many clusters (default 3, as `.ci/run`
//! runs it); `KP_DIFFERENTIAL_SEED` the first seed (default 1). A failure
//! names the seed, so `KP_DIFFERENTIAL_SEED=N KP_DIFFERENTIAL_CASES=1`
//! repeats it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Write as _;
use std::fs::{self, File};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use kp_testkit::netns::{require_root, wait_until, Netns, NsChild};

const BIN: &str = env!("CARGO_BIN_EXE_kube-proxy");

/// A small deterministic generator (xorshift64*), so a seed names a case.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
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

/// One random cluster as manifests: Services, EndpointSlices, the Node.
fn cluster(seed: u64) -> String {
    let mut rng = Rng::new(seed);
    let mut out = String::new();
    out.push_str(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-1\n  labels: {kubernetes.io/hostname: node-1}\n\
         spec:\n  podCIDR: 10.244.1.0/24\n  podCIDRs: [10.244.1.0/24, fd00:10:244:1::/64]\n\
         status:\n  addresses:\n    - {type: InternalIP, address: 192.168.99.2}\n    - {type: InternalIP, address: fd00:192:168:99::2}\n",
    );
    let services = 12 + rng.below(12);
    let mut node_port = 30100;
    for n in 0..services {
        let name = format!("svc-{n}");
        let families: Vec<Family> = match rng.below(4) {
            0 => vec![Family::V6],
            1 => vec![Family::V4, Family::V6],
            _ => vec![Family::V4],
        };
        let kind = *rng.pick(&["ClusterIP", "ClusterIP", "NodePort", "LoadBalancer"]);
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
            cluster_ips[0],
            cluster_ips.join(", "),
            families.iter().map(|f| f.name()).collect::<Vec<_>>().join(", "),
            if families.len() == 2 { "RequireDualStack" } else { "SingleStack" },
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
            let protocol = *rng.pick(&["TCP", "TCP", "UDP", "SCTP"]);
            let port = 80 + p as u16;
            let target = 8080 + p as u16;
            let _ = write!(
                out,
                "    - {{name: p{p}, port: {port}, targetPort: {target}, protocol: {protocol}"
            );
            if external {
                let _ = write!(out, ", nodePort: {node_port}");
                node_port += 1;
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
                let node = *rng.pick(&["node-1", "node-2", "node-2", ""]);
                let subnet = if node == "node-1" { 1 } else { 2 };
                let host = 2 + (n * 5 + e) % 250;
                let address = match family {
                    Family::V4 => format!("10.244.{subnet}.{host}"),
                    Family::V6 => format!("fd00:10:244:{subnet}::{host:x}"),
                };
                let (ready, serving, terminating) = *rng.pick(&[
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
    out
}

/// The binary's flags for `mode` on the manifests in `dir`.
fn flags(mode: &str, dir: &Path) -> Vec<String> {
    [
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
    .to_vec()
}

/// Programs the cluster of `seed` with `mode` and checks it: `None` when
/// the kernel does what the model says, else what `check` printed.
fn differs(seed: u64, mode: &str, hint: Option<&str>) -> Option<String> {
    let ns = Netns::create("diff").unwrap();
    ns.ip(&["link", "set", "lo", "up"]).unwrap();
    ns.ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "eth1",
    ])
    .unwrap();
    ns.ip(&["addr", "add", "192.168.99.2/24", "dev", "eth0"])
        .unwrap();
    ns.ip(&[
        "addr",
        "add",
        "fd00:192:168:99::2/64",
        "dev",
        "eth0",
        "nodad",
    ])
    .unwrap();
    ns.ip(&["link", "set", "eth0", "up"]).unwrap();
    ns.ip(&["link", "set", "eth1", "up"]).unwrap();
    if let Some(flavor) = hint {
        for program in [format!("iptables-{flavor}"), format!("ip6tables-{flavor}")] {
            ns.exec_ok(&program, &["-t", "mangle", "-N", "KUBE-IPTABLES-HINT"]);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    fs::create_dir_all(&manifests).unwrap();
    fs::write(manifests.join("cluster.yaml"), cluster(seed)).unwrap();
    let log = dir.path().join("proxy.log");
    let mut command = ns.command(BIN);
    command
        .args(flags(mode, &manifests))
        .args(["--metrics-bind-address", "127.0.0.1:10249"])
        .args(["--healthz-bind-address", "127.0.0.1:10256"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(File::create(&log).unwrap()));
    let _proxy = NsChild::spawn(&mut command).unwrap();
    let healthy = wait_until(Duration::from_secs(30), || {
        ns.run(|| kp_testkit::http::get(("127.0.0.1", 10256), "/healthz"))
            .is_ok_and(|reply| reply.code == 200)
    });
    assert!(
        healthy,
        "seed {seed}, {mode}: the proxy never became healthy:\n{}",
        fs::read_to_string(&log).unwrap_or_default()
    );
    // Each family syncs on its own; give the second its first sync.
    let mut last = String::new();
    let agreed = wait_until(Duration::from_secs(10), || {
        let output = ns
            .command(BIN)
            .arg("check")
            .args(flags(mode, &manifests))
            .output()
            .unwrap();
        last = format!(
            "exit {:?}\n{}{}",
            output.status.code(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let checked_some = String::from_utf8_lossy(&output.stdout)
            .lines()
            .any(|l| l.starts_with("IPv4:") && !l.contains(": 0 connections"));
        output.status.code() == Some(0) && checked_some
    });
    (!agreed).then(|| {
        format!(
            "{last}\nthe proxy's log:\n{}\nthe cluster:\n{}",
            fs::read_to_string(&log).unwrap_or_default(),
            cluster(seed)
        )
    })
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
    let first = number("KP_DIFFERENTIAL_SEED", 1);
    first..first + number("KP_DIFFERENTIAL_CASES", 3)
}

fn every_case_agrees(mode: &str, hint: Option<&str>) {
    require_root();
    for seed in cases() {
        if let Some(report) = differs(seed, mode, hint) {
            panic!(
                "seed {seed}, mode {mode} {hint:?}: the kernel differs from the model:\n{report}"
            );
        }
    }
}

#[test]
fn iptables_legacy_agrees_with_the_model() {
    every_case_agrees("iptables", Some("legacy"));
}

#[test]
fn iptables_nft_agrees_with_the_model() {
    every_case_agrees("iptables", Some("nft"));
}

#[test]
fn userspace_agrees_with_the_model() {
    every_case_agrees("userspace", Some("legacy"));
}

#[test]
fn nftables_agrees_with_the_model() {
    every_case_agrees("nftables", None);
}

#[test]
fn the_generator_covers_every_kind_of_service() {
    let all: String = cases().chain(10..20).map(cluster).collect();
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
