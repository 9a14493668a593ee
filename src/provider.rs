//! Hands out named locks that share a collection and options.

use std::sync::Arc;
use std::time::Duration;

use mongodb::bson::Document;
use mongodb::{Collection, Database};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::error::{Operation, shown_name};
use crate::lease::renewal::RenewalHub;
use crate::lease::{Problem, admin, held};
use crate::{
    CompositeGuard, DEFAULT_LOCK_COLLECTION, DEFAULT_RW_COLLECTION, DEFAULT_SEMAPHORE_COLLECTION,
    DocumentLock, Error, LeaderElection, LockDetails, LockOptions, LockStatus,
    MongoDistributedLock, MongoDistributedReaderWriterLock, MongoDistributedSemaphore, Result,
};

/// A factory of locks for dependency-injection style applications: configure the database,
/// collection and options once, then create locks by name wherever they are needed.
///
/// Clone + Send + Sync. The guards of all locks created by one provider (and its clones), of
/// every kind, share a renewal loop per Tokio runtime and collection: holding a thousand locks
/// costs one renewal command per cadence, not a thousand. The TTL index on the exclusive lock
/// collection is created once per process, after the first successful acquisition (shared with
/// locks created directly).
///
/// Each kind has its own collection setting ([`with_collection`](Self::with_collection),
/// [`with_reader_writer_collection`](Self::with_reader_writer_collection),
/// [`with_semaphore_collection`](Self::with_semaphore_collection)); the administration calls
/// read the same collections.
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
    collection: CollectionName,
    reader_writer_collection: CollectionName,
    semaphore_collection: CollectionName,
    options: LockOptions,
    renewals: Arc<RenewalHub>,
    details: LockDetails,
    exclusive_details: bool,
}

impl Provider {
    /// Locks in `database`'s default collections, with default options.
    pub fn new(database: &Database) -> Self {
        Provider {
            database: database.clone(),
            collection: CollectionName::new(DEFAULT_LOCK_COLLECTION.to_owned()),
            reader_writer_collection: CollectionName::new(DEFAULT_RW_COLLECTION.to_owned()),
            semaphore_collection: CollectionName::new(DEFAULT_SEMAPHORE_COLLECTION.to_owned()),
            options: LockOptions::default(),
            renewals: Arc::default(),
            details: LockDetails::new(),
            exclusive_details: false,
        }
    }

    /// Keeps exclusive locks (and composites' members) in `collection`. Defaults to
    /// `distributed_locks`. An invalid name is reported by the first call that talks to the
    /// server.
    #[must_use]
    pub fn with_collection(mut self, collection: impl Into<String>) -> Self {
        self.collection = CollectionName::new(collection.into());
        self
    }

    /// Keeps reader-writer locks in `collection`. Defaults to `distributed_rw_locks`. An invalid
    /// name is reported as for [`with_collection`](Self::with_collection).
    #[must_use]
    pub fn with_reader_writer_collection(mut self, collection: impl Into<String>) -> Self {
        self.reader_writer_collection = CollectionName::new(collection.into());
        self
    }

    /// Keeps semaphores in `collection`. Defaults to `distributed_semaphores`. An invalid name is
    /// reported as for [`with_collection`](Self::with_collection).
    #[must_use]
    pub fn with_semaphore_collection(mut self, collection: impl Into<String>) -> Self {
        self.semaphore_collection = CollectionName::new(collection.into());
        self
    }

    /// Uses `options` for every lock created from now on. Defaults to
    /// [`LockOptions::default`].
    #[must_use]
    pub fn with_options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }

    /// The [`LockDetails`] that reader-writer locks and semaphores created from now on store
    /// with their holders (and exclusive locks, with
    /// [`with_details_in_exclusive_locks`](Self::with_details_in_exclusive_locks)). Defaults to
    /// this process's host and id, no owner.
    #[must_use]
    pub fn with_details(mut self, details: LockDetails) -> Self {
        self.details = details;
        self
    }

    /// Whether exclusive locks created from now on (and so the members of
    /// [`acquire_all`](Self::acquire_all)'s composite locks) store the details too. Defaults to
    /// false.
    ///
    /// **Turning it on breaks interoperability with DistributedLock.MongoDB (.NET)** for this
    /// provider's collection: see [`MongoDistributedLock::with_details`].
    #[must_use]
    pub fn with_details_in_exclusive_locks(mut self, enabled: bool) -> Self {
        self.exclusive_details = enabled;
        self
    }

    /// The provider's options.
    pub fn options(&self) -> &LockOptions {
        &self.options
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
        admin::status(&self.collection.open(&self.database)?, name).await
    }

    /// Every lock of this provider that is held right now, ordered by name and kind, one entry
    /// per holder: the exclusive locks, the readers and writers of the reader-writer locks, and
    /// the holders of the semaphores, each in the provider's collection for its kind (with
    /// whatever details they stored).
    ///
    /// # Errors
    /// As [`status`](Self::status).
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn held_locks(&self) -> Result<Vec<LockStatus>> {
        let locks = self.collection.open(&self.database)?;
        let rw_locks = self.reader_writer_collection.open(&self.database)?;
        let semaphores = self.semaphore_collection.open(&self.database)?;
        let mut held = admin::held(&locks).await?;
        held.extend(admin::reader_writer_holders(&rw_locks, Document::new()).await?);
        held.extend(admin::semaphore_holders(&semaphores, Document::new()).await?);
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
        admin::force_release(&self.collection.open(&self.database)?, name).await
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
        admin::purge_expired(&self.collection.open(&self.database)?).await
    }

    /// Acquires the exclusive locks `names` together (as [`acquire_all`](Self::acquire_all)
    /// does), runs `work` while all of them are held ([`CompositeGuard::run_while_held`]) and
    /// releases them: `work`'s output, or [`Error::LockLost`] if any member was lost first.
    ///
    /// # Errors
    /// As [`acquire_all`](Self::acquire_all); [`Error::LockLost`] if a member was lost before
    /// `work` completed (`work` is dropped then). A release that fails after `work` completed
    /// is logged, not returned.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping this future drops `work` and the guard, which releases every
    /// member in the background.
    pub async fn acquire_all_and_run<T>(
        &self,
        names: &[&str],
        timeout: Duration,
        work: impl AsyncFnOnce(&CompositeGuard) -> T,
    ) -> Result<T> {
        let guard = self.acquire_all(names, timeout).await?;
        let output = guard.run_while_held(work(&guard)).await;
        held::after_release(&names.join(", "), output, guard.release().await)
    }

    /// Starts campaigning for leadership of `name` (an exclusive lock of this provider) in the
    /// background; see [`LeaderElection`]. [`shutdown`](Self::shutdown) ends the campaign and
    /// the term.
    ///
    /// # Errors
    /// [`Error::NoRuntime`] outside a Tokio runtime.
    pub fn create_leader_election(&self, name: impl Into<String>) -> Result<LeaderElection> {
        LeaderElection::start(self.create_lock(name))
    }

    /// Releases every lease held through this provider and its clones, and stops acquiring.
    ///
    /// Every held lease of the locks it created (locks, semaphore places, readers, writers,
    /// document locks, composite members) is marked lost (their `lost` signals fire first) and
    /// released with one update each; releases already under way, such as those of guards
    /// dropped earlier, are waited for too. Acquisitions waiting at that moment end with
    /// [`Error::ShutDown`], and so does every later one (a lease an attempt in flight wins
    /// meanwhile is released at once). Guards of this provider report
    /// [`Error::LockLost`](crate::Error::LockLost) from `release` afterwards. Call it when a
    /// service stops, so that other instances need not wait for the leases to expire.
    ///
    /// A failed release is logged; its lease ends by itself at its expiry. Locks of this
    /// provider used on a runtime that has already shut down are not waited for (their leases
    /// expire by themselves).
    ///
    /// ```no_run
    /// # async fn demo(provider: distributed_lock_mongodb::Provider) {
    /// tokio::signal::ctrl_c().await.ok();
    /// provider.shutdown().await; // other instances can take our locks at once
    /// # }
    /// ```
    ///
    /// # Cancel safety
    /// The provider is shut down from the first poll on; dropping the future only stops the
    /// waiting for the releases, which go on in the background.
    pub async fn shutdown(&self) {
        self.renewals.shut_down().await;
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
        let mut sorted: Vec<&str> = names.to_vec();
        sorted.sort_unstable();
        if sorted.is_empty() {
            return Err(Error::InvalidArgument(
                "acquire_all needs at least one lock name".to_owned(),
            ));
        }
        if let Some(pair) = sorted.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(Error::InvalidArgument(format!(
                "acquire_all got the lock name {:?} twice",
                shown_name(pair[0])
            )));
        }
        let started = Instant::now();
        let deadline = started.checked_add(timeout);
        let mut members = Vec::with_capacity(sorted.len());
        for name in sorted {
            let remaining = deadline.map_or(Duration::MAX, |deadline| {
                deadline.saturating_duration_since(Instant::now())
            });
            // On failure the members acquired so far are dropped: released at once.
            let member = self.create_lock(name).acquire_timeout(remaining).await;
            members.push(member.map_err(|error| match error {
                Error::Timeout {
                    operation: Operation::Acquire,
                    name,
                    waited: _,
                } => Error::Timeout {
                    operation: Operation::Acquire,
                    name,
                    waited: started.elapsed(),
                },
                other => other,
            })?);
        }
        Ok(CompositeGuard::new(members))
    }

    /// A semaphore called `name` allowing `max_count` holders, with this provider's options and
    /// details, in its semaphore collection. Its holders share the provider's renewal loops.
    pub fn create_semaphore(
        &self,
        name: impl Into<String>,
        max_count: u32,
    ) -> MongoDistributedSemaphore {
        MongoDistributedSemaphore::new(name, max_count, &self.database)
            .with_collection(self.semaphore_collection.name.as_str())
            .with_options(self.options.clone())
            .with_details(self.details.clone())
            .with_renewals(&self.renewals)
    }

    /// A reader-writer lock called `name`, with this provider's options and details, in its
    /// reader-writer collection. Its holders share the provider's renewal loops.
    pub fn create_reader_writer_lock(
        &self,
        name: impl Into<String>,
    ) -> MongoDistributedReaderWriterLock {
        MongoDistributedReaderWriterLock::new(name, &self.database)
            .with_collection(self.reader_writer_collection.name.as_str())
            .with_options(self.options.clone())
            .with_details(self.details.clone())
            .with_renewals(&self.renewals)
    }

    /// A lock called `name` with this provider's collection and options (and details, with
    /// [`with_details_in_exclusive_locks`](Self::with_details_in_exclusive_locks)).
    pub fn create_lock(&self, name: impl Into<String>) -> MongoDistributedLock {
        let details = self.exclusive_details.then(|| self.details.to_document());
        MongoDistributedLock::new(name, &self.database)
            .with_collection(self.collection.name.as_str())
            .with_options(self.options.clone())
            .with_provider_settings(&self.renewals, details)
    }

    /// Locks in the documents of `collection` (see [`DocumentLock`]), with this provider's
    /// options; its guards share the provider's renewal loops.
    pub fn create_document_lock<T>(&self, collection: &Collection<T>) -> DocumentLock<T>
    where
        T: Serialize + DeserializeOwned + Send + Sync + 'static,
    {
        DocumentLock::new(collection)
            .with_options(self.options.clone())
            .with_renewals(&self.renewals)
    }
}

/// A collection name of the provider, checked once, when it is set.
#[derive(Clone, Debug)]
struct CollectionName {
    name: String,
    /// Why MongoDB would refuse the name, reported by the first call that uses it.
    problem: Option<Problem>,
}

impl CollectionName {
    fn new(name: String) -> CollectionName {
        CollectionName {
            problem: Problem::of_collection(&name),
            name,
        }
    }

    /// The collection, or [`Error::InvalidCollectionName`] if MongoDB would refuse its name.
    fn open(&self, database: &Database) -> Result<Collection<Document>> {
        Problem::check(self.problem.as_ref())?;
        Ok(database.collection(&self.name))
    }
}
