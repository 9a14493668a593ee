//! A job that runs at most once per window across every instance of a service, fired by each
//! instance's own scheduler. Here that is a timer on the wall clock (the `every` function below);
//! in an application it is whatever already fires its periodic work (a cron crate such as
//! [tokio-cron-scheduler](https://docs.rs/tokio-cron-scheduler), a Kubernetes CronJob starting
//! every replica): the job needs only to be called, at any time, from every instance.
//!
//! Two instances run here side by side, each with its own client and timer; their timers
//! disagree by a second (one fires at seconds 0, 5, 10…, the other at 1, 6, 11…), as the clocks
//! of two machines may. Each firing calls `Job::run`: in every 5-second period the first to fire
//! runs the report, and the other, a second later, finds the lock taken for the rest of the
//! window (4 s, by the server's clock) and skips it, saying who ran it.
//!
//! `scripts/run-example scheduled_job [seconds]` (16 by default).
//!
//! Output (`…` stands for what changes from run to run; `scripts/run-examples` checks that
//! these lines come, in this order):
//!
//! ```text
//! instance-…: ran the report (…)
//! instance-…: skipped, ran by instance-… less than a window ago; due again after … (server time)
//! ```

mod common;

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distributed_lock_mongodb::{JobRun, LockDetails, Provider};
use mongodb::Client;

/// Every 5 s of the wall clock (as cron's `*/5 * * * * *`).
const PERIOD: Duration = Duration::from_secs(5);
/// Where in the period each instance fires: the second one's clock is a second behind.
const OFFSETS: [Duration; 2] = [Duration::ZERO, Duration::from_secs(1)];
/// Shorter than the period, so the next period's first firing finds it over.
const WINDOW: Duration = Duration::from_secs(4);

#[tokio::main]
async fn main() -> ExitCode {
    common::exit(instances().await)
}

/// Three instances of the service, for the given number of seconds.
async fn instances() -> Result<(), Box<dyn std::error::Error>> {
    let seconds: u64 = std::env::args().nth(1).map_or(Ok(16), |s| s.parse())?;
    let mut timers = Vec::new();
    let mut providers = Vec::new();
    let mut clients = Vec::new();
    for (number, offset) in OFFSETS.into_iter().enumerate() {
        let instance = format!("instance-{}", number + 1);
        let client = Client::with_uri_str(common::mongodb_uri()).await?;
        let provider = Provider::new(&client.database("job_example"))
            .with_details(LockDetails::new().with_owner(instance.as_str()));
        let report = provider.create_job("five-second-report", WINDOW);
        timers.push(tokio::spawn(every(PERIOD, offset, move || {
            let (report, instance) = (report.clone(), instance.clone());
            async move {
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
            }
        })));
        providers.push(provider);
        clients.push(client);
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    for timer in timers {
        timer.abort();
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

/// Calls `fire` at `offset` into every `period` of the wall clock, as a cron scheduler does; a
/// firing that outlasts its period delays the next one (`offset` is less than `period`).
async fn every<F, Fut>(period: Duration, offset: Duration, mut fire: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let (period, offset) = (period.as_nanos(), offset.as_nanos());
    loop {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let wait = (period + offset - now % period) % period;
        tokio::time::sleep(Duration::from_nanos(wait as u64)).await;
        fire().await;
        // Step past the instant just fired at (the timer's and the wall clock's ticks differ), so
        // that the next wait is not zero.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
