//! The test server answers the driver calls the suites rely on. On the embedded mongoeco server
//! this checks the launcher's two reply-format shims (cursor ids as Int64; Int64 limit, skip and
//! batchSize accepted); on a real MongoDB it is a plain smoke test.

mod common;

use futures::TryStreamExt;
use mongodb::IndexModel;
use mongodb::bson::{Document, doc};

#[tokio::test]
async fn find_one_find_aggregate_and_list_indexes_work() {
    let database = common::database().await;
    let collection = database.collection::<Document>(&common::unique("server"));
    collection
        .insert_many((0..5).map(|i| doc! { "_id": i, "group": i % 2 }))
        .await
        .unwrap();

    // find_one sends limit: Int64(1).
    let one = collection
        .find_one(doc! { "_id": 3 })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(one.get_i32("group").unwrap(), 1);

    // find with limit, skip and a small batch size (so getMore runs on a real cursor id).
    let found: Vec<Document> = collection
        .find(doc! {})
        .sort(doc! { "_id": 1 })
        .skip(1)
        .limit(3)
        .batch_size(1)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let ids: Vec<i32> = found.iter().map(|d| d.get_i32("_id").unwrap()).collect();
    assert_eq!(ids, [1, 2, 3]);

    let all: Vec<Document> = collection
        .find(doc! {})
        .batch_size(2)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(all.len(), 5);

    let groups: Vec<Document> = collection
        .aggregate([
            doc! { "$group": { "_id": "$group", "n": { "$sum": 1 } } },
            doc! { "$sort": { "_id": 1 } },
        ])
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let counts: Vec<i32> = groups.iter().map(|d| d.get_i32("n").unwrap()).collect();
    assert_eq!(counts, [3, 2]);

    collection
        .create_index(IndexModel::builder().keys(doc! { "group": 1 }).build())
        .await
        .unwrap();
    let names = collection.list_index_names().await.unwrap();
    assert!(names.contains(&"_id_".to_owned()), "{names:?}");
    assert!(names.contains(&"group_1".to_owned()), "{names:?}");
}
