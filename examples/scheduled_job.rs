//! A job that runs at most once per window across every instance of a service, fired by each
//! instance's own cron scheduler ([tokio-cron-scheduler](https://docs.rs/tokio-cron-scheduler)).
//!
//! Two instances run here side by side, each with its own client and scheduler; their timers
//! disagree by a second (one fires at seconds 0, 5, 10…, the other at 1, 6, 11…), as the clocks
//! of two machines may. Each firing calls `Job::run`: in every 5-second period the first to fire
//! runs the report, and the other, a second later, finds the lock taken for the rest of the
//! window (4 s, by the server's clock) and skips it, saying who ran it.
//!
//! `scripts/run-example scheduled_job [seconds]` (16 by default).

use std::time::Duration;

use distributed_lock_mongodb::{JobRun, LockDetails, Provider};
use mongodb::Client;
use tokio_cron_scheduler::{Job as CronJob, JobScheduler};

/// Every 5 s from second 0; the other instance's clock is a second behind.
const SCHEDULES: [&str; 2] = ["0/5 * * * * *", "1/5 * * * * *"];
/// Shorter than the period, so the next period's first firing finds it over.
const WINDOW: Duration = Duration::from_secs(4);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seconds: u64 = std::env::args().nth(1).map_or(Ok(16), |s| s.parse())?;
    let mut schedulers = Vec::new();
    let mut providers = Vec::new();
    let mut clients = Vec::new();
    for (number, schedule) in SCHEDULES.into_iter().enumerate() {
        let instance = format!("instance-{}", number + 1);
        let client = Client::with_uri_str(mongodb_uri()).await?;
        let provider = Provider::new(&client.database("job_example"))
            .with_details(LockDetails::new().with_owner(instance.as_str()));
        let report = provider.create_job("five-second-report", WINDOW);
        let scheduler = JobScheduler::new().await?;
        scheduler
            .add(CronJob::new_async(schedule, move |_id, _scheduler| {
                let (report, instance) = (report.clone(), instance.clone());
                Box::pin(async move {
                    let outcome = report
                        .run(async |guard| {
                            // The protected work; fence its writes with this token.
                            guard.fencing_token()
                        })
                        .await;
                    match outcome {
                        Ok(JobRun::Ran(token)) => println!("{instance}: ran the report ({token})"),
                        Ok(JobRun::Skipped(skipped)) => println!("{instance}: skipped, {skipped}"),
                        Err(error) => eprintln!("{instance}: the report failed: {error}"),
                    }
                })
            })?)
            .await?;
        scheduler.start().await?;
        schedulers.push(scheduler);
        providers.push(provider);
        clients.push(client);
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    for mut scheduler in schedulers {
        scheduler.shutdown().await?;
    }
    for provider in providers {
        provider.shutdown().await;
    }
    // End the drivers' work while the runtime still runs.
    for client in clients {
        client.shutdown().await;
    }
    Ok(())
}

fn mongodb_uri() -> String {
    std::env::var("MONGODB_URI").unwrap_or_else(|_| "mongodb://localhost:27017".to_owned())
}
