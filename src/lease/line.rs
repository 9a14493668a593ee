//! A line of waiters across processes, for fair locks ([`LockOptionsBuilder::fair`]): the
//! lock's document keeps the waits under way in arrival order (`line: [{id, expiresAt}]`), each
//! with a short lease of its own that its attempts renew, and only the first live wait in line
//! may take the lock. The expressions here build the line's part of an attempt's pipeline; the
//! wait's place is a [`WaitingMarker`](super::waiting_marker::WaitingMarker) in the field
//! [`LINE`], removed (from the array) when the wait ends without the lock.
//!
//! [`LockOptionsBuilder::fair`]: crate::LockOptionsBuilder::fair

use mongodb::bson::{Bson, Document, doc};

use super::schema::{
    EMBEDDED_ID, EXPIRES_AT, LINE, LOCK_ID, SERVED_WAIT, lease_end, live_members,
    marker_lease_millis, member_ids, new_holder,
};
use crate::options::LockOptions;

/// A stage that drops the places whose lease ended (a missing line is an empty one).
pub(crate) fn drop_ended() -> Document {
    doc! { "$set": { LINE: live_members(LINE, None) } }
}

/// Expression, after [`drop_ended`]: whether the wait `wait` may take the lock, nobody being
/// ahead of it in line (it is first, or the line is empty).
pub(crate) fn first_in_line(wait: &str) -> Document {
    let line = format!("${LINE}");
    doc! { "$or": [
        { "$eq": [{ "$size": &line }, 0] },
        { "$eq": [{ "$arrayElemAt": [member_ids(LINE), 0] }, wait] },
    ] }
}

/// Expression, after [`drop_ended`]: the line with the place of `wait` renewed for
/// `lease_millis`, or added at its end.
pub(crate) fn joined(wait: &str, lease_millis: i64) -> Document {
    let ours = doc! { EMBEDDED_ID: wait, EXPIRES_AT: lease_end(lease_millis) };
    let renewed = doc! { "$map": {
        "input": format!("${LINE}"),
        "as": "m",
        "in": { "$cond": [
            { "$eq": [format!("$$m.{EMBEDDED_ID}"), wait] },
            ours.clone(),
            "$$m",
        ] },
    } };
    let added = doc! { "$concatArrays": [format!("${LINE}"), [ours]] };
    doc! { "$cond": [{ "$in": [wait, member_ids(LINE)] }, renewed, added] }
}

/// Expression, after [`drop_ended`]: the line without the place of `wait`.
pub(crate) fn left(wait: &str) -> Document {
    doc! { "$filter": {
        "input": format!("${LINE}"),
        "as": "m",
        "cond": { "$ne": [format!("$$m.{EMBEDDED_ID}"), wait] },
    } }
}

/// The id of the first place in `document`'s line (`None`: nobody waits), as a reply returned
/// it: after its pipeline dropped the places whose lease ended.
pub(crate) fn head(document: &Document) -> Option<String> {
    document.get(LINE).and_then(head_of)
}

/// The id of the first place of `line` (an array of places).
pub(crate) fn head_of(line: &Bson) -> Option<String> {
    place_id(line.as_array()?.first()?)
}

/// The id of `place` (a place of a line).
pub(crate) fn place_id(place: &Bson) -> Option<String> {
    let place = place.as_document()?;
    place.get_str(EMBEDDED_ID).ok().map(str::to_owned)
}

/// The last stage: no `line` field where nobody waits.
pub(crate) fn tidy() -> Document {
    let line = doc! { "$ifNull": [format!("${LINE}"), []] };
    doc! { "$set": { LINE: { "$cond": [
        { "$eq": [{ "$size": line }, 0] },
        "$$REMOVE",
        format!("${LINE}"),
    ] } } }
}

/// The filter and pipeline that take the place of `wait` out of lock `name`'s line, if it is
/// still there (its wait ended without the lock).
pub(crate) fn removal(name: &str, wait: &str) -> (Document, Vec<Document>) {
    let filter = doc! { super::schema::ID: name, format!("{LINE}.{EMBEDDED_ID}"): wait };
    (filter, vec![doc! { "$set": { LINE: left(wait) } }, tidy()])
}

/// A fair lock's acquisition attempt (see the [module docs](self)): the lease of [`acquire_update`](super::schema::acquire_update), taken only
/// when the lock is free and no live wait is ahead of the wait `wait` in line, which then leaves
/// the line (and is recorded as `servedWait`); otherwise, if it `waits`, the wait's place is
/// renewed, or added at the end (not once the wait was served: a late attempt of a wait that
/// won by another attempt, or by a transfer, must not put it back in line).
///
/// With `releasing`, a release in this process hands the lock over in the same command: the
/// releasing lease ends first as its release would (`min_hold` window kept), and the waiter takes
/// the lock only as its own attempt would, first in line; otherwise the release goes through
/// alone and the waiter waits on.
pub(crate) fn fair_acquire_update(
    lock_id: &str,
    options: &LockOptions,
    details: Option<&Document>,
    wait: &str,
    waits: bool,
    releasing: Option<&str>,
) -> Vec<Document> {
    let mut stages = Vec::new();
    if let Some(releasing) = releasing {
        stages.push(super::schema::end_releasing(releasing));
    }
    stages.push(drop_ended());
    let free = doc! { "$and": [
        { "$lte": [format!("${EXPIRES_AT}"), "$$NOW"] },
        first_in_line(wait),
        super::schema::not_reserved_for_other(None),
    ] };
    let mut holder = new_holder(lock_id, options, details);
    holder.insert(LINE, left(wait));
    holder.insert(SERVED_WAIT, wait);
    let line_when_busy: Bson = if waits {
        let joined = joined(wait, marker_lease_millis(options));
        // Not once the wait was served (another of its attempts, or a release's transfer, won:
        // this one is late), nor when this very attempt holds the lock (applied again).
        let served = doc! { "$or": [
            { "$eq": [format!("${LOCK_ID}"), lock_id] },
            { "$eq": [format!("${SERVED_WAIT}"), wait] },
        ] };
        doc! { "$cond": [served, format!("${LINE}"), joined] }.into()
    } else {
        format!("${LINE}").into()
    };
    let busy = doc! { "$mergeObjects": ["$$ROOT", { LINE: line_when_busy }] };
    stages.push(doc! { "$replaceWith": { "$cond": [free, holder, busy] } });
    stages.push(tidy());
    stages
}
