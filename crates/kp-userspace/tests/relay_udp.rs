//! The UDP relay on loopback: endpoints answer `"<name> <datagram>"`
//! (see `common`); clients send straight to the listener's port.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{port_name, quick_options, serve_udp, udp_ask, udp_endpoint, wait_for, DEADLINE};
use kp_model::{IpFamily, Protocol};
use kp_userspace::{Relay, RelayOptions, Route};
use tokio::net::UdpSocket;
use tokio::runtime::Handle;

fn backend_of(answer: &str) -> &str {
    answer.split(' ').next().unwrap()
}

async fn client() -> UdpSocket {
    UdpSocket::bind("127.0.0.1:0").await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datagram_gets_the_endpoints_answer_from_the_address_it_was_sent_to() {
    let ep1 = udp_endpoint("ep1").await;
    let mut relay = Relay::new(Handle::current(), IpFamily::V4, quick_options());
    let addr = serve_udp(&mut relay, "dns", Route::to_endpoints(&[ep1]));

    let socket = client().await;
    assert_eq!(udp_ask(&socket, addr, "hello").await, "ep1 hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_client_has_its_own_session_on_one_endpoint() {
    let endpoints = [udp_endpoint("ep1").await, udp_endpoint("ep2").await];
    let mut relay = Relay::new(Handle::current(), IpFamily::V4, quick_options());
    let addr = serve_udp(&mut relay, "dns", Route::to_endpoints(&endpoints));

    let first = client().await;
    let second = client().await;
    let a = udp_ask(&first, addr, "1").await;
    let b = udp_ask(&second, addr, "1").await;
    assert_ne!(
        backend_of(&a),
        backend_of(&b),
        "round robin over sessions: {a} / {b}"
    );
    for n in 2..6 {
        let again = udp_ask(&first, addr, &n.to_string()).await;
        assert_eq!(
            backend_of(&again),
            backend_of(&a),
            "a session keeps its endpoint"
        );
    }
    let stats = relay.stats()[&port_name("dns", Protocol::Udp)];
    assert_eq!(stats.accepted, 2, "two sessions: {stats:?}");
    assert_eq!(stats.active, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_is_closed_and_the_next_datagram_starts_a_new_one() {
    let endpoints = [udp_endpoint("ep1").await, udp_endpoint("ep2").await];
    let options = quick_options();
    let idle = options.udp_idle_timeout;
    let mut relay = Relay::new(Handle::current(), IpFamily::V4, options);
    let addr = serve_udp(&mut relay, "dns", Route::to_endpoints(&endpoints));
    let name = port_name("dns", Protocol::Udp);

    let socket = client().await;
    let first = udp_ask(&socket, addr, "a").await;
    let closed = wait_for(|| relay.stats()[&name].active == 0).await;
    assert!(closed, "the session closes after {idle:?} without traffic");
    let second = udp_ask(&socket, addr, "b").await;
    assert_ne!(
        backend_of(&first),
        backend_of(&second),
        "a new session, balanced afresh"
    );
    assert_eq!(relay.stats()[&name].accepted, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_stays_open_for_the_configured_idle_time_then_closes() {
    // Longer than upstream's 250ms default, so a relay that ignored the
    // option would be caught closing early.
    let idle = Duration::from_millis(700);
    let options = RelayOptions {
        udp_idle_timeout: idle,
        ..quick_options()
    };
    let mut relay = Relay::new(Handle::current(), IpFamily::V4, options);
    let addr = serve_udp(
        &mut relay,
        "dns",
        Route::to_endpoints(&[udp_endpoint("ep1").await]),
    );
    let name = port_name("dns", Protocol::Udp);

    let socket = client().await;
    // The relay sees the datagram after this instant, so the session
    // cannot end before `sent + idle`.
    let sent = Instant::now();
    assert_eq!(udp_ask(&socket, addr, "a").await, "ep1 a");
    let open_until = sent + idle;
    let closed_at = loop {
        let active = relay.stats()[&name].active;
        let now = Instant::now();
        if now < open_until {
            assert_eq!(active, 1, "open {:?} after the datagram", now - sent);
        } else if active == 0 {
            break now;
        }
        assert!(
            now < open_until + DEADLINE,
            "the session is still open {:?} after the datagram",
            now - sent
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        relay.stats()[&name].accepted,
        1,
        "one session, closed {:?} after its datagram",
        closed_at - sent
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_endpoints_datagrams_are_dropped() {
    let mut relay = Relay::new(Handle::current(), IpFamily::V4, quick_options());
    let addr = serve_udp(&mut relay, "dns", Route::to_endpoints(&[]));

    let socket = client().await;
    socket.send_to(b"anyone?", addr).await.unwrap();
    let mut buffer = [0u8; 64];
    let answer =
        tokio::time::timeout(Duration::from_millis(300), socket.recv_from(&mut buffer)).await;
    assert!(answer.is_err(), "no answer: {answer:?}");
    assert_eq!(relay.stats()[&port_name("dns", Protocol::Udp)].refused, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_datagrams_are_relayed_too() {
    let Ok(endpoint) = UdpSocket::bind("[::1]:0").await else {
        panic!("IPv6 loopback is not available here; this test needs ::1");
    };
    let ep = endpoint.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buffer = [0u8; 512];
        while let Ok((n, from)) = endpoint.recv_from(&mut buffer).await {
            let answer = format!("ep6 {}", String::from_utf8_lossy(&buffer[..n]));
            let _ = endpoint.send_to(answer.as_bytes(), from).await;
        }
    });
    let mut relay = Relay::new(Handle::current(), IpFamily::V6, quick_options());
    let name = port_name("dns6", Protocol::Udp);
    let desired = std::collections::BTreeMap::from([(
        name.clone(),
        kp_userspace::DesiredListener {
            protocol: Protocol::Udp,
            route: Route::to_endpoints(&[ep]),
        },
    )]);
    assert!(relay.apply(&desired).is_empty());
    let addr = std::net::SocketAddr::from((
        std::net::Ipv6Addr::LOCALHOST,
        relay.listener(&name).unwrap().port,
    ));
    let socket = UdpSocket::bind("[::1]:0").await.unwrap();
    assert_eq!(udp_ask(&socket, addr, "v6").await, "ep6 v6");
}
