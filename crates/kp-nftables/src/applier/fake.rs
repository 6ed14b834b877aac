//! [`FakeApplier`]: records transactions in memory, for tests (feature
//! `test-util`).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use kp_model::IpFamily;

use super::*;
use crate::generation::{Observed, Touched, Watch};
use crate::model::Transaction;

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
            return Ok(());
        }
        if inner.failures > 0 {
            inner.failures -= 1;
            return Err(ApplyError::Write(io::Error::other("fake failure")));
        }
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
