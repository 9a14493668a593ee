//! The in-memory exclusive lock and semaphore, and the guard they share with writers.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::names::{Ask, Claim, Key, Kind, Line, Locks};
use crate::error::{Error, Result};
use crate::lease::acquire::ReadHolders;
use crate::lease::lost::LostSignal;
use crate::lease::state::LeaseState;
use crate::lease::{max_count_problem, name_problem, places_problem};
use crate::lock_status::LockStatus;
use crate::options::LockOptions;
use crate::sync::Mutex;
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
    /// The provider's options: those the double plays (see the module docs).
    pub(super) options: Arc<LockOptions>,
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
        self.take(self.ask(places, None, None))
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
        match self.key.kind {
            Kind::Lock => {}
            Kind::Semaphore => self.options.check_min_hold_unsupported("semaphore")?,
            Kind::ReaderWriter => {
                (self.options).check_min_hold_unsupported("reader-writer lock")?
            }
        }
        if self.locks.shut_down.load(Ordering::SeqCst) {
            return Err(Error::ShutDown);
        }
        tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        Ok(())
    }

    /// Whether a wait for it takes a place in a fair lock's line: a fair lock's, a semaphore's
    /// or a writer's (not a reader's, nor an upgrade's, which passes the line).
    fn waits_in_line(&self) -> bool {
        self.options.fair() && matches!(self.claim, Claim::Places(_) | Claim::Write)
    }

    /// What an attempt for `places` asks: with a semaphore's `mark`, and for a wait in a fair
    /// lock's line, its `place`.
    fn ask(&self, places: u32, mark: Option<u64>, place: Option<u64>) -> Ask {
        let line = match (self.options.fair(), self.claim, place) {
            (false, _, _) | (true, Claim::Upgrade(_), _) => Line::Ignored,
            (true, Claim::Read | Claim::UpgradeableRead, _) => Line::Behind,
            (true, _, Some(place)) => Line::Place(place),
            (true, _, None) => Line::Alone,
        };
        Ask {
            places,
            wait: mark,
            line,
            min_hold: self.options.min_hold(),
            revoking: None,
        }
    }

    fn take(&self, ask: Ask) -> Result<Option<MemoryGuard>> {
        let Some((acquisition, fencing_token, state)) =
            self.locks.try_take(&self.key, self.claim, ask)?
        else {
            return Ok(None);
        };
        // A lease that is not renewed ends at its expiry unless extended; every lease ends at
        // its `max_hold`.
        let now = Instant::now();
        let lease_end =
            (!self.options.auto_renew()).then(|| Arc::new(Mutex::new(now + self.options.expiry())));
        let hold_end = self
            .options
            .max_hold()
            .and_then(|hold| now.checked_add(hold));
        // Moved on by each report of progress.
        let idle_end = (self.options.max_idle())
            .and_then(|idle| now.checked_add(idle))
            .map(|end| Arc::new(Mutex::new(end)));
        if lease_end.is_some() || hold_end.is_some() || idle_end.is_some() {
            let (locks, key) = (Arc::clone(&self.locks), self.key.clone());
            let (state, lease_end, idle_end) =
                (Arc::clone(&state), lease_end.clone(), idle_end.clone());
            tokio::spawn(async move {
                loop {
                    let moving =
                        |end: &Option<Arc<Mutex<Instant>>>| end.as_ref().map(|e| *e.lock());
                    let end = [moving(&lease_end), hold_end, moving(&idle_end)];
                    let Some(end) = end.into_iter().flatten().min() else {
                        return;
                    };
                    tokio::time::sleep_until(end).await;
                    // Extended (or progressed) meanwhile: wait on.
                    let later = |end_now: Option<Instant>| end_now.is_none_or(|e| e > end);
                    if later(moving(&lease_end))
                        && hold_end.is_none_or(|hold| hold > end)
                        && later(moving(&idle_end))
                    {
                        continue;
                    }
                    locks.expire(&key, acquisition, &state);
                    return;
                }
            });
        }
        let lost = LostSignal::new(vec![Arc::clone(&state)]);
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        Ok(Some(MemoryGuard {
            key: self.key.clone(),
            locks: Arc::clone(&self.locks),
            acquisition,
            fencing_token,
            bound: crate::lease::bound::Bound::new(runtime, lost),
            state,
            lease_end,
            hold_end,
            idle_end,
            options: Arc::clone(&self.options),
        }))
    }

    /// Takes `places` of it as soon as they are free, within `timeout` if given.
    async fn wait_for(
        &self,
        places: u32,
        timeout: Option<Duration>,
    ) -> Result<Option<MemoryGuard>> {
        self.wait_with(places, timeout, None).await
    }

    /// Takes the lock as soon as it is free, within `timeout` if given, as the revoking wait
    /// `revoking` if given.
    pub(super) async fn wait_revoking(
        &self,
        timeout: Option<Duration>,
        revoking: Option<(u64, crate::RevokeRequest)>,
    ) -> Result<Option<MemoryGuard>> {
        self.wait_with(1, timeout, revoking).await
    }

    /// `Ok(guard)`, or the timeout of a wait of `timeout` that `found` nothing.
    pub(super) fn required(
        &self,
        found: Option<MemoryGuard>,
        timeout: Duration,
    ) -> Result<MemoryGuard> {
        found.ok_or_else(|| Error::Timeout {
            name: self.key.name.clone(),
            waited: timeout,
            holders: Vec::new(),
        })
    }

    async fn wait_with(
        &self,
        places: u32,
        timeout: Option<Duration>,
        revoking: Option<(u64, crate::RevokeRequest)>,
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
        // A fair lock's wait takes a place in line with its first attempt that fails.
        let place = self.waits_in_line().then(|| Place {
            locks: Arc::clone(&self.locks),
            key: self.key.clone(),
            wait: self.locks.new_wait(),
        });
        let mut ask = self.ask(
            places,
            mark.as_ref().map(|mark| mark.wait),
            place.as_ref().map(|place| place.wait),
        );
        ask.revoking = revoking;
        // A revoking wait's request: the target and grace whose timer runs.
        let mut timed = None;
        loop {
            // Registered before the attempt, so a release (or shutdown) in between is not missed.
            let freed = self.locks.freed.notified();
            if let Some(guard) = self.take(ask)? {
                return Ok(Some(guard));
            }
            if let Some((wait, _)) = revoking {
                timed = super::revocation::time_grace(&self.locks, &self.key, wait, timed);
            }
            if self.claim.writes() && waiting_writer.is_none() {
                waiting_writer = Some(self.locks.writer_waits(&self.key));
            }
            // A `min_hold` window ends without a release: attempt again then.
            let kept = self.locks.kept_until(&self.key);
            let window_over = async {
                match kept {
                    Some(until) => tokio::time::sleep_until(until).await,
                    None => std::future::pending().await,
                }
            };
            let woken = async {
                tokio::select! {
                    () = freed => {}
                    () = window_over => {}
                }
            };
            match deadline {
                None => woken.await,
                Some(deadline) => {
                    if tokio::time::timeout_at(deadline, woken).await.is_err() {
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
        Ok(self.locks.holders(&self.key, false))
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
    /// Its holders, or the `min_hold` window that keeps it taken.
    fn read_holders(&self) -> BoxFuture<'_, Result<Vec<LockStatus>>> {
        Box::pin(async { Ok(self.locks.holders(&self.key, true)) })
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

/// A fair lock's wait's place in line, taken out when the wait ends.
struct Place {
    locks: Arc<Locks>,
    key: Key,
    wait: u64,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.locks.leave_line(&self.key, self.wait);
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
    /// A lease that is not renewed (`auto_renew(false)`): when it ends, unless extended.
    lease_end: Option<Arc<Mutex<Instant>>>,
    /// When `max_hold` ends it.
    hold_end: Option<Instant>,
    /// With `max_idle`: when it ends unless the work reports progress.
    idle_end: Option<Arc<Mutex<Instant>>>,
    /// Its lock's options.
    options: Arc<LockOptions>,
    /// The tasks bound to its lease (`spawn`).
    bound: crate::lease::bound::Bound,
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
            options: Arc::clone(&self.options),
        }
    }

    /// Its name's key.
    pub(super) fn key(&self) -> &Key {
        &self.key
    }

    /// The provider's locks.
    pub(super) fn locks(&self) -> &Locks {
        &self.locks
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

    /// Extends the lease to at least `by` from now, as [`LockGuard::extend`](crate::LockGuard::extend)
    /// does: a lease that is renewed has no deadline in the double, so this only checks `by`
    /// (between 1 ms and 365 days, not past `max_hold`) and that the lock is not lost; a lease
    /// that is not renewed (`auto_renew(false)`) then ends `by` from now, if that is later.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a `by` out of range or
    /// past `max_hold`, [`Error::LockLost`](crate::Error::LockLost) once lost,
    /// [`Error::RevocationRequested`](crate::Error::RevocationRequested) while a revocation
    /// request targets the lease.
    pub async fn extend(&self, by: Duration) -> Result<()> {
        extended(&self.key.name, &self.state, by)?;
        let targeted = (self.locks.names.lock().get(&self.key))
            .and_then(|entry| entry.revoke.as_ref()?.seen_by(self.acquisition))
            .is_some();
        if targeted {
            return Err(Error::RevocationRequested {
                name: self.key.name.clone(),
            });
        }
        let until = Instant::now().checked_add(by);
        if let (Some(hold_end), Some(max_hold)) = (self.hold_end, self.options.max_hold())
            && until.is_none_or(|until| until > hold_end)
        {
            return Err(Error::InvalidArgument(format!(
                "extend of {:?} by {by:?} would run past max_hold ({max_hold:?}): the hold ends \
                 in {:?}",
                crate::error::shown_name(&self.key.name),
                hold_end.saturating_duration_since(Instant::now()),
            )));
        }
        if let (Some(lease_end), Some(until)) = (&self.lease_end, until) {
            let mut end = lease_end.lock();
            *end = (*end).max(until);
        }
        Ok(())
    }

    /// Releases the lock and wakes its waiters.
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) if the lock was lost before (it is freed all the same, if still
    /// taken).
    pub async fn release(self) -> Result<()> {
        // Its bound tasks end first, while the lock is still held.
        self.bound.settle().await;
        self.end()
    }

    crate::lease::bound::bound_task_methods!();

    /// Reports that the holder's work is making progress, as
    /// [`LockGuard::progress`](crate::LockGuard::progress): with `max_idle`, the lease ends
    /// `max_idle` after the last report. Returns whether the lock is still held.
    pub fn progress(&self) -> bool {
        if let (Some(idle_end), Some(max_idle)) = (&self.idle_end, self.options.max_idle())
            && !self.state.is_lost()
        {
            let mut end = idle_end.lock();
            *end = (*end).max(Instant::now() + max_idle);
        }
        !self.state.is_lost()
    }

    fn bound(&self) -> &crate::lease::bound::Bound {
        &self.bound
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
