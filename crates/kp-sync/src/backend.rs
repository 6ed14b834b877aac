//! The trait every data-plane mode (iptables, nftables, ipvs, userspace)
//! implements, and what the sync loop hands it.

use std::collections::{BTreeMap, BTreeSet};
use std::error::Error;
use std::net::IpAddr;
use std::sync::Arc;

use kp_model::{
    categorize_endpoints_with, CategorizedEndpoints, Endpoint, IpFamily, NamespacedName, NodeInfo,
    ServicePort, ServicePortName, TopologyOptions, TrafficPlan,
};

/// Renders and applies the proxy rules of one IP family.
///
/// The sync loop calls [`sync`](Backend::sync) with an already categorized
/// view of every service port. An implementation renders its whole ruleset
/// (or, for a partial sync, the part for `changed_services`) and applies it
/// in one atomic step per kernel table (the kernel has no transaction that
/// spans iptables tables), only in chains or tables it owns, so a process
/// killed at any point leaves every table as it was before or after the
/// sync, and the full sync of the next start repairs the rest. An error
/// makes the sync loop retry with a full sync.
pub trait Backend: Send {
    /// The mode's name as `--proxy-mode` spells it (`iptables`, `nftables`,
    /// `ipvs`, `userspace`); used in logs, metrics and `/proxyMode`.
    fn mode(&self) -> &'static str;

    /// Renders and applies the rules for `request`.
    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncOutcome, BackendError>;

    /// The kernel was found holding rules that differ from what this
    /// backend applied (the proxy's state check), so no record of earlier
    /// syncs may be trusted: the sync loop calls this before the full sync
    /// that repairs it. A backend whose full sync always rewrites its
    /// rules, or starts from the kernel's state, has nothing to forget;
    /// one that leaves out what it believes the kernel already holds
    /// must forget that belief here.
    fn distrust_kernel(&mut self) {}
}

/// Everything a backend needs for one sync.
#[derive(Debug, Clone, Copy)]
pub struct SyncRequest<'a> {
    /// The family this sync is for; every service port and endpoint below
    /// belongs to it (the node's addresses are those of both families).
    pub family: IpFamily,
    /// True for a full sync: rewrite everything and remove whatever is not in
    /// `service_ports`. False for a partial sync: only the Services in
    /// `changed_services` differ from the previous successful sync.
    pub full: bool,
    /// Every service port, sorted by name so rendering is deterministic.
    pub service_ports: &'a BTreeMap<ServicePortName, ServicePortState>,
    /// Services whose service ports or categorized endpoints may differ
    /// from those of the previous successful sync, for a full sync as for
    /// a partial one: after a new node or the first sync, every Service
    /// (and every Service the last sync had); Services left out because
    /// the kernel refused their rules are among them when they leave.
    /// A backend that knows its kernel state is what the previous
    /// successful sync left can render only these in a full sync too.
    pub changed_services: &'a BTreeSet<NamespacedName>,
    /// The proxy's own Node.
    pub node: &'a NodeInfo,
    /// Conntrack entries that the changes behind this sync made stale.
    pub stale_conntrack: &'a StaleConntrack,
}

/// One service port with its endpoints and every decision about its
/// traffic, made once per sync for every mode and the agent: a backend
/// only renders it.
#[derive(Debug, Clone, PartialEq)]
pub struct ServicePortState {
    /// The service port.
    pub port: Arc<ServicePort>,
    /// Its endpoints split by traffic policy and topology
    /// ([`kp_model::categorize_endpoints`] for this node).
    pub endpoints: CategorizedEndpoints,
    /// Every endpoint of the service port, sorted by (ip, port), whether
    /// usable or not.
    pub all_endpoints: Vec<Arc<Endpoint>>,
    /// Where each kind of traffic goes, and whether the node's own address
    /// passes the source ranges.
    pub plan: TrafficPlan,
}

impl ServicePortState {
    /// `port` with `all_endpoints` (sorted by (ip, port)), categorized and
    /// planned for `node` in `family`, as the sync loop does.
    pub fn new(
        port: Arc<ServicePort>,
        all_endpoints: Vec<Arc<Endpoint>>,
        node: &NodeInfo,
        family: IpFamily,
        topology: TopologyOptions,
    ) -> Self {
        let endpoints =
            categorize_endpoints_with(&all_endpoints, &port, &node.name, &node.labels, topology);
        let plan = TrafficPlan::new(&port, &endpoints, node.addresses_of(family).next());
        Self {
            port,
            endpoints,
            all_endpoints,
            plan,
        }
    }
}

/// What the changes behind a sync removed that the conntrack cleaner cannot
/// see in the synced state itself. Everything else it decides from the
/// state: which endpoints each frontend of a UDP or SCTP service port uses
/// now.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StaleConntrack {
    /// ClusterIPs of removed UDP and SCTP service ports
    /// (`conntrack -D -p udp --orig-dst IP`).
    pub deleted_cluster_ips: BTreeSet<IpAddr>,
}

/// What a backend reports about a successful sync, for logs and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncOutcome {
    /// Whether the backend rewrote everything (it may do a full sync when a
    /// partial one was asked for, never the other way round).
    pub full: bool,
    /// Rules per table after the sync, e.g. `("nat", 1234)`
    /// (`kubeproxy_sync_proxy_rules_iptables_total{table}`).
    pub rules_per_table: Vec<(String, usize)>,
    /// Chains per table after the sync, e.g. `("nat", 321)`.
    pub chains_per_table: Vec<(String, usize)>,
    /// Rules per table that this sync wrote, e.g. `("nat", 12)` for a
    /// partial sync that rewrote one Service's chains
    /// (`kubeproxy_sync_proxy_rules_iptables_last{table}`).
    pub rules_written_per_table: Vec<(String, usize)>,
    /// Rules, chains, set elements or listeners written by this sync.
    pub objects_written: usize,
    /// Cleanup steps of their own that failed in this otherwise successful
    /// sync: the nftables mode deletes stale chains in a transaction apart
    /// from the rules, as upstream does, and a failure there leaves them for
    /// a later sync (`kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total`).
    pub cleanup_failures: usize,
}

/// A backend could not sync.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The state cannot be expressed by this backend (a bug, or an input the
    /// sync loop should have filtered out).
    #[error("{mode} backend: rendering the rules failed: {reason}")]
    Render {
        /// The backend's [`Backend::mode`].
        mode: &'static str,
        /// What could not be rendered, naming the service port.
        reason: String,
    },
    /// The mode cannot run on this host as it is: a program or kernel
    /// feature it needs is missing. Retrying cannot help until the operator
    /// installs it, so the proxy reports itself unhealthy at once and says
    /// so once, instead of on every retry.
    #[error("{mode} mode cannot run on this host: {missing}; {remedy}")]
    Unavailable {
        /// The backend's [`Backend::mode`].
        mode: &'static str,
        /// What is missing, e.g. `program iptables-restore not found`.
        missing: String,
        /// What makes it available, e.g. `install the iptables package
        /// (apt-get install iptables)`.
        remedy: String,
    },
    /// The kernel refused the rule set as a whole (an `iptables-restore`
    /// input, an nftables transaction), so none of it was applied. Upstream
    /// counts exactly these in its failure counters
    /// (`kubeproxy_sync_proxy_rules_iptables_restore_failures_total`,
    /// `kubeproxy_sync_proxy_rules_nftables_sync_failures_total`).
    #[error("{mode} backend: {attempted} failed{}", refused_services(services))]
    Rejected {
        /// The backend's [`Backend::mode`].
        mode: &'static str,
        /// What was attempted, naming the rejected line where known, e.g.
        /// `applying the rules with iptables-restore (line 12: -A …)`.
        attempted: String,
        /// The Services whose rules the kernel refused, where the backend
        /// can tell (the rejected line or message belongs to them); empty
        /// when it cannot. The sync loop leaves these Services out of the
        /// following syncs until they change, so that one Service the
        /// kernel refuses does not keep every other one from being
        /// programmed.
        services: BTreeSet<NamespacedName>,
        /// The cause.
        #[source]
        source: Box<dyn Error + Send + Sync>,
    },
    /// Another step of applying the rendered state to the kernel failed (a
    /// sysctl, a listing, an IPVS or ipset request, a listener).
    #[error("{mode} backend: {attempted} failed")]
    Apply {
        /// The backend's [`Backend::mode`].
        mode: &'static str,
        /// What was attempted, e.g. `running iptables-restore for table nat`.
        attempted: String,
        /// The cause.
        #[source]
        source: Box<dyn Error + Send + Sync>,
    },
}

impl StaleConntrack {
    /// True when there is nothing to clean up.
    pub fn is_empty(&self) -> bool {
        self.deleted_cluster_ips.is_empty()
    }

    /// Adds `other`'s entries to these (used when a failed sync hands its
    /// entries on to the next one).
    pub fn merge(&mut self, other: StaleConntrack) {
        self.deleted_cluster_ips.extend(other.deleted_cluster_ips);
    }
}

impl BackendError {
    /// The same failure as a refused rule set: an [`Apply`](Self::Apply)
    /// of the step that hands the whole rule set to the kernel becomes
    /// [`Rejected`](Self::Rejected); other kinds stay as they are.
    pub fn rejected(self) -> Self {
        match self {
            Self::Apply {
                mode,
                attempted,
                source,
            } => Self::Rejected {
                mode,
                attempted,
                services: BTreeSet::new(),
                source,
            },
            other => other,
        }
    }

    /// The mode of the backend that failed.
    pub fn mode(&self) -> &'static str {
        match self {
            Self::Render { mode, .. }
            | Self::Rejected { mode, .. }
            | Self::Apply { mode, .. }
            | Self::Unavailable { mode, .. } => mode,
        }
    }
}

/// `: the kernel refused the rules of Service ns/a, ns/b`, or nothing when
/// no Service is named.
fn refused_services(services: &BTreeSet<NamespacedName>) -> String {
    if services.is_empty() {
        return String::new();
    }
    let names: Vec<String> = services.iter().map(ToString::to_string).collect();
    let noun = if names.len() == 1 {
        "Service"
    } else {
        "Services"
    };
    format!(
        " (the kernel refused the rules of {noun} {})",
        names.join(", ")
    )
}
