//! The reader-writer lock: any number of readers, or one writer.

use std::sync::Arc;
use std::time::Duration;

use mongodb::Database;
use mongodb::bson::doc;

use crate::details::LockDetails;
use crate::error::Result;
use crate::guard::LockGuard;
use crate::lease::acquire::{self, Acquisition, ReadHolders, Wait};
use crate::lease::family::Family;
use crate::lease::held::{self};
use crate::lease::schema::{ID, LINE, WAITING_WRITER};
use crate::lease::waiting_marker::WaitingMarker;
use crate::lease::{Problem, Target, admin};
use crate::lock_status::{LockKind, LockStatus};
use crate::options::LockOptions;
use crate::watch::{Changes, LockWatch};
use futures::future::BoxFuture;

pub(crate) mod attempt;
mod read_guard;
mod upgradeable_guard;

use attempt::{Reading, Writing};
pub use read_guard::ReadGuard;
pub use upgradeable_guard::UpgradeableReadGuard;

/// The default collection of reader-writer locks.
pub const DEFAULT_RW_COLLECTION: &str = "distributed_rw_locks";

/// A named reader-writer lock: any number of readers at once, or exactly one writer.
///
/// # Document
/// One document per name in `distributed_rw_locks`:
///
/// ```text
/// { _id: <name>,
///   readers: [ { id, expiresAt, acquiredAt, renewedAt, details, upgradeable }, ... ],
///   writer: { id, expiresAt, acquiredAt, renewedAt, fencingToken, details },
///   waitingWriter: { id, expiresAt },
///   line: [ { id, expiresAt }, ... ], servedWait,   // fair locks only
///   expiresAt }
/// ```
///
/// Every acquisition attempt, read or write, is one `findAndModify` with a pipeline update
/// (upsert): it drops expired readers and an expired waiting-writer marker, then adds us if the
/// lock allows it, all in one atomic step on the server. A lease that has ended (by server time)
/// is ignored, so a crashed holder blocks others for at most `expiry`. The top-level
/// `expiresAt`, never earlier than any lease inside, lets the TTL index (or
/// [`Provider::purge_expired`](crate::Provider::purge_expired)) delete a document a day after
/// its last lease ended, when its writer's fencing token no longer matters.
///
/// # Writer preference
/// A writer that has to wait leaves a *waiting-writer marker* with a short lease of its own
/// (twice the longest busy-wait sleep plus one second: 2.6 s with the default options), which
/// each of its attempts renews. While a live marker is present, new readers wait; readers that
/// hold the lock keep it until they release it, then the writer gets in. So a steady stream of
/// readers cannot starve writers. The marker is removed by the attempt that acquires the lock,
/// and when the wait ends otherwise (timeout, error, or the future is dropped: a drop guard
/// removes it in the background). A writer that vanishes without removing it (a crash, or a
/// dropped wait whose last attempt reached the server after the removal) blocks new readers for
/// at most the marker's lease. One writer at a time holds the marker; other waiting
/// writers compete as usual once it is gone.
///
/// # Fair order
/// With [`fair(true)`](crate::LockOptionsBuilder::fair), writers of every process are served
/// in the order they came: each writer's wait keeps a place in the document's `line` instead of
/// the marker (see [`MongoDistributedLock`](crate::MongoDistributedLock)'s fair order), only the
/// first live place may take the lock, and any live place holds new readers back as the marker
/// does. Readers are not in line: a reader that waits comes in once no writer waits. An
/// upgrade passes the line (the writers in it wait for its reader) and keeps the marker.
///
/// # Upgradeable reads
/// One reader at a time may hold the lock *upgradeable* (`upgradeable: true` in its lease;
/// [`acquire_upgradeable_read`](Self::acquire_upgradeable_read)): it reads beside plain readers,
/// and since it is a reader no writer gets in while it holds. Its
/// [`upgrade`](UpgradeableReadGuard::upgrade) is a writer's acquisition that wins when its own read
/// lease is the only live reader's and no writer's is live, whatever writer waits (that writer
/// waits for this very reader; its marker stays, holding new readers back): so nothing is written between
/// its read and its write. The write lease comes beside the read lease, with the next fencing
/// token; [`downgrade`](UpgradeableReadGuard::downgrade) releases it and keeps the read lease.
/// While the upgrade waits, its waiting-writer marker holds new readers back; a wait that ends
/// (timeout, drop, or the read lease lost) removes it. The upgradeable read and the upgrade poll
/// at the busy-wait pace, outside the line of this process's waiters: the waiters wait for what
/// the upgrading reader holds, and plain readers must not queue behind an upgradeable one, which
/// waits for what they need not.
///
/// # Guards
/// Readers get a [`ReadGuard`], the writer a [`LockGuard`] whose fencing token is larger than
/// that of every earlier writer of the same name. Both renew their lease, signal `lost`, and
/// release on `release()` or drop, exactly like the guards of
/// [`MongoDistributedLock`](crate::MongoDistributedLock). A writer's release never touches readers and vice versa: each
/// release is filtered on the holder's own lock id.
///
/// Waiting readers and writers of one lock in one process queue together: only the first polls
/// the server, and a release wakes the first waiter, with every reader in a row behind it, so
/// readers waiting behind a writer all get in right after its release.
///
/// ```no_run
/// # async fn demo(database: mongodb::Database) -> distributed_lock_mongodb::Result<()> {
/// use distributed_lock_mongodb::MongoDistributedReaderWriterLock;
///
/// let config = MongoDistributedReaderWriterLock::new("config", &database);
/// let reading = config.acquire_read().await?; // any number of readers at once
/// reading.release().await?;
/// let writing = config.acquire_write().await?; // alone: no readers, no other writer
/// println!("writing with fencing token {}", writing.fencing_token());
/// writing.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct MongoDistributedReaderWriterLock {
    target: Arc<Target>,
}

/// Read or write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Read,
    Write,
}

impl Mode {
    /// The kind, as the tracing span and the metrics show it.
    fn kind(self) -> LockKind {
        match self {
            Mode::Read => LockKind::Read,
            Mode::Write => LockKind::Write,
        }
    }
}

impl MongoDistributedReaderWriterLock {
    /// A reader-writer lock called `name` in `database`'s `distributed_rw_locks` collection, with
    /// default options, storing this process's [`LockDetails`] with each holder.
    pub fn new(name: impl Into<String>, database: &Database) -> Self {
        let mut target = Target::new(name.into(), database, DEFAULT_RW_COLLECTION);
        target.details = Some(LockDetails::new().to_document());
        MongoDistributedReaderWriterLock {
            target: Arc::new(target),
        }
    }

    /// Stores the lock in `collection` instead of `distributed_rw_locks`. Defaults to
    /// `distributed_rw_locks`. An invalid name is reported by the first call that talks to the
    /// server ([`Error::InvalidCollectionName`](crate::Error::InvalidCollectionName)).
    #[must_use]
    pub fn with_collection(mut self, collection: impl Into<String>) -> Self {
        Arc::make_mut(&mut self.target).set_collection(&collection.into());
        self
    }

    /// Replaces the options. Defaults to [`LockOptions::default`].
    #[must_use]
    pub fn with_options(mut self, options: LockOptions) -> Self {
        Arc::make_mut(&mut self.target).options = options;
        self
    }

    /// Stores `details` with each holder. Defaults to [`LockDetails::new()`] (this process's
    /// host and id).
    #[must_use]
    pub fn with_details(mut self, details: LockDetails) -> Self {
        Arc::make_mut(&mut self.target).details = Some(details.to_document());
        self
    }

    /// Joins `family` (a provider's).
    pub(crate) fn in_family(mut self, family: &Arc<Family>, refusal: Option<Problem>) -> Self {
        Arc::make_mut(&mut self.target).join_family(family, refusal);
        self
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.target.name
    }

    /// The lock's options.
    pub fn options(&self) -> &LockOptions {
        &self.target.options
    }

    /// Waits until a read lock is acquired: when no writer holds the lock and none waits.
    ///
    /// # Errors
    /// As [`MongoDistributedLock::acquire`](crate::MongoDistributedLock::acquire).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`MongoDistributedLock::acquire`](crate::MongoDistributedLock::acquire).
    pub async fn acquire_read(&self) -> Result<ReadGuard> {
        let wait = Wait::forever();
        wait.required(self.read_within(wait, false).await, self.name(), self)
            .await
    }

    /// Waits at most `timeout` for a read lock; [`Error::Timeout`](crate::Error::Timeout) when it runs out.
    ///
    /// # Errors
    /// As [`MongoDistributedLock::acquire_timeout`](crate::MongoDistributedLock::acquire_timeout).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`MongoDistributedLock::acquire`](crate::MongoDistributedLock::acquire).
    pub async fn acquire_read_timeout(&self, timeout: Duration) -> Result<ReadGuard> {
        let wait = Wait::at_most(timeout);
        wait.required(self.read_within(wait, false).await, self.name(), self)
            .await
    }

    /// One attempt at a read lock; `Ok(None)` if a writer holds the lock or waits for it.
    ///
    /// # Errors
    /// As [`MongoDistributedLock::try_acquire`](crate::MongoDistributedLock::try_acquire).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`MongoDistributedLock::acquire`](crate::MongoDistributedLock::acquire).
    pub async fn try_acquire_read(&self) -> Result<Option<ReadGuard>> {
        self.try_acquire_read_timeout(Duration::ZERO).await
    }

    /// Attempts at a read lock for up to `timeout`; `Ok(None)` if it stayed unavailable.
    ///
    /// # Errors
    /// As [`MongoDistributedLock::try_acquire_timeout`](crate::MongoDistributedLock::try_acquire_timeout).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`MongoDistributedLock::acquire`](crate::MongoDistributedLock::acquire).
    pub async fn try_acquire_read_timeout(&self, timeout: Duration) -> Result<Option<ReadGuard>> {
        self.read_within(Wait::at_most(timeout), false).await
    }

    /// Waits until the write lock is acquired: when no reader and no other writer holds it.
    /// While it waits, new readers are held back (see the type's docs).
    ///
    /// # Errors
    /// As [`MongoDistributedLock::acquire`](crate::MongoDistributedLock::acquire).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`MongoDistributedLock::acquire`](crate::MongoDistributedLock::acquire); a dropped wait also removes its
    /// waiting-writer marker in the background.
    pub async fn acquire_write(&self) -> Result<LockGuard> {
        let wait = Wait::forever();
        wait.required(self.write_within(wait).await, self.name(), self)
            .await
    }

    /// Waits at most `timeout` for the write lock; [`Error::Timeout`](crate::Error::Timeout) when it runs out (the
    /// waiting-writer marker is removed before this returns).
    ///
    /// # Errors
    /// As [`MongoDistributedLock::acquire_timeout`](crate::MongoDistributedLock::acquire_timeout).
    ///
    /// # Cancel safety
    /// As [`acquire_write`](Self::acquire_write).
    pub async fn acquire_write_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        let wait = Wait::at_most(timeout);
        wait.required(self.write_within(wait).await, self.name(), self)
            .await
    }

    /// One attempt at the write lock; `Ok(None)` if it is held (by readers or a writer). A single
    /// attempt leaves no waiting-writer marker.
    ///
    /// # Errors
    /// As [`MongoDistributedLock::try_acquire`](crate::MongoDistributedLock::try_acquire).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`MongoDistributedLock::acquire`](crate::MongoDistributedLock::acquire).
    pub async fn try_acquire_write(&self) -> Result<Option<LockGuard>> {
        self.try_acquire_write_timeout(Duration::ZERO).await
    }

    /// Attempts at the write lock for up to `timeout`; `Ok(None)` if it stayed unavailable.
    ///
    /// # Errors
    /// As [`MongoDistributedLock::try_acquire_timeout`](crate::MongoDistributedLock::try_acquire_timeout).
    ///
    /// # Cancel safety
    /// As [`acquire_write`](Self::acquire_write).
    pub async fn try_acquire_write_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        self.write_within(Wait::at_most(timeout)).await
    }

    /// Waits until the upgradeable read lock is acquired: when no writer holds the lock or
    /// waits for it, and no other reader holds it upgradeable. It reads beside plain readers
    /// and keeps writers out until it [upgrades](UpgradeableReadGuard::upgrade) (see
    /// [`UpgradeableReadGuard`]).
    ///
    /// # Errors
    /// As [`acquire_read`](Self::acquire_read).
    ///
    /// # Cancel safety
    /// As [`acquire_read`](Self::acquire_read).
    pub async fn acquire_upgradeable_read(&self) -> Result<UpgradeableReadGuard> {
        let wait = Wait::forever();
        let read = self.read_within(wait, true).await;
        let read = wait.required(read, self.name(), self).await?;
        Ok(UpgradeableReadGuard::new(read, self.clone()))
    }

    /// Waits at most `timeout` for the upgradeable read lock;
    /// [`Error::Timeout`](crate::Error::Timeout) when it runs out.
    ///
    /// # Errors
    /// As [`acquire_read_timeout`](Self::acquire_read_timeout).
    ///
    /// # Cancel safety
    /// As [`acquire_read`](Self::acquire_read).
    pub async fn acquire_upgradeable_read_timeout(
        &self,
        timeout: Duration,
    ) -> Result<UpgradeableReadGuard> {
        let wait = Wait::at_most(timeout);
        let read = self.read_within(wait, true).await;
        let read = wait.required(read, self.name(), self).await?;
        Ok(UpgradeableReadGuard::new(read, self.clone()))
    }

    /// One attempt at the upgradeable read lock; `Ok(None)` if a writer holds the lock or waits
    /// for it, or another reader holds it upgradeable.
    ///
    /// # Errors
    /// As [`try_acquire_read`](Self::try_acquire_read).
    ///
    /// # Cancel safety
    /// As [`acquire_read`](Self::acquire_read).
    pub async fn try_acquire_upgradeable_read(&self) -> Result<Option<UpgradeableReadGuard>> {
        self.try_acquire_upgradeable_read_timeout(Duration::ZERO)
            .await
    }

    /// Attempts at the upgradeable read lock for up to `timeout`; `Ok(None)` if it stayed
    /// unavailable.
    ///
    /// # Errors
    /// As [`try_acquire_read_timeout`](Self::try_acquire_read_timeout).
    ///
    /// # Cancel safety
    /// As [`acquire_read`](Self::acquire_read).
    pub async fn try_acquire_upgradeable_read_timeout(
        &self,
        timeout: Duration,
    ) -> Result<Option<UpgradeableReadGuard>> {
        let read = self.read_within(Wait::at_most(timeout), true).await?;
        Ok(read.map(|read| UpgradeableReadGuard::new(read, self.clone())))
    }

    /// Acquires a read lock (waiting as [`acquire_read`](Self::acquire_read) does), runs `work`
    /// while it is held ([`ReadGuard::run_while_held`]) and releases it: `work`'s output, or
    /// [`Error::LockLost`](crate::Error::LockLost) if the read lock was lost first.
    ///
    /// # Errors
    /// As [`acquire_read`](Self::acquire_read); [`Error::LockLost`](crate::Error::LockLost) if the lock was lost before `work`
    /// completed (`work` is dropped then). A release that fails after `work` completed is
    /// logged, not returned: the work ran while the lock was held, and the lease ends by itself
    /// at its expiry at the latest.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping this future drops `work` and the guard, which releases the lock in
    /// the background.
    pub async fn acquire_read_and_run<T>(
        &self,
        work: impl AsyncFnOnce(&ReadGuard) -> T,
    ) -> Result<T> {
        let read = self.acquire_read().await?;
        let output = read.run_while_held(work(&read)).await;
        held::after_release(self.name(), output, read.release().await)
    }

    /// Acquires the write lock (waiting as [`acquire_write`](Self::acquire_write) does), runs
    /// `work` while it is held ([`LockGuard::run_while_held`]) and releases it: `work`'s output,
    /// or [`Error::LockLost`](crate::Error::LockLost) if the write lock was lost first.
    ///
    /// # Errors
    /// As [`acquire_write`](Self::acquire_write); [`Error::LockLost`](crate::Error::LockLost) if the lock was lost before `work`
    /// completed (`work` is dropped then). A release that fails after `work` completed is
    /// logged, not returned: the work ran while the lock was held, and the lease ends by itself
    /// at its expiry at the latest.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping this future drops `work` and the guard, which releases the lock in
    /// the background.
    pub async fn acquire_write_and_run<T>(
        &self,
        work: impl AsyncFnOnce(&LockGuard) -> T,
    ) -> Result<T> {
        let write = self.acquire_write().await?;
        let output = write.run_while_held(work(&write)).await;
        held::after_release(self.name(), output, write.release().await)
    }

    /// The current holders (the writer, or the readers) at one server instant, each with its
    /// lease and details; empty when the lock is free.
    ///
    /// # Errors
    /// [`Error::Mongo`](crate::Error::Mongo) if the read fails; [`Error::InvalidCollectionName`](crate::Error::InvalidCollectionName).
    ///
    /// # Cancel safety
    /// Cancel safe: a read only.
    pub async fn holders(&self) -> Result<Vec<LockStatus>> {
        let target = &self.target;
        target.check()?;
        admin::reader_writer_holders(&target.collection, doc! { ID: &target.name }).await
    }

    /// Watches who holds it, without holding it: read now, then every `every`, and at once
    /// whenever its change stream (on a replica set or sharded cluster) shows a change; see
    /// [`LockWatch`].
    ///
    /// # Errors
    /// As [`holders`](Self::holders) for the first read; [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a zero
    /// `every`; [`Error::NoRuntime`](crate::Error::NoRuntime) outside a Tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel safe: a read, then a task of the returned watch.
    pub async fn watch(&self, every: Duration) -> Result<LockWatch> {
        LockWatch::start(
            self.clone(),
            every,
            Some(Changes::Stream(self.target.push_from())),
        )
        .await
    }

    /// **Dangerous**: ends every lease of this lock now (the writer's, every reader's, and a
    /// waiting writer's marker), whoever holds them, so a lock stuck by hung holders can be
    /// taken. The holders are not asked: each learns it at its next renewal and signals `lost`,
    /// so a forced-out holder may still believe it holds the lock for up to one extension
    /// cadence; protect resources with fencing tokens first. The document and the writer's
    /// fencing token stay, so tokens keep increasing. Returns whether any lease was live. To end
    /// one holder's lease only, use
    /// [`Provider::force_release_holder`](crate::Provider::force_release_holder) with an entry
    /// of [`holders`](Self::holders).
    ///
    /// # Errors
    /// As [`holders`](Self::holders).
    ///
    /// # Cancel safety
    /// Dropping the future may or may not leave the leases ended.
    pub async fn force_release_all(&self) -> Result<bool> {
        let target = &self.target;
        target.check()?;
        admin::force_release_reader_writer(&target.collection, &target.name).await
    }

    /// Read attempts (of the `upgradeable` reader, or a plain one) until one joins the readers
    /// or the wait runs out.
    ///
    /// An upgradeable reader waits outside the line of this process's waiters, polling at the
    /// busy-wait pace: it waits for what plain readers need not (no other upgradeable reader),
    /// and a plain reader queued behind it would wait for that too.
    async fn read_within(&self, wait: Wait, upgradeable: bool) -> Result<Option<ReadGuard>> {
        let reading = Arc::new(Reading {
            target: Arc::clone(&self.target),
            upgradeable,
        });
        let mut acquisition = self.acquisition(Mode::Read);
        if upgradeable {
            acquisition.waiters = None;
            acquisition.push = None;
        }
        acquire::acquire(acquisition, wait, reading).await
    }

    /// Write attempts until one takes the lock or the wait runs out. While it waits, the
    /// writer's marker holds new readers back; it is removed when the wait ends without the
    /// lock (or its future is dropped).
    async fn write_within(&self, wait: Wait) -> Result<Option<LockGuard>> {
        // A fair lock's writer waits in its line: its place holds new readers back.
        let field = match self.target.options.fair() {
            true => LINE,
            false => WAITING_WRITER,
        };
        let marker = WaitingMarker::new(&self.target, field)?;
        let writing = Arc::new(Writing {
            marker: Arc::clone(&marker),
            wait,
            upgrading: None,
        });
        let result = acquire::acquire(self.acquisition(Mode::Write), wait, writing).await;
        marker.end(&result).await;
        result
    }

    /// Upgrade attempts of the upgradeable reader `reader` (its lock id) until one takes the
    /// write lease or the wait runs out; its marker as a waiting writer's. The upgrade stays out
    /// of the line of local waiters: they wait for what its reader holds, and a line whose
    /// first waiter cannot win until it wins would stand still.
    pub(super) async fn upgrade_within(
        &self,
        reader: &str,
        wait: Wait,
    ) -> Result<Option<LockGuard>> {
        let marker = WaitingMarker::new(&self.target, WAITING_WRITER)?;
        let upgrading = Arc::new(Writing {
            marker: Arc::clone(&marker),
            wait,
            upgrading: Some(reader.to_owned()),
        });
        let mut acquisition = self.acquisition(Mode::Write);
        acquisition.waiters = None;
        acquisition.push = None;
        let result = acquire::acquire(acquisition, wait, upgrading).await;
        marker.end(&result).await;
        result
    }

    fn acquisition(&self, mode: Mode) -> Acquisition<'_> {
        let target = &self.target;
        Acquisition {
            kind: mode.kind(),
            name: &target.name,
            collection: target.collection.name(),
            options: &target.options,
            checked: target.check().and_then(|()| {
                target
                    .options
                    .check_min_hold_unsupported("reader-writer lock")
            }),
            // Readers and writers queue together: a writer's release wakes every reader in a
            // row, and while a writer holds the lock here the queue polls slowly.
            waiters: Some(&target.waiters),
            shared: mode == Mode::Read,
            // A waiting writer's attempts renew its marker: every waiting writer polls.
            renews_while_waiting: mode == Mode::Write,
            family: &target.family,
            push: Some(&target.collection),
            places: None,
            holders: self,
        }
    }
}

impl ReadHolders for MongoDistributedReaderWriterLock {
    fn read_holders(&self) -> BoxFuture<'_, Result<Vec<LockStatus>>> {
        Box::pin(self.holders())
    }
}

crate::traits::impl_distributed_reader_writer_lock!(MongoDistributedReaderWriterLock);
