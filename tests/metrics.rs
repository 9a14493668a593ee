//! The `metrics` feature: acquisitions by outcome, attempts, wait and hold times, losses by
//! reason and renewal commands, per kind of lock. One test: the recorder is process-wide.

mod common;

use std::time::Duration;

use distributed_lock_mongodb::Provider;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::{CompositeKey, MetricKind};
use mongodb::bson::{Document, doc};

type Entries = Vec<(
    CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
)>;

fn matches(key: &CompositeKey, kind: MetricKind, name: &str, labels: &[(&str, &str)]) -> bool {
    key.kind() == kind
        && key.key().name() == name
        && labels.iter().all(|(label, value)| {
            key.key()
                .labels()
                .any(|found| found.key() == *label && found.value() == *value)
        })
}

/// The sum of the counters called `name` with `labels` (among others).
fn counter(entries: &Entries, name: &str, labels: &[(&str, &str)]) -> u64 {
    entries
        .iter()
        .filter(|(key, ..)| matches(key, MetricKind::Counter, name, labels))
        .map(|(.., value)| match value {
            DebugValue::Counter(count) => *count,
            other => panic!("{name} is not a counter: {other:?}"),
        })
        .sum()
}

/// The values recorded in the histograms called `name` with `labels`.
fn histogram(entries: &Entries, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    entries
        .iter()
        .filter(|(key, ..)| matches(key, MetricKind::Histogram, name, labels))
        .flat_map(|(.., value)| match value {
            DebugValue::Histogram(values) => values.iter().map(|value| value.0).collect::<Vec<_>>(),
            other => panic!("{name} is not a histogram: {other:?}"),
        })
        .collect()
}

fn snapshot(snapshots: &Snapshotter) -> Entries {
    snapshots.snapshot().into_vec()
}

const ACQUISITIONS: &str = "distributed_lock_acquisitions_total";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_reports_acquisitions_waits_holds_losses_and_renewals() {
    let recorder = DebuggingRecorder::new();
    let snapshots = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this binary");

    let database = common::database().await;
    let locks = common::unique("metrics-locks");
    let provider = Provider::new(&database)
        .with_collection(locks.as_str())
        .with_reader_writer_collection(common::unique("metrics-rw").as_str())
        .with_semaphore_collection(common::unique("metrics-semaphores").as_str())
        .with_options(common::options(2_000, 200));

    // Exclusive: acquired and held for a while (renewed), then busy for another process.
    let lock = provider.create_lock("exclusive");
    let guard = lock.acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(lock.try_acquire().await.unwrap().is_none(), "busy");
    guard.release().await.unwrap();

    // One acquisition and release of every other kind.
    let read = provider
        .create_reader_writer_lock("rw")
        .acquire_read()
        .await
        .unwrap();
    read.release().await.unwrap();
    let write = provider
        .create_reader_writer_lock("rw")
        .acquire_write()
        .await
        .unwrap();
    write.release().await.unwrap();
    let place = provider
        .create_semaphore("places", 2)
        .acquire()
        .await
        .unwrap();
    place.release().await.unwrap();
    let jobs = database.collection::<Document>(&common::unique("metrics-jobs"));
    jobs.insert_one(doc! { "_id": "job" }).await.unwrap();
    let job = provider
        .create_document_lock(&jobs)
        .lock(doc! { "_id": "job" })
        .await
        .unwrap();
    job.release().await.unwrap();

    // A loss noticed by the renewal (the document deleted) and one by shutdown.
    let gone = provider.create_lock("gone").acquire().await.unwrap();
    database
        .collection::<Document>(&locks)
        .delete_one(doc! { "_id": "gone" })
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), gone.lost().wait())
        .await
        .expect("lost within the bound");
    let capped = Provider::new(&database)
        .with_collection(locks.as_str())
        .with_options(
            distributed_lock_mongodb::LockOptions::builder()
                .expiry(Duration::from_millis(1_000))
                .extension_cadence(Duration::from_millis(200))
                .max_hold(Duration::from_millis(1_000))
                .build()
                .unwrap(),
        )
        .create_lock("capped")
        .acquire()
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), capped.lost().wait())
        .await
        .expect("lost at max_hold");
    drop(capped);
    let kept = provider
        .create_semaphore("kept", 1)
        .acquire()
        .await
        .unwrap();
    provider.shutdown().await;
    assert!(kept.is_lost());
    drop((gone, kept));

    let entries = snapshot(&snapshots);
    for kind in ["exclusive", "read", "write", "semaphore", "document"] {
        assert!(
            counter(
                &entries,
                ACQUISITIONS,
                &[("kind", kind), ("outcome", "acquired")]
            ) >= 1,
            "{kind} acquisitions counted"
        );
        assert!(
            counter(
                &entries,
                "distributed_lock_attempts_total",
                &[("kind", kind)]
            ) >= 1,
            "{kind} attempts counted"
        );
        assert!(
            !histogram(&entries, "distributed_lock_hold_seconds", &[("kind", kind)]).is_empty(),
            "{kind} hold time recorded"
        );
        assert!(
            !histogram(&entries, "distributed_lock_wait_seconds", &[("kind", kind)]).is_empty(),
            "{kind} wait time recorded"
        );
    }
    assert_eq!(
        counter(
            &entries,
            ACQUISITIONS,
            &[("kind", "exclusive"), ("outcome", "acquired")]
        ),
        3,
        "\"exclusive\", \"gone\" and \"capped\""
    );
    assert_eq!(
        counter(
            &entries,
            ACQUISITIONS,
            &[("kind", "exclusive"), ("outcome", "not_acquired")]
        ),
        1,
        "the try while it was held"
    );
    let holds = histogram(
        &entries,
        "distributed_lock_hold_seconds",
        &[("kind", "exclusive")],
    );
    assert!(
        holds.iter().any(|&held| held >= 0.7),
        "the 700 ms hold: {holds:?}"
    );
    let losses = "distributed_lock_losses_total";
    assert_eq!(
        counter(
            &entries,
            losses,
            &[("kind", "exclusive"), ("reason", "gone")]
        ),
        1
    );
    assert_eq!(
        counter(
            &entries,
            losses,
            &[("kind", "semaphore"), ("reason", "shutdown")]
        ),
        1
    );
    assert_eq!(
        counter(
            &entries,
            losses,
            &[("kind", "exclusive"), ("reason", "max_hold")]
        ),
        1
    );
    assert!(
        counter(
            &entries,
            "distributed_lock_renewal_commands_total",
            &[("kind", "exclusive"), ("outcome", "ok")]
        ) >= 1,
        "renewals counted (every 200 ms while held: counts depend on scheduling)"
    );
    assert!(
        !histogram(
            &entries,
            "distributed_lock_renewal_seconds",
            &[("kind", "exclusive")]
        )
        .is_empty()
    );
}
