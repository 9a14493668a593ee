//! What an acquisition costs on the wire, and the TTL index it sets up.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::proxy::{self, Action, Rule};
use common::server;
use distributed_lock_mongodb::{
    MongoDistributedLock, MongoDistributedReaderWriterLock, MongoDistributedSemaphore, Provider,
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

#[tokio::test]
async fn every_reader_writer_attempt_is_one_find_and_modify() {
    let (database, commands) = common::counting_database().await;
    let lock = MongoDistributedReaderWriterLock::new(common::unique("rw"), &database)
        .with_collection(common::unique("rw"))
        .with_options(common::options(5_000, 1_000));
    let read = lock.try_acquire_read().await.unwrap().unwrap();
    assert!(lock.try_acquire_write().await.unwrap().is_none());
    assert_eq!(
        commands.started(),
        ["findAndModify"; 2],
        "a single try leaves no marker"
    );

    commands.clear();
    let timed_out = lock.acquire_write_timeout(Duration::from_millis(100)).await;
    assert!(timed_out.unwrap_err().is_timeout());
    let sent = commands.started();
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
    assert_eq!(commands.started(), ["update", "findAndModify", "update"]);
}

#[tokio::test]
async fn every_semaphore_attempt_is_one_find_and_modify_from_the_first_use() {
    let (database, commands) = common::counting_database().await;
    let semaphore = MongoDistributedSemaphore::new(common::unique("s"), 1, &database)
        .with_collection(common::unique("semaphores"));
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
