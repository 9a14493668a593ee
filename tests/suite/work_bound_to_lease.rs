//! Work bound to the lease: `run_while_held` on every guard, the `*_and_run` methods of every
//! kind, and `max_hold`.

use test_support as common;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use distributed_lock_mongodb::{
    DocumentLock, Error, LockOptions, MongoDistributedLock, MongoDistributedReaderWriterLock,
    MongoDistributedSemaphore, Provider,
};
use mongodb::bson::{Document, doc};
use mongodb::{Collection, Database};

/// Long enough for a renewal (cadence 400 ms) to notice a deleted document, on a loaded machine.
const NOTICED_WITHIN: Duration = Duration::from_secs(10);

/// Work that never finishes by itself, and a flag set when it is dropped.
fn endless_work() -> (impl Future<Output = ()>, Arc<AtomicBool>) {
    struct SetOnDrop(Arc<AtomicBool>);
    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = SetOnDrop(Arc::clone(&dropped));
    let work = async move {
        let _flag = flag;
        std::future::pending::<()>().await;
    };
    (work, dropped)
}

/// Runs `running` (a guard's `run_while_held` of an [`endless_work`]) while `break_lease` takes
/// the lease away behind the holder's back; returns the lost lock's name from the error.
async fn lost_while_working(
    what: &str,
    running: impl Future<Output = Result<(), Error>>,
    dropped: &AtomicBool,
    break_lease: impl Future<Output = ()>,
) -> String {
    let (outcome, ()) = tokio::join!(tokio::time::timeout(NOTICED_WITHIN, running), break_lease);
    let error = outcome
        .unwrap_or_else(|_| panic!("{what}: the loss ended the work within {NOTICED_WITHIN:?}"))
        .expect_err("the work never completes by itself");
    assert!(
        dropped.load(Ordering::SeqCst),
        "{what}: the work was dropped"
    );
    match error {
        Error::LockLost { name } => name,
        other => panic!("{what}: expected LockLost, got {other}"),
    }
}

fn short_lease() -> LockOptions {
    common::options(4_000, 400)
}

async fn delete(database: &Database, collection: &str, name: &str) {
    database
        .collection::<Document>(collection)
        .delete_one(doc! { "_id": name })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_completing_first_returns_its_output_and_the_guard_stays_held() {
    let (lock, collection) = common::fresh_lock("work-done", short_lease()).await;
    let guard = lock.acquire().await.unwrap();
    let output = guard
        .run_while_held(async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            42
        })
        .await
        .unwrap();
    assert_eq!(output, 42);
    assert!(!guard.is_lost());
    let other = MongoDistributedLock::new(lock.name(), &common::database().await)
        .with_collection(collection.name())
        .with_options(short_lease());
    assert!(other.try_acquire().await.unwrap().is_none(), "still held");
    guard.release().await.unwrap();
    assert!(other.try_acquire().await.unwrap().is_some(), "released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_guard_drops_the_work_and_reports_the_loss() {
    let database = common::database().await;
    let (locks, rw, semaphores) = (
        common::unique("work-locks"),
        common::unique("work-rw"),
        common::unique("work-semaphores"),
    );
    let provider = Provider::new(&database)
        .with_collection(locks.as_str())
        .with_reader_writer_collection(rw.as_str())
        .with_semaphore_collection(semaphores.as_str())
        .with_options(short_lease());

    let lock = provider.create_lock(common::unique("exclusive"));
    let guard = lock.acquire().await.unwrap();
    let (work, dropped) = endless_work();
    let name = lost_while_working(
        "lock",
        guard.run_while_held(work),
        &dropped,
        delete(&database, &locks, lock.name()),
    )
    .await;
    assert_eq!(name, lock.name());

    let readers = provider.create_reader_writer_lock(common::unique("read"));
    let read = readers.acquire_read().await.unwrap();
    let (work, dropped) = endless_work();
    let name = lost_while_working(
        "read lock",
        read.run_while_held(work),
        &dropped,
        delete(&database, &rw, readers.name()),
    )
    .await;
    assert_eq!(name, readers.name());

    let writers = provider.create_reader_writer_lock(common::unique("write"));
    let write = writers.acquire_write().await.unwrap();
    let (work, dropped) = endless_work();
    let name = lost_while_working(
        "write lock",
        write.run_while_held(work),
        &dropped,
        delete(&database, &rw, writers.name()),
    )
    .await;
    assert_eq!(name, writers.name());

    let semaphore = provider.create_semaphore(common::unique("places"), 2);
    let place = semaphore.acquire().await.unwrap();
    let (work, dropped) = endless_work();
    let name = lost_while_working(
        "semaphore place",
        place.run_while_held(work),
        &dropped,
        delete(&database, &semaphores, semaphore.name()),
    )
    .await;
    assert_eq!(name, semaphore.name());

    let (first, second) = (common::unique("member-a"), common::unique("member-b"));
    let composite = provider
        .acquire_all(&[&first, &second], Duration::from_secs(5))
        .await
        .unwrap();
    let (work, dropped) = endless_work();
    let name = lost_while_working(
        "composite",
        composite.run_while_held(work),
        &dropped,
        delete(&database, &locks, &second),
    )
    .await;
    assert_eq!(name, second, "the error names the member that was lost");

    let jobs: Collection<Document> = database.collection(&common::unique("work-jobs"));
    jobs.insert_one(doc! { "_id": "job-1", "status": "pending" })
        .await
        .unwrap();
    let documents = DocumentLock::new(&jobs).with_options(short_lease());
    let job = documents.lock(doc! { "_id": "job-1" }).await.unwrap();
    let (work, dropped) = endless_work();
    let unlock_behind_its_back = async {
        jobs.update_one(doc! { "_id": "job-1" }, doc! { "$unset": { "lock": "" } })
            .await
            .unwrap();
    };
    let name = lost_while_working(
        "document lock",
        job.run_while_held(work),
        &dropped,
        unlock_behind_its_back,
    )
    .await;
    assert!(name.contains("job-1"), "{name}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_runs_work_while_held_and_releases_after_it() {
    let database = common::database().await;
    let provider = Provider::new(&database)
        .with_collection(common::unique("run-locks").as_str())
        .with_reader_writer_collection(common::unique("run-rw").as_str())
        .with_semaphore_collection(common::unique("run-semaphores").as_str())
        .with_options(short_lease());

    let lock = provider.create_lock(common::unique("exclusive"));
    let other = provider.create_lock(lock.name());
    let token = lock
        .acquire_and_run(async |guard| {
            assert!(other.try_acquire().await.unwrap().is_none(), "held");
            guard.fencing_token()
        })
        .await
        .unwrap();
    let next = other.try_acquire().await.unwrap().expect("released");
    assert!(next.fencing_token() > token);
    next.release().await.unwrap();

    let rw: MongoDistributedReaderWriterLock =
        provider.create_reader_writer_lock(common::unique("rw"));
    let read_output = rw
        .acquire_read_and_run(async |_| {
            assert!(rw.try_acquire_write().await.unwrap().is_none(), "read held");
            "read"
        })
        .await
        .unwrap();
    assert_eq!(read_output, "read");
    let write_token = rw
        .acquire_write_and_run(async |guard| {
            assert!(rw.try_acquire_read().await.unwrap().is_none(), "write held");
            guard.fencing_token()
        })
        .await
        .unwrap();
    let read = rw
        .try_acquire_read()
        .await
        .unwrap()
        .expect("write released");
    read.release().await.unwrap();
    let write = rw
        .try_acquire_write()
        .await
        .unwrap()
        .expect("read released");
    assert!(write.fencing_token() > write_token);
    write.release().await.unwrap();

    let semaphore: MongoDistributedSemaphore =
        provider.create_semaphore(common::unique("places"), 1);
    semaphore
        .acquire_and_run(async |_| {
            assert!(
                semaphore.try_acquire().await.unwrap().is_none(),
                "place held"
            );
        })
        .await
        .unwrap();
    let place = semaphore
        .try_acquire()
        .await
        .unwrap()
        .expect("place released");
    place.release().await.unwrap();

    let (first, second) = (common::unique("member-a"), common::unique("member-b"));
    let tokens = provider
        .acquire_all_and_run(&[&first, &second], Duration::from_secs(5), async |all| {
            let member = provider.create_lock(first.as_str());
            assert!(member.try_acquire().await.unwrap().is_none(), "held");
            all.fencing_tokens().count()
        })
        .await
        .unwrap();
    assert_eq!(tokens, 2);
    for name in [&first, &second] {
        let member = provider.create_lock(name.as_str()).try_acquire().await;
        member.unwrap().expect("released").release().await.unwrap();
    }

    let jobs: Collection<Document> = database.collection(&common::unique("run-jobs"));
    jobs.insert_one(doc! { "_id": "job-1", "status": "pending" })
        .await
        .unwrap();
    let documents = DocumentLock::new(&jobs).with_options(short_lease());
    let status = documents
        .lock_and_run(doc! { "_id": "job-1" }, async |job| {
            let filter = doc! { "_id": "job-1" };
            assert!(
                documents.try_lock(filter).await.unwrap().is_none(),
                "locked"
            );
            job.document().get_str("status").unwrap().to_owned()
        })
        .await
        .unwrap();
    assert_eq!(status, "pending");
    let job = documents
        .try_lock(doc! { "_id": "job-1" })
        .await
        .unwrap()
        .expect("unlocked");
    job.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_and_run_reports_a_loss_during_the_work() {
    let (lock, collection) = common::fresh_lock("run-lost", short_lease()).await;
    let (work, dropped) = endless_work();
    let outcome = tokio::time::timeout(
        NOTICED_WITHIN,
        lock.acquire_and_run(async |_| {
            collection
                .delete_one(doc! { "_id": lock.name() })
                .await
                .unwrap();
            work.await;
        }),
    )
    .await
    .expect("the loss ended the work");
    assert!(outcome.unwrap_err().is_lock_lost());
    assert!(dropped.load(Ordering::SeqCst), "the work was dropped");
}

/// A holder that keeps renewing (its process is fine, its work is stuck) loses the lock at
/// `max_hold`: `lost` fires, renewal stops, and another client takes the lock once the last
/// renewal's lease has ended — after the holder saw `lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_keeps_renewing_loses_the_lock_at_max_hold() {
    let max_hold = Duration::from_millis(2_500);
    let options = LockOptions::builder()
        .expiry(Duration::from_millis(1_000))
        .extension_cadence(Duration::from_millis(200))
        .busy_wait_sleep_time(Duration::from_millis(5), Duration::from_millis(20))
        .max_hold(max_hold)
        .build()
        .unwrap();
    let (lock, collection) = common::fresh_lock("max-hold", options.clone()).await;
    let started = Instant::now();
    let guard = lock.acquire().await.unwrap();
    let first_expiry = common::server_now_and_expiry(&collection, lock.name())
        .await
        .1
        .unwrap();

    // A lock built apart (no in-process handoff) waits for it, as another process would, and
    // checks the holder's signal (computed from its deadline, not from when a task runs) as soon
    // as it holds the lock.
    let other = MongoDistributedLock::new(lock.name(), &common::database().await)
        .with_collection(collection.name())
        .with_options(options);
    let holder_lost = guard.lost();
    let waiting = tokio::spawn(async move {
        let next = other.acquire_timeout(Duration::from_secs(20)).await;
        (next, holder_lost.is_lost(), Instant::now())
    });

    tokio::time::timeout(max_hold + Duration::from_secs(10), guard.lost().wait())
        .await
        .expect("lost by max_hold while renewals kept succeeding");
    let lost_after = started.elapsed();
    let last_expiry = common::server_now_and_expiry(&collection, lock.name())
        .await
        .1
        .unwrap();
    assert!(
        last_expiry > first_expiry,
        "the lease was renewed before max_hold ({first_expiry} → {last_expiry})"
    );

    let (next, lost_when_taken, acquired_at) = waiting.await.unwrap();
    let next = next.expect("another client takes the lock once renewal stopped");
    assert!(
        lost_when_taken,
        "the holder's lost signal had fired when another client got the lock"
    );
    println!(
        "max_hold {max_hold:?}: lost after {lost_after:?}; the next holder acquired after {:?}",
        acquired_at - started
    );
    next.release().await.unwrap();
    assert!(guard.release().await.unwrap_err().is_lock_lost());
}

/// The same for a document lock, whose lease is stored in the user's document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_document_lock_is_lost_at_max_hold_and_no_longer_renewed() {
    let options = LockOptions::builder()
        .expiry(Duration::from_millis(1_000))
        .extension_cadence(Duration::from_millis(200))
        .busy_wait_sleep_time(Duration::from_millis(5), Duration::from_millis(20))
        .max_hold(Duration::from_millis(1_500))
        .build()
        .unwrap();
    let jobs: Collection<Document> = common::database()
        .await
        .collection(&common::unique("max-hold-jobs"));
    jobs.insert_one(doc! { "_id": "job", "status": "pending" })
        .await
        .unwrap();
    let documents = DocumentLock::new(&jobs).with_options(options);
    let job = documents.lock(doc! { "_id": "job" }).await.unwrap();
    tokio::time::timeout(Duration::from_secs(12), job.lost().wait())
        .await
        .expect("lost by max_hold");
    let next = documents
        .lock_timeout(doc! { "_id": "job" }, Duration::from_secs(20))
        .await
        .expect("locked again once renewal stopped");
    assert!(next.fencing_token() > job.fencing_token());
    assert!(job.is_lost());
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bound_tasks_are_aborted_and_the_token_fires_when_the_lock_is_lost() {
    let (lock, collection) = common::fresh_lock("bound-lost", short_lease()).await;
    let guard = lock.acquire().await.unwrap();
    let token = guard.cancellation();
    let (work, dropped) = endless_work();
    let task = guard.spawn(work).unwrap();
    let database = common::database().await;
    delete(&database, collection.name(), lock.name()).await;
    tokio::time::timeout(NOTICED_WITHIN, guard.lost().wait())
        .await
        .expect("the loss is noticed");
    tokio::time::timeout(NOTICED_WITHIN, token.cancelled())
        .await
        .expect("the token fires");
    let ended = tokio::time::timeout(NOTICED_WITHIN, task)
        .await
        .expect("the task ends");
    assert!(ended.unwrap_err().is_cancelled(), "aborted");
    assert!(dropped.load(Ordering::SeqCst));
    // A task spawned once the lock is lost is aborted at once.
    let (late, late_dropped) = endless_work();
    let late = guard.spawn(late).unwrap();
    assert!(late.await.unwrap_err().is_cancelled());
    assert!(late_dropped.load(Ordering::SeqCst));
    assert!(matches!(guard.release().await, Err(Error::LockLost { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_tells_bound_tasks_to_stop_and_waits_for_them_while_the_lock_is_held() {
    let (lock, collection) = common::fresh_lock("bound-release", short_lease()).await;
    let guard = lock.acquire().await.unwrap();
    let other = MongoDistributedLock::new(lock.name(), &common::database().await)
        .with_collection(collection.name())
        .with_options(short_lease());
    let finished = Arc::new(AtomicBool::new(false));
    let (token, done, rival) = (guard.cancellation(), Arc::clone(&finished), other.clone());
    let wind_down = guard
        .spawn(async move {
            token.cancelled().await;
            // Winding down, after the release began: the lock is still held meanwhile.
            let busy = rival.try_acquire().await.unwrap().is_none();
            tokio::time::sleep(Duration::from_millis(100)).await;
            done.store(true, Ordering::SeqCst);
            busy
        })
        .unwrap();
    guard.release().await.unwrap();
    assert!(
        finished.load(Ordering::SeqCst),
        "the release waited for the task"
    );
    assert!(wind_down.await.unwrap(), "held while its task wound down");
    assert!(
        other.try_acquire().await.unwrap().is_some(),
        "released after"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_tasks_ends_bound_tasks_at_once_and_so_does_dropping_the_guard() {
    let (lock, _collection) = common::fresh_lock("bound-abort", short_lease()).await;
    let guard = lock.acquire().await.unwrap();
    let (work, dropped) = endless_work();
    let task = guard.spawn(work).unwrap();
    guard.abort_tasks();
    assert!(task.await.unwrap_err().is_cancelled());
    assert!(dropped.load(Ordering::SeqCst));
    assert!(guard.cancellation().is_cancelled());
    // The release does not wait for aborted tasks.
    tokio::time::timeout(NOTICED_WITHIN, guard.release())
        .await
        .expect("released at once")
        .unwrap();

    let guard = lock.acquire().await.unwrap();
    let (work, dropped) = endless_work();
    let task = guard.spawn(work).unwrap();
    drop(guard);
    assert!(task.await.unwrap_err().is_cancelled());
    assert!(dropped.load(Ordering::SeqCst));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readers_and_a_document_locks_guards_bind_tasks_too() {
    let database = common::database().await;
    let rw = MongoDistributedReaderWriterLock::new(common::unique("bound-rw"), &database)
        .with_collection(common::unique("bound-rw"))
        .with_options(short_lease());
    let reader = rw.acquire_read().await.unwrap();
    let (work, dropped) = endless_work();
    let task = reader.spawn(work).unwrap();
    reader.abort_tasks();
    assert!(task.await.unwrap_err().is_cancelled());
    assert!(dropped.load(Ordering::SeqCst));
    reader.release().await.unwrap();

    let collection = common::unique("bound-docs");
    let documents = database.collection::<Document>(&collection);
    documents.insert_one(doc! { "_id": 1 }).await.unwrap();
    let locks = DocumentLock::new(&documents).with_options(short_lease());
    let guard = locks.lock(doc! { "_id": 1 }).await.unwrap();
    let token = guard.cancellation();
    let waited = guard.spawn(async move { token.cancelled().await }).unwrap();
    guard.release().await.unwrap();
    waited.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_work_stalls_loses_the_lock_at_max_idle_and_progress_keeps_it() {
    // Long enough that a loaded machine's scheduling never looks like a stall.
    const MAX_IDLE: Duration = Duration::from_secs(3);
    let options = short_lease()
        .to_builder()
        .max_idle(MAX_IDLE)
        .build()
        .unwrap();
    let (lock, collection) = common::fresh_lock("idle", options).await;
    let guard = lock.acquire().await.unwrap();
    let started = Instant::now();
    // Work that makes progress keeps the lease past max_idle (renewals go on every 400 ms).
    while started.elapsed() < MAX_IDLE + Duration::from_secs(1) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(guard.progress(), "held while the work progresses");
    }
    // The work stalls: the lock is lost once max_idle has passed since the last progress.
    let stalled = Instant::now();
    tokio::time::timeout(MAX_IDLE + NOTICED_WITHIN, guard.lost().wait())
        .await
        .expect("a stalled holder loses the lock");
    assert!(stalled.elapsed() >= MAX_IDLE - Duration::from_millis(200));
    assert!(!guard.progress(), "progress after the loss revives nothing");
    // Another instance takes over once the last renewal's lease has ended on the server.
    let other = MongoDistributedLock::new(lock.name(), &common::database().await)
        .with_collection(collection.name())
        .with_options(short_lease());
    let next = other
        .acquire_timeout(Duration::from_secs(30))
        .await
        .unwrap();
    assert!(next.fencing_token() > guard.fencing_token());
    assert!(matches!(guard.release().await, Err(Error::LockLost { .. })));
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_idle_out_of_range_is_refused() {
    for max_idle in [Duration::ZERO, Duration::from_secs(366 * 24 * 60 * 60)] {
        let refused = LockOptions::builder().max_idle(max_idle).build();
        assert!(
            matches!(&refused, Err(Error::InvalidOptions(message)) if message.contains("max_idle")),
            "{refused:?}"
        );
    }
}
