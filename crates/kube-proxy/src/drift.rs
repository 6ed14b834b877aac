//! The running proxy checks its own work: after a full sync (at most once
//! per `--state-check-interval`), a rotating sample of
//! `--state-check-service-ports` service ports is held against the rules
//! the kernel holds, as `kube-proxy check` does, on a thread of its own so
//! the sync loop never waits for it. The number of Services whose
//! connections differ from the model is exported as
//! `kubeproxy_rs_state_drift_services{ip_family}` and the first difference
//! is logged, so a kernel that lost or changed the proxy's rules behind its
//! back (another program flushing a table, a commit the kernel dropped) is
//! reported within one check; the family's rules are then rewritten whole
//! through its proxier's [`RepairHandle`]. A difference counts only when
//! its Service did not change in a sync since the sample was taken and a
//! second reading finds it again, since the proxy syncs on while the check
//! reads. A check that cannot run is counted in
//! `kubeproxy_rs_state_check_failures_total{ip_family}`.
//!
//! The proxy computes what each sampled connection must do (the model's
//! side); a short-lived child process, the same binary started as
//! `kube-proxy __state-check MODE FAMILY`, reads the kernel's rules and
//! traces the connections (the kernel's side) and exits. Reading a whole
//! ruleset costs memory in proportion to it (some 60 MiB at 10,000
//! Services in nftables mode), which would stay in the proxy's heap after
//! one check; in the child it is returned to the kernel when the child
//! exits. The sample bounds the tracing, the interval how often the rules
//! are read.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::atomic::AtomicI64;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kp_model::{IpFamily, NamespacedName};
use kp_sync::{RepairHandle, SyncObserver, SyncOutcome, SyncRequest};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{ExitCode, Stdio};

use kp_model::{Protocol, ServicePortName};
use kp_sync::expect::{Expected, Frontend, Probe};
use serde::{Deserialize, Serialize};

use crate::check::{check_probe, family_probes, Difference, FamilyResult, Recorded};
use crate::trace::{Live, TraceMode};

/// The first argument that starts the binary as a check worker.
pub const WORKER: &str = "__state-check";

type Labels = Vec<(&'static str, String)>;

/// One sample to check.
struct Job {
    /// Tells this job's entry in [`Changed`] from a later job's.
    id: u64,
    family: IpFamily,
    recorded: Recorded,
}

/// Per family, the job being checked and the Services that syncs changed
/// since its sample was taken: the kernel the check reads may already hold
/// their newer rules, so a difference of theirs says nothing.
type Changed = Arc<Mutex<BTreeMap<IpFamily, (u64, BTreeSet<NamespacedName>)>>>;

/// When the last check started and where the next sample begins.
#[derive(Default)]
struct Schedule {
    last: Option<Instant>,
    offset: usize,
    /// The last job's id.
    jobs: u64,
}

/// The sync observer that hands samples to the checking thread.
pub struct DriftCheck {
    sample: usize,
    interval: Duration,
    schedule: Mutex<Schedule>,
    jobs: SyncSender<Job>,
    repairs: Repairs,
    changed: Changed,
}

/// The proxiers' repair handles, one per family.
type Repairs = Arc<Mutex<Vec<RepairHandle>>>;

impl DriftCheck {
    /// A check of `sample` service ports at most every `interval` for the
    /// rules of `mode`, registering its gauge in `registry`; `None` when
    /// `sample` is 0.
    pub fn start(
        mode: TraceMode,
        sample: usize,
        interval: Duration,
        registry: &mut Registry,
    ) -> Option<Arc<Self>> {
        if sample == 0 {
            return None;
        }
        let metrics = Metrics::register(registry);
        let repairs = Repairs::default();
        let changed = Changed::default();
        let shared = Shared {
            mode,
            metrics,
            repairs: Arc::clone(&repairs),
            changed: Arc::clone(&changed),
        };
        // One job waits at most: a check still running when the next full
        // sync ends makes that sync's sample wait for the next one.
        let (jobs, receiver) = sync_channel(1);
        let spawned = std::thread::Builder::new()
            .name("state-check".to_owned())
            .spawn(move || run(&receiver, &shared));
        if let Err(error) = spawned {
            tracing::warn!(%error, "Cannot start the kernel state check; it is off");
            return None;
        }
        Some(Arc::new(Self {
            sample,
            interval,
            schedule: Mutex::new(Schedule::default()),
            jobs,
            repairs,
            changed,
        }))
    }

    /// Repairs the rules of `handle`'s family through it when a check
    /// finds them differing from the model.
    pub fn repair_with(&self, handle: RepairHandle) {
        lock(&self.repairs).push(handle);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl SyncObserver for DriftCheck {
    fn on_synced(&self, request: &SyncRequest<'_>, _outcome: &SyncOutcome) {
        if let Some((_, changed)) = lock(&self.changed).get_mut(&request.family) {
            changed.extend(request.changed_services.iter().cloned());
        }
        if !request.full || request.service_ports.is_empty() {
            return;
        }
        let mut schedule = lock(&self.schedule);
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
        let id = schedule.jobs + 1;
        let job = Job {
            id,
            family: request.family,
            recorded: (sample, request.node.clone()),
        };
        // Tracked from now, before the thread can start on the job.
        let replaced = lock(&self.changed).insert(request.family, (id, BTreeSet::new()));
        match self.jobs.try_send(job) {
            Ok(()) => {
                schedule.last = Some(now);
                schedule.offset = start + take;
                schedule.jobs = id;
            }
            Err(TrySendError::Full(_)) => {
                let mut changed = lock(&self.changed);
                match replaced {
                    Some(earlier) => changed.insert(request.family, earlier),
                    None => changed.remove(&request.family),
                };
            }
            Err(TrySendError::Disconnected(_)) => {
                tracing::debug!("the kernel state check has stopped");
            }
        }
    }
}

/// The check's metrics.
#[derive(Clone, Default)]
struct Metrics {
    /// Services that differ, per family, in the last check that ran.
    drift: Family<Labels, Gauge<i64, AtomicI64>>,
    /// Checks that could not run, per family.
    failures: Family<Labels, Counter>,
}

impl Metrics {
    fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "kubeproxy_rs_state_drift_services",
            "Services whose connections, in the last check of a sample of service ports that ran, the kernel's rules handle differently from the model (kube-proxy-rs)",
            metrics.drift.clone(),
        );
        // Registered as `..._failures`; the text encoding adds `_total`.
        registry.register(
            "kubeproxy_rs_state_check_failures",
            "Checks of the kernel's rules against the model that could not run (the rules could not be read or traced); kubeproxy_rs_state_drift_services keeps the last check that ran (kube-proxy-rs)",
            metrics.failures.clone(),
        );
        metrics
    }
}

/// What the checking thread shares with the observer.
struct Shared {
    mode: TraceMode,
    metrics: Metrics,
    repairs: Repairs,
    changed: Changed,
}

/// The checking thread: one job at a time until the proxy ends.
fn run(jobs: &Receiver<Job>, shared: &Shared) {
    while let Ok(job) = jobs.recv() {
        let started = Instant::now();
        let result = check_job(shared, &job);
        {
            let mut changed = lock(&shared.changed);
            if changed
                .get(&job.family)
                .is_some_and(|(id, _)| *id == job.id)
            {
                changed.remove(&job.family);
            }
        }
        if report(&shared.metrics, job.family, result, started.elapsed()) {
            for handle in lock(&shared.repairs)
                .iter()
                .filter(|h| h.family() == job.family)
            {
                handle.request();
            }
        }
    }
}

/// Checks `job` in a child; a difference is kept only if a second check
/// of its service ports finds it again and no sync changed its Service
/// since the sample: the proxy keeps syncing while the child reads, so a
/// single reading may meet rules newer than the sample, or a sync halfway
/// through being reported.
fn check_job(shared: &Shared, job: &Job) -> anyhow::Result<FamilyResult> {
    let unchanged = |result: FamilyResult| {
        let changed = lock(&shared.changed)
            .get(&job.family)
            .filter(|(id, _)| *id == job.id)
            .map(|(_, changed)| changed.clone())
            .unwrap_or_default();
        FamilyResult {
            differences: result
                .differences
                .into_iter()
                .filter(|d| !changed.contains(&d.probe.service.service))
                .collect(),
            ..result
        }
    };
    let first = unchanged(check_in_child(shared.mode, job.family, &job.recorded)?);
    if first.differences.is_empty() {
        return Ok(first);
    }
    let drifted: BTreeSet<&ServicePortName> =
        first.differences.iter().map(|d| &d.probe.service).collect();
    let again: Recorded = (
        job.recorded
            .0
            .iter()
            .filter(|(name, _)| drifted.contains(name))
            .map(|(name, state)| (name.clone(), state.clone()))
            .collect(),
        job.recorded.1.clone(),
    );
    let second = unchanged(check_in_child(shared.mode, job.family, &again)?);
    let confirmed: BTreeSet<(String, String)> = second
        .differences
        .iter()
        .map(|d| (d.probe.to_string(), d.found.clone()))
        .collect();
    Ok(FamilyResult {
        differences: first
            .differences
            .into_iter()
            .filter(|d| confirmed.contains(&(d.probe.to_string(), d.found.clone())))
            .collect(),
        ..first
    })
}

/// Exports and logs one check's `result`; true when the kernel's rules
/// differ from the model, so that the family's rules are to be rewritten.
fn report(
    metrics: &Metrics,
    family: IpFamily,
    result: anyhow::Result<FamilyResult>,
    elapsed: Duration,
) -> bool {
    let labels = vec![("ip_family", family.as_api_str().to_owned())];
    match result {
        Ok(result) => {
            let drifted = i64::try_from(drifted_services(&result.differences)).unwrap_or(i64::MAX);
            let before = metrics.drift.get_or_create(&labels).set(drifted);
            match result.differences.first() {
                Some(first) => tracing::error!(
                    family = family.as_api_str(),
                    services = drifted,
                    connections = result.differences.len(),
                    first = %first.probe,
                    expected = %first.probe.expected,
                    found = %first.found,
                    "The kernel's rules differ from what the proxy programmed; rewriting them"
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
                ?elapsed,
                "Checked the kernel's rules"
            );
            drifted > 0
        }
        Err(error) => {
            metrics.failures.get_or_create(&labels).inc();
            tracing::warn!(
                family = family.as_api_str(),
                error = format!("{error:#}"),
                "Could not check the kernel's rules"
            );
            false
        }
    }
}

/// How many Services the differences belong to.
fn drifted_services(differences: &[Difference]) -> usize {
    differences
        .iter()
        .map(|difference| &difference.probe.service.service)
        .collect::<BTreeSet<&NamespacedName>>()
        .len()
}

/// One probe as the worker reads it.
#[derive(Debug, Serialize, Deserialize)]
struct WireProbe {
    namespace: String,
    name: String,
    port: String,
    protocol: String,
    frontend: String,
    destination: SocketAddr,
    source: IpAddr,
    expected: WireExpected,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum WireExpected {
    Endpoints {
        endpoints: Vec<SocketAddr>,
        masquerade: Option<bool>,
    },
    Hairpin {
        endpoints: Vec<SocketAddr>,
        itself: IpAddr,
    },
    Reject,
    Drop,
    NoLocalEndpoint,
    RejectUnlessFiltered,
}

/// One difference as the worker writes it: the probe's position and what
/// the kernel does.
#[derive(Debug, Serialize, Deserialize)]
struct WireDifference {
    index: usize,
    found: String,
}

const FRONTENDS: [Frontend; 4] = [
    Frontend::ClusterIp,
    Frontend::NodePort,
    Frontend::ExternalIp,
    Frontend::LoadBalancerIp,
];

impl From<&Probe> for WireProbe {
    fn from(probe: &Probe) -> Self {
        Self {
            namespace: probe.service.service.namespace.to_string(),
            name: probe.service.service.name.to_string(),
            port: probe.service.port.to_string(),
            protocol: probe.protocol.as_api_str().to_owned(),
            frontend: probe.frontend.to_string(),
            destination: probe.destination,
            source: probe.source,
            expected: match &probe.expected {
                Expected::Endpoints {
                    endpoints,
                    masquerade,
                } => WireExpected::Endpoints {
                    endpoints: endpoints.iter().copied().collect(),
                    masquerade: *masquerade,
                },
                Expected::Hairpin { endpoints, itself } => WireExpected::Hairpin {
                    endpoints: endpoints.iter().copied().collect(),
                    itself: *itself,
                },
                Expected::Reject => WireExpected::Reject,
                Expected::Drop => WireExpected::Drop,
                Expected::NoLocalEndpoint => WireExpected::NoLocalEndpoint,
                Expected::RejectUnlessFiltered => WireExpected::RejectUnlessFiltered,
            },
        }
    }
}

impl TryFrom<WireProbe> for Probe {
    type Error = anyhow::Error;

    fn try_from(wire: WireProbe) -> anyhow::Result<Self> {
        let protocol = Protocol::from_api(&wire.protocol)
            .ok_or_else(|| anyhow::anyhow!("protocol {:?}", wire.protocol))?;
        let frontend = FRONTENDS
            .into_iter()
            .find(|f| f.to_string() == wire.frontend)
            .ok_or_else(|| anyhow::anyhow!("frontend {:?}", wire.frontend))?;
        Ok(Self {
            service: ServicePortName::new(
                NamespacedName::new(&wire.namespace, &wire.name),
                &wire.port,
                protocol,
            ),
            frontend,
            destination: wire.destination,
            protocol,
            source: wire.source,
            expected: match wire.expected {
                WireExpected::Endpoints {
                    endpoints,
                    masquerade,
                } => Expected::Endpoints {
                    endpoints: endpoints.into_iter().collect(),
                    masquerade,
                },
                WireExpected::Hairpin { endpoints, itself } => Expected::Hairpin {
                    endpoints: endpoints.into_iter().collect(),
                    itself,
                },
                WireExpected::Reject => Expected::Reject,
                WireExpected::Drop => Expected::Drop,
                WireExpected::NoLocalEndpoint => Expected::NoLocalEndpoint,
                WireExpected::RejectUnlessFiltered => Expected::RejectUnlessFiltered,
            },
        })
    }
}

/// Checks `recorded` in a child process: the probes go to its stdin, the
/// differences come back on its stdout.
fn check_in_child(
    mode: TraceMode,
    family: IpFamily,
    recorded: &Recorded,
) -> anyhow::Result<FamilyResult> {
    let probes = family_probes(family, recorded);
    let wire: Vec<WireProbe> = probes.iter().map(WireProbe::from).collect();
    let input = serde_json::to_vec(&wire)?;
    let exe =
        std::env::current_exe().map_err(|error| anyhow::anyhow!("finding the binary: {error}"))?;
    let mut child = std::process::Command::new(exe)
        .args([WORKER, mode.name(), family.as_api_str()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| anyhow::anyhow!("starting the check worker: {error}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(&input)
            .map_err(|error| anyhow::anyhow!("writing to the check worker: {error}"))?;
    }
    let output = child
        .wait_with_output()
        .map_err(|error| anyhow::anyhow!("waiting for the check worker: {error}"))?;
    if !output.status.success() {
        anyhow::bail!(
            "the check worker failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let found: Vec<WireDifference> = serde_json::from_slice(&output.stdout)
        .map_err(|error| anyhow::anyhow!("reading the check worker's answer: {error}"))?;
    let mut differences = Vec::new();
    for difference in found {
        let probe = probes
            .get(difference.index)
            .ok_or_else(|| anyhow::anyhow!("the check worker named probe {}", difference.index))?;
        differences.push(Difference {
            probe: probe.clone(),
            found: difference.found,
        });
    }
    Ok(FamilyResult {
        checked: probes.len(),
        service_ports: recorded.0.len(),
        differences,
    })
}

/// `kube-proxy __state-check MODE FAMILY`: reads probes (JSON) on stdin,
/// the kernel's rules of MODE and FAMILY, and writes the differences
/// (JSON) on stdout; `args` starts with the program name.
pub fn worker_main(args: &[OsString]) -> ExitCode {
    match worker(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{error:#}");
            ExitCode::FAILURE
        }
    }
}

fn worker(args: &[OsString]) -> anyhow::Result<()> {
    let arg = |n: usize| {
        args.get(n)
            .and_then(|a| a.to_str())
            .ok_or_else(|| anyhow::anyhow!("usage: kube-proxy {WORKER} MODE FAMILY"))
    };
    let mode = match arg(2)? {
        "iptables" => TraceMode::Iptables,
        "nftables" => TraceMode::Nftables,
        "ipvs" => TraceMode::Ipvs,
        "userspace" => TraceMode::Userspace,
        other => anyhow::bail!("mode {other:?} cannot be checked"),
    };
    let family = match arg(3)? {
        "IPv4" => IpFamily::V4,
        "IPv6" => IpFamily::V6,
        other => anyhow::bail!("family {other:?}"),
    };
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input)?;
    let wire: Vec<WireProbe> = serde_json::from_slice(&input)?;
    let live = Live::read_for_check(mode, family)?;
    let local: Vec<IpAddr> = kp_host::local_addresses()
        .map_err(|error| anyhow::anyhow!("reading this node's addresses: {error}"))?
        .into_iter()
        .filter(|ip| family.matches(ip))
        .collect();
    let mut found = Vec::new();
    for (index, wire) in wire.into_iter().enumerate() {
        let probe = Probe::try_from(wire)?;
        if let Some(outcome) = check_probe(&probe, &live, &local)? {
            found.push(WireDifference {
                index,
                found: outcome,
            });
        }
    }
    serde_json::to_writer(std::io::stdout().lock(), &found)?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use kp_model::NodeInfo;
    use kp_sync::testing::service;
    use prometheus_client::encoding::text::encode;

    fn recorded() -> Recorded {
        let mut ports = BTreeMap::new();
        for builder in [
            service("ns", "web", "10.96.0.10", 80)
                .endpoint("10.244.1.2", 8080, true)
                .node_port(30080)
                .etp_local(),
            service("ns", "web", "10.96.0.10", 81).endpoint("10.244.1.2", 8081, true),
            service("ns", "shop", "10.96.0.12", 443)
                .lb_ip("203.0.113.10")
                .source_range("198.51.100.0/24")
                .endpoint("10.244.2.4", 8443, false),
            service("ns", "empty", "10.96.0.11", 80),
        ] {
            let (name, state) = builder.build();
            ports.insert(name, state);
        }
        let node = NodeInfo {
            addresses: vec!["192.168.99.2".parse().unwrap()],
            ..NodeInfo::default()
        };
        (ports, node)
    }

    #[test]
    fn probes_cross_to_the_worker_unchanged() {
        let probes = family_probes(IpFamily::V4, &recorded());
        assert!(probes.len() >= 6, "{probes:#?}");
        let json =
            serde_json::to_string(&probes.iter().map(WireProbe::from).collect::<Vec<_>>()).unwrap();
        let back: Vec<WireProbe> = serde_json::from_str(&json).unwrap();
        let back: Vec<Probe> = back
            .into_iter()
            .map(|w| Probe::try_from(w).unwrap())
            .collect();
        assert_eq!(back, probes);
    }

    #[test]
    fn drift_counts_services_not_ports_or_connections() {
        let probes = family_probes(IpFamily::V4, &recorded());
        let web: Vec<Difference> = probes
            .iter()
            .filter(|p| &*p.service.service.name == "web")
            .map(|p| Difference {
                probe: p.clone(),
                found: "rejected".to_owned(),
            })
            .collect();
        assert!(web.len() >= 3);
        assert_eq!(drifted_services(&web), 1);
        let all: Vec<Difference> = probes
            .iter()
            .map(|p| Difference {
                probe: p.clone(),
                found: "rejected".to_owned(),
            })
            .collect();
        assert_eq!(drifted_services(&all), 3);
    }

    fn exported(registry: &Registry) -> String {
        let mut text = String::new();
        encode(&mut text, registry).unwrap();
        text
    }

    #[test]
    fn a_check_that_cannot_run_is_counted_and_the_last_drift_stays() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let probes = family_probes(IpFamily::V4, &recorded());
        let differences = probes
            .iter()
            .filter(|p| &*p.service.service.name == "web")
            .map(|p| Difference {
                probe: p.clone(),
                found: "rejected".to_owned(),
            })
            .collect();
        let checked = FamilyResult {
            checked: probes.len(),
            service_ports: 4,
            differences,
        };
        assert!(report(&metrics, IpFamily::V4, Ok(checked), Duration::ZERO));
        let text = exported(&registry);
        assert!(
            text.contains("kubeproxy_rs_state_drift_services{ip_family=\"IPv4\"} 1\n"),
            "{text}"
        );
        assert!(
            !text.contains("kubeproxy_rs_state_check_failures_total{"),
            "{text}"
        );
        for _ in 0..2 {
            let failed = Err(anyhow::anyhow!("the check worker failed"));
            assert!(!report(&metrics, IpFamily::V4, failed, Duration::ZERO));
        }
        let text = exported(&registry);
        assert!(
            text.contains("kubeproxy_rs_state_check_failures_total{ip_family=\"IPv4\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("kubeproxy_rs_state_drift_services{ip_family=\"IPv4\"} 1\n"),
            "{text}"
        );
        let clean = FamilyResult {
            checked: probes.len(),
            service_ports: 4,
            differences: Vec::new(),
        };
        assert!(!report(&metrics, IpFamily::V4, Ok(clean), Duration::ZERO));
        let text = exported(&registry);
        assert!(
            text.contains("kubeproxy_rs_state_drift_services{ip_family=\"IPv4\"} 0\n"),
            "{text}"
        );
    }

    /// The observer tracks, for the job being checked, every Service that
    /// later syncs change, and only for that job.
    #[test]
    fn services_changed_after_the_sample_are_tracked_for_its_job() {
        let (jobs, queued) = sync_channel(1);
        let check = DriftCheck {
            sample: 10,
            interval: Duration::ZERO,
            schedule: Mutex::new(Schedule::default()),
            jobs,
            repairs: Repairs::default(),
            changed: Changed::default(),
        };
        let (ports, node) = recorded();
        let stale = kp_sync::StaleConntrack::default();
        let sync = |full: bool, changed: &[&str]| {
            let changed: BTreeSet<NamespacedName> = changed
                .iter()
                .map(|name| NamespacedName::new("ns", name))
                .collect();
            check.on_synced(
                &SyncRequest {
                    family: IpFamily::V4,
                    full,
                    service_ports: &ports,
                    changed_services: &changed,
                    node: &node,
                    stale_conntrack: &stale,
                },
                &SyncOutcome::default(),
            );
        };
        let tracked = || {
            lock(&check.changed).get(&IpFamily::V4).map(|(id, names)| {
                (
                    *id,
                    names.iter().map(|n| n.name.to_string()).collect::<Vec<_>>(),
                )
            })
        };

        sync(true, &["web", "shop"]);
        assert_eq!(tracked(), Some((1, Vec::new())), "the sample's own changes");
        sync(false, &["web"]);
        assert_eq!(tracked(), Some((1, vec!["web".to_owned()])));
        // The queue holds one job: a full sync while it waits keeps
        // tracking for it, with its changes.
        sync(true, &["empty"]);
        assert_eq!(
            tracked(),
            Some((1, vec!["empty".to_owned(), "web".to_owned()]))
        );
        let job = queued.try_recv().unwrap();
        assert_eq!((job.id, job.recorded.0.len()), (1, 4));
        sync(true, &[]);
        assert_eq!(tracked(), Some((2, Vec::new())), "the next job's own entry");
    }

    #[test]
    fn no_check_for_a_sample_of_zero() {
        let mut registry = Registry::default();
        assert!(DriftCheck::start(TraceMode::Iptables, 0, Duration::ZERO, &mut registry).is_none());
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(!text.contains("drift"), "{text}");
    }
}
