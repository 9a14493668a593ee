//! Inspection and administration of the locks in a collection: who holds what, forced release
//! of stuck locks, and purging of expired lock documents.

use std::time::Duration;

use futures::TryStreamExt;
use mongodb::Collection;
use mongodb::bson::{Bson, DateTime, Document, doc};

use crate::schema::{ACQUIRED_AT, EXPIRES_AT, FENCING_TOKEN, ID, LOCK_ID, Layout, read_i64};
use crate::{FencingToken, Result};

/// What a lock document says, read at one server instant.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockStatus {
    /// The lock's name.
    pub name: String,
    /// The current holder's lock id, while the lock is held.
    pub holder: Option<String>,
    /// When the current (or last) holder acquired it, by server time.
    pub acquired_at: Option<DateTime>,
    /// When the lease ends (or ended), by server time.
    pub expires_at: Option<DateTime>,
    /// The fencing token of the current (or last) acquisition.
    pub fencing_token: Option<FencingToken>,
    /// How much of the lease is left by server time; `None` when the lock is not held.
    pub remaining: Option<Duration>,
}

impl LockStatus {
    /// Whether someone holds the lock (a holder with a live lease).
    pub fn is_held(&self) -> bool {
        self.remaining.is_some()
    }

    fn from_row(row: &Document) -> LockStatus {
        let date = |field| row.get_datetime(field).ok().copied();
        let now = date("now");
        let expires_at = date(EXPIRES_AT);
        let holder = row.get_str(LOCK_ID).ok().map(str::to_owned);
        let remaining = match (&holder, expires_at, now) {
            (Some(_), Some(expires_at), Some(now)) if expires_at > now => {
                let millis = expires_at.timestamp_millis() - now.timestamp_millis();
                Some(Duration::from_millis(u64::try_from(millis).unwrap_or(0)))
            }
            _ => None,
        };
        LockStatus {
            name: match row.get(ID) {
                Some(Bson::String(name)) => name.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            },
            holder,
            acquired_at: date(ACQUIRED_AT),
            expires_at,
            fencing_token: row
                .get(FENCING_TOKEN)
                .and_then(read_i64)
                .map(FencingToken::new),
            remaining,
        }
    }
}

/// The status of lock `name`, or `None` if it has no document.
pub(crate) async fn status(
    collection: &Collection<Document>,
    name: &str,
) -> Result<Option<LockStatus>> {
    let rows = read(collection, doc! { ID: name }).await?;
    Ok(rows.first().map(LockStatus::from_row))
}

/// Every lock that is held right now (by server time), by name.
pub(crate) async fn held(collection: &Collection<Document>) -> Result<Vec<LockStatus>> {
    let live = doc! {
        LOCK_ID: { "$exists": true },
        "$expr": Layout::LockDocument.live(),
    };
    let rows = read(collection, live).await?;
    Ok(rows.iter().map(LockStatus::from_row).collect())
}

async fn read(collection: &Collection<Document>, filter: Document) -> Result<Vec<Document>> {
    let rows = collection
        .aggregate([
            doc! { "$match": filter },
            doc! { "$addFields": { "now": "$$NOW" } },
            doc! { "$sort": { ID: 1 } },
        ])
        .await?
        .try_collect()
        .await?;
    Ok(rows)
}

/// Ends whatever lease `name` has, now. The document (and its fencing counter) stays.
pub(crate) async fn force_release(collection: &Collection<Document>, name: &str) -> Result<bool> {
    let result = collection
        .update_one(
            doc! { ID: name, LOCK_ID: { "$exists": true } },
            Layout::LockDocument.release_update(),
        )
        .await?;
    Ok(result.modified_count > 0)
}

/// Deletes lock documents whose lease ended strictly before now (server time).
pub(crate) async fn purge_expired(collection: &Collection<Document>) -> Result<u64> {
    let result = collection
        .delete_many(doc! {
            EXPIRES_AT: { "$type": "date" },
            "$expr": { "$lt": [format!("${EXPIRES_AT}"), "$$NOW"] },
        })
        .await?;
    Ok(result.deleted_count)
}
