//! Acquire, try and timeout semantics of the exclusive lock.

use test_support as common;

use std::time::{Duration, Instant};

use distributed_lock_mongodb::{Error, LockOptions, MongoDistributedLock, Provider};
use mongodb::bson::{Bson, DateTime};

/// Asserts that a held lock's document has exactly DistributedLock.MongoDB's fields.
fn assert_dotnet_fields(held: &mongodb::bson::Document) {
    let mut fields: Vec<&str> = held.keys().map(String::as_str).collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        ["_id", "acquiredAt", "expiresAt", "fencingToken", "lockId"],
        "{held}"
    );
}

#[tokio::test]
async fn acquire_writes_the_dotnet_document_and_release_ends_the_lease() {
    let (lock, collection) =
        common::fresh_lock_without_ttl("doc", common::options(10_000, 3_000)).await;
    let guard = lock.acquire().await.unwrap();
    assert_eq!(guard.name(), lock.name());
    assert!(!guard.is_lost());

    let held = common::lock_document(&collection, lock.name())
        .await
        .unwrap();
    assert_dotnet_fields(&held);
    assert!(matches!(held.get("lockId"), Some(Bson::String(_))));
    assert!(matches!(held.get("fencingToken"), Some(Bson::Int64(_))));
    let acquired_at = held.get_datetime("acquiredAt").unwrap().timestamp_millis();
    let expires_at = held.get_datetime("expiresAt").unwrap().timestamp_millis();
    assert_eq!(
        expires_at - acquired_at,
        10_000,
        "expiresAt = $$NOW + expiry"
    );
    assert_eq!(
        held.get_i64("fencingToken").unwrap(),
        guard.fencing_token().get()
    );

    guard.release().await.unwrap();
    let released = common::lock_document(&collection, lock.name())
        .await
        .unwrap();
    assert!(released.get("lockId").is_none(), "{released}");
    assert!(released.get_datetime("expiresAt").unwrap() <= &DateTime::now());
}

/// A renewal of a lock without details or `min_hold` keeps DistributedLock.MongoDB's document
/// exactly: it moves `expiresAt` and adds nothing (`renewedAt` is written only beside details).
#[tokio::test]
async fn a_renewal_keeps_the_dotnet_document_exactly() {
    let (lock, collection) =
        common::fresh_lock_without_ttl("renewed-doc", common::options(1_000, 200)).await;
    let guard = lock.acquire().await.unwrap();
    let expires_at =
        |held: &mongodb::bson::Document| held.get_datetime("expiresAt").unwrap().timestamp_millis();
    let acquired = common::lock_document(&collection, lock.name())
        .await
        .unwrap();
    let renewed = common::eventually(Duration::from_secs(10), || async {
        let held = common::lock_document(&collection, lock.name())
            .await
            .unwrap();
        expires_at(&held) > expires_at(&acquired)
    })
    .await;
    assert!(renewed, "the holder renews its lease");
    let held = common::lock_document(&collection, lock.name())
        .await
        .unwrap();
    assert_dotnet_fields(&held);
    assert_eq!(lock.status().await.unwrap().unwrap().renewed_at, None);
    guard.release().await.unwrap();
}

#[tokio::test]
async fn try_acquire_fails_at_once_while_held() {
    let (lock, _) = common::fresh_lock("try", common::options(10_000, 3_000)).await;
    let guard = lock
        .try_acquire()
        .await
        .unwrap()
        .expect("free lock is acquired");
    let other = lock.clone();
    let started = Instant::now();
    assert!(other.try_acquire().await.unwrap().is_none());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "one attempt, no waiting"
    );
    guard.release().await.unwrap();
    let again = other
        .try_acquire()
        .await
        .unwrap()
        .expect("released lock is free");
    again.release().await.unwrap();
}

#[tokio::test]
async fn timeouts_wait_about_as_long_as_asked() {
    let (lock, _) = common::fresh_lock("timeout", common::options(10_000, 3_000)).await;
    let guard = lock.acquire().await.unwrap();

    let started = Instant::now();
    assert!(
        lock.try_acquire_timeout(Duration::from_millis(300))
            .await
            .unwrap()
            .is_none()
    );
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    assert!(waited < Duration::from_secs(3), "{waited:?}");

    let started = Instant::now();
    let error = lock
        .acquire_timeout(Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(error.is_timeout(), "{error}");
    match error {
        Error::Timeout { name, waited, .. } => {
            assert_eq!(name, lock.name());
            assert!(waited >= Duration::from_millis(200), "{waited:?}");
        }
        other => panic!("{other}"),
    }
    assert!(started.elapsed() < Duration::from_secs(3));

    // Zero and Duration::MAX timeouts: bad_input.rs.
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_waiter_gets_the_lock_soon_after_release() {
    let options = LockOptions::builder()
        .busy_wait_sleep_time(Duration::from_millis(10), Duration::from_millis(50))
        .build()
        .unwrap();
    let (lock, _) = common::fresh_lock("handoff", options).await;
    let guard = lock.acquire().await.unwrap();
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move {
            let guard = lock.acquire_timeout(Duration::from_secs(10)).await?;
            let acquired = Instant::now();
            guard.release().await?;
            Ok::<_, Error>(acquired)
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter must wait while the lock is held"
    );
    let released = Instant::now();
    guard.release().await.unwrap();
    let acquired = waiter.await.unwrap().unwrap();
    let gap = acquired.duration_since(released);
    assert!(gap < Duration::from_secs(1), "waited {gap:?} after release");
}

#[tokio::test]
async fn names_are_verbatim_and_case_sensitive() {
    let database = common::database().await;
    let collection = common::unique("locks");
    let lock = |name: &str| {
        MongoDistributedLock::new(name, &database).with_collection(collection.as_str())
    };
    let lower = lock("job").acquire().await.unwrap();
    let upper = lock("JOB")
        .try_acquire()
        .await
        .unwrap()
        .expect("different name");
    let empty = lock("")
        .try_acquire()
        .await
        .unwrap()
        .expect("empty name is a name");
    let odd = lock("a.b$c ✓")
        .try_acquire()
        .await
        .unwrap()
        .expect("any string");
    assert!(lock("job").try_acquire().await.unwrap().is_none());
    for guard in [lower, upper, empty, odd] {
        guard.release().await.unwrap();
    }
}

#[tokio::test]
async fn provider_locks_share_collection_and_options() {
    let database = common::database().await;
    let collection = common::unique("provided");
    let options = common::options(5_000, 1_000);
    let provider = Provider::new(&database)
        .with_collection(collection.as_str())
        .with_options(options.clone());
    let name = common::unique("p");
    let first = provider.create_lock(name.as_str());
    assert_eq!(first.name(), name);
    assert_eq!(first.options().expiry(), Duration::from_secs(5));
    let guard = first.acquire().await.unwrap();
    // Same name from the provider and directly on the same collection: one lock.
    assert!(
        provider
            .create_lock(name.as_str())
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    let direct =
        MongoDistributedLock::new(name.as_str(), &database).with_collection(collection.as_str());
    assert!(direct.try_acquire().await.unwrap().is_none());
    let stored = common::lock_document(&database.collection(&collection), &name).await;
    assert!(stored.is_some(), "the provider's collection holds the lock");
    guard.release().await.unwrap();
}

/// The renewal loop ends when the last lock and guard of its family are gone; the release the
/// dropped guard asked for must still go out (a lease of 30 s would otherwise block the name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_with_the_last_lock_of_its_family_is_still_released() {
    let (lock, collection) =
        common::fresh_lock("dropped-together", common::options(30_000, 10_000)).await;
    let guard = lock.acquire().await.unwrap();
    let name = lock.name().to_owned();
    drop(lock);
    drop(guard);
    let other =
        distributed_lock_mongodb::MongoDistributedLock::new(name, &common::database().await)
            .with_collection(collection.name())
            .with_options(common::options(30_000, 10_000));
    let again = other.acquire_timeout(Duration::from_secs(10)).await;
    assert!(again.is_ok(), "released at once: {again:?}");
}
