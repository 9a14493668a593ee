//! Fenced writes refuse stale holders, including one that was partitioned.

use test_support as common;

use std::time::Duration;

use common::proxy::{self, Fault};
use distributed_lock_mongodb::{Fence, FenceOutcome, MongoDistributedLock};
use mongodb::bson::{Document, doc};

#[tokio::test]
async fn stale_tokens_are_refused_and_fresh_ones_applied() {
    let database = common::database().await;
    let accounts = database.collection::<Document>(&common::unique("accounts"));
    accounts
        .insert_one(doc! { "_id": "acct", "balance": 100 })
        .await
        .unwrap();
    let (lock, _) = common::fresh_lock("fence", common::options(5_000, 1_000)).await;
    let fence = Fence::new();

    let first = lock.acquire().await.unwrap();
    let stale = first.fencing_token();
    first.release().await.unwrap();
    let second = lock.acquire().await.unwrap();
    let current = second.fencing_token();

    let applied = fence
        .update_one(
            &accounts,
            doc! { "_id": "acct" },
            doc! { "$inc": { "balance": 50 } },
            current,
        )
        .await
        .unwrap();
    assert_eq!(applied, FenceOutcome::Applied);
    let refused = fence
        .update_one(
            &accounts,
            doc! { "_id": "acct" },
            doc! { "$set": { "balance": 0 } },
            stale,
        )
        .await
        .unwrap();
    assert_eq!(refused, FenceOutcome::Stale);
    // Equal tokens: refused by default, accepted when allowed.
    let again = fence
        .update_one(
            &accounts,
            doc! { "_id": "acct" },
            doc! { "$inc": { "balance": 1 } },
            current,
        )
        .await
        .unwrap();
    assert_eq!(again, FenceOutcome::Stale);
    let allowed = Fence::new()
        .with_allow_equal(true)
        .update_one(
            &accounts,
            doc! { "_id": "acct" },
            doc! { "$inc": { "balance": 1 } },
            current,
        )
        .await
        .unwrap();
    assert!(allowed.is_applied());
    let stored = accounts
        .find_one(doc! { "_id": "acct" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.get_i32("balance").unwrap(), 151);
    assert_eq!(stored.get_i64("fencingToken").unwrap(), current.get());

    let missing = fence
        .update_one(
            &accounts,
            doc! { "_id": "nope" },
            doc! { "$set": { "x": 1 } },
            current,
        )
        .await
        .unwrap();
    assert_eq!(missing, FenceOutcome::NotFound);
    assert!(
        fence
            .update_one(
                &accounts,
                doc! { "_id": "acct" },
                doc! { "$set": { "fencingToken": 1 } },
                current
            )
            .await
            .unwrap_err()
            .is_invalid_input()
    );
    second.release().await.unwrap();
}

#[tokio::test]
async fn a_foreign_stored_token_counts_as_older() {
    let database = common::database().await;
    let resources = database.collection::<Document>(&common::unique("resources"));
    resources
        .insert_many([
            doc! { "_id": 1, "fencingToken": "garbage" },
            doc! { "_id": 2, "fencingToken": 7.0 },
            doc! { "_id": 3, "guard": 9_i32 },
        ])
        .await
        .unwrap();
    let (lock, _) = common::fresh_lock("foreign", common::options(5_000, 1_000)).await;
    let guard = lock.acquire().await.unwrap();
    let token = guard.fencing_token();
    for id in [1, 2] {
        let outcome = Fence::new()
            .update_one(
                &resources,
                doc! { "_id": id },
                doc! { "$set": { "touched": true } },
                token,
            )
            .await
            .unwrap();
        assert!(outcome.is_applied(), "{id}");
    }
    let custom = Fence::new()
        .with_field("guard")
        .update_one(
            &resources,
            doc! { "_id": 3 },
            doc! { "$set": { "touched": true } },
            token,
        )
        .await
        .unwrap();
    assert!(custom.is_applied());
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_holder_is_refused_after_the_next_holder_wrote() {
    let (proxy, partitioned) = proxy::proxied_client().await;
    let control = common::database().await;
    let collection = common::unique("locks");
    let accounts_name = common::unique("accounts");
    let name = common::unique("partitioned");
    let options = common::options(1_500, 400);
    control
        .collection::<Document>(&accounts_name)
        .insert_one(doc! { "_id": "acct", "balance": 100 })
        .await
        .unwrap();

    let stale_holder =
        MongoDistributedLock::new(name.as_str(), &partitioned.database(common::DATABASE))
            .with_collection(collection.as_str())
            .with_options(options.clone());
    let guard = stale_holder.acquire().await.unwrap();
    let stale_token = guard.fencing_token();
    proxy.set(Fault::Blackhole);

    let rival = MongoDistributedLock::new(name.as_str(), &control)
        .with_collection(collection.as_str())
        .with_options(options);
    let next = rival
        .acquire_timeout(Duration::from_secs(10))
        .await
        .unwrap();
    let accounts = control.collection::<Document>(&accounts_name);
    assert!(
        Fence::new()
            .update_one(
                &accounts,
                doc! { "_id": "acct" },
                doc! { "$inc": { "balance": 10 } },
                next.fencing_token()
            )
            .await
            .unwrap()
            .is_applied()
    );

    // The partition heals; the old holder, unaware, tries to write through its own client.
    proxy.set(Fault::Pass);
    proxy.cut_connections();
    let its_accounts = partitioned
        .database(common::DATABASE)
        .collection::<Document>(&accounts_name);
    let outcome = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            match Fence::new()
                .update_one(
                    &its_accounts,
                    doc! { "_id": "acct" },
                    doc! { "$set": { "balance": 0 } },
                    stale_token,
                )
                .await
            {
                Ok(outcome) => return outcome,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await, // reconnecting
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(outcome, FenceOutcome::Stale);
    let stored = accounts
        .find_one(doc! { "_id": "acct" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.get_i32("balance").unwrap(), 110);
    assert!(guard.release().await.is_err());
    next.release().await.unwrap();
}
