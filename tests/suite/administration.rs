//! Status, listing, forced release and purge of a provider's locks.

use test_support as common;

use std::time::Duration;

use distributed_lock_mongodb::{LockDetails, LockFilter, LockKind, Provider};
use mongodb::Collection;
use mongodb::bson::{Bson, DateTime, Document, doc};

async fn provider() -> (Provider, Collection<Document>) {
    let (provider, [locks, _, _]) = provider_of_every_kind().await;
    (provider, locks)
}

/// A provider whose exclusive, reader-writer and semaphore collections (returned in that
/// order) are its own.
async fn provider_of_every_kind() -> (Provider, [Collection<Document>; 3]) {
    let (provider, collections) = common::provider_with_own_collections(&common::database().await);
    // A placeholder index keeps the embedded server's instant TTL deletion out of the way, so
    // expired documents stay until purged (as on a real server between TTL monitor runs).
    for collection in &collections {
        common::block_ttl_index(collection).await;
    }
    let provider = provider.with_options(common::options(5_000, 1_000));
    (provider, collections)
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

/// A holder that releases a lease an operator ended, before a renewal told it so, hears that it
/// did not hold the lock throughout: its release matched nothing. Fails when a release that
/// matches nothing counts as the holder's (a mutant of `release.rs` that no test killed).
#[tokio::test]
async fn releasing_a_lease_an_operator_ended_unnoticed_is_lock_lost() {
    let (provider, _) = provider().await;
    let holder = provider
        .create_lock("ended-unnoticed")
        .acquire()
        .await
        .unwrap();
    assert!(provider.force_release("ended-unnoticed").await.unwrap());
    // Released at once: the next renewal round, a second away, has not run.
    let error = holder.release().await.unwrap_err();
    assert!(error.is_lock_lost(), "{error}");
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

/// Every lease end stored in a reader-writer lock or semaphore document: its writer's, its
/// waiting writer's, its readers' and its holders'.
fn lease_ends(document: &Document) -> Vec<DateTime> {
    let mut ends = Vec::new();
    for field in ["writer", "waitingWriter"] {
        if let Ok(lease) = document.get_document(field) {
            ends.extend(lease.get_datetime("expiresAt").ok().copied());
        }
    }
    for field in ["readers", "holders"] {
        let members = document.get_array(field).map(Vec::as_slice).unwrap_or(&[]);
        ends.extend(
            members
                .iter()
                .filter_map(Bson::as_document)
                .filter_map(|member| member.get_datetime("expiresAt").ok().copied()),
        );
    }
    ends
}

/// The document's top-level `expiresAt`, after checking that it is no earlier than any lease
/// the document holds (what lets the TTL index and purge look at it alone).
async fn retained_until(collection: &Collection<Document>, name: &str) -> DateTime {
    let document = common::lock_document(collection, name)
        .await
        .expect("the lock has a document");
    let top = *document
        .get_datetime("expiresAt")
        .unwrap_or_else(|_| panic!("no top-level expiresAt in {document}"));
    let ends = lease_ends(&document);
    assert!(!ends.is_empty(), "a lease is held in {document}");
    assert!(
        ends.iter().all(|end| *end <= top),
        "a lease outlives the document's expiresAt: {document}"
    );
    top
}

#[tokio::test]
async fn reader_writer_and_semaphore_documents_are_kept_as_long_as_their_leases() {
    let (provider, [_, rw_locks, semaphores]) = provider_of_every_kind().await;
    // Renewed every 300 ms.
    let provider = provider.with_options(common::options(2_000, 300));
    let rw = provider.create_reader_writer_lock("rw");
    let first = rw.acquire_read().await.unwrap();
    let second = rw.acquire_read().await.unwrap();
    let after_readers = retained_until(&rw_locks, "rw").await;
    let semaphore = provider.create_semaphore("sem", 2);
    let place = semaphore.acquire().await.unwrap();
    let after_place = retained_until(&semaphores, "sem").await;

    // Renewals move the leases and the document's expiresAt with them.
    let renewed = common::eventually(Duration::from_secs(10), || async {
        retained_until(&rw_locks, "rw").await > after_readers
            && retained_until(&semaphores, "sem").await > after_place
    })
    .await;
    assert!(renewed, "renewals raise the documents' expiresAt");

    first.release().await.unwrap();
    second.release().await.unwrap();
    let writer = rw.acquire_write().await.unwrap();
    let after_writer = retained_until(&rw_locks, "rw").await;
    let renewed = common::eventually(Duration::from_secs(10), || async {
        retained_until(&rw_locks, "rw").await > after_writer
    })
    .await;
    assert!(renewed, "the writer's renewals raise it too");
    assert!(!writer.is_lost() && !place.is_lost());
    writer.release().await.unwrap();
    place.release().await.unwrap();
}

#[tokio::test]
async fn purge_removes_reader_writer_and_semaphore_documents_a_day_after_their_last_lease() {
    let (provider, [_, rw_locks, semaphores]) = provider_of_every_kind().await;
    let (old_rw, old_sem) = (
        provider.create_reader_writer_lock("old-rw"),
        provider.create_semaphore("old-sem", 2),
    );
    let writer_token = old_rw.acquire_write().await.unwrap().fencing_token();
    let place_token = old_sem.acquire().await.unwrap().fencing_token();
    // Dropped: released in the background. Wait until both documents hold no lease.
    let released = common::eventually(Duration::from_secs(10), || async {
        provider.held_locks().await.unwrap().is_empty()
    })
    .await;
    assert!(released, "dropped guards are released");
    let live_reader = provider
        .create_reader_writer_lock("live-rw")
        .acquire_read()
        .await
        .unwrap();
    let recent = provider.create_semaphore("recent-sem", 1);
    recent.acquire().await.unwrap().release().await.unwrap();

    // A day passes for the old documents (their last leases ended 25 hours ago) but not for
    // the recent one (23 hours).
    let hours_ago =
        |hours: i64| DateTime::from_millis(DateTime::now().timestamp_millis() - hours * 3_600_000);
    let age = |collection: &Collection<Document>, name: &str, hours: i64| {
        let (collection, name) = (collection.clone(), name.to_owned());
        async move {
            let update = doc! { "$set": { "expiresAt": hours_ago(hours) } };
            let result = collection.update_one(doc! { "_id": name }, update).await;
            assert_eq!(result.unwrap().matched_count, 1);
        }
    };
    age(&rw_locks, "old-rw", 25).await;
    age(&semaphores, "old-sem", 25).await;
    age(&semaphores, "recent-sem", 23).await;

    assert_eq!(provider.purge_expired().await.unwrap(), 2);
    let ids = |collection: &Collection<Document>| {
        let collection = collection.clone();
        async move {
            let mut ids: Vec<Bson> = collection.distinct("_id", doc! {}).await.unwrap();
            ids.sort_by_key(ToString::to_string);
            ids
        }
    };
    assert_eq!(ids(&rw_locks).await, [Bson::from("live-rw")]);
    assert_eq!(ids(&semaphores).await, [Bson::from("recent-sem")]);
    assert!(!live_reader.is_lost());

    // The next holders' fencing tokens still increase: a day later, `$$NOW × 1000` is above
    // any token of the deleted documents.
    let writer = old_rw.acquire_write().await.unwrap();
    assert!(writer.fencing_token() > writer_token);
    let place = old_sem.acquire().await.unwrap();
    assert!(place.fencing_token() > place_token);
    live_reader.release().await.unwrap();
}

#[tokio::test]
async fn holders_of_every_kind_are_listed_with_their_renewals_and_filtered() {
    let (provider, _) = provider_of_every_kind().await;
    // Renewed every 300 ms.
    let provider = provider.with_options(common::options(3_000, 300));
    let ours = provider
        .clone()
        .with_details(LockDetails::new().with_owner("svc-a"))
        .with_details_in_exclusive_locks(true);
    let theirs = provider
        .clone()
        .with_details(LockDetails::new().with_owner("svc-b"));
    let exclusive = ours.create_lock("x").acquire().await.unwrap();
    let plain = theirs.create_lock("plain").acquire().await.unwrap();
    let (rw, rw2) = (
        ours.create_reader_writer_lock("rw"),
        theirs.create_reader_writer_lock("rw2"),
    );
    let reader = rw.acquire_read().await.unwrap();
    let writer = rw2.acquire_write().await.unwrap();
    let place_a = ours.create_semaphore("sem", 2).acquire().await.unwrap();
    let place_b = theirs.create_semaphore("sem", 2).acquire().await.unwrap();

    let kinds_and_names = |held: Vec<distributed_lock_mongodb::LockStatus>| {
        held.into_iter()
            .map(|holder| (holder.kind, holder.name))
            .collect::<Vec<_>>()
    };
    let all = provider.held_locks().await.unwrap();
    assert_eq!(
        kinds_and_names(all.clone()),
        [
            (LockKind::Exclusive, "plain".to_owned()),
            (LockKind::Read, "rw".to_owned()),
            (LockKind::Write, "rw2".to_owned()),
            (LockKind::Semaphore, "sem".to_owned()),
            (LockKind::Semaphore, "sem".to_owned()),
            (LockKind::Exclusive, "x".to_owned()),
        ]
    );
    for holder in &all {
        match holder.name.as_str() {
            // .NET's layout: no renewal time.
            "plain" => assert_eq!(holder.renewed_at, None),
            _ => assert!(holder.renewed_at >= holder.acquired_at, "{holder:?}"),
        }
    }

    // Renewals record their time, in every kind that has a place for it.
    let renewed = common::eventually(Duration::from_secs(10), || async {
        let held = provider.held_locks().await.unwrap();
        held.iter()
            .filter(|holder| holder.name != "plain")
            .all(|holder| holder.renewed_at > holder.acquired_at)
    })
    .await;
    assert!(renewed, "every renewal is recorded");
    let plain_status = provider.status("plain").await.unwrap().unwrap();
    assert_eq!(
        plain_status.renewed_at, None,
        "renewals keep .NET's layout of exclusive locks without details"
    );

    let matching = |filter: LockFilter| {
        let provider = provider.clone();
        async move { kinds_and_names(provider.held_locks_matching(&filter).await.unwrap()) }
    };
    assert_eq!(
        matching(LockFilter::new().with_kind(LockKind::Semaphore)).await,
        vec![(LockKind::Semaphore, "sem".to_owned()); 2]
    );
    assert_eq!(
        matching(
            LockFilter::new()
                .with_kind(LockKind::Read)
                .with_kind(LockKind::Write)
        )
        .await,
        [
            (LockKind::Read, "rw".to_owned()),
            (LockKind::Write, "rw2".to_owned())
        ]
    );
    assert_eq!(
        matching(LockFilter::new().with_owner("svc-b")).await,
        [
            (LockKind::Write, "rw2".to_owned()),
            (LockKind::Semaphore, "sem".to_owned())
        ]
    );
    assert_eq!(
        matching(LockFilter::new().with_name("x")).await,
        [(LockKind::Exclusive, "x".to_owned())]
    );
    // Every holder has held for at least one renewal (300 ms); none for an hour.
    let held_a_while = LockFilter::new().with_min_held_for(Duration::from_millis(250));
    assert_eq!(matching(held_a_while).await.len(), 6);
    let held_an_hour = LockFilter::new().with_min_held_for(Duration::from_secs(3_600));
    assert!(matching(held_an_hour).await.is_empty());

    for guard in [exclusive, plain, writer, place_a, place_b] {
        guard.release().await.unwrap();
    }
    reader.release().await.unwrap();
}

#[tokio::test]
async fn one_holder_or_all_holders_of_every_kind_can_be_forced_out() {
    let (provider, _) = provider_of_every_kind().await;
    let provider = provider.with_options(common::options(3_000, 300));
    let holder = |kind: LockKind, name: &str| {
        let (provider, name) = (provider.clone(), name.to_owned());
        async move {
            let filter = LockFilter::new().with_kind(kind).with_name(name);
            provider.held_locks_matching(&filter).await.unwrap()
        }
    };
    let forced_out = |lost: distributed_lock_mongodb::LostSignal| async move {
        tokio::time::timeout(Duration::from_secs(5), lost.wait())
            .await
            .expect("the holder learns it at its next renewal");
    };

    // One reader of two.
    let rw = provider.create_reader_writer_lock("rw");
    let first = rw.acquire_read().await.unwrap();
    let first_entry = holder(LockKind::Read, "rw").await.remove(0);
    let kept = rw.acquire_read().await.unwrap();
    assert!(provider.force_release_holder(&first_entry).await.unwrap());
    assert!(!provider.force_release_holder(&first_entry).await.unwrap());
    let left = holder(LockKind::Read, "rw").await;
    assert_eq!(left.len(), 1);
    assert_ne!(left[0].lock_id, first_entry.lock_id);
    forced_out(first.lost()).await;
    assert!(!kept.is_lost());
    assert!(first.release().await.unwrap_err().is_lock_lost());

    // Then every holder, the writer's marker included.
    let other = rw.acquire_read().await.unwrap();
    assert!(rw.force_release_all().await.unwrap());
    assert!(!rw.force_release_all().await.unwrap(), "nothing left");
    forced_out(kept.lost()).await;
    forced_out(other.lost()).await;

    // The writer: its fencing token survives.
    let writer = rw.acquire_write().await.unwrap();
    let token = writer.fencing_token();
    let entry = holder(LockKind::Write, "rw").await.remove(0);
    assert_eq!(entry.fencing_token, Some(token));
    assert!(provider.force_release_holder(&entry).await.unwrap());
    forced_out(writer.lost()).await;
    let next = rw.try_acquire_write().await.unwrap().expect("free now");
    assert!(next.fencing_token() > token);
    next.release().await.unwrap();

    // Semaphore places: one, then all; tokens keep increasing.
    let semaphore = provider.create_semaphore("sem", 2);
    let place_a = semaphore.acquire().await.unwrap();
    let place_b = semaphore.acquire().await.unwrap();
    let entry_a = holder(LockKind::Semaphore, "sem")
        .await
        .into_iter()
        .find(|entry| entry.fencing_token == Some(place_a.fencing_token()))
        .unwrap();
    assert!(provider.force_release_holder(&entry_a).await.unwrap());
    forced_out(place_a.lost()).await;
    assert!(!place_b.is_lost());
    assert!(semaphore.force_release_all().await.unwrap());
    assert!(!semaphore.force_release_all().await.unwrap());
    forced_out(place_b.lost()).await;
    let next = semaphore.try_acquire().await.unwrap().expect("free now");
    assert!(next.fencing_token() > place_b.fencing_token());
    next.release().await.unwrap();

    // An exclusive lock, through its entry.
    let lock = provider.create_lock("x").acquire().await.unwrap();
    let entry = holder(LockKind::Exclusive, "x").await.remove(0);
    assert!(provider.force_release_holder(&entry).await.unwrap());
    forced_out(lock.lost()).await;

    // An entry of a free lock names no lease.
    let free = provider.status("x").await.unwrap().unwrap();
    let error = provider.force_release_holder(&free).await.unwrap_err();
    assert!(
        matches!(&error, distributed_lock_mongodb::Error::InvalidArgument(message) if message.contains("no lock id")),
        "{error}"
    );
}

/// Each guard tells its lease's lock id, the holder id its entry shows (and `dlock list`, and
/// `dlock release --holder` takes), so an application can log it.
#[tokio::test]
async fn every_guard_tells_the_lock_id_its_holder_entry_shows() {
    let (provider, _) = provider_of_every_kind().await;
    let entry = |kind: LockKind, name: &str| {
        let (provider, name) = (provider.clone(), name.to_owned());
        async move {
            let filter = LockFilter::new().with_kind(kind).with_name(name);
            let held = provider.held_locks_matching(&filter).await.unwrap();
            held.into_iter()
                .map(|entry| entry.lock_id.unwrap())
                .collect::<Vec<_>>()
        }
    };
    let lock = provider.create_lock("x").acquire().await.unwrap();
    assert_eq!(entry(LockKind::Exclusive, "x").await, [lock.lock_id()]);
    let rw = provider.create_reader_writer_lock("rw");
    let reader = rw.acquire_read().await.unwrap();
    assert_eq!(entry(LockKind::Read, "rw").await, [reader.lock_id()]);
    reader.release().await.unwrap();
    let writer = rw.acquire_write().await.unwrap();
    assert_eq!(entry(LockKind::Write, "rw").await, [writer.lock_id()]);
    let semaphore = provider.create_semaphore("sem", 2);
    let (place_a, place_b) = (
        semaphore.acquire().await.unwrap(),
        semaphore.acquire().await.unwrap(),
    );
    let mut places = entry(LockKind::Semaphore, "sem").await;
    places.sort();
    let mut ours = vec![place_a.lock_id().to_owned(), place_b.lock_id().to_owned()];
    ours.sort();
    assert_eq!(places, ours);
    assert_ne!(place_a.lock_id(), place_b.lock_id());
    let both = provider
        .acquire_all(&["m1", "m2"], Duration::from_secs(5))
        .await
        .unwrap();
    for (name, lock_id) in both.lock_ids() {
        assert_eq!(entry(LockKind::Exclusive, name).await, [lock_id]);
    }
    // The id an operator forces out is the guard's.
    let x = provider.status("x").await.unwrap().unwrap();
    assert_eq!(x.lock_id.as_deref(), Some(lock.lock_id()));
    assert!(provider.force_release_holder(&x).await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), lock.lost().wait())
        .await
        .expect("the holder learns it at its next renewal");
}

/// A provider pointed at an application's collection (documents with an `expiresAt` a day old,
/// but not lock documents): `purge_expired` refuses it before deleting anything, and every
/// administrative write leaves documents that are not locks alone, whatever their fields.
#[tokio::test]
async fn administration_never_touches_documents_that_are_not_locks() {
    let database = common::database().await;
    let days_ago =
        |days: i64| DateTime::from_millis(DateTime::now().timestamp_millis() - days * 86_400_000);
    let in_a_minute = DateTime::from_millis(DateTime::now().timestamp_millis() + 60_000);
    let sessions_name = common::unique("sessions");
    let sessions = database.collection::<Document>(&sessions_name);
    let application = [
        doc! { "_id": "s1", "user": "ann", "expiresAt": days_ago(2) },
        doc! { "_id": "s2", "user": "bob", "expiresAt": days_ago(3) },
        doc! { "_id": "s3", "user": "cy" },
    ];
    sessions.insert_many(application.clone()).await.unwrap();
    let (provider, [_, rw, semaphores]) = common::provider_with_own_collections(&database);
    let misconfigured = provider.with_collection(sessions_name.as_str());
    let refused = misconfigured.purge_expired().await.unwrap_err();
    assert!(
        matches!(&refused, distributed_lock_mongodb::Error::NotALockCollection { collection, .. } if *collection == sessions_name),
        "{refused}"
    );
    assert!(refused.to_string().contains("\"s1\""), "{refused}");
    assert!(refused.is_invalid_input());
    assert!(misconfigured.purgeable(5).await.is_err());

    // Documents shaped almost like locks, each with something a lock document never has, in
    // every lock collection: forced releases and purges leave them as they are.
    let (provider, [locks, _, _]) = common::provider_with_own_collections(&database);
    let provider = provider
        .with_reader_writer_collection(rw.name())
        .with_semaphore_collection(semaphores.name());
    let lookalikes = [
        (
            &locks,
            doc! { "_id": "held-lookalike", "lockId": "x", "expiresAt": in_a_minute, "fencingToken": 1_i64, "order": 7 },
        ),
        (
            &locks,
            doc! { "_id": "old-lookalike", "expiresAt": days_ago(2), "fencingToken": 1_i64, "order": 8 },
        ),
        (
            &locks,
            doc! { "_id": 5, "expiresAt": days_ago(2), "fencingToken": 1_i64 },
        ),
        (
            &rw,
            doc! { "_id": "rw-lookalike", "expiresAt": days_ago(2), "readers": [], "writer": { "id": "w", "expiresAt": in_a_minute }, "order": 9 },
        ),
        (
            &semaphores,
            doc! { "_id": "sem-lookalike", "expiresAt": days_ago(2), "holders": [{ "id": "h", "expiresAt": in_a_minute }], "maxCount": 2_i64, "order": 10 },
        ),
    ];
    for (collection, document) in &lookalikes {
        collection.insert_one(document.clone()).await.unwrap();
    }
    // Real lock documents beside them (most of each collection: it is a lock collection), of
    // which one is purged.
    locks
        .insert_one(doc! { "_id": "old-lock", "expiresAt": days_ago(2), "fencingToken": 2_i64 })
        .await
        .unwrap();
    for name in ["a", "b", "c"] {
        let writer = doc! { "fencingToken": 3_i64 };
        rw.insert_one(
            doc! { "_id": name, "expiresAt": in_a_minute, "readers": [], "writer": writer },
        )
        .await
        .unwrap();
        semaphores
            .insert_one(
                doc! { "_id": name, "expiresAt": in_a_minute, "holders": [], "maxCount": 2_i64 },
            )
            .await
            .unwrap();
        locks
            .insert_one(doc! { "_id": name, "expiresAt": in_a_minute, "acquiredAt": days_ago(0), "fencingToken": 4_i64 })
            .await
            .unwrap();
    }
    assert!(!provider.force_release("held-lookalike").await.unwrap());
    for holder in provider.held_locks().await.unwrap() {
        assert!(
            !provider.force_release_holder(&holder).await.unwrap(),
            "{holder:?}"
        );
    }
    let due = provider.purgeable(10).await.unwrap();
    assert_eq!(
        (due.count, due.names.clone()),
        (1, vec!["old-lock".to_owned()])
    );
    assert_eq!(provider.purge_expired().await.unwrap(), 1);
    for (collection, document) in &lookalikes {
        let stored = collection
            .find_one(doc! { "_id": document.get("_id").unwrap().clone() })
            .await
            .unwrap();
        assert_eq!(stored.as_ref(), Some(document), "changed");
    }
    let left: Vec<Document> =
        futures::TryStreamExt::try_collect(sessions.find(doc! {}).await.unwrap())
            .await
            .unwrap();
    assert_eq!(left, application);
}

/// An administration call whose reply never comes (a half-open connection, on which the driver
/// waits for ever) returns `NoReply` once the provider's patience (its `expiry`, at least five
/// seconds) has passed: found by the randomized history test, whose forced release hung a
/// worker past its end. Each call sends its command once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn administration_calls_without_a_reply_end_with_no_reply() {
    use common::proxy::{self, Action, Rule};
    let (proxy, client) = proxy::proxied_client().await;
    let database = client.database(common::DATABASE);
    let (provider, [locks, _, _]) = common::provider_with_own_collections(&database);
    let provider = provider.with_options(common::options(1_000, 300));
    let name = common::unique("hung-admin");
    let guard = provider.create_lock(name.as_str()).acquire().await.unwrap();
    let patience = Duration::from_secs(5);

    // The forced release's update is applied, and its reply never comes.
    let hung_update = proxy.add_rule(Rule::new("update", Action::ApplyThenHang).on(locks.name()));
    let started = tokio::time::Instant::now();
    let error = tokio::time::timeout(patience * 4, provider.force_release(&name))
        .await
        .expect("the forced release returns")
        .unwrap_err();
    let waited = started.elapsed();
    assert!(error.is_no_reply(), "{error}");
    assert!(
        error.to_string().contains(&name) && error.to_string().contains("administration"),
        "{error}"
    );
    assert!(waited >= patience, "gave up after {waited:?}");
    assert_eq!(
        proxy.hits(hung_update),
        1,
        "one forced release, one command"
    );
    // It was applied: the holder learns at its next renewal.
    tokio::time::timeout(Duration::from_secs(10), guard.lost().wait())
        .await
        .expect("the holder learns its lease ended");

    // A read that never gets a reply: the status of a provider and of a lock.
    let hung_read = proxy.add_rule(
        Rule::new("aggregate", Action::Hang)
            .on(locks.name())
            .times(2),
    );
    let error = tokio::time::timeout(patience * 4, provider.status(&name))
        .await
        .expect("the provider's status returns")
        .unwrap_err();
    assert!(error.is_no_reply(), "{error}");
    let lock = provider.create_lock(name.as_str());
    let error = tokio::time::timeout(patience * 4, lock.status())
        .await
        .expect("the lock's status returns")
        .unwrap_err();
    assert!(error.is_no_reply(), "{error}");
    assert_eq!(proxy.hits(hung_read), 2, "one read each");
}
