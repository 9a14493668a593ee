//! Stop working as soon as the lock is lost: `tokio::select!` on the guard's `lost` channel.
//!
//! To show the signal, an "operator" deletes the lock document while the work runs; the holder's
//! next renewal finds it gone and `lost` turns true.
//!
//! `scripts/run-example lost` (uses `MONGODB_URI` when set).

use std::time::Duration;

use distributed_lock_mongodb::{LockOptions, MongoDistributedLock};
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
    let database = client.database("lost_example");
    let options = LockOptions::builder()
        .expiry(Duration::from_secs(3))
        .extension_cadence(Duration::from_millis(500))
        .build()?;
    let lock = MongoDistributedLock::new("file-writer", &database).with_options(options);
    let guard = lock.acquire().await?;
    let lost = guard.lost();

    let operator = database.collection::<Document>("distributed_locks");
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let _ = operator.delete_one(doc! { "_id": "file-writer" }).await;
        println!("operator: deleted the lock document");
    });

    let mut chunks_written = 0;
    let outcome = loop {
        tokio::select! {
            _ = lost.wait() => break "lock lost: stopped writing",
            _ = tokio::time::sleep(Duration::from_millis(100)) => {
                chunks_written += 1; // one chunk of protected work
                if chunks_written == 100 {
                    break "finished";
                }
            }
        }
    };
    println!("{outcome} after {chunks_written} chunks");
    match guard.release().await {
        Ok(()) => println!("released"),
        Err(error) if error.is_lock_lost() => println!("release reports: {error}"),
        Err(error) => return Err(error.into()),
    }
    Ok(())
}

/// The server to use: `MONGODB_URI`, or a local MongoDB.
fn mongodb_uri() -> String {
    std::env::var("MONGODB_URI").unwrap_or_else(|_| "mongodb://localhost:27017".to_owned())
}
