//! The `metrics` feature: acquisitions by outcome, attempts, wait and hold times, losses by
//! reason and renewal commands, per kind of lock. One test: the recorder is process-wide.

use test_support as common;

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

/// The value of the gauge called `name` with `labels` (0 if never set).
fn gauge(entries: &Entries, name: &str, labels: &[(&str, &str)]) -> f64 {
    entries
        .iter()
        .filter(|(key, ..)| matches(key, MetricKind::Gauge, name, labels))
        .map(|(.., value)| match value {
            DebugValue::Gauge(value) => value.0,
            other => panic!("{name} is not a gauge: {other:?}"),
        })
        .sum()
}

/// Everything recorded so far. (The debugging recorder's snapshots reset what they read, even
/// gauges, whose increments then count from zero: each snapshot is added to the totals.)
fn snapshot(snapshots: &Snapshotter) -> Entries {
    static TOTALS: std::sync::Mutex<Vec<(CompositeKey, DebugValue)>> =
        std::sync::Mutex::new(Vec::new());
    let mut totals = TOTALS.lock().unwrap();
    for (key, _, _, value) in snapshots.snapshot().into_vec() {
        match totals.iter_mut().find(|(known, _)| *known == key) {
            None => totals.push((key, value)),
            Some((_, total)) => match (total, value) {
                (DebugValue::Counter(total), DebugValue::Counter(more)) => *total += more,
                (DebugValue::Gauge(total), DebugValue::Gauge(change)) => {
                    *total = (total.0 + change.0).into();
                }
                (DebugValue::Histogram(total), DebugValue::Histogram(more)) => total.extend(more),
                (total, value) => panic!("{key:?} changed kind: {total:?}, then {value:?}"),
            },
        }
    }
    totals
        .iter()
        .map(|(key, value)| {
            let value = match value {
                DebugValue::Counter(count) => DebugValue::Counter(*count),
                DebugValue::Gauge(gauge) => DebugValue::Gauge(*gauge),
                DebugValue::Histogram(values) => DebugValue::Histogram(values.clone()),
            };
            (key.clone(), None, None, value)
        })
        .collect()
}

const ACQUISITIONS: &str = "distributed_lock_acquisitions_total";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_reports_acquisitions_waits_holds_losses_and_renewals() {
    let recorder = DebuggingRecorder::new();
    let snapshots = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this binary");
    // Everything the crate logs, for the early-warning check (one subscriber for the process).
    let logs = common::Logs::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .init();

    let database = common::database().await;
    let locks = common::unique("metrics-locks");
    let provider = Provider::new(&database)
        .with_collection(locks.as_str())
        .with_reader_writer_collection(common::unique("metrics-rw").as_str())
        .with_semaphore_collection(common::unique("metrics-semaphores").as_str())
        .with_options(common::options(2_000, 200));

    // Exclusive: acquired and held for a while (renewed), then busy for another process, and
    // waited for by a caller: the gauges show one held and one waiting.
    let lock = provider.create_lock("exclusive");
    let guard = lock.acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(lock.try_acquire().await.unwrap().is_none(), "busy");
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.acquire().await.unwrap().release().await.unwrap() })
    };
    let waiting = common::eventually(Duration::from_secs(10), || async {
        gauge(
            &snapshot(&snapshots),
            "distributed_lock_waiting",
            &[("kind", "exclusive")],
        ) == 1.0
    })
    .await;
    assert!(waiting, "one caller waiting");
    let entries = snapshot(&snapshots);
    assert_eq!(
        gauge(&entries, "distributed_lock_held", &[("kind", "exclusive")]),
        1.0
    );
    guard.release().await.unwrap();
    waiter.await.unwrap();
    let entries = snapshot(&snapshots);
    assert_eq!(
        gauge(
            &entries,
            "distributed_lock_waiting",
            &[("kind", "exclusive")]
        ),
        0.0
    );
    assert_eq!(
        gauge(&entries, "distributed_lock_held", &[("kind", "exclusive")]),
        0.0
    );
    let left = histogram(
        &entries,
        "distributed_lock_lease_left_seconds",
        &[("kind", "exclusive")],
    );
    assert!(
        !left.is_empty() && left.iter().all(|&left| left > 0.0 && left <= 2.0),
        "lease left at each renewal, within the 2 s expiry: {left:?}"
    );
    // An early warning set at the whole expiry: every renewal is "late".
    let warned = Provider::new(&database)
        .with_collection(locks.as_str())
        .with_options(
            distributed_lock_mongodb::LockOptions::builder()
                .expiry(Duration::from_millis(2_000))
                .extension_cadence(Duration::from_millis(200))
                .renewal_warning(1.0)
                .build()
                .unwrap(),
        )
        .create_lock("warned")
        .acquire()
        .await
        .unwrap();
    let warning = common::eventually(Duration::from_secs(10), || async {
        logs.text()
            .contains("a renewal confirmed a lease with little of it left")
    })
    .await;
    assert!(warning, "{}", logs.text());
    assert!(logs.text().contains("lock=warned"), "{}", logs.text());
    warned.release().await.unwrap();

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
    let by_hand = Provider::new(&database)
        .with_collection(locks.as_str())
        .with_options(
            distributed_lock_mongodb::LockOptions::builder()
                .expiry(Duration::from_millis(500))
                .auto_renew(false)
                .build()
                .unwrap(),
        )
        .create_lock("by-hand")
        .acquire()
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), by_hand.lost().wait())
        .await
        .expect("expired");
    drop(by_hand);
    let kept = provider
        .create_semaphore("kept", 1)
        .acquire()
        .await
        .unwrap();
    provider.shutdown().await;
    assert!(kept.is_lost());
    drop((gone, kept));

    // A renewal that hangs is given up, counted as failed, and its lease renewed on another
    // connection; a lease whose renewals all hang is lost at its deadline. (Kill the
    // mutation-testing survivors "`RenewalLoop::give_up` does nothing" and
    // "`RenewalLoop::expire_overdue` does nothing": RELIABILITY.md, "Mutation testing".)
    let (proxy, client) = common::proxy::proxied_client().await;
    let proxied = Provider::new(&client.database(common::DATABASE))
        .with_collection(locks.as_str())
        .with_options(common::options(2_000, 500));
    let hung = proxied.create_lock("hung").acquire().await.unwrap();
    let hang = proxy.add_rule(
        common::proxy::Rule::new("findAndModify", common::proxy::Action::Hang).on(&locks),
    );
    let given_up = common::eventually(Duration::from_secs(10), || async {
        counter(
            &snapshot(&snapshots),
            "distributed_lock_renewal_commands_total",
            &[("kind", "exclusive"), ("outcome", "error")],
        ) >= 1
    })
    .await;
    assert!(
        given_up,
        "the hung renewal ({} hung) was given up",
        proxy.hits(hang)
    );
    // Renewed on other connections since: held for three more seconds (lease lifetime 1.78 s).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!hung.is_lost(), "renewed on another connection");
    hung.release().await.unwrap();
    let cut = proxied.create_lock("cut").acquire().await.unwrap();
    proxy.set(common::proxy::Fault::Blackhole);
    tokio::time::timeout(Duration::from_secs(10), cut.lost().wait())
        .await
        .expect("lost at its deadline");
    // The renewal loop reports why when it finds the deadline passed.
    let reported = common::eventually(Duration::from_secs(10), || async {
        counter(
            &snapshot(&snapshots),
            "distributed_lock_losses_total",
            &[("kind", "exclusive"), ("reason", "deadline")],
        ) == 1
    })
    .await;
    assert!(reported, "the loss at the deadline reported");
    proxy.set(common::proxy::Fault::Pass);
    drop(cut);

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
        8,
        "\"exclusive\" twice, \"warned\", \"gone\", \"capped\", \"by-hand\", \"hung\" and \"cut\""
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
            &[("kind", "exclusive"), ("reason", "deadline")]
        ),
        1,
        "the lease whose renewals all hung"
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
    assert_eq!(
        counter(
            &entries,
            losses,
            &[("kind", "exclusive"), ("reason", "expired")]
        ),
        1,
        "the lease nothing renewed"
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
