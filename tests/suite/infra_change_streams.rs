//! Change streams on the embedded test server (launcher shim 8, scripts/mongoeco_server.py),
//! through the Rust driver's own API (`watch()`, `ChangeStream`, resume tokens), each test citing
//! the MongoDB manual page it imitates. Every test starts a dedicated embedded server: the shim's
//! options (`--change-stream-history`, `--no-change-streams`) and its `mongoecoKillChangeStreams`
//! command exist only there. On a real replica set the same assertions hold for everything but
//! those three.

use test_support as common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use mongodb::bson::{Bson, Document, doc};
use mongodb::change_stream::ChangeStream;
use mongodb::change_stream::event::{ChangeStreamEvent, OperationType};
use mongodb::event::EventHandler;
use mongodb::event::command::CommandEvent;
use mongodb::options::{ClientOptions, FullDocumentType};
use mongodb::{Client, Collection};

/// How long any one step may take before the test calls it a hang (the machine is loaded; this
/// only catches hangs).
const HANG: Duration = Duration::from_secs(30);

type Stream = ChangeStream<ChangeStreamEvent<Document>>;

/// A dedicated embedded server started with the launcher's `args`, and a client of it.
async fn server(args: &[&str]) -> (common::server::Dedicated, Client) {
    let args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
    let dedicated = common::server::start_dedicated_with(&args);
    let client = Client::with_uri_str(&dedicated.uri).await.unwrap();
    (dedicated, client)
}

fn fresh_collection(client: &Client, prefix: &str) -> Collection<Document> {
    client
        .database(common::DATABASE)
        .collection(&common::unique(prefix))
}

/// The stream's next event; panics if the stream ends or nothing comes within [`HANG`].
async fn next_event(stream: &mut Stream) -> ChangeStreamEvent<Document> {
    tokio::time::timeout(HANG, stream.next())
        .await
        .expect("an event within the hang bound")
        .expect("the stream goes on")
        .expect("an event, not an error")
}

/// The next `n` events of the stream.
async fn next_events(stream: &mut Stream, n: usize) -> Vec<ChangeStreamEvent<Document>> {
    let mut events = Vec::with_capacity(n);
    for _ in 0..n {
        events.push(next_event(stream).await);
    }
    events
}

/// The `_id`s in the events' document keys.
fn keys(events: &[ChangeStreamEvent<Document>]) -> Vec<i32> {
    events
        .iter()
        .map(|event| {
            event
                .document_key
                .as_ref()
                .expect("a document key")
                .get_i32("_id")
                .unwrap()
        })
        .collect()
}

fn error_code(error: &mongodb::error::Error) -> Option<i32> {
    match &*error.kind {
        mongodb::error::ErrorKind::Command(command) => Some(command.code),
        _ => None,
    }
}

async fn insert_ids(collection: &Collection<Document>, ids: std::ops::Range<i32>) {
    for id in ids {
        collection.insert_one(doc! { "_id": id }).await.unwrap();
    }
}

/// Whether nothing more arrives: the stream's awaiting getMore (of its `max_await_time`) returns
/// no event. Two calls: the first after opening a stream only consumes the aggregate's first
/// batch, without a round trip; the second always sends a getMore.
async fn nothing_more(stream: &mut Stream) -> bool {
    for _ in 0..2 {
        let next = tokio::time::timeout(HANG, stream.next_if_any())
            .await
            .expect("the getMore returns within the hang bound")
            .unwrap();
        if next.is_some() {
            return false;
        }
    }
    true
}

/// The commands a client sent (name and command as sent), and the failures among them (name and
/// error code), from the driver's command events.
#[derive(Default)]
struct Commands {
    started: Mutex<Vec<(String, Document)>>,
    failed: Mutex<Vec<(String, Option<i32>)>>,
}

impl Commands {
    fn started(&self, name: &str) -> Vec<Document> {
        let started = self.started.lock().unwrap();
        started
            .iter()
            .filter(|(command, _)| command == name)
            .map(|(_, body)| body.clone())
            .collect()
    }

    fn failed(&self, name: &str, code: i32) -> usize {
        let failed = self.failed.lock().unwrap();
        failed
            .iter()
            .filter(|(command, failure)| command == name && *failure == Some(code))
            .count()
    }
}

/// A client of `uri` that records its commands.
async fn recording_client(uri: &str) -> (Client, Arc<Commands>) {
    let commands = Arc::new(Commands::default());
    let mut options = ClientOptions::parse(uri).await.unwrap();
    let recorder = Arc::clone(&commands);
    options.command_event_handler = Some(EventHandler::callback(move |event| match event {
        CommandEvent::Started(started) => recorder
            .started
            .lock()
            .unwrap()
            .push((started.command_name.clone(), started.command.clone())),
        CommandEvent::Failed(failed) => recorder
            .failed
            .lock()
            .unwrap()
            .push((failed.command_name.clone(), error_code(&failed.failure))),
        _ => {}
    }));
    (Client::with_options(options).unwrap(), commands)
}

/// MongoDB manual, "Change Events" (https://www.mongodb.com/docs/manual/reference/change-events/)
/// and "Change Streams" → "Lookup Full Document for Update Operations"
/// (https://www.mongodb.com/docs/manual/changeStreams/#lookup-full-document-for-update-operations):
/// insert, update, replace and delete events carry `ns`, `documentKey` and a `clusterTime` that
/// grows with each write; inserts and replacements carry the new document as `fullDocument`;
/// updates carry `updateDescription` (`updatedFields` by dotted path, `removedFields`,
/// `truncatedArrays`) and, with `fullDocument: "updateLookup"`, the document as it is when the
/// event is read (null once it is gone), without it no `fullDocument`; deletes carry none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_arrive_as_change_events_with_the_documented_fields() {
    let (_server, client) = server(&[]).await;
    let collection = fresh_collection(&client, "events");
    let mut looked_up_at_once = collection
        .watch()
        .full_document(FullDocumentType::UpdateLookup)
        .await
        .unwrap();
    let mut looked_up_late = collection
        .watch()
        .full_document(FullDocumentType::UpdateLookup)
        .await
        .unwrap();
    let mut plain = collection.watch().await.unwrap();

    collection
        .insert_one(doc! { "_id": 1, "a": 1, "b": { "c": 1, "d": 2 }, "list": [1, 2, 3] })
        .await
        .unwrap();
    let insert = next_event(&mut looked_up_at_once).await;
    collection
        .update_one(
            doc! { "_id": 1 },
            doc! {
                "$set": { "a": 2, "b.c": 5, "e": "new" },
                "$unset": { "b.d": "" },
                "$pop": { "list": 1 },
            },
        )
        .await
        .unwrap();
    let update = next_event(&mut looked_up_at_once).await;
    collection
        .replace_one(doc! { "_id": 1 }, doc! { "x": 1 })
        .await
        .unwrap();
    let replace = next_event(&mut looked_up_at_once).await;
    collection.delete_one(doc! { "_id": 1 }).await.unwrap();
    let delete = next_event(&mut looked_up_at_once).await;

    let namespace = collection.namespace();
    let mut last_time = None;
    for (event, operation) in [
        (&insert, OperationType::Insert),
        (&update, OperationType::Update),
        (&replace, OperationType::Replace),
        (&delete, OperationType::Delete),
    ] {
        assert_eq!(event.operation_type, operation);
        let ns = event.ns.as_ref().expect("ns");
        assert_eq!(ns.db, namespace.db);
        assert_eq!(ns.coll.as_deref(), Some(namespace.coll.as_str()));
        assert_eq!(event.document_key, Some(doc! { "_id": 1 }), "{event:?}");
        let time = event.cluster_time.expect("clusterTime");
        assert!(
            last_time.is_none_or(|last| (time.time, time.increment) > last),
            "each write's clusterTime is later: {event:?}"
        );
        last_time = Some((time.time, time.increment));
        assert!(event.wall_time.is_some(), "wallTime: {event:?}");
        assert_eq!(event.lsid, None, "not a transaction's write");
    }
    assert_eq!(
        insert.full_document,
        Some(doc! { "_id": 1, "a": 1, "b": { "c": 1, "d": 2 }, "list": [1, 2, 3] })
    );
    let description = update
        .update_description
        .as_ref()
        .expect("updateDescription");
    let updated = &description.updated_fields;
    assert_eq!(updated.len(), 3, "{updated:?}");
    assert_eq!(updated.get_i32("a").unwrap(), 2);
    assert_eq!(updated.get_i32("b.c").unwrap(), 5);
    assert_eq!(updated.get_str("e").unwrap(), "new");
    assert_eq!(description.removed_fields, ["b.d"]);
    let truncated = description.truncated_arrays.as_deref().unwrap_or_default();
    assert_eq!(truncated.len(), 1, "{truncated:?}");
    assert_eq!(
        (truncated[0].field.as_str(), truncated[0].new_size),
        ("list", 2)
    );
    assert_eq!(
        update.full_document,
        Some(doc! { "_id": 1, "a": 2, "b": { "c": 5 }, "list": [1, 2], "e": "new" }),
        "updateLookup: the document as it was when the event was read"
    );
    assert_eq!(replace.full_document, Some(doc! { "_id": 1, "x": 1 }));
    assert!(replace.update_description.is_none());
    assert_eq!(delete.full_document, None);

    // Read after the delete: the lookup finds nothing.
    let late = next_events(&mut looked_up_late, 4).await;
    assert_eq!(late[1].operation_type, OperationType::Update);
    assert_eq!(late[1].full_document, None, "looked up after the delete");
    assert_eq!(
        late.iter().map(|event| &event.id).collect::<Vec<_>>(),
        [&insert.id, &update.id, &replace.id, &delete.id],
        "the same events, with the same resume tokens"
    );

    // Without updateLookup an update has no fullDocument; the rest is the same.
    let plain = next_events(&mut plain, 4).await;
    assert_eq!(plain[1].full_document, None);
    assert_eq!(plain[1].update_description, update.update_description);
    assert_eq!(plain[0].full_document, insert.full_document);
    assert_eq!(plain[2].full_document, replace.full_document);
}

/// MongoDB manual, "Modify Change Stream Output"
/// (https://www.mongodb.com/docs/manual/changeStreams/#modify-change-stream-output): the
/// pipeline given to `watch()` (`$match`, `$project`, `$addFields`, ...) filters and reshapes the
/// events; a stream only delivers the events its `$match` admits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_match_stage_filters_the_events() {
    let (_server, client) = server(&[]).await;
    let collection = fresh_collection(&client, "match");
    let mut even_inserts = collection
        .watch()
        .pipeline([doc! { "$match": {
            "operationType": "insert",
            "documentKey._id": { "$in": [0, 2, 4] },
        } }])
        .max_await_time(Duration::from_millis(200))
        .await
        .unwrap();
    let mut everything = collection.watch().await.unwrap();

    insert_ids(&collection, 0..6).await;
    collection
        .update_one(doc! { "_id": 2 }, doc! { "$set": { "n": 1 } })
        .await
        .unwrap();
    collection.delete_one(doc! { "_id": 4 }).await.unwrap();

    let events = next_events(&mut even_inserts, 3).await;
    assert_eq!(keys(&events), [0, 2, 4]);
    assert!(
        events
            .iter()
            .all(|event| event.operation_type == OperationType::Insert)
    );
    assert!(
        nothing_more(&mut even_inserts).await,
        "the update and delete are filtered out"
    );
    let all = next_events(&mut everything, 8).await;
    assert_eq!(keys(&all), [0, 1, 2, 3, 4, 5, 2, 4]);

    // The `$addFields` stage ran on the events it let through (read as raw documents).
    let mut raw = collection
        .watch()
        .pipeline([
            doc! { "$match": { "documentKey._id": 7 } },
            doc! { "$addFields": { "seen": true } },
        ])
        .await
        .unwrap()
        .with_type::<Document>();
    insert_ids(&collection, 6..8).await;
    let shown = tokio::time::timeout(HANG, raw.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        shown.get_document("documentKey").unwrap(),
        &doc! { "_id": 7 }
    );
    assert_eq!(shown.get_bool("seen"), Ok(true));
}

/// MongoDB manual, "Resume a Change Stream"
/// (https://www.mongodb.com/docs/manual/changeStreams/#resume-a-change-stream): a stream opened
/// with `resumeAfter` a resume token (an event's `_id`, or the token the driver caches) delivers
/// exactly the events after that one: none lost, none repeated, also those written while no
/// stream was open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_with_a_token_loses_nothing_and_repeats_nothing() {
    let (_server, client) = server(&[]).await;
    let collection = fresh_collection(&client, "resume");
    let mut stream = collection
        .watch()
        .max_await_time(Duration::from_millis(200))
        .await
        .unwrap();
    insert_ids(&collection, 0..5).await;
    let read = next_events(&mut stream, 3).await;
    assert_eq!(keys(&read), [0, 1, 2]);
    let token = stream.resume_token().expect("a resume token");
    assert_eq!(
        token, read[2].id,
        "the cached token is the last event's _id"
    );
    drop(stream);

    insert_ids(&collection, 5..8).await;
    let mut resumed = collection
        .watch()
        .resume_after(token)
        .max_await_time(Duration::from_millis(200))
        .await
        .unwrap();
    let rest = next_events(&mut resumed, 5).await;
    assert_eq!(keys(&rest), [3, 4, 5, 6, 7]);
    assert!(nothing_more(&mut resumed).await, "nothing repeated");

    // The token of an empty batch (postBatchResumeToken) resumes as well.
    let quiet = resumed
        .resume_token()
        .expect("a token after an empty batch");
    drop(resumed);
    insert_ids(&collection, 8..10).await;
    let mut again = collection.watch().resume_after(quiet).await.unwrap();
    assert_eq!(keys(&next_events(&mut again, 2).await), [8, 9]);
}

/// MongoDB manual, "Resume a Change Stream"
/// (https://www.mongodb.com/docs/manual/changeStreams/#resume-a-change-stream: a stream resumes
/// only while the oplog still holds the event of its token) and "Change Streams Production
/// Recommendations"
/// (https://www.mongodb.com/docs/manual/administration/change-streams-production-recommendations/:
/// a stream whose resume point fell off the oplog cannot go on); the error is
/// ChangeStreamHistoryLost (286, manual "Error Codes"). The embedded server keeps the last
/// `--change-stream-history` events, as an oplog of that size: a token older than them is
/// refused, and so is a stream that falls that far behind, while newer tokens still resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_older_than_the_history_fails_with_change_stream_history_lost() {
    let (_server, client) = server(&["--change-stream-history", "3"]).await;
    let collection = fresh_collection(&client, "history");
    let mut stream = collection.watch().await.unwrap();
    insert_ids(&collection, 0..1).await;
    assert_eq!(keys(&[next_event(&mut stream).await]), [0]);
    let old = stream.resume_token().unwrap();
    drop(stream);

    insert_ids(&collection, 1..11).await;
    let error = collection.watch().resume_after(old).await.unwrap_err();
    assert_eq!(error_code(&error), Some(286), "{error}");

    // A stream that falls behind the history fails alike (not resumable: the driver reports it).
    let mut behind = collection.watch().await.unwrap();
    insert_ids(&collection, 11..21).await;
    let error = tokio::time::timeout(HANG, behind.next())
        .await
        .unwrap()
        .expect("an error, not the end")
        .expect_err("the stream fell behind the history");
    assert_eq!(error_code(&error), Some(286), "{error}");

    // A recent token still resumes.
    let mut fresh = collection.watch().await.unwrap();
    insert_ids(&collection, 21..22).await;
    assert_eq!(keys(&[next_event(&mut fresh).await]), [21]);
    let recent = fresh.resume_token().unwrap();
    insert_ids(&collection, 22..24).await;
    let mut resumed = collection.watch().resume_after(recent).await.unwrap();
    assert_eq!(keys(&next_events(&mut resumed, 2).await), [22, 23]);
}

/// MongoDB manual, "Change Events": "drop Event"
/// (https://www.mongodb.com/docs/manual/reference/change-events/drop/) and "invalidate Event"
/// (https://www.mongodb.com/docs/manual/reference/change-events/invalidate/), and "Resume a Change
/// Stream" → "startAfter for Change Streams"
/// (https://www.mongodb.com/docs/manual/changeStreams/#resume-a-change-stream): dropping a
/// watched collection yields a
/// `drop` event then an `invalidate` event, after which the stream is closed. `resumeAfter` an
/// invalidate is refused (InvalidResumeToken, 260); `startAfter` it opens a new stream that sees
/// the writes after the drop, the first one included. Dropping a collection that does not exist
/// yields nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_watched_collection_yields_drop_then_invalidate_and_ends_the_stream() {
    let (_server, client) = server(&[]).await;
    let collection = fresh_collection(&client, "drop");
    let mut stream = collection.watch().await.unwrap();
    insert_ids(&collection, 0..1).await;
    collection.drop().await.unwrap();

    let events = next_events(&mut stream, 3).await;
    let operations: Vec<_> = events.iter().map(|e| e.operation_type.clone()).collect();
    assert_eq!(
        operations,
        [
            OperationType::Insert,
            OperationType::Drop,
            OperationType::Invalidate
        ]
    );
    let drop_event = &events[1];
    assert_eq!(
        drop_event.ns.as_ref().map(|ns| ns.coll.as_deref()),
        Some(Some(collection.name()))
    );
    assert_eq!(drop_event.document_key, None);
    let invalidate = &events[2];
    assert_eq!(invalidate.cluster_time, drop_event.cluster_time);
    let after = tokio::time::timeout(HANG, stream.next()).await.unwrap();
    assert!(after.is_none(), "the stream ended: {after:?}");
    assert!(!stream.is_alive());

    let refused = collection
        .watch()
        .resume_after(invalidate.id.clone())
        .await
        .unwrap_err();
    assert_eq!(error_code(&refused), Some(260), "{refused}");

    insert_ids(&collection, 1..2).await; // recreates the collection
    let mut restarted = collection
        .watch()
        .start_after(invalidate.id.clone())
        .await
        .unwrap();
    let insert = next_event(&mut restarted).await;
    assert_eq!(insert.operation_type, OperationType::Insert);
    assert_eq!(keys(&[insert]), [1]);

    // Dropping a collection that does not exist writes nothing: a stream on it goes on.
    let missing = fresh_collection(&client, "missing");
    let mut on_missing = missing.watch().await.unwrap();
    missing.drop().await.unwrap();
    insert_ids(&missing, 0..1).await;
    let first = next_event(&mut on_missing).await;
    assert_eq!(first.operation_type, OperationType::Insert, "{first:?}");
}

/// MongoDB change streams specification, "Resumable Error"
/// (https://github.com/mongodb/specifications/blob/master/source/change-streams/change-streams.md:
/// drivers resume a change stream after CursorNotFound, 43, by its code alone) and MongoDB manual,
/// `killCursors` (https://www.mongodb.com/docs/manual/reference/command/killCursors/): a change
/// stream's cursor killed on the server, while idle between getMores or while a getMore waits,
/// is resumed by the driver from its resume token, and the stream goes on delivering: the writes
/// made while it was dead and those made after the kill, none lost, none repeated. The embedded
/// server's `mongoecoKillChangeStreams` kills every open change-stream cursor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_resumes_a_killed_stream_without_losing_events() {
    let (server, control) = server(&[]).await;
    let (client, commands) = recording_client(&server.uri).await;
    let collection = client
        .database(common::DATABASE)
        .collection::<Document>(&common::unique("killed"));
    let mut stream = collection
        .watch()
        .max_await_time(Duration::from_secs(60))
        .await
        .unwrap();
    let kill = || async {
        control
            .database("admin")
            .run_command(doc! { "mongoecoKillChangeStreams": 1 })
            .await
            .unwrap()
    };

    // Killed while idle: the next getMore fails, the driver resumes after event 2.
    insert_ids(&collection, 0..3).await;
    assert_eq!(keys(&next_events(&mut stream, 3).await), [0, 1, 2]);
    let reply = kill().await;
    assert_eq!(reply.get("cursorsKilled"), Some(&Bson::Int32(1)), "{reply}");
    insert_ids(&collection, 3..6).await;
    assert_eq!(keys(&next_events(&mut stream, 3).await), [3, 4, 5]);
    assert_eq!(commands.failed("getMore", 43), 1);
    let aggregates = commands.started("aggregate");
    assert_eq!(aggregates.len(), 2, "opened, then resumed once");
    let resumed_with = aggregates[1]
        .get_array("pipeline")
        .unwrap()
        .first()
        .and_then(Bson::as_document)
        .and_then(|stage| stage.get_document("$changeStream").ok())
        .cloned()
        .unwrap();
    assert!(resumed_with.contains_key("resumeAfter"), "{resumed_with}");

    // Killed while a getMore waits (up to 60 s): it fails at once, the driver resumes, and the
    // writes made after the kill arrive.
    let getmores = commands.started("getMore").len();
    let started = Instant::now();
    let reader = tokio::spawn(async move {
        let events = next_events(&mut stream, 3).await;
        (stream, events)
    });
    assert!(
        common::eventually(HANG, || async {
            commands.started("getMore").len() > getmores
        })
        .await,
        "the reader's getMore was sent"
    );
    kill().await;
    assert!(
        common::eventually(HANG, || async { commands.failed("getMore", 43) == 2 }).await,
        "the waiting getMore failed with CursorNotFound"
    );
    insert_ids(&collection, 6..9).await;
    let (_stream, events) = tokio::time::timeout(HANG, reader).await.unwrap().unwrap();
    assert_eq!(keys(&events), [6, 7, 8]);
    assert!(
        started.elapsed() < Duration::from_secs(45),
        "not held for the 60 s wait: {:?}",
        started.elapsed()
    );
    assert_eq!(commands.started("aggregate").len(), 3);
}

/// MongoDB manual, `$changeStream`
/// (https://www.mongodb.com/docs/manual/reference/operator/aggregation/changeStream/): change
/// streams are only available on replica sets and sharded clusters; a standalone mongod refuses
/// `$changeStream` (error 40573). The embedded server started with `--no-change-streams` does
/// the same, and still serves everything else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_change_streams_watch_fails_as_on_a_standalone() {
    let (_server, client) = server(&["--no-change-streams"]).await;
    let collection = fresh_collection(&client, "standalone");
    let error = collection.watch().await.unwrap_err();
    assert_eq!(error_code(&error), Some(40573), "{error}");
    let error = client.database(common::DATABASE).watch().await.unwrap_err();
    assert_eq!(error_code(&error), Some(40573), "{error}");
    insert_ids(&collection, 0..1).await;
    assert_eq!(collection.count_documents(doc! {}).await.unwrap(), 1);
}

/// MongoDB manual, "Change Events" (https://www.mongodb.com/docs/manual/reference/change-events/:
/// the events of a multi-document transaction share one `clusterTime`, the commit's, and carry
/// `lsid` and `txnNumber`) and "Transactions"
/// (https://www.mongodb.com/docs/manual/core/transactions/: a transaction's writes are not visible
/// outside it until it commits; an aborted one's never are).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactions_writes_arrive_with_one_cluster_time_once_it_commits() {
    let (_server, client) = server(&[]).await;
    let collection = fresh_collection(&client, "transaction");
    insert_ids(&collection, 0..1).await; // the collection exists before the transaction
    let mut stream = collection
        .watch()
        .max_await_time(Duration::from_millis(300))
        .await
        .unwrap();

    let mut aborted = client.start_session().await.unwrap();
    aborted.start_transaction().await.unwrap();
    collection
        .insert_one(doc! { "_id": 100 })
        .session(&mut aborted)
        .await
        .unwrap();
    aborted.abort_transaction().await.unwrap();

    let mut session = client.start_session().await.unwrap();
    session.start_transaction().await.unwrap();
    collection
        .insert_one(doc! { "_id": 1 })
        .session(&mut session)
        .await
        .unwrap();
    collection
        .insert_one(doc! { "_id": 2 })
        .session(&mut session)
        .await
        .unwrap();
    collection
        .update_one(doc! { "_id": 0 }, doc! { "$set": { "n": 1 } })
        .session(&mut session)
        .await
        .unwrap();
    assert!(
        nothing_more(&mut stream).await,
        "nothing before the commit (nor of the aborted transaction)"
    );
    session.commit_transaction().await.unwrap();
    insert_ids(&collection, 3..4).await;

    let events = next_events(&mut stream, 4).await;
    assert_eq!(keys(&events), [1, 2, 0, 3]);
    let (in_transaction, after) = events.split_at(3);
    let time = in_transaction[0].cluster_time.expect("clusterTime");
    for event in in_transaction {
        assert_eq!(event.cluster_time, Some(time), "one clusterTime: {event:?}");
        assert_eq!(event.lsid.as_ref(), Some(session.id()), "{event:?}");
        assert!(event.txn_number.is_some(), "{event:?}");
    }
    assert_eq!(in_transaction[2].operation_type, OperationType::Update);
    let later = after[0].cluster_time.expect("clusterTime");
    assert!((later.time, later.increment) > (time.time, time.increment));
    assert_eq!(after[0].lsid, None);
    assert!(nothing_more(&mut stream).await);
}

/// MongoDB manual, `getMore` (https://www.mongodb.com/docs/manual/reference/command/getMore/:
/// on a tailable awaitData cursor, such as a change stream's, `maxTimeMS` is how long the server
/// waits for new results before it returns an empty batch; drivers send their `maxAwaitTimeMS`
/// there): an awaiting getMore returns an empty batch once its maxAwaitTime passes with nothing
/// new, and returns at once when an event arrives meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_awaiting_get_more_returns_empty_at_its_max_await_time_or_at_once_with_an_event() {
    let (server, _client) = server(&[]).await;
    let (client, commands) = recording_client(&server.uri).await;
    let collection = fresh_collection(&client, "await");
    let mut quiet = collection
        .watch()
        .max_await_time(Duration::from_millis(300))
        .await
        .unwrap();
    // The aggregate's empty first batch is consumed without a round trip: time the call that
    // sends a getMore.
    let before = commands.started("getMore").len();
    let mut waited = None;
    for _ in 0..2 {
        let started = Instant::now();
        let next = tokio::time::timeout(HANG, quiet.next_if_any())
            .await
            .unwrap();
        assert!(next.unwrap().is_none());
        if commands.started("getMore").len() > before {
            waited = Some(started.elapsed());
            break;
        }
    }
    let waited = waited.expect("a getMore was sent");
    assert!(
        waited >= Duration::from_millis(290) && waited < HANG,
        "waited {waited:?} for a 300 ms maxAwaitTime"
    );
    assert!(quiet.is_alive(), "an empty batch does not end the stream");
    let sent = commands.started("getMore").pop().unwrap();
    let max_time = sent.get("maxTimeMS").cloned();
    assert!(
        matches!(max_time, Some(Bson::Int64(300) | Bson::Int32(300))),
        "{sent}"
    );

    // A long wait ends when an event arrives.
    let mut patient = collection
        .watch()
        .max_await_time(Duration::from_secs(60))
        .await
        .unwrap();
    let getmores = commands.started("getMore").len();
    let started = Instant::now();
    let reader = tokio::spawn(async move { next_event(&mut patient).await });
    assert!(
        common::eventually(HANG, || async {
            commands.started("getMore").len() > getmores
        })
        .await,
        "the reader's getMore was sent"
    );
    insert_ids(&collection, 0..1).await;
    let event = tokio::time::timeout(HANG, reader).await.unwrap().unwrap();
    assert_eq!(keys(&[event]), [0]);
    assert!(
        started.elapsed() < Duration::from_secs(45),
        "the getMore returned with the event, not at its 60 s maxAwaitTime: {:?}",
        started.elapsed()
    );
}

/// MongoDB manual, "Change Events", "update Event" (`updateDescription.updatedFields`): the
/// fields an update changed, by path. From MongoDB 5.0 a pipeline update's change is the
/// difference between the two documents, and a changed subdocument or array whose difference
/// would be larger than its new value is reported whole (server source,
/// `src/mongo/db/update/document_diff_calculator.cpp`). So a writer's lease ended by setting
/// `writer: {fencingToken}` shows as `updatedFields.writer`, with no removed `writer.id`, while a
/// renewal that changes one date of it shows by its path. Fails when the shim reports every
/// change by its deepest path.
#[tokio::test]
async fn a_subdocument_whose_difference_outweighs_it_is_reported_whole() {
    let (_server, client) = server(&[]).await;
    let collection = fresh_collection(&client, "whole-field");
    let mut stream = collection.watch().await.unwrap();
    let now = mongodb::bson::DateTime::now();
    let writer = doc! {
        "id": "0123456789abcdef0123456789abcdef",
        "expiresAt": now,
        "acquiredAt": now,
        "renewedAt": now,
        "fencingToken": 7_i64,
    };
    collection
        .insert_one(doc! { "_id": 1, "readers": [], "writer": writer, "expiresAt": now })
        .await
        .unwrap();
    next_event(&mut stream).await; // the insert

    let later = mongodb::bson::DateTime::from_millis(now.timestamp_millis() + 1_000);
    let renew = vec![doc! { "$set": { "writer.expiresAt": later } }];
    collection
        .update_one(doc! { "_id": 1 }, renew)
        .await
        .unwrap();
    let renewed = next_event(&mut stream).await;
    let description = renewed.update_description.expect("an update description");
    assert_eq!(
        description.updated_fields,
        doc! { "writer.expiresAt": later },
        "a small change shows by its path"
    );

    let end_writer =
        vec![doc! { "$set": { "writer": { "fencingToken": "$writer.fencingToken" } } }];
    collection
        .update_one(doc! { "_id": 1 }, end_writer)
        .await
        .unwrap();
    let ended = next_event(&mut stream).await;
    let description = ended.update_description.expect("an update description");
    assert_eq!(
        description.updated_fields,
        doc! { "writer": { "fencingToken": 7_i64 } },
        "the whole subdocument, not four removed fields"
    );
    assert!(description.removed_fields.is_empty(), "{description:?}");
}
