//! Hands out named locks that share a collection and options.

use std::sync::Arc;
use std::time::Duration;

use mongodb::bson::Document;
use mongodb::{Collection, Database};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::composite::CompositeMember;
use crate::details::LockDetails;
use crate::document_lock::DocumentLock;
use crate::error::Result;
use crate::job::Job;
use crate::leader::LeaderElection;
use crate::lease::Problem;
use crate::lease::family::Family;
use crate::lock::{DEFAULT_LOCK_COLLECTION, MongoDistributedLock};
use crate::options::LockOptions;
use crate::rw_lock::{DEFAULT_RW_COLLECTION, MongoDistributedReaderWriterLock};
use crate::semaphore::{DEFAULT_SEMAPHORE_COLLECTION, MongoDistributedSemaphore};
use crate::traits::{
    BoxedCompositeGuard, DistributedDocumentLock, DistributedLock, DistributedLockProvider,
    DistributedReaderWriterLock, DistributedSemaphore,
};
use futures::future::BoxFuture;

mod administration;
mod composite;

/// A factory of locks for dependency-injection style applications: configure the database,
/// collection and options once, then create locks by name wherever they are needed.
///
/// Clone + Send + Sync. The guards of all locks created by one provider (and its clones), of
/// every kind, share a renewal loop per Tokio runtime and collection: holding a thousand locks
/// costs one renewal command per cadence, not a thousand. (Document locks share it per
/// collection handle: see [`create_document_lock`](Self::create_document_lock).) The TTL index of each lock collection
/// is created once per process, after the first successful acquisition there (shared with
/// locks created directly), unless turned off in the options (see
/// [`create_indexes`](Self::create_indexes)).
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
    family: Arc<Family>,
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
            family: Arc::default(),
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

    /// Why the provider's locks cannot be used: two kinds of lock configured in one collection,
    /// where a lock of each kind with the same name would share (and corrupt) one document.
    fn shared_collection(&self) -> Option<Problem> {
        let settings = [
            ("exclusive locks (with_collection)", &self.collection),
            (
                "reader-writer locks (with_reader_writer_collection)",
                &self.reader_writer_collection,
            ),
            (
                "semaphores (with_semaphore_collection)",
                &self.semaphore_collection,
            ),
        ];
        settings
            .iter()
            .enumerate()
            .find_map(|(index, (kind, name))| {
                let (other, _) = settings[index + 1..]
                    .iter()
                    .find(|(_, other)| other.name == name.name)?;
                Some(Problem::Argument(format!(
                    "the provider keeps {kind} and {other} in the same collection {:?}: a lock of \
                 each kind with the same name would share one document; give each kind a \
                 collection of its own",
                    name.name
                )))
            })
    }

    /// The collection `name` of this provider, or the error that its settings call for.
    fn open(&self, name: &CollectionName) -> Result<Collection<Document>> {
        Problem::check(self.shared_collection().as_ref())?;
        name.open(&self.database)
    }

    /// Starts campaigning for leadership of `name` (an exclusive lock of this provider) in the
    /// background; see [`LeaderElection`]. [`shutdown`](Self::shutdown) ends the campaign and
    /// the term.
    ///
    /// # Errors
    /// [`Error::NoRuntime`](crate::Error::NoRuntime) outside a Tokio runtime.
    pub fn create_leader_election(&self, name: impl Into<String>) -> Result<LeaderElection> {
        LeaderElection::start(self.create_lock(name))
    }

    /// Releases every lease held through this provider and its clones, finishes or undoes
    /// everything under way, and stops acquiring.
    ///
    /// Every held lease of the locks it created (locks, semaphore places, readers, writers,
    /// document locks, composite members) is marked lost (their `lost` signals fire first) and
    /// released with one update each. Work under way that could leave a lease behind is finished
    /// or undone before this returns: releases already on their way (such as those of guards
    /// dropped earlier) and cleanups are sent again (harmlessly, by lock id); acquisition
    /// attempts still in flight, and transfers of a released lease to a waiting lock object
    /// (of this provider or built apart), are waited for, at most until 5 s after their last
    /// command was sent (the server time limit each carries), and only then undone by their
    /// own lock ids (a lease one of them wins meanwhile is released at once; a waiter is never
    /// handed a lease this undoes). Acquisitions waiting at that moment end with [`Error::ShutDown`](crate::Error::ShutDown), and so
    /// does every later one. Guards of this provider report
    /// [`Error::LockLost`](crate::Error::LockLost) from `release` afterwards. Call it when a
    /// service stops, so that other instances need not wait for the leases to expire; the
    /// runtime may be dropped as soon as it returns.
    ///
    /// Everything is sent from the task that awaits this, not by the renewal loops, so it returns
    /// in bounded time (each update waits at most `expiry` for its reply) even when a lock of the
    /// provider was used on a runtime that is no longer driven. A failed update is logged; its
    /// lease ends by itself at its expiry. Only a command delayed in the network for longer than
    /// its attempt was waited for can still be applied afterwards (its lease then expires). A
    /// second call (from a clone, in another task) while one is under way returns once that one
    /// is done.
    ///
    /// ```no_run
    /// # async fn demo(provider: distributed_lock_mongodb::Provider) {
    /// tokio::signal::ctrl_c().await.ok();
    /// provider.shutdown().await; // other instances can take our locks at once
    /// # }
    /// ```
    ///
    /// # Cancel safety
    /// The provider is shut down from the first poll on. Dropping the future stops the releases
    /// and undos this task sends (releases already under way elsewhere go on); those it had not
    /// finished are sent by the next call.
    pub async fn shutdown(&self) {
        self.family.shut_down().await;
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
            .in_family(&self.family, self.shared_collection())
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
            .in_family(&self.family, self.shared_collection())
    }

    /// A lock called `name` with this provider's collection and options (and details, with
    /// [`with_details_in_exclusive_locks`](Self::with_details_in_exclusive_locks)).
    pub fn create_lock(&self, name: impl Into<String>) -> MongoDistributedLock {
        let details = self.exclusive_details.then(|| self.details.to_document());
        MongoDistributedLock::new(name, &self.database)
            .with_collection(self.collection.name.as_str())
            .with_options(self.options.clone())
            .with_provider_settings(&self.family, details, self.shared_collection())
    }

    /// A job called `name` (an exclusive lock of this provider, with this process's details
    /// stored) that runs at most once per `window` across every instance; see [`Job`].
    pub fn create_job(&self, name: impl Into<String>, window: Duration) -> Job {
        let lock = MongoDistributedLock::new(name, &self.database)
            .with_collection(self.collection.name.as_str())
            .with_options(self.options.clone())
            .with_provider_settings(
                &self.family,
                Some(self.details.to_document()),
                self.shared_collection(),
            );
        Job::from_lock(lock, window)
    }

    /// Locks in the documents of `collection` (see [`DocumentLock`]), with this provider's
    /// options; its guards share the provider's renewal loops with the other document locks of
    /// the same collection handle (clones of it). A `mongodb::Client` cannot be compared, and
    /// two clients may reach two deployments with the same names: a handle made apart (even
    /// from the same client) gets renewal loops of its own, which cost a renewal command per
    /// cadence each, never a lease renewed on another deployment. Keep one handle per
    /// collection where many document locks are held at once.
    pub fn create_document_lock<T>(&self, collection: &Collection<T>) -> DocumentLock<T>
    where
        T: Serialize + DeserializeOwned + Send + Sync + 'static,
    {
        DocumentLock::new(collection)
            .with_options(self.options.clone())
            .in_family(&self.family)
    }
}

impl DistributedLockProvider for Provider {
    fn create_lock(&self, name: &str) -> Box<dyn DistributedLock> {
        Box::new(Provider::create_lock(self, name))
    }

    fn create_semaphore(&self, name: &str, max_count: u32) -> Box<dyn DistributedSemaphore> {
        Box::new(Provider::create_semaphore(self, name, max_count))
    }

    fn create_reader_writer_lock(&self, name: &str) -> Box<dyn DistributedReaderWriterLock> {
        Box::new(Provider::create_reader_writer_lock(self, name))
    }

    fn create_document_lock(&self, collection: &str) -> Box<dyn DistributedDocumentLock> {
        let collection = self.database.collection::<Document>(collection);
        Box::new(Provider::create_document_lock(self, &collection).of_database(&self.database))
    }

    fn create_leader_election(&self, name: &str) -> Result<LeaderElection> {
        Provider::create_leader_election(self, name)
    }

    fn create_job(
        &self,
        name: &str,
        window: Duration,
        max_runtime: Option<Duration>,
    ) -> Result<crate::DistributedJob> {
        let mut job = Provider::create_job(self, name, window);
        if let Some(max_runtime) = max_runtime {
            job = job.max_runtime(max_runtime);
        }
        Ok(crate::DistributedJob::over(Box::new(job.lock()?)))
    }

    fn acquire_all<'a>(
        &'a self,
        members: &'a [CompositeMember<'a>],
        timeout: Duration,
    ) -> BoxFuture<'a, Result<BoxedCompositeGuard>> {
        Box::pin(async move {
            let guard = Provider::acquire_all(self, members, timeout).await?;
            Ok(Box::new(guard) as BoxedCompositeGuard)
        })
    }

    fn try_acquire_all<'a>(
        &'a self,
        members: &'a [CompositeMember<'a>],
    ) -> BoxFuture<'a, Result<Option<BoxedCompositeGuard>>> {
        Box::pin(async move {
            let guard = Provider::try_acquire_all(self, members).await?;
            Ok(guard.map(|guard| Box::new(guard) as BoxedCompositeGuard))
        })
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

    /// The collection, or [`Error::InvalidCollectionName`](crate::Error::InvalidCollectionName) if MongoDB would refuse its name.
    fn open(&self, database: &Database) -> Result<Collection<Document>> {
        Problem::check(self.problem.as_ref())?;
        Ok(database.collection(&self.name))
    }
}
