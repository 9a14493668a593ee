//! Locks embedded in your own documents.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use mongodb::Collection;
use mongodb::bson::{Bson, Document, doc};
use mongodb::options::ReadConcern;
use mongodb::results::UpdateResult;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::runtime::Handle;
use tokio::time::{Instant, timeout_at};

use crate::LockKind;
use crate::clock;
use crate::error::{Operation, is_duplicate_id};
use crate::fencing::check_operators;
use crate::lease::acquire::{self, Acquisition, Attempt, Granted, ReadHolders, Wait};
use crate::lease::held::{self, HeldLease};
use crate::lease::hub::RenewalHub;
use crate::lease::schema::{
    EMBEDDED_ID, EXPIRES_AT, FENCING_TOKEN, Layout, lease_end, next_fencing_token, primary,
};
use crate::lease::{Problem, Target, admin};
use crate::token::read_i64;
use crate::{Error, FencingToken, LockOptions, LockStatus, LockWatch, LostSignal, Result};
use futures::future::BoxFuture;

/// The default field that holds the embedded lock.
pub const DEFAULT_LOCK_FIELD: &str = "lock";

/// A lock embedded in the documents of one of your collections: lock a business document itself,
/// work on it, and write its new state and unlock it in one update.
///
/// The lock lives under one field of the document (default `lock`):
/// `{lock: {id, expiresAt, fencingToken}}`. Taking it is one `findAndModify` that matches only
/// documents whose lock is missing or expired (by server time) and returns the locked document.
/// While the [`DocumentGuard`] lives the lease is renewed and `lost` is signalled exactly as for
/// [`MongoDistributedLock`](crate::MongoDistributedLock). [`DocumentGuard::commit`] and
/// [`DocumentGuard::replace`] write the new state and clear the lock in one update filtered on
/// this holder's lock id and a live lease, so nobody without the lock can commit. Clearing keeps
/// the fencing token in the document, so tokens keep increasing.
///
/// The lock field is reserved: updates through a guard may not touch it, and documents whose lock
/// field holds something else are treated as unlocked (and the field is overwritten when locked).
/// Other fields, and documents that never had a lock field, are left as they are. `T` must
/// tolerate the extra field when deserializing (serde ignores unknown fields unless told not to).
///
/// ```no_run
/// # #[derive(serde::Serialize, serde::Deserialize)]
/// # struct Job { payload: String }
/// # async fn demo(jobs: mongodb::Collection<Job>) -> distributed_lock_mongodb::Result<()> {
/// use distributed_lock_mongodb::DocumentLock;
/// use mongodb::bson::doc;
///
/// let locks = DocumentLock::new(&jobs);
/// // Claim any pending job nobody holds, process it, mark it done and unlock it atomically.
/// if let Some(job) = locks.try_lock(doc! { "status": "pending" }).await? {
///     println!("processing {}", job.document().payload);
///     job.commit(doc! { "$set": { "status": "done" } }).await?;
/// }
/// # Ok(())
/// # }
/// ```
pub struct DocumentLock<T> {
    target: Arc<Documents>,
    _documents: PhantomData<fn() -> T>,
}

/// The documents a caller waits to lock: their holders explain a wait.
#[derive(Debug)]
struct Matching {
    target: Arc<Documents>,
    filter: Document,
}

impl ReadHolders for Matching {
    fn read_holders(&self) -> BoxFuture<'_, Result<Vec<LockStatus>>> {
        Box::pin(async {
            let target = &self.target;
            target.check()?;
            admin::document_holders(&target.lock.collection, self.filter.clone(), &target.field)
                .await
        })
    }
}

/// What a document lock and its guards share.
/// The document locks of one collection: the engine's target for them, and where in each
/// document the lock lives.
#[derive(Clone, Debug)]
struct Documents {
    lock: Target,
    field: String,
    layout: Layout,
    /// An unusable field name, found when it was set.
    field_problem: Option<Problem>,
}

impl Documents {
    /// The first problem of the collection or the field name, as an error.
    fn check(&self) -> Result<()> {
        self.lock.check()?;
        Problem::check(self.field_problem.as_ref())
    }
}

impl<T> Clone for DocumentLock<T> {
    fn clone(&self) -> Self {
        DocumentLock {
            target: Arc::clone(&self.target),
            _documents: PhantomData,
        }
    }
}

impl<T> fmt::Debug for DocumentLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DocumentLock")
            .field("collection", &self.target.lock.collection.namespace())
            .field("field", &self.target.field)
            .field("options", &self.target.lock.options)
            .finish()
    }
}

impl<T> DocumentLock<T>
where
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// Locks documents of `collection` under the field `lock`, with default options.
    pub fn new(collection: &Collection<T>) -> Self {
        DocumentLock {
            target: Arc::new(Documents {
                lock: Target::of_documents(&collection.clone_with_type()),
                field: DEFAULT_LOCK_FIELD.to_owned(),
                layout: Layout::Embedded(DEFAULT_LOCK_FIELD.to_owned()),
                field_problem: None,
            }),
            _documents: PhantomData,
        }
        .rebuilt(|_| {})
    }

    /// Keeps the lock under `field` instead of `lock`. Defaults to `lock`. A name MongoDB cannot
    /// use as a plain field (empty, with `.` or `$`, or `_id`) is reported by the first locking
    /// call.
    #[must_use]
    pub fn with_field(self, field: impl Into<String>) -> Self {
        let field = field.into();
        self.rebuilt(|target| {
            target.layout = Layout::Embedded(field.clone());
            target.field = field;
        })
    }

    /// Replaces the options (expiry, cadence, busy-wait, write concern). Defaults to
    /// [`LockOptions::default`].
    #[must_use]
    pub fn with_options(self, options: LockOptions) -> Self {
        self.rebuilt(|target| target.lock.options = options)
    }

    /// Shares `renewals` (a provider's).
    pub(crate) fn with_renewals(self, renewals: &Arc<RenewalHub>) -> Self {
        self.rebuilt(|target| target.lock.share_renewals(renewals, None))
    }

    fn rebuilt(self, change: impl FnOnce(&mut Documents)) -> Self {
        let mut target = Documents::clone(&self.target);
        change(&mut target);
        target.field_problem = field_problem(&target.field);
        DocumentLock {
            target: Arc::new(target),
            _documents: PhantomData,
        }
    }

    /// The name of the collection whose documents it locks.
    pub fn name(&self) -> &str {
        self.target.lock.collection.name()
    }

    /// The field that holds the lock.
    pub fn field(&self) -> &str {
        &self.target.field
    }

    /// The lock's options.
    pub fn options(&self) -> &LockOptions {
        &self.target.lock.options
    }

    /// Waits until a document matching `filter` is locked, and returns it. With several matching
    /// documents, whichever unlocked one the server finds first is locked (claim-a-job style).
    ///
    /// # Errors
    /// - [`Error::DocumentNotFound`] when no document matches `filter` at all (checked after each
    ///   attempt that found nothing unlocked; locked documents are waited for).
    /// - [`Error::InvalidArgument`] for an unusable lock field, [`Error::InvalidCollectionName`]
    ///   for an unusable collection, before anything is sent.
    /// - [`Error::UnexpectedReply`] if the locked document does not deserialize into `T` (the
    ///   lock is released at once).
    /// - As [`MongoDistributedLock::acquire`](crate::MongoDistributedLock::acquire) otherwise.
    ///
    /// # Cancel safety
    /// Cancel safe: attempts run to completion in spawned tasks, and a document locked after
    /// this future was dropped is unlocked at once.
    pub async fn lock(&self, filter: Document) -> Result<DocumentGuard<T>> {
        let wait = Wait::forever();
        let outcome = self.lock_within(filter.clone(), wait, None).await;
        wait.required(outcome, self.name(), &self.matching(filter))
            .await
    }

    /// Like [`lock`](Self::lock), giving up after `timeout` with [`Error::Timeout`].
    ///
    /// # Errors
    /// As [`lock`](Self::lock), plus [`Error::Timeout`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn lock_timeout(
        &self,
        filter: Document,
        timeout: Duration,
    ) -> Result<DocumentGuard<T>> {
        let wait = Wait::at_most(timeout);
        let outcome = self.lock_within(filter.clone(), wait, None).await;
        wait.required(outcome, self.name(), &self.matching(filter))
            .await
    }

    /// Who holds the documents matching `filter` locked now, read at one server instant: one
    /// entry per locked document (kind [`LockKind::Document`](crate::LockKind::Document), named
    /// `collection/_id`), with its lock id, lease and fencing token.
    ///
    /// # Errors
    /// [`Error::Mongo`] if the read fails; [`Error::InvalidArgument`],
    /// [`Error::InvalidCollectionName`] as for [`lock`](Self::lock).
    ///
    /// # Cancel safety
    /// Cancel safe: a read only.
    pub async fn holders(&self, filter: Document) -> Result<Vec<LockStatus>> {
        self.matching(filter).read_holders().await
    }

    /// Watches who holds the documents matching `filter` locked, without locking them: read
    /// now, then every `every` (document locks have no change stream); see [`LockWatch`].
    ///
    /// # Errors
    /// As [`holders`](Self::holders) for the first read; [`Error::InvalidArgument`] for a zero
    /// `every`; [`Error::NoRuntime`] outside a Tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel safe: a read, then a task of the returned watch.
    pub async fn watch(&self, filter: Document, every: Duration) -> Result<LockWatch> {
        LockWatch::start(self.matching(filter), every, None).await
    }

    /// The documents of `filter`, as a lock whose holders can be read.
    fn matching(&self, filter: Document) -> Matching {
        Matching {
            target: Arc::clone(&self.target),
            filter,
        }
    }

    /// One attempt: `Ok(None)` if every matching document is locked by someone else.
    ///
    /// # Errors
    /// As [`lock`](Self::lock).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock(&self, filter: Document) -> Result<Option<DocumentGuard<T>>> {
        self.try_lock_timeout(filter, Duration::ZERO).await
    }

    /// Attempts for up to `timeout`: `Ok(None)` if the matching documents stayed locked.
    ///
    /// # Errors
    /// As [`lock`](Self::lock).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock_timeout(
        &self,
        filter: Document,
        timeout: Duration,
    ) -> Result<Option<DocumentGuard<T>>> {
        self.lock_within(filter, Wait::at_most(timeout), None).await
    }

    /// Locks a document matching `filter` (waiting as [`lock`](Self::lock) does), runs `work`
    /// while it is locked ([`DocumentGuard::run_while_held`]) and unlocks it without changing
    /// it: `work`'s output, or [`Error::LockLost`] if the lock was lost first. To write the
    /// document as it is unlocked, use [`lock`](Self::lock) and [`DocumentGuard::commit`].
    ///
    /// # Errors
    /// As [`lock`](Self::lock); [`Error::LockLost`] if the lock was lost before `work`
    /// completed (`work` is dropped then). A release that fails after `work` completed is
    /// logged, not returned: the work ran while the lock was held, and the lease ends by itself
    /// at its expiry at the latest.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping this future drops `work` and the guard, which releases the lock in
    /// the background.
    pub async fn lock_and_run<R>(
        &self,
        filter: Document,
        work: impl AsyncFnOnce(&DocumentGuard<T>) -> R,
    ) -> Result<R> {
        let guard = self.lock(filter).await?;
        let output = guard.run_while_held(work(&guard)).await;
        held::after_release(self.name(), output, guard.release().await)
    }

    /// Locks the document with `_id` `id`, inserting `new_document` (unlocked, with that `_id`)
    /// first if it does not exist. Concurrent callers never create two documents: the `_id` is
    /// unique, and a caller whose insert hits a duplicate key simply waits for the lock.
    ///
    /// # Errors
    /// As [`lock`](Self::lock) (never [`Error::DocumentNotFound`]); [`Error::InvalidArgument`]
    /// if `new_document` does not serialize to a document, or carries another `_id` or the lock
    /// field.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock). The document may have been inserted.
    pub async fn lock_or_insert(
        &self,
        id: impl Into<Bson>,
        new_document: T,
    ) -> Result<DocumentGuard<T>> {
        let id = id.into();
        let mut insert = to_document(&new_document)?;
        match insert.get("_id") {
            None => {
                insert.insert("_id", id.clone());
            }
            Some(existing) if *existing == id => {}
            Some(_) => {
                return Err(Error::InvalidArgument(
                    "lock_or_insert: new_document has an _id different from id".to_owned(),
                ));
            }
        }
        if insert.contains_key(&self.target.field) {
            return Err(Error::InvalidArgument(format!(
                "lock_or_insert: new_document must not carry the lock field {:?}",
                self.target.field
            )));
        }
        let wait = Wait::forever();
        let filter = doc! { "_id": id };
        let outcome = self.lock_within(filter.clone(), wait, Some(insert)).await;
        wait.required(outcome, self.name(), &self.matching(filter))
            .await
    }

    async fn lock_within(
        &self,
        filter: Document,
        wait: Wait,
        insert: Option<Document>,
    ) -> Result<Option<DocumentGuard<T>>> {
        let target = &self.target;
        let matching = self.matching(filter.clone());
        let what = Acquisition {
            kind: LockKind::Document,
            name: target.lock.collection.name(),
            collection: target.lock.collection.name(),
            options: &target.lock.options,
            checked: target.check().and_then(|()| {
                target
                    .lock
                    .options
                    .check_min_hold_unsupported("document lock")
            }),
            waiters: None,
            shared: false,
            renews_while_waiting: false,
            family: &target.lock.renewals,
            push: None,
            holders: &matching,
        };
        acquire::acquire(
            what,
            wait,
            |runtime, lock_id| Attempt {
                cleanup: target.lock.embedded_cleanup(&target.layout, &lock_id),
                work: attempt::<T>(
                    Arc::clone(target),
                    filter.clone(),
                    insert.clone(),
                    runtime.clone(),
                    lock_id,
                ),
            },
            None,
        )
        .await
    }
}

/// One attempt: lock an unlocked matching document (inserting it first if asked and missing).
async fn attempt<T>(
    target: Arc<Documents>,
    filter: Document,
    insert: Option<Document>,
    runtime: Handle,
    lock_id: String,
) -> Result<Option<DocumentGuard<T>>>
where
    T: DeserializeOwned + Send + Sync + 'static,
{
    if let Some(guard) = lock_unlocked_match::<T>(&target, &filter, &runtime, &lock_id).await? {
        return Ok(Some(guard));
    }
    let write_concern = target.lock.options.write_concern().clone();
    match insert {
        Some(new_document) => {
            match target
                .lock
                .collection
                .insert_one(new_document)
                .write_concern(write_concern)
                .await
            {
                // Inserted unlocked: lock it now (someone may beat us to it; then we wait).
                Ok(_) => lock_unlocked_match::<T>(&target, &filter, &runtime, &lock_id).await,
                // It exists: locked by someone else (or they just inserted it). Only a
                // duplicate `_id` means that; another unique index refusing the document would
                // refuse it forever.
                Err(error) if is_duplicate_id(&error) => Ok(None),
                Err(error) => Err(error.into()),
            }
        }
        None => {
            let exists = target
                .lock
                .collection
                .find_one(filter)
                .projection(doc! { "_id": 1 })
                .selection_criteria(primary())
                .read_concern(ReadConcern::local())
                .await?
                .is_some();
            if exists {
                Ok(None)
            } else {
                Err(Error::DocumentNotFound {
                    collection: target.lock.collection.name().to_owned(),
                })
            }
        }
    }
}

/// The `findAndModify` that locks one unlocked document matching `filter`.
async fn lock_unlocked_match<T>(
    target: &Arc<Documents>,
    filter: &Document,
    runtime: &Handle,
    lock_id: &str,
) -> Result<Option<DocumentGuard<T>>>
where
    T: DeserializeOwned + Send + Sync + 'static,
{
    let field = &target.field;
    let lock_id = lock_id.to_owned();
    let expires_at = format!("${field}.{EXPIRES_AT}");
    let unlocked =
        doc! { "$expr": { "$lte": [{ "$ifNull": [&expires_at, Bson::Null] }, "$$NOW"] } };
    let update = vec![doc! { "$set": { field.as_str(): {
        EMBEDDED_ID: &lock_id,
        EXPIRES_AT: lease_end(target.lock.options.expiry_millis()),
        FENCING_TOKEN: next_fencing_token(&format!("{field}.{FENCING_TOKEN}")),
    } } }];
    let sent_at = clock::now();
    let filter = doc! { "$and": [filter.clone(), unlocked] };
    let locked = target.lock.lock_one(filter, update).await?;
    let Some(document) = locked else {
        return Ok(None);
    };
    let id = document.get("_id").cloned().unwrap_or(Bson::Null);
    let token = document
        .get_document(field)
        .ok()
        .and_then(|lock| lock.get(FENCING_TOKEN))
        .and_then(read_i64);
    let lease = target
        .lock
        .hold_embedded(runtime, &target.layout, id.clone(), lock_id, sent_at);
    // Cannot happen on a conforming server (the update wrote the token); dropping the lease
    // unlocks at once, as for the other kinds.
    let Some(token) = token else {
        return Err(Error::UnexpectedReply(format!(
            "the locked document has no numeric fencing token in {field}.{FENCING_TOKEN}"
        )));
    };
    let document = match mongodb::bson::from_document::<T>(document) {
        Ok(document) => document,
        // Dropping the lease unlocks at once: we cannot hand out what we cannot read.
        Err(error) => {
            return Err(Error::UnexpectedReply(format!(
                "the locked document does not deserialize: {error}"
            )));
        }
    };
    // `None`: the reply came too late to trust the lease (dropping it unlocked).
    Ok(lease.map(|lease| DocumentGuard {
        document,
        id,
        fencing_token: FencingToken::new(token),
        lease,
        target: Arc::clone(target),
    }))
}

/// A locked document: gives access to it, keeps its lease renewed, signals `lost`, and ends with
/// [`commit`](Self::commit), [`replace`](Self::replace) or [`release`](Self::release). Dropping
/// it unlocks the document in the background, without changing data.
#[must_use = "dropping the guard unlocks the document at once"]
#[clippy::has_significant_drop]
pub struct DocumentGuard<T> {
    document: T,
    id: Bson,
    fencing_token: FencingToken,
    lease: HeldLease,
    target: Arc<Documents>,
}

impl<T> fmt::Debug for DocumentGuard<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DocumentGuard")
            .field("id", &self.id)
            .field("fencing_token", &self.fencing_token)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

impl<T> DocumentGuard<T> {
    /// The locked document, as it was when it was locked.
    pub fn document(&self) -> &T {
        &self.document
    }

    /// The locked document's `_id`.
    pub fn id(&self) -> &Bson {
        &self.id
    }

    /// This lock's fencing token: larger than that of every earlier lock of the same document.
    pub fn fencing_token(&self) -> FencingToken {
        self.fencing_token
    }

    /// A signal that turns true when the lock is known or presumed lost (see
    /// [`LockGuard::lost`](crate::LockGuard::lost)).
    pub fn lost(&self) -> LostSignal {
        self.lease.lost()
    }

    /// Whether the lock is known or presumed lost.
    pub fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// Runs `work` until it completes or the lock is lost, whichever comes first; see
    /// [`LockGuard::run_while_held`](crate::LockGuard::run_while_held).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping this future drops `work`; the guard stays held.
    pub async fn run_while_held<F: Future>(&self, work: F) -> Result<F::Output> {
        self.lease.run_while_held(work).await
    }

    /// Runs `work` in a multi-document transaction on `client` that commits only while this
    /// document lock is held; see [`LockGuard::transaction`](crate::LockGuard::transaction).
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

    /// Applies `update` (update operators such as `$set`, `$inc`, `$push`) and unlocks the
    /// document, in one update filtered on this holder's lock id and a live lease. The fencing
    /// token stays in the document.
    ///
    /// # Errors
    /// - [`Error::LockLost`] if the lock was lost: nothing is written.
    /// - [`Error::InvalidArgument`] if `update` is not made of update operators or touches the
    ///   lock field (nothing is written; the document is unlocked).
    /// - [`Error::Mongo`] / [`Error::Timeout`] if the update failed or got no reply within
    ///   `expiry`; the document is then unlocked in the background (or its lease expires).
    ///
    /// # Cancel safety
    /// Not cancel safe in the sense that dropping this future may or may not leave the update
    /// applied; the lock itself is released either way (by the update or in the background).
    pub async fn commit(self, update: Document) -> Result<()> {
        let field = &self.target.field;
        let mut update = update;
        if let Err(error) = check_operators(&update, field) {
            return Err(self.unlock_after(error));
        }
        let unset = doc! {
            format!("{field}.{EMBEDDED_ID}"): "",
            format!("{field}.{EXPIRES_AT}"): "",
        };
        match update.get_document_mut("$unset") {
            Ok(existing) => existing.extend(unset),
            Err(_) => {
                update.insert("$unset", unset);
            }
        }
        self.finish(Ending::Update(update)).await
    }

    /// Applies `update` (update operators such as `$set`, `$inc`, `$push`) and keeps the
    /// document locked: progress written by the holder, in one update filtered on this
    /// holder's lock id and a live lease.
    ///
    /// ```no_run
    /// # async fn demo(job: distributed_lock_mongodb::DocumentGuard<mongodb::bson::Document>) -> distributed_lock_mongodb::Result<()> {
    /// use mongodb::bson::doc;
    ///
    /// job.checkpoint(doc! { "$set": { "progress": 50 } }).await?;
    /// // ... the rest of the work ...
    /// job.commit(doc! { "$set": { "status": "done", "progress": 100 } }).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// - [`Error::LockLost`] if the lock was lost: nothing is written.
    /// - [`Error::InvalidArgument`] if `update` is not made of update operators or touches the
    ///   lock field (nothing is written; the document stays locked).
    /// - [`Error::Mongo`] / [`Error::Timeout`] if the update failed or got no reply within
    ///   `expiry`; the document stays locked.
    ///
    /// # Cancel safety
    /// Dropping this future may or may not leave the update applied; the lock stays held.
    pub async fn checkpoint(&self, update: Document) -> Result<()> {
        check_operators(&update, &self.target.field)?;
        let lost = || Error::LockLost {
            name: self.lease.name().to_owned(),
        };
        let lock_id = self
            .lease
            .lock_id()
            .filter(|_| !self.is_lost())
            .ok_or_else(lost)?;
        match self
            .write_while_held(lock_id, Ending::Update(update))
            .await?
        {
            written if written.matched_count == 1 => Ok(()),
            _ => Err(lost()),
        }
    }

    /// Matches the document while this holder's lease on it is live.
    fn live_filter(&self, lock_id: &str) -> Document {
        let layout = &self.target.layout;
        doc! {
            "_id": self.id.clone(),
            layout.lock_id_path(): lock_id,
            "$expr": layout.live(),
        }
    }

    /// Replaces the document with `new_document` and unlocks it, in one write filtered on this
    /// holder's lock id and a live lease. The lock field keeps only the fencing token.
    ///
    /// # Errors
    /// As [`commit`](Self::commit); [`Error::InvalidArgument`] if `new_document` does not
    /// serialize to a document or carries another `_id` or the lock field.
    ///
    /// # Cancel safety
    /// As [`commit`](Self::commit).
    pub async fn replace(self, new_document: T) -> Result<()>
    where
        T: Serialize,
    {
        let field = self.target.field.clone();
        let mut replacement = match to_document(&new_document) {
            Ok(document) => document,
            Err(error) => return Err(self.unlock_after(error)),
        };
        if replacement.get("_id").is_some_and(|id| *id != self.id) {
            return Err(self.unlock_after(Error::InvalidArgument(
                "replace: new_document has a different _id".to_owned(),
            )));
        }
        if replacement.contains_key(&field) {
            return Err(self.unlock_after(Error::InvalidArgument(format!(
                "replace: new_document must not carry the lock field {field:?}"
            ))));
        }
        replacement.insert(field, doc! { FENCING_TOKEN: self.fencing_token.get() });
        self.finish(Ending::Replace(replacement)).await
    }

    /// Unlocks the document without changing its data (the fencing token stays).
    ///
    /// # Errors
    /// As [`LockGuard::release`](crate::LockGuard::release).
    ///
    /// # Cancel safety
    /// Cancel safe: a background task finishes the release.
    pub async fn release(self) -> Result<()> {
        self.lease.release().await
    }

    /// Unlocks in the background (by dropping `self`) and returns `error`.
    fn unlock_after(self, error: Error) -> Error {
        drop(self);
        error
    }

    async fn finish(self, ending: Ending) -> Result<()> {
        let name = self.lease.name().to_owned();
        if self.is_lost() {
            return Err(self.unlock_after(Error::LockLost { name }));
        }
        let Some(lock_id) = self.lease.lock_id().map(str::to_owned) else {
            return Err(Error::BackgroundTaskEnded {
                operation: Operation::Commit,
            });
        };
        let result = match self.write_while_held(&lock_id, ending).await {
            Ok(result) => result,
            Err(error) => return Err(self.unlock_after(error)),
        };
        if result.matched_count == 0 {
            return Err(self.unlock_after(Error::LockLost { name }));
        }
        // The write ended the lease itself: the renewal loop only has to forget it.
        self.lease.ended_by_write();
        Ok(())
    }

    /// Sends `write`, filtered on this holder's live lease `lock_id`, in a task of its own that
    /// runs it to completion (the driver's futures must not be dropped midway), and waits at
    /// most `expiry` for its outcome.
    async fn write_while_held(&self, lock_id: &str, write: Ending) -> Result<UpdateResult> {
        let runtime = Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let target = Arc::clone(&self.target);
        let filter = self.live_filter(lock_id);
        let started = Instant::now();
        let patience = target.lock.options.expiry();
        let call = runtime.spawn(async move {
            let documents = &target.lock.collection;
            let write_concern = target.lock.options.write_concern().clone();
            match write {
                Ending::Update(update) => {
                    documents
                        .update_one(filter, update)
                        .write_concern(write_concern)
                        .await
                }
                Ending::Replace(replacement) => {
                    documents
                        .replace_one(filter, replacement)
                        .write_concern(write_concern)
                        .await
                }
            }
        });
        match timeout_at(started + patience, call).await {
            Ok(Ok(Ok(result))) => Ok(result),
            Ok(Ok(Err(error))) => Err(error.into()),
            Ok(Err(_join_error)) => Err(Error::BackgroundTaskEnded {
                operation: Operation::Commit,
            }),
            Err(_elapsed) => Err(Error::NoReply {
                operation: Operation::Commit,
                name: self.lease.name().to_owned(),
                waited: started.elapsed(),
            }),
        }
    }
}

impl<T> Granted for DocumentGuard<T> {
    fn fencing_token(&self) -> Option<FencingToken> {
        Some(self.fencing_token)
    }

    fn leaves_room(&self) -> bool {
        false
    }

    fn undelivered(self) {
        self.lease.undelivered();
    }
}

enum Ending {
    Update(Document),
    Replace(Document),
}

fn to_document<T: Serialize>(value: &T) -> Result<Document> {
    mongodb::bson::to_document(value).map_err(|error| {
        Error::InvalidArgument(format!("the document does not serialize: {error}"))
    })
}

/// Rejects lock fields MongoDB cannot address as a plain top-level field.
fn field_problem(field: &str) -> Option<Problem> {
    let unusable = field.is_empty() || field.contains(['.', '$', '\0']) || field == "_id";
    unusable.then(|| {
        Problem::Argument(format!(
            "lock field {field:?} must be a non-empty top-level field name without '.', '$' or \
             NUL, other than _id"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_fields_must_be_plain_top_level_names() {
        assert_eq!(field_problem("lock"), None);
        assert_eq!(field_problem("_lease"), None);
        for bad in ["", "a.b", "$x", "_id", "a\0b"] {
            assert!(field_problem(bad).is_some(), "{bad:?}");
        }
    }
}
