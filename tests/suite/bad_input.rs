//! Bad input: every case gives a clear `Error` naming the problem or a documented success, never
//! a panic (not even in a background task), and an error writes nothing.

use test_support as common;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use distributed_lock_mongodb::{Error, LockOptions, MongoDistributedLock};
use mongodb::bson::{Bson, DateTime, Document, doc};

/// Counts panics anywhere in this test binary, including spawned tasks whose panics Tokio
/// would otherwise swallow.
fn panics() -> &'static AtomicUsize {
    static PANICS: OnceLock<&'static AtomicUsize> = OnceLock::new();
    PANICS.get_or_init(|| {
        let counter: &'static AtomicUsize = Box::leak(Box::new(AtomicUsize::new(0)));
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            counter.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }));
        counter
    })
}

#[tokio::test]
async fn names_of_every_kind_are_stored_verbatim() {
    let panics = panics();
    let database = common::database().await;
    let collection_name = common::unique("names");
    let collection = database.collection::<Document>(&collection_name);
    let huge = "n".repeat(1 << 20);
    let names = [
        "".to_owned(),
        huge,
        "nul\0inside".to_owned(),
        "$dollar".to_owned(),
        "dots.in.name".to_owned(),
        "ünïcødé ✓ 名前".to_owned(),
        "Case".to_owned(),
        "case".to_owned(),
    ];
    for name in &names {
        let lock = MongoDistributedLock::new(name.as_str(), &database)
            .with_collection(collection_name.as_str());
        let guard = lock
            .try_acquire()
            .await
            .unwrap()
            .expect("a free name is acquired");
        assert_eq!(guard.name(), name);
        let stored = collection
            .find_one(doc! { "_id": name.as_str() })
            .await
            .unwrap();
        assert_eq!(
            stored.unwrap().get_str("_id").unwrap(),
            name,
            "stored verbatim"
        );
        guard.release().await.unwrap();
    }
    assert_eq!(panics.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn names_longer_than_one_mib_are_refused_by_every_kind_and_write_nothing() {
    let panics = panics();
    let database = common::database().await;
    let collection_name = common::unique("names");
    let provider = distributed_lock_mongodb::Provider::new(&database)
        .with_collection(collection_name.as_str());
    let too_long = "n".repeat((1 << 20) + 1);
    let refused = |error: Error| {
        assert!(matches!(error, Error::InvalidArgument(_)), "{error}");
        assert!(
            error.to_string().contains("limited to 1048576 bytes"),
            "{error}"
        );
    };
    refused(
        provider
            .create_lock(too_long.as_str())
            .try_acquire()
            .await
            .unwrap_err(),
    );
    refused(
        provider
            .create_semaphore(too_long.as_str(), 2)
            .try_acquire()
            .await
            .unwrap_err(),
    );
    let rw = provider.create_reader_writer_lock(too_long.as_str());
    refused(rw.try_acquire_read().await.unwrap_err());
    refused(rw.try_acquire_write().await.unwrap_err());
    let collections = database.list_collection_names().await.unwrap();
    assert!(
        !collections.contains(&collection_name),
        "nothing was written: {collections:?}"
    );
    assert_eq!(panics.load(Ordering::SeqCst), 0);
}

#[test]
fn options_out_of_range_are_rejected_naming_the_option() {
    let panics = panics();
    let ms = Duration::from_millis;
    let table: Vec<(&str, Result<LockOptions, Error>, &str)> = vec![
        (
            "expiry 0",
            LockOptions::builder().expiry(Duration::ZERO).build(),
            "expiry",
        ),
        (
            "expiry MAX",
            LockOptions::builder().expiry(Duration::MAX).build(),
            "expiry",
        ),
        (
            "cadence = expiry",
            LockOptions::builder()
                .expiry(ms(1_000))
                .extension_cadence(ms(1_000))
                .build(),
            "extension_cadence",
        ),
        (
            "cadence > expiry",
            LockOptions::builder()
                .expiry(ms(1_000))
                .extension_cadence(ms(5_000))
                .build(),
            "extension_cadence",
        ),
        (
            "min sleep > max sleep",
            LockOptions::builder()
                .busy_wait_sleep_time(ms(50), ms(10))
                .build(),
            "busy_wait_sleep_time",
        ),
        (
            "max sleep 0",
            LockOptions::builder()
                .busy_wait_sleep_time(Duration::ZERO, Duration::ZERO)
                .build(),
            "busy_wait_sleep_time",
        ),
        (
            "w: 0",
            LockOptions::builder()
                .write_concern(mongodb::options::WriteConcern::nodes(0))
                .build(),
            "write_concern",
        ),
    ];
    for (case, result, option) in table {
        match result {
            Err(Error::InvalidOptions(message)) => {
                assert!(message.contains(option), "{case}: {message}");
            }
            other => panic!("{case}: expected InvalidOptions, got {other:?}"),
        }
    }
    assert_eq!(panics.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn extreme_timeouts_are_one_attempt_or_no_deadline() {
    let panics = panics();
    let (lock, _) = common::fresh_lock("timeouts", common::options(5_000, 1_000)).await;
    // Documented: zero is exactly one attempt; Duration::MAX is no deadline.
    let guard = lock.acquire_timeout(Duration::ZERO).await.unwrap();
    assert!(
        lock.try_acquire_timeout(Duration::ZERO)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        lock.acquire_timeout(Duration::ZERO)
            .await
            .unwrap_err()
            .is_timeout()
    );
    let forever = tokio::time::timeout(
        Duration::from_millis(300),
        lock.acquire_timeout(Duration::MAX),
    )
    .await;
    assert!(
        forever.is_err(),
        "Duration::MAX keeps waiting while the lock is held"
    );
    let forever = tokio::time::timeout(
        Duration::from_millis(300),
        lock.try_acquire_timeout(Duration::MAX),
    )
    .await;
    assert!(forever.is_err());
    guard.release().await.unwrap();
    lock.try_acquire_timeout(Duration::MAX)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    assert_eq!(panics.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn collection_names_mongodb_rejects_give_an_error_and_write_nothing() {
    let panics = panics();
    let database = common::database().await;
    let before = database.list_collection_names().await.unwrap();
    for collection in ["", "$x", "with\0nul", "system.locks"] {
        let lock = MongoDistributedLock::new("n", &database).with_collection(collection);
        for result in [
            lock.try_acquire().await.map(|_| ()),
            lock.acquire().await.map(|_| ()),
            lock.acquire_timeout(Duration::from_secs(1))
                .await
                .map(|_| ()),
            lock.try_acquire_timeout(Duration::ZERO).await.map(|_| ()),
        ] {
            match result {
                Err(Error::InvalidCollectionName {
                    collection: named,
                    reason,
                }) => {
                    assert_eq!(named, collection);
                    assert!(!reason.is_empty());
                }
                other => panic!("{collection:?}: expected InvalidCollectionName, got {other:?}"),
            }
        }
    }
    let after = database.list_collection_names().await.unwrap();
    let created: Vec<&String> = after.iter().filter(|name| !before.contains(name)).collect();
    // Other tests of this binary create their own (uniquely named) collections meanwhile.
    assert!(
        created
            .iter()
            .all(|name| name.starts_with("names-") || name.starts_with("locks-")),
        "unexpected collections: {created:?}"
    );
    assert_eq!(panics.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_provider_reports_a_bad_collection_of_any_kind_from_the_calls_that_use_it() {
    let panics = panics();
    let database = common::database().await;
    let before = database.list_collection_names().await.unwrap();
    let named = |result: Result<(), Error>, collection: &str| match result {
        Err(Error::InvalidCollectionName {
            collection: named, ..
        }) => assert_eq!(named, collection),
        other => panic!("{collection:?}: expected InvalidCollectionName, got {other:?}"),
    };
    let bad = "bad$collection";
    let provider = distributed_lock_mongodb::Provider::new(&database).with_collection(bad);
    named(provider.status("n").await.map(|_| ()), bad);
    named(provider.force_release("n").await.map(|_| ()), bad);
    named(provider.purge_expired().await.map(|_| ()), bad);
    named(provider.held_locks().await.map(|_| ()), bad);
    named(
        provider.create_lock("n").try_acquire().await.map(|_| ()),
        bad,
    );
    named(
        provider
            .acquire_all(&["a", "b"], Duration::from_secs(1))
            .await
            .map(|_| ()),
        bad,
    );
    let provider = distributed_lock_mongodb::Provider::new(&database)
        .with_collection(common::unique("names"))
        .with_reader_writer_collection(bad);
    named(provider.held_locks().await.map(|_| ()), bad);
    let rw = provider.create_reader_writer_lock("n");
    named(rw.try_acquire_read().await.map(|_| ()), bad);
    named(rw.holders().await.map(|_| ()), bad);
    let provider = distributed_lock_mongodb::Provider::new(&database)
        .with_collection(common::unique("names"))
        .with_semaphore_collection(bad);
    named(provider.held_locks().await.map(|_| ()), bad);
    let semaphore = provider.create_semaphore("n", 2);
    named(semaphore.try_acquire().await.map(|_| ()), bad);
    named(semaphore.holders().await.map(|_| ()), bad);
    let after = database.list_collection_names().await.unwrap();
    assert!(
        after
            .iter()
            .all(|name| before.contains(name) || !name.contains('$')),
        "nothing was written to {bad:?}: {after:?}"
    );
    assert_eq!(panics.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn foreign_fencing_tokens_of_other_types_are_rebased() {
    let panics = panics();
    let (lock, collection) =
        common::fresh_lock_without_ttl("odd", common::options(5_000, 1_000)).await;
    let past = DateTime::from_millis(DateTime::now().timestamp_millis() - 1_000);
    for (token, expires_at) in [
        (Bson::String("not a number".into()), Bson::DateTime(past)),
        (Bson::String("12".into()), Bson::DateTime(past)),
        (Bson::Double(41.0), Bson::DateTime(past)),
        (Bson::Double(f64::NAN), Bson::DateTime(past)),
        (Bson::Int32(3), Bson::DateTime(past)),
        (Bson::Null, Bson::Null),
        (Bson::Int64(5), Bson::String("garbage".into())),
    ] {
        collection.delete_many(doc! {}).await.unwrap();
        collection
            .insert_one(doc! { "_id": lock.name(), "lockId": "x", "expiresAt": expires_at.clone(), "fencingToken": token.clone() })
            .await
            .unwrap();
        // Documented: an expired (or unreadable) lease is taken over, and the new token is a
        // long above both the old value (read as 0 when it is not a number) and server ms × 1000.
        let guard = lock.try_acquire().await.unwrap().unwrap_or_else(|| {
            panic!("acquirable with fencingToken {token} and expiresAt {expires_at}")
        });
        let stored = common::lock_document(&collection, lock.name())
            .await
            .unwrap();
        assert!(
            matches!(stored.get("fencingToken"), Some(Bson::Int64(_))),
            "{stored}"
        );
        assert_eq!(
            stored.get_i64("fencingToken").unwrap(),
            guard.fencing_token().get()
        );
        assert!(
            guard.fencing_token().get() > DateTime::now().timestamp_millis() * 1000 - 60_000_000
        );
        guard.release().await.unwrap();
    }
    assert_eq!(panics.load(Ordering::SeqCst), 0);
}

/// A provider configured with one collection for two kinds of lock would let an exclusive lock
/// and a reader-writer lock (or a semaphore) of the same name share one document, each kind's
/// updates corrupting the other's. Every call that would use such a collection refuses it,
/// naming both settings, and nothing is written.
#[tokio::test]
async fn a_provider_refuses_one_collection_for_two_kinds_of_lock() {
    let panics = panics();
    let database = common::database().await;
    let shared = common::unique("shared");
    let refused = |result: Result<(), Error>| match result {
        Err(Error::InvalidArgument(message)) => {
            assert!(message.contains(&shared), "{message}");
            assert!(message.contains("with_collection"), "{message}");
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    for provider in [
        distributed_lock_mongodb::Provider::new(&database)
            .with_collection(shared.as_str())
            .with_reader_writer_collection(shared.as_str()),
        distributed_lock_mongodb::Provider::new(&database)
            .with_collection(shared.as_str())
            .with_semaphore_collection(shared.as_str()),
    ] {
        refused(provider.create_lock("n").try_acquire().await.map(|_| ()));
        refused(
            provider
                .create_reader_writer_lock("n")
                .try_acquire_read()
                .await
                .map(|_| ()),
        );
        refused(
            provider
                .create_semaphore("n", 2)
                .try_acquire()
                .await
                .map(|_| ()),
        );
        refused(provider.status("n").await.map(|_| ()));
        refused(provider.held_locks().await.map(|_| ()));
        refused(provider.purge_expired().await.map(|_| ()));
        refused(
            provider
                .acquire_all(&["a"], Duration::from_secs(1))
                .await
                .map(|_| ()),
        );
    }
    let written = database
        .collection::<Document>(&shared)
        .count_documents(doc! {})
        .await
        .unwrap();
    assert_eq!(written, 0, "nothing was written");
    assert_eq!(panics.load(Ordering::SeqCst), 0);
}

/// `$rename` writes the field its value names: an update renaming another field onto the lock
/// field (or the fence field) would overwrite it. Document-lock commits and checkpoints and
/// fenced writes refuse it, and write nothing.
#[tokio::test]
async fn renaming_a_field_onto_the_lock_or_fence_field_is_refused() {
    let database = common::database().await;
    let documents = database.collection::<Document>(&common::unique("renames"));
    documents
        .insert_one(doc! { "_id": "x", "draft": { "id": "forged" }, "status": "pending" })
        .await
        .unwrap();
    let locks = distributed_lock_mongodb::DocumentLock::new(&documents);
    let guard = locks.lock(doc! { "_id": "x" }).await.unwrap();
    let checkpoint = guard
        .checkpoint(doc! { "$rename": { "draft": "lock" } })
        .await;
    assert!(
        matches!(checkpoint, Err(Error::InvalidArgument(_))),
        "{checkpoint:?}"
    );
    let commit = guard
        .commit(doc! { "$rename": { "draft": "lock.id" } })
        .await;
    assert!(
        matches!(commit, Err(Error::InvalidArgument(_))),
        "{commit:?}"
    );
    let stored = documents
        .find_one(doc! { "_id": "x" })
        .await
        .unwrap()
        .unwrap();
    assert!(
        stored.get_document("draft").is_ok(),
        "nothing was renamed: {stored}"
    );

    let (lock, _) = common::fresh_lock("fenced", common::options(5_000, 1_000)).await;
    let holder = lock.acquire().await.unwrap();
    documents
        .insert_one(doc! { "_id": "resource", "older": 1 })
        .await
        .unwrap();
    let fenced = distributed_lock_mongodb::Fence::new()
        .update_one(
            &documents,
            doc! { "_id": "resource" },
            doc! { "$rename": { "older": "fencingToken" } },
            holder.fencing_token(),
        )
        .await;
    assert!(
        matches!(fenced, Err(Error::InvalidArgument(_))),
        "{fenced:?}"
    );
    let stored = documents
        .find_one(doc! { "_id": "resource" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.get_i32("older").unwrap(), 1, "nothing was renamed");
    holder.release().await.unwrap();
}
