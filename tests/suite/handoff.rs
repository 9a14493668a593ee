//! In-process handoff: a release wakes the longest-waiting local waiter at once.

use test_support as common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::proxy::{Action, Rule};
use distributed_lock_mongodb::{Error, LockGuard, LockOptions, MongoDistributedLock, Result};
use mongodb::Collection;
use mongodb::bson::{Document, doc};
use tokio::task::JoinHandle;

/// Waiters that would sleep 20 s between attempts: anything faster is the handoff.
fn sleepy_options() -> LockOptions {
    LockOptions::builder()
        .expiry(Duration::from_secs(30))
        .busy_wait_sleep_time(Duration::from_secs(20), Duration::from_secs(20))
        .build()
        .unwrap()
}

/// Starts a waiter for `lock` (held) and returns once it waits in line, as the `position`-th
/// (from 1) of `collection`'s waiters for it.
async fn wait_in_line(
    lock: &MongoDistributedLock,
    collection: &str,
    position: usize,
) -> tokio::task::JoinHandle<Instant> {
    let name = lock.name().to_owned();
    let lock = lock.clone();
    let waiter = tokio::spawn(async move {
        let guard = lock.acquire_timeout(Duration::from_secs(60)).await.unwrap();
        let acquired = Instant::now();
        // Hold briefly so the next waiter's turn is observable, then hand over.
        tokio::time::sleep(Duration::from_millis(100)).await;
        guard.release().await.unwrap();
        acquired
    });
    // It joins the queue (with its offer) before the next one starts.
    assert!(
        common::offers_become(collection, &name, position).await,
        "waiter {position} did not queue"
    );
    waiter
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_wake_local_waiters_one_at_a_time_in_arrival_order() {
    let (lock, collection) = common::fresh_lock("fifo", sleepy_options()).await;
    let guard = lock.acquire().await.unwrap();
    let mut waiters = Vec::new();
    for position in 1..=4 {
        waiters.push(wait_in_line(&lock, collection.name(), position).await);
    }
    let released = Instant::now();
    guard.release().await.unwrap();
    let mut previous = released;
    for (position, waiter) in waiters.into_iter().enumerate() {
        let acquired = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("woken long before its 20 s sleep ends")
            .unwrap();
        assert!(
            acquired > previous,
            "waiter {position} acquired out of arrival order"
        );
        // Each waiter holds 100 ms; the next one follows within a second, not after 20 s.
        assert!(
            acquired - previous < Duration::from_secs(1),
            "waiter {position}: {:?}",
            acquired - previous
        );
        previous = acquired;
    }
}

#[tokio::test]
async fn dropping_a_guard_wakes_a_waiter_too() {
    let (lock, collection) = common::fresh_lock("dropwake", sleepy_options()).await;
    let guard = lock.acquire().await.unwrap();
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move {
            lock.acquire_timeout(Duration::from_secs(60))
                .await
                .map(|g| g.fencing_token())
        })
    };
    assert!(common::offers_become(collection.name(), lock.name(), 1).await);
    let token = guard.fencing_token();
    drop(guard);
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("woken by the drop, not by its 20 s sleep")
        .unwrap()
        .unwrap();
    assert!(next > token);
}

#[tokio::test]
async fn a_cancelled_waiter_leaves_the_queue_and_the_next_one_is_woken() {
    let (lock, collection) = common::fresh_lock("leave", sleepy_options()).await;
    let guard = lock.acquire().await.unwrap();
    let first = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.acquire().await.map(|g| g.fencing_token()) })
    };
    assert!(common::offers_become(collection.name(), lock.name(), 1).await);
    let second = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.acquire().await.map(|g| g.fencing_token()) })
    };
    assert!(common::offers_become(collection.name(), lock.name(), 2).await);
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    guard.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("the remaining waiter is woken")
        .unwrap()
        .unwrap();
}

// ---- Transfer: the release command hands the lock over ----

/// A lock with [`sleepy_options`] in a fresh collection of `database`, and that collection.
fn sleepy_lock(
    database: &mongodb::Database,
    prefix: &str,
) -> (MongoDistributedLock, Collection<Document>) {
    let collection = common::unique("locks");
    let lock = MongoDistributedLock::new(common::unique(prefix), database)
        .with_collection(collection.as_str())
        .with_options(sleepy_options());
    (lock, database.collection(&collection))
}

/// A waiter for `lock` (held here) that waits in line in `collection`, with its offer standing.
async fn queued_waiter(
    lock: &MongoDistributedLock,
    collection: &Collection<Document>,
) -> JoinHandle<Result<LockGuard>> {
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move { lock.acquire_timeout(Duration::from_secs(60)).await }
    });
    assert!(
        common::offers_become(collection.name(), lock.name(), 1).await,
        "the waiter did not queue"
    );
    waiter
}

async fn stored(collection: &Collection<Document>, name: &str) -> Document {
    common::lock_document(collection, name)
        .await
        .expect("the lock document exists")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_to_a_local_waiter_in_one_command() {
    let (database, log) = common::counting_database().await;
    let (lock, collection) = sleepy_lock(&database, "transfer");
    let guard = lock.acquire().await.unwrap();
    let token = guard.fencing_token();
    log.clear();
    let waiter = queued_waiter(&lock, &collection).await;
    guard.release().await.unwrap();
    // One command released the lock and gave it to the waiter: no separate release, and no
    // attempt by the waiter (the lock was held in this process when it called, so it queued at
    // once; and its next poll would come after 20 s). (The TTL index, set up in the background
    // after the first acquisition, may show up too.)
    let lock_commands: Vec<String> = log
        .started()
        .into_iter()
        .filter(|command| !command.ends_with("Indexes"))
        .collect();
    assert_eq!(lock_commands, ["findAndModify"]);
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter holds the lock once the release returns")
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > token);
    assert!(!next.is_lost());
    let document = stored(&collection, lock.name()).await;
    assert_eq!(
        document.get_i64("fencingToken").unwrap(),
        next.fencing_token().get()
    );
    // A transferred guard is like an acquired one: it releases, and the lock is free again.
    next.release().await.unwrap();
    let again = lock.try_acquire().await.unwrap();
    again.expect("free after release").release().await.unwrap();
}

/// Starts `count` waiters for `lock` (held here, so each queues at once with an offer), one
/// after the other in line; each records its fencing token, holds the lock 10 ms and releases it.
async fn waiters_in_line(
    lock: &MongoDistributedLock,
    collection: &str,
    count: usize,
    tokens: &Arc<Mutex<Vec<distributed_lock_mongodb::FencingToken>>>,
) -> Vec<JoinHandle<()>> {
    let mut waiters = Vec::new();
    for queued in 1..=count {
        let (waiter, tokens) = (lock.clone(), Arc::clone(tokens));
        waiters.push(tokio::spawn(async move {
            let guard = waiter
                .acquire_timeout(Duration::from_secs(60))
                .await
                .unwrap();
            tokens.lock().unwrap().push(guard.fencing_token());
            tokio::time::sleep(Duration::from_millis(10)).await;
            guard.release().await.unwrap();
        }));
        let in_line = common::offers_become(collection, lock.name(), queued).await;
        assert!(in_line, "waiter {queued} did not queue");
    }
    waiters
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_eight_transfers_a_plain_release_and_the_next_local_waiter_attempts_at_once() {
    const WAITERS: usize = 12;
    let (database, log) = common::counting_database().await;
    let (lock, collection) = sleepy_lock(&database, "notail");
    let guard = lock.acquire().await.unwrap();
    let tokens = Arc::new(Mutex::new(vec![guard.fencing_token()]));
    let waiters = waiters_in_line(&lock, collection.name(), WAITERS, &tokens).await;
    log.clear();
    let released = Instant::now();
    guard.release().await.unwrap();
    for waiter in waiters {
        // The waiters' pace is 20 s: a waiter that slept before attempting would miss this.
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("every waiter gets the lock without sleeping between attempts")
            .unwrap();
    }
    let took = released.elapsed();
    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), WAITERS + 1);
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "{tokens:?}"
    );
    // Eight transfers, a plain release and an attempt by the ninth waiter, three transfers to the
    // last ones, a plain release by the last.
    assert_eq!(log.transfers(), WAITERS - 1, "{:?}", log.started());
    assert_eq!(log.count("update"), 2, "{:?}", log.started());
    println!("no tail: {WAITERS} local handoffs with one plain release among them in {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_eight_transfers_another_process_that_asks_first_gets_the_lock() {
    const WAITERS: usize = 12;
    let (proxy, client) = common::proxy::proxied_client().await;
    let database = client.database(common::DATABASE);
    let (lock, collection) = sleepy_lock(&database, "fairness");
    let guard = lock.acquire().await.unwrap();
    let tokens = Arc::new(Mutex::new(vec![guard.fencing_token()]));
    let waiters = waiters_in_line(&lock, collection.name(), WAITERS, &tokens).await;
    // The local waiters' attempts (transfers are not upserts) reach the server half a second
    // late, so the other process, which polls every 5 ms, asks first after the plain release.
    proxy.add_rule(
        Rule::new("findAndModify", Action::Delay(Duration::from_millis(500)))
            .where_field("upsert", true)
            .times(usize::MAX),
    );
    let name = lock.name().to_owned();
    let remote_collection = common::database()
        .await
        .collection::<Document>(collection.name());
    let remote = tokio::spawn(async move {
        loop {
            let taken = remote_collection
                .find_one_and_update(
                    doc! { "_id": &name, "$expr": { "$lte": ["$expiresAt", "$$NOW"] } },
                    vec![doc! { "$set": {
                        "lockId": "remote",
                        "expiresAt": { "$add": ["$$NOW", 60_000_i64] },
                    } }],
                )
                .await
                .unwrap();
            if taken.is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    guard.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(15), remote)
        .await
        .expect("the other process gets the lock after eight transfers")
        .unwrap();
    let tokens = tokens.lock().unwrap().clone();
    // The first holder, then eight transfers; the ninth release was a plain one.
    assert_eq!(tokens.len(), 9, "{tokens:?}");
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "{tokens:?}"
    );
    for waiter in waiters {
        waiter.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_racing_a_takeover_by_another_process_hands_nothing_over() {
    let database = common::database().await;
    let (lock, collection) = sleepy_lock(&database, "race");
    let guard = lock.acquire().await.unwrap();
    let mut waiter = queued_waiter(&lock, &collection).await;
    // The lease ended behind the holder's back and another process took the lock.
    collection
        .update_one(
            doc! { "_id": lock.name() },
            vec![doc! { "$set": {
                "lockId": "intruder",
                "expiresAt": { "$add": ["$$NOW", 60_000_i64] },
                "fencingToken": { "$add": ["$fencingToken", 1_i64] },
            } }],
        )
        .await
        .unwrap();
    let error = guard.release().await.unwrap_err();
    assert!(matches!(error, Error::LockLost { .. }), "{error}");
    assert_eq!(
        stored(&collection, lock.name()).await.get_str("lockId"),
        Ok("intruder"),
        "the other process's lease is untouched"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut waiter)
            .await
            .is_err(),
        "the local waiter got nothing and waits on"
    );
    waiter.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_whose_reply_was_lost_is_confirmed_by_its_retry() {
    let (proxy, client) = common::proxy::proxied_client().await;
    let database = client.database(common::DATABASE);
    let (lock, collection) = sleepy_lock(&database, "lostreply");
    let guard = lock.acquire().await.unwrap();
    let token = guard.fencing_token();
    let waiter = queued_waiter(&lock, &collection).await;
    let rule = proxy.add_rule(Rule::new("findAndModify", Action::DropReplyAndClose).times(1));
    guard.release().await.unwrap();
    assert_eq!(proxy.hits(rule), 1, "the transfer's first reply was lost");
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the retry found the transfer done")
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > token);
    assert_eq!(
        stored(&collection, lock.name())
            .await
            .get_i64("fencingToken"),
        Ok(next.fencing_token().get()),
        "one transfer, not two"
    );
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_cancelled_while_the_lock_is_transferred_to_it_releases_it_at_once() {
    let (proxy, client) = common::proxy::proxied_client().await;
    let database = client.database(common::DATABASE);
    let (lock, collection) = sleepy_lock(&database, "cancelled");
    let guard = lock.acquire().await.unwrap();
    let waiter = queued_waiter(&lock, &collection).await;
    let transfer = proxy
        .add_rule(Rule::new("findAndModify", Action::Delay(Duration::from_millis(500))).times(1));
    let release = tokio::spawn(guard.release());
    let sent = common::eventually(Duration::from_secs(10), || async {
        proxy.hits(transfer) == 1
    })
    .await;
    assert!(sent, "the release hands the lock over");
    waiter.abort(); // while the transfer is on its way
    assert!(waiter.await.unwrap_err().is_cancelled());
    release.await.unwrap().unwrap();
    // The lease it received is released at once, not kept until its 30 s expiry.
    let freed = common::eventually(Duration::from_secs(10), || async {
        !stored(&collection, lock.name())
            .await
            .contains_key("lockId")
    })
    .await;
    assert!(freed, "{:?}", stored(&collection, lock.name()).await);
    let again = lock.try_acquire().await.unwrap();
    again.expect("free again").release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_first_local_waiter_polls_the_server() {
    const WAITERS: usize = 6;
    let (database, log) = common::counting_database().await;
    let collection = common::unique("locks");
    let options = LockOptions::builder()
        .busy_wait_sleep_time(Duration::from_millis(200), Duration::from_millis(200))
        .build()
        .unwrap();
    let lock = MongoDistributedLock::new(common::unique("poller"), &database)
        .with_collection(collection.as_str())
        .with_options(options);
    // Held by another process for a minute.
    let in_a_minute = mongodb::bson::DateTime::from_millis(
        mongodb::bson::DateTime::now().timestamp_millis() + 60_000,
    );
    database
        .collection::<Document>(&collection)
        .insert_one(doc! {
            "_id": lock.name(),
            "lockId": "remote",
            "expiresAt": in_a_minute,
            "fencingToken": 1_i64,
        })
        .await
        .unwrap();
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let lock = lock.clone();
            tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(60)).await })
        })
        .collect();
    // Every waiter has made its first attempt and waits in line, its offer standing.
    assert!(common::offers_become(&collection, lock.name(), WAITERS).await);
    log.clear();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let polls = log.count("findAndModify");
    // The first waiter polls every 200 ms (at most 10 times in 2 s); six polling waiters would
    // send six times as many.
    assert!((1..=12).contains(&polls), "{polls} polls in 2 s");
    for waiter in waiters {
        waiter.abort();
    }
}

/// Locks built apart (two clients, two lock objects: nothing tells the crate they reach one
/// deployment) hand over as a provider's locks do, once the waiter's attempt has found the
/// holder's lease stored: that lock id, a random UUID, proves they share the lock document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_built_apart_on_one_deployment_hand_over_in_one_command() {
    let (holder_database, holder_log) = common::counting_database().await;
    let (waiter_database, waiter_log) = common::counting_database().await;
    let (holder_lock, collection) = sleepy_lock(&holder_database, "apart");
    let waiter_lock = MongoDistributedLock::new(holder_lock.name(), &waiter_database)
        .with_collection(collection.name())
        .with_options(sleepy_options());
    let guard = holder_lock.acquire().await.unwrap();
    let token = guard.fencing_token();
    let waiter = {
        // A clone: the lock object itself lives on (its family stays linked while it lives).
        let waiter_lock = waiter_lock.clone();
        tokio::spawn(async move { waiter_lock.acquire_timeout(Duration::from_secs(60)).await })
    };
    // The waiter's first attempt finds the holder's lease, then it waits in line (20 s between
    // polls) with an offer standing.
    let queued = common::offers_become(collection.name(), holder_lock.name(), 1).await;
    assert!(queued, "{:?}", waiter_log.started());
    holder_log.clear();
    guard.release().await.unwrap();
    // One command on the holder's client released the lock and gave it to the waiter.
    let commands: Vec<String> = holder_log
        .started()
        .into_iter()
        .filter(|command| !command.ends_with("Indexes"))
        .collect();
    assert_eq!(commands, ["findAndModify"]);
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("handed over, not found by a poll 20 s later")
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > token);
    assert_eq!(
        stored(&collection, next.name())
            .await
            .get_i64("fencingToken"),
        Ok(next.fencing_token().get())
    );
    assert_eq!(
        waiter_log.count("findAndModify"),
        1,
        "no attempt of its own"
    );
    // The transferred lease is the waiter's: renewed and released by its own client.
    assert!(!next.is_lost());

    // The first lock comes back while the other holds it: the two are known to share the
    // deployment while they live, so it waits in line without an attempt to prove it again,
    // and the release hands the lock back in one command.
    holder_log.clear();
    waiter_log.clear();
    let again = {
        let holder_lock = holder_lock.clone();
        tokio::spawn(async move { holder_lock.acquire_timeout(Duration::from_secs(60)).await })
    };
    let queued = common::offers_become(collection.name(), holder_lock.name(), 1).await;
    assert!(queued, "{:?}", holder_log.started());
    next.release().await.unwrap();
    let back = tokio::time::timeout(Duration::from_secs(5), again)
        .await
        .expect("handed back, not found by a poll 20 s later")
        .unwrap()
        .unwrap();
    assert_eq!(
        holder_log.count("findAndModify"),
        0,
        "no attempt of its own: {:?}",
        holder_log.find_and_modifies()
    );
    assert_eq!(
        waiter_log.count("findAndModify"),
        1,
        "{:?}",
        waiter_log.started()
    );
    back.release().await.unwrap();
    drop(waiter_lock);
    assert!(
        !stored(&collection, holder_lock.name())
            .await
            .contains_key("lockId")
    );
}

/// Locks of one database, collection and name on two deployments: a release on one never hands
/// over to, nor wakes, a waiter on the other, which goes on polling its own server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_of_one_name_on_two_deployments_never_hand_over() {
    let other_deployment = common::server::start_dedicated(None);
    let (holder_database, holder_log) = common::counting_database().await;
    let (waiter_database, waiter_log) =
        common::counting_database_on(&other_deployment.uri, |_| {}).await;
    let (holder_lock, collection) = sleepy_lock(&holder_database, "twoclusters");
    // On the other deployment the lock is held by another process for a minute.
    let in_a_minute = mongodb::bson::DateTime::from_millis(
        mongodb::bson::DateTime::now().timestamp_millis() + 60_000,
    );
    let other_collection = waiter_database.collection::<Document>(collection.name());
    other_collection
        .insert_one(doc! {
            "_id": holder_lock.name(),
            "lockId": "remote",
            "expiresAt": in_a_minute,
            "fencingToken": 1_i64,
        })
        .await
        .unwrap();
    let waiter_lock = MongoDistributedLock::new(holder_lock.name(), &waiter_database)
        .with_collection(collection.name())
        .with_options(
            LockOptions::builder()
                .busy_wait_sleep_time(Duration::from_millis(50), Duration::from_millis(100))
                .build()
                .unwrap(),
        );
    let guard = holder_lock.acquire().await.unwrap();
    let waiter =
        tokio::spawn(async move { waiter_lock.acquire_timeout(Duration::from_secs(60)).await });
    let queued = common::eventually(Duration::from_secs(10), || async {
        waiter_log.count("findAndModify") >= 2
    })
    .await;
    assert!(queued, "the waiter polls its own server");
    holder_log.clear();
    guard.release().await.unwrap();
    assert_eq!(
        holder_log.count("findAndModify"),
        0,
        "no transfer: {:?}",
        holder_log.started()
    );
    assert_eq!(holder_log.count("update"), 1, "{:?}", holder_log.started());
    // The waiter still waits for its own server's lock, polling it.
    let polls = waiter_log.count("findAndModify");
    let polling = common::eventually(Duration::from_secs(10), || async {
        waiter_log.count("findAndModify") >= polls + 2
    })
    .await;
    assert!(polling, "the waiter goes on polling");
    assert!(!waiter.is_finished(), "nothing was handed to it");
    assert_eq!(
        stored(&other_collection, holder_lock.name())
            .await
            .get_str("lockId"),
        Ok("remote")
    );
    // Its own server's lock is freed: it acquires there (told by its own server's change
    // stream, or by a poll).
    other_collection
        .delete_one(doc! { "_id": holder_lock.name() })
        .await
        .unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter acquires on its own server")
        .unwrap()
        .unwrap();
    next.release().await.unwrap();
}

/// A waiter whose deadline passes while a release is handing it the lock (the proxy delays the
/// transfer past the deadline) gets the lock: the release took its offer before the deadline,
/// so the lock was handed to it before its call returned, and it is never told `Timeout` for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_deadline_passes_during_its_transfer_gets_the_lock_not_a_timeout() {
    let (proxy, client) = common::proxy::proxied_client().await;
    let database = client.database(common::DATABASE);
    let (lock, collection) = sleepy_lock(&database, "late-transfer");
    let guard = lock.acquire().await.unwrap();
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move { lock.acquire_timeout(Duration::from_secs(1)).await }
    });
    assert!(common::offers_become(collection.name(), lock.name(), 1).await);
    let transfer = proxy.add_rule(
        Rule::new("findAndModify", Action::Delay(Duration::from_millis(1_500)))
            .where_present("query.lockId.$in"),
    );
    let release = tokio::spawn(guard.release());
    let outcome = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter returns")
        .unwrap();
    assert_eq!(proxy.hits(transfer), 1, "the transfer was delayed");
    release.await.unwrap().unwrap();
    let handed = outcome.expect("the lock handed over is returned, not a timeout");
    let stored = stored(&collection, lock.name()).await;
    assert_eq!(
        stored.get_i64("fencingToken").unwrap(),
        handed.fencing_token().get(),
        "the waiter holds the stored lease"
    );
    handed.release().await.unwrap();
}

/// The same, where an attempt at the deadline would fail with a transient error (the proxy
/// answers every acquisition attempt with MaxTimeMSExpired once the waiter has queued): the
/// waiter takes its offer back before it attempts, finds it taken by the release, and waits for
/// the transfer instead; it makes no attempt while the lock is being handed to it (an attempt
/// and a transfer could both win, or the attempt's error end the wait), and gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_deadline_comes_during_its_transfer_attempts_nothing_and_gets_the_lock() {
    let (proxy, client) = common::proxy::proxied_client().await;
    let database = client.database(common::DATABASE);
    let (lock, collection) = sleepy_lock(&database, "late-transfer-error");
    let guard = lock.acquire().await.unwrap();
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move { lock.acquire_timeout(Duration::from_secs(1)).await }
    });
    assert!(common::offers_become(collection.name(), lock.name(), 1).await);
    let transfer = proxy.add_rule(
        Rule::new("findAndModify", Action::Delay(Duration::from_millis(1_500)))
            .where_present("query.lockId.$in"),
    );
    let failing = proxy.add_rule(
        Rule::new(
            "findAndModify",
            Action::Reply(common::proxy::replies::command_error(
                50,
                "MaxTimeMSExpired",
            )),
        )
        .on(collection.name())
        .where_field("upsert", true)
        .times(usize::MAX),
    );
    let release = tokio::spawn(guard.release());
    let outcome = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter returns")
        .unwrap();
    assert_eq!(proxy.hits(transfer), 1, "the transfer was delayed");
    assert_eq!(
        proxy.hits(failing),
        0,
        "no attempt while the lock was handed over"
    );
    release.await.unwrap().unwrap();
    let handed = outcome.expect("the lock handed over is returned");
    let stored = stored(&collection, lock.name()).await;
    assert_eq!(
        stored.get_i64("fencingToken").unwrap(),
        handed.fencing_token().get(),
        "the waiter holds the stored lease"
    );
    handed.release().await.unwrap();
}

/// A release whose runtime shuts down while it hands the lock to a waiter on another runtime
/// leaves no lease behind: the waiter hears that the transfer's outcome is unknown, ends both
/// leases (the releasing one and its own) from its own runtime, and then acquires the lock
/// long before the 30 s leases would have expired.
#[test]
fn a_transfer_cut_short_by_its_runtimes_end_leaves_no_lease_behind() {
    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let releasing = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let options = LockOptions::builder()
        .expiry(Duration::from_secs(30))
        .busy_wait_sleep_time(Duration::from_millis(50), Duration::from_millis(200))
        .build()
        .unwrap();
    let collection = common::unique("locks");
    let (proxy, provider) = main.block_on(async {
        let (proxy, client) = common::proxy::proxied_client().await;
        let provider = distributed_lock_mongodb::Provider::new(&client.database(common::DATABASE))
            .with_collection(collection.as_str())
            .with_options(options);
        (proxy, provider)
    });
    let name = common::unique("cut-short");
    // Held on the releasing runtime: its renewal loop, and its release, run there.
    let guard = releasing
        .block_on(provider.create_lock(name.as_str()).acquire())
        .unwrap();
    let waiter = main.spawn({
        let lock = provider.create_lock(name.as_str());
        async move { lock.acquire_timeout(Duration::from_secs(20)).await }
    });
    let transfer = proxy.add_rule(
        Rule::new("findAndModify", Action::Delay(Duration::from_millis(1_000)))
            .where_present("query.lockId.$in"),
    );
    // The waiter has queued, with its offer.
    assert!(main.block_on(common::offers_become(&collection, &name, 1)));
    releasing.spawn(guard.release());
    main.block_on(async {
        let sent = common::eventually(Duration::from_secs(10), || async {
            proxy.hits(transfer) == 1
        })
        .await;
        assert!(sent, "the release hands the lock over");
    });
    // The releasing runtime ends while the transfer is on its way.
    releasing.shutdown_background();
    let outcome = main.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("the waiter gets the lock long before the leases' expiry")
            .unwrap()
    });
    let guard = outcome.expect("acquired");
    main.block_on(guard.release()).unwrap();
}

/// The same cut short, with the waiter on the releasing runtime too: nobody is left to hear
/// that the transfer's outcome is unknown, so ending both leases falls to the family's next
/// lease, won on a live runtime (or to its shutdown). Fails when only a shutdown sends the undo
/// of work whose runtime was dropped: the name stays taken for the leases' 30 s.
#[test]
fn a_transfer_cut_short_with_its_waiter_on_the_same_runtime_leaves_no_lease_behind() {
    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dying = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let options = LockOptions::builder()
        .expiry(Duration::from_secs(30))
        .busy_wait_sleep_time(Duration::from_millis(50), Duration::from_millis(200))
        .build()
        .unwrap();
    let collection = common::unique("locks");
    let (proxy, provider) = main.block_on(async {
        let (proxy, client) = common::proxy::proxied_client().await;
        let provider = distributed_lock_mongodb::Provider::new(&client.database(common::DATABASE))
            .with_collection(collection.as_str())
            .with_options(options);
        (proxy, provider)
    });
    let name = common::unique("cut-short");
    let guard = dying
        .block_on(provider.create_lock(name.as_str()).acquire())
        .unwrap();
    let holder = main.block_on(stored_lock_id(&collection, &name));
    let _waiter = dying.spawn({
        let lock = provider.create_lock(name.as_str());
        async move { lock.acquire_timeout(Duration::from_secs(20)).await }
    });
    let transfer = proxy.add_rule(
        Rule::new("findAndModify", Action::Delay(Duration::from_millis(1_000)))
            .where_present("query.lockId.$in"),
    );
    // The waiter queues and offers to take the lease over; the release then hands it over.
    assert!(main.block_on(common::offers_become(&collection, &name, 1)));
    dying.spawn(guard.release());
    main.block_on(async {
        let sent = common::eventually(Duration::from_secs(10), || async {
            proxy.hits(transfer) == 1
        })
        .await;
        assert!(sent, "the release hands the lock over");
    });
    dying.shutdown_background();
    main.block_on(async {
        // The transfer, held back by the proxy, went with its runtime's connection: the
        // releasing lease is still stored.
        assert_eq!(
            stored_lock_id(&collection, &name).await,
            holder,
            "left behind"
        );
        let next = provider
            .create_lock(common::unique("next").as_str())
            .acquire()
            .await
            .unwrap();
        let other = MongoDistributedLock::new(name.as_str(), &common::database().await)
            .with_collection(collection.as_str());
        let freed = common::eventually(Duration::from_secs(10), || async {
            other.try_acquire().await.unwrap().is_some()
        })
        .await;
        assert!(freed, "both leases of the cut-short transfer were ended");
        next.release().await.unwrap();
    });
}

/// The lock id stored in lock `name`'s document, if any.
async fn stored_lock_id(collection: &str, name: &str) -> Option<String> {
    common::database()
        .await
        .collection::<Document>(collection)
        .find_one(doc! { "_id": name })
        .await
        .unwrap()
        .and_then(|stored| stored.get_str("lockId").ok().map(str::to_owned))
}

/// A caller that comes while callers of its process already wait in line for a lock (held by
/// another process) joins the line at once, behind them, without an attempt of its own: an
/// attempt could only fail, or jump the line. (Without anyone in line, a caller attempts at
/// once: see `round_trips.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_behind_local_waiters_joins_the_line_without_an_attempt() {
    let (database, log) = common::counting_database().await;
    let (lock, collection) = sleepy_lock(&database, "behind");
    let in_a_minute = mongodb::bson::DateTime::from_millis(
        mongodb::bson::DateTime::now().timestamp_millis() + 60_000,
    );
    collection
        .insert_one(doc! {
            "_id": lock.name(),
            "lockId": "remote",
            "expiresAt": in_a_minute,
            "fencingToken": 1_i64,
        })
        .await
        .unwrap();
    let first = queued_waiter(&lock, &collection).await;
    // The first waiter's stream is open, and the attempt its start woke the waiter for is
    // answered: it waits idle, and nothing more is coming from it.
    common::stream_open(&log, collection.name(), lock.name(), 1).await;
    log.clear();
    let second = tokio::spawn({
        let lock = lock.clone();
        async move { lock.acquire_timeout(Duration::from_secs(60)).await }
    });
    assert!(common::offers_become(collection.name(), lock.name(), 2).await);
    assert_eq!(
        log.count("findAndModify"),
        0,
        "the second caller attempted: {:?}",
        log.find_and_modifies()
    );
    first.abort();
    second.abort();
}
