//! One run of the proxy, from resolved flags to exit.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::ArgMatches;
use kp_config::{ConfigError, Flags, KubeProxyConfiguration, LocalMode, ProxyMode, Resolved};
use kp_model::{IpFamily, NodeInfo, ProxyEventHandler};
use kp_source::api::{observed_client_from, post_starting_event, ApiSource, RequestObserver};
use kp_source::ManifestSource;
use kp_sync::{Backend, FanOutHandler, Proxier, ProxierConfig, RunnerConfig};
use tokio::sync::watch;

use crate::agent::Agent;
use crate::check::{FamilyResult, Recorder};
use crate::config_watch::{ConfigWatch, CONFIG_CHANGED_MESSAGE};
use crate::drift::DriftCheck;
use crate::logging;
use crate::modes;
use crate::node_name::node_name;
use crate::node_setup::{self, InitStep};
use crate::trace::{Live, TraceMode};

/// How long `--dry-run` waits for the API server's first complete lists.
const API_LIST_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs the proxy as the flags ask: write the config, clean up, print one
/// dry-run sync, or serve until SIGTERM/SIGINT.
pub fn run(flags: &Flags, matches: &ArgMatches) -> anyhow::Result<()> {
    let resolved = kp_config::resolve(flags, matches)?;
    let config = &resolved.config;
    logging::init_with(&logging::LogSettings::from_config(
        &config.logging,
        &resolved.klog,
        resolved.dry_run,
    ))
    .context("setting up logging")?;
    crate::malloc_tuning::log_outcome();
    crate::rlimit::log_outcome();
    for warning in &resolved.warnings {
        tracing::warn!(%warning, "Configuration warning");
    }
    if let Some(path) = &resolved.write_config_to {
        kp_config::write_file(config, path)?;
        return Ok(());
    }
    let mode = config.effective_mode()?;
    if resolved.cleanup {
        return modes::cleanup(mode);
    }
    if resolved.init_only {
        return init_only(config);
    }
    // Armed before the slow start-up, so a change made meanwhile counts.
    let config_watch = match (&resolved.config_file, resolved.dry_run) {
        (Some(path), false) => Some(ConfigWatch::start(path).context("watching --config")?),
        _ => None,
    };
    let node_name = node_name(&config.hostname_override).context("reading the host name")?;
    tracing::info!(node = %node_name, mode = mode.as_str(), "Starting kube-proxy");
    // One worker: the API connections' response bodies are read on the
    // workers, and glibc gives every thread its own arena; with two, the
    // two multi-megabyte list bodies sometimes landed in two arenas that
    // kept them (peak RSS 63 instead of 59 MiB at 10,000 Services). The
    // async work is IO; parsing runs in the source on this thread and
    // syncs on the blocking pool.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        if resolved.dry_run {
            dry_run(&resolved, mode, &node_name).await
        } else {
            let stop = async {
                tokio::select! {
                    () = shutdown_signal() => Ok(()),
                    changed = config_changed(config_watch, resolved.config_change_exit_jitter) => changed,
                }
            };
            serve(&resolved, mode, &node_name, stop).await
        }
    })
}

/// `--init-only`: the privileged node setup (conntrack sysctls, the mode's
/// sysctls), then exit.
fn init_only(config: &KubeProxyConfiguration) -> anyhow::Result<()> {
    for step in node_setup::init_only_steps(config).context("--init-only")? {
        tracing::info!(%step, "Initializing the node");
        match step {
            InitStep::ConntrackSysctls => {
                let report = kp_conntrack::apply_conntrack_sysctls(&config.conntrack);
                if let Some(error) = report.failures.into_iter().next() {
                    return Err(error).context("--init-only: setting the conntrack sysctls");
                }
            }
            InitStep::Sysctl(setting) => {
                node_setup::ensure_sysctl(&setting, Path::new(node_setup::PROC_SYS))
                    .context("--init-only")?;
            }
        }
    }
    tracing::info!("System initialized and --init-only specified");
    Ok(())
}

/// Completes when the `--config` file changed (never without one) and a
/// random wait of up to `jitter` has passed, with the error that ends the
/// process so that the DaemonSet restarts it with the new configuration.
/// The proxy serves on with the old configuration while it waits; the wait
/// spreads the restarts of a fleet whose ConfigMap changed, and with them
/// the lists each restarted proxy asks of the API server.
async fn config_changed(watch: Option<ConfigWatch>, jitter: Duration) -> anyhow::Result<()> {
    let Some(watch) = watch else {
        return std::future::pending().await;
    };
    match watch.changed().await {
        Ok(changed) => {
            let wait = random_up_to(jitter);
            if !wait.is_zero() {
                tracing::info!(
                    path = %changed.path.display(),
                    wait = %kp_sync::proxier::go_duration(wait),
                    "Configuration file changed; exiting after a random wait so that the nodes do not all restart at once"
                );
                tokio::time::sleep(wait).await;
            }
            tracing::error!(
                path = %changed.path.display(),
                change = %changed.change,
                "{CONFIG_CHANGED_MESSAGE}"
            );
            Err(changed.into())
        }
        Err(error) => Err(anyhow::Error::new(error).context("watching --config")),
    }
}

/// Prints an error for the operator: every validation problem on its own
/// line, other errors with their chain of causes.
pub fn report_error(error: &anyhow::Error) {
    if let Some(ConfigError::Invalid(errors)) = error.downcast_ref::<ConfigError>() {
        eprintln!(
            "Error: invalid configuration ({} problems):",
            errors.0.len()
        );
        for message in errors.messages() {
            eprintln!("  {message}");
        }
        return;
    }
    eprintln!("Error: {error:#}");
}

/// Loads the objects once (from the manifests, or a first complete list from
/// the API server), runs one sync per family and lets the backends print
/// what they would program.
async fn dry_run(resolved: &Resolved, mode: ProxyMode, node_name: &str) -> anyhow::Result<()> {
    let config = &resolved.config;
    let proxiers: Vec<_> =
        build_proxiers(config, node_name, modes::families(mode, true), |family| {
            Ok(modes::backend(
                mode,
                family,
                config,
                resolved.nftables_layout,
                true,
            )?)
        })?
        .into_iter()
        .map(Arc::new)
        .collect();
    load_once(resolved, &proxiers, node_name, "--dry-run").await?;
    for proxier in &proxiers {
        proxier
            .sync_once()
            .with_context(|| format!("dry-run sync for {:?}", proxier.family()))?;
    }
    Ok(())
}

/// `kube-proxy check`: the state loaded as `--dry-run` loads it, synced into
/// recorders, then each family held against the kernel's live rules of the
/// configured mode.
pub fn check(
    flags: &Flags,
    matches: &ArgMatches,
) -> anyhow::Result<Vec<(IpFamily, TraceMode, FamilyResult)>> {
    let resolved = kp_config::resolve(flags, matches)?;
    let config = &resolved.config;
    logging::init_with(&logging::LogSettings::from_config(
        &config.logging,
        &resolved.klog,
        true,
    ))
    .context("setting up logging")?;
    let mode = config.effective_mode()?;
    let trace_mode = crate::check::trace_mode(mode)?;
    let node_name = node_name(&config.hostname_override).context("reading the host name")?;
    let mut recorded = Vec::new();
    let proxiers: Vec<_> =
        build_proxiers(config, &node_name, modes::families(mode, false), |family| {
            let (recorder, seen) = Recorder::new();
            recorded.push((family, seen));
            Ok(Box::new(recorder))
        })?
        .into_iter()
        .map(Arc::new)
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(load_once(&resolved, &proxiers, &node_name, "check"))?;
    for proxier in &proxiers {
        proxier
            .sync_once()
            .with_context(|| format!("loading the state for {:?}", proxier.family()))?;
    }
    let local = kp_host::local_addresses()
        .map_err(|error| anyhow::anyhow!("reading this node's addresses: {error}"))?;
    let mut results = Vec::new();
    for (family, seen) in recorded {
        let state = seen
            .lock()
            .map_err(|_| anyhow::anyhow!("the recorded state is unreadable"))?
            .take()
            .ok_or_else(|| anyhow::anyhow!("no sync of {family:?} was recorded"))?;
        let live = Live::read_for_check(trace_mode, family)?;
        let local: Vec<_> = local
            .iter()
            .copied()
            .filter(|ip| family.matches(ip))
            .collect();
        results.push((
            family,
            trace_mode,
            crate::check::check_family(family, &state, &live, &local)?,
        ));
    }
    Ok(results)
}

/// Loads the objects once into `proxiers`: the manifests, or a first
/// complete list from the API server.
async fn load_once(
    resolved: &Resolved,
    proxiers: &[Arc<Proxier>],
    node_name: &str,
    what: &str,
) -> anyhow::Result<()> {
    let handler = fan_out(proxiers);
    if let Some(manifests) = &resolved.manifests {
        let mut source = ManifestSource::new(manifests, node_name);
        let report = source.load(handler.as_ref())?;
        tracing::info!(
            objects = report.objects,
            rejected = report.rejected().count(),
            "Loaded manifests"
        );
    } else {
        let client = api_client(resolved, None).await?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let source = ApiSource::new(client, node_name);
        let listing = tokio::spawn(source.run(handler, stopped(stop_rx)));
        let synced = wait_for(API_LIST_TIMEOUT, || proxiers.iter().all(|p| p.is_synced())).await;
        // Ignoring the error is right: it only says the source already stopped.
        let _ = stop_tx.send(true);
        let _ = listing.await;
        if !synced {
            bail!("{what}: no complete list of Services and EndpointSlices from the API server within {API_LIST_TIMEOUT:?}");
        }
    }
    Ok(())
}

/// The API client from `clientConnection` and `--master`.
async fn api_client(
    resolved: &Resolved,
    observer: Option<Arc<dyn RequestObserver>>,
) -> anyhow::Result<kube::Client> {
    let connection = &resolved.config.client_connection;
    let kubeconfig = Some(connection.kubeconfig.as_str())
        .filter(|path| !path.is_empty())
        .map(Path::new);
    // client-go treats a zero qps or burst as "use the default" (5 and 10).
    let qps = if connection.qps > 0.0 {
        connection.qps
    } else {
        5.0
    };
    let burst = u32::try_from(connection.burst)
        .ok()
        .filter(|b| *b > 0)
        .unwrap_or(10);
    let client =
        observed_client_from(kubeconfig, resolved.master.as_deref(), qps, burst, observer).await?;
    Ok(client)
}

/// Polls `condition` until it holds or `timeout` passes.
async fn wait_for(timeout: Duration, condition: impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    while !condition() {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

/// Runs the proxy until `stop` completes, returning its result. Rules stay
/// in place on exit, as upstream leaves them.
async fn serve(
    resolved: &Resolved,
    mode: ProxyMode,
    node_name: &str,
    stop: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let config = &resolved.config;
    if let Some(score) = config.oom_score_adj {
        if let Err(error) = node_setup::apply_oom_score(score, Path::new(node_setup::PROC_SELF)) {
            tracing::warn!(%error, "Failed to apply the OOM score adjustment; continuing");
        }
    }
    // Each failure is logged by name; none stops the proxy.
    let _ = kp_conntrack::apply_conntrack_sysctls(&config.conntrack);
    // Removing what the other modes left runs `iptables-save` and
    // `iptables-restore` for each flavour (some 80 ms at start): it runs
    // while the source lists the API server's objects, and the first sync
    // waits for it.
    let (leftovers_gone_tx, leftovers_gone) = watch::channel(false);
    let _leftovers = tokio::task::spawn_blocking(move || {
        modes::remove_leftovers(mode);
        // Nobody listening means every proxier has stopped already.
        let _ = leftovers_gone_tx.send(true);
    });
    let agent = Agent::new(config, mode, node_name)?;
    let drift = DriftCheck::start(
        crate::check::trace_mode(mode)?,
        resolved.state_check_service_ports,
        resolved.state_check_interval,
        &mut agent.registry(),
    );
    let proxiers = build_proxiers(config, node_name, modes::families(mode, false), |family| {
        Ok(modes::backend(
            mode,
            family,
            config,
            resolved.nftables_layout,
            false,
        )?)
    })?
    .into_iter()
    .map(|proxier| {
        let proxier = agent.observe(proxier);
        Arc::new(match &drift {
            Some(drift) => {
                drift.repair_with(proxier.repair_handle());
                proxier.with_observer(Arc::clone(drift) as Arc<dyn kp_sync::SyncObserver>)
            }
            None => proxier,
        })
    })
    .collect::<Vec<_>>();
    let handler = fan_out(&proxiers);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    for proxier in &proxiers {
        let run = Arc::clone(proxier).run(stopped(stop_rx.clone()));
        let mut leftovers_gone = leftovers_gone.clone();
        tasks.spawn(async move {
            // An error means the removal ended without a word (it
            // panicked); syncing is right either way.
            let _ = leftovers_gone.wait_for(|gone| *gone).await;
            run.await;
        });
    }
    agent.serve(config, mode, &proxiers, &stop_rx, &mut tasks)?;
    let source_run: Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>> =
        match &resolved.manifests {
            Some(manifests) => {
                let source = ManifestSource::new(manifests, node_name);
                let run = source.run(handler, stopped(stop_rx.clone()));
                Box::pin(async move { run.await.context("manifest source stopped") })
            }
            None => {
                let client = api_client(resolved, Some(agent.api_requests())).await?;
                agent.use_api_client(&client);
                // Upstream posts this event and carries on when it cannot.
                let _ = post_starting_event(&client, node_name).await;
                let run = ApiSource::new(client, node_name).run(handler, stopped(stop_rx.clone()));
                Box::pin(async move {
                    run.await;
                    Ok(())
                })
            }
        };
    tokio::pin!(source_run);
    let result = tokio::select! {
        result = &mut source_run => result,
        stopped = stop => {
            tracing::info!("Shutting down; rules stay in place");
            stopped
        }
    };
    // Ignoring the send error is right: it fails only when every receiver
    // is already gone, i.e. everything has stopped.
    let _ = stop_tx.send(true);
    agent.stop();
    while tasks.join_next().await.is_some() {}
    result
}

/// One proxier per IP family the mode serves.
fn build_proxiers(
    config: &KubeProxyConfiguration,
    node_name: &str,
    families: Vec<IpFamily>,
    mut backend: impl FnMut(IpFamily) -> anyhow::Result<Box<dyn Backend>>,
) -> anyhow::Result<Vec<Proxier>> {
    let periods = config
        .sync_periods()
        .context("sync periods must not be negative")?;
    let runner = RunnerConfig {
        min_interval: periods.min_sync_period,
        max_interval: periods.sync_period,
        // Upstream retries a failed sync after minSyncPeriod; a floor keeps a
        // failing kernel from being hammered when minSyncPeriod is 0.
        retry_interval: periods.min_sync_period.max(Duration::from_secs(1)),
    };
    let node = NodeInfo {
        name: node_name.to_owned(),
        ..NodeInfo::default()
    };
    let topology = kp_model::TopologyOptions {
        prefer_same_node_hints: kp_config::feature_enabled(
            config,
            kp_config::PREFER_SAME_TRAFFIC_DISTRIBUTION,
        ),
    };
    let needs_pod_cidrs = config.effective_detect_local_mode()? == LocalMode::NodeCidr;
    if needs_pod_cidrs {
        tracing::info!("detectLocalMode is NodeCIDR: no rules until the Node has spec.podCIDRs");
    }
    let mut proxiers = Vec::new();
    for family in families {
        let backend = backend(family)?;
        let proxier_config = ProxierConfig {
            family,
            node: node.clone(),
            runner,
        };
        let proxier = Proxier::new(proxier_config, backend).with_topology(topology);
        proxiers.push(if needs_pod_cidrs {
            proxier.waiting_for_pod_cidrs()
        } else {
            proxier
        });
    }
    Ok(proxiers)
}

fn fan_out(proxiers: &[Arc<Proxier>]) -> Arc<dyn ProxyEventHandler> {
    let handlers = proxiers
        .iter()
        .map(|p| Arc::clone(p) as Arc<dyn ProxyEventHandler>)
        .collect();
    Arc::new(FanOutHandler::new(handlers))
}

async fn stopped(mut stop: watch::Receiver<bool>) {
    // An error means the sender is gone, which also means stop.
    let _ = stop.wait_for(|stop| *stop).await;
}

async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "Cannot listen for SIGTERM; only SIGINT stops the proxy");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}

/// A random duration from 0 to `max`, in milliseconds: the standard
/// library's per-process random hash keys are the randomness (the wait
/// needs no more).
fn random_up_to(max: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let millis = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
    if millis == 0 {
        return Duration::ZERO;
    }
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    Duration::from_millis(hasher.finish() % millis.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_waits_stay_within_their_bound_and_spread_over_it() {
        assert_eq!(random_up_to(Duration::ZERO), Duration::ZERO);
        let max = Duration::from_secs(30);
        let draws: Vec<Duration> = (0..200).map(|_| random_up_to(max)).collect();
        assert!(draws.iter().all(|d| *d <= max), "{draws:?}");
        let low = draws.iter().filter(|d| **d < max / 2).count();
        // 200 fair draws fall below the middle between 60 and 140 times
        // but for a chance of less than one in 10^7.
        assert!((60..=140).contains(&low), "{low} of 200 below 15 s");
    }
}
