//! An in-memory kernel for unit tests: restore input is applied to a
//! [`Ruleset`] per family, jump rules and calls are recorded.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use kp_model::IpFamily;

use super::{restore_error_line, Applier, ApplyError, SavedTable};
use crate::jumps::{JumpRule, Table, JUMP_RULES};
use crate::tracer::Ruleset;

/// The shared state behind any number of [`FakeApplier`]s. Clone it to keep
/// a handle for assertions after the applier moved into a backend.
#[derive(Debug, Clone, Default)]
pub struct FakeKernel(Arc<Mutex<State>>);

/// An [`Applier`] over a [`FakeKernel`]. Behaves like the real programs
/// where tests can observe it: restore input that does not parse is
/// rejected whole with the failing line, a jump to a missing chain fails.
#[derive(Debug, Clone)]
pub struct FakeApplier(FakeKernel);

/// One call a [`FakeApplier`] received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeCall {
    /// [`Applier::restore`] with its input.
    Restore(IpFamily, String),
    /// [`Applier::save_table`].
    SaveTable(IpFamily, Table),
    /// [`Applier::chain_exists`].
    ChainExists(IpFamily, Table, String),
    /// [`Applier::ensure_chain`].
    EnsureChain(IpFamily, Table, String),
    /// [`Applier::delete_jump`]: table, built-in chain, target.
    DeleteJump(IpFamily, Table, &'static str, &'static str),
    /// [`Applier::flush_and_delete_chain`].
    FlushAndDeleteChain(IpFamily, Table, String),
}

#[derive(Debug, Default)]
struct State {
    rulesets: BTreeMap<IpFamily, Ruleset>,
    jumps: Vec<(IpFamily, JumpRule)>,
    calls: Vec<FakeCall>,
    failing_restores: usize,
    /// Lines holding this text are refused, as the kernel refuses a rule
    /// it cannot take.
    refused_text: Option<String>,
}

impl FakeKernel {
    /// An empty kernel.
    pub fn new() -> Self {
        Self::default()
    }

    /// An applier programming this kernel.
    pub fn applier(&self) -> FakeApplier {
        FakeApplier(self.clone())
    }

    /// The rules of `family` (jump rules not included; see
    /// [`FakeKernel::jumps`]).
    pub fn ruleset(&self, family: IpFamily) -> Ruleset {
        self.lock()
            .rulesets
            .get(&family)
            .cloned()
            .unwrap_or_default()
    }

    /// The chains of `table`, sorted.
    pub fn chains(&self, family: IpFamily, table: Table) -> Vec<String> {
        let state = self.lock();
        let ruleset = state.rulesets.get(&family);
        ruleset
            .map(|r| r.chains(table).into_iter().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// The jump rules in built-in chains, in the order they were inserted.
    pub fn jumps(&self, family: IpFamily) -> Vec<JumpRule> {
        let state = self.lock();
        let of_family = state.jumps.iter().filter(|(f, _)| *f == family);
        of_family.map(|(_, rule)| *rule).collect()
    }

    /// Every call so far, oldest first, leaving the record empty.
    pub fn take_calls(&self) -> Vec<FakeCall> {
        std::mem::take(&mut self.lock().calls)
    }

    /// The next `count` restores fail as `iptables-restore` does on a
    /// rejected line, applying nothing.
    pub fn fail_restores(&self, count: usize) {
        self.lock().failing_restores = count;
    }

    /// From now on every restore whose input has a line holding `text` is
    /// refused at that line, as `iptables-restore` refuses a rule the
    /// kernel does not take (`line N failed`), applying nothing.
    pub fn refuse_lines_with(&self, text: &str) {
        self.lock().refused_text = Some(text.to_owned());
    }

    /// Someone else deletes every chain and rule of `table` (a firewall
    /// reload), canary and jump rules included.
    pub fn wipe_table(&self, family: IpFamily, table: Table) {
        let mut state = self.lock();
        let ruleset = state.rulesets.entry(family).or_default();
        let mut text = format!("*{table}\n");
        for chain in ruleset.chains(table) {
            text.push_str(&format!(":{chain} - [0:0]\n"));
        }
        for chain in ruleset.chains(table) {
            text.push_str(&format!("-X {chain}\n"));
        }
        text.push_str("COMMIT\n");
        // Flushing and deleting chains that exist cannot fail.
        let _ = ruleset.apply(&text);
        state
            .jumps
            .retain(|(f, rule)| *f != family || rule.table != table);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding the lock fails anyway.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `text` with each `-I` line that inserts one of the [`JUMP_RULES`] into
/// its table turned into a comment, and those rules with their line numbers.
fn split_jump_inserts(text: &str) -> (String, Vec<(usize, JumpRule)>) {
    let mut out = String::with_capacity(text.len());
    let mut jumps = Vec::new();
    let mut table = "";
    for (index, line) in text.lines().enumerate() {
        if let Some(name) = line.strip_prefix('*') {
            table = name;
        }
        let rule = JUMP_RULES
            .iter()
            .find(|rule| rule.table.as_str() == table && rule.insert_line() == line);
        if let Some(rule) = rule {
            jumps.push((index + 1, *rule));
            out.push('#');
        }
        out.push_str(line);
        out.push('\n');
    }
    (out, jumps)
}

impl FakeApplier {
    fn record(&self, call: FakeCall) -> MutexGuard<'_, State> {
        let mut state = self.0.lock();
        state.calls.push(call);
        state
    }
}

impl Applier for FakeApplier {
    fn restore(&mut self, family: IpFamily, text: &str) -> Result<(), ApplyError> {
        let mut state = self.record(FakeCall::Restore(family, text.to_owned()));
        let command = "fake-iptables-restore --noflush --counters".to_owned();
        let refused = state.refused_text.as_deref().and_then(|refused| {
            text.lines()
                .enumerate()
                .find(|(_, line)| line.contains(refused))
        });
        if let Some((index, line)) = refused {
            return Err(ApplyError::RestoreLine {
                command,
                line: index + 1,
                text: line.to_owned(),
                stderr: format!("iptables-restore: line {} failed", index + 1),
            });
        }
        if state.failing_restores > 0 {
            state.failing_restores -= 1;
            let stderr = "iptables-restore: line 2 failed".to_owned();
            let line = restore_error_line(&stderr).unwrap_or(1);
            let text = text.lines().nth(line - 1).unwrap_or_default().to_owned();
            return Err(ApplyError::RestoreLine {
                command,
                line,
                text,
                stderr,
            });
        }
        // Jump rules inserted into built-in chains are kept apart from the
        // ruleset (see `FakeKernel::jumps`); their lines become comments
        // so that error line numbers stay those of the input.
        let (text, jumps) = split_jump_inserts(text);
        // Apply to a copy: a rejected input changes nothing.
        let mut ruleset = state.rulesets.get(&family).cloned().unwrap_or_default();
        let applied = ruleset.apply(&text).and_then(|()| {
            // As the real restore, refuse a jump to a chain that is not there.
            let missing = jumps
                .iter()
                .find(|(_, rule)| !ruleset.chains(rule.table).contains(&rule.target_chain));
            match missing {
                Some((line, rule)) => Err(crate::tracer::TraceError::Parse {
                    line: *line,
                    text: rule.insert_line(),
                    reason: format!("Couldn't load target `{}'", rule.target_chain),
                }),
                None => Ok(()),
            }
        });
        match applied {
            Ok(()) => {
                state.rulesets.insert(family, ruleset);
                for (_, rule) in jumps {
                    if !state.jumps.contains(&(family, rule)) {
                        state.jumps.push((family, rule));
                    }
                }
                Ok(())
            }
            Err(crate::tracer::TraceError::Parse { line, text, reason }) => {
                Err(ApplyError::RestoreLine {
                    command,
                    line,
                    text,
                    stderr: reason,
                })
            }
            Err(other) => Err(ApplyError::Failed {
                command,
                status: "exit status: 1".to_owned(),
                stderr: other.to_string(),
            }),
        }
    }

    fn save_table(&mut self, family: IpFamily, table: Table) -> Result<SavedTable, ApplyError> {
        drop(self.record(FakeCall::SaveTable(family, table)));
        let chains = self.0.chains(family, table).into_iter();
        let jumps = self.0.jumps(family).into_iter();
        Ok(SavedTable {
            kube_chains: chains.filter(|c| c.starts_with("KUBE-")).collect(),
            jumps: jumps.filter(|rule| rule.table == table).collect(),
        })
    }

    fn chain_exists(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
    ) -> Result<bool, ApplyError> {
        drop(self.record(FakeCall::ChainExists(family, table, chain.to_owned())));
        Ok(self.0.chains(family, table).iter().any(|c| c == chain))
    }

    fn ensure_chain(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
    ) -> Result<(), ApplyError> {
        drop(self.record(FakeCall::EnsureChain(family, table, chain.to_owned())));
        if self.0.chains(family, table).iter().any(|c| c == chain) {
            return Ok(());
        }
        let mut state = self.0.lock();
        let ruleset = state.rulesets.entry(family).or_default();
        // Declaring a chain that does not exist yet cannot fail.
        let _ = ruleset.apply(&format!("*{table}\n:{chain} - [0:0]\nCOMMIT\n"));
        Ok(())
    }

    fn delete_jump(&mut self, family: IpFamily, rule: &JumpRule) -> Result<bool, ApplyError> {
        let call = FakeCall::DeleteJump(family, rule.table, rule.builtin_chain, rule.target_chain);
        let mut state = self.record(call);
        let before = state.jumps.len();
        state.jumps.retain(|entry| *entry != (family, *rule));
        Ok(state.jumps.len() < before)
    }

    fn flush_and_delete_chain(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
    ) -> Result<bool, ApplyError> {
        let call = FakeCall::FlushAndDeleteChain(family, table, chain.to_owned());
        drop(self.record(call));
        if !self.0.chains(family, table).iter().any(|c| c == chain) {
            return Ok(false);
        }
        let mut state = self.0.lock();
        let ruleset = state.rulesets.entry(family).or_default();
        let text = format!("*{table}\n:{chain} - [0:0]\n-X {chain}\nCOMMIT\n");
        ruleset.apply(&text).map_err(|error| ApplyError::Failed {
            command: format!("fake-iptables -t {table} -X {chain}"),
            status: "exit status: 1".to_owned(),
            stderr: error.to_string(),
        })?;
        Ok(true)
    }
}
