//! The in-memory exclusive lock and semaphore, and the guard they share with writers.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::names::{Claim, Key, Kind, Locks};
use crate::error::{Error, Result};
use crate::lease::lost::LostSignal;
use crate::lease::state::LeaseState;
use crate::lease::{max_count_problem, name_problem};
use crate::token::FencingToken;

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
            Claim::Read | Claim::Write => 1,
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
        loop {
            // Without a deadline the wait only ends with the lock (or an error).
            if let Some(guard) = self.wait_for(None).await? {
                return Ok(guard);
            }
        }
    }

    /// Waits up to `timeout`.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) when `timeout` runs out; the refusals of [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<MemoryGuard> {
        let started = Instant::now();
        self.wait_for(Some(timeout))
            .await?
            .ok_or_else(|| Error::Timeout {
                name: self.key.name.clone(),
                waited: started.elapsed(),
                holders: Vec::new(),
            })
    }

    /// One attempt: `Ok(None)` if the lock is held.
    ///
    /// # Errors
    /// The refusals of [`acquire`](Self::acquire).
    pub async fn try_acquire(&self) -> Result<Option<MemoryGuard>> {
        self.check()?;
        self.take()
    }

    /// Attempts for up to `timeout`: `Ok(None)` if the lock stayed held.
    ///
    /// # Errors
    /// The refusals of [`acquire`](Self::acquire).
    pub async fn try_acquire_timeout(&self, timeout: Duration) -> Result<Option<MemoryGuard>> {
        self.wait_for(Some(timeout)).await
    }

    /// What the MongoDB locks refuse before they try, in their order: a name too long to store
    /// (or a semaphore's `max_count` of 0), a provider shut down, a call outside a Tokio runtime.
    fn check(&self) -> Result<()> {
        let problem = name_problem(&self.key.name).or_else(|| match self.claim {
            Claim::Places(places) if self.key.kind == Kind::Semaphore => {
                max_count_problem(&self.key.name, places)
            }
            _ => None,
        });
        if let Some(problem) = problem {
            return Err(Error::InvalidArgument(problem));
        }
        if self.locks.shut_down.load(Ordering::SeqCst) {
            return Err(Error::ShutDown);
        }
        tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        Ok(())
    }

    fn take(&self) -> Result<Option<MemoryGuard>> {
        let taken = self.locks.try_take(&self.key, self.claim)?;
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

    /// Takes the lock as soon as it is free, within `timeout` if given.
    async fn wait_for(&self, timeout: Option<Duration>) -> Result<Option<MemoryGuard>> {
        self.check()?;
        let deadline = timeout.and_then(|timeout| Instant::now().checked_add(timeout));
        let mut waiting_writer = None;
        loop {
            // Registered before the attempt, so a release (or shutdown) in between is not missed.
            let freed = self.locks.freed.notified();
            if let Some(guard) = self.take()? {
                return Ok(Some(guard));
            }
            if self.claim == Claim::Write && waiting_writer.is_none() {
                waiting_writer = Some(self.locks.writer_waits(&self.key));
            }
            match deadline {
                None => freed.await,
                Some(deadline) => {
                    if tokio::time::timeout_at(deadline, freed).await.is_err() {
                        return self.take();
                    }
                }
            }
        }
    }
}

crate::traits::impl_distributed_lock!(MemoryLock);

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
