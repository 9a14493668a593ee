//! The renewal commands: what one round of the renewal loop sends for a batch of leases, and
//! what its reply says (see `renewal` for when and why).

use std::collections::HashSet;
use std::time::Duration;

use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};
use mongodb::options::{ReadConcern, ReturnDocument};

use super::protocol;
use super::record::Place;
use super::schema::{self, LIVE_LOCK_IDS};
use crate::clock;
use crate::error::error_code;

/// The largest `maxTimeMS` a server accepts (a 32-bit count of milliseconds).
pub(crate) const MAX_TIME_LIMIT: Duration = Duration::from_millis(i32::MAX as u64);

/// MaxTimeMSExpired: the command ran out of its server-side time limit.
const MAX_TIME_MS_EXPIRED: i32 = 50;

/// NotAReplicaSet: the server is a standalone.
const NOT_A_REPLICA_SET: i32 = 123;

/// ShardKeyNotFound: a `findAndModify` on a sharded collection without the shard key in its
/// filter (before MongoDB 7.0).
const SHARD_KEY_NOT_FOUND: i32 = 61;

/// A renewal command's answer.
pub(crate) struct Reply {
    pub(crate) renewed: Renewed,
    /// The server's clock when it ran the command (a `findAndModify` tells it), in ms since the
    /// epoch.
    pub(crate) server_millis: Option<i64>,
    pub(crate) received_at: clock::Instant,
}

/// Which leases of a renewal are still ours.
pub(crate) enum Renewed {
    All,
    Only(HashSet<String>),
}

/// Why a renewal command failed.
pub(crate) enum Failure {
    /// It ran out of its server-side time limit: a document of it is held back (by a
    /// transaction), or the server is very slow.
    TimeLimit,
    /// The server refused a `findAndModify` filtered on `_id` alone: the collection is sharded
    /// on another key (a document lock's collection) and the server is older than 7.0, which
    /// needs the shard key in a `findAndModify`'s filter.
    ShardKeyRequired,
    Other(String),
}

impl From<mongodb::error::Error> for Failure {
    fn from(error: mongodb::error::Error) -> Failure {
        match error_code(&error) {
            Some(MAX_TIME_MS_EXPIRED) => Failure::TimeLimit,
            Some(SHARD_KEY_NOT_FOUND) => Failure::ShardKeyRequired,
            _ => Failure::Other(error.to_string()),
        }
    }
}

/// Renews one lease with a `findAndModify` whose reply shows its new `expiresAt`, hence the
/// server's clock (`expiresAt − expiry`: the command wrote `$$NOW + expiry`).
pub(crate) async fn renew_one(
    place: &Place,
    id: &Bson,
    lock_id: &str,
    time_limit: Duration,
) -> std::result::Result<Reply, Failure> {
    let Place {
        collection,
        layout,
        options,
        ..
    } = place;
    let lock_ids = [lock_id.to_owned()];
    let ids = [id.clone()];
    let renewed = collection
        .find_one_and_update(
            layout.renew_many_filter(&ids, &lock_ids),
            layout.renew_update(options, &lock_ids),
        )
        .projection(layout.lease_projection(lock_id))
        .return_document(ReturnDocument::After)
        .write_concern(options.write_concern().clone())
        .max_time(time_limit)
        .await?;
    let received_at = clock::now();
    let Some(document) = renewed else {
        return Ok(Reply {
            renewed: Renewed::Only(HashSet::new()),
            server_millis: None,
            received_at,
        });
    };
    let server_millis = layout.renewed_at_millis(&document, lock_id, options.expiry_millis());
    Ok(Reply {
        renewed: Renewed::All,
        server_millis,
        received_at,
    })
}

/// Renews every listed lease that is still ours and live, in one `update` command with a time
/// limit (the driver's `update_many` cannot send one); only when some did not match does a
/// second command find out which. That read goes to the primary with read concern
/// `linearizable`: a secondary, or a primary deposed without knowing it yet, could show a lease
/// as ours and live after the real primary gave it away.
pub(crate) async fn renew_many(
    place: &Place,
    ids: &[Bson],
    lock_ids: &[String],
    time_limit: Duration,
) -> std::result::Result<Reply, Failure> {
    let Place {
        collection,
        layout,
        options,
        ..
    } = place;
    let (matched, received_at) = update(
        place,
        layout.renew_many_filter(ids, lock_ids),
        layout.renew_update(options, lock_ids),
        time_limit,
    )
    .await?;
    if protocol::renewed_every_lease(matched, lock_ids.len()) {
        return Ok(Reply {
            renewed: Renewed::All,
            server_millis: None,
            received_at,
        });
    }
    // Leases just renewed are live now; the others are gone for good.
    let read = |concern: ReadConcern| {
        collection
            .aggregate(layout.live_lock_ids(ids, lock_ids))
            .selection_criteria(schema::primary())
            .read_concern(concern)
    };
    let cursor = match read(ReadConcern::linearizable()).await {
        // A standalone server refuses `linearizable`; with no secondary and no other primary,
        // `local` is exact there.
        Err(error) if error_code(&error) == Some(NOT_A_REPLICA_SET) => {
            read(ReadConcern::local()).await?
        }
        other => other?,
    };
    let rows: Vec<Document> = cursor.try_collect().await?;
    let live = rows
        .iter()
        .filter_map(|row| row.get_array(LIVE_LOCK_IDS).ok())
        .flatten()
        .filter_map(|lock_id| lock_id.as_str().map(str::to_owned))
        .collect();
    Ok(Reply {
        renewed: Renewed::Only(live),
        server_millis: None,
        received_at,
    })
}

/// What became of an extension.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Extended {
    Yes,
    /// The lease is gone (ended, or taken over).
    Gone,
    /// The lease is live, but a revocation request targets it: not extended.
    Refused,
}

/// Extends the lease `lock_id` of document `id` to at least `$$NOW + by_millis` (a guard's
/// `extend`), in one `update` command with a time limit, filtered on the lease being ours and
/// live and on no revocation request targeting it ([`Layout::extend_filter`]). Only if that
/// matched nothing, a second command (a count with the renewal's filter, at the primary) tells
/// a lease gone from one a request targets.
///
/// [`Layout::extend_filter`]: super::schema::Layout::extend_filter
pub(crate) async fn extend_one(
    place: &Place,
    id: &Bson,
    lock_id: &str,
    by_millis: i64,
    time_limit: Duration,
) -> std::result::Result<Extended, Failure> {
    let Place {
        collection,
        layout,
        options,
        ..
    } = place;
    let (matched, _) = update(
        place,
        layout.extend_filter(id, lock_id),
        layout.extend_update(options, lock_id, by_millis),
        time_limit,
    )
    .await?;
    if matched.is_some_and(|matched| matched > 0) {
        return Ok(Extended::Yes);
    }
    // (Only an exclusive lock's lease and a semaphore's place can be asked to let go.)
    let revocable = match layout {
        super::schema::Layout::LockDocument => true,
        super::schema::Layout::Members(field) => field == super::schema::HOLDERS,
        _ => false,
    };
    if !revocable {
        return Ok(Extended::Gone);
    }
    let lock_ids = [lock_id.to_owned()];
    let live = collection
        .count_documents(layout.renew_many_filter(std::slice::from_ref(id), &lock_ids))
        .selection_criteria(schema::primary())
        .max_time(time_limit)
        .await?;
    Ok(if live > 0 {
        Extended::Refused
    } else {
        Extended::Gone
    })
}

/// Sends one `update` command of every document `filter` matches with the pipeline `pipeline`,
/// with the server-side time limit `time_limit` (the driver's `update_many` cannot send one)
/// and the lock's write concern, to the primary. Returns how many documents matched and when
/// the reply came.
async fn update(
    place: &Place,
    filter: Document,
    pipeline: Vec<Document>,
    time_limit: Duration,
) -> std::result::Result<(Option<i64>, clock::Instant), Failure> {
    let Place {
        collection,
        options,
        ..
    } = place;
    let mut command = doc! {
        "update": collection.name(),
        "updates": [{ "q": filter, "u": pipeline, "multi": true }],
        "maxTimeMS": i64::try_from(time_limit.as_millis()).unwrap_or(i64::MAX),
    };
    let write_concern = mongodb::bson::to_document(options.write_concern())
        .map_err(|error| Failure::Other(error.to_string()))?;
    if !write_concern.is_empty() {
        command.insert("writeConcern", write_concern);
    }
    let reply = collection
        .client()
        .database(&collection.namespace().db)
        .run_command(command)
        .selection_criteria(schema::primary())
        .await?;
    let received_at = clock::now();
    if let Some(failure) = write_failure(&reply) {
        return Err(failure);
    }
    Ok((reply.get("n").and_then(crate::token::read_i64), received_at))
}

/// The failure an `update` command's reply reports besides `ok: 0` (which the driver turns into
/// an error): a write error, or a write-concern error (the renewal may or may not be durable).
fn write_failure(reply: &Document) -> Option<Failure> {
    if let Ok(errors) = reply.get_array("writeErrors")
        && let Some(error) = errors.first().and_then(Bson::as_document)
    {
        let code = error.get("code").and_then(crate::token::read_i64);
        if code == Some(i64::from(MAX_TIME_MS_EXPIRED)) {
            return Some(Failure::TimeLimit);
        }
        return Some(Failure::Other(format!(
            "write error {code:?}: {}",
            error.get_str("errmsg").unwrap_or_default()
        )));
    }
    if let Ok(error) = reply.get_document("writeConcernError") {
        return Some(Failure::Other(format!(
            "write concern error: {}",
            error.get_str("errmsg").unwrap_or_default()
        )));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_errors_and_time_limits_in_update_replies_are_failures() {
        assert!(write_failure(&doc! { "n": 1, "ok": 1 }).is_none());
        let timed_out = doc! { "n": 0, "writeErrors": [{ "index": 0, "code": 50, "errmsg": "operation exceeded time limit" }] };
        assert!(matches!(
            write_failure(&timed_out),
            Some(Failure::TimeLimit)
        ));
        let other = doc! { "n": 0, "writeErrors": [{ "index": 0, "code": 2, "errmsg": "bad" }] };
        assert!(matches!(write_failure(&other), Some(Failure::Other(_))));
        let concern = doc! { "n": 1, "writeConcernError": { "code": 64, "errmsg": "waiting for replication timed out" } };
        assert!(matches!(write_failure(&concern), Some(Failure::Other(_))));
    }
}
