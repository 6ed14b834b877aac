//! Golden tests: the exact restore text of each scenario, byte for byte.
//! A difference fails and leaves the new text for `scripts/update-golden`
//! (see `kp_testkit::golden`); review its diff. Every golden text is also loaded into the tracer,
//! which fails on rules it cannot parse and on jumps to missing chains.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;

use common::{ip, namespaced, render_both_ways, ruleset, service, Pieces, World};
use kp_iptables::{
    JumpRule, ListedChains, LocalDetector, NatChains, RenderInput, Renderer, JUMP_RULES,
    STREAM_CHUNK_BYTES,
};
use kp_model::Protocol;

#[track_caller]
fn assert_golden(name: &str, text: &str) {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "tests",
        "golden",
        &format!("{name}.txt"),
    ]
    .iter()
    .collect();
    kp_testkit::golden::assert_golden(&path, text);
}

#[track_caller]
fn golden(name: &str, world: World) {
    let rendered = world.render();
    ruleset(&rendered);
    assert_golden(name, &rendered.restore);
}

#[test]
fn cluster_ip_with_three_endpoints() {
    golden(
        "cluster_ip",
        World::v4().with(
            service("ns1", "svc1", "10.96.0.41", 80)
                .local_endpoint("10.244.1.2", 8080)
                .remote_endpoint("10.244.2.3", 8080)
                .remote_endpoint("10.244.2.4", 8080),
        ),
    );
}

#[test]
fn node_port() {
    golden(
        "node_port",
        World::v4().with(
            service("ns1", "svc1", "10.96.0.42", 80)
                .node_port(30080)
                .remote_endpoint("10.244.2.3", 8080),
        ),
    );
}

#[test]
fn load_balancer_with_source_ranges() {
    golden(
        "load_balancer_source_ranges",
        World::v4().with(
            service("ns1", "lb", "10.96.0.43", 443)
                .node_port(30443)
                .lb_ip("203.0.113.9")
                .source_range("203.0.113.0/25")
                .source_range("192.168.99.0/24")
                .remote_endpoint("10.244.2.3", 8443),
        ),
    );
}

#[test]
fn external_ips() {
    golden(
        "external_ips",
        World::v4().with(
            service("ns1", "ext", "10.96.0.44", 80)
                .external_ip("203.0.113.20")
                .external_ip("203.0.113.21")
                .remote_endpoint("10.244.2.3", 80),
        ),
    );
}

#[test]
fn session_affinity() {
    golden(
        "session_affinity",
        World::v4().with(
            service("ns1", "sticky", "10.96.0.45", 80)
                .affinity_secs(10800)
                .local_endpoint("10.244.1.2", 80)
                .remote_endpoint("10.244.2.3", 80),
        ),
    );
}

#[test]
fn external_traffic_policy_local_with_local_endpoints() {
    golden(
        "etp_local",
        World::v4().with(
            service("ns2", "svc2", "10.96.0.46", 80)
                .node_port(30046)
                .lb_ip("203.0.113.10")
                .etp_local()
                .health_check_node_port(30000)
                .local_endpoint("10.244.1.2", 80)
                .remote_endpoint("10.244.2.3", 80),
        ),
    );
}

#[test]
fn external_traffic_policy_local_without_local_endpoints() {
    golden(
        "etp_local_no_local_endpoints",
        World::v4().with(
            service("ns2", "svc2", "10.96.0.47", 80)
                .node_port(30047)
                .external_ip("203.0.113.22")
                .lb_ip("203.0.113.11")
                .etp_local()
                .health_check_node_port(30001)
                .remote_endpoint("10.244.2.3", 80),
        ),
    );
}

#[test]
fn internal_traffic_policy_local() {
    golden(
        "itp_local",
        World::v4()
            .with(
                service("ns3", "local", "10.96.0.48", 80)
                    .itp_local()
                    .local_endpoint("10.244.1.2", 80)
                    .remote_endpoint("10.244.2.3", 80),
            )
            .with(
                service("ns3", "remote-only", "10.96.0.49", 80)
                    .itp_local()
                    .remote_endpoint("10.244.2.4", 80),
            ),
    );
}

#[test]
fn no_endpoints() {
    golden(
        "no_endpoints",
        World::v4().with(
            service("ns4", "empty", "10.96.0.50", 80)
                .node_port(30050)
                .external_ip("203.0.113.23")
                .lb_ip("203.0.113.12"),
        ),
    );
}

#[test]
fn terminating_fallback() {
    golden(
        "terminating_fallback",
        World::v4().with(
            service("ns5", "draining", "10.96.0.51", 80)
                .terminating_endpoint("10.244.1.2", 80, true)
                .terminating_endpoint("10.244.2.3", 80, false),
        ),
    );
}

#[test]
fn udp_and_sctp() {
    golden(
        "udp_sctp",
        World::v4()
            .with(
                service("kube-system", "dns", "10.96.0.10", 53)
                    .protocol(Protocol::Udp)
                    .remote_endpoint("10.244.2.5", 53),
            )
            .with(
                service("ns6", "sctp", "10.96.0.52", 9999)
                    .protocol(Protocol::Sctp)
                    .unnamed_port()
                    .node_port(30999)
                    .remote_endpoint("10.244.2.6", 9999),
            ),
    );
}

#[test]
fn ipv6() {
    golden(
        "ipv6",
        World::v6()
            .with(
                service("ns1", "svc1", "fd00:10:96::41", 80)
                    .node_port(30080)
                    .local_endpoint("fd00:10:244:1::2", 8080)
                    .remote_endpoint("fd00:10:244:2::3", 8080),
            )
            .with(service("ns1", "empty", "fd00:10:96::42", 80)),
    );
}

#[test]
fn masquerade_all() {
    golden(
        "masquerade_all",
        World::v4()
            .options(|o| o.masquerade_all = true)
            .with(service("ns1", "svc1", "10.96.0.41", 80).remote_endpoint("10.244.2.3", 80)),
    );
}

#[test]
fn each_local_detector() {
    let detectors = [
        ("detector_none", LocalDetector::None),
        ("detector_node_cidr", LocalDetector::NodeCidr),
        (
            "detector_bridge",
            LocalDetector::BridgeInterface("cbr0".into()),
        ),
        (
            "detector_interface_prefix",
            LocalDetector::InterfaceNamePrefix("veth".into()),
        ),
    ];
    for (name, detector) in detectors {
        golden(
            name,
            World::v4().options(|o| o.local_detector = detector).with(
                service("ns2", "svc2", "10.96.0.46", 80)
                    .node_port(30046)
                    .etp_local()
                    .local_endpoint("10.244.1.2", 80),
            ),
        );
    }
}

#[test]
fn node_port_addresses_and_host_features() {
    let mut world = World::v4()
        .options(|o| {
            o.masquerade_mark = kp_node::MasqueradeMark::new(5).unwrap();
            o.random_fully = false;
            o.nfacct_localhost_node_ports = true;
            o.nfacct_invalid_dropped = true;
        })
        .with(
            service("ns1", "svc1", "10.96.0.41", 80)
                .node_port(30080)
                .remote_endpoint("10.244.2.3", 80),
        );
    world.node_port_addresses = Some(vec![ip("192.168.99.2"), ip("127.0.0.1")]);
    golden("node_port_addresses", world);
}

#[test]
fn partial_sync_rewrites_only_changed_services() {
    let world = World::v4()
        .with(service("ns1", "svc1", "10.96.0.41", 80).remote_endpoint("10.244.2.3", 80))
        .with(service("ns2", "svc2", "10.96.0.42", 80).remote_endpoint("10.244.2.4", 80));
    let mut renderer = Renderer::new(world.options.clone()).unwrap();
    let full = world.render_with(&mut renderer, true, &BTreeSet::new(), None);
    let existing: Vec<String> = full
        .active_nat_chains
        .iter()
        .map(ToString::to_string)
        .chain([
            "KUBE-SEP-STALESTALESTALE2".to_owned(),
            "KUBE-SERVICES".to_owned(),
        ])
        .collect();

    let changed = BTreeSet::from([namespaced("ns2", "svc2")]);
    let partial = world.render_with(&mut renderer, false, &changed, Some(&existing));
    assert_golden("partial_sync", &partial.restore);
}

/// A cluster large enough that a streamed render hands its nat rules on in
/// many pieces, with stale chains to delete and jump rules to insert: the
/// pieces join to exactly the whole render's text.
#[test]
fn a_streamed_render_of_a_large_cluster_is_the_whole_render_in_pieces() {
    let mut world = World::v4();
    for n in 0..3000u32 {
        let (a, b) = (n / 250, n % 250);
        world = world.with(
            service("ns1", &format!("svc{n}"), &format!("10.96.{a}.{b}"), 80)
                .remote_endpoint(&format!("10.244.{}.{b}", 2 + a), 8080)
                .remote_endpoint(&format!("10.244.{}.{b}", 20 + a), 8080),
        );
    }
    let mut renderer = Renderer::new(world.options.clone()).unwrap();
    let stale = [
        "KUBE-SEP-STALESTALESTALE2".to_owned(),
        "KUBE-SVC-NOTANAMEATALL".to_owned(),
    ];
    let listed = ListedChains::from_listing(stale.to_vec());
    let jumps: Vec<JumpRule> = JUMP_RULES.to_vec();
    for full in [true, false] {
        let input = RenderInput {
            family: world.family,
            full,
            service_ports: &world.services,
            changed_services: &BTreeSet::from([namespaced("ns1", "svc7")]),
            node: &world.node,
            node_port_addresses: None,
            existing_nat_chains: NatChains::Listed(&listed),
            jumps: &jumps,
        };
        let mut pieces = Pieces::default();
        renderer.render_streamed(&input, &mut pieces).unwrap();
        let whole = render_both_ways(&mut renderer, &input);
        assert_eq!(whole.deleted_chains, stale, "both stale chains go");
        if full {
            assert!(
                pieces.count > 2 + whole.restore.len() / STREAM_CHUNK_BYTES / 2,
                "{} pieces for {} bytes",
                pieces.count,
                whole.restore.len()
            );
            ruleset(&whole);
        }
    }
}
