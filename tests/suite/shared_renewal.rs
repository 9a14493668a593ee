//! One renewal loop per provider and runtime: holding many locks costs two commands per cadence
//! (one lease renewed alone by a findAndModify that reads the server's clock, the others by one
//! update), and losses are still detected lock by lock.

use test_support as common;

use std::time::Duration;

use futures::StreamExt;

use distributed_lock_mongodb::Provider;
use mongodb::bson::{Document, doc};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_held_locks_cost_two_renewal_commands_per_cadence() {
    const LOCKS: usize = 1_000;
    // Warnings (a lease lost, with its reason; a late renewal) go to the test's output, shown if
    // it fails.
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_test_writer()
        .try_init();
    // A thousand locks get a server of their own, away from this file's other tests.
    let server = common::server::isolated();
    let (database, commands) = common::counting_database_on(&server.uri, |_| {}).await;
    let collection = common::unique("locks");
    let provider = Provider::new(&database)
        .with_collection(collection.as_str())
        // A slow cadence and a long lease: the embedded server needs seconds for one update
        // over a thousand documents (a real server takes milliseconds), over 8 s on a loaded
        // machine, where the thousand acquisitions also take more than a cadence, so a round
        // may renew several hundred leases while they go on. A 60 s lease leaves a round 38 s
        // (expiry − margin − skew − cadence) before its leases count as lost.
        .with_options(common::options(60_000, 20_000));
    // Eight at a time, and so the releases: the server works one command at a time, but the
    // rest of each round trip overlaps (the test took 38 s instead of 53 s on an idle machine).
    let guards: Vec<_> = futures::stream::iter(0..LOCKS)
        .map(|i| {
            let lock = provider.create_lock(format!("entity-{i}"));
            async move { lock.acquire().await.unwrap() }
        })
        .buffered(8)
        .collect()
        .await;

    let control = common::database_on(&server.uri)
        .await
        .collection::<Document>(&collection);
    let (_, acquired_until) = common::server_now_and_expiry(&control, "entity-0").await;
    commands.clear();
    let window = Duration::from_secs(25);
    tokio::time::sleep(window).await;
    let (updates, singles) = (commands.count("update"), commands.count("findAndModify"));
    let others: Vec<String> = commands
        .started()
        .into_iter()
        .filter(|c| c != "update" && c != "findAndModify")
        .collect();
    println!(
        "holding {LOCKS} locks for {window:?} at a 20 s cadence: {updates} updates and {singles} \
         findAndModify renewal commands"
    );
    // 25 s at a 20 s cadence: one round (two if the window straddles another), two commands
    // each; one lease per command would be thousands.
    assert!((1..=2).contains(&updates), "{updates} updates");
    assert!((1..=2).contains(&singles), "{singles} single renewals");
    assert!(others.is_empty(), "only renewals while holding: {others:?}");
    assert!(guards.iter().all(|guard| !guard.is_lost()));

    let (now, expires_at) = common::server_now_and_expiry(&control, "entity-0").await;
    assert!(expires_at.unwrap() > now, "the first lock's lease is live");
    assert!(expires_at > acquired_until, "and was renewed");
    futures::stream::iter(guards)
        .for_each_concurrent(8, |guard| {
            let control = &control;
            async move {
                let name = guard.name().to_owned();
                let lost_before = guard.is_lost();
                if let Err(error) = guard.release().await {
                    // Seen in CI beside a CPU hog (entity-0, right after the checks above), and
                    // again on 2026-11-28 with the model checker running beside this test: lost
                    // before the release, "no renewal was confirmed before the lease's deadline"
                    // (the starved embedded server took some 50 s to answer one round of the
                    // thousand leases; their 60 s leases leave a round 38 s). Which is why the
                    // model checker does not run beside this test (scripts/run-test-binaries).
                    // Say what the server stored and whether the guard was lost before its
                    // release, for the next look (the "lock lost" warning above it names the
                    // reason).
                    let stored = control.find_one(doc! { "_id": &name }).await;
                    let (now, _) = common::server_now_and_expiry(control, &name).await;
                    panic!(
                        "releasing {name}: {error} (lost before the release: {lost_before}); \
                         stored at {now:?}: {stored:?}"
                    );
                }
            }
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_lock_whose_document_vanished_is_lost() {
    let database = common::database().await;
    let collection = common::unique("locks");
    let provider = Provider::new(&database)
        .with_collection(collection.as_str())
        .with_options(common::options(3_000, 300));
    let kept = provider.create_lock("kept").acquire().await.unwrap();
    let doomed = provider.create_lock("doomed").acquire().await.unwrap();
    let also_kept = provider.create_lock("also-kept").acquire().await.unwrap();
    database
        .collection::<Document>(&collection)
        .delete_one(doc! { "_id": "doomed" })
        .await
        .unwrap();
    let lost = doomed.lost();
    tokio::time::timeout(Duration::from_secs(2), lost.wait())
        .await
        .expect("the deleted lock is lost within a cadence or two");
    tokio::time::sleep(Duration::from_millis(700)).await; // two more renewals
    assert!(!kept.is_lost() && !also_kept.is_lost());
    assert!(doomed.release().await.unwrap_err().is_lock_lost());
    kept.release().await.unwrap();
    also_kept.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_of_huge_names_are_split_into_commands_of_bounded_size() {
    const MIB: usize = 1 << 20;
    let (database, commands) = common::counting_database().await;
    let provider = Provider::new(&database)
        .with_collection(common::unique("locks").as_str())
        .with_options(common::options(10_000, 1_000));
    // Three names of the longest allowed length: 3 MiB of ids in one renewal would approach
    // MongoDB's 16 MiB command limit with a few more such locks.
    let mut guards = Vec::new();
    for letter in ["a", "b", "c"] {
        let name = letter.repeat(MIB);
        guards.push(provider.create_lock(name).acquire().await.unwrap());
    }
    commands.clear();
    // A round renews one lease alone with a findAndModify (it reads the server's clock) and the
    // others with updates, or alone too when one would not fit in a command beside another.
    let renewal_sizes = || [commands.sizes("update"), commands.sizes("findAndModify")].concat();
    let renewed = common::eventually(Duration::from_secs(10), || async {
        renewal_sizes().len() >= 3
    })
    .await;
    assert!(renewed, "renewal commands were sent");
    let sizes = renewal_sizes();
    println!("renewal command sizes for three 1 MiB names: {sizes:?}");
    // Commands stay within 2 MiB of ids, so no command can carry two of these names (2 MiB of
    // ids and its own fields): each goes in a command of its own.
    let largest = sizes.iter().copied().max().unwrap();
    assert!(
        largest < 2 * MIB,
        "a renewal command of {largest} bytes: ids must be chunked, one such name a command"
    );
    assert!(guards.iter().all(|guard| !guard.is_lost()));
    for guard in guards {
        guard.release().await.unwrap();
    }
}
