//! The blocking API (feature `blocking`): plain threads, no async runtime in the caller.

use test_support as common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use distributed_lock_mongodb::CompositeMember::{Exclusive, Read, Semaphore, Write};
use distributed_lock_mongodb::blocking::{LeaderElection, Provider};
use distributed_lock_mongodb::{Error, FenceOutcome, LockFilter, LockKind, LockOptions};
use mongodb::bson::{Bson, Document, doc};

/// Bounds that only catch hangs.
const HANG: Duration = Duration::from_secs(30);

/// Fresh collections of each kind, which no other test uses.
struct Collections {
    locks: String,
    rw: String,
    semaphores: String,
}

impl Collections {
    fn fresh() -> Collections {
        Collections {
            locks: common::unique("blocking-locks"),
            rw: common::unique("blocking-rw"),
            semaphores: common::unique("blocking-semaphores"),
        }
    }

    /// A provider (its own runtime, client and renewal loops) on these collections.
    fn provider(&self, options: LockOptions) -> Provider {
        let provider =
            Provider::connect(&common::server::uri(), common::DATABASE).expect("connect");
        self.configure(provider, options)
    }

    fn configure(&self, provider: Provider, options: LockOptions) -> Provider {
        provider
            .with_collection(self.locks.as_str())
            .with_reader_writer_collection(self.rw.as_str())
            .with_semaphore_collection(self.semaphores.as_str())
            .with_options(options)
    }
}

/// A provider on fresh collections.
fn provider(options: LockOptions) -> Provider {
    Collections::fresh().provider(options)
}

/// Two providers on the same fresh collections: two processes, as far as the locks can tell
/// (each has its own runtime, client and renewal loops; no in-process handoff between them).
fn two_processes(options: LockOptions) -> (Provider, Provider) {
    let collections = Collections::fresh();
    (
        collections.provider(options.clone()),
        collections.provider(options),
    )
}

/// Whether `other`'s lock `name` finds the lock held.
fn held_elsewhere(other: &Provider, name: &str) -> bool {
    other.create_lock(name).try_acquire().unwrap().is_none()
}

#[test]
fn a_held_lock_excludes_another_thread_until_released() {
    let provider = provider(common::options(10_000, 3_000));
    let lock = provider.create_lock(common::unique("exclusion"));
    let guard = lock.acquire().expect("free lock");
    assert_eq!(guard.name(), lock.name());
    assert!(!guard.is_lost());

    let (tried, was_busy) = mpsc::channel();
    let (go, released) = mpsc::channel::<()>();
    let other = lock.clone();
    let contender = thread::spawn(move || {
        tried
            .send(other.try_acquire().expect("try_acquire").is_none())
            .unwrap();
        released.recv().unwrap();
        let guard = other.acquire_timeout(HANG).expect("released lock");
        guard.release().expect("release");
    });
    assert!(
        was_busy.recv_timeout(HANG).unwrap(),
        "held by the other thread"
    );
    guard.release().expect("release");
    go.send(()).unwrap();
    contender.join().unwrap();
}

#[test]
fn the_lease_renews_while_no_blocking_call_is_in_progress() {
    // Lost after about 2 s unless renewed (every 600 ms, by the provider's runtime).
    let (holder, other) = two_processes(common::options(2_000, 600));
    let name = common::unique("renewal");
    let guard = holder
        .create_lock(name.as_str())
        .acquire()
        .expect("acquire");
    // Three expiries during which this thread makes no blocking call: only the background
    // renewal can keep the lease.
    thread::sleep(Duration::from_millis(6_500));
    assert!(!guard.is_lost(), "renewed in the background");
    assert!(!guard.wait_lost(Duration::ZERO).unwrap());
    assert!(held_elsewhere(&other, &name), "still held on the server");
    guard
        .release()
        .expect("release: not lost, so not Err(LockLost)");
}

#[test]
fn a_lease_nothing_renews_is_kept_by_extend_and_ends_without_it() {
    let by_hand = common::options(2_000, 600)
        .to_builder()
        .auto_renew(false)
        .build()
        .unwrap();
    let (holder, other) = two_processes(by_hand);
    let name = common::unique("by-hand");
    let guard = holder.create_lock(name.as_str()).acquire().unwrap();
    guard.extend(Duration::from_secs(5)).unwrap();
    thread::sleep(Duration::from_millis(2_500));
    assert!(!guard.is_lost(), "kept past its expiry by the extension");
    assert!(held_elsewhere(&other, &name), "still held on the server");
    assert!(matches!(
        guard.extend(Duration::ZERO),
        Err(Error::InvalidArgument(_))
    ));
    assert!(
        guard.wait_lost(HANG).unwrap(),
        "lost once the extension ran out"
    );
    assert!(matches!(
        guard.extend(Duration::from_secs(1)),
        Err(Error::LockLost { .. })
    ));
}

#[test]
fn dropping_a_guard_releases_the_lock_in_the_background() {
    // A 60 s lease: taking the lock within the bound below means it was released, not expired.
    let (holder, other) = two_processes(common::options(60_000, 20_000));
    let name = common::unique("drop");
    let guard = holder
        .create_lock(name.as_str())
        .acquire()
        .expect("acquire");
    let first_token = guard.fencing_token();
    drop(guard);
    let started = Instant::now();
    let next = other
        .create_lock(name.as_str())
        .acquire_timeout(HANG)
        .expect("released by the drop");
    assert!(started.elapsed() < HANG);
    assert!(next.fencing_token() > first_token);
    next.release().unwrap();
}

#[test]
fn dropping_the_last_handle_finishes_pending_releases() {
    let (holder, observer) = two_processes(common::options(60_000, 20_000));
    let name = common::unique("last-handle");
    let guard = holder
        .create_lock(name.as_str())
        .acquire()
        .expect("acquire");
    assert!(observer.status(&name).unwrap().unwrap().is_held());
    // The guard's release is queued on the holder's runtime; dropping the last handle waits
    // for it before stopping the runtime.
    drop(guard);
    drop(holder);
    let status = observer.status(&name).unwrap().expect("the document stays");
    assert!(!status.is_held(), "{status:?}");
}

#[test]
fn dropping_the_last_handle_waits_for_a_slow_release() {
    use common::proxy::{Action, FaultProxy, Rule};
    // The proxy runs on a runtime of the test's own, entered only to start it: the blocking
    // calls below must not run in a runtime context.
    let proxy_runtime = tokio::runtime::Runtime::new().unwrap();
    let proxy = proxy_runtime
        .block_on(async { FaultProxy::start(common::proxy::upstream_address().await).await });
    let mut options = proxy_runtime
        .block_on(async { mongodb::options::ClientOptions::parse(common::server::uri()).await })
        .unwrap();
    options.hosts = vec![mongodb::options::ServerAddress::Tcp {
        host: proxy.address().ip().to_string(),
        port: Some(proxy.address().port()),
    }];
    options.direct_connection = Some(true);
    options.repl_set_name = None;

    let collections = Collections::fresh();
    let lock_options = common::options(60_000, 20_000);
    let holder = collections.configure(
        Provider::connect_with_options(options, common::DATABASE).unwrap(),
        lock_options.clone(),
    );
    let observer = collections.provider(lock_options);
    let name = common::unique("slow-release");
    let guard = holder.create_lock(name.as_str()).acquire().unwrap();
    let slow = Duration::from_millis(1_500);
    let delayed = proxy.add_rule(Rule::new("update", Action::Delay(slow)).on(&collections.locks));
    let started = Instant::now();
    drop(guard);
    drop(holder);
    assert_eq!(proxy.hits(delayed), 1, "the release went through the proxy");
    assert!(started.elapsed() >= slow, "{:?}", started.elapsed());
    let status = observer.status(&name).unwrap().expect("the document stays");
    assert!(
        !status.is_held(),
        "released before the drop returned: {status:?}"
    );
}

#[test]
fn fencing_tokens_increase_with_every_acquisition() {
    let provider = provider(common::options(10_000, 3_000));
    let lock = provider.create_lock(common::unique("tokens"));
    let mut tokens = Vec::new();
    for round in 0..3 {
        let guard = lock.try_acquire().unwrap().expect("free");
        tokens.push(guard.fencing_token());
        if round % 2 == 0 {
            guard.release().unwrap();
        } else {
            drop(guard);
            // Wait for the background release without sleeping: the next acquisition waits.
            let guard = lock.acquire_timeout(HANG).unwrap();
            tokens.push(guard.fencing_token());
            guard.release().unwrap();
        }
    }
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "{tokens:?}"
    );
}

#[test]
fn reader_writer_lock_shares_reads_and_excludes_the_writer() {
    let provider = provider(common::options(10_000, 3_000));
    let lock = provider.create_reader_writer_lock(common::unique("rw"));
    let first = lock.acquire_read().expect("first reader");
    let second = thread::scope(|scope| {
        scope
            .spawn(|| lock.try_acquire_read().unwrap().expect("second reader"))
            .join()
            .unwrap()
    });
    assert_eq!(lock.holders().unwrap().len(), 2);
    assert!(
        lock.try_acquire_write().unwrap().is_none(),
        "readers hold it"
    );
    first.release().unwrap();
    drop(second);

    let writer = lock.acquire_write_timeout(HANG).expect("readers gone");
    assert!(!writer.is_lost());
    assert!(
        lock.try_acquire_read().unwrap().is_none(),
        "the writer holds it"
    );
    let holders = lock.holders().unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].kind, LockKind::Write);
    assert_eq!(holders[0].fencing_token, Some(writer.fencing_token()));
    writer.release().unwrap();
    assert!(lock.holders().unwrap().is_empty());
}

#[test]
fn an_upgradeable_reader_upgrades_and_downgrades_by_blocking_calls() {
    let provider = provider(common::options(10_000, 3_000));
    let lock = provider.create_reader_writer_lock(common::unique("rw"));
    let mut guard = lock.acquire_upgradeable_read_timeout(HANG).expect("free");
    assert!(lock.try_acquire_upgradeable_read().unwrap().is_none());
    let plain = lock.try_acquire_read().unwrap().expect("readers share");
    assert!(!guard.try_upgrade().unwrap(), "a plain reader holds it");
    plain.release().unwrap();
    assert!(guard.try_upgrade_timeout(HANG).unwrap());
    assert!(guard.is_upgraded());
    let token = guard.fencing_token().expect("a writer's token");
    // Its two leases: the writer's, and the upgradeable reader's beside it.
    let holders = lock.holders().unwrap();
    assert_eq!(holders.len(), 2, "{holders:?}");
    assert_eq!(holders[0].kind, LockKind::Write);
    assert_eq!(holders[0].fencing_token, Some(token));
    assert_eq!(holders[1].kind, LockKind::Read);
    assert_eq!(holders[1].lock_id.as_deref(), Some(guard.lock_id()));
    assert!(holders[1].upgradeable);
    assert!(lock.try_acquire_read().unwrap().is_none(), "it writes");
    guard.downgrade().unwrap();
    assert_eq!(guard.fencing_token(), None);
    let plain = lock.try_acquire_read().unwrap().expect("it reads again");
    assert!(lock.try_acquire_write().unwrap().is_none());
    plain.release().unwrap();
    guard.upgrade().unwrap();
    assert!(guard.fencing_token().unwrap() > token);
    guard.release().unwrap();
    assert!(lock.holders().unwrap().is_empty());
}

#[test]
fn semaphore_admits_max_count_holders() {
    let provider = provider(common::options(10_000, 3_000));
    let semaphore = provider.create_semaphore(common::unique("semaphore"), 2);
    assert_eq!(semaphore.max_count(), 2);
    let places: Vec<_> = (0..2)
        .map(|_| semaphore.try_acquire().unwrap().expect("a free place"))
        .collect();
    assert!(semaphore.try_acquire().unwrap().is_none(), "full");
    assert_eq!(semaphore.holders().unwrap().len(), 2);

    let waiter = {
        let semaphore = semaphore.clone();
        thread::spawn(move || semaphore.acquire_timeout(HANG).map(|place| place.release()))
    };
    let mut places = places.into_iter();
    places.next().unwrap().release().unwrap();
    waiter.join().unwrap().expect("a place came free").unwrap();
    drop(places);
}

#[test]
fn a_semaphore_gives_several_places_at_once_and_follows_a_set_count() {
    let provider = provider(common::options(10_000, 3_000));
    let semaphore = provider.create_semaphore(common::unique("semaphore"), 3);
    let two = semaphore.try_acquire_many(2).unwrap().expect("2 of 3 free");
    assert_eq!(semaphore.available().unwrap(), 1);
    assert!(semaphore.try_acquire_many(2).unwrap().is_none(), "1 left");
    semaphore.set_max_count(2).unwrap();
    assert_eq!(semaphore.available().unwrap(), 0, "2 of 2 taken");
    assert!(semaphore.try_acquire().unwrap().is_none());
    two.release().unwrap();
    let both = semaphore
        .acquire_many_timeout(2, HANG)
        .expect("both places of 2");
    both.release().unwrap();
}

#[test]
fn acquire_all_and_administration() {
    let (provider, admin) = two_processes(common::options(10_000, 3_000));
    let (a, b) = (common::unique("all-a"), common::unique("all-b"));
    let guard = provider
        .acquire_all(&[b.as_str(), a.as_str()], HANG)
        .expect("both free");
    let mut sorted = vec![a.clone(), b.clone()];
    sorted.sort();
    assert_eq!(guard.names().collect::<Vec<_>>(), sorted);
    assert_eq!(guard.fencing_tokens().count(), 2);
    let held: Vec<String> = admin
        .held_locks()
        .unwrap()
        .into_iter()
        .map(|status| status.name)
        .collect();
    assert_eq!(held, sorted);
    assert!(!guard.is_lost());
    guard.release().unwrap();
    assert!(admin.held_locks().unwrap().is_empty());
    assert_eq!(admin.status("never-acquired").unwrap(), None);
}

#[test]
fn mixed_composites_filters_forced_releases_and_indexes() {
    let (provider, admin) = two_processes(common::options(10_000, 3_000));
    let members = [
        Read("rw"),
        Exclusive("x"),
        Semaphore {
            name: "s",
            max_count: 2,
        },
    ];
    let guard = provider.acquire_all(&members, HANG).expect("all free");
    assert_eq!(guard.members().count(), 3);
    assert!(
        admin.try_acquire_all(&[Write("rw")]).unwrap().is_none(),
        "the composite's reader keeps writers out"
    );
    let readers = admin
        .held_locks_matching(&LockFilter::new().with_kind(LockKind::Read))
        .unwrap();
    assert_eq!(readers.len(), 1);
    assert!(admin.force_release_holder(&readers[0]).unwrap());
    assert!(
        guard.wait_lost(HANG).unwrap(),
        "the forced-out reader is lost"
    );
    assert!(guard.release().unwrap_err().is_lock_lost());

    let semaphore = provider.create_semaphore("s", 2);
    let place = semaphore.acquire().unwrap();
    assert!(admin.create_semaphore("s", 2).force_release_all().unwrap());
    assert!(place.wait_lost(HANG).unwrap());
    admin.create_indexes().unwrap();
}

#[test]
fn a_forced_release_is_seen_by_wait_lost() {
    let (holder, admin) = two_processes(common::options(5_000, 300));
    let name = common::unique("forced");
    let guard = holder.create_lock(name.as_str()).acquire().unwrap();
    assert!(!guard.wait_lost(Duration::from_millis(50)).unwrap());
    assert!(admin.force_release(&name).unwrap());
    assert!(
        guard.wait_lost(HANG).unwrap(),
        "the next renewal finds it gone"
    );
    assert!(guard.is_lost() && guard.lost().is_lost());
    assert!(guard.release().unwrap_err().is_lock_lost());
}

#[test]
fn shutdown_releases_everything_and_refuses_later_acquisitions() {
    let (provider, admin) = two_processes(common::options(60_000, 20_000));
    let name = common::unique("shutdown");
    let lock = provider.create_lock(name.as_str());
    let guard = lock.acquire().unwrap();
    provider.shutdown().unwrap();
    assert!(guard.is_lost());
    assert!(!admin.status(&name).unwrap().unwrap().is_held());
    assert!(matches!(lock.try_acquire(), Err(Error::ShutDown)));
}

#[test]
fn blocking_calls_inside_a_tokio_runtime_return_an_error() {
    let provider = provider(common::options(10_000, 3_000));
    let lock = provider.create_lock(common::unique("in-runtime"));
    let guard = lock.acquire().unwrap();
    let documents = provider.create_document_lock::<Document>(&common::unique("in-runtime"));
    let election = provider
        .create_leader_election(common::unique("in-runtime"))
        .unwrap();
    let mut watch = lock.watch(Duration::from_secs(1)).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let inside = |result: Result<(), Error>| {
        let error = result.unwrap_err();
        assert!(matches!(error, Error::BlockingInAsyncContext), "{error:?}");
        assert!(error.to_string().contains("use the async API"), "{error}");
    };
    runtime.block_on(async {
        inside(lock.try_acquire().map(drop));
        inside(lock.acquire_timeout(Duration::ZERO).map(drop));
        inside(provider.status("x").map(drop));
        inside(provider.shutdown());
        inside(guard.wait_lost(Duration::ZERO).map(drop));
        inside(documents.try_lock(doc! {}).map(drop));
        inside(election.wait_leader(Duration::ZERO).map(drop));
        let fence = provider.create_fence();
        let token = guard.fencing_token();
        inside(fence.update_one("x", doc! {}, doc! {}, token).map(drop));
        inside(watch.changed(Duration::ZERO).map(drop));
        inside(Provider::connect(&common::server::uri(), common::DATABASE).map(drop));
        // The guard is consumed: it is released in the background.
        inside(guard.release());
    });
    // Nothing was shut down, and the dropped guard was released.
    let again = lock
        .acquire_timeout(HANG)
        .expect("released in the background");
    again.release().unwrap();
}

#[test]
fn dropping_the_last_handle_inside_a_tokio_runtime_does_not_panic() {
    let provider = provider(common::options(10_000, 3_000));
    let guard = provider
        .create_lock(common::unique("drop-in-runtime"))
        .acquire()
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        drop(provider);
        drop(guard); // the last handle: wound down on a helper thread
    });
}

#[test]
fn bad_input_is_an_error() {
    assert!(matches!(
        Provider::connect("not a uri", common::DATABASE),
        Err(Error::Mongo(_))
    ));
    let provider = provider(common::options(10_000, 3_000));
    let error = provider
        .create_semaphore(common::unique("zero"), 0)
        .try_acquire()
        .unwrap_err();
    assert!(error.is_invalid_input(), "{error}");
    let error = provider
        .clone()
        .with_collection("bad$name")
        .create_lock("x")
        .try_acquire()
        .unwrap_err();
    assert!(error.is_invalid_input(), "{error}");
    let error = provider.acquire_all::<&str>(&[], HANG).unwrap_err();
    assert!(error.is_invalid_input(), "{error}");
}

#[test]
fn lock_status_holders_and_watch_block_on_the_async_reads() {
    let provider = provider(common::options(10_000, 3_000));
    let lock = provider.create_lock(common::unique("status"));
    assert_eq!(lock.status().unwrap(), None, "never acquired");
    assert!(lock.holders().unwrap().is_empty());
    let mut watch = lock.watch(Duration::from_millis(100)).unwrap();
    assert!(!watch.is_held());
    let guard = lock.acquire().unwrap();
    let status = lock.status().unwrap().expect("held");
    assert!(status.is_held());
    assert_eq!(status.fencing_token, Some(guard.fencing_token()));
    assert_eq!(lock.holders().unwrap().len(), 1);
    assert!(watch.changed(HANG).unwrap(), "the watch sees the holder");
    assert!(watch.is_held());
    assert_eq!(watch.holders()[0].lock_id, status.lock_id);
    guard.release().unwrap();
    assert!(watch.changed(HANG).unwrap(), "and the release");
    assert!(!watch.is_held());
    assert!(
        !watch.changed(Duration::from_millis(300)).unwrap(),
        "nothing changes while nobody acquires"
    );
}

#[test]
fn a_document_is_locked_checkpointed_and_committed_by_blocking_calls() {
    let provider = provider(common::options(10_000, 3_000));
    let jobs = provider.create_document_lock::<Document>(&common::unique("blocking-jobs"));
    let guard = jobs
        .lock_or_insert("job-1", doc! { "status": "pending" })
        .expect("inserted and locked");
    assert_eq!(guard.id(), &Bson::String("job-1".to_owned()));
    assert_eq!(guard.document().get_str("status").unwrap(), "pending");

    let other = jobs.clone();
    let busy = thread::spawn(move || other.try_lock(doc! { "_id": "job-1" }).unwrap().is_none());
    assert!(busy.join().unwrap(), "locked for every other caller");
    guard.checkpoint(doc! { "$set": { "step": 1 } }).unwrap();
    let first_token = guard.fencing_token();
    guard
        .commit(doc! { "$set": { "status": "done" } })
        .expect("applied and unlocked");

    let again = jobs
        .lock_timeout(doc! { "_id": "job-1" }, HANG)
        .expect("unlocked by the commit");
    assert_eq!(again.document().get_str("status").unwrap(), "done");
    assert_eq!(again.document().get_i32("step").unwrap(), 1);
    assert!(again.fencing_token() > first_token);
    assert!(jobs.holders(doc! { "_id": "job-1" }).unwrap().len() == 1);
    again
        .replace(doc! { "_id": "job-1", "status": "archived" })
        .unwrap();
    let last = jobs
        .try_lock(doc! { "_id": "job-1" })
        .unwrap()
        .expect("free");
    assert_eq!(last.document().get_str("status").unwrap(), "archived");
    assert!(!last.wait_lost(Duration::from_millis(50)).unwrap());
    last.release().unwrap();
    assert!(jobs.holders(doc! { "_id": "job-1" }).unwrap().is_empty());
}

#[test]
fn fenced_writes_apply_newer_tokens_only() {
    let provider = provider(common::options(10_000, 3_000));
    let collection = common::unique("blocking-fenced");
    let documents = provider.create_document_lock::<Document>(&collection);
    let older = documents.lock_or_insert("acct", doc! {}).unwrap();
    let older_token = older.fencing_token();
    older.release().unwrap();
    let newer = documents.lock(doc! { "_id": "acct" }).unwrap();
    let newer_token = newer.fencing_token();
    newer.release().unwrap();

    let fence = provider.create_fence().with_field("fence");
    let filter = doc! { "_id": "acct" };
    let add = doc! { "$inc": { "balance": 10 } };
    let applied = fence.update_one(&collection, filter.clone(), add.clone(), newer_token);
    assert_eq!(applied.unwrap(), FenceOutcome::Applied);
    let stale = fence.update_one(&collection, filter, add.clone(), older_token);
    assert_eq!(
        stale.unwrap(),
        FenceOutcome::Stale,
        "an older token is refused"
    );
    let missing = fence.update_one(&collection, doc! { "_id": "none" }, add, newer_token);
    assert_eq!(missing.unwrap(), FenceOutcome::NotFound);
    let written = documents.try_lock(doc! { "_id": "acct" }).unwrap().unwrap();
    assert_eq!(
        written.document().get_i32("balance").unwrap(),
        10,
        "applied once"
    );
    written.release().unwrap();
}

#[test]
fn one_leader_at_a_time_and_a_resignation_hands_over() {
    let (first, second) = two_processes(common::options(3_000, 1_000));
    let name = common::unique("leader");
    let a = first.create_leader_election(name.as_str()).unwrap();
    assert_eq!(a.name(), name);
    assert!(a.wait_leader(HANG).unwrap(), "alone: elected");
    let term = a.fencing_token().expect("a term while leading");
    assert!(a.lost().is_some_and(|lost| !lost.is_lost()));
    assert!(*a.watch().borrow());

    let b = second.create_leader_election(name.as_str()).unwrap();
    assert!(
        !b.wait_leader(Duration::from_millis(500)).unwrap(),
        "not while the first leads"
    );
    assert_eq!(b.fencing_token(), None);
    let lock = second.create_lock(name.as_str());
    let watch = LeaderElection::watch_leader(&lock, Duration::from_millis(100)).unwrap();
    assert_eq!(watch.holders()[0].fencing_token, Some(term));

    a.resign().unwrap();
    assert!(
        b.wait_leader(HANG).unwrap(),
        "elected once the first resigned"
    );
    assert!(b.fencing_token().unwrap() > term);
    b.resign().unwrap();
}
