//! The lease: renewal keeps a lock held, loss is signalled, release and drop end it.

use test_support as common;

use std::time::{Duration, Instant};

use distributed_lock_mongodb::Error;
use mongodb::bson::doc;

#[tokio::test]
async fn renewal_keeps_a_one_second_lock_held_for_five_seconds() {
    let (lock, collection) = common::fresh_lock("renew", common::options(1_000, 300)).await;
    let guard = lock.acquire().await.unwrap();
    let first_expiry = *common::lock_document(&collection, lock.name())
        .await
        .unwrap()
        .get_datetime("expiresAt")
        .unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        assert!(lock.try_acquire().await.unwrap().is_none(), "still held");
        assert!(!guard.is_lost());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let later_expiry = *common::lock_document(&collection, lock.name())
        .await
        .unwrap()
        .get_datetime("expiresAt")
        .unwrap();
    assert!(later_expiry.timestamp_millis() >= first_expiry.timestamp_millis() + 4_000);
    guard.release().await.unwrap();
}

#[tokio::test]
async fn deleting_the_document_is_noticed_within_two_cadences() {
    let (lock, collection) = common::fresh_lock("deleted", common::options(3_000, 500)).await;
    let guard = lock.acquire().await.unwrap();
    let lost = guard.lost();
    assert!(!lost.is_lost());
    collection
        .delete_one(doc! { "_id": lock.name() })
        .await
        .unwrap();
    let deleted = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), lost.wait())
        .await
        .expect("lost is signalled");
    let noticed = deleted.elapsed();
    assert!(
        noticed <= Duration::from_millis(1_000),
        "noticed after {noticed:?}"
    );
    assert!(guard.is_lost());
    let error = guard.release().await.unwrap_err();
    assert!(error.is_lock_lost(), "{error}");
}

#[tokio::test]
async fn a_lock_taken_over_is_lost_and_release_leaves_the_new_holder_alone() {
    let (lock, collection) =
        common::fresh_lock_without_ttl("taken", common::options(3_000, 300)).await;
    let guard = lock.acquire().await.unwrap();
    // Another client takes the lock over (as an operator or a buggy writer might).
    collection
        .update_one(
            doc! { "_id": lock.name() },
            doc! { "$set": { "lockId": "intruder" } },
        )
        .await
        .unwrap();
    let lost = guard.lost();
    tokio::time::timeout(Duration::from_secs(3), lost.wait())
        .await
        .expect("lost is signalled");
    assert!(matches!(guard.release().await, Err(Error::LockLost { .. })));
    let stored = common::lock_document(&collection, lock.name())
        .await
        .unwrap();
    assert_eq!(stored.get_str("lockId").unwrap(), "intruder");
    assert!(
        stored.get_datetime("expiresAt").unwrap().timestamp_millis()
            > mongodb::bson::DateTime::now().timestamp_millis()
    );
}

#[tokio::test]
async fn the_lost_signal_stays_false_after_release_even_past_the_deadline() {
    let (lock, _) = common::fresh_lock("closes", common::options(600, 200)).await;
    let guard = lock.acquire().await.unwrap();
    let lost = guard.lost();
    guard.release().await.unwrap();
    // Past the lease's local deadline (600 ms − margin − skew): nobody renews it any more, but
    // it was released, not lost.
    assert!(
        tokio::time::timeout(Duration::from_millis(800), lost.wait())
            .await
            .is_err(),
        "the signal of a released guard never fires"
    );
    assert!(!lost.is_lost(), "the lock was not lost");
}

#[tokio::test]
async fn dropping_the_guard_releases_promptly() {
    let (lock, _) = common::fresh_lock("drop", common::options(30_000, 10_000)).await;
    let guard = lock.acquire().await.unwrap();
    let lost = guard.lost();
    let dropped = Instant::now();
    drop(guard);
    let reacquired = lock.acquire_timeout(Duration::from_secs(5)).await.unwrap();
    assert!(
        dropped.elapsed() < Duration::from_secs(2),
        "{:?}",
        dropped.elapsed()
    );
    assert!(
        !lost.is_lost(),
        "a dropped guard's lock was released, not lost"
    );
    reacquired.release().await.unwrap();
}

#[tokio::test]
async fn dropping_a_guard_off_its_runtime_still_releases() {
    let (lock, _) = common::fresh_lock("offruntime", common::options(30_000, 10_000)).await;
    let guard = lock.acquire().await.unwrap();
    // Dropped on a plain thread with no runtime: the lease task on this test's runtime releases.
    std::thread::spawn(move || drop(guard)).join().unwrap();
    let reacquired = lock.acquire_timeout(Duration::from_secs(5)).await.unwrap();
    reacquired.release().await.unwrap();
}
