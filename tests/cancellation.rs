//! Cancelled acquisitions leave nothing behind.

mod common;

use std::time::Duration;

use distributed_lock_mongodb::LockOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_cancelled_by_short_timeouts_leave_no_orphan() {
    let (database, commands) = common::counting_database().await;
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
    assert!(
        free,
        "the lock must be free within a second of the last cancellation"
    );

    let releases = commands
        .lock()
        .unwrap()
        .iter()
        .filter(|c| *c == "update")
        .count();
    assert!(
        releases > won_and_kept,
        "some cancelled attempts must have won and been released ({releases} releases, \
         {won_and_kept} kept guards)"
    );
}
