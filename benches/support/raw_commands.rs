//! The two commands of an uncontended lock cycle, sent raw with the driver: the baseline that
//! `benches/perf_table.rs` compares the lock with.

use std::time::Duration;

use mongodb::Collection;
use mongodb::bson::{Document, doc};
use mongodb::options::{ReturnDocument, WriteConcern};

/// The index the lock's collection has, so raw and lock commands meet the same server work.
pub async fn with_ttl_index(raw: &Collection<Document>) -> mongodb::error::Result<()> {
    let index = mongodb::IndexModel::builder()
        .keys(doc! { "expiresAt": 1 })
        .options(
            mongodb::options::IndexOptions::builder()
                .expire_after(Duration::ZERO)
                .build(),
        )
        .build();
    raw.create_index(index).await.map(drop)
}

pub async fn raw_acquire(raw: &Collection<Document>, lock_id: &str) -> mongodb::error::Result<()> {
    let free = doc! { "$lte": ["$expiresAt", "$$NOW"] };
    raw.find_one_and_update(
        doc! { "_id": "raw" },
        vec![doc! { "$set": {
            "lockId": { "$cond": [free.clone(), lock_id, "$lockId"] },
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
    .await?;
    Ok(())
}

pub async fn raw_release(raw: &Collection<Document>, lock_id: &str) -> mongodb::error::Result<()> {
    raw.update_one(
        doc! { "_id": "raw", "lockId": lock_id },
        vec![
            doc! { "$set": { "expiresAt": "$$NOW" } },
            doc! { "$unset": "lockId" },
        ],
    )
    .write_concern(WriteConcern::majority())
    .await?;
    Ok(())
}
