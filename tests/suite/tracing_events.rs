//! The tracing spans and events the README lists, as a subscriber sees them: the `acquire` span
//! with its kind, lock, collection, outcome and fencing token; the `lock lost` warning with its
//! reason; the event of a long wait naming the holder; leader election's logs.
//!
//! Each test records what its own thread logs (`set_default`), on a current-thread runtime, so
//! the crate's background tasks log to it too and the tests do not see each other's events.

use test_support as common;

use std::time::Duration;

use common::Logs;
use distributed_lock_mongodb::{LeaderElection, MongoDistributedLock};
use mongodb::bson::doc;
use tracing::subscriber::DefaultGuard;
use tracing_subscriber::fmt::format::FmtSpan;

/// Records what this thread logs at `debug` and above, until the guard is dropped: one line per
/// event, and one per span as it closes (with the fields recorded on it).
fn record() -> (Logs, DefaultGuard) {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::DEBUG)
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(false)
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}

/// Waits (at most 20 s) until a line of `logs` contains every one of `parts`.
async fn wait_for(logs: &Logs, parts: &[&str]) -> String {
    for _ in 0..2_000 {
        if let Some(line) = logs.lines_with(parts).into_iter().next() {
            return line;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no line with {parts:?} in:\n{}", logs.text());
}

#[tokio::test]
async fn an_acquisition_is_a_span_with_its_kind_lock_collection_outcome_and_token() {
    let (logs, _recording) = record();
    let (lock, collection) = common::fresh_lock("traced", common::options(10_000, 1_000)).await;
    let guard = lock.acquire().await.unwrap();
    let token = guard.fencing_token().get().to_string();
    let other = MongoDistributedLock::new(lock.name(), &common::database().await)
        .with_collection(collection.name());
    assert!(other.try_acquire().await.unwrap().is_none());
    guard.release().await.unwrap();

    let name = format!("lock={}", lock.name());
    let in_collection = format!("collection={}", collection.name());
    let fencing_token = format!("fencing_token={token}");
    let won = logs.lines_with(&[
        "acquire{",
        "kind=\"exclusive\"",
        &name,
        &in_collection,
        "outcome=\"acquired\"",
        &fencing_token,
        "close",
    ]);
    assert_eq!(won.len(), 1, "{won:?}");
    let busy = logs.lines_with(&["acquire{", &name, "outcome=\"not acquired\"", "close"]);
    assert_eq!(busy.len(), 1, "{busy:?}");
    assert!(!busy[0].contains("fencing_token"), "{busy:?}");
}

#[tokio::test]
async fn a_loss_is_a_warning_that_names_the_lock_and_the_reason() {
    let (logs, _recording) = record();
    let (lock, collection) = common::fresh_lock("traced-loss", common::options(4_000, 200)).await;
    let guard = lock.acquire().await.unwrap();
    collection
        .delete_one(doc! { "_id": lock.name() })
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), guard.lost().wait())
        .await
        .expect("lost once the document is gone");
    let line = wait_for(
        &logs,
        &[
            "WARN",
            "lock lost",
            &format!("lock={}", lock.name()),
            "reason=\"the lease was no longer in the database (deleted, taken over or expired)\"",
        ],
    )
    .await;
    assert_eq!(logs.lines_with(&["lock lost"]), [line], "reported once");
}

/// A wait longer than 10 s (or than the lock's expiry) is reported once, naming the holder.
#[tokio::test]
async fn a_long_wait_says_once_what_holds_the_lock() {
    let (logs, _recording) = record();
    // An expiry under 10 s: the wait is reported after 10 s.
    let options = common::options(5_000, 500);
    let (lock, collection) = common::fresh_lock("traced-wait", options.clone()).await;
    let guard = lock.acquire().await.unwrap();
    let holder = guard.lock_id().to_owned();
    let waiter = MongoDistributedLock::new(lock.name(), &common::database().await)
        .with_collection(collection.name())
        .with_options(options);
    let waiting =
        tokio::spawn(async move { waiter.acquire_timeout(Duration::from_secs(60)).await });
    let line = wait_for(&logs, &["INFO", "still waiting for a lock", &holder]).await;
    assert!(line.contains(&format!("lock={}", lock.name())), "{line}");
    guard.release().await.unwrap();
    let next = waiting.await.unwrap().expect("acquired once released");
    next.release().await.unwrap();
    assert_eq!(logs.lines_with(&["still waiting for a lock"]).len(), 1);
}

#[tokio::test]
async fn leadership_is_logged_when_won_lost_and_resigned() {
    let (logs, _recording) = record();
    let (lock, collection) = common::fresh_lock("traced-leader", common::options(4_000, 200)).await;
    let name = format!("lock={}", lock.name());
    let election = LeaderElection::start(lock.clone()).unwrap();
    let mut leading = election.watch();
    tokio::time::timeout(Duration::from_secs(10), leading.wait_for(|leads| *leads))
        .await
        .expect("elected")
        .unwrap();
    let term = election.fencing_token().expect("a term").get();
    wait_for(
        &logs,
        &["INFO", "elected leader", &name, &format!("term={term}")],
    )
    .await;

    collection
        .delete_one(doc! { "_id": lock.name() })
        .await
        .unwrap();
    wait_for(
        &logs,
        &["WARN", "leadership lost; campaigning again", &name],
    )
    .await;
    tokio::time::timeout(Duration::from_secs(10), async {
        while logs.lines_with(&["elected leader"]).len() < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("elected again");

    election.resign().await.unwrap();
    wait_for(&logs, &["INFO", "resigned leadership", &name]).await;
}
