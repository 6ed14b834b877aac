//! Behaviour of rendered transactions, traced packet by packet.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web:p80 | ClusterIP 10.96.0.10, endpoints 10.244.1.2 (here), 10.244.2.2 (node-2) |
//! | ns1/np:p80 | NodePort 30080, externalIP 203.0.113.5, eTP Local, endpoint 10.244.2.3 (node-2) |
//! | ns1/lb:p80 | LB 203.0.113.9 from 198.51.100.0/24 only, endpoint 10.244.1.4 |
//! | ns1/empty:p80 | ClusterIP 10.96.0.14, no endpoints |
//! | ns1/itp:p80 | ClusterIP 10.96.0.15, iTP Local, endpoint 10.244.2.5 (node-2) |
//!
//! The paths of one packet ([`kp_nftables::tracer::Table::trace_paths`])
//! are told over a richer cluster, [`paths_world`]: the one above and
//!
//! | object | addresses |
//! |---|---|
//! | ns1/three:p80 | ClusterIP 10.96.0.16, endpoints 10.244.1.10 (here), 10.244.2.10, 10.244.2.11 |
//! | ns1/sticky:p80 | ClusterIP 10.96.0.17, ClientIP affinity 600 s, endpoints 10.244.1.12 (here), 10.244.2.12 |
//! | ns1/ext:p80 | NodePort 30082, externalIP 203.0.113.6, eTP Cluster, endpoint 10.244.2.13 (node-2) |
//! | ns1/local:p80 | NodePort 30083, LB 203.0.113.7, eTP Local, endpoint 10.244.1.14 (here) |
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{assert_goes_to, at, packet, service, World};
use kp_nftables::tracer::{PathOutcome, PathVerdict, Trace, Verdict};

const POD: &str = "10.244.1.7";
const CLIENT: &str = "192.168.99.10";
const NODE: &str = "192.168.99.2";

fn world() -> World {
    let mut world = World::v4();
    world
        .put(
            service("ns1", "web", "10.96.0.10", 80)
                .local_endpoint("10.244.1.2", 8080)
                .remote_endpoint("10.244.2.2", 8080),
        )
        .put(
            service("ns1", "np", "10.96.0.11", 80)
                .node_port(30080)
                .external_ip("203.0.113.5")
                .etp_local()
                .remote_endpoint("10.244.2.3", 8080),
        )
        .put(
            service("ns1", "lb", "10.96.0.12", 80)
                .lb_ip("203.0.113.9")
                .source_range("198.51.100.0/24")
                .local_endpoint("10.244.1.4", 8080),
        )
        .put(service("ns1", "empty", "10.96.0.14", 80))
        .put(
            service("ns1", "itp", "10.96.0.15", 80)
                .itp_local()
                .remote_endpoint("10.244.2.5", 8080),
        );
    world.sync(true, &[]);
    world
}

#[test]
fn cluster_ip_goes_to_one_of_its_endpoints() {
    let world = world();
    let verdict = world.trace(POD, at("10.96.0.10", 80));
    assert_goes_to(&verdict, &[at("10.244.1.2", 8080), at("10.244.2.2", 8080)]);
    // From outside the cluster the packet is masqueraded; a pod's is not,
    // unless it reaches itself (hairpin).
    let Verdict::Dnat { masquerade, .. } = world.trace(CLIENT, at("10.96.0.10", 80)) else {
        panic!("client traffic is DNATed");
    };
    assert_eq!(masquerade.len(), 2);
    let Verdict::Dnat { masquerade, .. } = world.trace("10.244.1.2", at("10.96.0.10", 80)) else {
        panic!("hairpin traffic is DNATed");
    };
    assert_eq!(
        masquerade.into_iter().collect::<Vec<_>>(),
        [at("10.244.1.2", 8080)]
    );
}

#[test]
fn a_service_without_endpoints_is_rejected_and_an_unknown_port_too() {
    let world = world();
    assert_eq!(world.trace(POD, at("10.96.0.14", 80)), Verdict::Reject);
    assert_eq!(world.trace(POD, at("10.96.0.10", 81)), Verdict::Reject);
    assert_eq!(world.trace(POD, at("10.96.9.9", 80)), Verdict::Accept);
}

#[test]
fn external_traffic_policy_local_without_local_endpoints() {
    let world = world();
    // From outside: dropped (a load balancer's health check moves on).
    assert_eq!(world.trace(CLIENT, at(NODE, 30080)), Verdict::Drop);
    assert_eq!(world.trace(CLIENT, at("203.0.113.5", 80)), Verdict::Drop);
    // Pods and the node itself are short-circuited to cluster endpoints.
    assert_goes_to(
        &world.trace(POD, at(NODE, 30080)),
        &[at("10.244.2.3", 8080)],
    );
    let Verdict::Dnat { masquerade, .. } = world.trace(NODE, at("203.0.113.5", 80)) else {
        panic!("node traffic is DNATed");
    };
    assert_eq!(masquerade.len(), 1, "the node's own traffic is masqueraded");
    // The ClusterIP still works for everyone.
    assert_goes_to(
        &world.trace(CLIENT, at("10.96.0.11", 80)),
        &[at("10.244.2.3", 8080)],
    );
}

#[test]
fn load_balancer_source_ranges_drop_other_sources() {
    let world = world();
    assert_eq!(world.trace(CLIENT, at("203.0.113.9", 80)), Verdict::Drop);
    assert_goes_to(
        &world.trace("198.51.100.7", at("203.0.113.9", 80)),
        &[at("10.244.1.4", 8080)],
    );
}

#[test]
fn internal_traffic_policy_local_without_local_endpoints_drops() {
    let world = world();
    assert_eq!(world.trace(POD, at("10.96.0.15", 80)), Verdict::Drop);
}

#[test]
fn udp_and_node_ports_on_selected_addresses() {
    let mut world = World::with(
        kp_model::IpFamily::V4,
        kp_node::NodePortAddresses::Select {
            cidrs: Vec::new(),
            primary: true,
        },
    );
    world.put(
        service("ns1", "dns", "10.96.0.53", 53)
            .udp()
            .node_port(30053)
            .remote_endpoint("10.244.2.9", 5353),
    );
    world.sync(true, &[]);
    let verdict = world.trace_packet(packet(CLIENT, at(NODE, 30053), "udp"));
    assert_goes_to(&verdict, &[at("10.244.2.9", 5353)]);
    let tcp = world.trace_packet(packet(CLIENT, at(NODE, 30053), "tcp"));
    assert_eq!(tcp, Verdict::Accept);
    assert!(world.table.maps["nodeport-ips"].contains_key(NODE));
}

#[test]
fn a_partial_sync_changes_only_what_changed_and_stale_chains_go_later() {
    let mut world = world();
    world.put(service("ns1", "web", "10.96.0.10", 80).local_endpoint("10.244.1.2", 8080));
    let text = world.sync(false, &[("ns1", "web")]);

    assert!(
        !text.contains("ns1/np/"),
        "only ns1/web is written:\n{text}"
    );
    assert!(!text.contains("flush map"), "maps are not flushed:\n{text}");
    assert!(
        text.contains("flush chain ip kube-proxy endpoint-"),
        "{text}"
    );
    assert!(
        !text.contains("delete chain"),
        "a stale chain waits:\n{text}"
    );
    assert_goes_to(
        &world.trace(POD, at("10.96.0.10", 80)),
        &[at("10.244.1.2", 8080)],
    );

    // A second later, the next sync deletes the flushed chain, in a
    // transaction of its own before the sync's.
    world.advance(Duration::from_secs(2));
    let text = world.sync(false, &[]);
    assert!(!text.contains("delete chain"), "{text}");
    let cleanup = world.cleanup_of_last_sync().expect("a cleanup transaction");
    assert!(
        cleanup.contains("delete chain ip kube-proxy endpoint-"),
        "{cleanup}"
    );
    assert_eq!(world.backend.programmed().stale_chains.len(), 0);

    // A removed Service leaves nothing behind.
    world.remove("ns1", "lb");
    let text = world.sync(false, &[("ns1", "lb")]);
    assert!(
        text.contains("delete element ip kube-proxy firewall-ips"),
        "{text}"
    );
    assert_eq!(
        world.trace("198.51.100.7", at("203.0.113.9", 80)),
        Verdict::Accept
    );
    assert_eq!(world.trace(POD, at("10.96.0.12", 80)), Verdict::Accept);
}

#[test]
fn endpoints_coming_and_going_switch_between_reject_and_dnat() {
    let mut world = world();
    world.put(service("ns1", "empty", "10.96.0.14", 80).remote_endpoint("10.244.2.8", 80));
    world.sync(false, &[("ns1", "empty")]);
    assert_goes_to(
        &world.trace(POD, at("10.96.0.14", 80)),
        &[at("10.244.2.8", 80)],
    );
    world.put(service("ns1", "empty", "10.96.0.14", 80));
    world.sync(false, &[("ns1", "empty")]);
    assert_eq!(world.trace(POD, at("10.96.0.14", 80)), Verdict::Reject);
}

#[test]
fn a_full_sync_over_a_table_gives_the_same_behaviour_as_a_fresh_one() {
    let mut world = world();
    world.put(service("ns1", "web", "10.96.0.10", 80).remote_endpoint("10.244.2.2", 8080));
    world.remove("ns1", "empty");
    world.sync(true, &[]);
    let mut fresh = World::v4();
    fresh.services = world.services.clone();
    fresh.sync(true, &[]);
    for (src, dst) in [
        (POD, at("10.96.0.10", 80)),
        (POD, at("10.96.0.14", 80)),
        (CLIENT, at("203.0.113.9", 80)),
        (CLIENT, at(NODE, 30080)),
    ] {
        assert_eq!(
            world.trace(src, dst),
            fresh.trace(src, dst),
            "{src} -> {dst}"
        );
    }
    assert_eq!(world.table.maps, fresh.table.maps);
}

#[test]
fn terminating_endpoints_serve_when_no_endpoint_is_ready() {
    let mut world = World::v4();
    world.put(service("ns1", "web", "10.96.0.10", 80).terminating_endpoint("10.244.1.2", 80, true));
    world.sync(true, &[]);
    assert_goes_to(
        &world.trace(POD, at("10.96.0.10", 80)),
        &[at("10.244.1.2", 80)],
    );
}

/// [`world`] with the Services of the second table above.
fn paths_world() -> World {
    let mut world = world();
    world
        .put(
            service("ns1", "three", "10.96.0.16", 80)
                .local_endpoint("10.244.1.10", 8080)
                .remote_endpoint("10.244.2.10", 8080)
                .remote_endpoint("10.244.2.11", 8080),
        )
        .put(
            service("ns1", "sticky", "10.96.0.17", 80)
                .affinity_secs(600)
                .local_endpoint("10.244.1.12", 8080)
                .remote_endpoint("10.244.2.12", 8080),
        )
        .put(
            service("ns1", "ext", "10.96.0.18", 80)
                .node_port(30082)
                .external_ip("203.0.113.6")
                .remote_endpoint("10.244.2.13", 8080),
        )
        .put(
            service("ns1", "local", "10.96.0.19", 80)
                .node_port(30083)
                .lb_ip("203.0.113.7")
                .etp_local()
                .local_endpoint("10.244.1.14", 8080),
        );
    world.sync(true, &[]);
    world
}

/// Every path of a TCP connection from `src` to `dst`.
fn paths(world: &World, src: &str, dst: std::net::SocketAddr) -> Trace {
    world.table.trace_paths(&packet(src, dst, "tcp")).unwrap()
}

/// The index in `path.matched` of the rule of a chain of `kind`
/// (`service`, `endpoint`, …) of `object` (`ns1/web/tcp/p80`, with
/// `__IP/PORT` for an endpoint) whose text contains `rule`.
#[track_caller]
fn rule_at(path: &PathOutcome, kind: &str, object: &str, rule: &str) -> usize {
    let found = path.matched.iter().position(|line| {
        line.split_once(": ").is_some_and(|(chain, text)| {
            chain.starts_with(&format!("{kind}-"))
                && chain.ends_with(&format!("-{object}"))
                && text.contains(rule)
        })
    });
    found.unwrap_or_else(|| {
        panic!(
            "no rule {rule:?} of a {kind} chain of {object} in\n{}",
            path.matched.join("\n")
        )
    })
}

/// The index in `path.matched` of exactly `line`.
#[track_caller]
fn line_at(path: &PathOutcome, line: &str) -> usize {
    path.matched
        .iter()
        .position(|matched| matched == line)
        .unwrap_or_else(|| panic!("no {line:?} in\n{}", path.matched.join("\n")))
}

/// The path's map element of `map` starting with `prefix`.
#[track_caller]
fn element<'a>(path: &'a PathOutcome, map: &str, prefix: &str) -> &'a str {
    let want = format!("{map}: {prefix}");
    path.elements
        .iter()
        .find(|element| element.starts_with(&want))
        .unwrap_or_else(|| panic!("no {want:?}… in {:#?}", path.elements))
}

#[test]
fn three_endpoints_are_three_paths_of_one_third_each() {
    let world = paths_world();
    let trace = paths(&world, POD, at("10.96.0.16", 80));
    let endpoints = [
        at("10.244.1.10", 8080),
        at("10.244.2.10", 8080),
        at("10.244.2.11", 8080),
    ];
    let destinations: Vec<_> = trace.paths.iter().map(|p| p.destination).collect();
    assert_eq!(destinations, endpoints.map(Some), "{trace:#?}");
    let total: f64 = trace.paths.iter().map(|p| p.probability).sum();
    assert!((total - 1.0).abs() < 1e-12, "probabilities sum to {total}");
    for (path, endpoint) in trace.paths.iter().zip(endpoints) {
        assert!(
            (path.probability - 1.0 / 3.0).abs() < 1e-12,
            "{endpoint}: {}",
            path.probability
        );
        assert_eq!(path.verdict, PathVerdict::Accept, "{endpoint}");
        assert!(!path.masqueraded, "a pod's own connection: {endpoint}");
        element(path, "service-ips", "10.96.0.16 . tcp . 80 : goto service-");
        assert_eq!(path.elements.len(), 1, "{:#?}", path.elements);
        // The dispatch, the service chain's choice, the endpoint's DNAT.
        let dispatch = line_at(
            path,
            "services: ip daddr . meta l4proto . th dport vmap @service-ips",
        );
        let object = format!("ns1/three/tcp/p80__{}/{}", endpoint.ip(), endpoint.port());
        let choice = rule_at(path, "service", "ns1/three/tcp/p80", "goto endpoint-");
        let dnat = rule_at(
            path,
            "endpoint",
            &object,
            &format!("meta l4proto tcp dnat to {endpoint}"),
        );
        assert!(dispatch < choice && choice < dnat, "{:#?}", path.matched);
        let (endpoint_chain, _) = path.matched[dnat].split_once(": ").unwrap();
        assert!(
            path.matched[choice].ends_with(&format!("goto {endpoint_chain}")),
            "the service chain goes to this endpoint's chain: {:#?}",
            path.matched
        );
    }
    assert_eq!(
        world
            .table
            .trace(&packet(POD, at("10.96.0.16", 80), "tcp"))
            .unwrap(),
        trace.verdict()
    );
}

#[test]
fn a_client_outside_the_source_ranges_is_dropped_by_the_firewall_chain() {
    let world = paths_world();
    let trace = paths(&world, CLIENT, at("203.0.113.9", 80));
    let [path] = trace.paths.as_slice() else {
        panic!("one path: {trace:#?}");
    };
    assert_eq!(path.verdict, PathVerdict::Drop);
    assert_eq!(path.destination, None, "dropped before DNAT");
    let check = line_at(
        path,
        "firewall-check: ip daddr . meta l4proto . th dport vmap @firewall-ips",
    );
    let drop = rule_at(
        path,
        "firewall",
        "ns1/lb/tcp/p80",
        "ip saddr != { 198.51.100.0/24 } drop",
    );
    assert!(check < drop, "{:#?}", path.matched);
    assert_eq!(
        path.elements,
        [element(
            path,
            "firewall-ips",
            "203.0.113.9 . tcp . 80 : goto firewall-"
        )]
    );

    // From inside the ranges the firewall chain lets it through to DNAT.
    let trace = paths(&world, "198.51.100.7", at("203.0.113.9", 80));
    let [path] = trace.paths.as_slice() else {
        panic!("one path: {trace:#?}");
    };
    assert_eq!(path.verdict, PathVerdict::Accept);
    assert_eq!(path.destination, Some(at("10.244.1.4", 8080)));
    element(
        path,
        "service-ips",
        "203.0.113.9 . tcp . 80 : goto external-",
    );
}

#[test]
fn external_traffic_policy_local_from_outside_keeps_the_client_address() {
    let world = paths_world();
    for dst in [at("203.0.113.7", 80), at(NODE, 30083)] {
        let trace = paths(&world, CLIENT, dst);
        let [path] = trace.paths.as_slice() else {
            panic!("{dst}: one path: {trace:#?}");
        };
        assert_eq!(path.verdict, PathVerdict::Accept, "{dst}");
        assert_eq!(path.destination, Some(at("10.244.1.14", 8080)), "{dst}");
        assert!(!path.masqueraded, "{dst}: {:#?}", path.matched);
        assert!(
            !path
                .matched
                .iter()
                .any(|line| line.starts_with("mark-for-masquerade:")
                    || line.starts_with("masquerading: masquerade")),
            "{dst}: {:#?}",
            path.matched
        );
        // It reaches the endpoint through the Service's local chain.
        rule_at(path, "local", "ns1/local/tcp/p80", "goto endpoint-");
        // And still passes the masquerading chain, which returns.
        line_at(path, "masquerading: mark and 0x00004000 == 0 return");
    }
}

#[test]
fn external_traffic_policy_cluster_from_outside_is_masqueraded() {
    let world = paths_world();
    for dst in [at("203.0.113.6", 80), at(NODE, 30082)] {
        let trace = paths(&world, CLIENT, dst);
        let [path] = trace.paths.as_slice() else {
            panic!("{dst}: one path: {trace:#?}");
        };
        assert_eq!(path.verdict, PathVerdict::Accept, "{dst}");
        assert_eq!(path.destination, Some(at("10.244.2.13", 8080)), "{dst}");
        assert!(path.masqueraded, "{dst}: {:#?}", path.matched);
        // The mark is set in nat prerouting, the masquerade done in nat
        // postrouting, after the filter checks.
        let jump = rule_at(
            path,
            "external",
            "ns1/ext/tcp/p80",
            "jump mark-for-masquerade",
        );
        let mark = line_at(path, "mark-for-masquerade: mark set mark or 0x00004000");
        let dnat = rule_at(
            path,
            "endpoint",
            "ns1/ext/tcp/p80__10.244.2.13/8080",
            "dnat to",
        );
        let forward = line_at(
            path,
            "filter-forward: ct state new jump service-endpoints-check",
        );
        let unmark = line_at(path, "masquerading: mark set mark xor 0x00004000");
        let masquerade = line_at(path, "masquerading: masquerade fully-random");
        assert!(
            jump < mark && mark < dnat && dnat < forward && forward < unmark && unmark < masquerade,
            "{dst}: {:#?}",
            path.matched
        );
    }
}

#[test]
fn session_affinity_is_reported_with_its_timeout() {
    let world = paths_world();
    let trace = paths(&world, POD, at("10.96.0.17", 80));
    // A first packet has no affinity entry yet: it is balanced as usual.
    let destinations: Vec<_> = trace.paths.iter().map(|p| p.destination).collect();
    assert_eq!(
        destinations,
        [Some(at("10.244.1.12", 8080)), Some(at("10.244.2.12", 8080))]
    );
    for path in &trace.paths {
        assert!((path.probability - 0.5).abs() < 1e-12, "{path:#?}");
        let endpoint = path.destination.unwrap();
        let own = format!("ns1/sticky/tcp/p80__{}/{}", endpoint.ip(), endpoint.port());
        // It looks up every endpoint's set (in the service chain, before the
        // choice) and adds its source to its own endpoint's set.
        let lookups: Vec<_> = path
            .affinity
            .iter()
            .filter(|a| a.rule.contains(&format!("ip saddr @{} goto", a.set)))
            .collect();
        assert_eq!(lookups.len(), 2, "{:#?}", path.affinity);
        let updates: Vec<_> = path
            .affinity
            .iter()
            .filter(|a| {
                a.rule
                    .contains(&format!("update @{} {{ ip saddr }}", a.set))
            })
            .collect();
        let [update] = updates.as_slice() else {
            panic!("one update: {:#?}", path.affinity);
        };
        assert!(update.set.starts_with("affinity-"), "{update:?}");
        assert!(update.set.ends_with(&own), "{update:?}");
        assert!(update.rule.starts_with("endpoint-"), "{update:?}");
        for affinity in &path.affinity {
            assert_eq!(affinity.timeout_secs, Some(600), "{affinity:?}");
        }
    }
    // A Service without affinity passes none.
    let trace = paths(&world, POD, at("10.96.0.16", 80));
    assert!(
        trace.paths.iter().all(|p| p.affinity.is_empty()),
        "{trace:#?}"
    );
}

#[test]
fn a_service_without_endpoints_is_one_reject_path_naming_its_element() {
    let world = paths_world();
    let trace = paths(&world, POD, at("10.96.0.14", 80));
    let [path] = trace.paths.as_slice() else {
        panic!("one path: {trace:#?}");
    };
    assert_eq!(path.verdict, PathVerdict::Reject);
    assert_eq!(path.destination, None);
    assert_eq!(path.probability, 1.0);
    assert_eq!(
        path.elements,
        ["no-endpoint-services: 10.96.0.14 . tcp . 80 : goto reject-chain"]
    );
    let check = line_at(
        path,
        "service-endpoints-check: ip daddr . meta l4proto . th dport vmap @no-endpoint-services",
    );
    assert_eq!(
        path.matched.last().map(String::as_str),
        Some("reject-chain: reject")
    );
    assert!(check < path.matched.len() - 1);
    assert_eq!(trace.verdict(), Verdict::Reject);
}

#[test]
fn an_unknown_port_of_a_cluster_ip_is_rejected_naming_its_set_element() {
    let world = paths_world();
    let trace = paths(&world, POD, at("10.96.0.10", 81));
    let [path] = trace.paths.as_slice() else {
        panic!("one path: {trace:#?}");
    };
    assert_eq!(path.verdict, PathVerdict::Reject);
    assert_eq!(path.destination, None);
    assert_eq!(path.elements, ["cluster-ips: 10.96.0.10"]);
    assert_eq!(
        path.matched.last().map(String::as_str),
        Some(
            "cluster-ips-check: ip daddr @cluster-ips reject \
             comment \"Reject traffic to invalid ports of ClusterIPs\""
        )
    );
}

#[test]
fn the_kernel_form_of_the_table_gives_the_same_paths() {
    // A read-back holds the rules in the kernel's form (an address list of
    // one entry a comparison): the paths over it are the same, down to the
    // chains of the rules they match.
    let world = paths_world();
    let read = kp_nftables::live::kernel_form(&world.table);
    let chains = |path: &PathOutcome| -> Vec<String> {
        let chain = |line: &String| line.split_once(": ").unwrap().0.to_owned();
        path.matched.iter().map(chain).collect()
    };
    for (src, dst) in [
        (POD, at("10.96.0.16", 80)),
        (POD, at("10.96.0.17", 80)),
        (POD, at("10.96.0.14", 80)),
        (CLIENT, at("203.0.113.9", 80)),
        ("198.51.100.7", at("203.0.113.9", 80)),
        (CLIENT, at("203.0.113.6", 80)),
        (CLIENT, at(NODE, 30083)),
        (NODE, at(NODE, 30080)),
    ] {
        let packet = packet(src, dst, "tcp");
        let want = world.table.trace_paths(&packet).unwrap();
        let got = read.trace_paths(&packet).unwrap();
        assert_eq!(got.paths.len(), want.paths.len(), "{src} -> {dst}");
        for (got, want) in got.paths.iter().zip(&want.paths) {
            assert_eq!(got.destination, want.destination, "{src} -> {dst}");
            assert_eq!(got.verdict, want.verdict, "{src} -> {dst}");
            assert_eq!(got.masqueraded, want.masqueraded, "{src} -> {dst}");
            assert_eq!(got.probability, want.probability, "{src} -> {dst}");
            assert_eq!(got.elements, want.elements, "{src} -> {dst}");
            assert_eq!(got.affinity.len(), want.affinity.len(), "{src} -> {dst}");
            assert_eq!(chains(got), chains(want), "{src} -> {dst}");
        }
    }
}

#[test]
fn ipv6_paths_name_their_rules_as_ip6() {
    let mut world = World::with(kp_model::IpFamily::V6, kp_node::NodePortAddresses::All);
    world.put(
        service("ns1", "web6", "fd00:10:96::10", 80)
            .remote_endpoint("fd00:10:244:2::2", 8080)
            .remote_endpoint("fd00:10:244:2::3", 8080),
    );
    world.sync(true, &[]);
    let trace = paths(&world, "fd00:10:244:1::7", at("fd00:10:96::10", 80));
    let destinations: Vec<_> = trace.paths.iter().map(|p| p.destination).collect();
    assert_eq!(
        destinations,
        [
            Some(at("fd00:10:244:2::2", 8080)),
            Some(at("fd00:10:244:2::3", 8080))
        ]
    );
    for path in &trace.paths {
        assert_eq!(path.probability, 0.5);
        line_at(
            path,
            "services: ip6 daddr . meta l4proto . th dport vmap @service-ips",
        );
        element(
            path,
            "service-ips",
            "fd00:10:96::10 . tcp . 80 : goto service-",
        );
        let endpoint = path.destination.unwrap();
        rule_at(
            path,
            "endpoint",
            // Chain names spell an IPv6 address with dots.
            &format!(
                "ns1/web6/tcp/p80__{}/{}",
                endpoint.ip().to_string().replace(':', "."),
                endpoint.port()
            ),
            &format!("meta l4proto tcp dnat to {endpoint}"),
        );
    }
}
