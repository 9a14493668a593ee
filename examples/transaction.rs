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

use distributed_lock_mongodb::{Error, MongoDistributedLock};
use mongodb::Client;
use mongodb::bson::{Document, doc};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::with_uri_str(mongodb_uri()).await?;
    let outcome = run(&client).await;
    // Every lock object is gone: end the driver's work while the runtime still runs, so that no
    // task of the driver or of the locks' background work ends with the runtime mid-request.
    client.shutdown().await;
    outcome
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
        let balance = stored.and_then(|stored| stored.get_i32("balance").ok());
        println!("{account}: {balance:?}");
    }
    drop(guard);
    Ok(())
}

fn mongodb_uri() -> String {
    std::env::var("MONGODB_URI").unwrap_or_else(|_| "mongodb://localhost:27017".to_owned())
}
