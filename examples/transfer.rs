//! Hold several locks at once: a transfer between two accounts locks both, in a deadlock-free
//! order, all or nothing; then the lock table is inspected and expired documents purged.
//! `scripts/run-example transfer` (uses `MONGODB_URI` when set).
//!
//! Output (`…` stands for what changes from run to run; `scripts/run-examples` checks that
//! these lines come, in this order):
//!
//! ```text
//! transfer acct-… → acct-… holds acct-A and acct-B
//! held: acct-A (token …, … ms left)
//! held: acct-C (token …, … ms left)
//! purged … expired lock documents
//! ```

mod common;

use std::process::ExitCode;
use std::time::Duration;

use distributed_lock_mongodb::Provider;
use mongodb::Client;

#[tokio::main]
async fn main() -> ExitCode {
    common::run(run).await
}

async fn run(client: &Client) -> Result<(), Box<dyn std::error::Error>> {
    let locks =
        Provider::new(&client.database("transfer_example")).with_collection("account_locks");

    // Two transfers in opposite directions at once: sorted acquisition means no deadlock.
    let one = {
        let locks = locks.clone();
        tokio::spawn(async move { transfer(&locks, "acct-A", "acct-B").await })
    };
    let two = {
        let locks = locks.clone();
        tokio::spawn(async move { transfer(&locks, "acct-B", "acct-A").await })
    };
    one.await??;
    two.await??;

    let guard = locks
        .acquire_all(&["acct-A", "acct-C"], Duration::from_secs(5))
        .await?;
    for status in locks.held_locks().await? {
        let token = status
            .fencing_token
            .map_or("none".to_owned(), |t| t.to_string());
        let left = status
            .remaining
            .map_or("?".to_owned(), |left| format!("{} ms", left.as_millis()));
        println!("held: {} (token {token}, {left} left)", status.name);
    }
    guard.release().await?;
    println!(
        "purged {} expired lock documents",
        locks.purge_expired().await?
    );
    Ok(())
}

async fn transfer(locks: &Provider, from: &str, to: &str) -> distributed_lock_mongodb::Result<()> {
    let both = locks
        .acquire_all(&[from, to], Duration::from_secs(10))
        .await?;
    println!(
        "transfer {from} → {to} holds {}",
        both.names().collect::<Vec<_>>().join(" and ")
    );
    tokio::time::sleep(Duration::from_millis(50)).await; // debit and credit here
    both.release().await
}
