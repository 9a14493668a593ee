//! "Who blocks me": an acquisition that times out names what held the lock at that moment, for
//! every kind, in its error and in one line of its message.

use test_support as common;

use std::time::Duration;

use distributed_lock_mongodb::{
    CompositeMember, DocumentLock, Error, LockDetails, LockKind, LockStatus, MongoDistributedLock,
    MongoDistributedReaderWriterLock, MongoDistributedSemaphore, Provider,
};
use mongodb::bson::{Document, doc};

const EXPIRY: Duration = Duration::from_secs(20);

fn options() -> distributed_lock_mongodb::LockOptions {
    common::options(EXPIRY.as_millis() as u64, 5_000)
}

/// The holders a timed-out acquisition reports, checked to be a one-line message naming them.
fn holders_of(error: Error) -> Vec<LockStatus> {
    let message = error.to_string();
    assert!(!message.contains('\n'), "one line: {message}");
    match error {
        Error::Timeout { holders, .. } => {
            for holder in &holders {
                let lock_id = holder.lock_id.as_deref().expect("a holder's lock id");
                assert!(message.contains(lock_id), "{message}");
            }
            holders
        }
        other => panic!("not a timeout: {other}"),
    }
}

/// A holder's lease was live, with at most the expiry left.
fn live(holder: &LockStatus) -> bool {
    holder
        .remaining
        .is_some_and(|left| !left.is_zero() && left <= EXPIRY)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusive_lock_names_its_holder_with_its_details_and_lease_left() {
    let database = common::database().await;
    let collection = common::unique("locks");
    let name = common::unique("blocked");
    let holder = MongoDistributedLock::new(name.as_str(), &database)
        .with_collection(collection.as_str())
        .with_options(options())
        .with_details(LockDetails::new().with_owner("nightly-report"));
    let guard = holder.acquire().await.unwrap();
    let waiter = MongoDistributedLock::new(name.as_str(), &database)
        .with_collection(collection.as_str())
        .with_options(options());
    let error = waiter
        .acquire_timeout(Duration::from_millis(300))
        .await
        .unwrap_err();
    let message = error.to_string();
    let holders = holders_of(error);
    assert_eq!(holders.len(), 1, "{holders:?}");
    let blocker = &holders[0];
    assert_eq!(blocker.kind, LockKind::Exclusive);
    assert_eq!(blocker.owner(), Some("nightly-report"));
    assert!(live(blocker), "{blocker:?}");
    assert!(message.contains("owner nightly-report"), "{message}");
    assert!(message.contains("of its lease left"), "{message}");
    println!("who blocks me: {message}");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_and_a_reader_writer_lock_name_every_holder() {
    let database = common::database().await;
    let name = common::unique("blocked");
    let semaphore = MongoDistributedSemaphore::new(name.as_str(), 2, &database)
        .with_collection(common::unique("semaphores"))
        .with_options(options());
    let places = [
        semaphore.acquire().await.unwrap(),
        semaphore.acquire().await.unwrap(),
    ];
    let error = semaphore
        .acquire_timeout(Duration::from_millis(300))
        .await
        .unwrap_err();
    let holders = holders_of(error);
    assert_eq!(holders.len(), 2, "{holders:?}");
    assert!(
        holders
            .iter()
            .all(|holder| holder.kind == LockKind::Semaphore && live(holder))
    );
    for place in places {
        place.release().await.unwrap();
    }

    let rw = MongoDistributedReaderWriterLock::new(name.as_str(), &database)
        .with_collection(common::unique("rw"))
        .with_options(options());
    let reads = [
        rw.acquire_read().await.unwrap(),
        rw.acquire_read().await.unwrap(),
    ];
    let error = rw
        .acquire_write_timeout(Duration::from_millis(300))
        .await
        .unwrap_err();
    let holders = holders_of(error);
    assert_eq!(holders.len(), 2, "{holders:?}");
    assert!(
        holders
            .iter()
            .all(|holder| holder.kind == LockKind::Read && live(holder))
    );
    drop(reads);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_document_lock_and_a_composite_name_their_holder() {
    let database = common::database().await;
    let documents = database.collection::<Document>(&common::unique("orders"));
    documents.insert_one(doc! { "_id": 7 }).await.unwrap();
    let locks = DocumentLock::new(&documents).with_options(options());
    let guard = locks.lock(doc! { "_id": 7 }).await.unwrap();
    let error = locks
        .lock_timeout(doc! { "_id": 7 }, Duration::from_millis(300))
        .await
        .unwrap_err();
    let holders = holders_of(error);
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0].kind, LockKind::Document);
    assert_eq!(holders[0].name, format!("{}/7", documents.name()));
    assert_eq!(holders[0].fencing_token, Some(guard.fencing_token()));
    assert!(live(&holders[0]), "{:?}", holders[0]);
    guard.release().await.unwrap();

    let provider = Provider::new(&database)
        .with_collection(common::unique("locks"))
        .with_options(options());
    let busy = common::unique("busy");
    let held = provider.create_lock(busy.as_str()).acquire().await.unwrap();
    let free = common::unique("free");
    let error = provider
        .acquire_all(
            &[
                CompositeMember::Exclusive(&free),
                CompositeMember::Exclusive(&busy),
            ],
            Duration::from_millis(300),
        )
        .await
        .unwrap_err();
    let holders = holders_of(error);
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0].name, busy);
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_free_again_when_read_names_nobody() {
    // The holder releases as the waiter gives up: the read finds nobody, and says so.
    let (lock, _) = common::fresh_lock("gone", options()).await;
    let error = Error::Timeout {
        name: lock.name().to_owned(),
        waited: Duration::from_secs(1),
        holders: lock.holders().await.unwrap(),
    };
    assert_eq!(
        error.to_string(),
        format!("timed out after 1s waiting to acquire {:?}", lock.name())
    );
}

/// The read that names the holder for the error of a wait that ran out is bounded by a small
/// share of the caller's timeout, and the error's `waited` is the whole wait. Fails when the
/// read may take seconds (`acquire_timeout(200 ms)` returned after 3.2 s, saying 200 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_read_of_the_holder_does_not_prolong_a_short_wait() {
    const READ_DELAY: Duration = Duration::from_secs(3);
    let (proxy, client) = common::proxy::proxied_client().await;
    let database = client.database(common::DATABASE);
    let collection = common::unique("locks");
    let name = common::unique("slow-read");
    let holder = MongoDistributedLock::new(name.as_str(), &common::database().await)
        .with_collection(collection.as_str())
        .with_options(options())
        .acquire()
        .await
        .unwrap();
    // The holders are read with an aggregation that starts with `$match` (a change stream's
    // starts with `$changeStream`).
    let slow = proxy.add_rule(
        common::proxy::Rule::new("aggregate", common::proxy::Action::Delay(READ_DELAY))
            .where_present("pipeline")
            .on(&collection)
            .times(100),
    );
    let waiter = MongoDistributedLock::new(name.as_str(), &database)
        .with_collection(collection.as_str())
        .with_options(options());
    let started = std::time::Instant::now();
    let error = waiter
        .acquire_timeout(Duration::from_millis(200))
        .await
        .unwrap_err();
    let took = started.elapsed();
    println!("acquire_timeout(200 ms) with a 3 s read of the holder returned after {took:?}");
    assert!(took < READ_DELAY, "returned after {took:?}: {error}");
    let Error::Timeout { waited, .. } = error else {
        panic!("{error}");
    };
    assert!(
        waited + Duration::from_millis(100) >= took,
        "the error says {waited:?}, the wait took {took:?}"
    );
    assert!(
        proxy.hits(slow) >= 1,
        "the holders were read through the proxy"
    );
    holder.release().await.unwrap();
}
