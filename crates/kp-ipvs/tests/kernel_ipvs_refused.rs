//! Kernel test of the IPVS mode: one Service the kernel refuses does not
//! take the others with it. Run in the VM by scripts/ipvs-vm/run (see
//! kernel_ipvs.rs).
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web, p80 80/TCP | ClusterIP 10.96.0.10, NodePort 30080, endpoint ep1 |
//! | ns1/bad, p80 80/TCP | ClusterIP 10.96.0.11, externalIP 203.0.113.7, endpoints ep2 and 255.255.255.255 |
//! | source of pod traffic | pod `src` on node-1; `client` outside |
//!
//! 255.255.255.255 is a valid IPv4 address to the API server; IPVS refuses
//! it as a real server ("not unicast", `EINVAL`), as it refuses the
//! directed broadcast address of any subnet the node is on.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use kp_iptables::{IptablesFlavor, SystemApplier};
use kp_ipvs::kernel::IpvsKernel;
use kp_ipvs::netlink::NetlinkKernel;
use kp_ipvs::testing::{service, Ports, RequestParts};
use kp_ipvs::{IpvsBackend, IpvsOptions, SetKind};
use kp_model::IpFamily;
use kp_sync::{Backend, BackendError};
use kp_testkit::netns::{connect, require_root, require_tool, Topology};

fn at(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap(), port)
}

#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_a_service_the_kernel_refuses_is_named_and_the_others_keep_answering() {
    require_root();
    assert!(
        Path::new("/proc/net/ip_vs").exists(),
        "this kernel has no IPVS: run scripts/ipvs-vm/run"
    );
    require_tool("iptables-legacy-restore");
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(80))
        .pod("ep2", |p| p.tcp(80))
        .pod("src", |p| p)
        .build()
        .unwrap();
    let ep = |pod: &str| topology.pod(pod).ip().to_string();
    let web = service("ns1", "web", "10.96.0.10", 80)
        .node_port(30080)
        .endpoint(&ep("ep1"), 80, true);
    let bad = service("ns1", "bad", "10.96.0.11", 80)
        .external_ip("203.0.113.7")
        .endpoint(&ep("ep2"), 80, true)
        .endpoint("255.255.255.255", 80, false);
    let with_bad = RequestParts::new(
        Ports::new().with(web.clone()).with(bad).build(),
        "192.168.99.2",
    );
    let without_bad = RequestParts::new(Ports::new().with(web).build(), "192.168.99.2");
    let mut backend = IpvsBackend::new(
        IpFamily::V4,
        IpvsOptions::default(),
        Box::new(NetlinkKernel::new()),
        Box::new(SystemApplier::new(IptablesFlavor::Legacy)),
    );

    let error = topology
        .node()
        .run(|| backend.sync(&with_bad.request(true)))
        .expect_err("the kernel refuses the broadcast real server");
    let BackendError::Rejected { services, .. } = &error else {
        panic!("a refused operation is a rejected rule set: {error}");
    };
    assert_eq!(
        services.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["ns1/bad"],
        "{error}"
    );
    assert!(
        kp_sync::error_chain(&error).contains("255.255.255.255:80"),
        "the refused real server is named: {}",
        kp_sync::error_chain(&error)
    );
    // Every other Service was programmed in that same sync.
    assert_eq!(
        connect(topology.pod("src"), at("10.96.0.10", 80))
            .unwrap()
            .backend,
        "ep1"
    );
    assert_eq!(
        connect(topology.client(), at("192.168.99.2", 30080))
            .unwrap()
            .backend,
        "ep1"
    );

    // The sync loop leaves ns1/bad out of the next sync: it succeeds and
    // nothing of ns1/bad is left in the kernel.
    topology
        .node()
        .run(|| backend.sync(&without_bad.request(true)))
        .expect("a sync without the refused Service succeeds");
    let listed = topology
        .node()
        .run(|| NetlinkKernel::new().list(IpFamily::V4))
        .unwrap();
    let gone: [IpAddr; 2] = [
        "10.96.0.11".parse().unwrap(),
        "203.0.113.7".parse().unwrap(),
    ];
    assert!(
        listed
            .services
            .keys()
            .all(|key| !gone.contains(&key.address)),
        "{:?}",
        listed.services.keys()
    );
    assert!(listed.addresses.iter().all(|ip| !gone.contains(ip)));
    for kind in SetKind::ALL {
        for entry in listed.entries(kind) {
            let text = entry.to_string();
            assert!(
                !text.contains("10.96.0.11") && !text.contains("203.0.113.7"),
                "{kind:?} still holds {text}"
            );
        }
    }
    assert_eq!(&listed, backend.applied().unwrap());
    assert_eq!(
        connect(topology.pod("src"), at("10.96.0.10", 80))
            .unwrap()
            .backend,
        "ep1"
    );
}

#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_the_sync_loop_leaves_the_refused_service_out_and_the_next_sync_converges() {
    use kp_model::{NodeInfo, ObjectEvent, ProxyEventHandler, ResourceKind};
    use kp_sync::{Proxier, ProxierConfig, RunnerConfig, SyncError};
    use kp_testkit::builders::{endpoint_slice, service};
    use kp_testkit::plan::{NODE_IP, NODE_NAME};
    use std::time::Duration;
    require_root();
    assert!(
        Path::new("/proc/net/ip_vs").exists(),
        "this kernel has no IPVS: run scripts/ipvs-vm/run"
    );
    require_tool("iptables-legacy-restore");
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(80))
        .pod("ep2", |p| p.tcp(80))
        .pod("src", |p| p)
        .build()
        .unwrap();
    let backend = IpvsBackend::new(
        IpFamily::V4,
        IpvsOptions::default(),
        Box::new(NetlinkKernel::new()),
        Box::new(SystemApplier::new(IptablesFlavor::Legacy)),
    );
    let config = ProxierConfig {
        family: IpFamily::V4,
        node: NodeInfo {
            name: NODE_NAME.to_owned(),
            addresses: vec![IpAddr::V4(NODE_IP)],
            ..NodeInfo::default()
        },
        runner: RunnerConfig {
            min_interval: Duration::ZERO,
            max_interval: Duration::ZERO,
            retry_interval: Duration::from_millis(100),
        },
    };
    let proxier = Proxier::new(config, Box::new(backend));
    for (name, ip) in [("web", "10.96.0.10"), ("bad", "10.96.0.11")] {
        proxier.on_service(ObjectEvent::Apply(service("ns1", name, |s| {
            s.cluster_ip(ip).port("http", 80, "TCP")
        })));
    }
    let (ep1, ep2) = (topology.pod("ep1").ip(), topology.pod("ep2").ip());
    proxier.on_endpoint_slice(ObjectEvent::Apply(endpoint_slice(
        "ns1",
        "web-1",
        "web",
        |s| {
            s.port("http", 80, "TCP")
                .endpoint(ep1, |e| e.ready(true).node(NODE_NAME))
        },
    )));
    proxier.on_endpoint_slice(ObjectEvent::Apply(endpoint_slice(
        "ns1",
        "bad-1",
        "bad",
        |s| {
            s.port("http", 80, "TCP")
                .endpoint(ep2, |e| e.ready(true).node(NODE_NAME))
                .endpoint("255.255.255.255", |e| e.ready(true).node("node-2"))
        },
    )));
    proxier.on_synced(ResourceKind::Service);
    proxier.on_synced(ResourceKind::EndpointSlice);

    let error = topology.node().run(|| proxier.sync_once()).unwrap_err();
    let SyncError::Backend {
        source: BackendError::Rejected { services, .. },
        ..
    } = &error
    else {
        panic!("{error}");
    };
    assert_eq!(
        services.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["ns1/bad"]
    );
    assert_eq!(
        connect(topology.pod("src"), at("10.96.0.10", 80))
            .unwrap()
            .backend,
        "ep1",
        "ns1/web answers after the refused sync"
    );

    // The retry leaves ns1/bad out: it succeeds, and the kernel holds
    // nothing of ns1/bad.
    topology
        .node()
        .run(|| proxier.sync_once())
        .expect("the sync after the refusal succeeds");
    let listed = topology
        .node()
        .run(|| NetlinkKernel::new().list(IpFamily::V4))
        .unwrap();
    let bad: IpAddr = "10.96.0.11".parse().unwrap();
    assert!(listed.services.keys().all(|key| key.address != bad));
    assert!(!listed.addresses.contains(&bad));
    assert_eq!(
        connect(topology.pod("src"), at("10.96.0.10", 80))
            .unwrap()
            .backend,
        "ep1"
    );
}
