//! Kernel tests: the rules over time. Endpoint changes keep established
//! connections, a flush by someone else is repaired by the periodic sync,
//! and cleanup removes what the proxy wrote, on iptables-legacy and on
//! iptables-nft.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web, http 80/TCP | ClusterIP 10.96.0.10, NodePort 30080, endpoints ep1, ep2 |
//! | ns1/web6, http 80/TCP | ClusterIP fd00:10:96::10, endpoints ep1 |
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kernel;

use std::time::Duration;

use kernel::{at, build, pod_ip, pod_ip_v6, require, slice, three_pods, Proxy};
use kp_iptables::applier::Tool;
use kp_iptables::{cleanup, IptablesFlavor};
use kp_model::IpFamily;
use kp_testkit::builders::service;
use kp_testkit::netns::{connect, hits, wait_until, TcpSession};

on_both_flavors!(
    removing_an_endpoint_moves_new_connections_and_keeps_established_ones,
    a_flush_by_someone_else_is_repaired_by_the_next_periodic_sync,
    cleanup_removes_every_kube_chain_and_leaves_foreign_ones,
);

/// How long a test waits for the periodic sync (period: 1 s).
const REPAIR_DEADLINE: Duration = Duration::from_secs(5);

fn web() -> k8s_openapi::api::core::v1::Service {
    service("ns1", "web", |s| {
        s.service_type("NodePort")
            .cluster_ip("10.96.0.10")
            .port("http", 80, "TCP")
            .node_port(30080)
    })
}

fn removing_an_endpoint_moves_new_connections_and_keeps_established_ones(flavor: IptablesFlavor) {
    require(flavor);
    let topology = build(three_pods());
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    let both = ["ep1", "ep2"].map(|p| pod_ip(&topology, p));
    proxy.apply(&[web()], &[slice("web", &both, &[])]);
    proxy.sync();
    let mut session = TcpSession::open(topology.client(), at("10.96.0.10", 80)).unwrap();
    let kept = session.backend().to_owned();

    // The endpoint the session uses goes away (its pod keeps running, as
    // a terminating pod does): new connections go to the other one, the
    // established one stays where it is.
    let other = if kept == "ep1" { "ep2" } else { "ep1" };
    let remaining = pod_ip(&topology, other);
    proxy.apply(&[], &[slice("web", &[remaining], &[])]);
    let outcome = proxy.sync();
    assert!(!outcome.full, "an endpoint change is a partial sync");

    let counts = hits(topology.client(), at("10.96.0.10", 80), 10);
    assert_eq!(counts.keys().collect::<Vec<_>>(), [&other.to_owned()]);
    let echo = session.echo("still here").unwrap();
    assert_eq!(
        (echo.backend.as_str(), echo.text.as_str()),
        (kept.as_str(), "still here")
    );
}

fn a_flush_by_someone_else_is_repaired_by_the_next_periodic_sync(flavor: IptablesFlavor) {
    require(flavor);
    let topology = build(three_pods());
    let proxy = Proxy::start_with(&topology, flavor, IpFamily::V4, Duration::from_secs(1));
    proxy.apply(&[web()], &[slice("web", &[pod_ip(&topology, "ep1")], &[])]);
    let _running = proxy.run_in_background();
    let works = || connect(topology.client(), at("10.96.0.10", 80)).is_ok();
    assert!(
        wait_until(REPAIR_DEADLINE, works),
        "the first sync programs the Service"
    );

    proxy.iptables(&["-t", "nat", "-F"]);

    let repaired = || {
        let save = proxy.save();
        save.contains("-A PREROUTING -m comment --comment \"kubernetes service portals\"")
            && save.contains("-A KUBE-SERVICES")
    };
    assert!(
        wait_until(REPAIR_DEADLINE, repaired),
        "rules are back:\n{}",
        proxy.save()
    );
    assert!(works(), "and the Service answers again");
}

fn cleanup_removes_every_kube_chain_and_leaves_foreign_ones(flavor: IptablesFlavor) {
    require(flavor);
    let topology = build(three_pods());
    let v4 = Proxy::start(&topology, flavor, IpFamily::V4);
    v4.apply(&[web()], &[slice("web", &[pod_ip(&topology, "ep1")], &[])]);
    v4.sync();
    let v6 = Proxy::start(&topology, flavor, IpFamily::V6);
    v6.apply(
        &[service("ns1", "web6", |s| {
            s.ip_families(&["IPv6"])
                .cluster_ip("fd00:10:96::10")
                .port("http", 80, "TCP")
        })],
        &[slice("web6", &[pod_ip_v6(&topology, "ep1")], &[])],
    );
    v6.sync();
    v4.iptables(&["-t", "nat", "-N", "FOREIGN"]);
    v4.iptables(&["-t", "nat", "-A", "FOREIGN", "-j", "RETURN"]);
    v4.iptables(&["-t", "mangle", "-N", "KUBE-KUBELET-CANARY"]);
    assert!(v4.save().contains(":KUBE-SVC-"));

    let report = topology.node().run(|| cleanup(flavor)).unwrap();
    assert!(report.jump_rules_removed >= 24, "12 per family: {report:?}");

    for proxy in [&v4, &v6] {
        let save = proxy.save();
        let left: Vec<&str> = save
            .lines()
            .filter(|line| line.contains("KUBE-"))
            .filter(|line| !line.contains("KUBE-FIREWALL") && !line.contains("KUBE-KUBELET-CANARY"))
            .collect();
        assert!(left.is_empty(), "{:?} left {left:?}", proxy.family);
    }
    let save = v4.save();
    assert!(save.contains(":FOREIGN") && save.contains("-A FOREIGN -j RETURN"));
    assert!(
        save.contains(":KUBE-KUBELET-CANARY"),
        "kubelet's chains stay"
    );
    let again = topology.node().run(|| cleanup(flavor)).unwrap();
    assert_eq!(
        (again.jump_rules_removed, again.chains_removed.len()),
        (0, 0)
    );
    let program = flavor.program(IpFamily::V4, Tool::Save);
    assert!(!topology
        .node()
        .exec_ok(&program, &[])
        .contains("KUBE-SERVICES"));
}
