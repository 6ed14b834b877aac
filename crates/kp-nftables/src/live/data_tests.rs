//! Round trips without a kernel for the data layout's statements (issue
//! 26): a transaction holding each of them is encoded with the real
//! encoder and decoded back, and must come back as the tracer's replay of
//! the same transaction.
//!
//! Address plan: ClusterIP 10.96.0.12 / fd00:10:96::c, endpoints
//! 10.244.1.2–3 / fd00:10:244:1::2–3, a client 10.244.1.7 / fd00::7.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, SocketAddr};

use kp_model::{IpFamily, Protocol};

use super::decode::{self, model_name};
use super::kernel_form;
use crate::model::{
    AddrField, ChainKind, Command, Expr, Key, MapElement, Rule, SetElement, Transaction,
    TypeofField, TypeofSpec, Verdict,
};
use crate::tracer::Table;

fn ip(family: IpFamily, v4: &str, v6: &str) -> IpAddr {
    match family {
        IpFamily::V4 => v4.parse().unwrap(),
        IpFamily::V6 => v6.parse().unwrap(),
    }
}

fn spec(name: &str, key: Vec<TypeofField>, data: Vec<TypeofField>) -> TypeofSpec {
    TypeofSpec {
        name: model_name(name),
        key,
        data,
        comment: None,
    }
}

fn rule(chain: &str, exprs: Vec<Expr>) -> Command {
    Command::AddRule(Rule {
        chain: model_name(chain),
        exprs,
        comment: None,
    })
}

/// Every statement of the layout, for tcp (draw, record) and udp
/// (affinity lookup), with an affinity entry as the kernel would hold it.
fn layout(family: IpFamily) -> Transaction {
    use AddrField::{Destination, Source};
    let entry = ip(family, "10.96.0.12", "fd00:10:96::c");
    let ep1 = ip(family, "10.244.1.2", "fd00:10:244:1::2");
    let ep2 = ip(family, "10.244.1.3", "fd00:10:244:1::3");
    let endpoints = |name: &str, key| {
        spec(
            name,
            key,
            vec![
                TypeofField::Addr(Destination),
                TypeofField::Port(Protocol::Tcp),
            ],
        )
    };
    let mut hairpin = spec(
        "hairpin-endpoints",
        vec![TypeofField::Addr(Source), TypeofField::Addr(Destination)],
        vec![],
    );
    hairpin.comment = Some("endpoint . endpoint".into());
    let commands = vec![
        Command::AddTypeofSet(endpoints(
            "service-endpoints-tcp",
            vec![
                TypeofField::Addr(Destination),
                TypeofField::Port(Protocol::Tcp),
                TypeofField::Number,
            ],
        )),
        Command::AddTypeofSet(endpoints(
            "nodeport-endpoints-tcp",
            vec![TypeofField::Port(Protocol::Tcp), TypeofField::Number],
        )),
        Command::AddSet(crate::model::SetSpec {
            name: model_name("endpoint-count-2"),
            map: false,
            key: match family {
                IpFamily::V4 => crate::model::IPV4_PROTO_PORT,
                IpFamily::V6 => crate::model::IPV6_PROTO_PORT,
            },
            verdicts: false,
            dynamic_timeout_secs: None,
            comment: None,
        }),
        Command::AddSet(crate::model::SetSpec {
            name: model_name("nodeport-count-2"),
            map: false,
            key: crate::model::PROTO_PORT,
            verdicts: false,
            dynamic_timeout_secs: None,
            comment: None,
        }),
        Command::AddTypeofSet(hairpin),
        Command::AddChain {
            name: model_name("svc"),
            kind: ChainKind::Regular,
        },
        Command::AddChain {
            name: model_name("mark"),
            kind: ChainKind::Regular,
        },
        Command::AddMapElements {
            map: model_name("service-endpoints-tcp"),
            elements: vec![
                MapElement {
                    key: Key::EntrySlot(entry, 80, 0),
                    comment: Some("ns1/web:http".into()),
                    target: SocketAddr::new(ep1, 8080),
                },
                MapElement {
                    key: Key::EntrySlot(entry, 80, 1),
                    comment: None,
                    target: SocketAddr::new(ep2, 8080),
                },
            ],
        },
        Command::AddMapElements {
            map: model_name("nodeport-endpoints-tcp"),
            elements: vec![MapElement {
                key: Key::PortSlot(30080, 1),
                comment: None,
                target: SocketAddr::new(ep2, 8080),
            }],
        },
        Command::AddElements {
            set: model_name("endpoint-count-2"),
            elements: vec![SetElement {
                key: Key::AddrProtoPort(entry, Protocol::Tcp, 80),
                comment: None,
                verdict: None,
            }],
        },
        Command::AddElements {
            set: model_name("nodeport-count-2"),
            elements: vec![SetElement {
                key: Key::ProtoPort(Protocol::Tcp, 30080),
                comment: None,
                verdict: None,
            }],
        },
        Command::AddElements {
            set: model_name("hairpin-endpoints"),
            elements: vec![SetElement {
                key: Key::AddrPair(ep1, ep1),
                comment: None,
                verdict: None,
            }],
        },
        rule(
            "svc",
            vec![
                Expr::AddrPairInSet(model_name("hairpin-endpoints")),
                Expr::Verdict(Verdict::Jump(model_name("mark"))),
            ],
        ),
        rule(
            "svc",
            vec![
                Expr::EntryInSet {
                    with_addr: true,
                    set: model_name("endpoint-count-2"),
                },
                Expr::DnatDraw {
                    protocol: Protocol::Tcp,
                    with_addr: true,
                    endpoints: 2,
                    map: model_name("service-endpoints-tcp"),
                },
            ],
        ),
        rule(
            "svc",
            vec![
                Expr::EntryInSet {
                    with_addr: false,
                    set: model_name("nodeport-count-2"),
                },
                Expr::DnatDraw {
                    protocol: Protocol::Tcp,
                    with_addr: false,
                    endpoints: 2,
                    map: model_name("nodeport-endpoints-tcp"),
                },
            ],
        ),
    ];
    Transaction { family, commands }
}

#[test]
fn the_data_layout_decodes_back_to_what_was_encoded() {
    for family in [IpFamily::V4, IpFamily::V6] {
        let transaction = layout(family);
        let decoded = decode::decode(family, &super::tests::as_dump(&transaction))
            .unwrap_or_else(|error| panic!("{family:?}: {error}"));
        let mut replayed = Table::new();
        replayed.apply(&transaction).unwrap();
        pretty_assertions::assert_eq!(kernel_form(&replayed), decoded, "{family:?}");
        // The rules did not come back empty or as something else.
        assert_eq!(decoded.chains["svc"].len(), 3, "{family:?}");
        assert_eq!(decoded.typeof_sets.len(), 3, "{family:?}");
    }
}
