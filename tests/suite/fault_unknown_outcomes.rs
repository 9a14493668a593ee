//! Faults a real cluster has and the embedded server cannot show, injected at the wire-protocol
//! level: replies lost after a write was applied, half-open connections, duplicate-key races,
//! elections and write-concern errors. Each test fails without the fix it names.

use test_support as common;

use std::time::{Duration, Instant};

use common::proxy::{self, Action, Rule, replies};
use distributed_lock_mongodb::{
    DocumentLock, Error, LockOptions, MongoDistributedLock, MongoDistributedReaderWriterLock,
    MongoDistributedSemaphore, Provider,
};
use mongodb::bson::{Document, doc};

/// A 30 s lease: "free again right after" cannot be confused with "free after expiry".
fn long_lease() -> LockOptions {
    LockOptions::builder()
        .expiry(Duration::from_secs(30))
        .busy_wait_sleep_time(Duration::from_millis(5), Duration::from_millis(50))
        .build()
        .unwrap()
}

/// Polls `acquire` (a direct client's attempt) for up to 5 s; returns how long it took.
async fn free_within_five_seconds<F, Fut>(acquire: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    let freed = common::eventually(Duration::from_secs(5), acquire).await;
    assert!(
        freed,
        "the name stayed held: the attempt whose reply was lost left an orphan lease (expiry 30 s)"
    );
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_won_lock_attempt_whose_reply_was_lost_is_released_at_once() {
    let (proxy, client) = proxy::proxied_client().await;
    let collection = common::unique("locks");
    let name = common::unique("lost-reply");
    let lock = MongoDistributedLock::new(name.as_str(), &client.database(common::DATABASE))
        .with_collection(collection.as_str())
        .with_options(long_lease());
    // Applied, then the reply is lost and the connection closed (on a replica set the driver
    // retries once: the second rule use drops that reply too).
    proxy.add_rule(
        Rule::new("findAndModify", Action::DropReplyAndClose)
            .on(&collection)
            .times(2),
    );
    let error = lock.try_acquire().await.unwrap_err();
    proxy.clear_rules();
    println!("lost reply: try_acquire returned {error}");
    let direct = MongoDistributedLock::new(name.as_str(), &common::database().await)
        .with_collection(collection.as_str())
        .with_options(long_lease());
    let took = free_within_five_seconds(|| async {
        match direct.try_acquire().await.unwrap() {
            Some(guard) => guard.release().await.is_ok(),
            None => false,
        }
    })
    .await;
    println!("lost reply: the name was free again {took:?} after the error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_won_attempt_without_any_reply_is_released_when_the_caller_gives_up() {
    let (proxy, client) = proxy::proxied_client().await;
    let collection = common::unique("locks");
    let name = common::unique("no-reply");
    let lock = MongoDistributedLock::new(name.as_str(), &client.database(common::DATABASE))
        .with_collection(collection.as_str())
        .with_options(long_lease());
    // Applied, then the connection goes half-open: no reply, no error, ever.
    proxy.add_rule(Rule::new("findAndModify", Action::ApplyThenHang).on(&collection));
    let error = lock.try_acquire().await.unwrap_err();
    assert!(error.is_no_reply(), "{error}");
    let direct = MongoDistributedLock::new(name.as_str(), &common::database().await)
        .with_collection(collection.as_str());
    free_within_five_seconds(|| async {
        match direct.try_acquire().await.unwrap() {
            Some(guard) => guard.release().await.is_ok(),
            None => false,
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_reader_writer_and_document_attempts_whose_reply_was_lost_leave_nothing_held() {
    let (proxy, client) = proxy::proxied_client().await;
    let proxied = client.database(common::DATABASE);
    let direct = common::database().await;
    let drop_next_reply = |collection: &str| {
        proxy.add_rule(
            Rule::new("findAndModify", Action::DropReplyAndClose)
                .on(collection)
                .times(2),
        );
    };

    // A semaphore with one place: an orphan holder would fill it for 30 s.
    let semaphores = common::unique("semaphores");
    let name = common::unique("place");
    let place = MongoDistributedSemaphore::new(name.as_str(), 1, &proxied)
        .with_collection(semaphores.as_str())
        .with_options(long_lease());
    drop_next_reply(&semaphores);
    place.try_acquire().await.unwrap_err();
    proxy.clear_rules();
    let other = MongoDistributedSemaphore::new(name.as_str(), 1, &direct)
        .with_collection(semaphores.as_str());
    free_within_five_seconds(|| async {
        match other.try_acquire().await.unwrap() {
            Some(guard) => guard.release().await.is_ok(),
            None => false,
        }
    })
    .await;

    // A reader, then a writer: an orphan of either keeps a writer out for 30 s.
    let rw = common::unique("rw");
    let name = common::unique("rw");
    let proxied_rw = MongoDistributedReaderWriterLock::new(name.as_str(), &proxied)
        .with_collection(rw.as_str())
        .with_options(long_lease());
    let direct_rw =
        MongoDistributedReaderWriterLock::new(name.as_str(), &direct).with_collection(rw.as_str());
    let writer_gets_in = || async {
        match direct_rw.try_acquire_write().await.unwrap() {
            Some(guard) => guard.release().await.is_ok(),
            None => false,
        }
    };
    drop_next_reply(&rw);
    proxied_rw.try_acquire_read().await.unwrap_err();
    proxy.clear_rules();
    free_within_five_seconds(writer_gets_in).await;
    drop_next_reply(&rw);
    proxied_rw.try_acquire_write().await.unwrap_err();
    proxy.clear_rules();
    free_within_five_seconds(writer_gets_in).await;

    // A document lock.
    let jobs = common::unique("jobs");
    direct
        .collection::<Document>(&jobs)
        .insert_one(doc! { "_id": "job", "status": "pending" })
        .await
        .unwrap();
    let proxied_jobs =
        DocumentLock::new(&proxied.collection::<Document>(&jobs)).with_options(long_lease());
    drop_next_reply(&jobs);
    proxied_jobs
        .try_lock(doc! { "_id": "job" })
        .await
        .unwrap_err();
    proxy.clear_rules();
    let direct_jobs = DocumentLock::new(&direct.collection::<Document>(&jobs));
    free_within_five_seconds(|| async {
        match direct_jobs.try_lock(doc! { "_id": "job" }).await.unwrap() {
            Some(guard) => guard.release().await.is_ok(),
            None => false,
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_whose_attempts_all_fail_leaves_no_marker_holding_readers_back() {
    let (proxy, client) = proxy::proxied_client().await;
    let rw = common::unique("rw");
    let name = common::unique("marker");
    let direct = MongoDistributedReaderWriterLock::new(name.as_str(), &common::database().await)
        .with_collection(rw.as_str());
    let reader = direct.acquire_read().await.unwrap();
    let writer =
        MongoDistributedReaderWriterLock::new(name.as_str(), &client.database(common::DATABASE))
            .with_collection(rw.as_str())
            .with_options(long_lease());
    // Every attempt is applied (placing or renewing the waiting-writer marker) and its reply lost.
    proxy.add_rule(
        Rule::new("findAndModify", Action::DropReplyAndClose)
            .on(&rw)
            .times(usize::MAX),
    );
    let outcome = writer
        .acquire_write_timeout(Duration::from_millis(500))
        .await;
    proxy.clear_rules();
    assert!(
        outcome.is_err(),
        "the writer cannot have got in past a reader"
    );
    // The marker (lease 2 × 50 ms + 1 s here) is removed at once, not when its lease ends.
    let took = free_within_five_seconds(|| async {
        match direct.try_acquire_read().await.unwrap() {
            Some(guard) => guard.release().await.is_ok(),
            None => false,
        }
    })
    .await;
    println!("writer marker: readers admitted again {took:?} after the failed wait");
    reader.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_renewal_does_not_stall_the_other_leases_of_the_provider() {
    let (proxy, client) = proxy::proxied_client().await;
    let collection = common::unique("locks");
    // expiry 3 s, cadence 500 ms: presumed lost 2.67 s after the last confirmed renewal.
    let provider = Provider::new(&client.database(common::DATABASE))
        .with_collection(collection.as_str())
        .with_options(common::options(3_000, 500));
    let names = ["a", "b", "c"];
    let mut guards = Vec::new();
    for name in names {
        guards.push(provider.create_lock(name).acquire().await.unwrap());
    }
    // A round renews one lease with a findAndModify (it reads the server's clock) and the
    // others with one update. The next of each is applied, then its connection goes half-open:
    // the driver would wait for its reply for ever.
    let hung_batch = proxy.add_rule(Rule::new("update", Action::ApplyThenHang).on(&collection));
    let hung_single =
        proxy.add_rule(Rule::new("findAndModify", Action::ApplyThenHang).on(&collection));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(proxy.hits(hung_batch), 1, "a renewal of two leases hung");
    assert_eq!(proxy.hits(hung_single), 1, "a renewal of one lease hung");
    assert!(
        guards.iter().all(|guard| !guard.is_lost()),
        "later renewals went out on other connections"
    );
    let control = common::database().await.collection::<Document>(&collection);
    for name in names {
        let (now, expires_at) = common::server_now_and_expiry(&control, name).await;
        assert!(expires_at.expect("held") > now, "{name}'s lease is live");
    }
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// An attempt refused with a duplicate key, and its repeat too, wrote nothing (the server wrote
/// nothing for either): the caller gets the error, and no cleanup is sent after it, unlike after
/// an error that may come after the write was applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_refused_with_a_duplicate_key_twice_sends_no_cleanup() {
    let (proxy, database, commands) = common::proxied_counting_database().await;
    let collection = common::unique("locks");
    let name = common::unique("refused");
    proxy.add_rule(
        Rule::new(
            "findAndModify",
            Action::Reply(replies::duplicate_key(
                doc! { "_id": 1 },
                doc! { "_id": name.as_str() },
            )),
        )
        .on(&collection)
        .times(2),
    );
    let lock = MongoDistributedLock::new(name.as_str(), &database)
        .with_collection(collection.as_str())
        .with_options(long_lease());
    let error = lock.try_acquire().await.unwrap_err();
    assert!(error.to_string().contains("E11000"), "{error}");
    // A cleanup would go out at once, in the background: give it time to show.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        commands.started_without_streams(),
        ["findAndModify", "findAndModify"],
        "the attempt and its repeat, and nothing after them"
    );
    let guard = lock.try_acquire().await.unwrap();
    assert!(guard.is_some(), "nothing was written: the lock is free");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_key_from_a_first_use_race_is_retried_not_reported_busy() {
    let (proxy, client) = proxy::proxied_client().await;
    let proxied = client.database(common::DATABASE);
    let race = |collection: &str, name: &str| {
        // What the loser of two concurrent upserts of a new `_id` gets on a real server.
        proxy.add_rule(
            Rule::new(
                "findAndModify",
                Action::Reply(replies::duplicate_key(
                    doc! { "_id": 1 },
                    doc! { "_id": name },
                )),
            )
            .on(collection),
        );
    };
    let semaphores = common::unique("semaphores");
    let semaphore = MongoDistributedSemaphore::new("first-use", 3, &proxied)
        .with_collection(semaphores.as_str());
    race(&semaphores, "first-use");
    let place = semaphore.try_acquire().await.unwrap();
    assert!(place.is_some(), "a free semaphore place was reported busy");

    let rw = common::unique("rw");
    let lock =
        MongoDistributedReaderWriterLock::new("first-use", &proxied).with_collection(rw.as_str());
    race(&rw, "first-use");
    assert!(
        lock.try_acquire_read().await.unwrap().is_some(),
        "a free read lock was reported busy"
    );
    drop(place);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elections_and_write_concern_timeouts_are_ridden_out_within_the_deadline() {
    let (proxy, client) = proxy::proxied_client().await;
    let collection = common::unique("locks");
    let lock = MongoDistributedLock::new(
        common::unique("election"),
        &client.database(common::DATABASE),
    )
    .with_collection(collection.as_str())
    .with_options(long_lease());
    // Three attempts meet a primary stepping down, then one is applied but its replication
    // times out: the wait goes on, and the orphan of the applied one is cleaned up.
    let stepping_down = proxy.add_rule(
        Rule::new(
            "findAndModify",
            Action::Reply(replies::command_error(10107, "NotWritablePrimary")),
        )
        .on(&collection)
        .times(3),
    );
    let unreplicated = proxy.add_rule(
        Rule::new(
            "findAndModify",
            Action::ApplyThenMerge(replies::write_concern_error()),
        )
        .on(&collection),
    );
    let guard = lock
        .acquire_timeout(Duration::from_secs(10))
        .await
        .expect("transient failures are retried within the deadline");
    assert_eq!(proxy.hits(stepping_down), 3);
    assert_eq!(proxy.hits(unreplicated), 1);
    guard.release().await.unwrap();

    // A single attempt reports the failure instead of "busy".
    proxy.add_rule(
        Rule::new(
            "findAndModify",
            Action::Reply(replies::command_error(
                11602,
                "InterruptedDueToReplStateChange",
            )),
        )
        .on(&collection)
        .times(2),
    );
    match lock.try_acquire().await {
        Err(Error::Mongo(error)) => assert!(error.to_string().contains("11602"), "{error}"),
        other => panic!("expected the election error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_meets_an_election_or_a_hung_connection_is_sent_again() {
    let (proxy, client) = proxy::proxied_client().await;
    let collection = common::unique("locks");
    let name = common::unique("release");
    let lock = MongoDistributedLock::new(name.as_str(), &client.database(common::DATABASE))
        .with_collection(collection.as_str())
        .with_options(long_lease());
    let direct = MongoDistributedLock::new(name.as_str(), &common::database().await)
        .with_collection(collection.as_str());

    let guard = lock.acquire().await.unwrap();
    let election = proxy.add_rule(
        Rule::new(
            "update",
            Action::Reply(replies::command_error(
                11602,
                "InterruptedDueToReplStateChange",
            )),
        )
        .on(&collection)
        .times(2),
    );
    guard
        .release()
        .await
        .expect("the release is retried after the election");
    assert_eq!(proxy.hits(election), 2);
    let next = direct
        .try_acquire()
        .await
        .unwrap()
        .expect("released at once");
    next.release().await.unwrap();

    // The release's connection goes half-open before the server sees it: it is sent again on
    // another connection after a quarter of the expiry (7.5 s), not left to the 30 s expiry.
    let guard = lock.acquire().await.unwrap();
    let hung = proxy.add_rule(Rule::new("update", Action::Hang).on(&collection));
    let started = Instant::now();
    guard.release().await.expect("the release is sent again");
    assert_eq!(proxy.hits(hung), 1);
    println!("hung release: released after {:?}", started.elapsed());
    let next = direct.try_acquire().await.unwrap().expect("released");
    next.release().await.unwrap();
}

/// A caller that stops waiting while its attempt is applied but unanswered (a half-open
/// connection) must not leave the lease behind until it expires: the attempt's time limit and
/// cleanup belong to the crate, not to the caller's future. Three ways to stop waiting: a
/// timeout around `acquire()`, an aborted task, and a leader election that resigns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_stops_waiting_leaves_no_lease_behind_when_its_attempt_hangs() {
    for way in ["timeout", "abort", "resign"] {
        let (proxy, client) = proxy::proxied_client().await;
        let collection = common::unique("locks");
        let name = common::unique("cancelled");
        let lock = MongoDistributedLock::new(name.as_str(), &client.database(common::DATABASE))
            .with_collection(collection.as_str())
            .with_options(long_lease());
        let hung =
            proxy.add_rule(Rule::new("findAndModify", Action::ApplyThenHang).on(&collection));
        match way {
            "timeout" => {
                let outcome =
                    tokio::time::timeout(Duration::from_millis(300), lock.acquire()).await;
                assert!(outcome.is_err(), "the caller gave up");
            }
            "abort" => {
                let waiting = tokio::spawn({
                    let lock = lock.clone();
                    async move { lock.acquire().await }
                });
                assert!(
                    common::eventually(Duration::from_secs(5), || async { proxy.hits(hung) == 1 })
                        .await
                );
                waiting.abort();
            }
            _ => {
                let election =
                    distributed_lock_mongodb::LeaderElection::start(lock.clone()).unwrap();
                assert!(
                    common::eventually(Duration::from_secs(5), || async { proxy.hits(hung) == 1 })
                        .await
                );
                election.resign().await.unwrap();
            }
        }
        assert_eq!(
            proxy.hits(hung),
            1,
            "{way}: the attempt was applied and hung"
        );
        let direct = MongoDistributedLock::new(name.as_str(), &common::database().await)
            .with_collection(collection.as_str());
        let took = free_within_five_seconds(|| async {
            match direct.try_acquire().await.unwrap() {
                Some(guard) => guard.release().await.is_ok(),
                None => false,
            }
        })
        .await;
        println!("cancelled caller ({way}): the name was free {took:?} later");
    }
}
