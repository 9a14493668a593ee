//! A holder process is killed: the lock frees itself one expiry after the last renewal.

use test_support as common;

use std::time::Duration;

use distributed_lock_mongodb::MongoDistributedLock;
use mongodb::bson::{DateTime, Document};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_frees_the_lock_one_expiry_after_its_last_renewal() {
    let database = common::database().await;
    let collection_name = common::unique("locks");
    let collection = database.collection::<Document>(&collection_name);
    let name = common::unique("crash");
    let mut child = common::workers::spawn(&["hold", &collection_name, &name, "1500", "300"]);

    let _output = common::workers::acquired(&mut child).await;

    // Let it renew a few times (each renewal moves expiresAt).
    let mut seen: Vec<DateTime> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while seen.len() < 4 && tokio::time::Instant::now() < deadline {
        let (_, expires_at) = common::server_now_and_expiry(&collection, &name).await;
        if let Some(expires_at) = expires_at
            && seen.last() != Some(&expires_at)
        {
            seen.push(expires_at);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        seen.len() >= 4,
        "the worker renews its lease ({} expiries seen)",
        seen.len()
    );

    child.kill().await.unwrap(); // SIGKILL: no release, no cleanup
    let (_, last_expiry) = common::server_now_and_expiry(&collection, &name).await;
    let last_expiry = last_expiry.expect("the dead holder's lease is still stored");

    let waiter = MongoDistributedLock::new(name.as_str(), &database)
        .with_collection(collection_name.as_str())
        .with_options(common::options(1_500, 300));
    let guard = waiter
        .acquire_timeout(Duration::from_secs(10))
        .await
        .unwrap();
    let document = common::lock_document(&collection, &name).await.unwrap();
    let acquired_at = *document.get_datetime("acquiredAt").unwrap();
    let after_expiry = acquired_at.timestamp_millis() - last_expiry.timestamp_millis();
    println!(
        "crash: waiter acquired {after_expiry} ms after the dead holder's lease ended (expiry 1500 ms after its last renewal)"
    );
    assert!(
        after_expiry >= 0,
        "acquired {} ms before the lease ended",
        -after_expiry
    );
    assert!(
        after_expiry <= 1_000,
        "acquired {after_expiry} ms after the lease ended"
    );
    guard.release().await.unwrap();
}
