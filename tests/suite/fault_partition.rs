//! A partitioned holder and a second client: the second acquires only after the lease expired,
//! and by then the first has already seen `lost`.

use test_support as common;

use std::time::{Duration, Instant};

use common::proxy::{self, Fault};
use distributed_lock_mongodb::MongoDistributedLock;
use mongodb::bson::Document;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_partitioned_holder_sees_lost_before_the_next_holder_acquires() {
    for trial in 0..3_u64 {
        let (proxy, partitioned_client) = proxy::proxied_client().await;
        let control = common::database().await;
        let collection_name = common::unique("locks");
        let name = common::unique("partition");
        let options = common::options(3_000, 800); // margin 30 ms
        let holder = MongoDistributedLock::new(
            name.as_str(),
            &partitioned_client.database(common::DATABASE),
        )
        .with_collection(collection_name.as_str())
        .with_options(options.clone());
        let rival = MongoDistributedLock::new(name.as_str(), &control)
            .with_collection(collection_name.as_str())
            .with_options(options);
        let collection = control.collection::<Document>(&collection_name);

        let guard = holder.acquire().await.unwrap();
        let lost = guard.lost();
        tokio::time::sleep(Duration::from_millis(150 * trial)).await;
        proxy.set(Fault::Blackhole);
        let (_, lease_end) = common::server_now_and_expiry(&collection, &name).await;
        let lease_end = lease_end.expect("held");

        let watcher = tokio::spawn(async move {
            lost.wait().await;
            Instant::now()
        });
        let next = rival
            .acquire_timeout(Duration::from_secs(10))
            .await
            .unwrap();
        let acquired_at = Instant::now();
        let lost_at = watcher.await.unwrap();
        assert!(
            lost_at < acquired_at,
            "trial {trial}: lost must fire before the next holder acquires"
        );
        let taken = common::lock_document(&collection, &name).await.unwrap();
        let server_acquired_at = *taken.get_datetime("acquiredAt").unwrap();
        assert!(
            server_acquired_at >= lease_end,
            "trial {trial}: acquired at {server_acquired_at} before the lease ended at {lease_end}"
        );
        assert!(next.fencing_token() > guard.fencing_token());
        println!(
            "trial {trial}: lost {:?} before the next acquisition; server-side takeover {} ms after lease end",
            acquired_at - lost_at,
            server_acquired_at.timestamp_millis() - lease_end.timestamp_millis()
        );

        proxy.set(Fault::Pass);
        proxy.cut_connections();
        // The partitioned holder's release must not disturb the new holder.
        assert!(guard.release().await.is_err());
        let still = common::lock_document(&collection, &name).await.unwrap();
        assert_eq!(
            still.get_str("lockId").unwrap(),
            taken.get_str("lockId").unwrap()
        );
        next.release().await.unwrap();
    }
}
