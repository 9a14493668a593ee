//! One attempt on a reader-writer lock's document: its update pipelines, and whether it won.

use std::sync::Arc;
#[cfg(test)]
use std::time::Duration;

use mongodb::bson::{Bson, Document, doc};
use tokio::runtime::Handle;

use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::lease::Target;
use crate::lease::acquire::Wait;
use crate::lease::claim::{Claim, Request};
use crate::lease::held::HeldLease;
use crate::lease::line;
use crate::lease::schema::{
    ACQUIRED_AT, DETAILS, EMBEDDED_ID, EXPIRES_AT, FENCING_TOKEN, LINE, Layout, READERS,
    RENEWED_AT, SERVED_WAIT, UPGRADEABLE, WAITING_WRITER, WRITER, lease_end, literal, live_members,
    member_ids, next_fencing_token, retain,
};
use crate::options::LockOptions;
use crate::token::FencingToken;
use crate::token::read_i64;

use super::{Mode, ReadGuard};
use crate::lease::waiting_marker::{WaitingMarker, marker_lease_millis};

/// A field that lives only inside one update pipeline.
pub(super) const WRITE_IS_FREE: &str = "_writeIsFree";

/// A reader, as the engine claims it: it joins the readers unless a writer holds or waits for the
/// lock; or in the release command of a local writer (see `lease::handoff`), with the readers
/// waiting behind it, the writer's lease ends and the same pipeline admits this reader (unless
/// another writer waits: writers are not starved). An `upgradeable` reader also waits while
/// another upgradeable reader holds the lock.
pub(super) struct Reading {
    pub(super) target: Arc<Target>,
    pub(super) upgradeable: bool,
}

impl Claim for Reading {
    type Won = ReadGuard;
    const TAKES_OVER: bool = true;

    fn target(&self) -> &Target {
        &self.target
    }

    fn layout(&self) -> Layout {
        layout(Mode::Read)
    }

    fn update(&self, lock_id: &str, replacing: Option<&str>) -> Vec<Document> {
        let (options, details) = (&self.target.options, self.target.details.as_ref());
        let upgradeable = self.upgradeable;
        match replacing {
            None => read_update(options, details, lock_id, upgradeable),
            Some(releasing) => {
                read_takeover_update(lock_id, options, details, releasing, upgradeable)
            }
        }
    }

    fn won(
        &self,
        runtime: &Handle,
        document: Document,
        lock_id: String,
        request: Request,
    ) -> Result<Option<ReadGuard>> {
        let won = hold(
            &self.target,
            runtime,
            Mode::Read,
            &document,
            lock_id,
            request,
        )?;
        Ok(won.map(|(lease, _)| ReadGuard { lease }))
    }
}

/// A writer, as the engine claims it: it takes the lock when no lease is live; while it has time
/// left to wait, each attempt also places (or renews) its waiting-writer `marker`, which holds new
/// readers back. Each attempt in flight keeps the marker: should the caller stop waiting, the
/// marker is removed once the last attempt's outcome is in, so that an attempt applied after the
/// removal cannot place it again.
///
/// The upgrade of an upgradeable reader is a writer `upgrading` that reader's lease (its lock
/// id): see [`write_update`].
pub(super) struct Writing {
    pub(super) marker: Arc<WaitingMarker>,
    pub(super) wait: Wait,
    pub(super) upgrading: Option<String>,
}

impl Claim for Writing {
    type Won = LockGuard;
    const TAKES_OVER: bool = false;

    fn target(&self) -> &Target {
        self.marker.target()
    }

    fn layout(&self) -> Layout {
        layout(Mode::Write)
    }

    fn place_in_line(&self) -> Option<&WaitingMarker> {
        Some(&*self.marker).filter(|marker| marker.in_line())
    }

    /// Marks the marker as possibly placed when it places it (never `replacing`: a writer takes
    /// nothing over).
    fn update(&self, lock_id: &str, _replacing: Option<&str>) -> Vec<Document> {
        // Only a writer with time left to wait holds readers back.
        let waits = !self.wait.is_over();
        if waits {
            self.marker.may_be_placed();
        }
        let target = self.marker.target();
        let (options, details) = (&target.options, target.details.as_ref());
        let upgrading = self.upgrading.as_deref();
        write_update(options, details, lock_id, &self.marker.id, waits, upgrading)
    }

    fn won(
        &self,
        runtime: &Handle,
        document: Document,
        lock_id: String,
        request: Request,
    ) -> Result<Option<LockGuard>> {
        let target = self.marker.target();
        let won = hold(target, runtime, Mode::Write, &document, lock_id, request)?;
        Ok(won.map(|(lease, token)| LockGuard::new(lease, token)))
    }
}

/// The lease, if `document` (returned by the command first sent as `request`) holds our lease
/// `lock_id` in `mode`; a writer's comes with its fencing token.
fn hold(
    target: &Target,
    runtime: &Handle,
    mode: Mode,
    document: &Document,
    lock_id: String,
    request: Request,
) -> Result<Option<(HeldLease, FencingToken)>> {
    let Some(token) = won(document, mode, &lock_id) else {
        return Ok(None);
    };
    let Some(lease) = target.hold(runtime, mode.kind(), &layout(mode), lock_id, request) else {
        return Ok(None);
    };
    match (mode, token) {
        (Mode::Read, _) => Ok(Some((lease, FencingToken::new(0)))),
        (Mode::Write, Some(token)) => Ok(Some((lease, FencingToken::new(token)))),
        // Cannot happen on a conforming server; dropping the lease releases it.
        (Mode::Write, None) => Err(Error::UnexpectedReply(
            "the acquired writer lease has no numeric fencingToken".to_owned(),
        )),
    }
}

/// The pipeline of a writer's release `releasing` that hands the lock to the local reader
/// `lock_id`: the writer's lease ends, and a read attempt's pipeline admits the reader.
pub(crate) fn read_takeover_update(
    lock_id: &str,
    options: &LockOptions,
    details: Option<&Document>,
    releasing: &str,
    upgradeable: bool,
) -> Vec<Document> {
    let mut update = vec![end_writer(releasing)];
    update.extend(read_update(options, details, lock_id, upgradeable));
    update
}

/// Ends the writer's lease `releasing`, if it is still the writer's, keeping only its fencing
/// token (as [`drop_expired`] does with a writer whose lease ended).
pub(super) fn end_writer(releasing: &str) -> Document {
    let token_only = doc! { FENCING_TOKEN: format!("${WRITER}.{FENCING_TOKEN}") };
    doc! { "$set": { WRITER: { "$cond": [
        { "$eq": [format!("${WRITER}.{EMBEDDED_ID}"), releasing] },
        token_only,
        format!("${WRITER}"),
    ] } } }
}

/// Where a reader's or the writer's lease lives in the document.
pub(crate) fn layout(mode: Mode) -> Layout {
    match mode {
        Mode::Read => Layout::Members(READERS.to_owned()),
        Mode::Write => Layout::Writer,
    }
}

/// Whether the document returned by an attempt holds our lease `lock_id`, and if so with which
/// fencing token (readers have none).
pub(crate) fn won(document: &Document, mode: Mode, lock_id: &str) -> Option<Option<i64>> {
    match mode {
        Mode::Read => holds_read(document, lock_id).then_some(None),
        Mode::Write => {
            let writer = document.get_document(WRITER).ok()?;
            (writer.get_str(EMBEDDED_ID) == Ok(lock_id))
                .then(|| writer.get(FENCING_TOKEN).and_then(read_i64))
        }
    }
}

pub(super) fn holds_read(document: &Document, lock_id: &str) -> bool {
    document.get_array(READERS).is_ok_and(|readers| {
        readers.iter().any(|reader| {
            reader
                .as_document()
                .is_some_and(|reader| reader.get_str(EMBEDDED_ID) == Ok(lock_id))
        })
    })
}

/// The lease of a new holder: `{id, expiresAt, acquiredAt, renewedAt, details}` (an
/// expression).
fn new_lease(options: &LockOptions, details: Option<&Document>, lock_id: &str) -> Document {
    let mut lease = doc! {
        EMBEDDED_ID: lock_id,
        EXPIRES_AT: lease_end(options.expiry_millis()),
        ACQUIRED_AT: "$$NOW",
        RENEWED_AT: "$$NOW",
    };
    if let Some(details) = details {
        lease.insert(DETAILS, literal(details));
    }
    lease
}

/// The first stage of every attempt: forget readers whose lease ended, a waiting-writer marker
/// whose lease ended, and a writer whose lease ended (keeping only its fencing token).
///
/// Clearing the ended writer matters when clocks differ: a reader joining through a router whose
/// clock is ahead sees the writer's lease over, while the writer's renewal through a router
/// that is behind would still find it live. With the writer's id gone, that renewal matches
/// nothing, so an ended writer never comes back to life beside a live reader.
pub(super) fn drop_expired() -> Document {
    let writer_live = doc! { "$gt": [format!("${WRITER}.{EXPIRES_AT}"), "$$NOW"] };
    let token_only = doc! { FENCING_TOKEN: format!("${WRITER}.{FENCING_TOKEN}") };
    doc! { "$set": {
        READERS: live_members(READERS, None),
        WAITING_WRITER: { "$cond": [
            { "$gt": [format!("${WAITING_WRITER}.{EXPIRES_AT}"), "$$NOW"] },
            format!("${WAITING_WRITER}"),
            "$$REMOVE",
        ] },
        WRITER: { "$cond": [writer_live, format!("${WRITER}"), token_only] },
    } }
}

/// A read attempt: join the readers unless a writer holds the lock or waits for it (a missing or
/// ended lease compares below `$$NOW`; a fair lock's writers wait in its line, and a live place
/// there holds readers back), or this reader is among them already (a transfer sent again after
/// it applied). An `upgradeable` reader's lease is marked so, and joins only if no live
/// reader's is (the first stage dropped the others).
pub(crate) fn read_update(
    options: &LockOptions,
    details: Option<&Document>,
    lock_id: &str,
    upgradeable: bool,
) -> Vec<Document> {
    let mut may_read = vec![
        Bson::from(doc! { "$lte": [format!("${WRITER}.{EXPIRES_AT}"), "$$NOW"] }),
        doc! { "$lte": [format!("${WAITING_WRITER}.{EXPIRES_AT}"), "$$NOW"] }.into(),
        doc! { "$eq": [{ "$in": [lock_id, member_ids(READERS)] }, false] }.into(),
    ];
    let mut lease = new_lease(options, details, lock_id);
    if upgradeable {
        let marks = doc! { "$map": {
            "input": format!("${READERS}"),
            "as": "m",
            "in": { "$eq": [format!("$$m.{UPGRADEABLE}"), true] },
        } };
        may_read.push(doc! { "$eq": [{ "$in": [true, marks] }, false] }.into());
        lease.insert(UPGRADEABLE, true);
    }
    if options.fair() {
        may_read.push(doc! { "$eq": [{ "$size": format!("${LINE}") }, 0] }.into());
    }
    let may_read = doc! { "$and": may_read };
    let join = doc! { "$concatArrays": [format!("${READERS}"), [lease]] };
    let read = doc! { "$set": { READERS: { "$cond": [may_read, join, format!("${READERS}")] } } };
    let retain = retain(options.expiry_millis());
    match options.fair() {
        true => vec![
            drop_expired(),
            line::drop_ended(),
            read,
            line::tidy(),
            retain,
        ],
        false => vec![drop_expired(), read, retain],
    }
}

/// A write attempt `lock_id` of the waiting writer `marker_id`: take the lock if no live reader,
/// no live writer and no other writer's live marker is there, with the next fencing token,
/// removing the marker; otherwise, if `waits`, place or renew our marker (unless another
/// writer's is live).
///
/// The upgrade of the upgradeable reader `upgrading` takes the lock when that reader's lease is
/// the only live one (it stays, beside the writer's) and no writer's is live, whatever writer
/// waits: no other writer can get in while that reader holds the lock, and another writer's
/// marker stays (it only holds new readers back). Its marker is placed only while that reader's
/// lease is live and no writer's is (a late attempt after the upgrade's win marks nothing).
pub(crate) fn write_update(
    options: &LockOptions,
    details: Option<&Document>,
    lock_id: &str,
    marker_id: &str,
    waits: bool,
    upgrading: Option<&str>,
) -> Vec<Document> {
    if options.fair() && upgrading.is_none() {
        return fair_write_update(options, details, lock_id, marker_id, waits);
    }
    let marker_is_ours_or_absent = doc! {
        "$eq": [{ "$ifNull": [format!("${WAITING_WRITER}.{EMBEDDED_ID}"), marker_id] }, marker_id]
    };
    let writer_ended = doc! { "$lte": [format!("${WRITER}.{EXPIRES_AT}"), "$$NOW"] };
    let readers = format!("${READERS}");
    let free = match upgrading {
        None => doc! { "$and": [
            writer_ended.clone(),
            { "$eq": [{ "$size": &readers }, 0] },
            marker_is_ours_or_absent.clone(),
        ] },
        Some(reader) => doc! { "$and": [
            writer_ended.clone(),
            { "$eq": [{ "$size": &readers }, 1] },
            { "$in": [reader, member_ids(READERS)] },
        ] },
    };

    let writer = new_writer(options, details, lock_id);
    let keep_marker: Bson = format!("${WAITING_WRITER}").into();
    let marker_when_busy: Bson = if waits {
        let ours = doc! {
            EMBEDDED_ID: marker_id,
            EXPIRES_AT: lease_end(marker_lease_millis(options)),
        };
        // Not when the writer is this very attempt's lease (the attempt applied again): its
        // wait is over, and a marker left now would hold every reader and writer back until it
        // expired.
        let mut placed = vec![
            Bson::from(marker_is_ours_or_absent.clone()),
            doc! { "$ne": [format!("${WRITER}.{EMBEDDED_ID}"), lock_id] }.into(),
        ];
        // An upgrade's: only while its reader is live, and while no writer is (the only one that
        // can be is its own, won by another attempt: a late attempt must not mark again).
        if let Some(reader) = upgrading {
            placed.push(doc! { "$in": [reader, member_ids(READERS)] }.into());
            placed.push(writer_ended.clone().into());
        }
        let placed = doc! { "$and": placed };
        doc! { "$cond": [placed, ours, keep_marker.clone()] }.into()
    } else {
        keep_marker.clone()
    };
    // A plain writer wins only with its own marker or none; an upgrade leaves another's.
    let marker_when_won = doc! { "$cond": [marker_is_ours_or_absent, "$$REMOVE", keep_marker] };
    let is_free = format!("${WRITE_IS_FREE}");
    vec![
        drop_expired(),
        doc! { "$set": { WRITE_IS_FREE: free } },
        doc! { "$set": {
            WRITER: { "$cond": [&is_free, writer, format!("${WRITER}")] },
            WAITING_WRITER: { "$cond": [&is_free, marker_when_won, marker_when_busy] },
        } },
        doc! { "$unset": WRITE_IS_FREE },
        retain(options.expiry_millis().max(marker_lease_millis(options))),
    ]
}

/// The lease of a new writer, with the next fencing token (an expression).
fn new_writer(options: &LockOptions, details: Option<&Document>, lock_id: &str) -> Document {
    let mut writer = new_lease(options, details, lock_id);
    writer.insert(
        FENCING_TOKEN,
        next_fencing_token(&format!("{WRITER}.{FENCING_TOKEN}")),
    );
    writer
}

/// A fair lock's write attempt `lock_id` of the wait `wait` (see `lease::line`): take the lock
/// if no live reader, no live writer and no upgrade's marker is there, and no live place is
/// ahead of the wait's in line, which then leaves the line (and is recorded as `servedWait`);
/// otherwise, if it `waits`, renew the wait's place or add it at the end (not once the wait was
/// served, as for an exclusive lock). Its place holds new readers back as a waiting writer's
/// marker does. An upgrade is not in line (see [`write_update`]).
fn fair_write_update(
    options: &LockOptions,
    details: Option<&Document>,
    lock_id: &str,
    wait: &str,
    waits: bool,
) -> Vec<Document> {
    let free = doc! { "$and": [
        { "$lte": [format!("${WRITER}.{EXPIRES_AT}"), "$$NOW"] },
        { "$eq": [{ "$size": format!("${READERS}") }, 0] },
        { "$lte": [format!("${WAITING_WRITER}.{EXPIRES_AT}"), "$$NOW"] },
        line::first_in_line(wait),
    ] };
    let line_when_busy: Bson = if waits {
        // Not once the wait was served, nor when this very attempt is the writer (applied
        // again).
        let served = doc! { "$or": [
            { "$eq": [format!("${WRITER}.{EMBEDDED_ID}"), lock_id] },
            { "$eq": [format!("${SERVED_WAIT}"), wait] },
        ] };
        let joined = line::joined(wait, marker_lease_millis(options));
        doc! { "$cond": [served, format!("${LINE}"), joined] }.into()
    } else {
        format!("${LINE}").into()
    };
    let is_free = format!("${WRITE_IS_FREE}");
    vec![
        drop_expired(),
        line::drop_ended(),
        doc! { "$set": { WRITE_IS_FREE: free } },
        doc! { "$set": {
            WRITER: { "$cond": [&is_free, new_writer(options, details, lock_id), format!("${WRITER}")] },
            LINE: { "$cond": [&is_free, line::left(wait), line_when_busy] },
            SERVED_WAIT: { "$cond": [&is_free, wait, format!("${SERVED_WAIT}")] },
        } },
        doc! { "$unset": WRITE_IS_FREE },
        line::tidy(),
        retain(options.expiry_millis().max(marker_lease_millis(options))),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_outlives_the_longest_sleep_between_attempts() {
        let options = LockOptions::default();
        let longest_sleep = options.busy_wait_sleep_time().1;
        let lease = Duration::from_millis(u64::try_from(marker_lease_millis(&options)).unwrap());
        assert!(lease >= longest_sleep * 2, "{lease:?}");
        assert_eq!(lease, Duration::from_millis(2_600));
    }

    #[test]
    fn readers_are_found_by_lock_id_only() {
        let document = doc! { READERS: [{ EMBEDDED_ID: "a" }, 5, { "other": "b" }] };
        assert!(holds_read(&document, "a"));
        assert!(!holds_read(&document, "b"));
        assert!(!holds_read(&doc! { READERS: "a" }, "a"));
    }
}
