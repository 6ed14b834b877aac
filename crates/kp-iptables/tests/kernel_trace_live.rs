//! Kernel tests: the rules the real applier programs, read back from the
//! kernel with `Ruleset::from_live`, trace every Service address exactly as
//! the text we rendered does, on iptables-legacy and on iptables-nft, for
//! IPv4 and IPv6; after one rule is deleted behind the proxy's back, the two
//! traces differ for the affected Service only.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web 80/TCP | ClusterIP 10.96.0.10 → 10.244.1.2:8080 (this node), 10.244.2.3:8080, 10.244.2.4:8080 |
//! | ns1/np 80/TCP | ClusterIP 10.96.0.11, NodePort 30080, externalIP 203.0.113.5 → 10.244.2.3:8080 |
//! | ns1/lb 443/TCP | ClusterIP 10.96.0.12, NodePort 30081, LB 203.0.113.9 from 203.0.113.0/25 and 192.168.99.0/24 → 10.244.2.5:8443 |
//! | ns2/local 80/TCP | ClusterIP 10.96.0.13, NodePort 30046, LB 203.0.113.10, eTP Local, health check 30000 → 10.244.1.2:80 (this node), 10.244.2.3:80 |
//! | ns1/sticky 80/TCP | ClusterIP 10.96.0.14, ClientIP affinity 10800 s → 10.244.1.2:80, 10.244.2.3:80 |
//! | ns4/empty 80/TCP | ClusterIP 10.96.0.15, NodePort 30050, externalIP 203.0.113.23, no endpoints |
//! | kube-system/dns 53/UDP | ClusterIP 10.96.0.53 → 10.244.2.6:53 |
//! | ns6/sctp 9999/SCTP | ClusterIP 10.96.0.52, NodePort 30999 → 10.244.2.7:9999 |
//! | ns1/web6 80/TCP | ClusterIP fd00:10:96::41, NodePort 30080 → fd00:10:244:1::2:8080, fd00:10:244:2::3:8080 |
//! | ns1/empty6 80/TCP | ClusterIP fd00:10:96::42, no endpoints |
//!
//! Node 192.168.99.2 / fd00:192:168:99::2, client 192.168.99.10 /
//! fd00:192:168:99::10, a client outside the source ranges 198.51.100.7,
//! pod 10.244.1.5 / fd00:10:244:1::5.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod kernel;

use std::collections::BTreeSet;
use std::net::IpAddr;

use common::{ip, render_both_ways, service, World};
use kernel::require;
use kp_iptables::tracer::{Packet, Ruleset, Trace};
use kp_iptables::{
    Applier, IptablesFlavor, NatChains, RenderInput, Renderer, SystemApplier, JUMP_RULES,
};
use kp_model::{IpFamily, Protocol};
use kp_testkit::netns::Netns;

const POD: &str = "10.244.1.5";
const CLIENT: &str = "192.168.99.10";
const OUTSIDER: &str = "198.51.100.7";
const NODE: &str = "192.168.99.2";
const POD6: &str = "fd00:10:244:1::5";
const CLIENT6: &str = "fd00:192:168:99::10";
const NODE6: &str = "fd00:192:168:99::2";

on_both_flavors!(
    live_rules_trace_as_the_rendered_text_for_every_service_address,
    a_rule_deleted_behind_our_back_changes_the_trace_of_its_service_only,
    another_programs_rules_are_read_and_noted_but_one_in_our_chains_is_an_error,
);

fn world_v4() -> World {
    World::v4()
        .with(
            service("ns1", "web", "10.96.0.10", 80)
                .local_endpoint("10.244.1.2", 8080)
                .remote_endpoint("10.244.2.3", 8080)
                .remote_endpoint("10.244.2.4", 8080),
        )
        .with(
            service("ns1", "np", "10.96.0.11", 80)
                .node_port(30080)
                .external_ip("203.0.113.5")
                .remote_endpoint("10.244.2.3", 8080),
        )
        .with(
            service("ns1", "lb", "10.96.0.12", 443)
                .node_port(30081)
                .lb_ip("203.0.113.9")
                .source_range("203.0.113.0/25")
                .source_range("192.168.99.0/24")
                .remote_endpoint("10.244.2.5", 8443),
        )
        .with(
            service("ns2", "local", "10.96.0.13", 80)
                .node_port(30046)
                .lb_ip("203.0.113.10")
                .etp_local()
                .health_check_node_port(30000)
                .local_endpoint("10.244.1.2", 80)
                .remote_endpoint("10.244.2.3", 80),
        )
        .with(
            service("ns1", "sticky", "10.96.0.14", 80)
                .affinity_secs(10800)
                .local_endpoint("10.244.1.2", 80)
                .remote_endpoint("10.244.2.3", 80),
        )
        .with(
            service("ns4", "empty", "10.96.0.15", 80)
                .node_port(30050)
                .external_ip("203.0.113.23"),
        )
        .with(
            service("kube-system", "dns", "10.96.0.53", 53)
                .protocol(Protocol::Udp)
                .remote_endpoint("10.244.2.6", 53),
        )
        .with(
            service("ns6", "sctp", "10.96.0.52", 9999)
                .protocol(Protocol::Sctp)
                .unnamed_port()
                .node_port(30999)
                .remote_endpoint("10.244.2.7", 9999),
        )
}

fn world_v6() -> World {
    World::v6()
        .with(
            service("ns1", "web6", "fd00:10:96::41", 80)
                .node_port(30080)
                .local_endpoint("fd00:10:244:1::2", 8080)
                .remote_endpoint("fd00:10:244:2::3", 8080),
        )
        .with(service("ns1", "empty6", "fd00:10:96::42", 80))
}

fn tcp(src: &str, dst: &str, port: u16) -> Packet {
    Packet::tcp(ip(src), ip(dst), port)
}

/// Every Service address of the plan, from a pod, a client, a client
/// outside the source ranges and the node itself, each with the Service
/// it belongs to.
fn packets(family: IpFamily) -> Vec<(&'static str, Packet)> {
    let udp = |p: Packet| p.with_protocol(Protocol::Udp);
    let sctp = |p: Packet| p.with_protocol(Protocol::Sctp);
    if family == IpFamily::V6 {
        return vec![
            ("web6", tcp(POD6, "fd00:10:96::41", 80)),
            ("web6", tcp(CLIENT6, NODE6, 30080)),
            ("web6", tcp(NODE6, "fd00:10:96::41", 80).from_host()),
            ("empty6", tcp(POD6, "fd00:10:96::42", 80)),
        ];
    }
    let mut packets = Vec::new();
    for (service, dst, port) in [
        ("web", "10.96.0.10", 80),
        ("np", "10.96.0.11", 80),
        ("np", NODE, 30080),
        ("np", "203.0.113.5", 80),
        ("lb", "10.96.0.12", 443),
        ("lb", NODE, 30081),
        ("lb", "203.0.113.9", 443),
        ("local", "10.96.0.13", 80),
        ("local", NODE, 30046),
        ("local", "203.0.113.10", 80),
        ("sticky", "10.96.0.14", 80),
        ("empty", "10.96.0.15", 80),
        ("empty", NODE, 30050),
        ("empty", "203.0.113.23", 80),
    ] {
        for src in [POD, CLIENT, OUTSIDER] {
            packets.push((service, tcp(src, dst, port)));
        }
        packets.push((service, tcp(NODE, dst, port).from_host()));
    }
    packets.push(("dns", udp(tcp(POD, "10.96.0.53", 53))));
    packets.push(("dns", tcp(POD, "10.96.0.53", 53)));
    packets.push(("sctp", sctp(tcp(POD, "10.96.0.52", 9999))));
    packets.push(("sctp", sctp(tcp(CLIENT, NODE, 30999))));
    packets
}

/// The world's full render with every jump rule, as a first full sync
/// writes it.
fn render(world: &World) -> String {
    let mut renderer = Renderer::new(world.options.clone()).unwrap();
    let input = RenderInput {
        family: world.family,
        full: true,
        service_ports: &world.services,
        changed_services: &BTreeSet::new(),
        node: &world.node,
        node_port_addresses: world.node_port_addresses.as_deref(),
        existing_nat_chains: NatChains::Unknown,
        jumps: JUMP_RULES,
    };
    render_both_ways(&mut renderer, &input).restore
}

/// The node: its own namespace, programmed by the real applier as a
/// first sync does (the jump rules' chains ensured, then one restore).
struct Node {
    netns: Netns,
    flavor: IptablesFlavor,
}

impl Node {
    fn programmed(flavor: IptablesFlavor, worlds: &[(&World, &str)]) -> Node {
        let node = Node {
            netns: Netns::create("trace").unwrap(),
            flavor,
        };
        for (world, text) in worlds {
            let mut applier = SystemApplier::new(flavor);
            node.netns.run(|| {
                for jump in JUMP_RULES {
                    applier
                        .ensure_chain(world.family, jump.table, jump.target_chain)
                        .unwrap();
                }
                applier.restore(world.family, text).unwrap();
            });
        }
        node
    }

    fn live(&self, family: IpFamily) -> Ruleset {
        let flavor = self.flavor;
        self.netns
            .run(|| Ruleset::from_live(flavor, family))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn iptables(&self, family: IpFamily, args: &[&str]) -> String {
        let program = self
            .flavor
            .program(family, kp_iptables::applier::Tool::Iptables);
        self.netns.exec_ok(&program, args)
    }
}

/// What the rendered text does: the same steps on an empty ruleset.
fn model(world: &World, text: &str) -> Ruleset {
    let mut ruleset = Ruleset::new();
    for jump in JUMP_RULES {
        let table = jump.table.as_str();
        let chain = jump.target_chain;
        ruleset
            .apply(&format!("*{table}\n:{chain} - [0:0]\nCOMMIT\n"))
            .unwrap();
    }
    ruleset
        .apply(text)
        .unwrap_or_else(|e| panic!("{:?}: {e}", world.family));
    ruleset
}

fn trace(ruleset: &Ruleset, packet: &Packet, locals: &[IpAddr]) -> Trace {
    ruleset
        .trace(packet, locals)
        .unwrap_or_else(|e| panic!("{packet:?}: {e}"))
}

/// The Services whose packets trace differently over `live` and `model`.
fn differing(family: IpFamily, live: &Ruleset, model: &Ruleset) -> BTreeSet<&'static str> {
    let locals = [ip(if family == IpFamily::V4 { NODE } else { NODE6 })];
    let mut services = BTreeSet::new();
    for (service, packet) in packets(family) {
        let kernel = trace(live, &packet, &locals);
        let rendered = trace(model, &packet, &locals);
        assert!(!rendered.paths.is_empty(), "{packet:?}");
        if kernel.behaviour() != rendered.behaviour() {
            eprintln!("{service}: {packet:?}\nlive:\n{kernel}\nrendered:\n{rendered}");
            services.insert(service);
        }
    }
    services
}

fn live_rules_trace_as_the_rendered_text_for_every_service_address(flavor: IptablesFlavor) {
    require(flavor);
    let (v4, v6) = (world_v4(), world_v6());
    let (text4, text6) = (render(&v4), render(&v6));
    let node = Node::programmed(flavor, &[(&v4, &text4), (&v6, &text6)]);
    for (world, text) in [(&v4, &text4), (&v6, &text6)] {
        let live = node.live(world.family);
        let model = model(world, text);
        let differ = differing(world.family, &live, &model);
        assert!(
            differ.is_empty(),
            "{flavor} {:?}: live and rendered traces differ for {differ:?}",
            world.family
        );
    }
}

fn a_rule_deleted_behind_our_back_changes_the_trace_of_its_service_only(flavor: IptablesFlavor) {
    require(flavor);
    let v4 = world_v4();
    let text = render(&v4);
    let node = Node::programmed(flavor, &[(&v4, &text)]);
    let model = model(&v4, &text);
    assert!(differing(IpFamily::V4, &node.live(IpFamily::V4), &model).is_empty());

    // The sticky Service's ClusterIP rule, by its number in KUBE-SERVICES
    // (`-S` lists `-N KUBE-SERVICES` first).
    let listing = node.iptables(IpFamily::V4, &["-t", "nat", "-S", "KUBE-SERVICES"]);
    let number = listing
        .lines()
        .position(|line| line.contains("\"ns1/sticky:p80 cluster IP\""))
        .unwrap_or_else(|| panic!("no sticky rule in\n{listing}"));
    node.iptables(
        IpFamily::V4,
        &["-t", "nat", "-D", "KUBE-SERVICES", &number.to_string()],
    );

    let differ = differing(IpFamily::V4, &node.live(IpFamily::V4), &model);
    assert_eq!(differ, BTreeSet::from(["sticky"]), "{flavor}");
}

#[test]
fn rules_that_cannot_be_read_are_an_error_naming_the_flavor_and_family() {
    require(IptablesFlavor::Nft);
    let applier = SystemApplier::new(IptablesFlavor::Nft).in_network_namespace("kpt-absent");
    let error = Ruleset::from_applier(&applier, IpFamily::V6).unwrap_err();
    assert_eq!(
        error.to_string(),
        "reading the IPv6 rules of iptables-nft failed",
        "{error:?}"
    );
    let cause = std::error::Error::source(&error).map(ToString::to_string);
    assert!(
        cause.is_some_and(|c| c.contains("ip netns exec kpt-absent ip6tables-nft-save -t nat")),
        "{error:?}"
    );
}

fn another_programs_rules_are_read_and_noted_but_one_in_our_chains_is_an_error(
    flavor: IptablesFlavor,
) {
    require(flavor);
    let v4 = world_v4();
    let text = render(&v4);
    let node = Node::programmed(flavor, &[(&v4, &text)]);
    let locals = [ip(NODE)];
    let packet = tcp(POD, "10.96.0.10", 80);

    // Someone logs short packets before our jump: the tracer does not
    // model `-m length`, but a LOG rule cannot change the path.
    node.iptables(
        IpFamily::V4,
        &[
            "-t",
            "nat",
            "-I",
            "PREROUTING",
            "-m",
            "length",
            "--length",
            "1:100",
            "-j",
            "LOG",
        ],
    );
    let live = node.live(IpFamily::V4);
    let traced = trace(&live, &packet, &locals);
    assert_eq!(
        traced.behaviour(),
        trace(&model(&v4, &text), &packet, &locals).behaviour()
    );
    for path in &traced.paths {
        assert_eq!(path.not_followed.len(), 1, "{traced}");
        assert!(
            path.not_followed[0].starts_with("nat/PREROUTING -m length --length 1:100 -j LOG"),
            "{traced}"
        );
    }

    // The same match in one of our chains is refused when read, by name.
    node.iptables(
        IpFamily::V4,
        &[
            "-t",
            "nat",
            "-I",
            "KUBE-MARK-MASQ",
            "-m",
            "length",
            "--length",
            "1:100",
            "-j",
            "RETURN",
        ],
    );
    let error = node
        .netns
        .run(|| Ruleset::from_live(flavor, IpFamily::V4))
        .unwrap_err();
    let save = flavor.program(IpFamily::V4, kp_iptables::applier::Tool::Save);
    assert_eq!(
        error.to_string(),
        format!("the output of {save} -t nat is not understood")
    );
    let cause = std::error::Error::source(&error).unwrap().to_string();
    assert!(
        cause.contains(
            "unknown module length: -A KUBE-MARK-MASQ -m length --length 1:100 -j RETURN"
        ),
        "{cause}"
    );
}
