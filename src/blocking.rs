//! A blocking API for programs without an async runtime (cargo feature `blocking`): the same
//! locks, with synchronous methods, usable from plain threads.
//!
//! ```no_run
//! use std::time::Duration;
//! use distributed_lock_mongodb::blocking::Provider;
//!
//! fn main() -> distributed_lock_mongodb::Result<()> {
//!     let provider = Provider::connect("mongodb://localhost:27017", "app")?;
//!     let lock = provider.create_lock("nightly-report");
//!     let guard = lock.acquire()?; // blocks this thread; the lease now renews itself
//!     // ... the protected work: check `guard.is_lost()` between steps ...
//!     guard.release()?; // Err(LockLost) if it was lost meanwhile
//!
//!     if let Some(guard) = lock.try_acquire_timeout(Duration::from_secs(5))? {
//!         println!("fencing token {}", guard.fencing_token());
//!     } // dropping a guard releases it in the background
//!     Ok(())
//! }
//! ```
//!
//! Each type wraps its async counterpart and runs its methods to completion, so everything the
//! async types document (waiting, retries, handoff, errors, guarantees) holds here too.
//!
//! # Design decisions
//!
//! - **A runtime per provider that keeps running between calls.** A lease must be renewed while
//!   its holder does other work, not only while it calls into this crate, and the MongoDB driver
//!   runs its connection monitors on the runtime that created the client. So
//!   [`Provider::connect`] starts a multi-threaded Tokio runtime with one worker thread and
//!   creates the client on it: the worker runs the renewals, background releases, spawned
//!   attempts and driver monitors at all times. (A current-thread runtime would make progress
//!   only inside a blocking call, and leases would be lost in between.) Clones of the provider,
//!   and the locks and guards created from it, share that runtime; it costs one thread, plus
//!   the blocking-pool threads Tokio starts on demand (DNS lookups).
//! - **Blocking calls** run the async method on the calling thread with `block_on`; any
//!   number of threads may call at once. A blocking call cannot be cancelled: use the
//!   `*_timeout` variants to bound a wait.
//! - **Inside a Tokio runtime** every method that would block returns
//!   [`Error::BlockingInAsyncContext`] and does nothing (blocking there would stall the
//!   runtime, and Tokio panics when a runtime is started within another). Any thread with a
//!   Tokio context counts, `spawn_blocking` threads included: Tokio offers no way to tell
//!   them apart. Use the async API there.
//! - **Dropping a guard** releases it in the background, as the async guard does, on the
//!   provider's runtime, which stays alive at least as long as the guard (every guard holds a
//!   handle to it). Dropping never blocks.
//! - **Dropping the last handle** (provider, lock or guard) to a runtime waits up to 5 seconds
//!   for the releases still under way ([`crate::Provider::shutdown`]), closes the client's
//!   connections, then stops the runtime. If the last handle is dropped inside a Tokio runtime,
//!   where blocking is not allowed, that happens on a helper thread instead and nobody waits
//!   for it. A lease whose release did not finish in time ends by itself at its expiry.
//! - **Not wrapped**: document locks, fenced writes, leader election, transactions and
//!   `run_while_held` (a synchronous closure cannot be interrupted when the lock is lost):
//!   check [`LockGuard::is_lost`] between steps, or protect writes with
//!   [fencing tokens](LockGuard::fencing_token).

use std::sync::Arc;
use std::time::Duration;

use mongodb::options::ClientOptions;
use tokio::runtime::Handle;

use crate::{
    CompositeMember, Error, FencingToken, LockDetails, LockFilter, LockKind, LockOptions,
    LockStatus, LostSignal, Result,
};

/// How long dropping the last handle to a runtime waits for the releases still under way.
const WIND_DOWN_GRACE: Duration = Duration::from_secs(5);

/// The runtime every handle of one provider shares, and what must be wound down with it.
#[derive(Debug)]
struct Background {
    runtime: OwnedRuntime,
    /// The provider as connected: its clones (with other settings) share its renewal loops, so
    /// shutting it down waits for every release under way.
    provider: crate::Provider,
    client: mongodb::Client,
}

impl Background {
    /// Runs `work` to completion on the calling thread, with the runtime's context.
    fn block_on<F: Future>(&self, work: F) -> Result<F::Output> {
        refuse_inside_runtime()?;
        match &self.runtime.0 {
            Some(runtime) => Ok(runtime.block_on(work)),
            // Unreachable: the runtime is only taken out by `drop`, when no handle is left to
            // call this. Reported as a runtime that has gone rather than a panic.
            None => Err(Error::BackgroundTaskEnded {
                operation: crate::Operation::Acquire,
            }),
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let runtime = OwnedRuntime(self.runtime.0.take());
        let (provider, client) = (self.provider.clone(), self.client.clone());
        let wind_down = move || runtime.wind_down(provider, client);
        if inside_runtime() {
            // Blocking is not allowed here. If the thread cannot start, the closure is dropped,
            // and with it the runtime, which `OwnedRuntime` then stops without blocking.
            let _ = std::thread::Builder::new()
                .name("dlock-wind-down".to_owned())
                .spawn(wind_down);
        } else {
            wind_down();
        }
    }
}

/// A Tokio runtime that, unless [wound down](Self::wind_down), is stopped without waiting when
/// dropped: that never blocks, so it cannot panic inside another runtime.
#[derive(Debug)]
struct OwnedRuntime(Option<tokio::runtime::Runtime>);

impl OwnedRuntime {
    /// Waits (a while) for the releases under way, closes the client, stops the runtime.
    fn wind_down(mut self, provider: crate::Provider, client: mongodb::Client) {
        let Some(runtime) = self.0.take() else {
            return;
        };
        runtime.block_on(async {
            let finishing = async {
                provider.shutdown().await;
                client.shutdown().immediate(true).await;
            };
            // Past the grace period, leases not yet released expire by themselves.
            let _ = tokio::time::timeout(WIND_DOWN_GRACE, finishing).await;
        });
        runtime.shutdown_timeout(Duration::from_secs(1));
    }
}

impl Drop for OwnedRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// [`Error::BlockingInAsyncContext`] on a thread with a Tokio runtime context.
fn refuse_inside_runtime() -> Result<()> {
    if inside_runtime() {
        Err(Error::BlockingInAsyncContext)
    } else {
        Ok(())
    }
}

/// Whether this thread has a Tokio runtime context (a runtime's thread, `block_on`,
/// `spawn_blocking`, or an entered handle), where blocking may be forbidden.
fn inside_runtime() -> bool {
    Handle::try_current().is_ok()
}

/// A factory of blocking locks: the blocking counterpart of [`crate::Provider`], with its own
/// runtime and MongoDB client (see the [module docs](self)).
///
/// Clone + Send + Sync; clones share the runtime, the client and the renewal loops. Configure it
/// once with the `with_*` setters, then create locks by name.
///
/// ```no_run
/// # fn demo() -> distributed_lock_mongodb::Result<()> {
/// use distributed_lock_mongodb::blocking::Provider;
///
/// let provider = Provider::connect("mongodb://localhost:27017", "app")?.with_collection("job_locks");
/// let guard = provider.create_lock("order-42").acquire()?;
/// guard.release()?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Provider {
    // Declared before `background`, so that it is dropped first (see `Background::drop`).
    inner: crate::Provider,
    background: Arc<Background>,
}

impl Provider {
    /// Starts the provider's runtime and a MongoDB client for `uri` on it, and hands out locks in
    /// `database`'s default collections, with default options. Like the driver, it connects
    /// lazily: an unreachable server is reported by the first call that talks to it.
    ///
    /// # Errors
    /// [`Error::Mongo`] for an invalid connection string (or a failed DNS lookup of a
    /// `mongodb+srv` one); [`Error::RuntimeStart`] if the runtime cannot start;
    /// [`Error::BlockingInAsyncContext`] inside a Tokio runtime.
    pub fn connect(uri: &str, database: &str) -> Result<Provider> {
        let runtime = start_runtime()?;
        let options = runtime.block_on(ClientOptions::parse(uri).into_future())?;
        Provider::on(runtime, options, database)
    }

    /// As [`connect`](Self::connect), with client options built by the caller (for example to
    /// set credentials, TLS or a connection pool size).
    ///
    /// # Errors
    /// [`Error::Mongo`] if the driver rejects `options`; otherwise as
    /// [`connect`](Self::connect).
    pub fn connect_with_options(options: ClientOptions, database: &str) -> Result<Provider> {
        Provider::on(start_runtime()?, options, database)
    }

    fn on(
        runtime: tokio::runtime::Runtime,
        options: ClientOptions,
        database: &str,
    ) -> Result<Self> {
        // Inside the runtime's context, so that the driver's monitors run on it.
        let client = {
            let _context = runtime.enter();
            mongodb::Client::with_options(options)?
        };
        let inner = crate::Provider::new(&client.database(database));
        let background = Background {
            runtime: OwnedRuntime(Some(runtime)),
            provider: inner.clone(),
            client,
        };
        Ok(Provider {
            inner,
            background: Arc::new(background),
        })
    }

    /// Keeps exclusive locks (and composites' members) in `collection`. Defaults to
    /// `distributed_locks`. See [`crate::Provider::with_collection`].
    #[must_use]
    pub fn with_collection(mut self, collection: impl Into<String>) -> Self {
        self.inner = self.inner.with_collection(collection);
        self
    }

    /// Keeps reader-writer locks in `collection`. Defaults to `distributed_rw_locks`.
    #[must_use]
    pub fn with_reader_writer_collection(mut self, collection: impl Into<String>) -> Self {
        self.inner = self.inner.with_reader_writer_collection(collection);
        self
    }

    /// Keeps semaphores in `collection`. Defaults to `distributed_semaphores`.
    #[must_use]
    pub fn with_semaphore_collection(mut self, collection: impl Into<String>) -> Self {
        self.inner = self.inner.with_semaphore_collection(collection);
        self
    }

    /// Uses `options` for every lock created from now on. Defaults to
    /// [`LockOptions::default`].
    #[must_use]
    pub fn with_options(mut self, options: LockOptions) -> Self {
        self.inner = self.inner.with_options(options);
        self
    }

    /// The details that reader-writer locks and semaphores created from now on store with
    /// their holders. Defaults to this process's host and id, no owner. See
    /// [`crate::Provider::with_details`].
    #[must_use]
    pub fn with_details(mut self, details: LockDetails) -> Self {
        self.inner = self.inner.with_details(details);
        self
    }

    /// Whether exclusive locks created from now on store the details too. Defaults to false;
    /// turning it on breaks interoperability with DistributedLock.MongoDB (.NET), see
    /// [`crate::Provider::with_details_in_exclusive_locks`].
    #[must_use]
    pub fn with_details_in_exclusive_locks(mut self, enabled: bool) -> Self {
        self.inner = self.inner.with_details_in_exclusive_locks(enabled);
        self
    }

    /// The provider's options.
    pub fn options(&self) -> &LockOptions {
        self.inner.options()
    }

    /// A lock called `name` with this provider's collection and options.
    pub fn create_lock(&self, name: impl Into<String>) -> MongoDistributedLock {
        MongoDistributedLock {
            inner: self.inner.create_lock(name),
            background: Arc::clone(&self.background),
        }
    }

    /// A reader-writer lock called `name`, with this provider's options and details, in its
    /// reader-writer collection.
    pub fn create_reader_writer_lock(
        &self,
        name: impl Into<String>,
    ) -> MongoDistributedReaderWriterLock {
        MongoDistributedReaderWriterLock {
            inner: self.inner.create_reader_writer_lock(name),
            background: Arc::clone(&self.background),
        }
    }

    /// A semaphore called `name` allowing `max_count` holders, with this provider's options
    /// and details, in its semaphore collection. A `max_count` of 0 is reported by the first
    /// `acquire*` call.
    pub fn create_semaphore(
        &self,
        name: impl Into<String>,
        max_count: u32,
    ) -> MongoDistributedSemaphore {
        MongoDistributedSemaphore {
            inner: self.inner.create_semaphore(name, max_count),
            background: Arc::clone(&self.background),
        }
    }

    /// The status of exclusive lock `name`, or `None` if it has no document; see
    /// [`crate::Provider::status`].
    ///
    /// # Errors
    /// As [`crate::Provider::status`]; [`Error::BlockingInAsyncContext`] inside a Tokio
    /// runtime.
    pub fn status(&self, name: &str) -> Result<Option<LockStatus>> {
        self.background.block_on(self.inner.status(name))?
    }

    /// Every lock of this provider that is held right now, one entry per holder; see
    /// [`crate::Provider::held_locks`].
    ///
    /// # Errors
    /// As [`status`](Self::status).
    pub fn held_locks(&self) -> Result<Vec<LockStatus>> {
        self.background.block_on(self.inner.held_locks())?
    }

    /// **Dangerous**: ends the lease of exclusive lock `name` now, whoever holds it; returns
    /// whether a holder was removed. Read [`crate::Provider::force_release`] first.
    ///
    /// # Errors
    /// As [`status`](Self::status).
    pub fn force_release(&self, name: &str) -> Result<bool> {
        self.background.block_on(self.inner.force_release(name))?
    }

    /// The held locks that pass `filter` (kind, name, owner, how long held); see
    /// [`crate::Provider::held_locks_matching`].
    ///
    /// # Errors
    /// As [`status`](Self::status).
    pub fn held_locks_matching(&self, filter: &LockFilter) -> Result<Vec<LockStatus>> {
        self.background
            .block_on(self.inner.held_locks_matching(filter))?
    }

    /// **Dangerous**: ends the one lease `holder` describes (an entry of
    /// [`held_locks`](Self::held_locks), of any kind); see
    /// [`crate::Provider::force_release_holder`].
    ///
    /// # Errors
    /// As [`crate::Provider::force_release_holder`]; [`Error::BlockingInAsyncContext`] inside a
    /// Tokio runtime.
    pub fn force_release_holder(&self, holder: &LockStatus) -> Result<bool> {
        self.background
            .block_on(self.inner.force_release_holder(holder))?
    }

    /// Deletes the lock documents of every kind whose last lease ended over a day ago and
    /// returns how many; see [`crate::Provider::purge_expired`].
    ///
    /// # Errors
    /// As [`status`](Self::status).
    pub fn purge_expired(&self) -> Result<u64> {
        self.background.block_on(self.inner.purge_expired())?
    }

    /// Creates the TTL index of each of the provider's collections now; see
    /// [`crate::Provider::create_indexes`].
    ///
    /// # Errors
    /// As [`crate::Provider::create_indexes`]; [`Error::BlockingInAsyncContext`] inside a Tokio
    /// runtime.
    pub fn create_indexes(&self) -> Result<()> {
        self.background.block_on(self.inner.create_indexes())?
    }

    /// Acquires `members` together (any mix of kinds, in the global lock order, all or
    /// nothing), waiting at most `timeout`; see [`crate::Provider::acquire_all`].
    ///
    /// # Errors
    /// As [`crate::Provider::acquire_all`]; [`Error::BlockingInAsyncContext`] inside a Tokio
    /// runtime.
    pub fn acquire_all<'a, M>(&self, members: &[M], timeout: Duration) -> Result<CompositeGuard>
    where
        M: Clone + Into<CompositeMember<'a>>,
    {
        let inner = self
            .background
            .block_on(self.inner.acquire_all(members, timeout))??;
        Ok(self.composite(inner))
    }

    /// Acquires `members` together only if all are free now; see
    /// [`crate::Provider::try_acquire_all`].
    ///
    /// # Errors
    /// As [`acquire_all`](Self::acquire_all), without timeouts.
    pub fn try_acquire_all<'a, M>(&self, members: &[M]) -> Result<Option<CompositeGuard>>
    where
        M: Clone + Into<CompositeMember<'a>>,
    {
        let inner = self
            .background
            .block_on(self.inner.try_acquire_all(members))??;
        Ok(inner.map(|inner| self.composite(inner)))
    }

    fn composite(&self, inner: crate::CompositeGuard) -> CompositeGuard {
        CompositeGuard {
            inner,
            background: Arc::clone(&self.background),
        }
    }

    /// Releases every lease held through this provider and its clones and stops acquiring
    /// (later acquisitions fail with [`Error::ShutDown`]); returns once the releases are done.
    /// See [`crate::Provider::shutdown`]. The runtime keeps running until the last handle is
    /// dropped.
    ///
    /// # Errors
    /// [`Error::BlockingInAsyncContext`] inside a Tokio runtime (nothing is shut down then).
    pub fn shutdown(&self) -> Result<()> {
        self.background.block_on(self.inner.shutdown())
    }
}

/// Starts a provider's runtime: one worker thread, which keeps running between blocking calls.
fn start_runtime() -> Result<tokio::runtime::Runtime> {
    refuse_inside_runtime()?;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("dlock-mongodb")
        .enable_all()
        .build()
        .map_err(Error::RuntimeStart)
}

/// A named mutual-exclusion lock with blocking methods; see
/// [`crate::MongoDistributedLock`]. Created by [`Provider::create_lock`]; cheap to clone.
#[derive(Clone, Debug)]
pub struct MongoDistributedLock {
    inner: crate::MongoDistributedLock,
    background: Arc<Background>,
}

impl MongoDistributedLock {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The lock's options.
    pub fn options(&self) -> &LockOptions {
        self.inner.options()
    }

    /// Blocks until the lock is acquired.
    ///
    /// # Errors
    /// As [`crate::MongoDistributedLock::acquire`]; [`Error::BlockingInAsyncContext`] inside a
    /// Tokio runtime.
    pub fn acquire(&self) -> Result<LockGuard> {
        let inner = self.background.block_on(self.inner.acquire())??;
        Ok(LockGuard::new(inner, &self.background))
    }

    /// Blocks at most `timeout` for the lock; see
    /// [`crate::MongoDistributedLock::acquire_timeout`].
    ///
    /// # Errors
    /// [`Error::Timeout`] when the lock stayed busy; otherwise as [`acquire`](Self::acquire).
    pub fn acquire_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        let inner = self
            .background
            .block_on(self.inner.acquire_timeout(timeout))??;
        Ok(LockGuard::new(inner, &self.background))
    }

    /// Makes one attempt; `Ok(None)` if the lock is held by someone else.
    ///
    /// # Errors
    /// As [`crate::MongoDistributedLock::try_acquire`]; [`Error::BlockingInAsyncContext`]
    /// inside a Tokio runtime.
    pub fn try_acquire(&self) -> Result<Option<LockGuard>> {
        let inner = self.background.block_on(self.inner.try_acquire())??;
        Ok(inner.map(|inner| LockGuard::new(inner, &self.background)))
    }

    /// Blocks at most `timeout` for the lock; `Ok(None)` if it stayed busy until then.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub fn try_acquire_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        let inner = self
            .background
            .block_on(self.inner.try_acquire_timeout(timeout))??;
        Ok(inner.map(|inner| LockGuard::new(inner, &self.background)))
    }
}

/// A reader-writer lock with blocking methods; see [`crate::MongoDistributedReaderWriterLock`].
/// Created by [`Provider::create_reader_writer_lock`]; cheap to clone.
#[derive(Clone, Debug)]
pub struct MongoDistributedReaderWriterLock {
    inner: crate::MongoDistributedReaderWriterLock,
    background: Arc<Background>,
}

impl MongoDistributedReaderWriterLock {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The lock's options.
    pub fn options(&self) -> &LockOptions {
        self.inner.options()
    }

    /// Blocks until a read lock is acquired (no writer holds the lock or waits for it).
    ///
    /// # Errors
    /// As [`crate::MongoDistributedReaderWriterLock::acquire_read`];
    /// [`Error::BlockingInAsyncContext`] inside a Tokio runtime.
    pub fn acquire_read(&self) -> Result<ReadGuard> {
        let inner = self.background.block_on(self.inner.acquire_read())??;
        Ok(ReadGuard::new(inner, &self.background))
    }

    /// Blocks at most `timeout` for a read lock.
    ///
    /// # Errors
    /// [`Error::Timeout`] when it stayed unavailable; otherwise as
    /// [`acquire_read`](Self::acquire_read).
    pub fn acquire_read_timeout(&self, timeout: Duration) -> Result<ReadGuard> {
        let inner = self
            .background
            .block_on(self.inner.acquire_read_timeout(timeout))??;
        Ok(ReadGuard::new(inner, &self.background))
    }

    /// Makes one attempt at a read lock; `Ok(None)` if a writer holds or waits for the lock.
    ///
    /// # Errors
    /// As [`acquire_read`](Self::acquire_read).
    pub fn try_acquire_read(&self) -> Result<Option<ReadGuard>> {
        let inner = self.background.block_on(self.inner.try_acquire_read())??;
        Ok(inner.map(|inner| ReadGuard::new(inner, &self.background)))
    }

    /// Blocks at most `timeout` for a read lock; `Ok(None)` if it stayed unavailable.
    ///
    /// # Errors
    /// As [`acquire_read`](Self::acquire_read).
    pub fn try_acquire_read_timeout(&self, timeout: Duration) -> Result<Option<ReadGuard>> {
        let inner = self
            .background
            .block_on(self.inner.try_acquire_read_timeout(timeout))??;
        Ok(inner.map(|inner| ReadGuard::new(inner, &self.background)))
    }

    /// Blocks until the write lock is acquired (no readers, no other writer).
    ///
    /// # Errors
    /// As [`crate::MongoDistributedReaderWriterLock::acquire_write`];
    /// [`Error::BlockingInAsyncContext`] inside a Tokio runtime.
    pub fn acquire_write(&self) -> Result<LockGuard> {
        let inner = self.background.block_on(self.inner.acquire_write())??;
        Ok(LockGuard::new(inner, &self.background))
    }

    /// Blocks at most `timeout` for the write lock.
    ///
    /// # Errors
    /// [`Error::Timeout`] when it stayed unavailable; otherwise as
    /// [`acquire_write`](Self::acquire_write).
    pub fn acquire_write_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        let inner = self
            .background
            .block_on(self.inner.acquire_write_timeout(timeout))??;
        Ok(LockGuard::new(inner, &self.background))
    }

    /// Makes one attempt at the write lock; `Ok(None)` if it is held.
    ///
    /// # Errors
    /// As [`acquire_write`](Self::acquire_write).
    pub fn try_acquire_write(&self) -> Result<Option<LockGuard>> {
        let inner = self.background.block_on(self.inner.try_acquire_write())??;
        Ok(inner.map(|inner| LockGuard::new(inner, &self.background)))
    }

    /// Blocks at most `timeout` for the write lock; `Ok(None)` if it stayed unavailable.
    ///
    /// # Errors
    /// As [`acquire_write`](Self::acquire_write).
    pub fn try_acquire_write_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        let inner = self
            .background
            .block_on(self.inner.try_acquire_write_timeout(timeout))??;
        Ok(inner.map(|inner| LockGuard::new(inner, &self.background)))
    }

    /// The current holders (the writer, or the readers); see
    /// [`crate::MongoDistributedReaderWriterLock::holders`].
    ///
    /// # Errors
    /// As [`crate::MongoDistributedReaderWriterLock::holders`];
    /// [`Error::BlockingInAsyncContext`] inside a Tokio runtime.
    pub fn holders(&self) -> Result<Vec<LockStatus>> {
        self.background.block_on(self.inner.holders())?
    }

    /// **Dangerous**: ends every holder's lease now; see the async type's `force_release_all`.
    ///
    /// # Errors
    /// As [`holders`](Self::holders).
    pub fn force_release_all(&self) -> Result<bool> {
        self.background.block_on(self.inner.force_release_all())?
    }
}

/// A semaphore with blocking methods; see [`crate::MongoDistributedSemaphore`]. Created by
/// [`Provider::create_semaphore`]; cheap to clone.
#[derive(Clone, Debug)]
pub struct MongoDistributedSemaphore {
    inner: crate::MongoDistributedSemaphore,
    background: Arc<Background>,
}

impl MongoDistributedSemaphore {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The semaphore's options.
    pub fn options(&self) -> &LockOptions {
        self.inner.options()
    }

    /// How many holders the semaphore allows.
    pub fn max_count(&self) -> u32 {
        self.inner.max_count()
    }

    /// Blocks until a place is acquired.
    ///
    /// # Errors
    /// As [`crate::MongoDistributedSemaphore::acquire`]; [`Error::BlockingInAsyncContext`]
    /// inside a Tokio runtime.
    pub fn acquire(&self) -> Result<LockGuard> {
        let inner = self.background.block_on(self.inner.acquire())??;
        Ok(LockGuard::new(inner, &self.background))
    }

    /// Blocks at most `timeout` for a place.
    ///
    /// # Errors
    /// [`Error::Timeout`] when every place stayed taken; otherwise as
    /// [`acquire`](Self::acquire).
    pub fn acquire_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        let inner = self
            .background
            .block_on(self.inner.acquire_timeout(timeout))??;
        Ok(LockGuard::new(inner, &self.background))
    }

    /// Makes one attempt; `Ok(None)` if every place is taken.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub fn try_acquire(&self) -> Result<Option<LockGuard>> {
        let inner = self.background.block_on(self.inner.try_acquire())??;
        Ok(inner.map(|inner| LockGuard::new(inner, &self.background)))
    }

    /// Blocks at most `timeout` for a place; `Ok(None)` if every place stayed taken.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub fn try_acquire_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        let inner = self
            .background
            .block_on(self.inner.try_acquire_timeout(timeout))??;
        Ok(inner.map(|inner| LockGuard::new(inner, &self.background)))
    }

    /// The current holders; see [`crate::MongoDistributedSemaphore::holders`].
    ///
    /// # Errors
    /// As [`crate::MongoDistributedSemaphore::holders`]; [`Error::BlockingInAsyncContext`]
    /// inside a Tokio runtime.
    pub fn holders(&self) -> Result<Vec<LockStatus>> {
        self.background.block_on(self.inner.holders())?
    }

    /// **Dangerous**: ends every holder's lease now; see the async type's `force_release_all`.
    ///
    /// # Errors
    /// As [`holders`](Self::holders).
    pub fn force_release_all(&self) -> Result<bool> {
        self.background.block_on(self.inner.force_release_all())?
    }
}

/// Proof that a lock is held (an exclusive lock, a writer, or a semaphore place); see
/// [`crate::LockGuard`].
///
/// The lease renews itself on the provider's runtime while the guard lives, whatever the
/// holding thread does. [`release`](Self::release) ends it; dropping the guard releases it in
/// the background without blocking.
#[must_use = "dropping the guard releases the lock at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct LockGuard {
    // Dropped first: its release is queued on the runtime the handle below keeps alive.
    inner: crate::LockGuard,
    background: Arc<Background>,
}

impl LockGuard {
    fn new(inner: crate::LockGuard, background: &Arc<Background>) -> Self {
        LockGuard {
            inner,
            background: Arc::clone(background),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// This acquisition's fencing token: larger than that of every earlier acquisition of the
    /// same name.
    pub fn fencing_token(&self) -> FencingToken {
        self.inner.fencing_token()
    }

    /// Whether the lock is known or presumed lost (checked against the lease's local deadline
    /// on every call). Stop touching the protected resource once it is.
    pub fn is_lost(&self) -> bool {
        self.inner.is_lost()
    }

    /// The lock's [`LostSignal`]: its [`is_lost`](LostSignal::is_lost) works on any thread; its
    /// async `wait` needs a Tokio runtime (see [`wait_lost`](Self::wait_lost) otherwise).
    pub fn lost(&self) -> LostSignal {
        self.inner.lost()
    }

    /// Blocks until the lock is known or presumed lost, for at most `timeout`: whether it was
    /// lost.
    ///
    /// # Errors
    /// [`Error::BlockingInAsyncContext`] inside a Tokio runtime.
    pub fn wait_lost(&self, timeout: Duration) -> Result<bool> {
        wait_lost(&self.background, &self.inner.lost(), timeout)
    }

    /// Stops renewing and releases the lock; see [`crate::LockGuard::release`].
    ///
    /// # Errors
    /// As [`crate::LockGuard::release`]; [`Error::BlockingInAsyncContext`] inside a Tokio
    /// runtime (the guard is dropped then, which releases the lock in the background).
    pub fn release(self) -> Result<()> {
        self.background.block_on(self.inner.release())?
    }
}

/// Proof that a read lock is held; see [`crate::ReadGuard`]. Behaves like [`LockGuard`], without
/// a fencing token.
#[must_use = "dropping the guard releases the read lock at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct ReadGuard {
    inner: crate::ReadGuard,
    background: Arc<Background>,
}

impl ReadGuard {
    fn new(inner: crate::ReadGuard, background: &Arc<Background>) -> Self {
        ReadGuard {
            inner,
            background: Arc::clone(background),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Whether the read lock is known or presumed lost.
    pub fn is_lost(&self) -> bool {
        self.inner.is_lost()
    }

    /// The read lock's [`LostSignal`]; see [`LockGuard::lost`].
    pub fn lost(&self) -> LostSignal {
        self.inner.lost()
    }

    /// Blocks until the read lock is known or presumed lost, for at most `timeout`: whether it
    /// was lost.
    ///
    /// # Errors
    /// [`Error::BlockingInAsyncContext`] inside a Tokio runtime.
    pub fn wait_lost(&self, timeout: Duration) -> Result<bool> {
        wait_lost(&self.background, &self.inner.lost(), timeout)
    }

    /// Stops renewing and releases the read lock; see [`crate::ReadGuard::release`].
    ///
    /// # Errors
    /// As [`LockGuard::release`].
    pub fn release(self) -> Result<()> {
        self.background.block_on(self.inner.release())?
    }
}

/// Several exclusive locks acquired together by [`Provider::acquire_all`]; see
/// [`crate::CompositeGuard`].
#[must_use = "dropping the guard releases every member at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct CompositeGuard {
    inner: crate::CompositeGuard,
    background: Arc<Background>,
}

impl CompositeGuard {
    /// The members' names, in acquisition order; see [`crate::CompositeGuard::names`].
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.inner.names()
    }

    /// Each member's kind and name, in acquisition order.
    pub fn members(&self) -> impl Iterator<Item = (LockKind, &str)> {
        self.inner.members()
    }

    /// Each member's fencing token, by name, in acquisition order (read locks have none).
    pub fn fencing_tokens(&self) -> impl Iterator<Item = (&str, FencingToken)> {
        self.inner.fencing_tokens()
    }

    /// Whether any member is known or presumed lost.
    pub fn is_lost(&self) -> bool {
        self.inner.is_lost()
    }

    /// A signal that turns true when any member is lost; see [`LockGuard::lost`].
    pub fn lost(&self) -> LostSignal {
        self.inner.lost()
    }

    /// Blocks until any member is known or presumed lost, for at most `timeout`: whether one
    /// was lost.
    ///
    /// # Errors
    /// [`Error::BlockingInAsyncContext`] inside a Tokio runtime.
    pub fn wait_lost(&self, timeout: Duration) -> Result<bool> {
        wait_lost(&self.background, &self.inner.lost(), timeout)
    }

    /// Releases every member; see [`crate::CompositeGuard::release`].
    ///
    /// # Errors
    /// As [`crate::CompositeGuard::release`]; [`Error::BlockingInAsyncContext`] inside a Tokio
    /// runtime (the members are released in the background then).
    pub fn release(self) -> Result<()> {
        self.background.block_on(self.inner.release())?
    }
}

/// Whether `lost` fired within `timeout`.
fn wait_lost(background: &Background, lost: &LostSignal, timeout: Duration) -> Result<bool> {
    background.block_on(async { tokio::time::timeout(timeout, lost.wait()).await.is_ok() })
}
