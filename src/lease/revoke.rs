//! Revocation requests on exclusive locks: a waiter (or an operator) asks the holder to let go.
//!
//! The request is one embedded document in the lock's document,
//! `revoke: {id, target, graceUntil, expiresAt, priority, reserves}`:
//! - `id` names the asker's wait (an operator's request has an id of its own);
//! - `target` is the lock id of the lease it asks to end;
//! - `graceUntil` (server time) is when the holder's grace runs out: from then on no renewal or
//!   extension of the target lease matches ([`renewable`]), so the lease ends by its own expiry at
//!   the latest, and the lock goes on with the next fencing token;
//! - `expiresAt` is the request's own lease: an asker renews it with each attempt (as a waiting
//!   marker); a request whose asker stopped asking lapses, grace, reservation and all;
//! - `priority`: a standing request ([`standing`]) is replaced only by one of higher priority;
//! - `reserves`: an asker's request keeps the lock for the asker once it is free: only an
//!   attempt of the asker's wait may take it ([`not_reserved_for_other`]). An operator's reserves
//!   nothing.
//!
//! The request goes with the next holder's acquisition, which writes the document whole.

use mongodb::bson::{Bson, Document, doc};

use super::schema::{
    EMBEDDED_ID, EXPIRES_AT, GRACE_UNTIL, HOLDERS, ID, LOCK_ID, PRIORITY, REQUEST_ID, RESERVES,
    REVOKE, SERVED_WAIT, Stored, TARGET, end_releasing, lease_end, marker_lease_millis, new_holder,
    not_reserved_for_other, request_live, request_path, standing, targets_holder,
};
use crate::options::LockOptions;
pub(crate) use crate::revocation::Ask;

/// How long an operator's request stands: its target lease is ended long before (renewals stop
/// at its grace's end), and a request whose target is gone stands only while it reserves, which
/// an operator's does not.
const OPERATOR_REQUEST_MILLIS: i64 = 24 * 60 * 60 * 1000;

/// The acquisition attempt of a revoking wait `wait`, with `lock_id` (see the [module
/// docs](self)): the lease of [`acquire_update`](super::schema::acquire_update) when the lock is
/// free and not reserved for another wait (the new holder's document records `wait` as
/// `servedWait`); otherwise, if it `waits`, the wait's request is placed, or renewed, unless a
/// standing request of another wait ranks as high or higher, or this wait was served already (a
/// late attempt must not ask its own lease to go). A renewed request keeps its grace while it
/// targets the same lease.
///
/// With `releasing`, a release in this process hands the lock over in the same command: the
/// releasing lease ends first as its release would, and the waiter takes the lock only as its own
/// attempt would.
pub(crate) fn revoking_acquire_update(
    lock_id: &str,
    options: &LockOptions,
    details: Option<&Document>,
    wait: &str,
    ask: Ask,
    waits: bool,
    releasing: Option<&str>,
) -> Vec<Document> {
    let mut stages = Vec::new();
    if let Some(releasing) = releasing {
        stages.push(end_releasing(releasing));
    }
    let free = doc! { "$and": [
        { "$lte": [format!("${EXPIRES_AT}"), "$$NOW"] },
        not_reserved_for_other(Some(wait)),
    ] };
    let mut holder = new_holder(lock_id, options, details);
    holder.insert(SERVED_WAIT, wait);
    let busy: Bson = if waits {
        let ours = doc! { "$eq": [request_path(REQUEST_ID), wait] };
        let outranked = doc! { "$and": [
            standing(),
            { "$ne": [request_path(REQUEST_ID), wait] },
            { "$gte": [request_path(PRIORITY), ask.priority] },
        ] };
        let served = doc! { "$or": [
            { "$eq": [format!("${LOCK_ID}"), lock_id] },
            { "$eq": [format!("${SERVED_WAIT}"), wait] },
        ] };
        let grace_until = doc! { "$cond": [
            { "$and": [request_live(), ours, targets_holder()] },
            request_path(GRACE_UNTIL),
            lease_end(ask.grace_millis),
        ] };
        let request = doc! {
            REQUEST_ID: wait,
            TARGET: format!("${LOCK_ID}"),
            GRACE_UNTIL: grace_until,
            EXPIRES_AT: lease_end(marker_lease_millis(options)),
            PRIORITY: ask.priority,
            RESERVES: true,
        };
        let keep = doc! { "$or": [outranked, served] };
        doc! { "$mergeObjects": ["$$ROOT", { REVOKE: {
            "$cond": [keep, format!("${REVOKE}"), request]
        } }] }
        .into()
    } else {
        "$$ROOT".into()
    };
    stages.push(doc! { "$replaceWith": { "$cond": [free, holder, busy] } });
    stages
}

/// Which lease an operator's request targets.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Asked<'a> {
    /// Whoever holds the exclusive lock.
    Holder,
    /// The exclusive lock's lease with this lock id.
    Lease(&'a str),
    /// The semaphore's place with this lock id.
    Place(&'a str),
}

/// The filter and pipeline of an operator's request `id` to end the lease `asked` of lock `name`
/// within `grace_millis`: written only on a live lease, in a document shaped like the lock's
/// kind, and it replaces any request (an operator's has the highest priority), keeping the lock
/// for nobody.
pub(crate) fn operator_request(
    name: &str,
    asked: Asked<'_>,
    id: &str,
    grace_millis: i64,
) -> (Document, Vec<Document>) {
    let (filter, target): (Document, Bson) = match asked {
        Asked::Holder | Asked::Lease(_) => {
            let lock_id: Bson = match asked {
                Asked::Lease(lock_id) => lock_id.into(),
                _ => doc! { "$type": "string" }.into(),
            };
            let filter = doc! {
                ID: name,
                LOCK_ID: lock_id,
                "$expr": { "$and": [
                    { "$gt": [format!("${EXPIRES_AT}"), "$$NOW"] },
                    Stored::Exclusive.shape(),
                ] },
            };
            (filter, format!("${LOCK_ID}").into())
        }
        Asked::Place(lock_id) => {
            let live = doc! { "$filter": {
                "input": format!("${HOLDERS}"),
                "as": "m",
                "cond": { "$and": [
                    { "$eq": [format!("$$m.{EMBEDDED_ID}"), lock_id] },
                    { "$gt": [format!("$$m.{EXPIRES_AT}"), "$$NOW"] },
                ] },
            } };
            // One request per semaphore at a time: not while a live one asks another live place.
            let other_asked = doc! { "$filter": {
                "input": format!("${HOLDERS}"),
                "as": "m",
                "cond": { "$and": [
                    { "$eq": [format!("$$m.{EMBEDDED_ID}"), request_path(TARGET)] },
                    { "$ne": [format!("$$m.{EMBEDDED_ID}"), lock_id] },
                    { "$gt": [format!("$$m.{EXPIRES_AT}"), "$$NOW"] },
                ] },
            } };
            let free_to_ask = doc! { "$or": [
                { "$lte": [request_path(EXPIRES_AT), "$$NOW"] },
                { "$eq": [{ "$size": other_asked }, 0] },
            ] };
            let filter = doc! {
                ID: name,
                format!("{HOLDERS}.{EMBEDDED_ID}"): lock_id,
                "$expr": { "$and": [
                    Stored::Semaphore.shape(),
                    { "$gt": [{ "$size": live }, 0] },
                    free_to_ask,
                ] },
            };
            (filter, lock_id.into())
        }
    };
    let request = doc! {
        REQUEST_ID: id,
        TARGET: target,
        GRACE_UNTIL: lease_end(grace_millis),
        EXPIRES_AT: lease_end(grace_millis.saturating_add(OPERATOR_REQUEST_MILLIS)),
        PRIORITY: i32::MAX,
        RESERVES: false,
    };
    (filter, vec![doc! { "$set": { REVOKE: request } }])
}

/// The filter and update that take the request of the wait `wait` out of lock `name`'s document,
/// if it is still there (its wait ended without the lock).
pub(crate) fn removal(name: &str, wait: &str) -> (Document, Document) {
    super::waiting_marker::removal(name, REVOKE, wait)
}

/// The id of the request stored in `document` (as a reply returned it), if any.
pub(crate) fn request_id(document: &Document) -> Option<String> {
    let request = document.get_document(REVOKE).ok()?;
    request.get_str(REQUEST_ID).ok().map(str::to_owned)
}

/// A request stored in a lock document, as its holder and a status read see it.
pub(crate) struct Request {
    pub(crate) target: Option<String>,
    pub(crate) grace_until: Option<mongodb::bson::DateTime>,
    pub(crate) expires_at: Option<mongodb::bson::DateTime>,
    pub(crate) priority: i32,
    pub(crate) reserves: bool,
}

/// The request stored in `document`, if any.
pub(crate) fn stored(document: &Document) -> Option<Request> {
    let request = document.get_document(REVOKE).ok()?;
    Some(Request {
        target: request.get_str(TARGET).ok().map(str::to_owned),
        grace_until: request.get_datetime(GRACE_UNTIL).ok().copied(),
        expires_at: request.get_datetime(EXPIRES_AT).ok().copied(),
        priority: request
            .get(PRIORITY)
            .and_then(crate::token::read_i64)
            .and_then(|priority| i32::try_from(priority).ok())
            .unwrap_or(0),
        reserves: request.get_bool(RESERVES) == Ok(true),
    })
}
