//! Reader-writer locks: shared readers, an exclusive writer, writer preference, the waiting
//! writer's marker, lease loss, and holders' details.

use test_support as common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use distributed_lock_mongodb::{
    Error, LockDetails, LockKind, LockOptions, LockStatus, MongoDistributedReaderWriterLock,
    Provider,
};
use mongodb::Collection;
use mongodb::bson::{DateTime, Document, doc};
use tokio::time::Instant;

/// A reader-writer lock with a unique name in a unique collection, and that collection.
async fn rw_lock(options: LockOptions) -> (MongoDistributedReaderWriterLock, Collection<Document>) {
    let database = common::database().await;
    let collection = common::unique("rw");
    let lock = MongoDistributedReaderWriterLock::new(common::unique("rw"), &database)
        .with_collection(collection.as_str())
        .with_options(options);
    (lock, database.collection(&collection))
}

async fn stored(
    collection: &Collection<Document>,
    lock: &MongoDistributedReaderWriterLock,
) -> Document {
    common::lock_document(collection, lock.name())
        .await
        .expect("the lock has a document")
}

#[tokio::test]
async fn readers_share_and_a_writer_excludes() {
    let (lock, _) = rw_lock(common::options(5_000, 1_000)).await;
    let first = lock
        .try_acquire_read()
        .await
        .unwrap()
        .expect("first reader");
    let second = lock
        .try_acquire_read()
        .await
        .unwrap()
        .expect("second reader");
    assert_eq!(first.name(), lock.name());
    assert!(
        lock.try_acquire_write().await.unwrap().is_none(),
        "readers exclude a writer"
    );
    first.release().await.unwrap();
    assert!(
        lock.try_acquire_write().await.unwrap().is_none(),
        "one reader still holds"
    );
    second.release().await.unwrap();

    let writer = lock
        .try_acquire_write()
        .await
        .unwrap()
        .expect("no reader left");
    assert!(
        lock.try_acquire_read().await.unwrap().is_none(),
        "a writer excludes readers"
    );
    assert!(
        lock.try_acquire_write().await.unwrap().is_none(),
        "and other writers"
    );
    let error = lock
        .acquire_write_timeout(Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(error.is_timeout(), "{error}");
    writer.release().await.unwrap();

    let reader = lock.try_acquire_read().await.unwrap().expect("writer gone");
    drop(reader); // releases in the background
    let writer = lock
        .acquire_write_timeout(Duration::from_secs(5))
        .await
        .expect("a dropped reader frees the lock");
    writer.release().await.unwrap();
}

#[tokio::test]
async fn write_fencing_tokens_strictly_increase_across_writers() {
    let (lock, _) = rw_lock(common::options(5_000, 1_000)).await;
    let mut previous = None;
    for round in 0..5 {
        if round % 2 == 0 {
            lock.acquire_read().await.unwrap().release().await.unwrap();
        }
        let writer = lock.acquire_write().await.unwrap();
        let token = writer.fencing_token();
        assert!(previous < Some(token), "{previous:?} then {token:?}");
        previous = Some(token);
        if round == 3 {
            drop(writer);
        } else {
            writer.release().await.unwrap();
        }
    }
}

#[tokio::test]
async fn expired_holders_are_ignored() {
    let (lock, collection) = rw_lock(common::options(5_000, 1_000)).await;
    let past = DateTime::from_millis(DateTime::now().timestamp_millis() - 60_000);
    collection
        .insert_one(doc! {
            "_id": lock.name(),
            "readers": [{ "id": "crashed-reader", "expiresAt": past }],
            "writer": { "id": "crashed-writer", "expiresAt": past, "fencingToken": 5_000_i64 << 40 },
            "waitingWriter": { "id": "crashed-waiter", "expiresAt": past },
        })
        .await
        .unwrap();
    let writer = lock
        .try_acquire_write()
        .await
        .unwrap()
        .expect("all leases ended");
    assert!(
        writer.fencing_token().get() > 5_000_i64 << 40,
        "tokens continue"
    );
    let document = stored(&collection, &lock).await;
    assert_eq!(
        document.get_array("readers").unwrap().len(),
        0,
        "{document}"
    );
    assert!(!document.contains_key("waitingWriter"), "{document}");
    writer.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_gets_in_while_eight_readers_keep_reacquiring() {
    const READERS: usize = 8;
    const HOLD: Duration = Duration::from_millis(200);
    // Eight busy readers get a server of their own, away from this file's other tests.
    let server = common::server::isolated();
    let provider = Provider::new(&common::database_on(&server.uri).await)
        .with_options(common::options(5_000, 1_000));
    let lock = provider.create_reader_writer_lock(common::unique("preference"));
    let stop = Arc::new(AtomicBool::new(false));
    let reading = Arc::new(AtomicUsize::new(0));
    let reads = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..READERS)
        .map(|i| {
            let (lock, stop) = (lock.clone(), Arc::clone(&stop));
            let (reading, reads) = (Arc::clone(&reading), Arc::clone(&reads));
            tokio::spawn(async move {
                // Staggered, so that the readers' holds always overlap.
                tokio::time::sleep(HOLD / READERS as u32 * i as u32).await;
                while !stop.load(Ordering::SeqCst) {
                    let guard = lock.acquire_read().await.unwrap();
                    reading.fetch_add(1, Ordering::SeqCst);
                    reads.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(HOLD).await;
                    reading.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    tokio::time::sleep(HOLD * 2).await;

    // Control: a writer that only ever tries once (and so leaves no marker) finds readers every
    // time: without writer preference, writers starve.
    let control_end = Instant::now() + HOLD * 8;
    let mut tries = 0;
    while Instant::now() < control_end {
        tries += 1;
        assert!(
            lock.try_acquire_write().await.unwrap().is_none(),
            "the readers' holds overlap, leaving no gap"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let reads_before = reads.load(Ordering::SeqCst);
    let started = Instant::now();
    let writer = lock
        .acquire_write_timeout(Duration::from_secs(30))
        .await
        .unwrap();
    let waited = started.elapsed();
    assert_eq!(
        reading.load(Ordering::SeqCst),
        0,
        "no reader holds while the writer does"
    );
    tokio::time::sleep(HOLD).await;
    assert_eq!(
        reading.load(Ordering::SeqCst),
        0,
        "readers wait for the writer"
    );
    writer.release().await.unwrap();
    let more_reads = common::eventually(Duration::from_secs(5), || async {
        reads.load(Ordering::SeqCst) > reads_before + READERS
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    for reader in readers {
        reader.await.unwrap();
    }
    println!(
        "writer preference: {tries} plain write tries all failed; the waiting writer got in after \
         {waited:?} (reader hold {HOLD:?}, {READERS} readers)"
    );
    // The slow path this excludes is starvation: without writer preference the readers' holds
    // overlap forever (the control above) and the writer stays out until its 30 s timeout. The
    // wait it does have is the last readers' holds plus their releases and its own attempts,
    // which a loaded embedded server runs one after another at tens of milliseconds each (1.3 s
    // in a CI run beside a CPU hog, against 800 ms allowed before).
    assert!(
        waited < Duration::from_secs(10),
        "the writer waited {waited:?}"
    );
    assert!(more_reads, "readers carry on after the writer");
}

#[tokio::test]
async fn a_timed_out_writer_removes_its_marker_before_returning() {
    let (lock, collection) = rw_lock(common::options(5_000, 1_000)).await;
    let reader = lock.acquire_read().await.unwrap();
    let error = lock
        .acquire_write_timeout(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Timeout { .. }), "{error}");
    let document = stored(&collection, &lock).await;
    assert!(!document.contains_key("waitingWriter"), "{document}");
    let second = lock
        .try_acquire_read()
        .await
        .unwrap()
        .expect("readers are not held back");

    // The same with try_acquire_write_timeout.
    assert!(
        lock.try_acquire_write_timeout(Duration::from_millis(300))
            .await
            .unwrap()
            .is_none()
    );
    let document = stored(&collection, &lock).await;
    assert!(!document.contains_key("waitingWriter"), "{document}");
    reader.release().await.unwrap();
    second.release().await.unwrap();
}

#[tokio::test]
async fn a_cancelled_writer_removes_its_marker_long_before_its_lease_ends() {
    // Slow polling: the marker's lease is 2 × 3 s + 1 s = 7 s.
    let options = LockOptions::builder()
        .expiry(Duration::from_secs(5))
        .busy_wait_sleep_time(Duration::from_secs(3), Duration::from_secs(3))
        .build()
        .unwrap();
    let (lock, collection) = rw_lock(options).await;
    let reader = lock.acquire_read().await.unwrap();
    let waiting = tokio::spawn({
        let lock = lock.clone();
        async move { lock.acquire_write().await }
    });
    let marked = common::eventually(Duration::from_secs(5), || async {
        stored(&collection, &lock)
            .await
            .contains_key("waitingWriter")
    })
    .await;
    assert!(marked, "the waiting writer placed its marker");
    assert!(
        lock.try_acquire_read().await.unwrap().is_none(),
        "the marker holds readers back"
    );
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    let removed = common::eventually(Duration::from_secs(2), || async {
        !stored(&collection, &lock)
            .await
            .contains_key("waitingWriter")
    })
    .await;
    assert!(removed, "the marker is removed, not left to its 7 s lease");
    let second = lock
        .try_acquire_read()
        .await
        .unwrap()
        .expect("readers go on at once");
    second.release().await.unwrap();
    reader.release().await.unwrap();
}

#[tokio::test]
async fn a_vanished_writers_marker_blocks_readers_only_until_its_lease_ends() {
    let (lock, collection) = rw_lock(common::options(5_000, 1_000)).await;
    collection
        .update_one(
            doc! { "_id": lock.name() },
            vec![doc! { "$set": { "waitingWriter": {
                "id": "vanished", "expiresAt": { "$add": ["$$NOW", 1_000_i64] }
            } } }],
        )
        .upsert(true)
        .await
        .unwrap();
    assert!(
        lock.try_acquire_read().await.unwrap().is_none(),
        "a live marker holds readers back"
    );
    let reader = lock
        .acquire_read_timeout(Duration::from_secs(5))
        .await
        .expect("the marker's lease ends");
    reader.release().await.unwrap();
}

#[tokio::test]
async fn lost_leases_are_signalled_and_releases_touch_only_their_own_holder() {
    let (lock, collection) = rw_lock(common::options(2_000, 200)).await;
    let mine = lock.acquire_read().await.unwrap();
    let other = lock.acquire_read().await.unwrap();
    let lost = mine.lost();
    // Someone removes our reader entry (as force-release tooling would).
    let mine_id = stored(&collection, &lock)
        .await
        .get_array("readers")
        .unwrap()[0]
        .as_document()
        .unwrap()
        .get_str("id")
        .unwrap()
        .to_owned();
    collection
        .update_one(
            doc! { "_id": lock.name() },
            doc! { "$pull": { "readers": { "id": &mine_id } } },
        )
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(2), lost.wait())
        .await
        .expect("lost within a cadence or two");
    assert!(
        mine.is_lost() ^ other.is_lost(),
        "only the removed reader is lost"
    );
    let (mine, other) = if mine.is_lost() {
        (mine, other)
    } else {
        (other, mine)
    };
    assert!(matches!(mine.release().await, Err(Error::LockLost { .. })));
    let readers = stored(&collection, &lock).await;
    assert_eq!(
        readers.get_array("readers").unwrap().len(),
        1,
        "the other reader stays: {readers}"
    );
    other.release().await.unwrap();

    // A writer whose lease was taken over is lost, and its release leaves the new holder alone.
    let writer = lock.acquire_write().await.unwrap();
    collection
        .update_one(
            doc! { "_id": lock.name() },
            doc! { "$set": { "writer.id": "intruder" } },
        )
        .await
        .unwrap();
    let lost = writer.lost();
    tokio::time::timeout(Duration::from_secs(2), lost.wait())
        .await
        .expect("lost within a cadence or two");
    assert!(matches!(
        writer.release().await,
        Err(Error::LockLost { .. })
    ));
    let document = stored(&collection, &lock).await;
    assert_eq!(
        document.get_document("writer").unwrap().get_str("id"),
        Ok("intruder")
    );
}

/// Held for longer than their expiry, renewed. (The expiry leaves a renewal 2.5 s to be
/// answered: with 600 ms, a reader was lost once in a CI run beside a CPU hog, rightly.)
#[tokio::test]
async fn held_leases_are_renewed_past_their_expiry() {
    let (lock, _) = rw_lock(common::options(3_000, 500)).await;
    let reader = lock.acquire_read().await.unwrap();
    let second_reader = lock.acquire_read().await.unwrap();
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert!(!reader.is_lost() && !second_reader.is_lost());
    assert!(
        lock.try_acquire_write().await.unwrap().is_none(),
        "both readers still hold"
    );
    reader.release().await.unwrap();
    second_reader.release().await.unwrap();
    let writer = lock.acquire_write().await.unwrap();
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert!(!writer.is_lost());
    assert!(
        lock.try_acquire_read().await.unwrap().is_none(),
        "the writer still holds"
    );
    writer.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquisitions_leave_nothing_held() {
    let (lock, _) = rw_lock(common::options(5_000, 1_000)).await;
    let writer = lock.acquire_write().await.unwrap();
    for _ in 0..3 {
        let waiters: Vec<_> = (0..10)
            .map(|i| {
                let lock = lock.clone();
                tokio::spawn(async move {
                    if i % 2 == 0 {
                        lock.acquire_read().await.map(drop)
                    } else {
                        lock.acquire_write().await.map(drop)
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(30)).await;
        for waiter in &waiters {
            waiter.abort();
        }
        for waiter in waiters {
            assert!(waiter.await.unwrap_err().is_cancelled());
        }
    }
    writer.release().await.unwrap();
    let next = lock
        .acquire_write_timeout(Duration::from_secs(2))
        .await
        .expect("no cancelled reader, writer or marker is left behind for long");
    next.release().await.unwrap();
}

#[tokio::test]
async fn holders_show_kind_lease_and_details() {
    let database = common::database().await;
    let provider = Provider::new(&database)
        .with_options(common::options(5_000, 1_000))
        .with_details(
            LockDetails::new()
                .with_owner("$not-a-field-path")
                .with_extra(doc! { "job": "reindex", "attempt": 2 }),
        );
    let lock = provider.create_reader_writer_lock(common::unique("details"));
    assert!(
        lock.holders().await.unwrap().is_empty(),
        "a new lock has no holders"
    );

    let readers = [
        lock.acquire_read().await.unwrap(),
        lock.acquire_read().await.unwrap(),
    ];
    let holders = lock.holders().await.unwrap();
    assert_eq!(holders.len(), 2, "{holders:?}");
    for holder in &holders {
        assert_eq!(
            (holder.kind, holder.name.as_str()),
            (LockKind::Read, lock.name())
        );
        assert_eq!(holder.owner(), Some("$not-a-field-path"), "stored verbatim");
        assert_eq!(holder.pid(), Some(std::process::id()));
        assert_eq!(holder.host(), LockDetails::new().host.as_deref());
        let details = holder.details.as_ref().unwrap();
        assert_eq!(details.extra, doc! { "job": "reindex", "attempt": 2 });
        assert!(holder.is_held() && holder.lock_id.is_some() && holder.fencing_token.is_none());
        assert!(holder.remaining.unwrap() <= Duration::from_secs(5));
    }
    let listed: Vec<_> = provider
        .held_locks()
        .await
        .unwrap()
        .into_iter()
        .filter(|held| held.name == lock.name())
        .collect();
    // The same holders and leases (`remaining` moves on between the two reads).
    let lease = |held: &LockStatus| {
        (
            held.kind,
            held.lock_id.clone(),
            held.expires_at,
            held.details.clone(),
        )
    };
    assert_eq!(
        listed.iter().map(lease).collect::<Vec<_>>(),
        holders.iter().map(lease).collect::<Vec<_>>(),
        "the provider's listing shows the same holders"
    );
    for reader in readers {
        reader.release().await.unwrap();
    }

    let writer = lock.acquire_write().await.unwrap();
    let holders = lock.holders().await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0].kind, LockKind::Write);
    assert_eq!(holders[0].fencing_token, Some(writer.fencing_token()));
    assert_eq!(holders[0].owner(), Some("$not-a-field-path"));
    writer.release().await.unwrap();
    assert!(lock.holders().await.unwrap().is_empty(), "released");
}

#[tokio::test]
async fn invalid_collection_names_are_reported_before_anything_is_sent() {
    let database = common::database().await;
    let lock = MongoDistributedReaderWriterLock::new("x", &database).with_collection("bad$name");
    for error in [
        lock.try_acquire_read().await.map(drop).unwrap_err(),
        lock.acquire_write_timeout(Duration::from_secs(1))
            .await
            .map(drop)
            .unwrap_err(),
        lock.holders().await.map(drop).unwrap_err(),
    ] {
        assert!(
            matches!(&error, Error::InvalidCollectionName { collection, .. } if collection == "bad$name"),
            "{error}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writers_release_wakes_every_local_reader_waiting_behind_it() {
    const READERS: usize = 5;
    // Waiters that would sleep 20 s between attempts: anything faster is a local wake-up.
    let sleepy = LockOptions::builder()
        .busy_wait_sleep_time(Duration::from_secs(20), Duration::from_secs(20))
        .build()
        .unwrap();
    let (lock, collection) = rw_lock(sleepy).await;
    let writer = lock.acquire_write().await.unwrap();
    let (acquired, mut acquisitions) = tokio::sync::mpsc::unbounded_channel();
    let mut readers = Vec::new();
    for queued in 1..=READERS {
        let (reader, acquired) = (lock.clone(), acquired.clone());
        readers.push(tokio::spawn(async move {
            let read = reader
                .acquire_read_timeout(Duration::from_secs(60))
                .await
                .unwrap();
            acquired.send(()).unwrap();
            std::future::pending::<()>().await;
            drop(read);
        }));
        // The writer is held here: the reader queues at once, with an offer.
        let in_line = common::offers_become(collection.name(), lock.name(), queued).await;
        assert!(in_line, "reader {queued} did not queue");
    }
    writer.release().await.unwrap();
    for reader in 0..READERS {
        tokio::time::timeout(Duration::from_secs(10), acquisitions.recv())
            .await
            .unwrap_or_else(|_| panic!("reader {reader} woken by the release, not a 20 s sleep"))
            .unwrap();
    }
    assert_eq!(lock.holders().await.unwrap().len(), READERS);
    for reader in readers {
        reader.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writers_release_admits_every_local_reader_behind_it_in_one_command() {
    const READERS: usize = 5;
    let (database, log) = common::counting_database().await;
    let collection = common::unique("rw");
    // Waiters that would sleep 20 s between attempts: anything faster is the handoff.
    let sleepy = LockOptions::builder()
        .busy_wait_sleep_time(Duration::from_secs(20), Duration::from_secs(20))
        .build()
        .unwrap();
    let lock = MongoDistributedReaderWriterLock::new(common::unique("admit"), &database)
        .with_collection(collection.as_str())
        .with_options(sleepy);
    let writer = lock.acquire_write().await.unwrap();
    let (acquired, mut acquisitions) = tokio::sync::mpsc::unbounded_channel();
    let mut readers = Vec::new();
    for queued in 1..=READERS {
        let (reader, acquired) = (lock.clone(), acquired.clone());
        readers.push(tokio::spawn(async move {
            let read = reader
                .acquire_read_timeout(Duration::from_secs(60))
                .await
                .unwrap();
            acquired.send(()).unwrap();
            std::future::pending::<()>().await;
            drop(read);
        }));
        // The writer is held here: the reader queues at once, with an offer.
        let in_line = common::offers_become(&collection, lock.name(), queued).await;
        assert!(in_line, "reader {queued} did not queue");
    }
    log.clear();
    writer.release().await.unwrap();
    // The release command itself admitted them all.
    assert_eq!(
        log.started_without_streams(),
        ["findAndModify"],
        "{:#?}",
        log.find_and_modifies()
    );
    assert_eq!(log.transfers(), 1);
    for reader in 0..READERS {
        tokio::time::timeout(Duration::from_secs(10), acquisitions.recv())
            .await
            .unwrap_or_else(|_| panic!("reader {reader} admitted by the release"))
            .unwrap();
    }
    assert_eq!(lock.holders().await.unwrap().len(), READERS);
    assert_eq!(
        log.started_without_streams(),
        ["findAndModify"],
        "and no attempt"
    );
    for reader in readers {
        reader.abort();
    }
}

/// Every waiting writer keeps its waiting-writer marker in place, also one queued behind another
/// local waiter: in one process only the first waiter polls for the lock, but a writer's
/// attempts are what renew its marker, so a writer polls (at the slowest busy-wait pace) even
/// behind others. Without that its marker lapses, readers of other processes slip in, and the
/// writer is overtaken by the reader queued before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_queued_behind_a_local_reader_keeps_its_marker_and_goes_first() {
    let (database, commands) = common::counting_database().await;
    let collection = common::unique("rw");
    let name = common::unique("rw");
    // Busy-wait up to 200 ms: the marker's lease is 2 × 200 ms + 1 s = 1.4 s.
    let options = LockOptions::builder()
        .expiry(Duration::from_secs(10))
        .busy_wait_sleep_time(Duration::from_millis(5), Duration::from_millis(200))
        .build()
        .unwrap();
    let provider = Provider::new(&database)
        .with_reader_writer_collection(collection.as_str())
        .with_options(options);
    let other = MongoDistributedReaderWriterLock::new(name.as_str(), &common::database().await)
        .with_collection(collection.as_str());
    let writing_elsewhere = other.acquire_write().await.unwrap();

    let attempts = || commands.count("findAndModify");
    let reader = tokio::spawn({
        let lock = provider.create_reader_writer_lock(name.as_str());
        async move { lock.acquire_read().await }
    });
    assert!(
        common::offers_become(&collection, &name, 1).await,
        "the reader found the lock busy and waits in line"
    );
    let before = attempts();
    let writer = tokio::spawn({
        let lock = provider.create_reader_writer_lock(name.as_str());
        async move { lock.acquire_write().await }
    });
    assert!(common::eventually(Duration::from_secs(5), || async { attempts() > before }).await);

    // Three marker leases later the writer's marker is still there.
    tokio::time::sleep(Duration::from_millis(4_200)).await;
    let control = common::database().await.collection::<Document>(&collection);
    let stored = common::lock_document(&control, &name).await.unwrap();
    let marker_ends = *stored
        .get_document("waitingWriter")
        .expect("a waiting-writer marker")
        .get_datetime("expiresAt")
        .unwrap();
    let (now, _) = common::server_now_and_expiry(&control, &name).await;
    assert!(
        marker_ends > now,
        "the marker is live ({marker_ends} vs now {now})"
    );
    assert!(
        other.try_acquire_read().await.unwrap().is_none(),
        "readers elsewhere are held back"
    );

    writing_elsewhere.release().await.unwrap();
    let write = tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("the writer gets in")
        .unwrap()
        .unwrap();
    assert!(
        !reader.is_finished(),
        "the reader queued first waits for the writer"
    );
    write.release().await.unwrap();
    let read = tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .expect("then the reader")
        .unwrap()
        .unwrap();
    read.release().await.unwrap();
}

/// A write attempt applied a second time after it won (a request the network or a retry
/// delivered twice) leaves no waiting-writer marker: its wait is over, and a marker left now
/// would hold every reader and writer back until it expired. Found by the model checker
/// (`model/`, a reader-writer lock with one fault): before, the second application placed the
/// marker and everyone waited out its 2.6 s lease.
#[tokio::test]
async fn a_write_attempt_applied_twice_leaves_no_waiting_marker() {
    use distributed_lock_mongodb::__model::{attempt_filter, reader_writer};
    use mongodb::options::ReturnDocument;

    let (lock, collection) = rw_lock(common::options(5_000, 1_000)).await;
    let update =
        reader_writer::attempt_update("w-1", false, lock.options(), "marker-1", false, None);
    for application in ["first", "second"] {
        let document = collection
            .find_one_and_update(attempt_filter(lock.name()), update.clone())
            .upsert(true)
            .return_document(ReturnDocument::After)
            .await
            .unwrap()
            .expect("an upsert returns the document");
        assert_eq!(
            document.get_document("writer").unwrap().get_str("id"),
            Ok("w-1"),
            "{application}: {document}"
        );
        assert!(
            !document.contains_key("waitingWriter"),
            "{application}: {document}"
        );
    }
    // A reader gets in as soon as the writer is gone.
    collection
        .update_one(
            doc! { "_id": lock.name() },
            reader_writer::release_update("w-1", false, false),
        )
        .await
        .unwrap();
    assert!(lock.try_acquire_read().await.unwrap().is_some());
}

/// A writer whose caller stops waiting while an attempt of its is still on its way to the
/// server leaves no waiting marker behind: the marker is removed once that attempt's outcome is
/// in, so the attempt, applied after the caller left, cannot place it again. Found by the model
/// checker (`model/`, a writer that stops waiting): before, the removal went out at once, the
/// late attempt placed the marker again (the lock was busy), and every reader and writer waited
/// out its lease. Here the attempt is held back 1.5 s by the proxy while another writer holds
/// the lock; once the marker is gone it must stay gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_stops_waiting_with_an_attempt_in_flight_leaves_no_marker() {
    use common::proxy::{Action, Rule};

    let (lock, collection) = rw_lock(common::options(5_000, 1_000)).await;
    let holder = lock.acquire_write().await.unwrap();
    let (proxy, client) = common::proxy::proxied_client().await;
    let proxied =
        MongoDistributedReaderWriterLock::new(lock.name(), &client.database(common::DATABASE))
            .with_collection(collection.name())
            .with_options(lock.options().clone());
    let waiting = tokio::spawn(async move { proxied.acquire_write().await.map(drop) });
    let marker = || async {
        stored(&collection, &lock)
            .await
            .contains_key("waitingWriter")
    };
    assert!(
        common::eventually(Duration::from_secs(10), marker).await,
        "the waiting writer placed its marker"
    );
    let delayed = proxy.add_rule(
        Rule::new("findAndModify", Action::Delay(Duration::from_millis(1_500)))
            .on(collection.name()),
    );
    assert!(
        common::eventually(Duration::from_secs(10), || async {
            proxy.hits(delayed) == 1
        })
        .await,
        "the writer's next attempt is held back"
    );
    waiting.abort();
    // Present until the held-back attempt's outcome, then gone for good (its lease is 2.6 s:
    // watching for 3 s after it went covers a marker placed again).
    let started = Instant::now();
    let mut gone_since = None;
    while gone_since.is_none_or(|since: Instant| since.elapsed() < Duration::from_secs(3)) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the marker never went"
        );
        match (marker().await, gone_since) {
            (true, Some(since)) => panic!(
                "the marker came back {:?} after it was removed",
                since.elapsed()
            ),
            (false, None) => gone_since = Some(Instant::now()),
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    holder.release().await.unwrap();
    assert!(lock.try_acquire_read().await.unwrap().is_some());
}
