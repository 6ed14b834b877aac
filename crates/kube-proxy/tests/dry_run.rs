//! `--dry-run` in iptables mode: the printed rules are exactly what the
//! kernel accepts. The output is loaded with iptables-restore (legacy and
//! nft) into network namespaces the harness creates and removes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use kp_testkit::netns::{require_root, Netns};

/// Runs `program args` inside `ns` with `stdin` as its input.
fn exec(ns: &Netns, program: &str, args: &[&str], stdin: &str) -> Output {
    let mut child = ns
        .command(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {program}: {e} (apt-get install iptables)"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn dry_run_output() -> String {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let out = Command::new(env!("CARGO_BIN_EXE_kube-proxy"))
        .args(["--manifests", examples.to_str().unwrap()])
        .args([
            "--hostname-override",
            "node-1",
            "--cluster-cidr",
            "10.244.0.0/16",
        ])
        .arg("--dry-run")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The restore input printed for one family (the lines after its header).
fn section(output: &str, header: &str) -> String {
    let mut lines = output.lines().skip_while(|l| !l.starts_with(header));
    assert!(
        lines.next().is_some(),
        "no {header:?} section in:\n{output}"
    );
    lines
        .take_while(|l| !l.starts_with("# "))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn dry_run_prints_rules_both_iptables_backends_accept() {
    let output = dry_run_output();
    assert!(output.contains("-A KUBE-SERVICES -m comment --comment \"demo/web:http cluster IP\""));
    assert!(output.contains("demo/empty:http has no endpoints"));
    let v4 = section(&output, "# IPv4 iptables-restore input");
    let v6 = section(&output, "# IPv6 ip6tables-restore input");
    require_root();
    for flavor in ["legacy", "nft"] {
        let ns = Netns::create(&format!("dry-{flavor}")).unwrap();
        let restore = |cmd: &str, text: &str| {
            let out = exec(&ns, cmd, &["--noflush"], text);
            assert!(
                out.status.success(),
                "{cmd} rejected the dry-run output: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        // The commands printed before the restore inputs create the chains
        // they need and do not declare (kubelet's KUBE-FIREWALL).
        for command in output.lines().filter_map(|l| l.strip_prefix("# ")) {
            let mut words = command.split(' ');
            let program = words.next().unwrap();
            if program == "iptables" || program == "ip6tables" {
                let args: Vec<&str> = words.collect();
                let out = exec(&ns, &format!("{program}-{flavor}"), &args, "");
                assert!(out.status.success(), "{command}: {out:?}");
            }
        }
        restore(&format!("iptables-{flavor}-restore"), &v4);
        restore(&format!("ip6tables-{flavor}-restore"), &v6);
        let saved = exec(&ns, &format!("iptables-{flavor}-save"), &["-t", "nat"], "");
        let saved = String::from_utf8(saved.stdout).unwrap();
        let chains = saved
            .lines()
            .filter(|l| l.starts_with(":KUBE-SVC-"))
            .count();
        assert_eq!(
            chains, 10,
            "one KUBE-SVC chain per service port with endpoints:\n{saved}"
        );
    }
}

/// `--dry-run` with `args` on the example manifests, or with `manifests`.
fn dry_run_with(manifests: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kube-proxy"))
        .args(["--manifests", manifests.to_str().unwrap()])
        .args(["--hostname-override", "node-1", "--dry-run"])
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn node_cidr_detection_uses_the_nodes_pod_cidrs() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");

    let out = dry_run_with(&examples, &["--detect-local-mode", "NodeCIDR"]);

    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // examples/node.yaml: podCIDRs [10.244.1.0/24]; traffic from elsewhere
    // to a ClusterIP is masqueraded.
    assert!(
        stdout.contains("! -s 10.244.1.0/24 -j KUBE-MARK-MASQ"),
        "{stdout}"
    );
}

#[test]
fn node_cidr_detection_without_a_node_says_what_it_waits_for() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        examples.join("services.yaml"),
        dir.path().join("services.yaml"),
    )
    .unwrap();

    let out = dry_run_with(dir.path(), &["--detect-local-mode", "NodeCIDR"]);

    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("the Node's spec.podCIDRs"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn the_nftables_layout_flag_chooses_how_endpoints_are_written() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let printed = |args: &[&str]| {
        let out = dry_run_with(&examples, args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let chains = printed(&["--proxy-mode", "nftables", "--nftables-layout", "chains"]);
    let data = printed(&["--proxy-mode", "nftables", "--nftables-layout", "data"]);
    // The data layout is the default.
    assert_eq!(printed(&["--proxy-mode", "nftables"]), data);
    let service_chains = |text: &str| {
        text.lines()
            .filter(|l| l.starts_with("add chain ip kube-proxy service-"))
            .count()
    };
    assert!(service_chains(&chains) > 0, "{chains}");
    assert_eq!(service_chains(&chains), service_chains(&data), "{data}");
    assert!(
        chains.contains("add chain ip kube-proxy endpoint-"),
        "{chains}"
    );
    assert!(!chains.contains("service-endpoints-tcp"), "{chains}");
    assert!(
        data.contains("add map ip kube-proxy service-endpoints-tcp "),
        "{data}"
    );
    assert!(
        data.contains(
            "add rule ip kube-proxy endpoints-by-count-tcp-1-8 ip daddr . meta l4proto . th dport @endpoint-count-"
        ),
        "{data}"
    );
    // Only the Service with ClientIP affinity (demo/sticky) keeps its
    // endpoint chains, as upstream writes them.
    let endpoint_chains: Vec<&str> = data
        .lines()
        .filter(|l| l.starts_with("add chain ip kube-proxy endpoint-"))
        .collect();
    assert!(!endpoint_chains.is_empty(), "{data}");
    assert!(
        endpoint_chains.iter().all(|l| l.contains("-demo/sticky/")),
        "{endpoint_chains:#?}"
    );

    let refused = dry_run_with(
        &examples,
        &["--proxy-mode", "nftables", "--nftables-layout", "maps"],
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(stderr.contains("--nftables-layout"), "{stderr}");
}
