//! Kernel tests of the portal rules' life: a restarted proxy replaces the
//! jumps instead of adding copies, and `--cleanup` removes every chain
//! and jump, on iptables-legacy and on iptables-nft.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web, http 80/TCP | ClusterIP 10.96.0.10, NodePort 30080, endpoint ep1 |
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kernel;

use kernel::{at, node_at, pod_ip, require, slice, three_pods, Proxy};
use kp_iptables::applier::Tool;
use kp_iptables::{IptablesFlavor, SystemApplier};
use kp_model::IpFamily;
use kp_testkit::builders::service;
use kp_testkit::netns::{connect, Topology};
use kp_userspace::portal::PORTAL_CHAINS;

on_both_flavors!(
    a_restarted_proxy_keeps_one_copy_of_each_jump,
    cleanup_removes_every_portal_chain_and_jump,
);

fn web(
    topology: &Topology,
) -> (
    Vec<k8s_openapi::api::core::v1::Service>,
    Vec<k8s_openapi::api::discovery::v1::EndpointSlice>,
) {
    (
        vec![service("ns1", "web", |s| {
            s.service_type("NodePort")
                .cluster_ip("10.96.0.10")
                .port("http", 80, "TCP")
                .node_port(30080)
        })],
        vec![slice("web", &[pod_ip(topology, "ep1")], &[])],
    )
}

fn nat_rules(topology: &Topology, flavor: IptablesFlavor) -> String {
    let program = flavor.program(IpFamily::V4, Tool::Save);
    topology.node().exec_ok(&program, &["-t", "nat"])
}

fn jump_count(rules: &str, chain: &str) -> usize {
    rules
        .lines()
        .filter(|line| {
            (line.starts_with("-A PREROUTING") || line.starts_with("-A OUTPUT"))
                && line.ends_with(&format!("-j {chain}"))
        })
        .count()
}

fn a_restarted_proxy_keeps_one_copy_of_each_jump(flavor: IptablesFlavor) {
    require(flavor);
    let topology = three_pods();
    let (services, slices) = web(&topology);
    for _start in 0..3 {
        let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
        proxy.apply(&services, &slices);
        proxy.sync();
        proxy.sync();
        assert_eq!(
            connect(topology.client(), node_at(30080)).unwrap().backend,
            "ep1"
        );
        assert_eq!(
            connect(topology.pod("ep2"), at("10.96.0.10", 80))
                .unwrap()
                .backend,
            "ep1"
        );
    }
    let rules = nat_rules(&topology, flavor);
    for chain in PORTAL_CHAINS {
        assert_eq!(
            jump_count(&rules, chain),
            1,
            "one jump to {chain}:\n{rules}"
        );
    }
    // The portal jumps come before anything else in PREROUTING and OUTPUT.
    let first = |builtin: &str| {
        rules
            .lines()
            .find(|line| line.starts_with(&format!("-A {builtin} ")))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(
        first("PREROUTING").ends_with("-j KUBE-PORTALS-CONTAINER"),
        "{rules}"
    );
    assert!(first("OUTPUT").ends_with("-j KUBE-PORTALS-HOST"), "{rules}");
}

fn cleanup_removes_every_portal_chain_and_jump(flavor: IptablesFlavor) {
    require(flavor);
    let topology = three_pods();
    let (services, slices) = web(&topology);
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    proxy.apply(&services, &slices);
    proxy.sync();
    assert!(nat_rules(&topology, flavor).contains(":KUBE-PORTALS-CONTAINER"));

    let mut applier = SystemApplier::new(flavor).in_network_namespace(topology.node().name());
    let removed = kp_userspace::cleanup(&mut applier, IpFamily::V4).unwrap();
    assert_eq!(removed, 8, "four jumps and four chains");
    let rules = nat_rules(&topology, flavor);
    assert!(
        !rules.contains("KUBE-"),
        "nothing of ours is left:\n{rules}"
    );
    // A second cleanup finds nothing and does not fail.
    assert_eq!(
        kp_userspace::cleanup(&mut applier, IpFamily::V4).unwrap(),
        0
    );
}
