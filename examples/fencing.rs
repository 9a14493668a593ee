//! Fencing tokens protect a resource from a holder that lost its lock without noticing.
//!
//! The protected document remembers the largest token that wrote to it and refuses writes
//! carrying a smaller one, in the same atomic update. A holder paused for longer than its lease
//! (GC, a stalled VM) therefore cannot overwrite the work of the holder that came after it.
//!
//! `scripts/run-example fencing` (uses `MONGODB_URI` when set).
//!
//! Output (`…` stands for what changes from run to run; `scripts/run-examples` checks that
//! these lines come, in this order):
//!
//! ```text
//! B (token …) writes 150: applied = true
//! A (stale token …) writes 90: applied = false
//! final balance: 150
//! ```

mod common;

use std::process::ExitCode;
use std::time::Duration;

use distributed_lock_mongodb::{FencingToken, LockOptions, MongoDistributedLock};
use mongodb::bson::{Document, doc};
use mongodb::{Client, Collection};

/// Sets the account balance only if `token` is newer than every token that wrote before.
async fn fenced_write(
    accounts: &Collection<Document>,
    token: FencingToken,
    balance: i64,
) -> mongodb::error::Result<bool> {
    let result = accounts
        .update_one(
            doc! { "_id": "acct-1", "$or": [
                { "lastToken": { "$lt": token.get() } },
                { "lastToken": { "$exists": false } },
            ] },
            doc! { "$set": { "balance": balance, "lastToken": token.get() } },
        )
        .await?;
    Ok(result.modified_count == 1)
}

#[tokio::main]
async fn main() -> ExitCode {
    common::run(run).await
}

async fn run(client: &Client) -> Result<(), Box<dyn std::error::Error>> {
    let database = client.database("fencing_example");
    let accounts = database.collection::<Document>("accounts");
    accounts.delete_many(doc! {}).await?;
    accounts
        .insert_one(doc! { "_id": "acct-1", "balance": 100_i64 })
        .await?;

    let options = LockOptions::builder()
        .expiry(Duration::from_secs(5))
        .build()?;
    let lock = MongoDistributedLock::new("acct-1", &database).with_options(options);

    // Holder A acquires, then stalls. We simulate its lease running out by releasing it
    // behind its back: a real stall would look the same to everyone else.
    let a = lock.acquire().await?;
    let stale_token = a.fencing_token();
    a.release().await?;

    // Holder B acquires next and writes.
    let b = lock.acquire().await?;
    println!(
        "B (token {}) writes 150: applied = {}",
        b.fencing_token(),
        fenced_write(&accounts, b.fencing_token(), 150).await?
    );

    // A wakes up and tries to write with its old token: rejected.
    let applied = fenced_write(&accounts, stale_token, 90).await?;
    println!("A (stale token {stale_token}) writes 90: applied = {applied}");
    assert!(!applied, "a stale token must be rejected");
    b.release().await?;

    let balance = accounts
        .find_one(doc! { "_id": "acct-1" })
        .await?
        .and_then(|d| d.get_i64("balance").ok())
        .ok_or("the account has no balance")?;
    println!("final balance: {balance}");
    Ok(())
}
