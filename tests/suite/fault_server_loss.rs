//! The server becomes unreachable while a lock is held, then comes back.

use test_support as common;

use std::time::Duration;

use common::proxy::{self, Fault};
use distributed_lock_mongodb::MongoDistributedLock;
use mongodb::bson::Document;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_server_signals_lost_before_expiry_and_the_client_recovers() {
    let (proxy, client) = proxy::proxied_client().await;
    let database = client.database(common::DATABASE);
    let collection_name = common::unique("locks");
    let control = common::database()
        .await
        .collection::<Document>(&collection_name);
    let lock = MongoDistributedLock::new(common::unique("outage"), &database)
        .with_collection(collection_name.as_str())
        .with_options(common::options(2_000, 500));

    let guard = lock.acquire().await.unwrap();
    let lost = guard.lost();
    proxy.set(Fault::Refuse);
    tokio::time::timeout(Duration::from_secs(4), lost.wait())
        .await
        .expect("lost fires while the server is unreachable");
    let (now, expires_at) = common::server_now_and_expiry(&control, lock.name()).await;
    let expires_at = expires_at.expect("the lease has not ended yet when lost fires");
    assert!(expires_at > now, "lost fired after the server-side expiry");
    println!(
        "outage: lost {} ms before the server-side expiry",
        expires_at.timestamp_millis() - now.timestamp_millis()
    );

    // While the server is unreachable, an attempt reports an error (no reply in time, or the
    // driver's), never "busy", and does not hang.
    let error = lock.try_acquire().await.unwrap_err();
    assert!(
        error.is_no_reply() || matches!(error, distributed_lock_mongodb::Error::Mongo(_)),
        "{error}"
    );
    assert!(guard.release().await.is_err());

    proxy.set(Fault::Pass);
    let other = MongoDistributedLock::new(common::unique("after"), &database)
        .with_collection(collection_name.as_str());
    let fresh = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match other.try_acquire().await {
                Ok(Some(guard)) => return guard,
                Ok(None) => panic!("a fresh name is free"),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    })
    .await
    .expect("the same client works again once the server is reachable");
    fresh.release().await.unwrap();
    let again = lock.acquire_timeout(Duration::from_secs(5)).await.unwrap();
    again.release().await.unwrap();
}
