//! Kernel test: names no API server would accept (quotes, newlines, rule
//! text, thousands of characters) reach the renderer straight from the
//! trackers, as they would from any source that failed to check them. The
//! rules must stay ours alone, and every Service must keep working.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web, http 80/TCP | ClusterIP 10.96.0.10, endpoint ep1 |
//! | HOSTILE/svc, http 80/TCP | ClusterIP 10.96.0.20, endpoint ep2 |
//! | ns1/HOSTILE, http 80/TCP | ClusterIP 10.96.0.21, endpoint ep2 |
//! | ns1/port, HOSTILE 80/TCP | ClusterIP 10.96.0.22, endpoint ep2 |
//! | ns1/aaaa…(5000), http 80/TCP | ClusterIP 10.96.0.23, endpoint ep2 |
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kernel;

use std::net::IpAddr;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kernel::{at, build, pod_ip, require, three_pods, Proxy, POD_TCP_PORT};
use kp_iptables::IptablesFlavor;
use kp_model::IpFamily;
use kp_testkit::builders::{endpoint_slice, service};
use kp_testkit::netns::connect;
use kp_testkit::plan::NODE_NAME;

on_both_flavors!(hostile_names_leave_no_foreign_rule_and_every_service_works);

/// Ends the comment, adds an accept-all rule, comments out the rest.
const HOSTILE: &str = "x\" -j ACCEPT\n-A INPUT -j ACCEPT\n-A OUTPUT -j DROP\n#";

/// The slice `<number>-1` of `service`, with one ready endpoint.
fn slice(number: usize, namespace: &str, service: &str, port: &str, ip: IpAddr) -> EndpointSlice {
    endpoint_slice(namespace, &format!("{number}-1"), service, |s| {
        s.address_type("IPv4")
            .port(port, i32::from(POD_TCP_PORT), "TCP")
            .endpoint(ip, |e| e.ready(true).node(NODE_NAME))
    })
}

fn hostile_names_leave_no_foreign_rule_and_every_service_works(flavor: IptablesFlavor) {
    require(flavor);
    let topology = build(three_pods());
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    let (ep1, ep2) = (pod_ip(&topology, "ep1"), pod_ip(&topology, "ep2"));
    let long = "a".repeat(5000);
    let services = [
        ("ns1", "web", "http", "10.96.0.10", ep1),
        (HOSTILE, "svc", "http", "10.96.0.20", ep2),
        ("ns1", HOSTILE, "http", "10.96.0.21", ep2),
        ("ns1", "port", HOSTILE, "10.96.0.22", ep2),
        ("ns1", long.as_str(), "http", "10.96.0.23", ep2),
    ];
    for (number, (namespace, name, port, cluster_ip, endpoint)) in services.into_iter().enumerate()
    {
        proxy.apply(
            &[service(namespace, name, |s| {
                s.cluster_ip(cluster_ip).port(port, 80, "TCP")
            })],
            &[slice(number, namespace, name, port, endpoint)],
        );
    }

    proxy.sync();

    let saved = proxy.save();
    for line in saved.lines().filter(|l| l.starts_with("-A ")) {
        let chain = line.split_whitespace().nth(1).unwrap_or_default();
        assert!(
            chain.starts_with("KUBE-") || line.contains(" -j KUBE-"),
            "a rule that is neither in nor into our chains: {line}\n{saved}"
        );
    }
    let pod = topology.pod("ep1");
    let expected = [
        ("10.96.0.10", "ep1"),
        ("10.96.0.20", "ep2"),
        ("10.96.0.21", "ep2"),
        ("10.96.0.22", "ep2"),
        ("10.96.0.23", "ep2"),
    ];
    for (cluster_ip, backend) in expected {
        let reply = connect(pod, at(cluster_ip, 80))
            .unwrap_or_else(|e| panic!("{cluster_ip}:80 does not answer: {e}\n{saved}"));
        assert_eq!(reply.backend, backend, "{cluster_ip}:80");
    }
}
