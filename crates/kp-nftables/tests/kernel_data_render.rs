//! Kernel tests of the data layout ([`Layout::Data`]) as the backend
//! renders it: endpoint changes reach the kernel as map elements, and real
//! connections follow them.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web, http 80/TCP | ClusterIP 10.96.0.30, endpoints ep1, ep2 (node-1), then ep1 and ep3 (node-2), then ep1 alone, then ep1, ep2, ep3, then five (two silent), then ep1, ep2, then the five again |
//! | ns1/sticky6, http 80/TCP | ClusterIP fd00:10:96::31, ClientIP affinity 300 s, endpoints ep1 (node-1), ep3 (node-2); client: pod ep2 |
//! | ns1/moved, http 80/TCP | ClusterIP 10.96.0.32, endpoints ep1, ep3 |
//! | ns1/sticky, http 80/TCP | ClusterIP 10.96.0.31, ClientIP affinity 300 s, endpoints ep1, ep2, ep3, then the two the client was not sent to |
//! | ns1/sticky, http 80/TCP (second test) | ClusterIP 10.96.0.35, NodePort 30095, ClientIP affinity 300 s, endpoints ep1, ep2, ep3 |
//! | ns1/toggle, http 80/TCP | ClusterIP 10.96.0.36, without, then with, then without ClientIP affinity 300 s; endpoints ep1, ep2, ep3 |
//!
//! The grouping of the class rules is told over nine pods, g1 to g5 of
//! node-1 (10.244.1.2–.6) and g6 to g9 of node-2 (10.244.2.2–.5), behind
//! ns1/web (ClusterIP 10.96.0.30), with up to eleven addresses nobody
//! answers on (10.244.2.240–.250).
//!
//! Node 192.168.99.2; `client` 192.168.99.10; pods of node-1 10.244.1.2
//! (ep1), .3 (ep2), of node-2 10.244.2.2 (ep3), each serving TCP 8080.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kernel;

use kernel::{at, build, node_at, pod_ip, pod_ip_v6, require, slice, three_pods, Proxy};
use kp_model::IpFamily;
use kp_nftables::Layout;
use kp_sync::SyncOutcome;
use kp_testkit::builders::service;
use kp_testkit::netns::{hits, hits_until_all};

const WEB: &str = "10.96.0.30";

/// The rules written by a sync.
fn rules_written(outcome: &SyncOutcome) -> usize {
    outcome
        .rules_written_per_table
        .iter()
        .map(|(_, rules)| rules)
        .sum()
}

/// The chains of a listing, with their rules (no set or map).
fn chains_of(listing: &str) -> Vec<&str> {
    chains_but(listing, &|_| false)
}

/// The chains of a listing but the class chains (`…-by-count-…`).
fn chains_but_classes(listing: &str) -> Vec<&str> {
    chains_but(listing, &|header| header.contains("-by-count-"))
}

/// The chains of a listing whose header `skip` does not pick, with their
/// rules.
fn chains_but<'l>(listing: &'l str, skip: &dyn Fn(&str) -> bool) -> Vec<&'l str> {
    let mut in_chain = false;
    let mut lines = Vec::new();
    for line in listing.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("chain ") {
            in_chain = !skip(trimmed);
        }
        if in_chain {
            lines.push(line);
        }
        if trimmed == "}" {
            in_chain = false;
        }
    }
    lines
}

#[test]
fn endpoint_changes_are_elements_and_connections_follow_them() {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start_in(&topology, IpFamily::V4, Layout::Data);
    let [ep1, ep2, ep3] = ["ep1", "ep2", "ep3"].map(|p| pod_ip(&topology, p));
    let web = service("ns1", "web", |s| s.cluster_ip(WEB).port("http", 80, "TCP"));
    proxy.apply(&[web], &[slice("web", &[ep1, ep2], &[])]);
    assert!(proxy.sync().full, "the first sync writes everything");
    let client = topology.client();
    let counts = hits_until_all(client, at(WEB, 80), &["ep1", "ep2"], 200);
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["ep1", "ep2"]);
    let before = proxy.list();

    // ep2 replaced by ep3: the same count, so elements only.
    proxy.apply(&[], &[slice("web", &[ep1], &[ep3])]);
    let outcome = proxy.sync();
    assert!(!outcome.full);
    assert_eq!(rules_written(&outcome), 0, "{outcome:?}");
    let after = proxy.list();
    assert_eq!(chains_of(&before), chains_of(&after), "no rule changed");
    assert!(chains_of(&after).len() > 20, "{after}");
    assert!(after.contains("10.244.2.2 . 8080"), "{after}");
    assert!(!after.contains("10.244.1.3 . 8080"), "{after}");
    let counts = hits_until_all(client, at(WEB, 80), &["ep1", "ep3"], 200);
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["ep1", "ep3"]);

    // ep3 gone: the count drops to 1, whose class the table holds (a
    // neighbour of 2): elements only.
    proxy.apply(&[], &[slice("web", &[ep1], &[])]);
    let outcome = proxy.sync();
    assert_eq!(rules_written(&outcome), 0, "{outcome:?}");
    let listing = proxy.list();
    assert!(
        listing.contains("@endpoint-count-1 dnat ip to ip daddr . tcp dport . numgen random mod 1 map @service-endpoints-tcp"),
        "{listing}"
    );
    let counts = hits_until_all(client, at(WEB, 80), &["ep1"], 20);
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["ep1"]);

    // Three at once: the count grows, still within the classes held.
    proxy.apply(&[], &[slice("web", &[ep1, ep2], &[ep3])]);
    let outcome = proxy.sync();
    assert_eq!(rules_written(&outcome), 0, "{outcome:?}");
    let counts = hits_until_all(client, at(WEB, 80), &["ep1", "ep2", "ep3"], 300);
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["ep1", "ep2", "ep3"]);

    // Five (two of them addresses nobody answers on): a count the table
    // holds no class for. The kernel takes the class chain written anew
    // with the classes 1 to 6, and no Service chain changes.
    let silent: [std::net::IpAddr; 2] = [
        "10.244.1.250".parse().unwrap(),
        "10.244.2.250".parse().unwrap(),
    ];
    proxy.apply(
        &[],
        &[slice("web", &[ep1, ep2, silent[0]], &[ep3, silent[1]])],
    );
    let outcome = proxy.sync();
    assert_eq!(rules_written(&outcome), 6, "{outcome:?}");
    let after = proxy.list();
    assert_eq!(
        chains_but_classes(&before),
        chains_but_classes(&after),
        "only the class chain changed"
    );
    assert_ne!(chains_of(&before), chains_of(&after));
    assert!(
        after.contains("@endpoint-count-5 dnat ip to ip daddr . tcp dport . numgen random mod 5 map @service-endpoints-tcp"),
        "{after}"
    );

    // Back to two: elements only (the entry moves from one count set to
    // the other, three slots go).
    proxy.apply(&[], &[slice("web", &[ep1, ep2], &[])]);
    let outcome = proxy.sync();
    assert_eq!(rules_written(&outcome), 0, "{outcome:?}");
    let counts = hits_until_all(client, at(WEB, 80), &["ep1", "ep2"], 200);
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["ep1", "ep2"]);

    // Five again, taken by a periodic full sync of the untouched table: it
    // sends only the differences and ends as a full rewrite would. The
    // entry leaves the count set of two, which no class needs any more:
    // the class chain is written anew with the classes 4 to 6, the entry's
    // element leaves the set, and the set goes last, in one transaction.
    proxy.apply(
        &[],
        &[slice("web", &[ep1, ep2, silent[0]], &[ep3, silent[1]])],
    );
    let outcome = proxy.full_sync();
    assert!(outcome.full);
    assert_eq!(rules_written(&outcome), 3, "{outcome:?}");
    let listing = proxy.list();
    for gone in ["endpoint-count-1", "endpoint-count-2", "endpoint-count-3"] {
        assert!(!listing.contains(gone), "{gone}: {listing}");
    }
    assert!(
        listing.contains("@endpoint-count-5 dnat ip to ip daddr . tcp dport . numgen random mod 5 map @service-endpoints-tcp"),
        "{listing}"
    );
    let five = proxy.nft(&["list", "set", "ip", "kube-proxy", "endpoint-count-5"]);
    assert!(five.contains(WEB), "{five}");
    let again = proxy.full_sync();
    assert_eq!(rules_written(&again), 0, "{again:?}");
}

/// Nine pods: `g1` to `g5` on this node, `g6` to `g9` on node-2, each
/// serving TCP 8080; and the client.
fn nine_pods() -> kp_testkit::netns::TopologyBuilder {
    let mut topology = kp_testkit::netns::Topology::builder();
    for n in 1..=9 {
        let name = format!("g{n}");
        topology = if n <= 5 {
            topology.pod(&name, |p| p.tcp(kernel::POD_TCP_PORT))
        } else {
            topology.remote_pod(&name, |p| p.tcp(kernel::POD_TCP_PORT))
        };
    }
    topology.client("client")
}

/// The lines of the chain `name` in a listing.
fn chain_in<'l>(listing: &'l str, name: &str) -> Vec<&'l str> {
    let header = format!("chain {name} {{");
    chains_but(listing, &|chain| chain != header)
}

/// The class rules are grouped by eight counts (1–8, 9–16, …): an entry
/// is in the count set of its count and the group set of its group, and
/// the class chain goes to the group's chain. With eight endpoints the
/// table holds the classes 7 to 9, so a ninth endpoint moves the entry
/// into the next group's sets and back with elements only, and
/// connections follow; a count far away (20) writes only its group chain
/// and the class chain; a periodic full sync of the untouched table then
/// deletes the group no class is left in, and a second writes nothing.
#[test]
fn counts_crossing_a_group_boundary_are_elements_and_far_counts_write_their_group() {
    require();
    let topology = build(nine_pods());
    let proxy = Proxy::start_in(&topology, IpFamily::V4, Layout::Data);
    let names: Vec<String> = (1..=9).map(|n| format!("g{n}")).collect();
    let ips: Vec<_> = names.iter().map(|name| pod_ip(&topology, name)).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let web_slice = |count: usize, silent: &[std::net::IpAddr]| {
        let local: Vec<_> = ips[..count.min(5)].to_vec();
        let mut remote: Vec<_> = ips[count.min(5)..count].to_vec();
        remote.extend_from_slice(silent);
        slice("web", &local, &remote)
    };
    let web = service("ns1", "web", |s| s.cluster_ip(WEB).port("http", 80, "TCP"));
    proxy.apply(&[web], &[web_slice(8, &[])]);
    assert!(proxy.sync().full);
    let client = topology.client();
    let group_holds = |group: &str| {
        proxy
            .nft(&["list", "set", "ip", "kube-proxy", group])
            .contains(WEB)
    };
    let counts = hits_until_all(client, at(WEB, 80), &names[..8], 600);
    assert_eq!(counts.keys().collect::<Vec<_>>(), names[..8]);
    assert!(group_holds("endpoint-group-1-8"));
    let listing = proxy.list();
    assert!(
        listing.contains("ip daddr . meta l4proto . th dport @endpoint-group-9-16 goto endpoints-by-count-tcp-9-16"),
        "the class of 9 is held ahead: {listing}"
    );

    // 8 → 9 → 8: across the boundary and back, elements only.
    for (count, into, from) in [
        (9, "endpoint-group-9-16", "endpoint-group-1-8"),
        (8, "endpoint-group-1-8", "endpoint-group-9-16"),
    ] {
        let before = proxy.list();
        proxy.apply(&[], &[web_slice(count, &[])]);
        let outcome = proxy.sync();
        assert!(!outcome.full);
        assert_eq!(rules_written(&outcome), 0, "{count}: {outcome:?}");
        assert_eq!(chains_of(&before), chains_of(&proxy.list()), "{count}");
        assert!(group_holds(into), "{count}: {into}");
        assert!(!group_holds(from), "{count}: {from}");
        let counts = hits_until_all(client, at(WEB, 80), &names[..count], 600);
        assert_eq!(counts.keys().collect::<Vec<_>>(), names[..count]);
    }

    // Twenty (the nine pods and eleven addresses nobody answers on): the
    // classes 19 to 21, in a group of their own (17–24). Only its chain
    // (three class rules) and the class chain (three group rules) are
    // written; the other group chains stay as they were.
    let before = proxy.list();
    let silent: Vec<std::net::IpAddr> = (0..11)
        .map(|n| format!("10.244.2.{}", 240 + n).parse().unwrap())
        .collect();
    proxy.apply(&[], &[web_slice(9, &silent)]);
    let outcome = proxy.sync();
    assert_eq!(rules_written(&outcome), 6, "{outcome:?}");
    let after = proxy.list();
    assert_eq!(chains_but_classes(&before), chains_but_classes(&after));
    for kept in ["endpoints-by-count-tcp-1-8", "endpoints-by-count-tcp-9-16"] {
        assert_eq!(chain_in(&before, kept), chain_in(&after, kept), "{kept}");
        assert!(!chain_in(&after, kept).is_empty(), "{kept}: {after}");
    }
    assert!(
        chain_in(&after, "endpoints-by-count-tcp-17-24").iter().any(|line| line.contains(
            "@endpoint-count-20 dnat ip to ip daddr . tcp dport . numgen random mod 20 map @service-endpoints-tcp"
        )),
        "{after}"
    );
    assert!(group_holds("endpoint-group-17-24"));

    // Back to the nine pods (elements only), then a periodic full sync:
    // the classes held become 8 to 10, so the group 17–24 goes (its chain,
    // its sets and its rule in the class chain); the group chains 1–8 and
    // 9–16 and the class chain are written anew (1 + 2 + 2 rules).
    proxy.apply(&[], &[web_slice(9, &[])]);
    assert_eq!(rules_written(&proxy.sync()), 0);
    let outcome = proxy.full_sync();
    assert!(outcome.full);
    assert_eq!(rules_written(&outcome), 5, "{outcome:?}");
    let listing = proxy.list();
    for gone in ["17-24", "endpoint-count-20", "endpoint-count-7 "] {
        assert!(!listing.contains(gone), "{gone}: {listing}");
    }
    let counts = hits_until_all(client, at(WEB, 80), &names, 600);
    assert_eq!(counts.keys().collect::<Vec<_>>(), names);
    let again = proxy.full_sync();
    assert_eq!(rules_written(&again), 0, "{again:?}");
    assert_eq!(proxy.list(), listing);
}

/// When the endpoint a client is held to leaves, the service chain no
/// longer looks up that endpoint's affinity set, and the client's next
/// connections go to one of the endpoints left; the pod that left still
/// answers, so a stale lookup would send the client there.
#[test]
fn a_client_held_to_an_endpoint_that_left_goes_to_another() {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start_in(&topology, IpFamily::V4, Layout::Data);
    let names = ["ep1", "ep2", "ep3"];
    let ips = names.map(|p| pod_ip(&topology, p));
    let sticky = service("ns1", "sticky", |s| {
        s.cluster_ip("10.96.0.31")
            .port("http", 80, "TCP")
            .session_affinity_client_ip(300)
    });
    proxy.apply(&[sticky], &[slice("sticky", &ips[..2], &ips[2..])]);
    proxy.sync();
    let client = topology.client();
    let counts = hits(client, at("10.96.0.31", 80), 10);
    assert_eq!(counts.len(), 1, "one endpoint for one client: {counts:?}");
    let held = counts.keys().next().unwrap().clone();
    let held_ip = pod_ip(&topology, &held);
    let lookup = format!("__{held_ip}/8080 goto endpoint-");
    assert!(proxy.list().contains(&lookup), "{}", proxy.list());

    let left: Vec<_> = ips.iter().copied().filter(|ip| *ip != held_ip).collect();
    proxy.apply(&[], &[slice("sticky", &left, &[])]);
    proxy.sync();
    assert!(!proxy.list().contains(&lookup), "{}", proxy.list());
    let counts = hits(client, at("10.96.0.31", 80), 10);
    assert_eq!(counts.len(), 1, "held again, to one endpoint: {counts:?}");
    assert!(!counts.contains_key(&held), "{held} left: {counts:?}");
    // The table stays trusted: once a periodic full sync has run, the next
    // one writes nothing.
    assert!(proxy.full_sync().full);
    let again = proxy.full_sync();
    assert_eq!(rules_written(&again), 0, "{again:?}");
}

/// Affinity is per service port, as upstream has it: a client held to an
/// endpoint through the ClusterIP goes to the same endpoint through the
/// NodePort.
#[test]
fn a_client_goes_to_the_same_endpoint_through_the_cluster_ip_and_the_node_port() {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start_in(&topology, IpFamily::V4, Layout::Data);
    let ips = ["ep1", "ep2", "ep3"].map(|p| pod_ip(&topology, p));
    let sticky = service("ns1", "sticky", |s| {
        s.service_type("NodePort")
            .cluster_ip("10.96.0.35")
            .port("http", 80, "TCP")
            .node_port(30095)
            .session_affinity_client_ip(300)
    });
    proxy.apply(&[sticky], &[slice("sticky", &ips[..2], &ips[2..])]);
    proxy.sync();
    let client = topology.client();
    let through_cluster_ip = hits(client, at("10.96.0.35", 80), 10);
    assert_eq!(through_cluster_ip.len(), 1, "{through_cluster_ip:?}");
    let through_node_port = hits(client, node_at(30095), 10);
    assert_eq!(
        through_node_port.keys().collect::<Vec<_>>(),
        through_cluster_ip.keys().collect::<Vec<_>>(),
        "the same endpoint through either entry"
    );
    // Another client is held on its own, to whichever endpoint its first
    // connection drew.
    let spread = hits_until_all(
        topology.pod("ep2").netns(),
        at("10.96.0.35", 80),
        &["ep1", "ep2", "ep3"],
        200,
    );
    assert_eq!(spread.len(), 1, "a pod is held too: {spread:?}");
}

/// A service port that gains ClientIP affinity and loses it again is
/// rewritten by partial syncs the kernel takes (draw to endpoint chains and
/// back); connections are answered throughout, held to one endpoint while
/// it has affinity and spread again after; then the table is what a full
/// render writes: a second periodic full sync writes no rule.
#[test]
fn a_port_gaining_and_losing_affinity_is_answered_throughout() {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start_in(&topology, IpFamily::V4, Layout::Data);
    let ips = ["ep1", "ep2", "ep3"].map(|p| pod_ip(&topology, p));
    let toggle = |affinity: bool| {
        service("ns1", "toggle", |s| {
            let s = s.cluster_ip("10.96.0.36").port("http", 80, "TCP");
            if affinity {
                s.session_affinity_client_ip(300)
            } else {
                s
            }
        })
    };
    let client = topology.client();
    let address = at("10.96.0.36", 80);
    let all = ["ep1", "ep2", "ep3"];
    proxy.apply(&[toggle(false)], &[slice("toggle", &ips[..2], &ips[2..])]);
    proxy.sync();
    assert_eq!(hits_until_all(client, address, &all, 200).len(), 3);

    proxy.apply(&[toggle(true)], &[]);
    assert!(!proxy.sync().full);
    let held = hits(client, address, 10);
    assert_eq!(held.len(), 1, "held to one endpoint: {held:?}");

    proxy.apply(&[toggle(false)], &[]);
    assert!(!proxy.sync().full);
    assert_eq!(hits_until_all(client, address, &all, 200).len(), 3);
    assert!(proxy.full_sync().full);
    let again = proxy.full_sync();
    assert_eq!(rules_written(&again), 0, "{again:?}");
}

/// A restart in the other layout: the new process's first sync deletes
/// the table and writes it afresh in one transaction, so the Service
/// answers before and after, and nothing of the earlier layout is left.
#[test]
fn a_restart_in_the_other_layout_replaces_the_table_whole() {
    require();
    let topology = build(three_pods());
    let ips = [pod_ip(&topology, "ep1"), pod_ip(&topology, "ep3")];
    let moved = service("ns1", "moved", |s| {
        s.cluster_ip("10.96.0.32").port("http", 80, "TCP")
    });
    let client = topology.client();
    for (from, to) in [
        (Layout::Chains, Layout::Data),
        (Layout::Data, Layout::Chains),
    ] {
        let earlier = Proxy::start_in(&topology, IpFamily::V4, from);
        earlier.apply(
            std::slice::from_ref(&moved),
            &[slice("moved", &ips[..1], &ips[1..])],
        );
        earlier.sync();
        let counts = hits_until_all(client, at("10.96.0.32", 80), &["ep1", "ep3"], 200);
        assert_eq!(counts.len(), 2, "{from:?}: {counts:?}");
        let later = Proxy::start_in(&topology, IpFamily::V4, to);
        later.apply(
            std::slice::from_ref(&moved),
            &[slice("moved", &ips[..1], &ips[1..])],
        );
        assert!(later.sync().full);
        let counts = hits_until_all(client, at("10.96.0.32", 80), &["ep1", "ep3"], 200);
        assert_eq!(counts.len(), 2, "{to:?}: {counts:?}");
        let listing = later.list();
        let (gone, kept) = match to {
            Layout::Data => ("chain endpoint-", "map service-endpoints-tcp"),
            Layout::Chains => ("service-endpoints-tcp", "chain endpoint-"),
        };
        assert!(!listing.contains(gone), "{from:?} -> {to:?}: {listing}");
        assert!(listing.contains(kept), "{from:?} -> {to:?}: {listing}");
    }
}

/// IPv6 affinity: a client stays on one endpoint, held in that endpoint's
/// set of clients.
#[test]
fn ipv6_session_affinity_keeps_a_client_on_one_endpoint() {
    require();
    let topology = build(three_pods());
    let proxy = Proxy::start_in(&topology, IpFamily::V6, Layout::Data);
    let sticky = service("ns1", "sticky6", |s| {
        s.ip_families(&["IPv6"])
            .cluster_ip("fd00:10:96::31")
            .port("http", 80, "TCP")
            .session_affinity_client_ip(300)
    });
    let slices = slice(
        "sticky6",
        &[pod_ip_v6(&topology, "ep1")],
        &[pod_ip_v6(&topology, "ep3")],
    );
    proxy.apply(&[sticky], &[slices]);
    proxy.sync();
    let counts = hits(topology.pod("ep2").netns(), at("fd00:10:96::31", 80), 12);
    assert_eq!(counts.len(), 1, "one endpoint for one client: {counts:?}");
    let held = pod_ip_v6(&topology, counts.keys().next().unwrap());
    let client = pod_ip_v6(&topology, "ep2");
    let listing = proxy.list();
    let set = listing
        .lines()
        .map(str::trim)
        .filter_map(|line| line.strip_prefix("set "))
        .map(|rest| rest.trim_end_matches(" {"))
        .find(|name| {
            // Colons are dots in names (`fd00.10.244.1..2`).
            let endpoint = held.to_string().replace(':', ".");
            name.starts_with("affinity-") && name.ends_with(&format!("__{endpoint}/8080"))
        })
        .unwrap_or_else(|| panic!("the held endpoint's affinity set: {listing}"))
        .to_owned();
    let elements = proxy.nft(&["list", "set", "ip6", "kube-proxy", &set]);
    assert!(elements.contains(&client.to_string()), "{elements}");
}
