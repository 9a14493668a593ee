//! Leases kept by hand: a guard's `extend(by)` (one command, never shortens, refused past
//! `max_hold`, `LockLost` once the lease ended) and `auto_renew(false)` (nothing renews the lease:
//! it ends at its expiry unless extended), for every kind of lock.

use test_support as common;

use std::sync::Arc;
use std::time::Duration;

use distributed_lock_mongodb::{
    DocumentLock, Error, LeaderElection, LockOptions, MongoDistributedLock, Provider,
};
use mongodb::bson::{DateTime, Document, doc};
use mongodb::{Collection, Database};

/// A lease of `expiry_ms` that nothing renews.
fn by_hand(expiry_ms: u64) -> LockOptions {
    common::options(expiry_ms, expiry_ms / 3)
        .to_builder()
        .auto_renew(false)
        .build()
        .unwrap()
}

/// The stored end of lock `name`'s lease.
async fn stored_end(collection: &Collection<Document>, name: &str) -> DateTime {
    *common::lock_document(collection, name)
        .await
        .expect("the lock document")
        .get_datetime("expiresAt")
        .unwrap()
}

/// A lock named `name` in `collection` of `database` with `options`.
fn lock_on(
    database: &Database,
    collection: &Collection<Document>,
    name: &str,
    options: LockOptions,
) -> MongoDistributedLock {
    MongoDistributedLock::new(name, database)
        .with_collection(collection.name())
        .with_options(options)
}

/// A lock whose lease nothing renews (`expiry_ms`), and another instance's lock of the same name
/// that renews its own, in a fresh collection of a database whose commands are logged.
struct Contenders {
    log: Arc<common::CommandLog>,
    collection: Collection<Document>,
    name: String,
    lock: MongoDistributedLock,
    other: MongoDistributedLock,
}

async fn contenders(expiry_ms: u64) -> Contenders {
    let (database, log) = common::counting_database().await;
    let collection = database.collection::<Document>(&common::unique("locks"));
    let name = common::unique("by-hand");
    let lock = lock_on(&database, &collection, &name, by_hand(expiry_ms));
    let other = lock_on(&database, &collection, &name, common::options(5_000, 1_000));
    Contenders {
        log,
        collection,
        name,
        lock,
        other,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_nothing_renews_ends_at_its_expiry_and_fires_lost_without_a_renewal() {
    let Contenders {
        log,
        collection,
        lock,
        other,
        ..
    } = contenders(1_500).await;

    let guard = lock.acquire().await.unwrap();
    log.clear();
    let lost = guard.lost();
    tokio::time::timeout(Duration::from_secs(30), lost.wait())
        .await
        .expect("lost at the expiry");
    assert!(guard.is_lost());
    let renewals = log
        .updates()
        .iter()
        .chain(log.find_and_modifies().iter())
        .filter(|command| {
            command
                .get_str("update")
                .or(command.get_str("findAndModify"))
                == Ok(collection.name())
        })
        .count();
    assert_eq!(
        renewals,
        0,
        "nothing renewed the lease: {:?}",
        log.started()
    );
    let next = other
        .acquire_timeout(Duration::from_secs(30))
        .await
        .expect("another instance takes the expired lock");
    assert!(next.fencing_token() > guard.fencing_token());
    assert!(matches!(guard.release().await, Err(Error::LockLost { .. })));
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extending_a_lease_nothing_renews_keeps_it_past_its_expiry_in_one_command() {
    let Contenders {
        log,
        collection,
        name,
        lock,
        other,
    } = contenders(2_000).await;

    let guard = lock.acquire().await.unwrap();
    let acquired_end = stored_end(&collection, &name).await;
    log.clear();
    guard.extend(Duration::from_secs(6)).await.unwrap();
    // (The TTL index's creation after the first acquisition may come meanwhile.)
    let commands = log
        .started()
        .into_iter()
        .filter(|command| {
            ["update", "findAndModify", "find", "aggregate"].contains(&command.as_str())
        })
        .collect::<Vec<_>>();
    assert_eq!(
        commands,
        ["update"],
        "an extension is one command, the lease's own"
    );
    let (now, end) = common::server_now_and_expiry(&collection, &name).await;
    let end = end.expect("the lock document");
    assert!(
        end > acquired_end,
        "the end moved: {end} after {acquired_end}"
    );
    assert!(
        end.timestamp_millis() - now.timestamp_millis() > 2_000,
        "the lease lasts about 6 s from the extension: ends {end}, server now {now}"
    );
    // Past the expiry the lease had, it is held still, here and on the server.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(!guard.is_lost(), "held past its first expiry");
    assert!(
        other.try_acquire().await.unwrap().is_none(),
        "another instance cannot take an extended lease"
    );
    guard.release().await.unwrap();
    let _ = other
        .try_acquire()
        .await
        .unwrap()
        .expect("free once released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_never_shortens_and_renewals_never_shorten_an_extension() {
    let (lock, collection) = common::fresh_lock("extend", common::options(2_000, 300)).await;
    let guard = lock.acquire().await.unwrap();

    // By less than is left: nothing moves back.
    let before = stored_end(&collection, lock.name()).await;
    guard.extend(Duration::from_millis(100)).await.unwrap();
    let after = stored_end(&collection, lock.name()).await;
    assert!(
        after >= before,
        "an extension never shortens: {after} < {before}"
    );

    // By more than a renewal gives: the renewals that follow keep it.
    guard.extend(Duration::from_secs(20)).await.unwrap();
    let extended = stored_end(&collection, lock.name()).await;
    let renewed = common::eventually(Duration::from_secs(20), || async {
        common::lock_document(&collection, lock.name())
            .await
            .and_then(|stored| stored.get_datetime("renewedAt").ok().copied())
            .is_some_and(|renewed_at| {
                renewed_at.timestamp_millis() > extended.timestamp_millis() - 20_000 + 600
            })
    })
    .await;
    assert!(renewed, "a renewal came after the extension");
    let end = stored_end(&collection, lock.name()).await;
    assert!(
        end >= extended,
        "a renewal kept the extension's later end: {end} < {extended}"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_extensions_are_refused_with_nothing_written() {
    let (database, log) = common::counting_database().await;
    let collection = database.collection::<Document>(&common::unique("locks"));
    let name = common::unique("extend");
    // (Nothing renews it: no renewal can come among the refusals.)
    let limited = by_hand(5_000)
        .to_builder()
        .max_hold(Duration::from_secs(10))
        .build()
        .unwrap();
    let lock = lock_on(&database, &collection, &name, limited);
    let guard = lock.acquire().await.unwrap();
    let stored = common::lock_document(&collection, &name).await.unwrap();
    log.clear();

    for (by, what) in [
        (Duration::ZERO, "between 1 ms and 365 days"),
        (
            Duration::from_secs(366 * 24 * 60 * 60),
            "between 1 ms and 365 days",
        ),
        (Duration::from_secs(11), "max_hold"),
    ] {
        match guard.extend(by).await {
            Err(Error::InvalidArgument(message)) => {
                assert!(message.contains(what), "{by:?}: {message}");
            }
            other => panic!("extend({by:?}): expected InvalidArgument, got {other:?}"),
        }
    }
    assert!(
        !log.started()
            .iter()
            .any(|command| command == "update" || command == "findAndModify"),
        "a refused extension sends nothing: {:?}",
        log.started()
    );
    let unchanged = common::lock_document(&collection, &name).await.unwrap();
    assert_eq!(
        unchanged.get_datetime("expiresAt"),
        stored.get_datetime("expiresAt"),
        "nothing written"
    );
    assert!(
        !guard.is_lost(),
        "a refused extension leaves the lease as it was"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extending_a_lease_that_ended_is_lock_lost_and_fires_lost() {
    let database = common::database().await;
    let (provider, [locks, ..]) = common::provider_with_own_collections(&database);
    let provider = provider.with_options(common::options(30_000, 10_000));
    let lock = provider.create_lock(common::unique("extend"));

    // Ended by an operator: the extension finds it gone.
    let guard = lock.acquire().await.unwrap();
    assert!(provider.force_release(lock.name()).await.unwrap());
    assert!(matches!(
        guard.extend(Duration::from_secs(5)).await,
        Err(Error::LockLost { .. })
    ));
    tokio::time::timeout(Duration::from_secs(10), guard.lost().wait())
        .await
        .expect("the extension's finding fires lost");
    assert!(
        common::lock_document(&locks, lock.name())
            .await
            .is_none_or(|stored| !stored.contains_key("lockId")),
        "the extension took nothing back"
    );
    drop(guard);

    // Expired: refused before any command.
    let expiring = lock_on(&database, &locks, &common::unique("extend"), by_hand(500));
    let guard = expiring.acquire().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), guard.lost().wait())
        .await
        .expect("expired");
    assert!(matches!(
        guard.extend(Duration::from_secs(5)).await,
        Err(Error::LockLost { .. })
    ));
}

/// The end of the lease `lock_id` among the array `field` of `stored`.
fn member_end(stored: &Document, field: &str, lock_id: &str) -> DateTime {
    *stored
        .get_array(field)
        .unwrap()
        .iter()
        .filter_map(|member| member.as_document())
        .find(|member| member.get_str("id") == Ok(lock_id))
        .expect("the member")
        .get_datetime("expiresAt")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_guard_extends_its_own_lease() {
    let database = common::database().await;
    let (provider, [locks, rw_locks, semaphores]) =
        common::provider_with_own_collections(&database);
    let provider = provider.with_options(by_hand(5_000));
    let by = Duration::from_secs(60);
    let later_than =
        |end: DateTime, now: DateTime| end.timestamp_millis() - now.timestamp_millis() > 30_000;

    let semaphore = provider.create_semaphore(common::unique("places"), 2);
    let place = semaphore.acquire().await.unwrap();
    let other_place = semaphore.acquire().await.unwrap();
    place.extend(by).await.unwrap();
    let stored = common::lock_document(&semaphores, semaphore.name())
        .await
        .unwrap();
    let (now, top) = common::server_now_and_expiry(&semaphores, semaphore.name()).await;
    assert!(
        later_than(member_end(&stored, "holders", place.lock_id()), now),
        "{stored}"
    );
    assert!(
        !later_than(member_end(&stored, "holders", other_place.lock_id()), now),
        "only its own place: {stored}"
    );
    assert!(
        later_than(top.unwrap(), now),
        "the document is kept as long: {stored}"
    );

    let rw = provider.create_reader_writer_lock(common::unique("rw"));
    let reader = rw.acquire_read().await.unwrap();
    reader.extend(by).await.unwrap();
    let stored = common::lock_document(&rw_locks, rw.name()).await.unwrap();
    let (now, _) = common::server_now_and_expiry(&rw_locks, rw.name()).await;
    assert!(
        later_than(member_end(&stored, "readers", reader.lock_id()), now),
        "{stored}"
    );
    reader.release().await.unwrap();
    let writer = rw.acquire_write().await.unwrap();
    writer.extend(by).await.unwrap();
    let stored = common::lock_document(&rw_locks, rw.name()).await.unwrap();
    let writer_end = *stored
        .get_document("writer")
        .unwrap()
        .get_datetime("expiresAt")
        .unwrap();
    assert!(later_than(writer_end, now), "{stored}");
    writer.release().await.unwrap();

    // A document lock records when (an extension's `renewedAt`), and its commit leaves nothing
    // of the lease but the token.
    let orders = database.collection::<Document>(&common::unique("orders"));
    orders
        .insert_one(doc! { "_id": 1, "total": 5 })
        .await
        .unwrap();
    let documents: DocumentLock<Document> = provider.create_document_lock(&orders);
    let locked = documents.lock(doc! { "_id": 1 }).await.unwrap();
    locked.extend(by).await.unwrap();
    let stored = orders.find_one(doc! { "_id": 1 }).await.unwrap().unwrap();
    let field = stored.get_document("lock").unwrap();
    assert!(
        later_than(*field.get_datetime("expiresAt").unwrap(), now),
        "{stored}"
    );
    assert!(field.get_datetime("renewedAt").is_ok(), "{stored}");
    locked
        .commit(doc! { "$set": { "total": 6 } })
        .await
        .unwrap();
    let committed = orders.find_one(doc! { "_id": 1 }).await.unwrap().unwrap();
    let field = committed.get_document("lock").unwrap();
    assert_eq!(
        field.keys().collect::<Vec<_>>(),
        ["fencingToken"],
        "only the token is left: {committed}"
    );

    // A composite extends each member.
    let (first, second) = (common::unique("member"), common::unique("member"));
    let all = provider
        .acquire_all(&[first.as_str(), second.as_str()], Duration::from_secs(10))
        .await
        .unwrap();
    all.extend(by).await.unwrap();
    for name in [&first, &second] {
        let (now, end) = common::server_now_and_expiry(&locks, name).await;
        assert!(later_than(end.unwrap(), now), "{name}");
    }
    all.release().await.unwrap();
    place.release().await.unwrap();
    other_place.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_nothing_renews_is_handed_over_and_its_waiter_keeps_it_by_hand_too() {
    let (lock, collection) = common::fresh_lock("by-hand", by_hand(2_000)).await;
    let first = lock.acquire().await.unwrap();
    // (Kept however long the waiter takes to queue.)
    first.extend(Duration::from_secs(60)).await.unwrap();
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(30)).await })
    };
    assert!(common::offers_become(collection.name(), lock.name(), 1).await);
    let first_token = first.fencing_token();
    first.release().await.unwrap();
    let second = waiter.await.unwrap().expect("handed over");
    assert!(second.fencing_token() > first_token);
    second.extend(Duration::from_secs(5)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(!second.is_lost(), "kept by its extension");
    tokio::time::timeout(Duration::from_secs(10), second.lost().wait())
        .await
        .expect("and lost once the extension ran out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_election_refuses_a_lease_nothing_renews() {
    let provider = Provider::new(&common::database().await).with_options(by_hand(5_000));
    match provider.create_leader_election(common::unique("leader")) {
        Err(Error::InvalidOptions(message)) => assert!(message.contains("auto_renew"), "{message}"),
        other => panic!("expected InvalidOptions, got {other:?}"),
    }
    let lock = provider.create_lock(common::unique("leader"));
    assert!(matches!(
        LeaderElection::start(lock),
        Err(Error::InvalidOptions(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_ends_a_lease_nothing_renews_and_min_hold_keeps_its_window() {
    let database = common::database().await;
    let (provider, [locks, ..]) = common::provider_with_own_collections(&database);
    let provider = provider.with_options(by_hand(5_000));
    let lock = provider.create_lock(common::unique("by-hand"));
    let guard = lock.acquire().await.unwrap();
    guard.extend(Duration::from_secs(60)).await.unwrap();
    provider.shutdown().await;
    assert!(guard.is_lost(), "a shutdown ends it, extension or not");
    let stored = common::lock_document(&locks, lock.name()).await;
    assert!(
        stored.is_none_or(|stored| !stored.contains_key("lockId")),
        "released on the server"
    );

    // With a `min_hold`, the window outlasts the release as for a renewed lease, and an
    // extension keeps it.
    let options = by_hand(2_000)
        .to_builder()
        .min_hold(Duration::from_secs(30))
        .build()
        .unwrap();
    let (windowed, collection) = common::fresh_lock("by-hand", options).await;
    let guard = windowed.acquire().await.unwrap();
    let window = stored_end(&collection, windowed.name()).await;
    guard.extend(Duration::from_secs(1)).await.unwrap();
    assert_eq!(
        stored_end(&collection, windowed.name()).await,
        window,
        "a short extension keeps the window's later end"
    );
    guard.release().await.unwrap();
    let other = MongoDistributedLock::new(windowed.name(), &database)
        .with_collection(collection.name())
        .with_options(common::options(5_000, 1_000));
    assert!(
        other.try_acquire().await.unwrap().is_none(),
        "the window keeps it taken after the release"
    );
}
