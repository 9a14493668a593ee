//! `min_hold`: a lock released, dropped or lost by its holder's death before `acquiredAt +
//! min_hold` stays taken on the server until then, by the server's clock.

use test_support as common;

use std::time::Duration;

use distributed_lock_mongodb::{
    DocumentLock, Error, LeaderElection, LockOptions, MongoDistributedLock,
    MongoDistributedReaderWriterLock, MongoDistributedSemaphore,
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
