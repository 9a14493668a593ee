//! The provider's administration calls: what is held, forced releases, purging, indexes.

use mongodb::Collection;
use mongodb::bson::{Document, doc};

use super::Provider;
use crate::error::{Error, Result, shown_name};
use crate::lease::revoke::Asked;
use crate::lease::schema::{HOLDERS, Layout, READERS, Stored};
use crate::lease::{admin, create_ttl_index};
use crate::lock_status::{LockFilter, LockKind, LockStatus, Purgeable};

impl Provider {
    /// The status of exclusive lock `name` (holder, lease, fencing token, and details if it
    /// stores them) at one server instant, or `None` if the lock has no document. For
    /// reader-writer locks and semaphores, see their `holders()`.
    ///
    /// # Errors
    /// [`Error::Mongo`](crate::Error::Mongo) if the read fails;
    /// [`Error::NoReply`](crate::Error::NoReply) if MongoDB does not answer within the
    /// provider's `expiry` (at least five seconds: a half-open connection, on which the driver
    /// would wait for ever; the same bound holds for every call of this section, and a write's
    /// outcome is then unknown); [`Error::InvalidCollectionName`](crate::Error::InvalidCollectionName).
    ///
    /// # Cancel safety
    /// Cancel safe: a read only.
    pub async fn status(&self, name: &str) -> Result<Option<LockStatus>> {
        let collection = self.open(&self.collection)?;
        self.within(name, admin::status(&collection, name)).await
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
        let subject = filter.name().unwrap_or(self.collection.name.as_str());
        self.within(subject, self.read_held(filter)).await
    }

    async fn read_held(&self, filter: &LockFilter) -> Result<Vec<LockStatus>> {
        let by_name = || {
            filter
                .name()
                .map_or_else(Document::new, |name| doc! { "_id": name })
        };
        let mut held = Vec::new();
        if filter.wants(LockKind::Exclusive) {
            let locks = self.open(&self.collection)?;
            held.extend(admin::held(&locks, by_name(), filter.wants_kept()).await?);
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
    /// token (and an exclusive lock its holder's `min_hold` window), a reader or semaphore place
    /// leaves the others alone. Only a document shaped like a lock document of that kind is
    /// touched. Returns whether that lease
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
        let release = admin::force_release_lease(&collection, &layout, &holder.name, lock_id);
        self.within(&holder.name, release).await
    }

    /// Asks the holder of exclusive lock `name` to let go within `grace` (see
    /// [`revocation`](crate::revocation)): its guard's
    /// [`revocation_requested`](crate::LockGuard::revocation_requested) resolves, and once the
    /// grace is over its lease is not renewed any more, so the lock is free at the lease's end
    /// at the latest (its holder's lost signal fires first). Unlike
    /// [`force_release`](Self::force_release), two holders never overlap, whatever the holder
    /// does. The request has the highest priority (it replaces a waiter's) and keeps the lock
    /// for nobody. Returns the holder's status, with the request; `None` if nobody holds the
    /// lock (nothing is written then). Only a document shaped like an exclusive lock's is
    /// touched.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a grace over 365 days,
    /// before anything is sent; otherwise as [`status`](Self::status).
    ///
    /// # Cancel safety
    /// Dropping the future may or may not leave the request written.
    pub async fn request_revocation(
        &self,
        name: &str,
        grace: std::time::Duration,
    ) -> Result<Option<LockStatus>> {
        let grace_millis = crate::revocation::grace_millis(&shown_name(name), grace)?;
        let collection = self.open(&self.collection)?;
        let request = admin::request_revocation(&collection, name, Asked::Holder, grace_millis);
        self.within(name, request).await
    }

    /// Asks the one holder `holder` describes (an entry of [`held_locks`](Self::held_locks):
    /// an exclusive lock's, or a semaphore's place) to let go within `grace`, as
    /// [`request_revocation`](Self::request_revocation) does: that lease alone, if it is still
    /// there (a holder that released or was replaced since the read is left alone). A
    /// semaphore's place stops being renewed once the grace is over; the other places are not
    /// touched. Returns the holder's status with the request, `None` if the lease is gone.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument), before anything is sent, for
    /// an entry without a lock id, a reader-writer lock's or a document lock's holder (only an
    /// exclusive lock's holder and a semaphore's place can be asked), or a grace over 365 days;
    /// and, nothing written, for a semaphore's place while a live request asks another of its
    /// places (one request per semaphore at a time); otherwise as [`status`](Self::status).
    ///
    /// # Cancel safety
    /// Dropping the future may or may not leave the request written.
    pub async fn request_revocation_of(
        &self,
        holder: &LockStatus,
        grace: std::time::Duration,
    ) -> Result<Option<LockStatus>> {
        let shown = shown_name(&holder.name);
        let Some(lock_id) = holder.lock_id.as_deref() else {
            return Err(Error::InvalidArgument(format!(
                "request_revocation_of: the entry for lock {shown:?} has no lock id (nobody held it)"
            )));
        };
        let grace_millis = crate::revocation::grace_millis(&shown, grace)?;
        let (collection, asked) = match holder.kind {
            LockKind::Exclusive => (&self.collection, Asked::Lease(lock_id)),
            LockKind::Semaphore => (&self.semaphore_collection, Asked::Place(lock_id)),
            kind => {
                return Err(Error::InvalidArgument(format!(
                    "request_revocation_of: {shown:?} is held as {kind}; only an exclusive \
                     lock's holder and a semaphore's place can be asked to let go"
                )));
            }
        };
        let collection = self.open(collection)?;
        let request = admin::request_revocation(&collection, &holder.name, asked, grace_millis);
        self.within(&holder.name, request).await
    }

    /// **Dangerous**: ends the lease of lock `name` now, whoever holds it, so a stuck lock (for
    /// example one held by a process that hangs but keeps renewing) can be taken by others. The
    /// holder is not asked: its next renewal finds the lease gone and signals `lost`, but until
    /// then it may still believe it holds the lock, so two holders can overlap for up to one
    /// extension cadence. Protect resources with fencing tokens before relying on this. The
    /// document is kept (never deleted), so fencing tokens keep increasing, and a holder's
    /// [`min_hold`](crate::LockOptions::min_hold) window stays (as after its own release): a
    /// job's window is a promise about the work, not about who holds the lease. Returns whether a
    /// holder was removed. Only a document shaped like an exclusive lock's is touched.
    ///
    /// # Errors
    /// As [`status`](Self::status).
    ///
    /// # Cancel safety
    /// Dropping the future may or may not leave the lease ended.
    pub async fn force_release(&self, name: &str) -> Result<bool> {
        let collection = self.open(&self.collection)?;
        self.within(name, admin::force_release(&collection, name))
            .await
    }

    /// Deletes the lock documents whose last lease ended more than a day ago (server time) in
    /// each of the provider's collections (exclusive, reader-writer, semaphore) and returns
    /// how many; never touches a held lock, nor a document whose fencing token may still
    /// matter (see `RELIABILITY.md`). For deployments where the TTL index cannot be created
    /// or its monitor lags.
    ///
    /// Only documents shaped like the lock documents of the kinds kept in each collection are
    /// deleted (a string `_id`, an `expiresAt` date, and only the fields those kinds write), so
    /// an application's documents never are. Before deleting anything it reads the first 100
    /// documents (by `_id`) of each collection, and refuses them all with
    /// [`Error::NotALockCollection`](crate::Error::NotALockCollection) if most of one's are not
    /// lock documents: a collection setting that names the wrong collection. Then one
    /// `delete_many` per collection. See [`purgeable`](Self::purgeable) for what it would delete.
    ///
    /// # Errors
    /// [`Error::NotALockCollection`](crate::Error::NotALockCollection), nothing deleted;
    /// otherwise as [`status`](Self::status).
    ///
    /// # Cancel safety
    /// Dropping the future may or may not leave documents deleted.
    pub async fn purge_expired(&self) -> Result<u64> {
        let collections = self.lock_collections()?;
        self.within(&self.collection.name, Self::purge(collections))
            .await
    }

    async fn purge(collections: Vec<(Collection<Document>, Vec<Stored>)>) -> Result<u64> {
        for (collection, kinds) in &collections {
            admin::check_lock_collection(collection, kinds).await?;
        }
        let mut deleted = 0;
        for (collection, kinds) in &collections {
            deleted += admin::purge_expired(collection, kinds).await?;
        }
        Ok(deleted)
    }

    /// What [`purge_expired`](Self::purge_expired) would delete now: how many lock documents,
    /// and the names of the first few of each collection (at most `names` each, by name). It
    /// refuses the same collections, and deletes nothing (for a confirmation, or a dry run).
    ///
    /// # Errors
    /// As [`purge_expired`](Self::purge_expired).
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn purgeable(&self, names: usize) -> Result<Purgeable> {
        let collections = self.lock_collections()?;
        self.within(
            &self.collection.name,
            Self::read_purgeable(collections, names),
        )
        .await
    }

    async fn read_purgeable(
        collections: Vec<(Collection<Document>, Vec<Stored>)>,
        names: usize,
    ) -> Result<Purgeable> {
        for (collection, kinds) in &collections {
            admin::check_lock_collection(collection, kinds).await?;
        }
        let mut purgeable = Purgeable::default();
        for (collection, kinds) in &collections {
            let (count, first) = admin::purgeable(collection, kinds, names).await?;
            purgeable.count += count;
            purgeable.names.extend(first);
        }
        Ok(purgeable)
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
        for (collection, _) in self.lock_collections()? {
            create_ttl_index(&collection).await?;
        }
        Ok(())
    }

    /// Checks the provider's settings without talking to the server, for an application (or
    /// tool) that wants to fail at startup: the problem every call that talks to the server
    /// would report first, if any.
    ///
    /// # Errors
    /// [`Error::InvalidCollectionName`](crate::Error::InvalidCollectionName) for a collection
    /// name MongoDB would refuse; [`Error::InvalidArgument`](crate::Error::InvalidArgument) for
    /// two kinds of lock kept in one collection.
    pub fn validate(&self) -> Result<()> {
        self.lock_collections().map(drop)
    }

    /// `call` (on lock or collection `subject`), waited for at most the provider's
    /// [`admin::patience`]: [`Error::NoReply`] after that.
    async fn within<T>(&self, subject: &str, call: impl Future<Output = Result<T>>) -> Result<T> {
        admin::within(admin::patience(&self.options), subject, call).await
    }

    /// The provider's lock collections (exclusive, reader-writer, semaphore), each once, with
    /// the kinds of lock document kept there.
    fn lock_collections(&self) -> Result<Vec<(Collection<Document>, Vec<Stored>)>> {
        let mut collections: Vec<(&str, Vec<Stored>)> = Vec::new();
        for (name, kind) in [
            (&self.collection, Stored::Exclusive),
            (&self.reader_writer_collection, Stored::ReaderWriter),
            (&self.semaphore_collection, Stored::Semaphore),
        ] {
            self.open(name)?;
            match collections
                .iter_mut()
                .find(|(known, _)| *known == name.name)
            {
                Some((_, kinds)) => kinds.push(kind),
                None => collections.push((&name.name, vec![kind])),
            }
        }
        Ok(collections
            .into_iter()
            .map(|(name, kinds)| (self.database.collection(name), kinds))
            .collect())
    }
}
