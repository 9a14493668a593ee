//! Watching a lock without holding it: holders kept up to date by push, or by polling.

use test_support as common;

use std::time::Duration;

use distributed_lock_mongodb::{
    DocumentLock, Error, LeaderElection, LockDetails, LockKind, LockWatch, MongoDistributedLock,
    MongoDistributedReaderWriterLock, MongoDistributedSemaphore,
};
use mongodb::bson::{Document, doc};

/// Waits (10 s at most) for the watched holders to change.
async fn next_change(watch: &mut LockWatch) {
    tokio::time::timeout(Duration::from_secs(10), watch.changed())
        .await
        .expect("the watch saw the change")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_sees_an_exclusive_lock_taken_and_freed_at_once_by_push() {
    let database = common::database().await;
    let collection = common::unique("locks");
    let name = common::unique("watched");
    let observer =
        MongoDistributedLock::new(name.as_str(), &database).with_collection(collection.as_str());
    // Reads every 60 s: anything sooner came through the change stream.
    let mut watch = observer.watch(Duration::from_secs(60)).await.unwrap();
    assert!(!watch.is_held());
    let holder = MongoDistributedLock::new(name.as_str(), &common::database().await)
        .with_collection(collection.as_str())
        .with_details(LockDetails::new().with_owner("report-runner"));
    let guard = holder.acquire().await.unwrap();
    next_change(&mut watch).await;
    let holders = watch.holders();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0].kind, LockKind::Exclusive);
    assert_eq!(holders[0].owner(), Some("report-runner"));
    assert_eq!(holders[0].fencing_token, Some(guard.fencing_token()));
    assert!(holders[0].remaining.is_some(), "{holders:?}");
    guard.release().await.unwrap();
    next_change(&mut watch).await;
    assert!(!watch.is_held(), "{:?}", watch.holders());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_change_streams_a_watch_polls_at_its_cadence() {
    let server = common::server::start_dedicated_with(&["--no-change-streams".to_owned()]);
    let database = common::database_on(&server.uri).await;
    let semaphore = MongoDistributedSemaphore::new(common::unique("watched"), 2, &database)
        .with_collection(common::unique("semaphores"));
    let mut watch = semaphore.watch(Duration::from_millis(100)).await.unwrap();
    let first = semaphore.acquire().await.unwrap();
    next_change(&mut watch).await;
    let second = semaphore.acquire().await.unwrap();
    next_change(&mut watch).await;
    let holders = watch.holders();
    assert_eq!(holders.len(), 2, "{holders:?}");
    assert!(
        holders
            .iter()
            .all(|holder| holder.kind == LockKind::Semaphore)
    );
    first.release().await.unwrap();
    second.release().await.unwrap();
    let freed = common::eventually(Duration::from_secs(10), || async { !watch.is_held() }).await;
    assert!(freed, "{:?}", watch.holders());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_of_a_reader_writer_lock_and_of_a_document_show_their_holders() {
    let database = common::database().await;
    let rw = MongoDistributedReaderWriterLock::new(common::unique("watched"), &database)
        .with_collection(common::unique("rw"));
    let mut watch = rw.watch(Duration::from_millis(200)).await.unwrap();
    let writer = rw.acquire_write().await.unwrap();
    next_change(&mut watch).await;
    let holders = watch.holders();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0].kind, LockKind::Write);
    assert_eq!(holders[0].fencing_token, Some(writer.fencing_token()));
    writer.release().await.unwrap();

    let documents = database.collection::<Document>(&common::unique("orders"));
    documents.insert_one(doc! { "_id": 1 }).await.unwrap();
    let locks = DocumentLock::new(&documents);
    let mut watch = locks
        .watch(doc! { "_id": 1 }, Duration::from_millis(100))
        .await
        .unwrap();
    assert!(!watch.is_held());
    let guard = locks.lock(doc! { "_id": 1 }).await.unwrap();
    next_change(&mut watch).await;
    assert_eq!(watch.holders()[0].kind, LockKind::Document);
    guard.release().await.unwrap();
    next_change(&mut watch).await;
    assert!(!watch.is_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn who_leads_is_watched_without_campaigning() {
    let database = common::database().await;
    let collection = common::unique("leaders");
    let lock = MongoDistributedLock::new(common::unique("term"), &database)
        .with_collection(collection.as_str())
        .with_options(common::options(2_000, 500));
    let mut leader = LeaderElection::watch_leader(&lock, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(!leader.is_held(), "nobody campaigns yet");
    let candidate = LeaderElection::start(lock.clone()).unwrap();
    next_change(&mut leader).await;
    let elected =
        common::eventually(Duration::from_secs(10), || async { candidate.is_leader() }).await;
    assert!(elected);
    assert_eq!(leader.holders()[0].fencing_token, candidate.fencing_token());
    candidate.resign().await.unwrap();
    next_change(&mut leader).await;
    assert!(!leader.is_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_needs_a_cadence_and_a_usable_lock() {
    let database = common::database().await;
    let lock = MongoDistributedLock::new(common::unique("w"), &database);
    let error = lock.watch(Duration::ZERO).await.unwrap_err();
    assert!(
        matches!(&error, Error::InvalidArgument(message) if message.contains("cadence")),
        "{error}"
    );
    let bad = MongoDistributedLock::new("w", &database).with_collection("bad$name");
    let error = bad.watch(Duration::from_secs(1)).await.unwrap_err();
    assert!(
        matches!(error, Error::InvalidCollectionName { .. }),
        "{error}"
    );
}

/// A job's lock kept taken by its `min_hold` window after the run (no holder, `expiresAt`
/// ahead) is not shown as free: the watch holds one entry without a lock id, kept for the rest
/// of the window. Fails when such a lock reads as free (`is_free`, no entry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_kept_by_a_min_hold_window_is_watched_as_kept_not_free() {
    let database = common::database().await;
    let provider = distributed_lock_mongodb::Provider::new(&database)
        .with_collection(common::unique("jobs"))
        .with_options(common::options(5_000, 1_000));
    let job = provider.create_job(common::unique("hourly"), Duration::from_secs(3_600));
    assert!(job.run(async |_| ()).await.unwrap().ran());
    let watch = job
        .lock()
        .unwrap()
        .watch(Duration::from_secs(1))
        .await
        .unwrap();
    assert!(!watch.is_held(), "nobody holds it");
    assert!(!watch.is_free(), "but it cannot be taken");
    let kept = watch.holders();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0].lock_id, None);
    assert!(
        kept[0]
            .kept
            .is_some_and(|kept| kept > Duration::from_secs(3_000)),
        "{kept:?}"
    );
    assert_eq!(kept[0].min_hold_until, kept[0].expires_at);
}
