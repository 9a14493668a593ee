//! In-process handoff: a release wakes the longest-waiting local waiter at once.

mod common;

use std::time::{Duration, Instant};

use distributed_lock_mongodb::{LockOptions, MongoDistributedLock};

/// Waiters that would sleep 20 s between attempts: anything faster is the handoff.
fn sleepy_options() -> LockOptions {
    LockOptions::builder()
        .expiry(Duration::from_secs(30))
        .busy_wait_sleep_time(Duration::from_secs(20), Duration::from_secs(20))
        .build()
        .unwrap()
}

async fn wait_in_line(lock: &MongoDistributedLock) -> tokio::task::JoinHandle<Instant> {
    let lock = lock.clone();
    let waiter = tokio::spawn(async move {
        let guard = lock.acquire_timeout(Duration::from_secs(60)).await.unwrap();
        let acquired = Instant::now();
        // Hold briefly so the next waiter's turn is observable, then hand over.
        tokio::time::sleep(Duration::from_millis(100)).await;
        guard.release().await.unwrap();
        acquired
    });
    // Let this waiter make its first (failed) attempt and join the queue before the next one.
    tokio::time::sleep(Duration::from_millis(150)).await;
    waiter
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_wake_local_waiters_one_at_a_time_in_arrival_order() {
    let (lock, _) = common::fresh_lock("fifo", sleepy_options()).await;
    let guard = lock.acquire().await.unwrap();
    let mut waiters = Vec::new();
    for _ in 0..4 {
        waiters.push(wait_in_line(&lock).await);
    }
    let released = Instant::now();
    guard.release().await.unwrap();
    let mut previous = released;
    for (position, waiter) in waiters.into_iter().enumerate() {
        let acquired = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("woken long before its 20 s sleep ends")
            .unwrap();
        assert!(
            acquired > previous,
            "waiter {position} acquired out of arrival order"
        );
        // Each waiter holds 100 ms; the next one follows within a second, not after 20 s.
        assert!(
            acquired - previous < Duration::from_secs(1),
            "waiter {position}: {:?}",
            acquired - previous
        );
        previous = acquired;
    }
}

#[tokio::test]
async fn dropping_a_guard_wakes_a_waiter_too() {
    let (lock, _) = common::fresh_lock("dropwake", sleepy_options()).await;
    let guard = lock.acquire().await.unwrap();
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move {
            lock.acquire_timeout(Duration::from_secs(60))
                .await
                .map(|g| g.fencing_token())
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let token = guard.fencing_token();
    drop(guard);
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("woken by the drop, not by its 20 s sleep")
        .unwrap()
        .unwrap();
    assert!(next > token);
}

#[tokio::test]
async fn a_cancelled_waiter_leaves_the_queue_and_the_next_one_is_woken() {
    let (lock, _) = common::fresh_lock("leave", sleepy_options()).await;
    let guard = lock.acquire().await.unwrap();
    let first = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.acquire().await.map(|g| g.fencing_token()) })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let second = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.acquire().await.map(|g| g.fencing_token()) })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    guard.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("the remaining waiter is woken")
        .unwrap()
        .unwrap();
}
