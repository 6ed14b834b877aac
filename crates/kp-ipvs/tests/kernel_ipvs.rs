//! Kernel tests of the IPVS mode: the real netlink kernel programs IPVS,
//! ipsets and kube-ipvs0 in a node namespace, and real connections from a
//! pod namespace prove the result.
//!
//! They need a kernel with IPVS, which the build machines lack, so they are
//! `#[ignore]`d and named `vm_…`: `cargo test -p kp-ipvs` runs everything
//! else, and scripts/ipvs-vm/run runs these inside a virtual machine with
//! `--ignored`. Run on a kernel without IPVS they fail and say why.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web, p80 80/TCP | ClusterIP 10.96.0.10, endpoints ep1, ep2 (node-1), ep3 (node-2) |
//! | ns1/empty, p80 80/TCP | ClusterIP 10.96.0.14, no endpoints |
//! | source of the traffic | pod `src` on node-1 (10.244.1.4), not an endpoint |
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use kp_iptables::{Applier, ApplyError, JumpRule, SavedTable, Table};
use kp_ipvs::kernel::IpvsKernel;
use kp_ipvs::netlink::NetlinkKernel;
use kp_ipvs::testing::{service, Ports, RequestParts};
use kp_ipvs::{IpvsBackend, IpvsOptions, DUMMY_LINK};
use kp_model::IpFamily;
use kp_sync::Backend;
use kp_testkit::netns::{expect_refused, hits_until_all, require_root, Topology};

const NEEDS_IPVS: &str = "needs a kernel with IPVS: run scripts/ipvs-vm/run";

/// The iptables rules are proven by the golden tests and by kp-iptables'
/// applier; these tests prove the IPVS, ipset and link side, so restores
/// are only counted.
#[derive(Default)]
struct CountingApplier(usize);

impl Applier for CountingApplier {
    fn restore(&mut self, _: IpFamily, _: &str) -> Result<(), ApplyError> {
        self.0 += 1;
        Ok(())
    }
    fn save_table(&mut self, _: IpFamily, _: Table) -> Result<SavedTable, ApplyError> {
        Ok(SavedTable::default())
    }
    fn chain_exists(&mut self, _: IpFamily, _: Table, _: &str) -> Result<bool, ApplyError> {
        Ok(self.0 > 0)
    }
    fn ensure_chain(&mut self, _: IpFamily, _: Table, _: &str) -> Result<(), ApplyError> {
        Ok(())
    }
    fn delete_jump(&mut self, _: IpFamily, _: &JumpRule) -> Result<bool, ApplyError> {
        Ok(false)
    }
    fn flush_and_delete_chain(
        &mut self,
        _: IpFamily,
        _: Table,
        _: &str,
    ) -> Result<bool, ApplyError> {
        Ok(false)
    }
}

#[track_caller]
fn require_ipvs() {
    require_root();
    assert!(
        Path::new("/proc/net/ip_vs").exists(),
        "this kernel has no IPVS (/proc/net/ip_vs is missing; the ip_vs module is not loaded): {NEEDS_IPVS}"
    );
}

fn at(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap(), port)
}

fn ip_of(topology: &Topology, pod: &str) -> String {
    topology.pod(pod).ip().to_string()
}

#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_cluster_ip_spreads_over_three_endpoints_and_an_empty_service_refuses() {
    require_ipvs();
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(80))
        .pod("ep2", |p| p.tcp(80))
        .remote_pod("ep3", |p| p.tcp(80))
        .pod("src", |p| p)
        .build()
        .unwrap();
    let ports = Ports::new()
        .with(
            service("ns1", "web", "10.96.0.10", 80)
                .endpoint(&ip_of(&topology, "ep1"), 80, true)
                .endpoint(&ip_of(&topology, "ep2"), 80, true)
                .endpoint(&ip_of(&topology, "ep3"), 80, false),
        )
        .with(service("ns1", "empty", "10.96.0.14", 80))
        .build();
    let parts = RequestParts::new(ports, "192.168.99.2");
    let mut backend = IpvsBackend::new(
        IpFamily::V4,
        IpvsOptions::default(),
        Box::new(NetlinkKernel::new()),
        Box::new(CountingApplier::default()),
    );
    topology
        .node()
        .run(|| backend.sync(&parts.request(true)))
        .expect("the first sync programs the node");

    let counts = hits_until_all(
        topology.pod("src"),
        at("10.96.0.10", 80),
        &["ep1", "ep2", "ep3"],
        60,
    );
    assert_eq!(
        counts.keys().collect::<Vec<_>>(),
        ["ep1", "ep2", "ep3"],
        "rr spreads connections over every endpoint: {counts:?}"
    );
    expect_refused(topology.pod("src"), at("10.96.0.14", 80));

    // What the kernel holds is what was planned: a second full sync sends
    // nothing but its listing.
    let listed = topology
        .node()
        .run(|| NetlinkKernel::new().list(IpFamily::V4))
        .unwrap();
    assert!(listed.link, "{DUMMY_LINK} exists");
    let addresses: Vec<IpAddr> = listed.addresses.iter().copied().collect();
    assert_eq!(
        addresses,
        [
            "10.96.0.10".parse::<IpAddr>().unwrap(),
            "10.96.0.14".parse().unwrap()
        ]
    );
    assert_eq!(listed.services.len(), 2);
    assert_eq!(&listed, backend.applied().unwrap());
    let outcome = topology
        .node()
        .run(|| backend.sync(&parts.request(true)))
        .unwrap();
    assert_eq!(outcome.objects_written, 0, "nothing was rewritten");
}

#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_one_endpoint_change_touches_one_real_server() {
    require_ipvs();
    let topology = Topology::builder()
        .pod("ep1", |p| p.tcp(80))
        .pod("ep2", |p| p.tcp(80))
        .pod("src", |p| p)
        .build()
        .unwrap();
    let web = |both: bool| {
        let mut svc =
            service("ns1", "web", "10.96.0.10", 80).endpoint(&ip_of(&topology, "ep1"), 80, true);
        if both {
            svc = svc.endpoint(&ip_of(&topology, "ep2"), 80, true);
        }
        RequestParts::new(Ports::new().with(svc).build(), "192.168.99.2")
    };
    let mut backend = IpvsBackend::new(
        IpFamily::V4,
        IpvsOptions::default(),
        Box::new(NetlinkKernel::new()),
        Box::new(CountingApplier::default()),
    );
    let one = web(false);
    let two = web(true);
    topology
        .node()
        .run(|| backend.sync(&one.request(true)))
        .unwrap();
    let counts = hits_until_all(topology.pod("src"), at("10.96.0.10", 80), &["ep1"], 10);
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["ep1"]);
    let outcome = topology
        .node()
        .run(|| backend.sync(&two.request(false)))
        .unwrap();
    assert_eq!(outcome.objects_written, 1, "one real server added");
    let counts = hits_until_all(
        topology.pod("src"),
        at("10.96.0.10", 80),
        &["ep1", "ep2"],
        60,
    );
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["ep1", "ep2"]);
}
