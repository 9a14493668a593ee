//! Weighted and resizable semaphores: `acquire_many(n)` (all or none, one command per attempt,
//! not starved by waiters for fewer places), `available()`, and `set_max_count(n)` (shrinking
//! evicts nobody; every process follows the new count).

use test_support as common;

use std::time::Duration;

use distributed_lock_mongodb::{Error, MongoDistributedSemaphore};
use mongodb::Database;
use mongodb::bson::{Document, doc};

/// A semaphore `name` of `max_count` places in `collection`, waiting briefly between attempts.
fn semaphore(
    database: &Database,
    collection: &str,
    name: &str,
    max_count: u32,
) -> MongoDistributedSemaphore {
    MongoDistributedSemaphore::new(name, max_count, database)
        .with_collection(collection)
        .with_options(common::options(10_000, 3_000))
}

/// Another process's semaphore of the same name (a lock object built apart: no handoff, its
/// own renewal loop).
fn elsewhere(
    semaphore: &MongoDistributedSemaphore,
    database: &Database,
    collection: &str,
    max_count: u32,
) -> MongoDistributedSemaphore {
    self::semaphore(database, collection, semaphore.name(), max_count)
}

/// Whether semaphore `name`'s document carries a waiting mark.
async fn marked(database: &Database, collection: &str, name: &str) -> bool {
    stored(database, collection, name)
        .await
        .is_some_and(|stored| stored.get_document("waiting").is_ok())
}

async fn stored(database: &Database, collection: &str, name: &str) -> Option<Document> {
    database
        .collection::<Document>(collection)
        .find_one(doc! { "_id": name })
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_places_are_taken_at_once_as_one_lease_in_one_command() {
    let (database, log) = common::counting_database().await;
    let collection = common::unique("semaphores");
    let pool = semaphore(&database, &collection, &common::unique("pool"), 4);

    log.clear();
    let three = pool
        .try_acquire_many(3)
        .await
        .unwrap()
        .expect("3 of 4 free");
    assert_eq!(
        log.count("findAndModify"),
        1,
        "one command: {:?}",
        log.started()
    );
    assert_eq!(pool.available().await.unwrap(), 1);
    let holders = pool.holders().await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].places, 3, "{holders:?}");

    log.clear();
    assert!(
        pool.try_acquire_many(2).await.unwrap().is_none(),
        "2 do not fit beside 3 of 4"
    );
    assert_eq!(log.count("findAndModify"), 1, "{:?}", log.started());
    let stored = stored(&database, &collection, pool.name()).await.unwrap();
    assert_eq!(
        stored.get_array("holders").unwrap().len(),
        1,
        "all or none: nothing of the refused attempt is stored: {stored}"
    );
    let one = pool.try_acquire().await.unwrap().expect("the fourth place");
    assert!(one.fencing_token() > three.fencing_token());
    assert_eq!(pool.available().await.unwrap(), 0);
    three.release().await.unwrap();
    assert_eq!(pool.available().await.unwrap(), 3);
    one.release().await.unwrap();
    assert_eq!(pool.available().await.unwrap(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asking_for_no_place_or_more_than_there_are_is_refused_with_nothing_written() {
    let database = common::database().await;
    let collection = common::unique("semaphores");
    let pool = semaphore(&database, &collection, &common::unique("pool"), 4);
    for places in [0, 5] {
        match pool.try_acquire_many(places).await {
            Err(Error::InvalidArgument(message)) => {
                assert!(
                    message.contains(&format!("{places} places of 4")),
                    "{message}"
                );
            }
            other => panic!("{places} places: {other:?}"),
        }
        assert!(matches!(
            pool.acquire_many_timeout(places, Duration::from_secs(1))
                .await,
            Err(Error::InvalidArgument(_))
        ));
    }
    assert!(
        stored(&database, &collection, pool.name()).await.is_none(),
        "nothing written"
    );
    assert_eq!(
        pool.available().await.unwrap(),
        4,
        "nothing stored: the caller's count"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_for_several_places_holds_back_waiters_for_fewer() {
    let database = common::database().await;
    let collection = common::unique("semaphores");
    let pool = semaphore(&database, &collection, &common::unique("pool"), 2);
    let other = elsewhere(&pool, &database, &collection, 2);
    let small = elsewhere(&pool, &database, &collection, 2);

    let first = pool.acquire().await.unwrap();
    let big =
        tokio::spawn(async move { other.acquire_many_timeout(2, Duration::from_secs(60)).await });
    // Its first attempt failed and placed its mark.
    let was_marked = common::eventually(Duration::from_secs(20), || {
        marked(&database, &collection, pool.name())
    })
    .await;
    assert!(was_marked, "the waiter for 2 places marks them");
    assert!(
        small.try_acquire().await.unwrap().is_none(),
        "a place is free, but the waiter for 2 needs it"
    );
    first.release().await.unwrap();
    let both = big.await.unwrap().expect("the waiter for 2 is served");
    let stored_now = stored(&database, &collection, pool.name()).await.unwrap();
    assert!(
        stored_now.get_document("waiting").is_err(),
        "its win removed the mark: {stored_now}"
    );
    assert!(small.try_acquire().await.unwrap().is_none(), "2 of 2 taken");
    both.release().await.unwrap();
    small
        .try_acquire()
        .await
        .unwrap()
        .expect("free again")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_removes_its_mark() {
    let database = common::database().await;
    let collection = common::unique("semaphores");
    let pool = semaphore(&database, &collection, &common::unique("pool"), 2);
    let other = elsewhere(&pool, &database, &collection, 2);
    let first = pool.acquire().await.unwrap();
    assert!(matches!(
        other
            .acquire_many_timeout(2, Duration::from_millis(300))
            .await,
        Err(Error::Timeout { .. })
    ));
    let stored_now = stored(&database, &collection, pool.name()).await.unwrap();
    assert!(
        stored_now.get_document("waiting").is_err(),
        "the mark is gone: {stored_now}"
    );
    other
        .try_acquire()
        .await
        .unwrap()
        .expect("the free place, held back no more")
        .release()
        .await
        .unwrap();
    first.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_waiter_for_several_places_gets_them_once_enough_are_released() {
    let database = common::database().await;
    let collection = common::unique("semaphores");
    let pool = semaphore(&database, &collection, &common::unique("pool"), 2);
    let (a, b) = (pool.acquire().await.unwrap(), pool.acquire().await.unwrap());
    let waiter = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.acquire_many_timeout(2, Duration::from_secs(60)).await })
    };
    assert!(common::offers_become(&collection, pool.name(), 1).await);
    // A release that frees one place cannot hand over two: it releases, and the waiter waits on.
    a.release().await.unwrap();
    assert!(!waiter.is_finished(), "one free place is not enough");
    b.release().await.unwrap();
    let both = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("served")
        .unwrap()
        .unwrap();
    assert_eq!(pool.available().await.unwrap(), 0);
    both.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_count_evicts_nobody_and_every_process_follows_it() {
    let database = common::database().await;
    let collection = common::unique("semaphores");
    let pool = semaphore(&database, &collection, &common::unique("pool"), 2);
    let (a, b) = (pool.acquire().await.unwrap(), pool.acquire().await.unwrap());

    pool.set_max_count(1).await.unwrap();
    assert!(!a.is_lost() && !b.is_lost(), "shrinking evicts nobody");
    let built_with_five = elsewhere(&pool, &database, &collection, 5);
    assert!(
        built_with_five.try_acquire().await.unwrap().is_none(),
        "a caller built with another count follows the set one, and waits"
    );
    assert_eq!(built_with_five.available().await.unwrap(), 0);
    a.release().await.unwrap();
    assert!(
        built_with_five.try_acquire().await.unwrap().is_none(),
        "1 taken of 1"
    );
    b.release().await.unwrap();
    let only = built_with_five
        .try_acquire()
        .await
        .unwrap()
        .expect("1 free of 1");
    assert!(pool.try_acquire().await.unwrap().is_none());
    assert!(matches!(
        pool.try_acquire_many(2).await,
        Err(Error::InvalidArgument(message)) if message.contains("set to 1")
    ));

    pool.set_max_count(3).await.unwrap();
    let two = pool.try_acquire_many(2).await.unwrap().expect("grown to 3");
    assert_eq!(pool.available().await.unwrap(), 0);
    only.release().await.unwrap();
    two.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_count_or_a_document_that_is_no_semaphore_is_refused_with_nothing_written() {
    let database = common::database().await;
    let collection = common::unique("semaphores");
    let pool = semaphore(&database, &collection, &common::unique("pool"), 2);
    assert!(matches!(
        pool.set_max_count(0).await,
        Err(Error::InvalidArgument(message)) if message.contains("at least 1")
    ));
    assert!(stored(&database, &collection, pool.name()).await.is_none());

    let application = doc! { "_id": "orders", "total": 5 };
    database
        .collection::<Document>(&collection)
        .insert_one(application.clone())
        .await
        .unwrap();
    let orders = semaphore(&database, &collection, "orders", 2);
    assert!(matches!(
        orders.set_max_count(3).await,
        Err(Error::InvalidArgument(message)) if message.contains("not a semaphore")
    ));
    assert_eq!(
        stored(&database, &collection, "orders").await,
        Some(application),
        "untouched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_whose_count_is_refused_leaves_no_mark() {
    let database = common::database().await;
    let collection = common::unique("semaphores");
    let pool = semaphore(&database, &collection, &common::unique("pool"), 2);
    let held = pool.acquire().await.unwrap();
    let built_with_three = elsewhere(&pool, &database, &collection, 3);
    assert!(matches!(
        built_with_three.acquire_many_timeout(3, Duration::from_secs(5)).await,
        Err(Error::InvalidArgument(message)) if message.contains("created with max_count 2")
    ));
    assert!(
        !marked(&database, &collection, pool.name()).await,
        "the document is left as it was"
    );
    pool.try_acquire()
        .await
        .unwrap()
        .expect("the free place")
        .release()
        .await
        .unwrap();
    held.release().await.unwrap();
}
