//! The guard of a locked document: its data, its lease, and the writes that end it.

use std::fmt;
use std::sync::Arc;

use mongodb::bson::{Bson, Document, doc};
use mongodb::results::UpdateResult;
use serde::Serialize;
use tokio::runtime::Handle;
use tokio::time::{Instant, timeout_at};

use crate::error::{Error, Operation, Result};
use crate::fencing::check_operators;
use crate::lease::claim::Granted;
use crate::lease::held::HeldLease;
use crate::lease::lost::LostSignal;
use crate::lease::schema::{EMBEDDED_ID, EXPIRES_AT, FENCING_TOKEN, Layout, RENEWED_AT};
use crate::token::FencingToken;

use super::{Documents, to_document};

/// A locked document: gives access to it, keeps its lease renewed, signals `lost`, and ends with
/// [`commit`](Self::commit), [`replace`](Self::replace) or [`release`](Self::release). Dropping
/// it unlocks the document in the background, without changing data.
#[must_use = "dropping the guard unlocks the document at once"]
#[clippy::has_significant_drop]
pub struct DocumentGuard<T> {
    pub(super) document: T,
    pub(super) id: Bson,
    pub(super) fencing_token: FencingToken,
    pub(super) lease: HeldLease,
    pub(super) target: Arc<Documents>,
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

    /// This lock's lock id, as the document's lock field stores it (`<field>.id`): log it to
    /// tell which holder locked the document.
    pub fn lock_id(&self) -> &str {
        // (A guard's lease is handed back only by its release or drop, which consume it.)
        self.lease.lock_id().unwrap_or_default()
    }

    crate::lease::bound::bound_task_methods!();

    crate::lease::bound::progress_method!(guard => [&guard.lease]);

    /// The tasks bound to the lease.
    pub(crate) fn bound(&self) -> &crate::lease::bound::Bound {
        self.lease.bound()
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

    /// Extends the lease to at least `by` from now; see
    /// [`LockGuard::extend`](crate::LockGuard::extend).
    ///
    /// # Errors
    /// As [`LockGuard::extend`](crate::LockGuard::extend).
    pub async fn extend(&self, by: std::time::Duration) -> Result<()> {
        self.lease.extend(by).await
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
    /// - [`Error::Mongo`] / [`Error::NoReply`] if the update failed or got no reply within
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
        unlock_with(&mut update, field);
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
    /// - [`Error::Mongo`] / [`Error::NoReply`] if the update failed or got no reply within
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
        live_filter(&self.target.layout, &self.id, lock_id)
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
        keep_only_token(&mut replacement, &field, self.fencing_token);
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

/// Matches the document `id` while the lease `lock_id`, stored as `layout` says, is live on it:
/// the filter of every write of a holder (`commit`, `checkpoint`, `replace`).
pub(crate) fn live_filter(layout: &Layout, id: &Bson, lock_id: &str) -> Document {
    doc! {
        "_id": id.clone(),
        layout.lock_id_path(): lock_id,
        "$expr": layout.live(),
    }
}

/// Gives `replacement` (a `replace`'s new document) the lock field `field` with only the
/// fencing token `token`: the lease ends with the write, and the next holder's token still
/// follows this one.
pub(crate) fn keep_only_token(replacement: &mut Document, field: &str, token: FencingToken) {
    replacement.insert(field, doc! { FENCING_TOKEN: token.get() });
}

/// Adds to `update` the unlock of `field`'s lease (its id and expiry go; its token stays): a
/// commit's update.
pub(crate) fn unlock_with(update: &mut Document, field: &str) {
    let unset = doc! {
        format!("{field}.{EMBEDDED_ID}"): "",
        format!("{field}.{EXPIRES_AT}"): "",
        format!("{field}.{RENEWED_AT}"): "",
    };
    match update.get_document_mut("$unset") {
        Ok(existing) => existing.extend(unset),
        Err(_) => {
            update.insert("$unset", unset);
        }
    }
}

pub(super) enum Ending {
    Update(Document),
    Replace(Document),
}

crate::traits::impl_distributed_document_guard!(DocumentGuard<Document>);
