//! The proxy's main job on the example cluster, in a throwaway set of
//! network namespaces: pods with echo servers, a node running `kube-proxy
//! --manifests examples/`, and a client outside the node. Traffic goes to
//! each kind of Service address and the answering backends are shown.
//! Everything is removed at the end. Needs root; touches nothing outside the
//! namespaces it creates.
//!
//! Run it with `scripts/demo`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use kp_testkit::netns::{connect, hits, udp_roundtrip, wait_until, NsChild, Topology};

/// How long the proxy may take to program the first Service.
const READY_TIMEOUT: Duration = Duration::from_secs(15);

/// The pods of `examples/endpointslices.yaml`, in the order that gives them
/// their addresses (local pods 10.244.1.2…, remote pods 10.244.2.2…).
fn example_cluster() -> Result<Topology, String> {
    Topology::builder()
        .pod("web-1", |p| p.tcp(8080))
        .pod("web-2", |p| p.tcp(8080))
        .pod("shop-1", |p| p.tcp(8443))
        .pod("api-1", |p| p.tcp(8080))
        .pod("legacy-1", |p| p.tcp(8080))
        .pod("multi-1", |p| p.tcp(8080).tcp(9090))
        .pod("dns-1", |p| p.udp(5353))
        .pod("draining-1", |p| p.tcp(8080))
        .remote_pod("web-3", |p| p.tcp(8080))
        .remote_pod("shop-2", |p| p.tcp(8443))
        .remote_pod("api-2", |p| p.tcp(8080))
        .client("client")
        .build()
        .and_then(|cluster| cluster.add_node_default_route().map(|()| cluster))
        .map_err(|error| format!("building the example network namespaces: {error}"))
}

fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

/// Every failure the demo expects (not root, no proxy binary, a proxy that
/// cannot program the rules) ends here with one line and exit code 1.
fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("demo: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("needs root: it creates network namespaces (try: sudo scripts/demo)".into());
    }
    let manifests = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "examples".into()));
    if !manifests.exists() {
        return Err(format!("no manifests at {}", manifests.display()));
    }
    let proxy = proxy_binary()?;
    let cluster = example_cluster()?;
    let node = cluster.node();
    let pod = cluster.pod("web-1");
    let client = cluster.client();
    println!("namespaces: {}", cluster.namespace_names().join(" "));
    let log = tempfile::tempfile().map_err(|e| format!("creating the proxy's log file: {e}"))?;
    let stderr = log
        .try_clone()
        .map_err(|e| format!("creating the proxy's log file: {e}"))?;
    let mut command = node.command(proxy.to_str().unwrap());
    command
        .args(["--manifests", manifests.to_str().unwrap()])
        .args(["--hostname-override", "node-1"])
        .args(["--cluster-cidr", "10.244.0.0/16"])
        .args(["--iptables-min-sync-period", "0s"])
        .stdin(Stdio::null())
        .stderr(stderr);
    let mut proxy_process =
        NsChild::spawn(&mut command).map_err(|e| format!("starting the proxy: {e}"))?;
    let mut exited = None;
    let ready = wait_until(READY_TIMEOUT, || {
        exited = proxy_process.try_wait().ok().flatten();
        exited.is_some() || connect(pod, addr("10.96.0.10:80")).is_ok()
    });
    if let Some(status) = exited {
        return Err(format!("the proxy exited ({status}):\n{}", tail(log, 20)));
    }
    if !ready {
        return Err(format!(
            "the proxy did not program demo/web within {READY_TIMEOUT:?}; its last log lines:\n{}",
            tail(log, 20)
        ));
    }

    let show = |what: &str, counts: std::collections::BTreeMap<String, usize>| {
        println!("{what:<58} {counts:?}");
    };
    show(
        "pod web-1 → ClusterIP 10.96.0.10:80 (demo/web), 30 conns",
        hits(pod, addr("10.96.0.10:80"), 30),
    );
    show(
        "client → NodePort 192.168.99.2:30080 (demo/web-nodeport)",
        hits(client, addr("192.168.99.2:30080"), 20),
    );
    show(
        "client → LoadBalancer 203.0.113.10:443 (demo/shop)",
        hits(client, addr("203.0.113.10:443"), 20),
    );
    show(
        "client → externalIP 203.0.113.20:8080 (demo/legacy)",
        hits(client, addr("203.0.113.20:8080"), 5),
    );
    show(
        "pod web-1 → 10.96.0.15:80 (demo/sticky, ClientIP affinity)",
        hits(pod, addr("10.96.0.15:80"), 20),
    );
    show(
        "pod web-1 → 10.96.0.18:80 (demo/draining, terminating)",
        hits(pod, addr("10.96.0.18:80"), 5),
    );
    let local = connect(client, addr("203.0.113.11:80"))
        .map_err(|e| format!("client → 203.0.113.11:80 (demo/api-local): {e}"))?;
    println!(
        "{:<58} answered by {}, saw source {} (client's own address kept)",
        "client → 203.0.113.11:80 (demo/api-local, eTP Local)", local.backend, local.source
    );
    let dns = udp_roundtrip(pod, addr("10.96.0.53:53"))
        .map_err(|e| format!("pod web-1 → UDP 10.96.0.53:53 (kube-system/dns): {e}"))?;
    println!(
        "{:<58} answered by {}",
        "pod web-1 → UDP 10.96.0.53:53 (kube-system/dns)", dns.backend
    );
    for (who, from) in [("pod web-1", pod), ("client", client)] {
        let what = format!("{who} → 10.96.0.17:80 (demo/empty, no endpoints)");
        match connect(from, addr("10.96.0.17:80")) {
            Err(e) if e.is_refused() => println!("{what:<58} connection refused"),
            other => println!("{what:<58} unexpected: {other:?}"),
        }
    }
    println!("done: the proxy stops and the namespaces are removed");
    Ok(())
}

/// The proxy built next to this example: target/<profile>/examples/demo →
/// target/<profile>/kube-proxy.
fn proxy_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating the demo binary: {e}"))?;
    let proxy = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("kube-proxy"))
        .filter(|proxy| proxy.exists())
        .ok_or("no kube-proxy binary next to the demo: run it with scripts/demo")?;
    Ok(proxy)
}

/// The last `lines` lines of the proxy's log.
fn tail(mut log: std::fs::File, lines: usize) -> String {
    use std::io::Seek;
    let mut text = String::new();
    if log.rewind().is_err() || log.read_to_string(&mut text).is_err() {
        return "(its log could not be read)".into();
    }
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
