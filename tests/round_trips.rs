//! What an acquisition costs on the wire, and the TTL index it sets up.

mod common;

use std::time::Duration;

use distributed_lock_mongodb::{MongoDistributedLock, Provider};
use futures::TryStreamExt;
use mongodb::bson::{Document, doc};

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
    let indexes: Vec<_> = observer
        .list_indexes()
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let ttl = indexes
        .iter()
        .find(|index| {
            index.options.as_ref().and_then(|o| o.name.as_deref()) == Some("expiresAt_ttl")
        })
        .unwrap();
    assert_eq!(ttl.keys, doc! { "expiresAt": 1 });
    assert_eq!(
        ttl.options.as_ref().unwrap().expire_after,
        Some(Duration::ZERO)
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
