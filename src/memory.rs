//! In-memory locks, semaphores, reader-writer locks and document locks with the crate's
//! semantics, for unit-testing application code without MongoDB: program against
//! [`DistributedLockProvider`] / [`DistributedLock`] / [`DistributedReaderWriterLock`] /
//! [`DistributedDocumentLock`], give the code a [`MemoryLockProvider`] in tests.
//!
//! What it keeps of the real thing, among everyone using the same provider (and its clones):
//! - one holder per lock name; at most `max_count` per semaphore name, and a semaphore's callers
//!   must agree on it; any number of readers or one writer per reader-writer name, new readers
//!   waiting while a writer waits; one holder per document of a document lock's collection;
//! - the three kinds of one name being independent, as they are in their separate collections;
//! - fencing tokens that strictly increase per name (readers have none), and per document;
//! - a guard's lease that stays held while the guard lives, with no deadline of its own;
//! - `lost` that fires before anyone else can take the lock;
//! - release by [`release`](crate::DistributedLockGuard::release) or on drop, which wakes the next
//!   waiter at once;
//! - waits that end with [`Error::Timeout`] as the MongoDB locks' do;
//! - the same refusals before anything happens: a name over 1 MiB is
//!   [`Error::InvalidArgument`], a call outside a Tokio runtime [`Error::NoRuntime`], and after
//!   [`shutdown`](MemoryLockProvider::shutdown) [`Error::ShutDown`];
//! - for document locks: [`Error::DocumentNotFound`] when nothing matches, updates refused
//!   when they are not update operators or touch the lock field, a commit or replace that
//!   unlocks in the same step. The documents live in the provider, inserted by
//!   [`lock_or_insert`](MemoryDocumentLock::lock_or_insert); filters are equalities of
//!   top-level fields and updates `$set`, `$unset`, `$inc`: the double does not evaluate MongoDB
//!   queries, and refuses the rest with [`Error::InvalidArgument`] instead of guessing.
//!
//! What it adds: test controls that play the failures a real deployment has, on locks.
//! [`MemoryLockProvider::expire`] ends the current lease as a lost renewal would (the holder's
//! `lost` fires, then the lock is free); [`MemoryLockProvider::mark_lost`] makes the holder
//! presume its lease lost while it still blocks others (a renewal whose reply never came), until
//! it releases or the lease is expired. Nothing is shared between processes, and there is no
//! renewal traffic to observe.
//!
//! ```
//! use distributed_lock_mongodb::memory::MemoryLockProvider;
//! use distributed_lock_mongodb::DistributedLockProvider;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> distributed_lock_mongodb::Result<()> {
//! let locks = MemoryLockProvider::new();
//! let guard = locks.create_lock("order-42").acquire().await?;
//! assert!(locks.expire("order-42")); // as if the lease had run out under the holder
//! assert!(guard.is_lost());
//! let next = locks.create_lock("order-42").try_acquire().await?.expect("free again");
//! assert!(next.fencing_token() > guard.fencing_token());
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use mongodb::bson::{Bson, Document, doc};

use crate::error::{Error, Result};
use crate::fencing::check_operators;
use crate::lease::lost::{LeaseState, LostSignal};
use crate::lease::{Problem, max_count_mismatch, max_count_problem, name_problem};
use crate::sync::Mutex;
use crate::token::FencingToken;
use crate::traits::{
    DistributedDocumentLock, DistributedLock, DistributedLockProvider, DistributedReaderWriterLock,
};

/// The field the MongoDB document locks keep their lock in by default: reserved in the
/// documents of the in-memory ones too.
const LOCK_FIELD: &str = "lock";

/// Creates in-memory locks that exclude each other by name; clones share the locks. See the
/// [module docs](self).
#[derive(Clone, Debug, Default)]
pub struct MemoryLockProvider {
    locks: Arc<Locks>,
}

#[derive(Debug, Default)]
struct Locks {
    names: Mutex<HashMap<Key, Name>>,
    /// The documents of the document locks, by collection.
    collections: Mutex<HashMap<String, Vec<StoredDocument>>>,
    /// Tells a document's lock holders apart.
    next_acquisition: AtomicU64,
    /// Woken whenever a lock becomes free, and at shutdown.
    freed: Notify,
    /// Set (with `names` locked) by [`MemoryLockProvider::shutdown`]: nothing is taken any more.
    shut_down: AtomicBool,
}

/// A lock's, a semaphore's or a reader-writer lock's name: the three kinds of one name are
/// independent, as they are in their separate collections.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    kind: Kind,
    name: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    Lock,
    Semaphore,
    ReaderWriter,
}

/// What an acquisition asks of its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Claim {
    /// One of this many places: 1 for a lock, `max_count` for a semaphore.
    Places(u32),
    /// A read lock: shared with other readers, while no writer holds the lock or waits for it.
    Read,
    /// The write lock: alone.
    Write,
}

/// The state of one name: its last fencing token, its holders, for a semaphore the
/// `max_count` its first acquisition recorded, and for a reader-writer lock how many writers
/// wait (holding back new readers, as the waiting-writer marker does).
#[derive(Debug, Default)]
struct Name {
    last_token: i64,
    last_acquisition: u64,
    holders: Vec<Holder>,
    max_count: Option<u32>,
    waiting_writers: usize,
}

#[derive(Debug)]
struct Holder {
    /// Tells this acquisition from later ones of the same name.
    acquisition: u64,
    /// Whether it holds a reader-writer lock to read.
    reader: bool,
    state: Arc<LeaseState>,
}

impl Locks {
    /// Takes `claim` of `key` if the name allows it: the new guard's acquisition number and
    /// token (a reader's is the last writer's: readers have none of their own), and its state.
    /// [`Error::ShutDown`] once the provider is shut down; for a semaphore whose first
    /// acquisition recorded another `max_count`, [`Error::InvalidArgument`].
    fn try_take(
        &self,
        key: &Key,
        claim: Claim,
    ) -> Result<Option<(u64, FencingToken, Arc<LeaseState>)>> {
        let mut names = self.names.lock();
        if self.shut_down.load(Ordering::SeqCst) {
            return Err(Error::ShutDown);
        }
        let entry = names.entry(key.clone()).or_default();
        let free = match claim {
            Claim::Places(places) => {
                if key.kind == Kind::Semaphore {
                    let recorded = *entry.max_count.get_or_insert(places);
                    if recorded != places {
                        return Err(max_count_mismatch(&key.name, &recorded.to_string(), places));
                    }
                }
                entry.holders.len() < usize::try_from(places).unwrap_or(usize::MAX)
            }
            Claim::Read => {
                entry.waiting_writers == 0 && entry.holders.iter().all(|holder| holder.reader)
            }
            Claim::Write => entry.holders.is_empty(),
        };
        if !free {
            return Ok(None);
        }
        if claim != Claim::Read {
            entry.last_token += 1;
        }
        entry.last_acquisition += 1;
        let state = LeaseState::without_deadline();
        entry.holders.push(Holder {
            acquisition: entry.last_acquisition,
            reader: claim == Claim::Read,
            state: Arc::clone(&state),
        });
        Ok(Some((
            entry.last_acquisition,
            FencingToken::new(entry.last_token),
            state,
        )))
    }

    /// Counts a writer of `key` as waiting until the returned value is dropped.
    fn writer_waits(self: &Arc<Self>, key: &Key) -> WaitingWriter {
        self.names
            .lock()
            .entry(key.clone())
            .or_default()
            .waiting_writers += 1;
        WaitingWriter {
            locks: Arc::clone(self),
            key: key.clone(),
        }
    }

    /// Refuses every acquisition from now on, and ends every lease: each is lost, then freed.
    fn shut_down(&self) {
        let ended: Vec<Arc<LeaseState>> = {
            let mut names = self.names.lock();
            self.shut_down.store(true, Ordering::SeqCst);
            let mut collections = self.collections.lock();
            let documents = collections
                .values_mut()
                .flatten()
                .filter_map(|stored| stored.holder.take());
            names
                .values_mut()
                .flat_map(|entry| entry.holders.drain(..))
                .chain(documents)
                .map(|holder| holder.state)
                .collect()
        };
        for state in ended {
            state.mark_lost();
        }
        self.freed.notify_waiters();
    }

    /// Frees the place of `key` that acquisition `acquisition` holds, if it still does.
    fn free(&self, key: &Key, acquisition: u64) -> bool {
        let freed = {
            let mut names = self.names.lock();
            names.get_mut(key).is_some_and(|entry| {
                let before = entry.holders.len();
                entry
                    .holders
                    .retain(|holder| holder.acquisition != acquisition);
                entry.holders.len() < before
            })
        };
        if freed {
            self.freed.notify_waiters();
        }
        freed
    }

    /// The lease state of the holder of the exclusive lock `name`.
    fn holder_state(&self, name: &str) -> Option<(u64, Arc<LeaseState>)> {
        let names = self.names.lock();
        let holder = names.get(&Key::lock(name))?.holders.first()?;
        Some((holder.acquisition, Arc::clone(&holder.state)))
    }
}

/// A writer waiting for a reader-writer lock, holding back new readers until it is dropped.
#[derive(Debug)]
struct WaitingWriter {
    locks: Arc<Locks>,
    key: Key,
}

impl Drop for WaitingWriter {
    fn drop(&mut self) {
        if let Some(entry) = self.locks.names.lock().get_mut(&self.key) {
            entry.waiting_writers -= 1;
        }
        // Readers held back by this writer may go in now.
        self.locks.freed.notify_waiters();
    }
}

impl Key {
    fn new(kind: Kind, name: impl Into<String>) -> Key {
        Key {
            kind,
            name: name.into(),
        }
    }

    fn lock(name: &str) -> Key {
        Key::new(Kind::Lock, name)
    }
}

impl MemoryLockProvider {
    /// A provider with no lock held.
    pub fn new() -> Self {
        MemoryLockProvider::default()
    }

    /// The in-memory lock called `name`.
    pub fn create_lock(&self, name: impl Into<String>) -> MemoryLock {
        self.lock(Key::new(Kind::Lock, name), Claim::Places(1))
    }

    fn lock(&self, key: Key, claim: Claim) -> MemoryLock {
        MemoryLock {
            key,
            claim,
            locks: Arc::clone(&self.locks),
        }
    }

    /// The in-memory semaphore called `name`, allowing `max_count` holders at once, as
    /// [`Provider::create_semaphore`](crate::Provider::create_semaphore): each holder has a
    /// guard of its own, and every caller of a name must agree on `max_count` (the first
    /// acquisition records it). Independent of the lock of the same name. The test controls
    /// below act on locks, not semaphores.
    pub fn create_semaphore(&self, name: impl Into<String>, max_count: u32) -> MemoryLock {
        self.lock(Key::new(Kind::Semaphore, name), Claim::Places(max_count))
    }

    /// The in-memory reader-writer lock called `name`, as
    /// [`Provider::create_reader_writer_lock`](crate::Provider::create_reader_writer_lock):
    /// any number of readers or one writer, and while a writer waits, new readers wait too.
    /// Independent of the lock and the semaphore of the same name. The test controls below act
    /// on locks, not reader-writer locks.
    pub fn create_reader_writer_lock(&self, name: impl Into<String>) -> MemoryReaderWriterLock {
        let key = Key::new(Kind::ReaderWriter, name);
        MemoryReaderWriterLock {
            read: self.lock(key.clone(), Claim::Read),
            write: self.lock(key, Claim::Write),
        }
    }

    /// The in-memory document locks of the collection called `collection`, as
    /// [`DistributedLockProvider::create_document_lock`]: its documents are kept here as BSON,
    /// inserted by [`lock_or_insert`](MemoryDocumentLock::lock_or_insert), and each is locked
    /// by one holder at a time, with fencing tokens that increase per document. A document
    /// shows its lock field as MongoDB's does (`lock: {id, fencingToken}` while locked, then
    /// `lock: {fencingToken}`), without a lease end: the double's leases have none. Filters are
    /// equalities of top-level fields (`{}` matches every document), updates `$set`, `$unset`
    /// and `$inc` of top-level fields: anything else is refused with
    /// [`Error::InvalidArgument`], not guessed at.
    pub fn create_document_lock(&self, collection: impl Into<String>) -> MemoryDocumentLock {
        MemoryDocumentLock {
            collection: collection.into(),
            locks: Arc::clone(&self.locks),
        }
    }

    /// Test control: ends the current lease of `name` as if it had run out under its holder
    /// (a renewal that failed for longer than the expiry): the holder's `lost` fires, then the
    /// lock is free for the next caller, whose fencing token is larger. Returns whether the
    /// lock was held.
    pub fn expire(&self, name: &str) -> bool {
        let Some((acquisition, state)) = self.locks.holder_state(name) else {
            return false;
        };
        // Lost strictly before anyone else can take the lock.
        state.mark_lost();
        self.locks.free(&Key::lock(name), acquisition)
    }

    /// Test control: makes the holder of `name` presume its lease lost (its `lost` fires, its
    /// `release` returns [`Error::LockLost`]), while the lock stays taken until the guard is
    /// released or dropped or [`expire`](Self::expire) is called, as a lease whose renewal got
    /// no reply stays on the server until it expires. Returns whether the lock was held.
    pub fn mark_lost(&self, name: &str) -> bool {
        match self.locks.holder_state(name) {
            Some((_, state)) => {
                state.mark_lost();
                true
            }
            None => false,
        }
    }

    /// Whether someone holds `name`.
    pub fn is_held(&self, name: &str) -> bool {
        self.locks.holder_state(name).is_some()
    }

    /// Shuts the provider (and its clones) down, as [`Provider::shutdown`](crate::Provider::shutdown)
    /// does: every lock held through it is lost (its `lost` fires, its release returns
    /// [`Error::LockLost`]) and freed, waiting calls end with [`Error::ShutDown`], and so does
    /// every later acquisition. A second call does nothing more.
    pub async fn shutdown(&self) {
        self.locks.shut_down();
    }

    /// The fencing token of the last acquisition of `name`, if it was ever acquired.
    pub fn last_fencing_token(&self, name: &str) -> Option<FencingToken> {
        let names = self.locks.names.lock();
        let entry = names.get(&Key::lock(name))?;
        (entry.last_token > 0).then(|| FencingToken::new(entry.last_token))
    }
}

impl DistributedLockProvider for MemoryLockProvider {
    fn create_lock(&self, name: &str) -> Box<dyn DistributedLock> {
        Box::new(MemoryLockProvider::create_lock(self, name))
    }

    fn create_semaphore(&self, name: &str, max_count: u32) -> Box<dyn DistributedLock> {
        Box::new(MemoryLockProvider::create_semaphore(self, name, max_count))
    }

    fn create_reader_writer_lock(&self, name: &str) -> Box<dyn DistributedReaderWriterLock> {
        Box::new(MemoryLockProvider::create_reader_writer_lock(self, name))
    }

    fn create_document_lock(&self, collection: &str) -> Box<dyn DistributedDocumentLock> {
        Box::new(MemoryLockProvider::create_document_lock(self, collection))
    }
}

/// An in-memory exclusive lock, or a semaphore (a lock with `max_count` places); see the
/// [module docs](self).
#[derive(Clone)]
pub struct MemoryLock {
    key: Key,
    /// What each acquisition takes: one of its places, or a side of a reader-writer lock.
    claim: Claim,
    locks: Arc<Locks>,
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
    /// The refusals of the MongoDB locks: [`Error::InvalidArgument`] for a name over 1 MiB (and
    /// for a semaphore, a `max_count` of 0 or one that differs from the count its first
    /// acquisition recorded), [`Error::NoRuntime`] outside a Tokio runtime, [`Error::ShutDown`]
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
    /// [`Error::Timeout`] when `timeout` runs out; the refusals of [`acquire`](Self::acquire).
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

/// Proof that a [`MemoryLock`] is held; behaves as [`LockGuard`](crate::LockGuard) does.
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

    /// Releases the lock and wakes its waiters.
    ///
    /// # Errors
    /// [`Error::LockLost`] if the lock was lost before (it is freed all the same, if still
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

impl Drop for MemoryGuard {
    fn drop(&mut self) {
        let _ = self.end();
    }
}

crate::traits::impl_distributed_lock_guard!(MemoryGuard);

/// An in-memory reader-writer lock; see the [module docs](self) and
/// [`MongoDistributedReaderWriterLock`](crate::MongoDistributedReaderWriterLock), whose
/// behaviour it keeps: readers share the lock, a writer holds it alone, and while a writer
/// waits (not on a single `try_acquire_write`), new readers wait too.
#[derive(Clone, Debug)]
pub struct MemoryReaderWriterLock {
    read: MemoryLock,
    write: MemoryLock,
}

impl MemoryReaderWriterLock {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.read.name()
    }

    /// Waits until a read lock is acquired: when no writer holds the lock and none waits.
    ///
    /// # Errors
    /// The refusals of [`MemoryLock::acquire`].
    pub async fn acquire_read(&self) -> Result<MemoryReadGuard> {
        self.read.acquire().await.map(MemoryReadGuard)
    }

    /// Waits up to `timeout` for a read lock.
    ///
    /// # Errors
    /// [`Error::Timeout`] when `timeout` runs out; the refusals of [`MemoryLock::acquire`].
    pub async fn acquire_read_timeout(&self, timeout: Duration) -> Result<MemoryReadGuard> {
        self.read
            .acquire_timeout(timeout)
            .await
            .map(MemoryReadGuard)
    }

    /// One attempt at a read lock: `Ok(None)` if a writer holds the lock or waits for it.
    ///
    /// # Errors
    /// The refusals of [`MemoryLock::acquire`].
    pub async fn try_acquire_read(&self) -> Result<Option<MemoryReadGuard>> {
        Ok(self.read.try_acquire().await?.map(MemoryReadGuard))
    }

    /// Attempts at a read lock for up to `timeout`: `Ok(None)` if it stayed unavailable.
    ///
    /// # Errors
    /// The refusals of [`MemoryLock::acquire`].
    pub async fn try_acquire_read_timeout(
        &self,
        timeout: Duration,
    ) -> Result<Option<MemoryReadGuard>> {
        let guard = self.read.try_acquire_timeout(timeout).await?;
        Ok(guard.map(MemoryReadGuard))
    }

    /// Waits until the write lock is acquired: when no reader and no other writer holds it.
    /// New readers wait meanwhile.
    ///
    /// # Errors
    /// The refusals of [`MemoryLock::acquire`].
    pub async fn acquire_write(&self) -> Result<MemoryGuard> {
        self.write.acquire().await
    }

    /// Waits up to `timeout` for the write lock.
    ///
    /// # Errors
    /// [`Error::Timeout`] when `timeout` runs out; the refusals of [`MemoryLock::acquire`].
    pub async fn acquire_write_timeout(&self, timeout: Duration) -> Result<MemoryGuard> {
        self.write.acquire_timeout(timeout).await
    }

    /// One attempt at the write lock: `Ok(None)` if readers or a writer hold it. It holds back
    /// no reader.
    ///
    /// # Errors
    /// The refusals of [`MemoryLock::acquire`].
    pub async fn try_acquire_write(&self) -> Result<Option<MemoryGuard>> {
        self.write.try_acquire().await
    }

    /// Attempts at the write lock for up to `timeout`: `Ok(None)` if it stayed unavailable.
    ///
    /// # Errors
    /// The refusals of [`MemoryLock::acquire`].
    pub async fn try_acquire_write_timeout(
        &self,
        timeout: Duration,
    ) -> Result<Option<MemoryGuard>> {
        self.write.try_acquire_timeout(timeout).await
    }
}

crate::traits::impl_distributed_reader_writer_lock!(MemoryReaderWriterLock);

/// Proof that a [`MemoryReaderWriterLock`] is held to read; behaves as
/// [`ReadGuard`](crate::ReadGuard) does (no fencing token).
#[must_use = "dropping the guard releases the read lock at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct MemoryReadGuard(MemoryGuard);

impl MemoryReadGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// A signal that turns true when the read lock is lost (only at the provider's shutdown).
    pub fn lost(&self) -> LostSignal {
        self.0.lost()
    }

    /// Whether the read lock is lost.
    pub fn is_lost(&self) -> bool {
        self.0.is_lost()
    }

    /// Releases the read lock and wakes its waiters.
    ///
    /// # Errors
    /// [`Error::LockLost`] if the read lock was lost before.
    pub async fn release(self) -> Result<()> {
        self.0.release().await
    }
}

crate::traits::impl_distributed_read_guard!(MemoryReadGuard);

/// In-memory document locks: the documents of one collection of the provider, kept as BSON,
/// each lockable by one holder at a time; see
/// [`MemoryLockProvider::create_document_lock`].
#[derive(Clone)]
pub struct MemoryDocumentLock {
    collection: String,
    locks: Arc<Locks>,
}

impl fmt::Debug for MemoryDocumentLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryDocumentLock")
            .field("collection", &self.collection)
            .finish_non_exhaustive()
    }
}

/// A stored document of an in-memory collection, with its lock.
#[derive(Debug)]
struct StoredDocument {
    document: Document,
    /// The fencing token of its last lock (0: never locked).
    last_token: i64,
    holder: Option<Holder>,
}

impl MemoryDocumentLock {
    /// The collection's name.
    pub fn name(&self) -> &str {
        &self.collection
    }

    /// Waits until a document matching `filter` is locked, as
    /// [`DocumentLock::lock`](crate::DocumentLock::lock).
    ///
    /// # Errors
    /// [`Error::DocumentNotFound`] when no document matches; [`Error::InvalidArgument`] for a
    /// filter other than equalities of top-level fields (what the double understands); the
    /// refusals of [`MemoryLock::acquire`].
    pub async fn lock(&self, filter: Document) -> Result<MemoryDocumentGuard> {
        loop {
            if let Some(guard) = self.lock_within(&filter, None).await? {
                return Ok(guard);
            }
        }
    }

    /// Waits up to `timeout` for a document matching `filter`.
    ///
    /// # Errors
    /// [`Error::Timeout`] when `timeout` runs out; otherwise as [`lock`](Self::lock).
    pub async fn lock_timeout(
        &self,
        filter: Document,
        timeout: Duration,
    ) -> Result<MemoryDocumentGuard> {
        let started = Instant::now();
        self.lock_within(&filter, Some(timeout))
            .await?
            .ok_or_else(|| Error::Timeout {
                name: self.collection.clone(),
                waited: started.elapsed(),
                holders: Vec::new(),
            })
    }

    /// One attempt: `Ok(None)` if every matching document is locked.
    ///
    /// # Errors
    /// As [`lock`](Self::lock).
    pub async fn try_lock(&self, filter: Document) -> Result<Option<MemoryDocumentGuard>> {
        self.lock_within(&filter, Some(Duration::ZERO)).await
    }

    /// Attempts for up to `timeout`: `Ok(None)` if every matching document stayed locked.
    ///
    /// # Errors
    /// As [`lock`](Self::lock).
    pub async fn try_lock_timeout(
        &self,
        filter: Document,
        timeout: Duration,
    ) -> Result<Option<MemoryDocumentGuard>> {
        self.lock_within(&filter, Some(timeout)).await
    }

    /// Locks the document with `_id` `id`, inserting `new_document` (with that `_id`) first if
    /// it does not exist, as [`DocumentLock::lock_or_insert`](crate::DocumentLock::lock_or_insert).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `new_document` carries another `_id` or the lock field
    /// `lock`; otherwise as [`lock`](Self::lock).
    pub async fn lock_or_insert(
        &self,
        id: impl Into<Bson>,
        new_document: Document,
    ) -> Result<MemoryDocumentGuard> {
        let id = id.into();
        let insert = crate::document_lock::insertion(new_document, &id, LOCK_FIELD)?;
        self.check()?;
        self.locks.insert_missing(&self.collection, insert);
        self.lock(doc! { "_id": id }).await
    }

    /// What the MongoDB document locks refuse before they try.
    fn check(&self) -> Result<()> {
        if let Some(problem) = Problem::of_collection(&self.collection) {
            return Problem::check(Some(&problem));
        }
        if self.locks.shut_down.load(Ordering::SeqCst) {
            return Err(Error::ShutDown);
        }
        tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        Ok(())
    }

    /// Locks a matching unlocked document as soon as there is one, within `timeout` if given.
    async fn lock_within(
        &self,
        filter: &Document,
        timeout: Option<Duration>,
    ) -> Result<Option<MemoryDocumentGuard>> {
        self.check()?;
        check_filter(filter)?;
        let deadline = timeout.and_then(|timeout| Instant::now().checked_add(timeout));
        loop {
            // Registered before the attempt, so a release in between is not missed.
            let freed = self.locks.freed.notified();
            if let Some(guard) = self.take(filter)? {
                return Ok(Some(guard));
            }
            match deadline {
                None => freed.await,
                Some(deadline) => {
                    if tokio::time::timeout_at(deadline, freed).await.is_err() {
                        return self.take(filter);
                    }
                }
            }
        }
    }

    /// One attempt: locks the first unlocked document matching `filter`.
    fn take(&self, filter: &Document) -> Result<Option<MemoryDocumentGuard>> {
        let mut collections = self.locks.collections.lock();
        if self.locks.shut_down.load(Ordering::SeqCst) {
            return Err(Error::ShutDown);
        }
        let documents = collections.entry(self.collection.clone()).or_default();
        let mut matched = false;
        for stored in documents.iter_mut() {
            if !matches(&stored.document, filter) {
                continue;
            }
            matched = true;
            if stored.holder.is_some() {
                continue;
            }
            stored.last_token += 1;
            let acquisition = self.locks.next_acquisition.fetch_add(1, Ordering::SeqCst);
            // As the MongoDB document lock stores it (without a lease end: the double's leases
            // have none).
            stored.document.insert(
                LOCK_FIELD,
                doc! { "id": format!("memory-{acquisition}"), "fencingToken": stored.last_token },
            );
            let state = LeaseState::without_deadline();
            stored.holder = Some(Holder {
                acquisition,
                reader: false,
                state: Arc::clone(&state),
            });
            return Ok(Some(MemoryDocumentGuard {
                id: stored.document.get("_id").cloned().unwrap_or(Bson::Null),
                document: stored.document.clone(),
                fencing_token: FencingToken::new(stored.last_token),
                collection: self.collection.clone(),
                locks: Arc::clone(&self.locks),
                acquisition,
                state,
                ended: false,
            }));
        }
        if matched {
            Ok(None)
        } else {
            Err(Error::DocumentNotFound {
                collection: self.collection.clone(),
            })
        }
    }
}

/// Refuses a filter that is not made of equalities of top-level fields (operators, dotted
/// paths): the double does not evaluate MongoDB queries. Checked before any document is looked
/// at, so the refusal never depends on the data.
fn check_filter(filter: &Document) -> Result<()> {
    for (field, value) in filter {
        let operator = match value {
            Bson::Document(inner) => inner.keys().find(|key| key.starts_with('$')),
            _ => None,
        };
        if field.starts_with('$') || field.contains('.') || operator.is_some() {
            return Err(Error::InvalidArgument(format!(
                "the in-memory document locks match equalities of top-level fields only, not \
                 {field:?}: test such a filter against MongoDB"
            )));
        }
    }
    Ok(())
}

/// Whether `document` matches `filter` (checked by [`check_filter`]): every field of the
/// filter equal to the document's.
fn matches(document: &Document, filter: &Document) -> bool {
    filter
        .iter()
        .all(|(field, value)| document.get(field) == Some(value))
}

/// `current + by` as MongoDB's `$inc` computes it: a missing field becomes `by`; two 32-bit
/// integers stay one while the sum fits; a 64-bit integer widens the sum, a double makes it a
/// double. `None` for what is not a number, or an overflow.
fn increment(current: Option<&Bson>, by: &Bson) -> Option<Bson> {
    let integer = |value: &Bson| match value {
        Bson::Int32(value) => Some(i64::from(*value)),
        Bson::Int64(value) => Some(*value),
        _ => None,
    };
    let float = |value: &Bson| match value {
        Bson::Double(value) => Some(*value),
        // Precision beyond 2^53 is lost, as in MongoDB's own conversion to a double.
        other => integer(other).map(|value| value as f64),
    };
    match (current, by) {
        (None, Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_)) => Some(by.clone()),
        (Some(Bson::Int32(a)), Bson::Int32(b)) => a.checked_add(*b).map(Bson::Int32),
        (Some(a @ (Bson::Int32(_) | Bson::Int64(_))), Bson::Int32(_) | Bson::Int64(_)) => {
            integer(a)?.checked_add(integer(by)?).map(Bson::Int64)
        }
        (Some(a), by) => Some(Bson::Double(float(a)? + float(by)?)),
        (None, _) => None,
    }
}

/// Applies `update` ($set, $unset and $inc of top-level fields) to `document`, refusing what
/// MongoDB's document locks refuse (no operators, the lock field) and what the double does not
/// implement.
fn apply(document: &mut Document, update: &Document) -> Result<()> {
    check_operators(update, LOCK_FIELD)?;
    let mut updated = document.clone();
    for (operator, fields) in update {
        let Bson::Document(fields) = fields else {
            unreachable_operator(operator)?;
            continue;
        };
        for (field, value) in fields {
            if field.contains('.') || field == "_id" {
                return Err(Error::InvalidArgument(format!(
                    "the in-memory document locks update top-level fields other than _id only, \
                     not {field:?}"
                )));
            }
            match operator.as_str() {
                "$set" => {
                    updated.insert(field, value.clone());
                }
                "$unset" => {
                    updated.remove(field);
                }
                "$inc" => {
                    let Some(sum) = increment(updated.get(field), value) else {
                        return Err(Error::InvalidArgument(format!(
                            "$inc of {field:?}: both the field and the increment must be \
                             numbers, and the sum must fit"
                        )));
                    };
                    updated.insert(field, sum);
                }
                other => unreachable_operator(other)?,
            }
        }
    }
    *document = updated;
    Ok(())
}

/// The refusal of an update operator the double does not implement.
fn unreachable_operator(operator: &str) -> Result<()> {
    Err(Error::InvalidArgument(format!(
        "the in-memory document locks implement $set, $unset and $inc, not {operator}: test \
         such an update against MongoDB"
    )))
}

impl Locks {
    /// Inserts `document` into `collection` unless a document with its `_id` is there.
    fn insert_missing(&self, collection: &str, document: Document) {
        let mut collections = self.collections.lock();
        let documents = collections.entry(collection.to_owned()).or_default();
        let id = document.get("_id");
        if !documents
            .iter()
            .any(|stored| stored.document.get("_id") == id)
        {
            documents.push(StoredDocument {
                document,
                last_token: 0,
                holder: None,
            });
        }
    }

    /// Runs `change` on the document `id` of `collection` while `acquisition` holds it, then
    /// unlocks it if `unlock`; [`Error::LockLost`] (and nothing changed) if the lock was lost.
    /// A failed `change` leaves the document as it was.
    fn while_held(
        &self,
        collection: &str,
        id: &Bson,
        acquisition: u64,
        unlock: bool,
        change: impl FnOnce(&mut Document) -> Result<()>,
    ) -> Result<()> {
        let result = {
            let mut collections = self.collections.lock();
            let stored = collections.get_mut(collection).and_then(|documents| {
                documents.iter_mut().find(|stored| {
                    stored.document.get("_id") == Some(id)
                        && stored
                            .holder
                            .as_ref()
                            .is_some_and(|holder| holder.acquisition == acquisition)
                })
            });
            match stored {
                Some(stored) => {
                    let lost = stored
                        .holder
                        .as_ref()
                        .is_some_and(|holder| holder.state.is_lost());
                    let changed = if lost {
                        Err(Error::LockLost {
                            name: format!("{collection}/{id}"),
                        })
                    } else {
                        change(&mut stored.document)
                    };
                    // An ending write unlocks whatever its outcome (its guard is gone), as on
                    // MongoDB; a checkpoint that failed leaves the document locked.
                    if unlock {
                        stored.holder = None;
                        // The lock field keeps the fencing token, as on MongoDB.
                        let token = stored.last_token;
                        stored
                            .document
                            .insert(LOCK_FIELD, doc! { "fencingToken": token });
                    }
                    changed
                }
                None => Err(Error::LockLost {
                    name: format!("{collection}/{id}"),
                }),
            }
        };
        self.freed.notify_waiters();
        result
    }
}

/// Proof that a document of a [`MemoryDocumentLock`] is locked; behaves as
/// [`DocumentGuard`](crate::DocumentGuard) does.
#[must_use = "dropping the guard unlocks the document at once"]
#[clippy::has_significant_drop]
pub struct MemoryDocumentGuard {
    document: Document,
    id: Bson,
    fencing_token: FencingToken,
    collection: String,
    locks: Arc<Locks>,
    acquisition: u64,
    state: Arc<LeaseState>,
    /// Set once a commit, replace or release ended the lock (whatever its outcome).
    ended: bool,
}

impl fmt::Debug for MemoryDocumentGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryDocumentGuard")
            .field("collection", &self.collection)
            .field("id", &self.id)
            .field("fencing_token", &self.fencing_token)
            .finish_non_exhaustive()
    }
}

impl MemoryDocumentGuard {
    /// The locked document, as it was when it was locked.
    pub fn document(&self) -> &Document {
        &self.document
    }

    /// The document's `_id`.
    pub fn id(&self) -> &Bson {
        &self.id
    }

    /// This acquisition's fencing token: larger than every earlier one of the same document.
    pub fn fencing_token(&self) -> FencingToken {
        self.fencing_token
    }

    /// A signal that turns true when the lock is lost (only at the provider's shutdown).
    pub fn lost(&self) -> LostSignal {
        LostSignal::new(vec![Arc::clone(&self.state)])
    }

    /// Whether the lock is lost.
    pub fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// Applies `update` to the document and keeps it locked.
    ///
    /// # Errors
    /// [`Error::LockLost`] if the lock was lost (nothing is written); [`Error::InvalidArgument`]
    /// for an update that is not made of update operators, touches `_id` or the lock field, or
    /// uses what the double does not implement (anything but `$set`, `$unset`, `$inc` of
    /// top-level fields).
    pub async fn checkpoint(&self, update: Document) -> Result<()> {
        self.locks.while_held(
            &self.collection,
            &self.id,
            self.acquisition,
            false,
            |document| apply(document, &update),
        )
    }

    /// Applies `update` and unlocks the document.
    ///
    /// # Errors
    /// As [`checkpoint`](Self::checkpoint); the document is unlocked either way.
    pub async fn commit(mut self, update: Document) -> Result<()> {
        self.end(|document| apply(document, &update))
    }

    /// Replaces the document with `new_document` (its `_id` kept) and unlocks it.
    ///
    /// # Errors
    /// [`Error::LockLost`] if the lock was lost; [`Error::InvalidArgument`] if `new_document`
    /// carries another `_id` or the lock field.
    pub async fn replace(mut self, new_document: Document) -> Result<()> {
        let id = self.id.clone();
        self.end(|document| {
            if new_document.get("_id").is_some_and(|other| *other != id) {
                return Err(Error::InvalidArgument(
                    "replace: the new document has another _id".to_owned(),
                ));
            }
            if new_document.contains_key(LOCK_FIELD) {
                return Err(Error::InvalidArgument(format!(
                    "replace: the new document must not carry the lock field \
                     {LOCK_FIELD:?}"
                )));
            }
            let mut replacement = doc! { "_id": id.clone() };
            replacement.extend(new_document);
            *document = replacement;
            Ok(())
        })
    }

    /// Unlocks the document without changing it.
    ///
    /// # Errors
    /// [`Error::LockLost`] if the lock was lost before.
    pub async fn release(mut self) -> Result<()> {
        self.end(|_| Ok(()))
    }

    /// Applies `change` and unlocks the document, whatever the outcome.
    fn end(&mut self, change: impl FnOnce(&mut Document) -> Result<()>) -> Result<()> {
        self.ended = true;
        self.state.mark_released();
        self.locks
            .while_held(&self.collection, &self.id, self.acquisition, true, change)
    }
}

impl Drop for MemoryDocumentGuard {
    fn drop(&mut self) {
        if !self.ended {
            let _ = self.end(|_| Ok(()));
        }
    }
}

crate::traits::impl_distributed_document_lock!(MemoryDocumentLock);

crate::traits::impl_distributed_document_guard!(MemoryDocumentGuard);
