//! `categorize_endpoints`, told as one story per case.
//!
//! Address plan: this node is `node-1` in `zone-a`; pods on it are
//! 10.244.1.0/24, pods on `node-2` (`zone-b`) are 10.244.2.0/24; the Service's
//! ClusterIP is 10.96.0.41, its external IP 203.0.113.5.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_model::{categorize_endpoints, endpoints_from_slices, service_ports_from_service, IpFamily};
use kp_testkit::builders::{endpoint_slice, service, EndpointSliceBuilder, ServiceBuilder};
use pretty_assertions::assert_eq;

const NODE: &str = "node-1";
const ZONE: &str = "zone-a";

/// One story: a Service, its endpoints, and which endpoints each kind of
/// traffic may use.
struct Case {
    story: &'static str,
    service: fn(ServiceBuilder) -> ServiceBuilder,
    endpoints: fn(EndpointSliceBuilder) -> EndpointSliceBuilder,
    node_zone: Option<&'static str>,
    cluster: &'static [&'static str],
    local: &'static [&'static str],
    all_reachable: &'static [&'static str],
    has_any: bool,
}

fn cluster_ip(s: ServiceBuilder) -> ServiceBuilder {
    s.cluster_ip("10.96.0.41").port("p80", 80, "TCP")
}

fn node_port(s: ServiceBuilder) -> ServiceBuilder {
    cluster_ip(s).node_port(30080).service_type("NodePort")
}

/// One local and one remote ready endpoint.
fn local_and_remote(e: EndpointSliceBuilder) -> EndpointSliceBuilder {
    e.endpoint("10.244.1.2", |ep| ep.ready(true).node("node-1"))
        .endpoint("10.244.2.2", |ep| ep.ready(true).node("node-2"))
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            story: "a service without endpoints has nothing to use anywhere",
            service: cluster_ip,
            endpoints: |e| e,
            node_zone: Some(ZONE),
            cluster: &[],
            local: &[],
            all_reachable: &[],
            has_any: false,
        },
        Case {
            story: "cluster traffic goes to every ready endpoint, local or not",
            service: cluster_ip,
            endpoints: local_and_remote,
            node_zone: Some(ZONE),
            cluster: &["10.244.1.2:8080", "10.244.2.2:8080"],
            local: &[],
            all_reachable: &["10.244.1.2:8080", "10.244.2.2:8080"],
            has_any: true,
        },
        Case {
            story: "an endpoint that is not ready and not terminating gets no traffic",
            service: cluster_ip,
            endpoints: |e| {
                e.endpoint("10.244.1.2", |ep| ep.ready(true))
                    .endpoint("10.244.2.2", |ep| ep.ready(false).serving(false))
            },
            node_zone: Some(ZONE),
            cluster: &["10.244.1.2:8080"],
            local: &[],
            all_reachable: &["10.244.1.2:8080"],
            has_any: true,
        },
        Case {
            story: "when nothing is ready, cluster traffic falls back to serving terminating endpoints",
            service: cluster_ip,
            endpoints: |e| {
                e.endpoint("10.244.1.2", |ep| ep.terminating_serving())
                    .endpoint("10.244.2.2", |ep| ep.terminating_not_serving())
            },
            node_zone: Some(ZONE),
            cluster: &["10.244.1.2:8080"],
            local: &[],
            all_reachable: &["10.244.1.2:8080"],
            has_any: true,
        },
        Case {
            story: "ready endpoints win over serving terminating ones",
            service: cluster_ip,
            endpoints: |e| {
                e.endpoint("10.244.1.2", |ep| ep.terminating_serving())
                    .endpoint("10.244.2.2", |ep| ep.ready(true))
            },
            node_zone: Some(ZONE),
            cluster: &["10.244.2.2:8080"],
            local: &[],
            all_reachable: &["10.244.2.2:8080"],
            has_any: true,
        },
        Case {
            story: "terminating endpoints that stopped serving leave the service without endpoints",
            service: cluster_ip,
            endpoints: |e| {
                e.endpoint("10.244.1.2", |ep| ep.terminating_not_serving())
                    .endpoint("10.244.2.2", |ep| ep.terminating_not_serving().node("node-1"))
            },
            node_zone: Some(ZONE),
            cluster: &[],
            local: &[],
            all_reachable: &[],
            has_any: false,
        },
        Case {
            story: "with internalTrafficPolicy Local, only this node's ready endpoints are used",
            service: |s| cluster_ip(s).internal_traffic_policy_local(),
            endpoints: local_and_remote,
            node_zone: Some(ZONE),
            cluster: &[],
            local: &["10.244.1.2:8080"],
            all_reachable: &["10.244.1.2:8080"],
            has_any: true,
        },
        Case {
            story: "with internalTrafficPolicy Local and no local endpoint, traffic is dropped but endpoints exist",
            service: |s| cluster_ip(s).internal_traffic_policy_local(),
            endpoints: |e| e.endpoint("10.244.2.2", |ep| ep.ready(true).node("node-2")),
            node_zone: Some(ZONE),
            cluster: &[],
            local: &[],
            all_reachable: &[],
            has_any: true,
        },
        Case {
            story: "when no local endpoint is ready, local traffic falls back to local serving terminating endpoints",
            service: |s| cluster_ip(s).internal_traffic_policy_local(),
            endpoints: |e| {
                e.endpoint("10.244.1.2", |ep| ep.terminating_serving().node("node-1"))
                    .endpoint("10.244.2.2", |ep| ep.ready(true).node("node-2"))
            },
            node_zone: Some(ZONE),
            cluster: &[],
            local: &["10.244.1.2:8080"],
            all_reachable: &["10.244.1.2:8080"],
            has_any: true,
        },
        Case {
            story: "a ready local endpoint wins over a local serving terminating one",
            service: |s| cluster_ip(s).internal_traffic_policy_local(),
            endpoints: |e| {
                e.endpoint("10.244.1.2", |ep| ep.terminating_serving().node("node-1"))
                    .endpoint("10.244.1.3", |ep| ep.ready(true).node("node-1"))
            },
            node_zone: Some(ZONE),
            cluster: &[],
            local: &["10.244.1.3:8080"],
            all_reachable: &["10.244.1.3:8080"],
            has_any: true,
        },
        Case {
            story: "with externalTrafficPolicy Local, external traffic uses local endpoints and pods still reach all",
            service: |s| node_port(s).external_traffic_policy_local(),
            endpoints: local_and_remote,
            node_zone: Some(ZONE),
            cluster: &["10.244.1.2:8080", "10.244.2.2:8080"],
            local: &["10.244.1.2:8080"],
            all_reachable: &["10.244.1.2:8080", "10.244.2.2:8080"],
            has_any: true,
        },
        Case {
            story: "with externalTrafficPolicy Local and no local endpoint, external traffic has nowhere to go",
            service: |s| node_port(s).external_traffic_policy_local(),
            endpoints: |e| e.endpoint("10.244.2.2", |ep| ep.ready(true).node("node-2")),
            node_zone: Some(ZONE),
            cluster: &["10.244.2.2:8080"],
            local: &[],
            all_reachable: &["10.244.2.2:8080"],
            has_any: true,
        },
        Case {
            story: "a local terminating endpoint serves external traffic while remote ready ones serve pods",
            service: |s| node_port(s).external_traffic_policy_local(),
            endpoints: |e| {
                e.endpoint("10.244.1.2", |ep| ep.terminating_serving().node("node-1"))
                    .endpoint("10.244.2.2", |ep| ep.ready(true).node("node-2"))
            },
            node_zone: Some(ZONE),
            cluster: &["10.244.2.2:8080"],
            local: &["10.244.1.2:8080"],
            all_reachable: &["10.244.1.2:8080", "10.244.2.2:8080"],
            has_any: true,
        },
        Case {
            story: "an externally reachable service with both policies Local still needs cluster endpoints",
            service: |s| {
                node_port(s)
                    .external_traffic_policy_local()
                    .internal_traffic_policy_local()
            },
            endpoints: local_and_remote,
            node_zone: Some(ZONE),
            cluster: &["10.244.1.2:8080", "10.244.2.2:8080"],
            local: &["10.244.1.2:8080"],
            all_reachable: &["10.244.1.2:8080", "10.244.2.2:8080"],
            has_any: true,
        },
        Case {
            story: "externalTrafficPolicy Local means nothing for a service nobody reaches from outside",
            service: |s| cluster_ip(s).external_traffic_policy_local(),
            endpoints: local_and_remote,
            node_zone: Some(ZONE),
            cluster: &["10.244.1.2:8080", "10.244.2.2:8080"],
            local: &[],
            all_reachable: &["10.244.1.2:8080", "10.244.2.2:8080"],
            has_any: true,
        },
        Case {
            story: "an external IP makes a ClusterIP service honour externalTrafficPolicy Local",
            service: |s| {
                cluster_ip(s)
                    .external_ip("203.0.113.5")
                    .external_traffic_policy_local()
            },
            endpoints: local_and_remote,
            node_zone: Some(ZONE),
            cluster: &["10.244.1.2:8080", "10.244.2.2:8080"],
            local: &["10.244.1.2:8080"],
            all_reachable: &["10.244.1.2:8080", "10.244.2.2:8080"],
            has_any: true,
        },
        Case {
            story: "zone hints keep cluster traffic in this node's zone",
            service: |s| cluster_ip(s).traffic_distribution("PreferClose"),
            endpoints: zone_hinted,
            node_zone: Some(ZONE),
            cluster: &["10.244.1.2:8080", "10.244.3.2:8080"],
            local: &[],
            all_reachable: &["10.244.1.2:8080", "10.244.3.2:8080"],
            has_any: true,
        },
        Case {
            story: "zone hints are ignored when one ready endpoint has none",
            service: |s| cluster_ip(s).traffic_distribution("PreferClose"),
            endpoints: |e| {
                zone_hinted(e).endpoint("10.244.4.2", |ep| ep.ready(true).zone("zone-b"))
            },
            node_zone: Some(ZONE),
            cluster: &[
                "10.244.1.2:8080",
                "10.244.2.2:8080",
                "10.244.3.2:8080",
                "10.244.4.2:8080",
            ],
            local: &[],
            all_reachable: &[
                "10.244.1.2:8080",
                "10.244.2.2:8080",
                "10.244.3.2:8080",
                "10.244.4.2:8080",
            ],
            has_any: true,
        },
        Case {
            story: "zone hints are ignored when none is for this node's zone",
            service: |s| cluster_ip(s).traffic_distribution("PreferClose"),
            endpoints: zone_hinted,
            node_zone: Some("zone-c"),
            cluster: &["10.244.1.2:8080", "10.244.2.2:8080", "10.244.3.2:8080"],
            local: &[],
            all_reachable: &["10.244.1.2:8080", "10.244.2.2:8080", "10.244.3.2:8080"],
            has_any: true,
        },
        Case {
            story: "zone hints are ignored on a node without a zone label",
            service: |s| cluster_ip(s).traffic_distribution("PreferClose"),
            endpoints: zone_hinted,
            node_zone: None,
            cluster: &["10.244.1.2:8080", "10.244.2.2:8080", "10.244.3.2:8080"],
            local: &[],
            all_reachable: &["10.244.1.2:8080", "10.244.2.2:8080", "10.244.3.2:8080"],
            has_any: true,
        },
        Case {
            story: "zone hints on endpoints that are not ready do not matter",
            service: |s| cluster_ip(s).traffic_distribution("PreferClose"),
            endpoints: |e| {
                zone_hinted(e).endpoint("10.244.4.2", |ep| ep.ready(false).serving(false))
            },
            node_zone: Some(ZONE),
            cluster: &["10.244.1.2:8080", "10.244.3.2:8080"],
            local: &[],
            all_reachable: &["10.244.1.2:8080", "10.244.3.2:8080"],
            has_any: true,
        },
        Case {
            story: "PreferClose without the topology-mode annotation still follows the hints",
            service: cluster_ip,
            endpoints: zone_hinted,
            node_zone: Some(ZONE),
            cluster: &["10.244.1.2:8080", "10.244.3.2:8080"],
            local: &[],
            all_reachable: &["10.244.1.2:8080", "10.244.3.2:8080"],
            has_any: true,
        },
        Case {
            story: "node hints keep cluster traffic on this node with PreferSameNode",
            service: |s| cluster_ip(s).traffic_distribution("PreferSameNode"),
            endpoints: |e| {
                e.endpoint("10.244.1.2", |ep| {
                    ep.ready(true).hints_nodes(&["node-1"]).hints_zones(&["zone-a"])
                })
                .endpoint("10.244.2.2", |ep| {
                    ep.ready(true).hints_nodes(&["node-2"]).hints_zones(&["zone-a"])
                })
            },
            node_zone: Some(ZONE),
            cluster: &["10.244.1.2:8080"],
            local: &[],
            all_reachable: &["10.244.1.2:8080"],
            has_any: true,
        },
        Case {
            story: "without a node hint for this node, PreferSameNode falls back to the zone hints",
            service: |s| cluster_ip(s).traffic_distribution("PreferSameNode"),
            endpoints: |e| {
                e.endpoint("10.244.2.2", |ep| {
                    ep.ready(true).hints_nodes(&["node-2"]).hints_zones(&["zone-a"])
                })
                .endpoint("10.244.3.2", |ep| {
                    ep.ready(true).hints_nodes(&["node-3"]).hints_zones(&["zone-b"])
                })
            },
            node_zone: Some(ZONE),
            cluster: &["10.244.2.2:8080"],
            local: &[],
            all_reachable: &["10.244.2.2:8080"],
            has_any: true,
        },
        Case {
            story: "a local endpoint outside the hinted zone still serves external Local traffic",
            service: |s| node_port(s).external_traffic_policy_local(),
            endpoints: |e| {
                e.endpoint("10.244.1.2", |ep| ep.ready(true).node("node-1").hints_zones(&["zone-b"]))
                    .endpoint("10.244.2.2", |ep| ep.ready(true).node("node-2").hints_zones(&["zone-a"]))
            },
            node_zone: Some(ZONE),
            cluster: &["10.244.2.2:8080"],
            local: &["10.244.1.2:8080"],
            all_reachable: &["10.244.1.2:8080", "10.244.2.2:8080"],
            has_any: true,
        },
    ]
}

/// Endpoints hinted for zone-a (10.244.1.2, 10.244.3.2) and zone-b (10.244.2.2).
fn zone_hinted(e: EndpointSliceBuilder) -> EndpointSliceBuilder {
    e.endpoint("10.244.1.2", |ep| {
        ep.ready(true).zone("zone-a").hints_zones(&["zone-a"])
    })
    .endpoint("10.244.2.2", |ep| {
        ep.ready(true).zone("zone-b").hints_zones(&["zone-b"])
    })
    .endpoint("10.244.3.2", |ep| {
        ep.ready(true).zone("zone-a").hints_zones(&["zone-a"])
    })
}

#[test]
fn categorize_endpoints_tells_every_story() {
    let cases = cases();
    assert!(cases.len() >= 20);
    for case in cases {
        let svc: Service = service("ns1", "svc1", case.service);
        let slice: EndpointSlice = endpoint_slice("ns1", "svc1-abc", "svc1", |e| {
            (case.endpoints)(e.port("p80", 8080, "TCP"))
        });
        let (port_name, service_port) = service_ports_from_service(&svc, IpFamily::V4)
            .unwrap()
            .remove(0);
        let endpoints = endpoints_from_slices(&[slice], IpFamily::V4, NODE)
            .remove(&port_name)
            .unwrap_or_default();
        let labels: BTreeMap<String, String> = case
            .node_zone
            .map(|zone| ("topology.kubernetes.io/zone".to_owned(), zone.to_owned()))
            .into_iter()
            .collect();

        let result = categorize_endpoints(&endpoints, &service_port, NODE, &labels);

        let addresses = |list: &[std::sync::Arc<kp_model::Endpoint>]| -> Vec<String> {
            list.iter().map(ToString::to_string).collect()
        };
        assert_eq!(
            addresses(&result.cluster),
            case.cluster,
            "cluster: {}",
            case.story
        );
        assert_eq!(
            addresses(&result.local),
            case.local,
            "local: {}",
            case.story
        );
        assert_eq!(
            addresses(&result.all_reachable),
            case.all_reachable,
            "all reachable: {}",
            case.story
        );
        assert_eq!(
            result.has_any_endpoints, case.has_any,
            "has any: {}",
            case.story
        );
    }
}
