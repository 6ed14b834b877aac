//! Round trips without a kernel: every rule and element list a full sync
//! renders for the fixture clusters is encoded with the real encoder and
//! decoded back, and must come back as the model wrote it (in the form the
//! kernel holds it: [`kernel_form_rule`]).
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web:p80 | ClusterIP 10.96.0.10, endpoints 10.244.1.2 (here), 10.244.2.2 |
//! | ns1/np:p80 | NodePort 30080, externalIP 203.0.113.5, eTP Local, endpoint 10.244.2.3 (node-2) |
//! | ns1/lb:p80 | LB 203.0.113.9 from 198.51.100.0/24, NodePort 30081, eTP Local, affinity 300 s, endpoint 10.244.1.4 |
//! | ns1/lb2:p443 | LB 203.0.113.10 from 198.51.100.0/25, 198.51.100.128/25, 192.0.2.7/32, endpoint 10.244.1.5 |
//! | ns1/empty:p80 | ClusterIP 10.96.0.14, externalIP 203.0.113.6, no endpoints |
//! | ns1/itp:p80 | ClusterIP 10.96.0.15, iTP Local, endpoint 10.244.2.5 (node-2) |
//! | ns1/dns:p53 | UDP ClusterIP 10.96.0.16, endpoint 10.244.1.6 |
//! | ns1/web6:p80 (IPv6) | ClusterIP fd00:10:96::10, NodePort 30090, endpoint [fd00:10:244:1::2]:8080 |
//! | ns1/lb6:p80 (IPv6) | LB fd00:203::9 from fd00:198::/64 and fd00:199::/64, affinity, endpoint [fd00:10:244:1::4]:8080 |
//! | ns1/empty6:p80 (IPv6) | ClusterIP fd00:10:96::14, no endpoints |
//!
//! Each cluster is rendered with each kind of local-traffic detector
//! (cluster CIDR, interface prefix, bridge) and of NodePort addresses (all,
//! selected, primary).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use kp_model::{IpFamily, NodeInfo, ServicePortName};
use kp_node::{LocalDetector, NodePortAddresses};
use kp_sync::testing::{service, ServiceBuilder};
use kp_sync::{Backend, ServicePortState, StaleConntrack, SyncRequest};

use super::*;
use crate::model::{ChainKind, Command, Expr, Name, Transaction};
use crate::{FakeApplier, NftablesBackend, NftablesOptions};

/// `NFT_MSG_NEWCHAIN`, `NEWRULE`, `NEWSET`, `NEWSETELEM`.
const NEWCHAIN: u8 = 3;
const NEWRULE: u8 = 6;
const NEWSET: u8 = 9;
const NEWSETELEM: u8 = 12;

fn v4_cluster() -> Vec<ServiceBuilder> {
    vec![
        service("ns1", "web", "10.96.0.10", 80)
            .local_endpoint("10.244.1.2", 8080)
            .remote_endpoint("10.244.2.2", 8080),
        service("ns1", "np", "10.96.0.11", 80)
            .node_port(30080)
            .external_ip("203.0.113.5")
            .etp_local()
            .remote_endpoint("10.244.2.3", 8080),
        service("ns1", "lb", "10.96.0.12", 80)
            .lb_ip("203.0.113.9")
            .source_range("198.51.100.0/24")
            .node_port(30081)
            .etp_local()
            .affinity_secs(300)
            .local_endpoint("10.244.1.4", 8080),
        service("ns1", "lb2", "10.96.0.13", 443)
            .lb_ip("203.0.113.10")
            .source_range("198.51.100.0/25")
            .source_range("198.51.100.128/25")
            .source_range("192.0.2.7/32")
            .local_endpoint("10.244.1.5", 8443),
        service("ns1", "empty", "10.96.0.14", 80).external_ip("203.0.113.6"),
        service("ns1", "itp", "10.96.0.15", 80)
            .itp_local()
            .remote_endpoint("10.244.2.5", 8080),
        service("ns1", "dns", "10.96.0.16", 53)
            .udp()
            .local_endpoint("10.244.1.6", 53),
    ]
}

fn v6_cluster() -> Vec<ServiceBuilder> {
    vec![
        service("ns1", "web6", "fd00:10:96::10", 80)
            .node_port(30090)
            .local_endpoint("fd00:10:244:1::2", 8080),
        service("ns1", "lb6", "fd00:10:96::12", 80)
            .lb_ip("fd00:203::9")
            .source_range("fd00:198::/64")
            .source_range("fd00:199::/64")
            .affinity_secs(60)
            .local_endpoint("fd00:10:244:1::4", 8080),
        service("ns1", "empty6", "fd00:10:96::14", 80),
    ]
}

/// The transactions of one full sync of `services` through a backend
/// over a fake applier.
fn full_sync(
    family: IpFamily,
    detector: LocalDetector,
    node_ports: NodePortAddresses,
    services: Vec<ServiceBuilder>,
) -> Vec<Transaction> {
    let options = NftablesOptions {
        local_detector: detector,
        ..NftablesOptions::default()
    };
    let applier = FakeApplier::new();
    let mut backend = NftablesBackend::new(family, options, node_ports, Box::new(applier.clone()))
        .unwrap()
        .with_layout(crate::Layout::Chains)
        .with_local_addresses(|_| Ok(Vec::new()));
    let service_ports: BTreeMap<ServicePortName, ServicePortState> =
        services.into_iter().map(ServiceBuilder::build).collect();
    let node = NodeInfo {
        name: "node-1".to_owned(),
        addresses: vec![
            "192.168.99.2".parse::<IpAddr>().unwrap(),
            "fd00:192:168:99::2".parse().unwrap(),
        ],
        ..NodeInfo::default()
    };
    let stale = StaleConntrack::default();
    let none = BTreeSet::new();
    backend
        .sync(&SyncRequest {
            family,
            full: true,
            service_ports: &service_ports,
            changed_services: &none,
            node: &node,
            stale_conntrack: &stale,
        })
        .unwrap();
    applier
        .transactions()
        .into_iter()
        .map(|t| t.transaction)
        .collect()
}

/// Every fixture: the clusters of both families, with each kind of
/// local-traffic detector and both kinds of NodePort addresses.
fn fixtures() -> Vec<(String, Vec<Transaction>)> {
    let cidrs = LocalDetector::ClusterCidr(vec![
        "10.244.0.0/16".parse().unwrap(),
        "fd00:10:244::/48".parse().unwrap(),
    ]);
    let select = NodePortAddresses::Select {
        cidrs: vec!["192.168.99.0/24".parse().unwrap()],
        primary: false,
    };
    let select6 = NodePortAddresses::Select {
        cidrs: Vec::new(),
        primary: true,
    };
    vec![
        (
            "v4, cluster CIDR, all node addresses".to_owned(),
            full_sync(
                IpFamily::V4,
                cidrs.clone(),
                NodePortAddresses::All,
                v4_cluster(),
            ),
        ),
        (
            "v4, interface prefix, selected node addresses".to_owned(),
            full_sync(
                IpFamily::V4,
                LocalDetector::InterfaceNamePrefix("veth".to_owned()),
                select,
                v4_cluster(),
            ),
        ),
        (
            "v4, bridge interface".to_owned(),
            full_sync(
                IpFamily::V4,
                LocalDetector::BridgeInterface("cbr0".to_owned()),
                NodePortAddresses::All,
                v4_cluster(),
            ),
        ),
        (
            "v6, cluster CIDR, all node addresses".to_owned(),
            full_sync(
                IpFamily::V6,
                cidrs.clone(),
                NodePortAddresses::All,
                v6_cluster(),
            ),
        ),
        (
            "v6, primary node address".to_owned(),
            full_sync(IpFamily::V6, cidrs, select6, v6_cluster()),
        ),
    ]
}

/// The payloads of `transaction`'s messages, by kind, as a dump.
pub(super) fn as_dump(transaction: &Transaction) -> Dump {
    let mut dump = Dump::default();
    for (kind, payload) in crate::netlink::encoded_payloads(transaction).unwrap() {
        match kind {
            NEWCHAIN => dump.chains.push(payload),
            NEWRULE => dump.rules.push(payload),
            NEWSET => dump.sets.push(payload),
            NEWSETELEM => dump.elements.push(payload),
            other => panic!("message kind {other} in a transaction of additions"),
        }
    }
    dump
}

/// Encodes `rule` alone (in its chain) and decodes it back.
fn round_trip(family: IpFamily, rule: &Rule) -> Result<Rule, ReadError> {
    let transaction = Transaction {
        family,
        commands: vec![
            Command::AddChain {
                name: rule.chain.clone(),
                kind: ChainKind::Regular,
            },
            Command::AddRule(rule.clone()),
        ],
    };
    let mut table = decode::decode(family, &as_dump(&transaction))?;
    let mut rules = table.chains.remove(rule.chain.as_str()).unwrap();
    assert_eq!(rules.len(), 1, "{rule:?}");
    Ok(rules.remove(0))
}

/// Whether the kernel holds `rule` in a form of its own.
fn has_kernel_form(rule: &Rule) -> bool {
    kernel_form_rule(rule) != *rule
}

#[test]
fn every_rendered_rule_decodes_back_to_itself() {
    let mut shapes = std::collections::HashSet::new();
    let mut own_form = 0;
    for (fixture, transactions) in fixtures() {
        let family = transactions[0].family;
        let mut rules = 0;
        for command in transactions.iter().flat_map(|t| &t.commands) {
            let Command::AddRule(rule) = command else {
                continue;
            };
            rules += 1;
            let decoded = round_trip(family, rule)
                .unwrap_or_else(|error| panic!("{fixture}: {rule:?}: {error}"));
            if has_kernel_form(rule) {
                own_form += 1;
                assert_eq!(decoded, kernel_form_rule(rule), "{fixture}");
            } else {
                assert_eq!(decoded, *rule, "{fixture}");
            }
            for expr in &rule.exprs {
                shapes.insert(std::mem::discriminant(expr));
            }
        }
        assert!(rules > 30, "{fixture}: only {rules} rules rendered");
    }
    // Only the firewall rules' source lists are held in a form of their
    // own, and every shape of the model was rendered by some fixture.
    assert!(own_form > 0);
    assert_eq!(shapes.len(), 18, "expression shapes covered");
}

#[test]
fn every_rendered_element_decodes_back_to_its_key_and_verdict() {
    for (fixture, transactions) in fixtures() {
        let family = transactions[0].family;
        let specs: BTreeMap<String, crate::model::SetSpec> = transactions
            .iter()
            .flat_map(|t| &t.commands)
            .filter_map(|command| match command {
                Command::AddSet(spec) => Some((spec.name.as_str().to_owned(), spec.clone())),
                _ => None,
            })
            .collect();
        let mut lists = 0;
        for command in transactions.iter().flat_map(|t| &t.commands) {
            let Command::AddElements { set, elements } = command else {
                continue;
            };
            lists += 1;
            let transaction = Transaction {
                family,
                commands: vec![
                    Command::AddSet(specs[set.as_str()].clone()),
                    command.clone(),
                ],
            };
            let table = decode::decode(family, &as_dump(&transaction))
                .unwrap_or_else(|error| panic!("{fixture}: {set}: {error}"));
            let want: BTreeMap<String, Option<crate::model::Verdict>> = elements
                .iter()
                .map(|e| (e.key.to_string(), e.verdict.clone()))
                .collect();
            assert_eq!(table.maps[set.as_str()], want, "{fixture}: {set}");
            assert!(table.sets.contains(set.as_str()));
        }
        assert!(lists >= 3, "{fixture}: only {lists} element lists");
    }
}

#[test]
fn every_rendered_chain_decodes_back_with_its_hook() {
    for (fixture, transactions) in fixtures() {
        let family = transactions[0].family;
        let chains: Vec<Command> = transactions
            .iter()
            .flat_map(|t| &t.commands)
            .filter(|command| matches!(command, Command::AddChain { .. }))
            .cloned()
            .collect();
        let transaction = Transaction {
            family,
            commands: chains,
        };
        let mut replayed = Table::new();
        replayed.apply(&transaction).unwrap();
        let table = decode::decode(family, &as_dump(&transaction))
            .unwrap_or_else(|error| panic!("{fixture}: {error}"));
        assert_eq!(table.base_chains.len(), 8, "{fixture}");
        assert_eq!(table.base_chains, replayed.base_chains, "{fixture}");
        assert_eq!(
            table.chains.keys().collect::<Vec<_>>(),
            replayed.chains.keys().collect::<Vec<_>>(),
            "{fixture}"
        );
    }
}

#[test]
fn fixed_names_come_back_fixed_and_service_names_shared() {
    assert_eq!(
        decode::model_name("services"),
        Name::Fixed(crate::names::SERVICES)
    );
    assert!(matches!(
        decode::model_name("service-ULMVA6XW-ns1/svc1/tcp/p80"),
        Name::Shared(_)
    ));
}

#[test]
fn an_expression_the_encoder_never_writes_is_named_with_its_chain() {
    // A rule whose expression the kernel does not know, as the test
    // applier writes it (`NetlinkApplier::refusing_rules_of`).
    let family = IpFamily::V4;
    let chain: Arc<str> = Arc::from("service-AAAAAAAA-ns1/web/tcp/http");
    let transaction = Transaction {
        family,
        commands: vec![
            Command::AddChain {
                name: Name::from(&chain),
                kind: ChainKind::Regular,
            },
            Command::AddRule(Rule::new(&chain, vec![Expr::Reject])),
        ],
    };
    let mut dump = as_dump(&transaction);
    // Rename the `reject` expression to one of the same length.
    let rule = &mut dump.rules[0];
    let at = rule
        .windows(7)
        .position(|w| w == b"reject\0")
        .expect("the reject expression");
    rule[at..at + 6].copy_from_slice(b"queue\0");
    let error = decode::decode(family, &dump).unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("chain service-AAAAAAAA-ns1/web/tcp/http")
            && text.contains("expression 0 (queue)")
            && text.contains("without a handle"),
        "{text}"
    );
}

#[test]
fn an_unknown_comment_is_an_error_not_a_guess() {
    let family = IpFamily::V4;
    let rule = Rule::new("services", vec![Expr::Reject]).with_comment("someone else's");
    let error = round_trip(family, &rule).unwrap_err();
    assert!(
        matches!(&error, ReadError::Rule { kind, .. } if kind == "comment"),
        "{error}"
    );
}

#[test]
fn prefixes_cover_a_range_exactly_with_the_fewest() {
    let v4 = |text: &str| u128::from(u32::from(text.parse::<std::net::Ipv4Addr>().unwrap()));
    let got: Vec<String> = decode::prefixes(v4("10.0.0.1"), v4("10.0.0.6"), 32)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        got,
        ["10.0.0.1/32", "10.0.0.2/31", "10.0.0.4/31", "10.0.0.6/32"]
    );
    let all: Vec<String> = decode::prefixes(0, u128::from(u32::MAX), 32)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(all, ["0.0.0.0/0"]);
    // Past the last IPv4 address: cut there, not counted on for ever.
    let past: Vec<String> = decode::prefixes(v4("255.255.255.0"), u128::MAX, 32)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(past, ["255.255.255.0/24"]);
    assert!(decode::prefixes(5, 4, 32).is_empty());
    let all6 = decode::prefixes(0, u128::MAX, 128);
    assert_eq!(all6.len(), 1);
    assert_eq!(all6[0].prefix_len(), 0);
}

#[test]
fn adjacent_source_ranges_are_held_merged() {
    let chain: Arc<str> = Arc::from("firewall-AAAAAAAA-ns1/lb2/tcp/p443");
    let rule = Rule::new(
        &chain,
        vec![
            Expr::AddrNotIn {
                field: crate::model::AddrField::Source,
                values: vec![
                    Address::Prefix("198.51.100.128/25".parse().unwrap()),
                    Address::Host("192.0.2.7".parse().unwrap()),
                    Address::Prefix("198.51.100.0/25".parse().unwrap()),
                ],
            },
            Expr::Verdict(crate::model::Verdict::Drop),
        ],
    );
    let decoded = round_trip(IpFamily::V4, &rule).unwrap();
    let Expr::AddrNotIn { values, .. } = &decoded.exprs[0] else {
        panic!("{decoded:?}");
    };
    let text: Vec<String> = values.iter().map(ToString::to_string).collect();
    assert_eq!(text, ["192.0.2.7", "198.51.100.0/24"]);
    assert_eq!(decoded, kernel_form_rule(&rule));
}

#[test]
fn a_source_range_up_to_the_last_address_comes_back_whole() {
    // The encoder writes no end point after the last address; the range
    // still ends there, in both families.
    for (family, values, want) in [
        (
            IpFamily::V4,
            vec!["198.51.100.0/24", "240.0.0.0/4"],
            vec!["198.51.100.0/24", "240.0.0.0/4"],
        ),
        (
            IpFamily::V6,
            vec!["fd00:198::/64", "ff00::/8"],
            vec!["fd00:198::/64", "ff00::/8"],
        ),
    ] {
        let chain: Arc<str> = Arc::from("firewall-AAAAAAAA-ns1/lb/tcp/p80");
        let rule = Rule::new(
            &chain,
            vec![
                Expr::AddrNotIn {
                    field: crate::model::AddrField::Source,
                    values: values
                        .iter()
                        .map(|text| Address::Prefix(text.parse().unwrap()))
                        .collect(),
                },
                Expr::Verdict(crate::model::Verdict::Drop),
            ],
        );
        let decoded = round_trip(family, &rule).unwrap();
        let Expr::AddrNotIn { values, .. } = &decoded.exprs[0] else {
            panic!("{decoded:?}");
        };
        let text: Vec<String> = values.iter().map(ToString::to_string).collect();
        assert_eq!(text, want, "{family:?}");
    }
}
