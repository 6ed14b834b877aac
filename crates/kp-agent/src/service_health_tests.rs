#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::time::Duration;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_model::{ObjectEvent, ProxyEventHandler, ResourceKind};
use kp_sync::testing::{fake_proxier, IMMEDIATE};
use kp_sync::Proxier;
use kp_testkit::builders::{endpoint_slice, service};
use kp_testkit::http;
use kp_testkit::netns::{require_root, wait_until, Netns};

use super::*;

fn proxier() -> Proxier {
    fake_proxier(IpFamily::V4, "node-1", IMMEDIATE).0
}

fn balancer(health_port: u16) -> k8s_openapi::api::core::v1::Service {
    service("ns1", "lb", |s| {
        s.service_type("LoadBalancer")
            .cluster_ip("10.96.0.20")
            .port("http", 80, "TCP")
            .node_port(30080)
            .external_traffic_policy_local()
            .health_check_node_port(i32::from(health_port))
    })
}

/// The slice of `lb` with one ready endpoint per `(address, node)`.
fn slice(endpoints: &[(&str, &str)]) -> EndpointSlice {
    endpoint_slice("ns1", "lb-1", "lb", |mut slice| {
        slice = slice.port("http", 8080, "TCP");
        for (address, node) in endpoints {
            slice = slice.endpoint(address, |e| e.ready(true).node(node));
        }
        slice
    })
}

/// `GET /` on `port` of loopback: the status code and the body.
fn get(port: u16) -> std::io::Result<(u16, String)> {
    http::get(("127.0.0.1", port), "/").map(|reply| (reply.code, reply.body))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn a_health_check_port_answers_200_with_local_endpoints_and_503_without() {
    require_root();
    let node = Netns::create("hcport").unwrap();
    node.run(|| {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let proxier = proxier();
        let servers = ServiceHealthServers::new(runtime.handle().clone());
        let proxier = Arc::new(proxier.with_observer(Arc::new(servers.clone())));
        proxier.on_synced(ResourceKind::Service);
        proxier.on_synced(ResourceKind::EndpointSlice);
        let port = free_port();

        proxier.on_service(ObjectEvent::Apply(balancer(port)));
        proxier.on_endpoint_slice(ObjectEvent::Apply(slice(&[
            ("10.244.1.2", "node-1"),
            ("10.244.1.3", "node-1"),
            ("10.244.2.2", "node-2"),
        ])));
        proxier.sync_once().unwrap();

        assert_eq!(servers.serving(), [port]);
        let (code, body) = get(port).unwrap();
        assert_eq!(code, 200);
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "service": {"namespace": "ns1", "name": "lb"},
                "localEndpoints": 2,
                "serviceProxyHealthy": true
            })
        );
        let weight = servers.answer(port);
        assert!(weight
            .headers
            .contains(&("X-Load-Balancing-Endpoint-Weight", "2".to_owned())));

        // The last local endpoint goes away: 503.
        proxier.on_endpoint_slice(ObjectEvent::Apply(slice(&[("10.244.2.2", "node-2")])));
        proxier.sync_once().unwrap();
        let (code, body) = get(port).unwrap();
        assert_eq!(code, 503);
        assert!(body.contains("\"localEndpoints\":0"), "{body}");

        // The Service goes away: so does its server.
        proxier.on_service(ObjectEvent::Delete(balancer(port)));
        proxier.sync_once().unwrap();
        assert!(servers.serving().is_empty());
        let closed = wait_until(Duration::from_secs(5), || get(port).is_err());
        assert!(closed, "the port is closed");
    });
}

#[test]
fn a_taken_port_is_retried_after_the_next_sync() {
    require_root();
    let node = Netns::create("hctaken").unwrap();
    node.run(|| {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let servers = ServiceHealthServers::new(runtime.handle().clone());
        let proxier = Arc::new(proxier().with_observer(Arc::new(servers.clone())));
        proxier.on_synced(ResourceKind::Service);
        proxier.on_synced(ResourceKind::EndpointSlice);
        let squatter = TcpListener::bind("[::]:0").unwrap();
        let port = squatter.local_addr().unwrap().port();

        proxier.on_service(ObjectEvent::Apply(balancer(port)));
        proxier.on_endpoint_slice(ObjectEvent::Apply(slice(&[("10.244.1.2", "node-1")])));
        proxier.sync_once().unwrap();
        assert!(servers.serving().is_empty(), "the port is taken");

        drop(squatter);
        // A process another test forks in that instant holds a copy of the
        // socket until it execs (close-on-exec): wait until nothing listens.
        let freed = wait_until(Duration::from_secs(5), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
        });
        assert!(freed, "the squatter's socket is closed");
        proxier.on_endpoint_slice(ObjectEvent::Apply(slice(&[("10.244.1.4", "node-1")])));
        proxier.sync_once().unwrap();
        assert_eq!(servers.serving(), [port]);
        assert_eq!(get(port).unwrap().0, 200);
    });
}

#[test]
fn with_node_port_addresses_the_server_listens_only_on_them() {
    require_root();
    let node = Netns::create("hcaddrs").unwrap();
    node.run(|| {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        // nodePortAddresses with IPv4 CIDRs only: 127.0.0.1 out of
        // 127.0.0.0/8; the IPv6 family, with no CIDR of its own, would
        // listen everywhere, but has no Service asking for the port.
        let listen: ListenAddresses = Arc::new(|family, _node: &NodeInfo| {
            (family == IpFamily::V4).then(|| vec!["127.0.0.1".parse().unwrap()])
        });
        let servers = ServiceHealthServers::listening_on(runtime.handle().clone(), listen);
        let observe = |family| {
            let proxier = fake_proxier(family, "node-1", IMMEDIATE).0;
            let proxier = Arc::new(proxier.with_observer(Arc::new(servers.clone())));
            proxier.on_synced(ResourceKind::Service);
            proxier.on_synced(ResourceKind::EndpointSlice);
            proxier
        };
        let (v4, v6) = (observe(IpFamily::V4), observe(IpFamily::V6));
        let port = free_port();

        for proxier in [&v4, &v6] {
            proxier.on_service(ObjectEvent::Apply(balancer(port)));
            proxier.on_endpoint_slice(ObjectEvent::Apply(slice(&[("10.244.1.2", "node-1")])));
        }
        v6.sync_once().unwrap();
        v4.sync_once().unwrap();

        assert_eq!(servers.serving(), [port]);
        assert_eq!(get(port).unwrap().0, 200);
        let other = http::get(("127.0.0.2", port), "/");
        assert!(other.is_err(), "127.0.0.2 is not selected: {other:?}");
    });
}

#[test]
fn with_primary_the_port_opens_once_the_node_address_is_known() {
    require_root();
    let node = Netns::create("hcprimary").unwrap();
    node.run(|| {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        // `nodePortAddresses: [primary]`: the Node's first address of the
        // family, unknown until the Node object arrives.
        let listen: ListenAddresses = Arc::new(|family, node: &NodeInfo| {
            Some(
                node.addresses
                    .iter()
                    .copied()
                    .filter(|ip| IpFamily::of(ip) == family)
                    .take(1)
                    .collect(),
            )
        });
        let servers = ServiceHealthServers::listening_on(runtime.handle().clone(), listen);
        let proxier = Arc::new(proxier().with_observer(Arc::new(servers.clone())));
        proxier.on_synced(ResourceKind::Service);
        proxier.on_synced(ResourceKind::EndpointSlice);
        let port = free_port();

        // The first sync comes before the Node: nothing to listen on yet.
        proxier.on_service(ObjectEvent::Apply(balancer(port)));
        proxier.on_endpoint_slice(ObjectEvent::Apply(slice(&[("10.244.1.2", "node-1")])));
        proxier.sync_once().unwrap();
        assert!(servers.serving().is_empty(), "no address to listen on yet");

        // The Node arrives with its address: the next sync opens the port
        // there.
        proxier.on_node(ObjectEvent::Apply(kp_testkit::builders::node(
            "node-1",
            |n| n.internal_ip("127.0.0.1"),
        )));
        proxier.sync_once().unwrap();
        assert_eq!(servers.serving(), [port]);
        assert_eq!(get(port).unwrap().0, 200);
    });
}
