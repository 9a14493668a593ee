//! A holder loses its lock during a long pause, wakes up and tries to write to the protected
//! account document: the fenced write refuses it, because the next holder already wrote with a
//! newer fencing token. `scripts/run-example stale_holder` (uses `MONGODB_URI` when set).
//!
//! Output (`…` stands for what changes from run to run; `scripts/run-examples` checks that
//! these lines come, in this order):
//!
//! ```text
//! A holds the lock with token …
//! B (token …) adds 50: Applied
//! A (token …) sets 0: Stale
//! A's release reports: lock "acct-1" was lost before it was released
//! final balance: 150
//! ```

mod common;

use std::process::ExitCode;
use std::time::Duration;

use distributed_lock_mongodb::{Fence, FenceOutcome, LockOptions, MongoDistributedLock};
use mongodb::Client;
use mongodb::bson::{Document, doc};

#[tokio::main]
async fn main() -> ExitCode {
    common::run(run).await
}

async fn run(client: &Client) -> Result<(), Box<dyn std::error::Error>> {
    let database = client.database("stale_holder_example");
    let accounts = database.collection::<Document>("accounts");
    accounts.drop().await?;
    accounts
        .insert_one(doc! { "_id": "acct-1", "balance": 100 })
        .await?;
    let fence = Fence::new();

    let options = LockOptions::builder()
        .expiry(Duration::from_millis(600))
        .extension_cadence(Duration::from_millis(200))
        .build()?;
    let lock = MongoDistributedLock::new("acct-1", &database).with_options(options);

    let stale = lock.acquire().await?;
    println!("A holds the lock with token {}", stale.fencing_token());
    // A's lease is lost behind its back (here: an operator removes it; in real life a long GC
    // pause or a partition outlasting the lease does the same) ...
    database
        .collection::<Document>("distributed_locks")
        .delete_one(doc! { "_id": "acct-1" })
        .await?;

    // ... and B acquires and writes.
    let next = lock.acquire_timeout(Duration::from_secs(5)).await?;
    let outcome = fence
        .update_one(
            &accounts,
            doc! { "_id": "acct-1" },
            doc! { "$inc": { "balance": 50 } },
            next.fencing_token(),
        )
        .await?;
    println!("B (token {}) adds 50: {outcome:?}", next.fencing_token());

    // A wakes up, unaware, and writes with its old token: refused.
    let outcome = fence
        .update_one(
            &accounts,
            doc! { "_id": "acct-1" },
            doc! { "$set": { "balance": 0 } },
            stale.fencing_token(),
        )
        .await?;
    println!("A (token {}) sets 0: {outcome:?}", stale.fencing_token());
    assert_eq!(outcome, FenceOutcome::Stale);
    match stale.release().await {
        Ok(()) => println!("A's release reports nothing wrong"),
        Err(error) => println!("A's release reports: {error}"),
    }
    next.release().await?;

    let balance = accounts
        .find_one(doc! { "_id": "acct-1" })
        .await?
        .and_then(|d| d.get_i32("balance").ok())
        .ok_or("the account has no balance")?;
    println!("final balance: {balance}");
    Ok(())
}
