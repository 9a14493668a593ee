//! The behaviour of the exclusive lock, the semaphore, the reader-writer lock and the document
//! lock, written once against the traits and run against both implementations: MongoDB
//! (`Provider`) and the in-memory double (`memory::MemoryLockProvider`). The exclusive lock's behaviours run again
//! on the write side of reader-writer locks. Then the double's own test controls.

use test_support as common;

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;

use distributed_lock_mongodb::memory::MemoryLockProvider;
use distributed_lock_mongodb::{
    BoxedGuard, DistributedDocumentLock, DistributedJob, DistributedLock, DistributedLockProvider,
    DistributedReaderWriterLock, DistributedSemaphore, Error, JobRun, LeaderElection, LockKind,
    LockOptions, LockStatus, LockWatch, Provider, Result,
};
use mongodb::bson::{Bson, doc};

type Locks = Arc<dyn DistributedLockProvider>;

/// No behaviour here waits for an expiry, so the lease is long: an attempt waits for its reply up
/// to the expiry, and a 5 s expiry failed three tests with `NoReply` when the server was starved
/// on an overloaded machine.
async fn mongodb_locks() -> Locks {
    let provider = Provider::new(&common::database().await)
        .with_collection(common::unique("behaviour").as_str())
        .with_semaphore_collection(common::unique("behaviour-semaphores").as_str())
        .with_reader_writer_collection(common::unique("behaviour-rw").as_str())
        .with_options(common::options(30_000, 10_000));
    Arc::new(provider)
}

fn memory_locks() -> Locks {
    Arc::new(MemoryLockProvider::new())
}

/// The same provider.
fn as_is(locks: Locks) -> Locks {
    locks
}

/// A provider whose "exclusive locks" are the write sides of its reader-writer locks.
fn writers(locks: Locks) -> Locks {
    Arc::new(Writers(locks))
}

#[derive(Debug)]
struct Writers(Locks);

#[derive(Debug)]
struct WriteSide(Box<dyn DistributedReaderWriterLock>);

impl DistributedLockProvider for Writers {
    fn create_lock(&self, name: &str) -> Box<dyn DistributedLock> {
        Box::new(WriteSide(self.0.create_reader_writer_lock(name)))
    }

    fn create_semaphore(&self, name: &str, max_count: u32) -> Box<dyn DistributedSemaphore> {
        self.0.create_semaphore(name, max_count)
    }

    fn create_reader_writer_lock(&self, name: &str) -> Box<dyn DistributedReaderWriterLock> {
        self.0.create_reader_writer_lock(name)
    }

    fn create_document_lock(&self, collection: &str) -> Box<dyn DistributedDocumentLock> {
        self.0.create_document_lock(collection)
    }

    fn create_job(
        &self,
        name: &str,
        window: Duration,
        max_runtime: Option<Duration>,
    ) -> Result<DistributedJob> {
        self.0.create_job(name, window, max_runtime)
    }
}

impl DistributedLock for WriteSide {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn acquire(&self) -> BoxFuture<'_, Result<BoxedGuard>> {
        self.0.acquire_write()
    }

    fn acquire_timeout(&self, timeout: Duration) -> BoxFuture<'_, Result<BoxedGuard>> {
        self.0.acquire_write_timeout(timeout)
    }

    fn try_acquire(&self) -> BoxFuture<'_, Result<Option<BoxedGuard>>> {
        self.0.try_acquire_write()
    }

    fn try_acquire_timeout(&self, timeout: Duration) -> BoxFuture<'_, Result<Option<BoxedGuard>>> {
        self.0.try_acquire_write_timeout(timeout)
    }

    fn holders(&self) -> BoxFuture<'_, Result<Vec<LockStatus>>> {
        self.0.holders()
    }

    fn watch(&self, every: Duration) -> BoxFuture<'_, Result<LockWatch>> {
        self.0.watch(every)
    }
}

/// One test per behaviour and implementation, in modules `$mongodb` and `$memory`, each
/// given its provider through `$wrap`.
macro_rules! behaviours {
    ($mongodb:ident, $memory:ident, $wrap:ident: $($behaviour:ident),* $(,)?) => {
        mod $mongodb {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    super::$behaviour(super::$wrap(super::mongodb_locks().await)).await;
                }
            )*
        }
        mod $memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    super::$behaviour(super::$wrap(super::memory_locks())).await;
                }
            )*
        }
    };
}

behaviours!(
    writers_on_mongodb, writers_in_memory, writers:
    holders_and_a_watch_show_who_holds_the_lock,
    a_held_lock_excludes_every_other_acquisition,
    release_frees_the_lock_and_tokens_increase,
    dropping_the_guard_frees_the_lock,
    a_waiter_gets_the_lock_when_the_holder_releases,
    a_held_lock_is_not_lost_and_a_released_one_never_fires,
    names_are_independent,
    contenders_hold_the_lock_one_at_a_time,
    bound_tasks_are_awaited_at_release_and_aborted_by_abort_tasks,
);

behaviours!(
    on_mongodb, in_memory, as_is:
    holders_and_a_watch_show_who_holds_the_lock,
    a_semaphores_and_a_reader_writer_locks_holders_are_each_holder,
    a_composite_takes_every_member_or_none,
    a_job_runs_once_per_window_and_is_skipped_while_it_runs,
    a_job_runs_again_once_its_window_is_over,
    a_job_with_a_window_out_of_range_is_refused,
    a_held_lock_excludes_every_other_acquisition,
    release_frees_the_lock_and_tokens_increase,
    dropping_the_guard_frees_the_lock,
    a_waiter_gets_the_lock_when_the_holder_releases,
    a_held_lock_is_not_lost_and_a_released_one_never_fires,
    bound_tasks_are_awaited_at_release_and_aborted_by_abort_tasks,
    names_are_independent,
    contenders_hold_the_lock_one_at_a_time,
    a_name_over_a_mib_is_refused,
    acquiring_outside_a_tokio_runtime_is_refused,
    a_semaphore_admits_max_count_holders_and_no_more,
    semaphore_contenders_never_exceed_max_count,
    a_semaphores_max_count_must_be_at_least_one_and_agreed,
    readers_share_the_lock_and_a_writer_holds_it_alone,
    a_waiting_writer_holds_back_new_readers,
    a_single_write_attempt_holds_back_no_reader,
    the_kinds_of_one_name_are_independent,
    reads_are_refused_as_writes_are,
    documents_are_claimed_by_one_holder_each,
    a_filter_that_matches_nothing_is_document_not_found,
    a_checkpoint_keeps_the_lock_and_a_replace_rewrites_the_document,
    increments_add_up_and_a_read_document_cannot_be_written_back,
    a_waiter_gets_the_document_when_it_is_unlocked,
    updates_that_would_corrupt_a_document_lock_are_refused,
    every_guard_extends_a_held_lease_and_refuses_a_bad_length,
    a_semaphore_gives_several_places_at_once_all_or_none,
    a_waiter_for_several_places_is_not_starved_by_waiters_for_one,
    a_set_count_evicts_nobody_and_rules_every_caller,
    one_upgradeable_reader_reads_beside_others_and_keeps_writers_out,
    an_upgrade_waits_for_plain_readers_and_ignores_a_waiting_writer,
    one_leader_at_a_time_and_a_resignation_hands_over,
    work_runs_under_each_kind_of_lock_and_the_lock_is_released_after,
);

async fn one_upgradeable_reader_reads_beside_others_and_keeps_writers_out(locks: Locks) {
    let rw = locks.create_reader_writer_lock("rw");
    let mut upgradeable = rw.acquire_upgradeable_read().await.unwrap();
    assert!(!upgradeable.is_upgraded());
    assert_eq!(upgradeable.fencing_token(), None);
    let plain = rw.try_acquire_read().await.unwrap().expect("readers share");
    assert!(rw.try_acquire_upgradeable_read().await.unwrap().is_none());
    assert!(
        rw.try_acquire_write_timeout(Duration::from_millis(200))
            .await
            .unwrap()
            .is_none()
    );
    plain.release().await.unwrap();
    assert!(
        rw.try_acquire_write().await.unwrap().is_none(),
        "it still reads"
    );

    assert!(upgradeable.try_upgrade().await.unwrap(), "the only reader");
    let token = upgradeable.fencing_token().expect("a writer's token");
    assert!(rw.try_acquire_read().await.unwrap().is_none(), "it writes");
    upgradeable.downgrade().await.unwrap();
    assert!(!upgradeable.is_upgraded());
    let plain = rw
        .try_acquire_read()
        .await
        .unwrap()
        .expect("it reads again");
    plain.release().await.unwrap();
    assert!(rw.try_acquire_write().await.unwrap().is_none());
    upgradeable.upgrade().await.unwrap();
    assert!(upgradeable.fencing_token().unwrap() > token);
    upgradeable.release().await.unwrap();
    let writer = rw.try_acquire_write().await.unwrap().expect("free");
    assert!(writer.fencing_token() > token);
    writer.release().await.unwrap();
}

async fn an_upgrade_waits_for_plain_readers_and_ignores_a_waiting_writer(locks: Locks) {
    let rw = locks.create_reader_writer_lock("rw");
    let mut upgradeable = rw.acquire_upgradeable_read().await.unwrap();
    let plain = rw.acquire_read().await.unwrap();
    assert!(
        !upgradeable
            .try_upgrade_timeout(Duration::from_millis(200))
            .await
            .unwrap()
    );
    // A writer waits for the upgradeable reader; the upgrade does not wait for the writer.
    let writer = {
        let rw = locks.create_reader_writer_lock("rw");
        tokio::spawn(async move { rw.acquire_write().await })
    };
    let probe = locks.create_reader_writer_lock("rw");
    let held_back = common::eventually(Duration::from_secs(10), || async {
        match probe.try_acquire_read().await.unwrap() {
            Some(read) => {
                read.release().await.unwrap();
                false
            }
            None => true,
        }
    })
    .await;
    assert!(held_back, "new readers wait while the writer waits");
    let upgrade = tokio::spawn(async move { upgradeable.upgrade().await.map(|()| upgradeable) });
    plain.release().await.unwrap();
    let mut upgradeable = tokio::time::timeout(Duration::from_secs(10), upgrade)
        .await
        .expect("upgraded once the plain reader left")
        .unwrap()
        .unwrap();
    assert!(upgradeable.is_upgraded());
    assert!(!writer.is_finished(), "no other writer got in");
    upgradeable.downgrade().await.unwrap();
    assert!(!writer.is_finished(), "nor while it reads again");
    upgradeable.release().await.unwrap();
    let writing = tokio::time::timeout(Duration::from_secs(30), writer)
        .await
        .expect("the writer goes next")
        .unwrap()
        .unwrap();
    writing.release().await.unwrap();
}

async fn work_runs_under_each_kind_of_lock_and_the_lock_is_released_after(locks: Locks) {
    let lock = locks.create_lock("run");
    let output = lock
        .acquire_and_run(async |guard| {
            assert!(!guard.is_lost());
            guard.fencing_token()
        })
        .await
        .unwrap();
    let next = lock
        .try_acquire()
        .await
        .unwrap()
        .expect("released after the work");
    assert!(next.fencing_token() > output);
    // The guard's own: the output, and the guard still held.
    let ran = next.run_while_held(async { 7 }).await.unwrap();
    assert_eq!(ran, 7);
    assert!(lock.try_acquire().await.unwrap().is_none());
    next.release().await.unwrap();

    let rw = locks.create_reader_writer_lock("run");
    let read = rw
        .acquire_read_and_run(async |guard| {
            let other = locks.create_reader_writer_lock("run");
            // Readers share; a writer waits.
            let second = other.try_acquire_read().await.unwrap().expect("shared");
            second.release().await.unwrap();
            assert!(other.try_acquire_write().await.unwrap().is_none());
            guard.name().to_owned()
        })
        .await
        .unwrap();
    assert_eq!(read, "run");
    let written = rw
        .acquire_write_and_run(async |guard| {
            let other = locks.create_reader_writer_lock("run");
            assert!(other.try_acquire_read().await.unwrap().is_none());
            guard.fencing_token()
        })
        .await
        .unwrap();
    let writer = rw.try_acquire_write().await.unwrap().expect("released");
    assert!(writer.fencing_token() > written);
    writer.release().await.unwrap();
}

/// Waits (up to `limit`) until `election` leads: whether it does.
async fn leads(election: &LeaderElection, limit: Duration) -> bool {
    let mut leading = election.watch();
    tokio::time::timeout(limit, leading.wait_for(|leader| *leader))
        .await
        .is_ok_and(|led| led.is_ok())
}

async fn one_leader_at_a_time_and_a_resignation_hands_over(locks: Locks) {
    let first = locks.create_leader_election("leader").unwrap();
    assert!(leads(&first, Duration::from_secs(10)).await);
    let term = first.fencing_token().expect("a term's token");
    assert!(first.lost().is_some_and(|lost| !lost.is_lost()));
    let second = locks.create_leader_election("leader").unwrap();
    assert!(!leads(&second, Duration::from_millis(300)).await);
    assert!(!second.is_leader() && second.fencing_token().is_none());
    first.resign().await.unwrap();
    assert!(leads(&second, Duration::from_secs(30)).await);
    assert!(second.fencing_token().unwrap() > term);
    second.resign().await.unwrap();
    assert!(
        locks
            .create_lock("leader")
            .try_acquire()
            .await
            .unwrap()
            .is_some()
    );
}

async fn a_held_lock_excludes_every_other_acquisition(locks: Locks) {
    let lock = locks.create_lock("a");
    let guard = lock.acquire().await.unwrap();
    assert_eq!(guard.name(), "a");
    let other = locks.create_lock("a");
    assert!(other.try_acquire().await.unwrap().is_none());
    let waited = other.try_acquire_timeout(Duration::from_millis(100)).await;
    assert!(waited.unwrap().is_none());
    let error = other
        .acquire_timeout(Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::Timeout { name, .. } if name == "a"),
        "{error}"
    );
    guard.release().await.unwrap();
}

/// `holders()` shows the holder with its fencing token, and a watch follows who holds the lock
/// (the MongoDB lock's through its change stream or its cadence, the double's at once); a zero
/// cadence is refused.
async fn holders_and_a_watch_show_who_holds_the_lock(locks: Locks) {
    let lock = locks.create_lock("watched");
    assert!(lock.holders().await.unwrap().is_empty());
    let zero = lock.watch(Duration::ZERO).await;
    assert!(
        matches!(&zero, Err(Error::InvalidArgument(message)) if message.contains("cadence")),
        "{zero:?}"
    );
    let mut watch = lock.watch(Duration::from_millis(200)).await.unwrap();
    assert!(watch.is_free());
    let guard = lock.acquire().await.unwrap();
    let holders = lock.holders().await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert!(holders[0].is_held());
    assert_eq!(holders[0].fencing_token, Some(guard.fencing_token()));
    let seen = async {
        while !watch.is_held() {
            watch.changed().await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(10), seen)
        .await
        .expect("the watch sees the holder");
    assert_eq!(watch.holders()[0].lock_id, holders[0].lock_id);
    guard.release().await.unwrap();
    let seen = async {
        while !watch.is_free() {
            watch.changed().await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(10), seen)
        .await
        .expect("the watch sees the release");
    assert!(lock.holders().await.unwrap().is_empty());
}

/// A semaphore's holders are each place's holder, with its places; a reader-writer lock's are
/// its readers (the upgradeable one marked) or its writer.
async fn a_semaphores_and_a_reader_writer_locks_holders_are_each_holder(locks: Locks) {
    let semaphore = locks.create_semaphore("counted", 3);
    let one = semaphore.acquire().await.unwrap();
    let two = semaphore.acquire_many(2).await.unwrap();
    let mut places: Vec<u32> = (semaphore.holders().await.unwrap().iter())
        .map(|holder| holder.places)
        .collect();
    places.sort_unstable();
    assert_eq!(places, [1, 2]);
    let mut watch = semaphore.watch(Duration::from_millis(200)).await.unwrap();
    assert_eq!(watch.holders().len(), 2);
    one.release().await.unwrap();
    let seen = async {
        while watch.holders().len() != 1 {
            watch.changed().await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(10), seen)
        .await
        .expect("the watch sees the release of one place");
    two.release().await.unwrap();

    let rw = locks.create_reader_writer_lock("shared");
    let reading = rw.acquire_read().await.unwrap();
    let upgradeable = rw.acquire_upgradeable_read().await.unwrap();
    let readers = rw.holders().await.unwrap();
    assert_eq!(readers.len(), 2, "{readers:?}");
    assert!(readers.iter().all(|reader| reader.kind == LockKind::Read));
    assert_eq!(
        readers.iter().filter(|reader| reader.upgradeable).count(),
        1
    );
    assert!(readers.iter().all(|reader| reader.fencing_token.is_none()));
    reading.release().await.unwrap();
    upgradeable.release().await.unwrap();
    let writing = rw.acquire_write().await.unwrap();
    let writer = rw.holders().await.unwrap();
    assert_eq!(writer.len(), 1);
    assert_eq!(writer[0].kind, LockKind::Write);
    assert_eq!(writer[0].fencing_token, Some(writing.fencing_token()));
    writing.release().await.unwrap();
}

/// A composite of every kind of member is taken whole or not at all: a set with a busy member
/// holds nothing (a try says `None`, a wait ends with a timeout naming that member), bad sets
/// are refused, and its release frees every member.
async fn a_composite_takes_every_member_or_none(locks: Locks) {
    use distributed_lock_mongodb::CompositeMember::{Exclusive, Read, Semaphore, Write};
    let members = [
        Exclusive("order"),
        Read("prices"),
        Semaphore {
            name: "exports",
            max_count: 2,
        },
    ];
    let all = locks
        .acquire_all(&members, Duration::from_secs(10))
        .await
        .unwrap();
    let mut names = all.names();
    names.sort();
    assert_eq!(names, ["exports", "order", "prices"]);
    let tokens: Vec<String> = all
        .fencing_tokens()
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(tokens.len(), 2, "readers have no token: {tokens:?}");
    assert!(!tokens.contains(&"prices".to_owned()));
    assert!(!all.is_lost());
    assert!(!all.lost().is_lost());
    assert!(
        locks
            .create_lock("order")
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );

    let overlapping = [Exclusive("elsewhere"), Exclusive("order")];
    assert!(locks.try_acquire_all(&overlapping).await.unwrap().is_none());
    let error = locks
        .acquire_all(&overlapping, Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::Timeout { name, .. } if name == "order"),
        "{error}"
    );
    let elsewhere = locks.create_lock("elsewhere").try_acquire().await.unwrap();
    assert!(
        elsewhere.is_some(),
        "nothing is held after a composite failed"
    );
    drop(elsewhere);

    let empty: [distributed_lock_mongodb::CompositeMember<'_>; 0] = [];
    let refused = locks.try_acquire_all(&empty).await;
    assert!(
        matches!(refused, Err(Error::InvalidArgument(_))),
        "{refused:?}"
    );
    let twice = [Read("prices"), Write("prices")];
    let refused = locks.try_acquire_all(&twice).await;
    assert!(
        matches!(&refused, Err(Error::InvalidArgument(message)) if message.contains("twice")),
        "{refused:?}"
    );

    all.extend(Duration::from_secs(60)).await.unwrap();
    all.release().await.unwrap();
    let again = locks.try_acquire_all(&members).await.unwrap();
    again
        .expect("every member was released")
        .release()
        .await
        .unwrap();
}

/// A job runs once per window: while one instance runs it another skips it, seeing who holds
/// its lock; once the run is over the window keeps it skipped, the status showing no holder.
async fn a_job_runs_once_per_window_and_is_skipped_while_it_runs(locks: Locks) {
    let window = Duration::from_secs(600);
    let job = locks.create_job("nightly", window, None).unwrap();
    let other = locks.create_job("nightly", window, None).unwrap();
    assert_eq!(job.name(), "nightly");
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let (finish, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let running = job.run(async |guard| {
        started_tx.send(guard.fencing_token()).unwrap();
        finish_rx.await.unwrap();
        guard.fencing_token()
    });
    let meanwhile = async {
        let token = started.await.unwrap();
        let JobRun::Skipped(skipped) = other.run(async |_| ()).await.unwrap() else {
            panic!("ran while another instance ran it");
        };
        let status = skipped.status.expect("held");
        assert!(status.lock_id.is_some(), "running now: {status:?}");
        assert_eq!(status.fencing_token, Some(token));
        finish.send(()).unwrap();
        token
    };
    let (ran, token) = tokio::join!(running, meanwhile);
    match ran.unwrap() {
        JobRun::Ran(ran) => assert_eq!(ran, token),
        JobRun::Skipped(skipped) => panic!("skipped: {skipped}"),
    }
    let JobRun::Skipped(skipped) = other.run(async |_| ()).await.unwrap() else {
        panic!("ran less than a window after the last run");
    };
    let status = skipped.status.expect("kept by the window");
    assert_eq!(status.lock_id, None, "the run is over: {status:?}");
    assert!(status.is_kept(), "{status:?}");
}

/// Once the window is over, the next call runs the job.
async fn a_job_runs_again_once_its_window_is_over(locks: Locks) {
    let window = Duration::from_millis(500);
    let job = locks.create_job("hourly", window, None).unwrap();
    assert!(job.run(async |_| ()).await.unwrap().ran());
    let ran_again = common::eventually(Duration::from_secs(20), || async {
        job.run(async |_| ()).await.unwrap().ran()
    })
    .await;
    assert!(ran_again, "the window never ended");
}

/// A window or a longest run out of range, or a longest run shorter than the window, is refused
/// when the job is made.
async fn a_job_with_a_window_out_of_range_is_refused(locks: Locks) {
    let refused = locks.create_job("job", Duration::ZERO, None);
    assert!(
        matches!(&refused, Err(Error::InvalidOptions(message)) if message.contains("min_hold")),
        "{refused:?}"
    );
    let window = Duration::from_secs(120);
    let refused = locks.create_job("job", window, Some(Duration::from_secs(60)));
    assert!(
        matches!(&refused, Err(Error::InvalidOptions(_))),
        "{refused:?}"
    );
}

async fn release_frees_the_lock_and_tokens_increase(locks: Locks) {
    let lock = locks.create_lock("a");
    let mut last = None;
    for _ in 0..5 {
        let guard = lock.try_acquire().await.unwrap().expect("free");
        let token = guard.fencing_token();
        assert!(
            last.is_none_or(|last| token > last),
            "{token:?} after {last:?}"
        );
        last = Some(token);
        guard.release().await.unwrap();
    }
}

async fn dropping_the_guard_frees_the_lock(locks: Locks) {
    let lock = locks.create_lock("a");
    drop(lock.acquire().await.unwrap());
    // Released at once (in the background, for MongoDB): long before any lease expiry.
    let next = lock.acquire_timeout(Duration::from_secs(3)).await.unwrap();
    next.release().await.unwrap();
}

async fn a_waiter_gets_the_lock_when_the_holder_releases(locks: Locks) {
    let holder = locks.create_lock("a").acquire().await.unwrap();
    let token = holder.fencing_token();
    let waiter = {
        let lock = locks.create_lock("a");
        tokio::spawn(async move { lock.acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter waits while the lock is held"
    );
    holder.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter gets the lock")
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > token);
    next.release().await.unwrap();
}

async fn a_held_lock_is_not_lost_and_a_released_one_never_fires(locks: Locks) {
    let guard = locks.create_lock("a").acquire().await.unwrap();
    let lost = guard.lost();
    assert!(!guard.is_lost() && !lost.is_lost());
    let fired = tokio::time::timeout(Duration::from_millis(100), lost.wait()).await;
    assert!(fired.is_err(), "not lost while held");
    guard.release().await.unwrap();
    assert!(!lost.is_lost());
    let fired = tokio::time::timeout(Duration::from_millis(100), lost.wait()).await;
    assert!(fired.is_err(), "a released lock is not lost");
}

async fn bound_tasks_are_awaited_at_release_and_aborted_by_abort_tasks(locks: Locks) {
    let guard = locks.create_lock("bound").acquire().await.unwrap();
    let token = guard.cancellation();
    let wound_down = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = Arc::clone(&wound_down);
    let task = guard
        .spawn(Box::pin(async move {
            token.cancelled().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        }))
        .unwrap();
    guard.release().await.unwrap();
    assert!(
        wound_down.load(std::sync::atomic::Ordering::SeqCst),
        "the release waited for the bound task"
    );
    task.await.unwrap();

    let guard = locks.create_lock("bound").acquire().await.unwrap();
    let endless = guard.spawn(Box::pin(std::future::pending::<()>())).unwrap();
    guard.abort_tasks();
    assert!(endless.await.unwrap_err().is_cancelled());
    assert!(guard.cancellation().is_cancelled());
    guard.release().await.unwrap();
}

async fn every_guard_extends_a_held_lease_and_refuses_a_bad_length(locks: Locks) {
    let lock = locks.create_lock("a");
    let guard = lock.acquire().await.unwrap();
    guard.extend(Duration::from_secs(5)).await.unwrap();
    assert!(!guard.is_lost(), "still held");
    assert!(lock.try_acquire().await.unwrap().is_none(), "still taken");
    for bad in [Duration::ZERO, Duration::from_secs(366 * 24 * 60 * 60)] {
        match guard.extend(bad).await {
            Err(Error::InvalidArgument(message)) => {
                assert!(message.contains("365 days"), "{message}")
            }
            other => panic!("extend({bad:?}): {other:?}"),
        }
    }
    guard.release().await.unwrap();

    let reader = locks
        .create_reader_writer_lock("rw")
        .acquire_read()
        .await
        .unwrap();
    reader.extend(Duration::from_secs(5)).await.unwrap();
    assert!(matches!(
        reader.extend(Duration::ZERO).await,
        Err(Error::InvalidArgument(_))
    ));
    reader.release().await.unwrap();

    let documents = documents(&locks, &["d"], doc! { "n": 1 }).await;
    let locked = documents.lock(doc! { "_id": "d" }).await.unwrap();
    locked.extend(Duration::from_secs(5)).await.unwrap();
    assert!(matches!(
        locked.extend(Duration::ZERO).await,
        Err(Error::InvalidArgument(_))
    ));
    locked.release().await.unwrap();
}

async fn a_semaphore_gives_several_places_at_once_all_or_none(locks: Locks) {
    let pool = locks.create_semaphore("pool", 4);
    assert_eq!(pool.max_count(), 4);
    assert_eq!(pool.available().await.unwrap(), 4, "nothing held yet");
    let three = pool
        .try_acquire_many(3)
        .await
        .unwrap()
        .expect("3 of 4 free");
    assert_eq!(pool.available().await.unwrap(), 1);
    assert!(
        pool.try_acquire_many(2).await.unwrap().is_none(),
        "2 do not fit"
    );
    let one = pool.try_acquire().await.unwrap().expect("the last place");
    assert!(one.fencing_token() > three.fencing_token());
    assert_eq!(pool.available().await.unwrap(), 0);
    for places in [0, 5] {
        assert!(
            matches!(
                pool.try_acquire_many(places).await,
                Err(Error::InvalidArgument(_))
            ),
            "{places} places"
        );
    }
    three.release().await.unwrap();
    assert_eq!(pool.available().await.unwrap(), 3);
    one.release().await.unwrap();
    let all = pool
        .acquire_many_timeout(4, Duration::from_secs(10))
        .await
        .unwrap();
    all.release().await.unwrap();
}

async fn a_waiter_for_several_places_is_not_starved_by_waiters_for_one(locks: Locks) {
    let pool: Arc<dyn DistributedSemaphore> = locks.create_semaphore("pool", 2).into();
    let first = pool.acquire().await.unwrap();
    let big = {
        let pool = Arc::clone(&pool);
        tokio::spawn(async move { pool.acquire_many_timeout(2, Duration::from_secs(30)).await })
    };
    // Once the waiter for both places has tried, the free place is held back for it.
    let held_back = common::eventually(Duration::from_secs(10), || async {
        pool.try_acquire().await.unwrap().is_none()
    })
    .await;
    assert!(
        held_back,
        "the free place is held back for the waiter for 2"
    );
    first.release().await.unwrap();
    let both = big.await.unwrap().expect("served");
    assert_eq!(pool.available().await.unwrap(), 0);
    both.release().await.unwrap();
    let one = pool.acquire().await.unwrap();
    assert!(
        matches!(
            pool.acquire_many_timeout(2, Duration::from_millis(200))
                .await,
            Err(Error::Timeout { .. })
        ),
        "one place taken"
    );
    assert!(
        pool.try_acquire().await.unwrap().is_some(),
        "the mark of a wait that ended holds nothing back"
    );
    one.release().await.unwrap();
}

async fn a_set_count_evicts_nobody_and_rules_every_caller(locks: Locks) {
    let pool = locks.create_semaphore("pool", 2);
    let (a, b) = (pool.acquire().await.unwrap(), pool.acquire().await.unwrap());
    pool.set_max_count(1).await.unwrap();
    assert!(!a.is_lost() && !b.is_lost(), "shrinking evicts nobody");
    let built_with_five = locks.create_semaphore("pool", 5);
    assert!(
        built_with_five.try_acquire().await.unwrap().is_none(),
        "2 taken of 1"
    );
    a.release().await.unwrap();
    b.release().await.unwrap();
    let only = built_with_five
        .try_acquire()
        .await
        .unwrap()
        .expect("1 of 1");
    assert!(pool.try_acquire().await.unwrap().is_none());
    assert!(matches!(
        pool.set_max_count(0).await,
        Err(Error::InvalidArgument(_))
    ));
    pool.set_max_count(3).await.unwrap();
    let two = pool.try_acquire_many(2).await.unwrap().expect("grown to 3");
    only.release().await.unwrap();
    two.release().await.unwrap();
}

async fn names_are_independent(locks: Locks) {
    let a = locks.create_lock("a").acquire().await.unwrap();
    let b = locks.create_lock("b").try_acquire().await.unwrap();
    let b = b.expect("another name is free");
    a.release().await.unwrap();
    b.release().await.unwrap();
}

async fn contenders_hold_the_lock_one_at_a_time(locks: Locks) {
    let occupancy = common::Occupancy::default();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (locks, occupancy) = (Arc::clone(&locks), occupancy.clone());
            tokio::spawn(async move {
                let lock = locks.create_lock("contended");
                let mut tokens = Vec::new();
                for _ in 0..5 {
                    let guard = lock.acquire().await.unwrap();
                    let inside = occupancy.enter();
                    tokens.push(guard.fencing_token());
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    drop(inside);
                    guard.release().await.unwrap();
                }
                tokens
            })
        })
        .collect();
    let mut tokens = Vec::new();
    for task in tasks {
        tokens.extend(task.await.unwrap());
    }
    assert_eq!(occupancy.most(), 1, "one holder at a time");
    let count = tokens.len();
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), count, "every acquisition has its own token");
}

/// The errors of the four ways to acquire `lock`, each of which must fail.
async fn refusals(lock: &dyn DistributedLock) -> [Error; 4] {
    [
        lock.acquire().await.map(drop).unwrap_err(),
        lock.acquire_timeout(Duration::from_secs(1))
            .await
            .map(drop)
            .unwrap_err(),
        lock.try_acquire().await.map(drop).unwrap_err(),
        lock.try_acquire_timeout(Duration::from_secs(1))
            .await
            .map(drop)
            .unwrap_err(),
    ]
}

async fn a_name_over_a_mib_is_refused(locks: Locks) {
    let name = "n".repeat((1 << 20) + 1);
    let writers = writers(Arc::clone(&locks));
    for lock in [
        locks.create_lock(&name),
        locks.create_semaphore(&name, 2),
        writers.create_lock(&name),
    ] {
        for error in refusals(&*lock).await {
            assert!(
                matches!(&error, Error::InvalidArgument(message) if message.contains("1 MiB")),
                "{error}"
            );
        }
    }
    // The longest allowed name is fine.
    let longest = locks.create_lock(&"n".repeat(1 << 20));
    longest.acquire().await.unwrap().release().await.unwrap();
}

async fn acquiring_outside_a_tokio_runtime_is_refused(locks: Locks) {
    let writers = writers(Arc::clone(&locks));
    for lock in [
        locks.create_lock("outside"),
        locks.create_semaphore("outside", 2),
        writers.create_lock("outside"),
    ] {
        // A plain thread, polled by an executor that is not Tokio's.
        let errors = std::thread::spawn(move || futures::executor::block_on(refusals(&*lock)))
            .join()
            .expect("no panic outside a runtime");
        for error in errors {
            assert!(matches!(error, Error::NoRuntime), "{error}");
        }
    }
    // Nothing was taken.
    let lock = locks.create_lock("outside");
    lock.try_acquire()
        .await
        .unwrap()
        .expect("free")
        .release()
        .await
        .unwrap();
}

async fn a_semaphore_admits_max_count_holders_and_no_more(locks: Locks) {
    let semaphore = locks.create_semaphore("s", 2);
    let first = semaphore.acquire().await.unwrap();
    assert_eq!(first.name(), "s");
    let second = semaphore
        .try_acquire()
        .await
        .unwrap()
        .expect("a second place");
    assert!(second.fencing_token() > first.fencing_token());
    let other = locks.create_semaphore("s", 2);
    assert!(
        other.try_acquire().await.unwrap().is_none(),
        "both places taken"
    );
    let error = other
        .acquire_timeout(Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::Timeout { name, .. } if name == "s"),
        "{error}"
    );
    // The exclusive lock of the same name is another lock.
    let lock = locks.create_lock("s").try_acquire().await.unwrap();
    lock.expect("the lock called s is free")
        .release()
        .await
        .unwrap();
    first.release().await.unwrap();
    let third = other
        .try_acquire()
        .await
        .unwrap()
        .expect("a place was freed");
    assert!(third.fencing_token() > second.fencing_token());
    second.release().await.unwrap();
    third.release().await.unwrap();
}

async fn semaphore_contenders_never_exceed_max_count(locks: Locks) {
    const MAX_COUNT: usize = 2;
    let occupancy = common::Occupancy::default();
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let (locks, occupancy) = (Arc::clone(&locks), occupancy.clone());
            tokio::spawn(async move {
                let semaphore = locks.create_semaphore("pool", MAX_COUNT as u32);
                for _ in 0..4 {
                    let place = semaphore.acquire().await.unwrap();
                    let inside = occupancy.enter();
                    // Held until the places are all taken (or 250 ms): whether holders overlap
                    // must not depend on how fast a loaded machine runs.
                    common::eventually(Duration::from_millis(250), || async {
                        occupancy.inside() >= MAX_COUNT
                    })
                    .await;
                    drop(inside);
                    place.release().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        occupancy.most(),
        MAX_COUNT,
        "up to max_count holders at once, never more"
    );
}

async fn a_semaphores_max_count_must_be_at_least_one_and_agreed(locks: Locks) {
    let three = locks.create_semaphore("shared", 3);
    let place = three.try_acquire().await.unwrap().expect("free");
    place.release().await.unwrap();
    let five = locks.create_semaphore("shared", 5);
    for error in refusals(&*five).await {
        assert!(
            matches!(&error, Error::InvalidArgument(message)
                if message.contains("max_count 3") && message.contains("uses 5")),
            "{error}"
        );
    }
    let zero = locks.create_semaphore("zero", 0);
    for error in refusals(&*zero).await {
        assert!(
            matches!(&error, Error::InvalidArgument(message) if message.contains("at least 1")),
            "{error}"
        );
    }
}

async fn readers_share_the_lock_and_a_writer_holds_it_alone(locks: Locks) {
    let rw = locks.create_reader_writer_lock("rw");
    let first = rw.acquire_read().await.unwrap();
    assert_eq!(first.name(), "rw");
    let other = locks.create_reader_writer_lock("rw");
    let second = other.try_acquire_read().await.unwrap();
    let second = second.expect("readers share the lock");
    assert!(
        other.try_acquire_write().await.unwrap().is_none(),
        "readers hold it"
    );
    let error = other
        .acquire_write_timeout(Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::Timeout { name, .. } if name == "rw"),
        "{error}"
    );
    first.release().await.unwrap();
    assert!(
        other.try_acquire_write().await.unwrap().is_none(),
        "one reader left"
    );
    second.release().await.unwrap();

    let writer = other
        .try_acquire_write()
        .await
        .unwrap()
        .expect("no reader left");
    assert!(
        rw.try_acquire_read().await.unwrap().is_none(),
        "a writer holds it"
    );
    assert!(rw.try_acquire_write().await.unwrap().is_none(), "alone");
    let waited = rw
        .try_acquire_read_timeout(Duration::from_millis(100))
        .await;
    assert!(waited.unwrap().is_none());
    let token = writer.fencing_token();
    writer.release().await.unwrap();
    let next = rw.acquire_write().await.unwrap();
    assert!(next.fencing_token() > token, "writers' tokens increase");
    next.release().await.unwrap();
    rw.acquire_read().await.unwrap().release().await.unwrap();
}

async fn a_waiting_writer_holds_back_new_readers(locks: Locks) {
    let reading = locks
        .create_reader_writer_lock("rw")
        .acquire_read()
        .await
        .unwrap();
    let writer = {
        let rw = locks.create_reader_writer_lock("rw");
        tokio::spawn(async move { rw.acquire_write().await })
    };
    // The state to wait for: new readers are refused (a successful probe is released at once).
    let rw = locks.create_reader_writer_lock("rw");
    let held_back = common::eventually(Duration::from_secs(10), || async {
        match rw.try_acquire_read().await.unwrap() {
            Some(read) => {
                read.release().await.unwrap();
                false
            }
            None => true,
        }
    })
    .await;
    assert!(held_back, "new readers wait while the writer waits");
    assert!(!writer.is_finished(), "the reader still holds the lock");
    // A reader waiting behind the writer gets in after it.
    let reader = {
        let rw = locks.create_reader_writer_lock("rw");
        tokio::spawn(async move { rw.acquire_read().await })
    };
    reading.release().await.unwrap();
    let writing = tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("the writer gets in when the reader leaves")
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!reader.is_finished(), "no reader while the writer holds it");
    writing.release().await.unwrap();
    let read = tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .expect("the reader gets in after the writer")
        .unwrap()
        .unwrap();
    read.release().await.unwrap();
}

async fn a_single_write_attempt_holds_back_no_reader(locks: Locks) {
    let rw = locks.create_reader_writer_lock("rw");
    let first = rw.acquire_read().await.unwrap();
    assert!(rw.try_acquire_write().await.unwrap().is_none());
    let second = rw.try_acquire_read().await.unwrap();
    second.expect("no writer waits").release().await.unwrap();
    first.release().await.unwrap();
}

async fn the_kinds_of_one_name_are_independent(locks: Locks) {
    let writing = locks
        .create_reader_writer_lock("one")
        .acquire_write()
        .await
        .unwrap();
    let lock = locks.create_lock("one").try_acquire().await.unwrap();
    let semaphore = locks
        .create_semaphore("one", 1)
        .try_acquire()
        .await
        .unwrap();
    lock.expect("the lock is another lock")
        .release()
        .await
        .unwrap();
    let semaphore = semaphore.expect("so is the semaphore");
    semaphore.release().await.unwrap();
    writing.release().await.unwrap();
}

async fn reads_are_refused_as_writes_are(locks: Locks) {
    let rw = locks.create_reader_writer_lock(&"n".repeat((1 << 20) + 1));
    let errors = [
        rw.acquire_read().await.map(drop).unwrap_err(),
        rw.acquire_read_timeout(Duration::from_secs(1))
            .await
            .map(drop)
            .unwrap_err(),
        rw.try_acquire_read().await.map(drop).unwrap_err(),
        rw.try_acquire_read_timeout(Duration::from_secs(1))
            .await
            .map(drop)
            .unwrap_err(),
    ];
    for error in errors {
        assert!(
            matches!(&error, Error::InvalidArgument(message) if message.contains("1 MiB")),
            "{error}"
        );
    }
    let rw = locks.create_reader_writer_lock("outside");
    let error = std::thread::spawn(move || {
        futures::executor::block_on(async {
            let read = rw.acquire_read().await.map(drop).unwrap_err();
            let try_read = rw.try_acquire_read().await.map(drop).unwrap_err();
            [read, try_read]
        })
    })
    .join()
    .expect("no panic outside a runtime");
    for error in error {
        assert!(matches!(error, Error::NoRuntime), "{error}");
    }
}

/// The document locks of a collection no other test uses, with the documents `ids` inserted
/// (unlocked) with `fields`.
async fn documents(
    locks: &Locks,
    ids: &[&str],
    fields: mongodb::bson::Document,
) -> Box<dyn DistributedDocumentLock> {
    let documents = locks.create_document_lock(&common::unique("documents"));
    for id in ids {
        let inserted = documents.lock_or_insert(Bson::from(*id), fields.clone());
        inserted.await.unwrap().release().await.unwrap();
    }
    documents
}

async fn documents_are_claimed_by_one_holder_each(locks: Locks) {
    let jobs = documents(&locks, &["a", "b"], doc! { "status": "pending" }).await;
    let pending = || doc! { "status": "pending" };
    let first = jobs.lock(pending()).await.unwrap();
    let second = jobs.try_lock(pending()).await.unwrap();
    let second = second.expect("the other pending document");
    assert_ne!(first.id(), second.id());
    assert!(
        jobs.try_lock(pending()).await.unwrap().is_none(),
        "both held"
    );
    let error = jobs
        .lock_timeout(pending(), Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Timeout { .. }), "{error}");

    let (id, token) = (first.id().clone(), first.fencing_token());
    let done = doc! { "$set": { "status": "done" }, "$inc": { "runs": 1 } };
    first.commit(done).await.unwrap();
    let again = jobs.try_lock(doc! { "status": "done" }).await.unwrap();
    let again = again.expect("committed and unlocked in one write");
    assert_eq!(again.id(), &id);
    assert_eq!(again.document().get_i32("runs"), Ok(1));
    assert!(
        again.fencing_token() > token,
        "tokens increase per document"
    );
    assert_eq!(
        stored_token(again.document()),
        Some(again.fencing_token().get()),
        "the document shows its lock field, with the holder's token"
    );
    again.release().await.unwrap();
    second.release().await.unwrap();
}

/// The fencing token stored in a document's lock field.
fn stored_token(document: &mongodb::bson::Document) -> Option<i64> {
    match document.get_document("lock").ok()?.get("fencingToken")? {
        Bson::Int32(token) => Some(i64::from(*token)),
        Bson::Int64(token) => Some(*token),
        _ => None,
    }
}

async fn a_filter_that_matches_nothing_is_document_not_found(locks: Locks) {
    let jobs = documents(&locks, &["a"], doc! {}).await;
    let missing = || doc! { "_id": "missing" };
    for error in [
        jobs.try_lock(missing()).await.map(drop).unwrap_err(),
        jobs.lock(missing()).await.map(drop).unwrap_err(),
    ] {
        assert!(matches!(error, Error::DocumentNotFound { .. }), "{error}");
    }
}

async fn a_checkpoint_keeps_the_lock_and_a_replace_rewrites_the_document(locks: Locks) {
    let jobs = documents(&locks, &["x"], doc! { "step": 0 }).await;
    let x = || doc! { "_id": "x" };
    let guard = jobs.lock(x()).await.unwrap();
    guard
        .checkpoint(doc! { "$set": { "step": 1 } })
        .await
        .unwrap();
    assert!(jobs.try_lock(x()).await.unwrap().is_none(), "still locked");
    let token = guard.fencing_token();
    guard
        .replace(doc! { "step": 2, "note": "rewritten" })
        .await
        .unwrap();
    let again = jobs
        .try_lock(x())
        .await
        .unwrap()
        .expect("unlocked by the replace");
    assert_eq!(again.document().get_i32("step"), Ok(2));
    assert_eq!(again.document().get_str("note"), Ok("rewritten"));
    assert!(again.fencing_token() > token);
    again.release().await.unwrap();
}

/// A number as an `i64`, whatever its integer type.
fn integer(value: Option<&Bson>) -> Option<i64> {
    match value? {
        Bson::Int32(value) => Some(i64::from(*value)),
        Bson::Int64(value) => Some(*value),
        _ => None,
    }
}

async fn increments_add_up_and_a_read_document_cannot_be_written_back(locks: Locks) {
    let counters = documents(&locks, &["c"], doc! { "total": 5_i64, "small": 1 }).await;
    let c = || doc! { "_id": "c" };
    let guard = counters.lock(c()).await.unwrap();
    let update = doc! { "$inc": { "total": 1, "small": 2, "new": 3 } };
    guard.commit(update).await.unwrap();
    let again = counters.lock(c()).await.unwrap();
    // The values only: MongoDB keeps a 64-bit `total` 64-bit, the embedded test server does
    // not (the double's types are checked on their own below).
    assert_eq!(integer(again.document().get("total")), Some(6));
    assert_eq!(integer(again.document().get("small")), Some(3));
    assert_eq!(integer(again.document().get("new")), Some(3));
    // Writing back what was read carries the lock field: refused, as MongoDB's lock refuses it.
    let copy = again.document().clone();
    let error = again.replace(copy).await.unwrap_err();
    assert!(matches!(error, Error::InvalidArgument(_)), "{error}");
}

async fn a_waiter_gets_the_document_when_it_is_unlocked(locks: Locks) {
    let jobs: Arc<dyn DistributedDocumentLock> = documents(&locks, &["w"], doc! {}).await.into();
    let holder = jobs.lock(doc! { "_id": "w" }).await.unwrap();
    let token = holder.fencing_token();
    let waiter = {
        let jobs = Arc::clone(&jobs);
        tokio::spawn(async move { jobs.lock(doc! { "_id": "w" }).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished(), "the waiter waits while it is locked");
    holder.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter gets the document")
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > token);
    next.release().await.unwrap();
}

async fn updates_that_would_corrupt_a_document_lock_are_refused(locks: Locks) {
    let jobs = documents(&locks, &["r"], doc! { "v": 1 }).await;
    let r = || doc! { "_id": "r" };
    let guard = jobs.lock(r()).await.unwrap();
    for update in [doc! { "v": 2 }, doc! { "$set": { "lock": 1 } }, doc! {}] {
        let error = guard.checkpoint(update).await.unwrap_err();
        assert!(matches!(error, Error::InvalidArgument(_)), "{error}");
    }
    assert!(
        jobs.try_lock(r()).await.unwrap().is_none(),
        "a refused checkpoint keeps it"
    );
    let error = guard.commit(doc! { "v": 3 }).await.unwrap_err();
    assert!(matches!(error, Error::InvalidArgument(_)), "{error}");
    // A refused commit unlocks (in the background, for MongoDB), writing nothing.
    let again = jobs
        .lock_timeout(r(), Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(again.document().get_i32("v"), Ok(1));
    again.release().await.unwrap();
    let other_id = jobs
        .lock_or_insert(Bson::from("s"), doc! { "_id": "t" })
        .await;
    assert!(
        matches!(other_id, Err(Error::InvalidArgument(_))),
        "{other_id:?}"
    );
}

// The in-memory double's test controls.

/// The double plays `fair`: waiters of a lock (and of a semaphore) are served in the order they
/// came, a reader-writer lock's writers too, with readers held back while a writer waits in
/// line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_double_serves_a_fair_locks_waiters_in_the_order_they_came() {
    let fair = LockOptions::builder().fair(true).build().unwrap();
    let locks = MemoryLockProvider::new().with_options(fair);
    let holder = locks.create_lock("fair").acquire().await.unwrap();
    let (served, mut order) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for waiter in 1..=3 {
        let lock = locks.create_lock("fair");
        let served = served.clone();
        waiters.push(tokio::spawn(async move {
            let guard = lock.acquire_timeout(Duration::from_secs(30)).await.unwrap();
            served.send(waiter).unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            guard.release().await.unwrap();
        }));
        let in_line = common::eventually(Duration::from_secs(10), || async {
            locks.waiting_in_line("fair") == waiter
        })
        .await;
        assert!(in_line);
    }
    // A single attempt does not pass the line, even when it finds the lock free.
    holder.release().await.unwrap();
    let mut seen = Vec::new();
    for _ in 1..=3 {
        seen.push(order.recv().await.unwrap());
    }
    assert_eq!(seen, [1, 2, 3]);
    for waiter in waiters {
        waiter.await.unwrap();
    }
    assert_eq!(locks.waiting_in_line("fair"), 0);
    // A wait that gives up leaves the line.
    let holder = locks.create_lock("fair").acquire().await.unwrap();
    let late = locks
        .create_lock("fair")
        .try_acquire_timeout(Duration::from_millis(50))
        .await
        .unwrap();
    assert!(late.is_none());
    assert_eq!(locks.waiting_in_line("fair"), 0);
    holder.release().await.unwrap();
}

/// A fair reader-writer lock of the double: a writer waiting in line holds a new reader back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_doubles_fair_writer_in_line_holds_new_readers_back() {
    let fair = LockOptions::builder().fair(true).build().unwrap();
    let locks = MemoryLockProvider::new().with_options(fair);
    let rw = locks.create_reader_writer_lock("shared");
    let reading = rw.acquire_read().await.unwrap();
    let writer = {
        let rw = rw.clone();
        tokio::spawn(async move { rw.acquire_write_timeout(Duration::from_secs(30)).await })
    };
    let waits = common::eventually(Duration::from_secs(10), || async {
        rw.try_acquire_read().await.unwrap().is_none()
    })
    .await;
    assert!(waits, "the waiting writer holds new readers back");
    reading.release().await.unwrap();
    let writing = writer.await.unwrap().unwrap();
    writing.release().await.unwrap();
    assert!(rw.try_acquire_read().await.unwrap().is_some());
}

/// The double plays `auto_renew(false)`: the lease ends at its expiry (lost, then free) unless
/// `extend` lengthens it; and `max_hold`: the lease is lost when the hold runs out, and an
/// extension past it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_double_ends_leases_that_are_not_renewed_and_holds_that_run_out() {
    let manual = LockOptions::builder()
        .expiry(Duration::from_millis(300))
        .auto_renew(false)
        .build()
        .unwrap();
    let locks = MemoryLockProvider::new().with_options(manual);
    let guard = locks.create_lock("manual").acquire().await.unwrap();
    guard.extend(Duration::from_secs(30)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!guard.is_lost(), "extended past its expiry");
    guard.release().await.unwrap();
    let other = locks.create_lock("manual").acquire().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), other.lost().wait())
        .await
        .expect("a lease nobody extends ends at its expiry");
    // Lost first, then free.
    let freed = common::eventually(Duration::from_secs(10), || async {
        !locks.is_held("manual")
    })
    .await;
    assert!(freed, "and frees the lock");
    assert!(matches!(other.release().await, Err(Error::LockLost { .. })));

    let capped = LockOptions::builder()
        .expiry(Duration::from_millis(300))
        .max_hold(Duration::from_millis(400))
        .build()
        .unwrap();
    let locks = MemoryLockProvider::new().with_options(capped);
    let guard = locks.create_lock("capped").acquire().await.unwrap();
    let refused = guard.extend(Duration::from_secs(30)).await;
    assert!(
        matches!(&refused, Err(Error::InvalidArgument(message)) if message.contains("max_hold")),
        "{refused:?}"
    );
    tokio::time::timeout(Duration::from_secs(10), guard.lost().wait())
        .await
        .expect("the hold runs out");
    // Lost first, then free.
    let freed = common::eventually(Duration::from_secs(10), || async {
        locks
            .create_lock("capped")
            .try_acquire()
            .await
            .unwrap()
            .is_some()
    })
    .await;
    assert!(freed, "the lock is free once the hold ran out");
}

/// The double refuses what the MongoDB locks refuse: `min_hold` for semaphores and
/// reader-writer locks, `min_hold` or `fair` for document locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_double_refuses_options_a_kind_does_not_support() {
    let window = LockOptions::builder()
        .min_hold(Duration::from_secs(1))
        .build()
        .unwrap();
    let locks = MemoryLockProvider::new().with_options(window);
    let refused = locks.create_semaphore("s", 2).try_acquire().await;
    assert!(
        matches!(&refused, Err(Error::InvalidOptions(m)) if m.contains("min_hold")),
        "{refused:?}"
    );
    let refused = locks
        .create_reader_writer_lock("rw")
        .try_acquire_write()
        .await;
    assert!(
        matches!(&refused, Err(Error::InvalidOptions(m)) if m.contains("min_hold")),
        "{refused:?}"
    );
    let fair = LockOptions::builder().fair(true).build().unwrap();
    let locks = MemoryLockProvider::new().with_options(fair);
    let refused = locks
        .create_document_lock("jobs")
        .try_lock(doc! { "_id": "a" })
        .await;
    assert!(
        matches!(&refused, Err(Error::InvalidOptions(m)) if m.contains("fair")),
        "{refused:?}"
    );
}

#[tokio::test]
async fn shutdown_ends_every_lease_and_refuses_what_comes_after() {
    let locks = MemoryLockProvider::new();
    let held = locks.create_lock("a").acquire().await.unwrap();
    let waiting = {
        let lock = locks.create_lock("a");
        tokio::spawn(async move { lock.acquire().await })
    };
    let clone = locks.clone();
    clone.shutdown().await;
    assert!(held.is_lost(), "a lease held through the provider is lost");
    assert!(!locks.is_held("a"), "and freed");
    let waited = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiting call ends")
        .unwrap();
    assert!(matches!(waited, Err(Error::ShutDown)), "{waited:?}");
    let lock = locks.create_lock("b");
    assert!(matches!(lock.acquire().await, Err(Error::ShutDown)));
    assert!(matches!(lock.try_acquire().await, Err(Error::ShutDown)));
    assert!(matches!(
        lock.try_acquire_timeout(Duration::from_secs(1)).await,
        Err(Error::ShutDown)
    ));
    assert!(held.release().await.unwrap_err().is_lock_lost());
    locks.shutdown().await; // a second call does nothing more
}

#[tokio::test]
async fn expire_fires_lost_then_frees_the_lock_for_a_larger_token() {
    let locks = MemoryLockProvider::new();
    let guard = locks.create_lock("a").acquire().await.unwrap();
    let waiter = {
        let lock = locks.create_lock("a");
        tokio::spawn(async move { lock.acquire().await })
    };
    let lost = guard.lost();
    assert!(locks.expire("a"));
    assert!(lost.is_lost(), "lost before anyone else can take the lock");
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter is woken")
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > guard.fencing_token());
    assert_eq!(locks.last_fencing_token("a"), Some(next.fencing_token()));
    // The expired guard's release neither succeeds nor frees the new holder's lock.
    assert!(guard.release().await.unwrap_err().is_lock_lost());
    assert!(locks.is_held("a"));
    next.release().await.unwrap();
    assert!(!locks.is_held("a"));
    assert!(!locks.expire("a"), "nothing held");
}

#[tokio::test]
async fn mark_lost_fires_lost_but_keeps_others_out_until_the_release() {
    let locks = MemoryLockProvider::new();
    let guard = locks.create_lock("a").acquire().await.unwrap();
    assert!(locks.mark_lost("a"));
    tokio::time::timeout(Duration::from_secs(1), guard.lost().wait())
        .await
        .expect("lost fires");
    assert!(guard.is_lost());
    let lock = locks.create_lock("a");
    assert!(
        lock.try_acquire().await.unwrap().is_none(),
        "the lease is still there until it ends"
    );
    assert!(guard.release().await.unwrap_err().is_lock_lost());
    lock.try_acquire()
        .await
        .unwrap()
        .expect("free after the release")
        .release()
        .await
        .unwrap();
    assert!(!locks.mark_lost("a"), "nothing held");
}

#[tokio::test]
async fn the_document_double_refuses_what_it_does_not_evaluate() {
    let locks = MemoryLockProvider::new();
    let jobs = locks.create_document_lock("jobs");
    let guard = jobs
        .lock_or_insert("a", doc! { "status": "pending", "tags": [] })
        .await
        .unwrap();
    for filter in [
        // Refused whatever the data: no document has this status.
        doc! { "status": "done", "n": { "$gt": 3 } },
        doc! { "status": { "$in": ["pending"] } },
        doc! { "$or": [{ "status": "pending" }] },
        doc! { "meta.kind": "x" },
    ] {
        let error = jobs.try_lock(filter).await.unwrap_err();
        assert!(
            matches!(&error, Error::InvalidArgument(message) if message.contains("equalities")),
            "{error}"
        );
    }
    let error = guard
        .checkpoint(doc! { "$push": { "tags": "x" } })
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::InvalidArgument(message) if message.contains("$push")),
        "{error}"
    );
    // Nothing was written by the refused update.
    guard.release().await.unwrap();
    let again = jobs.try_lock(doc! { "_id": "a" }).await.unwrap().unwrap();
    assert_eq!(again.document().get_array("tags").map(Vec::len), Ok(0));
    // At shutdown a locked document's lease is lost, and its release says so.
    locks.shutdown().await;
    assert!(again.is_lost());
    assert!(again.release().await.unwrap_err().is_lock_lost());
    let error = jobs.try_lock(doc! {}).await.unwrap_err();
    assert!(matches!(error, Error::ShutDown), "{error}");
}

#[tokio::test]
async fn the_document_double_widens_increments_as_mongodb_does() {
    // https://www.mongodb.com/docs/manual/reference/operator/update/inc/: mixed numeric types
    // follow the type conversion rules (int + long = long, any + double = double).
    let locks = MemoryLockProvider::new();
    let counters = locks.create_document_lock("counters");
    let fields = doc! { "long": 5_i64, "int": 1, "double": 0.5, "big": i32::MAX };
    let guard = counters.lock_or_insert("c", fields).await.unwrap();
    let update = doc! { "$inc": { "long": 1, "int": 2, "double": 1, "big": 1_i64 } };
    guard.commit(update).await.unwrap();
    let again = counters.lock(doc! { "_id": "c" }).await.unwrap();
    let value = |field| again.document().get(field).cloned();
    assert_eq!(value("long"), Some(Bson::Int64(6)));
    assert_eq!(value("int"), Some(Bson::Int32(3)));
    assert_eq!(value("double"), Some(Bson::Double(1.5)));
    assert_eq!(value("big"), Some(Bson::Int64(i64::from(i32::MAX) + 1)));
    let error = again
        .checkpoint(doc! { "$inc": { "int": "one" } })
        .await
        .unwrap_err();
    assert!(matches!(error, Error::InvalidArgument(_)), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_upgrade_ends_with_lock_lost_when_the_double_shuts_down() {
    let locks = MemoryLockProvider::new();
    let rw = locks.create_reader_writer_lock("rw");
    let mut upgradeable = rw.acquire_upgradeable_read().await.unwrap();
    let plain = rw.acquire_read().await.unwrap();
    let waiting = tokio::spawn(async move { (upgradeable.upgrade().await, upgradeable) });
    tokio::task::yield_now().await;
    locks.shutdown().await;
    let (upgraded, upgradeable) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the wait ends")
        .unwrap();
    assert!(
        matches!(upgraded, Err(Error::LockLost { .. } | Error::ShutDown)),
        "{upgraded:?}"
    );
    assert!(!upgradeable.is_upgraded());
    assert!(upgradeable.is_lost());
    assert!(plain.is_lost());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_double_ends_a_term_with_expire_and_its_leader_campaigns_again() {
    let locks = MemoryLockProvider::new();
    let election = locks.create_leader_election("leader").unwrap();
    assert!(leads(&election, Duration::from_secs(10)).await);
    let term = election.fencing_token().unwrap();
    let lost = election.lost().unwrap();
    assert!(locks.expire("leader"));
    // The term is over at once; the campaign may have won a new one already.
    assert!(lost.is_lost());
    assert!(election.fencing_token().is_none_or(|next| next > term));
    // Elected again, for a new term.
    let again = common::eventually(Duration::from_secs(10), || async {
        election.fencing_token().is_some_and(|next| next > term)
    })
    .await;
    assert!(again, "a new term after the loss");
    election.resign().await.unwrap();
    assert!(!locks.is_held("leader"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_behind_the_traits_is_dropped_when_the_lock_is_lost() {
    let locks = MemoryLockProvider::new();
    let lock: Box<dyn DistributedLock> = Box::new(locks.create_lock("run"));
    let ran = lock
        .acquire_and_run(async |_guard| {
            assert!(locks.expire("run"));
            std::future::pending::<()>().await
        })
        .await;
    assert!(matches!(ran, Err(Error::LockLost { .. })), "{ran:?}");
    assert!(!locks.is_held("run"));

    let guard = lock.acquire().await.unwrap();
    let ran = guard
        .run_while_held(async {
            assert!(locks.expire("run"));
            std::future::pending::<()>().await
        })
        .await;
    assert!(matches!(ran, Err(Error::LockLost { .. })), "{ran:?}");
    assert!(guard.is_lost());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_double_plays_revocation_as_mongodb_does() {
    use distributed_lock_mongodb::RevokeRequest;
    let locks = MemoryLockProvider::new();
    let name = common::unique("revoke");
    let holder = locks.create_lock(name.as_str()).acquire().await.unwrap();
    let asker = {
        let lock = locks.create_lock(name.as_str());
        tokio::spawn(async move {
            lock.acquire_revoking(
                RevokeRequest::new(Duration::from_millis(300)).priority(4),
                Duration::from_secs(30),
            )
            .await
        })
    };
    let revocation = holder.revocation_requested().await.unwrap();
    assert_eq!(revocation.priority, 4);
    assert!(!revocation.by_operator);
    // A plain attempt fails while the holder is there.
    let plain = locks.create_lock(name.as_str());
    assert!(plain.try_acquire().await.unwrap().is_none());
    // The holder ignores it: lost at the grace's end, and the asker takes it with a larger token.
    let lost = holder.lost();
    let guard = tokio::time::timeout(Duration::from_secs(30), asker)
        .await
        .expect("the asker gets the lock")
        .unwrap()
        .unwrap();
    assert!(lost.is_lost());
    assert!(guard.fencing_token() > holder.fencing_token());
    // An operator's request on a free lock writes nothing; on a held one, the holder is told.
    guard.release().await.unwrap();
    assert!(
        locks
            .request_revocation(&name, Duration::from_secs(5))
            .await
            .unwrap()
            .is_none()
    );
    let next = plain.acquire().await.unwrap();
    let status = locks
        .request_revocation(&name, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("held");
    assert!(status.revocation.is_some_and(|r| r.by_operator));
    assert!(next.revocation_requested().await.unwrap().by_operator);
    let refused = next.extend(Duration::from_secs(1)).await;
    assert!(
        matches!(refused, Err(Error::RevocationRequested { .. })),
        "{refused:?}"
    );
    next.release().await.unwrap();
    // A waiter asks only an exclusive lock's holder; an operator asks one semaphore place.
    let semaphore = locks.create_semaphore(name.as_str(), 2);
    let refused = semaphore
        .acquire_revoking(RevokeRequest::new(Duration::ZERO), Duration::from_secs(1))
        .await;
    assert!(
        matches!(refused, Err(Error::InvalidArgument(_))),
        "{refused:?}"
    );
    let first = semaphore.acquire().await.unwrap();
    let second = semaphore.acquire().await.unwrap();
    let entry = semaphore.holders().await.unwrap().remove(0);
    let asked = locks
        .request_revocation_of(&entry, Duration::from_millis(200))
        .await
        .unwrap()
        .expect("held");
    assert_eq!(asked.lock_id, entry.lock_id);
    // (The double's first poll reads its state: ready at once for the place asked.)
    let (asked_guard, other) = match first.revocation_requested().now_or_never() {
        Some(_) => (first, second),
        None => (second, first),
    };
    assert!(
        asked_guard
            .revocation_requested()
            .await
            .unwrap()
            .by_operator
    );
    tokio::time::timeout(Duration::from_secs(30), asked_guard.lost().wait())
        .await
        .expect("the asked place is lost at the grace's end");
    assert!(!other.is_lost());
    other.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_doubles_and_a_leaders_bound_tasks_end_with_the_lease() {
    let locks = MemoryLockProvider::new();
    // A guard of the double: aborted when the lease runs out.
    let guard = locks.create_lock("bound").acquire().await.unwrap();
    let token = guard.cancellation();
    let task = guard.spawn(std::future::pending::<()>()).unwrap();
    assert!(locks.expire("bound"));
    assert!(task.await.unwrap_err().is_cancelled());
    assert!(token.is_cancelled());
    drop(guard);

    // A leader's term: aborted when the term is lost, awaited when leadership is resigned.
    let election = locks.create_leader_election("bound-leader").unwrap();
    assert!(leads(&election, Duration::from_secs(10)).await);
    let endless = election
        .spawn(std::future::pending::<()>())
        .unwrap()
        .expect("leading");
    let (lost, term) = (election.lost().unwrap(), election.fencing_token().unwrap());
    assert!(locks.expire("bound-leader"));
    assert!(lost.is_lost());
    assert!(
        endless.await.unwrap_err().is_cancelled(),
        "aborted with its term"
    );
    let again = common::eventually(Duration::from_secs(10), || async {
        election.fencing_token().is_some_and(|next| next > term)
    })
    .await;
    assert!(again, "a new term after the loss");
    let token = election.cancellation().expect("leading");
    let wound_down = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = Arc::clone(&wound_down);
    election
        .spawn(async move {
            token.cancelled().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        })
        .unwrap()
        .expect("leading");
    election.resign().await.unwrap();
    assert!(
        wound_down.load(std::sync::atomic::Ordering::SeqCst),
        "resign waited for it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_double_and_a_leader_play_max_idle() {
    const MAX_IDLE: Duration = Duration::from_secs(1);
    let options = LockOptions::builder().max_idle(MAX_IDLE).build().unwrap();
    let locks = MemoryLockProvider::new().with_options(options);
    let guard = locks.create_lock("idle").acquire().await.unwrap();
    let started = tokio::time::Instant::now();
    while started.elapsed() < MAX_IDLE * 2 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(guard.progress(), "held while the work progresses");
    }
    tokio::time::timeout(Duration::from_secs(30), guard.lost().wait())
        .await
        .expect("a stalled holder loses the lock");
    // (Lost first, then freed: the double ends a lease as the server's expiry would.)
    let freed =
        common::eventually(Duration::from_secs(10), || async { !locks.is_held("idle") }).await;
    assert!(freed, "freed after the loss");

    // A leader whose work stalls loses its term; another term follows.
    let election = locks.create_leader_election("idle-leader").unwrap();
    assert!(leads(&election, Duration::from_secs(10)).await);
    let term = election.fencing_token().unwrap();
    let started = tokio::time::Instant::now();
    while started.elapsed() < MAX_IDLE * 2 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(election.progress());
    }
    assert_eq!(
        election.fencing_token(),
        Some(term),
        "the same term while it progresses"
    );
    let lost = election.lost().unwrap();
    tokio::time::timeout(Duration::from_secs(30), lost.wait())
        .await
        .expect("a stalled term is lost");
    election.resign().await.ok();
}
