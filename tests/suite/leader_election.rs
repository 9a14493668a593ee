//! Leader election: one leader at a time, a successor after resigning, dropping, losing the
//! lease or shutting down; a cut-off leader steps down before its successor is elected.

use test_support as common;

use std::time::Duration;

use common::proxy::{self, Fault};
use distributed_lock_mongodb::{LeaderElection, LockOptions, Provider};
use mongodb::Database;
use mongodb::bson::{Document, doc};

const ELECTED_WITHIN: Duration = Duration::from_secs(10);

fn provider(database: &Database, collection: &str, options: LockOptions) -> Provider {
    Provider::new(database)
        .with_collection(collection)
        .with_options(options)
}

/// Waits until `election` leads.
async fn elected(election: &LeaderElection) {
    let mut leading = election.watch();
    tokio::time::timeout(ELECTED_WITHIN, leading.wait_for(|leader| *leader))
        .await
        .expect("elected in time")
        .unwrap();
}

fn leaders(elections: &[LeaderElection]) -> Vec<usize> {
    (0..elections.len())
        .filter(|&index| elections[index].is_leader())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_and_a_successor_at_once_after_resigning_or_dropping() {
    let database = common::database().await;
    let collection = common::unique("leaders");
    let name = common::unique("leader");
    // Leases of 30 s: a successor elected within seconds was let in by a release, not expiry.
    let mut elections: Vec<LeaderElection> = (0..3)
        .map(|_| {
            provider(&database, &collection, common::options(30_000, 10_000))
                .create_leader_election(name.as_str())
                .unwrap()
        })
        .collect();
    assert!(
        common::eventually(ELECTED_WITHIN, || async { leaders(&elections).len() == 1 }).await,
        "a leader was elected"
    );
    for _ in 0..100 {
        assert_eq!(leaders(&elections).len(), 1, "exactly one leader");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let first = leaders(&elections)[0];
    let first_term = elections[first].fencing_token().unwrap();
    assert_eq!(elections[first].name(), name);
    assert!(elections[first].lost().is_some_and(|lost| !lost.is_lost()));
    elections.remove(first).resign().await.unwrap();
    assert!(
        common::eventually(ELECTED_WITHIN, || async { leaders(&elections).len() == 1 }).await,
        "a successor was elected after the resignation"
    );
    let second = leaders(&elections)[0];
    let second_term = elections[second].fencing_token().unwrap();
    assert!(second_term > first_term, "terms' tokens increase");

    drop(elections.remove(second));
    assert!(
        common::eventually(ELECTED_WITHIN, || async { leaders(&elections).len() == 1 }).await,
        "a successor was elected after the leader was dropped"
    );
    assert!(elections[0].fencing_token().unwrap() > second_term);
    let watch = elections[0].watch();
    assert!(*watch.borrow());
    elections.remove(0).resign().await.unwrap();
    assert!(!*watch.borrow(), "the watch says it no longer leads");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_lease_is_lost_steps_down_and_campaigns_again() {
    let database = common::database().await;
    let collection = common::unique("leaders");
    let name = common::unique("leader");
    let election = provider(&database, &collection, common::options(4_000, 400))
        .create_leader_election(name.as_str())
        .unwrap();
    elected(&election).await;
    let first_term = election.fencing_token().unwrap();
    // The term's own signal: the watch channel may go from false back to true (a new term, the
    // lock being free) before a loaded test task looks, and show only the latest value.
    let term = election.lost().expect("leading");
    database
        .collection::<Document>(&collection)
        .delete_one(doc! { "_id": name.as_str() })
        .await
        .unwrap();
    tokio::time::timeout(ELECTED_WITHIN, term.wait())
        .await
        .expect("stepped down once the renewal found the lease gone");
    let new_term = common::eventually(ELECTED_WITHIN, || async {
        election
            .fencing_token()
            .is_some_and(|term| term > first_term)
    })
    .await;
    assert!(new_term, "elected again, for a new term");
    election.resign().await.unwrap();
}

/// A leader cut off from the server (its renewals hang) loses leadership by its own clock
/// before the successor, whose router sees the lease end, is elected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_leader_steps_down_before_its_successor_is_elected() {
    let (proxy, client) = proxy::proxied_client().await;
    let database = common::database().await;
    let collection = common::unique("leaders");
    let name = common::unique("leader");
    let options = common::options(2_000, 300);
    let cut_off = provider(
        &client.database(common::DATABASE),
        &collection,
        options.clone(),
    )
    .create_leader_election(name.as_str())
    .unwrap();
    elected(&cut_off).await;
    let successor = provider(&database, &collection, options)
        .create_leader_election(name.as_str())
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !successor.is_leader(),
        "one leader while the first one renews"
    );

    proxy.set(Fault::Blackhole);
    elected(&successor).await;
    assert!(
        !cut_off.is_leader(),
        "the cut-off leader stepped down before its successor was elected"
    );
    successor.resign().await.unwrap();
    drop(cut_off);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutting_down_the_provider_ends_the_term_and_the_campaign() {
    let database = common::database().await;
    let collection = common::unique("leaders");
    let name = common::unique("leader");
    let ours = provider(&database, &collection, common::options(30_000, 10_000));
    let election = ours.create_leader_election(name.as_str()).unwrap();
    elected(&election).await;
    let mut leading = election.watch();
    ours.shutdown().await;
    assert!(!election.is_leader());
    tokio::time::timeout(ELECTED_WITHIN, leading.wait_for(|leader| !*leader))
        .await
        .expect("the watch says it no longer leads")
        .unwrap();
    // The term was released: another instance is elected at once (leases last 30 s).
    let theirs = provider(&database, &collection, common::options(30_000, 10_000))
        .create_leader_election(name.as_str())
        .unwrap();
    elected(&theirs).await;
    election.resign().await.unwrap();
    theirs.resign().await.unwrap();
}

/// Resigning after the term ended by a loss, before a new one started, tells the caller that its
/// leadership had lapsed (`LockLost`), as documented; resigning without ever having led is fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resigning_after_a_lost_term_reports_the_loss() {
    let database = common::database().await;
    let collection = common::unique("leaders");
    let name = common::unique("leader");
    let provider = provider(&database, &collection, common::options(4_000, 400));
    let election = provider.create_leader_election(name.as_str()).unwrap();
    elected(&election).await;
    // Another instance takes the lock over once the lease is gone: no new term can start here.
    let mut leading = election.watch();
    let locks = database.collection::<Document>(&collection);
    locks
        .delete_one(doc! { "_id": name.as_str() })
        .await
        .unwrap();
    let other = Provider::new(&common::database().await)
        .with_collection(collection.as_str())
        .create_lock(name.as_str());
    let taken = other.acquire_timeout(Duration::from_secs(5)).await.unwrap();
    tokio::time::timeout(ELECTED_WITHIN, leading.wait_for(|leader| !*leader))
        .await
        .expect("stepped down once the renewal found the lease gone")
        .unwrap();
    let resigned = election.resign().await;
    assert!(
        matches!(
            resigned,
            Err(distributed_lock_mongodb::Error::LockLost { .. })
        ),
        "{resigned:?}"
    );
    // An instance that never led resigns cleanly.
    let never = provider.create_leader_election(name.as_str()).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!never.is_leader());
    never.resign().await.unwrap();
    taken.release().await.unwrap();
}
