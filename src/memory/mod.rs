//! In-memory locks, semaphores, reader-writer locks and document locks with the crate's
//! semantics, for unit-testing application code without MongoDB: program against
//! [`DistributedLockProvider`] / [`DistributedLock`] / [`DistributedReaderWriterLock`] /
//! [`DistributedDocumentLock`], give the code a [`MemoryLockProvider`] in tests.
//!
//! What it keeps of the real thing, among everyone using the same provider (and its clones):
//! - one holder per lock name; at most `max_count` places per semaphore name, and a semaphore's
//!   callers must agree on it unless it was set ([`MemoryLock::set_max_count`]); several places
//!   at once ([`MemoryLock::acquire_many`]), the first waiter for several holding back the places
//!   it needs, and [`MemoryLock::available`]; any number of readers or one writer per
//!   reader-writer name, new readers waiting while a writer waits, and one upgradeable reader
//!   ([`MemoryReaderWriterLock::acquire_upgradeable_read`]) whose upgrade takes the write lock
//!   once it is the only holder, whatever writer waits; one holder per document of a document
//!   lock's collection;
//! - the three kinds of one name being independent, as they are in their separate collections;
//! - fencing tokens that strictly increase per name (readers have none), and per document;
//! - a guard's lease that stays held while the guard lives, with no deadline of its own (a
//!   guard's `extend` only checks its argument and that the lease is not lost), unless the
//!   provider's options ([`MemoryLockProvider::with_options`]) say `auto_renew(false)` (the lease
//!   ends at its expiry unless extended) or `max_hold` (it ends when the hold runs out);
//!   `min_hold` windows and `fair` order as the MongoDB locks keep them; jobs
//!   ([`MemoryLockProvider::create_job`]) that run once per window;
//! - `lost` that fires before anyone else can take the lock;
//! - release by [`release`](crate::DistributedLockGuard::release) or on drop, which wakes the next
//!   waiter at once;
//! - waits that end with [`Error::Timeout`](crate::Error::Timeout) as the MongoDB locks' do;
//! - `holders()` and lock watches ([`MemoryLock::watch`]), woken at every acquisition and
//!   release; composites ([`DistributedLockProvider::acquire_all`]) through the trait's default,
//!   all or nothing, in one order;
//! - the same refusals before anything happens: a name over 1 MiB is
//!   [`Error::InvalidArgument`](crate::Error::InvalidArgument), a call outside a Tokio runtime [`Error::NoRuntime`](crate::Error::NoRuntime), and after
//!   [`shutdown`](MemoryLockProvider::shutdown) [`Error::ShutDown`](crate::Error::ShutDown);
//! - for document locks: [`Error::DocumentNotFound`](crate::Error::DocumentNotFound) when nothing matches, updates refused
//!   when they are not update operators or touch the lock field, a commit or replace that
//!   unlocks in the same step. The documents live in the provider, inserted by
//!   [`lock_or_insert`](MemoryDocumentLock::lock_or_insert); filters are equalities of
//!   top-level fields and updates `$set`, `$unset`, `$inc`: the double does not evaluate MongoDB
//!   queries, and refuses the rest with [`Error::InvalidArgument`](crate::Error::InvalidArgument) instead of guessing.
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

use std::sync::Arc;
use std::time::Duration;

use crate::options::LockOptions;
use crate::token::FencingToken;
use crate::traits::{
    DistributedDocumentLock, DistributedLock, DistributedLockProvider, DistributedReaderWriterLock,
    DistributedSemaphore,
};

mod document_lock;
mod evaluator;
mod lock;
mod names;
mod revocation;
mod rw_lock;

pub use document_lock::{MemoryDocumentGuard, MemoryDocumentLock};
pub use lock::{MemoryGuard, MemoryLock};
use names::{Claim, Key, Kind, Locks};
pub use rw_lock::{MemoryReadGuard, MemoryReaderWriterLock, MemoryUpgradeableReadGuard};

/// Creates in-memory locks that exclude each other by name; clones share the locks. See the
/// [module docs](self).
#[derive(Clone, Debug, Default)]
pub struct MemoryLockProvider {
    locks: Arc<Locks>,
    options: Arc<LockOptions>,
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
            options: Arc::clone(&self.options),
        }
    }

    /// Gives its locks `options`, as [`Provider::with_options`](crate::Provider::with_options)
    /// does; the double plays these (the others change nothing here): `min_hold` (an exclusive
    /// lock stays taken until that long after its acquisition, released or not; refused by the
    /// other kinds), `max_hold` (the lease is lost that long after its acquisition),
    /// `auto_renew(false)` with `expiry` (the lease ends at its expiry unless a guard's `extend`
    /// lengthens it) and `fair` (waiters are served in the order they came: a semaphore's
    /// strictly, a reader-writer lock's writers in line and readers behind them; refused by
    /// document locks). Clones made before keep theirs; the locks are shared all the same.
    #[must_use]
    pub fn with_options(mut self, options: LockOptions) -> Self {
        self.options = Arc::new(options);
        self
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
            upgradeable: self.lock(key.clone(), Claim::UpgradeableRead),
            write: self.lock(key, Claim::Write),
        }
    }

    /// Starts campaigning for leadership of `name` with this provider's lock of that name: see
    /// [`LeaderElection`](crate::LeaderElection) (and [`expire`](Self::expire), which ends a term
    /// as a lost lease would).
    ///
    /// # Errors
    /// [`Error::NoRuntime`](crate::Error::NoRuntime) outside a Tokio runtime.
    pub fn create_leader_election(
        &self,
        name: impl Into<String>,
    ) -> crate::Result<crate::LeaderElection> {
        crate::LeaderElection::over(Box::new(self.create_lock(name)))
    }

    /// A job called `name` that runs at most once per `window`, as
    /// [`DistributedLockProvider::create_job`]: its lock is this provider's lock of that name
    /// with `window` as its `min_hold` (and `max_runtime`, if given, as its `max_hold`), which
    /// [`expire`](Self::expire) ends as a lost lease would, window kept.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`](crate::Error::InvalidOptions) for a window or longest run out
    /// of range, or in the wrong order.
    pub fn create_job(
        &self,
        name: impl Into<String>,
        window: Duration,
        max_runtime: Option<Duration>,
    ) -> crate::Result<crate::DistributedJob> {
        let mut options = self.options.to_builder().min_hold(window);
        if let Some(max_runtime) = max_runtime {
            options = options.max_hold(max_runtime);
        }
        let lock = MemoryLock {
            key: Key::new(Kind::Lock, name),
            claim: Claim::Places(1),
            locks: Arc::clone(&self.locks),
            options: Arc::new(options.build()?),
        };
        Ok(crate::DistributedJob::over(Box::new(lock)))
    }

    /// The in-memory document locks of the collection called `collection`, as
    /// [`DistributedLockProvider::create_document_lock`]: its documents are kept here as BSON,
    /// inserted by [`lock_or_insert`](MemoryDocumentLock::lock_or_insert), and each is locked
    /// by one holder at a time, with fencing tokens that increase per document. A document
    /// shows its lock field as MongoDB's does (`lock: {id, fencingToken}` while locked, then
    /// `lock: {fencingToken}`), without a lease end: the double's leases have none. Filters are
    /// equalities of top-level fields (`{}` matches every document), updates `$set`, `$unset`
    /// and `$inc` of top-level fields: anything else is refused with
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument), not guessed at.
    pub fn create_document_lock(&self, collection: impl Into<String>) -> MemoryDocumentLock {
        MemoryDocumentLock {
            collection: collection.into(),
            locks: Arc::clone(&self.locks),
            options: Arc::clone(&self.options),
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
        // Lost strictly before anyone else can take the lock. (A holder that sees the loss may
        // drop its guard, which frees the lease before this does: it was held all the same.)
        state.mark_lost();
        self.locks.free(&Key::lock(name), acquisition);
        true
    }

    /// Test control: makes the holder of `name` presume its lease lost (its `lost` fires, its
    /// `release` returns [`Error::LockLost`](crate::Error::LockLost)), while the lock stays taken until the guard is
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

    /// How many waits stand in the line of the fair lock `name` (see
    /// [`with_options`](Self::with_options)): for tests that must know a waiter is in line.
    pub fn waiting_in_line(&self, name: &str) -> usize {
        let names = self.locks.names.lock();
        names
            .get(&Key::lock(name))
            .map_or(0, |entry| entry.line.len())
    }

    /// Whether someone holds `name`.
    pub fn is_held(&self, name: &str) -> bool {
        self.locks.holder_state(name).is_some()
    }

    /// Shuts the provider (and its clones) down, as [`Provider::shutdown`](crate::Provider::shutdown)
    /// does: every lock held through it is lost (its `lost` fires, its release returns
    /// [`Error::LockLost`](crate::Error::LockLost)) and freed, waiting calls end with [`Error::ShutDown`](crate::Error::ShutDown), and so does
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

    fn create_semaphore(&self, name: &str, max_count: u32) -> Box<dyn DistributedSemaphore> {
        Box::new(MemoryLockProvider::create_semaphore(self, name, max_count))
    }

    fn create_reader_writer_lock(&self, name: &str) -> Box<dyn DistributedReaderWriterLock> {
        Box::new(MemoryLockProvider::create_reader_writer_lock(self, name))
    }

    fn create_document_lock(&self, collection: &str) -> Box<dyn DistributedDocumentLock> {
        Box::new(MemoryLockProvider::create_document_lock(self, collection))
    }

    fn create_job(
        &self,
        name: &str,
        window: Duration,
        max_runtime: Option<Duration>,
    ) -> crate::Result<crate::DistributedJob> {
        MemoryLockProvider::create_job(self, name, window, max_runtime)
    }
}
