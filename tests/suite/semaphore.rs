//! Semaphores: at most `max_count` holders, each with its own lease.

use test_support as common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use distributed_lock_mongodb::{
    Error, LockDetails, LockKind, LockOptions, MongoDistributedSemaphore, Provider,
};
use mongodb::bson::{Document, doc};

/// Waiters behind the first poll at most every 100 ms: sixteen of them polling every 20 ms would
/// saturate the single-threaded embedded server and slow every holder's commands.
fn contention_options() -> LockOptions {
    LockOptions::builder()
        .busy_wait_sleep_time(Duration::from_millis(1), Duration::from_millis(100))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_contenders_never_exceed_max_count() {
    const CONTENDERS: usize = 16;
    const ROUNDS: usize = 50;
    // Sixteen busy contenders get a server of their own, away from this file's other tests.
    let server = common::server::isolated();
    let provider =
        Provider::new(&common::database_on(&server.uri).await).with_options(contention_options());
    let semaphore = provider.create_semaphore(common::unique("pool"), 3);
    let occupancy = common::Occupancy::default();
    let tasks: Vec<_> = (0..CONTENDERS)
        .map(|_| {
            let (semaphore, occupancy) = (semaphore.clone(), occupancy.clone());
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let slot = semaphore
                        .acquire_timeout(Duration::from_secs(120))
                        .await
                        .unwrap();
                    let inside = occupancy.enter();
                    // Hold until the semaphore is full (or 250 ms): whether three holders ever
                    // overlap must not depend on how fast a loaded machine runs a 10 ms window.
                    common::eventually(Duration::from_millis(250), || async {
                        occupancy.inside() >= 3
                    })
                    .await;
                    drop(inside);
                    slot.release().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let most = occupancy.most();
    println!(
        "semaphore: {} acquisitions, at most {most} holders at once (max_count 3)",
        CONTENDERS * ROUNDS
    );
    assert!(most <= 3, "{most} holders at once");
    assert_eq!(
        most, 3,
        "the semaphore admits up to max_count holders concurrently"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_places_freed_at_once_are_refilled_by_local_waiters_at_once() {
    // Waiters that are not first in line poll only every 5 s: places must be refilled by
    // passing the turn on, not by polling.
    let options = LockOptions::builder()
        .busy_wait_sleep_time(Duration::from_millis(10), Duration::from_secs(5))
        .build()
        .unwrap();
    let database = common::database().await;
    let collection = common::unique("semaphores");
    let name = common::unique("refill");
    let semaphore = MongoDistributedSemaphore::new(name.as_str(), 3, &database)
        .with_collection(collection.as_str())
        .with_options(options);
    let (a, b, c) = (
        semaphore.acquire().await.unwrap(),
        semaphore.acquire().await.unwrap(),
        semaphore.acquire().await.unwrap(),
    );
    let holders = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(tokio::sync::Notify::new());
    let waiters: Vec<_> = (0..6)
        .map(|_| {
            let (semaphore, holders, done) = (semaphore.clone(), holders.clone(), done.clone());
            tokio::spawn(async move {
                let Ok(Some(place)) = semaphore.try_acquire_timeout(Duration::from_secs(20)).await
                else {
                    return;
                };
                holders.fetch_add(1, Ordering::SeqCst);
                done.notified().await;
                place.release().await.unwrap();
            })
        })
        .collect();
    // Every waiter has failed its first attempt and waits in line, with an offer.
    assert!(common::offers_become(&collection, &name, 6).await);
    // Two places end on the server (as when their holders' leases end, or another process
    // releases them), then the third holder releases locally: the woken waiter finds three free
    // places and must pass the turn on.
    database
        .collection::<Document>(&collection)
        .update_one(
            doc! { "_id": name.as_str() },
            doc! { "$pull": { "holders": { "id": { "$ne": "none" } } } },
        )
        .await
        .unwrap();
    let freed = std::time::Instant::now();
    let _ = a.release().await; // its entry is gone already: LockLost
    let refilled = common::eventually(Duration::from_secs(10), || async {
        holders.load(Ordering::SeqCst) == 3
    })
    .await;
    let elapsed = freed.elapsed();
    println!("semaphore refill: 3 free places refilled by local waiters in {elapsed:?}");
    assert!(refilled, "three waiters got in");
    assert!(
        elapsed < Duration::from_secs(2),
        "refilled after {elapsed:?}: the second and third waiter waited for their 5 s poll"
    );
    done.notify_waiters();
    drop((b, c));
    for waiter in waiters {
        waiter.abort();
        let _ = waiter.await;
    }
}

#[tokio::test]
async fn holders_have_their_own_leases_and_places_free_up_on_release_and_drop() {
    let database = common::database().await;
    let collection = common::unique("semaphores");
    let semaphore = MongoDistributedSemaphore::new("jobs", 2, &database)
        .with_collection(collection.as_str())
        .with_options(common::options(3_000, 300));
    assert_eq!((semaphore.name(), semaphore.max_count()), ("jobs", 2));
    let first = semaphore.try_acquire().await.unwrap().expect("slot 1");
    let second = semaphore.try_acquire().await.unwrap().expect("slot 2");
    assert!(semaphore.try_acquire().await.unwrap().is_none(), "full");
    assert_eq!(first.name(), "jobs");

    // Each holder's lease is renewed on its own: one lost holder leaves the other held.
    let documents = database.collection::<Document>(&collection);
    assert_eq!(documents.count_documents(doc! {}).await.unwrap(), 1);
    let stored = common::lock_document(&documents, "jobs").await.unwrap();
    assert_eq!(stored.get_array("holders").unwrap().len(), 2, "{stored}");
    assert!(
        first.fencing_token() < second.fencing_token(),
        "tokens increase across holders"
    );
    documents
        .update_one(
            doc! { "_id": "jobs" },
            doc! { "$set": { "holders.0.id": "stolen" } },
        )
        .await
        .unwrap();
    let (lost_first, lost_second) = (first.lost(), second.lost());
    let lost = tokio::time::timeout(Duration::from_secs(3), async {
        tokio::select! {
            _ = lost_first.wait() => 0,
            _ = lost_second.wait() => 1,
        }
    })
    .await
    .expect("the robbed slot is lost");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (robbed, kept) = if lost == 0 {
        (first, second)
    } else {
        (second, first)
    };
    assert!(!kept.is_lost(), "the other slot stays held");
    assert!(robbed.release().await.unwrap_err().is_lock_lost());

    drop(kept);
    let again = semaphore
        .acquire_timeout(Duration::from_secs(2))
        .await
        .unwrap();
    again.release().await.unwrap();
}

#[tokio::test]
async fn disagreeing_or_zero_max_counts_are_clear_errors() {
    let database = common::database().await;
    let collection = common::unique("semaphores");
    let three =
        MongoDistributedSemaphore::new("shared", 3, &database).with_collection(collection.as_str());
    three
        .try_acquire()
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    let five =
        MongoDistributedSemaphore::new("shared", 5, &database).with_collection(collection.as_str());
    match five.try_acquire().await {
        Err(Error::InvalidArgument(message)) => {
            assert!(
                message.contains("max_count 3") && message.contains("uses 5"),
                "{message}"
            );
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    let zero =
        MongoDistributedSemaphore::new("zero", 0, &database).with_collection(collection.as_str());
    assert!(matches!(
        zero.acquire().await,
        Err(Error::InvalidArgument(_))
    ));
    let documents = database.collection::<Document>(&collection);
    assert_eq!(
        documents
            .count_documents(doc! { "_id": "zero" })
            .await
            .unwrap(),
        0,
        "nothing written"
    );
    let shared = common::lock_document(&documents, "shared").await.unwrap();
    assert_eq!(
        shared.get_array("holders").unwrap().len(),
        0,
        "the refused caller changed nothing: {shared}"
    );
}

#[tokio::test]
async fn holders_show_each_holder_with_its_details() {
    let database = common::database().await;
    let semaphore = MongoDistributedSemaphore::new(common::unique("pool"), 3, &database)
        .with_collection(common::unique("semaphores"))
        .with_details(LockDetails::new().with_owner("importer"));
    assert!(semaphore.holders().await.unwrap().is_empty());
    let first = semaphore.acquire().await.unwrap();
    let second = semaphore.acquire().await.unwrap();
    let holders = semaphore.holders().await.unwrap();
    assert_eq!(holders.len(), 2, "{holders:?}");
    let mut tokens: Vec<_> = holders.iter().map(|h| h.fencing_token).collect();
    tokens.sort();
    let mut expected = vec![Some(first.fencing_token()), Some(second.fencing_token())];
    expected.sort();
    assert_eq!(tokens, expected);
    for holder in &holders {
        assert_eq!(
            (holder.name.as_str(), holder.kind),
            (semaphore.name(), LockKind::Semaphore)
        );
        assert_eq!(holder.owner(), Some("importer"));
        assert_eq!(holder.pid(), Some(std::process::id()));
        assert!(holder.is_held());
    }
    first.release().await.unwrap();
    assert_eq!(semaphore.holders().await.unwrap().len(), 1);
    second.release().await.unwrap();
    assert!(semaphore.holders().await.unwrap().is_empty());
}

/// Waiters that would sleep 20 s between attempts: anything faster is a local wake-up.
fn sleepy_options() -> LockOptions {
    LockOptions::builder()
        .busy_wait_sleep_time(Duration::from_secs(20), Duration::from_secs(20))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_every_place_at_once_refills_them_all_from_local_waiters() {
    const PLACES: u32 = 3;
    const WAITERS: usize = 6;
    let collection = common::unique("semaphores");
    let provider = Provider::new(&common::database().await)
        .with_semaphore_collection(collection.as_str())
        .with_options(sleepy_options());
    let semaphore = provider.create_semaphore(common::unique("refill"), PLACES);
    let mut holders = Vec::new();
    for _ in 0..PLACES {
        holders.push(semaphore.acquire().await.unwrap());
    }
    let (acquired, mut acquisitions) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for queued in 1..=WAITERS {
        let (waiter, acquired) = (semaphore.clone(), acquired.clone());
        waiters.push(tokio::spawn(async move {
            let place = waiter
                .acquire_timeout(Duration::from_secs(60))
                .await
                .unwrap();
            acquired.send(()).unwrap();
            // Keep the place until the test ends.
            std::future::pending::<()>().await;
            drop(place);
        }));
        // Its first attempt fails; then it waits in line with an offer.
        let in_line = common::offers_become(&collection, semaphore.name(), queued).await;
        assert!(in_line, "waiter {queued} did not queue");
    }
    futures::future::join_all(holders.into_iter().map(|holder| holder.release())).await;
    for place in 0..PLACES {
        tokio::time::timeout(Duration::from_secs(10), acquisitions.recv())
            .await
            .unwrap_or_else(|_| panic!("place {place} refilled by a wake-up, not a 20 s sleep"))
            .unwrap();
    }
    let held = semaphore.holders().await.unwrap();
    assert_eq!(held.len(), PLACES as usize, "{held:?}");
    for waiter in waiters {
        waiter.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_release_hands_its_place_to_a_local_waiter_in_the_release_command() {
    const PLACES: u32 = 3;
    const WAITERS: usize = 6;
    let (database, log) = common::counting_database().await;
    let collection = common::unique("semaphores");
    let provider = Provider::new(&database)
        .with_semaphore_collection(collection.as_str())
        .with_options(sleepy_options());
    let semaphore = provider.create_semaphore(common::unique("transfer"), PLACES);
    let mut holders = Vec::new();
    for _ in 0..PLACES {
        holders.push(semaphore.acquire().await.unwrap());
    }
    let first_token = holders.iter().map(|place| place.fencing_token()).max();
    let (acquired, mut acquisitions) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for queued in 1..=WAITERS {
        let (waiter, acquired) = (semaphore.clone(), acquired.clone());
        waiters.push(tokio::spawn(async move {
            let place = waiter
                .acquire_timeout(Duration::from_secs(60))
                .await
                .unwrap();
            acquired.send(place.fencing_token()).unwrap();
            std::future::pending::<()>().await;
            drop(place);
        }));
        // Its first attempt fails; then it waits in line with an offer (and 20 s between polls).
        let in_line = common::offers_become(&collection, semaphore.name(), queued).await;
        assert!(in_line, "waiter {queued} did not queue");
    }
    // The first waiter polls with a change stream; the attempt its start woke it for (a release
    // may have come before) is answered. (Cleared before that, the log showed that attempt
    // after the first transfer, 9 runs in 10 beside two busy loops.)
    common::stream_open(&log, &collection, semaphore.name(), WAITERS).await;
    log.clear();
    futures::future::join_all(holders.into_iter().map(|holder| holder.release())).await;
    let mut tokens = Vec::new();
    for place in 0..PLACES {
        let token = tokio::time::timeout(Duration::from_secs(10), acquisitions.recv())
            .await
            .unwrap_or_else(|_| panic!("place {place} handed over, not found by a 20 s sleep"))
            .unwrap();
        tokens.push(token);
    }
    // Three releases, each one command that gave its place to a waiter: no plain release, no
    // attempt.
    assert_eq!(
        log.started_without_streams(),
        ["findAndModify"; PLACES as usize],
        "{:#?}",
        log.find_and_modifies()
    );
    assert_eq!(log.transfers(), PLACES as usize);
    assert!(
        tokens.iter().all(|token| Some(*token) > first_token),
        "{tokens:?}"
    );
    assert_eq!(semaphore.holders().await.unwrap().len(), PLACES as usize);
    for waiter in waiters {
        waiter.abort();
    }
}
