//! The stored form of every kind of lock: field names, and the expressions and pipelines that
//! read and change leases.
//!
//! An exclusive lock document has DistributedLock.MongoDB's layout, so .NET and Rust services
//! can share locks:
//! `{ _id: <name>, lockId: <string>, expiresAt: <date>, acquiredAt: <date>, fencingToken: <long> }`
//! and no other field (unless details are stored, or the lock has a `min_hold`: see
//! [`acquire_update`]; or its holder extended its lease, which records `renewedAt` until the
//! next holder's acquisition rewrites the document: see [`Layout::lengthen`]). Reader-writer locks, semaphores and
//! document locks keep their leases as embedded documents `{id, expiresAt, ...}` (see
//! [`Layout`]); a reader-writer lock or semaphore document also keeps a top-level `expiresAt`,
//! never earlier than the end of any lease it holds (see [`retain`]), so the same TTL index and
//! purge remove it a [`RETENTION`] after its last lease ended.

use std::time::Duration;

use mongodb::bson::{Bson, Document, doc};
use mongodb::options::{ReadPreference, SelectionCriteria};

use crate::options::LockOptions;
use crate::token::read_i64;

pub(crate) const ID: &str = "_id";
pub(crate) const LOCK_ID: &str = "lockId";
pub(crate) const EXPIRES_AT: &str = "expiresAt";
pub(crate) const ACQUIRED_AT: &str = "acquiredAt";
/// When the holder last acquired or renewed its lease (not in .NET's layout: an exclusive lock
/// document has it only when it stores details).
pub(crate) const RENEWED_AT: &str = "renewedAt";
pub(crate) const FENCING_TOKEN: &str = "fencingToken";
/// A holder's [`LockDetails`](crate::LockDetails), where stored.
pub(crate) const DETAILS: &str = "details";
/// Until when an exclusive lock stays taken whatever becomes of its holder: `acquiredAt +
/// min_hold`, by the server's clock (not in .NET's layout: only a lock with a
/// [`min_hold`](crate::LockOptions::min_hold) has it). Stored so that every way of ending the
/// lease keeps the window, a forced release by someone who does not know the holder's options
/// included.
pub(crate) const MIN_HOLD_UNTIL: &str = "minHoldUntil";
/// The lock id's field inside an embedded lock.
pub(crate) const EMBEDDED_ID: &str = "id";

/// A reader-writer lock's array of readers' leases.
pub(crate) const READERS: &str = "readers";
/// Marks the one reader of a reader-writer lock that may become its writer (`true`, in that
/// reader's lease).
pub(crate) const UPGRADEABLE: &str = "upgradeable";
/// A reader-writer lock's writer lease.
pub(crate) const WRITER: &str = "writer";
/// A reader-writer lock's marker of the writer that waits first.
pub(crate) const WAITING_WRITER: &str = "waitingWriter";
/// A fair lock's line of waits under way, in arrival order: `[{id, expiresAt}]`.
pub(crate) const LINE: &str = "line";
/// A fair lock's wait whose place in line the current (or last) lease came from.
pub(crate) const SERVED_WAIT: &str = "servedWait";
/// A semaphore's array of holders' leases.
pub(crate) const HOLDERS: &str = "holders";
/// A semaphore's number of places.
pub(crate) const MAX_COUNT: &str = "maxCount";
/// A waiting marker's lease (a waiting writer's, a semaphore's mark, a fair lock's place in
/// line): longer than the longest sleep between two attempts, each of which renews it.
pub(crate) fn marker_lease_millis(options: &LockOptions) -> i64 {
    let lease = options.busy_wait_sleep_time().1 * 2 + Duration::from_secs(1);
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX)
}

/// Expression, inside a `$map` or `$filter` over an array of leases `as: "m"`: the member `m`
/// may be renewed: no live revocation request targets it whose grace is over (see `revoke`).
fn member_renewable() -> Document {
    doc! { "$or": [
        { "$lte": [request_path(EXPIRES_AT), "$$NOW"] },
        { "$ne": [request_path(TARGET), format!("$$m.{EMBEDDED_ID}")] },
        { "$gt": [request_path(GRACE_UNTIL), "$$NOW"] },
    ] }
}

/// Expression: the members of array `field` whose id is one of `lock_ids`, whose lease is live
/// by server time, and which may be renewed (no revocation's grace is over for them): what a
/// renewal of those leases renews.
pub(crate) fn renewable_members(field: &str, lock_ids: &[String]) -> Document {
    doc! { "$filter": {
        "input": { "$ifNull": [format!("${field}"), []] },
        "as": "m",
        "cond": renewable_member(lock_ids),
    } }
}

/// Expression, over a member `m`: one of `lock_ids`, live and renewable.
fn renewable_member(lock_ids: &[String]) -> Document {
    doc! { "$and": [
        { "$in": [format!("$$m.{EMBEDDED_ID}"), lock_ids] },
        { "$gt": [format!("$$m.{EXPIRES_AT}"), "$$NOW"] },
        member_renewable(),
    ] }
}

/// How many places a semaphore holder's lease takes, when more than one.
pub(crate) const PLACES: &str = "places";
/// A semaphore's marker of the waiter for several places that waits first: `{id, places,
/// expiresAt}`.
pub(crate) const WAITING: &str = "waiting";
/// When a semaphore's `maxCount` was last set by `set_max_count`: from then on it is the count,
/// whatever its callers were built with.
pub(crate) const RESIZED_AT: &str = "resizedAt";

/// A fresh lock id: names one acquisition attempt and, if it wins, the lease.
pub(crate) fn new_lock_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Name of the TTL index on `expiresAt`.
pub(crate) const TTL_INDEX_NAME: &str = "expiresAt_ttl";

/// How long a lock document (of any kind but document locks) is kept after its last lease
/// ended before the TTL index (or `purge_expired`) deletes it.
///
/// Fencing tokens (of exclusive locks, writers and semaphore places) are
/// `max(previous + 1, $$NOW in ms × 1000)`. While the document exists the
/// first term makes them increase whatever any clock says; once it is gone only the second
/// term is left, evaluated by whichever router or primary runs the next acquisition. Keeping
/// documents a day means a token could go backwards only if that server's clock were behind
/// the previous acquirer's by more than a day.
pub(crate) const RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// Reads whose result the crate acts on go to the primary, whatever the client's default read
/// preference (a lagging secondary could show a lease the primary already ended).
pub(crate) fn primary() -> SelectionCriteria {
    SelectionCriteria::ReadPreference(ReadPreference::Primary)
}

/// The pipeline update of an acquisition attempt, run with `find_one_and_update` on
/// `{_id: name}`, `upsert: true`, returning the document after the update.
///
/// When the stored lease is missing or over (`expiresAt <= $$NOW`; a missing or non-date value
/// sorts below every date) the attempt writes the new holder's document: our `lockId`, a fresh
/// lease and the next fencing token; otherwise the document stays as it is (`$$ROOT`). The
/// caller then compares the returned `lockId` with its own. The fencing token is
/// `max(previous + 1, $$NOW in ms × 1000)`, where a previous value that is not a number counts
/// as 0.
///
/// The new holder's document is written whole, so everything that described the previous holder
/// goes: it holds `details` (an opt-in that .NET clients cannot read) and `renewedAt` only if
/// this holder stores details, and `minHoldUntil` only with a [`min_hold`](LockOptions::min_hold),
/// whose lease lasts until then at least. A lock without either keeps DistributedLock.MongoDB's
/// five fields, whoever held it before. (One `$cond` for the whole document also costs the
/// server less than one per field.)
///
/// A lock reserved for a revoking waiter (see `revoke`) is not free for anyone else.
///
/// With `replacing`, a release hands the lock over to a waiter in the same command (run on
/// `{_id: name, lockId: {$in: [replacing, lock_id]}}` without upsert): the lease with that lock
/// id ends first, as its release would, and the waiter takes the lock as its own attempt would
/// (not while it is reserved for someone else: the release then goes through alone).
pub(crate) fn acquire_update(
    lock_id: &str,
    options: &LockOptions,
    details: Option<&Document>,
    replacing: Option<&str>,
) -> Vec<Document> {
    let free = doc! { "$and": [
        { "$lte": [format!("${EXPIRES_AT}"), "$$NOW"] },
        not_reserved_for_other(None),
    ] };
    let holder = new_holder(lock_id, options, details);
    let mut stages: Vec<Document> = replacing.map(end_releasing).into_iter().collect();
    stages.push(doc! { "$replaceWith": { "$cond": [free, holder, "$$ROOT"] } });
    stages
}

/// The lock document of a new holder `lock_id` (an expression): its lease, the next fencing
/// token, its details and `min_hold` window if any.
pub(crate) fn new_holder(
    lock_id: &str,
    options: &LockOptions,
    details: Option<&Document>,
) -> Document {
    let mut holder = doc! {
        ID: format!("${ID}"),
        LOCK_ID: lock_id,
        EXPIRES_AT: lease_end(options.acquired_lease_millis()),
        ACQUIRED_AT: "$$NOW",
        FENCING_TOKEN: next_fencing_token(FENCING_TOKEN),
    };
    if let Some(details) = details {
        holder.insert(DETAILS, literal(details));
    }
    let min_hold = options.min_hold_millis();
    if details.is_some() || min_hold.is_some() {
        holder.insert(RENEWED_AT, "$$NOW");
    }
    if let Some(min_hold) = min_hold {
        holder.insert(MIN_HOLD_UNTIL, lease_end(min_hold));
    }
    holder
}

/// The filter of an acquisition attempt on the lock document `id` (an upsert run with
/// [`acquire_update`]): the name alone, since the update decides whether the lock is free.
pub(crate) fn attempt_filter(id: impl Into<Bson>) -> Document {
    doc! { ID: id.into() }
}

/// The filter of a release that hands the lease `releasing` (stored as `from` says) of document
/// `id` over to waiters whose leases are stored as `to` says (run with their takeover
/// pipelines): the releasing lease, or one of the waiters' should an earlier try have applied.
/// An exclusive lock's is `{_id, lockId: {$in: [releasing, waiter]}}`.
pub(crate) fn transfer_filter(
    id: &Bson,
    from: &Layout,
    releasing: &str,
    to: &Layout,
    waiters: &[&str],
) -> Document {
    let (from, to) = (from.lock_id_path(), to.lock_id_path());
    if from == to {
        let mut lock_ids = vec![releasing];
        lock_ids.extend_from_slice(waiters);
        return doc! { ID: id.clone(), from: { "$in": lock_ids } };
    }
    doc! {
        ID: id.clone(),
        "$or": [{ from: releasing }, { to: { "$in": waiters } }],
    }
}

/// `value` as a constant inside an aggregation expression: strings starting with `$` and
/// `$`-prefixed keys in application data must not be read as field paths or operators.
pub(crate) fn literal(value: &Document) -> Bson {
    Bson::Document(doc! { "$literal": value.clone() })
}

// Revocation requests (see `revoke`): the stored form, and the conditions every exclusive
// lease's commands check.

/// The field of an exclusive lock's document that holds a revocation request.
pub(crate) const REVOKE: &str = "revoke";
pub(crate) const TARGET: &str = "target";
pub(crate) const GRACE_UNTIL: &str = "graceUntil";
pub(crate) const PRIORITY: &str = "priority";
pub(crate) const RESERVES: &str = "reserves";
pub(crate) const REQUEST_ID: &str = "id";

/// A request's field `field`, as an expression's path.
pub(crate) fn request_path(field: &str) -> String {
    format!("${REVOKE}.{field}")
}

/// Expression: the stored request's own lease is live.
pub(crate) fn request_live() -> Document {
    doc! { "$gt": [request_path(EXPIRES_AT), "$$NOW"] }
}

/// Expression: no stored request is live (a missing `revoke` sorts below every date).
fn lapsed() -> Document {
    doc! { "$lte": [request_path(EXPIRES_AT), "$$NOW"] }
}

/// Expression: the stored request asks to end the lease now stored (`lockId`).
pub(crate) fn targets_holder() -> Document {
    doc! { "$and": [
        { "$eq": [{ "$type": request_path(TARGET) }, "string"] },
        { "$eq": [request_path(TARGET), format!("${LOCK_ID}")] },
    ] }
}

/// Expression: the stored request does not target the lease now stored.
fn targets_another() -> Document {
    doc! { "$or": [
        { "$ne": [{ "$type": request_path(TARGET) }, "string"] },
        { "$ne": [request_path(TARGET), format!("${LOCK_ID}")] },
    ] }
}

/// Expression: the stored lease may be renewed: no live request targets it whose grace is over.
/// A renewal's filter requires it (with MongoDB's `$not`, which not every server speaks, the
/// negation is written out).
pub(crate) fn renewable() -> Document {
    doc! { "$or": [lapsed(), targets_another(), { "$gt": [request_path(GRACE_UNTIL), "$$NOW"] }] }
}

/// Expression: the stored lease may be extended by a guard's `extend`: no live request targets
/// it, grace over or not (an extension must not push the takeover back).
pub(crate) fn extendable() -> Document {
    doc! { "$or": [lapsed(), targets_another()] }
}

/// Expression: the stored request stands: live, and either it still targets the holder or it
/// reserves the lock for its asker. Only a request of higher priority replaces a standing one.
pub(crate) fn standing() -> Document {
    doc! { "$and": [
        request_live(),
        { "$or": [targets_holder(), { "$eq": [request_path(RESERVES), true] }] },
    ] }
}

/// Expression: the lock is not reserved for another wait than `wait` (any wait, with `None`):
/// no live request that reserves it is stored, or it is `wait`'s.
pub(crate) fn not_reserved_for_other(wait: Option<&str>) -> Document {
    let mut conditions = vec![
        Bson::from(lapsed()),
        doc! { "$ne": [request_path(RESERVES), true] }.into(),
    ];
    if let Some(wait) = wait {
        conditions.push(doc! { "$eq": [request_path(REQUEST_ID), wait] }.into());
    }
    doc! { "$or": conditions }
}

/// The stage of a release in this process that hands the lock over in its command: the releasing
/// lease ends first, as its release would (`min_hold` window kept).
pub(crate) fn end_releasing(releasing: &str) -> Document {
    let is_releasing = doc! { "$eq": [format!("${LOCK_ID}"), releasing] };
    doc! { "$set": {
        EXPIRES_AT: { "$cond": [&is_releasing, released_end(), format!("${EXPIRES_AT}")] },
        LOCK_ID: { "$cond": [&is_releasing, "$$REMOVE", format!("${LOCK_ID}")] },
    } }
}

/// The next fencing token after the one stored at `path`: `max(previous + 1, $$NOW in ms × 1000)`,
/// where a previous value that is not a number counts as 0 (it must never make a lock
/// unacquirable).
pub(crate) fn next_fencing_token(path: &str) -> Document {
    let previous = doc! {
        "$convert": { "input": format!("${path}"), "to": "long", "onError": 0_i64, "onNull": 0_i64 }
    };
    doc! {
        "$max": [
            { "$add": [previous, 1_i64] },
            { "$multiply": [{ "$toLong": "$$NOW" }, 1000_i64] },
        ]
    }
}

/// `$$NOW + expiry`, computed by the server.
pub(crate) fn lease_end(expiry_millis: i64) -> Bson {
    Bson::Document(doc! { "$add": ["$$NOW", expiry_millis] })
}

/// The last stage of every command that gives a reader-writer lock or semaphore document a
/// lease ending at most `lease_millis` from now: raises the document's top-level `expiresAt` to
/// that end. It is then never earlier than any lease the document holds (releases only remove
/// leases), so the TTL index and `purge_expired`, which look at it alone, cannot delete a
/// document with a live lease, and delete the others [`RETENTION`] after their last lease ended.
pub(crate) fn retain(lease_millis: i64) -> Document {
    let top: Bson = format!("${EXPIRES_AT}").into();
    doc! { "$set": { EXPIRES_AT: { "$max": [top, lease_end(lease_millis)] } } }
}

/// Where a lease lives in its document.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Layout {
    /// A document of its own in a lock collection, in DistributedLock.MongoDB's schema.
    LockDocument,
    /// Embedded in a business document under this field:
    /// `{<field>: {id, expiresAt, fencingToken}}`.
    Embedded(String),
    /// The writer of a reader-writer lock: embedded under [`WRITER`] in a lock document that
    /// keeps a top-level `expiresAt` for its retention (see [`retain`]).
    Writer,
    /// One of several leases in an array under this field, in a lock document that keeps a
    /// top-level `expiresAt` for its retention: `{<field>: [{id, expiresAt, ...}]}` (the
    /// readers of a reader-writer lock, the holders of a semaphore).
    Members(String),
}

impl Layout {
    /// The field the lease is embedded under, if it is.
    fn field(&self) -> Option<&str> {
        match self {
            Layout::LockDocument => None,
            Layout::Writer => Some(WRITER),
            Layout::Embedded(field) | Layout::Members(field) => Some(field),
        }
    }

    pub(crate) fn lock_id_path(&self) -> String {
        match self.field() {
            None => LOCK_ID.to_owned(),
            Some(field) => format!("{field}.{EMBEDDED_ID}"),
        }
    }

    pub(crate) fn expires_at_path(&self) -> String {
        match self.field() {
            None => EXPIRES_AT.to_owned(),
            Some(field) => format!("{field}.{EXPIRES_AT}"),
        }
    }

    /// `$expr` condition: the lease is live by server time (not for `Members`: see
    /// [`live_members`]).
    pub(crate) fn live(&self) -> Document {
        doc! { "$gt": [format!("${}", self.expires_at_path()), "$$NOW"] }
    }

    /// Matches the documents holding any of several leases that are still ours and live. Lock
    /// ids are unique per acquisition, so `_id ∈ ids` and `lockId ∈ lock ids` together match
    /// exactly our leases (the `_id` condition lets the server use its index).
    pub(crate) fn renew_many_filter(&self, ids: &[Bson], lock_ids: &[String]) -> Document {
        match self {
            Layout::Members(field) => doc! {
                ID: { "$in": ids },
                "$expr": { "$gt": [{ "$size": renewable_members(field, lock_ids) }, 0] },
            },
            // (No lease whose revocation's grace is over: see `revoke`.)
            Layout::LockDocument => doc! {
                ID: { "$in": ids },
                LOCK_ID: { "$in": lock_ids },
                "$expr": { "$and": [self.live(), renewable()] },
            },
            _ => doc! {
                ID: { "$in": ids },
                self.lock_id_path(): { "$in": lock_ids },
                "$expr": self.live(),
            },
        }
    }

    /// Matches the document holding the lease `lock_id` if a guard's `extend` may extend it:
    /// ours and live, and, for an exclusive lock, no live revocation request targets it (an
    /// extension must not push the takeover back).
    pub(crate) fn extend_filter(&self, id: &Bson, lock_id: &str) -> Document {
        let lock_ids = [lock_id.to_owned()];
        let mut filter = self.renew_many_filter(std::slice::from_ref(id), &lock_ids);
        match self {
            Layout::LockDocument => {
                filter.insert("$expr", doc! { "$and": [self.live(), extendable()] });
            }
            Layout::Members(_) => {
                let renewable = filter.remove("$expr").unwrap_or(Bson::Boolean(true));
                let untargeted = doc! { "$or": [
                    { "$lte": [request_path(EXPIRES_AT), "$$NOW"] },
                    { "$ne": [request_path(TARGET), lock_id] },
                ] };
                filter.insert("$expr", doc! { "$and": [renewable, untargeted] });
            }
            _ => {}
        }
        filter
    }

    /// Extends the listed leases to `$$NOW + expiry` (the renewal loop's rounds): see
    /// [`Layout::lengthen`].
    pub(crate) fn renew_update(&self, options: &LockOptions, lock_ids: &[String]) -> Vec<Document> {
        self.lengthen(options, lock_ids, options.expiry_millis(), false)
    }

    /// Extends the lease `lock_id` to at least `$$NOW + by_millis` (a guard's `extend`), and
    /// records when in its `renewedAt` whatever the layout: see [`Layout::lengthen`].
    pub(crate) fn extend_update(
        &self,
        options: &LockOptions,
        lock_id: &str,
        by_millis: i64,
    ) -> Vec<Document> {
        self.lengthen(options, &[lock_id.to_owned()], by_millis, true)
    }

    /// Extends the listed leases to at least `$$NOW + lease_millis`, never shortening one: a
    /// lease ends at the later of its stored end and that (a holder's `extend` may have set it
    /// beyond what a renewal gives, and an exclusive lease with a `min_hold` may end at
    /// `acquiredAt + min_hold`). An array member is extended only if it is still live.
    ///
    /// Records when (`renewedAt`): always in an array member and a writer; in an exclusive lock
    /// document or a document lock's field only if it stores details (which .NET clients cannot
    /// read anyway), has a `min_hold`, or recorded it already, or with `record` (an extension).
    /// The renewal loop reads the server's clock from a renewal's reply as `renewedAt`, or
    /// where there is none as `expiresAt − expiry`, which only holds for a lease never extended
    /// beyond what a renewal gives: an extension records `renewedAt`, and every later renewal of
    /// that lease keeps it.
    fn lengthen(
        &self,
        options: &LockOptions,
        lock_ids: &[String],
        lease_millis: i64,
        record: bool,
    ) -> Vec<Document> {
        let later = |path: String| {
            doc! { "$max": [format!("${path}"), lease_end(lease_millis)] }
        };
        let recorded = |path: String| -> Bson {
            if record {
                return "$$NOW".into();
            }
            let is_date = doc! { "$eq": [{ "$type": format!("${path}") }, "date"] };
            let keep = match self {
                Layout::LockDocument => doc! { "$or": [
                    { "$eq": [{ "$type": format!("${DETAILS}") }, "object"] },
                    is_date,
                ] },
                _ => is_date,
            };
            doc! { "$cond": [keep, "$$NOW", "$$REMOVE"] }.into()
        };
        match self {
            Layout::Members(field) => {
                let lease = doc! {
                    EXPIRES_AT: { "$max": [format!("$$m.{EXPIRES_AT}"), lease_end(lease_millis)] },
                    RENEWED_AT: "$$NOW",
                };
                let renewed = doc! {
                    "$cond": [
                        renewable_member(lock_ids),
                        { "$mergeObjects": ["$$m", lease] },
                        "$$m",
                    ]
                };
                vec![
                    doc! { "$set": { field.as_str(): {
                        "$map": { "input": format!("${field}"), "as": "m", "in": renewed }
                    } } },
                    retain(lease_millis),
                ]
            }
            Layout::Writer => vec![
                doc! { "$set": {
                    self.expires_at_path(): later(self.expires_at_path()),
                    format!("{WRITER}.{RENEWED_AT}"): "$$NOW",
                } },
                retain(lease_millis),
            ],
            Layout::LockDocument if options.min_hold().is_some() => {
                vec![doc! { "$set": {
                    EXPIRES_AT: later(EXPIRES_AT.to_owned()),
                    RENEWED_AT: "$$NOW",
                } }]
            }
            Layout::LockDocument => vec![doc! { "$set": {
                EXPIRES_AT: later(EXPIRES_AT.to_owned()),
                RENEWED_AT: recorded(RENEWED_AT.to_owned()),
            } }],
            Layout::Embedded(_) => vec![doc! { "$set": {
                self.expires_at_path(): later(self.expires_at_path()),
                self.renewed_at_path(): recorded(self.renewed_at_path()),
            } }],
        }
    }

    /// An aggregation pipeline that yields, per document of `ids`, `{ours: [<lock id>...]}`:
    /// those of `lock_ids` that are live there.
    pub(crate) fn live_lock_ids(&self, ids: &[Bson], lock_ids: &[String]) -> Vec<Document> {
        let (filter, ours) = match self {
            Layout::Members(field) => (
                doc! { ID: { "$in": ids } },
                Bson::Document(doc! { "$map": {
                    "input": renewable_members(field, lock_ids),
                    "as": "m",
                    "in": format!("$$m.{EMBEDDED_ID}"),
                } }),
            ),
            _ => (
                self.renew_many_filter(ids, lock_ids),
                Bson::Array(vec![format!("${}", self.lock_id_path()).into()]),
            ),
        };
        vec![
            doc! { "$match": filter },
            doc! { "$project": { LIVE_LOCK_IDS: ours } },
        ]
    }

    /// A projection that keeps only the lease `lock_id` of a document (and its `_id`).
    pub(crate) fn lease_projection(&self, lock_id: &str) -> Document {
        match self {
            Layout::Members(field) => {
                doc! { field.as_str(): { "$elemMatch": { EMBEDDED_ID: lock_id } } }
            }
            _ => doc! { self.expires_at_path(): 1, self.renewed_at_path(): 1 },
        }
    }

    /// Where a lease records when it was last acquired or renewed, if it does.
    fn renewed_at_path(&self) -> String {
        match self.field() {
            None => RENEWED_AT.to_owned(),
            Some(field) => format!("{field}.{RENEWED_AT}"),
        }
    }

    /// The server's time when the lease `lock_id` in `document` (returned by its renewal) was
    /// renewed: its `renewedAt` where it records one, else its `expiresAt` less `expiry_millis`.
    pub(crate) fn renewed_at_millis(
        &self,
        document: &Document,
        lock_id: &str,
        expiry_millis: i64,
    ) -> Option<i64> {
        let lease = match self {
            Layout::LockDocument => document,
            Layout::Writer | Layout::Embedded(_) => document.get_document(self.field()?).ok()?,
            Layout::Members(field) => document
                .get_array(field)
                .ok()?
                .iter()
                .filter_map(Bson::as_document)
                .find(|member| member.get_str(EMBEDDED_ID) == Ok(lock_id))?,
        };
        match lease.get_datetime(RENEWED_AT) {
            Ok(renewed_at) => Some(renewed_at.timestamp_millis()),
            Err(_) => Some(lease.get_datetime(EXPIRES_AT).ok()?.timestamp_millis() - expiry_millis),
        }
    }

    /// Matches whichever document holds the lease `lock_id`, live or not: the filter of the
    /// cleanup after a document lock's attempt whose outcome is unknown (its filter may match
    /// many documents, and which one it locked is unknown).
    pub(crate) fn anywhere_filter(&self, lock_id: &str) -> Document {
        doc! { self.lock_id_path(): lock_id }
    }

    /// Matches our lease whether or not it is still live: releasing an expired lease is
    /// harmless, and the lock id keeps us away from anyone else's.
    pub(crate) fn release_filter(&self, id: &Bson, lock_id: &str) -> Document {
        doc! { ID: id.clone(), self.lock_id_path(): lock_id }
    }

    /// Ends the lease `lock_id` and forgets the holder, keeping the fencing token. A lock
    /// document keeps an `expiresAt` of now, so the TTL index removes it later; an embedded lock
    /// drops both its id and expiry, leaving the business document unlocked; an array member is
    /// removed from its array.
    ///
    /// An exclusive lock's `minHoldUntil` (see [`MIN_HOLD_UNTIL`]) keeps it taken until then
    /// when its holder's lease ends ([`Ending::Release`]: a release, a forced release, a
    /// shutdown); a lease nobody was given ends at once ([`Ending::Cleanup`]).
    pub(crate) fn release_update(&self, lock_id: &str, ending: Ending) -> Vec<Document> {
        match self {
            Layout::LockDocument => end_lease(ending),
            Layout::Writer => match ending {
                Ending::Release => {
                    vec![doc! { "$unset": [self.lock_id_path(), self.expires_at_path()] }]
                }
                // (A fair lock's `servedWait` goes too, as an exclusive lock's: the wait was not
                // served, and may take a place in line again.)
                Ending::Cleanup => vec![doc! { "$unset": [
                    self.lock_id_path(),
                    self.expires_at_path(),
                    SERVED_WAIT,
                ] }],
            },
            // (A document lock's `renewedAt`, which only an extension writes, goes too.)
            Layout::Embedded(_) => vec![doc! { "$unset": [
                self.lock_id_path(),
                self.expires_at_path(),
                self.renewed_at_path(),
            ] }],
            Layout::Members(field) => vec![doc! { "$set": { field.as_str(): { "$filter": {
                "input": format!("${field}"),
                "as": "m",
                "cond": { "$ne": [format!("$$m.{EMBEDDED_ID}"), lock_id] },
            } } } }],
        }
    }
}

/// How a lease ends: what [`Layout::release_update`] keeps of an exclusive lock's `min_hold`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Its holder's lease ends (released, dropped, shut down, or forced by an operator): a
    /// `min_hold` window keeps the lock taken until `minHoldUntil`. The window is a promise
    /// about the work, not about who holds the lease.
    Release,
    /// A lease nobody was given ends (the cleanup after an attempt whose outcome is unknown, or
    /// a win after its caller stopped waiting): at once, window and all, since nobody ran.
    Cleanup,
}

/// Ends a lock document's lease, whoever holds it, as `ending` says: `lockId` goes, the fencing
/// token stays, and `expiresAt` becomes now, or for a holder's lease with a `min_hold` window
/// `minHoldUntil` if that is later (a cleanup removes the window with the lease nobody got).
pub(crate) fn end_lease(ending: Ending) -> Vec<Document> {
    match ending {
        Ending::Release => vec![
            doc! { "$set": { EXPIRES_AT: released_end() } },
            doc! { "$unset": LOCK_ID },
        ],
        // (A fair lock's `servedWait` goes too: the wait was not served, and may take a place
        // in line again.)
        Ending::Cleanup => vec![
            doc! { "$set": { EXPIRES_AT: "$$NOW" } },
            doc! { "$unset": [LOCK_ID, MIN_HOLD_UNTIL, SERVED_WAIT] },
        ],
    }
}

/// The end of an exclusive lease its holder released (an expression): now, or the end of its
/// `min_hold` window if that is later.
pub(crate) fn released_end() -> Document {
    let until = format!("${MIN_HOLD_UNTIL}");
    doc! { "$cond": [
        { "$eq": [{ "$type": &until }, "date"] },
        { "$max": ["$$NOW", &until] },
        "$$NOW",
    ] }
}

/// The kinds of lock document a lock collection holds (document locks live in application
/// documents, which no administrative call deletes or ends).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Stored {
    /// An exclusive lock's document.
    Exclusive,
    /// A reader-writer lock's document.
    ReaderWriter,
    /// A semaphore's document.
    Semaphore,
}

impl Stored {
    /// The kind of document a lease stored as `layout` says lives in (`None`: a document lock's).
    pub(crate) fn of_layout(layout: &Layout) -> Option<Stored> {
        match layout {
            Layout::LockDocument => Some(Stored::Exclusive),
            Layout::Writer => Some(Stored::ReaderWriter),
            Layout::Members(field) if field == READERS => Some(Stored::ReaderWriter),
            Layout::Members(_) => Some(Stored::Semaphore),
            Layout::Embedded(_) => None,
        }
    }

    /// The fields its commands write, and the one array or number every such document has.
    fn fields(self) -> (&'static [&'static str], Document) {
        let is =
            |field: &str, types: &[&str]| doc! { "$in": [{ "$type": format!("${field}") }, types] };
        match self {
            Stored::Exclusive => (
                &[
                    ID,
                    LOCK_ID,
                    EXPIRES_AT,
                    ACQUIRED_AT,
                    FENCING_TOKEN,
                    DETAILS,
                    RENEWED_AT,
                    MIN_HOLD_UNTIL,
                    LINE,
                    SERVED_WAIT,
                    REVOKE,
                ],
                is(FENCING_TOKEN, &NUMBERS),
            ),
            Stored::ReaderWriter => (
                &[
                    ID,
                    EXPIRES_AT,
                    READERS,
                    WRITER,
                    WAITING_WRITER,
                    LINE,
                    SERVED_WAIT,
                ],
                is(READERS, &["array"]),
            ),
            Stored::Semaphore => (
                &[
                    ID,
                    EXPIRES_AT,
                    HOLDERS,
                    MAX_COUNT,
                    FENCING_TOKEN,
                    WAITING,
                    RESIZED_AT,
                    LINE,
                    REVOKE,
                ],
                is(HOLDERS, &["array"]),
            ),
        }
    }

    /// `$expr`: the document is shaped like a lock document of this kind: a string `_id`, an
    /// `expiresAt` date, the field every such document has, and no field its commands do not
    /// write. Every administrative delete or update requires it, so that none ever touches an
    /// application's document (a collection named by mistake, or shared).
    pub(crate) fn shape(self) -> Document {
        let (fields, has) = self.fields();
        let names = doc! { "$map": {
            "input": { "$objectToArray": "$$ROOT" },
            "as": "field",
            "in": "$$field.k",
        } };
        doc! { "$and": [
            { "$eq": [{ "$type": format!("${ID}") }, "string"] },
            { "$eq": [{ "$type": format!("${EXPIRES_AT}") }, "date"] },
            has,
            { "$setIsSubset": [names, fields] },
        ] }
    }

    /// `$expr`: shaped like a lock document of one of `kinds` (see [`Stored::shape`]).
    pub(crate) fn any_shape(kinds: &[Stored]) -> Document {
        doc! { "$or": kinds.iter().map(|kind| kind.shape()).collect::<Vec<_>>() }
    }
}

/// `$type` names of numbers.
const NUMBERS: [&str; 4] = ["int", "long", "double", "decimal"];

/// The field of [`Layout::live_lock_ids`]' results.
pub(crate) const LIVE_LOCK_IDS: &str = "ours";

/// The lock ids of the leases in the array `field` (an expression).
pub(crate) fn member_ids(field: &str) -> Document {
    doc! { "$map": {
        "input": { "$ifNull": [format!("${field}"), []] },
        "as": "m",
        "in": format!("$$m.{EMBEDDED_ID}"),
    } }
}

/// Expression: the members of array `field` whose lease is live by server time, and, with
/// `lock_ids`, whose id is one of them. A missing array counts as empty.
pub(crate) fn live_members(field: &str, lock_ids: Option<&[String]>) -> Document {
    let live = doc! { "$gt": [format!("$$m.{EXPIRES_AT}"), "$$NOW"] };
    let cond = match lock_ids {
        Some(lock_ids) => doc! { "$and": [
            { "$in": [format!("$$m.{EMBEDDED_ID}"), lock_ids] },
            live,
        ] },
        None => live,
    };
    doc! { "$filter": {
        "input": { "$ifNull": [format!("${field}"), []] },
        "as": "m",
        "cond": cond,
    } }
}

/// How many places a semaphore holder's lease takes (`places`, 1 where absent or unreadable).
pub(crate) fn places_of(holder: &Document) -> i64 {
    holder
        .get(PLACES)
        .and_then(read_i64)
        .filter(|places| *places >= 1)
        .unwrap_or(1)
}

/// The outcome of an acquisition attempt, read from the document it returned.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AttemptReply {
    /// The document carries our `lockId`, with this fencing token (`None` if unreadable).
    Acquired(Option<i64>),
    /// Somebody else holds the lock.
    Busy,
}

pub(crate) fn read_attempt_reply(document: &Document, lock_id: &str) -> AttemptReply {
    match document.get_str(LOCK_ID) {
        Ok(stored) if stored == lock_id => {
            AttemptReply::Acquired(document.get(FENCING_TOKEN).and_then(read_i64))
        }
        _ => AttemptReply::Busy,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_reply_compares_lock_ids() {
        let ours = doc! { "_id": "n", "lockId": "a", "fencingToken": 5_i64 };
        assert_eq!(
            read_attempt_reply(&ours, "a"),
            AttemptReply::Acquired(Some(5))
        );
        assert_eq!(read_attempt_reply(&ours, "b"), AttemptReply::Busy);
        let no_holder = doc! { "_id": "n", "fencingToken": 5_i64 };
        assert_eq!(read_attempt_reply(&no_holder, "a"), AttemptReply::Busy);
        let odd_token = doc! { "_id": "n", "lockId": "a", "fencingToken": "x" };
        assert_eq!(
            read_attempt_reply(&odd_token, "a"),
            AttemptReply::Acquired(None)
        );
    }

    /// The document an acquisition writes when it wins, and what it keeps otherwise.
    /// The last stage's replacement when the lock is free, and otherwise (a takeover's first
    /// stage ends the releasing lease).
    fn written_when_free(pipeline: &[Document]) -> (Document, Bson) {
        let last = pipeline.last().unwrap();
        let replacement = last.get_document("$replaceWith").unwrap();
        let branches = replacement.get_array("$cond").unwrap();
        (
            branches[1].as_document().unwrap().clone(),
            branches[2].clone(),
        )
    }

    #[test]
    fn an_acquisition_writes_the_new_holders_document_whole() {
        let (written, kept) =
            written_when_free(&acquire_update("id", &LockOptions::default(), None, None));
        assert_eq!(kept, Bson::from("$$ROOT"), "a busy lock stays as it is");
        // .NET's five fields, and nothing that described the previous holder.
        let fields: Vec<&str> = written.keys().map(String::as_str).collect();
        assert_eq!(
            fields,
            [ID, LOCK_ID, EXPIRES_AT, ACQUIRED_AT, FENCING_TOKEN]
        );
        assert_eq!(written.get_str(LOCK_ID), Ok("id"));
        assert_eq!(written.get_str(ID), Ok("$_id"));

        let details = doc! { "owner": "batch-7" };
        let job = LockOptions::builder()
            .expiry(Duration::from_secs(3))
            .min_hold(Duration::from_secs(60))
            .build()
            .unwrap();
        let (written, _) =
            written_when_free(&acquire_update("id", &job, Some(&details), Some("old")));
        assert_eq!(
            written.get_document(DETAILS),
            Ok(&doc! { "$literal": details })
        );
        assert_eq!(written.get_str(RENEWED_AT), Ok("$$NOW"));
        assert_eq!(
            written.get_document(MIN_HOLD_UNTIL),
            Ok(&doc! { "$add": ["$$NOW", 60_000_i64] })
        );
        assert_eq!(
            written.get_document(EXPIRES_AT),
            Ok(&doc! { "$add": ["$$NOW", 60_000_i64] }),
            "a takeover's lease lasts min_hold, as the attempt's does"
        );
    }
}
