//! The guard of a held lock with a fencing token: an exclusive lock, a reader-writer lock's
//! writer, or a semaphore place.

use crate::Revocation;
use crate::error::Result;
use crate::lease::PushFrom;
use crate::lease::claim::Granted;
use crate::lease::held::HeldLease;
use crate::lease::lost::LostSignal;
use crate::token::FencingToken;

/// Proof that the lock is held; returned by the `acquire*` methods of
/// [`MongoDistributedLock`](crate::MongoDistributedLock), by those of
/// [`MongoDistributedSemaphore`](crate::MongoDistributedSemaphore) (one place), and by the
/// `acquire_write*` methods of
/// [`MongoDistributedReaderWriterLock`](crate::MongoDistributedReaderWriterLock) (the writer).
///
/// While the guard lives, the lease is renewed every
/// [`extension_cadence`](crate::LockOptions::extension_cadence) (by a renewal loop shared with
/// the other guards of the same provider: one command per cadence and per 2 MiB of names for all
/// of them). If the lease cannot be renewed (the document was deleted or taken over, or no
/// renewal was confirmed in time) the [`lost`] signal turns `true` — before the lease ends on
/// the server, so before anyone else can acquire the lock (see the crate docs for the
/// assumptions). Stop touching the protected resource when that happens.
///
/// Release the lock with [`release`](Self::release). Dropping the guard releases it in the
/// background on the runtime it was acquired on (it only sends a message: no blocking, works off
/// the runtime); if that runtime has shut down, the lease simply expires after `expiry`. A
/// service that is shutting down should therefore release explicitly.
///
/// Locks are not re-entrant: acquiring the same name again while holding this guard waits like
/// any other caller.
///
/// [`lost`]: Self::lost
#[must_use = "dropping the guard releases the lock at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct LockGuard {
    lease: HeldLease,
    fencing_token: FencingToken,
    /// An exclusive lock's change stream, which tells [`revocation_requested`](Self::revocation_requested)
    /// of a request at once.
    push: Option<PushFrom>,
}

impl LockGuard {
    pub(crate) fn new(lease: HeldLease, fencing_token: FencingToken) -> Self {
        LockGuard {
            lease,
            fencing_token,
            push: None,
        }
    }

    /// The guard of an exclusive lock whose change stream comes `from` there.
    pub(crate) fn pushed_from(mut self, from: PushFrom) -> Self {
        self.push = Some(from);
        self
    }

    /// Resolves when someone asks this holder to let go: a waiter's
    /// [`acquire_revoking`](crate::MongoDistributedLock::acquire_revoking), or an operator's
    /// [`request_revocation`](crate::Provider::request_revocation) (for a semaphore's place,
    /// [`request_revocation_of`](crate::Provider::request_revocation_of)). The [`Revocation`] says how
    /// much grace is left and the request's priority. Release before the grace runs out: from
    /// then on the lease is not renewed, and the lock is lost at its end at the latest (the
    /// [`lost`](Self::lost) signal fires first).
    ///
    /// Reads the lock's document now and every
    /// [`extension_cadence`](crate::LockOptions::extension_cadence), and at once when the lock's
    /// change stream (on a replica set or sharded cluster) shows a change. Costs nothing unless
    /// called: one small read per cadence while it waits.
    ///
    /// ```no_run
    /// # async fn demo(lock: distributed_lock_mongodb::MongoDistributedLock) -> distributed_lock_mongodb::Result<()> {
    /// # async fn one_batch() {}
    /// let guard = lock.acquire().await?;
    /// {
    ///     let asked = guard.revocation_requested();
    ///     tokio::pin!(asked);
    ///     loop {
    ///         tokio::select! {
    ///             revocation = &mut asked => {
    ///                 println!("asked to let go ({:?} of grace left)", revocation?.grace_left);
    ///                 break;
    ///             }
    ///             () = one_batch() => {}
    ///         }
    ///     }
    /// }
    /// guard.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) if the lock is lost first;
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a writer's guard (only an
    /// exclusive lock's holder and a semaphore's place can be asked to let go: see
    /// [`Provider::request_revocation_of`](crate::Provider::request_revocation_of));
    /// [`Error::NoRuntime`](crate::Error::NoRuntime) outside a Tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn revocation_requested(&self) -> Result<Revocation> {
        self.lease.revocation_requested(self.push.as_ref()).await
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.lease.name()
    }

    /// This acquisition's fencing token: larger than that of every earlier acquisition of the
    /// same name.
    pub fn fencing_token(&self) -> FencingToken {
        self.fencing_token
    }

    /// This lease's lock id: the holder id that [`LockStatus::lock_id`](crate::LockStatus::lock_id)
    /// reports and `dlock list` shows, and that `dlock release --holder` and
    /// [`Provider::force_release_holder`](crate::Provider::force_release_holder) take. Log it to
    /// tell operators which holder is which.
    pub fn lock_id(&self) -> &str {
        // (A guard's lease is handed back only by its release or drop, which consume it.)
        self.lease.lock_id().unwrap_or_default()
    }

    crate::lease::bound::bound_task_methods!();

    crate::lease::bound::progress_method!(guard => [&guard.lease]);

    /// The tasks bound to the lease.
    pub(crate) fn bound(&self) -> &crate::lease::bound::Bound {
        self.lease.bound()
    }

    /// Its lease.
    pub(crate) fn held(&self) -> &crate::lease::held::HeldLease {
        &self.lease
    }

    /// A signal that turns true when the lock is known or presumed lost, before anyone else can
    /// take it over (see [`LostSignal`]).
    ///
    /// Await [`LostSignal::wait`] in a `tokio::select!` next to the work the lock protects. It
    /// turns true by itself at the lease's local deadline, even if the renewal machinery cannot
    /// run (for example because the runtime is shutting down).
    pub fn lost(&self) -> LostSignal {
        self.lease.lost()
    }

    /// Whether the lock is known or presumed lost (checked against the lease's local deadline
    /// on every call).
    pub fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// Extends the lease so that it lasts at least `by` from now, on the server and for
    /// [`lost`](Self::lost): for a lease that nothing renews
    /// ([`auto_renew(false)`](crate::LockOptionsBuilder::auto_renew)), the way to keep it; for
    /// a renewed one, a promise that it stays taken that long even if this process stops
    /// renewing it (a crash keeps others out until then). One command.
    ///
    /// It never shortens the lease: a lease that lasts longer already stays as it is, and
    /// later renewals never shorten an extension. The local deadline counts from when the
    /// extension was sent, less the safety margin and `max_clock_skew`, as a renewal's.
    ///
    /// # Errors
    /// - [`Error::InvalidArgument`](crate::Error::InvalidArgument), with nothing written, if
    ///   `by` is zero or over 365 days, or if the lease would last past
    ///   [`max_hold`](crate::LockOptions::max_hold);
    /// - [`Error::LockLost`](crate::Error::LockLost) if the lease has ended (lost, or found
    ///   gone by this command, which then fires `lost`);
    /// - [`Error::NoReply`](crate::Error::NoReply) ([`Operation::Extend`](crate::Operation::Extend))
    ///   if the server's time limit ran out (the lease's document held back, say by a
    ///   transaction), or [`Error::UnexpectedReply`](crate::Error::UnexpectedReply) naming another
    ///   failure of the command: whether it applied is unknown, and the lease keeps the deadline
    ///   it had.
    ///
    /// A lease-checked [`transaction`](Self::transaction) renews the lease by `expiry` (its
    /// first write), also when nothing else renews it; it never shortens an extension.
    ///
    /// ```no_run
    /// # async fn demo(provider: distributed_lock_mongodb::Provider) -> distributed_lock_mongodb::Result<()> {
    /// use std::time::Duration;
    /// use distributed_lock_mongodb::LockOptions;
    ///
    /// // A lease that ends a minute after each step unless the next step extends it.
    /// let options = LockOptions::builder()
    ///     .expiry(Duration::from_secs(60))
    ///     .auto_renew(false)
    ///     .build()?;
    /// let lock = provider.clone().with_options(options).create_lock("import");
    /// let guard = lock.acquire().await?;
    /// for step in 0..3 {
    ///     // ... one step of the work ...
    ///     guard.extend(Duration::from_secs(60)).await?;
    /// }
    /// guard.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future may leave the extension applied or not; either way
    /// the guard keeps the deadline it had.
    pub async fn extend(&self, by: std::time::Duration) -> Result<()> {
        self.lease.extend(by).await
    }

    /// Runs `work` while the lock is held: until it completes (its output is returned and the
    /// guard stays held) or the lock is lost, whichever comes first. On loss, `work` is dropped
    /// at its current `.await` and the result is [`Error::LockLost`](crate::Error::LockLost); a
    /// loss noticed together with the completion counts as a loss.
    ///
    /// Dropping `work` cannot recall what it already sent: a write on its way to the database
    /// when the lock is lost may still be applied, after another holder has taken over. Make the
    /// writes that matter fenced ([`Fence`](crate::Fence) with
    /// [`fencing_token`](Self::fencing_token)) or make them in
    /// [`transaction`](Self::transaction), which commits only while the lock is held.
    ///
    /// ```no_run
    /// # async fn demo(lock: distributed_lock_mongodb::MongoDistributedLock) -> distributed_lock_mongodb::Result<()> {
    /// # async fn nightly_report() -> u32 { 0 }
    /// let guard = lock.acquire().await?;
    /// let rows = guard.run_while_held(nightly_report()).await?; // Err(LockLost) if lost first
    /// guard.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: dropping this future drops `work`; the guard stays held.
    pub async fn run_while_held<F: Future>(&self, work: F) -> Result<F::Output> {
        self.lease.run_while_held(work).await
    }

    /// Runs `work` in a multi-document transaction on `client` that commits only while this
    /// lock is held: fencing without any cooperation from the documents `work` writes.
    ///
    /// The transaction first renews this lease, filtered on its lock id and on the lease being
    /// live by server time: if that matches nothing, the transaction is aborted and the result is
    /// [`Error::LockLost`](crate::Error::LockLost) — `work` does not run. Because the transaction
    /// has written the lock's document, another client's acquisition, which must write the same
    /// document, waits for (or conflicts with) the transaction: it cannot take the lock over
    /// before the transaction ends, so the writes of `work` (all made through `session`) commit
    /// only if nobody else held the lock up to the commit.
    ///
    /// **Time limit.** While the transaction is open, its write holds the lock's document, so the
    /// lease is renewed by the transaction alone (its renewal counts once committed) and keeps the
    /// deadline it had when the transaction began: at least `expiry − margin − skew − cadence`
    /// after the start (18.7 s with the default options). If `work` is still running then, it is
    /// dropped, the transaction aborted, and the result is `LockLost` (nothing is committed).
    /// The lock's other leases keep being renewed meanwhile. For a read lock or a semaphore place,
    /// the document is shared with the other holders of the name: their renewals, in every
    /// process, wait until the transaction ends, so keep such transactions short.
    ///
    /// Transient transaction errors (write conflicts, elections) rerun the whole transaction, so
    /// `work` may run more than once and must only write through `session`. An unknown commit
    /// result is retried while the lock is held (and for at most the driver's 120 s).
    ///
    /// `client` must be connected to the cluster the lock lives in, and `work` must write
    /// through collections of `client` (a session belongs to the client that started it).
    /// Transactions need a replica set or a sharded cluster: on a standalone server the first
    /// command fails and its [`Error::Mongo`](crate::Error::Mongo) is returned (nothing is
    /// written). Read and write concerns are `snapshot` and the lock's write concern.
    ///
    /// ```no_run
    /// # async fn demo(lock: distributed_lock_mongodb::MongoDistributedLock, client: mongodb::Client) -> distributed_lock_mongodb::Result<()> {
    /// use mongodb::bson::{doc, Document};
    ///
    /// let accounts = client.database("bank").collection::<Document>("accounts");
    /// let guard = lock.acquire().await?;
    /// guard
    ///     .transaction(&client, async |session| {
    ///         accounts
    ///             .update_one(doc! { "_id": "a" }, doc! { "$inc": { "balance": -10 } })
    ///             .session(&mut *session)
    ///             .await?;
    ///         accounts
    ///             .update_one(doc! { "_id": "b" }, doc! { "$inc": { "balance": 10 } })
    ///             .session(&mut *session)
    ///             .await?;
    ///         Ok(())
    ///     })
    ///     .await?; // Err(LockLost): nothing was written
    /// guard.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// - [`Error::LockLost`](crate::Error::LockLost) if the lock was lost, or its deadline
    ///   passed, before the commit: nothing was committed.
    /// - [`Error::CommitOutcomeUnknown`](crate::Error::CommitOutcomeUnknown) if the commit got no
    ///   definite answer before the lock was lost (or 120 s passed): the writes **may have been
    ///   committed**. Read them back (or make them idempotent) before running the transaction
    ///   again.
    /// - [`Error::Mongo`](crate::Error::Mongo) for `work`'s own errors and other failures (the
    ///   transaction was aborted: nothing was committed).
    /// - [`Error::BackgroundTaskEnded`](crate::Error::BackgroundTaskEnded) if the task sending
    ///   the transaction's renewal ended without an answer (the runtime is shutting down).
    ///
    /// # Cancel safety
    /// Not cancel safe in the sense that dropping the future during the commit may or may not
    /// leave the transaction committed; before that, the driver aborts it (while the
    /// transaction's first write, the renewal, is on its way, once that write is answered, so
    /// that no transaction is left open holding the lock's document).
    pub async fn transaction<T>(
        &self,
        client: &mongodb::Client,
        work: impl AsyncFnMut(&mut mongodb::ClientSession) -> mongodb::error::Result<T>,
    ) -> Result<T> {
        self.lease.transaction(client, work).await
    }

    /// The lease and token, for a guard that holds several (a composite).
    pub(crate) fn into_parts(self) -> (HeldLease, FencingToken) {
        (self.lease, self.fencing_token)
    }

    /// Stops renewing and releases the lock: one update, filtered on this acquisition's lock id,
    /// that ends the lease now. The document stays (for an exclusive lock, the TTL index removes
    /// it a day later) so the next acquisition's fencing token is larger.
    ///
    /// When a caller of `acquire*` waits for the same exclusive lock in this process (through a
    /// clone of the lock or the same provider, with the same write concern), the release is
    /// instead a *transfer*: one `findAndModify`, filtered on this lock id, that gives the
    /// longest-waiting local caller the lock (its own lock id, a fresh lease, the next fencing
    /// token), so it holds the lock when this returns. At most 8 transfers follow one another;
    /// the next release is a plain one that wakes nobody, giving waiters in other processes
    /// their turn. For the other kinds, the longest-waiting local caller is woken at once. Transient
    /// failures (an election, a lost reply) are retried, and an update without a reply after a
    /// quarter of `expiry` (at least 1 s) is sent again on another connection, until `expiry`.
    ///
    /// # Errors
    /// - [`Error::LockLost`](crate::Error::LockLost) if the lock had been lost before the
    ///   release (the update is still sent, and never touches another holder's lock), also when
    ///   its [`Provider`](crate::Provider) was shut down (which released it) or the runtime it
    ///   was acquired on has shut down (nobody renews it any more; it expires by itself).
    /// - [`Error::Mongo`](crate::Error::Mongo) if the update failed for good, or if a retry
    ///   found the lease gone after an earlier try's outcome was unknown (it may have released
    ///   it); [`Error::NoReply`](crate::Error::NoReply) if no try got a reply within `expiry`.
    ///   The lease then ends by itself at its expiry at the latest.
    ///
    /// # Cancel safety
    /// Cancel safe: the release is carried out by a background task, which finishes it even if
    /// this future is dropped.
    pub async fn release(self) -> Result<()> {
        self.lease.release().await
    }
}

crate::traits::impl_distributed_lock_guard!(LockGuard);

impl Granted for LockGuard {
    fn fencing_token(&self) -> Option<FencingToken> {
        Some(self.fencing_token)
    }

    fn leaves_room(&self) -> bool {
        false
    }

    fn undelivered(self) {
        self.lease.undelivered();
    }
}
