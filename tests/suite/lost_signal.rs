//! When `lost` fires: on a deleted or taken-over document within cadence + 1 s; on a blackholed
//! connection strictly before the server-side expiry (measured against the server's clock);
//! never while renewals merely suffer latency the lease can absorb.

use test_support as common;

use std::time::{Duration, Instant};

use common::proxy::{self, Fault};
use distributed_lock_mongodb::MongoDistributedLock;
use mongodb::bson::{Document, doc};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_or_taken_over_documents_are_noticed_within_cadence_plus_one_second() {
    let cadence = Duration::from_millis(400);
    for takeover in [false, true] {
        let (lock, collection) = common::fresh_lock("gone", common::options(4_000, 400)).await;
        let guard = lock.acquire().await.unwrap();
        let lost = guard.lost();
        let filter = doc! { "_id": lock.name() };
        if takeover {
            collection
                .update_one(filter, doc! { "$set": { "lockId": "someone-else" } })
                .await
                .unwrap();
        } else {
            collection.delete_one(filter).await.unwrap();
        }
        let changed = Instant::now();
        tokio::time::timeout(cadence + Duration::from_secs(1), lost.wait())
            .await
            .unwrap_or_else(|_| panic!("lost within cadence + 1 s (takeover: {takeover})"));
        println!("takeover={takeover}: lost after {:?}", changed.elapsed());
        assert!(guard.release().await.unwrap_err().is_lock_lost());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_holder_sees_lost_before_the_server_side_expiry() {
    // 20 holders, each with its own lease (and renewal loop), acquired 100 ms apart so their
    // renewal phases differ; then one partition cuts them all off. Expiry 3 s: margin 30 ms.
    const TRIALS: usize = 20;
    let expiry = Duration::from_secs(3);
    let (proxy, client) = proxy::proxied_client().await;
    let locks = client.database(common::DATABASE);
    let control = common::database().await;
    let collection_name = common::unique("locks");
    let collection = control.collection::<Document>(&collection_name);

    let mut holders = Vec::new();
    for _ in 0..TRIALS {
        let lock = MongoDistributedLock::new(common::unique("blackhole"), &locks)
            .with_collection(collection_name.as_str())
            .with_options(common::options(3_000, 1_000));
        let guard = lock.acquire_timeout(Duration::from_secs(10)).await.unwrap();
        holders.push((lock, guard));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    proxy.set(Fault::Blackhole);
    let watchers: Vec<_> = holders
        .iter()
        .map(|(lock, guard)| {
            let (lost, name, collection) =
                (guard.lost(), lock.name().to_owned(), collection.clone());
            tokio::spawn(async move {
                tokio::time::timeout(expiry + Duration::from_secs(2), lost.wait())
                    .await
                    .expect("lost fires while blackholed");
                // Read the server's clock at once; the read's own latency only shrinks the margin.
                let (now, expires_at) = common::server_now_and_expiry(&collection, &name).await;
                let expires_at = expires_at.expect("the lease must still exist when lost fires");
                expires_at.timestamp_millis() - now.timestamp_millis()
            })
        })
        .collect();
    let mut margins = Vec::new();
    for (trial, watcher) in watchers.into_iter().enumerate() {
        let margin = watcher.await.unwrap();
        assert!(
            margin > 0,
            "trial {trial}: lost fired {}ms after the server-side expiry",
            -margin
        );
        margins.push(margin);
    }
    margins.sort_unstable();
    println!(
        "blackhole: {TRIALS} trials, margin before server-side expiry: min {} ms, median {} ms, max {} ms",
        margins[0],
        margins[TRIALS / 2],
        margins[TRIALS - 1]
    );

    proxy.set(Fault::Pass);
    proxy.cut_connections();
    for (_, guard) in holders {
        assert!(
            guard.release().await.is_err(),
            "a lost lock's release reports an error"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_the_lease_can_absorb_never_loses_the_lock() {
    // expiry 2 s, cadence 500 ms, margin 20 ms: renewals tolerate round trips below 1.48 s.
    let (proxy, client) = proxy::proxied_client().await;
    let collection_name = common::unique("locks");
    let lock =
        MongoDistributedLock::new(common::unique("slow"), &client.database(common::DATABASE))
            .with_collection(collection_name.as_str())
            .with_options(common::options(2_000, 500));
    let guard = lock.acquire().await.unwrap();
    proxy.set(Fault::Latency(Duration::from_millis(300))); // 600 ms round trips
    let control = common::database()
        .await
        .collection::<Document>(&collection_name);
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!guard.is_lost(), "lost under latency the lease can absorb");
        let (now, expires_at) = common::server_now_and_expiry(&control, lock.name()).await;
        assert!(expires_at.expect("held") > now);
    }
    proxy.set(Fault::Pass);
    guard.release().await.unwrap();
}

/// A renewal that fails is retried a quarter of a cadence later, not a whole cadence later: with
/// a cadence of more than half the lease's lifetime, the next round would come too late and the
/// lease would be lost. Kills the mutation-testing survivor "`RenewalLoop::retry_soon` does
/// nothing" (RELIABILITY.md, "Mutation testing").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_renewal_is_retried_before_the_next_cadence() {
    use common::proxy::{Action, Rule};

    // expiry 8 s, cadence 4 s, skew 800 ms, margin 80 ms: the lease's lifetime is 7.12 s, so
    // the round at 8 s is too late; the retry 1 s after the failed round at 4 s is not.
    let (proxy, client) = proxy::proxied_client().await;
    let collection_name = common::unique("locks");
    let lock =
        MongoDistributedLock::new(common::unique("retry"), &client.database(common::DATABASE))
            .with_collection(collection_name.as_str())
            .with_options(common::options(8_000, 4_000));
    let guard = lock.acquire().await.unwrap();
    let acquired = Instant::now();
    let refused = proxy.add_rule(
        Rule::new(
            "findAndModify",
            Action::Reply(proxy::replies::command_error(2, "BadValue")),
        )
        .on(&collection_name),
    );
    assert!(
        common::eventually(Duration::from_secs(10), || async {
            proxy.hits(refused) == 1
        })
        .await,
        "the first renewal went out and was refused"
    );
    tokio::time::sleep(
        (acquired + Duration::from_secs(9)).saturating_duration_since(Instant::now()),
    )
    .await;
    assert!(
        !guard.is_lost(),
        "the refused renewal was retried in time: {:?} after the acquisition",
        acquired.elapsed()
    );
    guard.release().await.unwrap();
}
