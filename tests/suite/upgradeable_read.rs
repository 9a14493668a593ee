//! The upgradeable read lock: one upgradeable reader beside plain readers, which keeps writers
//! out, becomes the writer (with the next fencing token) once the plain readers have left, and
//! goes back to reading, without another writer getting in between.

use test_support as common;

use std::time::Duration;

use distributed_lock_mongodb::{Error, MongoDistributedReaderWriterLock, UpgradeableReadGuard};
use mongodb::bson::{Document, doc};
use mongodb::{Collection, Database};

/// A reader-writer lock with a unique name in a unique collection, waiting briefly between
/// attempts.
fn rw_lock(database: &Database, collection: &str) -> MongoDistributedReaderWriterLock {
    MongoDistributedReaderWriterLock::new(common::unique("rw"), database)
        .with_collection(collection)
        .with_options(common::options(10_000, 3_000))
}

/// Another process's lock of the same name (built apart: no handoff between the two).
fn elsewhere(
    lock: &MongoDistributedReaderWriterLock,
    database: &Database,
    collection: &str,
) -> MongoDistributedReaderWriterLock {
    MongoDistributedReaderWriterLock::new(lock.name(), database)
        .with_collection(collection)
        .with_options(common::options(10_000, 3_000))
}

/// A lock in a fresh collection of `database`, the same lock of another process, and the
/// collection.
fn two_processes(
    database: &Database,
) -> (
    MongoDistributedReaderWriterLock,
    MongoDistributedReaderWriterLock,
    Collection<Document>,
) {
    let collection = common::unique("rw");
    let lock = rw_lock(database, &collection);
    let other = elsewhere(&lock, database, &collection);
    (lock, other, database.collection(&collection))
}

async fn stored(collection: &Collection<Document>, name: &str) -> Document {
    common::lock_document(collection, name)
        .await
        .expect("the lock has a document")
}

/// The waiting-writer marker's id, if one is stored (live or not: only an attempt, which drops
/// an ended one, or a removal takes it out).
async fn marker(collection: &Collection<Document>, name: &str) -> Option<String> {
    let document = stored(collection, name).await;
    let marker = document.get_document("waitingWriter").ok()?;
    marker.get_str("id").ok().map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_upgradeable_reader_at_a_time_reads_beside_plain_readers_and_keeps_writers_out() {
    let (database, log) = common::counting_database().await;
    let (lock, other, documents) = two_processes(&database);

    log.clear();
    let upgradeable = lock
        .try_acquire_upgradeable_read()
        .await
        .unwrap()
        .expect("free");
    assert_eq!(log.count("findAndModify"), 1, "{:?}", log.started());
    assert!(!upgradeable.is_upgraded());
    assert_eq!(upgradeable.fencing_token(), None);
    let readers = stored(&documents, lock.name()).await;
    let entry = readers.get_array("readers").unwrap()[0]
        .as_document()
        .unwrap()
        .clone();
    assert_eq!(entry.get_bool("upgradeable"), Ok(true), "{entry}");
    assert_eq!(entry.get_str("id"), Ok(upgradeable.lock_id()));

    // Plain readers join beside it; a second upgradeable reader does not, here or elsewhere.
    let plain = other
        .try_acquire_read()
        .await
        .unwrap()
        .expect("readers share");
    assert!(
        other
            .try_acquire_upgradeable_read()
            .await
            .unwrap()
            .is_none()
    );
    assert!(lock.try_acquire_upgradeable_read().await.unwrap().is_none());
    // No writer gets in, even once the plain reader has left.
    plain.release().await.unwrap();
    assert!(
        other
            .try_acquire_write_timeout(Duration::from_millis(300))
            .await
            .unwrap()
            .is_none()
    );

    // Once it has gone, another may be upgradeable, and the writer gets in after that.
    upgradeable.release().await.unwrap();
    let second = other
        .try_acquire_upgradeable_read()
        .await
        .unwrap()
        .expect("the first upgradeable reader left");
    second.release().await.unwrap();
    let writer = other.try_acquire_write().await.unwrap().expect("free");
    writer.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_waits_for_plain_readers_holds_new_ones_back_and_gets_the_next_token() {
    let (database, log) = common::counting_database().await;
    let (lock, other, documents) = two_processes(&database);
    let before = other.acquire_write().await.unwrap();
    let earlier = before.fencing_token();
    before.release().await.unwrap();

    let mut guard = lock.acquire_upgradeable_read().await.unwrap();
    let plain = other.acquire_read().await.unwrap();

    // Alone, an upgrade is one command: with the plain reader there, it waits.
    log.clear();
    assert!(!guard.try_upgrade().await.unwrap());
    assert_eq!(log.count("findAndModify"), 1, "{:?}", log.started());
    assert!(
        marker(&documents, lock.name()).await.is_none(),
        "a single attempt leaves no marker"
    );
    let upgrade = tokio::spawn(async move { guard.upgrade().await.map(|()| guard) });
    // The state to wait for: new readers are refused (a probe that got in is released at once;
    // the marker's lease is short, and a starved upgrade may let it lapse for a moment).
    let held_back = common::eventually(Duration::from_secs(10), || async {
        match other.try_acquire_read().await.unwrap() {
            Some(read) => {
                read.release().await.unwrap();
                false
            }
            None => true,
        }
    })
    .await;
    assert!(held_back, "new readers wait behind the upgrade");
    assert!(marker(&documents, lock.name()).await.is_some());
    plain.release().await.unwrap();
    let guard: UpgradeableReadGuard = tokio::time::timeout(Duration::from_secs(30), upgrade)
        .await
        .expect("upgraded once the plain reader left")
        .unwrap()
        .unwrap();
    assert!(guard.is_upgraded());
    let token = guard.fencing_token().expect("a writer's token");
    assert!(token > earlier, "{token:?} after {earlier:?}");
    assert_eq!(guard.writer().unwrap().fencing_token(), token);
    let document = stored(&documents, lock.name()).await;
    assert!(
        document.get_document("waitingWriter").is_err(),
        "{document}"
    );
    assert_eq!(
        document.get_array("readers").unwrap().len(),
        1,
        "{document}"
    );
    assert!(other.try_acquire_read().await.unwrap().is_none());
    assert!(other.try_acquire_write().await.unwrap().is_none());
    guard.release().await.unwrap();
    let document = stored(&documents, lock.name()).await;
    assert_eq!(
        document.get_array("readers").unwrap().len(),
        0,
        "{document}"
    );
    let next = other.try_acquire_write().await.unwrap().expect("free");
    assert!(next.fencing_token() > token);
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgrade_lets_readers_back_in_and_no_writer_gets_in_between() {
    let database = common::database().await;
    let (lock, other, documents) = two_processes(&database);

    // A writer waits elsewhere all along, its marker placed first.
    let mut guard = lock.acquire_upgradeable_read().await.unwrap();
    let waiting = {
        let other = other.clone();
        tokio::spawn(async move { other.acquire_write().await })
    };
    assert!(
        common::eventually(Duration::from_secs(10), || async {
            marker(&documents, lock.name()).await.is_some()
        })
        .await
    );
    let theirs = marker(&documents, lock.name()).await;

    // The other writer's marker does not hold the upgrade back (it waits for this very
    // reader), and stays: that writer goes next.
    guard.upgrade().await.unwrap();
    let first = guard.fencing_token().unwrap();
    assert_eq!(marker(&documents, lock.name()).await, theirs);
    guard.downgrade().await.unwrap();
    assert!(!guard.is_upgraded());
    assert_eq!(guard.fencing_token(), None);
    let document = stored(&documents, lock.name()).await;
    assert_eq!(
        document.get_document("writer").unwrap().get("id"),
        None,
        "the write lease ended: {document}"
    );
    assert_eq!(
        document.get_array("readers").unwrap().len(),
        1,
        "{document}"
    );
    assert!(!waiting.is_finished(), "no writer got in while it reads");

    // Up and down again: each write lease with a new token.
    guard.upgrade().await.unwrap();
    assert!(guard.fencing_token().unwrap() > first);
    guard.downgrade().await.unwrap();
    guard.release().await.unwrap();
    let writer = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the waiting writer gets in once the upgradeable reader left")
        .unwrap()
        .unwrap();
    writer.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_that_runs_out_removes_its_marker_and_keeps_reading() {
    let database = common::database().await;
    let (lock, other, documents) = two_processes(&database);
    let mut guard = lock.acquire_upgradeable_read().await.unwrap();
    let plain = other.acquire_read().await.unwrap();

    assert!(
        !guard
            .try_upgrade_timeout(Duration::from_millis(600))
            .await
            .unwrap()
    );
    assert_eq!(marker(&documents, lock.name()).await, None);
    assert!(!guard.is_upgraded());
    let more = other
        .try_acquire_read()
        .await
        .unwrap()
        .expect("readers join again");

    // A dropped upgrade removes its marker too.
    {
        let upgrade = guard.upgrade();
        assert!(
            tokio::time::timeout(Duration::from_millis(400), upgrade)
                .await
                .is_err()
        );
    }
    assert!(
        common::eventually(Duration::from_secs(10), || async {
            marker(&documents, lock.name()).await.is_none()
        })
        .await
    );
    assert!(!guard.is_upgraded());
    for reader in [plain, more] {
        reader.release().await.unwrap();
    }
    guard.upgrade().await.unwrap();
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_after_the_read_lease_was_lost_writes_nothing() {
    let (database, log) = common::counting_database().await;
    let (lock, other, documents) = two_processes(&database);
    let mut guard = lock.acquire_upgradeable_read().await.unwrap();

    // An operator ends the read lease; the guard hears of it at its next renewal.
    let holders = lock.holders().await.unwrap();
    assert_eq!(holders.len(), 1);
    let provider = distributed_lock_mongodb::Provider::new(&database)
        .with_reader_writer_collection(documents.name());
    assert!(provider.force_release_holder(&holders[0]).await.unwrap());
    tokio::time::timeout(Duration::from_secs(10), guard.lost().wait())
        .await
        .expect("lost at the next renewal");
    log.clear();
    assert!(matches!(guard.upgrade().await, Err(Error::LockLost { .. })));
    assert_eq!(log.count("findAndModify"), 0, "{:?}", log.started());
    assert_eq!(marker(&documents, lock.name()).await, None);
    // Someone else may be upgradeable now.
    let theirs = other
        .try_acquire_upgradeable_read()
        .await
        .unwrap()
        .expect("free");
    theirs.release().await.unwrap();
    assert!(matches!(guard.release().await, Err(Error::LockLost { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_the_upgrade_ends_when_the_read_lease_is_lost() {
    let database = common::database().await;
    let (lock, other, documents) = two_processes(&database);
    let mut guard = lock.acquire_upgradeable_read().await.unwrap();
    let plain = other.acquire_read().await.unwrap();
    let reader = guard.lock_id().to_owned();
    let upgrade = tokio::spawn(async move { (guard.upgrade().await, guard) });
    assert!(
        common::eventually(Duration::from_secs(10), || async {
            marker(&documents, lock.name()).await.is_some()
        })
        .await
    );
    // Someone removes the upgradeable reader's lease.
    documents
        .update_one(
            doc! { "_id": lock.name() },
            doc! { "$pull": { "readers": { "id": &reader } } },
        )
        .await
        .unwrap();
    let (upgraded, guard) = tokio::time::timeout(Duration::from_secs(15), upgrade)
        .await
        .expect("the wait ends at the loss")
        .unwrap();
    assert!(
        matches!(upgraded, Err(Error::LockLost { .. })),
        "{upgraded:?}"
    );
    assert!(!guard.is_upgraded());
    assert!(
        common::eventually(Duration::from_secs(10), || async {
            marker(&documents, lock.name()).await.is_none()
        })
        .await,
        "its marker goes"
    );
    plain.release().await.unwrap();
    let writer = other
        .try_acquire_write()
        .await
        .unwrap()
        .expect("nothing left");
    writer.release().await.unwrap();
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgrade_hands_the_lock_to_local_readers_in_its_release_command() {
    let (database, log) = common::counting_database().await;
    let collection = common::unique("rw");
    let lock = rw_lock(&database, &collection);
    let mut guard = lock.acquire_upgradeable_read().await.unwrap();
    guard.upgrade().await.unwrap();
    // A reader of this process waits behind the write lease.
    let waiting = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.acquire_read().await })
    };
    // The write lease is held here: the reader queues at once, with an offer.
    assert!(common::offers_become(&collection, lock.name(), 1).await);
    log.clear();
    guard.downgrade().await.unwrap();
    let reader = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("admitted by the downgrade")
        .unwrap()
        .unwrap();
    assert_eq!(log.transfers(), 1, "{:?}", log.started());
    let holders = lock.holders().await.unwrap();
    assert_eq!(holders.len(), 2, "{holders:?}");
    assert!(holders.iter().any(|holder| holder.upgradeable));
    reader.release().await.unwrap();
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_ends_both_leases_and_a_min_hold_is_refused_before_anything_is_sent() {
    let (database, log) = common::counting_database().await;
    let collection = common::unique("rw");
    let documents = database.collection::<Document>(&collection);
    let provider = distributed_lock_mongodb::Provider::new(&database)
        .with_reader_writer_collection(collection.as_str())
        .with_options(common::options(10_000, 3_000));
    let lock = provider.create_reader_writer_lock(common::unique("rw"));
    let mut guard = lock.acquire_upgradeable_read().await.unwrap();
    guard.upgrade().await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), provider.shutdown())
        .await
        .expect("shut down");
    assert!(lock.holders().await.unwrap().is_empty());
    assert!(guard.is_lost());
    log.clear();
    guard.downgrade().await.unwrap_err();
    assert!(guard.upgrade().await.is_err());
    assert_eq!(log.count("findAndModify"), 0, "{:?}", log.started());
    assert_eq!(marker(&documents, lock.name()).await, None);
    assert!(guard.release().await.is_err());

    let with_min_hold = MongoDistributedReaderWriterLock::new(common::unique("rw"), &database)
        .with_collection(collection.as_str())
        .with_options(
            common::options(10_000, 3_000)
                .to_builder()
                .min_hold(Duration::from_secs(5))
                .build()
                .unwrap(),
        );
    log.clear();
    let refused = with_min_hold.try_acquire_upgradeable_read().await;
    assert!(
        matches!(refused, Err(Error::InvalidOptions(_))),
        "{refused:?}"
    );
    assert!(
        log.started_without_streams().is_empty(),
        "{:?}",
        log.started()
    );
}

/// An upgradeable reader waits outside the line of its process's waiters: a plain reader of the
/// same process that comes after a waiting upgradeable reader is not queued behind it (it would
/// wait for what only the upgradeable one waits for: the other upgradeable reader's end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_upgradeable_reader_holds_back_no_plain_reader_of_its_process() {
    let (database, log) = common::counting_database().await;
    let (lock, other, documents) = two_processes(&database);
    let held = other.acquire_upgradeable_read().await.unwrap();
    log.clear();
    let second = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.acquire_upgradeable_read().await })
    };
    // Its second attempt is on its way: the first failed (a waiter in line by then, if it
    // queued).
    let waits = common::eventually(Duration::from_secs(10), || async {
        log.count("findAndModify") >= 2
    })
    .await;
    assert!(waits, "{:?}", log.started());
    // (A hang bound: queued behind the second, this waited until the first one's end.)
    let plain = tokio::time::timeout(Duration::from_secs(20), lock.acquire_read())
        .await
        .expect("the plain reader is not held back")
        .unwrap();
    assert!(!second.is_finished());
    plain.release().await.unwrap();
    held.release().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(20), second)
        .await
        .expect("the second gets in once the first has gone")
        .unwrap()
        .unwrap();
    second.release().await.unwrap();
    assert_eq!(marker(&documents, lock.name()).await, None);
}

/// A write lease lost under an upgraded reader (an operator ended it): the guard no longer
/// counts as upgraded, and its next upgrade takes a new write lease with a newer token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_write_lease_is_let_go_and_the_next_upgrade_takes_a_new_one() {
    let database = common::database().await;
    let (lock, _, documents) = two_processes(&database);
    let mut guard = lock.acquire_upgradeable_read().await.unwrap();
    guard.upgrade().await.unwrap();
    let first = guard.fencing_token().unwrap();
    let provider = distributed_lock_mongodb::Provider::new(&database)
        .with_reader_writer_collection(documents.name());
    let holders = lock.holders().await.unwrap();
    let writer = holders
        .iter()
        .find(|holder| holder.fencing_token.is_some())
        .expect("the write lease");
    assert!(provider.force_release_holder(writer).await.unwrap());
    let lost = guard.writer().unwrap().lost();
    tokio::time::timeout(Duration::from_secs(10), lost.wait())
        .await
        .expect("lost at the next renewal");
    assert!(!guard.is_upgraded());
    assert_eq!(guard.fencing_token(), None);
    assert!(guard.is_lost(), "a lease it holds is lost");
    guard.upgrade().await.unwrap();
    assert!(guard.fencing_token().unwrap() > first);
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
    assert!(lock.holders().await.unwrap().is_empty());
}
