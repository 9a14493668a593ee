//! The uncontended acquire + release cycle next to the same two commands sent raw with the
//! driver, in the same run against the same server: `cargo bench --bench cycle`.
//! Uses `MONGODB_URI`, or the embedded test server when it is unset.

#[path = "support/raw_commands.rs"]
mod raw_commands;
#[path = "../tests/common/server.rs"]
mod server;

use criterion::{Criterion, criterion_group, criterion_main};
use distributed_lock_mongodb::MongoDistributedLock;
use mongodb::bson::{Document, doc};
use mongodb::{Client, Collection};
use raw_commands::{raw_acquire, raw_release, with_ttl_index};

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

    // The same two commands, with the same pipelines and write concern, sent directly.
    let raw: Collection<Document> = database.collection("raw_commands");
    runtime
        .block_on(with_ttl_index(&raw))
        .expect("TTL index like the lock's");
    group.bench_function("raw find_one_and_update + update_one", |b| {
        b.to_async(&runtime).iter(|| async {
            let lock_id = uuid::Uuid::new_v4().simple().to_string();
            raw_acquire(&raw, &lock_id).await.expect("findAndModify");
            raw_release(&raw, &lock_id).await.expect("update");
        })
    });
    group.finish();
}

criterion_group!(benches, cycle);
criterion_main!(benches);
