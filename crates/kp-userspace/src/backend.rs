//! `--proxy-mode userspace`: [`UserspaceBackend`] keeps the relay's
//! listeners and the portal rules in step with the Services.
//!
//! A sync is a plain call from the sync loop's thread. It opens, updates
//! and closes listeners (non-blocking socket calls; the listeners' tasks
//! run on the tokio runtime whose [`Handle`] the backend was given), then
//! writes the whole portal ruleset of its family in one `iptables-restore`
//! (the four chains are flushed and refilled atomically at `COMMIT`). The
//! portal ruleset holds a few rules per service port, so every sync is a
//! full one.
//!
//! A listener that cannot be opened (its port range is full, say) leaves
//! that service port without portal rules; every other service port is
//! served, and the sync reports an error so the sync loop retries.
//!
//! After each sync the backend publishes the relay's routing table (see
//! [`crate::routes_file`]) for `kube-proxy trace`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use kp_iptables::{Applier, ApplyError, IptablesFlavor};
use kp_model::{IpFamily, Protocol, ServicePortName};
use kp_sync::{Backend, BackendError, SyncOutcome, SyncRequest};
use tokio::runtime::Handle;

use crate::jump_check::{jumps_present, JumpCheck};
use crate::portal::{
    render_portals, JumpLines, PortalInput, PortalService, PORTAL_CHAINS, PORTAL_JUMPS,
};
use crate::relay::{DesiredListener, OpenError, Relay};
use crate::route::Route;
use crate::routes_file::{self, PublishedPort, RoutesFile};
use crate::stats::{StatsRegistry, StatsSnapshot};
use crate::RelayOptions;

/// The mode's name, as `--proxy-mode` spells it.
pub const MODE: &str = "userspace";

/// A jump is deleted at most this many times per sync (duplicates left by
/// crashed runs), so a fake or broken `iptables -D` cannot loop forever.
const MAX_JUMP_COPIES: usize = 16;

/// The userspace mode of one IP family.
pub struct UserspaceBackend {
    family: IpFamily,
    relay: Relay,
    applier: Box<dyn Applier>,
    /// The jumps from the built-in chains were in place after the last
    /// restore (each sync checks it again, in the way `jump_check` says).
    jumps_in_place: bool,
    jump_check: JumpCheck,
    /// Where the routing table is published, if anywhere.
    routes_path: Option<PathBuf>,
    /// Publishing failed once already (logged once, then quiet).
    routes_failed: bool,
}

/// Why the userspace mode could not do what was asked of it.
#[derive(Debug, thiserror::Error)]
pub enum UserspaceError {
    /// Removing the portal rules failed.
    #[error("removing the {family} userspace portal rules failed")]
    Cleanup {
        /// The family.
        family: IpFamily,
        /// The cause.
        #[source]
        source: ApplyError,
    },
}

/// Listeners that could not be opened in one sync.
#[derive(Debug)]
struct OpenErrors(Vec<OpenError>);

impl UserspaceBackend {
    /// A backend for `family` relaying on `handle`'s runtime and applying
    /// portal rules through `applier`.
    pub fn new(
        handle: Handle,
        family: IpFamily,
        options: RelayOptions,
        applier: Box<dyn Applier>,
    ) -> Self {
        Self {
            family,
            relay: Relay::new(handle, family, options),
            applier,
            jumps_in_place: false,
            jump_check: JumpCheck::InRestore,
            routes_path: Some(routes_file::default_path(family)),
            routes_failed: false,
        }
    }

    /// The backend publishing its routing table at `path` after each
    /// sync (by default [`routes_file::default_path`]), or nowhere.
    pub fn with_routes_file(mut self, path: Option<PathBuf>) -> Self {
        self.routes_path = path;
        self
    }

    /// The backend checking its jumps with `check` (by default in every
    /// restore, which any applier supports; see [`JumpCheck::for_flavor`]
    /// for the cheaper check of a real iptables).
    pub fn with_jump_check(mut self, check: JumpCheck) -> Self {
        self.jump_check = check;
        self
    }

    /// The relay, for its listeners and counters.
    pub fn relay(&self) -> &Relay {
        &self.relay
    }

    /// Connection counters per service port.
    pub fn stats(&self) -> BTreeMap<ServicePortName, StatsSnapshot> {
        self.relay.stats()
    }

    /// A shared view of the connection counters that stays readable after
    /// the backend has moved into the sync loop (for the metrics server).
    pub fn stats_registry(&self) -> StatsRegistry {
        self.relay.stats_registry()
    }

    /// Deletes leftover copies of the jumps, so the next restore inserts
    /// each exactly once.
    fn remove_jumps(&mut self) -> Result<(), BackendError> {
        for jump in &PORTAL_JUMPS {
            for _ in 0..MAX_JUMP_COPIES {
                let removed = self
                    .applier
                    .delete_jump(self.family, jump)
                    .map_err(|source| apply_error("deleting old portal jump rules", source))?;
                if !removed {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Writes the portal rules of `services`. While the jumps are believed
    /// in place, they are checked first ([`JumpCheck::Probe`]), or the
    /// restore deletes and inserts them again in the same transaction,
    /// which the kernel refuses when one is missing
    /// ([`JumpCheck::InRestore`]). When one is missing (the nat table was
    /// flushed, a jump deleted), or the restore fails, the leftover copies
    /// are deleted and the rules written again with fresh jumps, in this
    /// sync. Returns the rules written.
    fn restore_portals(
        &mut self,
        node_ip: Option<std::net::IpAddr>,
        services: &[PortalService],
    ) -> Result<String, BackendError> {
        let in_place_lines = match self.jump_check {
            JumpCheck::InRestore => JumpLines::Replace,
            JumpCheck::Probe(flavor) => {
                if self.jumps_in_place && !self.probe_jumps(flavor)? {
                    tracing::warn!(family = %self.family, "the portal rules' jumps are not all in place (the nat table was changed by someone else?); inserting them again");
                    self.jumps_in_place = false;
                }
                JumpLines::Omit
            }
        };
        let mut input = PortalInput {
            family: self.family,
            node_ip,
            refusing_port: self.relay.refusing_port(),
            services,
            jumps: in_place_lines,
        };
        if self.jumps_in_place {
            let text = render_portals(&input);
            tracing::trace!(rules = %text, "portal rules");
            match self.applier.restore(self.family, &text) {
                Ok(()) => {
                    self.applier
                        .end_sync()
                        .map_err(|source| apply_error("finishing the sync", source))?;
                    return Ok(text);
                }
                Err(error) => {
                    if error.missing_program().is_some() {
                        return Err(apply_error("running iptables-restore for table nat", error));
                    }
                    tracing::warn!(family = %self.family, %error, "the portal rules' jumps are not all in place (the nat table was changed by someone else?); inserting them again");
                    self.jumps_in_place = false;
                }
            }
        }
        self.remove_jumps()?;
        input.jumps = JumpLines::Insert;
        let text = render_portals(&input);
        tracing::trace!(rules = %text, "portal rules");
        self.applier
            .restore(self.family, &text)
            .map_err(|source| apply_error("running iptables-restore for table nat", source))?;
        self.applier
            .end_sync()
            .map_err(|source| apply_error("finishing the sync", source))?;
        self.jumps_in_place = true;
        Ok(text)
    }

    /// Whether every portal jump is in place, asked with `flavor`'s
    /// `iptables -S`.
    fn probe_jumps(&self, flavor: IptablesFlavor) -> Result<bool, BackendError> {
        jumps_present(flavor, self.family, &PORTAL_JUMPS)
            .map_err(|source| apply_error("listing the portal jump rules", source))
    }

    /// Writes the relay's routing table of `desired` to the routing file;
    /// a failure is logged once and otherwise ignored, as the relay does
    /// not depend on the file.
    fn publish_routes(
        &mut self,
        request: &SyncRequest<'_>,
        desired: &BTreeMap<ServicePortName, DesiredListener>,
    ) {
        let Some(path) = self.routes_path.as_deref() else {
            return;
        };
        let ports = desired
            .iter()
            .filter_map(|(name, wanted)| {
                let listener = self.relay.listener(name)?;
                let local = request
                    .service_ports
                    .get(name)
                    .is_some_and(|state| state.port.external_policy_local);
                Some(PublishedPort::new(
                    name.to_string(),
                    wanted.protocol,
                    listener.port,
                    &wanted.route,
                    local,
                ))
            })
            .collect();
        let table = RoutesFile {
            family: self.family.as_api_str().to_owned(),
            refusing_port: self.relay.refusing_port(),
            ports,
        };
        match table.write_atomically(path) {
            Ok(()) => self.routes_failed = false,
            Err(error) if !self.routes_failed => {
                self.routes_failed = true;
                tracing::warn!(family = %self.family, error = %error_chain(&error), "cannot publish the relay's routing table; kube-proxy trace will not read this mode");
            }
            Err(_) => {}
        }
    }

    fn desired_listeners(request: &SyncRequest<'_>) -> BTreeMap<ServicePortName, DesiredListener> {
        request
            .service_ports
            .iter()
            .filter(|(name, state)| {
                let supported = state.port.protocol != Protocol::Sctp;
                if !supported {
                    tracing::debug!(service = %name, "the userspace mode does not relay SCTP; skipping");
                }
                supported
            })
            .map(|(name, state)| {
                let desired = DesiredListener {
                    protocol: state.port.protocol,
                    route: Route::from_state(state),
                };
                (name.clone(), desired)
            })
            .collect()
    }
}

impl Backend for UserspaceBackend {
    fn mode(&self) -> &'static str {
        MODE
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncOutcome, BackendError> {
        let desired = Self::desired_listeners(request);
        let open_errors = self.relay.apply(&desired);
        let services: Vec<PortalService> = desired
            .keys()
            .filter_map(|name| {
                let listener = self.relay.listener(name)?;
                let state = request.service_ports.get(name)?;
                Some(PortalService {
                    name: name.clone(),
                    port: state.port.clone(),
                    proxy_port: listener.port,
                    has_endpoints: listener.has_endpoints,
                })
            })
            .collect();
        let node_ip = request.node.addresses_of(self.family).next();
        let text = self.restore_portals(node_ip, &services)?;
        self.publish_routes(request, &desired);
        self.relay.sweep_affinity();
        if !open_errors.is_empty() {
            return Err(BackendError::Apply {
                mode: MODE,
                attempted: "opening listeners".to_owned(),
                source: Box::new(OpenErrors(open_errors)),
            });
        }
        let rules = text
            .lines()
            .filter(|line| line.starts_with("-A KUBE-"))
            .count();
        Ok(SyncOutcome {
            full: true,
            rules_per_table: vec![("nat".to_owned(), rules)],
            chains_per_table: vec![("nat".to_owned(), PORTAL_CHAINS.len())],
            rules_written_per_table: vec![("nat".to_owned(), rules)],
            objects_written: rules + services.len(),
            cleanup_failures: 0,
        })
    }
}

impl fmt::Debug for UserspaceBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserspaceBackend")
            .field("family", &self.family)
            .field("relay", &self.relay)
            .field("jumps_in_place", &self.jumps_in_place)
            .field("jump_check", &self.jump_check)
            .field("routes_path", &self.routes_path)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for OpenErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, error) in self.0.iter().enumerate() {
            if index > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{error}")?;
            let mut source = std::error::Error::source(error);
            while let Some(cause) = source {
                write!(f, ": {cause}")?;
                source = cause.source();
            }
        }
        Ok(())
    }
}

impl std::error::Error for OpenErrors {}

/// `error` with its causes, `: `-separated.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `--cleanup`: deletes the portal jumps and chains of `family` through
/// `applier`, and the relay's routing file of this network namespace.
/// Running it twice is harmless.
pub fn cleanup(applier: &mut dyn Applier, family: IpFamily) -> Result<usize, UserspaceError> {
    let routes = routes_file::default_path(family);
    match std::fs::remove_file(&routes) {
        Ok(()) => tracing::info!(path = %routes.display(), "Removed the relay's routing file"),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => {
            tracing::warn!(path = %routes.display(), %error, "Cannot remove the relay's routing file")
        }
    }
    let error = |source| UserspaceError::Cleanup { family, source };
    let mut removed = 0;
    for jump in &PORTAL_JUMPS {
        for _ in 0..MAX_JUMP_COPIES {
            if !applier.delete_jump(family, jump).map_err(error)? {
                break;
            }
            removed += 1;
        }
    }
    for chain in PORTAL_CHAINS {
        if applier
            .flush_and_delete_chain(family, kp_iptables::Table::Nat, chain)
            .map_err(error)?
        {
            removed += 1;
        }
    }
    Ok(removed)
}

/// A backend error for a failed step; a missing iptables program makes
/// the mode unavailable (reported once, unhealthy at once) rather than a
/// failure to retry.
fn apply_error(attempted: &str, source: ApplyError) -> BackendError {
    if let Some(program) = source.missing_program() {
        return BackendError::Unavailable {
            mode: MODE,
            missing: format!("program {program} not found"),
            remedy: "install the iptables package (Debian and Ubuntu: apt-get install iptables)"
                .to_owned(),
        };
    }
    BackendError::Apply {
        mode: MODE,
        attempted: attempted.to_owned(),
        source: Box::new(source),
    }
}

#[cfg(test)]
#[path = "backend_tests.rs"]
mod tests;
