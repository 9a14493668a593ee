//! Revocation (`acquire_revoking`, `Provider::request_revocation`, `revocation_requested`): a
//! waiter or an operator asks the holder of an exclusive lock to let go; the holder sees the
//! request; the lock is kept for the asking waiter once free; a holder that ignores the request
//! past its grace loses the lock and the asker takes it with a larger fencing token.

use test_support as common;

use std::time::Duration;

use distributed_lock_mongodb::{
    Error, Fence, FenceOutcome, LockOptions, MongoDistributedLock,
    MongoDistributedReaderWriterLock, RevokeRequest,
};
use mongodb::bson::{DateTime, Document, doc};
use mongodb::{Collection, Database};

/// A fresh collection (its name and handle) and a fresh lock name.
fn fresh(database: &Database) -> (String, Collection<Document>, String) {
    let collection = common::unique("revoke");
    let documents = database.collection::<Document>(&collection);
    (collection, documents, common::unique("revoke"))
}

/// Lock `name` in `collection` with `options`, as one process's lock object.
fn lock(
    database: &Database,
    collection: &str,
    name: &str,
    options: LockOptions,
) -> MongoDistributedLock {
    MongoDistributedLock::new(name, database)
        .with_collection(collection)
        .with_options(options)
}

/// Lock `name` in `collection` with `options`, acquired.
async fn held(
    database: &Database,
    collection: &str,
    name: &str,
    options: LockOptions,
) -> distributed_lock_mongodb::LockGuard {
    lock(database, collection, name, options)
        .acquire()
        .await
        .unwrap()
}

/// The request stored in lock `name`'s document, if any.
async fn request(documents: &Collection<Document>, name: &str) -> Option<Document> {
    let document = common::lock_document(documents, name).await?;
    document.get_document("revoke").ok().cloned()
}

/// Waits until lock `name`'s request has priority `priority`.
async fn request_of_priority(documents: &Collection<Document>, name: &str, priority: i32) {
    let reached = common::eventually(Duration::from_secs(10), || async {
        request(documents, name)
            .await
            .is_some_and(|request| request.get_i32("priority") == Ok(priority))
    })
    .await;
    assert!(reached, "{:?}", request(documents, name).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_sees_the_request_and_the_asker_gets_the_lock_when_it_lets_go() {
    let database = common::database().await;
    let (collection, documents, name) = fresh(&database);
    let options = common::options(10_000, 2_000);
    let holder = held(&database, &collection, &name, options.clone()).await;
    let asker = {
        let lock = lock(&database, &collection, &name, options.clone());
        let request = RevokeRequest::new(Duration::from_secs(60)).priority(3);
        tokio::spawn(async move {
            lock.acquire_revoking(request, Duration::from_secs(60))
                .await
        })
    };
    let revocation = tokio::time::timeout(Duration::from_secs(30), holder.revocation_requested())
        .await
        .expect("the holder is told")
        .unwrap();
    assert_eq!(revocation.priority, 3);
    assert!(!revocation.by_operator);
    assert!(
        revocation.grace_left > Duration::from_secs(30)
            && revocation.grace_left <= Duration::from_secs(60),
        "{revocation:?}"
    );
    // The status shows it too.
    let status = lock(&database, &collection, &name, options.clone())
        .status()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.revocation.map(|r| r.priority), Some(3));

    let old_token = holder.fencing_token();
    holder.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(30), asker)
        .await
        .expect("the asker gets the lock")
        .unwrap()
        .unwrap();
    assert!(guard.fencing_token() > old_token);
    assert!(
        request(&documents, &name).await.is_none(),
        "the request goes with the asker's acquisition"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_kept_for_an_asker_refuses_everyone_else_until_the_request_lapses() {
    let database = common::database().await;
    let (collection, documents, name) = fresh(&database);
    // (Released documents stay put, as on a server whose TTL monitor has not run yet.)
    common::block_ttl_index(&documents).await;
    let options = common::options(10_000, 2_000);
    let plain = lock(&database, &collection, &name, options);
    let guard = plain.acquire().await.unwrap();
    let token = guard.fencing_token();
    guard.release().await.unwrap();
    // A waiter of another process asked and was left the lock; it has not come back yet: its
    // request, with a lease of its own, keeps the lock for it.
    let until = DateTime::from_millis(DateTime::now().timestamp_millis() + 2_000);
    documents
        .update_one(
            doc! { "_id": &name },
            doc! { "$set": {
                "revoke": { "id": "someone-else", "graceUntil": until, "expiresAt": until,
                            "priority": 0, "reserves": true },
            } },
        )
        .await
        .unwrap();
    assert!(
        plain.try_acquire().await.unwrap().is_none(),
        "kept for the asker"
    );
    // An asker of lower or equal priority neither takes it nor replaces the request.
    let outranked = RevokeRequest::new(Duration::from_secs(1));
    let refused = plain
        .acquire_revoking(outranked, Duration::from_millis(200))
        .await;
    assert!(matches!(refused, Err(Error::Timeout { .. })), "{refused:?}");
    let stored = request(&documents, &name).await.unwrap();
    assert_eq!(stored.get_str("id"), Ok("someone-else"));
    // Once the request lapses (its asker stopped asking), anyone may take the lock.
    let taken = plain
        .try_acquire_timeout(Duration::from_secs(20))
        .await
        .unwrap()
        .expect("free once the request lapsed");
    assert!(taken.fencing_token() > token);
    taken.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_ignores_the_request_loses_the_lock_and_its_fenced_writes_are_refused() {
    let database = common::database().await;
    let (collection, _, name) = fresh(&database);
    let options = common::options(2_000, 500);
    let holder = held(&database, &collection, &name, options.clone()).await;
    let lost = holder.lost();
    let asker = lock(&database, &collection, &name, options);
    let guard = asker
        .acquire_revoking(
            RevokeRequest::new(Duration::from_millis(500)),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert!(
        lost.is_lost(),
        "the ignoring holder was told it lost the lock before the asker got it"
    );
    assert!(guard.fencing_token() > holder.fencing_token());
    let accounts = database.collection::<Document>(&common::unique("accounts"));
    accounts
        .insert_one(doc! { "_id": "acct", "balance": 100 })
        .await
        .unwrap();
    let write = |token| {
        let accounts = accounts.clone();
        async move {
            let update = doc! { "$inc": { "balance": 1 } };
            (Fence::new().update_one(&accounts, doc! { "_id": "acct" }, update, token))
                .await
                .unwrap()
        }
    };
    assert_eq!(write(guard.fencing_token()).await, FenceOutcome::Applied);
    assert_eq!(write(holder.fencing_token()).await, FenceOutcome::Stale);
    assert!(matches!(
        holder.release().await,
        Err(Error::LockLost { .. })
    ));
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_of_higher_priority_replaces_a_standing_one() {
    let database = common::database().await;
    let (collection, documents, name) = fresh(&database);
    let options = common::options(10_000, 2_000);
    let holder = held(&database, &collection, &name, options.clone()).await;
    let ask = |priority: i32| {
        let lock = lock(&database, &collection, &name, options.clone());
        tokio::spawn(async move {
            lock.acquire_revoking(
                RevokeRequest::new(Duration::from_secs(60)).priority(priority),
                Duration::from_secs(60),
            )
            .await
        })
    };
    let first = ask(1);
    request_of_priority(&documents, &name, 1).await;
    let first_id = request(&documents, &name).await.unwrap();
    let equal = ask(1);
    // The equal one attempts (every 5 to 20 ms) without replacing the first's request.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        request(&documents, &name).await.unwrap().get_str("id"),
        first_id.get_str("id")
    );
    let higher = ask(2);
    request_of_priority(&documents, &name, 2).await;
    let revocation = holder.revocation_requested().await.unwrap();
    assert_eq!(revocation.priority, 2);
    holder.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(30), higher)
        .await
        .expect("the higher request's asker gets the lock")
        .unwrap()
        .unwrap();
    first.abort();
    equal.abort();
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_is_refused_while_a_request_targets_the_lease() {
    let database = common::database().await;
    let (provider, _) = common::provider_with_own_collections(&database);
    let holder = provider
        .create_lock(common::unique("revoke"))
        .acquire()
        .await
        .unwrap();
    let asked = provider
        .request_revocation(holder.name(), Duration::from_secs(60))
        .await
        .unwrap()
        .expect("held");
    let revocation = asked.revocation.expect("the status shows the request");
    assert!(revocation.by_operator);
    assert_eq!(revocation.priority, i32::MAX);
    let refused = holder.extend(Duration::from_secs(600)).await;
    assert!(
        matches!(refused, Err(Error::RevocationRequested { .. })),
        "{refused:?}"
    );
    assert!(!holder.is_lost(), "the lease is still held");
    assert!(holder.revocation_requested().await.unwrap().by_operator);
    holder.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_request_on_a_free_lock_writes_nothing_and_keeps_the_lock_for_nobody() {
    let database = common::database().await;
    let (provider, [locks, _, _]) = common::provider_with_own_collections(&database);
    let lock = provider.create_lock(common::unique("revoke"));
    let name = lock.name().to_owned();
    assert!(
        provider
            .request_revocation(&name, Duration::from_secs(1))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        common::lock_document(&locks, &name).await.is_none(),
        "nothing written"
    );
    let guard = lock.acquire().await.unwrap();
    provider
        .request_revocation(&name, Duration::from_secs(60))
        .await
        .unwrap()
        .expect("held");
    guard.release().await.unwrap();
    // The operator's request keeps the lock for nobody.
    let next = lock.try_acquire().await.unwrap().expect("free");
    assert!(request(&locks, &name).await.is_none());
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_in_the_asking_process_hands_the_lock_over_in_its_command() {
    let (database, log) = common::counting_database().await;
    let (collection, _, name) = fresh(&database);
    // One lock object: holder and asker share its queue of local waiters.
    let lock = lock(
        &database,
        &collection,
        &name,
        common::options(10_000, 2_000),
    );
    let holder = lock.acquire().await.unwrap();
    let asker = {
        let lock = lock.clone();
        tokio::spawn(async move {
            lock.acquire_revoking(
                RevokeRequest::new(Duration::from_secs(60)),
                Duration::from_secs(60),
            )
            .await
        })
    };
    holder.revocation_requested().await.unwrap();
    assert!(common::offers_become(&collection, &name, 1).await);
    log.clear();
    holder.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(30), asker)
        .await
        .expect("handed over")
        .unwrap()
        .unwrap();
    assert_eq!(log.transfers(), 1, "{:?}", log.started());
    assert_eq!(
        log.count("update"),
        0,
        "no plain release: {:?}",
        log.started()
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_asks_costs_one_command_per_attempt_and_one_to_withdraw_its_request() {
    let (database, log) = common::counting_database().await;
    let (collection, documents, name) = fresh(&database);
    let options = common::options(10_000, 2_000);
    let holder = held(&database, &collection, &name, options.clone()).await;
    let asker = lock(&database, &collection, &name, options);
    log.clear();
    let waited = asker
        .acquire_revoking(
            RevokeRequest::new(Duration::from_secs(60)),
            Duration::from_millis(300),
        )
        .await;
    assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
    assert!(log.count("findAndModify") >= 2, "{:?}", log.started());
    assert_eq!(log.count("update"), 1, "{:?}", log.started());
    // (The timeout reads the holders to name them.)
    let others = (log.started_without_streams().into_iter())
        .filter(|command| {
            !["findAndModify", "update", "createIndexes", "find"].contains(&command.as_str())
        })
        .count();
    assert_eq!(others, 0, "{:?}", log.started());
    assert!(request(&documents, &name).await.is_none(), "withdrawn");
    // The holder keeps its lease, renewable as before.
    holder.extend(Duration::from_secs(20)).await.unwrap();
    holder.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_revocations_are_refused_before_anything_is_sent() {
    let (database, log) = common::counting_database().await;
    let (collection, documents, name) = fresh(&database);
    let fair = common::options(10_000, 2_000)
        .to_builder()
        .fair(true)
        .build()
        .unwrap();
    log.clear();
    let refused = lock(&database, &collection, &name, fair)
        .acquire_revoking(
            RevokeRequest::new(Duration::from_secs(1)),
            Duration::from_secs(1),
        )
        .await;
    assert!(
        matches!(&refused, Err(Error::InvalidArgument(message)) if message.contains("fair")),
        "{refused:?}"
    );
    let too_long = Duration::from_secs(366 * 24 * 60 * 60);
    let refused = lock(
        &database,
        &collection,
        &name,
        common::options(10_000, 2_000),
    )
    .acquire_revoking(RevokeRequest::new(too_long), Duration::from_secs(1))
    .await;
    assert!(
        matches!(&refused, Err(Error::InvalidArgument(message)) if message.contains("365 days")),
        "{refused:?}"
    );
    let provider =
        distributed_lock_mongodb::Provider::new(&database).with_collection(collection.as_str());
    let refused = provider.request_revocation(&name, too_long).await;
    assert!(
        matches!(refused, Err(Error::InvalidArgument(_))),
        "{refused:?}"
    );
    assert_eq!(log.started_without_streams(), Vec::<String>::new());
    assert!(common::lock_document(&documents, &name).await.is_none());

    // Only an exclusive lock's holder and a semaphore's place can be asked; a writer cannot.
    let rw = MongoDistributedReaderWriterLock::new(common::unique("revoke"), &database)
        .with_collection(collection.as_str());
    let writer = rw.acquire_write().await.unwrap();
    let refused = writer.revocation_requested().await;
    assert!(
        matches!(refused, Err(Error::InvalidArgument(_))),
        "{refused:?}"
    );
    writer.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_asked_to_step_down_resigns_and_the_asker_is_elected() {
    let database = common::database().await;
    let (provider, _) = common::provider_with_own_collections(&database);
    let provider = provider.with_options(common::options(10_000, 2_000));
    let name = common::unique("revoke");
    let election = provider.create_leader_election(name.as_str()).unwrap();
    let mut leading = election.watch();
    tokio::time::timeout(Duration::from_secs(30), leading.wait_for(|leader| *leader))
        .await
        .expect("elected")
        .unwrap();
    let term = election.fencing_token().unwrap();
    let asker = {
        let lock = provider.create_lock(name.as_str());
        tokio::spawn(async move {
            lock.acquire_revoking(
                RevokeRequest::new(Duration::from_secs(60)),
                Duration::from_secs(60),
            )
            .await
        })
    };
    let revocation = tokio::time::timeout(Duration::from_secs(30), election.revocation_requested())
        .await
        .expect("the leader is told")
        .unwrap();
    assert!(!revocation.by_operator);
    election.resign().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(30), asker)
        .await
        .expect("the asker takes the lock")
        .unwrap()
        .unwrap();
    assert!(guard.fencing_token() > term);
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_asks_one_semaphore_place_to_let_go_and_only_that_place_ends() {
    let database = common::database().await;
    let (provider, _) = common::provider_with_own_collections(&database);
    let provider = provider.with_options(common::options(2_000, 500));
    let pool = provider.create_semaphore(common::unique("revoke"), 2);
    let first = pool.acquire().await.unwrap();
    let second = pool.acquire().await.unwrap();
    let holders = pool.holders().await.unwrap();
    let entry = holders
        .iter()
        .find(|holder| holder.lock_id.as_deref() == Some(first.lock_id()))
        .unwrap();
    let asked = provider
        .request_revocation_of(entry, Duration::from_millis(600))
        .await
        .unwrap()
        .expect("held");
    assert!(asked.revocation.is_some_and(|r| r.by_operator));
    // One request per semaphore at a time: the other place is not asked meanwhile.
    let other = holders
        .iter()
        .find(|holder| holder.lock_id.as_deref() == Some(second.lock_id()))
        .unwrap();
    let refused = provider
        .request_revocation_of(other, Duration::from_secs(60))
        .await;
    assert!(
        matches!(&refused, Err(Error::InvalidArgument(message)) if message.contains("one request")),
        "{refused:?}"
    );
    let revocation = first.revocation_requested().await.unwrap();
    assert!(revocation.by_operator);
    let refused = first.extend(Duration::from_secs(30)).await;
    assert!(
        matches!(refused, Err(Error::RevocationRequested { .. })),
        "{refused:?}"
    );
    // Ignored past the grace: that place is lost; the other is renewed on as before.
    tokio::time::timeout(Duration::from_secs(30), first.lost().wait())
        .await
        .expect("the asked place is lost");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!second.is_lost(), "the other place is not asked");
    let third = pool
        .try_acquire()
        .await
        .unwrap()
        .expect("the lost place is free");
    assert!(third.fencing_token() > second.fencing_token());
    // A reader-writer lock's holder cannot be asked.
    let rw = provider.create_reader_writer_lock(common::unique("revoke"));
    let reader = rw.acquire_read().await.unwrap();
    let entry = rw.holders().await.unwrap().remove(0);
    let refused = provider
        .request_revocation_of(&entry, Duration::from_secs(1))
        .await;
    assert!(
        matches!(refused, Err(Error::InvalidArgument(_))),
        "{refused:?}"
    );
    reader.release().await.unwrap();
    third.release().await.unwrap();
    second.release().await.unwrap();
    assert!(matches!(first.release().await, Err(Error::LockLost { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_ends_a_revoking_wait_and_its_request_goes() {
    let database = common::database().await;
    let (collection, documents, name) = fresh(&database);
    let options = common::options(10_000, 2_000);
    let holder = held(&database, &collection, &name, options.clone()).await;
    let provider = distributed_lock_mongodb::Provider::new(&database)
        .with_collection(collection.as_str())
        .with_options(options);
    let waiting = {
        let lock = provider.create_lock(name.as_str());
        tokio::spawn(async move {
            lock.acquire_revoking(
                RevokeRequest::new(Duration::from_secs(60)),
                Duration::from_secs(60),
            )
            .await
        })
    };
    request_of_priority(&documents, &name, 0).await;
    tokio::time::timeout(Duration::from_secs(30), provider.shutdown())
        .await
        .expect("shut down");
    let ended = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the wait ends")
        .unwrap();
    assert!(matches!(ended, Err(Error::ShutDown)), "{ended:?}");
    let withdrawn = common::eventually(Duration::from_secs(10), || async {
        request(&documents, &name).await.is_none()
    })
    .await;
    assert!(withdrawn, "{:?}", request(&documents, &name).await);
    // The holder was asked, and is not any more: it renews and extends as before.
    holder.extend(Duration::from_secs(20)).await.unwrap();
    holder.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_min_hold_window_is_kept_and_the_asker_gets_the_lock_after_it() {
    const WINDOW: Duration = Duration::from_millis(1_500);
    let database = common::database().await;
    let (collection, documents, name) = fresh(&database);
    let windowed = common::options(10_000, 2_000)
        .to_builder()
        .min_hold(WINDOW)
        .build()
        .unwrap();
    let holder = held(&database, &collection, &name, windowed).await;
    let plain = lock(
        &database,
        &collection,
        &name,
        common::options(10_000, 2_000),
    );
    let window_end = plain
        .status()
        .await
        .unwrap()
        .unwrap()
        .min_hold_until
        .unwrap();
    let asker = {
        let lock = plain.clone();
        tokio::spawn(async move {
            lock.acquire_revoking(RevokeRequest::new(Duration::ZERO), Duration::from_secs(60))
                .await
        })
    };
    holder.revocation_requested().await.unwrap();
    // Let go at once: the window still keeps the lock taken, for everyone.
    holder.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(30), asker)
        .await
        .expect("the asker gets the lock")
        .unwrap()
        .unwrap();
    // (Server times, both: the window is kept by the server's clock.)
    let taken_at = plain.status().await.unwrap().unwrap().acquired_at.unwrap();
    assert!(
        taken_at >= window_end,
        "taken at {taken_at}, inside the window that ends at {window_end}"
    );
    assert!(request(&documents, &name).await.is_none());
    guard.release().await.unwrap();
}
