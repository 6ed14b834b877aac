//! The `kube-proxy` binary facing hostile and broken manifests: names that
//! try to inject rules are rejected with the API server's messages and no
//! foreign rule reaches the kernel; a typo in a live manifest keeps the
//! Service working until it is fixed, in a directory with symbolic link
//! loops.
//!
//! Address plan: kp-testkit's (pods ep1 10.244.1.2, ep2 10.244.1.3, node
//! 192.168.99.2). Service demo/web is 10.96.0.41:80 → ep1:8080; demo/api
//! 10.96.0.42:80 → ep1:8080; hostile Services take 10.96.0.51–54.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::{self, File};
use std::net::SocketAddr;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use kp_testkit::files::write_atomically;
use kp_testkit::netns::{connect, require_root, wait_until, Netns, NsChild, Topology};
use serde_json::{json, Value};

/// A name that would close an iptables comment and add a rule of its own.
const INJECTION: &str = "x\" -j ACCEPT\n-A INPUT -j ACCEPT\n# with spaces";

const WEB_YAML: &str = "apiVersion: v1
kind: Service
metadata: {namespace: demo, name: web}
spec:
  clusterIP: 10.96.0.41
  ports: [{name: http, port: 80, targetPort: 8080}]
";

fn at(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

fn service(namespace: &str, name: &str, cluster_ip: &str, ports: &[&str]) -> Value {
    let ports: Vec<Value> = ports
        .iter()
        .enumerate()
        .map(|(i, name)| json!({"name": name, "port": 80 + i, "targetPort": 8080}))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"clusterIP": cluster_ip, "ports": ports}
    })
}

fn slice(name: &str, service: &str, port: &str) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": "demo", "name": name,
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": port, "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["10.244.1.2"], "conditions": {"ready": true}, "nodeName": "node-1"}]
    })
}

fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
}

/// The proxy running in the node namespace, its output in a file.
struct Proxy {
    _child: NsChild,
    log: PathBuf,
}

impl Proxy {
    fn start(node: &Netns, manifests: &Path, log_dir: &Path) -> Self {
        let log = log_dir.join("proxy.log");
        let mut command = node.command(env!("CARGO_BIN_EXE_kube-proxy"));
        command
            .args(["--manifests", manifests.to_str().unwrap()])
            .args(["--hostname-override", "node-1"])
            .args(["--cluster-cidr", "10.244.0.0/16"])
            .args(["--iptables-min-sync-period", "0s"])
            .stdin(Stdio::null())
            .stdout(File::create(log_dir.join("proxy.out")).unwrap())
            .stderr(File::create(&log).unwrap());
        let child = NsChild::spawn(&mut command).unwrap();
        Self { _child: child, log }
    }

    fn output(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

fn write_json(dir: &Path, name: &str, value: &Value) {
    fs::write(dir.join(name), serde_json::to_string_pretty(value).unwrap()).unwrap();
}

/// Every rule of `table` that is not one of the proxy's: a rule in a chain
/// not named `KUBE-…` that does not jump to one.
fn foreign_rules(node: &Netns, table: &str) -> Vec<String> {
    let saved = node.exec_ok("iptables-save", &["-t", table]);
    saved
        .lines()
        .filter(|line| line.starts_with("-A "))
        .filter(|line| {
            let chain = line.split_whitespace().nth(1).unwrap_or_default();
            !chain.starts_with("KUBE-") && !line.contains(" -j KUBE-")
        })
        .map(str::to_owned)
        .collect()
}

/// Symbolic links that lead back into `dir`: to itself, to its parent from
/// a subdirectory, and two subdirectories linking to each other.
fn link_loops(dir: &Path) {
    for sub in ["a", "b"] {
        fs::create_dir(dir.join(sub)).unwrap();
    }
    symlink(".", dir.join("self")).unwrap();
    symlink("..", dir.join("a/up")).unwrap();
    symlink("../b", dir.join("a/to-b")).unwrap();
    symlink("../a", dir.join("b/to-a")).unwrap();
}

#[test]
fn hostile_names_are_rejected_and_inject_no_rule() {
    require_root();
    let cluster = Topology::builder()
        .pod("ep1", |p| p.tcp(8080))
        .pod("ep2", |p| p.tcp(8080))
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    fs::create_dir(&manifests).unwrap();
    write_json(
        &manifests,
        "web.json",
        &service("demo", "web", "10.96.0.41", &["http"]),
    );
    write_json(&manifests, "web-1.json", &slice("web-1", "web", "http"));
    let long = "a".repeat(300);
    let node_name = format!("node-1\n{INJECTION}");
    // Each hostile object, the field that holds its hostile name, and that name.
    let hostile: [(Value, &str, &str); 8] = [
        (
            service("demo", INJECTION, "10.96.0.51", &["http"]),
            "metadata.name",
            INJECTION,
        ),
        (
            service(INJECTION, "web2", "10.96.0.52", &["http"]),
            "metadata.namespace",
            INJECTION,
        ),
        (
            service("demo", "web3", "10.96.0.53", &[INJECTION, "b"]),
            "spec.ports[0].name",
            INJECTION,
        ),
        (
            service("demo", &long, "10.96.0.54", &["http"]),
            "metadata.name",
            &long,
        ),
        (slice(INJECTION, "web", "http"), "metadata.name", INJECTION),
        (slice("web-2", "web", INJECTION), "ports[0].name", INJECTION),
        (
            slice("web-3", INJECTION, "http"),
            "metadata.labels[kubernetes.io/service-name]",
            INJECTION,
        ),
        (node(&node_name), "metadata.name", &node_name),
    ];
    for (i, (object, _, _)) in hostile.iter().enumerate() {
        write_json(&manifests, &format!("hostile-{i}.json"), object);
    }

    let proxy = Proxy::start(cluster.node(), &manifests, dir.path());
    let (client, web) = (cluster.pod("ep2"), at("10.96.0.41:80"));
    let up = wait_until(Duration::from_secs(15), || connect(client, web).is_ok());
    assert!(
        up,
        "the normal Service carries traffic:\n{}",
        proxy.output()
    );
    assert_eq!(connect(client, web).unwrap().backend, "ep1");

    for table in ["filter", "nat", "mangle"] {
        let foreign = foreign_rules(cluster.node(), table);
        assert_eq!(
            foreign,
            Vec::<String>::new(),
            "foreign rules in the {table} table"
        );
    }
    let rejected = |i: usize, field: &str, value: &str| {
        let shown: String = value.chars().take(100).collect();
        // The error text names the value as `{:?}` writes it; the log line
        // quotes the whole error as klog (Go's `%q`) does.
        let needle = format!("{field}: Invalid value: {shown:?}")
            .replace('\\', "\\\\")
            .replace('"', "\\\"");
        let file = format!("hostile-{i}.json:");
        proxy
            .output()
            .lines()
            .any(|line| line.contains(&file) && line.contains(&needle))
    };
    for (i, (_, field, value)) in hostile.iter().enumerate() {
        let logged = wait_until(Duration::from_secs(5), || rejected(i, field, value));
        assert!(
            logged,
            "hostile-{i}.json is rejected naming {field}:\n{}",
            proxy.output()
        );
    }
    for ip in ["10.96.0.51", "10.96.0.52", "10.96.0.53", "10.96.0.54"] {
        let rules = cluster.node().exec_ok("iptables-save", &["-t", "nat"]);
        assert!(!rules.contains(ip), "a rejected Service got rules: {ip}");
    }
}

#[test]
fn a_typo_in_a_live_manifest_keeps_the_service_until_it_is_fixed() {
    require_root();
    let cluster = Topology::builder()
        .pod("ep1", |p| p.tcp(8080))
        .pod("ep2", |p| p.tcp(8080))
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    fs::create_dir(&manifests).unwrap();
    let web_file = manifests.join("web.yaml");
    fs::write(&web_file, WEB_YAML).unwrap();
    write_json(&manifests, "web-1.json", &slice("web-1", "web", "http"));
    link_loops(&manifests);
    let proxy = Proxy::start(cluster.node(), &manifests, dir.path());
    let (client, web) = (cluster.pod("ep2"), at("10.96.0.41:80"));
    let up = wait_until(Duration::from_secs(15), || connect(client, web).is_ok());
    assert!(up, "the Service carries traffic:\n{}", proxy.output());

    // A typo on line 6 (an unclosed flow mapping).
    write_atomically(&web_file, &WEB_YAML.replace("ports: [{", "ports: [{{"));
    let located = format!("{}:6 (document 0): malformed YAML", web_file.display());
    let logged = wait_until(Duration::from_secs(10), || {
        proxy.output().contains(&located)
    });
    assert!(
        logged,
        "the problem is logged with file and line:\n{}",
        proxy.output()
    );

    // Another Service added after the typo: once it carries traffic, every
    // change read with or before it has been applied.
    write_json(
        &manifests,
        "api.json",
        &service("demo", "api", "10.96.0.42", &["http"]),
    );
    write_json(&manifests, "api-1.json", &slice("api-1", "api", "http"));
    let api_up = wait_until(Duration::from_secs(10), || {
        connect(client, at("10.96.0.42:80")).is_ok()
    });
    assert!(
        api_up,
        "the new Service carries traffic:\n{}",
        proxy.output()
    );
    assert_eq!(
        connect(client, web)
            .map(|reply| reply.backend)
            .ok()
            .as_deref(),
        Some("ep1"),
        "the Service with the typo still carries traffic"
    );

    // Fixed, with a new port: the change is applied.
    write_atomically(&web_file, &WEB_YAML.replace("port: 80,", "port: 81,"));
    let moved = wait_until(Duration::from_secs(10), || {
        connect(client, at("10.96.0.41:81")).is_ok()
    });
    assert!(
        moved,
        "the fixed Service answers on its new port:\n{}",
        proxy.output()
    );
}
