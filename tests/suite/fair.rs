//! Fair locks (`LockOptionsBuilder::fair`): waiters of every process are served in the order
//! they came, through a line of waits kept in the lock's document, each place with a lease of its
//! own; a wait that ends without the lock gives its place up, and a vanished waiter's place ends
//! with its lease.

use test_support as common;

use common::CommandLog;

use std::time::Duration;

use distributed_lock_mongodb::{
    DocumentLock, Error, LockOptions, MongoDistributedLock, MongoDistributedReaderWriterLock,
    MongoDistributedSemaphore,
};
use mongodb::bson::{Document, doc};
use mongodb::{Collection, Database};

/// A fair lock's options: a place in line lasts 3 s (twice the longest sleep plus a second),
/// which a waiter starved on a loaded machine still renews in time.
fn fair_options() -> LockOptions {
    common::options(10_000, 3_000)
        .to_builder()
        .busy_wait_sleep_time(Duration::from_millis(5), Duration::from_secs(1))
        .fair(true)
        .build()
        .unwrap()
}

/// A fair lock `name` in `collection`, as one process's lock object (built apart: its own
/// renewals; a release still hands over to another's waiter once their attempts have seen each
/// other's leases, as lock objects of one process do).
fn process(database: &Database, collection: &str, name: &str) -> MongoDistributedLock {
    MongoDistributedLock::new(name, database)
        .with_collection(collection)
        .with_options(fair_options())
}

/// A fresh collection (its name and handle) and a fresh lock name.
fn fresh(database: &Database) -> (String, Collection<Document>, String) {
    let collection = common::unique("fair");
    let documents = database.collection::<Document>(&collection);
    (collection, documents, common::unique("fair"))
}

/// The ids of the places in lock `name`'s line, in order (empty without a line).
async fn line(collection: &Collection<Document>, name: &str) -> Vec<String> {
    let document = common::lock_document(collection, name).await;
    let Some(line) = document.as_ref().and_then(|d| d.get_array("line").ok()) else {
        return Vec::new();
    };
    line.iter()
        .filter_map(|place| place.as_document()?.get_str("id").ok().map(str::to_owned))
        .collect()
}

/// Waits until lock `name`'s line holds `count` places.
async fn line_of(collection: &Collection<Document>, name: &str, count: usize) {
    let reached = common::eventually(Duration::from_secs(10), || async {
        line(collection, name).await.len() == count
    })
    .await;
    assert!(reached, "{:?}", line(collection, name).await);
}

/// After a wait that ran out: it sent its attempts (two at least: the first took its place,
/// the next renewed it) and one update that took its place out, and nothing else.
async fn a_wait_gave_its_place_up(log: &CommandLog, documents: &Collection<Document>, name: &str) {
    assert!(log.count("findAndModify") >= 2, "{:?}", log.started());
    assert_eq!(log.count("update"), 1, "{:?}", log.started());
    let others = (log.started_without_streams().into_iter())
        .filter(|command| !["findAndModify", "update", "createIndexes"].contains(&command.as_str()))
        .count();
    assert_eq!(others, 0, "{:?}", log.started());
    assert!(
        line(documents, name).await.is_empty(),
        "its place is given up"
    );
}

/// The next `count` waiters served, as they report it on `order`, in turn.
async fn served_in_turn<T>(
    order: &mut tokio::sync::mpsc::UnboundedReceiver<T>,
    count: usize,
) -> Vec<T> {
    let mut seen = Vec::with_capacity(count);
    for _ in 0..count {
        let next = tokio::time::timeout(Duration::from_secs(30), order.recv())
            .await
            .expect("served")
            .expect("a waiter reports");
        seen.push(next);
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_three_processes_are_served_in_the_order_they_came() {
    let database = common::database().await;
    let (collection, documents, name) = fresh(&database);
    let holder = process(&database, &collection, &name)
        .acquire()
        .await
        .unwrap();
    let (served, mut order) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for waiter in 1..=3 {
        let lock = process(&database, &collection, &name);
        let served = served.clone();
        waiters.push(tokio::spawn(async move {
            let guard = lock.acquire_timeout(Duration::from_secs(60)).await.unwrap();
            served.send(waiter).unwrap();
            // Held a moment: the next in line must not slip in meanwhile.
            tokio::time::sleep(Duration::from_millis(100)).await;
            guard.release().await.unwrap();
        }));
        line_of(&documents, &name, waiter).await;
    }
    holder.release().await.unwrap();
    let seen = served_in_turn(&mut order, 3).await;
    assert_eq!(seen, [1, 2, 3]);
    for waiter in waiters {
        waiter.await.unwrap();
    }
    assert!(line(&documents, &name).await.is_empty());
    let document = common::lock_document(&documents, &name).await.unwrap();
    assert!(
        !document.contains_key("line"),
        "no empty line is left: {document}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_fair_lock_costs_one_command_and_each_waiting_attempt_one_more() {
    let (database, log) = common::counting_database().await;
    let (collection, documents, name) = fresh(&database);
    let lock = process(&database, &collection, &name);
    log.clear();
    let guard = lock.try_acquire().await.unwrap().expect("free");
    // (The first use of a collection also creates its TTL index.)
    assert_eq!(log.count("findAndModify"), 1, "{:?}", log.started());
    assert!(line(&documents, &name).await.is_empty());

    // A single attempt takes no place.
    let other = process(&database, &collection, &name);
    log.clear();
    assert!(other.try_acquire().await.unwrap().is_none());
    // (Its first use may create the TTL index in the background too.)
    assert_eq!(log.count("findAndModify"), 1, "{:?}", log.started());
    assert_eq!(log.count("update"), 0, "{:?}", log.started());
    assert!(line(&documents, &name).await.is_empty());

    // A wait takes a place with its first attempt, and gives it up with one update when it
    // runs out.
    log.clear();
    let waited = other
        .try_acquire_timeout(Duration::from_millis(300))
        .await
        .unwrap();
    assert!(waited.is_none());
    a_wait_gave_its_place_up(&log, &documents, &name).await;
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_leaves_gives_up_its_place_to_the_one_behind() {
    let database = common::database().await;
    let (collection, documents, name) = fresh(&database);
    let holder = process(&database, &collection, &name)
        .acquire()
        .await
        .unwrap();
    // The first waiter's place lasts 21 s: only its removal takes it out within the 10 s that
    // `line_of` waits.
    let slow = fair_options()
        .to_builder()
        .busy_wait_sleep_time(Duration::from_millis(5), Duration::from_secs(10))
        .build()
        .unwrap();
    let first = {
        let lock = process(&database, &collection, &name).with_options(slow);
        tokio::spawn(async move { lock.acquire().await })
    };
    line_of(&documents, &name, 1).await;
    let second = {
        let lock = process(&database, &collection, &name);
        tokio::spawn(async move { lock.acquire().await })
    };
    line_of(&documents, &name, 2).await;
    // The first stops waiting: its place goes (a dropped wait removes it in the background).
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    line_of(&documents, &name, 1).await;
    holder.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(30), second)
        .await
        .expect("the second is first now")
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_waiters_place_holds_the_lock_back_only_until_its_lease_ends() {
    let database = common::database().await;
    let (collection, documents, name) = fresh(&database);
    documents
        .update_one(
            doc! { "_id": &name },
            vec![doc! { "$set": { "line": [{
                "id": "vanished", "expiresAt": { "$add": ["$$NOW", 5_000_i64] }
            }] } }],
        )
        .upsert(true)
        .await
        .unwrap();
    let lock = process(&database, &collection, &name);
    assert!(
        lock.try_acquire().await.unwrap().is_none(),
        "a live place ahead keeps a free lock from being taken"
    );
    let guard = lock
        .acquire_timeout(Duration::from_secs(20))
        .await
        .expect("the place's lease ends");
    assert!(line(&documents, &name).await.is_empty());
    guard.release().await.unwrap();
}

/// A release hands the lock to a waiter of its process in the release command only when that
/// waiter is first in line, as its last reply showed it (and the command lets it in only if it
/// still is). Here a place of another process's wait (written by hand, a long lease) is ahead:
/// the release is a plain one, and wakes nobody here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_to_a_local_waiter_only_when_it_is_first_in_line() {
    let (database, log) = common::counting_database().await;
    let (collection, documents, name) = fresh(&database);
    let lock = process(&database, &collection, &name);
    let holder = lock.acquire().await.unwrap();
    documents
        .update_one(
            doc! { "_id": &name },
            vec![doc! { "$set": { "line": [{
                "id": "elsewhere", "expiresAt": { "$add": ["$$NOW", 60_000_i64] }
            }] } }],
        )
        .await
        .unwrap();
    let waiting = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(60)).await })
    };
    line_of(&documents, &name, 2).await;
    assert!(common::offers_become(&collection, &name, 1).await);
    log.clear();
    holder.release().await.unwrap();
    assert_eq!(log.transfers(), 0, "{:?}", log.started());
    assert_eq!(log.count("update"), 1, "{:?}", log.started());
    assert!(
        lock.holders().await.unwrap().is_empty(),
        "released, to nobody"
    );
    assert!(!waiting.is_finished());
    assert_eq!(line(&documents, &name).await[0], "elsewhere");
    // The place ahead goes: the local waiter is first, and gets the lock.
    documents
        .update_one(
            doc! { "_id": &name },
            doc! { "$pull": { "line": { "id": "elsewhere" } } },
        )
        .await
        .unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("first in line now")
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_is_refused_by_document_locks_before_anything_is_sent() {
    let (database, log) = common::counting_database().await;
    let collection = common::unique("fair");
    log.clear();
    let documents = DocumentLock::new(&database.collection::<Document>(&collection))
        .with_options(fair_options());
    let refused = documents.try_lock(doc! { "_id": "order" }).await;
    assert!(
        matches!(&refused, Err(Error::InvalidOptions(message)) if message.contains("fair")),
        "{refused:?}"
    );
    assert!(
        log.started_without_streams().is_empty(),
        "{:?}",
        log.started()
    );
}

/// A fair reader-writer lock `name` in `collection`, as one process's lock object.
fn rw_process(
    database: &Database,
    collection: &str,
    name: &str,
) -> MongoDistributedReaderWriterLock {
    MongoDistributedReaderWriterLock::new(name, database)
        .with_collection(collection)
        .with_options(fair_options())
}

/// Writers of three processes wait in line behind a reader and are served in the order they
/// came; while their places are live no new reader gets in (not even an upgradeable one), and a
/// reader that waits gets in after the last of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_of_three_processes_are_served_in_line_and_their_places_hold_readers_back() {
    let database = common::database().await;
    let (collection, documents, name) = fresh(&database);
    let reading = rw_process(&database, &collection, &name)
        .acquire_read()
        .await
        .unwrap();
    let (served, mut order) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for writer in 1..=3 {
        let lock = rw_process(&database, &collection, &name);
        let served = served.clone();
        waiters.push(tokio::spawn(async move {
            let guard = lock
                .acquire_write_timeout(Duration::from_secs(60))
                .await
                .unwrap();
            served.send(writer).unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            guard.release().await.unwrap();
        }));
        line_of(&documents, &name, writer).await;
    }
    let document = common::lock_document(&documents, &name).await.unwrap();
    assert!(
        !document.contains_key("waitingWriter"),
        "fair writers wait in line, with no marker: {document}"
    );
    let other = rw_process(&database, &collection, &name);
    assert!(other.try_acquire_read().await.unwrap().is_none());
    assert!(
        other
            .try_acquire_upgradeable_read()
            .await
            .unwrap()
            .is_none()
    );
    let reader = tokio::spawn(async move {
        let guard = other
            .acquire_read_timeout(Duration::from_secs(60))
            .await
            .unwrap();
        served.send(4).unwrap();
        guard.release().await.unwrap();
    });
    reading.release().await.unwrap();
    let seen = served_in_turn(&mut order, 4).await;
    assert_eq!(seen, [1, 2, 3, 4]);
    for waiter in waiters {
        waiter.await.unwrap();
    }
    reader.await.unwrap();
    let document = common::lock_document(&documents, &name).await.unwrap();
    assert!(!document.contains_key("line"), "{document}");
}

/// A fair writer's acquisition of a free lock is one command; a wait takes its place in line
/// with its first attempt, renews it with each later one, and gives it up with one update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_writer_costs_one_command_free_and_one_per_waiting_attempt() {
    let (database, log) = common::counting_database().await;
    let (collection, documents, name) = fresh(&database);
    let lock = rw_process(&database, &collection, &name);
    log.clear();
    let writing = lock.try_acquire_write().await.unwrap().expect("free");
    assert_eq!(log.count("findAndModify"), 1, "{:?}", log.started());
    let other = rw_process(&database, &collection, &name);
    log.clear();
    assert!(other.try_acquire_write().await.unwrap().is_none());
    assert_eq!(log.count("findAndModify"), 1, "{:?}", log.started());
    assert!(
        line(&documents, &name).await.is_empty(),
        "a single attempt takes no place"
    );
    log.clear();
    let waited = other
        .try_acquire_write_timeout(Duration::from_millis(300))
        .await
        .unwrap();
    assert!(waited.is_none());
    a_wait_gave_its_place_up(&log, &documents, &name).await;
    writing.release().await.unwrap();
}

/// An upgrade passes the line: the fair writers in it wait for its reader, so waiting for them
/// would never end. The writer in line gets the lock after the upgraded reader leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_passes_the_writers_in_line_which_wait_for_its_reader() {
    let database = common::database().await;
    let (collection, documents, name) = fresh(&database);
    let mut upgradeable = rw_process(&database, &collection, &name)
        .acquire_upgradeable_read()
        .await
        .unwrap();
    let writer = rw_process(&database, &collection, &name);
    let waiting = tokio::spawn(async move {
        writer
            .acquire_write_timeout(Duration::from_secs(60))
            .await
            .unwrap()
            .fencing_token()
    });
    line_of(&documents, &name, 1).await;
    tokio::time::timeout(Duration::from_secs(30), upgradeable.upgrade())
        .await
        .expect("the upgrade does not wait for the line")
        .unwrap();
    let upgraded = upgradeable.fencing_token().expect("upgraded");
    assert_eq!(
        line(&documents, &name).await.len(),
        1,
        "the writer keeps its place"
    );
    upgradeable.release().await.unwrap();
    let token = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the writer in line is served")
        .unwrap();
    assert!(token > upgraded);
}

/// A late attempt of a fair writer's wait that was served does not put it back in line, and
/// the cleanup of a win whose reply was lost lets its wait take a place again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_writers_served_wait_stays_out_of_line_until_its_win_is_cleaned_up() {
    use distributed_lock_mongodb::__model::{self as model, reader_writer};
    let database = common::database().await;
    let (_, documents, name) = fresh(&database);
    let options = fair_options();
    let attempt = |lock_id: &'static str, wait: &'static str| {
        let update = reader_writer::attempt_update(lock_id, false, &options, wait, false, None);
        let (documents, name) = (documents.clone(), name.clone());
        async move {
            documents
                .find_one_and_update(model::attempt_filter(&name), update)
                .upsert(true)
                .return_document(mongodb::options::ReturnDocument::After)
                .await
                .unwrap()
                .unwrap()
        }
    };
    let won = attempt("A2", "W1").await;
    assert_eq!(won.get_document("writer").unwrap().get_str("id"), Ok("A2"));
    assert_eq!(won.get_str("servedWait"), Ok("W1"));
    attempt("B1", "W2").await;
    assert_eq!(line(&documents, &name).await, ["W2"]);
    // W1's earlier attempt lands late, then its winning one again: W1 stays out of line.
    attempt("A1", "W1").await;
    attempt("A2", "W1").await;
    assert_eq!(line(&documents, &name).await, ["W2"]);
    // The win's reply was lost: its cleanup forgets the served wait, which may queue again.
    documents
        .update_one(
            reader_writer::release_filter(&name, "A2", false),
            reader_writer::release_update("A2", false, true),
        )
        .await
        .unwrap();
    let document = common::lock_document(&documents, &name).await.unwrap();
    assert!(!document.contains_key("servedWait"), "{document}");
    attempt("A3", "W1").await;
    assert_eq!(line(&documents, &name).await, ["W2", "W1"]);
}

/// An attempt of a wait that was served already (another attempt of it, or a release's
/// transfer, won first; this one reaches the server late) does not put the wait back in line:
/// a place nobody renews would hold every waiter behind it back until its lease ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_attempt_of_a_served_wait_takes_no_place_in_line() {
    use distributed_lock_mongodb::__model as model;
    let database = common::database().await;
    let (_, documents, name) = fresh(&database);
    let options = fair_options();
    let attempt = |lock_id: &str, wait: &str| {
        let update = model::fair_attempt_update(lock_id, &options, None, wait);
        let documents = documents.clone();
        let name = name.clone();
        async move {
            documents
                .find_one_and_update(model::attempt_filter(&name), update)
                .upsert(true)
                .return_document(mongodb::options::ReturnDocument::After)
                .await
                .unwrap()
                .unwrap()
        }
    };
    // Wait W1 wins with its attempt A2; W2 waits behind.
    let won = attempt("A2", "W1").await;
    assert_eq!(won.get_str("lockId"), Ok("A2"));
    assert_eq!(won.get_str("servedWait"), Ok("W1"));
    attempt("B1", "W2").await;
    assert_eq!(line(&documents, &name).await, ["W2"]);
    // W1's earlier attempt A1 lands now: the lock is busy (A2 holds it), and W1 stays out of line.
    let late = attempt("A1", "W1").await;
    assert_eq!(late.get_str("lockId"), Ok("A2"));
    assert_eq!(line(&documents, &name).await, ["W2"]);
    // A2 applied again (a retry of a write that had applied): it holds the lock, nothing moves.
    let again = attempt("A2", "W1").await;
    assert_eq!(again.get_str("lockId"), Ok("A2"));
    assert_eq!(line(&documents, &name).await, ["W2"]);
}

/// A release hands the lock to the first waiter of its process in the release command when
/// that waiter is first in line: one command, and the waiter holds the lock as it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_to_a_local_waiter_first_in_line_in_its_command() {
    let (database, log) = common::counting_database().await;
    let (collection, documents, name) = fresh(&database);
    let lock = process(&database, &collection, &name);
    let holder = lock.acquire().await.unwrap();
    let waiting = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(60)).await })
    };
    line_of(&documents, &name, 1).await;
    assert!(common::offers_become(&collection, &name, 1).await);
    let released = holder.lock_id().to_owned();
    log.clear();
    holder.release().await.unwrap();
    assert_eq!(log.transfers(), 1, "{:?}", log.started());
    let holders = lock.holders().await.unwrap();
    assert_eq!(holders.len(), 1, "handed over: {holders:?}");
    assert_ne!(holders[0].lock_id.as_deref(), Some(released.as_str()));
    let guard = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("handed the lock")
        .unwrap()
        .unwrap();
    assert_eq!(holders[0].lock_id.as_deref(), Some(guard.lock_id()));
    assert!(line(&documents, &name).await.is_empty());
    guard.release().await.unwrap();
}

/// A fair semaphore admits in line order: a waiter for one place whose place in line is behind
/// a waiter for two stays out, though one place is free, until the waiter for two was served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_semaphore_lets_no_waiter_for_fewer_places_pass_one_ahead_in_line() {
    let database = common::database().await;
    let (collection, documents, name) = fresh(&database);
    let semaphore = |_: usize| {
        MongoDistributedSemaphore::new(name.as_str(), 2, &database)
            .with_collection(collection.as_str())
            .with_options(fair_options())
    };
    let holder = semaphore(0).acquire().await.unwrap();
    let (served, mut order) = tokio::sync::mpsc::unbounded_channel();
    let two = {
        let (pool, served) = (semaphore(1), served.clone());
        tokio::spawn(async move {
            let places = pool
                .acquire_many_timeout(2, Duration::from_secs(60))
                .await
                .unwrap();
            served.send("two").unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            places.release().await.unwrap();
        })
    };
    line_of(&documents, &name, 1).await;
    let late = semaphore(2);
    assert!(
        late.try_acquire().await.unwrap().is_none(),
        "one place is free, but a wait is ahead in line"
    );
    let one = {
        let served = served.clone();
        tokio::spawn(async move {
            let place = late.acquire_timeout(Duration::from_secs(60)).await.unwrap();
            served.send("one").unwrap();
            place.release().await.unwrap();
        })
    };
    line_of(&documents, &name, 2).await;
    holder.release().await.unwrap();
    assert_eq!(served_in_turn(&mut order, 2).await, ["two", "one"]);
    two.await.unwrap();
    one.await.unwrap();
    assert!(line(&documents, &name).await.is_empty());
}

/// The cleanup after a win whose reply was lost (the lease nobody was given ends) also forgets
/// that the wait was served: its next attempt takes a place in line again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleaned_up_win_lets_its_wait_take_a_place_again() {
    use distributed_lock_mongodb::__model as model;
    let database = common::database().await;
    let (_, documents, name) = fresh(&database);
    let options = fair_options();
    let attempt = |lock_id: &'static str, wait: &'static str| {
        let update = model::fair_attempt_update(lock_id, &options, None, wait);
        let (documents, name) = (documents.clone(), name.clone());
        async move {
            documents
                .find_one_and_update(model::attempt_filter(&name), update)
                .upsert(true)
                .await
                .unwrap()
        }
    };
    attempt("A1", "W1").await;
    attempt("B1", "W2").await;
    documents
        .update_one(
            model::release_filter(&name, "A1"),
            model::cleanup_update("A1"),
        )
        .await
        .unwrap();
    let document = common::lock_document(&documents, &name).await.unwrap();
    assert!(!document.contains_key("servedWait"), "{document}");
    // W1 tries again: W2 is first now, and W1 takes a place behind it.
    attempt("A2", "W1").await;
    assert_eq!(line(&documents, &name).await, ["W2", "W1"]);
}

/// With change streams, a release wakes only the waiter whose place is first in line: a waiter
/// of another process behind it sends nothing until its own turn (its polls, to keep its place,
/// come a minute apart here), and then the release of the one ahead wakes it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushed_release_wakes_only_the_waiter_first_in_line() {
    let (database, log) = common::counting_database().await;
    let (collection, documents, name) = fresh(&database);
    let sleepy = fair_options()
        .to_builder()
        .busy_wait_sleep_time(Duration::from_secs(60), Duration::from_secs(60))
        .build()
        .unwrap();
    let in_a_minute = mongodb::bson::DateTime::from_millis(
        mongodb::bson::DateTime::now().timestamp_millis() + 60_000,
    );
    documents
        .insert_one(doc! {
            "_id": &name, "lockId": "remote", "expiresAt": in_a_minute, "fencingToken": 1_i64,
        })
        .await
        .unwrap();
    let waiter = |lock: MongoDistributedLock| {
        tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(60)).await })
    };
    let first = waiter(process(&database, &collection, &name).with_options(sleepy.clone()));
    line_of(&documents, &name, 1).await;
    let second = waiter(process(&database, &collection, &name).with_options(sleepy));
    line_of(&documents, &name, 2).await;
    let second_wait = line(&documents, &name).await[1].clone();
    let attempts_of_second = || {
        (log.find_and_modifies().iter())
            .filter(|command| command.to_string().contains(&second_wait))
            .count()
    };
    // Both pollers' change streams are open (one per lock object: each is its own process).
    let open = common::eventually(Duration::from_secs(20), || async {
        log.count("aggregate") >= 2 && log.count("getMore") >= 2
    })
    .await;
    assert!(open, "{:?}", log.started());
    documents
        .update_one(
            doc! { "_id": &name, "lockId": "remote" },
            vec![
                doc! { "$set": { "expiresAt": "$$NOW" } },
                doc! { "$unset": "lockId" },
            ],
        )
        .await
        .unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(30), first)
        .await
        .expect("woken by the release, not by a poll a minute later")
        .unwrap()
        .unwrap();
    // A wake of the second waiter would have come with the first's (the same event): give its
    // attempt time to show.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        attempts_of_second(),
        1,
        "only its first attempt, which took its place"
    );
    assert_eq!(
        line(&documents, &name).await,
        std::slice::from_ref(&second_wait)
    );
    guard.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(30), second)
        .await
        .expect("first in line now, woken by the release")
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
}

/// A provider's shutdown ends a fair wait with `ShutDown`, and the wait's place leaves the line:
/// the waiters of other processes behind it are not held back by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_ends_a_fair_wait_and_its_place_leaves_the_line() {
    let database = common::database().await;
    let (collection, documents, name) = fresh(&database);
    let holder = process(&database, &collection, &name)
        .acquire()
        .await
        .unwrap();
    let provider = distributed_lock_mongodb::Provider::new(&database)
        .with_collection(collection.as_str())
        .with_options(fair_options());
    let waiting = {
        let lock = provider.create_lock(name.as_str());
        tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(60)).await })
    };
    line_of(&documents, &name, 1).await;
    tokio::time::timeout(Duration::from_secs(30), provider.shutdown())
        .await
        .expect("shut down");
    let ended = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the wait ends")
        .unwrap();
    assert!(matches!(ended, Err(Error::ShutDown)), "{ended:?}");
    line_of(&documents, &name, 0).await;
    holder.release().await.unwrap();
}

/// A fair lock with a `min_hold` window: a release keeps the lock taken until the window ends,
/// and the first in line takes it then (not a later waiter, nor a single attempt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_locks_window_is_kept_and_the_first_in_line_gets_the_lock_after_it() {
    let database = common::database().await;
    let (collection, documents, name) = fresh(&database);
    let windowed = fair_options()
        .to_builder()
        .min_hold(Duration::from_secs(5))
        .build()
        .unwrap();
    let lock = |options: &LockOptions| {
        MongoDistributedLock::new(name.as_str(), &database)
            .with_collection(collection.as_str())
            .with_options(options.clone())
    };
    let holder = lock(&windowed).acquire().await.unwrap();
    let first = {
        let lock = lock(&windowed);
        tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(60)).await })
    };
    line_of(&documents, &name, 1).await;
    holder.release().await.unwrap();
    // The window keeps it taken, with nobody holding it, while the first in line waits.
    let status = lock(&windowed).status().await.unwrap().expect("stored");
    assert!(status.lock_id.is_none() && status.is_kept(), "{status:?}");
    assert!(!first.is_finished());
    assert!(lock(&windowed).try_acquire().await.unwrap().is_none());
    let guard = tokio::time::timeout(Duration::from_secs(30), first)
        .await
        .expect("the first in line gets the lock once the window is over")
        .unwrap()
        .unwrap();
    assert!(line(&documents, &name).await.is_empty());
    guard.release().await.unwrap();
}
