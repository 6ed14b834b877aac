//! The lone-restore reference: what the restore program alone takes to
//! apply one partial sync's input to the full ruleset, against which the
//! binary's partial sync is judged (the target: within 15 %).
//!
//! A separate step, so that the capture costs nothing in the runs: a fresh
//! binary whose PATH starts with a wrapper for the restore program
//! (`iptables-legacy-restore`) that keeps a copy of each input and then
//! execs the real program. After the first sync one Service's slice is
//! patched as the runs patch it (its second endpoint replaced, or an
//! endpoint added: `KP_E2E_PATCH_KIND`), then patched back, and the inputs
//! of the two partial syncs that applied them are kept: there and back,
//! each applies to the rules the other leaves. The binary is stopped (the
//! rules stay, exactly as it made them), and five times each input is
//! restored alone, in turn, with the proxy's arguments, a second apart
//! (timed, spawn included, as the proxy's sync includes it); the median of
//! the ten is the reference.

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use kp_testkit::apiserver::TestApiServer;

use crate::mode::Mode;
use crate::proxy::{unix_now, Proxy, SyncKind};
use crate::run::{applied, FIRST_SYNC_TIMEOUT, PATCH_EVERY};
use crate::workload::Workload;

/// Timed restores of each kept input.
pub const ROUNDS: usize = 5;
/// Rest before each timed restore.
const REST: Duration = Duration::from_secs(1);
/// Patches tried until one is applied by a partial sync.
const ATTEMPTS: usize = 5;

/// What the reference measured.
#[derive(Debug, Clone)]
pub struct Lone {
    /// The first kept input's size.
    pub input_lines: usize,
    pub input_bytes: usize,
    /// The lone restores of both inputs (ms).
    pub restore_ms: Vec<f64>,
    /// The binary's partial syncs that wrote the inputs, wrapper included,
    /// mean (ms): not a figure, a plausibility check.
    pub captured_sync_ms: f64,
}

/// Runs the reference for `workload` in `mode`; the calling thread is in a
/// fresh node namespace; `dir` holds the wrapper and the copies.
pub async fn lone_restore(
    mode: Mode,
    workload: Workload,
    kubeconfig: &Path,
    log: &Path,
    dir: &Path,
) -> Lone {
    let server = Arc::new(TestApiServer::start().await.unwrap());
    server.write_kubeconfig(kubeconfig).unwrap();
    workload.populate(&server);
    mode.prepare_node();
    let measuring = {
        let server = Arc::clone(&server);
        let (kubeconfig, log, dir): (PathBuf, PathBuf, PathBuf) =
            (kubeconfig.into(), log.into(), dir.into());
        tokio::task::spawn_blocking(move || {
            measure(mode, workload, &server, &kubeconfig, &log, &dir)
        })
    };
    match measuring.await {
        Ok(lone) => lone,
        Err(error) => std::panic::resume_unwind(error.into_panic()),
    }
}

fn measure(
    mode: Mode,
    workload: Workload,
    server: &TestApiServer,
    kubeconfig: &Path,
    log: &Path,
    dir: &Path,
) -> Lone {
    let wrappers = dir.join("wrappers");
    let copies = dir.join("inputs");
    std::fs::create_dir_all(&wrappers).unwrap();
    std::fs::create_dir_all(&copies).unwrap();
    let restore = mode
        .restore()
        .expect("a lone-restore reference only for modes that run a restore program");
    let real = which(restore);
    let wrapper = wrappers.join(restore);
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n\
             # Keeps a copy of the input, then restores it with the real program.\n\
             copy={}/$(date +%s%N).in\n\
             cat > \"$copy\"\n\
             exec {} \"$@\" < \"$copy\"\n",
            copies.display(),
            real.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();

    let proxy = Proxy::spawn(mode, kubeconfig, log, Some(&wrappers));
    let mut watch = proxy.first_sync(FIRST_SYNC_TIMEOUT);
    let first_end = watch.seen.last_sync.unwrap();
    let settle = (first_end + PATCH_EVERY.as_secs_f64() - unix_now()).max(0.0);
    std::thread::sleep(Duration::from_secs_f64(settle));
    let i = workload.patch_target(0, 1);
    let original = workload.populated(i);
    let mut kept = None;
    for attempt in 0..ATTEMPTS {
        let mut capture = |endpoints: &[Ipv4Addr]| {
            std::thread::sleep(PATCH_EVERY);
            watch.refresh();
            let copies_before = inputs(&copies).len();
            server.update(Workload::slice(i, endpoints, Some(SystemTime::now())));
            let (sync, _) = applied(&mut watch, &proxy);
            let new = inputs(&copies);
            let alone =
                sync.kind == SyncKind::Partial && sync.syncs == 1 && new.len() == copies_before + 1;
            alone.then(|| (new.last().unwrap().clone(), sync.duration * 1000.0))
        };
        // There and back: after both, the rules are as before.
        let there = capture(&workload.changed(i, Workload::patched_endpoint(100 + attempt)));
        let back = capture(&original);
        if let (Some(there), Some(back)) = (there, back) {
            kept = Some([there, back]);
            break;
        }
        eprintln!("  lone restore: a patch's sync was not a lone partial one; again");
    }
    let kept = kept.expect("no two patches were applied by partial syncs alone");
    drop(proxy);

    let mut restore_ms = Vec::with_capacity(2 * ROUNDS);
    for _ in 0..ROUNDS {
        for (input, _) in &kept {
            // As between the proxy's syncs, the kernel has finished with
            // the last change (nf_tables frees replaced objects in a
            // worker after the commit).
            std::thread::sleep(REST);
            let stdin = File::open(input).unwrap();
            let started = Instant::now();
            let out = Command::new(&real)
                .args(mode.restore_args())
                .stdin(stdin)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .output()
                .unwrap();
            restore_ms.push(started.elapsed().as_secs_f64() * 1000.0);
            assert!(
                out.status.success(),
                "the lone restore of {} failed: {}",
                input.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let text = std::fs::read_to_string(&kept[0].0).unwrap();
    Lone {
        input_lines: text.lines().count(),
        input_bytes: text.len(),
        restore_ms,
        captured_sync_ms: kept.iter().map(|(_, ms)| ms).sum::<f64>() / 2.0,
    }
}

/// The copies kept so far, oldest first.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    paths.sort();
    paths
}

/// Where `program` is on the PATH.
fn which(program: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| panic!("{program} is not on the PATH"))
}
