//! Hands out named locks that share a collection and options.

use std::sync::Arc;
use std::time::Duration;

use mongodb::bson::{Document, doc};
use mongodb::{Collection, Database};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::composite::HeldMember;
use crate::error::shown_name;
use crate::lease::hub::RenewalHub;
use crate::lease::schema::{HOLDERS, Layout, READERS};
use crate::lease::{Problem, admin, create_ttl_index, held};
use crate::traits::{DistributedLock, DistributedLockProvider, DistributedReaderWriterLock};
use crate::{
    CompositeGuard, CompositeMember, DEFAULT_LOCK_COLLECTION, DEFAULT_RW_COLLECTION,
    DEFAULT_SEMAPHORE_COLLECTION, DocumentLock, Error, Job, LeaderElection, LockDetails,
    LockFilter, LockGuard, LockKind, LockOptions, LockStatus, MongoDistributedLock,
    MongoDistributedReaderWriterLock, MongoDistributedSemaphore, Result,
};

/// A factory of locks for dependency-injection style applications: configure the database,
/// collection and options once, then create locks by name wherever they are needed.
///
/// Clone + Send + Sync. The guards of all locks created by one provider (and its clones), of
/// every kind, share a renewal loop per Tokio runtime and collection: holding a thousand locks
/// costs one renewal command per cadence, not a thousand. The TTL index of each lock collection
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
        admin::status(&self.open(&self.collection)?, name).await
    }

    /// Every lock of this provider that is held right now, ordered by name and kind, one entry
    /// per holder: the exclusive locks, the readers and writers of the reader-writer locks, and
    /// the holders of the semaphores, each in the provider's collection for its kind (with
    /// whatever details they stored). The same as
    /// [`held_locks_matching`](Self::held_locks_matching) with [`LockFilter::new`].
    ///
    /// # Errors
    /// As [`status`](Self::status).
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn held_locks(&self) -> Result<Vec<LockStatus>> {
        self.held_locks_matching(&LockFilter::new()).await
    }

    /// The holders [`held_locks`](Self::held_locks) lists that pass `filter` (kind, name, owner,
    /// how long held): for example the holders of one service that have held a lock for over
    /// an hour, to [`force_release_holder`](Self::force_release_holder) them. Only the
    /// collections of the kinds asked for are read, and a name is looked up by its `_id`.
    ///
    /// # Errors
    /// As [`status`](Self::status).
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn held_locks_matching(&self, filter: &LockFilter) -> Result<Vec<LockStatus>> {
        let by_name = || {
            filter
                .name()
                .map_or_else(Document::new, |name| doc! { "_id": name })
        };
        let mut held = Vec::new();
        if filter.wants(LockKind::Exclusive) {
            let locks = self.open(&self.collection)?;
            held.extend(admin::held(&locks, by_name()).await?);
        }
        if filter.wants(LockKind::Read) || filter.wants(LockKind::Write) {
            let rw_locks = self.open(&self.reader_writer_collection)?;
            held.extend(admin::reader_writer_holders(&rw_locks, by_name()).await?);
        }
        if filter.wants(LockKind::Semaphore) {
            let semaphores = self.open(&self.semaphore_collection)?;
            held.extend(admin::semaphore_holders(&semaphores, by_name()).await?);
        }
        held.retain(|holder| filter.matches(holder));
        held.sort_by(|a, b| (&a.name, a.kind).cmp(&(&b.name, b.kind)));
        Ok(held)
    }

    /// **Dangerous** (see [`force_release`](Self::force_release)): ends the one lease `holder`
    /// describes (an entry of [`held_locks`](Self::held_locks), of any kind), now, as its
    /// holder's release would: an exclusive lock or a writer keeps its document and fencing
    /// token, a reader or semaphore place leaves the others alone. Returns whether that lease
    /// was still there (a holder that released or was replaced since the read is not
    /// touched: the lock id names one acquisition). Its holder's next renewal finds the lease
    /// gone and signals `lost`.
    ///
    /// ```no_run
    /// # async fn demo(provider: distributed_lock_mongodb::Provider) -> distributed_lock_mongodb::Result<()> {
    /// use std::time::Duration;
    /// use distributed_lock_mongodb::LockFilter;
    ///
    /// // Free what a hung (but still renewing) batch host has held for over six hours.
    /// let stuck = LockFilter::new().with_min_held_for(Duration::from_secs(6 * 60 * 60));
    /// for holder in provider.held_locks_matching(&stuck).await? {
    ///     if holder.host() == Some("batch-7") {
    ///         provider.force_release_holder(&holder).await?;
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an entry without a lock
    /// id (a lock that was not held); otherwise as [`status`](Self::status).
    ///
    /// # Cancel safety
    /// Dropping the future may or may not leave the lease ended.
    pub async fn force_release_holder(&self, holder: &LockStatus) -> Result<bool> {
        let Some(lock_id) = holder.lock_id.as_deref() else {
            return Err(Error::InvalidArgument(format!(
                "force_release_holder: the entry for lock {:?} has no lock id (nobody held it)",
                shown_name(&holder.name)
            )));
        };
        let (collection, layout) = match holder.kind {
            LockKind::Exclusive => (&self.collection, Layout::LockDocument),
            LockKind::Write => (&self.reader_writer_collection, Layout::Writer),
            LockKind::Read => (
                &self.reader_writer_collection,
                Layout::Members(READERS.to_owned()),
            ),
            LockKind::Semaphore => (
                &self.semaphore_collection,
                Layout::Members(HOLDERS.to_owned()),
            ),
            LockKind::Document => {
                return Err(Error::InvalidArgument(format!(
                    "force_release_holder: {:?} is a document lock, which lives in the \
                     application's collection, not the provider's",
                    shown_name(&holder.name)
                )));
            }
        };
        let collection = self.open(collection)?;
        admin::force_release_lease(&collection, &layout, &holder.name, lock_id).await
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
        admin::force_release(&self.open(&self.collection)?, name).await
    }

    /// Deletes the lock documents whose last lease ended more than a day ago (server time) in
    /// each of the provider's collections (exclusive, reader-writer, semaphore) and returns
    /// how many; never touches a held lock, nor a document whose fencing token may still
    /// matter (see `RELIABILITY.md`). For deployments where the TTL index cannot be created
    /// or its monitor lags. One `delete_many` per collection.
    ///
    /// # Errors
    /// As [`status`](Self::status).
    ///
    /// # Cancel safety
    /// Dropping the future may or may not leave documents deleted.
    pub async fn purge_expired(&self) -> Result<u64> {
        let mut deleted = 0;
        for collection in self.lock_collections()? {
            deleted += admin::purge_expired(&collection).await?;
        }
        Ok(deleted)
    }

    /// Creates the TTL index on `expiresAt` in each of the provider's collections (exclusive,
    /// reader-writer, semaphore) now, and waits for it. For deployments that forbid creating
    /// indexes at run time: call it from a deployment step with a user that may, and turn the
    /// automatic creation off with
    /// [`LockOptionsBuilder::automatic_ttl_index`](crate::LockOptionsBuilder::automatic_ttl_index).
    /// An equivalent index created by someone else (a TTL index on `{expiresAt: 1}` keeping
    /// documents at least a day) counts as done. Creating an index that exists is a no-op, so
    /// calling it at every start is fine too.
    ///
    /// ```no_run
    /// # async fn demo(database: mongodb::Database) -> distributed_lock_mongodb::Result<()> {
    /// use distributed_lock_mongodb::{LockOptions, Provider};
    ///
    /// // In the deployment step:
    /// Provider::new(&database).create_indexes().await?;
    /// // In the service, whose user may not create indexes:
    /// let options = LockOptions::builder().automatic_ttl_index(false).build()?;
    /// let provider = Provider::new(&database).with_options(options);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::Mongo`](crate::Error::Mongo) with the server's refusal when an index could not
    /// be created and no equivalent one exists; [`Error::InvalidCollectionName`].
    ///
    /// # Cancel safety
    /// Dropping the future may or may not leave some of the indexes created.
    pub async fn create_indexes(&self) -> Result<()> {
        for collection in self.lock_collections()? {
            create_ttl_index(&collection).await?;
        }
        Ok(())
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

    /// The provider's lock collections (exclusive, reader-writer, semaphore), each once.
    fn lock_collections(&self) -> Result<Vec<Collection<Document>>> {
        let mut names = vec![
            &self.collection,
            &self.reader_writer_collection,
            &self.semaphore_collection,
        ];
        names.sort_by(|a, b| a.name.cmp(&b.name));
        names.dedup_by(|a, b| a.name == b.name);
        names.into_iter().map(|name| self.open(name)).collect()
    }

    /// Acquires `members` together (as [`acquire_all`](Self::acquire_all) does), runs `work`
    /// while all of them are held ([`CompositeGuard::run_while_held`]) and releases them:
    /// `work`'s output, or [`Error::LockLost`] if any member was lost first.
    ///
    /// # Errors
    /// As [`acquire_all`](Self::acquire_all); [`Error::LockLost`] if a member was lost before
    /// `work` completed (`work` is dropped then). A release that fails after `work` completed
    /// is logged, not returned.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping this future drops `work` and the guard, which releases every
    /// member in the background.
    pub async fn acquire_all_and_run<'a, M, T>(
        &self,
        members: &[M],
        timeout: Duration,
        work: impl AsyncFnOnce(&CompositeGuard) -> T,
    ) -> Result<T>
    where
        M: Clone + Into<CompositeMember<'a>>,
    {
        let guard = self.acquire_all(members, timeout).await?;
        let output = guard.run_while_held(work(&guard)).await;
        let names = guard.names().collect::<Vec<_>>().join(", ");
        held::after_release(&names, output, guard.release().await)
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

    /// Releases every lease held through this provider and its clones, finishes or undoes
    /// everything under way, and stops acquiring.
    ///
    /// Every held lease of the locks it created (locks, semaphore places, readers, writers,
    /// document locks, composite members) is marked lost (their `lost` signals fire first) and
    /// released with one update each. Work under way that could leave a lease behind is finished
    /// or undone before this returns: releases and transfers already on their way (such as those
    /// of guards dropped earlier) and cleanups are sent again (harmlessly, by lock id), and
    /// acquisition attempts still in flight are waited for, at most until 5 s after they were
    /// sent, and then cleaned up by their own lock id (a lease one of them wins meanwhile is
    /// released at once). Acquisitions waiting at that moment end with [`Error::ShutDown`], and so
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
        self.renewals.shut_down().await;
    }

    /// Acquires `members` together, any mix of exclusive locks, read locks, write locks and
    /// semaphore places (see [`CompositeMember`]; a plain name is an exclusive lock), and
    /// returns one guard for all of them.
    ///
    /// Members are acquired in one global order, by the name of the collection of their kind
    /// and then by name, so callers with overlapping sets cannot deadlock (with the same
    /// collection settings). It is all or nothing: on an error, or when `timeout` runs out, the
    /// members acquired so far are released at once. The guard's `lost` fires if any member is
    /// lost.
    ///
    /// ```no_run
    /// # async fn demo(provider: distributed_lock_mongodb::Provider) -> distributed_lock_mongodb::Result<()> {
    /// use std::time::Duration;
    /// use distributed_lock_mongodb::CompositeMember::{Exclusive, Read, Semaphore};
    ///
    /// // Two accounts (plain names are exclusive locks):
    /// let accounts = provider.acquire_all(&["acct-7", "acct-3"], Duration::from_secs(5)).await?;
    /// accounts.release().await?;
    /// // A mix: the price list for reading, one of 4 export slots and the order itself.
    /// let members = [Read("prices"), Semaphore { name: "exports", max_count: 4 }, Exclusive("order-42")];
    /// let all = provider.acquire_all(&members, Duration::from_secs(5)).await?;
    /// all.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an empty set or a lock
    /// given twice (a read and a write lock of one name count as the same lock);
    /// [`Error::Timeout`](crate::Error::Timeout) naming the member that could not be acquired
    /// when `timeout` runs out; otherwise as the members' own `acquire` methods.
    ///
    /// # Cancel safety
    /// Cancel safe: members acquired before the future was dropped are released at once.
    pub async fn acquire_all<'a, M>(
        &self,
        members: &[M],
        timeout: Duration,
    ) -> Result<CompositeGuard>
    where
        M: Clone + Into<CompositeMember<'a>>,
    {
        let started = Instant::now();
        match self.acquire_all_within(members, timeout).await? {
            Ok(guard) => Ok(guard),
            Err(busy) => {
                let waited = started.elapsed();
                let holders = tokio::time::timeout(Duration::from_secs(5), self.holders_of(busy))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or_default();
                Err(Error::Timeout {
                    name: busy.name().to_owned(),
                    waited,
                    holders,
                })
            }
        }
    }

    /// Who holds the composite member `member` now.
    async fn holders_of(&self, member: CompositeMember<'_>) -> Result<Vec<LockStatus>> {
        match member {
            CompositeMember::Exclusive(name) => self.create_lock(name).holders().await,
            CompositeMember::Read(name) | CompositeMember::Write(name) => {
                self.create_reader_writer_lock(name).holders().await
            }
            CompositeMember::Semaphore { name, max_count } => {
                self.create_semaphore(name, max_count).holders().await
            }
        }
    }

    /// Acquires `members` together if every one of them is free now, as
    /// [`acquire_all`](Self::acquire_all) does with no wait: `Ok(None)` (with nothing held) as
    /// soon as one is busy.
    ///
    /// # Errors
    /// As [`acquire_all`](Self::acquire_all), without timeouts.
    ///
    /// # Cancel safety
    /// As [`acquire_all`](Self::acquire_all).
    pub async fn try_acquire_all<'a, M>(&self, members: &[M]) -> Result<Option<CompositeGuard>>
    where
        M: Clone + Into<CompositeMember<'a>>,
    {
        Ok(self.acquire_all_within(members, Duration::ZERO).await?.ok())
    }

    /// Acquires `members` in lock order within `timeout`: the guard, or the member that was
    /// still busy when the time ran out (the others released).
    async fn acquire_all_within<'a, M>(
        &self,
        members: &[M],
        timeout: Duration,
    ) -> Result<std::result::Result<CompositeGuard, CompositeMember<'a>>>
    where
        M: Clone + Into<CompositeMember<'a>>,
    {
        let members = self.in_lock_order(members)?;
        let deadline = Instant::now().checked_add(timeout);
        let mut held = Vec::with_capacity(members.len());
        for member in members {
            let remaining = deadline.map_or(Duration::MAX, |deadline| {
                deadline.saturating_duration_since(Instant::now())
            });
            // On failure the members acquired so far are dropped: released at once.
            match self.acquire_member(member, remaining).await? {
                Some(acquired) => held.push(acquired),
                None => return Ok(Err(member)),
            }
        }
        Ok(Ok(CompositeGuard::new(held)))
    }

    /// `members` sorted into the global lock order: by the collection of their kind, then by
    /// name; refused if empty or if a lock comes twice.
    fn in_lock_order<'a, M>(&self, members: &[M]) -> Result<Vec<CompositeMember<'a>>>
    where
        M: Clone + Into<CompositeMember<'a>>,
    {
        let mut members: Vec<CompositeMember<'a>> =
            members.iter().cloned().map(Into::into).collect();
        let key = |member: &CompositeMember<'a>| {
            let collection = match member.kind() {
                // (A composite member is never a document lock.)
                LockKind::Exclusive | LockKind::Document => &self.collection,
                LockKind::Read | LockKind::Write => &self.reader_writer_collection,
                LockKind::Semaphore => &self.semaphore_collection,
            };
            (collection.name.clone(), member.name())
        };
        members.sort_by_cached_key(key);
        if members.is_empty() {
            return Err(Error::InvalidArgument(
                "acquire_all needs at least one lock".to_owned(),
            ));
        }
        if let Some(pair) = members
            .windows(2)
            .find(|pair| key(&pair[0]) == key(&pair[1]))
        {
            return Err(Error::InvalidArgument(format!(
                "acquire_all got the lock name {:?} twice (as {:?} and {:?})",
                shown_name(pair[0].name()),
                pair[0].kind(),
                pair[1].kind(),
            )));
        }
        Ok(members)
    }

    /// Acquires one member within `wait`: `None` if it stayed busy.
    async fn acquire_member(
        &self,
        member: CompositeMember<'_>,
        wait: Duration,
    ) -> Result<Option<HeldMember>> {
        let kind = member.kind();
        let with_token = |guard: Option<LockGuard>| {
            guard.map(|guard| {
                let (lease, token) = guard.into_parts();
                HeldMember {
                    lease,
                    kind,
                    fencing_token: Some(token),
                }
            })
        };
        Ok(match member {
            CompositeMember::Exclusive(name) => {
                with_token(self.create_lock(name).try_acquire_timeout(wait).await?)
            }
            CompositeMember::Write(name) => {
                let rw = self.create_reader_writer_lock(name);
                with_token(rw.try_acquire_write_timeout(wait).await?)
            }
            CompositeMember::Semaphore { name, max_count } => {
                let semaphore = self.create_semaphore(name, max_count);
                with_token(semaphore.try_acquire_timeout(wait).await?)
            }
            CompositeMember::Read(name) => {
                let rw = self.create_reader_writer_lock(name);
                let read = rw.try_acquire_read_timeout(wait).await?;
                read.map(|guard| HeldMember {
                    lease: guard.into_lease(),
                    kind,
                    fencing_token: None,
                })
            }
        })
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
            .with_renewals(&self.renewals, self.shared_collection())
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
            .with_renewals(&self.renewals, self.shared_collection())
    }

    /// A lock called `name` with this provider's collection and options (and details, with
    /// [`with_details_in_exclusive_locks`](Self::with_details_in_exclusive_locks)).
    pub fn create_lock(&self, name: impl Into<String>) -> MongoDistributedLock {
        let details = self.exclusive_details.then(|| self.details.to_document());
        MongoDistributedLock::new(name, &self.database)
            .with_collection(self.collection.name.as_str())
            .with_options(self.options.clone())
            .with_provider_settings(&self.renewals, details, self.shared_collection())
    }

    /// A job called `name` (an exclusive lock of this provider, with this process's details
    /// stored) that runs at most once per `window` across every instance; see [`Job`].
    pub fn create_job(&self, name: impl Into<String>, window: Duration) -> Job {
        let lock = MongoDistributedLock::new(name, &self.database)
            .with_collection(self.collection.name.as_str())
            .with_options(self.options.clone())
            .with_provider_settings(
                &self.renewals,
                Some(self.details.to_document()),
                self.shared_collection(),
            );
        Job::from_lock(lock, window)
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

impl DistributedLockProvider for Provider {
    fn create_lock(&self, name: &str) -> Box<dyn DistributedLock> {
        Box::new(Provider::create_lock(self, name))
    }

    fn create_semaphore(&self, name: &str, max_count: u32) -> Box<dyn DistributedLock> {
        Box::new(Provider::create_semaphore(self, name, max_count))
    }

    fn create_reader_writer_lock(&self, name: &str) -> Box<dyn DistributedReaderWriterLock> {
        Box::new(Provider::create_reader_writer_lock(self, name))
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
