//! Push wake-ups across processes: a waiter that polls for a lock held by another process
//! watches the lock's collection with a change stream, and that process's release wakes it at
//! once, however slowly it would poll. (On MongoDB, change streams need a replica set or a
//! sharded cluster; the embedded server imitates them, launcher shim 8.)

use test_support as common;

use std::sync::Arc;
use std::time::Duration;

use common::CommandLog;
use distributed_lock_mongodb::{
    LockGuard, LockOptions, MongoDistributedLock, MongoDistributedReaderWriterLock,
    MongoDistributedSemaphore, Result,
};
use mongodb::bson::{Document, doc};
use mongodb::{Collection, Database};
use tokio::task::JoinHandle;

/// Waiters that would poll every 20 s: a wake-up sooner than that is the push.
fn sleepy_options() -> LockOptions {
    LockOptions::builder()
        .expiry(Duration::from_secs(30))
        .busy_wait_sleep_time(Duration::from_secs(20), Duration::from_secs(20))
        .build()
        .unwrap()
}

/// The lock document of a lock held by another process for a minute.
async fn held_by_another_process(collection: &Collection<Document>, name: &str) {
    let in_a_minute = mongodb::bson::DateTime::from_millis(
        mongodb::bson::DateTime::now().timestamp_millis() + 60_000,
    );
    collection
        .insert_one(doc! {
            "_id": name,
            "lockId": "remote",
            "expiresAt": in_a_minute,
            "fencingToken": 1_i64,
        })
        .await
        .unwrap();
}

/// The other process releases its lease, as the crate's release does.
async fn released_by_the_other_process(collection: &Collection<Document>, name: &str) {
    collection
        .update_one(
            doc! { "_id": name, "lockId": "remote" },
            vec![
                doc! { "$set": { "expiresAt": "$$NOW" } },
                doc! { "$unset": "lockId" },
            ],
        )
        .await
        .unwrap();
}

struct Setup {
    lock: MongoDistributedLock,
    collection: Collection<Document>,
    log: Arc<CommandLog>,
}

fn setup(database: &Database, log: Arc<CommandLog>, options: LockOptions) -> Setup {
    let collection = common::unique("locks");
    let lock = MongoDistributedLock::new(common::unique("push"), database)
        .with_collection(collection.as_str())
        .with_options(options);
    Setup {
        lock,
        collection: database.collection(&collection),
        log,
    }
}

impl Setup {
    /// A waiter, once the lock is held by another process and the waiter's change stream is
    /// open (the driver asks for its first batch of events).
    async fn waiter_with_its_stream_open(&self) -> JoinHandle<Result<LockGuard>> {
        held_by_another_process(&self.collection, self.lock.name()).await;
        let lock = self.lock.clone();
        let waiter =
            tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(60)).await });
        let open = common::eventually(Duration::from_secs(20), || async {
            self.log.count("getMore") >= 1
        })
        .await;
        assert!(open, "no change stream: {:?}", self.log.started());
        waiter
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_by_another_process_wakes_the_poller_at_once() {
    let (database, log) = common::counting_database().await;
    let setup = setup(&database, log, sleepy_options());
    let waiter = setup.waiter_with_its_stream_open().await;
    released_by_the_other_process(&setup.collection, setup.lock.name()).await;
    let guard = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("woken by the release, not by a poll 20 s later")
        .unwrap()
        .unwrap();
    assert!(guard.fencing_token().get() > 1);
    guard.release().await.unwrap();
    // Nobody waits any more: the stream is closed, its cursor killed on the server.
    let closed = common::eventually(Duration::from_secs(10), || async {
        setup.log.count("killCursors") >= 1
    })
    .await;
    assert!(closed, "{:?}", setup.log.started());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_and_acquisitions_by_others_wake_nobody() {
    let (database, log) = common::counting_database().await;
    let setup = setup(&database, log, sleepy_options());
    let waiter = setup.waiter_with_its_stream_open().await;
    // The stream's first opening made the poller attempt once (a release may have come just
    // before it): wait for that attempt to be answered.
    let settled = common::eventually(Duration::from_secs(10), || async {
        setup.log.count("findAndModify") == 2 && setup.log.in_flight() <= 1
    })
    .await;
    assert!(settled, "{:?}", setup.log.started());
    let attempts_before = setup.log.count("findAndModify");
    let name = setup.lock.name();
    for _ in 0..3 {
        // The other process renews its lease...
        setup
            .collection
            .update_one(
                doc! { "_id": name },
                vec![doc! { "$set": { "expiresAt": { "$add": ["$$NOW", 60_000_i64] } } }],
            )
            .await
            .unwrap();
    }
    // ...and hands it to a third one, which releases it. Events arrive in order: by the time the
    // release wakes the poller, the renewals and the acquisition have been seen.
    setup
        .collection
        .update_one(doc! { "_id": name }, doc! { "$set": { "lockId": "third" } })
        .await
        .unwrap();
    setup
        .collection
        .update_one(
            doc! { "_id": name },
            vec![
                doc! { "$set": { "expiresAt": "$$NOW" } },
                doc! { "$unset": "lockId" },
            ],
        )
        .await
        .unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("woken by the release")
        .unwrap()
        .unwrap();
    assert_eq!(
        setup.log.count("findAndModify") - attempts_before,
        1,
        "one attempt, for the release: {:?}",
        setup.log.started()
    );
    guard.release().await.unwrap();
}

/// MongoDB manual, "Change Streams" (resumability): the driver resumes a stream whose cursor
/// was killed; the lock's stream goes on pushing releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_killed_on_the_server_resumes_and_still_pushes() {
    // The kill reaches every stream of a server: a server of its own.
    let server = common::server::start_dedicated(None);
    let (database, log) = common::counting_database_on(&server.uri, |_| {}).await;
    let setup = setup(&database, log, sleepy_options());
    let waiter = setup.waiter_with_its_stream_open().await;
    let opened = setup.log.count("aggregate");
    database
        .client()
        .database("admin")
        .run_command(doc! { "mongoecoKillChangeStreams": 1 })
        .await
        .unwrap();
    let resumed = common::eventually(Duration::from_secs(20), || async {
        setup.log.count("aggregate") > opened
    })
    .await;
    assert!(resumed, "{:?}", setup.log.started());
    released_by_the_other_process(&setup.collection, setup.lock.name()).await;
    let guard = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("woken by the release through the resumed stream")
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
}

/// Without change streams (a standalone server refuses `$changeStream` with 40573), waiters
/// poll at their busy-wait pace, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_change_streams_the_poller_polls_at_its_pace() {
    let server = common::server::start_dedicated_with(&["--no-change-streams".to_owned()]);
    let (database, log) = common::counting_database_on(&server.uri, |_| {}).await;
    let options = LockOptions::builder()
        .busy_wait_sleep_time(Duration::from_millis(100), Duration::from_millis(200))
        .build()
        .unwrap();
    let setup = setup(&database, log, options);
    held_by_another_process(&setup.collection, setup.lock.name()).await;
    let lock = setup.lock.clone();
    let waiter = tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(60)).await });
    // It asked for a stream, was refused, and polls.
    let polling = common::eventually(Duration::from_secs(20), || async {
        setup.log.count("aggregate") >= 1 && setup.log.count("findAndModify") >= 4
    })
    .await;
    assert!(polling, "{:?}", setup.log.started());
    assert_eq!(setup.log.count("getMore"), 0, "no stream was opened");
    released_by_the_other_process(&setup.collection, setup.lock.name()).await;
    let guard = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("found free by a poll")
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_place_released_by_another_process_wakes_the_semaphores_poller_at_once() {
    let (database, log) = common::counting_database().await;
    let (collection, name) = (common::unique("semaphores"), common::unique("push"));
    // Another process (a client of its own: nothing links the two in this process).
    let other = MongoDistributedSemaphore::new(name.as_str(), 1, &common::database().await)
        .with_collection(collection.as_str());
    let place = other.acquire().await.unwrap();
    let semaphore = MongoDistributedSemaphore::new(name.as_str(), 1, &database)
        .with_collection(collection.as_str())
        .with_options(sleepy_options());
    let waiter =
        tokio::spawn(async move { semaphore.acquire_timeout(Duration::from_secs(60)).await });
    common::stream_open(&log, &collection, &name, 1).await;
    place.release().await.unwrap();
    let place = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("woken by the release, not by a poll 20 s later")
        .unwrap()
        .unwrap();
    place.release().await.unwrap();
}

/// A place handed over in a release command (the releaser's lease filtered out, the waiter's
/// appended) comes back through the stream as a change of the holders array with every place
/// taken: it frees nothing, and the next local waiter, which becomes the poller as the first
/// leaves with the place, is not woken to attempt (an attempt that could only fail). (The test
/// server reports the shifted elements field by field; a server that reports the array whole,
/// or the document replaced, is covered by `push`'s unit tests.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_place_handed_over_in_its_release_wakes_no_other_waiter_through_the_stream() {
    let (database, log) = common::counting_database().await;
    let (collection, name) = (common::unique("semaphores"), common::unique("echo"));
    let semaphore = MongoDistributedSemaphore::new(name.as_str(), 2, &database)
        .with_collection(collection.as_str())
        .with_options(sleepy_options());
    // Held in this order: the first is the array's first element.
    let first = semaphore.acquire().await.unwrap();
    let _second = semaphore.acquire().await.unwrap();
    let (acquired, mut acquisitions) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for queued in 1..=2 {
        let (semaphore, acquired) = (semaphore.clone(), acquired.clone());
        waiters.push(tokio::spawn(async move {
            let place = semaphore
                .acquire_timeout(Duration::from_secs(60))
                .await
                .unwrap();
            acquired.send(()).unwrap();
            std::future::pending::<()>().await;
            drop(place);
        }));
        let in_line = common::offers_become(&collection, &name, queued).await;
        assert!(in_line, "waiter {queued} did not queue");
    }
    common::stream_open(&log, &collection, &name, 2).await;
    log.clear();
    first.release().await.unwrap();
    // The `getMore` that carries the release's echo was sent by now, or is the next one; the one
    // after it is sent once the echo was handled.
    let get_mores = log.count("getMore");
    tokio::time::timeout(Duration::from_secs(10), acquisitions.recv())
        .await
        .expect("the place handed over in the release")
        .unwrap();
    let echoed = common::eventually(Duration::from_secs(20), || async {
        log.count("getMore") >= get_mores + 2
            && distributed_lock_mongodb::__testing::waiters_idle(
                common::DATABASE,
                &collection,
                &name,
            ) == 1
            && log.in_flight() <= 1
    })
    .await;
    assert!(echoed, "{:?}", log.started());
    assert_eq!(
        log.started_without_streams(),
        ["findAndModify"],
        "the transfer and no attempt: {:#?}",
        log.find_and_modifies()
    );
    assert_eq!(log.transfers(), 1);
    for waiter in waiters {
        waiter.abort();
    }
}

/// The stream of a lock's poller closes when the poller leaves; a poller that subscribes soon
/// after resumes it where it stood, so no release in between is missed, and its first attempt
/// is all it needs (a stream started afresh wakes its poller to attempt once more: a release
/// may have come before it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_closed_with_its_last_poller_is_resumed_by_the_next_one() {
    let (database, log) = common::counting_database().await;
    let setup = setup(&database, Arc::clone(&log), sleepy_options());
    let first = setup.waiter_with_its_stream_open().await;
    first.abort();
    // Its stream closes once its `getMore` is answered: the driver kills its cursor.
    let closed = common::eventually(Duration::from_secs(20), || async {
        log.count("killCursors") >= 1
    })
    .await;
    assert!(closed, "{:?}", log.started());
    log.clear();
    let lock = setup.lock.clone();
    let second = tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(60)).await });
    common::stream_open(&log, setup.collection.name(), setup.lock.name(), 1).await;
    let resumed = log.reads().iter().any(|read| {
        read.get_array("pipeline")
            .ok()
            .and_then(|pipeline| pipeline.first())
            .and_then(|stage| stage.as_document())
            .and_then(|stage| stage.get_document("$changeStream").ok())
            .is_some_and(|stream| stream.contains_key("startAfter"))
    });
    assert!(resumed, "opened afresh: {:#?}", log.reads());
    assert_eq!(
        log.started_without_streams(),
        ["findAndModify"],
        "its first attempt only: {:#?}",
        log.find_and_modifies()
    );
    // And the stream pushes: a release by the other process reaches it.
    released_by_the_other_process(&setup.collection, setup.lock.name()).await;
    let guard = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("woken by the release, not by a poll 20 s later")
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_released_by_another_process_wakes_the_readers_and_readers_the_writer() {
    let (database, log) = common::counting_database().await;
    let (collection, name) = (common::unique("rw"), common::unique("push"));
    let other = MongoDistributedReaderWriterLock::new(name.as_str(), &common::database().await)
        .with_collection(collection.as_str());
    let lock = MongoDistributedReaderWriterLock::new(name.as_str(), &database)
        .with_collection(collection.as_str())
        .with_options(sleepy_options());

    // A writer elsewhere; readers here.
    let writer = other.acquire_write().await.unwrap();
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let lock = lock.clone();
            tokio::spawn(async move { lock.acquire_read_timeout(Duration::from_secs(60)).await })
        })
        .collect();
    common::stream_open(&log, &collection, &name, 3).await;
    writer.release().await.unwrap();
    let mut reads = Vec::new();
    for reader in readers {
        reads.push(
            tokio::time::timeout(Duration::from_secs(10), reader)
                .await
                .expect("woken by the writer's release, not by a poll 20 s later")
                .unwrap()
                .unwrap(),
        );
    }

    // A reader elsewhere; a writer here.
    let read = other.acquire_read().await.unwrap();
    for read in reads {
        read.release().await.unwrap();
    }
    log.clear();
    let writer = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.acquire_write_timeout(Duration::from_secs(60)).await })
    };
    common::stream_open(&log, &collection, &name, 1).await;
    read.release().await.unwrap();
    let write = tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("woken by the last reader's release, not by a poll 20 s later")
        .unwrap()
        .unwrap();
    write.release().await.unwrap();
}

/// A `getMore` of the waiters' change stream that never returns (a half-open connection, which
/// the driver never times out) does not keep the stream counted as healthy: it is given up and
/// the stream opened again from where it stood, so a release made meanwhile is pushed, and a
/// name subscribed meanwhile joins the stream's filter. Fails when the hung stream stays
/// "healthy": both waiters then sleep 60 s between polls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_more_that_never_returns_is_given_up_and_the_stream_opened_again() {
    let proxy = common::proxy::FaultProxy::start(common::proxy::upstream_address().await).await;
    let uri = format!("mongodb://{}/?directConnection=true", proxy.address());
    let (database, log) = common::counting_database_on(&uri, |_| {}).await;
    let collection_name = common::unique("locks");
    let collection = database.collection::<Document>(&collection_name);
    // One family of locks (a provider's): its waiters share one stream.
    let provider = distributed_lock_mongodb::Provider::new(&database)
        .with_collection(collection_name.as_str())
        .with_options(
            LockOptions::builder()
                .expiry(Duration::from_secs(30))
                .busy_wait_sleep_time(Duration::from_secs(60), Duration::from_secs(60))
                .build()
                .unwrap(),
        );
    let (first, second) = (common::unique("push"), common::unique("push"));
    let waiter = |name: &str| {
        let lock = provider.create_lock(name);
        tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(120)).await })
    };
    held_by_another_process(&collection, &first).await;
    held_by_another_process(&collection, &second).await;
    let first_waiter = waiter(&first);
    common::stream_open(&log, &collection_name, &first, 1).await;
    let opened = log.count("aggregate");
    let hung = proxy.add_rule(common::proxy::Rule::new(
        "getMore",
        common::proxy::Action::Hang,
    ));
    assert!(
        common::eventually(Duration::from_secs(10), || async { proxy.hits(hung) == 1 }).await,
        "the stream's next getMore hangs"
    );
    // A waiter for another name joins while the getMore hangs: its name is not in the filter.
    let second_waiter = waiter(&second);
    let queued = common::eventually(Duration::from_secs(20), || async {
        distributed_lock_mongodb::__testing::waiters_idle(
            common::DATABASE,
            &collection_name,
            &second,
        ) == 1
    })
    .await;
    assert!(queued, "{:?}", log.started());
    released_by_the_other_process(&collection, &first).await;
    released_by_the_other_process(&collection, &second).await;
    let released = std::time::Instant::now();
    for waiter in [first_waiter, second_waiter] {
        let guard = tokio::time::timeout(Duration::from_secs(40), waiter)
            .await
            .expect("woken through the stream opened again, not by a poll 60 s later")
            .unwrap()
            .unwrap();
        println!(
            "hung getMore: a waiter acquired {:?} after the release (polls every 60 s)",
            released.elapsed()
        );
        guard.release().await.unwrap();
    }
    assert!(log.count("aggregate") > opened, "{:?}", log.started());
}

/// A process opens a change stream only for a caller that waits: one that acquires free locks,
/// renews and releases them, finds a lock busy with `try_acquire`, or holds a lock another
/// process waits for, never watches the collection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_never_waits_opens_no_change_stream() {
    let (database, log) = common::counting_database().await;
    let other_process = common::database().await;
    let collection_name = common::unique("locks");
    let options = common::options(3_000, 500);
    let ours = |name: &str| {
        MongoDistributedLock::new(name, &database)
            .with_collection(collection_name.as_str())
            .with_options(options.clone())
    };
    let theirs = |name: &str| {
        MongoDistributedLock::new(name, &other_process)
            .with_collection(collection_name.as_str())
            .with_options(options.clone())
    };
    let (wanted, busy) = (common::unique("wanted"), common::unique("busy"));
    let held_by_them = theirs(&busy).acquire().await.unwrap();
    let held = ours(&wanted).acquire().await.unwrap();
    // The other process waits for the lock we hold, watching the collection as it polls.
    let waiter = tokio::spawn({
        let lock = theirs(&wanted);
        async move { lock.acquire_timeout(Duration::from_secs(60)).await }
    });
    for _ in 0..3 {
        assert!(ours(&busy).try_acquire().await.unwrap().is_none());
        ours(&common::unique("free"))
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    held.release().await.unwrap();
    let handed = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the waiter got the lock we released")
        .unwrap()
        .unwrap();
    handed.release().await.unwrap();
    held_by_them.release().await.unwrap();
    let renewals = log.count("findAndModify") + log.count("update");
    // 1 acquisition, 3 tries and 3 acquisitions and releases, 1 release: 11 commands; the rest
    // renewed what we held for about 2 s at a 500 ms cadence.
    assert!(renewals > 11, "no renewal seen: {:?}", log.started());
    assert_eq!(log.count("aggregate"), 0, "{:?}", log.started());
}
