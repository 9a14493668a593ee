//! Several locks acquired together: sorted, all or nothing, deadlock-free.

mod common;

use std::time::Duration;

use distributed_lock_mongodb::{Error, LockOptions, Provider};
use mongodb::bson::doc;

async fn provider(options: LockOptions) -> Provider {
    Provider::new(&common::database().await)
        .with_collection(common::unique("composite").as_str())
        .with_options(options)
}

#[tokio::test]
async fn members_are_held_together_and_released_together() {
    let provider = provider(common::options(5_000, 1_000)).await;
    let guard = provider
        .acquire_all(&["c", "a", "b"], Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(guard.names().collect::<Vec<_>>(), ["a", "b", "c"]);
    assert_eq!(guard.fencing_tokens().count(), 3);
    for name in ["a", "b", "c"] {
        assert!(
            provider
                .create_lock(name)
                .try_acquire()
                .await
                .unwrap()
                .is_none(),
            "{name} held"
        );
    }
    assert!(!guard.is_lost());
    let lost = guard.lost();
    guard.release().await.unwrap();
    assert!(!lost.is_lost(), "a released composite is not lost");
    assert!(
        tokio::time::timeout(Duration::from_millis(100), lost.wait())
            .await
            .is_err(),
        "the signal never fires after a release"
    );
    for name in ["a", "b", "c"] {
        provider
            .create_lock(name)
            .try_acquire()
            .await
            .unwrap()
            .expect("released")
            .release()
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn acquisition_is_all_or_nothing() {
    let provider = provider(common::options(5_000, 1_000)).await;
    let blocker = provider.create_lock("m").acquire().await.unwrap();
    let error = provider
        .acquire_all(&["z", "m", "a"], Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(error.is_timeout(), "{error}");
    // "a" was acquired before "m" timed out, and released again at once.
    let a = provider
        .create_lock("a")
        .acquire_timeout(Duration::from_secs(1))
        .await
        .unwrap();
    assert!(
        provider
            .create_lock("z")
            .try_acquire()
            .await
            .unwrap()
            .is_some(),
        "z never taken"
    );
    a.release().await.unwrap();
    blocker.release().await.unwrap();
}

#[tokio::test]
async fn losing_any_member_signals_lost() {
    let database = common::database().await;
    let collection = common::unique("composite");
    let provider = Provider::new(&database)
        .with_collection(collection.as_str())
        .with_options(common::options(3_000, 300));
    let guard = provider
        .acquire_all(&["x", "y"], Duration::from_secs(5))
        .await
        .unwrap();
    database
        .collection::<mongodb::bson::Document>(&collection)
        .delete_one(doc! { "_id": "y" })
        .await
        .unwrap();
    let lost = guard.lost();
    tokio::time::timeout(Duration::from_secs(3), lost.wait())
        .await
        .expect("lost when a member is lost");
    assert!(guard.is_lost());
    assert!(guard.release().await.unwrap_err().is_lock_lost());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_sets_in_random_orders_never_deadlock() {
    let options = LockOptions::builder()
        .busy_wait_sleep_time(Duration::from_millis(1), Duration::from_millis(20))
        .build()
        .unwrap();
    let provider = provider(options).await;
    let sets: [&[&str]; 8] = [
        &["a", "b", "c"],
        &["c", "b", "a"],
        &["b", "d"],
        &["d", "a"],
        &["c", "d", "e"],
        &["e", "a"],
        &["b", "e", "c"],
        &["d", "c", "b", "a"],
    ];
    let tasks: Vec<_> = sets
        .into_iter()
        .map(|set| {
            let provider = provider.clone();
            tokio::spawn(async move {
                for _ in 0..5 {
                    let guard = provider
                        .acquire_all(set, Duration::from_secs(60))
                        .await
                        .unwrap();
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(tasks))
        .await
        .expect("no deadlock")
        .into_iter()
        .for_each(|task| task.unwrap());
}

#[tokio::test]
async fn empty_and_duplicate_name_sets_are_rejected() {
    let provider = provider(common::options(5_000, 1_000)).await;
    for names in [&[][..], &["a", "b", "a"][..]] {
        let error = provider
            .acquire_all(names, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(
            matches!(error, Error::InvalidArgument(_)),
            "{names:?}: {error}"
        );
    }
    assert!(
        provider.held_locks().await.unwrap().is_empty(),
        "nothing acquired"
    );
}
