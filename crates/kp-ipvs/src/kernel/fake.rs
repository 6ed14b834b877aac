//! [`FakeKernel`]: an in-memory [`IpvsKernel`] for tests that refuses what
//! the kernel refuses and counts the messages a real kernel would have
//! received (feature `test-util`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kp_model::IpFamily;

use super::*;
use crate::capability::KNOWN_SCHEDULERS;
use crate::diff::{Op, OpError};
use crate::state::{KernelState, ServiceKey, SetEntry, SetKind};

/// `EINVAL`: what IPVS answers for a real server whose address is not
/// unicast (`ip_vs_new_dest`, net/netfilter/ipvs/ip_vs_ctl.c).
const EINVAL: i32 = 22;
/// `ENOENT`: what IPVS answers for a scheduler it cannot load.
const ENOENT: i32 = 2;

/// An in-memory kernel. Clones share the state, so a test keeps one clone
/// and hands another to the backend.
#[derive(Clone, Default)]
pub struct FakeKernel {
    state: Arc<Mutex<FakeState>>,
    set_users: Arc<Mutex<Option<SetUsers>>>,
}

/// Tells whether a rule outside the IPVS mode's kernel objects (an
/// iptables rule) uses the set of this name.
pub type SetUsers = Box<dyn Fn(&str) -> bool + Send>;

/// What the fake kernel holds.
#[derive(Debug, Clone, Default)]
pub struct FakeState {
    /// Per family: addresses, services and our sets.
    pub families: BTreeMap<IpFamily, KernelState>,
    /// kube-ipvs0 exists.
    pub link: bool,
    /// Connections per real server (what `connections` reports).
    pub connections: BTreeMap<(ServiceKey, SocketAddr), u32>,
    /// The last timeouts set, in seconds.
    pub timeouts_secs: Option<(u64, u64, u64)>,
    /// Requests received.
    pub messages: u64,
    /// Every operation applied, in order.
    pub log: Vec<Op>,
    /// Fail the next this many operations.
    pub fail_ops: usize,
    /// Schedulers whose module the kernel cannot load, besides names that
    /// are no IPVS scheduler at all.
    pub missing_schedulers: BTreeSet<String>,
    /// Addresses the node's routes make broadcast addresses (the directed
    /// broadcast of a connected subnet): IPVS refuses them as real
    /// servers, as it refuses multicast and unspecified ones.
    pub broadcast: BTreeSet<IpAddr>,
}

impl fmt::Debug for FakeKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("FakeKernel").field(&*self.state()).finish()
    }
}

impl FakeKernel {
    /// An empty kernel: no kube-ipvs0, no sets, no virtual servers.
    pub fn new() -> Self {
        Self::default()
    }

    /// The shared state.
    pub fn state(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Uses `users` to tell whether a rule still uses a set: destroying
    /// such a set is refused, as ipset refuses it (`IPSET_ERR_BUSY`, "Set
    /// cannot be destroyed: it is in use by a kernel component").
    pub fn with_set_users(self, users: SetUsers) -> Self {
        *self
            .set_users
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(users);
        self
    }

    /// The state of `family`.
    pub fn family(&self, family: IpFamily) -> KernelState {
        let state = self.state();
        let mut listed = state.families.get(&family).cloned().unwrap_or_default();
        listed.link = state.link;
        listed
    }

    /// Adds a virtual server someone else made (`ipvsadm -A`).
    pub fn add_foreign_service(&self, key: ServiceKey, scheduler: &str) {
        let mut state = self.state();
        state
            .families
            .entry(IpFamily::of(&key.address))
            .or_default()
            .services
            .insert(
                key,
                crate::state::ServiceState {
                    server: crate::state::VirtualServer {
                        scheduler: scheduler.to_owned(),
                        flags: 0,
                        timeout_secs: 0,
                    },
                    reals: BTreeMap::new(),
                },
            );
    }

    /// Sets the open connections of one real server.
    pub fn set_connections(&self, service: ServiceKey, real: SocketAddr, count: u32) {
        self.state().connections.insert((service, real), count);
    }

    /// Takes the operations applied since the last call.
    pub fn take_log(&self) -> Vec<Op> {
        std::mem::take(&mut self.state().log)
    }

    /// The number of requests so far.
    pub fn messages(&self) -> u64 {
        self.state().messages
    }
}

impl IpvsKernel for FakeKernel {
    fn list(&mut self, family: IpFamily) -> Result<KernelState, KernelError> {
        let mut state = self.state();
        // One dump each for links/addresses, services and sets, plus one
        // destination dump per service, as the netlink kernel sends.
        let listed = state.families.get(&family).cloned().unwrap_or_default();
        state.messages += 3 + listed.services.len() as u64;
        let mut listed = listed;
        listed.link = state.link;
        if !state.link {
            listed.addresses = BTreeSet::new();
        }
        Ok(listed)
    }

    fn connections(
        &mut self,
        service: &ServiceKey,
    ) -> Result<BTreeMap<SocketAddr, u32>, KernelError> {
        let mut state = self.state();
        state.messages += 1;
        let family = IpFamily::of(&service.address);
        let reals = state
            .families
            .get(&family)
            .and_then(|f| f.services.get(service))
            .map(|s| s.reals.keys().copied().collect::<Vec<_>>())
            .ok_or_else(|| {
                KernelError::refused(format!("ipvsadm -Ln {service}"), &OpError::Missing)
            })?;
        Ok(reals
            .into_iter()
            .map(|real| {
                let count = state
                    .connections
                    .get(&(*service, real))
                    .copied()
                    .unwrap_or(0);
                (real, count)
            })
            .collect())
    }

    fn apply(&mut self, family: IpFamily, ops: &[Op]) -> Result<(), ApplyError> {
        let mut state = self.state();
        let mut refused = Vec::new();
        for (index, op) in ops.iter().enumerate() {
            state.messages += 1;
            if let Err((error, drift)) = state.apply_one(family, op) {
                refused.push(Refusal {
                    index,
                    error,
                    drift,
                });
            }
        }
        ApplyError::unless_none(refused)
    }

    fn set_timeouts(
        &mut self,
        tcp: Duration,
        tcp_fin: Duration,
        udp: Duration,
    ) -> Result<(), KernelError> {
        let mut state = self.state();
        state.messages += 1;
        state.timeouts_secs = Some((tcp.as_secs(), tcp_fin.as_secs(), udp.as_secs()));
        Ok(())
    }

    fn delete_link(&mut self) -> Result<bool, KernelError> {
        let mut state = self.state();
        state.messages += 1;
        let existed = state.link;
        state.link = false;
        for family in state.families.values_mut() {
            family.link = false;
            family.addresses.clear();
        }
        Ok(existed)
    }

    fn destroy_set(&mut self, name: &str) -> Result<bool, KernelError> {
        let used = self
            .set_users
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|users| users(name));
        let mut state = self.state();
        state.messages += 1;
        let Some((kind, family)) = SetKind::from_name(name) else {
            return Ok(false);
        };
        let exists = state
            .families
            .get(&family)
            .is_some_and(|f| f.sets.contains_key(&kind));
        if exists && used {
            return Err(KernelError {
                attempted: format!("ipset destroy {name}"),
                source: crate::netlink::ipset::describe_error(
                    io::Error::from_raw_os_error(crate::netlink::ipset::IPSET_ERR_BUSY),
                    None,
                ),
            });
        }
        Ok(state
            .families
            .get_mut(&family)
            .is_some_and(|f| f.sets.remove(&kind).is_some()))
    }

    fn messages_sent(&self) -> u64 {
        self.messages()
    }
}

impl FakeState {
    /// One operation, refused where the kernel refuses it; the flag tells
    /// a refusal that found the wanted state already there
    /// ([`Refusal::drift`]).
    fn apply_one(&mut self, family: IpFamily, op: &Op) -> Result<(), (KernelError, bool)> {
        if self.fail_ops > 0 {
            self.fail_ops -= 1;
            let error = KernelError {
                attempted: op.to_string(),
                source: io::Error::other("injected failure"),
            };
            return Err((error, false));
        }
        if let Err(source) = self.refuse_as_the_kernel(op) {
            let error = KernelError {
                attempted: op.to_string(),
                source,
            };
            return Err((error, false));
        }
        let link = self.link;
        let target = self.families.entry(family).or_default();
        target.link = link;
        target.apply(op).map_err(|error| {
            let drift = match error {
                OpError::Exists => op.adds(),
                OpError::Missing => op.deletes(),
            };
            (KernelError::refused(op.to_string(), &error), drift)
        })?;
        if matches!(op, Op::CreateLink) {
            self.link = true;
            for other in self.families.values_mut() {
                other.link = true;
            }
        }
        self.log.push(op.clone());
        Ok(())
    }

    /// What IPVS refuses whatever it holds: a scheduler it cannot load
    /// (`ENOENT`), a real server whose address is not unicast (`EINVAL`).
    fn refuse_as_the_kernel(&self, op: &Op) -> io::Result<()> {
        match op {
            Op::AddService(_, server) | Op::UpdateService(_, server) => {
                let name = server.scheduler.as_str();
                if !KNOWN_SCHEDULERS.contains(&name) || self.missing_schedulers.contains(name) {
                    return Err(io::Error::from_raw_os_error(ENOENT));
                }
            }
            Op::AddReal(_, real, _) | Op::UpdateReal(_, real, _) => {
                let ip = real.ip();
                let not_unicast = ip.is_unspecified()
                    || ip.is_multicast()
                    || ip == IpAddr::V4(std::net::Ipv4Addr::BROADCAST)
                    || self.broadcast.contains(&ip);
                if not_unicast {
                    return Err(io::Error::from_raw_os_error(EINVAL));
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// Members of a set as the fake holds them (tests).
pub fn members(state: &KernelState, kind: SetKind) -> Vec<SetEntry> {
    state.entries(kind).copied().collect()
}
