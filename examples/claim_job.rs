//! Claim a job document, process it, mark it done — with the lock embedded in the job itself.
//!
//! Workers lock any pending job nobody holds (one `findAndModify`), work on it while the lease
//! renews itself, then write the result and unlock it in one update that only the holder can
//! make. `scripts/run-example claim_job` (uses `MONGODB_URI` when set).
//!
//! Output (`…` stands for what changes from run to run; `scripts/run-examples` checks that
//! these lines come, in this order):
//!
//! ```text
//! 6 jobs done, each exactly once
//! ```

mod common;

use std::process::ExitCode;
use std::time::Duration;

use distributed_lock_mongodb::{DocumentLock, Error};
use mongodb::Client;
use mongodb::bson::doc;
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct Job {
    #[serde(rename = "_id")]
    id: u32,
    status: String,
    input: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<u64>,
}

#[tokio::main]
async fn main() -> ExitCode {
    common::run(run).await
}

async fn run(client: &Client) -> Result<(), Box<dyn std::error::Error>> {
    let jobs = client
        .database("claim_job_example")
        .collection::<Job>("jobs");
    jobs.drop().await?;
    jobs.insert_many((1..=6).map(|id| Job {
        id,
        status: "pending".into(),
        input: u64::from(id) * 10,
        output: None,
    }))
    .await?;

    let locks = DocumentLock::new(&jobs);
    let workers: Vec<_> = (1..=3)
        .map(|worker| {
            let locks = locks.clone();
            tokio::spawn(async move {
                loop {
                    let job = match locks.try_lock(doc! { "status": "pending" }).await {
                        Ok(Some(job)) => job,
                        Ok(None) => {
                            // Pending jobs exist but are all claimed right now.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            continue;
                        }
                        Err(Error::DocumentNotFound { .. }) => return Ok::<_, Error>(()),
                        Err(error) => return Err(error),
                    };
                    let output = job.document().input * 2; // the work
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    println!(
                        "worker {worker} finished job {} (token {})",
                        job.document().id,
                        job.fencing_token()
                    );
                    job.commit(doc! { "$set": { "status": "done", "output": output as i64 } })
                        .await?;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await??;
    }
    let done = jobs.count_documents(doc! { "status": "done" }).await?;
    println!("{done} jobs done, each exactly once");
    Ok(())
}
