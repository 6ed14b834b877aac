//! Story-style builders shared by the integration tests.
//!
//! Address plan (kp_testkit::plan): pods 10.244.0.0/16 (this node's
//! 10.244.1.0/24), ClusterIPs 10.96.0.0/16, node 192.168.99.2, client
//! 192.168.99.10, external and load balancer IPs 203.0.113.0/24; IPv6 pods
//! fd00:10:244::/48, services fd00:10:96::/112, node fd00:192:168:99::2.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use kp_iptables::tracer::{Packet, Ruleset, Trace};
use kp_iptables::{IptablesOptions, LocalDetector, NatChains, RenderInput, Rendered, Renderer};
use kp_model::{
    categorize_endpoints, Endpoint, IpFamily, NamespacedName, NodeInfo, Protocol, ServicePort,
    ServicePortName,
};
use kp_sync::ServicePortState;
use kp_testkit::plan;

/// Parses an address of the plan.
pub fn ip(text: &str) -> IpAddr {
    text.parse().expect("test address")
}

/// A service port under construction; see [`service`].
#[derive(Debug, Clone)]
pub struct ServiceBuilder {
    name: ServicePortName,
    port: ServicePort,
    endpoints: Vec<Endpoint>,
}

/// Service port `ns/name:p<port>` (TCP) at `cluster_ip:port`, no endpoints.
pub fn service(namespace: &str, name: &str, cluster_ip: &str, port: u16) -> ServiceBuilder {
    ServiceBuilder {
        name: ServicePortName {
            service: NamespacedName {
                namespace: namespace.into(),
                name: name.into(),
            },
            port: format!("p{port}").into(),
            protocol: Protocol::Tcp,
        },
        port: ServicePort {
            cluster_ip: ip(cluster_ip),
            port,
            protocol: Protocol::Tcp,
            node_port: None,
            external_ips: Vec::new(),
            load_balancer_ips: Vec::new(),
            load_balancer_source_ranges: Vec::new(),
            session_affinity_timeout: None,
            external_policy_local: false,
            internal_policy_local: false,
            health_check_node_port: None,
            traffic_distribution: None,
            topology_mode: None,
        },
        endpoints: Vec::new(),
    }
}

impl ServiceBuilder {
    pub fn protocol(mut self, protocol: Protocol) -> Self {
        self.name.protocol = protocol;
        self.port.protocol = protocol;
        self
    }
    pub fn unnamed_port(mut self) -> Self {
        self.name.port = "".into();
        self
    }
    pub fn node_port(mut self, port: u16) -> Self {
        self.port.node_port = Some(port);
        self
    }
    pub fn external_ip(mut self, address: &str) -> Self {
        self.port.external_ips.push(ip(address));
        self
    }
    pub fn lb_ip(mut self, address: &str) -> Self {
        self.port.load_balancer_ips.push(ip(address));
        self
    }
    pub fn source_range(mut self, cidr: &str) -> Self {
        self.port
            .load_balancer_source_ranges
            .push(cidr.parse().unwrap());
        self
    }
    pub fn affinity_secs(mut self, seconds: u64) -> Self {
        self.port.session_affinity_timeout = Some(Duration::from_secs(seconds));
        self
    }
    pub fn etp_local(mut self) -> Self {
        self.port.external_policy_local = true;
        self
    }
    pub fn itp_local(mut self) -> Self {
        self.port.internal_policy_local = true;
        self
    }
    pub fn health_check_node_port(mut self, port: u16) -> Self {
        self.port.health_check_node_port = Some(port);
        self
    }
    /// A ready endpoint on this node.
    pub fn local_endpoint(self, address: &str, port: u16) -> Self {
        self.with_endpoint(address, port, true, true, false)
    }
    /// A ready endpoint on another node.
    pub fn remote_endpoint(self, address: &str, port: u16) -> Self {
        self.with_endpoint(address, port, false, true, false)
    }
    /// A terminating endpoint that still serves.
    pub fn terminating_endpoint(self, address: &str, port: u16, local: bool) -> Self {
        self.with_endpoint(address, port, local, false, true)
    }

    fn with_endpoint(
        mut self,
        address: &str,
        port: u16,
        local: bool,
        ready: bool,
        terminating: bool,
    ) -> Self {
        let node = if local {
            plan::NODE_NAME
        } else {
            plan::OTHER_NODE_NAME
        };
        self.endpoints.push(Endpoint {
            ip: ip(address),
            port,
            ready,
            serving: true,
            terminating,
            is_local: local,
            node_name: Some(node.into()),
            zone: None,
            zone_hints: None,
            node_hints: None,
        });
        self
    }

    pub fn name(&self) -> &ServicePortName {
        &self.name
    }

    /// The service port with its endpoints categorized by
    /// `kp_model::categorize_endpoints` for this node, as the sync loop does.
    pub fn build(mut self) -> (ServicePortName, ServicePortState) {
        self.endpoints.sort_by_key(|e| (e.ip, e.port));
        self.endpoints.dedup_by_key(|e| (e.ip, e.port));
        let all_endpoints: Vec<Arc<Endpoint>> = self.endpoints.into_iter().map(Arc::new).collect();
        let endpoints = categorize_endpoints(
            &all_endpoints,
            &self.port,
            plan::NODE_NAME,
            &BTreeMap::new(),
        );
        (
            self.name,
            ServicePortState {
                port: Arc::new(self.port),
                endpoints,
                all_endpoints,
            },
        )
    }
}

/// One node, its services and the renderer settings: what a test renders.
#[derive(Debug, Clone)]
pub struct World {
    pub family: IpFamily,
    pub services: BTreeMap<ServicePortName, ServicePortState>,
    pub node: NodeInfo,
    pub node_port_addresses: Option<Vec<IpAddr>>,
    pub options: IptablesOptions,
}

impl World {
    /// An IPv4 node (192.168.99.2) with the ClusterCIDR detector for
    /// 10.244.0.0/16 and upstream's defaults otherwise.
    pub fn v4() -> World {
        World {
            family: IpFamily::V4,
            services: BTreeMap::new(),
            node: NodeInfo {
                name: plan::NODE_NAME.to_owned(),
                addresses: vec![IpAddr::V4(plan::NODE_IP)],
                pod_cidrs: vec![plan::NODE_POD_CIDR.into()],
                ..NodeInfo::default()
            },
            node_port_addresses: None,
            options: IptablesOptions {
                local_detector: LocalDetector::ClusterCidr(vec![plan::POD_CIDR.into()]),
                ..IptablesOptions::default()
            },
        }
    }

    /// An IPv6 node (fd00:192:168:99::2), ClusterCIDR detector fd00:10:244::/48.
    pub fn v6() -> World {
        let mut world = World::v4();
        world.family = IpFamily::V6;
        world.node.addresses = vec![IpAddr::V6(plan::NODE_IP_V6)];
        world.node.pod_cidrs = vec![plan::NODE_POD_CIDR_V6.into()];
        world.options.local_detector = LocalDetector::ClusterCidr(vec![plan::POD_CIDR_V6.into()]);
        world
    }

    pub fn with(mut self, service: ServiceBuilder) -> Self {
        let (name, state) = service.build();
        self.services.insert(name, state);
        self
    }

    pub fn options(mut self, change: impl FnOnce(&mut IptablesOptions)) -> Self {
        change(&mut self.options);
        self
    }

    /// A full render with a fresh renderer.
    pub fn render(&self) -> Rendered {
        let mut renderer = Renderer::new(self.options.clone()).expect("valid options");
        self.render_with(&mut renderer, true, &BTreeSet::new(), None)
    }

    pub fn render_with(
        &self,
        renderer: &mut Renderer,
        full: bool,
        changed: &BTreeSet<NamespacedName>,
        existing: Option<&[String]>,
    ) -> Rendered {
        renderer.render(&RenderInput {
            family: self.family,
            full,
            service_ports: &self.services,
            changed_services: changed,
            node: &self.node,
            node_port_addresses: self.node_port_addresses.as_deref(),
            existing_nat_chains: existing.map_or(NatChains::Unknown, NatChains::Listed),
            jumps: &[],
        })
    }

    /// The node's addresses, as the tracer's local addresses.
    pub fn local_ips(&self) -> Vec<IpAddr> {
        self.node.addresses.clone()
    }

    /// Renders, loads the rules with the jump rules, checks every jump has
    /// a target, and traces `packet`.
    pub fn trace(&self, packet: &Packet) -> Trace {
        let ruleset = ruleset(&self.render());
        ruleset.trace(packet, &self.local_ips())
    }
}

/// The ruleset a clean host holds after applying `rendered`.
pub fn ruleset(rendered: &Rendered) -> Ruleset {
    let ruleset = Ruleset::from_restore(&rendered.restore)
        .and_then(Ruleset::with_jump_rules)
        .unwrap_or_else(|e| panic!("{e}\n{}", rendered.restore));
    ruleset
        .check_jumps()
        .unwrap_or_else(|e| panic!("{e}\n{}", rendered.restore));
    ruleset
}

pub fn namespaced(namespace: &str, name: &str) -> NamespacedName {
    NamespacedName {
        namespace: namespace.into(),
        name: name.into(),
    }
}
