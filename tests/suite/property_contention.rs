//! Many tasks contending for one lock: never two holders, tokens strictly increasing.

use test_support as common;

use std::sync::Arc;
use std::time::Duration;

use distributed_lock_mongodb::LockOptions;
use tokio::sync::Mutex;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_tasks_never_hold_the_lock_together() {
    const TASKS: usize = 16;
    const ROUNDS: usize = 6;
    let options = LockOptions::builder()
        .expiry(Duration::from_secs(10))
        .busy_wait_sleep_time(Duration::from_millis(1), Duration::from_millis(30))
        .build()
        .unwrap();
    let (lock, _) = common::fresh_lock("contended", options).await;
    let occupancy = common::Occupancy::default();
    let tokens = Arc::new(Mutex::new(Vec::new()));

    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (lock, occupancy, tokens) = (lock.clone(), occupancy.clone(), tokens.clone());
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = lock.acquire_timeout(Duration::from_secs(60)).await.unwrap();
                    let inside = occupancy.enter();
                    tokens.lock().await.push(guard.fencing_token());
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    drop(inside);
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }

    assert_eq!(occupancy.most(), 1, "never two holders");
    let tokens = tokens.lock().await;
    assert_eq!(tokens.len(), TASKS * ROUNDS);
    for pair in tokens.windows(2) {
        assert!(
            pair[0] < pair[1],
            "tokens must strictly increase: {} then {}",
            pair[0],
            pair[1]
        );
    }
}
