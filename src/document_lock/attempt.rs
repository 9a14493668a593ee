//! One attempt to lock a document: lock an unlocked match, inserting it first if asked.

use std::sync::Arc;

use mongodb::bson::{Bson, Document, doc};
use serde::de::DeserializeOwned;
use tokio::runtime::Handle;

use crate::clock;
use crate::error::is_duplicate_id;
use crate::fencing::exists_on_primary;
use crate::lease::schema::{EMBEDDED_ID, EXPIRES_AT, FENCING_TOKEN, lease_end, next_fencing_token};
use crate::lease::{DocumentAttempt, DocumentStep, Sent};
use crate::token::read_i64;
use crate::{Error, FencingToken, LockOptions, Result};

use super::DocumentGuard;
use super::Documents;

/// One attempt: lock an unlocked matching document (inserting it first if asked and missing),
/// its commands as the protocol core orders them ([`DocumentAttempt`]).
pub(super) async fn attempt<T>(
    target: Arc<Documents>,
    filter: Document,
    mut insert: Option<Document>,
    runtime: Handle,
    lock_id: String,
) -> Result<Option<DocumentGuard<T>>>
where
    T: DeserializeOwned + Send + Sync + 'static,
{
    let mut steps = DocumentAttempt::new(insert.is_some());
    let mut step = DocumentStep::Lock;
    loop {
        step = match step {
            DocumentStep::Lock => {
                match lock_unlocked_match::<T>(&target, &filter, &runtime, &lock_id).await? {
                    Some(guard) => return Ok(Some(guard)),
                    None => steps.no_match(),
                }
            }
            DocumentStep::Insert => {
                let write_concern = target.lock.options.write_concern().clone();
                // (Asked for only of a caller that gave a document, and once.)
                let Some(new_document) = insert.take() else {
                    return Ok(None);
                };
                match target
                    .lock
                    .collection
                    .insert_one(new_document)
                    .write_concern(write_concern)
                    .await
                {
                    // Inserted unlocked: lock it now (someone may beat us to it; then we wait).
                    Ok(_) => steps.inserted(false),
                    // It exists: locked by someone else (or they just inserted it). Only a
                    // duplicate `_id` means that; another unique index refusing the document
                    // would refuse it forever.
                    Err(error) if is_duplicate_id(&error) => steps.inserted(true),
                    Err(error) => return Err(error.into()),
                }
            }
            DocumentStep::CheckExists => {
                return if exists_on_primary(&target.lock.collection, filter).await? {
                    Ok(None)
                } else {
                    Err(Error::DocumentNotFound {
                        collection: target.lock.collection.name().to_owned(),
                    })
                };
            }
            DocumentStep::Busy => return Ok(None),
        };
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

/// The `findAndModify` that locks one unlocked document matching `filter`.
pub(super) async fn lock_unlocked_match<T>(
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
    let update = lock_update(field, &lock_id, &target.lock.options);
    let request = Sent::now(clock::now());
    let locked = target
        .lock
        .lock_one(unlocked_filter(filter, field), update)
        .await?;
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
