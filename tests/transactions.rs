//! Lease-checked transactions (`transaction` on the guards) and document checkpoints.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::proxy::{self, Action, Fault, Rule, replies};
use distributed_lock_mongodb::{DocumentLock, Error, MongoDistributedLock};
use mongodb::bson::{Document, doc};
use mongodb::{Client, Collection};

/// The embedded server refuses to commit a transaction if anything at all was written since it
/// began (a real server only when the same documents were): the tests of this binary run one at
/// a time, with renewal cadences far longer than a test, so that their transactions rarely meet
/// conflicts they did not provoke (those are retried; the assertions count commits, not runs).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A fresh collection of `client`: the writes of a transaction go through collections of the
/// client whose session they use.
fn accounts(client: &Client) -> Collection<Document> {
    client
        .database(common::DATABASE)
        .collection(&common::unique("accounts"))
}

async fn balance(accounts: &Collection<Document>, id: &str) -> Option<i32> {
    let account = accounts.find_one(doc! { "_id": id }).await.unwrap()?;
    Some(account.get_i32("balance").unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_commits_its_writes_while_the_lock_is_held() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let client = common::client().await;
    let accounts = accounts(&client);
    accounts
        .insert_one(doc! { "_id": "a", "balance": 100 })
        .await
        .unwrap();
    let (lock, collection) = common::fresh_lock("txn", common::options(30_000, 10_000)).await;
    let guard = lock.acquire().await.unwrap();
    let before = common::server_now_and_expiry(&collection, lock.name())
        .await
        .1
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await; // the renewal's $$NOW is later
    let moved = guard
        .transaction(&client, async |session| {
            accounts
                .update_one(doc! { "_id": "a" }, doc! { "$inc": { "balance": -10 } })
                .session(&mut *session)
                .await?;
            accounts
                .insert_one(doc! { "_id": "b", "balance": 10 })
                .session(&mut *session)
                .await?;
            Ok(10)
        })
        .await
        .unwrap();
    assert_eq!(moved, 10);
    assert_eq!(
        balance(&accounts, "a").await,
        Some(90),
        "committed exactly once"
    );
    assert_eq!(balance(&accounts, "b").await, Some(10));
    let after = common::server_now_and_expiry(&collection, lock.name())
        .await
        .1
        .unwrap();
    assert!(after > before, "the transaction renewed the lease");
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
}

/// A write conflict is transient: the transaction runs again and commits once. The proxy answers
/// the first `commitTransaction` with the `WriteConflict` a real server reports (labelled
/// `TransientTransactionError`), without forwarding it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_that_meets_a_write_conflict_runs_again() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let (proxy, client) = proxy::proxied_client().await;
    let mut conflict = replies::command_error(112, "WriteConflict");
    conflict.insert("errorLabels", vec!["TransientTransactionError"]);
    let injected = proxy.add_rule(Rule::new("commitTransaction", Action::Reply(conflict)));
    let accounts = accounts(&client);
    accounts
        .insert_one(doc! { "_id": "a", "balance": 100 })
        .await
        .unwrap();
    let (lock, _) = common::fresh_lock("txn-conflict", common::options(30_000, 10_000)).await;
    let guard = lock.acquire().await.unwrap();
    let runs = AtomicUsize::new(0);
    guard
        .transaction(&client, async |session| {
            runs.fetch_add(1, Ordering::SeqCst);
            accounts
                .update_one(doc! { "_id": "a" }, doc! { "$inc": { "balance": -10 } })
                .session(&mut *session)
                .await?;
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(proxy.hits(injected), 1, "the conflict was met");
    // At least twice: the embedded server also refuses a commit after unrelated writes (the
    // lock's TTL index being created in the background, say), which a real server does not.
    assert!(
        runs.load(Ordering::SeqCst) >= 2,
        "ran again after the conflict"
    );
    assert_eq!(
        balance(&accounts, "a").await,
        Some(90),
        "committed exactly once"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_after_a_takeover_runs_nothing_and_commits_nothing() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let client = common::client().await;
    let accounts = accounts(&client);
    // Cadence 10 s: the holder's renewal has not noticed the takeover yet.
    let (lock, collection) = common::fresh_lock("txn-taken", common::options(30_000, 10_000)).await;
    let guard = lock.acquire().await.unwrap();
    collection
        .update_one(
            doc! { "_id": lock.name() },
            doc! { "$set": { "lockId": "someone-else" } },
        )
        .await
        .unwrap();
    assert!(!guard.is_lost(), "not noticed by the renewal yet");
    let runs = AtomicUsize::new(0);
    let outcome = guard
        .transaction(&client, async |session| {
            runs.fetch_add(1, Ordering::SeqCst);
            accounts
                .insert_one(doc! { "_id": "x", "balance": 1 })
                .session(&mut *session)
                .await?;
            Ok(())
        })
        .await;
    assert!(
        matches!(outcome, Err(Error::LockLost { .. })),
        "{outcome:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the work never ran");
    assert_eq!(balance(&accounts, "x").await, None, "nothing written");
    let stored = common::lock_document(&collection, lock.name())
        .await
        .unwrap();
    assert_eq!(stored.get_str("lockId").unwrap(), "someone-else");
}

/// The holder is cut off from the server while its transaction runs (its renewals go through a
/// blackholed proxy; the transaction through a direct client): `lost` fires by the lease's
/// deadline, and the transaction's writes are not committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_whose_lease_is_lost_meanwhile_commits_nothing() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let (proxy, proxied) = proxy::proxied_client().await;
    let client = common::client().await;
    let accounts = accounts(&client);
    let collection = common::unique("locks");
    let lock = MongoDistributedLock::new(
        common::unique("txn-lost"),
        &proxied.database(common::DATABASE),
    )
    .with_collection(collection.as_str())
    .with_options(common::options(1_000, 200));
    let guard = lock.acquire().await.unwrap();
    let lost = guard.lost();
    let outcome = guard
        .transaction(&client, async |session| {
            accounts
                .insert_one(doc! { "_id": "y", "balance": 1 })
                .session(&mut *session)
                .await?;
            proxy.set(Fault::Blackhole);
            tokio::time::timeout(Duration::from_secs(10), lost.wait())
                .await
                .expect("lost by the lease's deadline");
            Ok(())
        })
        .await;
    assert!(
        matches!(outcome, Err(Error::LockLost { .. })),
        "{outcome:?}"
    );
    assert_eq!(balance(&accounts, "y").await, None, "nothing committed");
    proxy.set(Fault::Pass);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_document_checkpoint_writes_progress_and_keeps_the_lock() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let jobs = accounts(&common::client().await);
    jobs.insert_one(doc! { "_id": "job", "progress": 0 })
        .await
        .unwrap();
    let documents = DocumentLock::new(&jobs).with_options(common::options(30_000, 10_000));
    let job = documents.lock(doc! { "_id": "job" }).await.unwrap();
    job.checkpoint(doc! { "$set": { "progress": 50 } })
        .await
        .unwrap();
    let stored = jobs.find_one(doc! { "_id": "job" }).await.unwrap().unwrap();
    assert_eq!(stored.get_i32("progress").unwrap(), 50);
    assert!(stored.get_document("lock").unwrap().get_str("id").is_ok());
    assert!(
        documents
            .try_lock(doc! { "_id": "job" })
            .await
            .unwrap()
            .is_none(),
        "still locked"
    );
    let touching_the_lock = job.checkpoint(doc! { "$unset": { "lock": "" } }).await;
    assert!(matches!(touching_the_lock, Err(Error::InvalidArgument(_))));

    // A checkpoint by a holder whose lock was taken over writes nothing.
    jobs.update_one(
        doc! { "_id": "job" },
        doc! { "$set": { "lock.id": "intruder" } },
    )
    .await
    .unwrap();
    let late = job.checkpoint(doc! { "$set": { "progress": 75 } }).await;
    assert!(matches!(late, Err(Error::LockLost { .. })), "{late:?}");
    let stored = jobs.find_one(doc! { "_id": "job" }).await.unwrap().unwrap();
    assert_eq!(stored.get_i32("progress").unwrap(), 50, "nothing written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_document_guard_transaction_commits_while_the_document_is_locked() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let client = common::client().await;
    let jobs = accounts(&client);
    jobs.insert_one(doc! { "_id": "job", "status": "pending" })
        .await
        .unwrap();
    let audit = accounts(&client);
    let documents = DocumentLock::new(&jobs).with_options(common::options(30_000, 10_000));
    let job = documents.lock(doc! { "_id": "job" }).await.unwrap();
    job.transaction(&client, async |session| {
        audit
            .insert_one(doc! { "_id": "entry", "balance": 1 })
            .session(&mut *session)
            .await?;
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(balance(&audit, "entry").await, Some(1));
    job.commit(doc! { "$set": { "status": "done" } })
        .await
        .unwrap();
}
