//! The uncontended acquire + release cycle next to the same two commands sent raw with the
//! driver, in the same run against the same server: `cargo bench --bench cycle`.
//! Uses `MONGODB_URI`, or the embedded test server when it is unset.

#[path = "../tests/common/server.rs"]
mod server;

use criterion::{Criterion, criterion_group, criterion_main};
use distributed_lock_mongodb::MongoDistributedLock;
use mongodb::bson::{Document, doc};
use mongodb::options::{ReturnDocument, WriteConcern};
use mongodb::{Client, Collection};

fn cycle(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let database = runtime.block_on(async {
        Client::with_uri_str(server::uri())
            .await
            .expect("valid MongoDB URI")
            .database("distributed_lock_bench")
    });
    let mut group = c.benchmark_group("uncontended_cycle");

    let lock = MongoDistributedLock::new("bench-lock", &database);
    group.bench_function("lock acquire + release", |b| {
        b.to_async(&runtime).iter(|| async {
            let guard = lock.acquire().await.expect("acquire");
            guard.release().await.expect("release");
        })
    });

    // The same two commands, with the same pipelines' shape and write concern, sent directly.
    let raw: Collection<Document> = database.collection("raw_commands");
    group.bench_function("raw find_one_and_update + update_one", |b| {
        b.to_async(&runtime).iter(|| async {
            let lock_id = uuid::Uuid::new_v4().to_string();
            let free = doc! { "$lte": ["$expiresAt", "$$NOW"] };
            raw.find_one_and_update(
                doc! { "_id": "bench-raw" },
                vec![doc! { "$set": {
                    "lockId": { "$cond": [free.clone(), &lock_id, "$lockId"] },
                    "expiresAt": { "$cond": [free.clone(), { "$add": ["$$NOW", 30_000_i64] }, "$expiresAt"] },
                    "acquiredAt": { "$cond": [free.clone(), "$$NOW", "$acquiredAt"] },
                    "fencingToken": { "$cond": [free, { "$max": [
                        { "$add": [{ "$convert": { "input": "$fencingToken", "to": "long", "onError": 0_i64, "onNull": 0_i64 } }, 1_i64] },
                        { "$multiply": [{ "$toLong": "$$NOW" }, 1000_i64] },
                    ] }, "$fencingToken"] },
                } }],
            )
            .upsert(true)
            .return_document(ReturnDocument::After)
            .write_concern(WriteConcern::majority())
            .await
            .expect("findAndModify");
            raw.update_one(
                doc! { "_id": "bench-raw", "lockId": &lock_id },
                vec![doc! { "$set": { "expiresAt": "$$NOW" } }, doc! { "$unset": "lockId" }],
            )
            .write_concern(WriteConcern::majority())
            .await
            .expect("update");
        })
    });
    group.finish();
}

criterion_group!(benches, cycle);
criterion_main!(benches);
