//! Golden transactions: the exact `nft -f` text of a full sync and of the
//! partial sync that follows one endpoint change. A difference fails and
//! leaves the new text for `scripts/update-golden` (see
//! `kp_testkit::golden`); review its diff.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web:p80 | ClusterIP 10.96.0.10, endpoints 10.244.1.2 (here), 10.244.2.2 |
//! | ns1/lb:p80 | LoadBalancer 203.0.113.9 from 198.51.100.0/24, NodePort 30081, eTP Local, ClientIP affinity 300 s, endpoint 10.244.1.4 (here) |
//! | ns1/empty:p80 | ClusterIP 10.96.0.14, externalIP 203.0.113.5, no endpoints |
//! | ns1/web6:p80 (IPv6) | ClusterIP fd00:10:96::10, endpoint [fd00:10:244:1::2]:8080 |
//!
//! The `data_` files are the same syncs in the data layout
//! ([`kp_nftables::Layout::Data`]).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;

use common::{service, World};
use kp_model::IpFamily;
use kp_node::NodePortAddresses;

fn world() -> World {
    world_in(World::v4())
}

fn world_in(mut world: World) -> World {
    world
        .put(
            service("ns1", "web", "10.96.0.10", 80)
                .local_endpoint("10.244.1.2", 8080)
                .remote_endpoint("10.244.2.2", 8080),
        )
        .put(
            service("ns1", "lb", "10.96.0.12", 80)
                .lb_ip("203.0.113.9")
                .source_range("198.51.100.0/24")
                .node_port(30081)
                .etp_local()
                .affinity_secs(300)
                .local_endpoint("10.244.1.4", 8080),
        )
        .put(service("ns1", "empty", "10.96.0.14", 80).external_ip("203.0.113.5"));
    world
}

#[track_caller]
fn assert_golden(name: &str, text: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    kp_testkit::golden::assert_golden(&path, text);
}

#[test]
fn full_sync_of_ipv4() {
    let mut world = world();
    let text = world.sync(true, &[]);
    assert_golden("full_v4.nft", &text);
}

#[test]
fn partial_sync_after_one_endpoint_change() {
    let mut world = world();
    world.sync(true, &[]);
    world.put(
        service("ns1", "web", "10.96.0.10", 80)
            .local_endpoint("10.244.1.2", 8080)
            .remote_endpoint("10.244.2.3", 8080),
    );
    let text = world.sync(false, &[("ns1", "web")]);
    assert_golden("partial_v4.nft", &text);
}

#[test]
fn full_sync_of_ipv6_with_node_port_addresses() {
    let text = full_sync_of_ipv6(World::with(
        IpFamily::V6,
        NodePortAddresses::Select {
            cidrs: Vec::new(),
            primary: true,
        },
    ));
    assert_golden("full_v6.nft", &text);
}

#[test]
fn full_sync_of_ipv4_in_the_data_layout() {
    let mut world = world_in(World::v4_data());
    let text = world.sync(true, &[]);
    assert_golden("data_full_v4.nft", &text);
}

/// The endpoint 10.244.2.2 is replaced: two elements of the Service's
/// endpoint map and the hairpin pairs change, and no chain is written.
#[test]
fn partial_sync_after_one_endpoint_change_in_the_data_layout() {
    let mut world = world_in(World::v4_data());
    world.sync(true, &[]);
    world.put(
        service("ns1", "web", "10.96.0.10", 80)
            .local_endpoint("10.244.1.2", 8080)
            .remote_endpoint("10.244.2.3", 8080),
    );
    let text = world.sync(false, &[("ns1", "web")]);
    assert_golden("data_partial_v4.nft", &text);
}

#[test]
fn full_sync_of_ipv6_in_the_data_layout() {
    let world = World::with(
        IpFamily::V6,
        NodePortAddresses::Select {
            cidrs: Vec::new(),
            primary: true,
        },
    )
    .with_layout(kp_nftables::Layout::Data);
    let text = full_sync_of_ipv6(world);
    assert_golden("data_full_v6.nft", &text);
}

fn full_sync_of_ipv6(mut world: World) -> String {
    world.put(
        service("ns1", "web6", "fd00:10:96::10", 80)
            .node_port(30080)
            .local_endpoint("fd00:10:244:1::2", 8080),
    );
    world.sync(true, &[])
}
