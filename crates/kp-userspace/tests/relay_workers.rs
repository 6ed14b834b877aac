//! The relay's worker threads on loopback: every TCP service port has one
//! listening socket per worker (`SO_REUSEPORT`), and the kernel spreads
//! connections over them. The service port still behaves as one: one
//! round robin, one affinity table, one set of counters, closed as a
//! whole.
//!
//! Address plan: everything on 127.0.0.1, ports chosen by the kernel (see
//! `common`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;

use common::{
    hits, port_name, quick_options, serve_tcp, tcp_endpoint, wait_for, wait_refused, Client,
    DEADLINE,
};
use kp_model::{IpFamily, Protocol};
use kp_userspace::{DesiredListener, OpenError, Relay, RelayOptions, Route};
use tokio::net::TcpStream;
use tokio::runtime::Handle;

/// Enough connections that all of them landing on one of two sockets
/// (by the kernel's hash of their addresses) is a 1 in 2^39 chance.
const SPREAD_CONNECTIONS: usize = 40;

fn relay_with_workers(workers: usize) -> Relay {
    let options = RelayOptions {
        workers,
        ..quick_options()
    };
    Relay::new(Handle::current(), IpFamily::V4, options)
}

#[track_caller]
fn assert_every_worker_accepted(relay: &Relay, service: &str, workers: usize, total: u64) {
    let per_worker = relay
        .accepted_per_worker(&port_name(service, Protocol::Tcp))
        .expect("the service port has a listener");
    assert_eq!(per_worker.len(), workers, "one socket per worker");
    assert!(
        per_worker.iter().all(|&accepted| accepted > 0),
        "every worker's socket accepted some: {per_worker:?}"
    );
    assert_eq!(per_worker.iter().sum::<u64>(), total, "{per_worker:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_spread_over_every_worker_and_round_robin_stays_one() {
    let endpoints = [tcp_endpoint("ep1").await, tcp_endpoint("ep2").await];
    let mut relay = relay_with_workers(2);
    let addr = serve_tcp(&mut relay, "web", Route::to_endpoints(&endpoints));

    let counts = hits(addr, SPREAD_CONNECTIONS).await;

    // One round robin over both workers: sequential connections alternate
    // whichever socket accepted them.
    assert_eq!(
        counts,
        BTreeMap::from([("ep1".into(), 20), ("ep2".into(), 20)])
    );
    assert_every_worker_accepted(&relay, "web", 2, 40);
    let stats = relay.stats()[&port_name("web", Protocol::Tcp)];
    assert_eq!(stats.accepted, 40, "counted per service across workers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ip_affinity_holds_across_workers() {
    let endpoints = [tcp_endpoint("ep1").await, tcp_endpoint("ep2").await];
    let mut relay = relay_with_workers(2);
    let route = Route {
        affinity_timeout: Some(Duration::from_secs(60)),
        ..Route::to_endpoints(&endpoints)
    };
    let addr = serve_tcp(&mut relay, "sticky", route);

    let counts = hits(addr, SPREAD_CONNECTIONS).await;

    assert_eq!(
        counts.len(),
        1,
        "the one client keeps one endpoint, whichever worker accepted it: {counts:?}"
    );
    assert_every_worker_accepted(&relay, "sticky", 2, 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_connections_on_every_worker_count_as_active_for_the_service() {
    let ep1 = tcp_endpoint("ep1").await;
    let mut relay = relay_with_workers(2);
    let addr = serve_tcp(&mut relay, "web", Route::to_endpoints(&[ep1]));
    let registry = relay.stats_registry();

    let mut open = Vec::new();
    for _ in 0..SPREAD_CONNECTIONS {
        open.push(Client::open(addr).await.unwrap());
    }

    assert_every_worker_accepted(&relay, "web", 2, 40);
    let name = port_name("web", Protocol::Tcp);
    assert_eq!(registry.snapshot()[&name].active, 40);
    drop(open);
    let drained = wait_for(|| registry.snapshot()[&name].active == 0).await;
    assert!(
        drained,
        "closed connections leave the count on every worker: {:?}",
        registry.snapshot()[&name]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_service_port_closes_every_worker_listener_and_frees_its_port() {
    let ep1 = tcp_endpoint("ep1").await;
    let free = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let options = RelayOptions {
        workers: 2,
        port_range: Some((port, port)),
        ..quick_options()
    };
    let mut relay = Relay::new(Handle::current(), IpFamily::V4, options);
    let addr = serve_tcp(&mut relay, "old", Route::to_endpoints(&[ep1]));
    assert_eq!(addr.port(), port);
    let mut established = Client::open(addr).await.unwrap();

    assert!(relay.apply(&BTreeMap::new()).is_empty());

    assert!(wait_refused(addr).await, "the port refuses once closed");
    // A worker's socket left open would take about half the connections.
    for attempt in 0..SPREAD_CONNECTIONS {
        let refused = TcpStream::connect(addr).await.unwrap_err();
        assert_eq!(
            refused.kind(),
            ErrorKind::ConnectionRefused,
            "attempt {attempt}"
        );
    }
    assert_eq!(established.echo("after close").await, "after close");
    // The one port of the range is free for another service port: no
    // socket of the old one holds it.
    let reopened = serve_tcp(&mut relay, "new", Route::to_endpoints(&[ep1]));
    assert_eq!(reopened.port(), port);
    assert_eq!(hits(reopened, 4).await, BTreeMap::from([("ep1".into(), 4)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_another_program_shares_with_so_reuseport_is_not_joined() {
    let ep1 = tcp_endpoint("ep1").await;
    // Another program's listener that would accept company on its port.
    let foreign = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    nix::sys::socket::setsockopt(&foreign, nix::sys::socket::sockopt::ReusePort, &true).unwrap();
    foreign
        .bind(&SocketAddr::from(([0, 0, 0, 0], 0)).into())
        .unwrap();
    foreign.listen(16).unwrap();
    let taken = foreign.local_addr().unwrap().as_socket().unwrap().port();
    let options = RelayOptions {
        workers: 2,
        port_range: Some((taken, taken)),
        ..quick_options()
    };
    let mut relay = Relay::new(Handle::current(), IpFamily::V4, options);
    let name = port_name("web", Protocol::Tcp);
    let desired = BTreeMap::from([(
        name.clone(),
        DesiredListener {
            protocol: Protocol::Tcp,
            route: Route::to_endpoints(&[ep1]),
        },
    )]);

    let errors = relay.apply(&desired);

    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        matches!(&errors[0], OpenError::RangeExhausted { service, .. } if *service == name),
        "the taken port counts as taken: {}",
        errors[0]
    );
    assert!(relay.listener(&name).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_workers_tcp_is_served_on_the_relays_runtime_with_one_socket() {
    let endpoints = [tcp_endpoint("ep1").await, tcp_endpoint("ep2").await];
    let mut relay = relay_with_workers(0);
    let addr = serve_tcp(&mut relay, "web", Route::to_endpoints(&endpoints));

    let counts = hits(addr, 10).await;

    assert_eq!(
        counts,
        BTreeMap::from([("ep1".into(), 5), ("ep2".into(), 5)])
    );
    assert_eq!(
        relay.accepted_per_worker(&port_name("web", Protocol::Tcp)),
        Some(vec![10])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_relay_closes_the_connections_of_its_workers() {
    let ep1 = tcp_endpoint("ep1").await;
    let mut relay = relay_with_workers(2);
    let addr = serve_tcp(&mut relay, "web", Route::to_endpoints(&[ep1]));
    let mut client = TcpStream::connect(addr).await.unwrap();
    let mut greeting = [0u8; 4];
    tokio::io::AsyncReadExt::read_exact(&mut client, &mut greeting)
        .await
        .unwrap();

    drop(relay);

    let mut rest = Vec::new();
    let read = tokio::io::AsyncReadExt::read_to_end(&mut client, &mut rest);
    let ended = tokio::time::timeout(DEADLINE, read).await;
    assert!(
        matches!(ended, Ok(Ok(0)) | Ok(Err(_))),
        "the connection ends with its worker: {ended:?}"
    );
}
