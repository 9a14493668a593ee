//! Dependency-injection style: configure a `Provider` once, hand it to the parts of the
//! application, and create per-entity locks by name.
//!
//! `scripts/run-example provider` (uses `MONGODB_URI` when set).
//!
//! Output (`…` stands for what changes from run to run; `scripts/run-examples` checks that
//! these lines come, in this order):
//!
//! ```text
//! all orders processed
//! ```

mod common;

use std::process::ExitCode;
use std::time::Duration;

use distributed_lock_mongodb::{LockOptions, Provider};
use mongodb::Client;

/// What a web handler or job runner would get injected.
#[derive(Clone)]
struct AppState {
    locks: Provider,
}

async fn process_order(
    state: &AppState,
    worker: usize,
    order_id: u32,
) -> distributed_lock_mongodb::Result<()> {
    let lock = state.locks.create_lock(format!("order-{order_id}"));
    let guard = lock.acquire_timeout(Duration::from_secs(10)).await?;
    println!(
        "worker {worker} processes order {order_id} (token {})",
        guard.fencing_token()
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    guard.release().await
}

#[tokio::main]
async fn main() -> ExitCode {
    common::run(run).await
}

async fn run(client: &Client) -> Result<(), Box<dyn std::error::Error>> {
    let options = LockOptions::builder()
        .expiry(Duration::from_secs(15))
        .adaptive_backoff(true)
        .build()?;
    let state = AppState {
        locks: Provider::new(&client.database("shop"))
            .with_collection("order_locks")
            .with_options(options),
    };

    // Four workers race over three orders; each order is processed by one worker at a time.
    let workers: Vec<_> = (0..4)
        .map(|worker| {
            let state = state.clone();
            tokio::spawn(async move {
                for order_id in [1, 2, 3] {
                    process_order(&state, worker, order_id).await?;
                }
                Ok::<_, distributed_lock_mongodb::Error>(())
            })
        })
        .collect();
    for worker in workers {
        worker.await??;
    }
    println!("all orders processed");
    Ok(())
}
