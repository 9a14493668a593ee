//! The in-memory exclusive lock and semaphore, and the guard they share with writers.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::names::{Ask, Claim, Key, Kind, Locks};
use crate::error::{Error, Result};
use crate::lease::acquire::ReadHolders;
use crate::lease::lost::LostSignal;
use crate::lease::state::LeaseState;
use crate::lease::{max_count_problem, name_problem, places_problem};
use crate::lock_status::LockStatus;
use crate::token::FencingToken;
use crate::watch::{Changes, LockWatch};
use futures::future::BoxFuture;

/// An in-memory exclusive lock, or a semaphore (a lock with `max_count` places); see the
/// [module docs](super).
#[derive(Clone)]
pub struct MemoryLock {
    pub(super) key: Key,
    /// What each acquisition takes: one of its places, or a side of a reader-writer lock.
    pub(super) claim: Claim,
    pub(super) locks: Arc<Locks>,
}

impl fmt::Debug for MemoryLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryLock")
            .field("name", &self.key.name)
            .field("kind", &self.key.kind)
            .field("claim", &self.claim)
            .finish_non_exhaustive()
    }
}

impl MemoryLock {
    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.key.name
    }

    /// How many may hold it at once: 1 for a lock, `max_count` for a semaphore.
    pub fn max_count(&self) -> u32 {
        match self.claim {
            Claim::Places(places) => places,
            Claim::Read | Claim::Write | Claim::UpgradeableRead | Claim::Upgrade(_) => 1,
        }
    }

    /// Waits until the lock is acquired.
    ///
    /// # Errors
    /// The refusals of the MongoDB locks: [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a name over 1 MiB (and
    /// for a semaphore, a `max_count` of 0 or one that differs from the count its first
    /// acquisition recorded), [`Error::NoRuntime`](crate::Error::NoRuntime) outside a Tokio runtime, [`Error::ShutDown`](crate::Error::ShutDown)
    /// once the provider is shut down (also while waiting).
    pub async fn acquire(&self) -> Result<MemoryGuard> {
        self.acquire_many(1).await
    }

    /// Waits up to `timeout`.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) when `timeout` runs out; the refusals of [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<MemoryGuard> {
        self.acquire_many_timeout(1, timeout).await
    }

    /// One attempt: `Ok(None)` if the lock is held.
    ///
    /// # Errors
    /// The refusals of [`acquire`](Self::acquire).
    pub async fn try_acquire(&self) -> Result<Option<MemoryGuard>> {
        self.try_acquire_many(1).await
    }

    /// Attempts for up to `timeout`: `Ok(None)` if the lock stayed held.
    ///
    /// # Errors
    /// The refusals of [`acquire`](Self::acquire).
    pub async fn try_acquire_timeout(&self, timeout: Duration) -> Result<Option<MemoryGuard>> {
        self.try_acquire_many_timeout(1, timeout).await
    }

    /// Waits until `places` places of a semaphore are acquired at once, as
    /// [`MongoDistributedSemaphore::acquire_many`](crate::MongoDistributedSemaphore::acquire_many):
    /// one guard, all or none; while it waits, a waiter for several places holds back the places
    /// it needs (the first such waiter does).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for `places` of 0 or more than
    /// the count (for a lock: more than 1); the refusals of [`acquire`](Self::acquire).
    pub async fn acquire_many(&self, places: u32) -> Result<MemoryGuard> {
        loop {
            // Without a deadline the wait only ends with the places (or an error).
            if let Some(guard) = self.wait_for(places, None).await? {
                return Ok(guard);
            }
        }
    }

    /// Waits up to `timeout` for `places` places at once; see
    /// [`acquire_many`](Self::acquire_many).
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) when `timeout` runs out; the refusals of
    /// [`acquire_many`](Self::acquire_many).
    pub async fn acquire_many_timeout(
        &self,
        places: u32,
        timeout: Duration,
    ) -> Result<MemoryGuard> {
        let started = Instant::now();
        self.wait_for(places, Some(timeout))
            .await?
            .ok_or_else(|| Error::Timeout {
                name: self.key.name.clone(),
                waited: started.elapsed(),
                holders: Vec::new(),
            })
    }

    /// One attempt for `places` places at once: `Ok(None)` if fewer are free.
    ///
    /// # Errors
    /// The refusals of [`acquire_many`](Self::acquire_many).
    pub async fn try_acquire_many(&self, places: u32) -> Result<Option<MemoryGuard>> {
        self.check(places)?;
        self.take(Ask { places, wait: None })
    }

    /// Attempts for up to `timeout` for `places` places at once: `Ok(None)` if fewer stayed
    /// free.
    ///
    /// # Errors
    /// The refusals of [`acquire_many`](Self::acquire_many).
    pub async fn try_acquire_many_timeout(
        &self,
        places: u32,
        timeout: Duration,
    ) -> Result<Option<MemoryGuard>> {
        self.wait_for(places, Some(timeout)).await
    }

    /// How many places are free now: the count (as set, or recorded by the first acquisition,
    /// or this semaphore's before any) less the places its holders take.
    ///
    /// # Errors
    /// None today; a `Result` as [`MongoDistributedSemaphore::available`](crate::MongoDistributedSemaphore::available).
    pub async fn available(&self) -> Result<u32> {
        Ok(self.locks.available(&self.key, self.max_count()))
    }

    /// Sets the semaphore's count for every caller of its name, as
    /// [`MongoDistributedSemaphore::set_max_count`](crate::MongoDistributedSemaphore::set_max_count):
    /// holders keep their places; acquisitions wait until theirs fit.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a `max_count` of 0, or on a
    /// lock (not a semaphore).
    pub async fn set_max_count(&self, max_count: u32) -> Result<()> {
        if self.key.kind != Kind::Semaphore {
            return Err(Error::InvalidArgument(format!(
                "set_max_count: {:?} is not a semaphore",
                crate::error::shown_name(&self.key.name)
            )));
        }
        if let Some(problem) = max_count_problem(&self.key.name, max_count) {
            return Err(Error::InvalidArgument(problem));
        }
        self.locks.set_count(&self.key, max_count);
        Ok(())
    }

    /// What the MongoDB locks refuse before they try, in their order: a name too long to store
    /// (or a semaphore's `max_count` of 0), a provider shut down, a call outside a Tokio runtime.
    fn check(&self, places: u32) -> Result<()> {
        let problem = name_problem(&self.key.name)
            .or_else(|| match self.claim {
                Claim::Places(max_count) if self.key.kind == Kind::Semaphore => {
                    max_count_problem(&self.key.name, max_count)
                }
                _ => None,
            })
            .or_else(|| places_problem(&self.key.name, places, self.max_count()));
        if let Some(problem) = problem {
            return Err(Error::InvalidArgument(problem));
        }
        if self.locks.shut_down.load(Ordering::SeqCst) {
            return Err(Error::ShutDown);
        }
        tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        Ok(())
    }

    fn take(&self, ask: Ask) -> Result<Option<MemoryGuard>> {
        let taken = self.locks.try_take(&self.key, self.claim, ask)?;
        Ok(
            taken.map(|(acquisition, fencing_token, state)| MemoryGuard {
                key: self.key.clone(),
                locks: Arc::clone(&self.locks),
                acquisition,
                fencing_token,
                state,
            }),
        )
    }

    /// Takes `places` of it as soon as they are free, within `timeout` if given.
    async fn wait_for(
        &self,
        places: u32,
        timeout: Option<Duration>,
    ) -> Result<Option<MemoryGuard>> {
        self.check(places)?;
        let deadline = timeout.and_then(|timeout| Instant::now().checked_add(timeout));
        let mut waiting_writer = None;
        // A waiter for several places marks them while it waits; its mark goes when it ends.
        let mark = (places > 1).then(|| Mark {
            locks: Arc::clone(&self.locks),
            key: self.key.clone(),
            wait: self.locks.new_wait(),
        });
        let ask = Ask {
            places,
            wait: mark.as_ref().map(|mark| mark.wait),
        };
        loop {
            // Registered before the attempt, so a release (or shutdown) in between is not missed.
            let freed = self.locks.freed.notified();
            if let Some(guard) = self.take(ask)? {
                return Ok(Some(guard));
            }
            if self.claim.writes() && waiting_writer.is_none() {
                waiting_writer = Some(self.locks.writer_waits(&self.key));
            }
            match deadline {
                None => freed.await,
                Some(deadline) => {
                    if tokio::time::timeout_at(deadline, freed).await.is_err() {
                        return self.take(ask);
                    }
                }
            }
        }
    }
}

impl MemoryLock {
    /// The current holders, as [`MongoDistributedLock::holders`](crate::MongoDistributedLock::holders)
    /// shows them (for a semaphore, one entry per holder with its places; for a reader-writer
    /// lock, the writer or the readers): each lock id is `memory-<n>`, the `n`th acquisition of
    /// the provider's name, with its fencing token; the double's leases have no end and no
    /// details: `remaining` is `Duration::MAX`, the times and details are empty.
    ///
    /// # Errors
    /// None: a `Result` as the MongoDB locks'.
    pub async fn holders(&self) -> Result<Vec<LockStatus>> {
        Ok(self.locks.holders(&self.key))
    }

    /// Watches who holds it, as [`MongoDistributedLock::watch`](crate::MongoDistributedLock::watch):
    /// read now, then every `every`, and at once at every acquisition and release of the
    /// provider's locks.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero `every`; [`Error::NoRuntime`] outside a Tokio
    /// runtime.
    pub async fn watch(&self, every: Duration) -> Result<LockWatch> {
        let changes = Changes::Local(self.locks.changes.subscribe());
        LockWatch::start(self.clone(), every, Some(changes)).await
    }
}

impl ReadHolders for MemoryLock {
    fn read_holders(&self) -> BoxFuture<'_, Result<Vec<LockStatus>>> {
        Box::pin(self.holders())
    }
}

crate::traits::impl_distributed_lock!(MemoryLock);
crate::traits::impl_distributed_semaphore!(MemoryLock);

/// A waiter's mark on a semaphore's places, removed when the wait ends (dropped).
struct Mark {
    locks: Arc<Locks>,
    key: Key,
    wait: u64,
}

impl Drop for Mark {
    fn drop(&mut self) {
        self.locks.clear_mark(&self.key, self.wait);
    }
}

/// Proof that a [`MemoryLock`](super::MemoryLock) is held; behaves as [`LockGuard`](crate::LockGuard) does.
#[must_use = "dropping the guard releases the lock at once"]
#[clippy::has_significant_drop]
pub struct MemoryGuard {
    key: Key,
    locks: Arc<Locks>,
    acquisition: u64,
    fencing_token: FencingToken,
    state: Arc<LeaseState>,
}

impl fmt::Debug for MemoryGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryGuard")
            .field("name", &self.key.name)
            .field("fencing_token", &self.fencing_token)
            .field("lost", &self.state.is_lost())
            .finish_non_exhaustive()
    }
}

impl MemoryGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.key.name
    }

    /// The lock of its name and kind claiming `claim` (an upgrade of this reader's lease).
    pub(super) fn lock_for(&self, claim: Claim) -> MemoryLock {
        MemoryLock {
            key: self.key.clone(),
            claim,
            locks: Arc::clone(&self.locks),
        }
    }

    /// Tells this acquisition from later ones of the same name.
    pub(super) fn acquisition(&self) -> u64 {
        self.acquisition
    }

    /// This acquisition's fencing token: larger than every earlier one of the same name.
    pub fn fencing_token(&self) -> FencingToken {
        self.fencing_token
    }

    /// A signal that turns true when the lock is lost (only through the provider's test
    /// controls).
    pub fn lost(&self) -> LostSignal {
        LostSignal::new(vec![Arc::clone(&self.state)])
    }

    /// Whether the lock is lost.
    pub fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// Extends the lease to at least `by` from now: the in-memory lease has no deadline, so
    /// this only checks, as [`LockGuard::extend`](crate::LockGuard::extend) does, that `by` is
    /// between 1 ms and 365 days and that the lock is not lost.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a `by` out of range,
    /// [`Error::LockLost`](crate::Error::LockLost) once lost.
    pub async fn extend(&self, by: Duration) -> Result<()> {
        extended(&self.key.name, &self.state, by)
    }

    /// Releases the lock and wakes its waiters.
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) if the lock was lost before (it is freed all the same, if still
    /// taken).
    pub async fn release(self) -> Result<()> {
        self.end()
    }

    /// Ends the hold: `LockLost` if it had been lost.
    fn end(&self) -> Result<()> {
        self.state.mark_released();
        self.locks.free(&self.key, self.acquisition);
        if self.state.is_lost() {
            return Err(Error::LockLost {
                name: self.key.name.clone(),
            });
        }
        Ok(())
    }
}

/// A memory guard's `extend`: `by` in range, and the lease not lost.
pub(super) fn extended(name: &str, state: &LeaseState, by: Duration) -> Result<()> {
    crate::lease::held::check_extension_length(name, by)?;
    if state.is_lost() {
        return Err(Error::LockLost {
            name: name.to_owned(),
        });
    }
    Ok(())
}

impl Drop for MemoryGuard {
    fn drop(&mut self) {
        let _ = self.end();
    }
}

crate::traits::impl_distributed_lock_guard!(MemoryGuard);
