//! The reader-writer lock: any number of readers, or one writer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::clock;
use mongodb::Database;
use mongodb::bson::{Bson, Document, doc};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use crate::LockKind;
use crate::error::shown_name;
use crate::lease::acquire::{self, Acquisition, Attempt, Granted, ReadHolders, Takeover, Wait};
use crate::lease::held::{self, HeldLease};
use crate::lease::hub::RenewalHub;
use crate::lease::schema::new_lock_id;
use crate::lease::schema::{
    ACQUIRED_AT, DETAILS, EMBEDDED_ID, EXPIRES_AT, FENCING_TOKEN, ID, Layout, READERS, RENEWED_AT,
    WAITING_WRITER, WRITER, lease_end, literal, live_members, member_ids, next_fencing_token,
    retain,
};
use crate::lease::{Problem, Target, admin};
use crate::token::read_i64;
use crate::{
    Error, FencingToken, LockDetails, LockGuard, LockOptions, LockStatus, LockWatch, LostSignal,
    Result,
};
use futures::future::BoxFuture;

/// The default collection of reader-writer locks.
pub const DEFAULT_RW_COLLECTION: &str = "distributed_rw_locks";

/// A field that lives only inside one update pipeline.
const WRITE_IS_FREE: &str = "_writeIsFree";

/// A named reader-writer lock: any number of readers at once, or exactly one writer.
///
/// # Document
/// One document per name in `distributed_rw_locks`:
///
/// ```text
/// { _id: <name>,
///   readers: [ { id, expiresAt, acquiredAt, renewedAt, details }, ... ],
///   writer: { id, expiresAt, acquiredAt, renewedAt, fencingToken, details },
///   waitingWriter: { id, expiresAt },
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
enum Mode {
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
    /// server ([`Error::InvalidCollectionName`]).
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

    /// Shares `renewals` (a provider's).
    pub(crate) fn with_renewals(
        mut self,
        renewals: &Arc<RenewalHub>,
        refusal: Option<Problem>,
    ) -> Self {
        Arc::make_mut(&mut self.target).share_renewals(renewals, refusal);
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
        wait.required(self.read_within(wait).await, self.name(), self)
            .await
    }

    /// Waits at most `timeout` for a read lock; [`Error::Timeout`] when it runs out.
    ///
    /// # Errors
    /// As [`MongoDistributedLock::acquire_timeout`](crate::MongoDistributedLock::acquire_timeout).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`MongoDistributedLock::acquire`](crate::MongoDistributedLock::acquire).
    pub async fn acquire_read_timeout(&self, timeout: Duration) -> Result<ReadGuard> {
        let wait = Wait::at_most(timeout);
        wait.required(self.read_within(wait).await, self.name(), self)
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
        self.read_within(Wait::at_most(timeout)).await
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

    /// Waits at most `timeout` for the write lock; [`Error::Timeout`] when it runs out (the
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

    /// Acquires a read lock (waiting as [`acquire_read`](Self::acquire_read) does), runs `work`
    /// while it is held ([`ReadGuard::run_while_held`]) and releases it: `work`'s output, or
    /// [`Error::LockLost`] if the read lock was lost first.
    ///
    /// # Errors
    /// As [`acquire_read`](Self::acquire_read); [`Error::LockLost`] if the lock was lost before `work`
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
    /// or [`Error::LockLost`] if the write lock was lost first.
    ///
    /// # Errors
    /// As [`acquire_write`](Self::acquire_write); [`Error::LockLost`] if the lock was lost before `work`
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
    /// [`Error::Mongo`] if the read fails; [`Error::InvalidCollectionName`].
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
    /// As [`holders`](Self::holders) for the first read; [`Error::InvalidArgument`] for a zero
    /// `every`; [`Error::NoRuntime`] outside a Tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel safe: a read, then a task of the returned watch.
    pub async fn watch(&self, every: Duration) -> Result<LockWatch> {
        LockWatch::start(self.clone(), every, Some(self.target.push_from())).await
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

    /// Read attempts until one joins the readers or the wait runs out.
    async fn read_within(&self, wait: Wait) -> Result<Option<ReadGuard>> {
        let target = &self.target;
        let read = |runtime: &Handle, lock_id: String| {
            let update = read_update(target, &lock_id);
            let attempt = attempt(
                Arc::clone(target),
                runtime.clone(),
                Mode::Read,
                lock_id.clone(),
                update,
            );
            Attempt {
                cleanup: target.cleanup(&layout(Mode::Read), &lock_id),
                work: async move {
                    let won = attempt.await?;
                    Ok(won.map(|(lease, _)| ReadGuard { lease }))
                },
            }
        };
        let takeovers = |runtime: &Handle, lock_id: String| {
            read_takeover(Arc::clone(target), runtime.clone(), lock_id)
        };
        acquire::acquire(self.acquisition(Mode::Read), wait, read, Some(&takeovers)).await
    }

    /// Write attempts until one takes the lock or the wait runs out. While it waits, the
    /// writer's marker holds new readers back; it is removed when the wait ends without the
    /// lock (or its future is dropped).
    async fn write_within(&self, wait: Wait) -> Result<Option<LockGuard>> {
        let target = &self.target;
        let Ok(runtime) = Handle::try_current() else {
            return Err(Error::NoRuntime);
        };
        let marker = WaitingWriter {
            target: Arc::clone(target),
            runtime,
            id: new_lock_id(),
            placed: AtomicBool::new(false),
        };
        let write = |runtime: &Handle, lock_id: String| {
            // Only a writer with time left to wait holds readers back.
            let waits = !wait.is_over();
            if waits {
                marker.placed.store(true, Ordering::Relaxed);
            }
            let update = write_update(target, &lock_id, &marker.id, waits);
            let attempt = attempt(
                Arc::clone(target),
                runtime.clone(),
                Mode::Write,
                lock_id.clone(),
                update,
            );
            Attempt {
                cleanup: target.cleanup(&layout(Mode::Write), &lock_id),
                work: async move {
                    let won = attempt.await?;
                    Ok(won.map(|(lease, token)| LockGuard::new(lease, token)))
                },
            }
        };
        let result = acquire::acquire(self.acquisition(Mode::Write), wait, write, None).await;
        match &result {
            // The winning update removed the marker.
            Ok(Some(_)) => marker.placed.store(false, Ordering::Relaxed),
            // The wait ran out: readers may go on as soon as this returns.
            Ok(None) => {
                if let Some(removal) = marker.remove() {
                    let _ = removal.await;
                }
            }
            // Dropping the marker removes it in the background.
            Err(_) => {}
        }
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
            family: &target.renewals,
            push: Some(&target.collection),
            holders: self,
        }
    }
}

impl ReadHolders for MongoDistributedReaderWriterLock {
    fn read_holders(&self) -> BoxFuture<'_, Result<Vec<LockStatus>>> {
        Box::pin(self.holders())
    }
}

/// One attempt with `update` on the lock's document: `Ok(None)` if the lock is not available.
/// The lease goes to `lock_id`, which the update was built with; a writer's comes with its
/// fencing token.
async fn attempt(
    target: Arc<Target>,
    runtime: Handle,
    mode: Mode,
    lock_id: String,
    update: Vec<Document>,
) -> Result<Option<(HeldLease, FencingToken)>> {
    let sent_at = clock::now();
    let document = target.upsert(update).await?;
    let Some(token) = won(&document, mode, &lock_id) else {
        return Ok(None);
    };
    let Some(lease) = target.hold(&runtime, mode.kind(), &layout(mode), lock_id, sent_at) else {
        return Ok(None);
    };
    match (mode, token) {
        (Mode::Read, _) => Ok(Some((lease, FencingToken::new(0)))),
        (Mode::Write, Some(token)) => Ok(Some((lease, FencingToken::new(token)))),
        // Cannot happen on a conforming server; dropping the lease releases it.
        (Mode::Write, None) => Err(Error::UnexpectedReply(
            "the acquired writer lease has no numeric fencingToken".to_owned(),
        )),
    }
}

/// Joining the readers in the release command of a local writer (see `lease::handoff`), with
/// the readers waiting behind this one: the writer's lease ends, and the same pipeline as a read
/// attempt admits this reader (unless another writer waits: writers are not starved).
fn read_takeover(target: Arc<Target>, runtime: Handle, lock_id: String) -> Takeover<ReadGuard> {
    let join = read_update(&target, &lock_id);
    Takeover {
        layout: layout(Mode::Read),
        update: Box::new(move |releasing| {
            let mut update = vec![end_writer(releasing)];
            update.extend(join.iter().cloned());
            update
        }),
        cleanup: target.cleanup(&layout(Mode::Read), &lock_id),
        finish: Box::new(move |document, sent_at| {
            if !holds_read(&document, &lock_id) {
                return Ok(None);
            }
            let lease = target.hold(
                &runtime,
                Mode::Read.kind(),
                &layout(Mode::Read),
                lock_id,
                sent_at,
            );
            Ok(lease.map(|lease| ReadGuard { lease }))
        }),
    }
}

/// Ends the writer's lease `releasing`, if it is still the writer's, keeping only its fencing
/// token (as [`drop_expired`] does with a writer whose lease ended).
fn end_writer(releasing: &str) -> Document {
    let token_only = doc! { FENCING_TOKEN: format!("${WRITER}.{FENCING_TOKEN}") };
    doc! { "$set": { WRITER: { "$cond": [
        { "$eq": [format!("${WRITER}.{EMBEDDED_ID}"), releasing] },
        token_only,
        format!("${WRITER}"),
    ] } } }
}

/// Where a reader's or the writer's lease lives in the document.
fn layout(mode: Mode) -> Layout {
    match mode {
        Mode::Read => Layout::Members(READERS.to_owned()),
        Mode::Write => Layout::Writer,
    }
}

/// Whether the document returned by an attempt holds our lease `lock_id`, and if so with which
/// fencing token (readers have none).
fn won(document: &Document, mode: Mode, lock_id: &str) -> Option<Option<i64>> {
    match mode {
        Mode::Read => holds_read(document, lock_id).then_some(None),
        Mode::Write => {
            let writer = document.get_document(WRITER).ok()?;
            (writer.get_str(EMBEDDED_ID) == Ok(lock_id))
                .then(|| writer.get(FENCING_TOKEN).and_then(read_i64))
        }
    }
}

fn holds_read(document: &Document, lock_id: &str) -> bool {
    document.get_array(READERS).is_ok_and(|readers| {
        readers.iter().any(|reader| {
            reader
                .as_document()
                .is_some_and(|reader| reader.get_str(EMBEDDED_ID) == Ok(lock_id))
        })
    })
}

/// The lease of a new holder: `{id, expiresAt, acquiredAt, renewedAt, details}` (an
/// expression).
fn new_lease(lock: &Target, lock_id: &str) -> Document {
    let mut lease = doc! {
        EMBEDDED_ID: lock_id,
        EXPIRES_AT: lease_end(lock.options.expiry_millis()),
        ACQUIRED_AT: "$$NOW",
        RENEWED_AT: "$$NOW",
    };
    if let Some(details) = &lock.details {
        lease.insert(DETAILS, literal(details));
    }
    lease
}

/// The first stage of every attempt: forget readers whose lease ended, a waiting-writer marker
/// whose lease ended, and a writer whose lease ended (keeping only its fencing token).
///
/// Clearing the ended writer matters when clocks differ: a reader joining through a router whose
/// clock is ahead sees the writer's lease over, while the writer's renewal through a router
/// that is behind would still find it live. With the writer's id gone, that renewal matches
/// nothing, so an ended writer never comes back to life beside a live reader.
fn drop_expired() -> Document {
    let writer_live = doc! { "$gt": [format!("${WRITER}.{EXPIRES_AT}"), "$$NOW"] };
    let token_only = doc! { FENCING_TOKEN: format!("${WRITER}.{FENCING_TOKEN}") };
    doc! { "$set": {
        READERS: live_members(READERS, None),
        WAITING_WRITER: { "$cond": [
            { "$gt": [format!("${WAITING_WRITER}.{EXPIRES_AT}"), "$$NOW"] },
            format!("${WAITING_WRITER}"),
            "$$REMOVE",
        ] },
        WRITER: { "$cond": [writer_live, format!("${WRITER}"), token_only] },
    } }
}

/// A read attempt: join the readers unless a writer holds the lock or waits for it (a missing or
/// ended lease compares below `$$NOW`), or this reader is among them already (a transfer sent
/// again after it applied).
fn read_update(lock: &Target, lock_id: &str) -> Vec<Document> {
    let may_read = doc! { "$and": [
        { "$lte": [format!("${WRITER}.{EXPIRES_AT}"), "$$NOW"] },
        { "$lte": [format!("${WAITING_WRITER}.{EXPIRES_AT}"), "$$NOW"] },
        { "$eq": [{ "$in": [lock_id, member_ids(READERS)] }, false] },
    ] };
    let join = doc! { "$concatArrays": [format!("${READERS}"), [new_lease(lock, lock_id)]] };
    vec![
        drop_expired(),
        doc! { "$set": { READERS: { "$cond": [may_read, join, format!("${READERS}")] } } },
        retain(lock.options.expiry_millis()),
    ]
}

/// A write attempt `lock_id` of the waiting writer `marker_id`: take the lock if no live reader,
/// no live writer and no other writer's live marker is there, with the next fencing token,
/// removing the marker; otherwise, if `waits`, place or renew our marker (unless another
/// writer's is live).
fn write_update(lock: &Target, lock_id: &str, marker_id: &str, waits: bool) -> Vec<Document> {
    let marker_is_ours_or_absent = doc! {
        "$eq": [{ "$ifNull": [format!("${WAITING_WRITER}.{EMBEDDED_ID}"), marker_id] }, marker_id]
    };
    let free = doc! { "$and": [
        { "$lte": [format!("${WRITER}.{EXPIRES_AT}"), "$$NOW"] },
        { "$eq": [{ "$size": format!("${READERS}") }, 0] },
        marker_is_ours_or_absent.clone(),
    ] };
    let mut writer = new_lease(lock, lock_id);
    writer.insert(
        FENCING_TOKEN,
        next_fencing_token(&format!("{WRITER}.{FENCING_TOKEN}")),
    );
    let keep_marker: Bson = format!("${WAITING_WRITER}").into();
    let marker_when_busy: Bson = if waits {
        let ours = doc! {
            EMBEDDED_ID: marker_id,
            EXPIRES_AT: lease_end(marker_lease_millis(&lock.options)),
        };
        doc! { "$cond": [marker_is_ours_or_absent, ours, keep_marker] }.into()
    } else {
        keep_marker
    };
    let is_free = format!("${WRITE_IS_FREE}");
    vec![
        drop_expired(),
        doc! { "$set": { WRITE_IS_FREE: free } },
        doc! { "$set": {
            WRITER: { "$cond": [&is_free, writer, format!("${WRITER}")] },
            WAITING_WRITER: { "$cond": [&is_free, "$$REMOVE", marker_when_busy] },
        } },
        doc! { "$unset": WRITE_IS_FREE },
        retain(
            lock.options
                .expiry_millis()
                .max(marker_lease_millis(&lock.options)),
        ),
    ]
}

/// The waiting-writer marker's lease: longer than the longest sleep between two attempts.
fn marker_lease_millis(options: &LockOptions) -> i64 {
    let lease = options.busy_wait_sleep_time().1 * 2 + Duration::from_secs(1);
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX)
}

/// A waiting writer's marker, removed when the wait ends without the lock (also on drop).
struct WaitingWriter {
    target: Arc<Target>,
    runtime: Handle,
    id: String,
    /// Whether an attempt may have placed the marker.
    placed: AtomicBool,
}

impl WaitingWriter {
    /// Starts removing the marker, if one may have been placed; once.
    fn remove(&self) -> Option<JoinHandle<()>> {
        if !self.placed.swap(false, Ordering::Relaxed) {
            return None;
        }
        let collection = self.target.collection.clone();
        let filter =
            doc! { ID: &self.target.name, format!("{WAITING_WRITER}.{EMBEDDED_ID}"): &self.id };
        let write_concern = self.target.options.write_concern().clone();
        let name = self.target.name.clone();
        Some(self.runtime.spawn(async move {
            let removed = collection
                .update_one(filter, doc! { "$unset": { WAITING_WRITER: "" } })
                .write_concern(write_concern)
                .await;
            if let Err(error) = removed {
                tracing::warn!(
                    lock = %shown_name(&name),
                    %error,
                    "could not remove the waiting-writer marker; it ends with its lease"
                );
            }
        }))
    }
}

impl Drop for WaitingWriter {
    fn drop(&mut self) {
        let _ = self.remove();
    }
}

/// Proof that a read lock is held; returned by the `acquire_read*` methods of
/// [`MongoDistributedReaderWriterLock`].
///
/// Behaves like [`LockGuard`]: the lease is renewed while the guard lives, [`lost`](Self::lost)
/// turns `true` before the lease can end on the server, [`release`](Self::release) ends it, and
/// dropping the guard releases it in the background. Readers have no fencing token: they share
/// the lock, so there is no order among them to enforce.
#[must_use = "dropping the guard releases the read lock at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct ReadGuard {
    lease: HeldLease,
}

impl ReadGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.lease.name()
    }

    /// A signal that turns true when the read lock is known or presumed lost; see
    /// [`LockGuard::lost`].
    pub fn lost(&self) -> LostSignal {
        self.lease.lost()
    }

    /// Whether the read lock is known or presumed lost.
    pub fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// Runs `work` until it completes or the read lock is lost, whichever comes first; see
    /// [`LockGuard::run_while_held`].
    ///
    /// # Cancel safety
    /// Cancel safe: dropping this future drops `work`; the guard stays held.
    pub async fn run_while_held<F: Future>(&self, work: F) -> Result<F::Output> {
        self.lease.run_while_held(work).await
    }

    /// Runs `work` in a multi-document transaction on `client` that commits only while this
    /// read lock is held; see [`LockGuard::transaction`](crate::LockGuard::transaction).
    ///
    /// # Errors
    /// As [`LockGuard::transaction`](crate::LockGuard::transaction).
    ///
    /// # Cancel safety
    /// As [`LockGuard::transaction`](crate::LockGuard::transaction).
    pub async fn transaction<R>(
        &self,
        client: &mongodb::Client,
        work: impl AsyncFnMut(&mut mongodb::ClientSession) -> mongodb::error::Result<R>,
    ) -> Result<R> {
        self.lease.transaction(client, work).await
    }

    /// The lease, for a guard that holds several (a composite).
    pub(crate) fn into_lease(self) -> HeldLease {
        self.lease
    }

    /// Stops renewing and releases the read lock: one update that removes this reader, and no
    /// other, from the document.
    ///
    /// # Errors
    /// As [`LockGuard::release`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`LockGuard::release`].
    pub async fn release(self) -> Result<()> {
        self.lease.release().await
    }
}

crate::traits::impl_distributed_reader_writer_lock!(MongoDistributedReaderWriterLock);

impl crate::traits::DistributedReadGuard for ReadGuard {
    fn name(&self) -> &str {
        ReadGuard::name(self)
    }

    fn lost(&self) -> LostSignal {
        ReadGuard::lost(self)
    }

    fn is_lost(&self) -> bool {
        ReadGuard::is_lost(self)
    }

    fn release(self: Box<Self>) -> BoxFuture<'static, Result<()>> {
        Box::pin(ReadGuard::release(*self))
    }
}

impl Granted for ReadGuard {
    fn fencing_token(&self) -> Option<FencingToken> {
        None
    }

    /// Readers share the lock: the next local waiter tries at once (if it is a writer, it
    /// fails unless this reader has gone already, and goes back to waiting).
    fn leaves_room(&self) -> bool {
        true
    }

    fn undelivered(self) {
        self.lease.undelivered();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_outlives_the_longest_sleep_between_attempts() {
        let options = LockOptions::default();
        let longest_sleep = options.busy_wait_sleep_time().1;
        let lease = Duration::from_millis(u64::try_from(marker_lease_millis(&options)).unwrap());
        assert!(lease >= longest_sleep * 2, "{lease:?}");
        assert_eq!(lease, Duration::from_millis(2_600));
    }

    #[test]
    fn readers_are_found_by_lock_id_only() {
        let document = doc! { READERS: [{ EMBEDDED_ID: "a" }, 5, { "other": "b" }] };
        assert!(holds_read(&document, "a"));
        assert!(!holds_read(&document, "b"));
        assert!(!holds_read(&doc! { READERS: "a" }, "a"));
    }
}
