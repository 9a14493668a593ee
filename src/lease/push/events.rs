//! Which change events may end a lease: [`freed`].

use mongodb::bson::{Bson, Document};
use mongodb::change_stream::event::{ChangeStreamEvent, OperationType};

use crate::lease::{line, schema};

/// The lock an event is about, and whether it may have ended a lease stored there rather than
/// renewed or taken one. For every kind of lock document:
///
/// - a deletion ends every lease;
/// - an exclusive lock's release (or cleanup, or forced release) removes `lockId`; a writer's
///   removes `writer.id`; a waiting writer that gives up removes `waitingWriter` (readers may
///   join again);
/// - a semaphore place's or a reader's release takes its lease out of the array, which then
///   shrinks (`truncatedArrays`; the elements after it move up, which shows as changed
///   elements); where a server reports a whole array rewritten instead, that may be a release
///   too;
/// - before MongoDB 5.0 a pipeline update is logged, and shown, as a replacement: an exclusive
///   lock's document without `lockId` is free (unless it keeps a fair lock's line: every waiting
///   attempt of a fair lock rewrites it, and its waiters poll); any other replacement may have
///   freed something;
/// - from MongoDB 5.0 on, a changed subdocument whose difference would be larger than its new
///   value is logged, and shown, as a whole-field update (server: `document_diff_calculator`):
///   ending a writer by setting `writer: {fencingToken}` (a forced release, a writer handing
///   over to readers) then arrives as `updatedFields.writer` without `removedFields`. So a
///   field is judged by its new value: a `writer` without an `id` was freed, one with an `id`
///   taken; a whole `readers` array rewritten may be a release;
/// - a semaphore's `holders` array written whole (a replacement, or a whole-field update) has
///   a free place when it is shorter than the semaphore's places (`maxCount` in a replacement,
///   `places` for the name in an update, which does not show it; unknown: it may be a release).
///   A place handed over in a release command shifts the array by one, which a server may log
///   as the whole array rewritten: its echo, with every place taken, wakes nobody.
///
/// Renewals (new `expiresAt`s) and acquisitions (a new `lockId`, writer or element) free
/// nothing, also a writer's acquisition that removes its own waiting-writer marker, and a fair
/// lock's acquisition that shortens its line.
pub(super) fn freed(
    event: &ChangeStreamEvent<Document>,
    places: impl Fn(&str) -> Option<u32>,
) -> Option<(String, bool)> {
    let name = event.document_key.as_ref()?.get_str(schema::ID).ok()?;
    let has_room = |holders: &Bson, places: Option<i64>| {
        let held = holders.as_array().map_or(0, Vec::len);
        places.is_none_or(|places| i64::try_from(held).unwrap_or(i64::MAX) < places)
    };
    let writer_id = schema::Layout::Writer.lock_id_path();
    let ends_lease = |field: &String| {
        [schema::LOCK_ID, schema::WAITING_WRITER, &writer_id].contains(&field.as_str())
    };
    let writer_has_holder = |value: &Bson| {
        value
            .as_document()
            .is_some_and(|writer| writer.contains_key(schema::EMBEDDED_ID))
    };
    let frees = |(field, value): (&String, &Bson)| match field.as_str() {
        schema::WRITER => !writer_has_holder(value),
        schema::HOLDERS => has_room(value, places(name).map(i64::from)),
        schema::READERS => true,
        _ => false,
    };
    // (A fair lock's acquisition also shortens its line, which shows as a truncated array: the
    // new `lockId` says it was taken.)
    let takes = |(field, value): (&String, &Bson)| {
        *field == writer_id
            || field == schema::LOCK_ID
            || field == schema::WRITER && writer_has_holder(value)
    };
    let ends = match event.operation_type {
        OperationType::Delete => true,
        OperationType::Replace => event.full_document.as_ref().is_none_or(|document| {
            match document.get(schema::HOLDERS) {
                Some(holders) => has_room(
                    holders,
                    document
                        .get(schema::MAX_COUNT)
                        .and_then(crate::token::read_i64),
                ),
                // A fair lock's waiting attempt rewrites its line: before MongoDB 5.0 that is a
                // replacement too, and one that woke the pollers would set them spinning
                // while the line holds a free lock back. Its waiters poll instead.
                None => {
                    !document.contains_key(schema::LOCK_ID) && !document.contains_key(schema::LINE)
                }
            }
        }),
        OperationType::Update => event.update_description.as_ref().is_some_and(|update| {
            let updated = || update.updated_fields.iter();
            let freed = update.removed_fields.iter().any(ends_lease)
                || update
                    .truncated_arrays
                    .as_ref()
                    .is_some_and(|truncated| !truncated.is_empty())
                || updated().any(frees);
            freed && !updated().any(takes)
        }),
        _ => false,
    };
    Some((name.to_owned(), ends))
}

/// What `event` shows of a fair lock's line (see `line`): `Some` with the id of its first place
/// (`None` inside: nobody waits in line any more), or `None` when it does not show it (the
/// first place did not change, or the lock is not fair). From MongoDB 5.0 an update shows an
/// array it changed as the whole array, or as the elements that changed (`line.0`, or inside
/// one, `line.0.id`); before, every pipeline update is a replacement with the whole document.
pub(super) fn line_head(event: &ChangeStreamEvent<Document>) -> Option<Option<String>> {
    match event.operation_type {
        OperationType::Delete => Some(None),
        OperationType::Replace => event.full_document.as_ref().map(line::head),
        OperationType::Update => {
            let update = event.update_description.as_ref()?;
            if update
                .removed_fields
                .iter()
                .any(|field| field == schema::LINE)
            {
                return Some(None);
            }
            let updated = &update.updated_fields;
            let first = format!("{}.0", schema::LINE);
            let first_id = format!("{first}.{}", schema::EMBEDDED_ID);
            if let Some(whole) = updated.get(schema::LINE) {
                Some(line::head_of(whole))
            } else if let Some(place) = updated.get(&first) {
                Some(line::place_id(place))
            } else {
                let id = updated.get(&first_id)?;
                Some(id.as_str().map(str::to_owned))
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::{Timestamp, doc};

    fn event(operation: &str, more: Document) -> ChangeStreamEvent<Document> {
        let mut event = doc! {
            "_id": { "_data": "82" },
            "operationType": operation,
            "clusterTime": Bson::Timestamp(Timestamp { time: 1, increment: 1 }),
            "ns": { "db": "db", "coll": "locks" },
            "documentKey": { "_id": "job" },
        };
        event.extend(more);
        mongodb::bson::from_document(event).expect("a change event")
    }

    #[test]
    fn releases_deletions_and_replacements_without_a_holder_free_the_lock() {
        let freed_by = |operation: &str, more: Document| freed(&event(operation, more), |_| None);
        let released = doc! { "updateDescription": {
            "updatedFields": { "expiresAt": mongodb::bson::DateTime::now() },
            "removedFields": ["lockId"],
        } };
        assert_eq!(freed_by("update", released), Some(("job".to_owned(), true)));
        let renewed = doc! { "updateDescription": {
            "updatedFields": { "expiresAt": mongodb::bson::DateTime::now() },
            "removedFields": [],
        } };
        assert_eq!(freed_by("update", renewed), Some(("job".to_owned(), false)));
        assert_eq!(freed_by("delete", doc! {}), Some(("job".to_owned(), true)));
        // Before MongoDB 5.0 pipeline updates come as replacements: the document tells.
        let held = doc! { "fullDocument": { "_id": "job", "lockId": "a", "fencingToken": 1_i64 } };
        assert_eq!(freed_by("replace", held), Some(("job".to_owned(), false)));
        let ended = doc! { "fullDocument": { "_id": "job", "fencingToken": 1_i64 } };
        assert_eq!(freed_by("replace", ended), Some(("job".to_owned(), true)));
    }

    #[test]
    fn a_fair_locks_line_neither_wakes_pollers_nor_hides_an_acquisition() {
        let freed_by = |operation: &str, more: Document| freed(&event(operation, more), |_| None);
        // From MongoDB 5.0: an acquisition that takes its place out of the line shortens it.
        let acquired = doc! { "updateDescription": {
            "updatedFields": { "lockId": "b", "servedWait": "w" },
            "removedFields": [],
            "truncatedArrays": [{ "field": "line", "newSize": 1 }],
        } };
        assert_eq!(
            freed_by("update", acquired),
            Some(("job".to_owned(), false))
        );
        // A wait that gives its place up on a free lock: the next in line may go.
        let left = doc! { "updateDescription": {
            "updatedFields": {},
            "removedFields": [],
            "truncatedArrays": [{ "field": "line", "newSize": 1 }],
        } };
        assert_eq!(freed_by("update", left), Some(("job".to_owned(), true)));
        // Before 5.0 every waiting attempt's rewrite of the line is a replacement.
        let waiting = doc! { "fullDocument": {
            "_id": "job",
            "fencingToken": 1_i64,
            "line": [{ "id": "w", "expiresAt": mongodb::bson::DateTime::now() }],
        } };
        assert_eq!(
            freed_by("replace", waiting),
            Some(("job".to_owned(), false))
        );
    }

    #[test]
    fn places_readers_and_writers_are_freed_by_what_their_releases_change() {
        let freed_by = |updated: Document, removed: Vec<&str>, truncated: Vec<Document>| {
            freed(
                &event(
                    "update",
                    doc! { "updateDescription": {
                        "updatedFields": updated,
                        "removedFields": removed,
                        "truncatedArrays": truncated,
                    } },
                ),
                |_| None,
            )
            .map(|(_, ends)| ends)
        };
        let now = mongodb::bson::DateTime::now();
        // A place released: the array shrinks (the element after it moves up).
        let moved = doc! { "holders.0": { "id": "b", "expiresAt": now } };
        let shrunk = vec![doc! { "field": "holders", "newSize": 1 }];
        assert_eq!(freed_by(moved, vec![], shrunk), Some(true));
        // A place renewed or taken: an element changes or comes; nothing shrinks.
        let renewed = doc! { "holders.1.expiresAt": now, "expiresAt": now };
        assert_eq!(freed_by(renewed, vec![], vec![]), Some(false));
        let joined = doc! { "readers.2": { "id": "c", "expiresAt": now } };
        assert_eq!(freed_by(joined, vec![], vec![]), Some(false));
        // A server that rewrote the whole array: it may have been a release.
        let rewritten = doc! { "readers": [] };
        assert_eq!(freed_by(rewritten, vec![], vec![]), Some(true));
        // A writer released, or a waiting writer gone: readers may join.
        assert_eq!(
            freed_by(doc! {}, vec!["writer.id", "writer.expiresAt"], vec![]),
            Some(true)
        );
        assert_eq!(freed_by(doc! {}, vec!["waitingWriter"], vec![]), Some(true));
        // A waiting writer that takes the lock removes its marker: nothing freed.
        let writer_taken = doc! { "writer.id": "w", "writer.expiresAt": now };
        assert_eq!(
            freed_by(writer_taken, vec!["waitingWriter"], vec![]),
            Some(false)
        );
        // A writer renewed, or a waiting writer's marker renewed: nothing freed.
        let writer_renewed = doc! { "writer.expiresAt": now, "waitingWriter.expiresAt": now };
        assert_eq!(freed_by(writer_renewed, vec![], vec![]), Some(false));
    }

    /// MongoDB 5.0 and later log a changed subdocument whose difference is larger than its new
    /// value as a whole-field update (server source, `document_diff_calculator.cpp`): the new
    /// value tells whether the writer was freed or taken. Fails when any whole `writer` counts
    /// as taken: waiters in other processes are then not woken by a writer's end.
    #[test]
    fn a_whole_writer_field_is_judged_by_its_new_value() {
        let freed_by = |updated: Document| {
            freed(
                &event(
                    "update",
                    doc! { "updateDescription": {
                        "updatedFields": updated,
                        "removedFields": [],
                        "truncatedArrays": [],
                    } },
                ),
                |_| None,
            )
            .map(|(_, ends)| ends)
        };
        let now = mongodb::bson::DateTime::now();
        // A forced release, or a writer handing over to readers: no id left.
        assert_eq!(
            freed_by(doc! { "writer": { "fencingToken": 7_i64 } }),
            Some(true)
        );
        let handed_to_readers = doc! {
            "writer": { "fencingToken": 7_i64 },
            "readers": [{ "id": "r", "expiresAt": now }],
        };
        assert_eq!(freed_by(handed_to_readers), Some(true));
        // A new writer, written whole.
        let taken = doc! { "writer": { "id": "w2", "expiresAt": now, "fencingToken": 8_i64 } };
        assert_eq!(freed_by(taken), Some(false));
    }

    /// A place handed over in a release command (the releaser's lease filtered out, the new one
    /// appended) shifts the array, which MongoDB 5.0 and later log as the whole array rewritten;
    /// before 5.0, as a replacement. With every place taken it frees nothing: the semaphore's
    /// next local waiter must not attempt (it failed 9 runs in 10 of
    /// `semaphore::each_release_hands_its_place_to_a_local_waiter_in_the_release_command`
    /// beside two busy loops, with an attempt after the first of three transfers).
    #[test]
    fn a_whole_holders_array_frees_a_place_only_when_shorter_than_the_places() {
        let now = mongodb::bson::DateTime::now();
        let holders = |count: usize| {
            (0..count)
                .map(|id| Bson::Document(doc! { "id": id.to_string(), "expiresAt": now }))
                .collect::<Vec<Bson>>()
        };
        let rewritten = |count: usize| {
            event(
                "update",
                doc! { "updateDescription": {
                    "updatedFields": { "holders": holders(count), "fencingToken": 9_i64 },
                    "removedFields": [],
                    "truncatedArrays": [],
                } },
            )
        };
        let three_places = |name: &str| (name == "job").then_some(3);
        let ends = |event: &ChangeStreamEvent<Document>, places: &dyn Fn(&str) -> Option<u32>| {
            freed(event, places).map(|(_, ends)| ends)
        };
        assert_eq!(ends(&rewritten(3), &three_places), Some(false));
        assert_eq!(ends(&rewritten(2), &three_places), Some(true));
        // Places unknown: it may have been a release.
        assert_eq!(ends(&rewritten(3), &|_| None), Some(true));
        // A replacement shows the stored places.
        let replaced = |count: usize| {
            event(
                "replace",
                doc! { "fullDocument": {
                    "_id": "job", "holders": holders(count), "maxCount": 3_i64,
                } },
            )
        };
        assert_eq!(ends(&replaced(3), &|_| None), Some(false));
        assert_eq!(ends(&replaced(2), &|_| None), Some(true));
    }

    #[test]
    fn the_first_place_of_a_fair_locks_line_is_read_from_every_form_of_event() {
        let place = |id: &str| doc! { "id": id, "expiresAt": mongodb::bson::DateTime::now() };
        let update = |updated: Document, removed: Vec<&str>| {
            event(
                "update",
                doc! { "updateDescription": {
                    "updatedFields": updated,
                    "removedFields": removed,
                    "truncatedArrays": [],
                } },
            )
        };
        // An acquisition that shortens the line, shown whole, by element, or inside one.
        let whole = update(
            doc! { "lockId": "a", "line": [place("W2"), place("W3")] },
            vec![],
        );
        assert_eq!(line_head(&whole), Some(Some("W2".to_owned())));
        let element = update(doc! { "lockId": "a", "line.0": place("W2") }, vec![]);
        assert_eq!(line_head(&element), Some(Some("W2".to_owned())));
        let inside = update(doc! { "line.0.id": "W2", "line.0.expiresAt": 1 }, vec![]);
        assert_eq!(line_head(&inside), Some(Some("W2".to_owned())));
        // The last place gone, or the document.
        let emptied = update(doc! { "lockId": "a" }, vec!["line"]);
        assert_eq!(line_head(&emptied), Some(None));
        assert_eq!(line_head(&event("delete", doc! {})), Some(None));
        // Before MongoDB 5.0: the whole document.
        let replaced = event(
            "replace",
            doc! { "fullDocument": { "_id": "job", "line": [place("W3")] } },
        );
        assert_eq!(line_head(&replaced), Some(Some("W3".to_owned())));
        let replaced = event("replace", doc! { "fullDocument": { "_id": "job" } });
        assert_eq!(line_head(&replaced), Some(None));
        // A renewal of a place behind the first, a release of an unfair lock: nothing.
        let renewal = update(doc! { "line.1.expiresAt": 1 }, vec![]);
        assert_eq!(line_head(&renewal), None);
        let release = update(doc! { "expiresAt": 1 }, vec!["lockId"]);
        assert_eq!(line_head(&release), None);
    }
}
