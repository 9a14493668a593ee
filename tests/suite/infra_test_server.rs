//! The test server answers the driver calls the suites rely on, and its launcher's shims make it
//! behave like MongoDB (scripts/mongoeco_server.py). On the embedded mongoeco server this checks
//! the shims, each test citing the MongoDB manual page it imitates: the reply formats (cursor ids
//! as Int64; Int64 limit, skip and batchSize accepted), writes waiting behind open transactions,
//! and a clock that can be stepped. On a real MongoDB the first two are plain checks of the
//! behaviour the shims imitate; the clock tests always start an embedded server of their own.

use test_support as common;

use std::time::Duration;

use futures::TryStreamExt;
use mongodb::IndexModel;
use mongodb::bson::{Document, doc};

#[tokio::test]
async fn find_one_find_aggregate_and_list_indexes_work() {
    let database = common::database().await;
    let collection = database.collection::<Document>(&common::unique("server"));
    collection
        .insert_many((0..5).map(|i| doc! { "_id": i, "group": i % 2 }))
        .await
        .unwrap();

    // find_one sends limit: Int64(1).
    let one = collection
        .find_one(doc! { "_id": 3 })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(one.get_i32("group").unwrap(), 1);

    // find with limit, skip and a small batch size (so getMore runs on a real cursor id).
    let found: Vec<Document> = collection
        .find(doc! {})
        .sort(doc! { "_id": 1 })
        .skip(1)
        .limit(3)
        .batch_size(1)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let ids: Vec<i32> = found.iter().map(|d| d.get_i32("_id").unwrap()).collect();
    assert_eq!(ids, [1, 2, 3]);

    let all: Vec<Document> = collection
        .find(doc! {})
        .batch_size(2)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(all.len(), 5);

    let groups: Vec<Document> = collection
        .aggregate([
            doc! { "$group": { "_id": "$group", "n": { "$sum": 1 } } },
            doc! { "$sort": { "_id": 1 } },
        ])
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let counts: Vec<i32> = groups.iter().map(|d| d.get_i32("n").unwrap()).collect();
    assert_eq!(counts, [3, 2]);

    collection
        .create_index(IndexModel::builder().keys(doc! { "group": 1 }).build())
        .await
        .unwrap();
    let names = collection.list_index_names().await.unwrap();
    assert!(names.contains(&"_id_".to_owned()), "{names:?}");
    assert!(names.contains(&"group_1".to_owned()), "{names:?}");
}

// ---- Shim 6: writes wait behind open transactions ----

/// The server for the transaction tests: `MONGODB_URI` when it is set (a real replica set shows
/// the behaviour the shim imitates), otherwise a dedicated embedded server with `args`.
fn server_with(args: &[&str]) -> (String, Option<common::server::Dedicated>) {
    match std::env::var("MONGODB_URI") {
        Ok(uri) => (uri, None),
        Err(_) => {
            let args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
            let dedicated = common::server::start_dedicated_with(&args);
            (dedicated.uri.clone(), Some(dedicated))
        }
    }
}

/// Starts a transaction on a new session of `client` that writes `{n: 1}` into document `a` of
/// `collection`, and leaves it open.
async fn open_transaction_writing_a(
    client: &mongodb::Client,
    collection: &mongodb::Collection<Document>,
) -> mongodb::ClientSession {
    let mut session = client.start_session().await.unwrap();
    session.start_transaction().await.unwrap();
    collection
        .update_one(doc! { "_id": "a" }, doc! { "$set": { "n": 1 } })
        .session(&mut session)
        .await
        .unwrap();
    session
}

fn error_code(error: &mongodb::error::Error) -> Option<i32> {
    match &*error.kind {
        mongodb::error::ErrorKind::Command(command) => Some(command.code),
        mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(write)) => {
            Some(write.code)
        }
        _ => None,
    }
}

/// MongoDB manual, "Production Considerations" for transactions, section "In-progress
/// Transactions and Write Conflicts": when a transaction has modified a document, a write outside
/// the transaction to that document waits until the transaction ends. A `maxTimeMS` limits the
/// wait (error MaxTimeMSExpired, 50: manual, "Terminate Running Operations", `maxTimeMS`). The
/// waiting write's `$$NOW` is the one its command started with (manual, "Variables in
/// Aggregation Expressions": `$$NOW` stays the same for the whole operation). Writes to other
/// documents go on at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_to_a_document_an_open_transaction_wrote_waits_until_it_ends() {
    let (uri, _server) = server_with(&[]);
    let client = mongodb::Client::with_uri_str(&uri).await.unwrap();
    let database = client.database(common::DATABASE);
    let name = common::unique("in-transaction");
    let collection = database.collection::<Document>(&name);
    collection
        .insert_many([doc! { "_id": "a", "n": 0 }, doc! { "_id": "b", "n": 0 }])
        .await
        .unwrap();
    let mut session = open_transaction_writing_a(&client, &collection).await;

    let other = mongodb::Client::with_uri_str(&uri).await.unwrap();
    let others = other
        .database(common::DATABASE)
        .collection::<Document>(&name);
    tokio::time::timeout(
        Duration::from_secs(10),
        others.update_one(doc! { "_id": "b" }, doc! { "$set": { "n": 5 } }),
    )
    .await
    .expect("a document the transaction did not write is not held back")
    .unwrap();

    let started = std::time::Instant::now();
    let limited = other
        .database(common::DATABASE)
        .run_command(doc! {
            "update": &name,
            "updates": [{ "q": { "_id": "a" }, "u": { "$set": { "n": 2 } } }],
            "maxTimeMS": 300,
        })
        .await;
    let waited = started.elapsed();
    let error = limited.expect_err("the write waited past its maxTimeMS");
    assert_eq!(error_code(&error), Some(50), "{error}");
    assert!(waited >= Duration::from_millis(300), "{waited:?}");

    let waiting = tokio::spawn({
        let others = others.clone();
        async move {
            others
                .update_one(
                    doc! { "_id": "a" },
                    vec![doc! { "$set": { "n": { "$add": ["$n", 10] }, "at": "$$NOW" } }],
                )
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "the write waits for the transaction"
    );
    let before_end = common::server_now_and_expiry(&collection, "none").await.0;
    // Aborted rather than committed: the embedded server refuses any commit after another
    // write anywhere (the one to "b" above), where a real server would commit; ending the
    // transaction either way lets the write go on.
    session.abort_transaction().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the write goes on once the transaction ended")
        .unwrap()
        .unwrap();
    let stored = collection
        .find_one(doc! { "_id": "a" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        stored.get_i32("n").unwrap(),
        10,
        "applied after the transaction ended"
    );
    let at = *stored.get_datetime("at").unwrap();
    assert!(
        at < before_end,
        "its $$NOW ({at}) was fixed when it arrived, before it waited ({before_end})"
    );
}

/// The same pages: a held-back write waits for the documents its statement matched when it
/// arrived, by its own `$$NOW`, fixed for the whole command. A renewal filtered on "the lease is
/// live" therefore keeps waiting after the lease ended by the current clock, and once the
/// transaction ends it is applied by its old `$$NOW` (which is why the crate's renewals carry a
/// time limit shorter than their leases' budget). Fails when the shim re-reads the filter with the
/// current clock while the write waits: the write then goes on before the transaction ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_back_write_waits_for_what_it_matched_by_its_own_now() {
    let (uri, _server) = server_with(&[]);
    let client = mongodb::Client::with_uri_str(&uri).await.unwrap();
    let collection = client
        .database(common::DATABASE)
        .collection::<Document>(&common::unique("fixed-now"));
    collection
        .insert_one(doc! { "_id": "a", "n": 0 })
        .await
        .unwrap();
    collection
        .update_one(
            doc! { "_id": "a" },
            vec![doc! { "$set": { "until": { "$add": ["$$NOW", 300] } } }],
        )
        .await
        .unwrap();
    let mut session = open_transaction_writing_a(&client, &collection).await;
    let other = mongodb::Client::with_uri_str(&uri).await.unwrap();
    let others = other
        .database(common::DATABASE)
        .collection::<Document>(collection.name());
    let waiting = tokio::spawn(async move {
        others
            .update_one(
                doc! { "_id": "a", "$expr": { "$gt": ["$until", "$$NOW"] } },
                doc! { "$set": { "renewed": true } },
            )
            .await
    });
    // Past `until` by the current clock: the write still waits for the transaction.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(
        !waiting.is_finished(),
        "the write waits for the transaction, whatever the current clock says"
    );
    session.abort_transaction().await.unwrap();
    let written = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the write goes on once the transaction ended")
        .unwrap()
        .unwrap();
    assert_eq!(
        written.matched_count, 1,
        "applied by the $$NOW it arrived with, before `until`"
    );
}

/// On a server of its own whose transactions live at most 1 s: a collection holding
/// `{_id: "a", n: 0}`, and an open transaction that wrote `{n: 1}` to it.
async fn transaction_with_a_lifetime_of_one_second() -> (
    common::server::Dedicated,
    mongodb::Collection<Document>,
    mongodb::ClientSession,
) {
    let dedicated = common::server::start_dedicated_with(&[
        "--transaction-lifetime-limit-seconds".to_owned(),
        "1".to_owned(),
    ]);
    let client = mongodb::Client::with_uri_str(&dedicated.uri).await.unwrap();
    let collection = client
        .database(common::DATABASE)
        .collection::<Document>(&common::unique("lifetime"));
    collection
        .insert_one(doc! { "_id": "a", "n": 0 })
        .await
        .unwrap();
    let session = open_transaction_writing_a(&client, &collection).await;
    (dedicated, collection, session)
}

/// MongoDB manual, "Production Considerations" for transactions, "Runtime Limit": a transaction
/// open longer than `transactionLifetimeLimitSeconds` is aborted by the server, so writes waiting
/// behind it go on (the embedded server takes the limit as an argument; MongoDB's default is 60 s),
/// and its commit then fails with NoSuchTransaction (251), labelled TransientTransactionError
/// (manual, "Drivers API": retry the whole transaction on that label).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_past_its_lifetime_limit_is_aborted_and_stops_holding_writes_back() {
    let (_dedicated, collection, mut session) = transaction_with_a_lifetime_of_one_second().await;
    let started = std::time::Instant::now();
    tokio::time::timeout(
        Duration::from_secs(10),
        collection.update_one(doc! { "_id": "a" }, doc! { "$set": { "n": 2 } }),
    )
    .await
    .expect("the write goes on once the transaction is aborted")
    .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(500), "it waited");
    let commit = session.commit_transaction().await;
    let error = commit.expect_err("the server aborted the transaction");
    assert_eq!(error_code(&error), Some(251), "NoSuchTransaction: {error}");
    assert!(error.contains_label(mongodb::error::TRANSIENT_TRANSACTION_ERROR));
    let stored = collection
        .find_one(doc! { "_id": "a" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        stored.get_i32("n").unwrap(),
        2,
        "the transaction's write is gone"
    );
}

/// MongoDB manual, "Production Considerations" for transactions, "Runtime Limit", and "Drivers
/// API" (the TransientTransactionError label): once the server aborted a transaction past its
/// lifetime, a further statement of it fails with NoSuchTransaction (251), labelled
/// TransientTransactionError, and is not applied outside the transaction either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_of_a_transaction_the_server_aborted_fails_and_writes_nothing() {
    let (_dedicated, collection, mut session) = transaction_with_a_lifetime_of_one_second().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let error = collection
        .insert_one(doc! { "_id": "b" })
        .session(&mut session)
        .await
        .expect_err("the server aborted the transaction");
    assert_eq!(error_code(&error), Some(251), "NoSuchTransaction: {error}");
    assert!(error.contains_label(mongodb::error::TRANSIENT_TRANSACTION_ERROR));
    let _ = session.abort_transaction().await;
    assert_eq!(
        collection.count_documents(doc! {}).await.unwrap(),
        1,
        "neither the statement's write nor the transaction's first one was applied"
    );
    let stored = collection
        .find_one(doc! { "_id": "a" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.get_i32("n").unwrap(), 0);
}

// ---- Shim 7: the server's clock can be stepped ----

async fn step_clock(database: &mongodb::Database, millis: i64) -> i64 {
    let reply = database
        .run_command(doc! { "mongoecoStepClock": millis })
        .await
        .expect("the embedded server steps its clock");
    reply
        .get_i64("offsetMs")
        .or_else(|_| reply.get_i32("offsetMs").map(i64::from))
        .unwrap()
}

/// MongoDB manual, "Variables in Aggregation Expressions" (`$$NOW`: the current datetime of the
/// server that runs the operation) and "TTL Indexes" (a background task on the server deletes
/// documents whose indexed date plus `expireAfterSeconds` is before the server's current time):
/// both read the server's system clock, so stepping that clock (an NTP step, a resumed virtual
/// machine) moves both. The embedded server's clock is stepped by a command of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_servers_clock_steps_forward_and_back_for_now_and_ttl() {
    let dedicated = common::server::start_dedicated(None);
    let client = mongodb::Client::with_uri_str(&dedicated.uri).await.unwrap();
    let database = client.database(common::DATABASE);
    let collection = database.collection::<Document>(&common::unique("clock"));
    common::create_ttl_index(&collection, Duration::ZERO).await;
    let before = common::server_now_and_expiry(&collection, "none").await.0;
    let expires_at = mongodb::bson::DateTime::from_millis(before.timestamp_millis() + 30_000);
    collection
        .insert_one(doc! { "_id": "lease", "expiresAt": expires_at })
        .await
        .unwrap();

    assert_eq!(step_clock(&database, 60_000).await, 60_000);
    let ahead = common::server_now_and_expiry(&collection, "lease").await;
    let moved = ahead.0.timestamp_millis() - before.timestamp_millis();
    assert!((60_000..65_000).contains(&moved), "$$NOW moved {moved} ms");
    assert_eq!(ahead.1, None, "the TTL deletion follows the stepped clock");

    assert_eq!(step_clock(&database, -60_000).await, 0);
    let back = common::server_now_and_expiry(&collection, "none").await.0;
    let moved = back.timestamp_millis() - before.timestamp_millis();
    assert!((0..5_000).contains(&moved), "$$NOW is back: {moved} ms");

    let refused = database
        .run_command(doc! { "mongoecoStepClock": "soon" })
        .await;
    assert_eq!(error_code(&refused.unwrap_err()), Some(14));
}

// ---- Shims 3 and 5: errors with the codes a real server sends ----

/// MongoDB manual, "Transactions" → "In-progress Transactions and Write Conflicts" and "Drivers
/// API" (`TransientTransactionError`): a transaction that writes a document someone else wrote
/// after the transaction began fails with WriteConflict (112), labelled
/// TransientTransactionError, so that the client runs it again. A real server reports it at the
/// transaction's write; the embedded server at the commit (launcher shim 3 gives its codeless
/// refusal the code and label).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_conflict_in_a_transaction_is_reported_as_a_transient_write_conflict() {
    let (uri, _server) = server_with(&[]);
    let client = mongodb::Client::with_uri_str(&uri).await.unwrap();
    let collection = client
        .database(common::DATABASE)
        .collection::<Document>(&common::unique("conflict"));
    collection
        .insert_one(doc! { "_id": "a", "n": 0 })
        .await
        .unwrap();
    let mut session = client.start_session().await.unwrap();
    session.start_transaction().await.unwrap();
    // The transaction's snapshot starts with its first read.
    collection
        .find_one(doc! { "_id": "a" })
        .session(&mut session)
        .await
        .unwrap();
    collection
        .update_one(doc! { "_id": "a" }, doc! { "$set": { "n": 5 } })
        .await
        .unwrap();
    let written = collection
        .update_one(doc! { "_id": "a" }, doc! { "$inc": { "n": 1 } })
        .session(&mut session)
        .await;
    let error = match written {
        Err(error) => error,
        Ok(_) => session
            .commit_transaction()
            .await
            .expect_err("the transaction conflicts"),
    };
    assert_eq!(error_code(&error), Some(112), "{error}");
    assert!(error.contains_label(mongodb::error::TRANSIENT_TRANSACTION_ERROR));
    let stored = collection
        .find_one(doc! { "_id": "a" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        stored.get_i32("n").unwrap(),
        5,
        "only the other write is there"
    );
}

/// MongoDB manual, `createIndexes` → "Behavior": creating an index on a key pattern that an
/// index of another name already has, with other options, fails with IndexOptionsConflict (85)
/// (launcher shim 5 gives the embedded server's codeless refusal that code).
#[tokio::test]
async fn an_index_on_an_indexed_key_pattern_with_other_options_is_an_options_conflict() {
    let collection = common::database()
        .await
        .collection::<Document>(&common::unique("indexes"));
    let ttl = |name: &str, seconds: u64| {
        IndexModel::builder()
            .keys(doc! { "expiresAt": 1 })
            .options(
                mongodb::options::IndexOptions::builder()
                    .name(name.to_owned())
                    .expire_after(Duration::from_secs(seconds))
                    .build(),
            )
            .build()
    };
    collection.create_index(ttl("first", 60)).await.unwrap();
    let error = collection
        .create_index(ttl("second", 120))
        .await
        .unwrap_err();
    assert_eq!(error_code(&error), Some(85), "{error}");
}

/// MongoDB manual, "$project (aggregation)", "Conditionally Exclude Fields": a `$cond` whose
/// chosen branch names a field the document lacks yields a missing value, and the field is left
/// out of the output (the example's documents without `author.middle` come out without it), as
/// it is with `$$REMOVE`. The same holds for `$set`/`$addFields` in an update pipeline, which is
/// how the crate writes a field back unchanged when an attempt finds a lock busy. Fails when a
/// missing value is stored as null (mongoeco without shim 9).
#[tokio::test]
async fn a_cond_branch_naming_a_missing_field_leaves_the_field_out() {
    let collection = common::database()
        .await
        .collection::<mongodb::bson::Document>(&common::unique("cond-missing"));
    collection
        .insert_one(doc! { "_id": "a", "kept": 1, "gone": 2 })
        .await
        .unwrap();
    collection
        .update_one(
            doc! { "_id": "a" },
            vec![doc! { "$set": {
                "kept": { "$cond": [false, "$$REMOVE", "$kept"] },
                "gone": { "$cond": { "if": true, "then": "$$REMOVE", "else": "$gone" } },
                "absent": { "$cond": [false, 3, "$absent"] },
                "nested": { "$cond": [true, { "$cond": [false, 4, "$nothing"] }, 5] },
                "added": { "$cond": [true, 6, "$absent"] },
            } }],
        )
        .await
        .unwrap();
    let stored = collection
        .find_one(doc! { "_id": "a" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored, doc! { "_id": "a", "kept": 1, "added": 6 });
    let projected: Vec<mongodb::bson::Document> = collection
        .aggregate([doc! { "$project": {
            "middle": { "$cond": [{ "$eq": ["", "$middle"] }, "$$REMOVE", "$middle"] },
            "kept": 1,
        } }])
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(projected, [doc! { "_id": "a", "kept": 1 }]);
}

/// MongoDB manual, `db.collection.updateOne()` and `findAndModify`, "Upsert" (DOCS-14158): an
/// upsert whose query predicate holds `$expr` is refused, error 224 (QueryFeatureNotAllowed),
/// "$expr is not allowed in the query predicate for an upsert", whether or not a document
/// matches; without upsert the same filter is fine. (Shim 10: mongoeco ran such upserts.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upsert_whose_filter_holds_expr_is_refused() {
    let database = common::database().await;
    let collection = database.collection::<Document>(&common::unique("upserts"));
    collection
        .insert_one(doc! { "_id": "x", "n": 1 })
        .await
        .unwrap();
    let filter = doc! { "_id": "x", "$expr": { "$eq": ["$n", 1] } };
    let refused = collection
        .find_one_and_update(filter.clone(), doc! { "$set": { "n": 2 } })
        .upsert(true)
        .await
        .expect_err("findAndModify with upsert and $expr");
    assert_eq!(error_code(&refused), Some(224), "{refused}");
    let refused = collection
        .update_one(filter.clone(), doc! { "$set": { "n": 2 } })
        .upsert(true)
        .await
        .expect_err("update with upsert and $expr");
    assert_eq!(error_code(&refused), Some(224), "{refused}");
    let stored = collection
        .find_one(doc! { "_id": "x" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.get_i32("n"), Ok(1), "nothing applied: {stored}");
    // Without upsert, the same filter is an ordinary one.
    let updated = collection
        .update_one(filter, doc! { "$set": { "n": 2 } })
        .await
        .unwrap();
    assert_eq!(updated.modified_count, 1);
}
