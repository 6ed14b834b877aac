//! Kernel test: when the kernel refuses one Service's rules, the backend
//! names that Service in its error (traced from the refused message's
//! sequence number to its line), nothing of the transaction is applied,
//! and a sync without that Service programs every other one.
//!
//! The refusal is made by [`kp_nftables::NetlinkApplier::refusing_rules_of`]
//! (valid Services give the kernel nothing to refuse): it encodes the rules
//! of one Service's chains with an expression the kernel does not know;
//! reading the answers and naming the Service is the production path.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web, http 80/TCP | ClusterIP 10.96.0.10, endpoint ep1 |
//! | ns1/fill0 … fill2 | ClusterIPs 10.96.1.0 …, one endpoint each on node-2 (no host) |
//! | ns2/bad, p80 80/TCP | ClusterIP 10.96.0.30, endpoint ep2; its rules are refused |
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kernel;

use kernel::{at, build, pod_ip, require, three_pods, POD_TCP_PORT};
use kp_model::IpFamily;
use kp_testkit::netns::connect;
use kp_testkit::plan;

#[test]
fn a_rule_the_kernel_refuses_names_its_service_and_nothing_is_applied() {
    use kp_sync::Backend;
    require();
    let topology = build(three_pods());
    let web = kernel::web_and_fillers(pod_ip(&topology, "ep1"), 3);
    let mut with_bad = web.clone();
    let (name, state) = kp_sync::testing::service("ns2", "bad", "10.96.0.30", 80)
        .local_endpoint(&pod_ip(&topology, "ep2").to_string(), POD_TCP_PORT)
        .build();
    with_bad.insert(name, state);
    let applier = kp_nftables::NetlinkApplier::new().refusing_rules_of("ns2/bad/");
    let options = kp_nftables::NftablesOptions {
        local_detector: kp_node::LocalDetector::ClusterCidr(vec![plan::POD_CIDR.into()]),
        ..kp_nftables::NftablesOptions::default()
    };
    let mut backend = kp_nftables::NftablesBackend::new(
        IpFamily::V4,
        options,
        kp_node::NodePortAddresses::All,
        Box::new(applier),
    )
    .unwrap()
    .with_layout(kp_nftables::Layout::Chains);
    let node = kernel::node_v4();
    let none = std::collections::BTreeSet::new();
    let stale = kp_sync::StaleConntrack::default();
    let request = |service_ports| kp_sync::SyncRequest {
        family: IpFamily::V4,
        full: true,
        service_ports,
        changed_services: &none,
        node: &node,
        stale_conntrack: &stale,
    };

    let error = topology
        .node()
        .run(|| backend.sync(&request(&with_bad)))
        .unwrap_err();
    match &error {
        kp_sync::BackendError::Rejected { services, .. } => {
            let expected: std::collections::BTreeSet<_> =
                [kp_model::NamespacedName::new("ns2", "bad")].into();
            assert_eq!(services, &expected, "{}", kp_sync::error_chain(&error));
        }
        other => panic!("expected a rejected transaction, got {other:?}"),
    }
    let message = kp_sync::error_chain(&error);
    assert!(
        message.contains("ns2/bad/"),
        "the refused line is named: {message}"
    );
    // The transaction was atomic: nothing of it is in the kernel.
    let listing = topology
        .node()
        .exec("nft", &["list", "table", "ip", "kube-proxy"]);
    assert!(
        !listing.status.success(),
        "the first transaction left no table"
    );

    // Without the refused Service, every other one is programmed.
    topology
        .node()
        .run(|| backend.sync(&request(&web)))
        .unwrap();
    assert_eq!(
        connect(topology.client(), at("10.96.0.10", 80))
            .unwrap()
            .backend,
        "ep1"
    );
}
