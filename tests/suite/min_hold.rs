//! `min_hold`: a lock released, dropped or lost by its holder's death before `acquiredAt +
//! min_hold` stays taken on the server until then, by the server's clock.

use test_support as common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use distributed_lock_mongodb::{
    DocumentLock, Error, LeaderElection, LockOptions, MongoDistributedLock,
    MongoDistributedReaderWriterLock, MongoDistributedSemaphore, Provider,
};
use mongodb::bson::{DateTime, Document, doc};
use mongodb::{Collection, Database};

fn min_hold_options(expiry_ms: u64, cadence_ms: u64, min_hold_ms: u64) -> LockOptions {
    LockOptions::builder()
        .expiry(Duration::from_millis(expiry_ms))
        .extension_cadence(Duration::from_millis(cadence_ms))
        .busy_wait_sleep_time(Duration::from_millis(5), Duration::from_millis(20))
        .min_hold(Duration::from_millis(min_hold_ms))
        .build()
        .unwrap()
}

/// Another instance's lock of the same name, without a `min_hold`.
fn other_instance(
    database: &Database,
    lock: &MongoDistributedLock,
    collection: &str,
) -> MongoDistributedLock {
    MongoDistributedLock::new(lock.name(), database)
        .with_collection(collection)
        .with_options(common::options(5_000, 1_000))
}

async fn acquired_at(collection: &Collection<Document>, name: &str) -> DateTime {
    *common::lock_document(collection, name)
        .await
        .expect("the lock document")
        .get_datetime("acquiredAt")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_released_before_its_min_hold_stays_taken_until_then_by_the_servers_clock() {
    const MIN_HOLD_MS: i64 = 2_000;
    let (lock, collection) = common::fresh_lock(
        "minhold",
        min_hold_options(5_000, 1_000, MIN_HOLD_MS as u64),
    )
    .await;
    let database = common::database().await;
    let other = other_instance(&database, &lock, collection.name());

    let guard = lock.acquire().await.unwrap();
    let first = acquired_at(&collection, lock.name()).await;
    guard.release().await.unwrap();
    let stored = common::lock_document(&collection, lock.name())
        .await
        .unwrap();
    assert!(!stored.contains_key("lockId"), "released: {stored}");
    assert_eq!(
        stored.get_datetime("expiresAt").unwrap().timestamp_millis(),
        first.timestamp_millis() + MIN_HOLD_MS,
        "taken until acquiredAt + min_hold: {stored}"
    );
    let (now, _) = common::server_now_and_expiry(&collection, lock.name()).await;
    if now.timestamp_millis() < first.timestamp_millis() + MIN_HOLD_MS {
        assert!(
            other.try_acquire().await.unwrap().is_none(),
            "another instance cannot take it before acquiredAt + min_hold"
        );
    }
    let next = other
        .acquire_timeout(Duration::from_secs(30))
        .await
        .expect("free once the minimum hold is over");
    let second = acquired_at(&collection, lock.name()).await;
    let gap = second.timestamp_millis() - first.timestamp_millis();
    println!(
        "min_hold: released at once, the next instance acquired {gap} ms after the first (min_hold {MIN_HOLD_MS} ms)"
    );
    assert!(
        gap >= MIN_HOLD_MS,
        "acquired again {gap} ms after the first"
    );
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_released_after_its_min_hold_is_free_at_once() {
    let (lock, collection) =
        common::fresh_lock("minhold", min_hold_options(5_000, 1_000, 300)).await;
    let other = other_instance(&common::database().await, &lock, collection.name());
    let guard = lock.acquire().await.unwrap();
    let first = acquired_at(&collection, lock.name()).await;
    let past = common::eventually(Duration::from_secs(10), || async {
        let (now, _) = common::server_now_and_expiry(&collection, lock.name()).await;
        now.timestamp_millis() > first.timestamp_millis() + 300
    })
    .await;
    assert!(past, "the server's clock passes acquiredAt + min_hold");
    guard.release().await.unwrap();
    let next = other.try_acquire().await.unwrap();
    next.expect("free at once after the minimum hold")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_killed_before_its_min_hold_keeps_the_lock_taken_until_then() {
    const MIN_HOLD_MS: i64 = 4_000;
    let database = common::database().await;
    let collection_name = common::unique("locks");
    let collection = database.collection::<Document>(&collection_name);
    let name = common::unique("minhold-crash");
    // Expiry 1 s renewed every 200 ms: without the minimum hold, a second after its death.
    let mut child = common::workers::spawn(&[
        "hold",
        &collection_name,
        &name,
        "1000",
        "200",
        &MIN_HOLD_MS.to_string(),
    ]);
    let _output = common::workers::acquired(&mut child).await;
    let first = acquired_at(&collection, &name).await;
    // It renews (renewedAt moves) without shortening the lease below acquiredAt + min_hold.
    let renewed = common::eventually(Duration::from_secs(10), || async {
        let stored = common::lock_document(&collection, &name).await.unwrap();
        stored
            .get_datetime("renewedAt")
            .is_ok_and(|renewed| renewed.timestamp_millis() > first.timestamp_millis())
    })
    .await;
    assert!(renewed, "the worker renews its lease");
    let stored = common::lock_document(&collection, &name).await.unwrap();
    assert_eq!(
        stored.get_datetime("expiresAt").unwrap().timestamp_millis(),
        first.timestamp_millis() + MIN_HOLD_MS,
        "a renewal never shortens the lease: {stored}"
    );

    child.kill().await.unwrap(); // SIGKILL: no release
    let waiter = MongoDistributedLock::new(name.as_str(), &database)
        .with_collection(collection_name.as_str())
        .with_options(common::options(1_000, 200));
    let guard = waiter
        .acquire_timeout(Duration::from_secs(30))
        .await
        .unwrap();
    let second = acquired_at(&collection, &name).await;
    let gap = second.timestamp_millis() - first.timestamp_millis();
    println!(
        "min_hold crash: the dead holder's lock was taken again {gap} ms after its acquisition (min_hold {MIN_HOLD_MS} ms, expiry 1000 ms)"
    );
    assert!(
        gap >= MIN_HOLD_MS,
        "taken again {gap} ms after the first acquisition"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_resigns_keeps_others_out_until_its_min_hold_is_over() {
    const MIN_HOLD_MS: i64 = 1_500;
    let database = common::database().await;
    let collection_name = common::unique("leaders");
    let collection = database.collection::<Document>(&collection_name);
    let name = common::unique("term");
    let candidate = |options: LockOptions| {
        LeaderElection::start(
            MongoDistributedLock::new(name.as_str(), &database)
                .with_collection(collection_name.as_str())
                .with_options(options),
        )
        .unwrap()
    };
    let first = candidate(min_hold_options(5_000, 1_000, MIN_HOLD_MS as u64));
    let elected = common::eventually(Duration::from_secs(10), || async { first.is_leader() }).await;
    assert!(elected, "the first candidate leads");
    let began = acquired_at(&collection, &name).await;
    first.resign().await.unwrap();
    let second = candidate(common::options(5_000, 1_000));
    let elected =
        common::eventually(Duration::from_secs(30), || async { second.is_leader() }).await;
    assert!(
        elected,
        "the second candidate leads once the minimum hold is over"
    );
    let next = acquired_at(&collection, &name).await;
    let gap = next.timestamp_millis() - began.timestamp_millis();
    assert!(
        gap >= MIN_HOLD_MS,
        "the next term began {gap} ms after the first"
    );
    second.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_hold_is_refused_by_the_kinds_it_does_not_apply_to() {
    let database = common::database().await;
    let options = min_hold_options(5_000, 1_000, 1_000);
    let semaphore = MongoDistributedSemaphore::new(common::unique("s"), 2, &database)
        .with_collection(common::unique("semaphores"))
        .with_options(options.clone());
    let rw = MongoDistributedReaderWriterLock::new(common::unique("rw"), &database)
        .with_collection(common::unique("rw"))
        .with_options(options.clone());
    let documents = database.collection::<Document>(&common::unique("jobs"));
    documents.insert_one(doc! { "_id": 1 }).await.unwrap();
    let document_lock = DocumentLock::new(&documents).with_options(options);
    for (kind, error) in [
        (
            "semaphore",
            semaphore.try_acquire().await.map(drop).unwrap_err(),
        ),
        (
            "reader-writer lock",
            rw.try_acquire_read().await.map(drop).unwrap_err(),
        ),
        (
            "reader-writer lock",
            rw.try_acquire_write().await.map(drop).unwrap_err(),
        ),
        (
            "document lock",
            document_lock
                .try_lock(doc! { "_id": 1 })
                .await
                .map(drop)
                .unwrap_err(),
        ),
    ] {
        assert!(
            matches!(&error, Error::InvalidOptions(message) if message.contains("min_hold") && message.contains(kind)),
            "{kind}: {error}"
        );
    }
    // Nothing was written.
    assert_eq!(
        documents.find_one(doc! { "_id": 1 }).await.unwrap(),
        Some(doc! { "_id": 1 })
    );
}

/// A waiter with a `min_hold` handed the lock in a local holder's release command (the holder
/// without one) gets the same lease as its own attempt would write: at least `acquiredAt +
/// min_hold`, not `expiry` (3 s against 60 s), so its death keeps the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_min_hold_waiter_handed_the_lock_in_a_release_keeps_its_min_hold() {
    const MIN_HOLD_MS: i64 = 60_000;
    let (database, log) = common::counting_database().await;
    let collection_name = common::unique("locks");
    let collection = database.collection::<Document>(&collection_name);
    let sleepy = |builder: distributed_lock_mongodb::LockOptionsBuilder| {
        builder
            .busy_wait_sleep_time(Duration::from_secs(20), Duration::from_secs(20))
            .build()
            .unwrap()
    };
    let plain = MongoDistributedLock::new(common::unique("handed"), &database)
        .with_collection(collection_name.as_str())
        .with_options(sleepy(
            LockOptions::builder().expiry(Duration::from_secs(30)),
        ));
    // A clone with other options: the same family of locks, so the release hands over to it.
    let job = plain.clone().with_options(sleepy(
        LockOptions::builder()
            .expiry(Duration::from_secs(3))
            .min_hold(Duration::from_millis(MIN_HOLD_MS as u64)),
    ));
    let guard = plain.acquire().await.unwrap();
    let waiter = tokio::spawn(async move { job.acquire_timeout(Duration::from_secs(60)).await });
    assert!(common::offers_become(&collection_name, plain.name(), 1).await);
    log.clear();
    guard.release().await.unwrap();
    let handed = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("handed over, not found by a poll 20 s later")
        .unwrap()
        .unwrap();
    assert_eq!(log.transfers(), 1, "{:?}", log.started());
    let stored = common::lock_document(&collection, plain.name())
        .await
        .unwrap();
    let acquired = stored
        .get_datetime("acquiredAt")
        .unwrap()
        .timestamp_millis();
    let expires = stored.get_datetime("expiresAt").unwrap().timestamp_millis();
    assert!(
        expires - acquired >= MIN_HOLD_MS,
        "the lease lasts {} ms, not acquiredAt + min_hold: {stored}",
        expires - acquired
    );
    drop(handed);
}

/// A forced release of a running job (as `dlock release` does) ends its holder's lease, but the
/// window is a promise about the work: another instance's run in the same window is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_of_a_running_job_keeps_its_window() {
    let database = common::database().await;
    let collection = common::unique("jobs");
    let instance = |owner: &str| {
        Provider::new(&database)
            .with_collection(collection.as_str())
            .with_options(common::options(5_000, 1_000))
            .with_details(distributed_lock_mongodb::LockDetails::new().with_owner(owner))
    };
    let (first, second) = (instance("first"), instance("second"));
    let name = common::unique("report");
    let job = first.create_job(name.as_str(), Duration::from_secs(60));
    let (running_tx, running) = tokio::sync::oneshot::channel();
    let run = tokio::spawn(async move {
        job.run(async |guard| {
            let _ = running_tx.send(());
            guard.lost().wait().await;
        })
        .await
    });
    running.await.unwrap();
    let holders = first.held_locks().await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert!(first.force_release_holder(&holders[0]).await.unwrap());
    let ended = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the running holder hears that it lost its lease")
        .unwrap();
    assert!(matches!(ended, Err(Error::LockLost { .. })), "{ended:?}");
    let again = second
        .create_job(name.as_str(), Duration::from_secs(60))
        .run(async |_| ())
        .await
        .unwrap();
    assert!(
        !again.ran(),
        "another instance ran the job in the same window"
    );
}

/// A job run cancelled while its attempt is slow to reach the server: the cleanup sent at once
/// overtakes the attempt, which then wins a lease nobody was given. That lease is ended at once
/// (not kept for the window: nobody ran), so another instance runs the job right after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_cancelled_while_its_attempt_is_delayed_leaves_the_window_open() {
    let (proxy, client) = common::proxy::proxied_client().await;
    let database = common::database().await;
    let collection_name = common::unique("jobs");
    let collection = database.collection::<Document>(&collection_name);
    let name = common::unique("report");
    let window = Duration::from_secs(60);
    let cancelled = Provider::new(&client.database(common::DATABASE))
        .with_collection(collection_name.as_str())
        .with_options(common::options(5_000, 1_000))
        .create_job(name.as_str(), window);
    let delayed = proxy.add_rule(
        common::proxy::Rule::new(
            "findAndModify",
            common::proxy::Action::Delay(Duration::from_millis(1_500)),
        )
        .on(&collection_name),
    );
    let ran = Arc::new(AtomicBool::new(false));
    let run = {
        let ran = Arc::clone(&ran);
        cancelled.run(async move |_| ran.store(true, Ordering::SeqCst))
    };
    // The caller stops waiting while the attempt is on its way.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), run)
            .await
            .is_err()
    );
    assert_eq!(proxy.hits(delayed), 1, "the attempt was under way");
    // The attempt reaches the server after the cleanup and wins; its lease is ended.
    let won_and_ended = common::eventually(Duration::from_secs(20), || async {
        common::lock_document(&collection, &name)
            .await
            .is_some_and(|stored| {
                stored.contains_key("acquiredAt") && !stored.contains_key("lockId")
            })
    })
    .await;
    assert!(
        won_and_ended,
        "{:?}",
        common::lock_document(&collection, &name).await
    );
    assert!(!ran.load(Ordering::SeqCst), "the cancelled run never ran");
    let other = Provider::new(&database)
        .with_collection(collection_name.as_str())
        .with_options(common::options(5_000, 1_000))
        .create_job(name.as_str(), window);
    let outcome = other.run(async |_| ()).await.unwrap();
    assert!(
        outcome.ran(),
        "nobody ran the job, yet the window was closed: {outcome:?}"
    );
}

/// A composite that cannot be completed (a member stays busy) releases the members it had
/// acquired: nobody was given them, so an exclusive member's `min_hold` window is not kept.
/// Fails when they are released as a holder's release: the lock stays taken for the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_composite_that_cannot_be_completed_keeps_no_window() {
    use distributed_lock_mongodb::CompositeMember::Exclusive;
    let database = common::database().await;
    let collection = common::unique("locks");
    let provider = Provider::new(&database)
        .with_collection(collection.as_str())
        .with_options(min_hold_options(5_000, 1_000, 60_000));
    let (first, second) = (common::unique("a"), common::unique("b"));
    let busy = MongoDistributedLock::new(second.as_str(), &database)
        .with_collection(collection.as_str())
        .with_options(common::options(5_000, 1_000))
        .acquire()
        .await
        .unwrap();
    let members = [Exclusive(first.as_str()), Exclusive(second.as_str())];
    assert!(provider.try_acquire_all(&members).await.unwrap().is_none());
    let other = MongoDistributedLock::new(first.as_str(), &database)
        .with_collection(collection.as_str())
        .with_options(common::options(5_000, 1_000));
    let again = other
        .acquire_timeout(Duration::from_secs(10))
        .await
        .expect("free again at once, not kept for the 60 s window");
    again.release().await.unwrap();
    busy.release().await.unwrap();
}
