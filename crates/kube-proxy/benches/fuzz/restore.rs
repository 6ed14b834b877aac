//! Feeding rendered rulesets to `iptables-restore --test` (legacy and nft)
//! inside network namespaces created here and removed on drop, never in
//! the machine's own namespace.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use kp_model::IpFamily;
use kp_testkit::netns::Netns;

use crate::report::{Counts, Failures};

/// One sync's `--dry-run` output: the commands printed before the restore
/// input (creating chains the input jumps to but does not declare) and the
/// input itself.
#[derive(Debug, Clone)]
pub struct SyncOutput {
    /// The family synced.
    pub family: IpFamily,
    /// The whole dry-run text.
    pub text: String,
}

/// Runs restore tests with the iptables flavors this host has.
#[derive(Debug)]
pub struct Restorer {
    flavors: Vec<&'static str>,
}

impl Restorer {
    /// The flavors (`legacy`, `nft`) whose restore programs run here.
    pub fn detect() -> Self {
        let flavors = ["legacy", "nft"]
            .into_iter()
            .filter(|flavor| {
                Command::new(format!("iptables-{flavor}-restore"))
                    .arg("--version")
                    .output()
                    .is_ok_and(|o| o.status.success())
            })
            .collect();
        Self { flavors }
    }

    /// The flavors used.
    pub fn flavors(&self) -> &[&'static str] {
        &self.flavors
    }

    /// Applies a session's syncs in order, up to the last one `sampled`,
    /// in a fresh namespace per flavor: each sampled ruleset is first
    /// checked with `--test`; every one is committed, so a partial sync is
    /// checked on top of the rules before it, as on a node.
    pub fn test_session(
        &self,
        outputs: &[SyncOutput],
        sampled: &[bool],
        counts: &mut Counts,
        failures: &Failures,
        case: u64,
        input: &str,
    ) {
        let Some(last) = sampled.iter().rposition(|s| *s) else {
            return;
        };
        for flavor in &self.flavors {
            let ns = match Netns::create(&format!("fuzz-{flavor}")) {
                Ok(ns) => ns,
                Err(error) => {
                    counts.other += 1;
                    failures.report(case, "creating a network namespace failed", &error, "");
                    return;
                }
            };
            // Programs spawned from a thread inside the namespace run there,
            // without `ip netns exec`'s remounting (30 ms a program).
            let entered = ns.try_run(|| {
                for (output, test) in outputs.iter().zip(sampled).take(last + 1) {
                    counts.restore_tested += u64::from(*test);
                    let has_endpoints = output.text.contains("-A KUBE-SEP-");
                    counts.restore_with_endpoints += u64::from(*test && has_endpoints);
                    if let Err(message) = apply(flavor, output, *test) {
                        counts.restore_rejected += 1;
                        let detail = format!("{message}\n---- ruleset\n{}", output.text);
                        failures.report(case, "iptables-restore refused a ruleset", &detail, input);
                        break;
                    }
                }
            });
            if let Err(error) = entered {
                counts.other += 1;
                failures.report(case, "entering a network namespace failed", &error, "");
            }
        }
    }
}

/// Runs the commands of `output`, then its restore input with `--test`
/// (when `test`) and for real.
fn apply(flavor: &str, output: &SyncOutput, test: bool) -> Result<(), String> {
    let (iptables, header) = match output.family {
        IpFamily::V4 => ("iptables", "# IPv4 iptables-restore input"),
        IpFamily::V6 => ("ip6tables", "# IPv6 ip6tables-restore input"),
    };
    let mut lines = output.text.lines();
    // The commands before the input; `-N` of a chain that exists fails, as
    // it would on a node where the chain is already there.
    for line in lines.by_ref() {
        if line.starts_with(header) {
            break;
        }
        let Some(command) = line.strip_prefix("# ") else {
            continue;
        };
        let mut words = command.split(' ');
        if words.next() == Some(iptables) {
            let args: Vec<&str> = words.collect();
            exec(&format!("{iptables}-{flavor}"), &args, "")?;
        }
    }
    let input: String = lines.map(|l| format!("{l}\n")).collect();
    let restore = format!("{iptables}-{flavor}-restore");
    let tested = if test {
        exec(&restore, &["--test", "--noflush"], &input)?
    } else {
        exec(&restore, &["--noflush"], &input)?
    };
    if !tested.status.success() {
        return Err(format!(
            "{restore}{} --noflush: {}",
            if test { " --test" } else { "" },
            String::from_utf8_lossy(&tested.stderr)
        ));
    }
    if !test {
        return Ok(());
    }
    let applied = exec(&restore, &["--noflush"], &input)?;
    if !applied.status.success() {
        return Err(format!(
            "{restore} --noflush (after --test accepted it): {}",
            String::from_utf8_lossy(&applied.stderr)
        ));
    }
    Ok(())
}

/// Runs `program` in the calling thread's network namespace.
fn exec(program: &str, args: &[&str], stdin: &str) -> Result<Output, String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running {program}: {e}"))?;
    if let Some(mut stdin_pipe) = child.stdin.take() {
        stdin_pipe
            .write_all(stdin.as_bytes())
            .map_err(|e| format!("writing to {program}: {e}"))?;
    }
    child
        .wait_with_output()
        .map_err(|e| format!("waiting for {program}: {e}"))
}
