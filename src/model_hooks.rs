//! The lease protocol of every kind of lock (the exclusive lock's here; [`semaphore`] and the
//! modules below for the others), for the
//! repository's model checker (`model/`): the client's decisions (`protocol`: deadlines, the extension rule, renewal rounds, an attempt's
//! outcome) and the filters and update pipelines every command sends. The model runs this very
//! code (the pipelines through a small evaluator of MongoDB's expressions), so that it checks the
//! crate's protocol rather than a copy that could drift from it.
//!
//! Not part of the API: hidden from the docs, and free to change in any release.

use mongodb::bson::{Bson, Document};

use crate::fencing::Fence;
use crate::lease::schema;
use crate::options::LockOptions;
use crate::token::FencingToken;

/// The protocol's decisions without I/O, which the engine runs on its clocks and the model on
/// its ticks: a holder's [`Lease`] (its deadline and the extension rule), the renewal loop's
/// [`Renewals`], [`give_up_at`] and [`suspect_at`], an acquisition [`Attempt`] (of a document
/// lock: its commands, [`DocumentAttempt`]), a release's
/// [`hands_over`] and [`transfer_answered`], whether the end of a lease keeps its window
/// ([`keeps_window`]), whom a release hands its lease to ([`handover`], over the line of
/// [`InLine`] waiters, each one's [`takes_over`]), a family's [`Work`] under way (what a shutdown
/// waits for and undoes), and the renewal inside a lease-checked [`Transaction`].
pub use crate::lease::hooks::{
    Attempt, DocumentAttempt, DocumentStep, Due, Handover, InLine, Lease, MAX_TRANSFERS_IN_A_ROW,
    Moment, Phase, Refusal, Renewals, Reply, Sent, Settling, Step, Tell, Transaction,
    TransferReply, TransferStep, Work, give_up_at, handover, hands_over, keeps_window,
    renewed_every_lease, retry_delay, settled, suspect_at, transfer_answered,
};

/// A kind of lease, for [`takes_over`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseKind {
    /// An exclusive lock's.
    Exclusive,
    /// A place of a semaphore.
    Place,
    /// A reader-writer lock's writer.
    Writer,
    /// A reader-writer lock's reader.
    Reader,
    /// A document lock's, embedded in an application document.
    Document,
}

impl LeaseKind {
    fn layout(self) -> schema::Layout {
        match self {
            LeaseKind::Exclusive => schema::Layout::LockDocument,
            LeaseKind::Place => schema::Layout::Members(schema::HOLDERS.to_owned()),
            LeaseKind::Writer => schema::Layout::Writer,
            LeaseKind::Reader => schema::Layout::Members(schema::READERS.to_owned()),
            LeaseKind::Document => schema::Layout::Embedded("lock".to_owned()),
        }
    }
}

/// Whether a lease of kind `releasing` can be handed over in its release command to a waiter for
/// a lease of kind `waiter`, as the engine decides it for an offer (the [`InLine::takes_over`]
/// of that waiter).
pub fn takes_over(releasing: LeaseKind, waiter: LeaseKind) -> Option<bool> {
    crate::lease::hooks::takes_over(&releasing.layout(), &waiter.layout())
}

/// The filter of an acquisition attempt (`findAndModify` with upsert, returning the document
/// after the update).
pub fn attempt_filter(name: &str) -> Document {
    schema::attempt_filter(name)
}

/// The update pipeline of an acquisition attempt with `lock_id`, storing `details` if given
/// ([`LockDetails`](crate::LockDetails), as the holder's document).
pub fn attempt_update(
    lock_id: &str,
    options: &LockOptions,
    details: Option<&Document>,
) -> Vec<Document> {
    schema::acquire_update(lock_id, options, details, None)
}

/// What an attempt with `lock_id` learns from the document it returned: `Some(token)` if it won
/// (`None` inside when the token is unreadable), `None` if the lock is busy.
pub fn attempt_won(document: &Document, lock_id: &str) -> Option<Option<i64>> {
    match schema::read_attempt_reply(document, lock_id) {
        schema::AttemptReply::Acquired(token) => Some(token),
        schema::AttemptReply::Busy => None,
    }
}

/// The update pipeline of a fair lock's attempt with `lock_id` of the wait `wait`, which waits
/// on if it fails (its place in line renewed, or added).
pub fn fair_attempt_update(
    lock_id: &str,
    options: &LockOptions,
    details: Option<&Document>,
    wait: &str,
) -> Vec<Document> {
    crate::lease::line::fair_acquire_update(lock_id, options, details, wait, true, None)
}

/// The filter and update pipeline that take the place of the wait `wait` out of lock `name`'s
/// line, once it ended without the lock (`WaitingMarker::remove`).
pub fn line_removal(name: &str, wait: &str) -> (Document, Vec<Document>) {
    crate::lease::line::removal(name, wait)
}

/// The update pipeline of a revoking wait's attempt (`acquire_revoking`) with `lock_id`, of the
/// wait `wait`, asking the holder to let go within `grace_millis` with `priority`; it waits on
/// if it fails (its request placed or renewed).
pub fn revoking_attempt_update(
    lock_id: &str,
    options: &LockOptions,
    details: Option<&Document>,
    wait: &str,
    grace_millis: i64,
    priority: i32,
) -> Vec<Document> {
    let ask = crate::lease::revoke::Ask {
        grace_millis,
        priority,
    };
    crate::lease::revoke::revoking_acquire_update(lock_id, options, details, wait, ask, true, None)
}

/// The update pipeline of a release `releasing` that hands the lock to the revoking waiter
/// `waiter` of the wait `wait`: its attempt's, after the releasing lease ends.
pub fn revoking_transfer_update(
    waiter: &str,
    options: &LockOptions,
    releasing: &str,
    details: Option<&Document>,
    wait: &str,
    grace_millis: i64,
    priority: i32,
) -> Vec<Document> {
    let mut pipeline =
        revoking_attempt_update(waiter, options, details, wait, grace_millis, priority);
    pipeline.insert(0, schema::end_releasing(releasing));
    pipeline
}

/// The filter and update that take the request of the revoking wait `wait` out of lock `name`'s
/// document, once the wait ended without the lock.
pub fn revoke_removal(name: &str, wait: &str) -> (Document, Document) {
    crate::lease::revoke::removal(name, wait)
}

/// The filter and pipeline of an operator's revocation request `id` on lock `name`
/// (`Provider::request_revocation`, `dlock revoke`), with `grace_millis` of grace.
pub fn operator_revocation(name: &str, id: &str, grace_millis: i64) -> (Document, Vec<Document>) {
    crate::lease::revoke::operator_request(
        name,
        crate::lease::revoke::Asked::Holder,
        id,
        grace_millis,
    )
}

/// The filter of a guard's `extend` of the lease `lock_id`: a renewal's, and no live revocation
/// request targets the lease.
pub fn extend_filter(name: &str, lock_id: &str) -> Document {
    schema::Layout::LockDocument.extend_filter(&Bson::from(name), lock_id)
}

/// The filter of a renewal of the lease `lock_id` (a `findAndModify`: no match means lost).
pub fn renew_filter(name: &str, lock_id: &str) -> Document {
    schema::Layout::LockDocument.renew_many_filter(&[Bson::from(name)], &[lock_id.to_owned()])
}

/// The update pipeline of a renewal.
pub fn renew_update(options: &LockOptions) -> Vec<Document> {
    schema::Layout::LockDocument.renew_update(options, &[])
}

/// The update pipeline of a guard's `extend` of the lease `lock_id` by `by_millis` (its filter
/// is a renewal's).
pub fn extend_update(options: &LockOptions, lock_id: &str, by_millis: i64) -> Vec<Document> {
    schema::Layout::LockDocument.extend_update(options, lock_id, by_millis)
}

/// The filter of a release of the lease `lock_id`, and of the cleanup after an attempt with
/// `lock_id` whose outcome is unknown (the same update).
pub fn release_filter(name: &str, lock_id: &str) -> Document {
    schema::Layout::LockDocument.release_filter(&Bson::from(name), lock_id)
}

/// The update pipeline of a holder's release (also a lost lease's, and a shutdown's of a held
/// lease): a `min_hold` window stays.
pub fn release_update(lock_id: &str) -> Vec<Document> {
    schema::Layout::LockDocument.release_update(lock_id, schema::Ending::Release)
}

/// The update pipeline of a cleanup, which ends a lease nobody was given (after an attempt or a
/// transfer whose outcome is unknown, or a win nobody receives): at once, window and all.
pub fn cleanup_update(lock_id: &str) -> Vec<Document> {
    schema::Layout::LockDocument.release_update(lock_id, schema::Ending::Cleanup)
}

/// The filter of a forced release of lock `name` (`Provider::force_release`, `dlock release`):
/// its lease, whoever holds it, in a document shaped like an exclusive lock's.
pub fn force_release_filter(name: &str) -> Document {
    crate::lease::admin::force_release_filter(name)
}

/// The update pipeline of a forced release: the lease ends as its holder's release would.
pub fn force_release_update() -> Vec<Document> {
    crate::lease::admin::force_release_update()
}

/// The filter of `purge_expired` (`Provider::purge_expired`, `dlock purge`) over a collection of
/// exclusive locks: lock documents whose last lease ended more than a day ago, and nothing shaped
/// otherwise.
pub fn purge_filter() -> Document {
    crate::lease::admin::expired(&[schema::Stored::Exclusive])
}

/// The filter of a release that hands the lock over from `releasing` to a local waiter's
/// `waiter` (a `findAndModify` returning the document after the update).
pub fn transfer_filter(name: &str, releasing: &str, waiter: &str) -> Document {
    let exclusive = schema::Layout::LockDocument;
    schema::transfer_filter(
        &Bson::from(name),
        &exclusive,
        releasing,
        &exclusive,
        &[waiter],
    )
}

/// The update pipeline of that transfer, as an exclusive lock builds it (`lock.rs`): the lease
/// the waiter's own attempt would write, with the waiter's `options` and `details`.
pub fn transfer_update(
    waiter: &str,
    options: &LockOptions,
    releasing: &str,
    details: Option<&Document>,
) -> Vec<Document> {
    crate::lock::takeover_update(waiter, options, details, releasing)
}

/// The update pipeline of a fair lock's release `releasing` that hands the lock to the waiter
/// `waiter` of the wait `wait`: the release ends its lease, and the waiter takes the lock only
/// if it is first in line.
pub fn fair_transfer_update(
    waiter: &str,
    options: &LockOptions,
    releasing: &str,
    details: Option<&Document>,
    wait: &str,
) -> Vec<Document> {
    crate::lease::line::fair_acquire_update(waiter, options, details, wait, true, Some(releasing))
}

/// The filter of a fenced write with `token` to the documents of `filter` ([`Fence::new`]).
pub fn fenced_filter(filter: Document, token: i64) -> Document {
    Fence::new().fenced_filter(filter, FencingToken::new(token))
}

/// A semaphore's commands, whose leases are members of its document's `holders` array: as
/// `semaphore.rs` and the engine build them.
pub mod semaphore {
    use mongodb::bson::{Bson, Document};

    use crate::LockOptions;
    use crate::lease::schema::{self, HOLDERS, Layout};
    use crate::semaphore::{self as code, JoinReply};

    fn places() -> Layout {
        Layout::Members(HOLDERS.to_owned())
    }

    /// The update pipeline of an attempt of `lock_id` for `places` places on a semaphore of
    /// `max_count` places, placing the waiting mark `marker` while it waits (a waiter for
    /// several places; the filter is the exclusive lock's
    /// [`attempt_filter`](super::attempt_filter)).
    pub fn attempt_update(
        lock_id: &str,
        places: u32,
        max_count: u32,
        options: &LockOptions,
        marker: Option<&str>,
    ) -> Vec<Document> {
        let ask = code::Ask {
            lock_id,
            places,
            max_count,
            marker,
            waits: marker.is_some(),
        };
        code::join_update(ask, options, None)
    }

    /// What an attempt (or a transfer) of `lock_id` for `places` places learns from the
    /// document it returned: `Ok(Some(token))` if it holds its places (`None` inside when the
    /// token is unreadable), `Ok(None)` if they are not free, `Err(stored)` if the document
    /// records another count or too few places.
    pub fn won(
        document: &Document,
        lock_id: &str,
        places: u32,
        max_count: u32,
    ) -> Result<Option<Option<i64>>, String> {
        match code::read_join_reply(document, lock_id, places, max_count) {
            JoinReply::OtherCount(stored) => Err(stored),
            JoinReply::TooMany(stored) => Err(stored.to_string()),
            JoinReply::Full => Ok(None),
            JoinReply::Joined(place) => Ok(Some(place.token)),
        }
    }

    /// The filter and update pipeline (run with upsert) of an operator's `set_max_count` of
    /// semaphore `name` to `max_count`.
    pub fn set_count(name: &str, max_count: u32) -> (Document, Vec<Document>) {
        crate::lease::admin::set_semaphore_count_command(name, max_count)
    }

    /// The filter and update (of operators) that remove the waiting mark `marker` once its
    /// wait ended without the places (`WaitingMarker::remove`).
    pub fn marker_removal(name: &str, marker: &str) -> (Document, Document) {
        crate::lease::waiting_marker::removal(name, schema::WAITING, marker)
    }

    /// The filter of a renewal of the place `lock_id`.
    pub fn renew_filter(name: &str, lock_id: &str) -> Document {
        places().renew_many_filter(&[Bson::from(name)], &[lock_id.to_owned()])
    }

    /// The update pipeline of a renewal of the place `lock_id`.
    pub fn renew_update(options: &LockOptions, lock_id: &str) -> Vec<Document> {
        places().renew_update(options, &[lock_id.to_owned()])
    }

    /// The update pipeline of a guard's `extend` of the place `lock_id` by `by_millis` (its
    /// filter is a renewal's).
    pub fn extend_update(options: &LockOptions, lock_id: &str, by_millis: i64) -> Vec<Document> {
        places().extend_update(options, lock_id, by_millis)
    }

    /// The filter of a release of the place `lock_id` (and of its cleanup).
    pub fn release_filter(name: &str, lock_id: &str) -> Document {
        places().release_filter(&Bson::from(name), lock_id)
    }

    /// The filter, update pipeline and follow-up read (an aggregation yielding, per document,
    /// the live ones among `lock_ids` as `ours`) of a renewal of several places in one `update`
    /// command, as the renewal loop sends the second and later leases of a round.
    pub fn renew_many(
        name: &str,
        options: &LockOptions,
        lock_ids: &[String],
    ) -> (Document, Vec<Document>, Vec<Document>) {
        let ids = vec![Bson::from(name); lock_ids.len()];
        (
            places().renew_many_filter(&ids, lock_ids),
            places().renew_update(options, lock_ids),
            places().live_lock_ids(&ids, lock_ids),
        )
    }

    /// The update pipeline of a release of the place `lock_id` (a cleanup's is the same: a
    /// semaphore has no `min_hold`).
    pub fn release_update(lock_id: &str) -> Vec<Document> {
        places().release_update(lock_id, schema::Ending::Release)
    }

    /// The filter and update of an operator's forced release of the place `lock_id`
    /// (`Provider::force_release_holder` with an entry of the semaphore's `holders()`).
    pub fn force_release(name: &str, lock_id: &str) -> (Document, Vec<Document>) {
        crate::lease::admin::force_release_lease_command(&places(), name, lock_id)
    }

    /// The filter and pipeline of an operator's revocation request `id` to the place `lock_id`
    /// (`Provider::request_revocation_of` with an entry of the semaphore's `holders()`), with
    /// `grace_millis` of grace.
    pub fn operator_revocation(
        name: &str,
        lock_id: &str,
        id: &str,
        grace_millis: i64,
    ) -> (Document, Vec<Document>) {
        let place = crate::lease::revoke::Asked::Place(lock_id);
        crate::lease::revoke::operator_request(name, place, id, grace_millis)
    }

    /// The filter and update (of operators, not a pipeline) of an operator's forced release of
    /// every place (`force_release_all`).
    pub fn force_release_all(name: &str) -> (Document, Document) {
        crate::lease::admin::force_release_semaphore_command(name)
    }

    /// The filter of a release that hands the place `releasing` to a local waiter's `waiter`.
    pub fn transfer_filter(name: &str, releasing: &str, waiter: &str) -> Document {
        let places = places();
        schema::transfer_filter(&Bson::from(name), &places, releasing, &places, &[waiter])
    }

    /// The update pipeline of that transfer, as the semaphore's takeover builds it, for a
    /// waiter of `places` places (placing its waiting mark `marker`, if any, when they do not
    /// fit).
    pub fn transfer_update(
        waiter: &str,
        places: u32,
        max_count: u32,
        options: &LockOptions,
        releasing: &str,
        marker: Option<&str>,
    ) -> Vec<Document> {
        let ask = code::Ask {
            lock_id: waiter,
            places,
            max_count,
            marker,
            waits: marker.is_some(),
        };
        code::takeover_update(ask, options, None, releasing)
    }
}

/// A reader-writer lock's commands (`rw_lock/attempt.rs`): readers are members of the
/// document's `readers` array, the writer's lease is embedded under `writer`, and a waiting
/// writer's marker under `waitingWriter` holds new readers back. `reads` says which side.
pub mod reader_writer {
    use mongodb::bson::{Bson, Document};

    use crate::LockOptions;
    use crate::lease::schema::{self, Layout};
    use crate::rw_lock::Mode;
    use crate::rw_lock::attempt as code;

    fn mode(reads: bool) -> Mode {
        if reads { Mode::Read } else { Mode::Write }
    }

    fn layout(reads: bool) -> Layout {
        code::layout(mode(reads))
    }

    /// The update pipeline of an attempt of `lock_id` (the filter is the exclusive lock's
    /// [`attempt_filter`](super::attempt_filter)); a writer's places or renews its waiting
    /// writer's `marker` while it waits (its callers wait for ever). A reader may be
    /// `upgradeable` (`acquire_upgradeable_read`); a writer may be the upgrade of the
    /// upgradeable reader's lease `upgrading` (`UpgradeableReadGuard::upgrade`).
    pub fn attempt_update(
        lock_id: &str,
        reads: bool,
        options: &LockOptions,
        marker: &str,
        upgradeable: bool,
        upgrading: Option<&str>,
    ) -> Vec<Document> {
        if reads {
            code::read_update(options, None, lock_id, upgradeable)
        } else {
            code::write_update(options, None, lock_id, marker, true, upgrading)
        }
    }

    /// What an attempt (or a transfer) of `lock_id` learns from the document it returned:
    /// `Some(token)` if it holds the lock (a reader's token is `None`), `None` if not.
    pub fn won(document: &Document, reads: bool, lock_id: &str) -> Option<Option<i64>> {
        code::won(document, mode(reads), lock_id)
    }

    /// The filter of a renewal of the lease `lock_id`.
    pub fn renew_filter(name: &str, lock_id: &str, reads: bool) -> Document {
        layout(reads).renew_many_filter(&[Bson::from(name)], &[lock_id.to_owned()])
    }

    /// The update pipeline of a renewal of the lease `lock_id`.
    pub fn renew_update(options: &LockOptions, lock_id: &str, reads: bool) -> Vec<Document> {
        layout(reads).renew_update(options, &[lock_id.to_owned()])
    }

    /// The update pipeline of a guard's `extend` of the lease `lock_id` by `by_millis` (its
    /// filter is a renewal's).
    pub fn extend_update(
        options: &LockOptions,
        lock_id: &str,
        reads: bool,
        by_millis: i64,
    ) -> Vec<Document> {
        layout(reads).extend_update(options, lock_id, by_millis)
    }

    /// The filter of a release of the lease `lock_id` (and of its cleanup).
    pub fn release_filter(name: &str, lock_id: &str, reads: bool) -> Document {
        layout(reads).release_filter(&Bson::from(name), lock_id)
    }

    /// The update pipeline of a release of the lease `lock_id`, or of its `cleanup` (a
    /// reader-writer lock has no `min_hold`; a writer's cleanup forgets a fair lock's
    /// `servedWait`).
    pub fn release_update(lock_id: &str, reads: bool, cleanup: bool) -> Vec<Document> {
        let ending = match cleanup {
            true => schema::Ending::Cleanup,
            false => schema::Ending::Release,
        };
        layout(reads).release_update(lock_id, ending)
    }

    /// The filter and update of an operator's forced release of one lease, the writer's or a
    /// reader's `lock_id` (`Provider::force_release_holder` with an entry of `holders()`).
    pub fn force_release_holder(
        name: &str,
        lock_id: &str,
        reads: bool,
    ) -> (Document, Vec<Document>) {
        crate::lease::admin::force_release_lease_command(&layout(reads), name, lock_id)
    }

    /// The filter and update pipeline of an operator's forced release of every lease
    /// (`force_release_all`: the writer's, the readers', a waiting writer's marker).
    pub fn force_release_all(name: &str) -> (Document, Vec<Document>) {
        crate::lease::admin::force_release_reader_writer_command(name)
    }

    /// The filter and update (of operators) that remove the waiting writer `marker`'s marker,
    /// once its wait ended without the lock (`WaitingWriter::remove`).
    pub fn remove_marker(name: &str, marker: &str) -> (Document, Document) {
        crate::lease::waiting_marker::removal(name, crate::lease::schema::WAITING_WRITER, marker)
    }

    /// The filter of a writer's release `releasing` that hands the lock to the local reader
    /// `waiter`.
    pub fn transfer_filter(name: &str, releasing: &str, waiter: &str) -> Document {
        let (from, to) = (layout(false), layout(true));
        schema::transfer_filter(&Bson::from(name), &from, releasing, &to, &[waiter])
    }

    /// The update pipeline of that transfer, as the (`upgradeable`) reader's takeover builds
    /// it.
    pub fn transfer_update(
        waiter: &str,
        options: &LockOptions,
        releasing: &str,
        upgradeable: bool,
    ) -> Vec<Document> {
        code::read_takeover_update(waiter, options, None, releasing, upgradeable)
    }
}

/// A document lock's commands (`document_lock/`): its lease is embedded in an application
/// document, under the lock field `field`.
pub mod document_lock {
    use mongodb::bson::{Bson, Document, doc};

    use crate::LockOptions;
    use crate::document_lock::{attempt, guard, insertion};
    use crate::lease::schema::{self, EMBEDDED_ID, FENCING_TOKEN, Layout};
    use crate::token::read_i64;

    fn layout(field: &str) -> Layout {
        Layout::Embedded(field.to_owned())
    }

    /// The filter of an attempt on the document `name` (the caller's filter `{_id: name}`):
    /// matched only while it is unlocked.
    pub fn attempt_filter(name: &str, field: &str) -> Document {
        attempt::unlocked_filter(&doc! { "_id": name }, field)
    }

    /// The update of an attempt of `lock_id` (a `findAndModify` without upsert, returning the
    /// document after the update).
    pub fn attempt_update(lock_id: &str, options: &LockOptions, field: &str) -> Vec<Document> {
        attempt::lock_update(field, lock_id, options)
    }

    /// The token an attempt of `lock_id` won, read from the document it returned (`None` if
    /// its lease is not there, or has no numeric token).
    pub fn won(document: &Document, lock_id: &str, field: &str) -> Option<i64> {
        let lease = document.get_document(field).ok()?;
        (lease.get_str(EMBEDDED_ID) == Ok(lock_id))
            .then(|| lease.get(FENCING_TOKEN).and_then(read_i64))
            .flatten()
    }

    /// The filter of a renewal of the lease `lock_id` on the document `name`.
    pub fn renew_filter(name: &str, lock_id: &str, field: &str) -> Document {
        layout(field).renew_many_filter(&[Bson::from(name)], &[lock_id.to_owned()])
    }

    /// The update pipeline of a renewal.
    pub fn renew_update(options: &LockOptions, lock_id: &str, field: &str) -> Vec<Document> {
        layout(field).renew_update(options, &[lock_id.to_owned()])
    }

    /// The update pipeline of a guard's `extend` of the lease `lock_id` by `by_millis` (its
    /// filter is a renewal's).
    pub fn extend_update(
        options: &LockOptions,
        lock_id: &str,
        field: &str,
        by_millis: i64,
    ) -> Vec<Document> {
        layout(field).extend_update(options, lock_id, by_millis)
    }

    /// The filter of a release of the lease `lock_id` on the document `name` (a guard dropped
    /// or a lost lease: the document is unlocked as it is).
    pub fn release_filter(name: &str, lock_id: &str, field: &str) -> Document {
        layout(field).release_filter(&Bson::from(name), lock_id)
    }

    /// The update pipeline of a release (and of a cleanup).
    pub fn release_update(lock_id: &str, field: &str) -> Vec<Document> {
        layout(field).release_update(lock_id, schema::Ending::Release)
    }

    /// The filter of the cleanup after an attempt of `lock_id` whose outcome is unknown: every
    /// document carrying the lock id (sent as a multi-document update, `Target::cleanup`).
    pub fn cleanup_filter(lock_id: &str, field: &str) -> Document {
        layout(field).anywhere_filter(lock_id)
    }

    /// The document a `lock_or_insert` of the document `name` inserts, unlocked, when none
    /// matches: the caller's `new_document`, with `_id` `name` (`document_lock::insertion`).
    pub fn insertion_of(
        new_document: Document,
        name: &str,
        field: &str,
    ) -> crate::Result<Document> {
        insertion(new_document, &Bson::from(name), field)
    }

    /// The filter of a holder's `commit` (and `checkpoint`, `replace`) of the document `name`:
    /// its lease `lock_id` still live.
    pub fn commit_filter(name: &str, lock_id: &str, field: &str) -> Document {
        guard::live_filter(&layout(field), &Bson::from(name), lock_id)
    }

    /// The document a `replace` by the holder of `token` writes in place of the document:
    /// the caller's `new_document`, whose lock field keeps only the token.
    pub fn replacement(new_document: Document, field: &str, token: i64) -> Document {
        let mut replacement = new_document;
        guard::keep_only_token(&mut replacement, field, crate::FencingToken::new(token));
        replacement
    }

    /// The update of a `commit` of the caller's `update`: applied and unlocked in one write.
    pub fn commit_update(update: Document, field: &str) -> Document {
        let mut update = update;
        guard::unlock_with(&mut update, field);
        update
    }
}
