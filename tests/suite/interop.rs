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

/// Every acquisition writes its own holder's details, or removes the last holder's: a plain
/// lock taken after a holder with details is not listed, filtered or named as that holder's
/// (an operator freeing "what batch-7 holds" would free a healthy holder), its document has
/// DistributedLock.MongoDB's fields only, and the same holds when the lock is handed over in a
/// release command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_holder_never_shows_the_previous_holders_details() {
    use distributed_lock_mongodb::{LockDetails, LockFilter, MongoDistributedLock, Provider};
    let database = common::database().await;
    let collection_name = common::unique("locks");
    let collection = database.collection::<mongodb::bson::Document>(&collection_name);
    let name = common::unique("details");
    let sleepy = distributed_lock_mongodb::LockOptions::builder()
        .expiry(Duration::from_secs(30))
        .busy_wait_sleep_time(Duration::from_secs(20), Duration::from_secs(20))
        .build()
        .unwrap();
    let batch = MongoDistributedLock::new(name.as_str(), &database)
        .with_collection(collection_name.as_str())
        .with_options(sleepy.clone())
        .with_details(LockDetails::new().with_owner("batch-7"));
    let plain = MongoDistributedLock::new(name.as_str(), &database)
        .with_collection(collection_name.as_str())
        .with_options(sleepy);
    let provider = Provider::new(&database).with_collection(collection_name.as_str());
    // In any order: a release removes `lockId`, the next acquisition adds it back at the end.
    let dotnet_fields = ["_id", "acquiredAt", "expiresAt", "fencingToken", "lockId"];
    let fields = |stored: &mongodb::bson::Document| -> Vec<String> {
        let mut fields: Vec<String> = stored.keys().cloned().collect();
        fields.sort();
        fields
    };

    // An attempt after a release.
    batch.acquire().await.unwrap().release().await.unwrap();
    let guard = plain.acquire().await.unwrap();
    let stored = common::lock_document(&collection, &name).await.unwrap();
    assert_eq!(fields(&stored), dotnet_fields, "{stored}");
    let status = plain.status().await.unwrap().unwrap();
    assert_eq!((status.details, status.renewed_at), (None, None));
    let batch_7 = LockFilter::new().with_owner("batch-7");
    assert!(
        provider
            .held_locks_matching(&batch_7)
            .await
            .unwrap()
            .is_empty(),
        "a healthy holder listed as batch-7's"
    );
    guard.release().await.unwrap();

    // A takeover in a release command: the holder with details, the waiter without, in one
    // family (a clone with details shares the plain lock's family), so the release hands over.
    let holder = plain
        .clone()
        .with_details(LockDetails::new().with_owner("batch-7"))
        .acquire()
        .await
        .unwrap();
    let waiter = {
        let plain = plain.clone();
        tokio::spawn(async move { plain.acquire_timeout(Duration::from_secs(60)).await })
    };
    assert!(common::offers_become(&collection_name, &name, 1).await);
    holder.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("handed over")
        .unwrap()
        .unwrap();
    let stored = common::lock_document(&collection, &name).await.unwrap();
    assert_eq!(fields(&stored), dotnet_fields, "{stored}");
    next.release().await.unwrap();
}
