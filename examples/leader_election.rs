//! One instance of a service runs a scheduled job; another takes over when it stops or dies.
//!
//! Every instance campaigns for leadership of "report-scheduler". The leader runs the job every
//! second, stops as soon as its term ends, and tags each run with the term's fencing token. On
//! Ctrl-C an instance shuts its provider down, which releases leadership at once; an
//! instance killed outright (`kill -9`) loses it when its lease expires (5 s here), and a
//! follower is elected then.
//!
//! `scripts/run-example leader_election [instance-name] [seconds]` runs one instance (for 20 s by
//! default), each run against a private embedded server. To watch a failover, both instances
//! need one server: run `scripts/test-server` (it prints `export MONGODB_URI=...` and keeps an
//! embedded server until Ctrl-C) or start a MongoDB; then, in two terminals with that
//! `MONGODB_URI` exported, run `scripts/run-example leader_election instance-1 60` and
//! `... instance-2 60`, and stop the one that leads.
//!
//! Output (`…` stands for what changes from run to run; `scripts/run-examples` checks that
//! these lines come, in this order):
//!
//! ```text
//! instance-1: elected (term …)
//! instance-1: running the scheduled job (term …)
//! instance-1: done
//! ```

mod common;

use std::process::ExitCode;
use std::time::Duration;

use distributed_lock_mongodb::{LockOptions, Provider};
use mongodb::Client;

#[tokio::main]
async fn main() -> ExitCode {
    common::exit(instance().await)
}

/// One instance of the service, until it stops.
async fn instance() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let instance = args.next().unwrap_or_else(|| "instance-1".to_owned());
    let seconds: u64 = args.next().map_or(Ok(20), |s| s.parse())?;

    let client = Client::with_uri_str(common::mongodb_uri()).await?;
    let options = LockOptions::builder()
        .expiry(Duration::from_secs(5))
        .build()?;
    let provider = Provider::new(&client.database("leader_example")).with_options(options);
    let election = provider.create_leader_election("report-scheduler")?;
    let mut leading = election.watch();

    let service = async {
        loop {
            // Wait to be elected, then run the job every second while leading.
            if leading.wait_for(|leader| *leader).await.is_err() {
                return; // the campaign has ended
            }
            let (Some(term), Some(lost)) = (election.fencing_token(), election.lost()) else {
                continue; // the term ended in the meantime
            };
            println!("{instance}: elected (term {term})");
            let work = async {
                loop {
                    println!("{instance}: running the scheduled job (term {term})");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            };
            tokio::select! {
                () = work => {}
                () = lost.wait() => println!("{instance}: no longer the leader"),
            }
        }
    };

    tokio::select! {
        () = service => {}
        _ = tokio::signal::ctrl_c() => println!("{instance}: stopping"),
        () = tokio::time::sleep(Duration::from_secs(seconds)) => println!("{instance}: done"),
    }
    // Releases leadership (and anything else the provider holds) so a follower takes over now,
    // then ends the driver's work while the runtime still runs.
    provider.shutdown().await;
    drop((election, provider));
    client.shutdown().await;
    Ok(())
}
