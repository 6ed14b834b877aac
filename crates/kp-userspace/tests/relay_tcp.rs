//! The TCP relay on loopback: endpoints are named echo servers on
//! 127.0.0.1 (see `common`), the client connects straight to the
//! listener's port (no portal rules: those are the kernel tests' job).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;

use common::{
    closed_port, hits, port_name, quick_options, serve_tcp, tcp_endpoint, wait_refused, Client,
    DEADLINE,
};
use kp_model::Protocol;
use kp_userspace::{DesiredListener, OpenError, Relay, RelayOptions, Route};
use tokio::net::TcpStream;
use tokio::runtime::Handle;

fn relay(options: RelayOptions) -> Relay {
    Relay::new(Handle::current(), kp_model::IpFamily::V4, options)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_spread_round_robin_over_every_endpoint() {
    let endpoints = [
        tcp_endpoint("ep1").await,
        tcp_endpoint("ep2").await,
        tcp_endpoint("ep3").await,
    ];
    let mut relay = relay(quick_options());
    let addr = serve_tcp(&mut relay, "web", Route::to_endpoints(&endpoints));

    let counts = hits(addr, 30).await;
    assert_eq!(
        counts,
        BTreeMap::from([("ep1".into(), 10), ("ep2".into(), 10), ("ep3".into(), 10)])
    );
    let stats = relay.stats()[&port_name("web", Protocol::Tcp)];
    assert_eq!(stats.accepted, 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ip_affinity_sends_every_connection_of_a_client_to_one_endpoint() {
    let endpoints = [tcp_endpoint("ep1").await, tcp_endpoint("ep2").await];
    let mut relay = relay(quick_options());
    let route = Route {
        affinity_timeout: Some(Duration::from_secs(60)),
        ..Route::to_endpoints(&endpoints)
    };
    let addr = serve_tcp(&mut relay, "sticky", route);

    let counts = hits(addr, 10).await;
    assert_eq!(
        counts.len(),
        1,
        "one endpoint for the one client: {counts:?}"
    );
    assert_eq!(counts.values().sum::<usize>(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_refuses_is_skipped_for_the_next_one() {
    let live = tcp_endpoint("ep2").await;
    let mut relay = relay(quick_options());
    let addr = serve_tcp(
        &mut relay,
        "web",
        Route::to_endpoints(&[closed_port(), live]),
    );

    let counts = hits(addr, 6).await;
    assert_eq!(counts, BTreeMap::from([("ep2".into(), 6)]));
    let stats = relay.stats()[&port_name("web", Protocol::Tcp)];
    assert!(stats.dial_failures >= 3, "refusals are counted: {stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_does_not_answer_is_skipped_after_its_timeout() {
    // A listener with a full accept queue drops further SYNs: a connection
    // to it hangs as one to a dead pod would.
    let silent = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    silent
        .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    silent.listen(0).unwrap();
    let silent_addr = silent.local_addr().unwrap().as_socket().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..2 {
        let filler = std::net::TcpStream::connect_timeout(&silent_addr, Duration::from_millis(300));
        fillers.extend(filler.ok());
    }
    let live = tcp_endpoint("ep2").await;
    let mut relay = relay(quick_options());
    let addr = serve_tcp(&mut relay, "web", Route::to_endpoints(&[silent_addr, live]));

    let started = std::time::Instant::now();
    let counts = hits(addr, 4).await;
    assert_eq!(counts, BTreeMap::from([("ep2".into(), 4)]));
    let stats = relay.stats()[&port_name("web", Protocol::Tcp)];
    assert!(
        stats.dial_failures >= 1,
        "the silent endpoint was tried: {stats:?}"
    );
    assert!(started.elapsed() < DEADLINE, "each timeout is short");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_endpoints_the_listener_resets_and_the_refusing_port_refuses() {
    let mut relay = relay(quick_options());
    let addr = serve_tcp(&mut relay, "empty", Route::to_endpoints(&[]));

    let error = Client::open(addr)
        .await
        .err()
        .expect("no endpoint can answer");
    assert!(
        matches!(
            error.kind(),
            ErrorKind::ConnectionReset | ErrorKind::UnexpectedEof
        ),
        "reset at once: {error}"
    );
    let refusing = SocketAddr::from(([127, 0, 0, 1], relay.refusing_port().unwrap()));
    let refused = TcpStream::connect(refusing).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);
    assert!(
        !relay
            .listener(&port_name("empty", Protocol::Tcp))
            .unwrap()
            .has_endpoints
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_update_keeps_established_connections() {
    let ep1 = tcp_endpoint("ep1").await;
    let ep2 = tcp_endpoint("ep2").await;
    let mut relay = relay(quick_options());
    let addr = serve_tcp(&mut relay, "web", Route::to_endpoints(&[ep1]));
    let mut established = Client::open(addr).await.unwrap();
    assert_eq!(established.backend, "ep1");

    // ep1 is removed from the Service: new connections go to ep2, the
    // established one keeps talking to ep1.
    let same_port = serve_tcp(&mut relay, "web", Route::to_endpoints(&[ep2]));
    assert_eq!(same_port, addr, "the listener stays where it was");
    assert_eq!(hits(addr, 3).await, BTreeMap::from([("ep2".into(), 3)]));
    assert_eq!(established.echo("still here").await, "still here");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_listener_keeps_its_established_connections() {
    let ep1 = tcp_endpoint("ep1").await;
    let mut relay = relay(quick_options());
    let addr = serve_tcp(&mut relay, "web", Route::to_endpoints(&[ep1]));
    let mut established = Client::open(addr).await.unwrap();
    let registry = relay.stats_registry();
    let name = port_name("web", Protocol::Tcp);
    assert_eq!(
        registry.snapshot()[&name].active,
        1,
        "a metrics reader sees the open connection"
    );

    assert!(relay.apply(&BTreeMap::new()).is_empty());
    assert!(
        !registry.snapshot().contains_key(&name),
        "a closed listener leaves the registry"
    );
    assert!(relay.listener(&port_name("web", Protocol::Tcp)).is_none());
    let refused = wait_refused(addr).await;
    assert!(
        refused,
        "new connections are refused once the listener is closed"
    );
    assert_eq!(established.echo("after close").await, "after close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_data_and_half_close_pass_through_unchanged() {
    let ep1 = tcp_endpoint("ep1").await;
    let data: Vec<u8> = (0..8 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    for splice in [true, false] {
        let mut relay = relay(RelayOptions {
            splice,
            ..quick_options()
        });
        let addr = serve_tcp(&mut relay, "web", Route::to_endpoints(&[ep1]));

        let client = Client::open(addr).await.unwrap();
        let echoed = client.round_trip(&data).await;
        assert_eq!(
            echoed.len(),
            data.len(),
            "every byte comes back (splice {splice})"
        );
        assert!(
            echoed == data,
            "the bytes come back unchanged (splice {splice})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_port_range_fails_only_the_service_port_that_does_not_fit_and_is_retried() {
    let ep1 = tcp_endpoint("ep1").await;
    // A range of two ports, one of which another program holds.
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let low = taken.local_addr().unwrap().port();
    let Some(high) = low.checked_add(1) else {
        panic!("the kernel handed out port 65535; rerun");
    };
    let free_check = std::net::TcpListener::bind(("0.0.0.0", high));
    drop(free_check.expect("the port after an ephemeral one is free for this test"));
    let options = RelayOptions {
        port_range: Some((low, high)),
        ..quick_options()
    };
    let mut relay = relay(options);
    let route = Route::to_endpoints(&[ep1]);
    let desired = |names: &[&str]| {
        names
            .iter()
            .map(|n| {
                let listener = DesiredListener {
                    protocol: Protocol::Tcp,
                    route: route.clone(),
                };
                (port_name(n, Protocol::Tcp), listener)
            })
            .collect::<BTreeMap<_, _>>()
    };

    let errors = relay.apply(&desired(&["a", "b"]));
    assert_eq!(errors.len(), 1, "one service port does not fit: {errors:?}");
    assert!(
        matches!(&errors[0], OpenError::RangeExhausted { service, .. } if *service == port_name("b", Protocol::Tcp)),
        "the error names the service port: {}",
        errors[0]
    );
    let a = relay.listener(&port_name("a", Protocol::Tcp)).unwrap();
    assert_eq!(a.port, high, "the taken port is skipped");
    assert_eq!(
        hits(SocketAddr::from(([127, 0, 0, 1], a.port)), 2).await,
        BTreeMap::from([("ep1".into(), 2)])
    );

    // The other program goes away: the next sync opens the missing one.
    drop(taken);
    assert!(relay.apply(&desired(&["a", "b"])).is_empty());
    assert_eq!(
        relay.listener(&port_name("b", Protocol::Tcp)).unwrap().port,
        low
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_data_to_a_slow_reader_arrives_whole_and_in_order() {
    // An endpoint that pushes 32 MiB at once; the client waits before
    // reading, so the relay's pipe and buffers fill and wait for room.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let source = listener.local_addr().unwrap();
    const SIZE: usize = 32 * 1024 * 1024;
    let pattern = |i: usize| (i % 253) as u8;
    tokio::spawn(async move {
        let data: Vec<u8> = (0..SIZE).map(pattern).collect();
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::io::AsyncWriteExt::write_all(&mut stream, &data)
                .await
                .unwrap();
        }
    });
    for splice in [true, false] {
        let mut relay = relay(RelayOptions {
            splice,
            ..quick_options()
        });
        let addr = serve_tcp(&mut relay, "bulk", Route::to_endpoints(&[source]));

        let mut client = TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut received = Vec::with_capacity(SIZE);
        let read = tokio::io::AsyncReadExt::read_to_end(&mut client, &mut received);
        tokio::time::timeout(DEADLINE * 4, read)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(received.len(), SIZE, "every byte arrives (splice {splice})");
        let first_wrong = received
            .iter()
            .enumerate()
            .position(|(i, b)| *b != pattern(i));
        assert_eq!(first_wrong, None, "in order, unchanged (splice {splice})");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_ends_first_and_a_client_that_ends_last_both_see_the_end() {
    // The endpoint says goodbye and half-closes, then waits for the
    // client's end; the client reads to the end, then half-closes too.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let source = listener.local_addr().unwrap();
    let (saw_end, client_ended) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut stream, b"bye")
            .await
            .unwrap();
        tokio::io::AsyncWriteExt::shutdown(&mut stream)
            .await
            .unwrap();
        let mut rest = Vec::new();
        let read = tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut rest).await;
        let _ = saw_end.send(read.map(|_| rest));
    });
    let mut relay = relay(quick_options());
    let addr = serve_tcp(&mut relay, "web", Route::to_endpoints(&[source]));

    let mut client = TcpStream::connect(addr).await.unwrap();
    let mut received = Vec::new();
    let read = tokio::io::AsyncReadExt::read_to_end(&mut client, &mut received);
    tokio::time::timeout(DEADLINE, read).await.unwrap().unwrap();
    assert_eq!(received, b"bye", "the endpoint's end reaches the client");
    tokio::io::AsyncWriteExt::write_all(&mut client, b"ok")
        .await
        .unwrap();
    tokio::io::AsyncWriteExt::shutdown(&mut client)
        .await
        .unwrap();

    let at_endpoint = tokio::time::timeout(DEADLINE, client_ended).await;
    assert_eq!(
        at_endpoint.unwrap().unwrap().unwrap(),
        b"ok",
        "the client's last bytes and then its end reach the endpoint"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_idle_past_the_idle_timeout_is_ended_and_an_active_one_is_not() {
    let ep1 = tcp_endpoint("ep1").await;
    let mut relay = relay(RelayOptions {
        tcp_idle_timeout: Duration::from_millis(400),
        ..quick_options()
    });
    let addr = serve_tcp(&mut relay, "web", Route::to_endpoints(&[ep1]));

    // Talking every 100 ms for well past the timeout keeps it open.
    let mut active = Client::open(addr).await.unwrap();
    for round in 0..12 {
        let line = format!("round {round}");
        assert_eq!(active.echo(&line).await, line);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Saying nothing ends it: the relay resets both sides.
    let idle = Client::open(addr).await.unwrap();
    let ended = idle.wait_for_end().await;
    assert!(ended, "the idle connection was ended within {DEADLINE:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_sides_of_a_relayed_connection_send_keepalive_probes() {
    common::require_ss();
    let ep1 = tcp_endpoint("ep1").await;
    let mut relay = relay(quick_options());
    let addr = serve_tcp(&mut relay, "web", Route::to_endpoints(&[ep1]));
    let _client = Client::open(addr).await.unwrap();

    let sockets = common::established_sockets();
    let with = |column: usize, addr: SocketAddr| {
        sockets
            .iter()
            .find(|line| line.split_whitespace().nth(column) == Some(&addr.to_string()))
            .unwrap_or_else(|| {
                panic!(
                    "no socket with {addr} in column {column}:\n{}",
                    sockets.join("\n")
                )
            })
    };
    // Columns: Recv-Q, Send-Q, local address, peer address, timer.
    let relay_side = with(2, addr);
    let endpoint_side = with(3, ep1);
    for (side, line) in [("client", relay_side), ("endpoint", endpoint_side)] {
        assert!(
            line.contains("timer:(keepalive,"),
            "the relay's socket towards the {side} has keepalive on: {line}"
        );
    }
}
