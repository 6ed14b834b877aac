//! The real kernel: IPVS over generic netlink ([`ipvs`]), ipset over
//! nfnetlink ([`ipset`]), kube-ipvs0 over rtnetlink ([`link`]), all built
//! on the shared netlink layer (`kp-netlink`: requests with checked
//! lengths, acknowledged batches, dumps); real servers are read from the
//! kernel's IPVS table ([`table`]).
//! No `ipvsadm`, `ipset` or `ip` program runs.
//!
//! Each socket belongs to the network namespace of the thread that opens
//! it (on first use).

pub mod ipset;
pub mod ipvs;
pub mod link;
pub mod table;

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use kp_model::IpFamily;
use kp_netlink::{BatchError, BatchFailure, Message};

use crate::diff::Op;
use crate::kernel::{ApplyError, IpvsKernel, KernelError, Refusal};
use crate::netlink::ipset::IpsetNetlink;
use crate::netlink::ipvs::IpvsNetlink;
use crate::netlink::link::DummyLink;
use crate::state::{KernelState, ServiceKey, ServiceState, SetKind, VirtualServer};

/// The three netlink handles behind [`IpvsKernel`].
#[derive(Debug, Default)]
pub struct NetlinkKernel {
    ipvs: IpvsNetlink,
    ipset: IpsetNetlink,
    link: DummyLink,
    link_index: Option<u32>,
}

/// Which socket an operation goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Link,
    Ipset,
    Ipvs,
}

impl NetlinkKernel {
    /// Handles that open their sockets on first use.
    pub fn new() -> Self {
        Self::default()
    }

    /// The kernel's ipset protocol version.
    pub fn ipset_protocol(&mut self) -> io::Result<u8> {
        self.ipset.protocol_version()
    }

    /// Every virtual server of both families (cleanup).
    pub fn list_all_services(&mut self) -> io::Result<Vec<ServiceKey>> {
        Ok(self
            .ipvs
            .list_services(None)?
            .into_iter()
            .map(|(key, _)| key)
            .collect())
    }

    /// `ipvsadm -D -t SERVICE` (cleanup).
    pub fn delete_service(&mut self, key: &ServiceKey) -> io::Result<()> {
        let message = self.ipvs.delete_service_message(key)?;
        self.ipvs
            .execute(vec![message])
            .map_err(|failure| failure.into_first().error.into())
    }

    /// The real servers of every service: all at once from the kernel's
    /// table ([`table`]); a service the table does not show yet (created
    /// between the two listings) is asked for over netlink. Without the
    /// table, every service is asked for over netlink.
    fn list_real_servers(
        &mut self,
        services: Vec<(ServiceKey, VirtualServer)>,
    ) -> Result<BTreeMap<ServiceKey, ServiceState>, KernelError> {
        let mut table = match table::read() {
            Ok(table) => table,
            Err(error) if error.kind() == io::ErrorKind::NotFound => HashMap::new(),
            Err(source) => {
                return Err(KernelError {
                    attempted: format!("reading {}", table::TABLE_PATH),
                    source,
                })
            }
        };
        let mut listed = BTreeMap::new();
        for (key, server) in services {
            let dests = match table.remove(&key) {
                Some(dests) => dests,
                None => self.ipvs.list_dests(&key).map_err(|source| KernelError {
                    attempted: format!("ipvsadm -Ln {key}"),
                    source,
                })?,
            };
            let reals = dests
                .into_iter()
                .map(|dest| (dest.address, dest.weight))
                .collect();
            listed.insert(key, ServiceState { server, reals });
        }
        Ok(listed)
    }

    fn index(&mut self) -> io::Result<u32> {
        if let Some(index) = self.link_index {
            return Ok(index);
        }
        let index = self
            .link
            .index()?
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "kube-ipvs0 does not exist"))?;
        self.link_index = Some(index);
        Ok(index)
    }

    fn message(&mut self, family: IpFamily, op: &Op) -> io::Result<Message> {
        Ok(match op {
            Op::CreateLink => {
                return Err(io::Error::other("a link is created on its own"));
            }
            Op::AddAddress(ip) => DummyLink::address_message(self.index()?, *ip, true),
            Op::DeleteAddress(ip) => DummyLink::address_message(self.index()?, *ip, false),
            Op::CreateSet(kind) => IpsetNetlink::create_message(*kind, family),
            Op::AddEntry(kind, entry) => IpsetNetlink::entry_message(*kind, family, entry, true),
            Op::DeleteEntry(kind, entry) => {
                IpsetNetlink::entry_message(*kind, family, entry, false)
            }
            Op::AddService(key, server) => self.ipvs.service_message(key, server, false)?,
            Op::UpdateService(key, server) => self.ipvs.service_message(key, server, true)?,
            Op::DeleteService(key) => self.ipvs.delete_service_message(key)?,
            Op::AddReal(key, real, weight) => {
                self.ipvs.dest_message(key, *real, Some(*weight), false)?
            }
            Op::UpdateReal(key, real, weight) => {
                self.ipvs.dest_message(key, *real, Some(*weight), true)?
            }
            Op::DeleteReal(key, real) => self.ipvs.dest_message(key, *real, None, false)?,
        })
    }

    /// Sends a run of operations that go to one socket; `offset` is the
    /// position of its first operation in the whole apply. Refusals are
    /// added to `refused`; a failed exchange ends the apply.
    fn send_run(
        &mut self,
        family: IpFamily,
        offset: usize,
        ops: &[Op],
        refused: &mut Vec<Refusal>,
    ) -> Result<(), ApplyError> {
        let Some(first) = ops.first() else {
            return Ok(());
        };
        if *first == Op::CreateLink {
            // Nothing of the mode works without kube-ipvs0.
            self.link_index = None;
            return self
                .link
                .create()
                .map_err(|e| ApplyError::Broken(failure(family, ops, e)));
        }
        let mut messages = Vec::with_capacity(ops.len());
        // The position in `ops` of each message.
        let mut positions = Vec::with_capacity(ops.len());
        for (at, op) in ops.iter().enumerate() {
            let message = self.message(family, op).map_err(|source| {
                ApplyError::Broken(KernelError {
                    attempted: describe(family, op),
                    source,
                })
            })?;
            // A value too long for its length field is this object's
            // problem, not the node's: refuse it alone.
            if let Err(error) = message.check() {
                refused.push(Refusal {
                    index: offset + at,
                    error: KernelError {
                        attempted: describe(family, op),
                        source: io::Error::new(io::ErrorKind::InvalidInput, error),
                    },
                    drift: false,
                });
                continue;
            }
            messages.push(message);
            positions.push(at);
        }
        let result = match route(first) {
            Route::Link => self.link.execute(messages),
            Route::Ipset => self.ipset.execute(messages),
            Route::Ipvs => self.ipvs.execute(messages),
        };
        let Err(BatchFailure {
            refused: refusals,
            broken,
            // Only nfnetlink batches are refused as a whole; these
            // requests are sent one by one.
            refused_whole: _,
        }) = result
        else {
            return Ok(());
        };
        // Positions in `messages` back to positions in `ops`.
        let at = |error: BatchError| BatchError {
            index: positions.get(error.index).copied().unwrap_or(error.index),
            error: error.error,
        };
        for refusal in refusals {
            let refusal = at(refusal);
            let drift = ops
                .get(refusal.index)
                .is_some_and(|op| is_drift(op, &refusal.error));
            refused.push(Refusal {
                index: offset + refusal.index,
                error: failure(family, ops, refusal),
                drift,
            });
        }
        match broken {
            Some(broken) => Err(ApplyError::Broken(failure(family, ops, at(broken)))),
            None => Ok(()),
        }
    }
}

impl IpvsKernel for NetlinkKernel {
    fn list(&mut self, family: IpFamily) -> Result<KernelState, KernelError> {
        let failed = |what: &str| {
            let what = what.to_owned();
            move |source| KernelError {
                attempted: what,
                source,
            }
        };
        let mut state = KernelState::default();
        self.link_index = self
            .link
            .index()
            .map_err(failed("ip link show kube-ipvs0"))?;
        if let Some(index) = self.link_index {
            state.link = true;
            state.addresses = self
                .link
                .addresses(index, family)
                .map_err(failed("ip addr show dev kube-ipvs0"))?;
        }
        let services = self
            .ipvs
            .list_services(Some(family))
            .map_err(failed("ipvsadm -Ln"))?;
        state.services = self.list_real_servers(services)?;
        for kind in SetKind::ALL {
            let name = kind.name(family);
            if let Some(members) = self
                .ipset
                .list(name, family)
                .map_err(failed(&format!("ipset list {name}")))?
            {
                state.sets.insert(kind, members);
            }
        }
        Ok(state)
    }

    fn connections(
        &mut self,
        service: &ServiceKey,
    ) -> Result<BTreeMap<SocketAddr, u32>, KernelError> {
        let dests = self
            .ipvs
            .list_dests(service)
            .map_err(|source| KernelError {
                attempted: format!("ipvsadm -Ln {service}"),
                source,
            })?;
        Ok(ipvs::connections(&dests))
    }

    fn apply(&mut self, family: IpFamily, ops: &[Op]) -> Result<(), ApplyError> {
        let mut refused = Vec::new();
        let mut start = 0;
        while start < ops.len() {
            let kind = route(&ops[start]);
            let single = ops[start] == Op::CreateLink;
            let mut end = start + 1;
            while !single
                && end < ops.len()
                && route(&ops[end]) == kind
                && ops[end] != Op::CreateLink
            {
                end += 1;
            }
            self.send_run(family, start, &ops[start..end], &mut refused)?;
            start = end;
        }
        refused.sort_by_key(|refusal| refusal.index);
        ApplyError::unless_none(refused)
    }

    fn set_timeouts(
        &mut self,
        tcp: Duration,
        tcp_fin: Duration,
        udp: Duration,
    ) -> Result<(), KernelError> {
        self.ipvs
            .set_timeouts(tcp, tcp_fin, udp)
            .map_err(|source| KernelError {
                attempted: format!(
                    "ipvsadm --set {} {} {}",
                    tcp.as_secs(),
                    tcp_fin.as_secs(),
                    udp.as_secs()
                ),
                source,
            })
    }

    fn delete_link(&mut self) -> Result<bool, KernelError> {
        self.link_index = None;
        self.link.delete().map_err(|source| KernelError {
            attempted: "ip link del kube-ipvs0".to_owned(),
            source,
        })
    }

    fn destroy_set(&mut self, name: &str) -> Result<bool, KernelError> {
        self.ipset.destroy(name).map_err(|source| KernelError {
            attempted: format!("ipset destroy {name}"),
            source,
        })
    }

    fn messages_sent(&self) -> u64 {
        self.ipvs.messages() + self.ipset.messages() + self.link.messages()
    }
}

/// Whether the kernel refused `op` because it already held what `op`
/// wanted: IPVS answers a delete of a missing service `ESRCH` and of a
/// missing real server `ENOENT`, an add of a present one `EEXIST`;
/// rtnetlink a delete of a missing address `EADDRNOTAVAIL`. An ipset entry
/// request is sent without `NLM_F_EXCL`, so the kernel takes an add of a
/// present member or a delete of a missing one as done and never answers
/// `IPSET_ERR_EXIST` to it.
fn is_drift(op: &Op, error: &kp_netlink::Error) -> bool {
    const ENOENT: i32 = 2;
    const ESRCH: i32 = 3;
    const EEXIST: i32 = 17;
    const EADDRNOTAVAIL: i32 = 99;
    let Some(code) = error.errno() else {
        return false;
    };
    match op {
        Op::AddEntry(..) | Op::DeleteEntry(..) => false,
        _ if op.adds() => code == EEXIST,
        _ if op.deletes() => matches!(code, ENOENT | ESRCH | EADDRNOTAVAIL),
        _ => false,
    }
}

/// An answer that cannot be understood.
fn malformed(what: &'static str) -> io::Error {
    kp_netlink::Error::Malformed(what).into()
}

fn route(op: &Op) -> Route {
    match op {
        Op::CreateLink | Op::AddAddress(_) | Op::DeleteAddress(_) => Route::Link,
        Op::CreateSet(_) | Op::AddEntry(..) | Op::DeleteEntry(..) => Route::Ipset,
        _ => Route::Ipvs,
    }
}

/// An operation as the command an operator would type, with real set names.
fn describe(family: IpFamily, op: &Op) -> String {
    match op {
        Op::CreateSet(kind) => format!(
            "ipset create {} {}",
            kind.name(family),
            kind.set_type().as_str()
        ),
        Op::AddEntry(kind, entry) => format!("ipset add {} {entry}", kind.name(family)),
        Op::DeleteEntry(kind, entry) => format!("ipset del {} {entry}", kind.name(family)),
        other => other.to_string(),
    }
}

fn failure(family: IpFamily, ops: &[Op], error: BatchError) -> KernelError {
    let op = ops.get(error.index);
    let attempted = op
        .map(|op| describe(family, op))
        .unwrap_or_else(|| "a netlink request".to_owned());
    let set_type = match op {
        Some(Op::CreateSet(kind) | Op::AddEntry(kind, _) | Op::DeleteEntry(kind, _)) => {
            Some(kind.set_type())
        }
        _ => None,
    };
    let source = match op.map(route) {
        Some(Route::Ipset) => ipset::describe_error(error.error.into(), set_type),
        _ => error.error.into(),
    };
    KernelError { attempted, source }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::kernel::ApplyError;
    use kp_model::Protocol;

    #[test]
    fn a_virtual_server_too_large_to_encode_is_refused_by_name_and_nothing_is_sent() {
        let mut kernel = NetlinkKernel {
            ipvs: IpvsNetlink::with_family_id(0x30),
            ..NetlinkKernel::default()
        };
        let key = ServiceKey {
            address: "10.96.0.41".parse().unwrap(),
            protocol: Protocol::Tcp,
            port: 80,
        };
        let server = VirtualServer {
            scheduler: "x".repeat(70_000),
            flags: 0,
            timeout_secs: 0,
        };
        let Err(ApplyError::Refused(refused)) =
            kernel.apply(IpFamily::V4, &[Op::AddService(key, server)])
        else {
            panic!("an oversized virtual server must be refused");
        };
        assert_eq!(refused.len(), 1);
        let error = &refused[0].error;
        assert!(
            error
                .attempted
                .starts_with("ipvsadm -A TCP  10.96.0.41:80 -s xxx"),
            "the error names the virtual server: {:.60}",
            error.attempted
        );
        let cause = error.source.to_string();
        assert!(
            cause.contains("70005 bytes") && cause.contains("at most 65535"),
            "{cause}"
        );
        assert_eq!(kernel.messages_sent(), 0, "nothing reached the kernel");
    }
}
