//! The blocking provider: its runtime and client, and the locks it creates.

use std::sync::Arc;
use std::time::Duration;

use mongodb::Database;
use mongodb::options::ClientOptions;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{
    Background, CompositeGuard, DocumentLock, Fence, FromAsync, LeaderElection,
    MongoDistributedLock, MongoDistributedReaderWriterLock, MongoDistributedSemaphore,
    OwnedRuntime, start_runtime, twins,
};
use crate::composite::CompositeMember;
use crate::details::LockDetails;
use crate::error::Result;
use crate::lock_status::{LockFilter, LockStatus};
use crate::options::LockOptions;

/// A factory of blocking locks: the blocking counterpart of [`crate::Provider`], with its own
/// runtime and MongoDB client (see the [module docs](super)).
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
    /// The database of the locks, on the provider's client.
    database: Database,
    background: Arc<Background>,
}

impl Provider {
    /// Starts the provider's runtime and a MongoDB client for `uri` on it, and hands out locks in
    /// `database`'s default collections, with default options. Like the driver, it connects
    /// lazily: an unreachable server is reported by the first call that talks to it.
    ///
    /// # Errors
    /// [`Error::Mongo`](crate::Error::Mongo) for an invalid connection string (or a failed DNS lookup of a
    /// `mongodb+srv` one); [`Error::RuntimeStart`](crate::Error::RuntimeStart) if the runtime cannot start;
    /// [`Error::BlockingInAsyncContext`](crate::Error::BlockingInAsyncContext) inside a Tokio runtime.
    pub fn connect(uri: &str, database: &str) -> Result<Provider> {
        let runtime = start_runtime()?;
        let options = runtime.block_on(ClientOptions::parse(uri).into_future())?;
        Provider::on(runtime, options, database)
    }

    /// As [`connect`](Self::connect), with client options built by the caller (for example to
    /// set credentials, TLS or a connection pool size).
    ///
    /// # Errors
    /// [`Error::Mongo`](crate::Error::Mongo) if the driver rejects `options`; otherwise as
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
        let database = client.database(database);
        let inner = crate::Provider::new(&database);
        let background = Background {
            runtime: OwnedRuntime(Some(runtime)),
            provider: inner.clone(),
            client,
        };
        Ok(Provider {
            inner,
            database,
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
        MongoDistributedLock::from_async(self.inner.create_lock(name), &self.background)
    }

    /// A reader-writer lock called `name`, with this provider's options and details, in its
    /// reader-writer collection.
    pub fn create_reader_writer_lock(
        &self,
        name: impl Into<String>,
    ) -> MongoDistributedReaderWriterLock {
        let inner = self.inner.create_reader_writer_lock(name);
        MongoDistributedReaderWriterLock::from_async(inner, &self.background)
    }

    /// A semaphore called `name` allowing `max_count` holders, with this provider's options
    /// and details, in its semaphore collection. A `max_count` of 0 is reported by the first
    /// `acquire*` call.
    pub fn create_semaphore(
        &self,
        name: impl Into<String>,
        max_count: u32,
    ) -> MongoDistributedSemaphore {
        let inner = self.inner.create_semaphore(name, max_count);
        MongoDistributedSemaphore::from_async(inner, &self.background)
    }

    /// Locks in the documents of collection `collection` of the provider's database, holding
    /// documents of type `T` (see [`crate::DocumentLock`]), with this provider's options; its
    /// guards share the provider's renewal loops.
    pub fn create_document_lock<T>(&self, collection: &str) -> DocumentLock<T>
    where
        T: Serialize + DeserializeOwned + Send + Sync + 'static,
    {
        let collection = self.database.collection::<T>(collection);
        let inner = self
            .inner
            .create_document_lock(&collection)
            .of_database(&self.database);
        DocumentLock::from_async(inner, &self.background)
    }

    /// Checks the provider's settings without talking to the server; see
    /// [`crate::Provider::validate`].
    ///
    /// # Errors
    /// As [`crate::Provider::validate`].
    pub fn validate(&self) -> Result<()> {
        self.inner.validate()
    }

    /// Starts campaigning for leadership of `name` (an exclusive lock of this provider, with
    /// this process's details stored) on the provider's runtime; see
    /// [`crate::Provider::create_leader_election`].
    ///
    /// # Errors
    /// As [`crate::Provider::create_leader_election`].
    pub fn create_leader_election(&self, name: impl Into<String>) -> Result<LeaderElection> {
        let inner = self
            .background
            .enter(|| self.inner.create_leader_election(name))??;
        Ok(LeaderElection::from_async(inner, &self.background))
    }

    /// Fenced writes to the collections of the provider's database; see [`crate::Fence`].
    pub fn create_fence(&self) -> Fence {
        Fence::new(crate::Fence::new(), self.database.clone(), &self.background)
    }

    twins! { Provider:
        fn status(&self, name: &str) -> Option<LockStatus>;
        fn held_locks(&self) -> Vec<LockStatus>;
        /// **Dangerous**: ends the lease of exclusive lock `name` now, whoever holds it.
        fn force_release(&self, name: &str) -> bool;
        /// Asks the holder of exclusive lock `name` to let go within `grace`; see
        /// [`crate::Provider::request_revocation`].
        fn request_revocation(&self, name: &str, grace: Duration) -> Option<LockStatus>;
        /// Asks the one holder `holder` describes to let go within `grace`; see
        /// [`crate::Provider::request_revocation_of`].
        fn request_revocation_of(&self, holder: &LockStatus, grace: Duration) -> Option<LockStatus>;
        fn held_locks_matching(&self, filter: &LockFilter) -> Vec<LockStatus>;
        /// **Dangerous**: ends the one lease `holder` describes.
        fn force_release_holder(&self, holder: &LockStatus) -> bool;
        fn purge_expired(&self) -> u64;
        fn purgeable(&self, names: usize) -> crate::Purgeable;
        fn create_indexes(&self) -> ();
    }

    /// Acquires `members` together (any mix of kinds, in the global lock order, all or
    /// nothing), waiting at most `timeout`; see [`crate::Provider::acquire_all`].
    ///
    /// # Errors
    /// As [`crate::Provider::acquire_all`]; [`Error::BlockingInAsyncContext`](crate::Error::BlockingInAsyncContext) inside a Tokio
    /// runtime.
    pub fn acquire_all<'a, M>(&self, members: &[M], timeout: Duration) -> Result<CompositeGuard>
    where
        M: Clone + Into<CompositeMember<'a>>,
    {
        let inner = self
            .background
            .block_on(self.inner.acquire_all(members, timeout))??;
        Ok(CompositeGuard::from_async(inner, &self.background))
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
        Ok(Option::from_async(inner, &self.background))
    }

    /// Releases every lease held through this provider and its clones and stops acquiring
    /// (later acquisitions fail with [`Error::ShutDown`](crate::Error::ShutDown)); returns once the releases are done.
    /// See [`crate::Provider::shutdown`]. The runtime keeps running until the last handle is
    /// dropped.
    ///
    /// # Errors
    /// [`Error::BlockingInAsyncContext`](crate::Error::BlockingInAsyncContext) inside a Tokio runtime (nothing is shut down then).
    pub fn shutdown(&self) -> Result<()> {
        self.background.block_on(self.inner.shutdown())
    }
}
