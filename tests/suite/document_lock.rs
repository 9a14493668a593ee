//! Locks embedded in business documents: claim, commit, replace, release, loss, inserts.

use test_support as common;

use std::time::Duration;

use distributed_lock_mongodb::{DocumentLock, Error, LockOptions};
use mongodb::Collection;
use mongodb::bson::{Bson, Document, doc};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Job {
    #[serde(rename = "_id")]
    id: String,
    status: String,
    #[serde(default)]
    attempts: i32,
}

async fn jobs() -> Collection<Job> {
    common::database().await.collection(&common::unique("jobs"))
}

fn raw(collection: &Collection<Job>) -> Collection<Document> {
    collection.clone_with_type()
}

fn job(id: &str) -> Job {
    Job {
        id: id.to_owned(),
        status: "pending".to_owned(),
        attempts: 0,
    }
}

#[tokio::test]
async fn commit_writes_the_new_state_and_unlocks_in_one_step() {
    let jobs = jobs().await;
    jobs.insert_one(job("a")).await.unwrap();
    let locks = DocumentLock::new(&jobs);
    let guard = locks.lock(doc! { "_id": "a" }).await.unwrap();
    assert_eq!(guard.document(), &job("a"));
    assert_eq!(guard.id(), &Bson::String("a".into()));
    let token = guard.fencing_token();

    let locked = raw(&jobs)
        .find_one(doc! { "_id": "a" })
        .await
        .unwrap()
        .unwrap();
    let lock = locked.get_document("lock").unwrap();
    assert!(lock.get_str("id").is_ok() && lock.get_datetime("expiresAt").is_ok());
    assert_eq!(lock.get_i64("fencingToken").unwrap(), token.get());
    assert!(
        locks.try_lock(doc! { "_id": "a" }).await.unwrap().is_none(),
        "held"
    );

    guard
        .commit(doc! { "$set": { "status": "done" }, "$inc": { "attempts": 1 } })
        .await
        .unwrap();
    let committed = raw(&jobs)
        .find_one(doc! { "_id": "a" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(committed.get_str("status").unwrap(), "done");
    assert_eq!(committed.get_i32("attempts").unwrap(), 1);
    assert_eq!(
        committed.get_document("lock").unwrap(),
        &doc! { "fencingToken": token.get() }
    );

    let next = locks
        .try_lock(doc! { "_id": "a" })
        .await
        .unwrap()
        .expect("unlocked by the commit");
    assert!(next.fencing_token() > token);
    assert_eq!(next.document().status, "done");
    next.release().await.unwrap();
}

#[tokio::test]
async fn a_commit_after_the_lock_was_lost_writes_nothing() {
    let jobs = jobs().await;
    jobs.insert_one(job("b")).await.unwrap();
    let locks = DocumentLock::new(&jobs).with_options(common::options(2_000, 300));
    let guard = locks.lock(doc! { "_id": "b" }).await.unwrap();
    // Someone else takes the lock over behind the holder's back.
    raw(&jobs)
        .update_one(
            doc! { "_id": "b" },
            doc! { "$set": { "lock.id": "intruder" } },
        )
        .await
        .unwrap();
    let error = guard
        .commit(doc! { "$set": { "status": "done" } })
        .await
        .unwrap_err();
    assert!(error.is_lock_lost(), "{error}");
    let stored = raw(&jobs)
        .find_one(doc! { "_id": "b" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        stored.get_str("status").unwrap(),
        "pending",
        "nothing written"
    );
    assert_eq!(
        stored.get_document("lock").unwrap().get_str("id").unwrap(),
        "intruder"
    );

    // Once lost is signalled locally, commit refuses without writing either.
    jobs.insert_one(job("c")).await.unwrap();
    let guard = locks.lock(doc! { "_id": "c" }).await.unwrap();
    raw(&jobs)
        .update_one(doc! { "_id": "c" }, doc! { "$unset": { "lock": "" } })
        .await
        .unwrap();
    let lost = guard.lost();
    tokio::time::timeout(Duration::from_secs(3), lost.wait())
        .await
        .unwrap();
    assert!(
        guard
            .commit(doc! { "$set": { "status": "done" } })
            .await
            .unwrap_err()
            .is_lock_lost()
    );
    let stored = raw(&jobs)
        .find_one(doc! { "_id": "c" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.get_str("status").unwrap(), "pending");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_never_hold_the_same_document() {
    let jobs = jobs().await;
    jobs.insert_one(job("shared")).await.unwrap();
    let locks = DocumentLock::new(&jobs).with_options(
        LockOptions::builder()
            .busy_wait_sleep_time(Duration::from_millis(1), Duration::from_millis(10))
            .build()
            .unwrap(),
    );
    let occupancy = common::Occupancy::default();
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let (locks, occupancy) = (locks.clone(), occupancy.clone());
            tokio::spawn(async move {
                for _ in 0..5 {
                    let guard = locks.lock(doc! { "_id": "shared" }).await.unwrap();
                    let inside = occupancy.enter();
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    drop(inside);
                    guard
                        .commit(doc! { "$inc": { "attempts": 1 } })
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    assert_eq!(occupancy.most(), 1);
    let stored = raw(&jobs)
        .find_one(doc! { "_id": "shared" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        stored.get_i32("attempts").unwrap(),
        40,
        "every commit applied exactly once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_claiming_pending_jobs_process_each_exactly_once() {
    let jobs = jobs().await;
    jobs.insert_many((0..20).map(|i| job(&format!("job-{i}"))))
        .await
        .unwrap();
    let locks = DocumentLock::new(&jobs);
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let locks = locks.clone();
            tokio::spawn(async move {
                let mut done = 0;
                loop {
                    match locks.try_lock(doc! { "status": "pending" }).await {
                        Ok(Some(claimed)) => {
                            claimed
                                .commit(doc! { "$set": { "status": "done" }, "$inc": { "attempts": 1 } })
                                .await
                                .unwrap();
                            done += 1;
                        }
                        Ok(None) => tokio::time::sleep(Duration::from_millis(5)).await,
                        Err(Error::DocumentNotFound { .. }) => return done,
                        Err(error) => panic!("{error}"),
                    }
                }
            })
        })
        .collect();
    let mut processed = 0;
    for worker in workers {
        processed += worker.await.unwrap();
    }
    assert_eq!(processed, 20);
    let twice = raw(&jobs)
        .count_documents(doc! { "attempts": { "$ne": 1 } })
        .await
        .unwrap();
    assert_eq!(twice, 0, "each job processed exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_lock_or_insert_creates_one_document_and_one_holder_at_a_time() {
    let jobs = jobs().await;
    let locks = DocumentLock::new(&jobs).with_options(
        LockOptions::builder()
            .busy_wait_sleep_time(Duration::from_millis(1), Duration::from_millis(10))
            .build()
            .unwrap(),
    );
    let occupancy = common::Occupancy::default();
    let racers: Vec<_> = (0..16)
        .map(|_| {
            let (locks, occupancy) = (locks.clone(), occupancy.clone());
            tokio::spawn(async move {
                let guard = locks
                    .lock_or_insert("new-job", job("new-job"))
                    .await
                    .unwrap();
                let inside = occupancy.enter();
                tokio::time::sleep(Duration::from_millis(2)).await;
                drop(inside);
                guard
                    .commit(doc! { "$inc": { "attempts": 1 } })
                    .await
                    .unwrap();
            })
        })
        .collect();
    for racer in racers {
        racer.await.unwrap();
    }
    assert_eq!(occupancy.most(), 1, "one holder at a time");
    assert_eq!(
        raw(&jobs).count_documents(doc! {}).await.unwrap(),
        1,
        "one document"
    );
    let stored = raw(&jobs).find_one(doc! {}).await.unwrap().unwrap();
    assert_eq!(stored.get_i32("attempts").unwrap(), 16);
}

#[tokio::test]
async fn replace_release_and_drop_keep_the_fencing_token() {
    let jobs = jobs().await;
    jobs.insert_one(job("r")).await.unwrap();
    let locks = DocumentLock::new(&jobs);
    let first = locks.lock(doc! { "_id": "r" }).await.unwrap();
    let token = first.fencing_token();
    let mut replacement = first.document().clone();
    replacement.status = "rewritten".into();
    first.replace(replacement).await.unwrap();
    let stored = raw(&jobs)
        .find_one(doc! { "_id": "r" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.get_str("status").unwrap(), "rewritten");
    assert_eq!(
        stored.get_document("lock").unwrap(),
        &doc! { "fencingToken": token.get() }
    );

    let second = locks.lock(doc! { "_id": "r" }).await.unwrap();
    assert!(second.fencing_token() > token);
    let token = second.fencing_token();
    second.release().await.unwrap();
    let stored = raw(&jobs)
        .find_one(doc! { "_id": "r" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        stored.get_str("status").unwrap(),
        "rewritten",
        "release changes no data"
    );
    assert_eq!(
        stored.get_document("lock").unwrap(),
        &doc! { "fencingToken": token.get() }
    );

    let third = locks.lock(doc! { "_id": "r" }).await.unwrap();
    assert!(third.fencing_token() > token);
    drop(third);
    let fourth = locks
        .lock_timeout(doc! { "_id": "r" }, Duration::from_secs(2))
        .await
        .unwrap();
    fourth.release().await.unwrap();
}

#[tokio::test]
async fn documents_without_or_with_foreign_lock_fields_are_handled() {
    let collection: Collection<Document> =
        common::database().await.collection(&common::unique("docs"));
    collection
        .insert_many([
            doc! { "_id": 1, "owner": "ann", "nested": { "deep": [1, 2, 3] } },
            doc! { "_id": 2, "owner": "bob", "lease": "not ours" },
        ])
        .await
        .unwrap();
    let locks = DocumentLock::new(&collection).with_field("lease");
    let guard = locks.lock(doc! { "_id": 1 }).await.unwrap();
    assert_eq!(guard.document().get_str("owner").unwrap(), "ann");
    guard
        .commit(doc! { "$set": { "owner": "ann2" } })
        .await
        .unwrap();
    let stored = collection
        .find_one(doc! { "_id": 1 })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        stored.get_document("nested").unwrap(),
        &doc! { "deep": [1, 2, 3] }
    );
    assert_eq!(stored.get_str("owner").unwrap(), "ann2");

    // A lease field holding something else is treated as unlocked and taken over.
    let guard = locks.lock(doc! { "_id": 2 }).await.unwrap();
    guard.release().await.unwrap();
    let stored = collection
        .find_one(doc! { "_id": 2 })
        .await
        .unwrap()
        .unwrap();
    assert!(
        stored
            .get_document("lease")
            .unwrap()
            .get_i64("fencingToken")
            .is_ok()
    );
    assert_eq!(stored.get_str("owner").unwrap(), "bob");
}

#[tokio::test]
async fn bad_input_gives_clear_errors_and_writes_nothing() {
    let jobs = jobs().await;
    jobs.insert_one(job("x")).await.unwrap();
    let locks = DocumentLock::new(&jobs);
    let missing = locks.lock(doc! { "_id": "nope" }).await.unwrap_err();
    assert!(
        matches!(missing, Error::DocumentNotFound { .. }),
        "{missing}"
    );
    for field in ["", "a.b", "$x", "_id"] {
        let error = DocumentLock::new(&jobs)
            .with_field(field)
            .try_lock(doc! {})
            .await
            .unwrap_err();
        assert!(
            matches!(error, Error::InvalidArgument(_)),
            "{field:?}: {error}"
        );
    }
    let guard = locks.lock(doc! { "_id": "x" }).await.unwrap();
    let error = guard
        .commit(doc! { "status": "replacement-style" })
        .await
        .unwrap_err();
    assert!(matches!(error, Error::InvalidArgument(_)), "{error}");
    let stored = raw(&jobs)
        .find_one(doc! { "_id": "x" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.get_str("status").unwrap(), "pending");
    // The refused commit unlocked the document.
    let again = locks
        .lock_timeout(doc! { "_id": "x" }, Duration::from_secs(2))
        .await
        .unwrap();
    let error = again
        .commit(doc! { "$set": { "lock.id": "mine" } })
        .await
        .unwrap_err();
    assert!(matches!(error, Error::InvalidArgument(_)), "{error}");
    let error = locks.lock_or_insert("other", job("x")).await.unwrap_err();
    assert!(matches!(error, Error::InvalidArgument(_)), "{error}");
}

#[tokio::test]
async fn lock_or_insert_reports_a_duplicate_on_another_unique_index_instead_of_waiting() {
    let jobs = jobs().await;
    let unique_status = mongodb::IndexModel::builder()
        .keys(doc! { "status": 1 })
        .options(
            mongodb::options::IndexOptions::builder()
                .unique(true)
                .name("status_unique".to_owned())
                .build(),
        )
        .build();
    jobs.create_index(unique_status).await.unwrap();
    jobs.insert_one(job("first")).await.unwrap();
    let locks = DocumentLock::new(&jobs);
    // "second" does not exist, but its insert collides with "first" on `status`: the document
    // will never exist, so waiting for it to be unlocked would wait forever.
    let outcome = tokio::time::timeout(
        Duration::from_secs(20),
        locks.lock_or_insert("second", job("second")),
    )
    .await
    .expect("an unrelated duplicate key is an error, not a reason to wait");
    let error = outcome.unwrap_err();
    assert!(matches!(error, Error::Mongo(_)), "{error}");
    assert!(error.to_string().contains("E11000"), "{error}");
    assert_eq!(
        raw(&jobs).count_documents(doc! {}).await.unwrap(),
        1,
        "nothing was inserted"
    );
    // A duplicate `_id` still means "it exists": lock_or_insert locks the existing document.
    let guard = locks.lock_or_insert("first", job("first")).await.unwrap();
    assert_eq!(guard.document().id, "first");
    guard.release().await.unwrap();
}

/// A locked document whose reply carries no numeric fencing token (impossible on a conforming
/// server: the lock's own update writes it) is an `UnexpectedReply`, as for every other kind,
/// never a guard with token 0. The proxy answers the locking `findAndModify` in the server's
/// place with such a document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_document_without_a_fencing_token_is_an_unexpected_reply() {
    let (proxy, client) = common::proxy::proxied_client().await;
    let jobs = client
        .database(common::DATABASE)
        .collection::<Job>(&common::unique("jobs"));
    jobs.insert_one(job("x")).await.unwrap();
    let tokenless = doc! {
        "ok": 1.0,
        "lastErrorObject": { "n": 1, "updatedExisting": true },
        "value": {
            "_id": "x", "status": "pending", "attempts": 0,
            "lock": { "id": "whoever", "expiresAt": mongodb::bson::DateTime::now() },
        },
    };
    proxy.add_rule(common::proxy::Rule::new(
        "findAndModify",
        common::proxy::Action::Reply(tokenless),
    ));
    let outcome = DocumentLock::new(&jobs).try_lock(doc! { "_id": "x" }).await;
    assert!(
        matches!(outcome, Err(Error::UnexpectedReply(_))),
        "{outcome:?}"
    );
}

/// The cleanup of a document-lock attempt whose outcome is unknown filters by the attempt's
/// lock id alone (which document it locked is unknown), so it must be a multi-document update:
/// a sharded collection accepts those without the shard key on every MongoDB version, where a
/// single-document update without the shard key needs 7.0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cleanup_after_an_unknown_outcome_is_a_multi_document_update() {
    let (proxy, database, commands) = common::proxied_counting_database().await;
    let name = common::unique("jobs");
    let jobs = database.collection::<Job>(&name);
    jobs.insert_one(job("x")).await.unwrap();
    proxy.add_rule(
        common::proxy::Rule::new("findAndModify", common::proxy::Action::DropReplyAndClose)
            .on(&name),
    );
    let outcome = DocumentLock::new(&jobs).try_lock(doc! { "_id": "x" }).await;
    assert!(outcome.is_err(), "the reply was lost: {outcome:?}");
    let unlocked = common::eventually(Duration::from_secs(10), || async {
        raw(&jobs)
            .find_one(doc! { "_id": "x" })
            .await
            .unwrap()
            .is_some_and(|stored| {
                stored
                    .get_document("lock")
                    .is_ok_and(|lock| !lock.contains_key("id"))
            })
    })
    .await;
    assert!(unlocked, "the cleanup unlocked the document");
    let cleanups = commands.updates();
    let cleanup = cleanups
        .iter()
        .find(|update| update.get_str("update") == Ok(name.as_str()))
        .expect("a cleanup update was sent");
    let statement = cleanup.get_array("updates").unwrap()[0]
        .as_document()
        .unwrap()
        .clone();
    assert_eq!(statement.get_bool("multi"), Ok(true), "{statement}");
    assert!(
        !statement.get_document("q").unwrap().contains_key("_id"),
        "{statement}"
    );
}

/// Before MongoDB 7.0, a `findAndModify` on a sharded collection must carry the shard key in its
/// filter (<https://www.mongodb.com/docs/v6.0/reference/command/findAndModify/#sharded-collections>),
/// and a document lock's collection may be sharded on a key other than `_id`. The renewals,
/// which filter on the locked document's `_id`, must keep the lease alive there. The proxy
/// answers every `findAndModify` on the collection after the locking one as such a server does
/// (ShardKeyNotFound, 61). Fails when a single lease is always renewed with a `findAndModify`:
/// the lease is lost at its first deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_document_lock_keeps_renewing_on_a_collection_sharded_on_another_key() {
    let (proxy, client) = common::proxy::proxied_client().await;
    let name = common::unique("jobs");
    let jobs = client.database(common::DATABASE).collection::<Job>(&name);
    jobs.insert_one(job("s")).await.unwrap();
    let guard = DocumentLock::new(&jobs)
        .with_options(common::options(1_500, 300))
        .lock(doc! { "_id": "s" })
        .await
        .unwrap();
    let refused = proxy.add_rule(
        common::proxy::Rule::new(
            "findAndModify",
            common::proxy::Action::Reply(common::proxy::replies::command_error(
                61,
                "ShardKeyNotFound",
            )),
        )
        .on(&name)
        .times(usize::MAX),
    );
    // Three lease lifetimes: held throughout only if renewals keep succeeding.
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    assert!(
        proxy.hits(refused) >= 1,
        "a renewal was tried as a findAndModify first"
    );
    assert!(!guard.is_lost(), "the lease was renewed throughout");
    let stored = raw(&jobs)
        .find_one(doc! { "_id": "s" })
        .await
        .unwrap()
        .unwrap();
    let expires_at = stored
        .get_document("lock")
        .unwrap()
        .get_datetime("expiresAt")
        .unwrap();
    assert!(
        expires_at.timestamp_millis() > mongodb::bson::DateTime::now().timestamp_millis(),
        "the stored lease is live"
    );
    guard.release().await.unwrap();
}

/// A checkpoint that gets no reply within `expiry` returns `Error::NoReply` then, and its update
/// is not cut off mid-flight: the driver's manual warns against dropping its futures midway, so
/// the write runs to its reply in a task of its own, like every other write whose outcome
/// matters. Fails when the checkpoint drops the driver's future at its limit: the command is
/// never answered (its started event has no succeeded or failed event).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_without_a_reply_in_time_times_out_and_its_update_runs_to_its_reply() {
    let (proxy, database, commands) = common::proxied_counting_database().await;
    let name = common::unique("jobs");
    let jobs = database.collection::<Job>(&name);
    jobs.insert_one(job("p")).await.unwrap();
    let guard = DocumentLock::new(&jobs)
        .with_options(common::options(1_500, 300))
        .lock(doc! { "_id": "p" })
        .await
        .unwrap();
    let delay = Duration::from_secs(6);
    proxy.add_rule(
        common::proxy::Rule::new("update", common::proxy::Action::DelayReply(delay)).on(&name),
    );
    let started = std::time::Instant::now();
    let outcome = guard.checkpoint(doc! { "$set": { "progress": 50 } }).await;
    let returned_after = started.elapsed();
    assert!(matches!(outcome, Err(Error::NoReply { .. })), "{outcome:?}");
    assert!(
        returned_after < delay,
        "bounded by expiry, not by the reply: {returned_after:?}"
    );
    let answered = common::eventually(Duration::from_secs(15), || async {
        commands.in_flight() == 0
    })
    .await;
    assert!(answered, "the checkpoint's update ran to its reply");
    let stored = raw(&jobs)
        .find_one(doc! { "_id": "p" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.get_i32("progress"), Ok(50), "{stored}");
    guard.release().await.unwrap();
}

/// Two document locks on `app.orders` of two clients that reach two deployments, made by one
/// provider (one family: its renewal loops): each lease is renewed and released on its own
/// deployment. Fails when one renewal loop, keyed by the namespace alone, serves both: the
/// second lease is then renewed (and released) on the first deployment, found gone there and
/// reported lost, and stays locked on its own until it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn document_locks_of_two_deployments_renew_and_release_each_on_its_own() {
    let other = common::server::start_dedicated(None);
    let here = common::database().await;
    let there = common::database_on(&other.uri).await;
    let name = common::unique("orders");
    let (ours, theirs) = (
        here.collection::<Document>(&name),
        there.collection::<Document>(&name),
    );
    for orders in [&ours, &theirs] {
        orders
            .insert_one(doc! { "_id": 1, "status": "new" })
            .await
            .unwrap();
    }
    let provider =
        distributed_lock_mongodb::Provider::new(&here).with_options(common::options(1_500, 300));
    let first = provider
        .create_document_lock(&ours)
        .lock(doc! { "_id": 1 })
        .await
        .unwrap();
    let second = provider
        .create_document_lock(&theirs)
        .lock(doc! { "_id": 1 })
        .await
        .unwrap();
    // Several lease lifetimes: both are renewed, each where it lives.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!first.is_lost(), "the first lease was lost");
    assert!(
        !second.is_lost(),
        "the lease on the other deployment was lost"
    );
    second.release().await.unwrap();
    let unlocked = theirs.find_one(doc! { "_id": 1 }).await.unwrap().unwrap();
    assert!(
        unlocked
            .get_document("lock")
            .is_ok_and(|lock| !lock.contains_key("id")),
        "released on its own deployment: {unlocked}"
    );
    first.release().await.unwrap();
}
