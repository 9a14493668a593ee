//! Hands out named locks that share a collection and options.

use std::sync::Arc;
use std::time::Duration;

use mongodb::bson::Document;
use mongodb::{Collection, Database};

use crate::composite::{self, CompositeGuard};
use crate::lock::{DEFAULT_COLLECTION, validate_collection_name};
use crate::renewal::RenewalHub;
use crate::semaphore::DEFAULT_SEMAPHORE_COLLECTION;
use crate::status::{self, LockStatus};
use crate::{LockOptions, MongoDistributedLock, MongoDistributedSemaphore, Result};

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
}

impl Provider {
    /// Locks in `database`'s `distributed_locks` collection, with default options.
    pub fn new(database: &Database) -> Self {
        Provider {
            database: database.clone(),
            collection: DEFAULT_COLLECTION.to_owned(),
            options: LockOptions::default(),
            renewals: Arc::default(),
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

    /// The status of lock `name` (holder, lease, fencing token) at one server instant, or `None`
    /// if the lock has no document.
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

    /// Every lock of this provider's collection that is held right now, ordered by name.
    ///
    /// # Errors
    /// As [`status`](Self::status).
    ///
    /// # Cancel safety
    /// Cancel safe: a read only.
    pub async fn held_locks(&self) -> Result<Vec<LockStatus>> {
        status::held(&self.collection()?).await
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
        let lock = MongoDistributedLock::new(name, &self.database)
            .with_collection(DEFAULT_SEMAPHORE_COLLECTION)
            .with_options(self.options.clone())
            .with_renewals(&self.renewals);
        MongoDistributedSemaphore::from_lock(lock, max_count)
    }

    /// A lock called `name` with this provider's collection and options.
    pub fn create_lock(&self, name: impl Into<String>) -> MongoDistributedLock {
        MongoDistributedLock::new(name, &self.database)
            .with_collection(self.collection.as_str())
            .with_options(self.options.clone())
            .with_renewals(&self.renewals)
    }
}
