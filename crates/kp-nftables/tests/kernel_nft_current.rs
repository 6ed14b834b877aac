//! Kernel tests (issue 26): everything the nftables mode commits over
//! netlink lists, unchanged, with the `nft` of Debian bookworm (the
//! system's, 1.0.6) and with a current release's (`$KP_NFT_CURRENT`:
//! Debian trixie's nft 1.1.3 with libnftnl 1.2.9, which
//! `scripts/lib/nft-current.sh` puts in place and `scripts/test` exports),
//! and the current release's listing loads again with its `nft -f` in a
//! fresh namespace and lists the same. Bytecode that a release cannot
//! decompile, or decompiles to text it cannot read back, breaks every
//! tool that reads the table with that release.
//!
//! The assertions compare listings only and name no chain, set or map, so
//! they hold for whatever the renderer writes; each listing must hold
//! every address of its world, so that two empty or truncated listings
//! cannot pass as alike. Every test runs in both layouts (`chains::…`,
//! `data::…`).
//!
//! | object | IPv4 | IPv6 |
//! |---|---|---|
//! | ns1/web:p80 TCP | ClusterIP 10.96.0.10; endpoints 10.244.1.2 (here), 10.244.2.2 (node-2) | ClusterIP fd00:10:96::10, NodePort 30090; fd00:10:244:1::2, fd00:10:244:2::2 |
//! | ns1/np:p80 TCP | 10.96.0.11, NodePort 30080, externalIP 203.0.113.5, eTP Local; 10.244.2.3 | fd00:10:96::11, externalIP fd00:203::5, eTP Local; fd00:10:244:2::3 |
//! | ns1/lb:p80 TCP | 10.96.0.12, LB 203.0.113.9 from 198.51.100.0/24, NodePort 30081, eTP Local, health check 32001, affinity 300 s; 10.244.1.4 | fd00:10:96::12, LB fd00:203::9 from fd00:198::/64, fd00:199::/64, affinity 60 s; fd00:10:244:1::4 |
//! | ns1/lb2:p443 TCP | 10.96.0.13, LB 203.0.113.10 from 198.51.100.0/25, 198.51.100.128/25, 192.0.2.7/32; 10.244.1.5, 10.244.1.8, 10.244.2.8 | – |
//! | ns1/empty:p80 TCP | 10.96.0.14, externalIP 203.0.113.6; none | fd00:10:96::14; none |
//! | ns1/itp:p80 TCP | 10.96.0.15, iTP Local; 10.244.2.5 (node-2: not in the table) | fd00:10:96::15, iTP Local; fd00:10:244:2::5 (likewise) |
//! | ns1/dns:p53 UDP | 10.96.0.16, affinity 10800 s; 10.244.1.6, 10.244.2.6 | fd00:10:96::16, affinity 10800 s; fd00:10:244:1::6 |
//! | ns1/stream:p9000 SCTP | 10.96.0.17, NodePort 30082; 10.244.1.9, 10.244.2.9–.12 | fd00:10:96::17, NodePort 30091; fd00:10:244:1::9, fd00:10:244:2::9–c |
//! | ns1/going:p80 TCP | 10.96.0.18; 10.244.1.10 terminating | fd00:10:96::18; fd00:10:244:1::a terminating |
//!
//! A second, partial sync adds 10.244.2.13 (fd00:10:244:2::d) to ns1/web,
//! takes 10.244.2.9 (fd00:10:244:2::9) from ns1/stream and removes
//! ns1/going. The affinity test runs the proxy in the harness's node
//! (192.168.99.2) with ns1/sticky (ClusterIP 10.96.0.13 and
//! fd00:10:96::13, port 80, ClientIP affinity 300 s, endpoints ep1 and
//! ep3) and connects from pod ep2 (10.244.1.3, fd00:10:244:1::3).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod kernel;

in_both_layouts!(
    the_ipv4_world_lists_alike_with_both_releases_and_reloads,
    the_ipv6_world_lists_alike_with_both_releases_and_reloads,
    affinity_entries_recorded_by_connections_list_alike_and_reload,
);

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::process::{Command, Stdio};

use kernel::{at, build, pod_ip, pod_ip_v6, require, slice, three_pods, Proxy};
use kp_model::{IpFamily, NamespacedName, Protocol, ServicePortName};
use kp_nftables::{Layout, NftablesBackend, NftablesOptions};
use kp_node::{LocalDetector, NodePortAddresses};
use kp_sync::testing::{builder_node, service, ServiceBuilder};
use kp_sync::{Backend, ServicePortState, StaleConntrack, SyncRequest};
use kp_testkit::builders::service as k8s_service;
use kp_testkit::netns::{connect, Netns};

/// One family's world: what the first (full) sync programs, what the
/// second (partial) one changes, and the addresses a listing must hold.
struct Plan {
    family: IpFamily,
    world: fn(bool) -> Vec<ServiceBuilder>,
    changed: &'static [&'static str],
    /// The Service and endpoint addresses of both syncs' worlds.
    kept: &'static [&'static str],
    /// Those of the first world only, and of the second only.
    first_only: &'static [&'static str],
    second_only: &'static [&'static str],
}

const V4: Plan = Plan {
    family: IpFamily::V4,
    world: v4_world,
    changed: &["web", "stream", "going"],
    kept: &[
        "10.96.0.10",
        "10.96.0.11",
        "10.96.0.12",
        "10.96.0.13",
        "10.96.0.14",
        "10.96.0.15",
        "10.96.0.16",
        "10.96.0.17",
        "203.0.113.5",
        "203.0.113.6",
        "203.0.113.9",
        "203.0.113.10",
        "10.244.1.2",
        "10.244.2.2",
        "10.244.2.3",
        "10.244.1.4",
        "10.244.1.5",
        "10.244.1.8",
        "10.244.2.8",
        "10.244.1.6",
        "10.244.2.6",
        "10.244.1.9",
        "10.244.2.10",
        "10.244.2.11",
        "10.244.2.12",
    ],
    first_only: &["10.96.0.18", "10.244.1.10", "10.244.2.9"],
    second_only: &["10.244.2.13"],
};

const V6: Plan = Plan {
    family: IpFamily::V6,
    world: v6_world,
    changed: &["web", "stream", "going"],
    kept: &[
        "fd00:10:96::10",
        "fd00:10:96::11",
        "fd00:10:96::12",
        "fd00:10:96::14",
        "fd00:10:96::15",
        "fd00:10:96::16",
        "fd00:10:96::17",
        "fd00:203::5",
        "fd00:203::9",
        "fd00:10:244:1::2",
        "fd00:10:244:2::2",
        "fd00:10:244:2::3",
        "fd00:10:244:1::4",
        "fd00:10:244:1::6",
        "fd00:10:244:1::9",
        "fd00:10:244:2::a",
        "fd00:10:244:2::b",
        "fd00:10:244:2::c",
    ],
    first_only: &["fd00:10:96::18", "fd00:10:244:1::a", "fd00:10:244:2::9"],
    second_only: &["fd00:10:244:2::d"],
};

/// The IPv4 world of the table above; `second`: after the second sync.
fn v4_world(second: bool) -> Vec<ServiceBuilder> {
    let mut web = service("ns1", "web", "10.96.0.10", 80)
        .local_endpoint("10.244.1.2", 8080)
        .remote_endpoint("10.244.2.2", 8080);
    let mut stream = service("ns1", "stream", "10.96.0.17", 9000)
        .protocol(Protocol::Sctp)
        .node_port(30082)
        .local_endpoint("10.244.1.9", 9000);
    let remote_streams: &[&str] = if second {
        web = web.remote_endpoint("10.244.2.13", 8080);
        &["10.244.2.10", "10.244.2.11", "10.244.2.12"]
    } else {
        &["10.244.2.9", "10.244.2.10", "10.244.2.11", "10.244.2.12"]
    };
    for ip in remote_streams {
        stream = stream.remote_endpoint(ip, 9000);
    }
    let mut world = vec![
        web,
        stream,
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
            .health_check_node_port(32001)
            .affinity_secs(300)
            .local_endpoint("10.244.1.4", 8080),
        service("ns1", "lb2", "10.96.0.13", 443)
            .lb_ip("203.0.113.10")
            .source_range("198.51.100.0/25")
            .source_range("198.51.100.128/25")
            .source_range("192.0.2.7/32")
            .local_endpoint("10.244.1.5", 8443)
            .local_endpoint("10.244.1.8", 8443)
            .remote_endpoint("10.244.2.8", 8443),
        service("ns1", "empty", "10.96.0.14", 80).external_ip("203.0.113.6"),
        service("ns1", "itp", "10.96.0.15", 80)
            .itp_local()
            .remote_endpoint("10.244.2.5", 8080),
        service("ns1", "dns", "10.96.0.16", 53)
            .udp()
            .affinity_secs(10800)
            .local_endpoint("10.244.1.6", 53)
            .remote_endpoint("10.244.2.6", 53),
    ];
    if !second {
        world.push(
            service("ns1", "going", "10.96.0.18", 80).terminating_endpoint(
                "10.244.1.10",
                8080,
                true,
            ),
        );
    }
    world
}

/// The IPv6 world of the table above; `second`: after the second sync.
fn v6_world(second: bool) -> Vec<ServiceBuilder> {
    let mut web = service("ns1", "web", "fd00:10:96::10", 80)
        .node_port(30090)
        .local_endpoint("fd00:10:244:1::2", 8080)
        .remote_endpoint("fd00:10:244:2::2", 8080);
    let mut stream = service("ns1", "stream", "fd00:10:96::17", 9000)
        .protocol(Protocol::Sctp)
        .node_port(30091)
        .local_endpoint("fd00:10:244:1::9", 9000);
    let remote_streams: &[&str] = if second {
        web = web.remote_endpoint("fd00:10:244:2::d", 8080);
        &["fd00:10:244:2::a", "fd00:10:244:2::b", "fd00:10:244:2::c"]
    } else {
        &[
            "fd00:10:244:2::9",
            "fd00:10:244:2::a",
            "fd00:10:244:2::b",
            "fd00:10:244:2::c",
        ]
    };
    for ip in remote_streams {
        stream = stream.remote_endpoint(ip, 9000);
    }
    let mut world = vec![
        web,
        stream,
        service("ns1", "np", "fd00:10:96::11", 80)
            .external_ip("fd00:203::5")
            .etp_local()
            .remote_endpoint("fd00:10:244:2::3", 8080),
        service("ns1", "lb", "fd00:10:96::12", 80)
            .lb_ip("fd00:203::9")
            .source_range("fd00:198::/64")
            .source_range("fd00:199::/64")
            .affinity_secs(60)
            .local_endpoint("fd00:10:244:1::4", 8080),
        service("ns1", "empty", "fd00:10:96::14", 80),
        service("ns1", "itp", "fd00:10:96::15", 80)
            .itp_local()
            .remote_endpoint("fd00:10:244:2::5", 8080),
        service("ns1", "dns", "fd00:10:96::16", 53)
            .udp()
            .affinity_secs(10800)
            .local_endpoint("fd00:10:244:1::6", 53),
    ];
    if !second {
        world.push(
            service("ns1", "going", "fd00:10:96::18", 80).terminating_endpoint(
                "fd00:10:244:1::a",
                8080,
                true,
            ),
        );
    }
    world
}

fn the_ipv4_world_lists_alike_with_both_releases_and_reloads(layout: Layout) {
    story(&V4, layout);
}

fn the_ipv6_world_lists_alike_with_both_releases_and_reloads(layout: Layout) {
    story(&V6, layout);
}

/// The world's first (full) and second (partial) syncs, committed over
/// netlink by the backend in a namespace of its own; after each, both
/// releases list the table alike and the current one reloads its listing.
fn story(plan: &Plan, layout: Layout) {
    require();
    let current = current_nft();
    let netns = Netns::create("nftcur").unwrap();
    let options = NftablesOptions {
        local_detector: LocalDetector::ClusterCidr(vec![
            "10.244.0.0/16".parse().unwrap(),
            "fd00:10:244::/48".parse().unwrap(),
        ]),
        ..NftablesOptions::default()
    };
    let mut backend = NftablesBackend::system(plan.family, options, NodePortAddresses::All)
        .unwrap()
        .with_layout(layout)
        .with_local_addresses(|_| Ok(Vec::new()));

    sync(
        &netns,
        &mut backend,
        plan.family,
        (plan.world)(false),
        true,
        &[],
    );
    let when = "after the full sync";
    let listing = lists_alike(&netns, &current, plan.family, when);
    assert_holds(&listing, &[plan.kept, plan.first_only].concat(), when);
    reloads(&current, &listing, plan.family, when);

    let changed = plan.changed;
    sync(
        &netns,
        &mut backend,
        plan.family,
        (plan.world)(true),
        false,
        changed,
    );
    let when = "after the partial sync";
    let listing = lists_alike(&netns, &current, plan.family, when);
    assert_holds(&listing, &[plan.kept, plan.second_only].concat(), when);
    reloads(&current, &listing, plan.family, when);
}

/// One sync of `world` by `backend` in `netns`.
fn sync(
    netns: &Netns,
    backend: &mut NftablesBackend,
    family: IpFamily,
    world: Vec<ServiceBuilder>,
    full: bool,
    changed: &[&str],
) {
    let service_ports: BTreeMap<ServicePortName, ServicePortState> =
        world.into_iter().map(ServiceBuilder::build).collect();
    let changed_services: BTreeSet<NamespacedName> = changed
        .iter()
        .map(|name| NamespacedName::new("ns1", name))
        .collect();
    let node = builder_node();
    let stale = StaleConntrack::default();
    let request = SyncRequest {
        family,
        full,
        service_ports: &service_ports,
        changed_services: &changed_services,
        node: &node,
        stale_conntrack: &stale,
    };
    netns
        .run(|| backend.sync(&request))
        .unwrap_or_else(|e| panic!("sync (full: {full}): {}", kp_sync::error_chain(&e)));
}

/// The proxy itself in the harness's node, both families: a connection from
/// pod ep2 to ns1/sticky records its affinity entry (the pod's address,
/// found nowhere in the table before), and the table with that entry lists
/// alike with both releases and reloads.
fn affinity_entries_recorded_by_connections_list_alike_and_reload(layout: Layout) {
    require();
    let current = current_nft();
    let topology = build(three_pods());
    for family in [IpFamily::V4, IpFamily::V6] {
        let (cluster_ip, endpoints, client): (&str, _, _) = match family {
            IpFamily::V4 => (
                "10.96.0.13",
                [pod_ip(&topology, "ep1"), pod_ip(&topology, "ep3")],
                pod_ip(&topology, "ep2"),
            ),
            IpFamily::V6 => (
                "fd00:10:96::13",
                [pod_ip_v6(&topology, "ep1"), pod_ip_v6(&topology, "ep3")],
                pod_ip_v6(&topology, "ep2"),
            ),
        };
        let families: &[&str] = match family {
            IpFamily::V4 => &["IPv4"],
            IpFamily::V6 => &["IPv6"],
        };
        let proxy = Proxy::start_in(&topology, family, layout);
        proxy.apply(
            &[k8s_service("ns1", "sticky", |s| {
                s.ip_families(families)
                    .cluster_ip(cluster_ip)
                    .port("http", 80, "TCP")
                    .session_affinity_client_ip(300)
            })],
            &[slice("sticky", &endpoints[..1], &endpoints[1..])],
        );
        proxy.sync();
        let client = client.to_string();
        let before = lists_alike(topology.node(), &current, family, "before the connection");
        assert!(
            !holds_address(&before, &client),
            "{family:?}: {client} is in the table before it connects:\n{before}"
        );

        let reply = connect(topology.pod("ep2"), at(cluster_ip, 80))
            .unwrap_or_else(|e| panic!("{family:?}: ep2 to {cluster_ip}:80: {e:?}"));
        assert!(
            ["ep1", "ep3"].contains(&reply.backend.as_str()),
            "{reply:?}"
        );
        let after = lists_alike(topology.node(), &current, family, "after the connection");
        assert!(
            holds_address(&after, &client),
            "{family:?}: no affinity entry of {client} after its connection:\n{after}"
        );
        reloads(&current, &after, family, "with an affinity entry");
    }
}

/// A rule that bookworm's nft and nft 1.1.3 print differently (`tcp flags
/// syn / syn,ack`, which 1.1.3 prints as a mask and a comparison), written
/// by bookworm's nft: the comparison of the two listings names it, so the
/// tests above would fail on any rule of the proxy's that lists
/// differently.
#[test]
fn a_rule_the_releases_print_differently_fails_the_comparison() {
    require();
    let current = current_nft();
    let netns = Netns::create("nftcur-diff").unwrap();
    load(
        &netns,
        "nft",
        "table ip kube-proxy {\n\tchain c {\n\t\ttcp flags syn / syn,ack counter\n\t}\n}\n",
    )
    .unwrap();
    let bookworm = list(&netns, "nft", IpFamily::V4);
    let listed = list(&netns, &current, IpFamily::V4);
    let differences = listing_differences(&bookworm, &listed);
    assert_eq!(differences.len(), 2, "{differences:#?}");
    assert!(
        differences[0].starts_with("only bookworm's nft prints: tcp flags")
            && differences[1].starts_with("only the current nft prints: tcp flags"),
        "{differences:#?}"
    );
}

/// The comparison itself: a line printed by one release only, a line
/// printed twice by one and once by the other, and the same lines in
/// another order are differences; the time left to a dynamic element
/// (`expires …`, which moves between any two listings) and an `output`
/// hook's priority as a number or by name are not, but another hook's or
/// another number is.
#[test]
fn the_comparison_names_each_line_only_one_release_prints() {
    let bookworm = "table ip t {\n\tchain c {\n\t\tip daddr 10.0.0.1 drop\n\t}\n}\n";
    let other = "table ip t {\n\tchain c {\n\t\tip daddr 10.0.0.2 drop\n\t}\n}\n";
    assert_eq!(
        listing_differences(bookworm, other),
        [
            "only bookworm's nft prints: ip daddr 10.0.0.1 drop",
            "only the current nft prints: ip daddr 10.0.0.2 drop",
        ]
    );
    let doubled = "table ip t {\n\tchain c {\n\t\tip daddr 10.0.0.1 drop\n\t\tip daddr 10.0.0.1 drop\n\t}\n}\n";
    assert_eq!(
        listing_differences(bookworm, doubled),
        ["only the current nft prints: ip daddr 10.0.0.1 drop"]
    );
    let two = "table ip t {\n\tchain c {\n\t\tip daddr 10.0.0.1 drop\n\t\tip daddr 10.0.0.2 drop\n\t}\n}\n";
    let swapped = "table ip t {\n\tchain c {\n\t\tip daddr 10.0.0.2 drop\n\t\tip daddr 10.0.0.1 drop\n\t}\n}\n";
    assert_eq!(
        listing_differences(two, swapped),
        ["the same lines in another order"]
    );
    let early = "\t\telements = { 10.244.1.3 timeout 5m expires 4m59s990ms }\n";
    let late = "\t\telements = { 10.244.1.3 timeout 5m expires 4m58s120ms }\n";
    assert_eq!(listing_differences(early, late), Vec::<String>::new());
    let numbered = "\t\ttype filter hook output priority -110; policy accept;\n";
    let named = "\t\ttype filter hook output priority dstnat - 10; policy accept;\n";
    assert_eq!(listing_differences(numbered, named), Vec::<String>::new());
    let other_hook = "\t\ttype filter hook input priority dstnat - 10; policy accept;\n";
    let other_number = "\t\ttype filter hook output priority -109; policy accept;\n";
    for other in [other_hook, other_number] {
        assert_eq!(listing_differences(numbered, other).len(), 2, "{other}");
    }
    assert_eq!(listing_differences(two, two), Vec::<String>::new());
}

/// The current release's `nft`: `$KP_NFT_CURRENT`, checked to run and to be
/// another release than the system's.
#[track_caller]
fn current_nft() -> String {
    let Ok(path) = std::env::var("KP_NFT_CURRENT") else {
        panic!(
            "KP_NFT_CURRENT is unset: these tests need a current release's nft beside the \
             system's; scripts/lib/nft-current.sh fetches Debian trixie's and prints its path \
             (scripts/test exports it): \
             KP_NFT_CURRENT=$(scripts/lib/nft-current.sh) cargo test -p kp-nftables --test kernel_nft_current"
        )
    };
    let current = version(&path);
    let system = version("nft");
    assert_ne!(
        current, system,
        "KP_NFT_CURRENT ({path}) is the system's own release: nothing to compare"
    );
    path
}

/// `PROGRAM --version`, or a failure that names the program and why.
#[track_caller]
fn version(program: &str) -> String {
    let output = Command::new(program)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("`{program} --version` cannot run: {e} (KP_NFT_CURRENT: the path scripts/lib/nft-current.sh prints)"));
    assert!(
        output.status.success(),
        "`{program} --version` failed with {}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

fn table_family(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

/// `NFT list table FAMILY kube-proxy` in `netns`.
#[track_caller]
fn list(netns: &Netns, nft: &str, family: IpFamily) -> String {
    netns.exec_ok(nft, &["list", "table", table_family(family), "kube-proxy"])
}

/// `NFT -f -` with `text` on stdin in `netns`; its stderr on failure.
fn load(netns: &Netns, nft: &str, text: &str) -> Result<(), String> {
    let mut child = netns
        .command(nft)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {nft} -f - in {}: {e}", netns.name()));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// Lists `family`'s table in `netns` with bookworm's nft and with `current`,
/// requires the two listings to be alike ([`listing_differences`]) and
/// returns the current release's.
#[track_caller]
fn lists_alike(netns: &Netns, current: &str, family: IpFamily, when: &str) -> String {
    let bookworm = list(netns, "nft", family);
    let listed = list(netns, current, family);
    let differences = listing_differences(&bookworm, &listed);
    assert!(
        differences.is_empty(),
        "{family:?} {when}: the two releases list the table differently:\n{}\n\
         bookworm's listing:\n{bookworm}\ncurrent listing:\n{listed}",
        differences.join("\n")
    );
    listed
}

/// Loads `listing` with the current release's `nft -f` in a fresh
/// namespace and requires it to list what it loaded.
///
/// Only the current release lists the reloaded table: bookworm's nft 1.0.6
/// crashes (SIGSEGV) listing any set declared with `type` that nft 1.1.3
/// created, whatever its flags (a `typeof` set lists); the proxy commits
/// its sets itself, over netlink, and those both releases list (the
/// comparisons above).
#[track_caller]
fn reloads(current: &str, listing: &str, family: IpFamily, when: &str) {
    let fresh = Netns::create("nftcur-reload").unwrap();
    if let Err(error) = load(&fresh, current, listing) {
        panic!("{family:?} {when}: the current nft cannot load its own listing: {error}\nthe listing:\n{listing}");
    }
    let reloaded = list(&fresh, current, family);
    let differences = listing_differences(listing, &reloaded);
    assert!(
        differences.is_empty(),
        "{family:?} {when}: the reloaded table lists otherwise (\"bookworm\" below: \
         the listing loaded; \"current\": its listing after the load):\n{}",
        differences.join("\n")
    );
}

/// Requires every address of `addresses` in `listing`: the listings
/// compared hold the whole world.
#[track_caller]
fn assert_holds(listing: &str, addresses: &[&str], when: &str) {
    let missing: Vec<&&str> = addresses
        .iter()
        .filter(|address| !holds_address(listing, address))
        .collect();
    assert!(
        missing.is_empty(),
        "{when}: the listing lacks {missing:?}:\n{listing}"
    );
}

/// Whether `address` is in `text` as a whole address (10.96.0.1 is not in
/// 10.96.0.10).
fn holds_address(text: &str, address: &str) -> bool {
    let part_of_address = |c: char| c.is_ascii_alphanumeric() || c == '.' || c == ':';
    text.match_indices(address).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + address.len()..].chars().next();
        // An IPv4 address may be followed by `:port`.
        let after_ends =
            after.is_none_or(|c| !part_of_address(c) || (c == ':' && !address.contains(':')));
        before.is_none_or(|c| !part_of_address(c)) && after_ends
    })
}

/// What differs between bookworm's listing of a table and the current
/// release's: each line (after [`normalised`]) that one prints more often
/// than the other, or, when they print the same lines, a different order.
/// Empty when the two are alike.
fn listing_differences(bookworm: &str, current: &str) -> Vec<String> {
    let old = normalised(bookworm);
    let new = normalised(current);
    let mut counts: BTreeMap<&str, i64> = BTreeMap::new();
    for line in &old {
        *counts.entry(line.as_str()).or_default() += 1;
    }
    for line in &new {
        *counts.entry(line.as_str()).or_default() -= 1;
    }
    let mut differences: Vec<String> = counts
        .iter()
        .filter(|(_, count)| **count > 0)
        .map(|(line, _)| format!("only bookworm's nft prints: {line}"))
        .collect();
    differences.extend(
        counts
            .iter()
            .filter(|(_, count)| **count < 0)
            .map(|(line, _)| format!("only the current nft prints: {line}")),
    );
    if differences.is_empty() && old != new {
        differences.push("the same lines in another order".to_owned());
    }
    differences
}

/// The lines of `listing`, trimmed, with two things taken out:
/// - the time left to a dynamic element (`expires 4m59s990ms`), which
///   moves on between any two listings of one table;
/// - the one difference between the releases' printing of what the proxy
///   commits: bookworm's nft 1.0.6 prints the priority of a base chain on
///   the `output` hook as a number (`priority -100`, `-110`, `-99`), where
///   1.1.3 names it (`priority dstnat`, `dstnat - 10`, `dstnat + 1`; 1.0.6
///   refuses those names on that hook when it reads text, netfilter
///   bugzilla 1694): both become the number.
fn normalised(listing: &str) -> Vec<String> {
    listing
        .lines()
        .map(|line| without_expiry(&output_priority_as_number(line.trim())))
        .collect()
}

/// `line` with the value after each `expires ` replaced by `…`.
fn without_expiry(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find("expires ") {
        let (before, after) = rest.split_at(at + "expires ".len());
        out.push_str(before);
        out.push('…');
        let end = after.find([' ', ',', '}']).unwrap_or(after.len());
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// A base chain's `type … hook output priority P;` line with `P` as a
/// number (`dstnat - 10` → `-110`); any other line as it is.
fn output_priority_as_number(line: &str) -> String {
    const KEY: &str = " hook output priority ";
    let (Some(at), true) = (line.find(KEY), line.starts_with("type ")) else {
        return line.to_owned();
    };
    let start = at + KEY.len();
    let end = line[start..]
        .find(';')
        .map_or(line.len(), |end| start + end);
    let words: Vec<&str> = line[start..end].split_whitespace().collect();
    // The standard priorities of the ip and ip6 families (nft(8), "CHAINS").
    let named = |word: &str| match word {
        "raw" => Some(-300),
        "mangle" => Some(-150),
        "dstnat" => Some(-100),
        "filter" => Some(0),
        "security" => Some(50),
        "srcnat" => Some(100),
        number => number.parse::<i64>().ok(),
    };
    let value = match words.as_slice() {
        [base] => named(base),
        [base, "+", offset] => named(base)
            .zip(offset.parse::<i64>().ok())
            .map(|(b, o)| b + o),
        [base, "-", offset] => named(base)
            .zip(offset.parse::<i64>().ok())
            .map(|(b, o)| b - o),
        _ => None,
    };
    match value {
        Some(value) => format!("{}{value}{}", &line[..start], &line[end..]),
        None => line.to_owned(),
    }
}
