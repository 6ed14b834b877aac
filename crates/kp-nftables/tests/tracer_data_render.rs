//! The data layout ([`Layout::Data`]) as rendered by the backend, traced
//! packet by packet, and the commands its partial syncs send.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web:p80 | ClusterIP 10.96.0.10, endpoints 10.244.1.2 (here), 10.244.2.2 (node-2) |
//! | ns1/np:p80 | NodePort 30080, externalIP 203.0.113.5, eTP Local, endpoint 10.244.2.3 (node-2) |
//! | ns1/lb:p80 | LB 203.0.113.9 from 198.51.100.0/24 only, NodePort 30081, eTP Local, endpoints 10.244.1.4 (here), 10.244.2.4 (node-2) |
//! | ns1/empty:p80 | ClusterIP 10.96.0.14, no endpoints |
//! | ns1/itp:p80 | ClusterIP 10.96.0.15, iTP Local, endpoint 10.244.2.5 (node-2) |
//!
//! ClientIP affinity is told over [`sticky_world`]:
//!
//! | object | addresses |
//! |---|---|
//! | ns1/sticky:p80 | ClusterIP 10.96.0.17, externalIP 203.0.113.17, NodePort 30090, ClientIP affinity 600 s, endpoints 10.244.1.12 (here), 10.244.2.12 |
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;

use common::{assert_goes_to, at, ip, packet, service, ServiceBuilder, World};
use kp_model::NamespacedName;
use kp_nftables::model::{Command, Expr, Key, Name};
use kp_nftables::tracer::Verdict;
use kp_nftables::Transaction;

const POD: &str = "10.244.1.7";
const CLIENT: &str = "192.168.99.10";
const NODE: &str = "192.168.99.2";

fn web(second: &str) -> common::ServiceBuilder {
    service("ns1", "web", "10.96.0.10", 80)
        .local_endpoint("10.244.1.2", 8080)
        .remote_endpoint(second, 8080)
}

fn world() -> World {
    let mut world = World::v4_data();
    world
        .put(web("10.244.2.2"))
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
                .node_port(30081)
                .etp_local()
                .local_endpoint("10.244.1.4", 8080)
                .remote_endpoint("10.244.2.4", 8080),
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

/// The commands of the last sync's own transaction.
fn last_commands(world: &World) -> Vec<Command> {
    world
        .applier
        .transactions()
        .last()
        .unwrap()
        .transaction
        .commands
        .clone()
}

/// The chains the commands declare, flush or add rules to.
fn chains_written(commands: &[Command]) -> BTreeSet<String> {
    commands
        .iter()
        .filter_map(|command| match command {
            Command::AddChain { name, .. } | Command::FlushChain(name) => {
                Some(name.as_str().to_owned())
            }
            Command::AddRule(rule) => Some(rule.chain.as_str().to_owned()),
            _ => None,
        })
        .collect()
}

/// Of every draw rule of the commands: whether it is keyed by address
/// (not by NodePort), and its modulus.
fn draws(commands: &[Command]) -> Vec<(bool, u32)> {
    commands
        .iter()
        .filter_map(|command| match command {
            Command::AddRule(rule) => rule.exprs.iter().find_map(|expr| match expr {
                Expr::DnatDraw {
                    with_addr,
                    endpoints,
                    ..
                } => Some((*with_addr, *endpoints)),
                _ => None,
            }),
            _ => None,
        })
        .collect()
}

/// The keys the commands add to and delete from `set`.
fn set_changes(commands: &[Command], wanted: &str) -> (Vec<Key>, Vec<Key>) {
    let mut added = Vec::new();
    let mut deleted = Vec::new();
    for command in commands {
        match command {
            Command::AddElements { set, elements } if set.as_str() == wanted => {
                added.extend(elements.iter().map(|element| element.key));
            }
            Command::DeleteElements { set, keys } if set.as_str() == wanted => {
                deleted.extend(keys.iter().copied());
            }
            _ => {}
        }
    }
    (added, deleted)
}

/// A tcp Service entry.
fn entry(address: &str, port: u16) -> Key {
    Key::AddrProtoPort(ip(address), kp_model::Protocol::Tcp, port)
}

/// The `hairpin-endpoints` pairs the commands add or delete.
fn hairpin_changes(commands: &[Command]) -> (Vec<Key>, Vec<Key>) {
    let mut added = Vec::new();
    let mut deleted = Vec::new();
    for command in commands {
        match command {
            Command::AddElements { set, elements } if set.as_str() == "hairpin-endpoints" => {
                added.extend(elements.iter().map(|element| element.key));
            }
            Command::DeleteElements { set, keys } if set.as_str() == "hairpin-endpoints" => {
                deleted.extend(keys.iter().copied());
            }
            _ => {}
        }
    }
    (added, deleted)
}

fn pair(text: &str) -> Key {
    Key::AddrPair(ip(text), ip(text))
}

#[test]
fn cluster_ip_goes_to_one_of_its_endpoints_and_a_pod_reaching_itself_is_masqueraded() {
    let world = world();
    let verdict = world.trace(POD, at("10.96.0.10", 80));
    assert_goes_to(&verdict, &[at("10.244.1.2", 8080), at("10.244.2.2", 8080)]);
    let Verdict::Dnat { masquerade, .. } = verdict else {
        panic!("pod traffic is DNATed");
    };
    assert!(masquerade.is_empty(), "a pod's connection keeps its source");
    // From outside the cluster the packet is masqueraded.
    let Verdict::Dnat { masquerade, .. } = world.trace(CLIENT, at("10.96.0.10", 80)) else {
        panic!("client traffic is DNATed");
    };
    assert_eq!(masquerade.len(), 2);
    // Hairpin: the pair 10.244.1.2 . 10.244.1.2 is in the set.
    let Verdict::Dnat { masquerade, .. } = world.trace("10.244.1.2", at("10.96.0.10", 80)) else {
        panic!("hairpin traffic is DNATed");
    };
    assert_eq!(
        masquerade.into_iter().collect::<Vec<_>>(),
        [at("10.244.1.2", 8080)]
    );
}

#[test]
fn a_new_connection_has_one_path_per_slot_each_equally_likely() {
    let world = world();
    let trace = world
        .table
        .trace_paths(&packet(POD, at("10.96.0.10", 80), "tcp"))
        .unwrap();
    let mut destinations: Vec<_> = trace
        .paths
        .iter()
        .map(|path| (path.destination.unwrap(), path.probability))
        .collect();
    destinations.sort_by_key(|(destination, _)| *destination);
    assert_eq!(destinations.len(), 2, "{trace:#?}");
    // Each path names the class rule that drew (count 2), not the rules
    // of other counts it walked past.
    for path in &trace.paths {
        let draws: Vec<&String> = path
            .matched
            .iter()
            .filter(|rule| rule.contains("numgen random mod"))
            .collect();
        assert_eq!(draws.len(), 1, "{path:#?}");
        assert!(draws[0].contains("@endpoint-count-2 "), "{path:#?}");
    }
    for (destination, probability) in destinations {
        assert!(
            (probability - 0.5).abs() < 1e-9,
            "{destination}: {probability}"
        );
    }
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
    assert_eq!(world.trace(CLIENT, at(NODE, 30080)), Verdict::Drop);
    assert_eq!(world.trace(CLIENT, at("203.0.113.5", 80)), Verdict::Drop);
    assert_goes_to(
        &world.trace(POD, at(NODE, 30080)),
        &[at("10.244.2.3", 8080)],
    );
    let Verdict::Dnat { masquerade, .. } = world.trace(NODE, at("203.0.113.5", 80)) else {
        panic!("node traffic is DNATed");
    };
    assert_eq!(masquerade.len(), 1, "the node's own traffic is masqueraded");
    assert_goes_to(
        &world.trace(CLIENT, at("10.96.0.11", 80)),
        &[at("10.244.2.3", 8080)],
    );
}

/// eTP Local draws from the local list (a number of its own); the
/// ClusterIP from the cluster list.
#[test]
fn external_traffic_policy_local_draws_local_endpoints_and_keeps_the_source() {
    let world = world();
    let from_range = "198.51.100.7";
    for dst in [at("203.0.113.9", 80), at(NODE, 30081)] {
        let verdict = world.trace(from_range, dst);
        assert_goes_to(&verdict, &[at("10.244.1.4", 8080)]);
        let Verdict::Dnat { masquerade, .. } = verdict else {
            unreachable!()
        };
        assert!(masquerade.is_empty(), "{dst}: the client's address is kept");
    }
    assert_goes_to(
        &world.trace(POD, at("10.96.0.12", 80)),
        &[at("10.244.1.4", 8080), at("10.244.2.4", 8080)],
    );
}

#[test]
fn load_balancer_source_ranges_drop_other_sources() {
    let world = world();
    assert_eq!(world.trace(CLIENT, at("203.0.113.9", 80)), Verdict::Drop);
}

#[test]
fn internal_traffic_policy_local_without_local_endpoints_drops() {
    let world = world();
    assert_eq!(world.trace(POD, at("10.96.0.15", 80)), Verdict::Drop);
}

#[test]
fn terminating_endpoints_serve_when_no_endpoint_is_ready() {
    let mut world = World::v4_data();
    world.put(service("ns1", "web", "10.96.0.10", 80).terminating_endpoint("10.244.1.2", 80, true));
    world.sync(true, &[]);
    assert_goes_to(
        &world.trace(POD, at("10.96.0.10", 80)),
        &[at("10.244.1.2", 80)],
    );
}

/// An endpoint replaced is an element-only transaction: no chain, no rule.
#[test]
fn a_replaced_endpoint_changes_elements_only() {
    let mut world = world();
    world.put(web("10.244.2.9"));
    world.sync(false, &[("ns1", "web")]);
    let commands = last_commands(&world);
    assert!(
        commands.iter().all(|command| matches!(
            command,
            Command::AddElements { .. }
                | Command::DeleteElements { .. }
                | Command::AddMapElements { .. }
        )),
        "{commands:#?}"
    );
    assert_eq!(
        hairpin_changes(&commands),
        (vec![pair("10.244.2.9")], vec![pair("10.244.2.2")])
    );
    assert_goes_to(
        &world.trace(POD, at("10.96.0.10", 80)),
        &[at("10.244.1.2", 8080), at("10.244.2.9", 8080)],
    );
}

/// A readiness flip that keeps the count (one endpoint stops being ready
/// as another becomes ready) is an element-only transaction too.
#[test]
fn a_readiness_flip_that_keeps_the_count_changes_elements_only() {
    let mut world = World::v4_data();
    world.put(
        service("ns1", "web", "10.96.0.10", 80)
            .local_endpoint("10.244.1.2", 8080)
            .terminating_endpoint("10.244.2.2", 8080, false),
    );
    world.sync(true, &[]);
    world.put(
        service("ns1", "web", "10.96.0.10", 80)
            .terminating_endpoint("10.244.1.2", 8080, true)
            .remote_endpoint("10.244.2.2", 8080),
    );
    world.sync(false, &[("ns1", "web")]);
    let commands = last_commands(&world);
    assert!(
        !commands.iter().any(|command| command.is_rule()),
        "{commands:#?}"
    );
    assert!(chains_written(&commands).is_empty(), "{commands:#?}");
    assert_goes_to(
        &world.trace(POD, at("10.96.0.10", 80)),
        &[at("10.244.2.2", 8080)],
    );
}

/// A count change to a count some entry of the pool already has moves the
/// entry from one count set to the other and deletes (or adds) its last
/// slot: elements only, no chain and no rule.
#[test]
fn a_count_change_to_a_count_in_use_changes_elements_only() {
    let mut world = world();
    // np's entries draw among 1 endpoint: the class of count 1 exists.
    world.put(service("ns1", "web", "10.96.0.10", 80).local_endpoint("10.244.1.2", 8080));
    world.sync(false, &[("ns1", "web")]);
    let commands = last_commands(&world);
    assert!(
        !commands.iter().any(|command| command.is_rule()),
        "{commands:#?}"
    );
    assert!(chains_written(&commands).is_empty(), "{commands:#?}");
    assert_eq!(
        set_changes(&commands, "endpoint-count-1"),
        (vec![entry("10.96.0.10", 80)], vec![])
    );
    assert_eq!(
        set_changes(&commands, "endpoint-count-2"),
        (vec![], vec![entry("10.96.0.10", 80)])
    );
    assert_goes_to(
        &world.trace(POD, at("10.96.0.10", 80)),
        &[at("10.244.1.2", 8080)],
    );
    // And back: the slot comes again.
    world.put(web("10.244.2.2"));
    world.sync(false, &[("ns1", "web")]);
    assert!(!last_commands(&world).iter().any(Command::is_rule));
    assert_goes_to(
        &world.trace(POD, at("10.96.0.10", 80)),
        &[at("10.244.1.2", 8080), at("10.244.2.2", 8080)],
    );
}

/// The lb Service with cluster endpoints 10.244.1.4 and 10.244.2.4, and
/// `more` remote ones 10.244.2.6, .7, ….
fn lb_with(more: u8) -> common::ServiceBuilder {
    let mut lb = service("ns1", "lb", "10.96.0.12", 80)
        .lb_ip("203.0.113.9")
        .source_range("198.51.100.0/24")
        .node_port(30081)
        .etp_local()
        .local_endpoint("10.244.1.4", 8080)
        .remote_endpoint("10.244.2.4", 8080);
    for n in 0..more {
        lb = lb.remote_endpoint(&format!("10.244.2.{}", 6 + n), 8080);
    }
    lb
}

/// One more endpoint than any entry has: its class was written ahead (each
/// class in use comes with the counts one below and one above), so the
/// change is elements only.
#[test]
fn one_endpoint_more_than_any_entry_has_changes_elements_only() {
    let mut world = world();
    world.put(lb_with(1));
    world.sync(false, &[("ns1", "lb")]);
    let commands = last_commands(&world);
    assert!(!commands.iter().any(Command::is_rule), "{commands:#?}");
    assert!(chains_written(&commands).is_empty(), "{commands:#?}");
    assert_goes_to(
        &world.trace(POD, at("10.96.0.12", 80)),
        &[
            at("10.244.1.4", 8080),
            at("10.244.2.4", 8080),
            at("10.244.2.6", 8080),
        ],
    );
}

/// A count the table holds no class for (here 5, where counts 1 to 3 are
/// held) adds its class and those of its neighbours: the count sets are
/// declared and the chain of their group (counts 1 to 8) written anew with
/// every class it held, addresses first; the class chain, whose groups
/// stay, and the Service chains are not rewritten.
#[test]
fn a_new_count_writes_its_group_chain_and_no_service_chain() {
    let mut world = world();
    world.put(lb_with(3));
    world.sync(false, &[("ns1", "lb")]);
    let commands = last_commands(&world);
    let written = chains_written(&commands);
    assert_eq!(
        written.into_iter().collect::<Vec<_>>(),
        ["endpoints-by-count-tcp-1-8"]
    );
    // The group chain: address classes 1 to 6, then NodePort classes 1 to 6.
    let expected: Vec<(bool, u32)> = [true, false]
        .into_iter()
        .flat_map(|with_addr| (1..=6).map(move |count| (with_addr, count)))
        .collect();
    assert_eq!(draws(&commands), expected);
    let lb: Vec<_> = [
        "10.244.1.4",
        "10.244.2.4",
        "10.244.2.6",
        "10.244.2.7",
        "10.244.2.8",
    ]
    .iter()
    .map(|ip| at(ip, 8080))
    .collect();
    assert_goes_to(&world.trace(POD, at("10.96.0.12", 80)), &lb);
    // A pod reaching the NodePort short-circuits to the cluster list.
    assert_goes_to(&world.trace(POD, at(NODE, 30081)), &lb);
}

/// The rules of the class chain the commands write: for each, whether it
/// is keyed by address (not by NodePort), its group set and the chain it
/// goes to.
fn group_rules(commands: &[Command]) -> Vec<(bool, String, String)> {
    commands
        .iter()
        .filter_map(|command| match command {
            Command::AddRule(rule) if rule.chain.as_str() == "endpoints-by-count-tcp" => {
                match rule.exprs.as_slice() {
                    [Expr::EntryInSet { with_addr, set }, Expr::Verdict(kp_nftables::model::Verdict::Goto(chain))] => {
                        Some((*with_addr, set.to_string(), chain.to_string()))
                    }
                    other => panic!("not a group rule: {other:?}"),
                }
            }
            _ => None,
        })
        .collect()
}

/// The lb Service's 12 cluster endpoints ([`lb_with`]).
fn twelve() -> Vec<std::net::SocketAddr> {
    let mut endpoints = vec![at("10.244.1.4", 8080), at("10.244.2.4", 8080)];
    endpoints.extend((6..16).map(|n| at(&format!("10.244.2.{n}"), 8080)));
    endpoints
}

/// A count far from those held (12, where 1 to 3 are held) adds the
/// classes 11 to 13 in a group of their own (9 to 16): its chain and sets
/// are declared and filled, and the class chain is written anew with one
/// rule per group, address groups first; no Service chain is rewritten.
#[test]
fn a_count_in_a_new_group_writes_its_group_chain_and_the_class_chain() {
    let mut world = world();
    world.put(lb_with(10));
    world.sync(false, &[("ns1", "lb")]);
    let commands = last_commands(&world);
    assert_eq!(
        chains_written(&commands).into_iter().collect::<Vec<_>>(),
        ["endpoints-by-count-tcp", "endpoints-by-count-tcp-9-16"]
    );
    let expected: Vec<(bool, u32)> = [true, false]
        .into_iter()
        .flat_map(|with_addr| (11..=13).map(move |count| (with_addr, count)))
        .collect();
    assert_eq!(draws(&commands), expected);
    let group =
        |with_addr: bool, set: &str, chain: &str| (with_addr, set.to_owned(), chain.to_owned());
    assert_eq!(
        group_rules(&commands),
        [
            group(true, "endpoint-group-1-8", "endpoints-by-count-tcp-1-8"),
            group(true, "endpoint-group-9-16", "endpoints-by-count-tcp-9-16"),
            group(false, "nodeport-group-1-8", "endpoints-by-count-tcp-1-8"),
            group(false, "nodeport-group-9-16", "endpoints-by-count-tcp-9-16"),
        ]
    );
    // The ClusterIP, and the LB IP (pods reach it through the cluster
    // list).
    assert_eq!(
        set_changes(&commands, "endpoint-group-9-16"),
        (
            vec![entry("10.96.0.12", 80), entry("203.0.113.9", 80)],
            vec![]
        )
    );
    assert_goes_to(&world.trace(POD, at("10.96.0.12", 80)), &twelve());
    assert_goes_to(&world.trace(POD, at(NODE, 30081)), &twelve());
}

/// A new connection to an entry with 12 endpoints walks the class chain's
/// rule of its group (9 to 16) into the group chain, where the class rule
/// of 12 draws: one path per slot, each named by the group rule and the
/// one class rule, each one in twelve.
#[test]
fn a_new_connection_goes_through_its_group_to_its_class() {
    let mut world = world();
    world.put(lb_with(10));
    world.sync(false, &[("ns1", "lb")]);
    let trace = world
        .table
        .trace_paths(&packet(POD, at("10.96.0.12", 80), "tcp"))
        .unwrap();
    let mut destinations: Vec<_> = trace
        .paths
        .iter()
        .map(|path| path.destination.unwrap())
        .collect();
    destinations.sort();
    let mut expected = twelve();
    expected.sort();
    assert_eq!(destinations, expected, "{trace:#?}");
    for path in &trace.paths {
        assert!((path.probability - 1.0 / 12.0).abs() < 1e-9, "{path:#?}");
        let groups: Vec<&String> = path
            .matched
            .iter()
            .filter(|rule| rule.contains(" goto endpoints-by-count-tcp-"))
            .collect();
        assert_eq!(groups.len(), 1, "{path:#?}");
        assert!(
            groups[0].contains("@endpoint-group-9-16 goto endpoints-by-count-tcp-9-16"),
            "{path:#?}"
        );
        let draws: Vec<&String> = path
            .matched
            .iter()
            .filter(|rule| rule.contains("numgen random mod"))
            .collect();
        assert_eq!(draws.len(), 1, "{path:#?}");
        assert!(
            draws[0].starts_with("endpoints-by-count-tcp-9-16: "),
            "{path:#?}"
        );
        assert!(draws[0].contains("@endpoint-count-12 "), "{path:#?}");
        assert!(
            path.elements
                .iter()
                .any(|element| element == "endpoint-group-9-16: 10.96.0.12 . tcp . 80"),
            "{path:#?}"
        );
    }
}

/// Eight endpoints hold the classes 7 to 9, so a ninth endpoint (count 9,
/// the next group) and its removal move the entry between count sets and
/// group sets: elements only, and connections follow.
#[test]
fn a_count_crossing_a_group_boundary_changes_elements_only() {
    let mut world = world();
    world.put(lb_with(6));
    world.sync(false, &[("ns1", "lb")]);
    for (more, from, to) in [
        (7, "endpoint-group-1-8", "endpoint-group-9-16"),
        (6, "endpoint-group-9-16", "endpoint-group-1-8"),
    ] {
        world.put(lb_with(more));
        world.sync(false, &[("ns1", "lb")]);
        let commands = last_commands(&world);
        assert!(!commands.iter().any(Command::is_rule), "{commands:#?}");
        assert!(chains_written(&commands).is_empty(), "{commands:#?}");
        let entries = vec![entry("10.96.0.12", 80), entry("203.0.113.9", 80)];
        assert_eq!(
            set_changes(&commands, to),
            (entries.clone(), vec![]),
            "{commands:#?}"
        );
        assert_eq!(
            set_changes(&commands, from),
            (vec![], entries),
            "{commands:#?}"
        );
        let mut endpoints = twelve();
        endpoints.truncate(2 + usize::from(more));
        assert_goes_to(&world.trace(POD, at("10.96.0.12", 80)), &endpoints);
    }
}

/// A group no class is left in goes with the next full sync, whether it
/// renders the table (no generations) or sends only what differs: its
/// chain is flushed and deleted, its sets deleted, the class chain written
/// without its rule; a second full sync writes nothing of it.
#[test]
fn a_full_sync_deletes_a_group_no_class_is_left_in() {
    for generations in [false, true] {
        let mut world = if generations {
            World::v4_data().with_generations()
        } else {
            World::v4_data()
        };
        world.put(web("10.244.2.2")).put(lb_with(0));
        world.sync(true, &[]);
        world.put(lb_with(10));
        world.sync(false, &[("ns1", "lb")]);
        world.put(lb_with(0));
        world.sync(false, &[("ns1", "lb")]);
        assert!(
            !last_commands(&world).iter().any(Command::is_rule),
            "a partial sync keeps the group"
        );
        let text = world.sync(true, &[]);
        for deleted in [
            "delete chain ip kube-proxy endpoints-by-count-tcp-9-16",
            "delete set ip kube-proxy endpoint-group-9-16",
            "delete set ip kube-proxy nodeport-group-9-16",
        ] {
            assert!(text.contains(deleted), "{generations}: {deleted}: {text}");
        }
        assert!(!text.contains("@endpoint-group-9-16"), "{text}");
        assert!(world
            .backend
            .programmed()
            .classes
            .iter()
            .all(|class| class.count < 9));
        assert_goes_to(
            &world.trace(POD, at("10.96.0.12", 80)),
            &[at("10.244.1.4", 8080), at("10.244.2.4", 8080)],
        );
        let again = world.sync(true, &[]);
        if generations {
            assert!(!again.contains("delete"), "{again}");
            assert!(!again.contains("add rule"), "{again}");
        }
        assert!(!again.contains("9-16"), "{again}");
    }
}

/// A class no Service needs any more stays until the next full sync,
/// which writes the class chains without it and deletes its count set.
#[test]
fn an_unused_class_is_kept_until_a_full_sync_deletes_its_count_set() {
    let mut world = world();
    let five = |world: &World| {
        world
            .backend
            .programmed()
            .classes
            .iter()
            .any(|class| class.count == 5)
    };
    assert!(!five(&world));
    let mut many = service("ns1", "web", "10.96.0.10", 80).local_endpoint("10.244.1.2", 8080);
    for last in 2..6 {
        many = many.remote_endpoint(&format!("10.244.2.{last}"), 8080);
    }
    world.put(many);
    world.sync(false, &[("ns1", "web")]);
    assert!(five(&world));
    world.put(web("10.244.2.2"));
    world.sync(false, &[("ns1", "web")]);
    assert!(five(&world), "kept by a partial sync");
    assert!(!last_commands(&world).iter().any(Command::is_rule));
    world.sync(true, &[]);
    assert!(!five(&world));
    let text = world.applier.transactions().last().unwrap().text.clone();
    for count in [4, 5, 6] {
        assert!(
            text.contains(&format!("delete set ip kube-proxy endpoint-count-{count}")),
            "{text}"
        );
        assert!(!text.contains(&format!("mod {count} map")), "{text}");
    }
    assert!(
        text.contains("mod 3 map"),
        "the neighbour of 2 stays: {text}"
    );
    assert_goes_to(
        &world.trace(POD, at("10.96.0.10", 80)),
        &[at("10.244.1.2", 8080), at("10.244.2.2", 8080)],
    );
}

/// An address that is an endpoint of two Services needs one pair, kept
/// until the last Service stops using it.
#[test]
fn a_hairpin_pair_stays_until_the_last_service_using_it_goes() {
    let mut world = world();
    world.put(service("ns1", "web2", "10.96.0.21", 81).local_endpoint("10.244.1.2", 8081));
    world.sync(false, &[("ns1", "web2")]);
    assert_eq!(hairpin_changes(&last_commands(&world)), (vec![], vec![]));
    world.remove("ns1", "web");
    world.sync(false, &[("ns1", "web")]);
    assert_eq!(
        hairpin_changes(&last_commands(&world)),
        (vec![], vec![pair("10.244.2.2")])
    );
    let Verdict::Dnat { masquerade, .. } = world.trace("10.244.1.2", at("10.96.0.21", 81)) else {
        panic!("hairpin traffic is DNATed");
    };
    assert_eq!(masquerade.len(), 1, "the pair is still there");
    world.remove("ns1", "web2");
    world.sync(false, &[("ns1", "web2")]);
    assert_eq!(
        hairpin_changes(&last_commands(&world)),
        (vec![], vec![pair("10.244.1.2")])
    );
    let programmed = world.backend.programmed();
    assert!(!programmed.hairpin.contains_key(&ip("10.244.1.2")));
    assert!(programmed
        .services
        .keys()
        .all(|service| *service != NamespacedName::new("ns1", "web2")));
}

/// A full sync over the table (no reset) behaves as the fresh table did.
#[test]
fn a_full_sync_over_the_table_gives_the_same_behaviour() {
    let mut world = world();
    world.put(web("10.244.2.9"));
    world.sync(false, &[("ns1", "web")]);
    world.sync(true, &[]);
    assert_goes_to(
        &world.trace(POD, at("10.96.0.10", 80)),
        &[at("10.244.1.2", 8080), at("10.244.2.9", 8080)],
    );
    assert_eq!(world.trace(POD, at("10.96.0.14", 80)), Verdict::Reject);
    assert_eq!(world.trace(CLIENT, at("203.0.113.9", 80)), Verdict::Drop);
}

/// The data layout writes no `endpoint-` chain; the chains layout does.
#[test]
fn the_data_layout_has_no_endpoint_chains_and_the_chains_layout_has() {
    let data = world();
    let mut chains = World::v4();
    chains.put(web("10.244.2.2"));
    let chains_text = chains.sync(true, &[]);
    let data_text = data.applier.transactions().last().unwrap().text.clone();
    assert!(chains_text.contains("add chain ip kube-proxy endpoint-"));
    assert!(!chains_text.contains("hairpin-endpoints"));
    assert!(!data_text.contains("add chain ip kube-proxy endpoint-"));
    assert!(data_text.contains("@hairpin-endpoints"));
}

/// A Service with ClientIP affinity 600 s, reached by its ClusterIP, an
/// external IP and a NodePort.
fn sticky() -> ServiceBuilder {
    service("ns1", "sticky", "10.96.0.17", 80)
        .affinity_secs(600)
        .node_port(30090)
        .external_ip("203.0.113.17")
        .local_endpoint("10.244.1.12", 8080)
        .remote_endpoint("10.244.2.12", 8080)
}

fn sticky_world() -> World {
    let mut world = World::v4_data();
    world.put(sticky());
    world.sync(true, &[]);
    world
}

/// The lines of `text` that belong to ns1/sticky, sorted.
fn sticky_lines(text: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("ns1/sticky/"))
        .collect();
    lines.sort_unstable();
    lines
}

/// A service port with ClientIP affinity is written as the chains layout
/// writes it (upstream's shape): a chain and a set of clients per endpoint,
/// looked up by the service chain before it draws; affinity is then per
/// service port, through every entry. The data layout's draw, its maps and
/// any affinity recording of its own are not used for it.
#[test]
fn a_service_port_with_affinity_is_written_as_the_chains_layout_writes_it() {
    let data = sticky_world();
    let data_text = data.applier.transactions().last().unwrap().text.clone();
    let mut chains = World::v4();
    chains.put(sticky());
    let chains_text = chains.sync(true, &[]);

    let own = sticky_lines(&data_text);
    assert_eq!(own, sticky_lines(&chains_text));
    assert_eq!(
        own.iter()
            .filter(|line| line.starts_with("add chain ip kube-proxy endpoint-"))
            .count(),
        2,
        "{own:#?}"
    );
    assert_eq!(
        own.iter()
            .filter(|line| line.starts_with("add set ip kube-proxy affinity-"))
            .count(),
        2,
        "{own:#?}"
    );
    for absent in ["affinity-prerouting", "affinity-tcp-", "endpoint-count-"] {
        assert!(!data_text.contains(absent), "{absent}: {data_text}");
    }
    let drawn: Vec<&str> = data_text
        .lines()
        .filter(|line| {
            line.contains("10.96.0.17 . ")
                && !line.starts_with("add element ip kube-proxy service-ips ")
        })
        .collect();
    assert!(drawn.is_empty(), "no slot or count-set element: {drawn:#?}");
}

/// A client in an endpoint's affinity set goes to that endpoint through
/// the ClusterIP, the external IP and the NodePort alike; another client
/// is drawn among every endpoint.
#[test]
fn a_client_with_affinity_goes_to_its_endpoint_through_every_entry() {
    let mut world = sticky_world();
    let text = world.applier.transactions().last().unwrap().text.clone();
    let set = text
        .lines()
        .filter_map(|line| line.strip_prefix("add set ip kube-proxy "))
        .map(|rest| rest.split(' ').next().unwrap())
        .find(|name| name.starts_with("affinity-") && name.ends_with("__10.244.2.12/8080"))
        .expect("the remote endpoint's affinity set")
        .to_owned();
    let entry = Transaction {
        family: kp_model::IpFamily::V4,
        commands: vec![Command::AddElements {
            set: Name::Shared(set.into()),
            elements: vec![kp_nftables::model::SetElement {
                key: Key::Addr(ip(CLIENT)),
                comment: None,
                verdict: None,
            }],
        }],
    };
    world.table.apply(&entry).unwrap();
    for entry in [
        at("10.96.0.17", 80),
        at("203.0.113.17", 80),
        at(NODE, 30090),
    ] {
        assert_goes_to(&world.trace(CLIENT, entry), &[at("10.244.2.12", 8080)]);
        assert_goes_to(
            &world.trace("192.168.99.11", entry),
            &[at("10.244.1.12", 8080), at("10.244.2.12", 8080)],
        );
    }
}

/// The kernel refuses a rule naming a map the table does not hold
/// (ENOENT); so does the fake, or a transaction that leaves out a map
/// declaration would pass here and fail on a node.
#[test]
fn the_fake_refuses_a_rule_naming_a_map_the_table_lacks() {
    use kp_nftables::model::{ChainKind, Rule};
    use kp_nftables::{Applier, FakeApplier};
    let mut applier = FakeApplier::new();
    let transaction = Transaction {
        family: kp_model::IpFamily::V4,
        commands: vec![
            Command::AddTable { comment: None },
            Command::AddChain {
                name: Name::Fixed("svc"),
                kind: ChainKind::Regular,
            },
            Command::AddRule(Rule::new(
                "svc",
                vec![Expr::DnatDraw {
                    protocol: kp_model::Protocol::Tcp,
                    with_addr: true,
                    endpoints: 2,
                    map: Name::Fixed("service-endpoints-tcp"),
                }],
            )),
        ],
    };
    let error = applier.apply(&transaction).unwrap_err();
    assert!(error.to_string().contains("line 3"), "{error}");
}

/// A periodic full sync of a table nobody else touched sends only what
/// differs from the record: nothing when nothing changed, and an endpoint
/// replaced behind its back as elements only.
#[test]
fn a_full_sync_of_an_untouched_table_sends_only_the_elements_that_differ() {
    let mut world = World::v4_data().with_generations();
    world.put(web("10.244.2.2"));
    let first = world.sync(true, &[]);
    assert!(first.contains("delete table"), "{first}");
    let periodic = world.sync(true, &[]);
    assert!(!periodic.contains("add rule"), "{periodic}");
    assert!(!periodic.contains("flush"), "{periodic}");
    assert!(!periodic.contains("element"), "{periodic}");

    world.put(web("10.244.2.9"));
    world.sync(true, &[("ns1", "web")]);
    let commands = last_commands(&world);
    assert!(
        !commands.iter().any(|command| command.is_rule()),
        "{commands:#?}"
    );
    assert!(chains_written(&commands).is_empty(), "{commands:#?}");
    assert_eq!(
        hairpin_changes(&commands),
        (vec![pair("10.244.2.9")], vec![pair("10.244.2.2")])
    );
    assert_goes_to(
        &world.trace(POD, at("10.96.0.10", 80)),
        &[at("10.244.1.2", 8080), at("10.244.2.9", 8080)],
    );
}

/// A full sync writes the slot elements and hairpin pairs of a map in
/// shared commands, none larger than its netlink message can nest (256
/// elements), and every endpoint is drawn.
#[test]
fn slot_elements_share_commands_of_at_most_256() {
    let endpoints: Vec<_> = (0..600u32)
        .map(|index| {
            std::net::SocketAddr::from((std::net::Ipv4Addr::from(0x0af4_0a00 + index), 8080))
        })
        .collect();
    let mut many = service("ns1", "many", "10.96.0.20", 80);
    for endpoint in &endpoints {
        many = many.remote_endpoint(&endpoint.ip().to_string(), 8080);
    }
    let mut world = World::v4_data();
    world.put(many);
    world.sync(true, &[]);
    let commands = last_commands(&world);
    let sizes = |wanted: &dyn Fn(&str) -> bool| -> Vec<usize> {
        commands
            .iter()
            .filter_map(|command| match command {
                Command::AddMapElements { map, elements } if wanted(map.as_str()) => {
                    Some(elements.len())
                }
                Command::AddElements { set, elements } if wanted(set.as_str()) => {
                    Some(elements.len())
                }
                _ => None,
            })
            .collect()
    };
    let slots = sizes(&|name| name == "service-endpoints-tcp");
    let pairs = sizes(&|name| name == "hairpin-endpoints");
    for (what, sizes) in [("slots", &slots), ("hairpin pairs", &pairs)] {
        assert_eq!(sizes.iter().sum::<usize>(), 600, "{what}: {sizes:?}");
        assert!(sizes.iter().all(|size| *size <= 256), "{what}: {sizes:?}");
        assert_eq!(sizes.len(), 3, "{what} in shared commands: {sizes:?}");
    }
    assert_goes_to(&world.trace(CLIENT, at("10.96.0.20", 80)), &endpoints);
}

/// The slot and count-set elements of different Services share commands
/// too (they name no Service): 300 Services with one endpoint each send
/// their 300 slots in two commands, not 300.
#[test]
fn slot_and_count_elements_of_many_services_share_commands() {
    let mut world = World::v4_data();
    for n in 0..300u32 {
        let cluster_ip = std::net::Ipv4Addr::from(0x0a60_1000 + n).to_string();
        let endpoint = std::net::Ipv4Addr::from(0x0af4_0200 + n).to_string();
        world.put(
            service("ns1", &format!("s{n}"), &cluster_ip, 80).remote_endpoint(&endpoint, 8080),
        );
    }
    world.sync(true, &[]);
    let commands = last_commands(&world);
    let sizes = |wanted: &str| -> Vec<usize> {
        commands
            .iter()
            .filter_map(|command| match command {
                Command::AddMapElements { map, elements } if map.as_str() == wanted => {
                    Some(elements.len())
                }
                Command::AddElements { set, elements } if set.as_str() == wanted => {
                    Some(elements.len())
                }
                _ => None,
            })
            .collect()
    };
    assert_eq!(sizes("service-endpoints-tcp"), [256, 44]);
    assert_eq!(sizes("endpoint-count-1"), [256, 44]);
    // Service IPs stay one command each: a refusal names its Service.
    assert_eq!(sizes("service-ips").len(), 300);
    assert_goes_to(
        &world.trace(POD, at("10.96.16.7", 80)),
        &[at("10.244.2.7", 8080)],
    );
}

/// The record holds a Service's slot, count-set and group-set elements as
/// its draws
/// (an entry and the endpoint of each slot), not as elements: what it gives
/// as the Service's elements still has them, each once, sorted.
#[test]
fn the_record_derives_slot_and_count_elements_from_its_draws() {
    let mut world = world();
    world.sync(true, &[]);
    let record = &world.backend.programmed().services[&NamespacedName::new("ns1", "web")];
    let maps = |elements: &[kp_nftables::Element]| -> Vec<&'static str> {
        elements.iter().map(|element| element.map).collect()
    };
    let recorded = maps(&record.elements);
    assert!(
        !recorded.iter().any(|map| map.starts_with("endpoint-count-")
            || map.starts_with("endpoint-group-")
            || *map == "service-endpoints-tcp"),
        "{recorded:?}"
    );
    let all = record.all_elements();
    assert_eq!(all.len(), record.element_count());
    // Its count-set and group-set elements and two slots.
    assert_eq!(all.len(), record.elements.len() + 4, "{all:#?}");
    let slots: Vec<String> = all
        .iter()
        .filter(|element| element.map == "service-endpoints-tcp")
        .map(|element| format!("{} : {:?}", element.key(), element.data))
        .collect();
    assert_eq!(slots.len(), 2, "{slots:?}");
    assert!(
        all.windows(2)
            .all(|pair| (pair[0].map, pair[0].key()) < (pair[1].map, pair[1].key())),
        "sorted, each once: {all:#?}"
    );
    assert!(all.iter().any(|element| element.map == "endpoint-count-2"
        && element.key() == Key::AddrProtoPort(ip("10.96.0.10"), kp_model::Protocol::Tcp, 80)));
}

/// A service port that gains ClientIP affinity moves from the draw to
/// endpoint chains in a partial sync, and back when it loses it: none of
/// its slot, count-set, group-set or hairpin elements is left behind while
/// it has affinity, none of its endpoint chains is named once it has lost
/// it, connections go to both endpoints throughout, and a periodic full
/// sync afterwards adds no rule.
#[test]
fn a_port_gaining_and_losing_affinity_moves_between_the_draw_and_endpoint_chains() {
    let mut world = World::v4_data().with_generations();
    let plain = || {
        service("ns1", "sticky", "10.96.0.17", 80)
            .local_endpoint("10.244.1.12", 8080)
            .remote_endpoint("10.244.2.12", 8080)
    };
    let both = [at("10.244.1.12", 8080), at("10.244.2.12", 8080)];
    // The elements of the Service's entry and endpoints, but its dispatch.
    let drawn = |world: &World| -> Vec<String> {
        let table = world.applier.table(kp_model::IpFamily::V4).unwrap();
        let mut found: Vec<String> = table
            .maps
            .iter()
            .filter(|(name, _)| name.as_str() != "service-ips" && name.as_str() != "cluster-ips")
            .flat_map(|(name, elements)| elements.keys().map(move |key| format!("{name}: {key}")))
            .chain(table.targets.iter().flat_map(|(name, elements)| {
                elements.keys().map(move |key| format!("{name}: {key}"))
            }))
            .filter(|element| element.contains("10.96.0.17 . ") || element.contains(".12 . 10."))
            .collect();
        found.sort();
        found
    };
    let named_endpoint_chains = |world: &World| -> usize {
        let table = world.applier.table(kp_model::IpFamily::V4).unwrap();
        table
            .chains
            .values()
            .flatten()
            .filter(|rule| {
                rule.exprs.iter().any(|expr| {
                    matches!(expr, Expr::Verdict(kp_nftables::model::Verdict::Goto(chain))
                        if chain.as_str().starts_with("endpoint-"))
                })
            })
            .count()
    };

    world.put(plain());
    world.sync(true, &[]);
    assert!(!drawn(&world).is_empty());
    assert_eq!(named_endpoint_chains(&world), 0);
    assert_goes_to(&world.trace(POD, at("10.96.0.17", 80)), &both);

    world.put(plain().affinity_secs(600));
    world.sync(false, &[("ns1", "sticky")]);
    assert_eq!(drawn(&world), Vec::<String>::new());
    assert!(named_endpoint_chains(&world) > 0);
    assert_goes_to(&world.trace(POD, at("10.96.0.17", 80)), &both);

    world.put(plain());
    world.sync(false, &[("ns1", "sticky")]);
    assert!(!drawn(&world).is_empty());
    assert_eq!(named_endpoint_chains(&world), 0);
    assert_goes_to(&world.trace(POD, at("10.96.0.17", 80)), &both);
    let periodic = world.sync(true, &[]);
    assert!(!periodic.contains("add rule"), "{periodic}");
}
