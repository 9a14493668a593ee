//! The guard of the upgradeable reader, which can become the writer and go back to reading.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::lease::acquire::Wait;
use crate::lease::lost::LostSignal;
use crate::token::FencingToken;

use super::{MongoDistributedReaderWriterLock, ReadGuard};

/// Proof that the upgradeable read lock is held; returned by the `acquire_upgradeable_read*`
/// methods of [`MongoDistributedReaderWriterLock`].
///
/// It reads beside plain readers, and at most one reader at a time is upgradeable. While it
/// holds the lock no writer gets in, so it can [`upgrade`](Self::upgrade) to the writer knowing
/// that nothing was written since it read: the upgrade waits until the plain readers have left
/// (holding new readers back meanwhile, as a waiting writer does), then takes the write lease with
/// the next fencing token, keeping its read lease. [`downgrade`](Self::downgrade) ends the write
/// lease and keeps reading; no other writer can get in between. [`release`](Self::release) (or
/// dropping the guard) ends both.
///
/// Each lease is renewed, and signals its loss, like any other; the write lease, while held, is
/// a whole [`LockGuard`] ([`writer`](Self::writer)): fence writes with it.
///
/// ```no_run
/// # async fn demo(database: mongodb::Database) -> distributed_lock_mongodb::Result<()> {
/// use distributed_lock_mongodb::MongoDistributedReaderWriterLock;
///
/// let cache = MongoDistributedReaderWriterLock::new("cache", &database);
/// let mut guard = cache.acquire_upgradeable_read().await?;
/// let stale = true; // ... read, beside other readers ...
/// if stale {
///     guard.upgrade().await?; // alone now; nobody wrote since we read
///     // ... refresh, fenced with guard.fencing_token() ...
///     guard.downgrade().await?; // readers may come back in
/// }
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping the guard releases the upgradeable read lock at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct UpgradeableReadGuard {
    // Dropped in this order (as fields are): the write lease before the read lease.
    writer: Option<LockGuard>,
    read: ReadGuard,
    lock: MongoDistributedReaderWriterLock,
}

impl UpgradeableReadGuard {
    pub(super) fn new(read: ReadGuard, lock: MongoDistributedReaderWriterLock) -> Self {
        UpgradeableReadGuard {
            writer: None,
            read,
            lock,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.read.name()
    }

    /// The read lease's lock id (see [`ReadGuard::lock_id`]); the write lease, while held, has
    /// its own ([`writer`](Self::writer)).
    pub fn lock_id(&self) -> &str {
        self.read.lock_id()
    }

    /// Whether it holds the write lease now (one not known or presumed lost).
    pub fn is_upgraded(&self) -> bool {
        self.live_writer().is_some()
    }

    /// The write lease's fencing token while upgraded (larger than that of every earlier writer
    /// of the lock), `None` while reading or once the write lease is lost.
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.live_writer().map(LockGuard::fencing_token)
    }

    fn live_writer(&self) -> Option<&LockGuard> {
        self.writer.as_ref().filter(|writer| !writer.is_lost())
    }

    /// The write lease while upgraded (also once lost, until the next `upgrade` or `downgrade`),
    /// as a [`LockGuard`]: its fencing token, its own [`lost`](LockGuard::lost), fenced writes
    /// and lease-checked transactions.
    pub fn writer(&self) -> Option<&LockGuard> {
        self.writer.as_ref()
    }

    crate::lease::bound::bound_task_methods!();

    crate::lease::bound::progress_method!(guard => guard.leases());

    /// Its leases: the read lease, and the write lease while upgraded.
    fn leases(&self) -> impl Iterator<Item = &crate::lease::held::HeldLease> {
        std::iter::once(self.read.held()).chain(self.writer.as_ref().map(LockGuard::held))
    }

    /// The tasks bound to the read lease (which outlives an upgrade's write lease).
    fn bound(&self) -> &crate::lease::bound::Bound {
        self.read.bound()
    }

    /// A signal that turns true when the read lease, or the write lease held when this is
    /// called, is known or presumed lost (see [`LockGuard::lost`]).
    pub fn lost(&self) -> LostSignal {
        let lost = self.read.lost();
        match &self.writer {
            Some(writer) => lost.and(&writer.lost()),
            None => lost,
        }
    }

    /// Whether the read lease, or the write lease while held, is known or presumed lost.
    pub fn is_lost(&self) -> bool {
        self.read.is_lost() || self.writer.as_ref().is_some_and(LockGuard::is_lost)
    }

    /// Waits until it holds the write lease too: when no plain reader holds the lock any more
    /// (new readers are held back meanwhile) and no writer does. At once if upgraded already;
    /// a write lease that was lost is let go, and a new one taken.
    ///
    /// Each attempt is one `findAndModify`. The wait polls at the busy-wait pace (it is not in
    /// the line of this process's waiters: it holds what they wait for).
    ///
    /// # Errors
    /// - [`Error::LockLost`] if the read lease is lost (before or while it waits): no new
    ///   attempt is sent (one already on its way is cleaned up after, and a write lease it wins
    ///   is released), and the waiting-writer marker is removed in the background once no
    ///   attempt is in flight.
    /// - Otherwise as [`MongoDistributedReaderWriterLock::acquire_write`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`MongoDistributedReaderWriterLock::acquire_write`]: a write lease won
    /// after the future was dropped is released at once, and the marker removed; the read lease
    /// stays.
    pub async fn upgrade(&mut self) -> Result<()> {
        let wait = Wait::forever();
        match self.upgrade_within(wait).await? {
            true => Ok(()),
            false => Err(Error::BackgroundTaskEnded {
                // Unreachable without a deadline, but never worth a panic.
                operation: crate::error::Operation::Acquire,
            }),
        }
    }

    /// One upgrade attempt: whether it holds the write lease now. A single attempt leaves no
    /// waiting-writer marker.
    ///
    /// # Errors
    /// As [`upgrade`](Self::upgrade).
    ///
    /// # Cancel safety
    /// As [`upgrade`](Self::upgrade).
    pub async fn try_upgrade(&mut self) -> Result<bool> {
        self.try_upgrade_timeout(Duration::ZERO).await
    }

    /// Upgrade attempts for up to `timeout`: whether it holds the write lease now. When it
    /// runs out, the marker is removed before this returns, and it still reads.
    ///
    /// # Errors
    /// As [`upgrade`](Self::upgrade).
    ///
    /// # Cancel safety
    /// As [`upgrade`](Self::upgrade).
    pub async fn try_upgrade_timeout(&mut self, timeout: Duration) -> Result<bool> {
        self.upgrade_within(Wait::at_most(timeout)).await
    }

    async fn upgrade_within(&mut self, wait: Wait) -> Result<bool> {
        if self.is_upgraded() {
            return Ok(true);
        }
        // A lost write lease ends (its drop releases whatever is left of it).
        self.writer = None;
        let lost = self.read.lost();
        if lost.is_lost() {
            return Err(self.lost_error());
        }
        let upgrade = self.lock.upgrade_within(self.read.lock_id(), wait);
        let won = tokio::select! {
            biased;
            () = lost.wait() => return Err(self.lost_error()),
            won = upgrade => won?,
        };
        self.writer = won;
        Ok(self.writer.is_some())
    }

    fn lost_error(&self) -> Error {
        Error::LockLost {
            name: self.name().to_owned(),
        }
    }

    /// Ends the write lease and goes on reading: readers may join again, and no other writer
    /// can get in while it reads. Nothing is sent if it is not upgraded.
    ///
    /// # Errors
    /// As [`LockGuard::release`] (for the write lease, which is ended either way).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`LockGuard::release`].
    pub async fn downgrade(&mut self) -> Result<()> {
        match self.writer.take() {
            Some(writer) => writer.release().await,
            None => Ok(()),
        }
    }

    /// Extends the read lease (and the write lease while held) to at least `by` from now; see
    /// [`LockGuard::extend`]: both are sent, and the first error returned.
    ///
    /// # Errors
    /// As [`LockGuard::extend`].
    ///
    /// # Cancel safety
    /// As [`LockGuard::extend`].
    pub async fn extend(&self, by: Duration) -> Result<()> {
        let written = match &self.writer {
            Some(writer) => writer.extend(by).await,
            None => Ok(()),
        };
        let read = self.read.extend(by).await;
        written.and(read)
    }

    /// Releases the write lease (if held), then the read lease: the first error, once both
    /// were sent.
    ///
    /// # Errors
    /// As [`LockGuard::release`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`LockGuard::release`].
    pub async fn release(self) -> Result<()> {
        // Its bound tasks end first, while both leases still hold.
        self.bound().settle().await;
        let UpgradeableReadGuard { writer, read, .. } = self;
        let written = match writer {
            Some(writer) => writer.release().await,
            None => Ok(()),
        };
        let read = read.release().await;
        written.and(read)
    }
}

crate::traits::impl_distributed_upgradeable_read_guard!(UpgradeableReadGuard);
