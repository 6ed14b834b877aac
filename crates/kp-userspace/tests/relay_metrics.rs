//! The relay's connection metrics as `/metrics` renders them, after real
//! connections on loopback (endpoints from `common`).
//!
//! | service port | route |
//! |---|---|
//! | ns1/web:p TCP | ep1 |
//! | ns1/down:p TCP | a closed port on 127.0.0.1 |
//! | ns1/dns:p UDP | ep1 (UDP) |
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::{
    closed_port, port_name, quick_options, tcp_endpoint, udp_ask, udp_endpoint, wait_for, Client,
    DEADLINE,
};
use kp_model::{IpFamily, Protocol};
use kp_userspace::{DesiredListener, Relay, RelayOptions, Route, UserspaceMetrics};
use pretty_assertions::assert_eq;
use prometheus_client::registry::Registry;
use tokio::net::{TcpStream, UdpSocket};
use tokio::runtime::Handle;

fn render(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

/// The sample lines of `text` for `service`'s port, in order.
fn samples_of(text: &str, service: &str) -> Vec<String> {
    let labels = format!("service=\"{service}\"");
    text.lines()
        .filter(|line| !line.starts_with('#') && line.contains(&labels))
        .map(str::to_owned)
        .collect()
}

fn expected(
    service: &str,
    protocol: &str,
    [active, accepted, refused, failed]: [u64; 4],
) -> Vec<String> {
    let labels = format!(
        "{{namespace=\"ns1\",service=\"{service}\",port_name=\"p\",protocol=\"{protocol}\",ip_family=\"IPv4\"}}"
    );
    vec![
        format!("kubeproxy_userspace_active_connections{labels} {active}"),
        format!("kubeproxy_userspace_accepted_connections_total{labels} {accepted}"),
        format!("kubeproxy_userspace_refused_connections_total{labels} {refused}"),
        format!("kubeproxy_userspace_endpoint_dial_failures_total{labels} {failed}"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_through_the_relay_show_in_the_rendered_metrics() {
    let ep1 = tcp_endpoint("ep1").await;
    let udp_ep1 = udp_endpoint("ep1").await;
    let options = RelayOptions {
        // The UDP session stays open while the metrics are read.
        udp_idle_timeout: Duration::from_secs(60),
        ..quick_options()
    };
    let dial_attempts = options.dial_timeouts.len() as u64;
    let mut relay = Relay::new(Handle::current(), IpFamily::V4, options);
    let metrics = UserspaceMetrics::new();
    metrics.watch(IpFamily::V4, relay.stats_registry());
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    assert_eq!(
        render(&registry),
        "# EOF\n",
        "nothing is reported before a listener opens"
    );

    let listener = |protocol, route| DesiredListener { protocol, route };
    let desired = BTreeMap::from([
        (
            port_name("web", Protocol::Tcp),
            listener(Protocol::Tcp, Route::to_endpoints(&[ep1])),
        ),
        (
            port_name("down", Protocol::Tcp),
            listener(Protocol::Tcp, Route::to_endpoints(&[closed_port()])),
        ),
        (
            port_name("dns", Protocol::Udp),
            listener(Protocol::Udp, Route::to_endpoints(&[udp_ep1])),
        ),
    ]);
    assert!(relay.apply(&desired).is_empty());
    let addr = |service, protocol| {
        let port = relay.listener(&port_name(service, protocol)).unwrap().port;
        SocketAddr::from(([127, 0, 0, 1], port))
    };

    // Three connections to web, two of them closed again; one to down,
    // whose only endpoint refuses every attempt; one UDP session.
    let mut kept = Client::open(addr("web", Protocol::Tcp)).await.unwrap();
    for _ in 0..2 {
        let closed = Client::open(addr("web", Protocol::Tcp)).await.unwrap();
        assert_eq!(closed.backend, "ep1");
    }
    // The relay resets it once every dial failed; on a busy machine the
    // reset can come before the client's connect() has returned.
    let reset = match TcpStream::connect(addr("down", Protocol::Tcp)).await {
        Ok(mut down) => {
            let mut byte = [0u8; 1];
            tokio::time::timeout(
                DEADLINE,
                tokio::io::AsyncReadExt::read(&mut down, &mut byte),
            )
            .await
            .unwrap()
        }
        Err(error) => Err(error),
    };
    assert!(
        match &reset {
            Ok(n) => *n == 0,
            Err(error) => error.kind() == std::io::ErrorKind::ConnectionReset,
        },
        "down answers nothing: {reset:?}"
    );
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    assert_eq!(
        udp_ask(&socket, addr("dns", Protocol::Udp), "q").await,
        "ep1 q"
    );

    // The relay notices closed connections on its own time.
    let settled = wait_for(|| {
        let stats = relay.stats();
        stats[&port_name("web", Protocol::Tcp)].active == 1
            && stats[&port_name("down", Protocol::Tcp)].active == 0
    })
    .await;
    assert!(settled, "{:?}", relay.stats());

    let text = render(&registry);
    assert_eq!(
        samples_of(&text, "web"),
        expected("web", "TCP", [1, 3, 0, 0]),
        "{text}"
    );
    assert_eq!(
        samples_of(&text, "down"),
        expected("down", "TCP", [0, 1, 1, dial_attempts]),
        "{text}"
    );
    assert_eq!(
        samples_of(&text, "dns"),
        expected("dns", "UDP", [1, 1, 0, 0]),
        "{text}"
    );
    for family in [
        "# TYPE kubeproxy_userspace_active_connections gauge",
        "# TYPE kubeproxy_userspace_accepted_connections counter",
        "# TYPE kubeproxy_userspace_refused_connections counter",
        "# TYPE kubeproxy_userspace_endpoint_dial_failures counter",
    ] {
        assert!(text.contains(family), "{family} in:\n{text}");
    }
    assert_eq!(kept.echo("still here").await, "still here");

    // A removed service port leaves the metrics with its listener.
    desired_without_down(&mut relay, desired);
    let text = render(&registry);
    assert!(samples_of(&text, "down").is_empty(), "{text}");
    assert_eq!(samples_of(&text, "web").len(), 4, "{text}");
}

fn desired_without_down(
    relay: &mut Relay,
    mut desired: BTreeMap<kp_model::ServicePortName, DesiredListener>,
) {
    desired.remove(&port_name("down", Protocol::Tcp));
    assert!(relay.apply(&desired).is_empty());
}
