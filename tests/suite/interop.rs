//! Sharing locks with DistributedLock.MongoDB (.NET) and with earlier acquisitions: foreign
//! holders and fencing-token continuity. (Odd stored values: bad_input.rs.)

use test_support as common;

use std::time::Duration;

use mongodb::bson::{DateTime, doc};

#[tokio::test]
async fn a_live_dotnet_holder_blocks_and_an_expired_one_is_taken_over_with_a_larger_token() {
    let (lock, collection) =
        common::fresh_lock_without_ttl("dotnet", common::options(5_000, 1_000)).await;
    // What DistributedLock.MongoDB writes: its token counter starts at 1.
    let now = DateTime::now();
    collection
        .insert_one(doc! {
            "_id": lock.name(),
            "lockId": "dotnet-holder",
            "expiresAt": DateTime::from_millis(now.timestamp_millis() + 1_500),
            "acquiredAt": now,
            "fencingToken": 7_i64,
        })
        .await
        .unwrap();

    assert!(
        lock.try_acquire().await.unwrap().is_none(),
        "a live foreign holder blocks"
    );
    let untouched = common::lock_document(&collection, lock.name())
        .await
        .unwrap();
    assert_eq!(untouched.get_str("lockId").unwrap(), "dotnet-holder");
    assert_eq!(untouched.get_i64("fencingToken").unwrap(), 7);

    let guard = lock.acquire_timeout(Duration::from_secs(10)).await.unwrap();
    assert!(guard.fencing_token().get() > 7);
    let taken = common::lock_document(&collection, lock.name())
        .await
        .unwrap();
    assert_ne!(taken.get_str("lockId").unwrap(), "dotnet-holder");
    guard.release().await.unwrap();
}

#[tokio::test]
async fn release_keeps_the_document_and_tokens_keep_increasing() {
    let (lock, collection) =
        common::fresh_lock_without_ttl("tokens", common::options(5_000, 1_000)).await;
    let mut previous = None;
    for _ in 0..5 {
        let guard = lock.acquire().await.unwrap();
        let token = guard.fencing_token();
        if let Some(previous) = previous {
            assert!(token > previous, "{token} after {previous}");
        }
        previous = Some(token);
        guard.release().await.unwrap();
        let kept = common::lock_document(&collection, lock.name())
            .await
            .expect("kept");
        assert_eq!(kept.get_i64("fencingToken").unwrap(), token.get());
        assert!(kept.get("lockId").is_none());
    }
}

#[tokio::test]
async fn tokens_increase_after_the_document_was_deleted() {
    let (lock, collection) = common::fresh_lock("deleted", common::options(5_000, 1_000)).await;
    let first = lock.acquire().await.unwrap();
    let token = first.fencing_token();
    first.release().await.unwrap();
    // What the TTL monitor does some time after expiry.
    collection.delete_many(doc! {}).await.unwrap();
    let second = lock.acquire().await.unwrap();
    assert!(
        second.fencing_token() > token,
        "{} after {token}",
        second.fencing_token()
    );
    second.release().await.unwrap();
}
