//! At most three downloads at a time across every instance: a distributed semaphore.
//! `scripts/run-example semaphore` (uses `MONGODB_URI` when set).
//!
//! Output (`…` stands for what changes from run to run; `scripts/run-examples` checks that
//! these lines come, in this order):
//!
//! ```text
//! all downloads done, never more than 3 at once
//! ```

mod common;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use distributed_lock_mongodb::Provider;
use mongodb::Client;

#[tokio::main]
async fn main() -> ExitCode {
    common::run(run).await
}

async fn run(client: &Client) -> Result<(), Box<dyn std::error::Error>> {
    let provider = Provider::new(&client.database("semaphore_example"));
    let downloads = provider.create_semaphore("downloads", 3);

    let running = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (1..=8)
        .map(|file| {
            let (downloads, running) = (downloads.clone(), Arc::clone(&running));
            tokio::spawn(async move {
                let slot = downloads.acquire().await?;
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                println!("downloading file {file} ({now} running)");
                tokio::time::sleep(Duration::from_millis(100)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                slot.release().await
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    println!(
        "all downloads done, never more than {} at once",
        downloads.max_count()
    );
    Ok(())
}
