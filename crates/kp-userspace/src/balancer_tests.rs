//! Address plan: endpoints 10.244.1.2:8080, 10.244.1.3:8080,
//! 10.244.2.2:8080; clients 10.244.1.9 and 192.168.99.10.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;

const EP1: &str = "10.244.1.2:8080";
const EP2: &str = "10.244.1.3:8080";
const EP3: &str = "10.244.2.2:8080";

fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn route(endpoints: &[&str], affinity: Option<Duration>) -> Route {
    let list: Vec<SocketAddr> = endpoints.iter().map(|e| addr(e)).collect();
    Route {
        affinity_timeout: affinity,
        ..Route::to_endpoints(&list)
    }
}

fn counts(balancer: &Balancer, client: &str, n: usize, now: Instant) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for _ in 0..n {
        let picked = balancer
            .pick(ip(client), TrafficKind::Internal, now, &[])
            .unwrap();
        *counts.entry(picked.to_string()).or_default() += 1;
    }
    counts
}

#[test]
fn round_robin_spreads_connections_evenly_over_every_endpoint() {
    let balancer = Balancer::new(route(&[EP1, EP2, EP3], None));
    let counts = counts(&balancer, "10.244.1.9", 30, Instant::now());
    assert_eq!(
        counts,
        BTreeMap::from([(EP1.into(), 10), (EP2.into(), 10), (EP3.into(), 10)])
    );
}

#[test]
fn without_endpoints_nothing_is_picked() {
    let balancer = Balancer::new(route(&[], None));
    let picked = balancer.pick(ip("10.244.1.9"), TrafficKind::Internal, Instant::now(), &[]);
    assert_eq!(picked, None);
}

#[test]
fn a_failed_endpoint_is_skipped_and_the_next_one_tried() {
    let balancer = Balancer::new(route(&[EP1, EP2], None));
    let now = Instant::now();
    let client = ip("10.244.1.9");
    for _ in 0..4 {
        let first = balancer
            .pick(client, TrafficKind::Internal, now, &[])
            .unwrap();
        let second = balancer
            .pick(client, TrafficKind::Internal, now, &[first])
            .unwrap();
        assert_ne!(first, second, "the failed endpoint is not picked again");
        let none = balancer.pick(client, TrafficKind::Internal, now, &[first, second]);
        assert_eq!(none, None, "every endpoint failed");
    }
}

#[test]
fn client_ip_affinity_keeps_a_client_on_one_endpoint_until_it_idles_out() {
    let timeout = Duration::from_secs(10);
    let balancer = Balancer::new(route(&[EP1, EP2, EP3], Some(timeout)));
    let start = Instant::now();
    let first = counts(&balancer, "10.244.1.9", 20, start);
    assert_eq!(first.len(), 1, "one endpoint for the client: {first:?}");
    let other = counts(&balancer, "192.168.99.10", 1, start);
    assert_ne!(
        first.keys().next(),
        other.keys().next(),
        "the next client gets the next endpoint"
    );

    // Used 9 s later: still sticky, and the timer restarts.
    let later = start + Duration::from_secs(9);
    assert_eq!(
        counts(&balancer, "10.244.1.9", 1, later),
        BTreeMap::from([(first.keys().next().unwrap().clone(), 1)])
    );
    let still = later + Duration::from_secs(9);
    assert_eq!(
        counts(&balancer, "10.244.1.9", 1, still)
            .keys()
            .collect::<Vec<_>>(),
        first.keys().collect::<Vec<_>>()
    );

    // Idle for the whole timeout: the client is balanced afresh.
    let expired = still + timeout;
    let mut seen = BTreeMap::new();
    for step in 0..3 {
        let at = expired + timeout * (step * 2);
        seen.extend(counts(&balancer, "10.244.1.9", 1, at));
    }
    assert!(seen.len() > 1, "after expiry the client moves on: {seen:?}");
}

#[test]
fn affinity_moves_a_client_whose_endpoint_was_removed() {
    let balancer = Balancer::new(route(&[EP1, EP2], Some(Duration::from_secs(60))));
    let now = Instant::now();
    let client = ip("10.244.1.9");
    let first = balancer
        .pick(client, TrafficKind::Internal, now, &[])
        .unwrap();
    let remaining = if first == addr(EP1) { EP2 } else { EP1 };
    balancer.update(route(&[remaining], Some(Duration::from_secs(60))));
    assert_eq!(
        balancer.remembered_clients(),
        0,
        "the stale entry is dropped"
    );
    let picked = balancer
        .pick(client, TrafficKind::Internal, now, &[])
        .unwrap();
    assert_eq!(picked, addr(remaining));
}

#[test]
fn affinity_to_a_failing_endpoint_is_forgotten() {
    let balancer = Balancer::new(route(&[EP1, EP2], Some(Duration::from_secs(60))));
    let now = Instant::now();
    let client = ip("10.244.1.9");
    let first = balancer
        .pick(client, TrafficKind::Internal, now, &[])
        .unwrap();
    let retry = balancer
        .pick(client, TrafficKind::Internal, now, &[first])
        .unwrap();
    assert_ne!(retry, first);
    assert_eq!(
        balancer.pick(client, TrafficKind::Internal, now, &[]),
        Some(retry),
        "the endpoint that answered is remembered"
    );
}

#[test]
fn sweep_drops_idle_clients() {
    let timeout = Duration::from_secs(5);
    let balancer = Balancer::new(route(&[EP1], Some(timeout)));
    let now = Instant::now();
    balancer.pick(ip("10.244.1.9"), TrafficKind::Internal, now, &[]);
    balancer.sweep(now + Duration::from_secs(1));
    assert_eq!(balancer.remembered_clients(), 1);
    balancer.sweep(now + timeout);
    assert_eq!(balancer.remembered_clients(), 0);
}

#[test]
fn internal_and_external_traffic_use_their_own_endpoints() {
    let balancer = Balancer::new(Route {
        internal: Arc::from([addr(EP1)]),
        external: Arc::from([addr(EP3)]),
        ..Route::to_endpoints(&[])
    });
    let now = Instant::now();
    let client = ip("192.168.99.10");
    assert_eq!(
        balancer.pick(client, TrafficKind::Internal, now, &[]),
        Some(addr(EP1))
    );
    assert_eq!(
        balancer.pick(client, TrafficKind::External, now, &[]),
        Some(addr(EP3))
    );
}

/// Client `index` of a flood, from 10.0.0.0/8 (not in the address plan's
/// ranges).
fn flood_client(index: usize) -> IpAddr {
    let index = u32::try_from(index).unwrap();
    IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 | index))
}

#[test]
fn a_flood_of_new_clients_keeps_the_table_at_its_bound_and_a_returning_client_keeps_its_endpoint() {
    let balancer = Balancer::new(route(&[EP1, EP2, EP3], Some(Duration::from_secs(10_800))));
    let start = Instant::now();
    let regular = ip("192.168.99.10");
    let kept = balancer
        .pick(regular, TrafficKind::Internal, start, &[])
        .unwrap();

    for index in 0..3 * MAX_AFFINITY_CLIENTS {
        let now = start + Duration::from_millis(u64::try_from(index).unwrap());
        balancer.pick(flood_client(index), TrafficKind::Internal, now, &[]);
        if index % 1000 == 0 {
            // The regular client comes back now and then.
            assert_eq!(
                balancer.pick(regular, TrafficKind::Internal, now, &[]),
                Some(kept),
                "after {index} new clients"
            );
        }
        assert!(balancer.remembered_clients() <= MAX_AFFINITY_CLIENTS);
    }
    assert_eq!(balancer.remembered_clients(), MAX_AFFINITY_CLIENTS);
}

#[test]
fn expired_clients_are_shed_as_new_ones_come_without_a_sweep() {
    let timeout = Duration::from_secs(10);
    let balancer = Balancer::new(route(&[EP1, EP2], Some(timeout)));
    let start = Instant::now();
    for index in 0..1000 {
        balancer.pick(flood_client(index), TrafficKind::Internal, start, &[]);
    }
    let later = start + timeout;
    for index in 1000..1500 {
        balancer.pick(flood_client(index), TrafficKind::Internal, later, &[]);
    }
    // Each of the 500 new clients shed two of the 1,000 expired ones.
    let shed = 2 * 500;
    assert_eq!(balancer.remembered_clients(), 1000 - shed + 500);
}
