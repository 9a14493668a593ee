//! What an acquisition costs on the wire, and the TTL index it sets up.

use test_support as common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::proxy::{self, Action, Rule};
use common::server;
use distributed_lock_mongodb::{
    LockOptions, MongoDistributedLock, MongoDistributedReaderWriterLock, MongoDistributedSemaphore,
    Provider,
};
use futures::TryStreamExt;
use mongodb::IndexModel;
use mongodb::bson::{Document, doc};
use mongodb::event::EventHandler;
use mongodb::event::command::CommandEvent;
use mongodb::options::IndexOptions;

#[tokio::test]
async fn an_uncontended_cycle_is_two_commands_and_the_ttl_index_is_created_once() {
    let (database, commands) = common::counting_database().await;
    let collection = common::unique("locks");
    let provider = Provider::new(&database).with_collection(collection.as_str());

    let first = provider
        .create_lock(common::unique("a"))
        .acquire()
        .await
        .unwrap();
    first.release().await.unwrap();

    // The index is created in the background after the first acquisition.
    let observer = common::database().await.collection::<Document>(&collection);
    let created = common::eventually(Duration::from_secs(10), || async {
        let names = observer.list_index_names().await.unwrap_or_default();
        names.iter().any(|name| name == "expiresAt_ttl")
    })
    .await;
    assert!(created, "the TTL index appears");
    let indexes = indexes_of(&observer).await;
    let ttl = indexes
        .iter()
        .find(|index| {
            index.options.as_ref().and_then(|o| o.name.as_deref()) == Some("expiresAt_ttl")
        })
        .unwrap();
    assert_eq!(ttl.keys, doc! { "expiresAt": 1 });
    assert_eq!(
        ttl.options.as_ref().unwrap().expire_after,
        Some(Duration::from_secs(24 * 60 * 60)),
        "lock documents are kept a day after their lease ended"
    );

    commands.clear();
    for _ in 0..3 {
        let guard = provider
            .create_lock(common::unique("b"))
            .acquire()
            .await
            .unwrap();
        guard.release().await.unwrap();
    }
    let direct = MongoDistributedLock::new(common::unique("c"), &database)
        .with_collection(collection.as_str());
    direct.acquire().await.unwrap().release().await.unwrap();

    let sent = commands.started();
    assert_eq!(
        sent,
        ["findAndModify", "update"].repeat(4),
        "one findAndModify and one update per cycle"
    );
}

/// A renewal loop starts with its first lease, and renews it a cadence later, not at once: a lock
/// object's first lease held for half a second under a 10 s cadence costs its acquisition and
/// nothing else. Fails when the loop's first round is due as it starts (a renewal of a lease
/// acquired a moment ago: a command per new loop, for nothing).
#[tokio::test]
async fn a_lease_just_acquired_is_not_renewed_before_its_cadence() {
    let (database, commands) = common::counting_database().await;
    let lock = renewed_every(&database, Duration::from_secs(10));
    let guard = lock.acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        commands.started(),
        ["findAndModify"],
        "the acquisition, and no renewal yet"
    );
    guard.release().await.unwrap();
}

/// A lease acquired after its lock object held nothing for longer than a cadence is renewed a
/// cadence after its acquisition, not at once: the loop's round planned for leases that are gone
/// must not pull the new one's forward. Fails when the new lease counts as one of the "others"
/// already renewed (its own renewal, due in the past, then goes out at once).
#[tokio::test]
async fn a_lease_acquired_after_an_idle_spell_is_not_renewed_at_once() {
    let (database, commands) = common::counting_database().await;
    let lock = renewed_every(&database, Duration::from_secs(1));
    lock.acquire().await.unwrap().release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await; // the planned round is past
    commands.clear();
    let guard = lock.acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        commands.started(),
        ["findAndModify"],
        "the acquisition, and no renewal yet"
    );
    guard.release().await.unwrap();
}

/// A fresh lock of `database` with a 30 s lease renewed every `cadence`, whose acquisitions send
/// nothing but their own commands (no TTL index creation).
fn renewed_every(database: &mongodb::Database, cadence: Duration) -> MongoDistributedLock {
    MongoDistributedLock::new(common::unique("renewed"), database)
        .with_collection(common::unique("locks"))
        .with_options(
            LockOptions::builder()
                .expiry(Duration::from_secs(30))
                .extension_cadence(cadence)
                .automatic_ttl_index(false)
                .build()
                .unwrap(),
        )
}

#[tokio::test]
async fn index_creation_is_attempted_once_per_collection() {
    let (database, commands) = common::counting_database().await;
    let collection = common::unique("locks");
    for _ in 0..5 {
        let lock = MongoDistributedLock::new(common::unique("n"), &database)
            .with_collection(collection.as_str());
        lock.acquire().await.unwrap().release().await.unwrap();
    }
    let observer = common::database().await.collection::<Document>(&collection);
    assert!(
        common::eventually(Duration::from_secs(10), || async {
            observer.list_index_names().await.unwrap_or_default().len() == 2
        })
        .await
    );
    let creations = commands.count("createIndexes");
    assert_eq!(creations, 1);
}

/// Options whose acquisitions send nothing but their own commands (no TTL index creation).
fn without_index_creation() -> LockOptions {
    LockOptions::builder()
        .expiry(Duration::from_secs(5))
        .extension_cadence(Duration::from_secs(1))
        .automatic_ttl_index(false)
        .build()
        .unwrap()
}

#[tokio::test]
async fn every_reader_writer_attempt_is_one_find_and_modify() {
    let (database, commands) = common::counting_database().await;
    // A waiting writer attempts every 50 ms at most. (With the default pace, up to 800 ms, and
    // a 100 ms timeout, an overloaded CI run saw a single attempt.)
    let options = LockOptions::builder()
        .expiry(Duration::from_secs(5))
        .extension_cadence(Duration::from_secs(1))
        .automatic_ttl_index(false)
        .busy_wait_sleep_time(Duration::from_millis(10), Duration::from_millis(50))
        .build()
        .unwrap();
    let lock = MongoDistributedReaderWriterLock::new(common::unique("rw"), &database)
        .with_collection(common::unique("rw"))
        .with_options(options);
    let read = lock.try_acquire_read().await.unwrap().unwrap();
    assert!(lock.try_acquire_write().await.unwrap().is_none());
    assert_eq!(
        commands.started(),
        ["findAndModify"; 2],
        "a single try leaves no marker"
    );

    commands.clear();
    // Attempts every 50 ms at most (see above), for 2 s: at least two, however slow the machine.
    let timed_out = lock.acquire_write_timeout(Duration::from_secs(2)).await;
    assert!(timed_out.unwrap_err().is_timeout());
    // (The waiting writer also watches the lock with a change stream: its commands are not
    // attempts.)
    let sent = commands.started_without_streams();
    let (last, attempts) = sent.split_last().unwrap();
    assert!(attempts.len() >= 2, "{sent:?}");
    assert!(
        attempts.iter().all(|command| command == "findAndModify"),
        "{sent:?}"
    );
    assert_eq!(
        last, "update",
        "one update removes the waiting writer's marker"
    );

    commands.clear();
    read.release().await.unwrap();
    let write = lock.acquire_write().await.unwrap();
    write.release().await.unwrap();
    assert_eq!(
        commands.started_without_streams(),
        ["update", "findAndModify", "update"]
    );
}

#[tokio::test]
async fn every_semaphore_attempt_is_one_find_and_modify_from_the_first_use() {
    let (database, commands) = common::counting_database().await;
    let semaphore = MongoDistributedSemaphore::new(common::unique("s"), 1, &database)
        .with_collection(common::unique("semaphores"))
        .with_options(without_index_creation());
    let held = semaphore.acquire().await.unwrap(); // the first use creates the document
    assert!(semaphore.try_acquire().await.unwrap().is_none());
    held.release().await.unwrap();
    semaphore
        .try_acquire()
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    assert_eq!(
        commands.started(),
        [
            "findAndModify",
            "findAndModify",
            "update",
            "findAndModify",
            "update"
        ]
    );
}

/// Whether `collection` has our TTL index, keeping documents a day.
async fn has_ttl_index(collection: &mongodb::Collection<Document>) -> bool {
    indexes_of(collection).await.iter().any(|index| {
        let options = index.options.as_ref();
        options.and_then(|o| o.name.as_deref()) == Some("expiresAt_ttl")
            && index.keys == doc! { "expiresAt": 1 }
            && options.and_then(|o| o.expire_after) == Some(Duration::from_secs(24 * 60 * 60))
    })
}

#[tokio::test]
async fn reader_writer_and_semaphore_collections_get_the_ttl_index_too() {
    let database = common::database().await;
    let (rw_locks, semaphores) = (common::unique("rw"), common::unique("semaphores"));
    let provider = Provider::new(&database)
        .with_reader_writer_collection(rw_locks.as_str())
        .with_semaphore_collection(semaphores.as_str());
    let rw = provider.create_reader_writer_lock("a");
    rw.acquire_read().await.unwrap().release().await.unwrap();
    let semaphore = provider.create_semaphore("b", 2);
    semaphore.acquire().await.unwrap().release().await.unwrap();
    for collection in [rw_locks, semaphores] {
        let collection = database.collection::<Document>(&collection);
        let created = common::eventually(Duration::from_secs(10), || async {
            has_ttl_index(&collection).await
        })
        .await;
        assert!(created, "the TTL index appears on {}", collection.name());
    }
}

#[tokio::test]
async fn with_automatic_creation_off_only_create_indexes_creates_them() {
    let (database, commands) = common::counting_database().await;
    let (provider, collections) = common::provider_with_own_collections(&database);
    let provider = provider.with_options(without_index_creation());
    provider
        .create_lock("a")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let rw = provider.create_reader_writer_lock("b");
    rw.acquire_read().await.unwrap().release().await.unwrap();
    rw.acquire_write().await.unwrap().release().await.unwrap();
    let semaphore = provider.create_semaphore("c", 2);
    semaphore.acquire().await.unwrap().release().await.unwrap();

    // A lock with automatic creation on, acquired after them: once its index is there, any
    // creation the earlier acquisitions had started would have been sent (tasks are spawned in
    // order on this single-threaded runtime).
    let sentinel = common::unique("sentinel");
    let lock = MongoDistributedLock::new("d", &database).with_collection(sentinel.as_str());
    lock.acquire().await.unwrap().release().await.unwrap();
    let sentinel = database.collection::<Document>(&sentinel);
    let created = common::eventually(Duration::from_secs(10), || async {
        has_ttl_index(&sentinel).await
    })
    .await;
    assert!(created, "the sentinel's index appears");
    assert_eq!(commands.count("createIndexes"), 1, "only the sentinel's");
    for collection in &collections {
        assert!(!has_ttl_index(collection).await);
    }

    provider.create_indexes().await.unwrap();
    for collection in &collections {
        assert!(has_ttl_index(collection).await, "{}", collection.name());
    }
    assert_eq!(commands.count("createIndexes"), 4);
    // Again: the indexes exist, nothing fails.
    provider.create_indexes().await.unwrap();
}

#[tokio::test]
async fn create_indexes_accepts_an_equivalent_index_and_reports_a_short_one() {
    let database = common::database().await;
    let ttl_index = |name: &str, expire_after: Duration| {
        IndexModel::builder()
            .keys(doc! { "expiresAt": 1 })
            .options(
                IndexOptions::builder()
                    .name(name.to_owned())
                    .expire_after(expire_after)
                    .build(),
            )
            .build()
    };
    let (long, short) = (common::unique("long"), common::unique("short"));
    let day = Duration::from_secs(24 * 60 * 60);
    database
        .collection::<Document>(&long)
        .create_index(ttl_index("theirs", day * 2))
        .await
        .unwrap();
    database
        .collection::<Document>(&short)
        .create_index(ttl_index("theirs", Duration::from_secs(60)))
        .await
        .unwrap();
    // The other kinds in fresh collections of their own (one collection may not serve two kinds).
    let with_exclusive_locks_in = |collection: &str| {
        Provider::new(&database)
            .with_collection(collection)
            .with_reader_writer_collection(common::unique("rw"))
            .with_semaphore_collection(common::unique("semaphores"))
    };
    with_exclusive_locks_in(&long)
        .create_indexes()
        .await
        .unwrap();
    let error = with_exclusive_locks_in(&short)
        .create_indexes()
        .await
        .unwrap_err();
    assert!(
        matches!(error, distributed_lock_mongodb::Error::Mongo(_)),
        "{error}"
    );
}

/// Earlier versions of this crate created the TTL index with `expireAfterSeconds: 0`; the first
/// acquisition of this release raises it to a day with `collMod` (the embedded server has no
/// `collMod`: there the proxy answers in its place, and the command sent is what is checked).
#[tokio::test]
async fn an_earlier_zero_second_ttl_index_is_raised_to_a_day() {
    let collection = common::unique("locks");
    let observer = common::database().await.collection::<Document>(&collection);
    observer
        .create_index(
            IndexModel::builder()
                .keys(doc! { "expiresAt": 1 })
                .options(
                    IndexOptions::builder()
                        .name("expiresAt_ttl".to_owned())
                        .expire_after(Duration::ZERO)
                        .build(),
                )
                .build(),
        )
        .await
        .unwrap();

    let sent = Arc::new(Mutex::new(Vec::<Document>::new()));
    let recorder = Arc::clone(&sent);
    let (proxy, client) = proxy::proxied_client_with(&server::uri(), |options| {
        options.command_event_handler = Some(EventHandler::callback(move |event| {
            if let CommandEvent::Started(started) = event
                && started.command_name == "collMod"
            {
                recorder.lock().unwrap().push(started.command);
            }
        }));
    })
    .await;
    if server::is_embedded() {
        proxy.add_rule(Rule::new("collMod", Action::Reply(doc! { "ok": 1 })));
    }
    let lock = MongoDistributedLock::new(common::unique("a"), &client.database(common::DATABASE))
        .with_collection(collection.as_str());
    lock.acquire().await.unwrap().release().await.unwrap();

    let raised = common::eventually(Duration::from_secs(10), || async {
        !sent.lock().unwrap().is_empty()
    })
    .await;
    assert!(raised, "a collMod is sent");
    let command = sent.lock().unwrap()[0].clone();
    assert_eq!(command.get_str("collMod").unwrap(), collection);
    assert_eq!(
        command.get_document("index").unwrap(),
        &doc! { "name": "expiresAt_ttl", "expireAfterSeconds": 86_400_i64 }
    );
    if !server::is_embedded() {
        let indexes = indexes_of(&observer).await;
        let ttl = indexes
            .iter()
            .find(|index| index.keys == doc! { "expiresAt": 1 })
            .unwrap();
        assert_eq!(
            ttl.options.as_ref().unwrap().expire_after,
            Some(Duration::from_secs(24 * 60 * 60))
        );
    }
}

/// The indexes of `collection`, as the server lists them.
async fn indexes_of(collection: &mongodb::Collection<Document>) -> Vec<IndexModel> {
    collection
        .list_indexes()
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

/// Runs `cycle` (one acquisition and release of one lock) [`UNCONTENDED_CYCLES`] times and
/// returns the commands they sent.
async fn commands_of_cycles<F, Fut>(commands: &common::CommandLog, mut cycle: F) -> Vec<String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    commands.clear();
    for _ in 0..UNCONTENDED_CYCLES {
        cycle().await;
    }
    commands.started()
}

/// How many of each command `sent` holds, for a short failure message.
fn tally(sent: &[String]) -> std::collections::BTreeMap<&str, usize> {
    let mut tally = std::collections::BTreeMap::new();
    for command in sent {
        *tally.entry(command.as_str()).or_default() += 1;
    }
    tally
}

const UNCONTENDED_CYCLES: usize = 200;

/// The plainest loop: acquire and release one lock, over and over, with nobody else. After
/// `release().await` returns, nothing of that lease may make the next acquisition wait, queue
/// or watch the collection: two commands per cycle, never an `aggregate` (a change stream), for
/// one lock object, for its clones, and for a provider's locks of one name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_loop_on_one_lock_sends_two_commands_per_cycle_and_never_waits() {
    let (database, commands) = common::counting_database().await;
    let collection = common::unique("locks");
    let options = common::options(60_000, 20_000);
    let expected = ["findAndModify", "update"].repeat(UNCONTENDED_CYCLES);
    // The collection's first acquisition creates its TTL index in the background.
    MongoDistributedLock::new(common::unique("first"), &database)
        .with_collection(collection.as_str())
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let settled = common::eventually(Duration::from_secs(10), || async {
        commands.count("createIndexes") == 1 && commands.in_flight() == 0
    })
    .await;
    assert!(settled, "{:?}", commands.started());

    let lock = MongoDistributedLock::new(common::unique("loop"), &database)
        .with_collection(collection.as_str())
        .with_options(options.clone());
    let sent = commands_of_cycles(&commands, || async {
        lock.acquire().await.unwrap().release().await.unwrap();
    })
    .await;
    assert!(sent == expected, "one lock object: {:?}", tally(&sent));

    let clones = [lock.clone(), lock.clone()];
    let mut turn = 0;
    let sent = commands_of_cycles(&commands, || {
        turn += 1;
        let clone = clones[turn % 2].clone();
        async move { clone.acquire().await.unwrap().release().await.unwrap() }
    })
    .await;
    assert!(
        sent == expected,
        "clones of one lock, taking turns: {:?}",
        tally(&sent)
    );

    let provider = Provider::new(&database)
        .with_collection(collection.as_str())
        .with_options(options);
    let name = common::unique("provided");
    let sent = commands_of_cycles(&commands, || async {
        let guard = provider.create_lock(name.as_str()).acquire().await.unwrap();
        guard.release().await.unwrap();
    })
    .await;
    assert!(
        sent == expected,
        "a provider's locks of one name: {:?}",
        tally(&sent)
    );
}

/// Waiters behind a lease held in this process: only the first polls the server, at the slowest
/// busy-wait pace (the lease's end will be a local event, so polling is only a safety net), and
/// the others wait for local events and their deadline. With adaptive backoff from 1 ms, a waiter
/// polling at its own pace would send about fifteen attempts in its first three seconds; a second
/// waiter polling too, three more. Here: the first waiter one attempt a second and one at its
/// deadline (4 in 3.5 s); the second one as the first leaves the line (the poller's duty passes
/// to it: seen on 2026-11-28) and one at its deadline a moment later: 6 in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_behind_a_lease_held_here_poll_once_at_the_slowest_pace() {
    const WAIT: Duration = Duration::from_millis(3_500);
    let (database, commands) = common::counting_database().await;
    let options = LockOptions::builder()
        .busy_wait_sleep_time(Duration::from_millis(1), Duration::from_secs(1))
        .adaptive_backoff(true)
        .build()
        .unwrap();
    let lock = MongoDistributedLock::new(common::unique("held-here"), &database)
        .with_collection(common::unique("locks").as_str())
        .with_options(options);
    let guard = lock.acquire().await.unwrap();
    commands.clear();
    let (first, second) = (lock.clone(), lock.clone());
    let first = tokio::spawn(async move { first.acquire_timeout(WAIT).await });
    // The second comes after the first, behind it in line.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = tokio::spawn(async move { second.acquire_timeout(WAIT).await });
    for waiter in [first, second] {
        let outcome = waiter.await.unwrap();
        assert!(
            matches!(
                outcome,
                Err(distributed_lock_mongodb::Error::Timeout { .. })
            ),
            "{:?}",
            outcome.map(|guard| guard.fencing_token())
        );
    }
    let attempts = commands
        .find_and_modifies()
        .iter()
        .filter(|command| command.get_bool("upsert").unwrap_or(false))
        .count();
    println!("two waiters behind a lease held here for {WAIT:?}: {attempts} attempts");
    assert!(
        attempts <= 6,
        "{attempts} attempts while the lease was held here"
    );
    assert!(
        attempts >= 2,
        "each waiter attempts at least at its deadline"
    );
    guard.release().await.unwrap();
}

/// `adaptive_backoff`: a waiter's sleeps grow by half per failed attempt from the busy-wait
/// minimum (±20 %), instead of falling anywhere in the range. A document lock's waiter polls
/// (it has no local queue): over 2 s with a range of 50 ms to 10 s it sends about eight attempts
/// (the schedule 50, 75, 112, 169, 253, 380, 570, 854 ms, and one at the deadline). A uniform
/// sleep in that range would average 5 s: one or two attempts.
#[tokio::test]
async fn adaptive_backoff_paces_the_attempts_of_a_waiter_that_polls() {
    let (database, commands) = common::counting_database().await;
    let collection_name = common::unique("jobs");
    let holder_side = common::database().await;
    let holder = distributed_lock_mongodb::DocumentLock::<Document>::new(
        &holder_side.collection(&collection_name),
    );
    holder_side
        .collection::<Document>(&collection_name)
        .insert_one(doc! { "_id": 1 })
        .await
        .unwrap();
    let held = holder.lock(doc! { "_id": 1 }).await.unwrap();

    let options = LockOptions::builder()
        .busy_wait_sleep_time(Duration::from_millis(50), Duration::from_secs(10))
        .adaptive_backoff(true)
        .build()
        .unwrap();
    let waiter = distributed_lock_mongodb::DocumentLock::<Document>::new(
        &database.collection(&collection_name),
    )
    .with_options(options);
    let before = commands.count("findAndModify");
    let outcome = waiter
        .try_lock_timeout(doc! { "_id": 1 }, Duration::from_secs(2))
        .await
        .unwrap();
    assert!(outcome.is_none(), "the document stayed locked");
    let attempts = commands.count("findAndModify") - before;
    // The fastest schedule (-20 %) allows nine in 2 s and one at the deadline; a loaded
    // machine may fit fewer.
    assert!((4..=10).contains(&attempts), "{attempts} attempts in 2 s");
    held.release().await.unwrap();
}
