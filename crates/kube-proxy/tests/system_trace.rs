//! `kube-proxy trace` and `kube-proxy check` against a running proxy: the
//! binary programs the example manifests in a node network namespace
//! (iptables mode with each flavor, nftables mode with each table layout),
//! then:
//! - `kube-proxy trace` run in the same namespace reads the kernel's live
//!   rules and reports, for a ClusterIP, a load balancer IP with source
//!   ranges, a Service without endpoints and an address that is no Service,
//!   where a new connection goes. It changes nothing: the rules are the
//!   same before and after.
//! - `kube-proxy check` with the proxy's own flags finds no difference
//!   between the kernel and the model, and after damage behind the proxy's
//!   back (one Service's rule or map element deleted, the nat table or the
//!   nftables table flushed, the nftables table deleted; in the data layout
//!   a `service-endpoints-…` element deleted or pointed elsewhere) names
//!   exactly the damaged connections and exits 1.
//! - the running proxy's state check, and its worker, read the data layout
//!   as `check` does; `trace` shows a removed `hairpin-endpoints` pair.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use kp_testkit::netns::{require_root, wait_until, Netns, NsChild};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_kube-proxy");

struct Node {
    ns: Netns,
    mode: &'static str,
    /// The nftables table layout (`--nftables-layout`), if one is given.
    layout: Option<&'static str>,
    proxy: Option<NsChild>,
    _dir: tempfile::TempDir,
    log: std::path::PathBuf,
}

/// A node namespace running the binary in `mode` on the example manifests;
/// `hint` is the iptables flavor kubelet's hint chain names, if any.
fn node(mode: &'static str, hint: Option<&str>) -> Node {
    node_with(mode, None, hint, &[])
}

/// [`node`] in the nftables mode with the table in `layout`.
fn nftables_node(layout: &'static str) -> Node {
    node_with("nftables", Some(layout), None, &[])
}

/// [`node`], the nftables table in `layout` (if given), the proxy started
/// with `extra` flags too.
fn node_with(
    mode: &'static str,
    layout: Option<&'static str>,
    hint: Option<&str>,
    extra: &[&str],
) -> Node {
    require_root();
    let ns = Netns::create("trace").unwrap();
    ns.ip(&["link", "set", "lo", "up"]).unwrap();
    ns.ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "eth1",
    ])
    .unwrap();
    ns.ip(&["addr", "add", "192.168.99.2/24", "dev", "eth0"])
        .unwrap();
    ns.ip(&["link", "set", "eth0", "up"]).unwrap();
    ns.ip(&["link", "set", "eth1", "up"]).unwrap();
    if let Some(flavor) = hint {
        ns.exec_ok(
            &format!("iptables-{flavor}"),
            &["-t", "mangle", "-N", "KUBE-IPTABLES-HINT"],
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("proxy.log");
    let mut command = ns.command(BIN);
    command
        .args(proxy_flags(mode, layout))
        .args(["--metrics-bind-address", "127.0.0.1:10249"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(File::create(&log).unwrap()));
    let proxy = NsChild::spawn(&mut command).unwrap();
    let node = Node {
        ns,
        mode,
        layout,
        proxy: Some(proxy),
        _dir: dir,
        log,
    };
    let programmed = wait_until(Duration::from_secs(30), || {
        let (code, json, _) = node.trace(&["--to", "10.96.0.10:80/tcp"]);
        code == Some(0) && json["outcome"]["kind"] == "dnat"
    });
    assert!(
        programmed,
        "the example Services were not traced as programmed; the proxy's log:\n{}",
        std::fs::read_to_string(&node.log).unwrap_or_default()
    );
    node
}

/// The proxy's flags for `mode` (and the nftables `layout`, if given) on
/// the example manifests.
fn proxy_flags(mode: &str, layout: Option<&str>) -> Vec<String> {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut flags = [
        "--manifests",
        examples.to_str().unwrap(),
        "--hostname-override",
        "node-1",
        "--cluster-cidr",
        "10.244.0.0/16",
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

impl Node {
    /// Runs `kube-proxy check` with the proxy's flags: exit code, stdout
    /// and stderr.
    fn check(&self) -> (Option<i32>, String, String) {
        let output = self
            .ns
            .command(BIN)
            .arg("check")
            .args(proxy_flags(self.mode, self.layout))
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// Stops the proxy (its rules stay), so nothing repairs what a test
    /// breaks.
    fn stop_proxy(&mut self) {
        self.proxy = None;
    }

    /// Runs `kube-proxy trace ARGS --output json` in the node namespace:
    /// exit code, the report, stderr.
    fn trace(&self, args: &[&str]) -> (Option<i32>, Value, String) {
        let output = self
            .ns
            .command(BIN)
            .arg("trace")
            .args(args)
            .args(["--output", "json"])
            .output()
            .unwrap();
        let json = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
        (
            output.status.code(),
            json,
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    #[track_caller]
    fn report(&self, args: &[&str]) -> Value {
        let (code, json, stderr) = self.trace(args);
        assert_eq!(code, Some(0), "kube-proxy trace {args:?} failed: {stderr}");
        json
    }

    /// Every rule of the namespace, of both iptables flavors and nftables.
    fn rules(&self) -> String {
        let mut all = String::new();
        for program in ["iptables-legacy-save", "iptables-nft-save"] {
            let text = self.ns.exec_ok(program, &[]);
            // Counters move with traffic; the rules do not.
            all.extend(
                text.lines()
                    .filter(|l| !l.starts_with('#'))
                    .map(|l| format!("{}\n", l.split(" [").next().unwrap_or(l))),
            );
        }
        // -s: without counters.
        all + &self.ns.exec_ok("nft", &["-s", "list", "ruleset"])
    }
}

/// The endpoints of a DNAT outcome with their probabilities.
#[track_caller]
fn shares(report: &Value) -> BTreeMap<String, f64> {
    assert_eq!(report["outcome"]["kind"], "dnat", "{report:#}");
    report["outcome"]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|share| {
            (
                share["endpoint"].as_str().unwrap().to_owned(),
                share["probability"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// `kube-proxy trace` over the example manifests `node` programmed.
fn traces_the_examples(node: &Node) {
    let mode = node.mode;
    let data_layout = node.layout == Some("data");
    let before = node.rules();

    // The proxy checked its own rules after its first full sync and found
    // them as the model says.
    let mut metrics = String::new();
    let checked = wait_until(Duration::from_secs(20), || {
        metrics = node
            .ns
            .run(|| kp_testkit::http::get(("127.0.0.1", 10249), "/metrics"))
            .map(|reply| reply.body)
            .unwrap_or_default();
        metrics.contains("kubeproxy_rs_state_drift_services{ip_family=\"IPv4\"} 0")
    });
    assert!(checked, "no state check reported:\n{metrics}");

    // A pod to a ClusterIP: one of three endpoints, a third each, no
    // masquerade (the source is in the cluster CIDR).
    let report = node.report(&["--to", "10.96.0.10:80/tcp", "--from", "10.244.1.5"]);
    assert_eq!(report["mode"], mode);
    assert_eq!(report["origin"], "received");
    let web = shares(&report);
    assert_eq!(
        web.keys().collect::<Vec<_>>(),
        ["10.244.1.2:8080", "10.244.1.3:8080", "10.244.2.2:8080"],
        "{report:#}"
    );
    for (endpoint, probability) in &web {
        assert!(
            (probability - 1.0 / 3.0).abs() < 1e-6,
            "{endpoint} has probability {probability}:\n{report:#}"
        );
    }
    assert_eq!(report["outcome"]["masqueraded"], "none", "{report:#}");

    // The node itself to the same ClusterIP: masqueraded.
    let report = node.report(&["--to", "10.96.0.10:80/tcp"]);
    assert_eq!(report["origin"], "this-node");
    assert_eq!(shares(&report).len(), 3);
    assert_eq!(report["outcome"]["masqueraded"], "all", "{report:#}");

    // The load balancer IP from inside a source range reaches the shop's
    // endpoints, masqueraded (externalTrafficPolicy: Cluster); from
    // outside the ranges it is dropped.
    let report = node.report(&["--to", "203.0.113.10:443", "--from", "198.51.100.7"]);
    assert_eq!(
        shares(&report).keys().collect::<Vec<_>>(),
        ["10.244.1.4:8443", "10.244.2.3:8443"],
        "{report:#}"
    );
    assert_eq!(report["outcome"]["masqueraded"], "all", "{report:#}");
    let report = node.report(&["--to", "203.0.113.10:443", "--from", "192.0.2.1"]);
    assert_eq!(report["outcome"]["kind"], "drop", "{report:#}");

    // A Service without endpoints: rejected.
    let report = node.report(&["--to", "10.96.0.17:80"]);
    assert_eq!(report["outcome"]["kind"], "reject", "{report:#}");

    // No Service at that address.
    let report = node.report(&["--to", "192.0.2.99:80", "--from", "10.244.1.5"]);
    assert_eq!(report["outcome"]["kind"], "not-a-service", "{report:#}");

    // Each path names the rules it matched: the Service's dispatch and the
    // endpoint's DNAT.
    let report = node.report(&["--to", "10.96.0.10:80/tcp", "--from", "10.244.1.5"]);
    for path in report["paths"].as_array().unwrap() {
        let strings = |key: &str| -> Vec<String> {
            path[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_str().unwrap().to_owned())
                .collect()
        };
        let rules = strings("rules");
        let endpoint = path["endpoint"].as_str().unwrap();
        let dispatch = if mode == "iptables" {
            "-j KUBE-SVC-"
        } else {
            "services: ip daddr . meta l4proto . th dport vmap @service-ips"
        };
        assert!(rules.iter().any(|r| r.contains(dispatch)), "{rules:#?}");
        if data_layout {
            // The data layout: the group rule of counts 1 to 8, the class
            // rule of count 3 in its chain, and the elements of the entry
            // and the drawn slot.
            let draw = rules
                .iter()
                .find(|r| r.contains(" . numgen random mod "))
                .unwrap_or_else(|| panic!("no draw rule: {rules:#?}"));
            assert!(
                draw.starts_with("endpoints-by-count-tcp-1-8: ")
                    && draw.contains("@endpoint-count-3 ")
                    && draw.ends_with(" . numgen random mod 3 map @service-endpoints-tcp"),
                "{draw}"
            );
            let (ip, port) = endpoint.rsplit_once(':').unwrap();
            let element = "service-endpoints-tcp: 10.96.0.10 . 80 . ";
            let target = format!(" : {ip} . {port}");
            let elements = strings("elements");
            assert!(
                elements
                    .iter()
                    .any(|e| e.starts_with(element) && e.ends_with(&target)),
                "no element {element}SLOT{target}: {elements:#?}"
            );
            assert!(
                rules.iter().any(|r| r
                    == "endpoints-by-count-tcp: ip daddr . meta l4proto . th dport @endpoint-group-1-8 goto endpoints-by-count-tcp-1-8"),
                "{rules:#?}"
            );
            for set in ["endpoint-group-1-8", "endpoint-count-3"] {
                assert!(
                    elements.contains(&format!("{set}: 10.96.0.10 . tcp . 80")),
                    "{elements:#?}"
                );
            }
        } else {
            let dnat = if mode == "iptables" {
                format!("--to-destination {endpoint}")
            } else {
                format!("dnat to {endpoint}")
            };
            assert!(rules.iter().any(|r| r.ends_with(&dnat)), "{rules:#?}");
        }
        if mode == "nftables" {
            let elements = strings("elements");
            assert!(
                elements
                    .iter()
                    .any(|e| e.starts_with("service-ips: 10.96.0.10 . tcp . 80 : goto service-")),
                "{elements:#?}"
            );
        }
    }
    if data_layout {
        // The text for people says which count set, slot and element each
        // path drew.
        let output = node
            .ns
            .command(BIN)
            .args(["trace", "--to", "10.96.0.10:80/tcp", "--from", "10.244.1.5"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{text}");
        let (entry, map) = web_draw(&node.ns);
        // `drawn: the entry E is in endpoint-count-3, so slot S of 3 was
        // drawn: element E . S of map MAP holds the endpoint A`, one per
        // slot, each endpoint once.
        let mut drawn: Vec<(String, String)> = text
            .lines()
            .filter_map(|line| {
                let rest = line.trim().strip_prefix(&format!(
                    "drawn: the entry {entry} is in endpoint-count-3, so slot "
                ))?;
                let (slot, rest) = rest.split_once(" of 3 was drawn: element ")?;
                let endpoint = rest.strip_prefix(&format!(
                    "{entry} . {slot} of map {map} holds the endpoint "
                ))?;
                Some((slot.to_owned(), endpoint.to_owned()))
            })
            .collect();
        drawn.sort();
        let slots: Vec<&str> = drawn.iter().map(|(slot, _)| slot.as_str()).collect();
        assert_eq!(slots, ["0", "1", "2"], "{text}");
        let mut endpoints: Vec<&str> = drawn.iter().map(|(_, e)| e.as_str()).collect();
        endpoints.sort_unstable();
        assert_eq!(
            endpoints,
            ["10.244.1.2:8080", "10.244.1.3:8080", "10.244.2.2:8080"],
            "{text}"
        );
        // Every slot of the draw is a path of its own.
        let slots: Vec<&str> = report["paths"]
            .as_array()
            .unwrap()
            .iter()
            .map(|path| path["endpoint"].as_str().unwrap())
            .collect();
        assert_eq!(slots.len(), 3, "{report:#}");
    }

    // Session affinity, with the Service's timeout (600 s).
    let report = node.report(&["--to", "10.96.0.15:80", "--from", "10.244.1.5"]);
    assert_eq!(shares(&report).len(), 2, "{report:#}");
    for path in report["paths"].as_array().unwrap() {
        let affinity = path["affinity"].as_array().unwrap();
        assert!(!affinity.is_empty(), "{report:#}");
        assert!(affinity.iter().all(|a| a["seconds"] == 600), "{report:#}");
        if mode == "nftables" {
            // In either layout the client is looked up in, and recorded
            // in, the endpoints' own sets of clients.
            assert!(
                affinity.iter().all(|a| a["name"]
                    .as_str()
                    .is_some_and(|name| name.starts_with("affinity-") && name.contains("__"))),
                "{report:#}"
            );
        }
    }

    let after = node.rules();
    let changed: Vec<&str> = before
        .lines()
        .filter(|line| !after.lines().any(|l| l == *line))
        .chain(
            after
                .lines()
                .filter(|line| !before.lines().any(|l| l == *line)),
        )
        .collect();
    assert!(
        changed.is_empty(),
        "kube-proxy trace changed the rules: {changed:#?}"
    );
}

#[test]
fn trace_reads_the_iptables_legacy_rules() {
    traces_the_examples(&node("iptables", Some("legacy")));
}

#[test]
fn trace_reads_the_iptables_nft_rules() {
    traces_the_examples(&node("iptables", Some("nft")));
}

#[test]
fn trace_reads_the_nftables_table() {
    traces_the_examples(&nftables_node("chains"));
}

#[test]
fn trace_reads_the_nftables_table_in_the_data_layout() {
    traces_the_examples(&nftables_node("data"));
}

#[test]
fn trace_without_rules_or_with_a_bad_destination_says_why() {
    require_root();
    let ns = Netns::create("trace-empty").unwrap();
    let output = ns
        .command(BIN)
        .args(["trace", "--to", "10.96.0.10:80"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no kube-proxy rules"), "{stderr}");
    assert!(stderr.contains("--proxy-mode"), "{stderr}");

    let output = ns
        .command(BIN)
        .args(["trace", "--to", "10.96.0.10"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("ADDRESS:PORT"), "{stderr}");
}

/// The connections `kube-proxy check` probes for the example manifests.
const EXAMPLE_CONNECTIONS: usize = 28;

/// `kube-proxy check` finds the kernel as the model says; after
/// `break_it` damaged the rules behind the stopped proxy's back, it exits 1
/// and prints one line per damaged connection: `damaged` lines in all,
/// each starting with one of `prefixes` (every line when `prefixes` is
/// empty).
fn check_reports_the_damage(
    mut node: Node,
    break_it: &dyn Fn(&Netns),
    damaged: usize,
    prefixes: &[&str],
) {
    let (code, stdout, stderr) = node.check();
    assert_eq!(code, Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("IPv4:"))
        .unwrap_or_else(|| panic!("no IPv4 line:\n{stdout}"));
    let checked: usize = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    // Every example Service port's ClusterIP at least, and its other
    // addresses, and for each port with an endpoint on this node that
    // endpoint reaching its own Service: 11 service ports, 28 connections.
    assert_eq!(checked, EXAMPLE_CONNECTIONS, "{stdout}");
    assert!(line.ends_with(": 0 different"), "{stdout}");

    node.stop_proxy();
    break_it(&node.ns);
    let stdout = failed_check(&node);
    let different = different_lines(&stdout);
    assert_eq!(different.len(), damaged, "{stdout}");
    for line in &different {
        assert!(
            prefixes.is_empty() || prefixes.iter().any(|p| line.starts_with(p)),
            "{stdout}"
        );
    }
    assert!(
        stdout.contains(&format!(": {damaged} different")),
        "{stdout}"
    );
}

/// Damage to `demo/web`'s ClusterIP: its connection from outside and its
/// endpoint 10.244.1.2 reaching it (hairpin) differ.
fn checks_the_examples(node: Node, break_it: &dyn Fn(&Netns)) {
    check_reports_the_damage(
        node,
        break_it,
        2,
        &["DIFFERENT demo/web:http cluster IP 10.96.0.10:80/tcp"],
    );
}

/// `kube-proxy check` in `node`, which must find differences (exit 1):
/// its stdout.
#[track_caller]
fn failed_check(node: &Node) -> String {
    let (code, stdout, stderr) = node.check();
    assert_eq!(code, Some(1), "stdout:\n{stdout}\nstderr:\n{stderr}");
    stdout
}

/// The `DIFFERENT …` lines of a check's output.
fn different_lines(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter(|l| l.starts_with("DIFFERENT"))
        .collect()
}

/// The example connections the model DNATs (all but the rejected
/// `demo/empty` ClusterIP and the `demo/shop` load balancer IP refused to
/// a client outside its source ranges), the 10 hairpin ones among them.
const DNAT_CONNECTIONS: usize = 26;

#[test]
fn check_finds_a_flushed_iptables_nat_table() {
    // The filter table's REJECT and firewall rules stay: only the
    // connections that needed nat differ.
    check_reports_the_damage(
        node("iptables", Some("legacy")),
        &|ns| {
            ns.exec_ok("iptables-legacy", &["-t", "nat", "-F"]);
        },
        DNAT_CONNECTIONS,
        &[],
    );
}

#[test]
fn check_finds_a_flushed_nftables_table() {
    check_reports_the_damage(
        nftables_node("chains"),
        &|ns| {
            ns.exec_ok("nft", &["flush", "table", "ip", "kube-proxy"]);
        },
        EXAMPLE_CONNECTIONS,
        &[],
    );
}

#[test]
fn check_finds_a_deleted_nftables_table() {
    check_reports_the_damage(
        nftables_node("chains"),
        &|ns| {
            ns.exec_ok("nft", &["delete", "table", "ip", "kube-proxy"]);
        },
        EXAMPLE_CONNECTIONS,
        &[],
    );
}

#[test]
fn check_finds_a_deleted_iptables_rule() {
    checks_the_examples(node("iptables", Some("legacy")), &|ns| {
        ns.exec_ok(
            "iptables-legacy",
            &[
                "-t",
                "nat",
                "-D",
                "KUBE-SERVICES",
                "-d",
                "10.96.0.10/32",
                "-p",
                "tcp",
                "-m",
                "comment",
                "--comment",
                "demo/web:http cluster IP",
                "-m",
                "tcp",
                "--dport",
                "80",
                "-j",
                "KUBE-SVC-XRY76EGRC3BSCIIJ",
            ],
        );
    });
}

#[test]
fn check_finds_a_deleted_nftables_map_element() {
    checks_the_examples(nftables_node("chains"), &|ns| {
        ns.exec_ok(
            "nft",
            &[
                "delete",
                "element",
                "ip",
                "kube-proxy",
                "service-ips",
                "{ 10.96.0.10 . tcp . 80 }",
            ],
        );
    });
}

#[test]
fn check_finds_a_flushed_nftables_table_in_the_data_layout() {
    check_reports_the_damage(
        nftables_node("data"),
        &|ns| {
            ns.exec_ok("nft", &["flush", "table", "ip", "kube-proxy"]);
        },
        EXAMPLE_CONNECTIONS,
        &[],
    );
}

/// The data layout's slots of `demo/web:http` (10.96.0.10:80/tcp), read
/// from `nft list`: its slot map and the key of slot 0 there.
fn web_draw(ns: &Netns) -> (String, String) {
    let map = "service-endpoints-tcp";
    let listing = ns.exec_ok("nft", &["list", "map", "ip", "kube-proxy", map]);
    assert!(
        listing.contains("10.96.0.10 . 80 . 0 : "),
        "no slot 0 of 10.96.0.10:80 in {map}:\n{listing}"
    );
    ("10.96.0.10 . 80".to_owned(), map.to_owned())
}

#[test]
fn check_finds_a_deleted_service_endpoints_element() {
    checks_the_examples(nftables_node("data"), &|ns| {
        let (entry, map) = web_draw(ns);
        // `nft delete element` fails on an element that is not there.
        ns.exec_ok(
            "nft",
            &[
                "delete",
                "element",
                "ip",
                "kube-proxy",
                &map,
                &format!("{{ {entry} . 0 }}"),
            ],
        );
    });
}

#[test]
fn check_finds_a_wrong_slot_target() {
    checks_the_examples(nftables_node("data"), &|ns| {
        let (entry, map) = web_draw(ns);
        let element = format!("{{ {entry} . 1 }}");
        ns.exec_ok(
            "nft",
            &["delete", "element", "ip", "kube-proxy", &map, &element],
        );
        // Slot 1 now sends one in three connections to an address that
        // is no endpoint of the Service.
        let wrong = format!("{{ {entry} . 1 : 10.244.9.9 . 8080 }}");
        ns.exec_ok("nft", &["add", "element", "ip", "kube-proxy", &map, &wrong]);
    });
}

/// The worker the running proxy starts for its state checks: probes in,
/// differences out. In a namespace without rules (no iptables rules, no
/// nftables table), a connection the model DNATs is not handled by the
/// kernel; bad input is an error, not an empty answer.
#[test]
fn the_state_check_worker_names_what_the_kernel_misses() {
    require_root();
    let ns = Netns::create("worker").unwrap();
    let run = |mode: &str, input: &str| state_check_worker(&ns, mode, input);
    let probes = r#"[{"namespace":"ns","name":"web","port":"http","protocol":"TCP",
        "frontend":"cluster IP","destination":"10.96.0.10:80","source":"192.0.2.1",
        "expected":{"kind":"endpoints","endpoints":["10.244.1.2:8080"],"masquerade":null}}]"#;
    let output = run("iptables", probes);
    assert!(output.status.success(), "{output:?}");
    let found: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(found[0]["index"], 0, "{found}");
    assert_eq!(
        found[0]["found"], "not handled (no rule for this address and port)",
        "{found}"
    );
    assert_eq!(found.as_array().unwrap().len(), 1, "{found}");

    let output = run("iptables", "[{\"namespace\": 1}]");
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(!output.stderr.is_empty(), "{output:?}");
    // No nftables table at all: every connection is drift.
    let output = run("nftables", probes);
    assert!(output.status.success(), "{output:?}");
    let found: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(found.as_array().unwrap().len(), 1, "{found}");
}

/// The running proxy's own state check finds a rule of other software
/// that keeps a Service's connections from its rules, logs it, counts the
/// Service, and has the rules rewritten at once; once the rule is gone,
/// the next check finds the kernel as the model says.
#[test]
fn the_running_proxy_reports_drift_and_rewrites_its_rules() {
    let node = node_with(
        "iptables",
        None,
        Some("legacy"),
        &[
            "--state-check-interval",
            "1s",
            "--iptables-sync-period",
            "2s",
        ],
    );
    let metrics = || {
        node.ns
            .run(|| kp_testkit::http::get(("127.0.0.1", 10249), "/metrics"))
            .map(|reply| reply.body)
            .unwrap_or_default()
    };
    let log = || std::fs::read_to_string(&node.log).unwrap_or_default();
    let drift = |services: u32| {
        format!("kubeproxy_rs_state_drift_services{{ip_family=\"IPv4\"}} {services}\n")
    };
    let mut last = String::new();
    let clean = wait_until(Duration::from_secs(20), || {
        last = metrics();
        last.contains(&drift(0))
    });
    assert!(clean, "no clean state check:\n{last}\n{}", log());

    // Other software accepts web's ClusterIP before the proxy's rules see it.
    let foreign = [
        "-t",
        "nat",
        "PREROUTING",
        "-d",
        "10.96.0.10/32",
        "-p",
        "tcp",
        "--dport",
        "80",
        "-j",
        "ACCEPT",
    ];
    let rule = |action: &'static str| {
        let mut args = foreign.to_vec();
        args.insert(2, action);
        args
    };
    node.ns.exec_ok("iptables-legacy", &rule("-I"));
    let found = wait_until(Duration::from_secs(20), || {
        last = metrics();
        last.contains(&drift(1))
    });
    assert!(found, "the drift was not counted:\n{last}\n{}", log());
    let text = log();
    assert!(
        text.contains("The kernel's rules differ from what the proxy programmed; rewriting them")
            && text.contains("demo/web:http cluster IP 10.96.0.10:80/tcp"),
        "{text}"
    );
    let rewritten = wait_until(Duration::from_secs(10), || {
        log().contains("Rewriting the proxy rules whole")
    });
    assert!(rewritten, "no rewrite after the drift:\n{}", log());

    node.ns.exec_ok("iptables-legacy", &rule("-D"));
    let clean = wait_until(Duration::from_secs(20), || {
        last = metrics();
        last.contains(&drift(0))
    });
    assert!(clean, "the drift stayed counted:\n{last}\n{}", log());
    assert!(log().contains("The kernel's rules match the model again"));
}

/// The running proxy in the data layout: its state check finds a correct
/// table clean, and one `service-endpoints-…` element deleted behind its
/// back is put back by its next full sync.
#[test]
fn the_running_proxy_finds_the_data_layout_clean_and_repairs_a_deleted_element() {
    let node = node_with(
        "nftables",
        Some("data"),
        None,
        &[
            "--state-check-interval",
            "1s",
            "--iptables-sync-period",
            "2s",
        ],
    );
    let metrics = || {
        node.ns
            .run(|| kp_testkit::http::get(("127.0.0.1", 10249), "/metrics"))
            .map(|reply| reply.body)
            .unwrap_or_default()
    };
    let log = || std::fs::read_to_string(&node.log).unwrap_or_default();
    let mut last = String::new();
    let clean = wait_until(Duration::from_secs(20), || {
        last = metrics();
        last.contains("kubeproxy_rs_state_drift_services{ip_family=\"IPv4\"} 0\n")
    });
    assert!(clean, "no clean state check:\n{last}\n{}", log());

    let (entry, map) = web_draw(&node.ns);
    let element = format!("{{ {entry} . 2 }}");
    node.ns.exec_ok(
        "nft",
        &["delete", "element", "ip", "kube-proxy", &map, &element],
    );
    let mut listing = String::new();
    let repaired = wait_until(Duration::from_secs(10), || {
        listing = node
            .ns
            .exec_ok("nft", &["list", "map", "ip", "kube-proxy", &map]);
        listing.contains(&format!("{entry} . 2 : "))
    });
    assert!(
        repaired,
        "the element was not put back:\n{listing}\n{}",
        log()
    );
    assert!(
        !log().contains("differ from what the proxy programmed"),
        "drift reported on a correct table:\n{}",
        log()
    );
}

/// Hairpin in the data layout: an endpoint reaching itself through its
/// Service is masqueraded on the path drawn to itself only, by its pair in
/// `hairpin-endpoints`; with the pair removed behind the stopped proxy's
/// back, `trace` shows that path no longer masqueraded, and `check`
/// (which probes each Service from one of its endpoints on this node too)
/// names that connection alone.
#[test]
fn trace_shows_a_removed_hairpin_endpoints_pair() {
    let mut node = nftables_node("data");
    node.stop_proxy();
    let masqueraded = |node: &Node| -> BTreeMap<String, bool> {
        let report = node.report(&["--to", "10.96.0.10:80/tcp", "--from", "10.244.1.2"]);
        report["paths"]
            .as_array()
            .unwrap()
            .iter()
            .map(|path| {
                (
                    path["endpoint"].as_str().unwrap().to_owned(),
                    path["masqueraded"].as_bool().unwrap(),
                )
            })
            .collect()
    };
    let expected = |hairpin: bool| -> BTreeMap<String, bool> {
        [
            ("10.244.1.2:8080".to_owned(), hairpin),
            ("10.244.1.3:8080".to_owned(), false),
            ("10.244.2.2:8080".to_owned(), false),
        ]
        .into()
    };
    assert_eq!(masqueraded(&node), expected(true));
    node.ns.exec_ok(
        "nft",
        &[
            "delete",
            "element",
            "ip",
            "kube-proxy",
            "hairpin-endpoints",
            "{ 10.244.1.2 . 10.244.1.2 }",
        ],
    );
    assert_eq!(masqueraded(&node), expected(false));
    let stdout = failed_check(&node);
    let different = different_lines(&stdout);
    // The pair serves every Service 10.244.1.2 is an endpoint of, but
    // demo/sticky (ClientIP affinity: its endpoint chains masquerade their
    // own hairpin connections): each of their hairpin connections, and no
    // other, differs.
    let services: Vec<&str> = different
        .iter()
        .filter_map(|line| line.strip_prefix("DIFFERENT "))
        .filter_map(|line| line.split(' ').next())
        .collect();
    assert_eq!(
        services,
        ["demo/web:http", "demo/web-nodeport:http"],
        "{stdout}"
    );
    for line in &different {
        assert!(
            line.contains(" from 10.244.1.2: the model says DNAT to one of {")
                && line.contains("}, masqueraded back to 10.244.1.2; the nftables rules: DNAT")
                && line.ends_with("}, not masqueraded"),
            "{stdout}"
        );
    }
}

/// Runs the running proxy's state-check worker (`__state-check MODE
/// IPv4`) in `ns` on `input`.
fn state_check_worker(ns: &Netns, mode: &str, input: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = ns
        .command(BIN)
        .args(["__state-check", mode, "IPv4"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// The state check's worker reads the data layout: `demo/web`'s ClusterIP
/// is as the model says on the table the proxy left; with one slot's
/// element deleted, or its target changed, it names the connection.
#[test]
fn the_state_check_worker_finds_damage_to_the_data_layout() {
    let mut node = nftables_node("data");
    node.stop_proxy();
    let probes = r#"[{"namespace":"demo","name":"web","port":"http","protocol":"TCP",
        "frontend":"cluster IP","destination":"10.96.0.10:80","source":"10.244.1.5",
        "expected":{"kind":"endpoints","endpoints":["10.244.1.2:8080","10.244.1.3:8080","10.244.2.2:8080"],
        "masquerade":false}}]"#;
    let differences = || {
        let output = state_check_worker(&node.ns, "nftables", probes);
        assert!(output.status.success(), "{output:?}");
        serde_json::from_slice::<Value>(&output.stdout).unwrap()
    };
    let found = differences();
    assert_eq!(found, Value::Array(Vec::new()), "{found}");

    let (entry, map) = web_draw(&node.ns);
    let slot = |n: u32| format!("{{ {entry} . {n} }}");
    node.ns.exec_ok(
        "nft",
        &["delete", "element", "ip", "kube-proxy", &map, &slot(0)],
    );
    let found = differences();
    assert_eq!(found.as_array().unwrap().len(), 1, "{found}");
    assert_eq!(found[0]["index"], 0, "{found}");
    assert_eq!(found[0]["found"], "paths that end differently", "{found}");

    // Slot 0 back to its endpoint, slot 1 to an address that is none.
    let element = format!("{{ {entry} . 0 : 10.244.1.2 . 8080 }}");
    node.ns.exec_ok(
        "nft",
        &["add", "element", "ip", "kube-proxy", &map, &element],
    );
    assert_eq!(differences(), Value::Array(Vec::new()));
    node.ns.exec_ok(
        "nft",
        &["delete", "element", "ip", "kube-proxy", &map, &slot(1)],
    );
    let wrong = format!("{{ {entry} . 1 : 10.244.9.9 . 8080 }}");
    node.ns
        .exec_ok("nft", &["add", "element", "ip", "kube-proxy", &map, &wrong]);
    let found = differences();
    assert_eq!(found.as_array().unwrap().len(), 1, "{found}");
    let text = found[0]["found"].as_str().unwrap();
    assert!(text.contains("10.244.9.9:8080"), "{found}");
}

/// The userspace mode: `trace` finds the portal rule and the relay's
/// routing table (its mode found without `--proxy-mode`), `check` agrees
/// with the model, the running proxy's own check too, and a portal rule
/// deleted behind the proxy's back is named alone.
#[test]
fn trace_and_check_read_the_userspace_relay() {
    let mut node = node("userspace", Some("legacy"));
    let report = node.report(&["--to", "10.96.0.10:80/tcp", "--from", "10.244.1.5"]);
    assert_eq!(report["mode"], "userspace", "{report:#}");
    let web = shares(&report);
    assert_eq!(
        web.keys().collect::<Vec<_>>(),
        ["10.244.1.2:8080", "10.244.1.3:8080", "10.244.2.2:8080"],
        "{report:#}"
    );
    assert!(
        web.values().all(|p| (p - 1.0 / 3.0).abs() < 1e-6),
        "{report:#}"
    );
    let report = node.report(&["--to", "10.96.0.17:80"]);
    assert_eq!(report["outcome"]["kind"], "reject", "{report:#}");

    let mut metrics = String::new();
    let checked = wait_until(Duration::from_secs(20), || {
        metrics = node
            .ns
            .run(|| kp_testkit::http::get(("127.0.0.1", 10249), "/metrics"))
            .map(|reply| reply.body)
            .unwrap_or_default();
        metrics.contains("kubeproxy_rs_state_drift_services{ip_family=\"IPv4\"} 0")
    });
    assert!(checked, "no state check reported:\n{metrics}");

    let (code, stdout, stderr) = node.check();
    assert_eq!(code, Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("IPv4: 28 connections to 11 service ports checked against the userspace rules: 0 different"),
        "{stdout}"
    );

    node.stop_proxy();
    let listing = node.ns.exec_ok(
        "iptables-legacy",
        &[
            "-t",
            "nat",
            "-L",
            "KUBE-PORTALS-CONTAINER",
            "-n",
            "--line-numbers",
        ],
    );
    let number = listing
        .lines()
        .find(|line| line.contains("10.96.0.10") && line.contains("dpt:80"))
        .and_then(|line| line.split_whitespace().next())
        .unwrap_or_else(|| panic!("no portal rule of demo/web:\n{listing}"))
        .to_owned();
    node.ns.exec_ok(
        "iptables-legacy",
        &["-t", "nat", "-D", "KUBE-PORTALS-CONTAINER", &number],
    );
    let stdout = failed_check(&node);
    let different = different_lines(&stdout);
    // From outside, and from its endpoint 10.244.1.2 (hairpin).
    assert_eq!(different.len(), 2, "{stdout}");
    for line in different {
        assert!(
            line.starts_with("DIFFERENT demo/web:http cluster IP 10.96.0.10:80/tcp"),
            "{stdout}"
        );
    }
}
