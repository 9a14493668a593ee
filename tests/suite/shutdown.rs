//! `Provider::shutdown`: every lease of every kind released, dropped guards' releases waited
//! for, waiting and later acquisitions refused with `Error::ShutDown`.

use test_support as common;

use std::time::Duration;

use common::proxy::{self, Action, Rule};
use distributed_lock_mongodb::{Error, Provider};
use mongodb::Collection;
use mongodb::bson::{Document, doc};

/// Two providers on the same collections: `ours` is shut down, `theirs` (built apart, as in
/// another process) checks that everything was released.
async fn providers() -> (Provider, Provider, Collection<Document>, String) {
    let database = common::database().await;
    let (locks, rw, semaphores) = (
        common::unique("shutdown-locks"),
        common::unique("shutdown-rw"),
        common::unique("shutdown-semaphores"),
    );
    let build = || {
        Provider::new(&database)
            .with_collection(locks.as_str())
            .with_reader_writer_collection(rw.as_str())
            .with_semaphore_collection(semaphores.as_str())
            // A lease left behind would block `theirs` for 30 s: far beyond the checks below.
            .with_options(common::options(30_000, 10_000))
    };
    let jobs = database.collection(&common::unique("shutdown-jobs"));
    (build(), build(), jobs, locks)
}

fn is_shut_down<T: std::fmt::Debug>(result: Result<T, Error>) -> bool {
    matches!(result, Err(Error::ShutDown))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_every_lease_of_every_kind_and_refuses_later_acquisitions() {
    let (ours, theirs, jobs, locks) = providers().await;
    jobs.insert_one(doc! { "_id": "job", "status": "pending" })
        .await
        .unwrap();

    let lock = ours.create_lock("exclusive");
    let held = lock.acquire().await.unwrap();
    let dropped = ours.create_lock("dropped").acquire().await.unwrap();
    let semaphore = ours.create_semaphore("places", 1);
    let place = semaphore.acquire().await.unwrap();
    let readers = ours.create_reader_writer_lock("read");
    let read = readers.acquire_read().await.unwrap();
    let writers = ours.create_reader_writer_lock("write");
    let write = writers.acquire_write().await.unwrap();
    let documents = ours.create_document_lock(&jobs);
    let job = documents.lock(doc! { "_id": "job" }).await.unwrap();
    let composite = ours
        .acquire_all(&["member-a", "member-b"], Duration::from_secs(5))
        .await
        .unwrap();
    let lost_signals = [
        held.lost(),
        place.lost(),
        read.lost(),
        write.lost(),
        job.lost(),
        composite.lost(),
    ];

    // A caller waiting for a lock another process holds, without a deadline.
    let busy = theirs.create_lock("busy").acquire().await.unwrap();
    let waiting = tokio::spawn({
        let lock = ours.create_lock("busy");
        async move { lock.acquire().await }
    });
    assert!(
        common::offers_become(&locks, "busy", 1).await,
        "the caller found the lock busy and waits in line"
    );

    drop(dropped); // its release goes out in the background; shutdown waits for it
    let started = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(30), ours.shutdown())
        .await
        .expect("shutdown finishes");
    println!("shutdown: 8 leases released in {:?}", started.elapsed());

    for (index, lost) in lost_signals.iter().enumerate() {
        assert!(lost.is_lost(), "guard {index} was told it lost its lease");
    }
    let waited = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiting caller was told at once")
        .unwrap();
    assert!(
        is_shut_down(waited),
        "the waiting caller got Error::ShutDown"
    );

    // Everything is free for another process at once (leases last 30 s otherwise).
    for name in ["exclusive", "dropped", "member-a", "member-b"] {
        let guard = theirs.create_lock(name).try_acquire().await.unwrap();
        assert!(guard.is_some(), "{name} was released");
    }
    let place = theirs.create_semaphore("places", 1).try_acquire().await;
    assert!(place.unwrap().is_some(), "the semaphore place was released");
    let writer = theirs
        .create_reader_writer_lock("read")
        .try_acquire_write()
        .await;
    assert!(writer.unwrap().is_some(), "the read lock was released");
    let reader = theirs
        .create_reader_writer_lock("write")
        .try_acquire_read()
        .await;
    assert!(reader.unwrap().is_some(), "the write lock was released");
    let job_again = theirs
        .create_document_lock(&jobs)
        .try_lock(doc! { "_id": "job" })
        .await;
    assert!(job_again.unwrap().is_some(), "the document was unlocked");

    // Guards of the shut-down provider report the loss; nothing is acquired any more.
    assert!(held.release().await.unwrap_err().is_lock_lost());
    assert!(read.release().await.unwrap_err().is_lock_lost());
    assert!(is_shut_down(lock.try_acquire().await));
    assert!(is_shut_down(lock.acquire().await));
    assert!(is_shut_down(ours.create_lock("new").try_acquire().await));
    assert!(is_shut_down(semaphore.try_acquire().await));
    assert!(is_shut_down(readers.try_acquire_read().await));
    assert!(is_shut_down(writers.acquire_write().await));
    assert!(is_shut_down(
        documents.try_lock(doc! { "_id": "job" }).await
    ));
    assert!(is_shut_down(
        ours.acquire_all(&["x", "y"], Duration::from_secs(1)).await
    ));
    // A clone of the provider shares its fate.
    assert!(is_shut_down(
        ours.clone().create_lock("c").try_acquire().await
    ));
    busy.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutting_down_a_provider_that_holds_nothing_returns_at_once() {
    let (ours, _theirs, _jobs, _locks) = providers().await;
    tokio::time::timeout(Duration::from_secs(5), ours.shutdown())
        .await
        .expect("nothing to release");
    assert!(is_shut_down(ours.create_lock("late").try_acquire().await));
}

/// Runs `scenario` on a runtime of its own, which is dropped as soon as it returns (as a process
/// exits after its shutdown), then returns what it returned.
fn on_a_runtime_dropped_right_after<T>(scenario: impl std::future::Future<Output = T>) -> T {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let output = runtime.block_on(scenario);
    drop(runtime);
    output
}

/// A fault proxy on a runtime of its own, which outlives the scenario's runtime as the network
/// outlives a process: what the scenario sent is still delivered after its runtime is gone.
fn network() -> (tokio::runtime::Runtime, proxy::FaultProxy) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let proxy =
        runtime.block_on(async { proxy::FaultProxy::start(proxy::upstream_address().await).await });
    (runtime, proxy)
}

/// Whether the exclusive lock `name` in `collection` is free, for a client of another runtime.
fn is_free(collection: &str, name: &str) -> bool {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let lock =
            distributed_lock_mongodb::MongoDistributedLock::new(name, &common::database().await)
                .with_collection(collection);
        let free = lock.try_acquire().await.unwrap();
        free.is_some()
    })
}

/// A provider (leases of 30 s, in `collection`) whose client goes through `proxy`.
async fn provider_through(proxy: &proxy::FaultProxy, collection: &str) -> Provider {
    let client = proxy::client_through(proxy, &common::server::uri()).await;
    Provider::new(&client.database(common::DATABASE))
        .with_collection(collection)
        .with_options(common::options(30_000, 10_000))
}

/// Starts acquiring `name` in a task; returns once its attempt was applied on the server, whose
/// reply never comes (the proxy leaves its connection half-open).
async fn acquire_with_an_attempt_that_hangs(
    provider: &Provider,
    proxy: &proxy::FaultProxy,
    name: &str,
) -> tokio::task::JoinHandle<Result<distributed_lock_mongodb::LockGuard, Error>> {
    let hung = proxy.add_rule(Rule::new("findAndModify", Action::ApplyThenHang));
    let lock = provider.create_lock(name);
    let waiting = tokio::spawn(async move { lock.acquire().await });
    assert!(common::eventually(Duration::from_secs(5), || async { proxy.hits(hung) == 1 }).await);
    waiting
}

/// An acquisition attempt applied on the server whose reply never comes (a half-open
/// connection) when the provider is shut down: `shutdown` ends its lease before returning,
/// even though the runtime is dropped right after.
#[test]
fn shutdown_ends_the_lease_of_an_attempt_applied_but_unanswered() {
    let collection = common::unique("shutdown-hung");
    let name = common::unique("hung");
    let (_network, proxy) = network();
    let took = on_a_runtime_dropped_right_after(async {
        let provider = provider_through(&proxy, &collection).await;
        let waiting = acquire_with_an_attempt_that_hangs(&provider, &proxy, &name).await;
        let started = std::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(30), provider.shutdown())
            .await
            .expect("shutdown returns in bounded time");
        assert!(is_shut_down(waiting.await.unwrap()));
        started.elapsed()
    });
    println!("shutdown with an attempt applied but unanswered: {took:?}");
    assert!(
        is_free(&collection, &name),
        "the attempt's lease was ended before shutdown returned"
    );
}

/// A second `shutdown` (another task's, of a clone of the provider) called while the first is
/// still waiting for an attempt in flight returns only once the job is done, like the first.
#[test]
fn a_second_concurrent_shutdown_returns_only_when_the_job_is_done() {
    let collection = common::unique("shutdown-twice");
    let name = common::unique("twice");
    let (_network, proxy) = network();
    on_a_runtime_dropped_right_after(async {
        let provider = provider_through(&proxy, &collection).await;
        let waiting = acquire_with_an_attempt_that_hangs(&provider, &proxy, &name).await;
        // The cleanups reach the server late: one shutdown is still sending when the other
        // finds nothing left to take.
        let late = proxy
            .add_rule(Rule::new("update", Action::Delay(Duration::from_millis(1500))).times(10));
        let first = tokio::spawn({
            let provider = provider.clone();
            async move { provider.shutdown().await }
        });
        assert!(
            common::eventually(Duration::from_secs(10), || async { proxy.hits(late) >= 1 }).await,
            "the first shutdown sends a cleanup"
        );
        tokio::time::timeout(Duration::from_secs(30), provider.shutdown())
            .await
            .expect("shutdown returns in bounded time");
        // Checked before the first returns for sure: directly, not through the proxy.
        let other = distributed_lock_mongodb::MongoDistributedLock::new(
            name.as_str(),
            &common::database().await,
        )
        .with_collection(collection.as_str());
        assert!(
            other.try_acquire().await.unwrap().is_some(),
            "the second shutdown returned before the attempt's lease was ended"
        );
        first.await.unwrap();
        assert!(is_shut_down(waiting.await.unwrap()));
    });
}

/// An attempt applied on the server whose reply comes back only after the shutdown began (the
/// proxy holds the reply back) wins then: `shutdown` waits for it and releases what it won
/// before returning.
#[test]
fn shutdown_releases_what_an_attempt_in_flight_wins_after_it_began() {
    let collection = common::unique("shutdown-late");
    let name = common::unique("late");
    let (_network, proxy) = network();
    on_a_runtime_dropped_right_after(async {
        let provider = provider_through(&proxy, &collection).await;
        let delayed = proxy.add_rule(Rule::new(
            "findAndModify",
            Action::DelayReply(Duration::from_millis(700)),
        ));
        let lock = provider.create_lock(name.as_str());
        let waiting = tokio::spawn(async move { lock.acquire().await });
        assert!(
            common::eventually(Duration::from_secs(5), || async {
                proxy.hits(delayed) == 1
            })
            .await
        );
        tokio::time::timeout(Duration::from_secs(30), provider.shutdown())
            .await
            .expect("shutdown returns in bounded time");
        assert!(is_shut_down(waiting.await.unwrap()));
    });
    assert!(
        is_free(&collection, &name),
        "the late win was released before shutdown returned"
    );
}

/// A lease renewed by a loop on a runtime that is no longer driven (a current-thread runtime
/// whose `block_on` has returned): `shutdown`, called from another runtime, still returns and
/// still releases it.
#[test]
fn shutdown_returns_and_releases_even_when_a_renewal_loop_is_not_driven() {
    let collection = common::unique("shutdown-idle");
    let name = common::unique("idle");
    let client_runtime = tokio::runtime::Runtime::new().unwrap();
    let provider = client_runtime.block_on(async {
        Provider::new(&common::database().await)
            .with_collection(collection.as_str())
            .with_options(common::options(30_000, 10_000))
    });
    let idle = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let guard = idle
        .block_on(provider.create_lock(name.as_str()).acquire())
        .unwrap();
    // From here on nothing drives `idle`: its renewal loop cannot run.
    let took = client_runtime.block_on(async {
        let started = std::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(30), provider.shutdown())
            .await
            .expect("shutdown does not wait for a loop that cannot run");
        started.elapsed()
    });
    println!("shutdown with a renewal loop on an idle runtime: {took:?}");
    assert!(guard.is_lost());
    assert!(
        is_free(&collection, &name),
        "its lease was released by the shutdown itself"
    );
    drop(guard);
    drop(idle);
}

/// A lease whose renewal loop's runtime was dropped (a `#[tokio::test]` ending, a worker pool
/// torn down) is lost and renewed by nobody. The provider's next acquisition, on another runtime
/// (the client's, which lives on), finds that loop gone and releases the orphaned lease instead
/// of leaving it stored until its expiry.
#[test]
fn a_lease_left_by_a_dropped_runtime_is_released_by_the_next_acquisition() {
    let collection = common::unique("orphans");
    let (orphan, next) = (common::unique("orphan"), common::unique("next"));
    let client_runtime = tokio::runtime::Runtime::new().unwrap();
    let provider = client_runtime.block_on(async {
        Provider::new(&common::database().await)
            .with_collection(collection.as_str())
            .with_options(common::options(30_000, 10_000))
    });
    let short_lived = tokio::runtime::Runtime::new().unwrap();
    let guard = short_lived
        .block_on(provider.create_lock(orphan.as_str()).acquire())
        .unwrap();
    drop(short_lived);
    assert!(guard.is_lost(), "nobody renews it any more");
    assert!(
        !is_free(&collection, &orphan),
        "still stored: nobody released it"
    );
    client_runtime.block_on(async {
        let _next = provider.create_lock(next.as_str()).acquire().await.unwrap();
        let other = distributed_lock_mongodb::MongoDistributedLock::new(
            orphan.as_str(),
            &common::database().await,
        )
        .with_collection(collection.as_str());
        let freed = common::eventually(Duration::from_secs(10), || async {
            other.try_acquire().await.unwrap().is_some()
        })
        .await;
        assert!(freed, "the orphaned lease was released");
    });
    drop(guard);
}

/// A lock object built apart (as in another part of the process, with its own client) whose
/// waiters would sleep 20 s between attempts: anything faster is a handoff.
fn lock_built_apart(
    database: &mongodb::Database,
    collection: &str,
    name: &str,
) -> distributed_lock_mongodb::MongoDistributedLock {
    let sleepy = distributed_lock_mongodb::LockOptions::builder()
        .expiry(Duration::from_secs(30))
        .busy_wait_sleep_time(Duration::from_secs(20), Duration::from_secs(20))
        .build()
        .unwrap();
    distributed_lock_mongodb::MongoDistributedLock::new(name, database)
        .with_collection(collection)
        .with_options(sleepy)
}

/// A provider holds a lock; a lock object built apart (another family, linked by the lock id it
/// found stored) waits with an offer; the provider's release becomes a transfer, which the proxy
/// holds up (`held_up`: its reply, once the server applied it, or its request, on its way); the
/// provider is shut down meanwhile. Returns the waiter's outcome, how long after the shutdown
/// returned the waiter was answered, the collection and the name.
async fn shut_down_during_a_transfer(
    held_up: Action,
) -> (
    Result<distributed_lock_mongodb::LockGuard, Error>,
    Duration,
    String,
    String,
) {
    let request_held_up = matches!(held_up, Action::Delay(_));
    let (proxy, client) = proxy::proxied_client().await;
    let collection = common::unique("shutdown-transfer");
    let name = common::unique("transfer");
    let provider = Provider::new(&client.database(common::DATABASE))
        .with_collection(collection.as_str())
        .with_options(common::options(30_000, 10_000));
    let database = common::database().await;
    let documents = database.collection::<Document>(&collection);
    let guard = provider.create_lock(name.as_str()).acquire().await.unwrap();
    let releasing = common::lock_document(&documents, &name)
        .await
        .unwrap()
        .get_str("lockId")
        .unwrap()
        .to_owned();
    let waiter = {
        let apart = lock_built_apart(&database, &collection, &name);
        tokio::spawn(async move { apart.acquire_timeout(Duration::from_secs(60)).await })
    };
    assert!(common::offers_become(&collection, &name, 1).await);
    let slow =
        proxy.add_rule(Rule::new("findAndModify", held_up).where_present("query.lockId.$in"));
    let release = tokio::spawn(guard.release());
    if request_held_up {
        let sent = common::eventually(Duration::from_secs(10), || async { proxy.hits(slow) == 1 });
        assert!(sent.await, "the transfer's request is held up on its way");
    } else {
        assert!(
            transfer_applied(&documents, &name, &releasing).await,
            "the release handed the lock over"
        );
        assert_eq!(proxy.hits(slow), 1, "its reply is on its way");
    }
    tokio::time::timeout(Duration::from_secs(60), provider.shutdown())
        .await
        .expect("shutdown returns in bounded time");
    let shut_down = std::time::Instant::now();
    let _ = release.await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(60), waiter)
        .await
        .expect("the waiter is answered")
        .unwrap();
    (outcome, shut_down.elapsed(), collection, name)
}

/// A transfer whose *request* is still on its way when the releasing provider shuts down: the
/// shutdown waits for it (at most until the try's settle deadline, when the server has applied it
/// or given up), the transfer lands, and the waiter of the other family is handed the lock at
/// once, the only holder. (Undoing it at once instead would be safe here too: the releasing
/// lease's end makes the late transfer match nothing, and the waiter takes the free lock.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_waits_for_a_transfer_whose_request_is_on_its_way() {
    let (outcome, answered_after, collection, name) =
        shut_down_during_a_transfer(Action::Delay(Duration::from_secs(2))).await;
    let holder = outcome.expect("the waiter got the lock");
    assert!(
        answered_after < Duration::from_secs(5),
        "the waiter is answered by the transfer, not by its next poll 20 s later: {answered_after:?}"
    );
    is_the_only_holder(&holder, &collection, &name).await;
    holder.release().await.unwrap();
}

/// Whether, within 10 s, a transfer of `name` is applied: the stored lease is no longer
/// `releasing`.
async fn transfer_applied(documents: &Collection<Document>, name: &str, releasing: &str) -> bool {
    common::eventually(Duration::from_secs(10), || async {
        common::lock_document(documents, name)
            .await
            .and_then(|stored| stored.get_str("lockId").ok().map(str::to_owned))
            .is_some_and(|holder| holder != releasing)
    })
    .await
}

/// Fails if a third lock object can take `name` while `holder` holds it, or if `holder`'s lease
/// is not the one stored.
async fn is_the_only_holder(
    holder: &distributed_lock_mongodb::LockGuard,
    collection: &str,
    name: &str,
) {
    let database = common::database().await;
    let stored = common::lock_document(&database.collection::<Document>(collection), name)
        .await
        .unwrap();
    assert!(
        stored.contains_key("lockId"),
        "its lease was ended: {stored}"
    );
    assert_eq!(
        stored.get_i64("fencingToken"),
        Ok(holder.fencing_token().get()),
        "{stored}"
    );
    let third = lock_built_apart(&database, collection, name);
    assert!(
        third.try_acquire().await.unwrap().is_none(),
        "a third lock object took the lock while the waiter holds it"
    );
    assert!(!holder.is_lost());
}

/// The shutdown waits for the transfer's outcome (it settles within the attempt's server time
/// limit) instead of undoing it: the waiter gets the lock, and it alone holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_during_a_transfer_to_a_lock_built_apart_never_leaves_two_holders() {
    let (outcome, _, collection, name) =
        shut_down_during_a_transfer(Action::DelayReply(Duration::from_secs(1))).await;
    let holder = outcome.expect("the waiter got the lock");
    is_the_only_holder(&holder, &collection, &name).await;
    holder.release().await.unwrap();
}

/// A transfer whose reply comes after its settle deadline: the shutdown undoes it (the waiter's
/// lease too), so the waiter must not be handed that lease when the reply comes. It goes on
/// waiting and takes the freed lock with an attempt of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_never_handed_a_lease_whose_undo_was_sent() {
    let (outcome, _, collection, name) =
        shut_down_during_a_transfer(Action::DelayReply(Duration::from_secs(7))).await;
    let holder = outcome.expect("the waiter got the lock with an attempt of its own");
    is_the_only_holder(&holder, &collection, &name).await;
    holder.release().await.unwrap();
}

/// The waiter's side: a lock object of provider B (built apart, linked by the lease id it found
/// stored) waits; provider A's release becomes a transfer to it, applied, its reply slow; B is
/// shut down meanwhile and its runtime dropped right after, as a process exit does. B's shutdown
/// waits for the transfer's outcome and ends the lease it handed B, so the name is free when it
/// returns. Fails when the transfer is tracked by A alone: B's shutdown returns at once, the
/// lease is handed to B after its runtime is gone, and nobody releases it for its 30 s.
#[test]
fn a_shutdown_of_the_waiters_provider_waits_for_a_transfer_to_it() {
    let collection = common::unique("shutdown-receiving");
    let name = common::unique("transfer");
    let (network, proxy) = network();
    let (guard, releasing) = network.block_on(async {
        let holder = provider_through(&proxy, &collection).await;
        let guard = holder.create_lock(name.as_str()).acquire().await.unwrap();
        let documents = common::database().await.collection::<Document>(&collection);
        let stored = common::lock_document(&documents, &name).await.unwrap();
        (guard, stored.get_str("lockId").unwrap().to_owned())
    });
    let waiters = tokio::runtime::Runtime::new().unwrap();
    let (waiting, provider) = waiters.block_on(async {
        let provider = Provider::new(&common::database().await)
            .with_collection(collection.as_str())
            .with_options(common::options(30_000, 10_000));
        let lock = provider.create_lock(name.as_str());
        let waiting = tokio::spawn(async move { lock.acquire().await });
        assert!(common::offers_become(&collection, &name, 1).await);
        (waiting, provider)
    });
    let slow = proxy.add_rule(
        Rule::new("findAndModify", Action::DelayReply(Duration::from_secs(1)))
            .where_present("query.lockId.$in"),
    );
    let release = network.spawn(guard.release());
    network.block_on(async {
        let documents = common::database().await.collection::<Document>(&collection);
        assert!(
            transfer_applied(&documents, &name, &releasing).await,
            "the release handed the lock over"
        );
    });
    assert_eq!(proxy.hits(slow), 1);
    waiters.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), provider.shutdown())
            .await
            .expect("shutdown returns in bounded time");
        assert!(is_shut_down(waiting.await.unwrap()));
    });
    drop(waiters);
    assert!(
        is_free(&collection, &name),
        "the lease handed to the shut-down provider was ended before its shutdown returned"
    );
    network.block_on(release).unwrap().unwrap();
}
