//! Writes that commit only while the lock is held: a lease-checked transaction.
//!
//! A worker holds the lock for an account ledger and moves money between two accounts in one
//! multi-document transaction. The transaction first checks (and renews) the lease inside
//! itself, so if the lock had been lost, nothing would be written — no fencing field needed in
//! the account documents. Then an "operator" takes the lock over behind the worker's back, and
//! the worker's next transfer is refused with `LockLost`.
//!
//! Transactions need a replica set or a sharded cluster (`docker compose up` in this repository
//! starts one); the embedded test server supports them too.
//!
//! `scripts/run-example transaction` (uses `MONGODB_URI` when set).
//!
//! Output (`…` stands for what changes from run to run; `scripts/run-examples` checks that
//! these lines come, in this order):
//!
//! ```text
//! moved 30 while holding the lock
//! the lock was lost: the second transfer wrote nothing
//! alice: 70
//! bob: 30
//! ```

mod common;

use distributed_lock_mongodb::{Error, MongoDistributedLock};
use mongodb::Client;
use mongodb::bson::{Document, doc};
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    common::run(run).await
}

async fn run(client: &Client) -> Result<(), Box<dyn std::error::Error>> {
    let database = client.database("transaction_example");
    let accounts = database.collection::<Document>("accounts");
    accounts.drop().await?;
    accounts
        .insert_many([
            doc! { "_id": "alice", "balance": 100 },
            doc! { "_id": "bob", "balance": 0 },
        ])
        .await?;

    let lock = MongoDistributedLock::new("ledger", &database);
    let guard = lock.acquire().await?;
    let transfer = async |amount: i32| {
        guard
            .transaction(client, async |session| {
                accounts
                    .update_one(
                        doc! { "_id": "alice" },
                        doc! { "$inc": { "balance": -amount } },
                    )
                    .session(&mut *session)
                    .await?;
                accounts
                    .update_one(
                        doc! { "_id": "bob" },
                        doc! { "$inc": { "balance": amount } },
                    )
                    .session(&mut *session)
                    .await?;
                Ok(())
            })
            .await
    };

    transfer(30).await?;
    println!("moved 30 while holding the lock");

    // An operator takes the lock over (the worker's renewal has not noticed yet).
    database
        .collection::<Document>("distributed_locks")
        .update_one(
            doc! { "_id": "ledger" },
            doc! { "$set": { "lockId": "operator" } },
        )
        .await?;
    match transfer(50).await {
        Err(Error::LockLost { .. }) => {
            println!("the lock was lost: the second transfer wrote nothing")
        }
        other => println!("unexpected: {other:?}"),
    }

    for account in ["alice", "bob"] {
        let stored = accounts.find_one(doc! { "_id": account }).await?;
        let balance = stored
            .and_then(|stored| stored.get_i32("balance").ok())
            .ok_or("an account has no balance")?;
        println!("{account}: {balance}");
    }
    drop(guard);
    Ok(())
}
