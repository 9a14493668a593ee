//! Several locks acquired together: sorted, all or nothing, deadlock-free.

use test_support as common;

use std::time::Duration;

use distributed_lock_mongodb::CompositeMember::{Exclusive, Read, Semaphore, Write};
use distributed_lock_mongodb::{Error, LockKind, LockOptions, Provider};
use mongodb::bson::doc;

/// A provider whose collections of every kind are its own.
async fn provider(options: LockOptions) -> Provider {
    let (provider, _) = common::provider_with_own_collections(&common::database().await);
    provider.with_options(options)
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
    acquire_each_set_five_times(&provider, sets.into_iter()).await;
}

/// One task per set acquires it five times, all at once; fails if they deadlock.
async fn acquire_each_set_five_times<S, M>(provider: &Provider, sets: impl Iterator<Item = S>)
where
    S: AsRef<[M]> + Send + 'static,
    M: Clone + Into<distributed_lock_mongodb::CompositeMember<'static>> + Send + Sync,
{
    let tasks: Vec<_> = sets
        .map(|set| {
            let provider = provider.clone();
            tokio::spawn(async move {
                for _ in 0..5 {
                    let guard = provider
                        .acquire_all(set.as_ref(), Duration::from_secs(60))
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

#[tokio::test]
async fn a_mix_of_kinds_is_held_together_in_one_global_order() {
    let database = common::database().await;
    // Collection names that sort semaphores first, then exclusive locks, then reader-writer
    // locks: the order is by collection, then by name, whatever the kinds.
    let prefix = common::unique("mix");
    let provider = Provider::new(&database)
        .with_collection(format!("{prefix}_b"))
        .with_reader_writer_collection(format!("{prefix}_c"))
        .with_semaphore_collection(format!("{prefix}_a"))
        .with_options(common::options(5_000, 1_000));
    let members = [
        Write("ledger"),
        Exclusive("order"),
        Semaphore {
            name: "exports",
            max_count: 2,
        },
        Read("prices"),
        Exclusive("account"),
    ];
    let guard = provider
        .acquire_all(&members, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(
        guard.members().collect::<Vec<_>>(),
        [
            (LockKind::Semaphore, "exports"),
            (LockKind::Exclusive, "account"),
            (LockKind::Exclusive, "order"),
            (LockKind::Write, "ledger"),
            (LockKind::Read, "prices"),
        ]
    );
    let tokens: Vec<&str> = guard.fencing_tokens().map(|(name, _)| name).collect();
    assert_eq!(
        tokens,
        ["exports", "account", "order", "ledger"],
        "readers have no token"
    );

    // Each member is held as its kind says.
    let busy = |held: bool, what: &str| assert!(!held, "{what} is held by the composite");
    busy(
        provider
            .create_lock("order")
            .try_acquire()
            .await
            .unwrap()
            .is_some(),
        "order",
    );
    let ledger = provider.create_reader_writer_lock("ledger");
    busy(
        ledger.try_acquire_read().await.unwrap().is_some(),
        "ledger (write)",
    );
    let prices = provider.create_reader_writer_lock("prices");
    busy(
        prices.try_acquire_write().await.unwrap().is_some(),
        "prices (read)",
    );
    let other_reader = prices
        .try_acquire_read()
        .await
        .unwrap()
        .expect("readers share");
    let exports = provider.create_semaphore("exports", 2);
    let last_place = exports
        .try_acquire()
        .await
        .unwrap()
        .expect("one place is left");
    busy(
        exports.try_acquire().await.unwrap().is_some(),
        "exports (full)",
    );
    other_reader.release().await.unwrap();
    last_place.release().await.unwrap();

    guard.release().await.unwrap();
    assert!(provider.held_locks().await.unwrap().is_empty());
    let again = provider.try_acquire_all(&members).await.unwrap();
    again
        .expect("everything is free again")
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_busy_member_of_any_kind_leaves_nothing_held() {
    let provider = provider(common::options(5_000, 1_000)).await;
    let members = [
        Exclusive("a"),
        Read("r"),
        Semaphore {
            name: "s",
            max_count: 1,
        },
    ];
    let place = provider.create_semaphore("s", 1).acquire().await.unwrap();

    assert!(provider.try_acquire_all(&members).await.unwrap().is_none());
    let error = provider
        .acquire_all(&members, Duration::from_millis(300))
        .await
        .unwrap_err();
    match &error {
        Error::Timeout { name, .. } => assert_eq!(name, "s", "the busy member is named"),
        other => panic!("expected a timeout, got {other}"),
    }
    // What was acquired before the busy member is released (in the background, at once).
    let a = provider.create_lock("a");
    let a = a.acquire_timeout(Duration::from_secs(1)).await.unwrap();
    a.release().await.unwrap();
    let writer = provider.create_reader_writer_lock("r");
    let writer = writer.acquire_write_timeout(Duration::from_secs(1)).await;
    writer.unwrap().release().await.unwrap();

    place.release().await.unwrap();
    let all = provider
        .try_acquire_all(&members)
        .await
        .unwrap()
        .expect("free");
    all.release().await.unwrap();
}

#[tokio::test]
async fn a_lock_given_twice_across_kinds_is_rejected_but_same_names_of_other_kinds_are_not() {
    let provider = provider(common::options(5_000, 1_000)).await;
    let twice = [Read("x"), Write("x")];
    let error = provider.try_acquire_all(&twice).await.unwrap_err();
    assert!(matches!(error, Error::InvalidArgument(_)), "{error}");
    // Different kinds live in different collections: these are three different locks.
    let three = [
        Exclusive("x"),
        Read("x"),
        Semaphore {
            name: "x",
            max_count: 1,
        },
    ];
    let guard = provider
        .try_acquire_all(&three)
        .await
        .unwrap()
        .expect("free");
    assert_eq!(guard.names().count(), 3);
    guard.release().await.unwrap();
}

#[tokio::test]
async fn losing_a_reader_member_signals_lost() {
    let database = common::database().await;
    let rw_collection = common::unique("composite_rw");
    let provider = Provider::new(&database)
        .with_collection(common::unique("composite").as_str())
        .with_reader_writer_collection(rw_collection.as_str())
        .with_options(common::options(3_000, 300));
    let guard = provider
        .acquire_all(&[Exclusive("x"), Read("r")], Duration::from_secs(5))
        .await
        .unwrap();
    database
        .collection::<mongodb::bson::Document>(&rw_collection)
        .delete_one(doc! { "_id": "r" })
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(3), guard.lost().wait())
        .await
        .expect("lost when the reader is lost");
    assert!(guard.release().await.unwrap_err().is_lock_lost());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_mixed_sets_never_deadlock() {
    let options = LockOptions::builder()
        .busy_wait_sleep_time(Duration::from_millis(1), Duration::from_millis(20))
        .build()
        .unwrap();
    let provider = provider(options).await;
    let mutex = |name| Semaphore { name, max_count: 1 };
    let sets = [
        vec![Exclusive("a"), Write("w"), mutex("s")],
        vec![mutex("s"), Read("w"), Exclusive("a")],
        vec![Write("w"), Exclusive("b")],
        vec![Exclusive("b"), mutex("s")],
        vec![Read("w"), Exclusive("b"), Exclusive("a")],
        vec![mutex("s"), Write("v"), Read("w")],
    ];
    acquire_each_set_five_times(&provider, sets.into_iter()).await;
}
