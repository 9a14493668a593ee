//! One attempt to lock a document: lock an unlocked match, inserting it first if asked.

use std::marker::PhantomData;
use std::sync::Arc;

use mongodb::bson::{Bson, Document, doc};
use serde::de::DeserializeOwned;
use tokio::runtime::Handle;

use crate::clock;
use crate::error::{Error, Result, is_duplicate_id};
use crate::fencing::exists_on_primary;
use crate::lease::claim::{Claim, Request};
use crate::lease::schema::{
    EMBEDDED_ID, EXPIRES_AT, FENCING_TOKEN, Layout, lease_end, next_fencing_token,
};
use crate::lease::{DocumentAttempt, DocumentStep, Sent, Target};
use crate::options::LockOptions;
use crate::token::FencingToken;
use crate::token::read_i64;

use super::DocumentGuard;
use super::Documents;

/// A document lock, as the engine claims it: lock an unlocked document matching `filter`, and
/// (for `lock_or_insert`) insert `insert` first when none matches. Its lease lives in the
/// document, so there is no handoff.
pub(super) struct Locking<T> {
    pub(super) documents: Arc<Documents>,
    pub(super) filter: Document,
    pub(super) insert: Option<Document>,
    pub(super) _documents: PhantomData<fn() -> T>,
}

impl<T> Claim for Locking<T>
where
    T: DeserializeOwned + Send + Sync + 'static,
{
    type Won = DocumentGuard<T>;
    const TAKES_OVER: bool = false;

    fn target(&self) -> &Target {
        &self.documents.lock
    }

    fn layout(&self) -> Layout {
        self.documents.layout.clone()
    }

    /// Our lease `lock_id` in the lock field, with the next fencing token.
    fn update(&self, lock_id: &str, _replacing: Option<&str>) -> Vec<Document> {
        lock_update(&self.documents.field, lock_id, &self.documents.lock.options)
    }

    /// The guard over `document`, the one the lock command locked.
    fn won(
        &self,
        runtime: &Handle,
        document: Document,
        lock_id: String,
        request: Request,
    ) -> Result<Option<DocumentGuard<T>>> {
        let target = &self.documents;
        let field = &target.field;
        let id = document.get("_id").cloned().unwrap_or(Bson::Null);
        let token = document
            .get_document(field)
            .ok()
            .and_then(|lock| lock.get(FENCING_TOKEN))
            .and_then(read_i64);
        let lease =
            target
                .lock
                .hold_embedded(runtime, &target.layout, id.clone(), lock_id, request);
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

    /// Its commands as the protocol core orders them ([`DocumentAttempt`]): the lock command;
    /// then, if nothing matched, the insert and the lock command again, or a read of whether a
    /// matching document exists.
    async fn attempt(
        self: Arc<Self>,
        runtime: Handle,
        lock_id: String,
    ) -> Result<Option<DocumentGuard<T>>> {
        let collection = &self.documents.lock.collection;
        let mut insert = self.insert.clone();
        let mut steps = DocumentAttempt::new(insert.is_some());
        let mut step = DocumentStep::Lock;
        loop {
            step = match step {
                DocumentStep::Lock => match self.lock_unlocked_match(&runtime, &lock_id).await? {
                    Some(guard) => return Ok(Some(guard)),
                    None => steps.no_match(),
                },
                DocumentStep::Insert => {
                    let write_concern = self.documents.lock.options.write_concern().clone();
                    // (Asked for only of a caller that gave a document, and once.)
                    let Some(new_document) = insert.take() else {
                        return Ok(None);
                    };
                    match collection
                        .insert_one(new_document)
                        .write_concern(write_concern)
                        .await
                    {
                        // Inserted unlocked: lock it now (someone may beat us to it; then we
                        // wait).
                        Ok(_) => steps.inserted(false),
                        // It exists: locked by someone else (or they just inserted it). Only
                        // a duplicate `_id` means that; another unique index refusing the
                        // document would refuse it forever.
                        Err(error) if is_duplicate_id(&error) => steps.inserted(true),
                        Err(error) => return Err(error.into()),
                    }
                }
                DocumentStep::CheckExists => {
                    return if exists_on_primary(collection, self.filter.clone()).await? {
                        Ok(None)
                    } else {
                        Err(Error::DocumentNotFound {
                            collection: collection.name().to_owned(),
                        })
                    };
                }
                DocumentStep::Busy => return Ok(None),
            };
        }
    }
}

impl<T> Locking<T>
where
    T: DeserializeOwned + Send + Sync + 'static,
{
    /// The `findAndModify` that locks one unlocked document matching the filter.
    async fn lock_unlocked_match(
        &self,
        runtime: &Handle,
        lock_id: &str,
    ) -> Result<Option<DocumentGuard<T>>> {
        let request = Sent::now(clock::now());
        let filter = unlocked_filter(&self.filter, &self.documents.field);
        let locked = self
            .documents
            .lock
            .lock_one(filter, self.update(lock_id, None))
            .await?;
        match locked {
            Some(document) => self.won(runtime, document, lock_id.to_owned(), request),
            None => Ok(None),
        }
    }
}

/// The filter of an attempt: the caller's `filter`, and a lease in `field` that has ended (or
/// none).
pub(crate) fn unlocked_filter(filter: &Document, field: &str) -> Document {
    let expires_at = format!("${field}.{EXPIRES_AT}");
    let unlocked =
        doc! { "$expr": { "$lte": [{ "$ifNull": [&expires_at, Bson::Null] }, "$$NOW"] } };
    doc! { "$and": [filter.clone(), unlocked] }
}

/// The update of an attempt: our lease `lock_id` in `field`, with the next fencing token.
pub(crate) fn lock_update(field: &str, lock_id: &str, options: &LockOptions) -> Vec<Document> {
    vec![doc! { "$set": { field: {
        EMBEDDED_ID: lock_id,
        EXPIRES_AT: lease_end(options.expiry_millis()),
        FENCING_TOKEN: next_fencing_token(&format!("{field}.{FENCING_TOKEN}")),
    } } }]
}
