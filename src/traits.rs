//! The lock as an interface: program against these traits, and run the same code on MongoDB
//! ([`Provider`](crate::Provider), [`MongoDistributedLock`](crate::MongoDistributedLock),
//! [`MongoDistributedSemaphore`](crate::MongoDistributedSemaphore),
//! [`MongoDistributedReaderWriterLock`](crate::MongoDistributedReaderWriterLock),
//! [`DocumentLock`](crate::DocumentLock)) or, in unit tests, on the in-memory locks, semaphores,
//! reader-writer locks and document locks of [`memory`](crate::memory). A provider also starts
//! [`LeaderElection`](crate::LeaderElection)s, and the trait objects run work bound to a lease
//! (`acquire_and_run`, `run_while_held`).
//!
//! # Why boxed futures
//! `async fn` in a trait cannot be called through `dyn` in today's Rust, and its futures carry
//! no `Send` bound a caller can rely on; applications want both (`Arc<dyn DistributedLockProvider>`
//! in their state, and guards held across `.await` in spawned tasks). So the methods return
//! [`BoxFuture`]s (`Send`) and [`BoxedGuard`]s. The cost is one allocation per call, next to
//! the network round trip of every acquisition. The same traits serve generics
//! (`fn run<L: DistributedLock>(lock: &L)`) and trait objects; the concrete types keep their
//! inherent methods, which return their own guard types without boxing.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use distributed_lock_mongodb::memory::MemoryLockProvider;
//! use distributed_lock_mongodb::{DistributedLockProvider, Result};
//!
//! /// Application code: knows nothing of MongoDB.
//! async fn nightly_job(locks: Arc<dyn DistributedLockProvider>) -> Result<bool> {
//!     let Some(guard) = locks.create_lock("nightly-job").try_acquire().await? else {
//!         return Ok(false); // another instance runs it
//!     };
//!     // ... the job, checking guard.is_lost() or guard.lost() ...
//!     guard.release().await?;
//!     Ok(true)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<()> {
//! // In a unit test: the in-memory double (in production: `Arc::new(Provider::new(&database))`).
//! let locks = MemoryLockProvider::new();
//! let other_instance = locks.create_lock("nightly-job").acquire().await?;
//! assert!(!nightly_job(Arc::new(locks.clone())).await?);
//! other_instance.release().await?;
//! assert!(nightly_job(Arc::new(locks)).await?);
//! # Ok(())
//! # }
//! ```

use std::fmt::Debug;
use std::time::Duration;

use futures::future::BoxFuture;
use mongodb::bson::{Bson, Document};

use crate::composite::CompositeMember;
use crate::error::Result;
use crate::lease::lost::LostSignal;
use crate::lock_status::LockStatus;
use crate::token::FencingToken;
use crate::watch::LockWatch;

/// A held lock of any implementation, boxed: what the [`DistributedLock`] methods return.
pub type BoxedGuard = Box<dyn DistributedLockGuard>;

/// An upgradeable read lock of any implementation, boxed: what the
/// [`DistributedReaderWriterLock::acquire_upgradeable_read`] methods return.
pub type BoxedUpgradeableReadGuard = Box<dyn DistributedUpgradeableReadGuard>;

/// A locked document of any implementation, boxed: what the [`DistributedDocumentLock`]
/// methods return.
pub type BoxedDocumentGuard = Box<dyn DistributedDocumentGuard>;

/// Several locks held together, of any implementation, boxed: what
/// [`DistributedLockProvider::acquire_all`] returns.
pub type BoxedCompositeGuard = Box<dyn DistributedCompositeGuard>;

/// Several locks of any kind held together (see [`CompositeGuard`](crate::CompositeGuard)):
/// `lost` fires when any member is lost, `release` releases every member.
pub trait DistributedCompositeGuard: Send + Sync + Debug {
    /// The members' names, in acquisition order.
    fn names(&self) -> Vec<String>;

    /// The fencing token of each member that has one (readers have none), by name.
    fn fencing_tokens(&self) -> Vec<(String, FencingToken)>;

    /// A signal that turns true when any member is known or presumed lost.
    fn lost(&self) -> LostSignal;

    /// Whether any member is known or presumed lost.
    fn is_lost(&self) -> bool;

    /// Extends every member's lease to at least `by` from now.
    ///
    /// # Errors
    /// As [`CompositeGuard::extend`](crate::CompositeGuard::extend).
    fn extend(&self, by: Duration) -> BoxFuture<'_, Result<()>>;

    /// Releases every member (in reverse acquisition order).
    ///
    /// # Errors
    /// As [`CompositeGuard::release`](crate::CompositeGuard::release).
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<()>>;
}

/// A held read lock of any implementation, boxed: what the `acquire_read*` methods of
/// [`DistributedReaderWriterLock`] return.
pub type BoxedReadGuard = Box<dyn DistributedReadGuard>;

/// Proof that a lock is held; see [`LockGuard`](crate::LockGuard), whose contract every
/// implementation follows: the lease stays held (renewed) while the guard lives, `lost` turns
/// true before anyone else can take the lock, `release` ends the lease, and dropping the guard
/// releases it in the background.
pub trait DistributedLockGuard: Send + Sync + Debug {
    /// The lock's name.
    fn name(&self) -> &str;

    /// This acquisition's fencing token: larger than that of every earlier acquisition of the
    /// same name.
    fn fencing_token(&self) -> FencingToken;

    /// A signal that turns true when the lock is known or presumed lost.
    fn lost(&self) -> LostSignal;

    /// Whether the lock is known or presumed lost.
    fn is_lost(&self) -> bool;

    /// Extends the lease to at least `by` from now; see
    /// [`LockGuard::extend`](crate::LockGuard::extend).
    ///
    /// # Errors
    /// As [`LockGuard::extend`](crate::LockGuard::extend).
    fn extend(&self, by: Duration) -> BoxFuture<'_, Result<()>>;

    /// Reports progress of the holder's work; see
    /// [`LockGuard::progress`](crate::LockGuard::progress).
    fn progress(&self) -> bool;

    /// Spawns `task` bound to the lease; see [`LockGuard::spawn`](crate::LockGuard::spawn).
    ///
    /// # Errors
    /// As [`LockGuard::spawn`](crate::LockGuard::spawn).
    fn spawn(&self, task: BoxFuture<'static, ()>) -> Result<tokio::task::JoinHandle<()>>;

    /// The token that fires when the lock is lost, at the release, and at `abort_tasks`; see
    /// [`LockGuard::cancellation`](crate::LockGuard::cancellation).
    fn cancellation(&self) -> crate::CancellationToken;

    /// Aborts the tasks bound to the lease; see
    /// [`LockGuard::abort_tasks`](crate::LockGuard::abort_tasks).
    fn abort_tasks(&self);

    /// Resolves when someone asks this holder to let go; see
    /// [`LockGuard::revocation_requested`](crate::LockGuard::revocation_requested).
    ///
    /// # Errors
    /// As [`LockGuard::revocation_requested`](crate::LockGuard::revocation_requested).
    fn revocation_requested(&self) -> BoxFuture<'_, Result<crate::Revocation>>;

    /// Releases the lock.
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) if it had been lost before; otherwise as
    /// the implementation's release.
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<()>>;
}

/// Proof that a read lock is held; see [`ReadGuard`](crate::ReadGuard), whose contract every
/// implementation follows. It is a [`DistributedLockGuard`] without a fencing token: readers
/// share the lock, so there is no order among them to enforce.
pub trait DistributedReadGuard: Send + Sync + Debug {
    /// The lock's name.
    fn name(&self) -> &str;

    /// A signal that turns true when the read lock is known or presumed lost.
    fn lost(&self) -> LostSignal;

    /// Whether the read lock is known or presumed lost.
    fn is_lost(&self) -> bool;

    /// Extends the lease to at least `by` from now; see
    /// [`LockGuard::extend`](crate::LockGuard::extend).
    ///
    /// # Errors
    /// As [`LockGuard::extend`](crate::LockGuard::extend).
    fn extend(&self, by: Duration) -> BoxFuture<'_, Result<()>>;

    /// Releases the read lock.
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) if it had been lost before; otherwise as
    /// the implementation's release.
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<()>>;
}

/// A held upgradeable read lock, of any implementation: see
/// [`UpgradeableReadGuard`](crate::UpgradeableReadGuard).
pub trait DistributedUpgradeableReadGuard: Send + Sync + Debug {
    /// The lock's name.
    fn name(&self) -> &str;

    /// Whether it holds the write lease now.
    fn is_upgraded(&self) -> bool;

    /// The write lease's fencing token while upgraded, `None` while reading.
    fn fencing_token(&self) -> Option<FencingToken>;

    /// A signal that turns true when a lease held now is known or presumed lost.
    fn lost(&self) -> LostSignal;

    /// Whether a lease held now is known or presumed lost.
    fn is_lost(&self) -> bool;

    /// Waits until it holds the write lease too (the plain readers have left).
    ///
    /// # Errors
    /// As [`UpgradeableReadGuard::upgrade`](crate::UpgradeableReadGuard::upgrade).
    fn upgrade(&mut self) -> BoxFuture<'_, Result<()>>;

    /// One upgrade attempt: whether it holds the write lease now.
    ///
    /// # Errors
    /// As [`UpgradeableReadGuard::upgrade`](crate::UpgradeableReadGuard::upgrade).
    fn try_upgrade(&mut self) -> BoxFuture<'_, Result<bool>>;

    /// Upgrade attempts for up to `timeout`: whether it holds the write lease now.
    ///
    /// # Errors
    /// As [`UpgradeableReadGuard::upgrade`](crate::UpgradeableReadGuard::upgrade).
    fn try_upgrade_timeout(&mut self, timeout: Duration) -> BoxFuture<'_, Result<bool>>;

    /// Ends the write lease and goes on reading.
    ///
    /// # Errors
    /// As [`UpgradeableReadGuard::downgrade`](crate::UpgradeableReadGuard::downgrade).
    fn downgrade(&mut self) -> BoxFuture<'_, Result<()>>;

    /// Extends its leases to at least `by` from now.
    ///
    /// # Errors
    /// As [`LockGuard::extend`](crate::LockGuard::extend).
    fn extend(&self, by: Duration) -> BoxFuture<'_, Result<()>>;

    /// Releases the write lease (if held), then the read lease.
    ///
    /// # Errors
    /// As [`LockGuard::release`](crate::LockGuard::release).
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<()>>;
}

/// A semaphore of any implementation: a [`DistributedLock`] (one place per acquisition) that
/// also takes several places at once, tells how many are free, and has its count set, as
/// [`MongoDistributedSemaphore`](crate::MongoDistributedSemaphore).
pub trait DistributedSemaphore: DistributedLock {
    /// How many places this semaphore was built with.
    fn max_count(&self) -> u32;

    /// Waits until `places` places are acquired at once (one guard).
    ///
    /// # Errors
    /// As [`MongoDistributedSemaphore::acquire_many`](crate::MongoDistributedSemaphore::acquire_many).
    fn acquire_many(&self, places: u32) -> BoxFuture<'_, Result<BoxedGuard>>;

    /// Waits up to `timeout` for `places` places at once;
    /// [`Error::Timeout`](crate::Error::Timeout) if it runs out.
    ///
    /// # Errors
    /// As [`MongoDistributedSemaphore::acquire_many_timeout`](crate::MongoDistributedSemaphore::acquire_many_timeout).
    fn acquire_many_timeout(
        &self,
        places: u32,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<BoxedGuard>>;

    /// One attempt for `places` places at once: `Ok(None)` if fewer are free.
    ///
    /// # Errors
    /// As [`MongoDistributedSemaphore::try_acquire_many`](crate::MongoDistributedSemaphore::try_acquire_many).
    fn try_acquire_many(&self, places: u32) -> BoxFuture<'_, Result<Option<BoxedGuard>>>;

    /// Attempts for up to `timeout` for `places` places at once.
    ///
    /// # Errors
    /// As [`MongoDistributedSemaphore::try_acquire_many_timeout`](crate::MongoDistributedSemaphore::try_acquire_many_timeout).
    fn try_acquire_many_timeout(
        &self,
        places: u32,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Option<BoxedGuard>>>;

    /// How many places are free now.
    ///
    /// # Errors
    /// As [`MongoDistributedSemaphore::available`](crate::MongoDistributedSemaphore::available).
    fn available(&self) -> BoxFuture<'_, Result<u32>>;

    /// Sets the count for every caller of the name.
    ///
    /// # Errors
    /// As [`MongoDistributedSemaphore::set_max_count`](crate::MongoDistributedSemaphore::set_max_count).
    fn set_max_count(&self, max_count: u32) -> BoxFuture<'_, Result<()>>;
}

/// A named lock of any implementation: the four ways to acquire it, as on
/// [`MongoDistributedLock`](crate::MongoDistributedLock).
pub trait DistributedLock: Send + Sync + Debug {
    /// The lock's name.
    fn name(&self) -> &str;

    /// Waits until the lock is acquired.
    ///
    /// # Errors
    /// As [`MongoDistributedLock::acquire`](crate::MongoDistributedLock::acquire).
    fn acquire(&self) -> BoxFuture<'_, Result<BoxedGuard>>;

    /// Waits up to `timeout`; [`Error::Timeout`](crate::Error::Timeout) if it runs out.
    ///
    /// # Errors
    /// As [`MongoDistributedLock::acquire_timeout`](crate::MongoDistributedLock::acquire_timeout).
    fn acquire_timeout(&self, timeout: Duration) -> BoxFuture<'_, Result<BoxedGuard>>;

    /// One attempt: `Ok(None)` if the lock is held by someone else.
    ///
    /// # Errors
    /// As [`MongoDistributedLock::try_acquire`](crate::MongoDistributedLock::try_acquire).
    fn try_acquire(&self) -> BoxFuture<'_, Result<Option<BoxedGuard>>>;

    /// Attempts for up to `timeout`: `Ok(None)` if the lock stayed held by someone else.
    ///
    /// # Errors
    /// As [`MongoDistributedLock::try_acquire_timeout`](crate::MongoDistributedLock::try_acquire_timeout).
    fn try_acquire_timeout(&self, timeout: Duration) -> BoxFuture<'_, Result<Option<BoxedGuard>>>;

    /// The current holders, each with its lease and details; empty when the lock is free.
    ///
    /// # Errors
    /// As [`MongoDistributedLock::holders`](crate::MongoDistributedLock::holders).
    fn holders(&self) -> BoxFuture<'_, Result<Vec<LockStatus>>>;

    /// Watches who holds it, without holding it: read now, then every `every`, and at once
    /// when it changes where the implementation can tell (a change stream; the double's every
    /// acquisition and release); see [`LockWatch`].
    ///
    /// # Errors
    /// As [`MongoDistributedLock::watch`](crate::MongoDistributedLock::watch).
    fn watch(&self, every: Duration) -> BoxFuture<'_, Result<LockWatch>>;
}

/// A named reader-writer lock of any implementation: any number of readers at once, or one
/// writer; the four ways to acquire each side, as on
/// [`MongoDistributedReaderWriterLock`](crate::MongoDistributedReaderWriterLock), including
/// its writer preference (while a writer waits, new readers wait too).
pub trait DistributedReaderWriterLock: Send + Sync + Debug {
    /// The lock's name.
    fn name(&self) -> &str;

    /// Waits until a read lock is acquired.
    ///
    /// # Errors
    /// As [`MongoDistributedReaderWriterLock::acquire_read`](crate::MongoDistributedReaderWriterLock::acquire_read).
    fn acquire_read(&self) -> BoxFuture<'_, Result<BoxedReadGuard>>;

    /// Waits up to `timeout` for a read lock; [`Error::Timeout`](crate::Error::Timeout) if it
    /// runs out.
    ///
    /// # Errors
    /// As [`MongoDistributedReaderWriterLock::acquire_read_timeout`](crate::MongoDistributedReaderWriterLock::acquire_read_timeout).
    fn acquire_read_timeout(&self, timeout: Duration) -> BoxFuture<'_, Result<BoxedReadGuard>>;

    /// One attempt at a read lock: `Ok(None)` if a writer holds the lock or waits for it.
    ///
    /// # Errors
    /// As [`MongoDistributedReaderWriterLock::try_acquire_read`](crate::MongoDistributedReaderWriterLock::try_acquire_read).
    fn try_acquire_read(&self) -> BoxFuture<'_, Result<Option<BoxedReadGuard>>>;

    /// Attempts at a read lock for up to `timeout`: `Ok(None)` if it stayed unavailable.
    ///
    /// # Errors
    /// As [`MongoDistributedReaderWriterLock::try_acquire_read_timeout`](crate::MongoDistributedReaderWriterLock::try_acquire_read_timeout).
    fn try_acquire_read_timeout(
        &self,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Option<BoxedReadGuard>>>;

    /// Waits until the write lock is acquired; new readers wait meanwhile.
    ///
    /// # Errors
    /// As [`MongoDistributedReaderWriterLock::acquire_write`](crate::MongoDistributedReaderWriterLock::acquire_write).
    fn acquire_write(&self) -> BoxFuture<'_, Result<BoxedGuard>>;

    /// Waits up to `timeout` for the write lock; [`Error::Timeout`](crate::Error::Timeout) if
    /// it runs out.
    ///
    /// # Errors
    /// As [`MongoDistributedReaderWriterLock::acquire_write_timeout`](crate::MongoDistributedReaderWriterLock::acquire_write_timeout).
    fn acquire_write_timeout(&self, timeout: Duration) -> BoxFuture<'_, Result<BoxedGuard>>;

    /// One attempt at the write lock: `Ok(None)` if readers or a writer hold it.
    ///
    /// # Errors
    /// As [`MongoDistributedReaderWriterLock::try_acquire_write`](crate::MongoDistributedReaderWriterLock::try_acquire_write).
    fn try_acquire_write(&self) -> BoxFuture<'_, Result<Option<BoxedGuard>>>;

    /// Attempts at the write lock for up to `timeout`: `Ok(None)` if it stayed unavailable.
    ///
    /// # Errors
    /// As [`MongoDistributedReaderWriterLock::try_acquire_write_timeout`](crate::MongoDistributedReaderWriterLock::try_acquire_write_timeout).
    fn try_acquire_write_timeout(
        &self,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Option<BoxedGuard>>>;

    /// Waits until the upgradeable read lock is acquired.
    ///
    /// # Errors
    /// As [`MongoDistributedReaderWriterLock::acquire_upgradeable_read`](crate::MongoDistributedReaderWriterLock::acquire_upgradeable_read).
    fn acquire_upgradeable_read(&self) -> BoxFuture<'_, Result<BoxedUpgradeableReadGuard>>;

    /// Waits at most `timeout` for the upgradeable read lock.
    ///
    /// # Errors
    /// As [`MongoDistributedReaderWriterLock::acquire_upgradeable_read_timeout`](crate::MongoDistributedReaderWriterLock::acquire_upgradeable_read_timeout).
    fn acquire_upgradeable_read_timeout(
        &self,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<BoxedUpgradeableReadGuard>>;

    /// One attempt at the upgradeable read lock.
    ///
    /// # Errors
    /// As [`MongoDistributedReaderWriterLock::try_acquire_upgradeable_read`](crate::MongoDistributedReaderWriterLock::try_acquire_upgradeable_read).
    fn try_acquire_upgradeable_read(
        &self,
    ) -> BoxFuture<'_, Result<Option<BoxedUpgradeableReadGuard>>>;

    /// Attempts at the upgradeable read lock for up to `timeout`.
    ///
    /// # Errors
    /// As [`MongoDistributedReaderWriterLock::try_acquire_upgradeable_read_timeout`](crate::MongoDistributedReaderWriterLock::try_acquire_upgradeable_read_timeout).
    fn try_acquire_upgradeable_read_timeout(
        &self,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Option<BoxedUpgradeableReadGuard>>>;

    /// The current holders, each with its lease and details; empty when the lock is free.
    ///
    /// # Errors
    /// As [`MongoDistributedLock::holders`](crate::MongoDistributedLock::holders).
    fn holders(&self) -> BoxFuture<'_, Result<Vec<LockStatus>>>;

    /// Watches who holds it, without holding it: read now, then every `every`, and at once
    /// when it changes where the implementation can tell (a change stream; the double's every
    /// acquisition and release); see [`LockWatch`].
    ///
    /// # Errors
    /// As [`MongoDistributedLock::watch`](crate::MongoDistributedLock::watch).
    fn watch(&self, every: Duration) -> BoxFuture<'_, Result<LockWatch>>;
}

/// Locks on the documents of one collection, of any implementation, with the documents as BSON:
/// the methods of [`DocumentLock`](crate::DocumentLock) (whose docs say what each does) for
/// `DocumentLock<Document>`.
pub trait DistributedDocumentLock: Send + Sync + Debug {
    /// The collection's name.
    fn name(&self) -> &str;

    /// Waits until a document matching `filter` is locked.
    ///
    /// # Errors
    /// As [`DocumentLock::lock`](crate::DocumentLock::lock).
    fn lock(&self, filter: Document) -> BoxFuture<'_, Result<BoxedDocumentGuard>>;

    /// Waits up to `timeout`; [`Error::Timeout`](crate::Error::Timeout) if it runs out.
    ///
    /// # Errors
    /// As [`DocumentLock::lock_timeout`](crate::DocumentLock::lock_timeout).
    fn lock_timeout(
        &self,
        filter: Document,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<BoxedDocumentGuard>>;

    /// One attempt: `Ok(None)` if every matching document is locked.
    ///
    /// # Errors
    /// As [`DocumentLock::try_lock`](crate::DocumentLock::try_lock).
    fn try_lock(&self, filter: Document) -> BoxFuture<'_, Result<Option<BoxedDocumentGuard>>>;

    /// Attempts for up to `timeout`: `Ok(None)` if every matching document stayed locked.
    ///
    /// # Errors
    /// As [`DocumentLock::try_lock_timeout`](crate::DocumentLock::try_lock_timeout).
    fn try_lock_timeout(
        &self,
        filter: Document,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Option<BoxedDocumentGuard>>>;

    /// Locks the document with `_id` `id`, inserting `new_document` first if it is missing.
    ///
    /// # Errors
    /// As [`DocumentLock::lock_or_insert`](crate::DocumentLock::lock_or_insert).
    fn lock_or_insert(
        &self,
        id: Bson,
        new_document: Document,
    ) -> BoxFuture<'_, Result<BoxedDocumentGuard>>;
}

/// Proof that a document is locked, of any implementation; see
/// [`DocumentGuard`](crate::DocumentGuard), whose contract every implementation follows.
pub trait DistributedDocumentGuard: Send + Sync + Debug {
    /// The locked document, as it was when it was locked.
    fn document(&self) -> &Document;

    /// The document's `_id`.
    fn id(&self) -> &Bson;

    /// This acquisition's fencing token: larger than every earlier one of the same document.
    fn fencing_token(&self) -> FencingToken;

    /// A signal that turns true when the lock is known or presumed lost.
    fn lost(&self) -> LostSignal;

    /// Whether the lock is known or presumed lost.
    fn is_lost(&self) -> bool;

    /// Extends the lease to at least `by` from now; see
    /// [`LockGuard::extend`](crate::LockGuard::extend).
    ///
    /// # Errors
    /// As [`LockGuard::extend`](crate::LockGuard::extend).
    fn extend(&self, by: Duration) -> BoxFuture<'_, Result<()>>;

    /// Applies `update` (update operators) to the document and keeps it locked.
    ///
    /// # Errors
    /// As [`DocumentGuard::checkpoint`](crate::DocumentGuard::checkpoint).
    fn checkpoint(&self, update: Document) -> BoxFuture<'_, Result<()>>;

    /// Applies `update` and unlocks the document in one write.
    ///
    /// # Errors
    /// As [`DocumentGuard::commit`](crate::DocumentGuard::commit).
    fn commit(self: Box<Self>, update: Document) -> BoxFuture<'static, Result<()>>;

    /// Replaces the document with `new_document` and unlocks it in one write.
    ///
    /// # Errors
    /// As [`DocumentGuard::replace`](crate::DocumentGuard::replace).
    fn replace(self: Box<Self>, new_document: Document) -> BoxFuture<'static, Result<()>>;

    /// Unlocks the document without changing it.
    ///
    /// # Errors
    /// As [`DocumentGuard::release`](crate::DocumentGuard::release).
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<()>>;
}

/// Creates locks by name: what application code holds (as
/// `Arc<dyn DistributedLockProvider>` or a generic) instead of a concrete provider.
pub trait DistributedLockProvider: Send + Sync + Debug {
    /// The exclusive lock called `name`.
    fn create_lock(&self, name: &str) -> Box<dyn DistributedLock>;

    /// The semaphore called `name`, allowing `max_count` holders at once, each with a guard of
    /// its own; independent of the exclusive lock of the same name. As
    /// [`Provider::create_semaphore`](crate::Provider::create_semaphore): a `max_count` of 0,
    /// or one that differs from the count the name's first acquisition recorded, makes every
    /// acquisition [`Error::InvalidArgument`](crate::Error::InvalidArgument).
    fn create_semaphore(&self, name: &str, max_count: u32) -> Box<dyn DistributedSemaphore>;

    /// The reader-writer lock called `name`; independent of the exclusive lock and the
    /// semaphore of the same name.
    fn create_reader_writer_lock(&self, name: &str) -> Box<dyn DistributedReaderWriterLock>;

    /// Locks on the documents of the collection called `collection` (of the provider's
    /// database), held under the field `lock`, with the documents as BSON; see
    /// [`Provider::create_document_lock`](crate::Provider::create_document_lock).
    fn create_document_lock(&self, collection: &str) -> Box<dyn DistributedDocumentLock>;

    /// Starts campaigning for leadership of `name`, on the current Tokio runtime: see
    /// [`LeaderElection`](crate::LeaderElection). Its leadership is the lease of
    /// [`create_lock`](Self::create_lock)`(name)`.
    ///
    /// # Errors
    /// [`Error::NoRuntime`](crate::Error::NoRuntime) outside a Tokio runtime; as
    /// [`Provider::create_leader_election`](crate::Provider::create_leader_election) for the
    /// MongoDB provider.
    fn create_leader_election(&self, name: &str) -> Result<crate::LeaderElection> {
        crate::LeaderElection::over(self.create_lock(name))
    }

    /// A job called `name` that runs at most once per `window` across every instance, as
    /// [`Provider::create_job`](crate::Provider::create_job)'s does, stopped after
    /// `max_runtime` if given ([`Job::max_runtime`](crate::Job::max_runtime)).
    ///
    /// # Errors
    /// [`Error::InvalidOptions`](crate::Error::InvalidOptions) for a window or longest run out
    /// of range, or in the wrong order (as [`Job::lock`](crate::Job::lock)).
    fn create_job(
        &self,
        name: &str,
        window: Duration,
        max_runtime: Option<Duration>,
    ) -> Result<crate::DistributedJob>;

    /// Acquires `members` together, all or nothing, within `timeout`, as
    /// [`Provider::acquire_all`](crate::Provider::acquire_all) does: in one global order (for
    /// this default, by kind then by name: exclusive locks, reader-writer locks, semaphores),
    /// releasing what it holds on an error or when `timeout` runs out. The default acquires
    /// each member through this provider's `create_*` methods (the in-memory double's);
    /// [`Provider`](crate::Provider) uses its own.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an empty set or a lock
    /// given twice; [`Error::Timeout`](crate::Error::Timeout) naming the member still busy when
    /// `timeout` ran out; otherwise as the members' `acquire` methods.
    fn acquire_all<'a>(
        &'a self,
        members: &'a [CompositeMember<'a>],
        timeout: Duration,
    ) -> BoxFuture<'a, Result<BoxedCompositeGuard>> {
        Box::pin(async move {
            let started = tokio::time::Instant::now();
            match crate::composite::acquire_behind_traits(self, members, timeout).await? {
                Ok(acquired) => Ok(acquired),
                Err(busy) => {
                    Err(crate::composite::busy_behind_traits(self, busy, timeout, started).await)
                }
            }
        })
    }

    /// Acquires `members` together if every one of them is free now: `Ok(None)`, with nothing
    /// held, as soon as one is busy (see [`acquire_all`](Self::acquire_all)).
    ///
    /// # Errors
    /// As [`acquire_all`](Self::acquire_all), without timeouts.
    fn try_acquire_all<'a>(
        &'a self,
        members: &'a [CompositeMember<'a>],
    ) -> BoxFuture<'a, Result<Option<BoxedCompositeGuard>>> {
        Box::pin(async move {
            let acquired = crate::composite::acquire_behind_traits(self, members, Duration::ZERO);
            Ok(acquired.await?.ok())
        })
    }
}

impl dyn DistributedLockGuard {
    /// Runs `work` until it completes or the lock is lost, whichever comes first, as
    /// [`LockGuard::run_while_held`](crate::LockGuard::run_while_held) does: its output, the
    /// guard still held, or [`Error::LockLost`](crate::Error::LockLost) (`work` is dropped).
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) if the lock was lost before `work` completed.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping this future drops `work`; the guard stays held.
    pub async fn run_while_held<F: Future>(&self, work: F) -> Result<F::Output> {
        self.lost()
            .unless_lost(work)
            .await
            .ok_or_else(|| crate::Error::LockLost {
                name: self.name().to_owned(),
            })
    }
}

impl dyn DistributedReadGuard {
    /// Runs `work` until it completes or the read lock is lost: see
    /// [`DistributedLockGuard::run_while_held`](trait.DistributedLockGuard.html#method.run_while_held).
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) if the lock was lost before `work` completed.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping this future drops `work`; the guard stays held.
    pub async fn run_while_held<F: Future>(&self, work: F) -> Result<F::Output> {
        self.lost()
            .unless_lost(work)
            .await
            .ok_or_else(|| crate::Error::LockLost {
                name: self.name().to_owned(),
            })
    }
}

impl dyn DistributedLock {
    /// Acquires the lock (waiting as [`acquire`](DistributedLock::acquire) does), runs `work`
    /// while it is held and releases it, as
    /// [`MongoDistributedLock::acquire_and_run`](crate::MongoDistributedLock::acquire_and_run)
    /// does.
    ///
    /// # Errors
    /// As [`acquire`](DistributedLock::acquire); [`Error::LockLost`](crate::Error::LockLost) if
    /// the lock was lost before `work` completed. A release that fails after `work` completed is
    /// logged, not returned.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping this future drops `work` and the guard, which releases the lock.
    pub async fn acquire_and_run<T>(
        &self,
        work: impl AsyncFnOnce(&dyn DistributedLockGuard) -> T,
    ) -> Result<T> {
        let guard = self.acquire().await?;
        let output = guard.run_while_held(work(guard.as_ref())).await;
        crate::lease::held::after_release(self.name(), output, guard.release().await)
    }
}

impl dyn DistributedReaderWriterLock {
    /// Acquires a read lock, runs `work` while it is held and releases it, as
    /// [`MongoDistributedReaderWriterLock::acquire_read_and_run`](crate::MongoDistributedReaderWriterLock::acquire_read_and_run)
    /// does.
    ///
    /// # Errors
    /// As [`acquire_and_run`](trait.DistributedLock.html#method.acquire_and_run).
    ///
    /// # Cancel safety
    /// As [`acquire_and_run`](trait.DistributedLock.html#method.acquire_and_run).
    pub async fn acquire_read_and_run<T>(
        &self,
        work: impl AsyncFnOnce(&dyn DistributedReadGuard) -> T,
    ) -> Result<T> {
        let guard = self.acquire_read().await?;
        let output = guard.run_while_held(work(guard.as_ref())).await;
        crate::lease::held::after_release(self.name(), output, guard.release().await)
    }

    /// Acquires the write lock, runs `work` while it is held and releases it, as
    /// [`MongoDistributedReaderWriterLock::acquire_write_and_run`](crate::MongoDistributedReaderWriterLock::acquire_write_and_run)
    /// does.
    ///
    /// # Errors
    /// As [`acquire_and_run`](trait.DistributedLock.html#method.acquire_and_run).
    ///
    /// # Cancel safety
    /// As [`acquire_and_run`](trait.DistributedLock.html#method.acquire_and_run).
    pub async fn acquire_write_and_run<T>(
        &self,
        work: impl AsyncFnOnce(&dyn DistributedLockGuard) -> T,
    ) -> Result<T> {
        let guard = self.acquire_write().await?;
        let output = guard.run_while_held(work(guard.as_ref())).await;
        crate::lease::held::after_release(self.name(), output, guard.release().await)
    }
}

/// Boxes a concrete guard.
pub(crate) fn boxed<G: DistributedLockGuard + 'static>(guard: G) -> BoxedGuard {
    Box::new(guard)
}

/// The four acquisition methods of a trait, each forwarding to the inherent method of the same
/// name on `$lock` and boxing its guard with `$boxed` into `$guard`.
macro_rules! forward_acquisitions {
    ($lock:ty, $guard:ty, $boxed:path:
     $acquire:ident, $acquire_timeout:ident, $try_acquire:ident, $try_acquire_timeout:ident) => {
        fn $acquire(&self) -> futures::future::BoxFuture<'_, $crate::error::Result<$guard>> {
            Box::pin(async move { <$lock>::$acquire(self).await.map($boxed) })
        }

        fn $acquire_timeout(
            &self,
            timeout: std::time::Duration,
        ) -> futures::future::BoxFuture<'_, $crate::error::Result<$guard>> {
            Box::pin(async move { <$lock>::$acquire_timeout(self, timeout).await.map($boxed) })
        }

        fn $try_acquire(
            &self,
        ) -> futures::future::BoxFuture<'_, $crate::error::Result<Option<$guard>>> {
            Box::pin(async move { Ok(<$lock>::$try_acquire(self).await?.map($boxed)) })
        }

        fn $try_acquire_timeout(
            &self,
            timeout: std::time::Duration,
        ) -> futures::future::BoxFuture<'_, $crate::error::Result<Option<$guard>>> {
            Box::pin(async move {
                Ok(<$lock>::$try_acquire_timeout(self, timeout)
                    .await?
                    .map($boxed))
            })
        }
    };
}
pub(crate) use forward_acquisitions;

/// Boxes a concrete upgradeable read guard.
pub(crate) fn boxed_upgradeable<G: DistributedUpgradeableReadGuard + 'static>(
    guard: G,
) -> BoxedUpgradeableReadGuard {
    Box::new(guard)
}

/// Boxes a concrete read guard.
pub(crate) fn boxed_read<G: DistributedReadGuard + 'static>(guard: G) -> BoxedReadGuard {
    Box::new(guard)
}

/// Implements [`DistributedLock`] for a type whose inherent `acquire*` methods return
/// `Result<$guard>` / `Result<Option<$guard>>` and whose `name()` returns `&str`.
macro_rules! impl_distributed_lock {
    ($lock:ty) => {
        impl $crate::traits::DistributedLock for $lock {
            fn name(&self) -> &str {
                <$lock>::name(self)
            }

            $crate::traits::forward_acquisitions!($lock, $crate::traits::BoxedGuard, $crate::traits::boxed:
                acquire, acquire_timeout, try_acquire, try_acquire_timeout);

            $crate::traits::forward_watching!($lock);
        }
    };
}
pub(crate) use impl_distributed_lock;

/// `holders` and `watch`, forwarded to the inherent methods of `$lock`.
macro_rules! forward_watching {
    ($lock:ty) => {
        fn holders(
            &self,
        ) -> futures::future::BoxFuture<'_, $crate::error::Result<Vec<$crate::LockStatus>>> {
            Box::pin(<$lock>::holders(self))
        }

        fn watch(
            &self,
            every: std::time::Duration,
        ) -> futures::future::BoxFuture<'_, $crate::error::Result<$crate::LockWatch>> {
            Box::pin(<$lock>::watch(self, every))
        }
    };
}
pub(crate) use forward_watching;

/// Implements [`DistributedSemaphore`] for a semaphore with the inherent `*_many`, `available`,
/// `set_max_count` and `max_count` methods (its [`DistributedLock`] by
/// [`impl_distributed_lock`]).
macro_rules! impl_distributed_semaphore {
    ($semaphore:ty) => {
        impl $crate::traits::DistributedSemaphore for $semaphore {
            fn max_count(&self) -> u32 {
                <$semaphore>::max_count(self)
            }

            fn acquire_many(
                &self,
                places: u32,
            ) -> futures::future::BoxFuture<'_, $crate::error::Result<$crate::traits::BoxedGuard>>
            {
                Box::pin(async move {
                    <$semaphore>::acquire_many(self, places)
                        .await
                        .map($crate::traits::boxed)
                })
            }

            fn acquire_many_timeout(
                &self,
                places: u32,
                timeout: std::time::Duration,
            ) -> futures::future::BoxFuture<'_, $crate::error::Result<$crate::traits::BoxedGuard>>
            {
                Box::pin(async move {
                    <$semaphore>::acquire_many_timeout(self, places, timeout)
                        .await
                        .map($crate::traits::boxed)
                })
            }

            fn try_acquire_many(
                &self,
                places: u32,
            ) -> futures::future::BoxFuture<
                '_,
                $crate::error::Result<Option<$crate::traits::BoxedGuard>>,
            > {
                Box::pin(async move {
                    <$semaphore>::try_acquire_many(self, places)
                        .await
                        .map(|guard| guard.map($crate::traits::boxed))
                })
            }

            fn try_acquire_many_timeout(
                &self,
                places: u32,
                timeout: std::time::Duration,
            ) -> futures::future::BoxFuture<
                '_,
                $crate::error::Result<Option<$crate::traits::BoxedGuard>>,
            > {
                Box::pin(async move {
                    <$semaphore>::try_acquire_many_timeout(self, places, timeout)
                        .await
                        .map(|guard| guard.map($crate::traits::boxed))
                })
            }

            fn available(&self) -> futures::future::BoxFuture<'_, $crate::error::Result<u32>> {
                Box::pin(<$semaphore>::available(self))
            }

            fn set_max_count(
                &self,
                max_count: u32,
            ) -> futures::future::BoxFuture<'_, $crate::error::Result<()>> {
                Box::pin(<$semaphore>::set_max_count(self, max_count))
            }
        }
    };
}
pub(crate) use impl_distributed_semaphore;

/// Implements [`DistributedReaderWriterLock`] for a type with the inherent `acquire_read*` and
/// `acquire_write*` methods and `name()`.
macro_rules! impl_distributed_reader_writer_lock {
    ($lock:ty) => {
        impl $crate::traits::DistributedReaderWriterLock for $lock {
            fn name(&self) -> &str {
                <$lock>::name(self)
            }

            $crate::traits::forward_acquisitions!($lock, $crate::traits::BoxedReadGuard, $crate::traits::boxed_read:
                acquire_read, acquire_read_timeout, try_acquire_read, try_acquire_read_timeout);

            $crate::traits::forward_acquisitions!($lock, $crate::traits::BoxedGuard, $crate::traits::boxed:
                acquire_write, acquire_write_timeout, try_acquire_write, try_acquire_write_timeout);

            $crate::traits::forward_acquisitions!($lock, $crate::traits::BoxedUpgradeableReadGuard,
                $crate::traits::boxed_upgradeable:
                acquire_upgradeable_read, acquire_upgradeable_read_timeout,
                try_acquire_upgradeable_read, try_acquire_upgradeable_read_timeout);

            $crate::traits::forward_watching!($lock);
        }
    };
}
pub(crate) use impl_distributed_reader_writer_lock;

/// The methods a guard trait shares: `name` (unless the guard has none), `lost`, `is_lost`, and
/// `release`, forwarded to the inherent methods of `$guard`.
macro_rules! forward_guard {
    ($guard:ty) => {
        fn lost(&self) -> $crate::LostSignal {
            <$guard>::lost(self)
        }

        fn is_lost(&self) -> bool {
            <$guard>::is_lost(self)
        }

        fn extend(
            &self,
            by: std::time::Duration,
        ) -> futures::future::BoxFuture<'_, $crate::error::Result<()>> {
            Box::pin(<$guard>::extend(self, by))
        }

        fn release(
            self: Box<Self>,
        ) -> futures::future::BoxFuture<'static, $crate::error::Result<()>> {
            Box::pin(<$guard>::release(*self))
        }
    };
}
pub(crate) use forward_guard;

/// Implements [`DistributedLockGuard`] for a guard with the inherent methods of the same names.
macro_rules! impl_distributed_lock_guard {
    ($guard:ty) => {
        impl $crate::traits::DistributedLockGuard for $guard {
            fn name(&self) -> &str {
                <$guard>::name(self)
            }

            fn fencing_token(&self) -> $crate::token::FencingToken {
                <$guard>::fencing_token(self)
            }

            fn revocation_requested(
                &self,
            ) -> futures::future::BoxFuture<'_, $crate::error::Result<$crate::Revocation>> {
                Box::pin(<$guard>::revocation_requested(self))
            }

            fn spawn(
                &self,
                task: futures::future::BoxFuture<'static, ()>,
            ) -> $crate::error::Result<tokio::task::JoinHandle<()>> {
                <$guard>::spawn(self, task)
            }

            fn cancellation(&self) -> $crate::CancellationToken {
                <$guard>::cancellation(self)
            }

            fn progress(&self) -> bool {
                <$guard>::progress(self)
            }

            fn abort_tasks(&self) {
                <$guard>::abort_tasks(self)
            }

            $crate::traits::forward_guard!($guard);
        }
    };
}
pub(crate) use impl_distributed_lock_guard;

/// Implements [`DistributedReadGuard`] for a guard with the inherent methods of the same names.
macro_rules! impl_distributed_read_guard {
    ($guard:ty) => {
        impl $crate::traits::DistributedReadGuard for $guard {
            fn name(&self) -> &str {
                <$guard>::name(self)
            }

            $crate::traits::forward_guard!($guard);
        }
    };
}
pub(crate) use impl_distributed_read_guard;

/// Implements [`DistributedUpgradeableReadGuard`] for a guard with the inherent methods of the
/// same names.
macro_rules! impl_distributed_upgradeable_read_guard {
    ($guard:ty) => {
        impl $crate::traits::DistributedUpgradeableReadGuard for $guard {
            fn name(&self) -> &str {
                <$guard>::name(self)
            }

            fn is_upgraded(&self) -> bool {
                <$guard>::is_upgraded(self)
            }

            fn fencing_token(&self) -> Option<$crate::token::FencingToken> {
                <$guard>::fencing_token(self)
            }

            fn upgrade(&mut self) -> futures::future::BoxFuture<'_, $crate::error::Result<()>> {
                Box::pin(<$guard>::upgrade(self))
            }

            fn try_upgrade(
                &mut self,
            ) -> futures::future::BoxFuture<'_, $crate::error::Result<bool>> {
                Box::pin(<$guard>::try_upgrade(self))
            }

            fn try_upgrade_timeout(
                &mut self,
                timeout: std::time::Duration,
            ) -> futures::future::BoxFuture<'_, $crate::error::Result<bool>> {
                Box::pin(<$guard>::try_upgrade_timeout(self, timeout))
            }

            fn downgrade(&mut self) -> futures::future::BoxFuture<'_, $crate::error::Result<()>> {
                Box::pin(<$guard>::downgrade(self))
            }

            $crate::traits::forward_guard!($guard);
        }
    };
}
pub(crate) use impl_distributed_upgradeable_read_guard;

/// Implements [`DistributedDocumentGuard`] for a guard of BSON documents with the inherent
/// methods of the same names.
macro_rules! impl_distributed_document_guard {
    ($guard:ty) => {
        impl $crate::traits::DistributedDocumentGuard for $guard {
            fn document(&self) -> &mongodb::bson::Document {
                <$guard>::document(self)
            }

            fn id(&self) -> &mongodb::bson::Bson {
                <$guard>::id(self)
            }

            fn fencing_token(&self) -> $crate::token::FencingToken {
                <$guard>::fencing_token(self)
            }

            fn checkpoint(
                &self,
                update: mongodb::bson::Document,
            ) -> futures::future::BoxFuture<'_, $crate::error::Result<()>> {
                Box::pin(<$guard>::checkpoint(self, update))
            }

            fn commit(
                self: Box<Self>,
                update: mongodb::bson::Document,
            ) -> futures::future::BoxFuture<'static, $crate::error::Result<()>> {
                Box::pin(<$guard>::commit(*self, update))
            }

            fn replace(
                self: Box<Self>,
                new_document: mongodb::bson::Document,
            ) -> futures::future::BoxFuture<'static, $crate::error::Result<()>> {
                Box::pin(<$guard>::replace(*self, new_document))
            }

            $crate::traits::forward_guard!($guard);
        }
    };
}
pub(crate) use impl_distributed_document_guard;

/// Boxes a concrete document guard.
pub(crate) fn boxed_document<G: DistributedDocumentGuard + 'static>(
    guard: G,
) -> BoxedDocumentGuard {
    Box::new(guard)
}

/// Implements [`DistributedDocumentLock`] for a lock of BSON documents with the inherent
/// methods of the same names.
macro_rules! impl_distributed_document_lock {
    ($lock:ty) => {
        impl $crate::traits::DistributedDocumentLock for $lock {
            fn name(&self) -> &str {
                <$lock>::name(self)
            }

            fn lock(
                &self,
                filter: mongodb::bson::Document,
            ) -> futures::future::BoxFuture<
                '_,
                $crate::error::Result<$crate::traits::BoxedDocumentGuard>,
            > {
                Box::pin(async move {
                    let guard = <$lock>::lock(self, filter).await?;
                    Ok($crate::traits::boxed_document(guard))
                })
            }

            fn lock_timeout(
                &self,
                filter: mongodb::bson::Document,
                timeout: std::time::Duration,
            ) -> futures::future::BoxFuture<
                '_,
                $crate::error::Result<$crate::traits::BoxedDocumentGuard>,
            > {
                Box::pin(async move {
                    let guard = <$lock>::lock_timeout(self, filter, timeout).await?;
                    Ok($crate::traits::boxed_document(guard))
                })
            }

            fn try_lock(
                &self,
                filter: mongodb::bson::Document,
            ) -> futures::future::BoxFuture<
                '_,
                $crate::error::Result<Option<$crate::traits::BoxedDocumentGuard>>,
            > {
                Box::pin(async move {
                    let guard = <$lock>::try_lock(self, filter).await?;
                    Ok(guard.map($crate::traits::boxed_document))
                })
            }

            fn try_lock_timeout(
                &self,
                filter: mongodb::bson::Document,
                timeout: std::time::Duration,
            ) -> futures::future::BoxFuture<
                '_,
                $crate::error::Result<Option<$crate::traits::BoxedDocumentGuard>>,
            > {
                Box::pin(async move {
                    let guard = <$lock>::try_lock_timeout(self, filter, timeout).await?;
                    Ok(guard.map($crate::traits::boxed_document))
                })
            }

            fn lock_or_insert(
                &self,
                id: mongodb::bson::Bson,
                new_document: mongodb::bson::Document,
            ) -> futures::future::BoxFuture<
                '_,
                $crate::error::Result<$crate::traits::BoxedDocumentGuard>,
            > {
                Box::pin(async move {
                    let guard = <$lock>::lock_or_insert(self, id, new_document).await?;
                    Ok($crate::traits::boxed_document(guard))
                })
            }
        }
    };
}
pub(crate) use impl_distributed_document_lock;
