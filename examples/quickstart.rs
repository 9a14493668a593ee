//! Acquire a lock, do some work while holding it, release it.
//!
//! Runs against `MONGODB_URI` (default `mongodb://localhost:27017`); `scripts/run-example quickstart`
//! starts an embedded test server when it is unset.
//!
//! Output (`…` stands for what changes from run to run; `scripts/run-examples` checks that
//! these lines come, in this order):
//!
//! ```text
//! acquired "nightly-report" with fencing token …
//! a second instance finds the lock busy
//! released
//! the other instance acquired it next, with token …
//! ```

mod common;

use std::process::ExitCode;
use std::time::Duration;

use distributed_lock_mongodb::{LockOptions, MongoDistributedLock};
use mongodb::Client;

#[tokio::main]
async fn main() -> ExitCode {
    common::run(run).await
}

async fn run(client: &Client) -> Result<(), Box<dyn std::error::Error>> {
    let database = client.database("quickstart");

    let options = LockOptions::builder()
        .expiry(Duration::from_secs(10)) // a crashed holder frees the lock after 10 s
        .build()?;
    let lock = MongoDistributedLock::new("nightly-report", &database).with_options(options);

    let guard = lock.acquire().await?;
    println!(
        "acquired {:?} with fencing token {}",
        guard.name(),
        guard.fencing_token()
    );

    // Another instance trying now is turned away (try_acquire makes a single attempt).
    let other_instance = lock.clone();
    match other_instance.try_acquire().await? {
        Some(_) => println!("unexpected: a second holder"),
        None => println!("a second instance finds the lock busy"),
    }

    // ... the work only one instance may do; the lease renews itself meanwhile ...
    tokio::time::sleep(Duration::from_millis(200)).await;

    guard.release().await?;
    println!("released");

    let next = other_instance
        .acquire_timeout(Duration::from_secs(5))
        .await?;
    println!(
        "the other instance acquired it next, with token {}",
        next.fencing_token()
    );
    next.release().await?;
    Ok(())
}
