//! Stop working as soon as the lock is lost: `tokio::select!` on the guard's `lost` channel.
//!
//! To show the signal, an "operator" deletes the lock document while the work runs; the holder's
//! next renewal finds it gone and `lost` turns true.
//!
//! `scripts/run-example lost` (uses `MONGODB_URI` when set).
//!
//! Output (`…` stands for what changes from run to run; `scripts/run-examples` checks that
//! these lines come, in this order):
//!
//! ```text
//! operator: deleted the lock document
//! lock lost: stopped writing after … chunks
//! release reports: lock "file-writer" was lost before it was released
//! ```

mod common;

use std::process::ExitCode;
use std::time::Duration;

use distributed_lock_mongodb::{LockOptions, MongoDistributedLock};
use mongodb::Client;
use mongodb::bson::{Document, doc};

#[tokio::main]
async fn main() -> ExitCode {
    common::run(run).await
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
