//! Routers and primaries with different clocks. Each test starts its own embedded server with a
//! second port whose `$$NOW` is shifted (a simulated second `mongos`, or a new primary after a
//! failover): the lock must stay safe when the clients of one lock evaluate `$$NOW` on
//! different clocks, within the configured `max_clock_skew`.

use test_support as common;

use std::time::Duration;

use common::proxy::Fault;
use common::server::{self, Dedicated};
use distributed_lock_mongodb::{
    LockOptions, MongoDistributedLock, MongoDistributedReaderWriterLock,
};
use futures::TryStreamExt;
use mongodb::bson::{DateTime, Document, doc};
use mongodb::{Client, Database};

async fn database(uri: &str) -> Database {
    Client::with_uri_str(uri)
        .await
        .expect("valid URI")
        .database(common::DATABASE)
}

/// The server time as `uri`'s router sees it, and the stored `expiresAt` of lock `name`.
async fn now_and_expiry(uri: &str, collection: &str, name: &str) -> (DateTime, DateTime) {
    let rows: Vec<Document> = database(uri)
        .await
        .collection::<Document>(collection)
        .aggregate([
            doc! { "$match": { "_id": name } },
            doc! { "$project": { "now": "$$NOW", "expiresAt": 1 } },
        ])
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let row = rows.first().expect("the lock document");
    (
        *row.get_datetime("now").unwrap(),
        *row.get_datetime("expiresAt").unwrap(),
    )
}

/// How long before a router whose clock runs `ahead` sees the lease end does a blackholed
/// holder's `lost` fire, with `max_clock_skew` set to `tolerance`? Negative: after.
async fn margin_seen_by_a_router_ahead(dedicated: &Dedicated, tolerance: Duration) -> i64 {
    let skewed = dedicated.skewed_uri.clone().expect("a skewed port");
    let (proxy, client) = common::proxy::proxied_client_with(&dedicated.uri, |_| {}).await;
    let collection = common::unique("locks");
    let name = common::unique("skew");
    let options = LockOptions::builder()
        .expiry(Duration::from_secs(3))
        .extension_cadence(Duration::from_millis(1_000))
        .max_clock_skew(tolerance)
        .build()
        .unwrap();
    let lock = MongoDistributedLock::new(name.as_str(), &client.database(common::DATABASE))
        .with_collection(collection.as_str())
        .with_options(options);
    let guard = lock.acquire().await.unwrap();
    proxy.set(Fault::Blackhole);
    tokio::time::timeout(Duration::from_secs(6), guard.lost().wait())
        .await
        .expect("lost fires while blackholed");
    let (ahead_now, expires_at) = now_and_expiry(&skewed, &collection, &name).await;
    proxy.set(Fault::Pass);
    proxy.cut_connections();
    drop(guard);
    expires_at.timestamp_millis() - ahead_now.timestamp_millis()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_before_a_router_whose_clock_runs_ahead_sees_the_lease_end() {
    // The second router's clock runs 400 ms ahead of the one the holder renews through.
    let dedicated = server::start_dedicated(Some(400));
    let untolerated = margin_seen_by_a_router_ahead(&dedicated, Duration::ZERO).await;
    let tolerated = margin_seen_by_a_router_ahead(&dedicated, Duration::from_millis(500)).await;
    println!(
        "clock skew 400 ms: lost fired {untolerated} ms before the lease ended for the router \
         ahead with max_clock_skew 0, {tolerated} ms with max_clock_skew 500 ms"
    );
    assert!(
        untolerated < 0,
        "without tolerance the router ahead sees the lease end first ({untolerated} ms)"
    );
    assert!(
        tolerated > 0,
        "with max_clock_skew above the real skew, lost fires first ({tolerated} ms)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_keep_increasing_when_the_next_router_is_behind() {
    // The next acquisition runs on a router 2 s behind. For it, the released lease (ended at the
    // first router's "now") ends 2 s later: it waits that long. If the document had been deleted
    // meanwhile, it would get `$$NOW × 1000` from a clock 2 s behind: a smaller token.
    let dedicated = server::start_dedicated(Some(-2_000));
    let behind = database(dedicated.skewed_uri.as_deref().expect("a skewed port")).await;
    let normal = database(&dedicated.uri).await;
    let collection = common::unique("locks");
    let name = common::unique("tokens");
    let first =
        MongoDistributedLock::new(name.as_str(), &normal).with_collection(collection.as_str());
    let guard = first.acquire().await.unwrap();
    let first_token = guard.fencing_token();
    guard.release().await.unwrap();
    // Wait for the TTL index: on the embedded server it deletes expired documents on access,
    // which is what a real TTL monitor does a minute later.
    let indexed = common::eventually(Duration::from_secs(10), || async {
        normal
            .collection::<Document>(&collection)
            .list_index_names()
            .await
            .unwrap_or_default()
            .iter()
            .any(|index| index == "expiresAt_ttl")
    })
    .await;
    assert!(indexed, "the TTL index was created");
    let second =
        MongoDistributedLock::new(name.as_str(), &behind).with_collection(collection.as_str());
    let guard = second.acquire().await.unwrap();
    println!(
        "router 2 s behind: token {} after {first_token}",
        guard.fencing_token()
    );
    assert!(
        guard.fencing_token() > first_token,
        "token {} after {first_token}: the released document must outlive any clock skew",
        guard.fencing_token()
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_whose_lease_ended_for_one_router_is_not_revived_by_another() {
    // Readers join through a router 5 s ahead: for it, the writer's 3 s lease has ended at once.
    let dedicated = server::start_dedicated(Some(5_000));
    let ahead = database(dedicated.skewed_uri.as_deref().expect("a skewed port")).await;
    let normal = database(&dedicated.uri).await;
    let collection = common::unique("rw");
    let name = common::unique("revive");
    let options = common::options(3_000, 500);
    let writer_lock = MongoDistributedReaderWriterLock::new(name.as_str(), &normal)
        .with_collection(collection.as_str())
        .with_options(options.clone());
    let reader_lock = MongoDistributedReaderWriterLock::new(name.as_str(), &ahead)
        .with_collection(collection.as_str())
        .with_options(options);
    let writer = writer_lock.acquire_write().await.unwrap();
    let reader = reader_lock
        .try_acquire_read()
        .await
        .unwrap()
        .expect("the router ahead sees the writer's lease over");
    // The writer's next renewal goes through its own router, where its lease still looks live.
    // It must not bring the writer back beside the reader.
    tokio::time::timeout(Duration::from_secs(3), writer.lost().wait())
        .await
        .expect("the writer learns at its next renewal that its lease is gone");
    let stored = normal
        .collection::<Document>(&collection)
        .find_one(doc! { "_id": name.as_str() })
        .await
        .unwrap()
        .unwrap();
    let writer_field = stored.get_document("writer").unwrap();
    assert!(
        writer_field.get("id").is_none(),
        "the ended writer was cleared by the joining reader: {stored}"
    );
    assert!(!reader.is_lost());
    reader.release().await.unwrap();
    assert!(writer.release().await.unwrap_err().is_lock_lost());
}

/// Steps the embedded server's clock by `millis` (launcher shim 7).
async fn step_clock(database: &Database, millis: i64) {
    database
        .run_command(doc! { "mongoecoStepClock": millis })
        .await
        .expect("the embedded server steps its clock");
}

/// A forward step of the server's clock (an NTP step, a resumed virtual machine) larger than
/// `max_clock_skew` makes a lease written before it end early in real time: another client could
/// take the lock while its holder's local deadline has not passed yet. The holder notices at its
/// next renewal (the server's clock advanced by more than the local time between two replies
/// plus the skew) and reports the lease lost, although that renewal matched. A step within the
/// skew is not a loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_step_of_the_servers_clock_beyond_the_skew_is_reported_as_a_loss() {
    let dedicated = server::start_dedicated(None);
    let database = database(&dedicated.uri).await;
    let collection = common::unique("locks");
    let name = common::unique("stepped");
    let options = LockOptions::builder()
        .expiry(Duration::from_secs(10))
        .extension_cadence(Duration::from_millis(500))
        .max_clock_skew(Duration::from_millis(500))
        .build()
        .unwrap();
    let lock = MongoDistributedLock::new(name.as_str(), &database)
        .with_collection(collection.as_str())
        .with_options(options);
    let guard = lock.acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await; // renewals have read the clock

    step_clock(&database, 200).await; // within the skew
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(!guard.is_lost(), "a step within max_clock_skew is no loss");

    step_clock(&database, 3_000).await;
    tokio::time::timeout(Duration::from_secs(5), guard.lost().wait())
        .await
        .expect("the jump is noticed at the next renewal");
    // The renewal matched: the lease is still ours on the server, so only the clock check can
    // have reported it lost.
    let (now, expires_at) = now_and_expiry(&dedicated.uri, &collection, &name).await;
    assert!(expires_at > now, "the lease is live on the server");
    let stored = database
        .collection::<Document>(&collection)
        .find_one(doc! { "_id": &name })
        .await
        .unwrap()
        .unwrap();
    assert!(stored.get_str("lockId").is_ok(), "and still held");
    assert!(guard.release().await.unwrap_err().is_lock_lost());
}

/// A backward step of the server's clock only makes leases last longer in real time, so it is
/// not reported; fencing tokens keep increasing across it (the document keeps the last token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backward_step_of_the_servers_clock_keeps_the_lease_and_the_token_order() {
    let dedicated = server::start_dedicated(None);
    let database = database(&dedicated.uri).await;
    let collection = common::unique("locks");
    let lock = MongoDistributedLock::new(common::unique("stepped-back"), &database)
        .with_collection(collection.as_str())
        .with_options(common::options(5_000, 500));
    let first = lock.acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    step_clock(&database, -60_000).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(!first.is_lost(), "a backward step is no loss");
    let token = first.fencing_token();
    first.release().await.unwrap();
    let second = lock.acquire().await.unwrap();
    assert!(second.fencing_token() > token, "tokens keep increasing");
    second.release().await.unwrap();
}
