//! A counting semaphore: at most `max_count` holders at once.

use std::sync::Arc;
use std::time::Duration;

use mongodb::Database;
use mongodb::bson::{Bson, Document, doc};
use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::error::shown_name;
use crate::handoff;
use crate::lock::{LockInner, hold, new_lock_id, upsert_attempt, validate_target};
use crate::schema::{
    self, ACQUIRED_AT, DETAILS, EMBEDDED_ID, EXPIRES_AT, FENCING_TOKEN, ID, Layout,
};
use crate::status::{self, LockStatus};
use crate::{
    Error, LockDetails, LockGuard, LockOptions, MongoDistributedLock, Result, backoff, waiting,
};

/// The default collection of semaphores.
pub const DEFAULT_SEMAPHORE_COLLECTION: &str = "distributed_semaphores";

const MAX_COUNT: &str = "maxCount";
/// The array of holders' leases.
pub(crate) const HOLDERS: &str = "holders";
/// A field that lives only inside one update pipeline.
const ADMITTED: &str = "_admitted";

/// A named semaphore: at most `max_count` holders at once, each with its own lease and guard.
///
/// # Document
/// One document per name in `distributed_semaphores`:
///
/// ```text
/// { _id: <name>, maxCount: <n>, fencingToken: <last>,
///   holders: [ { id, expiresAt, acquiredAt, fencingToken, details }, ... ] }
/// ```
///
/// An attempt is one `findAndModify` (upsert) with a pipeline update that drops holders whose
/// lease ended (by server time) and appends ours if fewer than `max_count` remain, all in one
/// atomic step. Holders get a [`LockGuard`]: lease renewal, `lost`, `release` and release on drop
/// work exactly as for [`MongoDistributedLock`]; fencing tokens strictly increase across all
/// holders of the semaphore. `details` are the holder's [`LockDetails`] (by default this
/// process's host and id; see [`with_details`](Self::with_details)), shown by
/// [`holders`](Self::holders). Releases wake one waiter of the same semaphore in this process.
///
/// Every user of a name must agree on `max_count`: the first acquisition records it, and a
/// caller whose count differs gets [`Error::InvalidArgument`] naming both counts (the document
/// is left as it was). To change the count, let every holder go and delete the document.
///
/// ```no_run
/// # async fn demo(database: mongodb::Database) -> distributed_lock_mongodb::Result<()> {
/// use distributed_lock_mongodb::MongoDistributedSemaphore;
///
/// let downloads = MongoDistributedSemaphore::new("downloads", 3, &database);
/// let slot = downloads.acquire().await?; // at most 3 of these at a time, cluster-wide
/// slot.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct MongoDistributedSemaphore {
    lock: MongoDistributedLock,
    max_count: u32,
}

impl MongoDistributedSemaphore {
    /// A semaphore called `name` allowing `max_count` holders, in `database`'s
    /// `distributed_semaphores` collection, with default options. A `max_count` of 0 is
    /// reported by the first `acquire*` call ([`Error::InvalidArgument`]).
    pub fn new(name: impl Into<String>, max_count: u32, database: &Database) -> Self {
        let lock =
            MongoDistributedLock::new(name, database).with_collection(DEFAULT_SEMAPHORE_COLLECTION);
        MongoDistributedSemaphore::from_lock(lock, max_count)
    }

    /// Stores the semaphore in `collection` instead of `distributed_semaphores`.
    pub fn with_collection(mut self, collection: impl Into<String>) -> Self {
        self.lock = self.lock.with_collection(collection);
        self
    }

    /// Replaces the options.
    pub fn with_options(mut self, options: LockOptions) -> Self {
        self.lock = self.lock.with_options(options);
        self
    }

    /// Stores `details` with each holder instead of [`LockDetails::new()`] (this process's host
    /// and id).
    pub fn with_details(mut self, details: LockDetails) -> Self {
        self.lock = self.lock.with_stored_details(Some(details.to_document()));
        self
    }

    /// The current holders at one server instant; each shows its lease, fencing token and
    /// details.
    ///
    /// # Errors
    /// [`Error::Mongo`] if the read fails; [`Error::InvalidCollectionName`].
    ///
    /// # Cancel safety
    /// Cancel safe: a read only.
    pub async fn holders(&self) -> Result<Vec<LockStatus>> {
        let inner = self.lock.inner();
        validate_target(&inner.name, inner.collection.name())?;
        let this_semaphore = doc! { ID: &inner.name };
        status::semaphore_holders(&inner.collection, this_semaphore).await
    }

    /// A semaphore over `lock`'s name, collection, options and renewal loops, storing the
    /// details of this process unless `lock` has others.
    pub(crate) fn from_lock(lock: MongoDistributedLock, max_count: u32) -> Self {
        let lock = lock.with_details_by_default();
        MongoDistributedSemaphore { lock, max_count }
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// How many holders it allows at once.
    pub fn max_count(&self) -> u32 {
        self.max_count
    }

    /// Waits until one of the `max_count` places is acquired.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `max_count` of 0 or one that differs from the count the
    /// semaphore was created with; otherwise as
    /// [`MongoDistributedLock::acquire`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`MongoDistributedLock::acquire`].
    pub async fn acquire(&self) -> Result<LockGuard> {
        self.wait_for(None)
            .await?
            .ok_or(Error::BackgroundTaskEnded("acquire"))
    }

    /// Waits at most `timeout` for a place; [`Error::Timeout`] when it runs out.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), plus [`Error::Timeout`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        let started = Instant::now();
        self.wait_for(backoff::deadline_after(started, timeout))
            .await?
            .ok_or_else(|| Error::Timeout {
                operation: "acquire",
                name: self.name().to_owned(),
                waited: started.elapsed(),
            })
    }

    /// One attempt: `Ok(None)` if `max_count` holders hold it.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>> {
        self.try_acquire_timeout(Duration::ZERO).await
    }

    /// Attempts for up to `timeout`: `Ok(None)` if the semaphore stayed full.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub async fn try_acquire_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        self.wait_for(backoff::deadline_after(Instant::now(), timeout))
            .await
    }

    async fn wait_for(&self, deadline: Option<Instant>) -> Result<Option<LockGuard>> {
        let inner = self.lock.inner();
        validate_target(&inner.name, inner.collection.name())?;
        if self.max_count == 0 {
            return Err(Error::InvalidArgument(format!(
                "semaphore {:?}: max_count must be at least 1",
                shown_name(&inner.name)
            )));
        }
        let runtime = Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let layout = Layout::Members(HOLDERS.to_owned());
        let joined = waiting::retry(&inner.options, deadline, Some(&inner.waiters), || {
            let lock_id = new_lock_id();
            let cleanup = inner.cleanup(&layout, &lock_id);
            let attempt = attempt(Arc::clone(inner), self.max_count, runtime.clone(), lock_id);
            waiting::spawned_attempt(&runtime, deadline, &inner.options, cleanup, attempt)
        })
        .await?;
        Ok(joined.map(|(guard, places_left)| {
            // Several places can free up at once (holders that expired or were released by
            // another process): the next local waiter tries at once instead of after its sleep.
            if places_left {
                handoff::wake_first(&inner.waiters);
            }
            guard
        }))
    }
}

/// One attempt: join the holders if fewer than `max_count` hold a live lease, in one
/// `findAndModify` (upsert) whose pipeline drops ended leases first. On success, also whether
/// places are left after ours.
async fn attempt(
    lock: Arc<LockInner>,
    max_count: u32,
    runtime: Handle,
    lock_id: String,
) -> Result<Option<(LockGuard, bool)>> {
    let sent_at = Instant::now();
    let update = join_update(&lock, max_count, &lock_id);
    let document = upsert_attempt(&lock, update).await?;
    let stored_count = document.get(MAX_COUNT).and_then(schema::read_i64);
    if stored_count != Some(i64::from(max_count)) {
        let stored = document
            .get(MAX_COUNT)
            .map_or_else(|| "none".to_owned(), ToString::to_string);
        return Err(Error::InvalidArgument(format!(
            "semaphore {:?} was created with max_count {stored}; this caller uses {max_count}",
            shown_name(&lock.name)
        )));
    }
    let holders: Vec<&Document> = document
        .get_array(HOLDERS)
        .map(|holders| holders.iter().filter_map(Bson::as_document).collect())
        .unwrap_or_default();
    let ours = holders
        .iter()
        .find(|holder| holder.get_str(EMBEDDED_ID) == Ok(lock_id.as_str()));
    match ours {
        Some(holder) => {
            let token = holder.get(FENCING_TOKEN).and_then(schema::read_i64);
            let id = lock.name.as_str().into();
            let layout = Layout::Members(HOLDERS.to_owned());
            let places_left = holders.len() < usize::try_from(max_count).unwrap_or(usize::MAX);
            let guard = hold(&lock, &runtime, &layout, id, lock_id, sent_at, token)?;
            Ok(guard.map(|guard| (guard, places_left)))
        }
        None => Ok(None),
    }
}

/// The pipeline of an attempt: drop ended leases; record `max_count` on first use; if the stored
/// count is ours and a place is free, take the next fencing token and append our lease.
fn join_update(lock: &LockInner, max_count: u32, lock_id: &str) -> Vec<Document> {
    let max_count = i64::from(max_count);
    let admitted = format!("${ADMITTED}");
    let mut lease = doc! {
        EMBEDDED_ID: lock_id,
        EXPIRES_AT: schema::lease_end(lock.options.expiry_millis()),
        ACQUIRED_AT: "$$NOW",
        FENCING_TOKEN: format!("${FENCING_TOKEN}"),
    };
    if let Some(details) = &lock.details {
        lease.insert(DETAILS, schema::literal(details));
    }
    vec![
        doc! { "$set": {
            HOLDERS: schema::live_members(HOLDERS, None),
            MAX_COUNT: { "$ifNull": [format!("${MAX_COUNT}"), max_count] },
        } },
        doc! { "$set": { ADMITTED: { "$and": [
            { "$eq": [format!("${MAX_COUNT}"), max_count] },
            { "$lt": [{ "$size": format!("${HOLDERS}") }, max_count] },
        ] } } },
        doc! { "$set": { FENCING_TOKEN: { "$cond": [
            &admitted,
            schema::next_fencing_token(FENCING_TOKEN),
            format!("${FENCING_TOKEN}"),
        ] } } },
        doc! { "$set": { HOLDERS: { "$cond": [
            &admitted,
            { "$concatArrays": [format!("${HOLDERS}"), [lease]] },
            format!("${HOLDERS}"),
        ] } } },
        doc! { "$unset": ADMITTED },
    ]
}
