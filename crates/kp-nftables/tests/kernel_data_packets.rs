//! Kernel tests: real connections through a hand-built table of the data
//! layout (issue 26) committed over netlink in the node namespace of the
//! harness. The draw spreads connections over the endpoints in a slot map,
//! a pod reaching itself through a Service is answered (the hairpin pair
//! set marks it for masquerade). (ClientIP affinity: the renderer writes
//! a service port with affinity as the chains layout does; see
//! `kernel_data_render.rs`.)
//!
//! | Service (tcp 80) | count set | endpoints |
//! |---|---|---|
//! | two, 10.96.0.30 | `endpoint-count-2` | ep1, ep2 (node-1) :8080 |
//! | three, 10.96.0.31 | `endpoint-count-3` | ep1, ep2 (node-1), ep3 (node-2) :8080, everything masqueraded |
//!
//! Node 192.168.99.2; pods of node-1 10.244.1.2 (ep1), .3 (ep2), of node-2
//! 10.244.2.2 (ep3), each serving TCP 8080. Every Service's slots are in
//! the one slot map `service-endpoints-tcp`, keyed by its entry, as the
//! renderer writes them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod data_layout;
mod kernel;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use data_layout::{name, rule};
use kernel::{at, build, pod_ip, require, three_pods, POD_TCP_PORT};
use kp_model::{IpFamily, Protocol};
use kp_nftables::model::{
    AddrField, Address, ChainKind, ChainType, Command, Expr, Hook, Key, MapElement, SetElement,
    SetSpec, TypeofField, TypeofSpec, Verdict, IPV4_PROTO_PORT,
};
use kp_nftables::{Applier, NetlinkApplier, Transaction};
use kp_testkit::netns::{hits, hits_until_all, Topology};

const SLOTS: &str = "service-endpoints-tcp";
const HAIRPIN: &str = "hairpin-endpoints";

/// One Service of the table.
struct Service {
    chain: &'static str,
    ip: &'static str,
    endpoints: Vec<IpAddr>,
    masquerade_all: bool,
}

fn jump(chain: &str) -> Expr {
    Expr::Verdict(Verdict::Jump(name(chain.to_owned())))
}

fn base(chain: &str, chain_type: ChainType, hook: Hook, priority: i32) -> Command {
    Command::AddChain {
        name: name(chain.to_owned()),
        kind: ChainKind::Base {
            chain_type,
            hook,
            priority,
        },
    }
}

fn regular(chain: &str) -> Command {
    Command::AddChain {
        name: name(chain.to_owned()),
        kind: ChainKind::Regular,
    }
}

fn typeof_set(set: &str, key: Vec<TypeofField>, data: Vec<TypeofField>) -> TypeofSpec {
    TypeofSpec {
        name: name(set.to_owned()),
        key,
        data,
        comment: None,
    }
}

fn table(services: &[Service]) -> Transaction {
    use AddrField::{Destination, Source};
    let tcp = TypeofField::Port(Protocol::Tcp);
    let mut commands = vec![
        Command::AddTable { comment: None },
        Command::AddTypeofSet(typeof_set(
            SLOTS,
            vec![TypeofField::Addr(Destination), tcp, TypeofField::Number],
            vec![TypeofField::Addr(Destination), tcp],
        )),
        Command::AddTypeofSet(typeof_set(
            HAIRPIN,
            vec![TypeofField::Addr(Source), TypeofField::Addr(Destination)],
            vec![],
        )),
        base("nat-prerouting", ChainType::Nat, Hook::Prerouting, -100),
        base("nat-output", ChainType::Nat, Hook::Output, -100),
        base("nat-postrouting", ChainType::Nat, Hook::Postrouting, 100),
        regular("mark-for-masquerade"),
        regular("masquerading"),
        rule("mark-for-masquerade", vec![Expr::MarkSetOr(0x4000)]),
        rule("nat-postrouting", vec![jump("masquerading")]),
        rule(
            "masquerading",
            vec![
                Expr::AddrPairInSet(name(HAIRPIN.to_owned())),
                jump("mark-for-masquerade"),
            ],
        ),
        rule(
            "masquerading",
            vec![Expr::MarkLacks(0x4000), Expr::Verdict(Verdict::Return)],
        ),
        rule("masquerading", vec![Expr::MarkSetXor(0x4000)]),
        rule("masquerading", vec![Expr::MasqueradeFullyRandom]),
    ];
    let mut pairs = BTreeMap::new();
    for service in services {
        commands.push(regular(service.chain));
        let entry: IpAddr = service.ip.parse().unwrap();
        for chain in ["nat-prerouting", "nat-output"] {
            commands.push(rule(
                chain,
                vec![
                    Expr::AddrIs {
                        field: Destination,
                        negate: false,
                        value: Address::Host(entry),
                    },
                    Expr::DestinationPort {
                        protocol: Protocol::Tcp,
                        port: 80,
                    },
                    jump(service.chain),
                ],
            ));
        }
        if service.masquerade_all {
            commands.push(rule(service.chain, vec![jump("mark-for-masquerade")]));
        }
        let count = u32::try_from(service.endpoints.len()).unwrap();
        let count_set = name(format!("endpoint-count-{count}"));
        commands.push(Command::AddSet(SetSpec {
            name: count_set.clone(),
            map: false,
            key: IPV4_PROTO_PORT,
            verdicts: false,
            dynamic_timeout_secs: None,
            comment: None,
        }));
        commands.push(Command::AddElements {
            set: count_set.clone(),
            elements: vec![SetElement {
                key: Key::AddrProtoPort(entry, Protocol::Tcp, 80),
                comment: None,
                verdict: None,
            }],
        });
        commands.push(rule(
            service.chain,
            vec![
                Expr::EntryInSet {
                    with_addr: true,
                    set: count_set,
                },
                Expr::DnatDraw {
                    protocol: Protocol::Tcp,
                    with_addr: true,
                    endpoints: count,
                    map: name(SLOTS.to_owned()),
                },
            ],
        ));
        commands.push(Command::AddMapElements {
            map: name(SLOTS.to_owned()),
            elements: service
                .endpoints
                .iter()
                .zip(0u32..)
                .map(|(ip, slot)| MapElement {
                    key: Key::EntrySlot(entry, 80, slot),
                    comment: None,
                    target: SocketAddr::new(*ip, POD_TCP_PORT),
                })
                .collect(),
        });
        for ip in &service.endpoints {
            pairs.insert(ip.to_string(), *ip);
        }
    }
    commands.push(Command::AddElements {
        set: name(HAIRPIN.to_owned()),
        elements: pairs
            .values()
            .map(|ip| SetElement {
                key: Key::AddrPair(*ip, *ip),
                comment: None,
                verdict: None,
            })
            .collect(),
    });
    Transaction {
        family: IpFamily::V4,
        commands,
    }
}

/// The topology with the table committed over netlink in its node.
fn programmed() -> Topology {
    let topology = build(three_pods());
    let (ep1, ep2, ep3) = (
        pod_ip(&topology, "ep1"),
        pod_ip(&topology, "ep2"),
        pod_ip(&topology, "ep3"),
    );
    let transaction = table(&[
        Service {
            chain: "service-two",
            ip: "10.96.0.30",
            endpoints: vec![ep1, ep2],
            masquerade_all: false,
        },
        Service {
            chain: "service-three",
            ip: "10.96.0.31",
            endpoints: vec![ep1, ep2, ep3],
            masquerade_all: true,
        },
    ]);
    topology
        .node()
        .run(|| NetlinkApplier::new().apply(&transaction))
        .unwrap_or_else(|e| panic!("netlink: {e}"));
    topology
}

#[track_caller]
fn assert_spread(counts: &BTreeMap<String, usize>, pods: &[&str], at_least: usize) {
    let answered: Vec<&str> = counts.keys().map(String::as_str).collect();
    assert_eq!(answered, pods, "{counts:?}");
    for pod in pods {
        assert!(
            counts[*pod] >= at_least,
            "{pod} answered {} times, fewer than {at_least}: {counts:?}",
            counts[*pod]
        );
    }
}

#[test]
fn the_draw_spreads_connections_over_two_and_three_endpoints() {
    require();
    let topology = programmed();
    // The node is no endpoint, so no path here is a hairpin.
    let from = topology.node();
    // 120 connections, one in two each: below 35 has a chance under 1e-6.
    assert_spread(&hits(from, at("10.96.0.30", 80), 120), &["ep1", "ep2"], 35);
    // 150 connections, one in three each: below 25 has a chance under 1e-6.
    assert_spread(
        &hits(from, at("10.96.0.31", 80), 150),
        &["ep1", "ep2", "ep3"],
        25,
    );
}

#[test]
fn a_pod_reaching_itself_through_a_service_is_answered() {
    require();
    let topology = programmed();
    let ep1 = topology.pod("ep1").netns();
    // Every connection is answered (`hits` fails on the first that is
    // not), those drawn to ep1 itself among them.
    let counts = hits_until_all(ep1, at("10.96.0.30", 80), &["ep1", "ep2"], 200);
    assert!(counts.get("ep1").copied().unwrap_or(0) >= 1, "{counts:?}");
}
