//! Reads whose result the crate acts on go to the primary with a read concern that cannot show
//! a lease the primary has already ended, whatever the client's defaults say.

use test_support as common;

use std::time::Duration;

use common::proxy::{self, Action, Rule, replies};
use distributed_lock_mongodb::{DocumentLock, Error, LockGuard, Provider};
use mongodb::bson::{Document, doc};
use mongodb::options::{ReadConcern, ReadPreference, SelectionCriteria};

/// Every read sent asks for the primary (when the driver sends a read preference at all: it
/// does not to a standalone) and for read concern `local` or `linearizable`.
fn assert_reads_are_fresh(reads: &[Document]) {
    assert!(!reads.is_empty(), "no read was recorded");
    for read in reads {
        let level = read
            .get_document("readConcern")
            .and_then(|concern| concern.get_str("level"))
            .unwrap_or_else(|_| panic!("no read concern in {read}"));
        assert!(
            ["local", "linearizable"].contains(&level),
            "read concern {level} in {read}"
        );
        if let Ok(preference) = read.get_document("$readPreference") {
            assert_eq!(preference.get_str("mode"), Ok("primary"), "{read}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_status_and_existence_reads_ignore_the_clients_read_defaults() {
    // Client defaults that would weaken the lock if the crate used them.
    let (database, commands) = common::counting_database_with(|options| {
        options.selection_criteria = Some(SelectionCriteria::ReadPreference(
            ReadPreference::SecondaryPreferred {
                options: Default::default(),
            },
        ));
        options.read_concern = Some(ReadConcern::majority());
    })
    .await;
    let collection = common::unique("locks");
    let provider = Provider::new(&database)
        .with_collection(collection.as_str())
        .with_options(common::options(3_000, 300));
    let (kept, doomed) = four_locks(&provider).await;
    commands.clear();
    // Two of four leases vanish: a round renews one lease alone and the others in one update,
    // which then matches fewer leases than it sent and reads back which are still live. That
    // read decides who keeps a lock.
    delete_and_wait_until_lost(&collection, doomed).await;
    assert!(kept.iter().all(|guard| !guard.is_lost()));
    let renewal_reads = commands.reads();
    assert!(
        renewal_reads.iter().any(|read| read
            .get_document("readConcern")
            .and_then(|concern| concern.get_str("level"))
            == Ok("linearizable")),
        "the renewal read-back is linearizable: {renewal_reads:?}"
    );

    let status = provider.status("kept-1").await.unwrap().unwrap();
    assert!(status.is_held());
    assert_eq!(provider.held_locks().await.unwrap().len(), 2);

    let jobs = database.collection::<Document>(&common::unique("jobs"));
    let locks = DocumentLock::new(&jobs);
    let error = locks.try_lock(doc! { "_id": "missing" }).await.unwrap_err();
    assert!(matches!(error, Error::DocumentNotFound { .. }), "{error}");

    assert_reads_are_fresh(&commands.reads());
    for guard in kept {
        guard.release().await.unwrap();
    }
}

/// A standalone server refuses read concern `linearizable` (NotAReplicaSet, 123). The renewal
/// read-back then reads with `local`, which is exact there: the lease still held stays held, the
/// one that vanished is lost. (The embedded server accepts `linearizable`, so the proxy refuses
/// it in the server's place.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_renewal_read_back_falls_back_to_local_where_linearizable_is_refused() {
    let (proxy, client) = proxy::proxied_client().await;
    let refused = proxy.add_rule(
        Rule::new(
            "aggregate",
            Action::Reply(replies::command_error(123, "NotAReplicaSet")),
        )
        .where_field("readConcern.level", "linearizable")
        .times(usize::MAX),
    );
    let collection = common::unique("locks");
    let provider = Provider::new(&client.database(common::DATABASE))
        .with_collection(collection.as_str())
        .with_options(common::options(3_000, 300));
    let (kept, doomed) = four_locks(&provider).await;
    delete_and_wait_until_lost(&collection, doomed).await;
    assert!(
        proxy.hits(refused) >= 1,
        "the read-back asked for linearizable"
    );
    // Past the kept leases' own expiry: only renewals that were confirmed keep them.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        kept.iter().all(|guard| !guard.is_lost()),
        "the leases still ours are kept"
    );
    for guard in kept {
        guard.release().await.unwrap();
    }
}

/// Two locks to keep and two to lose, all renewed by one loop.
async fn four_locks(provider: &Provider) -> (Vec<LockGuard>, Vec<LockGuard>) {
    let mut kept = Vec::new();
    let mut doomed = Vec::new();
    for name in ["kept-1", "kept-2"] {
        kept.push(provider.create_lock(name).acquire().await.unwrap());
    }
    for name in ["doomed-1", "doomed-2"] {
        doomed.push(provider.create_lock(name).acquire().await.unwrap());
    }
    (kept, doomed)
}

/// Deletes the lock documents of `doomed` behind their holder's back and waits (at most 3 s, the
/// expiry these tests use) for the renewals to find them gone. At least one of them is renewed
/// with another lease in one update (only one lease of a round is renewed alone).
async fn delete_and_wait_until_lost(collection: &str, doomed: Vec<LockGuard>) {
    let locks = common::database().await.collection::<Document>(collection);
    for guard in &doomed {
        locks
            .delete_one(doc! { "_id": guard.name() })
            .await
            .unwrap();
    }
    for guard in doomed {
        tokio::time::timeout(Duration::from_secs(3), guard.lost().wait())
            .await
            .expect("the deleted lock is lost");
    }
}
