//! The running proxy checks its own work: after a full sync (at most once
//! per `--state-check-interval`), a rotating sample of
//! `--state-check-service-ports` service ports is held against the rules
//! the kernel holds, as `kube-proxy check` does, on a thread of its own so
//! the sync loop never waits for it. The number of Services whose
//! connections differ from the model is exported as
//! `kubeproxy_rs_state_drift_services{ip_family}` and the first difference
//! is logged, so a kernel that lost or changed the proxy's rules behind its
//! back (another program flushing a table, a commit the kernel dropped) is
//! reported within one check.
//!
//! The sample bounds the tracing; reading the rules costs what the mode's
//! ruleset costs to list (docs/OPERATIONS.md gives the figures at 10,000
//! Services), which is why the checks are spaced.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::atomic::AtomicI64;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kp_model::{IpFamily, NamespacedName};
use kp_sync::{SyncObserver, SyncOutcome, SyncRequest};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::check::{check_family, Recorded};
use crate::trace::{Live, TraceMode};

type Labels = Vec<(&'static str, String)>;

/// One sample to check.
struct Job {
    family: IpFamily,
    recorded: Recorded,
}

/// When the last check started and where the next sample begins.
#[derive(Default)]
struct Schedule {
    last: Option<Instant>,
    offset: usize,
}

/// The sync observer that hands samples to the checking thread.
pub struct DriftCheck {
    sample: usize,
    interval: Duration,
    schedule: Mutex<Schedule>,
    jobs: SyncSender<Job>,
}

impl DriftCheck {
    /// A check of `sample` service ports at most every `interval` for the
    /// rules of `mode`, registering its gauge in `registry`; `None` when
    /// `sample` is 0 or the mode's state cannot be traced.
    pub fn start(
        mode: TraceMode,
        sample: usize,
        interval: Duration,
        registry: &mut Registry,
    ) -> Option<Arc<Self>> {
        if sample == 0 {
            return None;
        }
        if matches!(mode, TraceMode::Ipvs | TraceMode::Userspace) {
            tracing::info!(
                mode = mode.name(),
                "The kernel state check does not read this mode's state yet; it is off"
            );
            return None;
        }
        let gauge = Family::<Labels, Gauge<i64, AtomicI64>>::default();
        registry.register(
            "kubeproxy_rs_state_drift_services",
            "Services whose connections, in the last check of a sample of service ports, the kernel's rules handle differently from the model (kube-proxy-rs)",
            gauge.clone(),
        );
        // One job waits at most: a check still running when the next full
        // sync ends makes that sync's sample wait for the next one.
        let (jobs, receiver) = sync_channel(1);
        let spawned = std::thread::Builder::new()
            .name("state-check".to_owned())
            .spawn(move || run(mode, &receiver, &gauge));
        if let Err(error) = spawned {
            tracing::warn!(%error, "Cannot start the kernel state check; it is off");
            return None;
        }
        Some(Arc::new(Self {
            sample,
            interval,
            schedule: Mutex::new(Schedule::default()),
            jobs,
        }))
    }
}

impl SyncObserver for DriftCheck {
    fn on_synced(&self, request: &SyncRequest<'_>, _outcome: &SyncOutcome) {
        if !request.full || request.service_ports.is_empty() {
            return;
        }
        let mut schedule = match self.schedule.lock() {
            Ok(schedule) => schedule,
            Err(poisoned) => poisoned.into_inner(),
        };
        let now = Instant::now();
        if schedule
            .last
            .is_some_and(|last| now.duration_since(last) < self.interval)
        {
            return;
        }
        let total = request.service_ports.len();
        let start = schedule.offset % total;
        let take = self.sample.min(total);
        let sample: BTreeMap<_, _> = request
            .service_ports
            .iter()
            .cycle()
            .skip(start)
            .take(take)
            .map(|(name, state)| (name.clone(), state.clone()))
            .collect();
        let job = Job {
            family: request.family,
            recorded: (sample, request.node.clone()),
        };
        match self.jobs.try_send(job) {
            Ok(()) => {
                schedule.last = Some(now);
                schedule.offset = start + take;
            }
            Err(TrySendError::Full(_)) => {}
            Err(TrySendError::Disconnected(_)) => {
                tracing::debug!("the kernel state check has stopped");
            }
        }
    }
}

/// The checking thread: one job at a time until the proxy ends.
fn run(mode: TraceMode, jobs: &Receiver<Job>, gauge: &Family<Labels, Gauge<i64, AtomicI64>>) {
    while let Ok(job) = jobs.recv() {
        let family = job.family;
        let labels = vec![("ip_family", family.as_api_str().to_owned())];
        let started = Instant::now();
        let checked = Live::read(mode, family).and_then(|live| {
            let local: Vec<IpAddr> = kp_host::local_addresses()
                .map_err(|error| anyhow::anyhow!("reading this node's addresses: {error}"))?
                .into_iter()
                .filter(|ip| family.matches(ip))
                .collect();
            check_family(family, &job.recorded, &live, &local)
        });
        match checked {
            Ok(result) => {
                let services: BTreeSet<&NamespacedName> = result
                    .differences
                    .iter()
                    .map(|difference| &difference.probe.service.service)
                    .collect();
                let drifted = i64::try_from(services.len()).unwrap_or(i64::MAX);
                let before = gauge.get_or_create(&labels).set(drifted);
                match result.differences.first() {
                    Some(first) => tracing::error!(
                        family = family.as_api_str(),
                        services = drifted,
                        connections = result.differences.len(),
                        first = %first.probe,
                        expected = %first.probe.expected,
                        found = %first.found,
                        "The kernel's rules differ from what the proxy programmed"
                    ),
                    None if before > 0 => tracing::info!(
                        family = family.as_api_str(),
                        "The kernel's rules match the model again"
                    ),
                    None => {}
                }
                tracing::debug!(
                    family = family.as_api_str(),
                    checked = result.checked,
                    service_ports = result.service_ports,
                    elapsed = ?started.elapsed(),
                    "Checked the kernel's rules"
                );
            }
            Err(error) => tracing::warn!(
                family = family.as_api_str(),
                error = format!("{error:#}"),
                "Could not check the kernel's rules"
            ),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use kp_model::NodeInfo;
    use kp_sync::testing::service;
    use kp_sync::StaleConntrack;
    use kp_testkit::netns::{require_root, wait_until, Netns};
    use prometheus_client::encoding::text::encode;

    fn gauge_text(registry: &Registry) -> String {
        let mut text = String::new();
        encode(&mut text, registry).unwrap();
        text
    }

    /// In a namespace whose kernel holds no rules at all, every Service
    /// the sync reported is drift: two ports of one Service count once,
    /// and a Service without endpoints (rejected in the model, not handled
    /// in the kernel) counts too. A second full sync within the interval
    /// is not checked again.
    #[test]
    fn a_kernel_without_the_rules_is_drift_per_service() {
        require_root();
        let ns = Netns::create("drift").unwrap();
        let text = ns.run(|| {
            let mut registry = Registry::default();
            let check = DriftCheck::start(
                TraceMode::Iptables,
                10,
                Duration::from_secs(3600),
                &mut registry,
            )
            .unwrap();
            let mut ports = BTreeMap::new();
            for builder in [
                service("ns", "web", "10.96.0.10", 80).endpoint("10.244.1.2", 8080, true),
                service("ns", "web", "10.96.0.10", 81).endpoint("10.244.1.2", 8081, true),
                service("ns", "empty", "10.96.0.11", 80),
            ] {
                let (name, state) = builder.build();
                ports.insert(name, state);
            }
            let node = NodeInfo::default();
            let changed = BTreeSet::new();
            let stale = StaleConntrack::default();
            let request = SyncRequest {
                family: IpFamily::V4,
                full: true,
                service_ports: &ports,
                changed_services: &changed,
                node: &node,
                stale_conntrack: &stale,
            };
            check.on_synced(&request, &SyncOutcome::default());
            let line = "kubeproxy_rs_state_drift_services{ip_family=\"IPv4\"} 2";
            let seen = wait_until(Duration::from_secs(20), || {
                gauge_text(&registry).contains(line)
            });
            assert!(seen, "{}", gauge_text(&registry));
            // Within the interval: no second sample is taken.
            check.on_synced(&request, &SyncOutcome::default());
            assert_eq!(check.schedule.lock().unwrap().offset, 3);
            gauge_text(&registry)
        });
        assert!(
            text.contains("# HELP kubeproxy_rs_state_drift_services"),
            "{text}"
        );
    }

    #[test]
    fn no_check_for_a_sample_of_zero_or_an_untraced_mode() {
        let mut registry = Registry::default();
        assert!(DriftCheck::start(TraceMode::Iptables, 0, Duration::ZERO, &mut registry).is_none());
        assert!(DriftCheck::start(TraceMode::Ipvs, 10, Duration::ZERO, &mut registry).is_none());
        assert!(!gauge_text(&registry).contains("drift"));
    }
}
