//! Scheduled jobs: at most one run per window across instances whose timers disagree.

use test_support as common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distributed_lock_mongodb::{Error, Job, JobRun, LockDetails, LockOptions, Provider};
use tokio::time::Instant;

/// An instance of a service: a client and provider of its own, with its name in its details.
async fn instance(collection: &str, number: usize) -> Provider {
    Provider::new(&common::database().await)
        .with_collection(collection)
        .with_options(common::options(2_000, 500))
        .with_details(LockDetails::new().with_owner(format!("instance-{number}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_whose_timers_are_seconds_apart_run_the_job_once_per_window() {
    const PERIOD: Duration = Duration::from_secs(4);
    const WINDOW: Duration = Duration::from_millis(2_500);
    const PERIODS: u32 = 3;
    // Each instance's timer fires this long after the period starts (clocks that disagree).
    const OFFSETS: [Duration; 3] = [
        Duration::ZERO,
        Duration::from_millis(500),
        Duration::from_millis(1_000),
    ];
    let collection = common::unique("jobs");
    let name = common::unique("report");
    let runs = Arc::new(Mutex::new(Vec::new()));
    let skips = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now() + Duration::from_millis(500);
    let mut instances = Vec::new();
    for (number, offset) in OFFSETS.into_iter().enumerate() {
        let job = instance(&collection, number)
            .await
            .create_job(name.as_str(), WINDOW);
        let (runs, skips) = (Arc::clone(&runs), Arc::clone(&skips));
        instances.push(tokio::spawn(async move {
            for period in 0..PERIODS {
                tokio::time::sleep_until(start + PERIOD * period + offset).await;
                let outcome = job
                    .run(async |_guard| {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    })
                    .await
                    .unwrap();
                match outcome {
                    JobRun::Ran(()) => runs.lock().unwrap().push((period, number)),
                    JobRun::Skipped(skipped) => {
                        skips.lock().unwrap().push((period, number, skipped))
                    }
                }
            }
        }));
    }
    for instance in instances {
        instance.await.unwrap();
    }
    let runs = runs.lock().unwrap().clone();
    for period in 0..PERIODS {
        let ran: Vec<_> = runs.iter().filter(|(p, _)| *p == period).collect();
        assert_eq!(ran.len(), 1, "period {period}: runs {runs:?}");
    }
    let skips = skips.lock().unwrap();
    assert_eq!(skips.len(), (PERIODS as usize) * (OFFSETS.len() - 1));
    for (period, number, skipped) in skips.iter() {
        let status = skipped
            .status
            .as_ref()
            .unwrap_or_else(|| panic!("period {period}, instance {number}: no status"));
        assert!(
            status
                .owner()
                .is_some_and(|owner| owner.starts_with("instance-")),
            "{status:?}"
        );
        assert!(status.expires_at.is_some(), "{status:?}");
    }
    println!(
        "job: {PERIODS} periods of {PERIOD:?}, 3 instances whose timers are up to 1 s apart, window {WINDOW:?}: runs {runs:?}, {} skips (e.g. {})",
        skips.len(),
        skips[0].2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skip_names_the_instance_running_the_job_and_one_that_ran_it() {
    let collection = common::unique("jobs");
    let name = common::unique("sync");
    let running = instance(&collection, 1)
        .await
        .create_job(name.as_str(), Duration::from_secs(30));
    let other = instance(&collection, 2)
        .await
        .create_job(name.as_str(), Duration::from_secs(30));
    let (started, mut started_rx) = tokio::sync::mpsc::channel(1);
    let (finish, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(async move {
        running
            .run(async |_guard| {
                started.send(()).await.unwrap();
                finish_rx.await.unwrap();
            })
            .await
    });
    started_rx.recv().await.unwrap();
    let JobRun::Skipped(skipped) = other.run(async |_guard| ()).await.unwrap() else {
        panic!("ran while another instance ran it");
    };
    let status = skipped.status.as_ref().unwrap();
    assert!(status.lock_id.is_some(), "running now: {status:?}");
    assert_eq!(status.owner(), Some("instance-1"));
    assert!(
        skipped.to_string().starts_with("running by instance-1"),
        "{skipped}"
    );
    finish.send(()).unwrap();
    assert!(run.await.unwrap().unwrap().ran());
    let JobRun::Skipped(skipped) = other.run(async |_guard| ()).await.unwrap() else {
        panic!("ran less than a window after the last run");
    };
    let status = skipped.status.as_ref().unwrap();
    assert_eq!(status.lock_id, None, "the run is over: {status:?}");
    assert!(
        skipped
            .to_string()
            .starts_with("ran by instance-1 less than a window ago"),
        "{skipped}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_longer_than_its_max_runtime_is_stopped_with_lock_lost() {
    let database = common::database().await;
    let provider = Provider::new(&database)
        .with_collection(common::unique("jobs"))
        .with_options(common::options(1_000, 250));
    let job = provider
        .create_job(common::unique("stuck"), Duration::from_millis(1_000))
        .max_runtime(Duration::from_millis(1_500));
    let began = Instant::now();
    let outcome = job
        .run(async |_guard| tokio::time::sleep(Duration::from_secs(60)).await)
        .await;
    assert!(
        matches!(outcome, Err(Error::LockLost { .. })),
        "{outcome:?}"
    );
    // A generous bound: only a hang (the 60 s work not stopped) fails it.
    assert!(
        began.elapsed() < Duration::from_secs(30),
        "{:?}",
        began.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_out_of_range_is_reported_before_anything_is_sent() {
    let (database, commands) = common::counting_database().await;
    let options = LockOptions::builder()
        .max_hold(Duration::from_secs(60))
        .build()
        .unwrap();
    let lock =
        distributed_lock_mongodb::MongoDistributedLock::new(common::unique("job"), &database)
            .with_options(options);
    for job in [
        Job::from_lock(lock.clone(), Duration::ZERO),
        // Longer than the lock's max_hold: a run stopped at max_hold would keep others out.
        Job::from_lock(lock.clone(), Duration::from_secs(120)),
        Job::from_lock(lock, Duration::from_secs(10)).max_runtime(Duration::from_secs(5)),
    ] {
        let error = job.run(async |_guard| ()).await.unwrap_err();
        assert!(
            matches!(&error, Error::InvalidOptions(message) if message.contains("min_hold") || message.contains("max_hold")),
            "{error}"
        );
    }
    assert!(commands.started().is_empty(), "{:?}", commands.started());
}
