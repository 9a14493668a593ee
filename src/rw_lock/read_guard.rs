//! The guard of a reader.

use crate::error::Result;
use crate::lease::claim::Granted;
use crate::lease::held::HeldLease;
use crate::lease::lost::LostSignal;
use crate::token::FencingToken;

/// Proof that a read lock is held; returned by the `acquire_read*` methods of
/// [`MongoDistributedReaderWriterLock`](crate::MongoDistributedReaderWriterLock).
///
/// Behaves like [`LockGuard`](crate::LockGuard): the lease is renewed while the guard lives, [`lost`](Self::lost)
/// turns `true` before the lease can end on the server, [`release`](Self::release) ends it, and
/// dropping the guard releases it in the background. Readers have no fencing token: they share
/// the lock, so there is no order among them to enforce.
#[must_use = "dropping the guard releases the read lock at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct ReadGuard {
    pub(super) lease: HeldLease,
}

impl ReadGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.lease.name()
    }

    /// This reader's lock id: the holder id that [`LockStatus::lock_id`](crate::LockStatus::lock_id)
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

    /// A signal that turns true when the read lock is known or presumed lost; see
    /// [`LockGuard::lost`](crate::LockGuard::lost).
    pub fn lost(&self) -> LostSignal {
        self.lease.lost()
    }

    /// Whether the read lock is known or presumed lost.
    pub fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// Extends the lease to at least `by` from now; see
    /// [`LockGuard::extend`](crate::LockGuard::extend).
    ///
    /// # Errors
    /// As [`LockGuard::extend`](crate::LockGuard::extend).
    pub async fn extend(&self, by: std::time::Duration) -> Result<()> {
        self.lease.extend(by).await
    }

    /// Runs `work` until it completes or the read lock is lost, whichever comes first; see
    /// [`LockGuard::run_while_held`](crate::LockGuard::run_while_held).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping this future drops `work`; the guard stays held.
    pub async fn run_while_held<F: Future>(&self, work: F) -> Result<F::Output> {
        self.lease.run_while_held(work).await
    }

    /// Runs `work` in a multi-document transaction on `client` that commits only while this
    /// read lock is held; see [`LockGuard::transaction`](crate::LockGuard::transaction).
    ///
    /// # Errors
    /// As [`LockGuard::transaction`](crate::LockGuard::transaction).
    ///
    /// # Cancel safety
    /// As [`LockGuard::transaction`](crate::LockGuard::transaction).
    pub async fn transaction<R>(
        &self,
        client: &mongodb::Client,
        work: impl AsyncFnMut(&mut mongodb::ClientSession) -> mongodb::error::Result<R>,
    ) -> Result<R> {
        self.lease.transaction(client, work).await
    }

    /// The lease, for a guard that holds several (a composite).
    pub(crate) fn into_lease(self) -> HeldLease {
        self.lease
    }

    /// Stops renewing and releases the read lock: one update that removes this reader, and no
    /// other, from the document.
    ///
    /// # Errors
    /// As [`LockGuard::release`](crate::LockGuard::release).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`LockGuard::release`](crate::LockGuard::release).
    pub async fn release(self) -> Result<()> {
        self.lease.release().await
    }
}

crate::traits::impl_distributed_read_guard!(ReadGuard);

impl Granted for ReadGuard {
    fn fencing_token(&self) -> Option<FencingToken> {
        None
    }

    /// Readers share the lock: the next local waiter tries at once (if it is a writer, it
    /// fails unless this reader has gone already, and goes back to waiting).
    fn leaves_room(&self) -> bool {
        true
    }

    fn undelivered(self) {
        self.lease.undelivered();
    }
}
