//! A hand-built transaction holding every statement of the data layout
//! (rules by endpoint count, docs/nft-layout-experiment.md), for tcp, udp
//! and sctp, in either family.
//!
//! | object | IPv4 | IPv6 |
//! |---|---|---|
//! | Service entry (ClusterIP) | 10.96.0.12 | fd00:10:96::c |
//! | endpoints ep1, ep2, ep3 | 10.244.1.2, .3, .4 | fd00:10:244:1::2, ::3, ::4 |
//! | slot maps, count sets | `service-endpoints-PROTO`, `endpoint-count-N` | same |
//!
//! tcp 80 → ep1, ep2, ep3 :8080 (slots 0, 1, 2); udp 53 → ep1, ep2 :5353;
//! sctp 9 → ep1 :9.
#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use kp_model::{IpFamily, Protocol};
use kp_nftables::live::decode::model_name;
use kp_nftables::model::{
    protocol_keyword, AddrField, Address, ChainKind, ChainType, Command, Expr, Hook, Key,
    MapElement, Name, Rule, SetElement, SetSpec, TypeofField, TypeofSpec, Verdict, IPV4_PROTO_PORT,
    IPV6_PROTO_PORT,
};
use kp_nftables::Transaction;

/// The protocols, in the order the transaction writes them.
pub const PROTOCOLS: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];
/// The Service's ports and its endpoints' port, per protocol.
pub fn ports(protocol: Protocol) -> (u16, u16) {
    match protocol {
        Protocol::Tcp => (80, 8080),
        Protocol::Udp => (53, 5353),
        Protocol::Sctp => (9, 9),
    }
}

/// How many endpoints each protocol's port has.
pub fn endpoint_count(protocol: Protocol) -> u32 {
    match protocol {
        Protocol::Tcp => 3,
        Protocol::Udp => 2,
        Protocol::Sctp => 1,
    }
}

/// The ClusterIP.
pub fn entry(family: IpFamily) -> IpAddr {
    match family {
        IpFamily::V4 => "10.96.0.12".parse().unwrap(),
        IpFamily::V6 => "fd00:10:96::c".parse().unwrap(),
    }
}

/// Endpoint `index` (1-based).
pub fn endpoint(family: IpFamily, index: u8) -> IpAddr {
    match family {
        IpFamily::V4 => format!("10.244.1.{}", index + 1).parse().unwrap(),
        IpFamily::V6 => format!("fd00:10:244:1::{}", index + 1).parse().unwrap(),
    }
}

/// A name as the read-back names it (fixed names of the renderer's
/// table fixed, the rest shared), so that a replay and a read-back compare.
pub fn name(text: String) -> Name {
    model_name(&text)
}

fn fixed(text: &str) -> Name {
    model_name(text)
}

pub fn endpoints_map(protocol: Protocol) -> Name {
    name(format!("service-endpoints-{}", protocol_keyword(protocol)))
}

/// The set of the entries with `protocol`'s endpoint count.
pub fn count_set(protocol: Protocol) -> Name {
    name(format!("endpoint-count-{}", endpoint_count(protocol)))
}

pub const HAIRPIN: &str = "hairpin-endpoints";
pub const SERVICE_CHAIN: &str = "service-web";

/// The declarations, elements and rules.
pub fn layout(family: IpFamily) -> Transaction {
    use AddrField::{Destination, Source};
    let mut commands = vec![Command::AddTable { comment: None }];
    for protocol in PROTOCOLS {
        commands.push(Command::AddTypeofSet(TypeofSpec {
            name: endpoints_map(protocol),
            key: vec![
                TypeofField::Addr(Destination),
                TypeofField::Port(protocol),
                TypeofField::Number,
            ],
            data: vec![TypeofField::Addr(Destination), TypeofField::Port(protocol)],
            comment: None,
        }));
    }
    for protocol in PROTOCOLS {
        commands.push(Command::AddSet(SetSpec {
            name: count_set(protocol),
            map: false,
            key: match family {
                IpFamily::V4 => IPV4_PROTO_PORT,
                IpFamily::V6 => IPV6_PROTO_PORT,
            },
            verdicts: false,
            dynamic_timeout_secs: None,
            comment: None,
        }));
    }
    commands.push(Command::AddTypeofSet(TypeofSpec {
        name: fixed(HAIRPIN),
        key: vec![TypeofField::Addr(Source), TypeofField::Addr(Destination)],
        data: vec![],
        comment: Some("endpoint . endpoint".into()),
    }));
    for (chain, chain_type, hook, priority) in [
        ("nat-prerouting", ChainType::Nat, Hook::Prerouting, -100),
        ("nat-output", ChainType::Nat, Hook::Output, -100),
        ("nat-postrouting", ChainType::Nat, Hook::Postrouting, 100),
    ] {
        commands.push(Command::AddChain {
            name: fixed(chain),
            kind: ChainKind::Base {
                chain_type,
                hook,
                priority,
            },
        });
    }
    for chain in ["mark-for-masquerade", "masquerading", SERVICE_CHAIN] {
        commands.push(Command::AddChain {
            name: fixed(chain),
            kind: ChainKind::Regular,
        });
    }
    for protocol in PROTOCOLS {
        let (_, target_port) = ports(protocol);
        let elements = (0..endpoint_count(protocol))
            .map(|slot| MapElement {
                key: Key::EntrySlot(entry(family), ports(protocol).0, slot),
                comment: (slot == 0).then(|| Arc::from("ns1/web:p")),
                target: SocketAddr::new(endpoint(family, slot as u8 + 1), target_port),
            })
            .collect();
        commands.push(Command::AddMapElements {
            map: endpoints_map(protocol),
            elements,
        });
    }
    for protocol in PROTOCOLS {
        commands.push(Command::AddElements {
            set: count_set(protocol),
            elements: vec![SetElement {
                key: Key::AddrProtoPort(entry(family), protocol, ports(protocol).0),
                comment: None,
                verdict: None,
            }],
        });
    }
    commands.push(Command::AddElements {
        set: fixed(HAIRPIN),
        elements: (1..=3)
            .map(|index| SetElement {
                key: Key::AddrPair(endpoint(family, index), endpoint(family, index)),
                comment: None,
                verdict: None,
            })
            .collect(),
    });
    commands.push(rule("mark-for-masquerade", vec![Expr::MarkSetOr(0x4000)]));
    for chain in ["nat-prerouting", "nat-output"] {
        commands.push(rule(
            chain,
            vec![
                Expr::AddrIs {
                    field: Destination,
                    negate: false,
                    value: Address::Host(entry(family)),
                },
                Expr::Verdict(Verdict::Jump(fixed(SERVICE_CHAIN))),
            ],
        ));
    }
    commands.push(rule(
        "nat-postrouting",
        vec![Expr::Verdict(Verdict::Jump(fixed("masquerading")))],
    ));
    commands.push(rule(
        "masquerading",
        vec![
            Expr::AddrPairInSet(fixed(HAIRPIN)),
            Expr::Verdict(Verdict::Jump(fixed("mark-for-masquerade"))),
        ],
    ));
    commands.push(rule(
        "masquerading",
        vec![Expr::MarkLacks(0x4000), Expr::Verdict(Verdict::Return)],
    ));
    commands.push(rule("masquerading", vec![Expr::MarkSetXor(0x4000)]));
    commands.push(rule("masquerading", vec![Expr::MasqueradeFullyRandom]));
    for protocol in PROTOCOLS {
        commands.push(rule(
            SERVICE_CHAIN,
            vec![
                Expr::EntryInSet {
                    with_addr: true,
                    set: count_set(protocol),
                },
                Expr::DnatDraw {
                    protocol,
                    with_addr: true,
                    endpoints: endpoint_count(protocol),
                    map: endpoints_map(protocol),
                },
            ],
        ));
    }
    Transaction { family, commands }
}

pub fn rule(chain: &'static str, exprs: Vec<Expr>) -> Command {
    Command::AddRule(Rule {
        chain: fixed(chain),
        exprs,
        comment: None,
    })
}
