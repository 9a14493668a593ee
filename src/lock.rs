//! The exclusive lock.

use std::sync::Arc;
use std::time::Duration;

use mongodb::bson::{Bson, Document, doc};
use mongodb::options::ReturnDocument;
use mongodb::{Collection, Database};
use tokio::runtime::Handle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::backoff;
use crate::error::{is_duplicate_key, shown_name};
use crate::handoff;
use crate::lost::LeaseState;
use crate::renewal::{Lease, RenewalHub};
use crate::schema::{self, AttemptReply, Layout};
use crate::ttl_index;
use crate::waiting;
use crate::{Error, FencingToken, LockDetails, LockGuard, LockOptions, Result};

/// The default collection, shared with DistributedLock.MongoDB.
pub const DEFAULT_COLLECTION: &str = "distributed_locks";

/// A named mutual-exclusion lock stored in a MongoDB collection.
///
/// Cheap to clone (the clones share one lock definition); `Send + Sync`. Creating one talks to
/// no server. See the [crate docs](crate) for how it works and what it guarantees.
///
/// ```no_run
/// # async fn demo(database: mongodb::Database) -> distributed_lock_mongodb::Result<()> {
/// use distributed_lock_mongodb::MongoDistributedLock;
///
/// let lock = MongoDistributedLock::new("nightly-report", &database);
/// let guard = lock.acquire().await?;
/// // ... only one instance runs this at a time ...
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct MongoDistributedLock {
    inner: Arc<LockInner>,
}

/// What a lock and its guards share.
#[derive(Clone, Debug)]
pub(crate) struct LockInner {
    pub(crate) name: String,
    pub(crate) database: Database,
    pub(crate) collection: Collection<Document>,
    pub(crate) options: LockOptions,
    /// The renewal loops, shared with the locks of the same provider.
    pub(crate) renewals: Arc<RenewalHub>,
    /// This lock's queue of in-process waiters.
    pub(crate) waiters: handoff::Key,
    /// The stored form of the holder's details, if they are stored.
    pub(crate) details: Option<Document>,
}

impl MongoDistributedLock {
    /// A lock called `name` in `database`'s `distributed_locks` collection, with default
    /// options. The name is the document's `_id`, verbatim and case-sensitive; any string works.
    pub fn new(name: impl Into<String>, database: &Database) -> Self {
        let name = name.into();
        MongoDistributedLock {
            inner: Arc::new(LockInner {
                waiters: handoff::key(database.name(), DEFAULT_COLLECTION, &name),
                name,
                database: database.clone(),
                collection: database.collection(DEFAULT_COLLECTION),
                options: LockOptions::default(),
                renewals: Arc::default(),
                details: None,
            }),
        }
    }

    /// Stores the lock in `collection` instead of `distributed_locks`. An invalid name is
    /// reported by the first `acquire*` call ([`Error::InvalidCollectionName`]).
    pub fn with_collection(mut self, collection: impl Into<String>) -> Self {
        let inner = Arc::make_mut(&mut self.inner);
        let collection = collection.into();
        inner.waiters = handoff::key(inner.database.name(), &collection, &inner.name);
        inner.collection = inner.database.collection(&collection);
        self
    }

    /// Shares `renewals` (a provider's) instead of this lock's own renewal loops.
    pub(crate) fn with_renewals(mut self, renewals: &Arc<RenewalHub>) -> Self {
        Arc::make_mut(&mut self.inner).renewals = Arc::clone(renewals);
        self
    }

    /// Replaces the options.
    pub fn with_options(mut self, options: LockOptions) -> Self {
        Arc::make_mut(&mut self.inner).options = options;
        self
    }

    /// Stores `details` with each acquisition, in a sixth field `details` of the lock document,
    /// so [`Provider::status`](crate::Provider::status) and
    /// [`Provider::held_locks`](crate::Provider::held_locks) can show who holds the lock.
    ///
    /// **This breaks interoperability with DistributedLock.MongoDB (.NET)**: its document class
    /// rejects unknown fields, so .NET clients fail to read a lock document that carries
    /// details. Leave it off for locks shared with .NET services.
    pub fn with_details(mut self, details: LockDetails) -> Self {
        Arc::make_mut(&mut self.inner).details = Some(details.to_document());
        self
    }

    /// Replaces the details setting (a provider's).
    pub(crate) fn with_stored_details(mut self, details: Option<Document>) -> Self {
        Arc::make_mut(&mut self.inner).details = details;
        self
    }

    /// Stores this process's details unless details are set already (the default of the
    /// primitives that are not .NET-compatible).
    pub(crate) fn with_details_by_default(self) -> Self {
        if self.inner.details.is_some() {
            self
        } else {
            self.with_details(LockDetails::new())
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The lock's options.
    pub fn options(&self) -> &LockOptions {
        &self.inner.options
    }

    pub(crate) fn inner(&self) -> &Arc<LockInner> {
        &self.inner
    }

    /// Waits until the lock is acquired.
    ///
    /// Attempts alternate with sleeps in the busy-wait range (see [`LockOptions`]). Each attempt
    /// is one `findAndModify`.
    ///
    /// Transient failures (no reply, a network error, no primary during an election) are
    /// retried at the busy-wait pace for up to `expiry` in a row before they are returned; an
    /// attempt whose outcome is unknown is cleaned up by its own lock id (see the crate docs).
    ///
    /// # Errors
    /// - [`Error::InvalidCollectionName`] before anything is sent, for a collection name MongoDB
    ///   would reject; [`Error::InvalidArgument`] for a name over 1 MiB.
    /// - [`Error::Mongo`] if an attempt fails in the driver with an error that is not transient,
    ///   or transient errors persisted for `expiry`; the lock is not held then.
    /// - [`Error::Timeout`] if attempts got no reply within `expiry` for `expiry` in a row (the
    ///   lock is then not held: a late win is released at once).
    /// - [`Error::NoRuntime`] outside a Tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel safe: every attempt runs to completion in a spawned task, and if it won the lock
    /// after this future was dropped, it releases the lock at once.
    pub async fn acquire(&self) -> Result<LockGuard> {
        self.wait_for(None, "acquire").await?.ok_or_else(|| {
            // Unreachable without a deadline, but never worth a panic.
            Error::BackgroundTaskEnded("acquire")
        })
    }

    /// Waits at most `timeout` for the lock. A zero timeout makes exactly one attempt; one too
    /// large to represent (such as `Duration::MAX`) waits forever. The sleep before the last
    /// attempt is shortened so that attempt starts at the deadline; an attempt in flight then
    /// still gets at least five seconds (at most `expiry`) to answer.
    ///
    /// # Errors
    /// [`Error::Timeout`] when the lock stayed busy until the deadline, or when an attempt got
    /// no reply in time (at least five seconds, at most `expiry`; `operation` then says so) and
    /// the deadline has passed; otherwise as [`acquire`](Self::acquire) (transient failures are
    /// retried only until the deadline).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        let started = Instant::now();
        let deadline = backoff::deadline_after(started, timeout);
        self.wait_for(deadline, "acquire")
            .await?
            .ok_or_else(|| Error::Timeout {
                operation: "acquire",
                name: self.inner.name.clone(),
                waited: started.elapsed(),
            })
    }

    /// Makes one attempt; `Ok(None)` if the lock is held by someone else.
    ///
    /// # Errors
    /// As [`try_acquire_timeout`](Self::try_acquire_timeout).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>> {
        self.try_acquire_timeout(Duration::ZERO).await
    }

    /// Like [`acquire_timeout`](Self::acquire_timeout), but `Ok(None)` when the lock stays busy
    /// until the deadline.
    ///
    /// # Errors
    /// [`Error::Timeout`] only when an attempt got no reply in time (at least five seconds, at most
    /// `expiry`): an unreachable server is not reported as a busy lock. Otherwise as
    /// [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub async fn try_acquire_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        let deadline = backoff::deadline_after(Instant::now(), timeout);
        self.wait_for(deadline, "try_acquire").await
    }

    /// Attempts until acquired or `deadline` (`None`: never) has passed.
    async fn wait_for(
        &self,
        deadline: Option<Instant>,
        operation: &'static str,
    ) -> Result<Option<LockGuard>> {
        let span = tracing::debug_span!(
            "acquire",
            lock = %shown_name(&self.inner.name),
            collection = %self.inner.collection.name(),
            operation,
            outcome = tracing::field::Empty,
            fencing_token = tracing::field::Empty,
        );
        let result = self.attempt_until(deadline).instrument(span.clone()).await;
        match &result {
            Ok(Some(guard)) => {
                span.record("outcome", "acquired");
                span.record("fencing_token", guard.fencing_token().get());
            }
            Ok(None) => {
                span.record("outcome", "not acquired");
            }
            Err(error) => {
                span.record("outcome", tracing::field::display(error));
            }
        }
        result
    }

    async fn attempt_until(&self, deadline: Option<Instant>) -> Result<Option<LockGuard>> {
        validate_target(&self.inner.name, self.inner.collection.name())?;
        let runtime = Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let inner = &self.inner;
        waiting::retry(&inner.options, deadline, Some(&inner.waiters), || {
            let lock_id = new_lock_id();
            let cleanup = inner.cleanup(&Layout::LockDocument, &lock_id);
            let attempt = run_attempt(Arc::clone(inner), runtime.clone(), lock_id);
            waiting::spawned_attempt(&runtime, deadline, &inner.options, cleanup, attempt)
        })
        .await
    }
}

impl LockInner {
    /// What ends the lease that the attempt with `lock_id` may have taken in this lock's
    /// document (stored as `layout` says), should its outcome be unknown.
    pub(crate) fn cleanup(&self, layout: &Layout, lock_id: &str) -> waiting::Cleanup {
        waiting::Cleanup {
            collection: self.collection.clone(),
            filter: layout.release_filter(&self.name.as_str().into(), lock_id),
            update: layout.release_update(lock_id),
            options: self.options.clone(),
            name: self.name.clone(),
        }
    }
}

/// A fresh lock id: identifies one acquisition attempt and, if it wins, the lease.
pub(crate) fn new_lock_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// One acquisition attempt: `Ok(None)` if the lock is busy.
async fn run_attempt(
    lock: Arc<LockInner>,
    runtime: Handle,
    lock_id: String,
) -> Result<Option<LockGuard>> {
    let sent_at = Instant::now();
    let update = schema::acquire_update(
        &lock_id,
        lock.options.expiry_millis(),
        lock.details.as_ref(),
    );
    let document = upsert_attempt(&lock, update).await?;
    match schema::read_attempt_reply(&document, &lock_id) {
        AttemptReply::Acquired(token) => {
            ttl_index::ensure(&runtime, &lock.collection);
            let id = lock.name.as_str().into();
            hold(
                &lock,
                &runtime,
                &Layout::LockDocument,
                id,
                lock_id,
                sent_at,
                token,
            )
        }
        AttemptReply::Busy => Ok(None),
    }
}

/// Runs an attempt's pipeline `update` on the lock's document (`{_id: name}`, created if
/// missing) and returns the document after it.
///
/// Two concurrent upserts of a new name can make one fail with a duplicate key (E11000) when
/// the server does not retry it itself. The document exists then, and the attempt is repeated
/// at once: for an exclusive lock it will find the lock busy, but a reader or a semaphore holder
/// may well join.
pub(crate) async fn upsert_attempt(lock: &LockInner, update: Vec<Document>) -> Result<Document> {
    let send = || {
        lock.collection
            .find_one_and_update(doc! { schema::ID: &lock.name }, update.clone())
            .upsert(true)
            .return_document(ReturnDocument::After)
            .write_concern(lock.options.write_concern().clone())
    };
    let result = match send().await {
        Err(error) if is_duplicate_key(&error) => send().await,
        other => other,
    };
    match result {
        Ok(Some(document)) => Ok(document),
        Ok(None) => Err(Error::UnexpectedReply(
            "findAndModify with upsert returned no document".to_owned(),
        )),
        Err(error) => Err(Error::Mongo(error)),
    }
}

/// Turns a won acquisition of the lease in document `id` (stored as `layout` says) into a guard:
/// registers the lease with the renewal loop and checks the reply came in time.
///
/// `Ok(None)` when the reply came too late to trust the lease (after its local deadline: the
/// lease may already have ended on the server and someone else taken over); the guard is then
/// dropped, which releases whatever is left of the lease. A missing token cannot happen on a
/// conforming server (we wrote it ourselves); the lease is released and an error returned.
pub(crate) fn hold(
    lock: &Arc<LockInner>,
    runtime: &Handle,
    layout: &Layout,
    id: Bson,
    lock_id: String,
    sent_at: Instant,
    token: Option<i64>,
) -> Result<Option<LockGuard>> {
    let state = LeaseState::new(lock.options.lost_deadline(sent_at));
    let lease = Lease {
        id,
        name: lock.name.clone(),
        lock_id: lock_id.clone(),
        state: Arc::clone(&state),
        waiters: Some(Arc::clone(&lock.waiters)),
    };
    let renewals = lock
        .renewals
        .hold(runtime, &lock.collection, layout, &lock.options, lease);
    let guard = LockGuard::new(
        Arc::clone(lock),
        lock_id,
        FencingToken::new(token.unwrap_or_default()),
        Arc::clone(&state),
        renewals,
    );
    if state.is_lost() {
        return Ok(None);
    }
    match token {
        Some(_) => Ok(Some(guard)),
        None => Err(Error::UnexpectedReply(
            "the acquired lock document has no numeric fencingToken".to_owned(),
        )),
    }
}

/// The longest lock name, in bytes: a name is stored as the `_id` of its document and sent in
/// every command about it, and must leave room within MongoDB's 16 MiB document limit.
pub(crate) const MAX_NAME_BYTES: usize = 1 << 20;

/// Rejects a lock name too long to store and a collection name MongoDB would refuse, before
/// anything is sent.
pub(crate) fn validate_target(name: &str, collection: &str) -> Result<()> {
    if name.len() > MAX_NAME_BYTES {
        return Err(Error::InvalidArgument(format!(
            "lock name {:?} is {} bytes long; names are limited to {MAX_NAME_BYTES} bytes (1 MiB)",
            shown_name(name),
            name.len()
        )));
    }
    validate_collection_name(collection)
}

/// Rejects collection names MongoDB would refuse, before anything is sent.
pub(crate) fn validate_collection_name(collection: &str) -> Result<()> {
    let reason = if collection.is_empty() {
        "it is empty"
    } else if collection.contains('\0') {
        "it contains a NUL character"
    } else if collection.contains('$') {
        "it contains '$'"
    } else if collection.starts_with('.') {
        "it starts with '.'"
    } else if collection.starts_with("system.") {
        "the 'system.' prefix is reserved"
    } else {
        return Ok(());
    };
    Err(Error::InvalidCollectionName {
        collection: collection.to_owned(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collection_names_mongodb_rejects_are_refused() {
        for bad in ["", "a\0b", "$x", "a$b", ".x", "system.locks"] {
            let error = validate_collection_name(bad).unwrap_err();
            assert!(
                matches!(&error, Error::InvalidCollectionName { collection, .. } if collection == bad),
                "{error}"
            );
        }
        for good in ["distributed_locks", "locks.v2", "ünïcode", "a b"] {
            validate_collection_name(good).unwrap();
        }
    }
}
