//! `Provider::shutdown`: every lease of every kind released, dropped guards' releases waited
//! for, waiting and later acquisitions refused with `Error::ShutDown`.

mod common;

use std::time::Duration;

use distributed_lock_mongodb::{Error, Provider};
use mongodb::Collection;
use mongodb::bson::{Document, doc};

/// Two providers on the same collections: `ours` is shut down, `theirs` (built apart, as in
/// another process) checks that everything was released.
async fn providers() -> (Provider, Provider, Collection<Document>) {
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
    (build(), build(), jobs)
}

fn is_shut_down<T: std::fmt::Debug>(result: Result<T, Error>) -> bool {
    matches!(result, Err(Error::ShutDown))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_every_lease_of_every_kind_and_refuses_later_acquisitions() {
    let (ours, theirs, jobs) = providers().await;
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
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "the lock is busy");

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
    let (ours, _theirs, _jobs) = providers().await;
    tokio::time::timeout(Duration::from_secs(5), ours.shutdown())
        .await
        .expect("nothing to release");
    assert!(is_shut_down(ours.create_lock("late").try_acquire().await));
}
