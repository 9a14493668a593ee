//! The blocking guards: of a lock, a writer or a semaphore place; of a reader; of a composite.

use std::sync::Arc;
use std::time::Duration;

use super::{Background, twins, wait_lost, wrapper};
use crate::error::Result;
use crate::lease::lost::LostSignal;
use crate::lock_status::LockKind;
use crate::token::FencingToken;

/// Proof that a lock is held (an exclusive lock, a writer, or a semaphore place); see
/// [`crate::LockGuard`].
///
/// The lease renews itself on the provider's runtime while the guard lives, whatever the
/// holding thread does. [`release`](Self::release) ends it; dropping the guard releases it in
/// the background without blocking.
#[must_use = "dropping the guard releases the lock at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct LockGuard {
    // Dropped first: its release is queued on the runtime the handle below keeps alive.
    inner: crate::LockGuard,
    background: Arc<Background>,
}

wrapper!(LockGuard wraps crate::LockGuard);

impl LockGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// This acquisition's fencing token: larger than that of every earlier acquisition of the
    /// same name.
    pub fn fencing_token(&self) -> FencingToken {
        self.inner.fencing_token()
    }

    /// This lease's lock id; see [`LockGuard::lock_id`](crate::LockGuard::lock_id).
    pub fn lock_id(&self) -> &str {
        self.inner.lock_id()
    }

    /// Whether the lock is known or presumed lost (checked against the lease's local deadline
    /// on every call). Stop touching the protected resource once it is.
    pub fn is_lost(&self) -> bool {
        self.inner.is_lost()
    }

    /// Reports that the holder's work is making progress, for
    /// [`max_idle`](crate::LockOptionsBuilder::max_idle); see [`crate::LockGuard::progress`].
    pub fn progress(&self) -> bool {
        self.inner.progress()
    }

    /// The lock's [`LostSignal`]: its [`is_lost`](LostSignal::is_lost) works on any thread; its
    /// async `wait` needs a Tokio runtime (see [`wait_lost`](Self::wait_lost) otherwise).
    pub fn lost(&self) -> LostSignal {
        self.inner.lost()
    }

    /// Blocks until the lock is known or presumed lost, for at most `timeout`: whether it was
    /// lost.
    ///
    /// # Errors
    /// [`Error::BlockingInAsyncContext`](crate::Error::BlockingInAsyncContext) inside a Tokio runtime.
    pub fn wait_lost(&self, timeout: Duration) -> Result<bool> {
        wait_lost(&self.background, &self.inner.lost(), timeout)
    }

    twins! { LockGuard:
        /// Extends the lease to at least `by` from now; see [`crate::LockGuard::extend`].
        fn extend(&self, by: Duration) -> ();
        /// Blocks until someone asks this holder to let go (or the lock is lost); see
        /// [`crate::LockGuard::revocation_requested`].
        fn revocation_requested(&self) -> crate::Revocation;
        /// Stops renewing and releases the lock.
        fn release(self) -> ();
    }
}

/// Proof that the upgradeable read lock is held; see [`crate::UpgradeableReadGuard`]: it reads
/// beside plain readers, keeps writers out, and can become the writer and go back to reading.
#[must_use = "dropping the guard releases the upgradeable read lock at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct UpgradeableReadGuard {
    inner: crate::UpgradeableReadGuard,
    background: Arc<Background>,
}

wrapper!(UpgradeableReadGuard wraps crate::UpgradeableReadGuard);

impl UpgradeableReadGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The read lease's lock id; see
    /// [`UpgradeableReadGuard::lock_id`](crate::UpgradeableReadGuard::lock_id).
    pub fn lock_id(&self) -> &str {
        self.inner.lock_id()
    }

    /// Whether it holds the write lease now.
    pub fn is_upgraded(&self) -> bool {
        self.inner.is_upgraded()
    }

    /// The write lease's fencing token while upgraded, `None` while reading.
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.inner.fencing_token()
    }

    /// Whether the read lease, or the write lease while held, is known or presumed lost.
    pub fn is_lost(&self) -> bool {
        self.inner.is_lost()
    }

    /// Reports that the holder's work is making progress, for
    /// [`max_idle`](crate::LockOptionsBuilder::max_idle); see [`crate::LockGuard::progress`].
    pub fn progress(&self) -> bool {
        self.inner.progress()
    }

    /// The [`LostSignal`] of the leases held now; see
    /// [`UpgradeableReadGuard::lost`](crate::UpgradeableReadGuard::lost).
    pub fn lost(&self) -> LostSignal {
        self.inner.lost()
    }

    /// Blocks until a lease held now is known or presumed lost, for at most `timeout`: whether
    /// it was lost.
    ///
    /// # Errors
    /// [`Error::BlockingInAsyncContext`](crate::Error::BlockingInAsyncContext) inside a Tokio runtime.
    pub fn wait_lost(&self, timeout: Duration) -> Result<bool> {
        wait_lost(&self.background, &self.inner.lost(), timeout)
    }

    twins! { UpgradeableReadGuard:
        /// Blocks until it holds the write lease too (the plain readers have left).
        fn upgrade(&mut self) -> ();
        /// Makes one upgrade attempt: whether it holds the write lease now.
        fn try_upgrade(&mut self) -> bool;
        /// Blocks at most `timeout` for the write lease: whether it holds it now.
        fn try_upgrade_timeout(&mut self, timeout: Duration) -> bool;
        /// Ends the write lease and goes on reading.
        fn downgrade(&mut self) -> ();
        /// Extends its leases to at least `by` from now.
        fn extend(&self, by: Duration) -> ();
        /// Releases the write lease (if held), then the read lease.
        fn release(self) -> ();
    }
}

/// Proof that a read lock is held; see [`crate::ReadGuard`]. Behaves like [`LockGuard`], without
/// a fencing token.
#[must_use = "dropping the guard releases the read lock at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct ReadGuard {
    inner: crate::ReadGuard,
    background: Arc<Background>,
}

wrapper!(ReadGuard wraps crate::ReadGuard);

impl ReadGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// This reader's lock id; see [`ReadGuard::lock_id`](crate::ReadGuard::lock_id).
    pub fn lock_id(&self) -> &str {
        self.inner.lock_id()
    }

    /// Whether the read lock is known or presumed lost.
    pub fn is_lost(&self) -> bool {
        self.inner.is_lost()
    }

    /// Reports that the holder's work is making progress, for
    /// [`max_idle`](crate::LockOptionsBuilder::max_idle); see [`crate::LockGuard::progress`].
    pub fn progress(&self) -> bool {
        self.inner.progress()
    }

    /// The read lock's [`LostSignal`]; see [`LockGuard::lost`].
    pub fn lost(&self) -> LostSignal {
        self.inner.lost()
    }

    /// Blocks until the read lock is known or presumed lost, for at most `timeout`: whether it
    /// was lost.
    ///
    /// # Errors
    /// [`Error::BlockingInAsyncContext`](crate::Error::BlockingInAsyncContext) inside a Tokio runtime.
    pub fn wait_lost(&self, timeout: Duration) -> Result<bool> {
        wait_lost(&self.background, &self.inner.lost(), timeout)
    }

    twins! { ReadGuard:
        /// Extends the lease to at least `by` from now; see [`crate::LockGuard::extend`].
        fn extend(&self, by: Duration) -> ();
        /// Stops renewing and releases the read lock.
        fn release(self) -> ();
    }
}

/// Several locks of any kinds acquired together by
/// [`Provider::acquire_all`](super::Provider::acquire_all); see [`crate::CompositeGuard`].
#[must_use = "dropping the guard releases every member at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct CompositeGuard {
    inner: crate::CompositeGuard,
    background: Arc<Background>,
}

wrapper!(CompositeGuard wraps crate::CompositeGuard);

impl CompositeGuard {
    /// The members' names, in acquisition order; see [`crate::CompositeGuard::names`].
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.inner.names()
    }

    /// Each member's kind and name, in acquisition order.
    pub fn members(&self) -> impl Iterator<Item = (LockKind, &str)> {
        self.inner.members()
    }

    /// Each member's fencing token, by name, in acquisition order (read locks have none).
    pub fn fencing_tokens(&self) -> impl Iterator<Item = (&str, FencingToken)> {
        self.inner.fencing_tokens()
    }

    /// Each member's lock id, by name; see
    /// [`CompositeGuard::lock_ids`](crate::CompositeGuard::lock_ids).
    pub fn lock_ids(&self) -> impl Iterator<Item = (&str, &str)> {
        self.inner.lock_ids()
    }

    /// Whether any member is known or presumed lost.
    pub fn is_lost(&self) -> bool {
        self.inner.is_lost()
    }

    /// Reports that the holder's work is making progress, for
    /// [`max_idle`](crate::LockOptionsBuilder::max_idle); see [`crate::LockGuard::progress`].
    pub fn progress(&self) -> bool {
        self.inner.progress()
    }

    /// A signal that turns true when any member is lost; see [`LockGuard::lost`].
    pub fn lost(&self) -> LostSignal {
        self.inner.lost()
    }

    /// Blocks until any member is known or presumed lost, for at most `timeout`: whether one
    /// was lost.
    ///
    /// # Errors
    /// [`Error::BlockingInAsyncContext`](crate::Error::BlockingInAsyncContext) inside a Tokio runtime.
    pub fn wait_lost(&self, timeout: Duration) -> Result<bool> {
        wait_lost(&self.background, &self.inner.lost(), timeout)
    }

    twins! { CompositeGuard:
        /// Extends the lease to at least `by` from now; see [`crate::LockGuard::extend`].
        fn extend(&self, by: Duration) -> ();
        /// Releases every member.
        fn release(self) -> ();
    }
}
