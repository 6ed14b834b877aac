//! A full render hands its element commands on in pieces of a few
//! thousand elements, after everything else of its transaction, so that
//! an applier that encodes pieces as they come (the netlink applier) never
//! holds every element's command at once; together the pieces add each
//! element once.
//!
//! Address plan: Services `ns1/sN` at ClusterIP 10.96.(N / 250).(N % 250),
//! endpoints 10.244.(N / 250).(N % 250) and 10.245.(N / 250).(N % 250) on
//! node-2.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use kp_model::{IpFamily, NodeInfo};
use kp_nftables::{Command, Layout, NftablesOptions, Piece, Programmed, RenderInput, Renderer};

/// The elements `command` adds, as text (set or map, then the element).
fn added(command: &Command) -> Vec<String> {
    match command {
        Command::AddElements { set, elements } => elements
            .iter()
            .map(|element| format!("{set:?} {:?}", element.key))
            .collect(),
        Command::AddMapElements { map, elements } => elements
            .iter()
            .map(|element| format!("{map:?} {:?}", element.key))
            .collect(),
        _ => Vec::new(),
    }
}

#[test]
fn a_full_render_hands_its_elements_on_in_pieces() {
    let mut service_ports = BTreeMap::new();
    for n in 0..3_000u32 {
        let (high, low) = (n / 250, n % 250);
        let (name, state) =
            kp_sync::testing::service("ns1", &format!("s{n}"), &format!("10.96.{high}.{low}"), 80)
                .remote_endpoint(&format!("10.244.{high}.{low}"), 8080)
                .remote_endpoint(&format!("10.245.{high}.{low}"), 8080)
                .build();
        service_ports.insert(name, state);
    }
    let none = BTreeSet::new();
    let node = NodeInfo::default();
    let input = RenderInput {
        family: IpFamily::V4,
        full: true,
        reset: true,
        split: false,
        service_ports: &service_ports,
        changed_services: &none,
        prune: false,
        node: &node,
        node_port_addresses: None,
        now: Instant::now(),
    };
    let mut renderer = Renderer::new(NftablesOptions::default())
        .unwrap()
        .with_layout(Layout::Data);
    let mut pieces: Vec<Vec<Command>> = Vec::new();
    let mut commits = 0;
    let rendered = renderer
        .render_streamed(&input, &Programmed::default(), |piece| {
            match piece {
                Piece::Commands(commands) => pieces.push(commands),
                Piece::Commit => commits += 1,
            }
            Ok::<(), std::convert::Infallible>(())
        })
        .unwrap();
    assert_eq!(commits, 1);

    // Per Service: its service-ips and cluster-ips elements, its
    // count-set and group-set elements, two slots and two hairpin pairs.
    let per_piece: Vec<Vec<String>> = pieces
        .iter()
        .map(|piece| piece.iter().flat_map(added).collect())
        .collect();
    let total: usize = per_piece.iter().map(Vec::len).sum();
    assert_eq!(total, 3_000 * 8);
    assert_eq!(total, rendered.stats.elements_added);
    let distinct: BTreeSet<&String> = per_piece.iter().flatten().collect();
    assert_eq!(distinct.len(), total, "each element once");

    // The elements come last, in pieces of about 4,096 (a piece ends at a
    // Service boundary).
    let with_elements: Vec<usize> = per_piece
        .iter()
        .map(Vec::len)
        .filter(|count| *count > 0)
        .collect();
    assert!(with_elements.len() >= 5, "{with_elements:?}");
    assert!(
        with_elements.iter().all(|count| *count < 4_096 + 8),
        "{with_elements:?}"
    );
    let first_with_elements = per_piece
        .iter()
        .position(|piece| !piece.is_empty())
        .unwrap();
    assert!(
        pieces[first_with_elements..]
            .iter()
            .flatten()
            .all(|command| matches!(
                command,
                Command::AddElements { .. } | Command::AddMapElements { .. }
            )),
        "after the first element, only elements"
    );
}
