//! The proxy's main job on the example cluster, in a throwaway set of
//! network namespaces: pods with echo servers, a node running `kube-proxy
//! --manifests examples/`, and a client outside the node. Traffic goes to
//! each kind of Service address and the answering backends are shown.
//! Everything is removed at the end. Needs root; touches nothing outside the
//! namespaces it creates.
//!
//! Run it with `scripts/demo`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use kp_testkit::netns::{connect, hits, require_root, udp_roundtrip, wait_until, Topology};

/// The pods of `examples/endpointslices.yaml`, in the order that gives them
/// their addresses (local pods 10.244.1.2…, remote pods 10.244.2.2…).
fn example_cluster() -> Topology {
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
        .expect("building the example network namespaces")
}

fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

fn main() {
    require_root();
    let mut args = std::env::args().skip(1);
    let manifests = PathBuf::from(args.next().unwrap_or_else(|| "examples".to_owned()));
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/examples/demo → target/<profile>/kube-proxy
    let proxy = exe
        .parent()
        .and_then(|d| d.parent())
        .unwrap()
        .join("kube-proxy");
    assert!(proxy.exists(), "build the proxy first: {}", proxy.display());

    let cluster = example_cluster();
    let node = cluster.node();
    let pod = cluster.pod("web-1");
    let client = cluster.client();
    println!("namespaces: {}", cluster.namespace_names().join(" "));
    let _proxy = node.spawn(
        proxy.to_str().unwrap(),
        &[
            "--manifests",
            manifests.to_str().unwrap(),
            "--hostname-override",
            "node-1",
            "--cluster-cidr",
            "10.244.0.0/16",
            "--iptables-min-sync-period",
            "0s",
        ],
    );
    let ready = wait_until(Duration::from_secs(15), || {
        connect(pod, addr("10.96.0.10:80")).is_ok()
    });
    assert!(ready, "the proxy did not program demo/web within 15 s");

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
    let local = connect(client, addr("203.0.113.11:80")).unwrap();
    println!(
        "{:<58} answered by {}, saw source {} (client's own address kept)",
        "client → 203.0.113.11:80 (demo/api-local, eTP Local)", local.backend, local.source
    );
    let dns = udp_roundtrip(pod, addr("10.96.0.53:53")).unwrap();
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
}
