//! Status, listing, forced release and purge of a provider's locks.

mod common;

use std::time::Duration;

use distributed_lock_mongodb::{LockDetails, LockKind, Provider};
use mongodb::bson::{DateTime, Document, doc};

async fn provider() -> (Provider, mongodb::Collection<Document>) {
    let database = common::database().await;
    let collection = common::unique("admin");
    // A placeholder index keeps the embedded server's instant TTL deletion out of the way, so
    // expired documents stay until purged (as on a real server between TTL monitor runs).
    let documents = database.collection::<Document>(&collection);
    common::block_ttl_index(&documents).await;
    let provider = Provider::new(&database)
        .with_collection(collection.as_str())
        .with_options(common::options(5_000, 1_000));
    (provider, documents)
}

#[tokio::test]
async fn status_and_listing_show_holders_and_leases() {
    let (provider, _) = provider().await;
    assert_eq!(provider.status("nobody").await.unwrap(), None);
    let a = provider.create_lock("a").acquire().await.unwrap();
    let b = provider.create_lock("b").acquire().await.unwrap();
    provider
        .create_lock("c")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    let status = provider
        .status("a")
        .await
        .unwrap()
        .expect("a has a document");
    assert_eq!(status.name, "a");
    assert!(status.is_held());
    assert!(status.lock_id.is_some());
    assert_eq!(status.fencing_token, Some(a.fencing_token()));
    let remaining = status.remaining.unwrap();
    assert!(
        remaining > Duration::from_secs(3) && remaining <= Duration::from_secs(5),
        "{remaining:?}"
    );
    assert!(status.acquired_at.unwrap() < status.expires_at.unwrap());

    let released = provider
        .status("c")
        .await
        .unwrap()
        .expect("released documents stay");
    assert!(!released.is_held() && released.lock_id.is_none() && released.fencing_token.is_some());

    let held: Vec<String> = provider
        .held_locks()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(held, ["a", "b"]);
    a.release().await.unwrap();
    b.release().await.unwrap();
    assert!(provider.held_locks().await.unwrap().is_empty());
}

#[tokio::test]
async fn force_release_expires_the_holder_and_keeps_tokens_increasing() {
    let (provider, documents) = provider().await;
    let stuck = provider.create_lock("stuck").acquire().await.unwrap();
    let token = stuck.fencing_token();
    assert!(provider.force_release("stuck").await.unwrap());
    assert!(
        !provider.force_release("stuck").await.unwrap(),
        "nothing left to release"
    );
    assert!(
        documents
            .find_one(doc! { "_id": "stuck" })
            .await
            .unwrap()
            .is_some(),
        "not deleted"
    );

    let next = provider
        .create_lock("stuck")
        .try_acquire()
        .await
        .unwrap()
        .expect("free now");
    assert!(next.fencing_token() > token);
    let lost = stuck.lost();
    tokio::time::timeout(Duration::from_secs(3), lost.wait())
        .await
        .expect("the forced-out holder learns it at its next renewal");
    assert!(stuck.release().await.unwrap_err().is_lock_lost());
    assert_eq!(
        provider
            .status("stuck")
            .await
            .unwrap()
            .unwrap()
            .fencing_token,
        Some(next.fencing_token())
    );
    next.release().await.unwrap();
}

#[tokio::test]
async fn purge_removes_only_documents_whose_lease_ended_over_a_day_ago() {
    let (provider, documents) = provider().await;
    let live = provider.create_lock("live").acquire().await.unwrap();
    provider
        .create_lock("released")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let hours_ago =
        |hours: i64| DateTime::from_millis(DateTime::now().timestamp_millis() - hours * 3_600_000);
    let future = DateTime::from_millis(DateTime::now().timestamp_millis() + 60_000);
    documents
        .insert_many([
            doc! { "_id": "ended-25h-ago", "lockId": "x", "expiresAt": hours_ago(25), "fencingToken": 3_i64 },
            doc! { "_id": "ended-23h-ago", "expiresAt": hours_ago(23), "fencingToken": 5_i64 },
            doc! { "_id": "live-foreign", "lockId": "y", "expiresAt": future, "fencingToken": 4_i64 },
            doc! { "_id": "not-a-lock", "note": "no expiresAt" },
        ])
        .await
        .unwrap();
    // Documents are kept a day after their lease ended: their fencing tokens keep the next
    // acquisition's token above them whatever the next router's clock says.
    assert_eq!(provider.purge_expired().await.unwrap(), 1);
    let mut left: Vec<String> = documents
        .distinct("_id", doc! {})
        .await
        .unwrap()
        .into_iter()
        .filter_map(|id| id.as_str().map(str::to_owned))
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "ended-23h-ago",
            "live",
            "live-foreign",
            "not-a-lock",
            "released"
        ]
    );
    assert!(!live.is_lost());
    live.release().await.unwrap();
}

#[tokio::test]
async fn details_are_opt_in_for_exclusive_locks_and_composites() {
    let (provider, documents) = provider().await;
    let plain = provider.create_lock("plain").acquire().await.unwrap();
    let document = documents
        .find_one(doc! { "_id": "plain" })
        .await
        .unwrap()
        .unwrap();
    assert!(
        !document.contains_key("details"),
        ".NET's five fields only: {document}"
    );
    assert_eq!(
        provider.status("plain").await.unwrap().unwrap().details,
        None
    );

    let detailed = provider
        .clone()
        .with_details(LockDetails::new().with_owner("nightly-report"))
        .with_details_in_exclusive_locks(true);
    let composite = detailed
        .acquire_all(&["m2", "m1"], Duration::from_secs(5))
        .await
        .unwrap();
    let held = provider.held_locks().await.unwrap();
    let summary: Vec<_> = held
        .iter()
        .map(|held| (held.name.as_str(), held.kind, held.owner(), held.pid()))
        .collect();
    let pid = Some(std::process::id());
    assert_eq!(
        summary,
        [
            ("m1", LockKind::Exclusive, Some("nightly-report"), pid),
            ("m2", LockKind::Exclusive, Some("nightly-report"), pid),
            ("plain", LockKind::Exclusive, None, None),
        ]
    );
    assert_eq!(held[0].host(), LockDetails::new().host.as_deref());
    composite.release().await.unwrap();
    plain.release().await.unwrap();
}
