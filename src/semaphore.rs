//! A counting semaphore: at most `max_count` holders at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::TryStreamExt;
use mongodb::Database;
use mongodb::bson::{Bson, Document, doc};
use mongodb::options::ReturnDocument;
use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::error::is_duplicate_key;
use crate::lock::{LockInner, hold, validate_collection_name};
use crate::schema::{self, ACQUIRED_AT, DETAILS, EXPIRES_AT, FENCING_TOKEN, ID, LOCK_ID, Layout};
use crate::status::{self, LockKind, LockStatus};
use crate::{
    Error, LockDetails, LockGuard, LockOptions, MongoDistributedLock, Result, backoff, waiting,
};

/// The default collection of semaphores.
pub const DEFAULT_SEMAPHORE_COLLECTION: &str = "distributed_semaphores";

const MAX_COUNT: &str = "maxCount";
/// The semaphore's name inside a slot's `_id`.
pub(crate) const SEMAPHORE: &str = "semaphore";

/// A named semaphore: at most `max_count` holders at once, each with its own lease and guard.
///
/// Each of the `max_count` slots is a lock document of its own,
/// `{_id: {semaphore: <name>, slot: <i>}, maxCount, lockId, expiresAt, acquiredAt, fencingToken,
/// details}`, created on first use. `details` are the holder's [`LockDetails`] (by default this
/// process's host and id; see [`with_details`](Self::with_details)), shown by
/// [`holders`](Self::holders). An attempt is one `findAndModify` that takes any free slot (missing or
/// expired lease, by server time). Holders get a [`LockGuard`]: lease renewal, `lost`, `release`
/// and release on drop work exactly as for [`MongoDistributedLock`]; its fencing token orders the
/// acquisitions of that slot. Releases wake one waiter of the same semaphore in this process.
///
/// Every user of a name must agree on `max_count`: a caller whose count differs from the one
/// the slots were created with gets [`Error::InvalidArgument`] naming both counts.
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
    /// Set once the slots were seen to exist with our count: later failed attempts cost nothing
    /// more than their `findAndModify`.
    slots_ready: Arc<AtomicBool>,
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

    /// Stores the slots in `collection` instead of `distributed_semaphores`.
    pub fn with_collection(mut self, collection: impl Into<String>) -> Self {
        self.lock = self.lock.with_collection(collection);
        self.slots_ready = Arc::default();
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

    /// The current holders, one per taken slot, at one server instant; each shows its lease,
    /// fencing token and details.
    ///
    /// # Errors
    /// [`Error::Mongo`] if the read fails; [`Error::InvalidCollectionName`].
    ///
    /// # Cancel safety
    /// Cancel safe: a read only.
    pub async fn holders(&self) -> Result<Vec<LockStatus>> {
        let inner = self.lock.inner();
        validate_collection_name(inner.collection.name())?;
        let this_semaphore = doc! { format!("{ID}.{SEMAPHORE}"): &inner.name };
        status::held(&inner.collection, LockKind::Semaphore, this_semaphore).await
    }

    /// A semaphore over `lock`'s name, collection, options and renewal loops, storing the
    /// details of this process unless `lock` has others.
    pub(crate) fn from_lock(lock: MongoDistributedLock, max_count: u32) -> Self {
        let lock = if lock.inner().details.is_some() {
            lock
        } else {
            lock.with_stored_details(Some(LockDetails::new().to_document()))
        };
        MongoDistributedSemaphore {
            lock,
            max_count,
            slots_ready: Arc::default(),
        }
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// How many holders it allows at once.
    pub fn max_count(&self) -> u32 {
        self.max_count
    }

    /// Waits until a slot is acquired.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `max_count` of 0 or one that differs from the count the
    /// semaphore's slots were created with; otherwise as
    /// [`MongoDistributedLock::acquire`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`MongoDistributedLock::acquire`].
    pub async fn acquire(&self) -> Result<LockGuard> {
        self.wait_for(None)
            .await?
            .ok_or(Error::BackgroundTaskEnded("acquire"))
    }

    /// Waits at most `timeout` for a slot; [`Error::Timeout`] when it runs out.
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

    /// One attempt: `Ok(None)` if every slot is taken.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>> {
        self.try_acquire_timeout(Duration::ZERO).await
    }

    /// Attempts for up to `timeout`: `Ok(None)` if every slot stayed taken.
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
        validate_collection_name(inner.collection.name())?;
        if self.max_count == 0 {
            return Err(Error::InvalidArgument(format!(
                "semaphore {:?}: max_count must be at least 1",
                crate::error::shown_name(&inner.name)
            )));
        }
        let runtime = Handle::try_current().map_err(|_| Error::NoRuntime)?;
        waiting::retry(&inner.options, deadline, Some(&inner.waiters), || {
            let attempt = attempt(
                Arc::clone(inner),
                self.max_count,
                Arc::clone(&self.slots_ready),
                runtime.clone(),
            );
            waiting::spawned_attempt(&runtime, deadline, &inner.options, &inner.name, attempt)
        })
        .await
    }
}

fn slot_id(name: &str, slot: u32) -> Bson {
    Bson::Document(doc! { SEMAPHORE: name, "slot": i64::from(slot) })
}

/// One attempt: take any free slot; on the first failure, make sure the slots exist.
async fn attempt(
    lock: Arc<LockInner>,
    max_count: u32,
    slots_ready: Arc<AtomicBool>,
    runtime: Handle,
) -> Result<Option<LockGuard>> {
    if let Some(guard) = take_slot(&lock, max_count, &runtime).await? {
        return Ok(Some(guard));
    }
    if slots_ready.load(Ordering::Relaxed) {
        return Ok(None);
    }
    ensure_slots(&lock, max_count).await?;
    slots_ready.store(true, Ordering::Relaxed);
    take_slot(&lock, max_count, &runtime).await
}

async fn take_slot(
    lock: &Arc<LockInner>,
    max_count: u32,
    runtime: &Handle,
) -> Result<Option<LockGuard>> {
    let slots: Vec<Bson> = (0..max_count)
        .map(|slot| slot_id(&lock.name, slot))
        .collect();
    let free = doc! { "$lte": [{ "$ifNull": [format!("${EXPIRES_AT}"), Bson::Null] }, "$$NOW"] };
    let lock_id = uuid::Uuid::new_v4().simple().to_string();
    let mut take = doc! {
        LOCK_ID: &lock_id,
        EXPIRES_AT: schema::lease_end(lock.options.expiry_millis()),
        ACQUIRED_AT: "$$NOW",
        FENCING_TOKEN: schema::next_fencing_token(FENCING_TOKEN),
    };
    if let Some(details) = &lock.details {
        take.insert(DETAILS, schema::literal(details));
    }
    let sent_at = Instant::now();
    let taken = lock
        .collection
        .find_one_and_update(
            doc! { ID: { "$in": slots }, MAX_COUNT: i64::from(max_count), "$expr": free },
            vec![doc! { "$set": take }],
        )
        .return_document(ReturnDocument::After)
        .write_concern(lock.options.write_concern().clone())
        .await?;
    let Some(document) = taken else {
        return Ok(None);
    };
    let id = document.get(ID).cloned().unwrap_or(Bson::Null);
    let token = document.get(FENCING_TOKEN).and_then(schema::read_i64);
    hold(
        lock,
        runtime,
        &Layout::LockDocument,
        id,
        lock_id,
        sent_at,
        token,
    )
}

/// Creates the missing slots (each insert races harmlessly with other callers' on `_id`) and
/// checks that existing ones agree on the count.
async fn ensure_slots(lock: &Arc<LockInner>, max_count: u32) -> Result<()> {
    let existing: Vec<Document> = lock
        .collection
        .find(doc! { format!("{ID}.{SEMAPHORE}"): &lock.name })
        .projection(doc! { MAX_COUNT: 1 })
        .await?
        .try_collect()
        .await?;
    if let Some(other) = existing
        .iter()
        .filter_map(|slot| slot.get(MAX_COUNT).and_then(schema::read_i64))
        .find(|count| *count != i64::from(max_count))
    {
        return Err(Error::InvalidArgument(format!(
            "semaphore {:?} was created with max_count {other}; this caller uses {max_count}",
            crate::error::shown_name(&lock.name)
        )));
    }
    for slot in 0..max_count {
        let created = lock
            .collection
            .insert_one(doc! { ID: slot_id(&lock.name, slot), MAX_COUNT: i64::from(max_count) })
            .write_concern(lock.options.write_concern().clone())
            .await;
        match created {
            Ok(_) => {}
            Err(error) if is_duplicate_key(&error) => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}
