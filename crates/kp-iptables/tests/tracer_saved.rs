//! The tracer over the kernel's rules as `iptables-save` prints them, on
//! both flavors: real captures in tests/saved/{legacy,nft}/ made by
//! tests/saved/capture.sh (golden texts applied by the real
//! iptables-restore in a scratch namespace, with our jump rules; docker.txt
//! adds Docker's, kubelet's and an administrator's rules).
//!
//! Every golden text of one family that applies alone is captured (see
//! `CAPTURES`); the stories below use these:
//!
//! | capture | Services |
//! |---|---|
//! | session_affinity | ns1/sticky 10.96.0.45:80, ClientIP 10800 s → 10.244.1.2:80, 10.244.2.3:80 |
//! | udp_sctp | kube-system/dns 10.96.0.10:53/UDP → 10.244.2.5:53; ns6/sctp 10.96.0.52:9999/SCTP, NodePort 30999 → 10.244.2.6:9999 |
//! | cluster_ip, docker | ns1/svc1 10.96.0.41:80 → 10.244.1.2, 10.244.2.3, 10.244.2.4 :8080; Docker's 8081 → 172.17.0.2:80 |
//!
//! Node 192.168.99.2 / fd00:192:168:99::2, client 192.168.99.10 /
//! fd00:192:168:99::10, pod 10.244.1.5 / fd00:10:244:1::5.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;

use kp_iptables::tracer::{
    InFlight, IpSetMembers, IpSets, Packet, Ruleset, Trace, TraceError, Verdict,
};
use kp_iptables::Table;
use kp_model::Protocol;

const POD: &str = "10.244.1.5";
const CLIENT: &str = "192.168.99.10";
const NODE: &str = "192.168.99.2";
const POD6: &str = "fd00:10:244:1::5";
const CLIENT6: &str = "fd00:192:168:99::10";
const NODE6: &str = "fd00:192:168:99::2";
const FLAVORS: [&str; 2] = ["legacy", "nft"];

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn tcp(src: &str, dst: &str, port: u16) -> Packet {
    Packet::tcp(ip(src), ip(dst), port)
}

fn read(path: &[&str]) -> String {
    let mut full = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    full.push("tests");
    full.extend(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

fn saved(flavor: &str, name: &str) -> Ruleset {
    let text = read(&["saved", flavor, &format!("{name}.txt")]);
    Ruleset::from_save(&text).unwrap_or_else(|e| panic!("{flavor}/{name}: {e}"))
}

/// The golden text with the jump rules: what we meant the kernel to hold.
fn rendered(name: &str) -> Ruleset {
    let text = read(&["golden", &format!("{name}.txt")]);
    Ruleset::from_restore(&text)
        .and_then(Ruleset::with_jump_rules)
        .unwrap()
}

fn local(name: &str) -> Vec<IpAddr> {
    vec![ip(if name == "ipv6" { NODE6 } else { NODE })]
}

#[track_caller]
fn trace(ruleset: &Ruleset, packet: &Packet, name: &str) -> Trace {
    ruleset
        .trace(packet, &local(name))
        .unwrap_or_else(|e| panic!("{name}: {packet:?}: {e}"))
}

/// Every Service address the golden text of `name` captures (`-d ADDR …
/// --dport N` in KUBE-SERVICES, `--dport N` in KUBE-NODEPORTS at the
/// node's address), as a pod (by address, and on the `cbr0` bridge and a
/// `veth` for the interface detectors), a client, a client outside every
/// source range, and the node itself would reach it; and the same
/// addresses over another protocol.
fn packets(name: &str) -> Vec<Packet> {
    let (pod, client, node) = if name == "ipv6" {
        (POD6, CLIENT6, NODE6)
    } else {
        (POD, CLIENT, NODE)
    };
    let outsider = if name == "ipv6" {
        "2001:db8::7"
    } else {
        "198.51.100.7"
    };
    let text = read(&["golden", &format!("{name}.txt")]);
    let mut packets = Vec::new();
    for (protocol, dst, port) in service_addresses(&text, ip(node)) {
        let other = match protocol {
            Protocol::Tcp => Protocol::Udp,
            _ => Protocol::Tcp,
        };
        let to = |src: &str| Packet::tcp(ip(src), dst, port).with_protocol(protocol);
        packets.extend([
            to(pod),
            to(pod).from_interface("cbr0"),
            to(pod).from_interface("veth9"),
            to(client).from_interface("eth0"),
            to(outsider).from_interface("eth0"),
            to(node).from_host(),
            to(pod).with_protocol(other),
        ]);
    }
    assert!(!packets.is_empty(), "{name}: no Service address found");
    packets
}

fn service_addresses(text: &str, node: IpAddr) -> Vec<(Protocol, IpAddr, u16)> {
    let mut addresses = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let value = |option: &str| {
            let at = words.iter().position(|w| *w == option)?;
            words.get(at + 1).copied()
        };
        let (Some(protocol), Some(port)) = (value("-p"), value("--dport")) else {
            continue;
        };
        let protocol = match protocol {
            "tcp" => Protocol::Tcp,
            "udp" => Protocol::Udp,
            "sctp" => Protocol::Sctp,
            other => panic!("protocol {other} in {line}"),
        };
        let port = port.parse().unwrap();
        let address = match words.get(1).copied() {
            Some("KUBE-SERVICES") => value("-d").map(|d| ip(d.split('/').next().unwrap())),
            Some("KUBE-NODEPORTS") => Some(node),
            _ => None,
        };
        if let Some(address) = address {
            addresses.push((protocol, address, port));
        }
    }
    addresses.sort_by_key(|(p, a, n)| (p.as_rule_str(), *a, *n));
    addresses.dedup();
    addresses
}

/// Every golden text of one family that applies alone (see capture.sh).
const CAPTURES: [&str; 17] = [
    "cluster_ip",
    "detector_bridge",
    "detector_interface_prefix",
    "detector_node_cidr",
    "detector_none",
    "etp_local",
    "etp_local_no_local_endpoints",
    "external_ips",
    "ipv6",
    "itp_local",
    "load_balancer_source_ranges",
    "masquerade_all",
    "no_endpoints",
    "node_port",
    "session_affinity",
    "terminating_fallback",
    "udp_sctp",
];

#[test]
fn every_capture_of_both_flavors_behaves_as_the_text_we_rendered() {
    for name in CAPTURES {
        let model = rendered(name);
        for flavor in FLAVORS {
            let kernel = saved(flavor, name);
            for packet in packets(name) {
                let want = trace(&model, &packet, name);
                let got = trace(&kernel, &packet, name);
                assert_eq!(
                    got.behaviour(),
                    want.behaviour(),
                    "{flavor}/{name}: {packet:?} (after a change of the golden text, \
                     run tests/saved/capture.sh as root)\nkernel:\n{got}\nrendered:\n{want}"
                );
                assert!(!got.paths.is_empty());
                assert!(got.paths.iter().all(|p| p.not_followed.is_empty()), "{got}");
            }
        }
    }
}

#[test]
fn every_rule_of_our_chains_survives_the_round_trip_through_the_kernel() {
    for name in CAPTURES {
        let model = rendered(name);
        for flavor in FLAVORS {
            let kernel = saved(flavor, name);
            for table in [Table::Nat, Table::Filter] {
                let ours = |r: &Ruleset| -> Vec<String> {
                    let chains = r.chains(table).into_iter();
                    chains
                        .filter(|c| c.starts_with("KUBE-"))
                        .map(String::from)
                        .collect()
                };
                assert_eq!(ours(&kernel), ours(&model), "{flavor}/{name}");
                for chain in model.chains(table) {
                    let count = |r: &Ruleset| r.rules(table, chain).map(|r| r.len());
                    assert_eq!(
                        count(&kernel),
                        count(&model),
                        "{flavor}/{name} {table}/{chain}"
                    );
                }
            }
        }
    }
}

#[test]
fn sctp_and_udp_services_are_told_apart_by_protocol() {
    for flavor in FLAVORS {
        let kernel = saved(flavor, "udp_sctp");
        let sctp = tcp(POD, "10.96.0.52", 9999).with_protocol(Protocol::Sctp);
        let trace = trace(&kernel, &sctp, "udp_sctp");
        assert_eq!(trace.destinations().len(), 1, "{trace}");
        assert!(trace
            .destinations()
            .contains(&"10.244.2.6:9999".parse().unwrap()));
        let node_port = tcp(CLIENT, NODE, 30999).with_protocol(Protocol::Sctp);
        let trace = self::trace(&kernel, &node_port, "udp_sctp");
        assert!(trace.always_masqueraded(), "{trace}");
        // The same port over TCP is no Service.
        let tcp_trace = self::trace(&kernel, &tcp(CLIENT, NODE, 30999), "udp_sctp");
        assert!(tcp_trace.destinations().is_empty(), "{tcp_trace}");
        let udp_as_tcp = self::trace(&kernel, &tcp(POD, "10.96.0.10", 53), "udp_sctp");
        assert!(udp_as_tcp.destinations().is_empty(), "{udp_as_tcp}");
    }
}

#[test]
fn session_affinity_is_reported_on_the_path_of_a_first_packet() {
    for flavor in FLAVORS {
        let trace = trace(
            &saved(flavor, "session_affinity"),
            &tcp(POD, "10.96.0.45", 80),
            "session_affinity",
        );
        assert_eq!(trace.paths.len(), 2, "{trace}");
        for path in &trace.paths {
            let lists: Vec<(&str, Option<u32>)> = path
                .affinity
                .iter()
                .map(|a| (a.list.as_str(), a.seconds))
                .collect();
            assert_eq!(
                lists,
                [
                    ("KUBE-SEP-FHBPJSGR73MMOGRR", Some(10800)),
                    ("KUBE-SEP-EVU65E3JDOTX3UYC", Some(10800)),
                ],
                "{trace}"
            );
            assert_eq!(path.probability, 0.5, "{trace}");
        }
    }
}

#[test]
fn probabilities_of_the_paths_are_the_kernels() {
    for flavor in FLAVORS {
        let trace = trace(
            &saved(flavor, "docker"),
            &tcp(NODE, "10.96.0.41", 80).from_host(),
            "docker",
        );
        let chances: Vec<f64> = trace.paths.iter().map(|p| p.probability).collect();
        assert_eq!(chances.len(), 3, "{trace}");
        let total: f64 = chances.iter().sum();
        assert!((total - 1.0).abs() < 1e-9, "{chances:?}");
        for chance in chances {
            assert!((chance - 1.0 / 3.0).abs() < 1e-6, "{chance}");
        }
    }
}

#[test]
fn dockers_forward_policy_drops_pod_traffic_that_our_rules_alone_accept() {
    let packet = tcp(POD, "10.96.0.41", 80);
    let ours = trace(&rendered("cluster_ip"), &packet, "docker");
    assert!(ours.always(Verdict::Accept), "{ours}");
    for flavor in FLAVORS {
        let trace = trace(&saved(flavor, "docker"), &packet, "docker");
        assert_eq!(trace.destinations().len(), 0, "{trace}");
        assert!(trace.always(Verdict::Drop), "{flavor}:\n{trace}");
        // `-o docker0 -j DOCKER` cannot be decided (no routes in a trace),
        // but nothing in DOCKER matches a pod address: noted, not failed.
        for path in &trace.paths {
            assert_eq!(path.not_followed.len(), 1, "{trace}");
            assert!(
                path.not_followed[0].starts_with("filter/FORWARD -o docker0 -j DOCKER: "),
                "{trace}"
            );
        }
    }
}

#[test]
fn other_softwares_rules_that_can_change_the_path_fail_the_trace_by_name() {
    for flavor in FLAVORS {
        let kernel = saved(flavor, "docker");
        // Docker's published port: DNATed by a rule the tracer reads, then
        // accepted only if `-o docker0` holds, which it cannot know.
        let error = kernel
            .trace(&tcp(CLIENT, NODE, 8081), &local("docker"))
            .unwrap_err();
        match &error {
            TraceError::Undecidable {
                table, chain, rule, ..
            } => {
                assert_eq!((table.as_str(), chain.as_str()), ("filter", "DOCKER"));
                assert!(rule.contains("-o docker0"), "{error}");
            }
            other => panic!("{flavor}: {other}"),
        }
        // `-m owner` can drop the node's own UDP to port 9.
        let udp = tcp(NODE, "203.0.113.1", 9)
            .with_protocol(Protocol::Udp)
            .from_host();
        let error = kernel.trace(&udp, &local("docker")).unwrap_err();
        assert!(
            error.to_string().contains("--uid-owner 0"),
            "{flavor}: {error}"
        );
    }
}

#[test]
fn other_softwares_rules_that_cannot_change_the_path_are_noted() {
    for flavor in FLAVORS {
        let kernel = saved(flavor, "docker");
        // A LOG rule with `-m limit`, which the tracer does not model.
        let trace = trace(&kernel, &tcp(CLIENT, NODE, 22), "docker");
        assert!(trace.always(Verdict::Accept), "{trace}");
        let noted = &trace.paths[0].not_followed;
        assert_eq!(noted.len(), 1, "{trace}");
        assert!(noted[0].contains("-j LOG --log-prefix"), "{trace}");
        assert!(noted[0].contains("-m limit"), "{trace}");
        // A rule of a module we do not model but whose decided matches
        // fail is simply not matched.
        let trace = trace_ok(&kernel, &tcp(NODE, "10.96.0.41", 80).from_host());
        assert!(trace.paths.iter().all(|p| p.not_followed.is_empty()));
    }
}

fn trace_ok(ruleset: &Ruleset, packet: &Packet) -> Trace {
    trace(ruleset, packet, "docker")
}

#[test]
fn a_rule_of_our_own_chains_that_is_not_understood_is_an_error_naming_it() {
    for flavor in FLAVORS {
        let text = read(&["saved", flavor, "docker.txt"]);
        let tampered = text.replace(
            "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
            "-A KUBE-MARK-MASQ -m owner --uid-owner 0 -j MARK --set-xmark 0x4000/0x4000",
        );
        assert_ne!(tampered, text);
        let error = Ruleset::from_save(&tampered).unwrap_err();
        let message = error.to_string();
        assert!(message.contains("-A KUBE-MARK-MASQ -m owner"), "{message}");
        assert!(message.contains("unknown module owner"), "{message}");
        // The same rule in another chain is read, and judged on the path.
        let elsewhere = text.replace(
            "-A DOCKER-USER -j RETURN",
            "-A DOCKER-USER -m owner --uid-owner 0 -j RETURN",
        );
        assert_ne!(elsewhere, text);
        Ruleset::from_save(&elsewhere).unwrap();
    }
}

/// Written by hand in the shapes kp-ipvs renders (crates/kp-ipvs/src/
/// rules.rs), as iptables-save prints them.
const IPVS_NAT: &str = "*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SERVICES - [0:0]
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-NODE-PORT -p tcp -m comment --comment \"Kubernetes nodeport TCP port for masquerade purpose\" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully
-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN
-A KUBE-SERVICES ! -s 10.244.0.0/16 -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-IPVS-FILTER - [0:0]
-A INPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-FILTER
-A KUBE-IPVS-FILTER -m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT --reject-with icmp-port-unreachable
COMMIT
";

#[test]
fn ipvs_mode_rules_ask_the_ipsets_given_to_the_trace() {
    let ruleset = Ruleset::from_save(IPVS_NAT).unwrap();
    let cluster_ip = ip("10.96.0.41");
    let sets = IpSets::new()
        .with(
            "KUBE-CLUSTER-IP",
            IpSetMembers::AddressPorts(vec![(cluster_ip, Protocol::Tcp, 80)]),
        )
        .with(
            "KUBE-IPVS-IPS",
            IpSetMembers::Addresses(vec!["10.96.0.41/32".parse().unwrap()]),
        )
        .with("KUBE-NODE-PORT-TCP", IpSetMembers::Ports(vec![30080]));
    // The ClusterIP is on kube-ipvs0, so local to the node.
    let locals = [ip(NODE), cluster_ip];
    let run = |packet: &Packet| ruleset.trace_with_sets(packet, &locals, &sets).unwrap();

    let from_client = run(&tcp(CLIENT, "10.96.0.41", 80));
    assert!(from_client.always_masqueraded(), "{from_client}");
    let from_pod = run(&tcp(POD, "10.96.0.41", 80));
    assert!(from_pod.always(Verdict::Accept) && from_pod.never_masqueraded());
    // A port the Service does not have: the VIP refuses it.
    let other_port = run(&tcp(POD, "10.96.0.41", 81));
    assert!(other_port.always(Verdict::Reject), "{other_port}");
    let node_port = run(&tcp(CLIENT, NODE, 30080));
    assert!(node_port.always_masqueraded(), "{node_port}");
    let not_a_node_port = run(&tcp(CLIENT, NODE, 30081));
    assert!(not_a_node_port.never_masqueraded(), "{not_a_node_port}");

    // Without the members, a rule of our chain cannot be decided.
    let error = ruleset
        .trace(&tcp(CLIENT, "10.96.0.41", 80), &locals)
        .unwrap_err();
    assert!(
        error.to_string().contains("KUBE-CLUSTER-IP were not given"),
        "{error}"
    );
}

/// The IPVS mode's out filter as iptables-legacy-save prints it (the
/// protocol as its number).
const IPVS_OUT_FILTER: &str = "*filter
:OUTPUT ACCEPT [0:0]
:KUBE-IPVS-OUT-FILTER - [0:0]
-A OUTPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-OUT-FILTER
-A KUBE-IPVS-OUT-FILTER -s 203.0.113.9/32 -m ipvs --vaddr 203.0.113.9/32 --vproto 6 --vport 80 -j DROP
COMMIT
";

#[test]
fn a_hook_at_a_time_asks_ipvs_matches_about_the_virtual_server_that_scheduled_the_packet() {
    let ruleset = Ruleset::from_save(IPVS_OUT_FILTER).unwrap();
    let lb = ip("203.0.113.9");
    let packet = Packet::tcp(lb, lb, 80).from_host();
    let output = |flight: InFlight| {
        ruleset
            .run_hook(
                Table::Filter,
                "OUTPUT",
                &packet,
                flight,
                &[lb],
                &IpSets::new(),
            )
            .unwrap()
    };
    let mut scheduled = InFlight::new(&packet);
    scheduled.redirect("10.244.1.2:80".parse().unwrap(), 0.5, "ipvs".to_owned());
    let paths = output(scheduled);
    assert_eq!(paths.len(), 1);
    let (flight, verdict, masqueraded) = &paths[0];
    assert_eq!((*verdict, *masqueraded), (Verdict::Drop, false));
    let path = flight.clone().finish(*verdict, *masqueraded);
    assert_eq!(path.destination, Some("10.244.1.2:80".parse().unwrap()));
    assert_eq!(path.probability, 0.5);
    assert_eq!(path.matched.len(), 3, "{:?}", path.matched);
    // Another port of the same virtual address is let through.
    let other = Packet::tcp(lb, lb, 81).from_host();
    let mut elsewhere = InFlight::new(&other);
    elsewhere.redirect("10.244.1.2:81".parse().unwrap(), 1.0, "ipvs".to_owned());
    let paths = ruleset
        .run_hook(
            Table::Filter,
            "OUTPUT",
            &other,
            elsewhere,
            &[lb],
            &IpSets::new(),
        )
        .unwrap();
    assert_eq!(paths[0].1, Verdict::Accept);
}
