//! Conntrack duties of kube-proxy-rs.
//!
//! - At start, [`apply_conntrack_sysctls`] sets the conntrack sysctls of the
//!   `conntrack` section of the configuration (`nf_conntrack_max` and the
//!   hash size, TCP and UDP timeouts, `tcp_be_liberal`), like upstream's
//!   `SetSysctls`; failures are logged and reported, never fatal.
//! - After syncs, a [`ConntrackCleaner`] per IP family, attached to that
//!   family's `kp_sync::Proxier` as a [`kp_sync::SyncObserver`], deletes the
//!   UDP and SCTP conntrack entries that still send clients to endpoints the
//!   Service no longer uses (upstream's conntrack reconciler), through ctnetlink
//!   ([`NetlinkConntrack`]). Its [`ConntrackMetrics`] are upstream's
//!   `kubeproxy_conntrack_reconciler_*` metrics.
//! - For the userspace mode's relay, [`NetlinkConntrack::for_lookups`]
//!   answers where a redirected UDP datagram was sent
//!   ([`NetlinkConntrack::udp_original_destination`]): the one ctnetlink
//!   client of the project serves both.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use kp_model::IpFamily;
//! # fn wire(config: &kp_config::KubeProxyConfiguration,
//! #         registry: &mut prometheus_client::registry::Registry,
//! #         proxier: kp_sync::Proxier) -> kp_sync::Proxier {
//! let report = kp_conntrack::apply_conntrack_sysctls(&config.conntrack);
//! let metrics = kp_conntrack::ConntrackMetrics::new();
//! metrics.register(registry);
//! let cleaner = kp_conntrack::ConntrackCleaner::new(IpFamily::V4, metrics.clone());
//! proxier.with_observer(Arc::new(cleaner))
//! # }
//! ```

mod cleaner;
mod flow;
mod metrics;
mod netlink;
mod stale;
mod sysctls;
mod table;
#[cfg(test)]
mod test_state;

pub use cleaner::{CleanupReport, ConntrackCleaner};
pub use flow::{Flow, FlowTuple, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP};
pub use metrics::{ConntrackMetrics, DELETED_ENTRIES_METRIC, SYNC_DURATION_METRIC};
pub use netlink::NetlinkConntrack;
pub use stale::{stale_flows, sync_may_leave_stale_flows};
pub use sysctls::{
    apply_conntrack_sysctls, apply_sysctls, conntrack_max, SysctlError, SysctlPaths, SysctlReport,
};
#[cfg(test)]
pub use table::FakeConntrack;
pub use table::{ConntrackError, ConntrackTable, Deletion, Listing};
