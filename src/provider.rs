//! Hands out named locks that share a collection and options.

use std::sync::Arc;
use std::time::Duration;

use mongodb::bson::Document;
use mongodb::{Collection, Database};

use crate::composite::{self, CompositeGuard};
use crate::lock::{DEFAULT_COLLECTION, validate_collection_name};
use crate::renewal::RenewalHub;
use crate::rw_lock::DEFAULT_RW_COLLECTION;
use crate::semaphore::DEFAULT_SEMAPHORE_COLLECTION;
use crate::status::{self, LockStatus};
use crate::{
    LockDetails, LockOptions, MongoDistributedLock, MongoDistributedReaderWriterLock,
    MongoDistributedSemaphore, Result,
};

/// A factory of locks for dependency-injection style applications: configure the database,
/// collection and options once, then create locks by name wherever they are needed.
///
/// Clone + Send + Sync. The guards of all locks created by one provider (and its clones) share a
/// renewal loop per Tokio runtime: holding a thousand locks costs one renewal command per
/// cadence, not a thousand. The TTL index on the collection is created once per process, after
/// the first successful acquisition (shared with locks created directly).
///
/// ```no_run
/// # async fn demo(database: mongodb::Database) -> distributed_lock_mongodb::Result<()> {
/// use distributed_lock_mongodb::Provider;
///
/// let provider = Provider::new(&database).with_collection("job_locks");
/// let guard = provider.create_lock("order-42").acquire().await?;
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Provider {
    database: Database,
    collection: String,
    options: LockOptions,
    renewals: Arc<RenewalHub>,
    details: LockDetails,
    exclusive_details: bool,
}

impl Provider {
    /// Locks in `database`'s `distributed_locks` collection, with default options.
    pub fn new(database: &Database) -> Self {
        Provider {
            database: database.clone(),
            collection: DEFAULT_COLLECTION.to_owned(),
            options: LockOptions::default(),
            renewals: Arc::default(),
            details: LockDetails::new(),
            exclusive_details: false,
        }
    }

    /// Uses `collection` instead of `distributed_locks`.
    pub fn with_collection(mut self, collection: impl Into<String>) -> Self {
        self.collection = collection.into();
        self
    }

    /// Uses `options` for every lock created from now on.
    pub fn with_options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }

    /// The [`LockDetails`] that reader-writer locks and semaphores created from now on store
    /// with their holders (and exclusive locks, if
    /// [`store_details_in_exclusive_locks`](Self::store_details_in_exclusive_locks) is on).
    /// By default: this process's host and id, no owner.
    pub fn with_details(mut self, details: LockDetails) -> Self {
        self.details = details;
        self
    }

    /// Whether exclusive locks created from now on (and so the members of
    /// [`acquire_all`](Self::acquire_all)'s composite locks) store the details too. Off by
    /// default.
    ///
    /// **Turning it on breaks interoperability with DistributedLock.MongoDB (.NET)** for this
    /// provider's collection: see [`MongoDistributedLock::with_details`].
    pub fn store_details_in_exclusive_locks(mut self, enabled: bool) -> Self {
        self.exclusive_details = enabled;
        self
    }

    /// The status of exclusive lock `name` (holder, lease, fencing token, and details if it
    /// stores them) at one server instant, or `None` if the lock has no document. For
    /// reader-writer locks and semaphores, see their `holders()`.
    ///
    /// # Errors
    /// [`Error::Mongo`](crate::Error::Mongo) if the read fails;
    /// [`Error::InvalidCollectionName`](crate::Error::InvalidCollectionName).
    ///
    /// # Cancel safety
    /// Cancel safe: a read only.
    pub async fn status(&self, name: &str) -> Result<Option<LockStatus>> {
        status::status(&self.collection()?, name).await
    }

    /// Every lock of this provider that is held right now, ordered by name and kind, one entry
    /// per holder: the exclusive locks of its collection, the readers and writers of the
    /// reader-writer locks in `distributed_rw_locks`, and the holders of the semaphores in
    /// `distributed_semaphores` (with whatever details they stored).
    ///
    /// # Errors
    /// As [`status`](Self::status).
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn held_locks(&self) -> Result<Vec<LockStatus>> {
        let mut held = status::held(&self.collection()?).await?;
        let rw_locks = self.database.collection(DEFAULT_RW_COLLECTION);
        held.extend(status::reader_writer_holders(&rw_locks, Document::new()).await?);
        let semaphores = self.database.collection(DEFAULT_SEMAPHORE_COLLECTION);
        held.extend(status::semaphore_holders(&semaphores, Document::new()).await?);
        held.sort_by(|a, b| (&a.name, a.kind).cmp(&(&b.name, b.kind)));
        Ok(held)
    }

    /// **Dangerous**: ends the lease of lock `name` now, whoever holds it, so a stuck lock (for
    /// example one held by a process that hangs but keeps renewing) can be taken by others. The
    /// holder is not asked: its next renewal finds the lease gone and signals `lost`, but until
    /// then it may still believe it holds the lock, so two holders can overlap for up to one
    /// extension cadence. Protect resources with fencing tokens before relying on this. The
    /// document is kept (never deleted), so fencing tokens keep increasing. Returns whether a
    /// holder was removed.
    ///
    /// # Errors
    /// As [`status`](Self::status).
    ///
    /// # Cancel safety
    /// Dropping the future may or may not leave the lease ended.
    pub async fn force_release(&self, name: &str) -> Result<bool> {
        status::force_release(&self.collection()?, name).await
    }

    /// Deletes the lock documents whose lease ended strictly before now (server time) and
    /// returns how many; never touches a held lock. For deployments where the TTL monitor is
    /// disabled or lags. One `delete_many`.
    ///
    /// # Errors
    /// As [`status`](Self::status).
    ///
    /// # Cancel safety
    /// Dropping the future may or may not leave documents deleted.
    pub async fn purge_expired(&self) -> Result<u64> {
        status::purge_expired(&self.collection()?).await
    }

    /// Acquires the exclusive locks `names` together and returns one guard for all of them.
    ///
    /// The locks are acquired in sorted name order, so callers with overlapping sets cannot
    /// deadlock; it is all or nothing: on an error or when `timeout` runs out, the locks
    /// acquired so far are released at once. The guard's `lost` fires if any member is lost.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an empty set or a name
    /// given twice; [`Error::Timeout`](crate::Error::Timeout) when `timeout` runs out; otherwise
    /// as [`MongoDistributedLock::acquire`].
    ///
    /// # Cancel safety
    /// Cancel safe: members acquired before the future was dropped are released at once.
    pub async fn acquire_all(&self, names: &[&str], timeout: Duration) -> Result<CompositeGuard> {
        composite::acquire_all(self, names, timeout).await
    }

    fn collection(&self) -> Result<Collection<Document>> {
        validate_collection_name(&self.collection)?;
        Ok(self.database.collection(&self.collection))
    }

    /// A semaphore called `name` allowing `max_count` holders, with this provider's options, in
    /// the `distributed_semaphores` collection. Its holders share the provider's renewal loops.
    pub fn create_semaphore(
        &self,
        name: impl Into<String>,
        max_count: u32,
    ) -> MongoDistributedSemaphore {
        let lock = self
            .lock_in(name, DEFAULT_SEMAPHORE_COLLECTION)
            .with_details(self.details.clone());
        MongoDistributedSemaphore::from_lock(lock, max_count)
    }

    /// A reader-writer lock called `name`, with this provider's options and details, in the
    /// `distributed_rw_locks` collection. Its holders share the provider's renewal loops.
    pub fn create_reader_writer_lock(
        &self,
        name: impl Into<String>,
    ) -> MongoDistributedReaderWriterLock {
        let lock = self
            .lock_in(name, DEFAULT_RW_COLLECTION)
            .with_details(self.details.clone());
        MongoDistributedReaderWriterLock::from_lock(lock)
    }

    /// A lock called `name` in `collection`, with this provider's options and renewal loops.
    fn lock_in(&self, name: impl Into<String>, collection: &str) -> MongoDistributedLock {
        MongoDistributedLock::new(name, &self.database)
            .with_collection(collection)
            .with_options(self.options.clone())
            .with_renewals(&self.renewals)
    }

    /// A lock called `name` with this provider's collection and options (and details, if
    /// [`store_details_in_exclusive_locks`](Self::store_details_in_exclusive_locks) is on).
    pub fn create_lock(&self, name: impl Into<String>) -> MongoDistributedLock {
        let details = self.exclusive_details.then(|| self.details.to_document());
        self.lock_in(name, &self.collection)
            .with_stored_details(details)
    }
}
