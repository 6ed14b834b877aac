//! Target `pipeline`: generated clusters, evolving and now and then damaged,
//! written to a manifest directory and read by the manifest source, which
//! feeds an IPv4 and an IPv6 proxier whose iptables backends run dry,
//! writing their ruleset to a buffer. One case is one read of the manifests
//! followed by a sync of both families; a session of 1 to 4 cases shares
//! source and proxiers, so later syncs are partial.

use std::io::{self, Write};
use std::net::IpAddr;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kp_iptables::{IptablesBackend, IptablesOptions, LocalDetector, NodePortAddresses};
use kp_model::{IpFamily, NodeInfo, ProxyEventHandler};
use kp_source::ManifestSource;
use kp_sync::{FanOutHandler, Proxier, ProxierConfig, RunnerConfig};

use crate::cluster::Cluster;
use crate::manifests::check_errors;
use crate::mutate;
use crate::report::{Counts, Failures};
use crate::restore::{Restorer, SyncOutput};
use crate::rng::Gen;

const NODE: &str = "node-1";
const FILES: [&str; 2] = ["fuzz.yaml", "fuzz.json"];

/// A writer into a buffer shared with the test.
#[derive(Debug, Clone, Default)]
struct SharedBuf(Arc<Mutex<Vec<u8>>>);

/// What a session produced.
pub struct Session {
    /// Every sync's output, in order.
    pub outputs: Vec<SyncOutput>,
    /// The manifest text of every step, for failure reports.
    pub inputs: String,
}

impl SharedBuf {
    fn take(&self) -> String {
        let bytes = std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner));
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl Write for SharedBuf {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut inner = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        inner.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Runs one session of `steps` cases in `dir`, the first numbered `case`.
#[allow(clippy::too_many_arguments)]
pub fn session(
    gen: &mut Gen,
    dir: &Path,
    steps: u64,
    case: u64,
    counts: &mut Counts,
    failures: &Failures,
    restorer: Option<&Restorer>,
    sample_every: u64,
) {
    let mut session = Session {
        outputs: Vec::new(),
        inputs: String::new(),
    };
    let run = std::panic::catch_unwind(AssertUnwindSafe(|| {
        run_session(gen, dir, steps, case, counts, failures, &mut session)
    }));
    if run.is_err() {
        counts.panics += 1;
        failures.report(
            case,
            "the pipeline panicked",
            &"(see the panic above)",
            &session.inputs,
        );
        return;
    }
    let renders = session.outputs.len() as u64;
    counts.rendered += renders;
    let sampled: Vec<bool> = (0..renders)
        .map(|_| gen.below(sample_every as usize) == 0)
        .collect();
    if let Some(restorer) = restorer.filter(|_| sampled.contains(&true)) {
        restorer.test_session(
            &session.outputs,
            &sampled,
            counts,
            failures,
            case,
            &session.inputs,
        );
    }
}

fn run_session(
    gen: &mut Gen,
    dir: &Path,
    steps: u64,
    case: u64,
    counts: &mut Counts,
    failures: &Failures,
    session: &mut Session,
) {
    for file in FILES {
        let _ = std::fs::remove_file(dir.join(file));
    }
    let (options, node_ports) = options(gen);
    let families = [IpFamily::V4, IpFamily::V6];
    let bufs = [SharedBuf::default(), SharedBuf::default()];
    let proxiers: Vec<Arc<Proxier>> = families
        .iter()
        .zip(&bufs)
        .map(|(family, buf)| proxier(*family, &options, &node_ports, buf))
        .collect();
    let handler = FanOutHandler::new(
        proxiers
            .iter()
            .map(|p| Arc::clone(p) as Arc<dyn ProxyEventHandler>)
            .collect(),
    );
    let mut source = ManifestSource::new(dir, NODE);
    let mut cluster = Cluster::random(gen);
    for step in 0..steps {
        if step > 0 {
            cluster.evolve(gen);
        }
        let (file, mut text) = cluster.write(gen);
        if gen.chance(0.2) {
            text = mutate::damage(gen, &text, 4);
        }
        session
            .inputs
            .push_str(&format!("#### step {step}: {file}\n{text}\n"));
        for other in FILES.iter().filter(|f| **f != file) {
            let _ = std::fs::remove_file(dir.join(other));
        }
        if let Err(error) = std::fs::write(dir.join(file), &text) {
            counts.other += 1;
            failures.report(case, "writing the manifest failed", &error, "");
            return;
        }
        counts.cases += 1;
        let report = match source.load(&handler) {
            Ok(report) => report,
            Err(error) => {
                counts.other += 1;
                failures.report(case, "the manifest source failed", &error, &session.inputs);
                continue;
            }
        };
        check_errors(&report.errors, counts, failures, case, &session.inputs);
        for ((proxier, buf), family) in proxiers.iter().zip(&bufs).zip(families) {
            if let Err(error) = proxier.sync_once() {
                counts.other += 1;
                let detail = kp_sync::error_chain(&error);
                failures.report(case, "a sync failed", &detail, &session.inputs);
                continue;
            }
            session.outputs.push(SyncOutput {
                family,
                text: buf.take(),
            });
        }
    }
}

fn proxier(
    family: IpFamily,
    options: &IptablesOptions,
    node_ports: &NodePortAddresses,
    buf: &SharedBuf,
) -> Arc<Proxier> {
    let local: Vec<IpAddr> = ["127.0.0.1", "192.168.99.2", "::1", "fd00:192:168:99::2"]
        .iter()
        .filter_map(|a| a.parse().ok())
        .collect();
    let backend = IptablesBackend::dry_run(
        family,
        options.clone(),
        node_ports.clone(),
        Box::new(buf.clone()),
    )
    .map(|b| b.with_local_addresses(move || Ok(local.clone())));
    let backend = match backend {
        Ok(backend) => backend,
        Err(error) => panic!("the generated options are valid: {error}"),
    };
    let config = ProxierConfig {
        family,
        node: NodeInfo {
            name: NODE.to_owned(),
            ..NodeInfo::default()
        },
        runner: RunnerConfig {
            min_interval: Duration::ZERO,
            max_interval: Duration::from_secs(3600),
            retry_interval: Duration::from_secs(1),
        },
    };
    Arc::new(Proxier::new(config, Box::new(backend)))
}

/// Renderer options and NodePort addresses as a configuration could set
/// them.
fn options(gen: &mut Gen) -> (IptablesOptions, NodePortAddresses) {
    let cidrs = |list: &[&str]| list.iter().filter_map(|c| c.parse().ok()).collect();
    let local_detector = match gen.below(5) {
        0 => LocalDetector::None,
        1 => LocalDetector::ClusterCidr(cidrs(&["10.244.0.0/16", "fd00:10:244::/48"])),
        2 => LocalDetector::NodeCidr,
        3 => LocalDetector::BridgeInterface("cbr0".to_owned()),
        _ => LocalDetector::InterfaceNamePrefix("veth".to_owned()),
    };
    let options = IptablesOptions {
        masquerade_mark: kp_node::MasqueradeMark::new(gen.below(32) as u8).unwrap_or_default(),
        masquerade_all: gen.chance(0.2),
        local_detector,
        localhost_node_ports: gen.chance(0.7),
        random_fully: gen.chance(0.5),
        conntrack_tcp_be_liberal: gen.chance(0.2),
        ..IptablesOptions::default()
    };
    let node_ports = match gen.below(4) {
        0 => NodePortAddresses::Select {
            cidrs: cidrs(&["192.168.99.0/24", "fd00:192:168:99::/64"]),
            primary: gen.chance(0.5),
        },
        1 => NodePortAddresses::Select {
            cidrs: cidrs(&["127.0.0.0/8"]),
            primary: gen.chance(0.5),
        },
        _ => NodePortAddresses::All,
    };
    (options, node_ports)
}
