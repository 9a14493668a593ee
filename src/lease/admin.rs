//! Inspection and administration: who holds what (every kind of lock, with the holders'
//! details), forced release of stuck leases of every kind, and purging of expired lock
//! documents.
//! Reads go to the primary with read concern `local`, whatever the client's defaults, so they
//! never show a lease the primary has already ended. Every delete and update is filtered on the
//! shape of the lock documents it means ([`Stored::shape`]), so none ever touches an
//! application's document, whatever collection it is pointed at.

use std::time::Duration;

use futures::TryStreamExt;
use mongodb::Collection;
use mongodb::bson::{Bson, DateTime, Document, doc};
use mongodb::options::{ReadConcern, ReturnDocument, WriteConcern};

use super::revoke;
use super::schema::{
    ACQUIRED_AT, DETAILS, EMBEDDED_ID, EXPIRES_AT, Ending, FENCING_TOKEN, HOLDERS, ID, LOCK_ID,
    Layout, MAX_COUNT, MIN_HOLD_UNTIL, PLACES, READERS, RENEWED_AT, RESIZED_AT, RETENTION, Stored,
    UPGRADEABLE, WAITING_WRITER, WRITER, end_lease, live_members, places_of, primary,
};
use crate::Revocation;
use crate::details::LockDetails;
use crate::error::{Error, Operation, Result, is_duplicate_key, shown_name};
use crate::lock_status::{LockKind, LockStatus};
use crate::options::LockOptions;
use crate::token::FencingToken;
use crate::token::read_i64;

/// How long an administration call (or a read of a lock's holders) waits for MongoDB: the
/// lock's `expiry`, at least [`MIN_ATTEMPT_WAIT`](super::protocol::MIN_ATTEMPT_WAIT). A reply
/// that has not come by then is behind a half-open connection, on which the driver would wait
/// for ever.
pub(crate) fn patience(options: &LockOptions) -> Duration {
    options.expiry().max(super::protocol::MIN_ATTEMPT_WAIT)
}

/// `call`, waited for at most `patience`; after that [`Error::NoReply`] (an
/// [`Operation::Administration`] on `subject`, a lock's or a collection's name).
pub(crate) async fn within<T>(
    patience: Duration,
    subject: &str,
    call: impl Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(patience, call)
        .await
        .unwrap_or_else(|_elapsed| {
            Err(Error::NoReply {
                operation: Operation::Administration,
                name: subject.to_owned(),
                waited: patience,
            })
        })
}

/// The server time added to each row read.
const NOW: &str = "now";

/// The status of the lease in `holder`, whose lock id is in `id_field`, at server time `now`.
fn of_holder(
    kind: LockKind,
    name: String,
    holder: &Document,
    id_field: &str,
    now: Option<DateTime>,
) -> LockStatus {
    let date = |field| holder.get_datetime(field).ok().copied();
    let expires_at = date(EXPIRES_AT);
    let holder_id = holder.get_str(id_field).ok().map(str::to_owned);
    let ahead = match (expires_at, now) {
        (Some(expires_at), Some(now)) if expires_at > now => {
            let millis = expires_at.timestamp_millis() - now.timestamp_millis();
            Some(Duration::from_millis(u64::try_from(millis).unwrap_or(0)))
        }
        _ => None,
    };
    let (remaining, kept) = match (&holder_id, kind) {
        (Some(_), _) => (ahead, None),
        // Nobody holds it, and its end is ahead: a finished holder's `min_hold` window.
        (None, LockKind::Exclusive) => (None, ahead),
        (None, _) => (None, None),
    };
    let revocation = match (kind, &holder_id, now) {
        (LockKind::Exclusive, Some(holder_id), Some(now)) => revocation_of(holder, holder_id, now),
        _ => None,
    };
    LockStatus {
        name,
        kind,
        lock_id: holder_id,
        acquired_at: date(ACQUIRED_AT),
        expires_at,
        renewed_at: date(RENEWED_AT),
        fencing_token: holder
            .get(FENCING_TOKEN)
            .and_then(read_i64)
            .map(FencingToken::new),
        remaining,
        kept,
        min_hold_until: date(MIN_HOLD_UNTIL),
        details: holder.get(DETAILS).and_then(LockDetails::from_bson),
        places: match kind {
            LockKind::Semaphore => u32::try_from(places_of(holder)).unwrap_or(u32::MAX),
            _ => 1,
        },
        upgradeable: kind == LockKind::Read && holder.get_bool(UPGRADEABLE) == Ok(true),
        revocation,
    }
}

/// The live revocation request stored in the exclusive lock document `row` that targets its
/// holder `holder_id`, as of server time `now`.
fn revocation_of(row: &Document, holder_id: &str, now: DateTime) -> Option<Revocation> {
    let request = revoke::stored(row)?;
    let live = request
        .expires_at
        .is_some_and(|expires_at| expires_at > now);
    if !live || request.target.as_deref() != Some(holder_id) {
        return None;
    }
    let grace_until = request.grace_until?;
    let left = grace_until
        .timestamp_millis()
        .saturating_sub(now.timestamp_millis());
    Some(Revocation {
        priority: request.priority,
        grace_until,
        grace_left: Duration::from_millis(u64::try_from(left).unwrap_or(0)),
        by_operator: !request.reserves,
    })
}

/// The name of the lock a row belongs to: its `_id`.
fn name_of(row: &Document) -> String {
    match row.get(ID) {
        Some(Bson::String(name)) => name.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    }
}

fn now_of(row: &Document) -> Option<DateTime> {
    row.get_datetime(NOW).ok().copied()
}

/// The status of the exclusive lock document `row`.
fn exclusive(row: &Document) -> LockStatus {
    of_holder(LockKind::Exclusive, name_of(row), row, LOCK_ID, now_of(row))
}

/// The status of exclusive lock `name`, or `None` if it has no document.
pub(crate) async fn status(
    collection: &Collection<Document>,
    name: &str,
) -> Result<Option<LockStatus>> {
    let rows = read(collection, doc! { ID: name }).await?;
    Ok(rows.first().map(exclusive))
}

/// The live holders of the exclusive locks of `collection` that match `filter`; with `kept`,
/// also the locks nobody holds that a finished holder's `min_hold` window keeps taken.
pub(crate) async fn held(
    collection: &Collection<Document>,
    filter: Document,
    kept: bool,
) -> Result<Vec<LockStatus>> {
    let mut live = if kept {
        doc! { "$expr": Layout::LockDocument.live() }
    } else {
        doc! {
            LOCK_ID: { "$exists": true },
            "$expr": Layout::LockDocument.live(),
        }
    };
    live.extend(filter);
    let rows = read(collection, live).await?;
    Ok(rows.iter().map(exclusive).collect())
}

/// The live writer and readers of the reader-writer locks of `collection` that match `filter`.
pub(crate) async fn reader_writer_holders(
    collection: &Collection<Document>,
    filter: Document,
) -> Result<Vec<LockStatus>> {
    let mut held = doc! { "$expr": reader_writer_held() };
    held.extend(filter);
    let mut holders = Vec::new();
    for row in read(collection, held).await? {
        let (name, now) = (name_of(&row), now_of(&row));
        if let Ok(writer) = row.get_document(WRITER) {
            let writer = of_holder(LockKind::Write, name, writer, EMBEDDED_ID, now);
            holders.extend(Some(writer).filter(LockStatus::is_held));
        }
        holders.extend(members(&row, READERS, LockKind::Read));
    }
    Ok(holders)
}

/// The live holders of the semaphores of `collection` that match `filter`.
pub(crate) async fn semaphore_holders(
    collection: &Collection<Document>,
    filter: Document,
) -> Result<Vec<LockStatus>> {
    let mut held = doc! { "$expr": semaphore_held() };
    held.extend(filter);
    let rows = read(collection, held).await?;
    Ok(rows
        .iter()
        .flat_map(|row| members(row, HOLDERS, LockKind::Semaphore))
        .collect())
}

/// The live holders of the documents of `collection` that match `filter`, locked in their
/// `field` (see `DocumentLock`), each named `collection/_id`.
pub(crate) async fn document_holders(
    collection: &Collection<Document>,
    filter: Document,
    field: &str,
) -> Result<Vec<LockStatus>> {
    let layout = Layout::Embedded(field.to_owned());
    let mut held = doc! { "$expr": layout.live() };
    held.extend(filter);
    let rows = read(collection, held).await?;
    Ok(rows
        .iter()
        .filter_map(|row| {
            let lease = row.get_document(field).ok()?;
            let id = row.get(ID).map_or_else(String::new, ToString::to_string);
            let name = format!("{}/{id}", collection.name());
            Some(of_holder(
                LockKind::Document,
                name,
                lease,
                EMBEDDED_ID,
                now_of(row),
            ))
        })
        .filter(LockStatus::is_held)
        .collect())
}

/// The holders with a live lease in array `field` of `row`.
fn members(row: &Document, field: &str, kind: LockKind) -> Vec<LockStatus> {
    let (name, now) = (name_of(row), now_of(row));
    let Ok(members) = row.get_array(field) else {
        return Vec::new();
    };
    members
        .iter()
        .filter_map(Bson::as_document)
        .map(|member| {
            let mut status = of_holder(kind, name.clone(), member, EMBEDDED_ID, now);
            // (A semaphore's request is stored beside its places.)
            if let (LockKind::Semaphore, Some(lock_id), Some(now)) = (kind, &status.lock_id, now) {
                status.revocation = revocation_of(row, lock_id, now);
            }
            status
        })
        .filter(LockStatus::is_held)
        .collect()
}

async fn read(collection: &Collection<Document>, filter: Document) -> Result<Vec<Document>> {
    let rows = collection
        .aggregate([
            doc! { "$match": filter },
            doc! { "$addFields": { NOW: "$$NOW" } },
            doc! { "$sort": { ID: 1 } },
        ])
        .selection_criteria(primary())
        .read_concern(ReadConcern::local())
        .await?
        .try_collect()
        .await?;
    Ok(rows)
}

/// `$expr`: a reader-writer lock document has a live writer or reader.
fn reader_writer_held() -> Document {
    doc! { "$or": [
        Layout::Writer.live(),
        { "$gt": [{ "$size": live_members(READERS, None) }, 0] },
    ] }
}

/// `$expr`: a semaphore document has a live holder.
fn semaphore_held() -> Document {
    doc! { "$gt": [{ "$size": live_members(HOLDERS, None) }, 0] }
}

/// Ends whatever lease `name` has, now, as its holder's release would (a `min_hold` window
/// stays). The document (and its fencing counter) stays.
pub(crate) async fn force_release(collection: &Collection<Document>, name: &str) -> Result<bool> {
    let result = collection
        .update_one(force_release_filter(name), force_release_update())
        .await?;
    Ok(result.modified_count > 0)
}

/// Asks the holder of exclusive lock `name` to let go within `grace_millis` (an operator's
/// revocation request, see `revoke`): the holder's status with the request, or `None` if nobody
/// holds the lock (nothing written then).
pub(crate) async fn request_revocation(
    collection: &Collection<Document>,
    name: &str,
    asked: revoke::Asked<'_>,
    grace_millis: i64,
) -> Result<Option<LockStatus>> {
    let id = format!("operator-{}", super::schema::new_lock_id());
    let (filter, pipeline) = revoke::operator_request(name, asked, &id, grace_millis);
    let written = collection
        .find_one_and_update(filter, pipeline)
        .return_document(ReturnDocument::After)
        .await?;
    let place = |lock_id: &str| {
        let lock_id = lock_id.to_owned();
        async move {
            Ok::<_, Error>(
                semaphore_holders(collection, doc! { ID: name })
                    .await?
                    .into_iter()
                    .find(|holder| holder.lock_id.as_deref() == Some(lock_id.as_str())),
            )
        }
    };
    match (written, asked) {
        (Some(_), revoke::Asked::Holder | revoke::Asked::Lease(_)) => {
            status(collection, name).await
        }
        (Some(_), revoke::Asked::Place(lock_id)) => place(lock_id).await,
        (None, revoke::Asked::Place(lock_id)) => match place(lock_id).await? {
            // Held, so another place's request stands.
            Some(_) => Err(Error::InvalidArgument(format!(
                "request_revocation_of: another place of semaphore {:?} is being asked to let go \
                 (one request per semaphore at a time); ask again once that one is over",
                shown_name(name)
            ))),
            None => Ok(None),
        },
        (None, _) => Ok(None),
    }
}

/// The update of [`force_release`]: the lease ends as its holder's release would, keeping a
/// `min_hold` window.
pub(crate) fn force_release_update() -> Vec<Document> {
    end_lease(Ending::Release)
}

/// The filter of [`force_release`]: exclusive lock `name` with a lease, whoever holds it, in a
/// document shaped like an exclusive lock's.
pub(crate) fn force_release_filter(name: &str) -> Document {
    doc! {
        ID: name,
        LOCK_ID: { "$exists": true },
        "$expr": Stored::Exclusive.shape(),
    }
}

/// Ends the lease `lock_id` of `name`, stored as `layout` says, as its holder's release would:
/// whether it was there.
pub(crate) async fn force_release_lease(
    collection: &Collection<Document>,
    layout: &Layout,
    name: &str,
    lock_id: &str,
) -> Result<bool> {
    let (filter, update) = force_release_lease_command(layout, name, lock_id);
    let result = collection.update_one(filter, update).await?;
    Ok(result.modified_count > 0)
}

/// The filter and update of [`force_release_lease`]: the lease's own release, in a document
/// shaped like a lock document of its kind.
pub(crate) fn force_release_lease_command(
    layout: &Layout,
    name: &str,
    lock_id: &str,
) -> (Document, Vec<Document>) {
    let mut filter = layout.release_filter(&name.into(), lock_id);
    if let Some(stored) = Stored::of_layout(layout) {
        filter.insert("$expr", stored.shape());
    }
    (filter, layout.release_update(lock_id, Ending::Release))
}

/// Ends every lease of reader-writer lock `name` (its writer's, its readers', a waiting
/// writer's marker), keeping the writer's fencing token: whether any was live.
pub(crate) async fn force_release_reader_writer(
    collection: &Collection<Document>,
    name: &str,
) -> Result<bool> {
    let (filter, update) = force_release_reader_writer_command(name);
    Ok(collection.update_one(filter, update).await?.modified_count > 0)
}

/// The filter and update pipeline of [`force_release_reader_writer`].
pub(crate) fn force_release_reader_writer_command(name: &str) -> (Document, Vec<Document>) {
    let filter = doc! {
        ID: name,
        "$expr": { "$and": [reader_writer_held(), Stored::ReaderWriter.shape()] },
    };
    let token_only = doc! { FENCING_TOKEN: format!("${WRITER}.{FENCING_TOKEN}") };
    let update = vec![doc! { "$set": {
        READERS: [],
        WRITER: token_only,
        WAITING_WRITER: "$$REMOVE",
    } }];
    (filter, update)
}

/// Semaphore `name`'s stored count (`None` without a document) and the places its live leases
/// take, read at one server instant from the primary.
pub(crate) async fn semaphore_places(
    collection: &Collection<Document>,
    name: &str,
) -> Result<(Option<i64>, i64)> {
    let taken = doc! { "$sum": { "$map": {
        "input": live_members(HOLDERS, None),
        "as": "m",
        "in": { "$ifNull": [format!("$$m.{PLACES}"), 1] },
    } } };
    let rows: Vec<Document> = collection
        .aggregate([
            doc! { "$match": { ID: name, "$expr": Stored::Semaphore.shape() } },
            doc! { "$project": { MAX_COUNT: 1, "taken": taken } },
        ])
        .selection_criteria(primary())
        .read_concern(ReadConcern::local())
        .await?
        .try_collect()
        .await?;
    let Some(row) = rows.first() else {
        return Ok((None, 0));
    };
    let taken = row.get("taken").and_then(read_i64).unwrap_or(0);
    Ok((row.get(MAX_COUNT).and_then(read_i64), taken))
}

/// Sets semaphore `name`'s count to `max_count` for every caller (see
/// `MongoDistributedSemaphore::set_max_count`), creating its document if need be; refused when a
/// document of that name is not a semaphore's (it is left as it is).
pub(crate) async fn set_semaphore_count(
    collection: &Collection<Document>,
    name: &str,
    max_count: u32,
    write_concern: &WriteConcern,
) -> Result<()> {
    let (filter, update) = set_semaphore_count_command(name, max_count);
    let set = || {
        collection
            .find_one_and_update(filter.clone(), update.clone())
            .upsert(true)
            .return_document(ReturnDocument::After)
            .write_concern(write_concern.clone())
    };
    // A first acquisition of the name may insert its document between our look and our insert:
    // a duplicate key, after which the document exists and the second try updates it.
    let stored = match set().await {
        Err(error) if is_duplicate_key(&error) => set().await?,
        other => other?,
    };
    let counted = stored.as_ref().is_some_and(|stored| {
        stored.get(MAX_COUNT).and_then(read_i64) == Some(i64::from(max_count))
            && stored.get_datetime(RESIZED_AT).is_ok()
            && stored.get_array(HOLDERS).is_ok()
    });
    if !counted {
        return Err(Error::InvalidArgument(format!(
            "set_max_count: the document {:?} in {:?} is not a semaphore's",
            shown_name(name),
            collection.name()
        )));
    }
    Ok(())
}

/// The filter and update pipeline of [`set_semaphore_count`] (a `findAndModify` with upsert):
/// the filter names the document only, since MongoDB allows no `$expr` in an upsert's filter, and
/// the pipeline changes it only if it is shaped like a semaphore's, or new (`_id` alone): then
/// it sets the count, `resizedAt`, the holders (none for a new one) and keeps the document at
/// least until now (its retention counts from there); any other document stays as it is.
pub(crate) fn set_semaphore_count_command(name: &str, max_count: u32) -> (Document, Vec<Document>) {
    let new = doc! { "$eq": [{ "$size": { "$objectToArray": "$$ROOT" } }, 1] };
    let counted = doc! { "$mergeObjects": ["$$ROOT", {
        MAX_COUNT: i64::from(max_count),
        RESIZED_AT: "$$NOW",
        HOLDERS: { "$ifNull": [format!("${HOLDERS}"), []] },
        EXPIRES_AT: { "$max": [format!("${EXPIRES_AT}"), "$$NOW"] },
    }] };
    let update = vec![doc! { "$replaceWith": { "$cond": [
        { "$or": [new, Stored::Semaphore.shape()] },
        counted,
        "$$ROOT",
    ] } }];
    (doc! { ID: name }, update)
}

/// Ends every lease of semaphore `name`, keeping its fencing token: whether any was live.
pub(crate) async fn force_release_semaphore(
    collection: &Collection<Document>,
    name: &str,
) -> Result<bool> {
    let (filter, update) = force_release_semaphore_command(name);
    Ok(collection.update_one(filter, update).await?.modified_count > 0)
}

/// The filter and update (of operators) of [`force_release_semaphore`].
pub(crate) fn force_release_semaphore_command(name: &str) -> (Document, Document) {
    let filter = doc! {
        ID: name,
        "$expr": { "$and": [semaphore_held(), Stored::Semaphore.shape()] },
    };
    (filter, doc! { "$set": { HOLDERS: [] } })
}

/// The filter of the lock documents of `kinds` whose last lease ended more than [`RETENTION`]
/// before now (server time): what the TTL index deletes, and nothing that is not a lock
/// document.
pub(crate) fn expired(kinds: &[Stored]) -> Document {
    let retention_millis = i64::try_from(RETENTION.as_millis()).unwrap_or(i64::MAX);
    let retained_until = doc! { "$add": [format!("${EXPIRES_AT}"), retention_millis] };
    doc! {
        EXPIRES_AT: { "$type": "date" },
        "$expr": { "$and": [
            { "$lt": [retained_until, "$$NOW"] },
            Stored::any_shape(kinds),
        ] },
    }
}

/// How many documents [`check_lock_collection`] reads: the first ones by `_id`.
const SAMPLE: i32 = 100;

/// [`Error::NotALockCollection`] unless most of the first [`SAMPLE`] documents of
/// `collection` (by `_id`) are lock documents of `kinds`: a collection named by mistake, or one
/// shared with application data, is refused before anything in it is deleted.
pub(crate) async fn check_lock_collection(
    collection: &Collection<Document>,
    kinds: &[Stored],
) -> Result<()> {
    const IS_LOCK: &str = "isLock";
    let rows: Vec<Document> = collection
        .aggregate([
            doc! { "$sort": { ID: 1 } },
            doc! { "$limit": SAMPLE },
            doc! { "$project": { ID: 1, IS_LOCK: Stored::any_shape(kinds) } },
        ])
        .selection_criteria(primary())
        .read_concern(ReadConcern::local())
        .await?
        .try_collect()
        .await?;
    let others: Vec<String> = rows
        .iter()
        .filter(|row| row.get_bool(IS_LOCK) != Ok(true))
        .map(name_of)
        .collect();
    if others.len() * 2 <= rows.len() {
        return Ok(());
    }
    let examples: Vec<String> = others
        .iter()
        .take(3)
        .map(|name| format!("{:?}", shown_name(name)))
        .collect();
    Err(Error::NotALockCollection {
        collection: collection.name().to_owned(),
        reason: format!(
            "{} of its first {} documents (by _id) are not {} lock documents, for example _id {}",
            others.len(),
            rows.len(),
            kinds_text(kinds),
            examples.join(", ")
        ),
    })
}

/// `exclusive`, `exclusive or semaphore`...
fn kinds_text(kinds: &[Stored]) -> String {
    let names: Vec<&str> = kinds
        .iter()
        .map(|kind| match kind {
            Stored::Exclusive => "exclusive",
            Stored::ReaderWriter => "reader-writer",
            Stored::Semaphore => "semaphore",
        })
        .collect();
    names.join(" or ")
}

/// How many lock documents of `kinds` in `collection` [`purge_expired`] would delete now, and
/// the names of the first `names` of them (by name).
pub(crate) async fn purgeable(
    collection: &Collection<Document>,
    kinds: &[Stored],
    names: usize,
) -> Result<(u64, Vec<String>)> {
    let count = collection
        .count_documents(expired(kinds))
        .selection_criteria(primary())
        .read_concern(ReadConcern::local())
        .await?;
    let first: Vec<Document> = collection
        .find(expired(kinds))
        .projection(doc! { ID: 1 })
        .sort(doc! { ID: 1 })
        .limit(i64::try_from(names).unwrap_or(i64::MAX))
        .selection_criteria(primary())
        .read_concern(ReadConcern::local())
        .await?
        .try_collect()
        .await?;
    Ok((count, first.iter().map(name_of).collect()))
}

/// Deletes the lock documents of `kinds` whose lease ended more than [`RETENTION`] before now
/// (server time), and nothing else.
pub(crate) async fn purge_expired(
    collection: &Collection<Document>,
    kinds: &[Stored],
) -> Result<u64> {
    let result = collection.delete_many(expired(kinds)).await?;
    Ok(result.deleted_count)
}
