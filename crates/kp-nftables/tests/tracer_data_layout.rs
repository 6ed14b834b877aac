//! The tracer over the data layout's statements (issue 26), on the
//! hand-built table of `tests/data_layout`: the draw forks one path per
//! slot, and the hairpin pair set marks an endpoint's connection to
//! itself.
//!
//! Address plan: `tests/data_layout/mod.rs` (ClusterIP 10.96.0.12;
//! endpoints ep1 10.244.1.2, ep2 .3, ep3 .4), and a pod 10.244.1.7 that is
//! no endpoint.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod data_layout;

use std::net::{IpAddr, SocketAddr};

use data_layout::{endpoints_map, layout};
use kp_model::{IpFamily, Protocol};
use kp_nftables::model::{Command, Key};
use kp_nftables::tracer::{PathOutcome, Table, Trace};
use kp_nftables::Transaction;

const POD: &str = "10.244.1.7";
const SERVICE: &str = "10.96.0.12";

fn table(extra: Vec<Command>) -> Table {
    let mut table = Table::new();
    table.apply(&layout(IpFamily::V4)).unwrap();
    table
        .apply(&Transaction {
            family: IpFamily::V4,
            commands: extra,
        })
        .unwrap();
    table
}

fn packet(src: &str, protocol: &'static str, dport: u16) -> kp_nftables::tracer::Packet {
    kp_nftables::tracer::Packet {
        src: src.parse().unwrap(),
        dst: SERVICE.parse().unwrap(),
        protocol,
        dport,
        src_local: false,
        dst_local: false,
    }
}

fn at(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

/// The paths' destinations and probabilities, in order.
fn spread(trace: &Trace) -> Vec<(SocketAddr, f64)> {
    trace
        .paths
        .iter()
        .map(|path| (path.destination.unwrap(), path.probability))
        .collect()
}

#[track_caller]
fn assert_spread(trace: &Trace, expected: &[(&str, f64)]) {
    let got = spread(trace);
    let want: Vec<(SocketAddr, f64)> = expected.iter().map(|(to, p)| (at(to), *p)).collect();
    assert_eq!(got.len(), want.len(), "{trace:#?}");
    for ((to, p), (want_to, want_p)) in got.iter().zip(&want) {
        assert_eq!(to, want_to, "{trace:#?}");
        assert!((p - want_p).abs() < 1e-9, "{to}: {p} against {want_p}");
    }
}

fn path_to<'a>(trace: &'a Trace, to: &str) -> &'a PathOutcome {
    trace
        .paths
        .iter()
        .find(|path| path.destination == Some(at(to)))
        .unwrap_or_else(|| panic!("no path to {to}: {trace:#?}"))
}

#[test]
fn a_new_tcp_connection_draws_one_of_three_slots_each_one_in_three() {
    let trace = table(vec![]).trace_paths(&packet(POD, "tcp", 80)).unwrap();
    let third = 1.0 / 3.0;
    assert_spread(
        &trace,
        &[
            ("10.244.1.2:8080", third),
            ("10.244.1.3:8080", third),
            ("10.244.1.4:8080", third),
        ],
    );
    let path = path_to(&trace, "10.244.1.3:8080");
    assert_eq!(
        path.elements,
        [
            "endpoint-count-3: 10.96.0.12 . tcp . 80",
            "service-endpoints-tcp: 10.96.0.12 . 80 . 1 : 10.244.1.3 . 8080",
        ]
    );
    assert!(path.matched.contains(
        &"service-web: ip daddr . meta l4proto . th dport @endpoint-count-3 dnat ip to ip daddr . tcp dport . numgen random mod 3 map @service-endpoints-tcp"
            .to_owned()
    ));
    assert!(
        !path.masqueraded,
        "a pod that is no endpoint is not masqueraded"
    );
}

#[test]
fn udp_and_sctp_draw_from_their_own_maps() {
    let table = table(vec![]);
    let udp = table.trace_paths(&packet(POD, "udp", 53)).unwrap();
    assert_spread(&udp, &[("10.244.1.2:5353", 0.5), ("10.244.1.3:5353", 0.5)]);
    let sctp = table.trace_paths(&packet(POD, "sctp", 9)).unwrap();
    assert_spread(&sctp, &[("10.244.1.2:9", 1.0)]);
    assert_eq!(
        sctp.paths[0].elements,
        [
            "endpoint-count-1: 10.96.0.12 . sctp . 9",
            "service-endpoints-sctp: 10.96.0.12 . 9 . 0 : 10.244.1.2 . 9",
        ]
    );
}

#[test]
fn an_endpoint_reaching_itself_through_the_service_is_masqueraded_only_on_that_path() {
    let ep2 = "10.244.1.3";
    let trace = table(vec![]).trace_paths(&packet(ep2, "tcp", 80)).unwrap();
    for path in &trace.paths {
        let to_itself = path.destination.unwrap().ip() == ep2.parse::<IpAddr>().unwrap();
        assert_eq!(path.masqueraded, to_itself, "{path:#?}");
    }
    let hairpin = path_to(&trace, "10.244.1.3:8080");
    assert!(hairpin
        .elements
        .contains(&"hairpin-endpoints: 10.244.1.3 . 10.244.1.3".to_owned()));
}

#[test]
fn a_slot_without_an_element_is_an_error_naming_the_map_and_the_key() {
    let hole = Command::DeleteElements {
        set: endpoints_map(Protocol::Tcp),
        keys: vec![Key::EntrySlot("10.96.0.12".parse().unwrap(), 80, 1)],
    };
    let error = table(vec![hole])
        .trace_paths(&packet(POD, "tcp", 80))
        .unwrap_err();
    assert!(
        error
            .0
            .contains("service-endpoints-tcp has no element 10.96.0.12 . 80 . 1"),
        "{error}"
    );
}

/// Traced as the kernel does (a table read back after damage), the same
/// hole is a path of its own: one in three connections goes on past the
/// draw rule un-DNATed, naming the element it missed; the other two slots
/// are DNATed as before.
#[test]
fn a_slot_without_an_element_traced_as_the_kernel_goes_on_without_dnat() {
    let hole = Command::DeleteElements {
        set: endpoints_map(Protocol::Tcp),
        keys: vec![Key::EntrySlot("10.96.0.12".parse().unwrap(), 80, 1)],
    };
    let trace = table(vec![hole])
        .trace_paths_as_the_kernel(&packet(POD, "tcp", 80))
        .unwrap();
    assert_eq!(trace.paths.len(), 3, "{trace:#?}");
    let missed: Vec<_> = trace
        .paths
        .iter()
        .filter(|path| path.destination.is_none())
        .collect();
    assert_eq!(missed.len(), 1, "{trace:#?}");
    assert!(
        (missed[0].probability - 1.0 / 3.0).abs() < 1e-9,
        "{trace:#?}"
    );
    assert!(
        missed[0].elements.contains(
            &"service-endpoints-tcp: 10.96.0.12 . 80 . 1 : no element (the lookup misses)"
                .to_owned()
        ),
        "{trace:#?}"
    );
    assert_eq!(
        trace
            .paths
            .iter()
            .filter(|path| path.destination.is_some())
            .count(),
        2,
        "{trace:#?}"
    );
}
