//! [`FakeApplier`]: records transactions in memory, for tests (feature
//! `test-util`).
//!
//! It is no kinder than the kernel about what a transaction may name: it
//! keeps each family's table (as [`crate::tracer::Table`]) and refuses,
//! as the kernel does with `ENOENT`, a command on a table, chain, set or
//! element that does not exist, e.g. a partial sync onto a table someone
//! deleted. A refused transaction changes nothing.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use kp_model::IpFamily;

use super::*;
use crate::generation::{Observed, Touched, Watch};
use crate::model::Transaction;
use crate::tracer::Table;

/// What the kernel answers a command on an object that does not exist
/// (`ENOENT`), as [`crate::NetlinkApplier`] reports it.
const NO_SUCH_OBJECT: &str = "No such file or directory (os error 2)";

/// One transaction a [`FakeApplier`] received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeTransaction {
    /// The family.
    pub family: IpFamily,
    /// Its text.
    pub text: String,
    /// The transaction.
    pub transaction: Transaction,
}

/// Records transactions; shares its record with its clones, so a test
/// keeps a clone after handing one to the backend.
#[derive(Debug, Clone, Default)]
pub struct FakeApplier {
    inner: Arc<Mutex<FakeInner>>,
}

#[derive(Debug, Default)]
struct FakeInner {
    transactions: Vec<FakeTransaction>,
    successes_first: usize,
    failures: usize,
    /// The simulated ruleset generation, once enabled.
    generation: Option<u32>,
    /// The simulated commit notifications, once enabled.
    watch: Option<FakeWatchState>,
    /// The tables as committed transactions left them: IPv4, IPv6.
    tables: [Option<Table>; 2],
}

/// What a [`FakeApplier`]'s watch received and whether it listens.
#[derive(Debug, Default)]
struct FakeWatchState {
    listening: bool,
    received: Vec<Observed>,
}

/// The [`Watch`] of a [`FakeApplier`].
#[derive(Debug)]
struct FakeWatch {
    inner: Arc<Mutex<FakeInner>>,
}

impl FakeApplier {
    /// A fake that accepts everything.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every transaction received so far.
    pub fn transactions(&self) -> Vec<FakeTransaction> {
        self.lock().transactions.clone()
    }

    /// The last transaction received.
    pub fn last(&self) -> Option<FakeTransaction> {
        self.lock().transactions.last().cloned()
    }

    /// Simulates the kernel's ruleset generation from now on: every
    /// accepted transaction with a line other than `add table` increments
    /// it, as a commit that changes something does.
    pub fn with_generations(self) -> Self {
        self.lock().generation = Some(1);
        self
    }

    /// Simulates the kernel's commit notifications too: a watch
    /// ([`Applier::watch`]) receives every commit made while it listens.
    pub fn with_watch(self) -> Self {
        self.lock().watch = Some(FakeWatchState {
            listening: true,
            received: Vec::new(),
        });
        self
    }

    /// Someone else commits a change to both tables of the proxy.
    pub fn foreign_commit(&self) {
        self.lock().commit(Touched::BOTH);
    }

    /// Someone else commits a change to a table not the proxy's.
    pub fn foreign_commit_elsewhere(&self) {
        self.lock().commit(Touched::default());
    }

    /// Makes the next `count` transactions fail (they are still recorded).
    pub fn fail_next(&self, count: usize) {
        self.fail_after(0, count);
    }

    /// Lets `successes` transactions through, then makes `count` fail.
    pub fn fail_after(&self, successes: usize, count: usize) {
        let mut inner = self.lock();
        inner.successes_first = successes;
        inner.failures = count;
    }

    /// The table of `family` as the committed transactions left it; `None`
    /// when it does not exist.
    pub fn table(&self, family: IpFamily) -> Option<Table> {
        self.lock().tables[family_index(family)].clone()
    }

    /// Someone else deletes the table of `family` (`nft delete table ip
    /// kube-proxy`).
    pub fn delete_table(&self, family: IpFamily) {
        let mut inner = self.lock();
        inner.tables[family_index(family)] = None;
        let mut touched = Touched::default();
        touched.add(family);
        inner.commit(touched);
    }

    fn lock(&self) -> MutexGuard<'_, FakeInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Applier for FakeApplier {
    fn apply(&mut self, transaction: &Transaction) -> Result<(), ApplyError> {
        let family = transaction.family;
        let mut inner = self.lock();
        inner.transactions.push(FakeTransaction {
            family,
            text: transaction.to_string(),
            transaction: transaction.clone(),
        });
        if inner.successes_first > 0 {
            inner.successes_first -= 1;
            return inner.replay(transaction);
        }
        if inner.failures > 0 {
            inner.failures -= 1;
            return Err(ApplyError::Write(io::Error::other("fake failure")));
        }
        inner.replay(transaction)?;
        let changes = transaction
            .commands
            .iter()
            .any(|command| !matches!(command, Command::AddTable { .. }));
        if changes {
            let mut touched = Touched::default();
            touched.add(family);
            inner.commit(touched);
        }
        Ok(())
    }

    fn generation(&mut self) -> Option<Result<u32, ApplyError>> {
        self.lock().generation.map(Ok)
    }

    fn watch(&mut self) -> Option<Box<dyn Watch>> {
        self.lock().watch.as_ref()?;
        Some(Box::new(FakeWatch {
            inner: Arc::clone(&self.inner),
        }))
    }

    fn apply_at(&mut self, transaction: &Transaction, generation: u32) -> Result<(), ApplyError> {
        if self.lock().generation != Some(generation) {
            return Err(ApplyError::GenerationMoved);
        }
        self.apply(transaction)
    }
}

impl FakeInner {
    /// Replays `transaction` on a copy of its family's table and keeps the
    /// copy only if every command found what it names.
    fn replay(&mut self, transaction: &Transaction) -> Result<(), ApplyError> {
        let family = transaction.family;
        let slot = &mut self.tables[family_index(family)];
        let mut table = slot.clone();
        for (index, command) in transaction.commands.iter().enumerate() {
            let found = match command {
                Command::AddTable { .. } => {
                    table.get_or_insert_with(Table::new);
                    true
                }
                Command::DeleteTable => table.take().is_some(),
                other => table
                    .as_mut()
                    .and_then(|table| table.apply_command(other))
                    .is_some(),
            };
            if !found {
                return Err(ApplyError::Kernel {
                    message: NO_SUCH_OBJECT.to_owned(),
                    line: Some((index + 1, command.line(family).to_string())),
                    also_refused: Vec::new(),
                    refused: vec![command.clone()],
                });
            }
        }
        *slot = table;
        Ok(())
    }

    /// A commit that changes `touched`: the generation moves on, and a
    /// listening watch receives it.
    fn commit(&mut self, touched: Touched) {
        self.generation = self.generation.map(next_generation);
        if let (Some(generation), Some(watch)) = (self.generation, self.watch.as_mut()) {
            if watch.listening {
                watch.received.push(Observed {
                    generation,
                    touched,
                });
            }
        }
    }
}

impl FakeWatch {
    fn state(&self) -> MutexGuard<'_, FakeInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Watch for FakeWatch {
    fn drain(&mut self, out: &mut Vec<Observed>) {
        if let Some(watch) = self.state().watch.as_mut() {
            out.append(&mut watch.received);
        }
    }

    fn pause(&mut self) {
        if let Some(watch) = self.state().watch.as_mut() {
            watch.listening = false;
        }
    }

    fn resume(&mut self) {
        if let Some(watch) = self.state().watch.as_mut() {
            watch.listening = true;
        }
    }
}

fn family_index(family: IpFamily) -> usize {
    match family {
        IpFamily::V4 => 0,
        IpFamily::V6 => 1,
    }
}
