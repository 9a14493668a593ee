//! Many readers of a shared configuration at once, one writer at a time, and writers are not
//! starved by a steady stream of readers: a distributed reader-writer lock. Then an upgradeable
//! reader that writes only when what it read says so, with nobody writing in between.
//! `scripts/run-example reader_writer` (uses `MONGODB_URI` when set).
//!
//! Output (`…` stands for what changes from run to run; `scripts/run-examples` checks that
//! these lines come, in this order):
//!
//! ```text
//! config-service holds feature-flags to read (host …, pid …)
//! writer got in after … ms with fencing token …; holders now: write
//! reader 1 read … times
//! refresher upgraded to the writer with fencing token … (the last writer's was …)
//! ```

mod common;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use distributed_lock_mongodb::{LockDetails, Provider};
use mongodb::Client;
use tokio::time::Instant;

#[tokio::main]
async fn main() -> ExitCode {
    common::run(run).await
}

async fn run(client: &Client) -> Result<(), Box<dyn std::error::Error>> {
    let provider = Provider::new(&client.database("reader_writer_example"))
        .with_details(LockDetails::new().with_owner("config-service"));
    let config = provider.create_reader_writer_lock("feature-flags");

    // Four readers keep reading the configuration, each holding the read lock for 100 ms.
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (1..=4)
        .map(|reader| {
            let (config, stop) = (config.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(25 * reader)).await;
                let mut reads = 0;
                while !stop.load(Ordering::SeqCst) {
                    let guard = config.acquire_read().await?;
                    reads += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    guard.release().await?;
                }
                Ok::<_, distributed_lock_mongodb::Error>(reads)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;

    for holder in provider.held_locks().await? {
        let pid = holder.pid().map_or("?".to_owned(), |pid| pid.to_string());
        println!(
            "{} holds {} to {} (host {}, pid {pid})",
            holder.owner().unwrap_or("?"),
            holder.name,
            holder.kind,
            holder.host().unwrap_or("?"),
        );
    }

    // The writer announces itself, so new readers wait while the current ones finish.
    let started = Instant::now();
    let writer = config.acquire_write().await?;
    let holders: Vec<String> = config
        .holders()
        .await?
        .iter()
        .map(|h| h.kind.to_string())
        .collect();
    println!(
        "writer got in after {} ms with fencing token {}; holders now: {}",
        started.elapsed().as_millis(),
        writer.fencing_token(),
        holders.join(", "),
    );
    tokio::time::sleep(Duration::from_millis(100)).await; // write the new configuration
    let last_token = writer.fencing_token();
    writer.release().await?;

    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::SeqCst);
    for (reader, task) in readers.into_iter().enumerate() {
        println!("reader {} read {} times", reader + 1, task.await??);
    }

    // A refresher reads beside any readers and writes only when it must. Its read is
    // upgradeable: no writer gets in while it holds it, so nothing changes between its read and
    // its write.
    let mut refresher = config.acquire_upgradeable_read().await?;
    let stale = true; // what it read says a refresh is due
    if stale {
        refresher.upgrade().await?; // once no plain reader holds the lock
        let token = refresher.fencing_token().expect("upgraded");
        println!(
            "refresher upgraded to the writer with fencing token {token} (the last writer's was {last_token})"
        );
        refresher.downgrade().await?; // reading again; readers may come back
    }
    refresher.release().await?;
    Ok(())
}
