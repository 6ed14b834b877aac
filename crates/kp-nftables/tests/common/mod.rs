//! Story-style builders shared by the integration tests.
//!
//! Address plan (kp_testkit::plan): pods 10.244.0.0/16 (this node's
//! 10.244.1.0/24), ClusterIPs 10.96.0.0/16, node 192.168.99.2, client
//! 192.168.99.10, external and load balancer IPs 203.0.113.0/24; IPv6 pods
//! fd00:10:244::/48, services fd00:10:96::/112, node fd00:192:168:99::2.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kp_model::{IpFamily, NamespacedName, NodeInfo, ServicePortName};
use kp_nftables::tracer::{Packet, Table, Verdict};
use kp_nftables::{FakeApplier, NftablesBackend, NftablesOptions};
use kp_node::{LocalDetector, NodePortAddresses};
use kp_sync::{Backend, ServicePortState, StaleConntrack, SyncOutcome, SyncRequest};
use kp_testkit::plan;

/// Parses an address of the plan.
pub fn ip(text: &str) -> IpAddr {
    text.parse().expect("test address")
}

/// `ip:port`.
pub fn at(text: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip(text), port)
}

pub use kp_sync::testing::{service, ServiceBuilder};

/// A node, its Services and a backend over a fake applier; every sync's
/// transaction is replayed on a tracer table.
pub struct World {
    pub family: IpFamily,
    pub services: BTreeMap<ServicePortName, ServicePortState>,
    pub node: NodeInfo,
    pub backend: NftablesBackend,
    pub applier: FakeApplier,
    pub table: Table,
    pub clock: Arc<Mutex<Instant>>,
    /// Transactions the applier had received when the last sync started.
    pub last_sync_start: usize,
}

impl World {
    /// An IPv4 node (192.168.99.2) with the ClusterCIDR detector for
    /// 10.244.0.0/16, NodePorts on every local address.
    pub fn v4() -> Self {
        Self::with(IpFamily::V4, NodePortAddresses::All)
    }

    /// Like [`World::v4`], for `family` and `node_ports`.
    pub fn with(family: IpFamily, node_ports: NodePortAddresses) -> Self {
        let options = NftablesOptions {
            local_detector: LocalDetector::ClusterCidr(vec![
                plan::POD_CIDR.into(),
                plan::POD_CIDR_V6.into(),
            ]),
            ..NftablesOptions::default()
        };
        let applier = FakeApplier::new();
        let clock = Arc::new(Mutex::new(Instant::now()));
        let shared = Arc::clone(&clock);
        // The chains layout unless `with_layout` says otherwise: the tests
        // of this world were written for it; the data layout has its own.
        let backend = NftablesBackend::new(family, options, node_ports, Box::new(applier.clone()))
            .unwrap()
            .with_layout(kp_nftables::Layout::Chains)
            .with_local_addresses(|_| Ok(Vec::new()))
            .with_clock(move || *shared.lock().unwrap());
        Self {
            family,
            services: BTreeMap::new(),
            node: NodeInfo {
                name: plan::NODE_NAME.to_owned(),
                addresses: vec![IpAddr::V4(plan::NODE_IP), IpAddr::V6(plan::NODE_IP_V6)],
                pod_cidrs: vec![plan::NODE_POD_CIDR.into()],
                ..NodeInfo::default()
            },
            backend,
            applier,
            table: Table::new(),
            clock,
            last_sync_start: 0,
        }
    }

    /// Makes the fake applier keep a ruleset generation, as the kernel does.
    pub fn with_generations(self) -> Self {
        let _ = self.applier.clone().with_generations();
        self
    }

    /// Makes the fake applier send commit notifications to a watch too.
    pub fn with_watch(self) -> Self {
        let _ = self.applier.clone().with_generations().with_watch();
        self
    }

    /// Writes the table in `layout`.
    pub fn with_layout(mut self, layout: kp_nftables::Layout) -> Self {
        self.backend = self.backend.with_layout(layout);
        self
    }

    /// Like [`World::v4`], in the data layout.
    pub fn v4_data() -> Self {
        Self::v4().with_layout(kp_nftables::Layout::Data)
    }

    /// Splits full syncs into transactions of about `bytes` of Service
    /// chain text each.
    pub fn split_at(mut self, bytes: usize) -> Self {
        self.backend = self.backend.with_transaction_text_max(bytes);
        self
    }

    /// Adds or replaces a service port.
    pub fn put(&mut self, builder: ServiceBuilder) -> &mut Self {
        let (name, state) = builder.build();
        self.services.insert(name, state);
        self
    }

    /// Removes every port of `ns/name`.
    pub fn remove(&mut self, namespace: &str, name: &str) -> &mut Self {
        let service = NamespacedName::new(namespace, name);
        self.services.retain(|port, _| port.service != service);
        self
    }

    /// Moves the clock on.
    pub fn advance(&mut self, by: Duration) {
        *self.clock.lock().unwrap() += by;
    }

    /// Syncs (full or partial, with `changed` Services) and replays its
    /// transactions (a stale-chain cleanup may come first) on the tracer
    /// table. Returns the text of the sync's own, the last.
    pub fn sync(&mut self, full: bool, changed: &[(&str, &str)]) -> String {
        let changed: BTreeSet<NamespacedName> = changed
            .iter()
            .map(|(ns, name)| NamespacedName::new(ns, name))
            .collect();
        let outcome = self.try_sync(full, &changed).unwrap();
        assert_eq!(outcome.full, full || outcome.full);
        let transactions = self.applier.transactions();
        for transaction in &transactions[self.last_sync_start..] {
            self.table.apply(&transaction.transaction).unwrap();
        }
        transactions.last().unwrap().text.clone()
    }

    /// The stale-chain cleanup transaction of the last sync, if it sent
    /// one (it comes first, before the sync's own).
    pub fn cleanup_of_last_sync(&self) -> Option<String> {
        let transactions = self.applier.transactions();
        let first = &transactions[self.last_sync_start..];
        match first {
            [cleanup, _, ..] if cleanup.text.contains("delete chain") => Some(cleanup.text.clone()),
            _ => None,
        }
    }

    /// One sync through the backend.
    pub fn try_sync(
        &mut self,
        full: bool,
        changed: &BTreeSet<NamespacedName>,
    ) -> Result<SyncOutcome, kp_sync::BackendError> {
        self.last_sync_start = self.applier.transactions().len();
        let stale = StaleConntrack::default();
        let request = SyncRequest {
            family: self.family,
            full,
            service_ports: &self.services,
            changed_services: changed,
            node: &self.node,
            stale_conntrack: &stale,
        };
        self.backend.sync(&request)
    }

    /// Traces a TCP connection from `src` to `dst`.
    pub fn trace(&self, src: &str, dst: SocketAddr) -> Verdict {
        self.trace_packet(packet(src, dst, "tcp"))
    }

    /// Traces `packet`.
    pub fn trace_packet(&self, packet: Packet) -> Verdict {
        self.table.trace(&packet).unwrap()
    }
}

/// A packet from `src` to `dst`; the node's own addresses count as local.
pub fn packet(src: &str, dst: SocketAddr, protocol: &'static str) -> Packet {
    let node = [IpAddr::V4(plan::NODE_IP), IpAddr::V6(plan::NODE_IP_V6)];
    let src = ip(src);
    Packet {
        src,
        dst: dst.ip(),
        protocol,
        dport: dst.port(),
        src_local: node.contains(&src),
        dst_local: node.contains(&dst.ip()),
    }
}

/// DNAT to exactly `endpoints`.
#[track_caller]
pub fn assert_goes_to(verdict: &Verdict, endpoints: &[SocketAddr]) {
    match verdict {
        Verdict::Dnat { endpoints: got, .. } => {
            let want: BTreeSet<SocketAddr> = endpoints.iter().copied().collect();
            assert_eq!(got, &want, "endpoints");
        }
        other => panic!("expected DNAT to {endpoints:?}, got {other:?}"),
    }
}
