#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

#[test]
fn a_load_balancer_service_carries_every_field_asked_for() {
    let svc = service("ns1", "svc1", |s| {
        s.cluster_ip("10.96.0.41")
            .port("p80", 80, "TCP")
            .node_port(30080)
            .target_port(8080)
            .external_ip("203.0.113.5")
            .lb_ingress_ip("203.0.113.9")
            .lb_ingress_ip_mode("203.0.113.10", "Proxy")
            .lb_source_range("192.168.99.10/32")
            .session_affinity_client_ip(600)
            .external_traffic_policy_local()
            .health_check_node_port(30500)
            .internal_traffic_policy_local()
            .service_type("LoadBalancer")
            .label("app", "web")
            .annotation("service.kubernetes.io/topology-mode", "Auto")
            .traffic_distribution("PreferClose")
            .ip_families(&["IPv4"])
    });

    assert_eq!(svc.metadata.namespace.as_deref(), Some("ns1"));
    assert_eq!(svc.metadata.name.as_deref(), Some("svc1"));
    assert_eq!(svc.metadata.labels.unwrap()["app"], "web");
    let spec = svc.spec.unwrap();
    assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
    assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.41"));
    assert_eq!(spec.cluster_ips.unwrap(), vec!["10.96.0.41"]);
    let port = &spec.ports.unwrap()[0];
    assert_eq!(port.name.as_deref(), Some("p80"));
    assert_eq!((port.port, port.node_port), (80, Some(30080)));
    assert_eq!(port.target_port, Some(IntOrString::Int(8080)));
    assert_eq!(spec.external_ips.unwrap(), vec!["203.0.113.5"]);
    assert_eq!(
        spec.load_balancer_source_ranges.unwrap(),
        vec!["192.168.99.10/32"]
    );
    let timeout = spec.session_affinity_config.unwrap().client_ip.unwrap();
    assert_eq!(timeout.timeout_seconds, Some(600));
    assert_eq!(spec.external_traffic_policy.as_deref(), Some("Local"));
    assert_eq!(spec.internal_traffic_policy.as_deref(), Some("Local"));
    assert_eq!(spec.health_check_node_port, Some(30500));
    assert_eq!(spec.traffic_distribution.as_deref(), Some("PreferClose"));
    let ingress = svc.status.unwrap().load_balancer.unwrap().ingress.unwrap();
    assert_eq!(ingress[0].ip.as_deref(), Some("203.0.113.9"));
    assert_eq!(ingress[1].ip_mode.as_deref(), Some("Proxy"));
}

#[test]
fn an_unnamed_port_without_protocol_leaves_both_unset() {
    let svc = service("ns1", "svc1", |s| {
        s.cluster_ip("10.96.0.41").port("", 53, "")
    });
    let port = &svc.spec.unwrap().ports.unwrap()[0];
    assert_eq!((port.name.as_ref(), port.protocol.as_ref()), (None, None));
}

#[test]
fn a_dual_stack_service_has_its_first_cluster_ip_as_cluster_ip() {
    let svc = service("ns1", "svc1", |s| {
        s.cluster_ips(&["fd00:10:96::41", "10.96.0.41"])
    });
    let spec = svc.spec.unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("fd00:10:96::41"));
    assert_eq!(spec.cluster_ips.unwrap().len(), 2);
}

#[test]
fn an_endpoint_slice_names_its_service_and_only_sets_conditions_asked_for() {
    let slice = endpoint_slice("ns1", "svc1-abc", "svc1", |e| {
        e.port("p80", 80, "TCP")
            .endpoint("10.244.1.2", |ep| {
                ep.ready(true)
                    .serving(true)
                    .terminating(false)
                    .node("node-1")
                    .zone("zone-a")
                    .hints_zones(&["zone-a"])
                    .hints_nodes(&["node-1"])
            })
            .endpoint("10.244.2.2", |ep| ep)
    });

    assert_eq!(slice.address_type, "IPv4");
    assert_eq!(
        slice.metadata.labels.unwrap()["kubernetes.io/service-name"],
        "svc1"
    );
    let first = &slice.endpoints[0];
    let conditions = first.conditions.as_ref().unwrap();
    assert_eq!(conditions.ready, Some(true));
    assert_eq!(conditions.terminating, Some(false));
    assert_eq!(first.node_name.as_deref(), Some("node-1"));
    let hints = first.hints.as_ref().unwrap();
    assert_eq!(hints.for_zones.as_ref().unwrap()[0].name, "zone-a");
    assert_eq!(hints.for_nodes.as_ref().unwrap()[0].name, "node-1");
    assert!(slice.endpoints[1].conditions.is_none());
}

#[test]
fn a_node_has_labels_addresses_pod_cidrs_and_taints() {
    let node = node("node-1", |n| {
        n.zone("zone-a")
            .internal_ip("192.168.99.2")
            .external_ip("203.0.113.2")
            .pod_cidr("10.244.1.0/24")
            .pod_cidr("fd00:10:244:1::/64")
            .taint("ToBeDeletedByClusterAutoscaler", "NoSchedule")
    });

    assert_eq!(
        node.metadata.labels.unwrap()["topology.kubernetes.io/zone"],
        "zone-a"
    );
    let addresses = node.status.unwrap().addresses.unwrap();
    assert_eq!(addresses[0].type_, "InternalIP");
    assert_eq!(addresses[1].address, "203.0.113.2");
    let spec = node.spec.unwrap();
    assert_eq!(spec.pod_cidr.as_deref(), Some("10.244.1.0/24"));
    assert_eq!(spec.pod_cidrs.unwrap().len(), 2);
    assert_eq!(
        spec.taints.unwrap()[0].key,
        "ToBeDeletedByClusterAutoscaler"
    );
}
