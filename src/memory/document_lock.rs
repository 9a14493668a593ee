//! The in-memory document locks: documents kept as BSON, each lockable by one holder.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use mongodb::bson::{Bson, Document, doc};

use super::evaluator::{LOCK_FIELD, apply, check_filter, matches};
use super::names::{Holder, Locks, StoredDocument};
use crate::error::{Error, Result};
use crate::lease::Problem;
use crate::lease::lost::LostSignal;
use crate::lease::state::LeaseState;
use crate::token::FencingToken;

/// In-memory document locks: the documents of one collection of the provider, kept as BSON,
/// each lockable by one holder at a time; see
/// [`MemoryLockProvider::create_document_lock`](super::MemoryLockProvider::create_document_lock).
#[derive(Clone)]
pub struct MemoryDocumentLock {
    pub(super) collection: String,
    pub(super) locks: Arc<Locks>,
    /// The provider's options: a `min_hold` or `fair` is refused, as the MongoDB document lock
    /// refuses them.
    pub(super) options: Arc<crate::options::LockOptions>,
}

impl fmt::Debug for MemoryDocumentLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryDocumentLock")
            .field("collection", &self.collection)
            .finish_non_exhaustive()
    }
}

impl MemoryDocumentLock {
    /// The collection's name.
    pub fn name(&self) -> &str {
        &self.collection
    }

    /// Waits until a document matching `filter` is locked, as
    /// [`DocumentLock::lock`](crate::DocumentLock::lock).
    ///
    /// # Errors
    /// [`Error::DocumentNotFound`](crate::Error::DocumentNotFound) when no document matches; [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a
    /// filter other than equalities of top-level fields (what the double understands); the
    /// refusals of [`MemoryLock::acquire`](super::MemoryLock::acquire).
    pub async fn lock(&self, filter: Document) -> Result<MemoryDocumentGuard> {
        loop {
            if let Some(guard) = self.lock_within(&filter, None).await? {
                return Ok(guard);
            }
        }
    }

    /// Waits up to `timeout` for a document matching `filter`.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) when `timeout` runs out; otherwise as [`lock`](Self::lock).
    pub async fn lock_timeout(
        &self,
        filter: Document,
        timeout: Duration,
    ) -> Result<MemoryDocumentGuard> {
        let started = Instant::now();
        self.lock_within(&filter, Some(timeout))
            .await?
            .ok_or_else(|| Error::Timeout {
                name: self.collection.clone(),
                waited: started.elapsed(),
                holders: Vec::new(),
            })
    }

    /// One attempt: `Ok(None)` if every matching document is locked.
    ///
    /// # Errors
    /// As [`lock`](Self::lock).
    pub async fn try_lock(&self, filter: Document) -> Result<Option<MemoryDocumentGuard>> {
        self.lock_within(&filter, Some(Duration::ZERO)).await
    }

    /// Attempts for up to `timeout`: `Ok(None)` if every matching document stayed locked.
    ///
    /// # Errors
    /// As [`lock`](Self::lock).
    pub async fn try_lock_timeout(
        &self,
        filter: Document,
        timeout: Duration,
    ) -> Result<Option<MemoryDocumentGuard>> {
        self.lock_within(&filter, Some(timeout)).await
    }

    /// Locks the document with `_id` `id`, inserting `new_document` (with that `_id`) first if
    /// it does not exist, as [`DocumentLock::lock_or_insert`](crate::DocumentLock::lock_or_insert).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if `new_document` carries another `_id` or the lock field
    /// `lock`; otherwise as [`lock`](Self::lock).
    pub async fn lock_or_insert(
        &self,
        id: impl Into<Bson>,
        new_document: Document,
    ) -> Result<MemoryDocumentGuard> {
        let id = id.into();
        let insert = crate::document_lock::insertion(new_document, &id, LOCK_FIELD)?;
        self.check()?;
        self.locks.insert_missing(&self.collection, insert);
        self.lock(doc! { "_id": id }).await
    }

    /// What the MongoDB document locks refuse before they try.
    fn check(&self) -> Result<()> {
        if let Some(problem) = Problem::of_collection(&self.collection) {
            return Problem::check(Some(&problem));
        }
        self.options
            .check_neither_min_hold_nor_fair("document lock")?;
        if self.locks.shut_down.load(Ordering::SeqCst) {
            return Err(Error::ShutDown);
        }
        tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        Ok(())
    }

    /// Locks a matching unlocked document as soon as there is one, within `timeout` if given.
    async fn lock_within(
        &self,
        filter: &Document,
        timeout: Option<Duration>,
    ) -> Result<Option<MemoryDocumentGuard>> {
        self.check()?;
        check_filter(filter)?;
        let deadline = timeout.and_then(|timeout| Instant::now().checked_add(timeout));
        loop {
            // Registered before the attempt, so a release in between is not missed.
            let freed = self.locks.freed.notified();
            if let Some(guard) = self.take(filter)? {
                return Ok(Some(guard));
            }
            match deadline {
                None => freed.await,
                Some(deadline) => {
                    if tokio::time::timeout_at(deadline, freed).await.is_err() {
                        return self.take(filter);
                    }
                }
            }
        }
    }

    /// One attempt: locks the first unlocked document matching `filter`.
    fn take(&self, filter: &Document) -> Result<Option<MemoryDocumentGuard>> {
        let mut collections = self.locks.collections.lock();
        if self.locks.shut_down.load(Ordering::SeqCst) {
            return Err(Error::ShutDown);
        }
        let documents = collections.entry(self.collection.clone()).or_default();
        let mut matched = false;
        for stored in documents.iter_mut() {
            if !matches(&stored.document, filter) {
                continue;
            }
            matched = true;
            if stored.holder.is_some() {
                continue;
            }
            stored.last_token += 1;
            let acquisition = self.locks.next_acquisition.fetch_add(1, Ordering::SeqCst);
            // As the MongoDB document lock stores it (without a lease end: the double's leases
            // have none).
            stored.document.insert(
                LOCK_FIELD,
                doc! { "id": format!("memory-{acquisition}"), "fencingToken": stored.last_token },
            );
            let state = LeaseState::without_deadline();
            stored.holder = Some(Holder {
                acquisition,
                reader: false,
                places: 1,
                upgradeable: false,
                token: None,
                acquired_at: tokio::time::Instant::now(),
                min_hold: None,
                state: Arc::clone(&state),
            });
            return Ok(Some(MemoryDocumentGuard {
                id: stored.document.get("_id").cloned().unwrap_or(Bson::Null),
                document: stored.document.clone(),
                fencing_token: FencingToken::new(stored.last_token),
                collection: self.collection.clone(),
                locks: Arc::clone(&self.locks),
                acquisition,
                state,
                ended: false,
            }));
        }
        if matched {
            Ok(None)
        } else {
            Err(Error::DocumentNotFound {
                collection: self.collection.clone(),
            })
        }
    }
}

impl Locks {
    /// Inserts `document` into `collection` unless a document with its `_id` is there.
    fn insert_missing(&self, collection: &str, document: Document) {
        let mut collections = self.collections.lock();
        let documents = collections.entry(collection.to_owned()).or_default();
        let id = document.get("_id");
        if !documents
            .iter()
            .any(|stored| stored.document.get("_id") == id)
        {
            documents.push(StoredDocument {
                document,
                last_token: 0,
                holder: None,
            });
        }
    }

    /// Runs `change` on the document `id` of `collection` while `acquisition` holds it, then
    /// unlocks it if `unlock`; [`Error::LockLost`](crate::Error::LockLost) (and nothing changed) if the lock was lost.
    /// A failed `change` leaves the document as it was.
    fn while_held(
        &self,
        collection: &str,
        id: &Bson,
        acquisition: u64,
        unlock: bool,
        change: impl FnOnce(&mut Document) -> Result<()>,
    ) -> Result<()> {
        let result = {
            let mut collections = self.collections.lock();
            let stored = collections.get_mut(collection).and_then(|documents| {
                documents.iter_mut().find(|stored| {
                    stored.document.get("_id") == Some(id)
                        && stored
                            .holder
                            .as_ref()
                            .is_some_and(|holder| holder.acquisition == acquisition)
                })
            });
            match stored {
                Some(stored) => {
                    let lost = stored
                        .holder
                        .as_ref()
                        .is_some_and(|holder| holder.state.is_lost());
                    let changed = if lost {
                        Err(Error::LockLost {
                            name: format!("{collection}/{id}"),
                        })
                    } else {
                        change(&mut stored.document)
                    };
                    // An ending write unlocks whatever its outcome (its guard is gone), as on
                    // MongoDB; a checkpoint that failed leaves the document locked.
                    if unlock {
                        stored.holder = None;
                        // The lock field keeps the fencing token, as on MongoDB.
                        let token = stored.last_token;
                        stored
                            .document
                            .insert(LOCK_FIELD, doc! { "fencingToken": token });
                    }
                    changed
                }
                None => Err(Error::LockLost {
                    name: format!("{collection}/{id}"),
                }),
            }
        };
        self.freed.notify_waiters();
        result
    }
}

/// Proof that a document of a [`MemoryDocumentLock`](super::MemoryDocumentLock) is locked; behaves as
/// [`DocumentGuard`](crate::DocumentGuard) does.
#[must_use = "dropping the guard unlocks the document at once"]
#[clippy::has_significant_drop]
pub struct MemoryDocumentGuard {
    document: Document,
    id: Bson,
    fencing_token: FencingToken,
    collection: String,
    locks: Arc<Locks>,
    acquisition: u64,
    state: Arc<LeaseState>,
    /// Set once a commit, replace or release ended the lock (whatever its outcome).
    ended: bool,
}

impl fmt::Debug for MemoryDocumentGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryDocumentGuard")
            .field("collection", &self.collection)
            .field("id", &self.id)
            .field("fencing_token", &self.fencing_token)
            .finish_non_exhaustive()
    }
}

impl MemoryDocumentGuard {
    /// The locked document, as it was when it was locked.
    pub fn document(&self) -> &Document {
        &self.document
    }

    /// The document's `_id`.
    pub fn id(&self) -> &Bson {
        &self.id
    }

    /// This acquisition's fencing token: larger than every earlier one of the same document.
    pub fn fencing_token(&self) -> FencingToken {
        self.fencing_token
    }

    /// A signal that turns true when the lock is lost (only at the provider's shutdown).
    pub fn lost(&self) -> LostSignal {
        LostSignal::new(vec![Arc::clone(&self.state)])
    }

    /// Whether the lock is lost.
    pub fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// Extends the lease to at least `by` from now: the in-memory lease has no deadline, so
    /// this only checks, as [`LockGuard::extend`](crate::LockGuard::extend) does, that `by` is
    /// between 1 ms and 365 days and that the lock is not lost.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a `by` out of range,
    /// [`Error::LockLost`](crate::Error::LockLost) once lost.
    pub async fn extend(&self, by: Duration) -> Result<()> {
        super::lock::extended(&self.collection, &self.state, by)
    }

    /// Applies `update` to the document and keeps it locked.
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) if the lock was lost (nothing is written); [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// for an update that is not made of update operators, touches `_id` or the lock field, or
    /// uses what the double does not implement (anything but `$set`, `$unset`, `$inc` of
    /// top-level fields).
    pub async fn checkpoint(&self, update: Document) -> Result<()> {
        self.locks.while_held(
            &self.collection,
            &self.id,
            self.acquisition,
            false,
            |document| apply(document, &update),
        )
    }

    /// Applies `update` and unlocks the document.
    ///
    /// # Errors
    /// As [`checkpoint`](Self::checkpoint); the document is unlocked either way.
    pub async fn commit(mut self, update: Document) -> Result<()> {
        self.end(|document| apply(document, &update))
    }

    /// Replaces the document with `new_document` (its `_id` kept) and unlocks it.
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) if the lock was lost; [`Error::InvalidArgument`](crate::Error::InvalidArgument) if `new_document`
    /// carries another `_id` or the lock field.
    pub async fn replace(mut self, new_document: Document) -> Result<()> {
        let id = self.id.clone();
        self.end(|document| {
            if new_document.get("_id").is_some_and(|other| *other != id) {
                return Err(Error::InvalidArgument(
                    "replace: the new document has another _id".to_owned(),
                ));
            }
            if new_document.contains_key(LOCK_FIELD) {
                return Err(Error::InvalidArgument(format!(
                    "replace: the new document must not carry the lock field \
                     {LOCK_FIELD:?}"
                )));
            }
            let mut replacement = doc! { "_id": id.clone() };
            replacement.extend(new_document);
            *document = replacement;
            Ok(())
        })
    }

    /// Unlocks the document without changing it.
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) if the lock was lost before.
    pub async fn release(mut self) -> Result<()> {
        self.end(|_| Ok(()))
    }

    /// Applies `change` and unlocks the document, whatever the outcome.
    fn end(&mut self, change: impl FnOnce(&mut Document) -> Result<()>) -> Result<()> {
        self.ended = true;
        self.state.mark_released();
        self.locks
            .while_held(&self.collection, &self.id, self.acquisition, true, change)
    }
}

impl Drop for MemoryDocumentGuard {
    fn drop(&mut self) {
        if !self.ended {
            let _ = self.end(|_| Ok(()));
        }
    }
}

crate::traits::impl_distributed_document_lock!(MemoryDocumentLock);

crate::traits::impl_distributed_document_guard!(MemoryDocumentGuard);
