//! Story-style builders shared by the integration tests.
//!
//! Address plan (kp_testkit::plan): pods 10.244.0.0/16 (this node's
//! 10.244.1.0/24), ClusterIPs 10.96.0.0/16, node 192.168.99.2, client
//! 192.168.99.10, external and load balancer IPs 203.0.113.0/24; IPv6 pods
//! fd00:10:244::/48, services fd00:10:96::/112, node fd00:192:168:99::2.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use kp_iptables::tracer::{Packet, Ruleset, Trace};
use kp_iptables::{
    IptablesOptions, ListedChains, LocalDetector, NatChains, RenderInput, Rendered, Renderer,
    RestoreSink,
};
use kp_model::{IpFamily, NamespacedName, NodeInfo, ServicePortName};
use kp_sync::ServicePortState;
use kp_testkit::plan;

/// Parses an address of the plan.
pub fn ip(text: &str) -> IpAddr {
    text.parse().expect("test address")
}

pub use kp_sync::testing::{service, ServiceBuilder};

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
        let listed = existing.map(|names| ListedChains::from_listing(names.to_vec()));
        let input = RenderInput {
            family: self.family,
            full,
            service_ports: &self.services,
            changed_services: changed,
            node: &self.node,
            node_port_addresses: self.node_port_addresses.as_deref(),
            existing_nat_chains: listed
                .as_ref()
                .map_or(NatChains::Unknown, NatChains::Listed),
            jumps: &[],
        };
        render_both_ways(renderer, &input)
    }

    /// The node's addresses, as the tracer's local addresses.
    pub fn local_ips(&self) -> Vec<IpAddr> {
        self.node.addresses.clone()
    }

    /// Renders, loads the rules with the jump rules, checks every jump has
    /// a target, and traces `packet`.
    pub fn trace(&self, packet: &Packet) -> Trace {
        let ruleset = ruleset(&self.render());
        ruleset
            .trace(packet, &self.local_ips())
            .unwrap_or_else(|error| panic!("trace of {packet:?}: {error}"))
    }
}

/// Renders `input` streamed (first, so that it meets the renderer's caches
/// as they were) and whole, and checks that both give the same text and
/// the same result otherwise: every test that renders checks the streamed
/// render that full syncs use against the whole one.
pub fn render_both_ways(renderer: &mut Renderer, input: &RenderInput<'_>) -> Rendered {
    let mut pieces = Pieces::default();
    let streamed = renderer
        .render_streamed(input, &mut pieces)
        .expect("collecting pieces cannot fail");
    let whole = renderer.render(input);
    pretty_assertions::assert_str_eq!(whole.restore, pieces.text, "streamed text");
    assert!(streamed.restore.is_empty());
    assert_eq!(
        Rendered {
            restore: whole.restore.clone(),
            ..streamed
        },
        whole,
        "streamed render's result"
    );
    whole
}

/// The pieces of a streamed render, joined; each must be whole lines.
#[derive(Default)]
pub struct Pieces {
    pub text: String,
    pub count: usize,
}

impl RestoreSink for Pieces {
    fn write_lines(&mut self, lines: &str) -> std::io::Result<()> {
        assert!(
            lines.is_empty() || lines.ends_with('\n'),
            "a piece of whole lines"
        );
        self.text.push_str(lines);
        self.count += 1;
        Ok(())
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
