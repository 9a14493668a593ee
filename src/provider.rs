//! Hands out named locks that share a collection and options.

use std::sync::Arc;

use mongodb::Database;

use crate::lock::DEFAULT_COLLECTION;
use crate::renewal::RenewalHub;
use crate::{LockOptions, MongoDistributedLock};

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

    /// A lock called `name` with this provider's collection and options.
    pub fn create_lock(&self, name: impl Into<String>) -> MongoDistributedLock {
        MongoDistributedLock::new(name, &self.database)
            .with_collection(self.collection.as_str())
            .with_options(self.options.clone())
            .with_renewals(&self.renewals)
    }
}
