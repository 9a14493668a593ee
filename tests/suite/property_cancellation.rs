//! Cancelled acquisitions leave nothing behind.

use test_support as common;

use std::time::Duration;

use distributed_lock_mongodb::LockOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_cancelled_by_short_timeouts_leave_no_orphan() {
    // Each test of this file floods a server of its own: a sibling's load must not turn this
    // test's attempts into "no reply" errors.
    let server = common::server::isolated();
    let (database, commands) = common::counting_database_on(&server.uri, |_| {}).await;
    let collection = common::unique("locks");
    let options = LockOptions::builder()
        .expiry(Duration::from_secs(30))
        .busy_wait_sleep_time(Duration::from_millis(1), Duration::from_millis(5))
        .build()
        .unwrap();
    let lock =
        distributed_lock_mongodb::MongoDistributedLock::new(common::unique("cancel"), &database)
            .with_collection(collection.as_str())
            .with_options(options);

    let mut won_and_kept = 0;
    for round in 0..200_u64 {
        // Cancel at 0..10 ms: before the request is sent, while it is in flight, or after it won.
        let cutoff = Duration::from_micros(round * 7_919 % 10_000);
        if let Ok(Ok(guard)) = tokio::time::timeout(cutoff, lock.acquire()).await {
            won_and_kept += 1;
            drop(guard);
        }
    }
    // Cancelled attempts still run to completion, and a win nobody waits for is released once
    // its reply arrives: on a loaded machine that can be seconds after the last cancellation.
    // "Afterwards" starts once every command has been answered.
    let drained = common::eventually(Duration::from_secs(60), || async {
        commands.in_flight() == 0
    })
    .await;
    assert!(
        drained,
        "{} commands still unanswered",
        commands.in_flight()
    );
    // Every win was released: by the explicit drop above, or by the attempt task when nobody
    // waited for its result any more. With a 30 s expiry, an orphan would block for 30 s.
    let free = common::eventually(Duration::from_secs(1), || async {
        match lock.try_acquire().await.unwrap() {
            Some(guard) => {
                guard.release().await.unwrap();
                true
            }
            None => false,
        }
    })
    .await;
    if !free {
        let stored = common::database_on(&server.uri)
            .await
            .collection::<mongodb::bson::Document>(&collection)
            .find_one(mongodb::bson::doc! {})
            .await;
        panic!(
            "the lock must be free within a second of the last reply: stored {stored:?}, \
             {} commands in flight, {won_and_kept} guards kept",
            commands.in_flight()
        );
    }

    // A release is an `update`, or a transfer to a local waiter (a `findAndModify`).
    let releases = commands.count("update") + commands.transfers();
    assert!(
        releases > won_and_kept,
        "some cancelled attempts must have won and been released ({releases} releases, \
         {won_and_kept} kept guards)"
    );
}

/// Cancels acquisitions in every way a caller can, at random points, with several contenders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_cancellations_of_every_kind_leave_nothing_held() {
    const CONCURRENCY: u64 = 8;
    const PER_TASK: u64 = 130; // 8 × 130 = 1,040 cancelled or dropped acquisitions
    let server = common::server::isolated();
    let (database, commands) = common::counting_database_on(&server.uri, |_| {}).await;
    let collection_name = common::unique("locks");
    let control = common::database_on(&server.uri)
        .await
        .collection::<mongodb::bson::Document>(&collection_name);
    let options = LockOptions::builder()
        .expiry(Duration::from_secs(30))
        .busy_wait_sleep_time(Duration::from_millis(1), Duration::from_millis(5))
        .build()
        .unwrap();
    let lock =
        distributed_lock_mongodb::MongoDistributedLock::new(common::unique("storm"), &database)
            .with_collection(collection_name.as_str())
            .with_options(options);

    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|task| {
            let lock = lock.clone();
            tokio::spawn(async move {
                let mut kept = 0;
                for round in 0..PER_TASK {
                    // A cheap deterministic spread of 0..10 ms cut-offs.
                    let cutoff = Duration::from_micros((task * 7_919 + round * 104_729) % 10_000);
                    match round % 4 {
                        0 => {
                            let _ = tokio::time::timeout(cutoff, lock.acquire()).await;
                        }
                        1 => {
                            tokio::select! {
                                _ = lock.acquire() => {}
                                () = tokio::time::sleep(cutoff) => {}
                            }
                        }
                        2 => {
                            let attempt = tokio::spawn({
                                let lock = lock.clone();
                                async move { lock.acquire().await }
                            });
                            tokio::time::sleep(cutoff).await;
                            attempt.abort();
                            let _ = attempt.await;
                        }
                        _ => {
                            if let Ok(Ok(guard)) =
                                tokio::time::timeout(Duration::from_millis(50), lock.acquire())
                                    .await
                            {
                                kept += 1;
                                tokio::time::sleep(cutoff).await;
                                drop(guard);
                            }
                        }
                    }
                }
                kept
            })
        })
        .collect();
    let mut kept = 0;
    for task in tasks {
        kept += task.await.unwrap();
    }

    // Cancelled attempts still run to completion (that is what makes them safe); on a serial
    // server they queue up. "Afterwards" starts once every command has been answered.
    let drained = common::eventually(Duration::from_secs(60), || async {
        commands.in_flight() == 0
    })
    .await;
    assert!(
        drained,
        "{} commands still unanswered",
        commands.in_flight()
    );

    // Nothing stays held for more than a second...
    let released = common::eventually(Duration::from_secs(1), || async {
        let (now, expires_at) = common::server_now_and_expiry(&control, lock.name()).await;
        expires_at.is_none_or(|expires_at| expires_at <= now)
    })
    .await;
    assert!(
        released,
        "the lock document is still held a second after the last cancellation"
    );
    // ...and the lock is immediately acquirable.
    let guard = lock
        .try_acquire()
        .await
        .unwrap()
        .expect("acquirable at once");
    guard.release().await.unwrap();

    // A release is an `update`, or a transfer to a local waiter (a `findAndModify`).
    let transfers = commands.transfers();
    let attempts = commands.count("findAndModify") - transfers;
    let releases = commands.count("update") - 1 + transfers;
    println!(
        "cancellation storm: {} cancellations, {attempts} attempts sent, {releases} releases, {kept} guards dropped by their callers",
        CONCURRENCY * PER_TASK
    );
    assert!(
        releases > kept,
        "attempts that won after their caller gave up must have been released too ({releases} releases, {kept} kept guards)"
    );
}
