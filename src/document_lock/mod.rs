//! Locks embedded in your own documents.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use mongodb::bson::{Bson, Document, doc};
use mongodb::{Collection, Database};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};
use crate::lease::acquire::{self, Acquisition, ReadHolders, Wait};
use crate::lease::family::Family;
use crate::lease::schema::Layout;
use crate::lease::{Problem, Target, admin, held};
use crate::lock_status::{LockKind, LockStatus};
use crate::options::LockOptions;
use crate::watch::LockWatch;
use futures::future::BoxFuture;

pub(crate) mod attempt;
pub(crate) mod guard;

use attempt::Locking;
pub use guard::DocumentGuard;

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

    /// Joins `family` (a provider's).
    pub(crate) fn in_family(self, family: &Arc<Family>) -> Self {
        self.rebuilt(|target| target.lock.join_family(family, None))
    }

    /// Its collection was made from `database` (a provider's): its leases are renewed with the
    /// other leases of that database's deployment.
    pub(crate) fn of_database(self, database: &Database) -> Self {
        self.rebuilt(|target| target.lock.reached_through(database))
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
        let insert = insertion(to_document(&new_document)?, &id, &self.target.field)?;
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
                    .check_neither_min_hold_nor_fair("document lock")
            }),
            waiters: None,
            shared: false,
            renews_while_waiting: false,
            family: &target.lock.family,
            push: None,
            places: None,
            holders: &matching,
        };
        let locking = Locking {
            documents: Arc::clone(target),
            filter,
            insert,
            _documents: PhantomData,
        };
        acquire::acquire(what, wait, Arc::new(locking)).await
    }
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

crate::traits::impl_distributed_document_lock!(DocumentLock<Document>);

/// The document `lock_or_insert` inserts, unlocked, when none matches: the caller's
/// `new_document`, with `_id` `id` (its own must be the same, if it has one) and without the
/// lock field `field` (an inserted lease would be nobody's).
pub(crate) fn insertion(mut new_document: Document, id: &Bson, field: &str) -> Result<Document> {
    match new_document.get("_id") {
        None => {
            new_document.insert("_id", id.clone());
        }
        Some(existing) if existing == id => {}
        Some(_) => {
            return Err(Error::InvalidArgument(
                "lock_or_insert: new_document has an _id different from id".to_owned(),
            ));
        }
    }
    if new_document.contains_key(field) {
        return Err(Error::InvalidArgument(format!(
            "lock_or_insert: new_document must not carry the lock field {field:?}"
        )));
    }
    Ok(new_document)
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
